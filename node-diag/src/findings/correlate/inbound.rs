//! Inbound SYN drops: a client elsewhere connects to a pod of this node and a filter here
//! (a NetworkPolicy's ingress rule, a host firewall) drops or rejects its SYN. The
//! client's node sees a timeout (or a refusal) it cannot explain; this node saw the drop.
//! One finding per client address, pod address and port (`tcp_syn_dropped`, layer
//! `firewall`), built from the kernel's aggregate entry ([`InboundKey`], [`InboundAgg`]),
//! whether its event or a map read brought it. A `NETFILTER_DROP` that the drop
//! namespace's conntrack counters show to be a full table's is layer `conntrack`
//! instead, as for a connect's own SYN ([`super::conntrack`]).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::SystemTime,
};

use node_diag_common::{AF_INET, Event, InboundAgg, InboundKey, icmp, icmpv6};

use super::conntrack;
use crate::findings::{
    Evidence, Finding, Kind, Layer, Severity,
    conntrack::Window,
    evidence::{
        ConntrackCause, ConntrackEvidence, DropEvidence, IcmpSent, InboundAction, InboundEvidence,
    },
    names::Names,
};

/// The kernel's entry an inbound event announced, as the map holds it.
pub(crate) fn entry_of(ev: &Event) -> (InboundKey, InboundAgg) {
    let key = InboundKey {
        saddr: ev.flow.saddr,
        daddr: ev.flow.daddr,
        netns: ev.netns,
        reason: ev.drop.reason,
        dport: ev.flow.dport,
        family: ev.flow.family,
        _pad: 0,
    };
    let rejected = ev.icmp.count > 0;
    let agg = InboundAgg {
        first_ns: ev.drop.last_ns,
        last_ns: ev.drop.last_ns,
        count: u64::from(ev.drop.count.max(1)),
        drop_netns: ev.drop.netns,
        ifindex: ev.drop.ifindex,
        pod_ifindex: ev.len,
        icmp_type: if rejected {
            ev.icmp.icmp_type as u16
        } else {
            0
        },
        icmp_code: if rejected {
            ev.icmp.icmp_code as u16
        } else {
            0
        },
    };
    (key, agg)
}

/// The event an entry found in the map (its own lost, or still queued) would have
/// carried, but for the first SYN's source port: what naming its rule or program reads.
pub(crate) fn event_of(key: &InboundKey, agg: &InboundAgg) -> Event {
    let rejected = agg.icmp_type != 0;
    Event {
        ts_ns: agg.first_ns,
        kind: node_diag_common::event_kind::INBOUND_SYN_DROPPED,
        flow: node_diag_common::FlowKey {
            saddr: key.saddr,
            daddr: key.daddr,
            sport: 0,
            dport: key.dport,
            family: key.family,
            _pad: 0,
        },
        netns: key.netns,
        drop: node_diag_common::DropInfo {
            last_ns: agg.first_ns,
            reason: key.reason,
            count: 1,
            netns: agg.drop_netns,
            ifindex: agg.ifindex,
            flags: 0,
            mtu: 0,
        },
        icmp: node_diag_common::IcmpInfo {
            last_ns: if rejected { agg.first_ns } else { 0 },
            icmp_type: agg.icmp_type.into(),
            icmp_code: agg.icmp_code.into(),
            netns: if rejected { agg.drop_netns } else { 0 },
            count: rejected.into(),
            ..Default::default()
        },
        len: agg.pod_ifindex,
        count: 1,
        ..Event::default()
    }
}

fn ip(family: u16, b: &[u8; 16]) -> IpAddr {
    if family == AF_INET {
        IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(*b)).to_canonical()
    }
}

/// The client's address of an inbound key.
pub(crate) fn client(key: &InboundKey) -> IpAddr {
    ip(key.family, &key.saddr)
}

/// The pod's address of an inbound key.
pub(crate) fn pod_addr(key: &InboundKey) -> IpAddr {
    ip(key.family, &key.daddr)
}

/// Whether the ICMP error this node sent for the SYN, just before a filter's drop of it,
/// was that filter's answer (a REJECT's unreachable or prohibited): any but a
/// frag-needed, which only an oversize packet's drop comes with.
fn rejected(key: &InboundKey, agg: &InboundAgg) -> bool {
    let (icmp_type, code) = (u32::from(agg.icmp_type), u32::from(agg.icmp_code));
    if key.family != AF_INET {
        // ICMPv6's too-big is a type of its own, never recorded as sent.
        return icmp_type == icmpv6::DEST_UNREACH;
    }
    icmp_type == icmp::DEST_UNREACH && code != icmp::FRAG_NEEDED
}

