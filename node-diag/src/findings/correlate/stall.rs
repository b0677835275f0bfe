//! The MTU family: DF packets dropped as too big, flows stalled on full-size segments
//! with MTU evidence (PMTUD black holes), and stalls without it (a silent peer).

use node_diag_common::{AF_INET, Event, WINDOW_ALL, icmp, icmpv6, stall};

use super::{Context, addr, with_flow};
use crate::{
    findings::{
        Finding, Kind, Layer, Severity,
        evidence::{
            BlackholeEvidence, Evidence, FragEvidence, IcmpWatch, NetfilterHook, OversizeEvidence,
            RecoveredEvidence, Recovery, StallEvidence,
        },
    },
    host_network::SenderPath,
};

/// MSS clamping, the stop-gap for every MTU fault.
const CLAMP_MSS: &str = "iptables -t mangle -A POSTROUTING -p tcp --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu";

/// ICMP frag-needed evidence (generated here, received, dropped by netfilter). Received
/// is unknown (`null`) when none was seen and ICMP from the network was not watched
/// throughout the window.
fn frag_evidence(ev: &Event, watched: bool) -> FragEvidence {
    let sent = (ev.icmp.last_ns != 0 && is_frag_needed(ev)).then_some(ev.icmp);
    let seen = watched || ev.icmp_rcvd.count > 0;
    FragEvidence {
        frag_needed_sent: sent.map_or(0, |i| i.count),
        frag_needed_mtu: sent.filter(|i| i.mtu != 0).map(|i| i.mtu),
        frag_needed_received: seen.then_some(ev.icmp_rcvd.count),
        frag_needed_received_mtu: (ev.icmp_rcvd.count > 0 && ev.icmp_rcvd.mtu != 0)
            .then_some(ev.icmp_rcvd.mtu),
        frag_needed_dropped: ev.frag_dropped.count,
        icmp_watch: (!seen).then_some(IcmpWatch::Off),
    }
}

/// The MTU a frag-needed for the flow announced, when one was sent or received here:
/// on a plain stall of a full-size segment it means the segments shrank to fit it
/// (the kernel judges a black hole only on MTU evidence the segment still exceeds).
fn pmtud_worked_for(ev: &Event) -> Option<u32> {
    if ev.icmp_rcvd.count > 0 && ev.icmp_rcvd.mtu != 0 {
        return Some(ev.icmp_rcvd.mtu);
    }
    (frag_needed_generated(ev) && ev.icmp.mtu != 0).then_some(ev.icmp.mtu)
}

/// Whether this node generated a frag-needed (IPv6: a packet-too-big) for the flow.
fn frag_needed_generated(ev: &Event) -> bool {
    ev.icmp.count > 0 && is_frag_needed(ev)
}

/// Whether the ICMP error this node generated for the flow is a frag-needed, or for
/// IPv6, where the kernel records the packet-too-big with the oversize drop it answers,
/// a packet-too-big.
fn is_frag_needed(ev: &Event) -> bool {
    if ev.flow.family == AF_INET {
        ev.icmp.icmp_type == icmp::DEST_UNREACH && ev.icmp.icmp_code == icmp::FRAG_NEEDED
    } else {
        ev.icmp.icmp_type == icmpv6::PKT_TOOBIG
    }
}

