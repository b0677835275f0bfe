//! The model proper: each interface's role (overlay, pod interface, node-side veth,
//! underlay), the largest MTU it may have, and the verdict. Overlays are held to their
//! underlay minus the encapsulation overhead; pod interfaces and node-side veths to the
//! ceiling, the smallest limit of the node's overlays that are up.

use std::{collections::HashSet, fmt::Write as _};

use serde::Serialize;

use super::encapsulation::Encapsulation;
use crate::host_network::{Family, Interface, LinkKind, Snapshot, UnderlaySource};

/// What an interface is to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A tunnel device: compared with its underlay.
    Overlay,
    /// The pod end of a veth whose other end is in the agent's namespace.
    PodInterface,
    /// The agent-namespace end of a pod's veth.
    NodeVeth,
    /// A device carrying an overlay's encapsulated packets (and, for a veth, its other
    /// end: two test "nodes" joined by a veth are not a node and its pod).
    Underlay,
    /// Anything else: listed, not compared.
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    Mismatch,
    /// A tunnel whose underlay could not be found.
    Unknown,
    /// A tunnel that is down: not carrying traffic, not judged.
    Down,
    NotApplicable,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Mismatch => "mismatch",
            Self::Unknown => "unknown",
            Self::Down => "down",
            Self::NotApplicable => "-",
        }
    }
}

/// One interface as judged by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MtuVerdict {
    pub netns: u32,
    pub netns_name: String,
    pub interface: String,
    pub ifindex: u32,
    pub kind: LinkKind,
    pub role: Role,
    pub up: bool,
    pub mtu: u32,
    /// For pod interfaces and node-side veths: the overlay they are compared with.
    pub overlay: Option<String>,
    pub overlay_mtu: Option<u32>,
    /// The overlay's underlay (for overlays: their own; for pods: their overlay's); for
    /// other devices, the device they sit on.
    pub underlay: Option<String>,
    pub underlay_mtu: Option<u32>,
    pub underlay_source: Option<UnderlaySource>,
    /// Label such as "VXLAN" or "VXLAN/IPv6".
    pub encapsulation: Option<String>,
    pub family: Option<Family>,
    /// The family was not in the tunnel's configuration and IPv4 was assumed.
    pub family_assumed: bool,
    pub overhead: Option<u32>,
    pub overhead_breakdown: Option<String>,
    /// The largest MTU this interface may have.
    pub expected_mtu: Option<u32>,
    /// `expected_mtu − mtu`: negative when the interface is too large.
    pub headroom: Option<i64>,
    pub verdict: Verdict,
    /// The arithmetic, or why there is none.
    pub detail: String,
}

impl MtuVerdict {
    fn new(i: &Interface, role: Role) -> Self {
        Self {
            netns: i.netns,
            netns_name: i.netns_name.clone(),
            interface: i.name.clone(),
            ifindex: i.ifindex,
            kind: i.kind.clone(),
            role,
            up: i.up,
            mtu: i.mtu,
            overlay: None,
            overlay_mtu: None,
            underlay: i.lower.as_ref().map(|l| l.name.clone()),
            underlay_mtu: i.lower.as_ref().map(|l| l.mtu),
            underlay_source: None,
            encapsulation: None,
            family: None,
            family_assumed: false,
            overhead: None,
            overhead_breakdown: None,
            expected_mtu: None,
            headroom: None,
            verdict: Verdict::NotApplicable,
            detail: String::new(),
        }
    }

    /// "pod eth0", "node-side veth veth1 (peer of pod-a eth0)", "vxlan vx0".
    fn subject(&self, peer: Option<(&str, &str)>) -> String {
        match self.role {
            Role::PodInterface => format!("pod {}", self.interface),
            Role::NodeVeth => match peer {
                Some((ns, name)) => {
                    format!("node-side veth {} (peer of {ns} {name})", self.interface)
                }
                None => format!("node-side veth {}", self.interface),
            },
            _ => format!("{} {}", self.kind, self.interface),
        }
    }

