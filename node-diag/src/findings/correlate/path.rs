//! Verdicts from probing a flow's path. A stall on full-size segments with no MTU
//! evidence on this node, or a connect timing out with none, may come from beyond the
//! node: a router whose link is smaller and whose frag-needed is filtered, or a hop
//! dropping the tunnel's UDP. The kernel cannot see either; DF echo probes of the path
//! can. Which findings ask for a probe ([`question`]) and what its result makes of them
//! ([`judge`]) are decided here, pure; the probing itself is the agent's (`crate::probe`
//! sends, `agent::path_probe` bounds it), and fills in [`PathCheck`].

use std::{net::IpAddr, time::SystemTime};

use crate::findings::{
    Finding, Kind, Layer, Severity, Status,
    evidence::{
        BlackholeEvidence, ConnectEvidence, Evidence, PathEvidence, PathProbeEvidence,
        PathProbeResult, StallEvidence,
    },
};

/// MSS clamping, the stop-gap for every MTU fault.
const CLAMP_MSS: &str = "iptables -t mangle -A POSTROUTING -p tcp --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu";

/// What a finding asks of its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Question {
    /// A stall on full-size segments with no MTU evidence here: which sizes cross?
    Size,
    /// A connect timing out with no evidence here, or failing because its next hop
    /// never answered neighbour resolution: does the tunnel carry packets while its
    /// remote endpoint answers on the underlay? Only probed for destinations the node
    /// routes through a tunnel.
    Tunnel,
}

/// Whether `f` is a verdict the path can settle, and how.
pub(crate) fn question(f: &Finding) -> Option<Question> {
    match (f.kind, f.layer, base(&f.evidence)) {
        (Kind::TcpStall, _, Evidence::Stall(e)) if full_size_without_evidence(&e) => {
            Some(Question::Size)
        }
        (Kind::TcpTimeout, Layer::Unknown, Evidence::Connect(_)) => Some(Question::Tunnel),
        // A next hop through a tunnel whose neighbour entry is learned through it (ARP
        // over the VXLAN, not a CNI's static entry) fails when the tunnel is lost.
        (Kind::TcpTimeout | Kind::TcpUnreachable, Layer::CniRouting, Evidence::Connect(e))
            if next_hop_unresolved(&e) =>
        {
            Some(Question::Tunnel)
        }
        _ => None,
    }
}

/// The attempt's packets died waiting for the next hop's link-layer address: dropped
/// with a neighbour reason, or dropped otherwise where the next hop was found unresolved
/// (the kernel purges a neighbour's queue with no reason when its resolution restarts
/// while it fails, as any other packet to that next hop can make it).
fn next_hop_unresolved(e: &ConnectEvidence) -> bool {
    e.drop
        .as_ref()
        .is_some_and(|d| d.drop_reason.starts_with("NEIGH_"))
        || e.drop_site.as_ref().is_some_and(|s| s.neighbour.is_some())
}

/// Whether `f` is a black hole a probe found on the path: nothing on this node shows
/// it heal, so only probing the path again can close it.
pub(crate) fn reprobed(f: &Finding) -> bool {
    f.kind == Kind::PmtudBlackhole && f.layer == Layer::Path
}

/// Whether a probe of a black-holed path shows it healed: the peer answered and every
/// size up to the egress MTU crossed, or the size lost drew a frag-needed (the hop's
/// ICMP now gets through, and PMTUD shrinks the flow's segments itself). A silent peer
/// shows nothing either way.
fn healed(check: &PathCheck) -> bool {
    let peer = &check.peer;
    peer.answered() && (peer.smallest_lost.is_none() || peer.frag_needed.is_some())
}

/// A stalled full-size segment with nothing on this node saying size is the problem.
fn full_size_without_evidence(e: &StallEvidence) -> bool {
    e.mss > 0
        && e.segment_len >= e.mss
        && e.oversize_drops == 0
        && e.frag.frag_needed_sent == 0
        && e.frag.frag_needed_dropped == 0
        && e.frag.frag_needed_received.unwrap_or(0) == 0
}