pub(super) fn df_oversize(ev: &Event, ctx: &Context<'_>) -> Finding {
    let flow = &ev.flow;
    let (src, dst) = (addr(flow, &flow.saddr), addr(flow, &flow.daddr));
    let iface = ctx
        .names
        .interface(ev.drop.netns, ev.drop.ifindex)
        .unwrap_or_else(|| format!("ifindex {}", ev.drop.ifindex));
    // IPv6 has no tracepoint for the packet-too-big the kernel sends, but a forwarding
    // IPv6 node sends one for every such drop (rate-limited): only netfilter dropping it
    // here is visible, and decides.
    let v6 = flow.family != AF_INET;
    let pmtud_worked = ev.frag_dropped.count == 0 && (v6 || frag_needed_generated(ev));
    let (severity, tail, remediation) = if pmtud_worked {
        (
            Severity::Info,
            if v6 {
                "; the kernel answers each with an ICMPv6 packet-too-big and none was dropped here, so PMTUD can recover the flow"
            } else {
                "; ICMP frag-needed went back to the sender, so PMTUD can recover the flow"
            },
            format!(
                "Nothing is broken yet, but every new flow pays a drop and a retransmit: set the pod/CNI MTU to at most {} so packets fit the overlay.",
                ev.mtu
            ),
        )
    } else {
        (
            Severity::Warning,
            if v6 {
                "; this node's netfilter drops the ICMPv6 packet-too-big meant for the sender, so it cannot learn the path MTU"
            } else {
                "; no ICMP frag-needed went back, so the sender cannot learn the path MTU"
            },
            format!(
                "Set the pod/CNI MTU to at most {}, or clamp TCP MSS (`{CLAMP_MSS}`).",
                ev.mtu
            ),
        )
    };
    let summary = format!(
        "DF packets of {src} -> {dst}:{} ({} bytes) are dropped: larger than {iface}'s MTU {}{tail}.",
        flow.dport, ev.len, ev.mtu
    );
    let mut f = with_flow(
        Finding::new(
            Kind::DfOversizeDrop,
            Layer::OverlayMtu,
            severity,
            summary,
            remediation,
            ctx.now,
        ),
        ev,
    );
    f.evidence = Evidence::Oversize(OversizeEvidence {
        drop_reason: ctx.names.drop_reason(ev.drop.reason),
        packet_len: ev.len,
        egress_interface: iface.clone(),
        egress_mtu: ev.mtu,
        frag: frag_evidence(ev, ctx.icmp_watched),
        candidate_backends: Vec::new(),
    });
    f.interface = Some(iface);
    f
}

pub(super) fn pmtud_stall(ev: &Event, ctx: &Context<'_>) -> Finding {
    let flow = &ev.flow;
    let (src, dst) = (addr(flow, &flow.saddr), addr(flow, &flow.daddr));
    let generated_here = frag_needed_generated(ev);
    let mut evidence = BlackholeEvidence {
        fullsize_retransmits: ev.retrans,
        oversize_drops: ev.drop.count,
        mss: ev.mtu,
        segment_len: ev.len,
        frag: frag_evidence(ev, ctx.icmp_watched),
        ..Default::default()
    };
    let frag = if flow.family == AF_INET {
        "ICMP frag-needed"
    } else {
        "ICMPv6 packet-too-big"
    };
    let why = if ev.frag_dropped.count > 0 {
        // A frag-needed this node generated is dropped on its way out; one it forwards
        // is dropped in forward (or input, when addressed to the node itself). No
        // tracepoint shows an IPv6 packet-too-big being sent, but this node sends one
        // for each of its own oversize drops of the flow: with those, the one dropped
        // was its own.
        let v6 = flow.family != AF_INET;
        let hook = if generated_here || (v6 && ev.drop.count > 0) {
            NetfilterHook::Output
        } else {
            NetfilterHook::Forward
        };
        evidence.netfilter_hook = Some(hook);
        evidence.drop_reason = Some("NETFILTER_DROP");
        format!(
            "the {frag} meant for the sender is dropped by netfilter on this node ({} hook, {} times)",
            hook.as_str(),
            ev.frag_dropped.count
        )
    } else if ev.icmp_rcvd.count > 0 {
        format!(
            "ICMP frag-needed (MTU {}) reached this node {} times but the sender never shrank its segments (filtered before the pod, or PMTUD disabled there)",
            ev.icmp_rcvd.mtu, ev.icmp_rcvd.count
        )
    } else if generated_here {
        format!(
            "this node generated {frag} (MTU {}) {} times, but it never took effect at the sender: it is lost or ignored between this node and the sender",
            ev.icmp.mtu, ev.icmp.count
        )
    } else {
        // The kernel reports a black hole only with MTU evidence: here, oversize drops.
        format!(
            "its full-size packets are dropped on this node as larger than the egress MTU ({} times) and no frag-needed goes back",
            ev.drop.count
        )
    };
    let summary = format!(
        "PMTUD black hole: {src}:{} -> {dst}:{} keeps retransmitting full-size segments ({} in a row, {} bytes, MSS {}) and {why}.",
        flow.sport, flow.dport, ev.retrans, ev.len, ev.mtu
    );
    let remediation = format!(
        "Fix the MTU (pod/CNI MTU = underlay MTU - overlay overhead); clamp TCP MSS (`{CLAMP_MSS}`); allow ICMP type 3 code 4; or set `sysctl -w net.ipv4.tcp_mtu_probing=1` on the sender."
    );
    let mut f = with_flow(
        Finding::new(
            Kind::PmtudBlackhole,
            Layer::IcmpFiltered,
            Severity::Critical,
            summary,
            remediation,
            ctx.now,
        ),
        ev,
    );
    f.evidence = Evidence::Blackhole(evidence);
    f
}

