//! A bounded probe of one flow's path, for the agent: the same DF echo requests as
//! `node-diag probe`, but with a packet budget, a pace the caller sets, and a result the
//! verdicts read ([`PathCheck`]). Blocking: the agent runs it on a blocking thread.
//!
//! It runs in the calling thread's network namespace, the agent's: the node's, for a
//! hostNetwork DaemonSet. A pod's packets to another node's pod leave through the node,
//! which routes pod CIDRs into the overlay, so a probe from the node towards the pod
//! address crosses the same tunnel and underlay hops as the flow (only the source
//! address differs). Probing from inside the pod would need a thread per namespace and
//! would add nothing about the path beyond the node.
//!
//! For a tunnel, the tunnel's remote endpoint (its configured `remote`, or the single
//! endpoint of its FDB entries) is probed on the underlay as well, and a connect
//! question is asked through the tunnel of the route's gateway (the remote node's
//! tunnel address), which answers whether or not the pod is alive.

use std::{net::IpAddr, time::Duration};

use crate::{
    findings::correlate::path::{Leg, PathCheck, Question},
    host_network::{self as netlink, RouteEntry},
};

use super::{
    ProbeError,
    egress::egress,
    icmp::IcmpProber,
    packets::Family,
    search::{Search, search_bounded},
};

/// The most echo requests one run sends, whatever it is asked.
pub(crate) const MAX_PACKETS: u32 = 20;
/// Kept for the underlay when the peer's run leaves room for it.
const UNDERLAY_SHARE: u32 = 4;
/// Where the search starts when it can: every IPv6 link carries 1280 bytes and nearly
/// every IPv4 path does, so starting there leaves the budget for the sizes in doubt.
/// Silence at 1280 falls back to the family's minimum.
const FLOOR: u32 = 1280;

/// What to probe and within which bounds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PathRequest {
    pub(crate) dst: IpAddr,
    pub(crate) question: Question,
    /// Echo requests for the whole run, capped at [`MAX_PACKETS`].
    pub(crate) budget: u32,
    /// Bound on each wait for an answer.
    pub(crate) timeout: Duration,
}

/// Where `dst`'s packets go when the node routes them into a tunnel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TunnelPath {
    /// The remote endpoint on the underlay.
    pub(crate) endpoint: Option<IpAddr>,
    /// The route's gateway through the tunnel (the remote node's tunnel address).
    pub(crate) gateway: Option<IpAddr>,
}

/// The tunnel `dst` is routed through, if any.
pub(crate) fn tunnel_path(dst: IpAddr) -> Option<TunnelPath> {
    let route = netlink::route_get(dst).ok()??;
    let link = netlink::links()
        .ok()?
        .into_iter()
        .find(|l| l.index == route.oif)?;
    let tunnel = link.tunnel?;
    let endpoint = tunnel.remote.filter(|r| !is_multicast(*r)).or_else(|| {
        // A VXLAN without a remote sends by FDB entry: one peer, one endpoint.
        let mut dsts: Vec<IpAddr> = netlink::fdb_destinations()
            .ok()?
            .into_iter()
            .filter(|e| e.ifindex == link.index && !e.dst.is_unspecified())
            .map(|e| e.dst)
            .collect();
        dsts.sort_unstable();
        dsts.dedup();
        (dsts.len() == 1).then(|| dsts[0])
    });
    let gateway = netlink::routes()
        .ok()
        .and_then(|routes| gateway_in(&routes, dst, link.index));
    Some(TunnelPath { endpoint, gateway })
}

fn is_multicast(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(a) => a.is_multicast(),
        IpAddr::V6(a) => a.is_multicast(),
    }
}

/// The gateway of the longest-prefix route to `dst` leaving by `oif`.
fn gateway_in(routes: &[RouteEntry], dst: IpAddr, oif: u32) -> Option<IpAddr> {
    routes
        .iter()
        .filter(|r| r.unicast && r.via(oif) && contains(r.dst, r.prefix_len, dst))
        .max_by_key(|r| (r.prefix_len, std::cmp::Reverse(r.metric)))?
        .hops
        .iter()
        .find(|h| h.oif == oif)?
        .gateway
}

