//! The model proper: each interface's role (overlay, pod interface, node-side veth,
//! underlay), the largest MTU it may have, its effective MTU, and the verdict.
//!
//! - Overlays are held to the smallest of their ways out: each underlay's path MTU (the
//!   device's MTU, capped by the `mtu` of the route to the endpoint, and by the path MTU
//!   the route cache learned towards the endpoint when that is smaller) minus the
//!   encapsulation overhead for that endpoint's family.
//! - Pod interfaces and node-side veths are held to the ceiling: the smallest limit of the
//!   node's overlays that are up.
//! - What is compared with the limit is the effective MTU: the largest packet the kernel
//!   sends by the interface's routes that leave its link. A route's `mtu` metric caps the
//!   device's (Cilium's tunnel mode keeps veths at 1500 and puts `mtu 1450` on the pod
//!   routes); a route without one sends up to the device's MTU. A node-side veth carries
//!   what its pod's routes let through, so those routes cap it too. A route's `advmss`
//!   only bounds the TCP segments peers send back: it is reported, never counted as a
//!   fix, since other protocols still send full-size packets.

use std::{collections::HashSet, fmt::Write as _, net::IpAddr};

use serde::Serialize;

use super::encapsulation::Encapsulation;
// The roles are the host network's; the model decides which interface has which.
pub(crate) use crate::host_network::Role;
use crate::host_network::{Family, Interface, LinkKind, RouteMetrics, Snapshot, UnderlaySource};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Verdict {
    Ok,
    Mismatch,
    /// A tunnel whose underlay could not be found.
    Unknown,
    /// A tunnel that is down: not carrying traffic, not judged.
    Down,
    NotApplicable,
}

impl Verdict {
    pub(crate) fn as_str(self) -> &'static str {
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
pub(crate) struct MtuVerdict {
    pub(crate) netns: u32,
    pub(crate) netns_name: String,
    pub(crate) interface: String,
    pub(crate) ifindex: u32,
    pub(crate) kind: LinkKind,
    pub(crate) role: Role,
    pub(crate) up: bool,
    /// The device's MTU.
    pub(crate) mtu: u32,
    /// For judged interfaces: the largest packet it is given, its MTU capped by the `mtu`
    /// of its routes (for a node-side veth, of its pod's routes).
    pub(crate) effective_mtu: Option<u32>,
    /// The route deciding the effective MTU ("default via 169.254.1.1"), when a route
    /// metric is involved.
    pub(crate) route: Option<String>,
    pub(crate) route_mtu: Option<u32>,
    pub(crate) route_advmss: Option<u32>,
    /// For pod interfaces and node-side veths: the overlay they are compared with.
    pub(crate) overlay: Option<String>,
    pub(crate) overlay_mtu: Option<u32>,
    /// The overlay's underlay (for overlays: their own smallest way out; for pods: their
    /// overlay's); for other devices, the device they sit on.
    pub(crate) underlay: Option<String>,
    /// The underlay's path MTU: its device's MTU, capped by the route to the endpoint.
    pub(crate) underlay_mtu: Option<u32>,
    /// The underlay device's own MTU.
    pub(crate) underlay_device_mtu: Option<u32>,
    /// The route to the endpoint, when its `mtu` caps the underlay device.
    pub(crate) underlay_route: Option<String>,
    pub(crate) underlay_route_mtu: Option<u32>,
    pub(crate) underlay_source: Option<UnderlaySource>,
    /// With `underlay_source` `learned_pmtu`: how the underlay device was found.
    pub(crate) underlay_found_by: Option<UnderlaySource>,
    /// The path MTU the route cache learned towards the endpoint, when it limits the
    /// underlay.
    pub(crate) learned_pmtu: Option<u32>,
    /// Seconds until the kernel forgets that learned path MTU.
    pub(crate) learned_pmtu_expires_secs: Option<u32>,
    /// The endpoint whose route is the underlay, when known.
    pub(crate) underlay_endpoint: Option<IpAddr>,
    /// How many endpoints the tunnel's ways out were found from.
    pub(crate) underlay_endpoints: Option<u32>,
    /// Label such as "VXLAN" or "VXLAN/IPv6".
    pub(crate) encapsulation: Option<String>,
    pub(crate) family: Option<Family>,
    /// The family was not in the tunnel's configuration nor told by an endpoint, and
    /// IPv4 was assumed.
    pub(crate) family_assumed: bool,
    pub(crate) overhead: Option<u32>,
    pub(crate) overhead_breakdown: Option<String>,
    /// The largest MTU this interface may have.
    pub(crate) expected_mtu: Option<u32>,
    /// `expected_mtu − effective_mtu`: negative when the interface is too large.
    pub(crate) headroom: Option<i64>,
    pub(crate) verdict: Verdict,
    /// The arithmetic, or why there is none.
    pub(crate) detail: String,
    /// For overlays: "underlay ul0 1500 − VXLAN 50 = 1450", what the ceiling quotes.
    #[serde(skip)]
    limit_arithmetic: Option<String>,
}

/// An interface's effective MTU and how its routes decide it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Effective {
    mtu: u32,
    /// The route deciding it, when some route through the interface has an `mtu`.
    deciding: Option<RouteMetrics>,
    /// How to say it after "{subject} is {mtu}" (empty when no route metric matters).
    explanation: String,
}