/// What sent a stalled segment again smaller, as the flow's namespace tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShrunkBy {
    /// The kernel's MTU probing: on in the namespace, and nothing else explains it.
    MtuProbing,
    /// The route or its device now carries an MTU (`mtu`) the segment exceeded: a
    /// route or link MTU changed, by hand or by a frag-needed the kernel learned from.
    /// PMTUD worked, or someone worked around the path: no black hole is shown.
    MtuChange(u32),
    /// MTU probing is off there and no MTU explains it (a change since undone): no
    /// cause can be named, and no black hole is claimed.
    Unexplained,
}

/// Why the `MSS_SHRUNK` event `ev` (its `len` the segment before) happened, judged on
/// `sender` (read after the event, from the flow's namespace). Unknown probing (the
/// sysctl unreadable) is taken as on: the kernel's own rule still saw the shrink.
pub(crate) fn shrunk_by(ev: &Event, sender: &SenderPath) -> ShrunkBy {
    let before = stall::smallest_packet(ev.flow.family, ev.len);
    match (sender.path_mtu, sender.tcp_mtu_probing) {
        (Some(mtu), _) if mtu > 0 && stall::exceeds(before, mtu) => ShrunkBy::MtuChange(mtu),
        (_, Some(0)) => ShrunkBy::Unexplained,
        _ => ShrunkBy::MtuProbing,
    }
}

/// A stall with no MTU evidence that ended with the segment sent smaller: the kernel's
/// MTU probing found the black hole the path never reported (its frag-needed filtered
/// or never sent). Recovered, but every such flow pays the seconds it stalled: a
/// warning about the path, not a page.
pub(super) fn mss_shrunk(ev: &Event, ctx: &Context<'_>) -> Finding {
    let flow = &ev.flow;
    let (src, dst) = (addr(flow, &flow.saddr), addr(flow, &flow.daddr));
    let seconds_lost = if ev.window_ms == WINDOW_ALL {
        0.0
    } else {
        f64::from(ev.window_ms) / 1000.0
    };
    let summary = format!(
        "PMTUD black hole on the path, masked by MTU probing: {src}:{} -> {dst}:{} retransmitted its {}-byte segment {} times with no ICMP frag-needed for it, until the sender's TCP MTU probing shrank the MSS to {} ({seconds_lost:.1} s lost). Large packets are dropped somewhere between this node and {dst} and the path's frag-needed never arrives; every new flow through it stalls the same way.",
        flow.sport, flow.dport, ev.len, ev.retrans, ev.mtu
    );
    let remediation = format!(
        "Find the hop whose MTU is below the flow's ({} bytes of payload did not pass): `node-diag probe {dst}` from this node, then fix its MTU or allow ICMP type 3 code 4 (IPv6: packet-too-big) from it; meanwhile clamp TCP MSS (`{CLAMP_MSS}`).",
        ev.len
    );
    let mut f = with_flow(
        Finding::new(
            Kind::PmtudBlackhole,
            Layer::IcmpFiltered,
            Severity::Warning,
            summary,
            remediation,
            ctx.now,
        ),
        ev,
    );
    f.evidence = Evidence::Recovered(RecoveredEvidence {
        recovered_by: Recovery::TcpMtuProbing,
        fullsize_retransmits: ev.retrans,
        mss_before: ev.len,
        mss_after: ev.mtu,
        seconds_lost,
        frag: frag_evidence(ev, ctx.icmp_watched),
        candidate_backends: Vec::new(),
    });
    f
}