    fn judge(&mut self, arithmetic: &str, subject: &str, limit: u32) {
        let headroom = i64::from(limit) - i64::from(self.mtu);
        self.expected_mtu = Some(limit);
        self.headroom = Some(headroom);
        if headroom < 0 {
            self.verdict = Verdict::Mismatch;
            self.detail = format!("{arithmetic}, but {subject} is {}", self.mtu);
        } else {
            self.verdict = Verdict::Ok;
            self.detail = format!("{arithmetic}; {subject} is {}", self.mtu);
        }
    }
}

/// `underlays`: the (netns, ifindex) of every tunnel's underlay device.
fn role_of(i: &Interface, own: u32, underlays: &HashSet<(u32, u32)>) -> Role {
    if i.kind.is_tunnel() {
        return Role::Overlay;
    }
    if underlays.contains(&(i.netns, i.ifindex)) {
        return Role::Underlay;
    }
    if i.kind != LinkKind::Veth {
        return Role::Other;
    }
    let Some(peer) = i.veth_peer.as_ref() else {
        return Role::Other;
    };
    let Some(peer_ns) = peer.netns else {
        return Role::Other;
    };
    if underlays.contains(&(peer_ns, peer.ifindex)) {
        return Role::Underlay;
    }
    match peer_ns {
        p if i.netns != own && p == own => Role::PodInterface,
        p if i.netns == own && p != own => Role::NodeVeth,
        _ => Role::Other,
    }
}

fn source_note(i: &Interface, source: UnderlaySource, underlay: &str) -> Option<String> {
    let t = i.tunnel.as_ref();
    let how = match source {
        UnderlaySource::Bound => return None,
        UnderlaySource::RouteToRemote => format!(
            "the route to {}",
            t.and_then(|t| t.remote)
                .map_or_else(|| "its remote".into(), |a| a.to_string())
        ),
        UnderlaySource::LocalAddress => format!(
            "the device holding {}",
            t.and_then(|t| t.local)
                .map_or_else(|| "its local address".into(), |a| a.to_string())
        ),
        UnderlaySource::DefaultRoute => "the default route".into(),
        UnderlaySource::LargestPhysical => "the largest physical interface".into(),
    };
    Some(format!(
        "{} is not bound to a device; underlay {underlay} is {how}",
        i.name
    ))
}

fn overlay_verdict(i: &Interface) -> MtuVerdict {
    let mut v = MtuVerdict::new(i, Role::Overlay);
    let Some(enc) = Encapsulation::for_interface(i) else {
        return v;
    };
    v.encapsulation = Some(enc.label());
    v.family = Some(enc.family());
    v.family_assumed = i.remote_family.is_none();
    v.overhead = Some(enc.overhead());
    v.overhead_breakdown = Some(enc.breakdown());
    v.underlay = None;
    v.underlay_mtu = None;
    if !i.up {
        v.verdict = Verdict::Down;
        v.detail = format!("{} is down", i.name);
        return v;
    }
    let Some(u) = &i.underlay else {
        v.verdict = Verdict::Unknown;
        v.detail = format!(
            "no underlay found for {} (not bound to a device, no route to its remote, no \
             default route, no physical interface up)",
            i.name
        );
        return v;
    };
    v.underlay = Some(u.name.clone());
    v.underlay_mtu = Some(u.mtu);
    v.underlay_source = Some(u.source);
    let expected = u.mtu.saturating_sub(enc.overhead());
    let mut arithmetic = format!(
        "underlay {} {} − {} {} = {expected}",
        u.name,
        u.mtu,
        enc.label(),
        enc.overhead()
    );
    if v.family_assumed {
        arithmetic.push_str(" (IPv4 underlay assumed)");
    }
    if i.tunnel.as_ref().is_some_and(|t| t.external) {
        // Metadata-mode devices (Cilium's, for one) are left at a large MTU on purpose:
        // the kernel checks each packet against the route to its endpoint instead.
        v.expected_mtu = Some(expected);
        v.detail = format!(
            "{arithmetic}; {} is a metadata-mode (external) device, whose own MTU does not \
             limit encapsulated packets",
            i.name
        );
    } else {
        let subject = v.subject(None);
        v.judge(&arithmetic, &subject, expected);
    }
    if let Some(note) = source_note(i, u.source, &u.name) {
        let _ = write!(v.detail, " ({note})");
    }
    v
}