/// IPv4 + TCP or IPv6 + TCP headers: an MSS plus this is the packet it fills.
fn tcp_headers(f: Family) -> u32 {
    match f {
        Family::V4 => 40,
        Family::V6 => 60,
    }
}

/// `i`'s effective MTU from its own routes: the largest packet any of its routes that
/// leave the link builds (a route without `mtu` builds up to the device's MTU).
fn effective_of(i: &Interface) -> Effective {
    let by = |r: &RouteMetrics| r.mtu.map_or(i.mtu, |m| m.min(i.mtu));
    let mut effective = Effective {
        mtu: i.mtu,
        deciding: None,
        explanation: String::new(),
    };
    let with_mtu = i.routes.iter().find(|r| r.mtu.is_some());
    if let Some(with_mtu) = with_mtu {
        // The largest wins; among equals a route without `mtu` explains best why the
        // device's MTU still counts.
        let deciding = i
            .routes
            .iter()
            .max_by_key(|r| (by(r), r.mtu.is_none()))
            .unwrap_or(with_mtu);
        effective.mtu = by(deciding);
        effective.explanation = match deciding.mtu {
            Some(m) if m < i.mtu => format!(
                ": route {} mtu {m} caps {} {}",
                deciding.route, i.kind, i.mtu
            ),
            Some(m) if m == i.mtu => format!(" (route {} mtu {m} does not cap it)", deciding.route),
            Some(m) => format!(
                " (route {} mtu {m} is above it: larger packets are dropped by the device)",
                deciding.route
            ),
            None => format!(
                ": route {} has no mtu (route {} mtu {} does)",
                deciding.route,
                with_mtu.route,
                with_mtu.mtu.unwrap_or(0)
            ),
        };
        effective.deciding = Some(deciding.clone());
    }
    if let Some(r) = i.routes.iter().find(|r| r.advmss.is_some()) {
        let advmss = r.advmss.unwrap_or(0);
        let _ = write!(
            effective.explanation,
            "; route {} advmss {advmss} keeps the TCP segments peers send within {} (other \
             protocols are not bounded by it)",
            r.route,
            advmss + tcp_headers(r.family)
        );
        if effective.deciding.is_none() {
            effective.deciding = Some(r.clone());
        }
    }
    effective
}