/// One target's probes: echo requests with DF, sizes in IP packet bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Leg {
    pub(crate) target: Option<IpAddr>,
    /// Largest size answered; `None`: none was.
    pub(crate) largest_ok: Option<u32>,
    /// Smallest size that drew no answer or a frag-needed.
    pub(crate) smallest_lost: Option<u32>,
    /// A frag-needed (packet too big) a probe drew: who sent it, and its MTU.
    pub(crate) frag_needed: Option<(IpAddr, Option<u32>)>,
    /// Echo requests sent to this target.
    pub(crate) probes: u32,
}

impl Leg {
    pub(crate) fn answered(&self) -> bool {
        self.largest_ok.is_some()
    }
}

/// A probe run for one finding: towards the peer (through the overlay when the node
/// routes it there), and towards the tunnel's remote endpoint on the underlay when
/// there is a tunnel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PathCheck {
    pub(crate) peer: Leg,
    pub(crate) underlay: Option<Leg>,
}

/// What a probe run makes of the finding that asked for it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PathVerdict {
    /// A new verdict replacing the original (withdrawn).
    Replace(Finding),
    /// The original verdict stands; the probe's result joins its evidence.
    Annotate(Finding),
    /// A path black hole probed again whose path now carries the large size (or answers
    /// it with a frag-needed, so PMTUD works again): the original resolves, with this
    /// probe in its evidence.
    Healed(Finding),
}

/// Judges `original` (a finding [`question`] asked about) on `check`. Pure.
pub(crate) fn judge(original: &Finding, check: &PathCheck, now: SystemTime) -> PathVerdict {
    let mut probe = evidence(check);
    match question(original) {
        Some(Question::Size) => judge_size(original, check, probe, now),
        Some(Question::Tunnel) => judge_tunnel(original, check, probe, now),
        None if reprobed(original) => {
            let healed = healed(check);
            probe.path_probe = Some(if healed {
                PathProbeResult::Passed
            } else if check.peer.answered() {
                PathProbeResult::Blackhole
            } else {
                PathProbeResult::NoReply
            });
            probe.path_mtu = check.peer.largest_ok.filter(|_| !healed);
            let f = annotated(original, probe);
            if healed {
                PathVerdict::Healed(f)
            } else {
                PathVerdict::Annotate(f)
            }
        }
        None => {
            probe.path_probe = None;
            PathVerdict::Annotate(annotated(original, probe))
        }
    }
}

fn evidence(check: &PathCheck) -> PathProbeEvidence {
    let peer = &check.peer;
    let under = check.underlay.as_ref();
    PathProbeEvidence {
        path_probe: None,
        path_probe_target: peer.target,
        path_probe_largest_ok: peer.largest_ok,
        path_probe_smallest_lost: peer.smallest_lost,
        path_mtu: None,
        path_probe_frag_needed_from: peer.frag_needed.map(|(from, _)| from),
        path_probe_frag_needed_mtu: peer.frag_needed.and_then(|(_, mtu)| mtu),
        path_probe_packets: peer.probes + under.map_or(0, |u| u.probes),
        underlay_probe_target: under.and_then(|u| u.target),
        underlay_probe_answered: under.map(Leg::answered),
        underlay_probe_largest_ok: under.and_then(|u| u.largest_ok),
        underlay_probe_smallest_lost: under.and_then(|u| u.smallest_lost),
    }
}

fn annotated(original: &Finding, probe: PathProbeEvidence) -> Finding {
    let mut f = original.clone();
    // Refreshes the stored verdict: the stall itself was already counted.
    f.count = 0;
    f.evidence = Evidence::Path(Box::new(PathEvidence {
        base: base(&original.evidence),
        probe,
    }));
    f
}