fn contains(net: IpAddr, len: u8, a: IpAddr) -> bool {
    match (net, a) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// Runs the probe. `pace` is called before every echo request (the caller's rate
/// limit); the run sends at most `req.budget` (≤ [`MAX_PACKETS`]) of them.
pub(crate) fn check(req: &PathRequest, mut pace: impl FnMut()) -> Result<PathCheck, ProbeError> {
    let budget = req.budget.min(MAX_PACKETS);
    let tunnel = tunnel_path(req.dst);
    let endpoint = tunnel.as_ref().and_then(|t| t.endpoint);
    let mut run = |target: IpAddr, sizes: Sizes, budget: u32| -> Result<Leg, ProbeError> {
        leg(target, sizes, budget, req.timeout, &mut pace)
    };
    match req.question {
        Question::Size => {
            let share = if endpoint.is_some() {
                UNDERLAY_SHARE
            } else {
                0
            };
            let peer = run(req.dst, Sizes::Search, budget.saturating_sub(share))?;
            // The underlay tells where the limit is only when the peer's path has one.
            let underlay = match endpoint {
                Some(ep) if peer.answered() && peer.smallest_lost.is_some() => {
                    Some(run(ep, Sizes::Search, budget - peer.probes)?)
                }
                _ => None,
            };
            Ok(PathCheck { peer, underlay })
        }
        Question::Tunnel => {
            // A connect question only means something for a tunnel with a known end.
            let Some(ep) = endpoint else {
                return Ok(PathCheck::default());
            };
            // A gateway reached only `onlink` (no route of its own) cannot be pinged:
            // the destination is probed through the tunnel instead.
            let through = tunnel
                .and_then(|t| t.gateway)
                .filter(|g| matches!(netlink::route_get(*g), Ok(Some(_))))
                .unwrap_or(req.dst);
            let peer = run(through, Sizes::Smallest, budget / 2)?;
            let underlay = run(ep, Sizes::Smallest, budget - peer.probes)?;
            Ok(PathCheck {
                peer,
                underlay: Some(underlay),
            })
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Sizes {
    /// The DF search up to the egress interface's MTU.
    Search,
    /// The smallest packet only: does anything cross?
    Smallest,
}

fn leg(
    target: IpAddr,
    sizes: Sizes,
    budget: u32,
    timeout: Duration,
    pace: &mut impl FnMut(),
) -> Result<Leg, ProbeError> {
    let family = Family::of(target);
    let min = family.min_mtu();
    let max = match sizes {
        Sizes::Search => egress(target)?.mtu.max(min),
        Sizes::Smallest => min,
    };
    let mut prober = IcmpProber::open(target, timeout)?;
    let mut send = |size| {
        pace();
        prober.probe(size)
    };
    let floor = FLOOR.clamp(min, max);
    let mut found = search_bounded(floor, max, budget, &mut send)?;
    if found.path_mtu.is_none() && floor > min && found.probes < budget {
        let below = search_bounded(min, floor - 1, budget - found.probes, &mut send)?;
        found = Search {
            probes: found.probes + below.probes,
            smallest_lost: below.smallest_lost.or(Some(floor)),
            ..below
        };
    }
    tracing::debug!(%target, ?found, "path probe");
    let answered = found.path_mtu.is_some();
    // An ICMP error other than frag-needed means the target is not reached: nothing
    // was answered there.
    let frag_needed = found.frag_needed.first().map(|f| (f.from, f.next_hop_mtu));
    Ok(Leg {
        target: Some(target),
        largest_ok: found.path_mtu,
        smallest_lost: if answered { found.smallest_lost } else { None },
        frag_needed,
        probes: found.probes,
    })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::host_network::{Family as NetFamily, NextHop};

    fn fixtures_route(dst: IpAddr, len: u8, oif: u32, gateway: Option<IpAddr>) -> RouteEntry {
        RouteEntry {
            family: NetFamily::V4,
            dst,
            prefix_len: len,
            hops: vec![NextHop { oif, gateway }],
            mtu: None,
            advmss: None,
            connected: false,
            encap_dst: None,
            table: 254,
            unicast: true,
            metric: 0,
        }
    }

    #[test]
    fn the_longest_route_by_the_tunnel_names_the_gateway() {
        let gw = IpAddr::V4(Ipv4Addr::new(10, 200, 0, 2));
        let routes = vec![
            fixtures_route("0.0.0.0".parse().unwrap(), 0, 2, None),
            fixtures_route("10.244.2.0".parse().unwrap(), 24, 5, Some(gw)),
            fixtures_route("10.244.0.0".parse().unwrap(), 16, 5, None),
        ];
        let pod = "10.244.2.9".parse().unwrap();
        assert_eq!(gateway_in(&routes, pod, 5), Some(gw));
        assert_eq!(gateway_in(&routes, pod, 2), None);
        assert_eq!(gateway_in(&routes, "10.244.3.1".parse().unwrap(), 5), None);
        assert!(contains(
            "fd00::".parse().unwrap(),
            64,
            "fd00::1".parse().unwrap()
        ));
        assert!(!contains(
            "fd00::".parse().unwrap(),
            64,
            "fd01::1".parse().unwrap()
        ));
        assert!(contains("0.0.0.0".parse().unwrap(), 0, pod));
    }
}