/// The finding of `count` drops of `key`'s SYNs (`agg` its kernel entry); `window`: the
/// drop namespace's conntrack counters around the first drop, when read.
pub(crate) fn finding(
    key: &InboundKey,
    agg: &InboundAgg,
    count: u64,
    names: &Names,
    now: SystemTime,
    window: Option<&Window>,
) -> Finding {
    let (src, dst) = (client(key), pod_addr(key));
    let reason = names.drop_reason(key.reason);
    let reject = rejected(key, agg);
    let first = event_of(key, agg);
    let cause = window
        .and_then(|w| conntrack::cause(&first.drop, &reason, w))
        .filter(|c| *c == ConntrackCause::TableFull);
    let evidence = InboundEvidence {
        action: reject.then_some(InboundAction::Reject),
        drop: DropEvidence {
            drop_reason: reason.clone(),
            syn_drops: u32::try_from(agg.count).unwrap_or(u32::MAX),
            return_path: false,
            drop_netns: (agg.drop_netns != 0).then_some(agg.drop_netns),
            drop_ifindex: (agg.ifindex != 0).then_some(agg.ifindex),
            drop_interface: (agg.ifindex != 0)
                .then(|| names.interface(agg.drop_netns, agg.ifindex))
                .flatten(),
        },
        pod_interface: (agg.pod_ifindex != 0)
            .then(|| names.interface(agg.drop_netns, agg.pod_ifindex))
            .flatten(),
        icmp_sent: (agg.icmp_type != 0).then_some(IcmpSent {
            icmp_sent_type: agg.icmp_type.into(),
            icmp_sent_code: agg.icmp_code.into(),
            icmp_sent_netns: (agg.drop_netns != 0).then_some(agg.drop_netns),
        }),
        conntrack: window.map(ConntrackEvidence::from),
        conntrack_cause: cause,
        ..InboundEvidence::default()
    };
    let target = format!("{dst}:{}", key.dport);
    if let (Some(cause), Some(w)) = (cause, window) {
        let dropped = format!("SYNs from {src} to {target} (a pod of this node)");
        let (summary, remediation) = conntrack::text(cause, w, &first, &dropped, &target);
        let mut f = Finding::new(
            Kind::TcpSynDropped,
            Layer::Conntrack,
            Severity::Warning,
            summary,
            remediation,
            now,
        );
        f.evidence = Evidence::Inbound(Box::new(evidence));
        return place(f, key, src, dst, count);
    }
    let (did, client_sees) = if reject {
        ("rejected", "refused or unreachable")
    } else {
        ("dropped", "timing out")
    };
    let mut f = Finding::new(
        Kind::TcpSynDropped,
        Layer::Firewall,
        Severity::Warning,
        format!(
            "this node's firewall {did} SYNs from {src} to {dst}:{} (a pod of this node, \
             {reason}): that client's connects are {client_sees}",
            key.dport
        ),
        "a NetworkPolicy ingress rule or a host firewall on this node blocks connections \
         to this pod's port: check the policies selecting the pod (kubectl get \
         networkpolicy -n <namespace>) and this node's FORWARD rules (iptables-save -c, \
         nft list ruleset); `rule` names the one whose counter rose with the drops, when \
         it could"
            .into(),
        now,
    );
    f.evidence = Evidence::Inbound(Box::new(evidence));
    place(f, key, src, dst, count)
}

/// `f` about `key`'s client, pod and port, `count` times.
fn place(mut f: Finding, key: &InboundKey, src: IpAddr, dst: IpAddr, count: u64) -> Finding {
    f.src = Some(src);
    f.dst = Some(dst);
    f.dport = Some(key.dport);
    f.netns = (key.netns != 0).then_some(key.netns);
    f.count = count;
    f
}

#[cfg(test)]
mod tests {
    use node_diag_common::{DropInfo, FlowKey, IcmpInfo, event_kind};

    use super::*;
    use crate::findings::correlate::testkit::{reasons, window};

    fn names() -> Names {
        Names::new(reasons(), |netns, ifindex| match (netns, ifindex) {
            (1, 2) => Some("vx0".into()),
            (1, 3) => Some("vpod0".into()),
            _ => None,
        })
    }