/// The verdict's own evidence, once: a finding annotated earlier keeps its base.
fn base(e: &Evidence) -> Evidence {
    match e {
        Evidence::Path(p) => p.base.clone(),
        other => other.clone(),
    }
}

fn judge_size(
    original: &Finding,
    check: &PathCheck,
    mut probe: PathProbeEvidence,
    now: SystemTime,
) -> PathVerdict {
    let peer = &check.peer;
    let (Some(ok), Some(lost)) = (peer.largest_ok, peer.smallest_lost) else {
        probe.path_probe = Some(if peer.answered() {
            PathProbeResult::Passed
        } else {
            PathProbeResult::NoReply
        });
        return PathVerdict::Annotate(annotated(original, probe));
    };
    if peer.frag_needed.is_some() {
        probe.path_probe = Some(PathProbeResult::FragNeeded);
        return PathVerdict::Annotate(annotated(original, probe));
    }
    probe.path_probe = Some(PathProbeResult::Blackhole);
    probe.path_mtu = Some(ok);
    let stall = match base(&original.evidence) {
        Evidence::Stall(s) => s,
        _ => StallEvidence::default(),
    };
    let (src, dst) = (
        original.src.map(|a| a.to_string()).unwrap_or_default(),
        original.dst.map(|a| a.to_string()).unwrap_or_default(),
    );
    let target = peer.target.or(original.dst);
    let target = target.map(|a| a.to_string()).unwrap_or_default();
    let measured = if lost == ok + 1 {
        format!("the path MTU is {ok}")
    } else {
        format!("the path MTU is between {ok} and {}", lost - 1)
    };
    let underlay = match check.underlay.as_ref() {
        Some(u) => match (u.target, u.largest_ok, u.smallest_lost) {
            (Some(t), Some(uok), Some(ulost)) => {
                format!("; on the underlay, {t} answers packets up to {uok} bytes and not {ulost}")
            }
            (Some(t), Some(uok), None) => {
                format!("; on the underlay, {t} answers packets up to {uok} bytes")
            }
            _ => String::new(),
        },
        None => String::new(),
    };
    let summary = format!(
        "PMTUD black hole beyond this node: {src}:{} -> {dst}:{} keeps retransmitting full-size segments ({} in a row, {} bytes, MSS {}) and a probe of the path to {target} confirms it: packets up to {ok} bytes cross, {lost} bytes and more vanish with no ICMP frag-needed back, so {measured}{underlay}. A hop on the path has a smaller MTU and its frag-needed is filtered.",
        original.sport.unwrap_or_default(),
        original.dport.unwrap_or_default(),
        stall.retransmits,
        stall.segment_len,
        stall.mss,
    );
    let remediation = format!(
        "Find the hop with the smaller MTU between this node and {target} and raise its MTU, or lower the pod/CNI MTU to at most {ok}; allow ICMP type 3 code 4 (ICMPv6 packet too big) back through the path; meanwhile clamp TCP MSS (`{CLAMP_MSS}`) or set `sysctl -w net.ipv4.tcp_mtu_probing=1` on the sender."
    );
    let mut f = Finding::new(
        Kind::PmtudBlackhole,
        Layer::Path,
        Severity::Critical,
        summary,
        remediation,
        now,
    );
    copy_flow(&mut f, original);
    f.evidence = Evidence::Path(Box::new(PathEvidence {
        base: Evidence::Blackhole(BlackholeEvidence {
            fullsize_retransmits: stall.retransmits,
            oversize_drops: stall.oversize_drops,
            mss: stall.mss,
            segment_len: stall.segment_len,
            frag: stall.frag,
            candidate_backends: stall.candidate_backends,
            ..Default::default()
        }),
        probe,
    }));
    PathVerdict::Replace(f)
}