/// The `mtu` every route of a pod interface that leaves its link carries (the largest),
/// when all carry one: what a node-side veth is given from the pod.
fn route_cap(i: &Interface) -> Option<&RouteMetrics> {
    if i.routes.is_empty() || i.routes.iter().any(|r| r.mtu.is_none()) {
        return None;
    }
    i.routes.iter().max_by_key(|r| r.mtu)
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
            effective_mtu: None,
            route: None,
            route_mtu: None,
            route_advmss: None,
            overlay: None,
            overlay_mtu: None,
            underlay: i.lower.as_ref().map(|l| l.name.clone()),
            underlay_mtu: i.lower.as_ref().map(|l| l.mtu),
            underlay_device_mtu: i.lower.as_ref().map(|l| l.mtu),
            underlay_route: None,
            underlay_route_mtu: None,
            underlay_source: None,
            underlay_found_by: None,
            learned_pmtu: None,
            learned_pmtu_expires_secs: None,
            underlay_endpoint: None,
            underlay_endpoints: None,
            encapsulation: None,
            family: None,
            family_assumed: false,
            overhead: None,
            overhead_breakdown: None,
            expected_mtu: None,
            headroom: None,
            verdict: Verdict::NotApplicable,
            detail: String::new(),
            limit_arithmetic: None,
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

    fn set_effective(&mut self, e: &Effective) {
        self.effective_mtu = Some(e.mtu);
        if let Some(r) = &e.deciding {
            self.route = Some(r.route.clone());
            self.route_mtu = r.mtu;
            self.route_advmss = r.advmss;
        }
    }

    /// Compares the effective MTU `e` with `limit`, `arithmetic` saying where the limit
    /// comes from.
    fn judge(&mut self, arithmetic: &str, subject: &str, limit: u32, e: &Effective) {
        self.set_effective(e);
        let headroom = i64::from(limit) - i64::from(e.mtu);
        self.expected_mtu = Some(limit);
        self.headroom = Some(headroom);
        let (verdict, joint) = if headroom < 0 {
            (Verdict::Mismatch, ", but")
        } else {
            (Verdict::Ok, ";")
        };
        self.verdict = verdict;
        self.detail = format!(
            "{arithmetic}{joint} {subject} is {}{}",
            e.mtu, e.explanation
        );
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

/// For a tunnel not bound to a device: how its underlay was found.
fn source_note(
    i: &Interface,
    v: &MtuVerdict,
    source: UnderlaySource,
    underlay: &str,
) -> Option<String> {
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
        other => {
            let kind = other.endpoint_kind().unwrap_or("endpoint");
            let endpoint = v
                .underlay_endpoint
                .map_or_else(|| "an endpoint".into(), |a| a.to_string());
            match v.underlay_endpoints {
                Some(n) if n > 1 => format!(
                    "the route to {endpoint}, {kind}, the smallest path of its {n} endpoints"
                ),
                _ => format!("the route to {endpoint}, {kind}"),
            }
        }
    };
    Some(format!(
        "{} is not bound to a device; underlay {underlay} is {how}",
        i.name
    ))
}

fn overlay_verdict(i: &Interface) -> MtuVerdict {
    let mut v = MtuVerdict::new(i, Role::Overlay);
    let Some(configured) = Encapsulation::for_interface(i, None) else {
        return v;
    };
    v.underlay = None;
    v.underlay_mtu = None;
    v.underlay_device_mtu = None;
    // The smallest way out, each with the overhead of its endpoint's family.
    let chosen = i
        .underlays
        .iter()
        .filter_map(|u| {
            let enc = Encapsulation::for_interface(i, u.family())?;
            Some((u.path_mtu().saturating_sub(enc.overhead()), u, enc))
        })
        .min_by_key(|(expected, ..)| *expected);
    let enc = chosen.as_ref().map_or(configured, |(_, _, enc)| *enc);
    v.encapsulation = Some(enc.label());
    v.family = Some(enc.family());
    v.family_assumed =
        i.remote_family.is_none() && chosen.as_ref().is_none_or(|(_, u, _)| u.endpoint.is_none());
    v.overhead = Some(enc.overhead());
    v.overhead_breakdown = Some(enc.breakdown());
    if !i.up {
        v.verdict = Verdict::Down;
        v.detail = format!("{} is down", i.name);
        return v;
    }
    let Some((expected, u, _)) = chosen else {
        v.verdict = Verdict::Unknown;
        v.detail = format!(
            "no underlay found for {} (not bound to a device, no route to an endpoint, no \
             default route, no physical interface up)",
            i.name
        );
        return v;
    };
    v.underlay = Some(u.name.clone());
    v.underlay_mtu = Some(u.path_mtu());
    v.underlay_device_mtu = Some(u.mtu);
    v.underlay_source = Some(u.source);
    v.underlay_endpoint = u.endpoint;
    let endpoints: u32 = i.underlays.iter().map(|u| u.endpoints).sum();
    v.underlay_endpoints = (endpoints > 0).then_some(endpoints);
    let mut arithmetic = format!("underlay {} {}", u.name, u.path_mtu());
    let route_cap = match (&u.route, u.route_mtu) {
        (Some(route), Some(m)) if m < u.mtu => Some((route, m)),
        _ => None,
    };
    if let Some((route, m)) = route_cap {
        v.underlay_route = Some(route.clone());
        v.underlay_route_mtu = Some(m);
    }
    if let Some(learned) = u.learned_below() {
        // The devices and routes of this node carry more: a hop beyond it is narrower,
        // and the route cache says so since a frag-needed (packet-too-big) came back.
        v.underlay_source = Some(UnderlaySource::LearnedPmtu);
        v.underlay_found_by = Some(u.source);
        v.learned_pmtu = Some(learned);
        v.learned_pmtu_expires_secs = u.learned_expires_secs;
        let towards = u
            .endpoint
            .map_or_else(|| "its endpoint".into(), |a| a.to_string());
        let below = match route_cap {
            Some((route, m)) => format!("route {route} mtu {m}"),
            None => format!("{}'s {}", u.name, u.mtu),
        };
        let _ = write!(
            arithmetic,
            " (the route cache learned a path MTU of {learned} towards {towards}, below \
             {below})"
        );
    } else if let Some((route, m)) = route_cap {
        let _ = write!(
            arithmetic,
            " (route {route} mtu {m} caps {} {})",
            u.name, u.mtu
        );
    }
    let _ = write!(
        arithmetic,
        " − {} {} = {expected}",
        enc.label(),
        enc.overhead()
    );
    if v.family_assumed {
        arithmetic.push_str(" (IPv4 underlay assumed)");
    }
    v.limit_arithmetic = Some(arithmetic.clone());
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
        v.judge(&arithmetic, &subject, expected, &effective_of(i));
    }
    if let Some(note) = source_note(i, &v, u.source, &u.name) {
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
            v.encapsulation.as_ref()?;
            let external = v.verdict == Verdict::NotApplicable;
            // What the overlay is given: its MTU, capped by its routes.
            let given = v.effective_mtu.unwrap_or(v.mtu);
            let (limit, arithmetic) = match (&v.limit_arithmetic, v.expected_mtu) {
                (Some(a), Some(expected)) if external || expected <= given => {
                    (expected, format!("{a} (overlay {})", v.interface))
                }
                (Some(a), Some(_)) => (
                    given,
                    format!("overlay {} is {given} (below {a})", v.interface),
                ),
                _ => (
                    given,
                    format!(
                        "overlay {} is {given} (its underlay is unknown)",
                        v.interface
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
    // The node's tunnels that are up: a tunnel inside a pod (a VPN sidecar, or the ipip
    // module's `tunl0` every namespace gets, down) finds the pod's eth0 by its default
    // route, which is still the pod's interface to judge.
    let underlays: HashSet<(u32, u32)> = snap
        .interfaces
        .iter()
        .filter(|i| i.netns == own && i.up)
        .flat_map(|i| i.underlays.iter().map(|u| (i.netns, u.ifindex)))
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
        v.underlay_device_mtu = ov.underlay_device_mtu;
        v.underlay_route = ov.underlay_route.clone();
        v.underlay_route_mtu = ov.underlay_route_mtu;
        v.underlay_source = ov.underlay_source;
        v.underlay_found_by = ov.underlay_found_by;
        v.learned_pmtu = ov.learned_pmtu;
        v.learned_pmtu_expires_secs = ov.learned_pmtu_expires_secs;
        v.underlay_endpoint = ov.underlay_endpoint;
        v.underlay_endpoints = ov.underlay_endpoints;
        v.encapsulation = ov.encapsulation.clone();
        v.family = ov.family;
        v.family_assumed = ov.family_assumed;
        v.overhead = ov.overhead;
        v.overhead_breakdown = ov.overhead_breakdown.clone();
        let effective = if v.role == Role::PodInterface {
            effective_of(i)
        } else {
            node_side_effective(i, snap)
        };
        let subject = if v.role == Role::PodInterface {
            format!("{subject} (netns {})", v.netns_name)
        } else {
            subject
        };
        v.judge(&c.arithmetic, &subject, c.limit, &effective);
    }
    out
}

/// A node-side veth is given what its pod's routes let through: capped by them when all
/// carry an `mtu`.
fn node_side_effective(i: &Interface, snap: &Snapshot) -> Effective {
    let pod = i.veth_peer.as_ref().and_then(|p| {
        snap.interfaces
            .iter()
            .find(|x| Some(x.netns) == p.netns && x.ifindex == p.ifindex)
    });
    match pod.and_then(route_cap) {
        Some(r) => {
            let m = r.mtu.unwrap_or(i.mtu);
            let (mtu, explanation) = if m < i.mtu {
                (
                    m,
                    format!(
                        ": its pod's route {} mtu {m} caps {} {}",
                        r.route, i.kind, i.mtu
                    ),
                )
            } else {
                (
                    i.mtu,
                    format!(" (its pod's route {} mtu {m} does not cap it)", r.route),
                )
            };
            Effective {
                mtu,
                deciding: Some(r.clone()),
                explanation,
            }
        }
        None => Effective {
            mtu: i.mtu,
            deciding: None,
            explanation: String::new(),
        },
    }
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

    /// Cilium's tunnel mode: an external `cilium_vxlan`, veths at 1500 on both ends, the
    /// pod's default route with `mtu` (its route to the router itself leaves no link, so
    /// the inventory does not list it).
    fn cilium(route_mtu: u32) -> Snapshot {
        let mut snap = node(1500, 1450, 1500, 1500);
        snap.interfaces.retain(|i| i.name != "vx0");
        snap.interfaces.push(tunnel(
            iface(NODE, "cilium_vxlan", 7, LinkKind::Vxlan, 1500),
            Tunnel {
                external: true,
                ..Tunnel::default()
            },
            None,
        ));
        let ext = snap.interfaces.last_mut().unwrap();
        ext.underlays = vec![way(
            "ul0",
            2,
            1500,
            UnderlaySource::RouteToEncapDestination,
            Some(IpAddr::from([192, 168, 77, 2])),
            1,
        )];
        let pod = snap
            .interfaces
            .iter_mut()
            .find(|i| i.netns == POD && i.name == "eth0")
            .unwrap();
        *pod = routed(
            pod.clone(),
            &[("default via 10.244.1.1", Some(route_mtu), None)],
        );
        snap
    }

    #[test]
    fn cilium_route_mtu_caps_1500_veths() {
        let snap = cilium(1450);
        let vs = verdicts(&snap);
        let pod = verdict(&vs, POD, "eth0");
        assert_eq!(pod.verdict, Verdict::Ok, "{pod:#?}");
        assert_eq!((pod.mtu, pod.effective_mtu), (1500, Some(1450)));
        assert_eq!(pod.headroom, Some(0));
        assert_eq!(pod.route.as_deref(), Some("default via 10.244.1.1"));
        assert!(
            pod.detail.contains(
                "pod eth0 (netns pod-a) is 1450: route default via 10.244.1.1 mtu 1450 caps \
                 veth 1500"
            ),
            "{}",
            pod.detail
        );
        let node_side = verdict(&vs, NODE, "veth1");
        assert_eq!(node_side.verdict, Verdict::Ok, "{node_side:#?}");
        assert!(
            node_side
                .detail
                .contains("its pod's route default via 10.244.1.1 mtu 1450 caps veth 1500"),
            "{}",
            node_side.detail
        );
        // The external device's underlay is the route to its endpoint, IPv4 known.
        let ext = verdict(&vs, NODE, "cilium_vxlan");
        assert!(!ext.family_assumed);
        assert_eq!(ext.underlay_endpoint, Some(IpAddr::from([192, 168, 77, 2])));
        assert!(findings(&snap, SystemTime::UNIX_EPOCH).is_empty());
    }

    #[test]
    fn cilium_route_mtu_1500_over_the_1450_tunnel_names_the_route() {
        let snap = cilium(1500);
        let vs = verdicts(&snap);
        let pod = verdict(&vs, POD, "eth0");
        assert_eq!(pod.verdict, Verdict::Mismatch);
        assert_eq!((pod.effective_mtu, pod.headroom), (Some(1500), Some(-50)));
        assert!(
            pod.detail.contains(
                "but pod eth0 (netns pod-a) is 1500 (route default via 10.244.1.1 mtu 1500 \
                 does not cap it)"
            ),
            "{}",
            pod.detail
        );
        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        let f = fs
            .iter()
            .find(|f| f.interface.as_deref() == Some("eth0"))
            .unwrap();
        assert_eq!(f.evidence.to_map()["route"], "default via 10.244.1.1");
        assert_eq!(f.evidence.to_map()["route_mtu"], 1500);
        assert_eq!(f.evidence.to_map()["effective_mtu"], 1500);
        assert!(
            f.remediation
                .starts_with("Set the mtu of the pod's routes in netns pod-a (default via"),
            "{}",
            f.remediation
        );
        let node_side = verdict(&vs, NODE, "veth1");
        assert_eq!(node_side.verdict, Verdict::Mismatch);
        assert!(
            node_side.detail.ends_with(
                "is 1500 (its pod's route default via 10.244.1.1 mtu 1500 does not cap it)"
            ),
            "{}",
            node_side.detail
        );
        let f = fs
            .iter()
            .find(|f| f.interface.as_deref() == Some("veth1"))
            .unwrap();
        assert!(
            f.remediation
                .starts_with("Set the mtu of its pod's routes (default via 10.244.1.1) to 1450"),
            "{}",
            f.remediation
        );
    }

    #[test]
    fn a_route_without_mtu_sends_at_the_device_mtu() {
        let mut snap = cilium(1450);
        let pod = snap
            .interfaces
            .iter_mut()
            .find(|i| i.netns == POD && i.name == "eth0")
            .unwrap();
        *pod = routed(
            pod.clone(),
            &[
                ("default via 10.244.1.1", Some(1450), None),
                ("10.0.0.0/8 via 10.244.1.1", None, None),
            ],
        );
        let vs = verdicts(&snap);
        let pod = verdict(&vs, POD, "eth0");
        assert_eq!(pod.verdict, Verdict::Mismatch);
        assert!(
            pod.detail.contains(
                "is 1500: route 10.0.0.0/8 via 10.244.1.1 has no mtu (route default via \
                 10.244.1.1 mtu 1450 does)"
            ),
            "{}",
            pod.detail
        );
        // Its node-side end is not capped either: not every pod route carries an mtu.
        assert_eq!(verdict(&vs, NODE, "veth1").verdict, Verdict::Mismatch);
    }

    #[test]
    fn advmss_alone_bounds_tcp_only() {
        let mut snap = node(1500, 1450, 1500, 1450);
        let pod = snap
            .interfaces
            .iter_mut()
            .find(|i| i.netns == POD && i.name == "eth0")
            .unwrap();
        *pod = routed(
            pod.clone(),
            &[("default via 169.254.1.1", None, Some(1410))],
        );
        let vs = verdicts(&snap);
        let pod = verdict(&vs, POD, "eth0");
        assert_eq!(pod.verdict, Verdict::Mismatch);
        assert_eq!(pod.route_advmss, Some(1410));
        assert!(
            pod.detail.contains(
                "route default via 169.254.1.1 advmss 1410 keeps the TCP segments peers send \
                 within 1450"
            ),
            "{}",
            pod.detail
        );
        let f = findings(&snap, SystemTime::UNIX_EPOCH)
            .into_iter()
            .find(|f| f.interface.as_deref() == Some("eth0"))
            .unwrap();
        assert!(
            f.remediation
                .starts_with("Give route default via 169.254.1.1 mtu 1450")
        );
    }

    #[test]
    fn routes_through_an_overlay_cap_it() {
        let mut snap = node(1500, 1450, 1450, 1450);
        snap.interfaces.push(routed(
            tunnel(
                iface(NODE, "vx9", 9, LinkKind::Vxlan, 1500),
                bound_vxlan([10, 0, 0, 3]),
                Some(("ul0", 2, 1500, UnderlaySource::Bound)),
            ),
            &[("10.244.3.0/24 via 10.200.0.3", Some(1450), None)],
        ));
        let vs = verdicts(&snap);
        let vx = verdict(&vs, NODE, "vx9");
        assert_eq!(vx.verdict, Verdict::Ok, "{vx:#?}");
        assert!(
            vx.detail.contains(
                "vxlan vx9 is 1450: route 10.244.3.0/24 via 10.200.0.3 mtu 1450 caps vxlan 1500"
            ),
            "{}",
            vx.detail
        );
    }

    /// A VXLAN at `mtu` whose FDB peers are on cl0 (9000) and, with `stray`, one on ul0.
    fn multi_nic(mtu: u32, stray: bool) -> Snapshot {
        let mut snap = node(1500, 1450, 1450, 1450);
        snap.interfaces
            .push(iface(NODE, "cl0", 8, LinkKind::Physical, 9000));
        let mut vx = tunnel(
            iface(NODE, "flannel.1", 9, LinkKind::Vxlan, mtu),
            Tunnel::default(),
            None,
        );
        vx.underlays.push(way(
            "cl0",
            8,
            9000,
            UnderlaySource::RouteToFdbDestination,
            Some(IpAddr::from([192, 168, 88, 2])),
            2,
        ));
        if stray {
            vx.underlays.push(way(
                "ul0",
                2,
                1500,
                UnderlaySource::RouteToFdbDestination,
                Some(IpAddr::from([192, 168, 77, 9])),
                1,
            ));
        }
        snap.interfaces.push(vx);
        snap
    }

    #[test]
    fn the_underlay_is_the_route_to_the_endpoints() {
        let vs = verdicts(&multi_nic(8950, false));
        let vx = verdict(&vs, NODE, "flannel.1");
        assert_eq!(vx.verdict, Verdict::Ok, "{vx:#?}");
        assert_eq!(vx.expected_mtu, Some(8950));
        assert!(!vx.family_assumed);
        assert!(
            vx.detail.contains(
                "underlay cl0 is the route to 192.168.88.2, an FDB destination, the smallest \
                 path of its 2 endpoints"
            ),
            "{}",
            vx.detail
        );
        // One peer on the 1500 network: the smallest way out decides.
        let snap = multi_nic(8950, true);
        let vs = verdicts(&snap);
        let vx = verdict(&vs, NODE, "flannel.1");
        assert_eq!(vx.verdict, Verdict::Mismatch);
        assert_eq!(
            (vx.underlay.as_deref(), vx.expected_mtu),
            (Some("ul0"), Some(1450))
        );
        assert_eq!(vx.underlay_endpoints, Some(3));
        assert!(
            vx.detail
                .starts_with("underlay ul0 1500 − VXLAN 50 = 1450, but vxlan flannel.1 is 8950"),
            "{}",
            vx.detail
        );
        assert!(
            vx.detail.contains(
                "the route to 192.168.77.9, an FDB destination, the smallest path of its 3 endpoints"
            ),
            "{}",
            vx.detail
        );
        let f = &findings(&snap, SystemTime::UNIX_EPOCH)[0];
        assert_eq!(f.evidence.to_map()["underlay_endpoint"], "192.168.77.9");
        assert_eq!(
            f.evidence.to_map()["underlay_source"],
            "route_to_fdb_destination"
        );
    }

    #[test]
    fn a_route_mtu_caps_the_underlay() {
        let mut snap = multi_nic(8950, false);
        let vx = snap.interfaces.last_mut().unwrap();
        vx.underlays[0].route = Some("192.168.88.0/24".into());
        vx.underlays[0].route_mtu = Some(1500);
        let vs = verdicts(&snap);
        let vx = verdict(&vs, NODE, "flannel.1");
        assert_eq!(vx.verdict, Verdict::Mismatch);
        assert!(
            vx.detail.starts_with(
                "underlay cl0 1500 (route 192.168.88.0/24 mtu 1500 caps cl0 9000) − VXLAN 50 \
                 = 1450, but vxlan flannel.1 is 8950"
            ),
            "{}",
            vx.detail
        );
        assert_eq!(
            (vx.underlay_mtu, vx.underlay_device_mtu),
            (Some(1500), Some(9000))
        );
        let f = &findings(&snap, SystemTime::UNIX_EPOCH)[0];
        assert!(
            f.remediation.contains(
                "raise the mtu of route 192.168.88.0/24 (it caps the underlay cl0) by 7500 bytes"
            ),
            "{}",
            f.remediation
        );
    }

    #[test]
    fn ipv6_endpoints_count_ipv6_headers() {
        // An external VXLAN whose only endpoint is IPv6: 70 bytes, not an assumed 50.
        let mut snap = cilium(1450);
        let ext = snap
            .interfaces
            .iter_mut()
            .find(|i| i.name == "cilium_vxlan")
            .unwrap();
        ext.underlays[0].endpoint = Some("fd00:77::2".parse().unwrap());
        let vs = verdicts(&snap);
        let ext = verdict(&vs, NODE, "cilium_vxlan");
        assert_eq!(
            (ext.encapsulation.as_deref(), ext.overhead, ext.expected_mtu),
            (Some("VXLAN/IPv6"), Some(70), Some(1430))
        );
        assert!(!ext.family_assumed);
        let pod = verdict(&vs, POD, "eth0");
        assert_eq!((pod.verdict, pod.headroom), (Verdict::Mismatch, Some(-20)));

        // WireGuard toward an IPv6 peer: 80.
        let mut wg = tunnel(
            iface(NODE, "wg0", 6, LinkKind::Wireguard, 1420),
            Tunnel::default(),
            None,
        );
        wg.underlays.push(way(
            "ul0",
            2,
            1500,
            UnderlaySource::RouteToWireguardPeer,
            Some("fd00:77::2".parse().unwrap()),
            1,
        ));
        let v = overlay_verdict(&wg);
        assert_eq!(
            (v.overhead, v.expected_mtu, v.verdict),
            (Some(80), Some(1420), Verdict::Ok)
        );
        // An IP tunnel's kind fixes its family whatever the endpoint.
        let mut ipip = tunnel(
            iface(NODE, "tunl0", 5, LinkKind::Ipip, 1480),
            Tunnel::default(),
            None,
        );
        ipip.underlays.push(way(
            "ul0",
            2,
            1500,
            UnderlaySource::RouteToTunnelGateway,
            Some(IpAddr::from([192, 168, 77, 2])),
            1,
        ));
        assert_eq!(overlay_verdict(&ipip).expected_mtu, Some(1480));
    }

    #[test]
    fn tunnels_inside_pods_do_not_make_their_eth0_an_underlay() {
        // With the ipip module loaded every namespace has a `tunl0` (down), and a pod may
        // run its own WireGuard: both find the pod's eth0 by its default route.
        let mut snap = node(1500, 1450, 1500, 1450);
        for (name, ifindex, up) in [("tunl0", 7, false), ("wg0", 8, true)] {
            let mut t = tunnel(
                iface(POD, name, ifindex, LinkKind::Ipip, 1480),
                Tunnel::default(),
                Some(("eth0", 2, 1500, UnderlaySource::DefaultRoute)),
            );
            t.up = up;
            snap.interfaces.push(t);
        }
        let vs = verdicts(&snap);
        let pod = verdict(&vs, POD, "eth0");
        assert_eq!(pod.role, Role::PodInterface);
        assert_eq!(pod.verdict, Verdict::Mismatch);
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