    /// The first drop of pod B's SYN to pod A's port 8080 (NETFILTER_DROP, 12), in the
    /// node's namespace 1, in on `vx0`, on its way to `vpod0`; the pod's namespace is 7.
    fn event(icmp: Option<(u32, u32)>) -> Event {
        let mut ev = Event {
            kind: event_kind::INBOUND_SYN_DROPPED,
            flow: FlowKey {
                saddr: [10, 244, 2, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                daddr: [10, 244, 1, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                sport: 40000,
                dport: 8080,
                family: AF_INET,
                _pad: 0,
            },
            netns: 7,
            drop: DropInfo {
                last_ns: 100,
                reason: 12,
                count: 1,
                netns: 1,
                ifindex: 2,
                ..DropInfo::default()
            },
            len: 3,
            count: 1,
            ..Event::default()
        };
        if let Some((t, c)) = icmp {
            ev.icmp = IcmpInfo {
                last_ns: 100,
                icmp_type: t,
                icmp_code: c,
                netns: 1,
                count: 1,
                ..IcmpInfo::default()
            };
        }
        ev
    }

    #[test]
    fn a_dropped_inbound_syn_names_client_pod_port_and_the_drop() {
        let (key, agg) = entry_of(&event(None));
        assert_eq!((key.netns, key.dport, agg.first_ns), (7, 8080, 100));
        // A map entry read before its event makes the same entry back.
        assert_eq!(entry_of(&event_of(&key, &agg)), (key, agg));
        let f = finding(&key, &agg, 1, &names(), SystemTime::now(), None);
        assert_eq!(
            (f.kind, f.layer, f.severity),
            (Kind::TcpSynDropped, Layer::Firewall, Severity::Warning)
        );
        assert_eq!(f.src, Some("10.244.2.9".parse().unwrap()));
        assert_eq!(f.dst, Some("10.244.1.7".parse().unwrap()));
        assert_eq!((f.dport, f.sport, f.netns), (Some(8080), None, Some(7)));
        let e = f.evidence.to_map();
        assert_eq!(e["drop_reason"], "NETFILTER_DROP");
        assert_eq!(e["drop_interface"], "vx0");
        assert_eq!(e["pod_interface"], "vpod0");
        // Nothing tells a silent drop from a `tcp reset` REJECT until the rule is named.
        assert!(e.get("action").is_none(), "{e:?}");
        assert!(f.summary.contains("timing out"), "{}", f.summary);
    }

    #[test]
    fn an_icmp_answer_sent_here_is_a_reject_and_a_named_rule_says_what_it_did() {
        let (key, agg) = entry_of(&event(Some((3, 13))));
        let f = finding(&key, &agg, 1, &names(), SystemTime::now(), None);
        let e = f.evidence.to_map();
        assert_eq!(e["action"], "reject");
        assert_eq!(
            (&e["icmp_sent_type"], &e["icmp_sent_code"]),
            (&3.into(), &13.into())
        );
        assert!(f.summary.contains("rejected"), "{}", f.summary);

        // Frag-needed is no filter's answer.
        let (key, agg) = entry_of(&event(Some((3, 4))));
        let f = finding(&key, &agg, 1, &names(), SystemTime::now(), None);
        assert!(f.evidence.to_map().get("action").is_none());
    }

    #[test]
    fn a_full_conntrack_table_is_conntrack_and_a_rule_with_room_stays_the_firewall() {
        let mut ev = event(None);
        ev.drop.netns = 77;
        let (key, agg) = entry_of(&ev);
        // Netns 77 at its limit, conntrack's own drops rising: the table dropped them.
        let full = window(100, 100, 3, 0);
        let f = finding(&key, &agg, 1, &names(), SystemTime::now(), Some(&full));
        assert_eq!((f.kind, f.layer), (Kind::TcpSynDropped, Layer::Conntrack));
        let e = f.evidence.to_map();
        assert_eq!(e["conntrack_cause"], "table_full");
        assert_eq!(e["conntrack_count"], 100);
        assert_eq!(f.dst, Some("10.244.1.7".parse().unwrap()));
        // Room in the table: the rule's drop, with the counters as evidence.
        let room = window(10, 100, 0, 0);
        let f = finding(&key, &agg, 1, &names(), SystemTime::now(), Some(&room));
        assert_eq!(f.layer, Layer::Firewall);
        let e = f.evidence.to_map();
        assert!(e.get("conntrack_cause").is_none(), "{e:?}");
        assert_eq!(e["conntrack_max"], 100);
    }
}