/// The limit pod interfaces are held to: the smallest over the agent namespace's overlays
/// that are up.
struct Ceiling {
    /// Index of the overlay's verdict.
    overlay: usize,
    limit: u32,
    /// "underlay ul0 1500 − VXLAN 50 = 1450 (overlay vx0)".
    arithmetic: String,
}

fn ceiling(verdicts: &[MtuVerdict], own: u32) -> Option<Ceiling> {
    verdicts
        .iter()
        .enumerate()
        .filter(|(_, v)| v.role == Role::Overlay && v.netns == own && v.up)
        .filter_map(|(idx, v)| {
            let external = v.verdict == Verdict::NotApplicable;
            let (limit, arithmetic) = match (v.underlay.as_ref(), v.underlay_mtu, v.expected_mtu) {
                (Some(u), Some(umtu), Some(expected)) if external || expected <= v.mtu => (
                    expected,
                    format!(
                        "underlay {u} {umtu} − {} {} = {expected} (overlay {})",
                        v.encapsulation.as_deref()?,
                        v.overhead?,
                        v.interface
                    ),
                ),
                (Some(u), Some(umtu), Some(expected)) => (
                    v.mtu,
                    format!(
                        "overlay {} is {} (below underlay {u} {umtu} − {} {} = {expected})",
                        v.interface,
                        v.mtu,
                        v.encapsulation.as_deref()?,
                        v.overhead?
                    ),
                ),
                _ => (
                    v.mtu,
                    format!(
                        "overlay {} is {} (its underlay is unknown)",
                        v.interface, v.mtu
                    ),
                ),
            };
            Some(Ceiling {
                overlay: idx,
                limit,
                arithmetic,
            })
        })
        .min_by_key(|c| c.limit)
}