fn judge_tunnel(
    original: &Finding,
    check: &PathCheck,
    mut probe: PathProbeEvidence,
    now: SystemTime,
) -> PathVerdict {
    let peer = &check.peer;
    let under = check.underlay.as_ref();
    if under.is_none() && original.layer == Layer::CniRouting {
        // No tunnel on the route: the neighbour that failed is this node's own.
        let mut f = original.clone();
        f.count = 0;
        return PathVerdict::Annotate(f);
    }
    let (Some(under), false) = (under, peer.answered()) else {
        probe.path_probe = Some(if peer.answered() {
            PathProbeResult::OverlayPassed
        } else {
            PathProbeResult::NoReply
        });
        return PathVerdict::Annotate(annotated(original, probe));
    };
    let (Some(endpoint), true) = (under.target, under.answered()) else {
        probe.path_probe = Some(PathProbeResult::NoReply);
        return PathVerdict::Annotate(annotated(original, probe));
    };
    probe.path_probe = Some(PathProbeResult::OverlayLost);
    let through = peer
        .target
        .map(|a| a.to_string())
        .unwrap_or_else(|| "the peer".into());
    let dst = original.dst.map(|a| a.to_string()).unwrap_or_default();
    let local = original
        .src
        .map(|a| a.to_string())
        .unwrap_or_else(|| "this node".into());
    let failed = if original.kind == Kind::TcpUnreachable {
        "failed with EHOSTUNREACH (its next hop through the tunnel never answered neighbour resolution)"
    } else {
        "timed out"
    };
    let summary = format!(
        "Connection to {dst}:{} {failed}: the tunnel's packets are lost between the nodes. {endpoint}, the tunnel's remote endpoint, answers on the underlay, but nothing sent through the tunnel (to {through}) comes back, and no rule on this node dropped the flow.",
        original.dport.unwrap_or_default(),
    );
    let remediation = format!(
        "The tunnel's packets are lost between the nodes: check UDP 4789 (VXLAN; 8472 for Flannel's default, 6081 for Geneve) between this node and {endpoint} (security groups, host firewalls, the underlay's ACLs), in both directions; {local}'s own rules do not drop it."
    );
    let mut f = Finding::new(
        original.kind,
        Layer::Overlay,
        Severity::Critical,
        summary,
        remediation,
        now,
    );
    copy_flow(&mut f, original);
    f.count = original.count.max(1);
    f.first_seen.clone_from(&original.first_seen);
    f.evidence = Evidence::Path(Box::new(PathEvidence {
        base: base(&original.evidence),
        probe,
    }));
    PathVerdict::Replace(f)
}

/// Whether `stored` is the verdict a replacement of `original` withdraws: the same
/// kind and layer about the same flow (any source port) in the same namespace.
pub(crate) fn withdraws(original: &Finding, stored: &Finding) -> bool {
    stored.kind == original.kind
        && stored.layer == original.layer
        && stored.src == original.src
        && stored.dst == original.dst
        && stored.dport == original.dport
        && stored.netns == original.netns
}

/// Whether `stored` is `original`, a connect timeout, withdrawn while its path was
/// probed: the connect got through late, or its attempt ended refused or unreachable.
/// The probe's verdict is then dropped, or it would bring back (or replace) a timeout the
/// attempt's own last word ended: a slow probe (a loaded node, a TCG guest) finishes
/// after a late success.
pub(crate) fn withdrawn_meanwhile(original: &Finding, stored: &Finding) -> bool {
    original.kind == Kind::TcpTimeout
        && stored.status != Status::Active
        && withdraws(original, stored)
}