/// The same stall as a black hole, but with no sign that size is the problem: the peer
/// stopped answering altogether.
pub(super) fn tcp_stall(ev: &Event, ctx: &Context<'_>) -> Finding {
    let flow = &ev.flow;
    let (src, dst) = (addr(flow, &flow.saddr), addr(flow, &flow.daddr));
    let why = if ev.len < ev.mtu {
        format!(
            "The stalled segment ({} bytes) is shorter than the MSS ({}), so size is not the problem",
            ev.len, ev.mtu
        )
    } else if let Some(mtu) = pmtud_worked_for(ev) {
        // The kernel found the frag-needed it had no longer applies: the segments shrank.
        format!(
            "PMTUD already worked for this flow (a frag-needed announced MTU {mtu} and its segments now fit it), so size is not the problem"
        )
    } else if ctx.icmp_watched || ev.icmp_rcvd.count > 0 {
        "With no oversize drop and no ICMP frag-needed for this flow, size is not the problem"
            .to_owned()
    } else {
        // A frag-needed from a router beyond this node may have come and gone unwatched.
        "No oversize drop here and no ICMP frag-needed generated or dropped here, so size is probably not the problem (whether one arrived from the network was not watched)"
            .to_owned()
    };
    let summary = format!(
        "Connection {src}:{} -> {dst}:{} stalled: the same segment was retransmitted {} times and nothing came back. {why}: the peer went silent (node or pod gone, a firewall or NetworkPolicy applied mid-connection, an idle timeout on a middlebox).",
        flow.sport, flow.dport, ev.retrans
    );
    let remediation = format!(
        "Check that {dst} is still up and reachable (`ping`, the pod's status, its node), then rules changed on the path to {dst}:{}. If only large transfers hang while small requests work, run `node-diag probe {dst}` to look for a path MTU black hole beyond this node.",
        flow.dport
    );
    let mut f = with_flow(
        Finding::new(
            Kind::TcpStall,
            Layer::Unknown,
            Severity::Warning,
            summary,
            remediation,
            ctx.now,
        ),
        ev,
    );
    f.evidence = Evidence::Stall(StallEvidence {
        retransmits: ev.retrans,
        segment_len: ev.len,
        mss: ev.mtu,
        oversize_drops: 0,
        frag: frag_evidence(ev, ctx.icmp_watched),
        candidate_backends: Vec::new(),
    });
    f
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use node_diag_common::{Event, IcmpInfo, event_kind};
    use serde_json::Value;

    use super::super::testkit::*;
    use crate::findings::{Kind, Layer, Severity};

    #[test]
    fn a_shrink_is_mtu_probing_only_when_probing_is_on_and_no_mtu_explains_it() {
        use super::{ShrunkBy, shrunk_by};
        use crate::host_network::SenderPath;
        let mut ev = event(event_kind::MSS_SHRUNK, 0);
        ev.len = 1410;
        ev.mtu = 1024;
        let sender = |probing, mtu| SenderPath {
            tcp_mtu_probing: probing,
            path_mtu: mtu,
        };
        assert_eq!(
            shrunk_by(&ev, &sender(Some(1), Some(1450))),
            ShrunkBy::MtuProbing
        );
        assert_eq!(shrunk_by(&ev, &sender(None, None)), ShrunkBy::MtuProbing);
        // 1410 + 40 = 1450 fits a 1450 route; not a 1300 one, set by hand mid-stall.
        assert_eq!(
            shrunk_by(&ev, &sender(Some(1), Some(1300))),
            ShrunkBy::MtuChange(1300)
        );
        assert_eq!(
            shrunk_by(&ev, &sender(Some(0), Some(1300))),
            ShrunkBy::MtuChange(1300)
        );
        assert_eq!(
            shrunk_by(&ev, &sender(Some(0), Some(1450))),
            ShrunkBy::Unexplained
        );
    }

    #[test]
    fn oversize_drop_without_frag_needed_is_a_warning() {
        let mut ev = event(event_kind::DF_OVERSIZE, 0);
        ev.drop = dropped(93, 1, 77, 3);
        ev.mtu = 1450;
        ev.len = 1500;
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::DfOversizeDrop, Layer::OverlayMtu));
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.interface.as_deref(), Some("vpod0"));
        assert_eq!(f.evidence.to_map()["egress_mtu"], 1450);
        assert_eq!(f.evidence.to_map()["packet_len"], 1500);
        assert!(f.summary.contains("MTU 1450"), "{}", f.summary);
    }

    #[test]
    fn oversize_drop_with_frag_needed_sent_back_is_info() {
        let mut ev = event(event_kind::DF_OVERSIZE, 0);
        ev.icmp = frag_needed_sent(1, 1450);
        let f = run(&ev).unwrap();
        assert_eq!(f.severity, Severity::Info);
        assert_eq!(f.evidence.to_map()["frag_needed_sent"], 1);
        assert_eq!(f.evidence.to_map()["frag_needed_mtu"], 1450);
    }

    #[test]
    fn stall_with_locally_dropped_frag_needed_names_the_hook() {
        let mut ev = event(event_kind::PMTUD_STALL, 0);
        ev.retrans = 3;
        ev.mtu = 1448;
        ev.len = 1448;
        ev.icmp = frag_needed_sent(4, 0);
        ev.frag_dropped = dropped(12, 4, 77, 0);
        let f = run(&ev).unwrap();
        assert_eq!(
            (f.kind, f.layer),
            (Kind::PmtudBlackhole, Layer::IcmpFiltered)
        );
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.evidence.to_map()["netfilter_hook"], "output");
        assert_eq!(f.evidence.to_map()["frag_needed_dropped"], 4);
        assert!(f.remediation.contains("tcp_mtu_probing=1"));
    }

    #[test]
    fn ipv6_packet_too_big_of_this_nodes_own_drops_is_dropped_in_output() {
        let mut ev = event(event_kind::PMTUD_STALL, 0);
        ev.flow.family = node_diag_common::AF_INET6;
        ev.retrans = 3;
        ev.drop = dropped(12, 3, 77, 3);
        ev.frag_dropped = dropped(12, 3, 77, 0);
        let f = run(&ev).unwrap();
        assert_eq!(f.evidence.to_map()["netfilter_hook"], "output");
        // Without oversize drops here the packet-too-big came from beyond: forwarded.
        ev.drop = Default::default();
        let f = run(&ev).unwrap();
        assert_eq!(f.evidence.to_map()["netfilter_hook"], "forward");
    }

    #[test]
    fn black_hole_on_oversize_drops_alone_names_them() {
        let mut ev = event(event_kind::PMTUD_STALL, 0);
        ev.drop = dropped(12, 2, 1, 3);
        let f = run(&ev).unwrap();
        assert_eq!(f.layer, Layer::IcmpFiltered);
        assert!(
            f.summary.contains("larger than the egress MTU (2 times)"),
            "{}",
            f.summary
        );
        assert!(f.evidence.to_map().get("netfilter_hook").is_none());
    }

    #[test]
    fn stall_without_mtu_evidence_is_a_silent_peer_not_a_black_hole() {
        let mut ev = event(event_kind::TCP_STALL, 0);
        ev.retrans = 3;
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpStall, Layer::Unknown));
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.evidence.to_map()["oversize_drops"], 0);
        assert_eq!(f.evidence.to_map()["frag_needed_dropped"], 0);
        assert!(
            f.summary.contains("size is not the problem"),
            "{}",
            f.summary
        );
    }

    #[test]
    fn stall_with_icmp_unwatched_says_frag_needed_received_is_unknown() {
        let mut ev = event(event_kind::TCP_STALL, 0);
        ev.retrans = 3;
        (ev.len, ev.mtu) = (1398, 1398);
        let f = run_unwatched(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpStall, Layer::Unknown));
        assert_eq!(f.evidence.to_map()["frag_needed_received"], Value::Null);
        assert_eq!(f.evidence.to_map()["icmp_watch"], "off");
        assert!(f.summary.contains("probably not"), "{}", f.summary);
        assert!(
            !f.summary.contains("size is not the problem"),
            "{}",
            f.summary
        );
        // Watched: none received is a fact.
        let f = run(&ev).unwrap();
        assert_eq!(f.evidence.to_map()["frag_needed_received"], 0);
        assert!(f.evidence.to_map().get("icmp_watch").is_none());
    }

    #[test]
    fn a_segment_shrunk_by_mtu_probing_is_a_recovered_black_hole() {
        let mut ev = event(event_kind::MSS_SHRUNK, 0);
        (ev.retrans, ev.len, ev.mtu, ev.window_ms) = (4, 1398, 1024, 6_200);
        let f = run(&ev).unwrap();
        assert_eq!(
            (f.kind, f.layer, f.severity),
            (Kind::PmtudBlackhole, Layer::IcmpFiltered, Severity::Warning)
        );
        let e = f.evidence.to_map();
        assert_eq!(e["recovered_by"], "tcp_mtu_probing");
        assert_eq!(
            (e["mss_before"].clone(), e["mss_after"].clone()),
            (1398.into(), 1024.into())
        );
        assert_eq!(e["seconds_lost"], 6.2);
        assert_eq!(e["fullsize_retransmits"], 4);
        assert!(f.summary.contains("masked by MTU probing"), "{}", f.summary);
    }

    #[test]
    fn stall_after_pmtud_worked_says_so() {
        // The segments shrank to the 1450 the frag-needed announced, then the peer died.
        let mut ev = event(event_kind::TCP_STALL, 0);
        ev.retrans = 3;
        (ev.mtu, ev.len) = (1398, 1398);
        ev.icmp_rcvd = IcmpInfo {
            mtu: 1450,
            ..frag_needed_sent(1, 1450)
        };
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpStall, Layer::Unknown));
        assert!(
            f.summary.contains("PMTUD already worked for this flow"),
            "{}",
            f.summary
        );
        assert_eq!(f.evidence.to_map()["frag_needed_received_mtu"], 1450);
    }

    #[test]
    fn stall_of_a_short_segment_says_size_is_not_the_problem() {
        let mut ev = event(event_kind::TCP_STALL, 0);
        ev.retrans = 3;
        (ev.len, ev.mtu) = (200, 1398);
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpStall, Layer::Unknown));
        assert_eq!(f.evidence.to_map()["segment_len"], 200);
        assert!(
            f.summary
                .contains("(200 bytes) is shorter than the MSS (1398)"),
            "{}",
            f.summary
        );
    }

    /// IPv6's packet-too-big, recorded by the kernel with the oversize drop it answers.
    fn packet_too_big_sent(count: u32, mtu: u32) -> IcmpInfo {
        IcmpInfo {
            icmp_type: node_diag_common::icmpv6::PKT_TOOBIG,
            icmp_code: 0,
            ..frag_needed_sent(count, mtu)
        }
    }

    fn v6_event(kind: u32) -> Event {
        let mut ev = event(kind, 0);
        ev.flow.family = node_diag_common::AF_INET6;
        ev.flow.saddr = "fd00:244:1::7".parse::<Ipv6Addr>().unwrap().octets();
        ev.flow.daddr = "fd00:244:2::9".parse::<Ipv6Addr>().unwrap().octets();
        ev
    }

    #[test]
    fn ipv6_black_hole_whose_packet_too_big_this_node_drops_names_the_output_hook() {
        let mut ev = v6_event(event_kind::PMTUD_STALL);
        (ev.retrans, ev.mtu, ev.len) = (3, 1428, 1428);
        ev.icmp = packet_too_big_sent(4, 1450);
        ev.frag_dropped = dropped(12, 4, 77, 0);
        let f = run(&ev).unwrap();
        assert_eq!(f.layer, Layer::IcmpFiltered);
        let e = f.evidence.to_map();
        assert_eq!(e["netfilter_hook"], "output");
        assert_eq!(e["frag_needed_sent"], 4);
        assert!(
            f.summary
                .contains("the ICMPv6 packet-too-big meant for the sender is dropped"),
            "{}",
            f.summary
        );
    }

    #[test]
    fn ipv6_stall_after_a_packet_too_big_shrank_the_segments_says_pmtud_worked() {
        let mut ev = v6_event(event_kind::TCP_STALL);
        (ev.retrans, ev.mtu, ev.len) = (3, 1378, 1378);
        ev.icmp = packet_too_big_sent(1, 1450);
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpStall, Layer::Unknown));
        assert!(
            f.summary
                .contains("a frag-needed announced MTU 1450 and its segments now fit it"),
            "{}",
            f.summary
        );
        // An IPv4 error with the same numbers is no frag-needed.
        ev.icmp = IcmpInfo {
            icmp_type: 3,
            icmp_code: 0,
            ..ev.icmp
        };
        assert!(!run(&ev).unwrap().summary.contains("PMTUD already worked"));
    }

    #[test]
    fn ipv6_oversize_drop_is_not_called_unanswered() {
        let mut ev = event(event_kind::DF_OVERSIZE, 0);
        ev.flow.family = node_diag_common::AF_INET6;
        ev.flow.daddr = "fd00::2".parse::<Ipv6Addr>().unwrap().octets();
        (ev.mtu, ev.len) = (1450, 1500);
        let f = run(&ev).unwrap();
        assert_eq!(f.severity, Severity::Info, "{}", f.summary);
        assert!(f.summary.contains("packet-too-big"), "{}", f.summary);
        assert!(
            !f.summary.contains("no ICMP frag-needed went back"),
            "{}",
            f.summary
        );
        ev.frag_dropped = dropped(12, 1, 0, 0);
        let f = run(&ev).unwrap();
        assert_eq!(f.severity, Severity::Warning);
        assert!(
            f.summary.contains("drops the ICMPv6 packet-too-big"),
            "{}",
            f.summary
        );
    }
}