/// Every interface of the snapshot, judged.
pub(super) fn verdicts(snap: &Snapshot) -> Vec<MtuVerdict> {
    let own = snap.own_netns;
    let underlays: HashSet<(u32, u32)> = snap
        .interfaces
        .iter()
        .filter_map(|i| Some((i.netns, i.underlay.as_ref()?.ifindex)))
        .collect();
    let mut out: Vec<MtuVerdict> = snap
        .interfaces
        .iter()
        .map(|i| match role_of(i, own, &underlays) {
            Role::Overlay => overlay_verdict(i),
            role => MtuVerdict::new(i, role),
        })
        .collect();
    let ceiling = ceiling(&out, own).map(|c| (out[c.overlay].clone(), c));
    for (v, i) in out.iter_mut().zip(&snap.interfaces) {
        if !matches!(v.role, Role::PodInterface | Role::NodeVeth) {
            continue;
        }
        let peer = i
            .veth_peer
            .as_ref()
            .and_then(|p| Some((p.netns_name.as_deref()?, p.name.as_deref()?)));
        let subject = v.subject(peer);
        let Some((ov, c)) = &ceiling else {
            v.detail = format!(
                "no overlay device is up in the node's namespace: {subject} has the \
                 underlay's path"
            );
            continue;
        };
        v.overlay = Some(ov.interface.clone());
        v.overlay_mtu = Some(ov.mtu);
        v.underlay = ov.underlay.clone();
        v.underlay_mtu = ov.underlay_mtu;
        v.underlay_source = ov.underlay_source;
        v.encapsulation = ov.encapsulation.clone();
        v.family = ov.family;
        v.family_assumed = ov.family_assumed;
        v.overhead = ov.overhead;
        v.overhead_breakdown = ov.overhead_breakdown.clone();
        let subject = if v.role == Role::PodInterface {
            format!("{subject} (netns {})", v.netns_name)
        } else {
            subject
        };
        v.judge(&c.arithmetic, &subject, c.limit);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::{net::IpAddr, time::SystemTime};

    use super::{super::fixtures::*, *};
    use crate::host_network::{Link, Tunnel, fixtures};

    #[test]
    fn correct_setup_has_no_findings() {
        for (ul, vx) in [(1500, 1450), (9000, 8950), (9001, 8951), (1500, 1400)] {
            let snap = node(ul, vx, vx, vx);
            let fs = findings(&snap, SystemTime::UNIX_EPOCH);
            assert!(fs.is_empty(), "{ul}/{vx}: {fs:#?}");
            let vs = verdicts(&snap);
            assert!(
                vs.iter()
                    .all(|v| matches!(v.verdict, Verdict::Ok | Verdict::NotApplicable)),
                "{vs:#?}"
            );
        }
    }

    #[test]
    fn jumbo_underlays() {
        let vs = verdicts(&node(9001, 9001, 9001, 9001));
        let vx = verdict(&vs, NODE, "vx0");
        assert_eq!(vx.expected_mtu, Some(8951));
        assert_eq!(vx.headroom, Some(-50));
        assert!(
            vx.detail
                .starts_with("underlay ul0 9001 − VXLAN 50 = 8951, but vxlan vx0 is 9001")
        );
        assert_eq!(verdict(&vs, POD, "eth0").expected_mtu, Some(8951));

        // Every encapsulation, both families, on 9000 and 9001.
        let expect = [
            (9000, Family::V4, LinkKind::Vxlan, 8950),
            (9000, Family::V6, LinkKind::Vxlan, 8930),
            (9001, Family::V4, LinkKind::Geneve, 8951),
            (9001, Family::V6, LinkKind::Geneve, 8931),
            (9000, Family::V4, LinkKind::Wireguard, 8940),
            (9001, Family::V6, LinkKind::Wireguard, 8921),
            (9000, Family::V4, LinkKind::Gre, 8976),
            (9001, Family::V4, LinkKind::Ipip, 8981),
        ];
        for (ul, family, kind, want) in expect {
            let remote = match family {
                Family::V4 => IpAddr::from([10, 0, 0, 2]),
                Family::V6 => IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 2]),
            };
            let t = Tunnel {
                remote: Some(remote),
                ..Tunnel::default()
            };
            let i = tunnel(
                iface(NODE, "t0", 3, kind.clone(), ul),
                t,
                Some(("ul0", 2, ul, UnderlaySource::RouteToRemote)),
            );
            let v = overlay_verdict(&i);
            assert_eq!(v.expected_mtu, Some(want), "{kind} {family:?} over {ul}");
        }
    }

    #[test]
    fn smallest_overlay_limits_pods() {
        // VXLAN (1450) and WireGuard (1440 over IPv4) on the same node: pods at 1450 are
        // too big for the WireGuard path.
        let mut snap = node(1500, 1450, 1450, 1440);
        snap.interfaces.push(tunnel(
            iface(NODE, "wg0", 6, LinkKind::Wireguard, 1440),
            Tunnel::default(),
            Some(("ul0", 2, 1500, UnderlaySource::DefaultRoute)),
        ));
        let vs = verdicts(&snap);
        let wg = verdict(&vs, NODE, "wg0");
        assert!(wg.family_assumed);
        assert_eq!(wg.verdict, Verdict::Ok);
        let pod = verdict(&vs, POD, "eth0");
        assert_eq!(pod.overlay.as_deref(), Some("wg0"));
        assert_eq!((pod.expected_mtu, pod.headroom), (Some(1440), Some(-10)));
        assert_eq!(verdict(&vs, NODE, "veth1").verdict, Verdict::Ok);
    }

    #[test]
    fn external_down_and_underlay_unknown_tunnels() {
        let mut snap = node(1500, 1450, 1450, 1450);
        // Cilium-style metadata-mode device left at 1500: not a mismatch itself, but it
        // still holds pods to 1450.
        snap.interfaces.push(tunnel(
            iface(NODE, "cilium_vxlan", 7, LinkKind::Vxlan, 1500),
            Tunnel {
                external: true,
                ..Tunnel::default()
            },
            Some(("ul0", 2, 1500, UnderlaySource::DefaultRoute)),
        ));
        let mut down = tunnel(
            iface(NODE, "gre0", 8, LinkKind::Gre, 1476),
            Tunnel::default(),
            None,
        );
        down.up = false;
        snap.interfaces.push(down);
        snap.interfaces.push(tunnel(
            iface(NODE, "tunl0", 9, LinkKind::Ipip, 1480),
            Tunnel::default(),
            None,
        ));
        let vs = verdicts(&snap);
        let ext = verdict(&vs, NODE, "cilium_vxlan");
        assert_eq!(ext.verdict, Verdict::NotApplicable);
        assert_eq!(ext.expected_mtu, Some(1450));
        assert_eq!(ext.headroom, None);
        assert_eq!(verdict(&vs, NODE, "gre0").verdict, Verdict::Down);
        assert_eq!(verdict(&vs, NODE, "tunl0").verdict, Verdict::Unknown);
        // tunl0's 1480 (underlay unknown) does not beat the 1450 limits.
        assert_eq!(verdict(&vs, POD, "eth0").expected_mtu, Some(1450));
        assert!(findings(&snap, SystemTime::UNIX_EPOCH).is_empty());
    }

    #[test]
    fn without_overlay_pods_are_not_compared() {
        let mut snap = node(1500, 1450, 9000, 9000);
        snap.interfaces.retain(|i| i.name != "vx0");
        let vs = verdicts(&snap);
        assert_eq!(verdict(&vs, POD, "eth0").verdict, Verdict::NotApplicable);
        assert!(findings(&snap, SystemTime::UNIX_EPOCH).is_empty());
    }

    #[test]
    fn underlay_veth_to_another_node_is_not_a_pod() {
        // Two test "nodes" joined by a veth: the far end is not a pod interface.
        let mut snap = node(1500, 1450, 1450, 1450);
        snap.interfaces[1] = peer(iface(NODE, "ul0", 2, LinkKind::Veth, 1500), POD, 3, "ul1");
        snap.interfaces.push(peer(
            iface(POD, "ul1", 3, LinkKind::Veth, 1500),
            NODE,
            2,
            "ul0",
        ));
        let vs = verdicts(&snap);
        assert_eq!(verdict(&vs, NODE, "ul0").role, Role::Underlay);
        assert_eq!(verdict(&vs, POD, "ul1").role, Role::Underlay);
        assert!(findings(&snap, SystemTime::UNIX_EPOCH).is_empty());
    }

    /// An interface from a parsed link message, as the inventory builds it.
    fn from_link(l: Link, underlay_mtu: u32) -> Interface {
        let kind = LinkKind::from_kernel(l.kind.as_deref(), l.link_type);
        let t = l.tunnel.clone().unwrap_or_default();
        let mut i = iface(NODE, &l.name, l.index, kind, l.mtu.unwrap());
        i = tunnel(i, t, Some(("eth0", 2, underlay_mtu, UnderlaySource::Bound)));
        i
    }

    #[test]
    fn parsed_fixtures_match_the_kernels_default_mtus() {
        use netlink_packet_route::link::{InfoGeneve, InfoGre6, InfoIpTunnel, InfoVxlan};
        use std::net::{Ipv4Addr, Ipv6Addr};
        // (link as dumped, the MTU the kernel gives it on a 1500 underlay)
        let cases = [
            (
                fixtures::vxlan(vec![
                    InfoVxlan::Group6(Ipv6Addr::LOCALHOST),
                    InfoVxlan::Link(2),
                ]),
                1430,
            ),
            (
                fixtures::geneve(vec![InfoGeneve::Remote(Ipv4Addr::new(10, 0, 0, 2))]),
                1450,
            ),
            // No peer endpoint in a link message: IPv4 assumed (the kernel's own 1420
            // leaves room for an IPv6 peer).
            (fixtures::wireguard(), 1440),
            (
                fixtures::ipip(fixtures::InfoKind::IpIp, vec![InfoIpTunnel::Link(2)]),
                1480,
            ),
            (fixtures::ipip(fixtures::InfoKind::Ip6Tnl, vec![]), 1452),
            (fixtures::gre(false, vec![]), 1476),
            (fixtures::gre(true, vec![]), 1462),
            (fixtures::ip6gre(false, false, vec![]), 1448),
            (
                fixtures::ip6gre(false, true, vec![InfoGre6::Remote(Ipv6Addr::LOCALHOST)]),
                1456,
            ),
        ];
        for (link, want) in cases {
            let name = format!("{:?}", link.kind);
            let v = overlay_verdict(&from_link(link, 1500));
            assert_eq!(v.expected_mtu, Some(want), "{name}: {}", v.detail);
        }
    }
}