/// Whether `stored` is a black hole this node's kernel showed for `original`'s flow (an
/// OVERSIZE drop or a frag-needed, reported as layer other than `path`). The kernel can
/// find that evidence after the stall asked for a probe (a plain stall is upgraded once
/// the evidence arrives); its verdict is then the one that stands, and the probe's is
/// dropped, so the probe never adds a second black hole for a fault seen here. A black
/// hole the sender's MTU probing got out of settles it too, resolved as it is at once:
/// the flow moves again, and that warning is its verdict.
pub(crate) fn settled_here(original: &Finding, stored: &Finding) -> bool {
    question(original) == Some(Question::Size)
        && (stored.status == Status::Active || matches!(stored.evidence, Evidence::Recovered(_)))
        && stored.kind == Kind::PmtudBlackhole
        && stored.layer != Layer::Path
        && stored.src == original.src
        && stored.dst == original.dst
        && stored.dport == original.dport
        && stored.netns == original.netns
}

/// The flow, its pods and its Service, as the original verdict had them.
fn copy_flow(f: &mut Finding, original: &Finding) {
    f.src = original.src;
    f.dst = original.dst;
    f.dport = original.dport;
    f.sport = original.sport;
    f.netns = original.netns;
    f.service.clone_from(&original.service);
    f.backend = original.backend;
    f.backend_port = original.backend_port;
    f.pod.clone_from(&original.pod);
    f.peer_pod.clone_from(&original.peer_pod);
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{
        findings::evidence::{DropEvidence, FragEvidence, RecoveredEvidence, Recovery},
        host_network::drop_site::DropSite,
    };

    const POD_B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 244, 2, 9));
    const NODE_B: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 168, 77, 2));
    const ROUTER: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 168, 77, 254));

    fn flow(kind: Kind, layer: Layer, evidence: Evidence) -> Finding {
        let mut f = crate::findings::fixtures::finding(kind, layer);
        f.src = Some([10, 244, 1, 7].into());
        f.dst = Some(POD_B);
        f.sport = Some(40000);
        f.dport = Some(9000);
        f.netns = Some(4026532000);
        f.evidence = evidence;
        f
    }

    fn stall(segment_len: u32, frag: FragEvidence) -> Finding {
        flow(
            Kind::TcpStall,
            Layer::Unknown,
            Evidence::Stall(StallEvidence {
                retransmits: 3,
                segment_len,
                mss: 1398,
                oversize_drops: 0,
                frag,
                candidate_backends: Vec::new(),
            }),
        )
    }

    fn watched() -> FragEvidence {
        FragEvidence {
            frag_needed_received: Some(0),
            ..Default::default()
        }
    }

    fn timeout(layer: Layer) -> Finding {
        flow(
            Kind::TcpTimeout,
            layer,
            Evidence::Connect(Box::new(ConnectEvidence {
                errno: Some("ETIMEDOUT"),
                syn_retransmits: Some(2),
                ..Default::default()
            })),
        )
    }

    #[test]
    fn a_probe_of_a_timeout_withdrawn_meanwhile_is_dropped() {
        let original = timeout(Layer::Unknown);
        let mut stored = original.clone();
        assert!(!withdrawn_meanwhile(&original, &stored), "still active");
        for status in [Status::Resolved, Status::Superseded] {
            stored.status = status;
            assert!(withdrawn_meanwhile(&original, &stored), "{status}");
        }
        stored.layer = Layer::Firewall;
        assert!(!withdrawn_meanwhile(&original, &stored), "another verdict");
    }

    fn leg(target: IpAddr, ok: Option<u32>, lost: Option<u32>) -> Leg {
        Leg {
            target: Some(target),
            largest_ok: ok,
            smallest_lost: lost,
            frag_needed: None,
            probes: 8,
        }
    }

    #[test]
    fn a_black_hole_the_kernel_showed_drops_the_probe_verdict() {
        let asked = stall(1398, watched());
        let mut kernel = flow(
            Kind::PmtudBlackhole,
            Layer::Overlay,
            Evidence::Blackhole(BlackholeEvidence::default()),
        );
        kernel.sport = Some(40001);
        assert!(settled_here(&asked, &kernel));
        let mut probed = kernel.clone();
        probed.layer = Layer::Path;
        assert!(!settled_here(&asked, &probed), "the probe's own verdict");
        let mut resolved = kernel.clone();
        resolved.status = Status::Resolved;
        assert!(!settled_here(&asked, &resolved));
        resolved.evidence = Evidence::Recovered(RecoveredEvidence {
            recovered_by: Recovery::TcpMtuProbing,
            fullsize_retransmits: 4,
            mss_before: 1398,
            mss_after: 1024,
            seconds_lost: 3.0,
            frag: Default::default(),
            candidate_backends: Vec::new(),
        });
        assert!(settled_here(&asked, &resolved), "recovered by MTU probing");
        let mut other = kernel.clone();
        other.dport = Some(9001);
        assert!(!settled_here(&asked, &other), "another flow");
        assert!(
            !settled_here(&timeout(Layer::Unknown), &kernel),
            "a connect question is not about size"
        );
    }

    #[test]
    fn only_unexplained_full_size_stalls_and_unknown_timeouts_ask() {
        assert_eq!(question(&stall(1398, watched())), Some(Question::Size));
        // Frag-needed received unknown (not watched): still nothing on this node.
        assert_eq!(
            question(&stall(1398, FragEvidence::default())),
            Some(Question::Size)
        );
        assert_eq!(question(&stall(600, watched())), None, "short segment");
        let frag = FragEvidence {
            frag_needed_dropped: 1,
            ..watched()
        };
        assert_eq!(question(&stall(1398, frag)), None, "evidence here");
        let got = FragEvidence {
            frag_needed_received: Some(2),
            ..Default::default()
        };
        assert_eq!(question(&stall(1398, got)), None);
        assert_eq!(question(&timeout(Layer::Unknown)), Some(Question::Tunnel));
        assert_eq!(question(&timeout(Layer::Firewall)), None);
    }

    #[test]
    fn small_answered_large_lost_without_frag_needed_is_a_path_black_hole() {
        let check = PathCheck {
            peer: leg(POD_B, Some(1350), Some(1351)),
            underlay: Some(leg(NODE_B, Some(1400), Some(1401))),
        };
        let PathVerdict::Replace(f) = judge(&stall(1398, watched()), &check, SystemTime::now())
        else {
            panic!("a black hole replaces the stall");
        };
        assert_eq!((f.kind, f.layer), (Kind::PmtudBlackhole, Layer::Path));
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(
            (f.src, f.dst, f.dport),
            (Some([10, 244, 1, 7].into()), Some(POD_B), Some(9000))
        );
        let m = f.evidence.to_map();
        assert_eq!(m["path_probe"], "blackhole");
        assert_eq!(m["path_probe_largest_ok"], 1350);
        assert_eq!(m["path_probe_smallest_lost"], 1351);
        assert_eq!(m["path_mtu"], 1350);
        assert_eq!(m["path_probe_packets"], 16);
        assert_eq!(m["underlay_probe_largest_ok"], 1400);
        assert_eq!(m["underlay_probe_target"], "192.168.77.2");
        // The black hole family's keys, unchanged.
        assert_eq!(m["fullsize_retransmits"], 3);
        assert_eq!(m["segment_len"], 1398);
        assert_eq!(m["frag_needed_received"], 0);
        assert!(f.summary.contains("path MTU is 1350"), "{}", f.summary);
        assert!(f.summary.contains("192.168.77.2"), "{}", f.summary);
        let original = stall(1398, watched());
        let mut later = original.clone();
        later.sport = Some(40001);
        assert!(withdraws(&original, &later));
        assert!(!withdraws(&original, &f), "not the black hole itself");
    }

    #[test]
    fn a_path_black_hole_probed_again_heals_only_when_the_large_size_crosses() {
        let found = PathCheck {
            peer: leg(POD_B, Some(1350), Some(1351)),
            underlay: None,
        };
        let PathVerdict::Replace(hole) = judge(&stall(1398, watched()), &found, SystemTime::now())
        else {
            panic!("black hole");
        };
        assert!(reprobed(&hole));
        let PathVerdict::Annotate(still) = judge(&hole, &found, SystemTime::now()) else {
            panic!("the same sizes lost: still a black hole");
        };
        assert_eq!(
            (still.kind, still.layer),
            (Kind::PmtudBlackhole, Layer::Path)
        );
        assert_eq!(still.evidence.to_map()["path_probe"], "blackhole");
        assert_eq!(still.count, 0);
        let silent = PathCheck {
            peer: leg(POD_B, None, None),
            underlay: None,
        };
        let PathVerdict::Annotate(dead) = judge(&hole, &silent, SystemTime::now()) else {
            panic!("a silent peer heals nothing");
        };
        assert_eq!(dead.evidence.to_map()["path_probe"], "no_reply");
        for check in [
            PathCheck {
                peer: leg(POD_B, Some(1450), None),
                underlay: None,
            },
            PathCheck {
                peer: Leg {
                    frag_needed: Some((ROUTER, Some(1400))),
                    ..leg(POD_B, Some(1400), Some(1401))
                },
                underlay: None,
            },
        ] {
            let PathVerdict::Healed(f) = judge(&hole, &check, SystemTime::now()) else {
                panic!("healed: {check:?}");
            };
            let m = f.evidence.to_map();
            assert_eq!(m["path_probe"], "passed");
            assert_eq!(m["fullsize_retransmits"], 3, "the black hole's keys stay");
            assert!(withdraws(&hole, &f));
        }
    }

    #[test]
    fn a_bracket_is_named_as_a_bracket() {
        let check = PathCheck {
            peer: leg(POD_B, Some(1300), Some(1420)),
            underlay: None,
        };
        let PathVerdict::Replace(f) = judge(&stall(1398, watched()), &check, SystemTime::now())
        else {
            panic!("black hole");
        };
        assert!(f.summary.contains("between 1300 and 1419"), "{}", f.summary);
    }

    #[test]
    fn silence_frag_needed_and_a_clear_path_leave_the_stall() {
        for (check, result) in [
            (
                PathCheck {
                    peer: leg(POD_B, None, None),
                    underlay: Some(leg(NODE_B, Some(1500), None)),
                },
                "no_reply",
            ),
            (
                PathCheck {
                    peer: leg(POD_B, Some(1450), None),
                    underlay: None,
                },
                "passed",
            ),
            (
                PathCheck {
                    peer: Leg {
                        frag_needed: Some((ROUTER, Some(1400))),
                        ..leg(POD_B, Some(1400), Some(1401))
                    },
                    underlay: None,
                },
                "frag_needed",
            ),
        ] {
            let original = stall(1398, watched());
            let PathVerdict::Annotate(f) = judge(&original, &check, SystemTime::now()) else {
                panic!("{result}: the stall stays");
            };
            assert_eq!((f.kind, f.layer), (Kind::TcpStall, Layer::Unknown));
            assert_eq!(f.count, 0, "a refresh, not a new stall");
            let m = f.evidence.to_map();
            assert_eq!(m["path_probe"], result);
            assert_eq!(m["retransmits"], 3, "the stall's keys stay");
            // Judged again, the base is not nested.
            let PathVerdict::Annotate(g) = judge(&f, &check, SystemTime::now()) else {
                panic!("still a stall");
            };
            assert_eq!(g.evidence.to_map(), m);
        }
    }

    #[test]
    fn tunnel_lost_while_the_underlay_answers_is_the_overlay() {
        let check = PathCheck {
            peer: leg(POD_B, None, None),
            underlay: Some(leg(NODE_B, Some(84), None)),
        };
        let PathVerdict::Replace(f) = judge(&timeout(Layer::Unknown), &check, SystemTime::now())
        else {
            panic!("overlay");
        };
        assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::Overlay));
        assert!(
            f.remediation
                .contains("The tunnel's packets are lost between the nodes: check UDP 4789"),
            "{}",
            f.remediation
        );
        let m = f.evidence.to_map();
        assert_eq!(m["path_probe"], "overlay_lost");
        assert_eq!(m["underlay_probe_answered"], true);
        assert_eq!(m["errno"], "ETIMEDOUT");
    }

    #[test]
    fn a_neighbour_failed_through_a_lost_tunnel_is_the_overlay() {
        let mut unreachable = timeout(Layer::CniRouting);
        unreachable.kind = Kind::TcpUnreachable;
        let Evidence::Connect(e) = &mut unreachable.evidence else {
            unreachable!("connect evidence");
        };
        e.drop = Some(Box::new(DropEvidence {
            drop_reason: "NEIGH_FAILED".into(),
            syn_drops: 3,
            drop_interface: Some("vx0".into()),
            ..Default::default()
        }));
        assert_eq!(question(&unreachable), Some(Question::Tunnel));
        let check = PathCheck {
            peer: leg(POD_B, None, None),
            underlay: Some(leg(NODE_B, Some(84), None)),
        };
        let PathVerdict::Replace(f) = judge(&unreachable, &check, SystemTime::now()) else {
            panic!("overlay");
        };
        assert_eq!((f.kind, f.layer), (Kind::TcpUnreachable, Layer::Overlay));
        assert!(f.summary.contains("EHOSTUNREACH"), "{}", f.summary);
        assert!(withdraws(&unreachable, &unreachable.clone()));
        // No tunnel on the route: the routing verdict stands, unannotated.
        let PathVerdict::Annotate(g) =
            judge(&unreachable, &PathCheck::default(), SystemTime::now())
        else {
            panic!("stays");
        };
        assert_eq!((g.layer, g.count), (Layer::CniRouting, 0));
        assert_eq!(g.evidence, unreachable.evidence);
        // Another drop reason is routing, not a question for the path.
        let Evidence::Connect(e) = &mut unreachable.evidence else {
            unreachable!("connect evidence");
        };
        e.drop.as_mut().unwrap().drop_reason = "IP_NOROUTE".into();
        assert_eq!(question(&unreachable), None);
        // A queue purged without a reason, its next hop found unresolved: the same
        // question, and the same overlay verdict.
        let Evidence::Connect(e) = &mut unreachable.evidence else {
            unreachable!("connect evidence");
        };
        e.drop.as_mut().unwrap().drop_reason = "NOT_SPECIFIED".into();
        e.drop_site = Some(Box::new(DropSite {
            neighbour: Some("10.200.0.2 dev vx0 incomplete".into()),
            ..Default::default()
        }));
        assert_eq!(question(&unreachable), Some(Question::Tunnel));
        let PathVerdict::Replace(f) = judge(&unreachable, &check, SystemTime::now()) else {
            panic!("overlay");
        };
        assert_eq!((f.kind, f.layer), (Kind::TcpUnreachable, Layer::Overlay));
    }

    #[test]
    fn a_silent_underlay_or_a_working_tunnel_is_no_overlay_verdict() {
        for (check, result) in [
            (
                PathCheck {
                    peer: leg(POD_B, None, None),
                    underlay: Some(leg(NODE_B, None, None)),
                },
                "no_reply",
            ),
            (
                PathCheck {
                    peer: leg(POD_B, Some(84), None),
                    underlay: Some(leg(NODE_B, Some(84), None)),
                },
                "overlay_passed",
            ),
            (
                PathCheck {
                    peer: leg(POD_B, None, None),
                    underlay: None,
                },
                "no_reply",
            ),
        ] {
            let PathVerdict::Annotate(f) =
                judge(&timeout(Layer::Unknown), &check, SystemTime::now())
            else {
                panic!("{result}: the timeout stays");
            };
            assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::Unknown));
            assert_eq!(f.evidence.to_map()["path_probe"], result);
        }
    }
}
