//! A tunnel's underlay: the devices its encapsulated packets leave by, and the family of
//! their outer header. The underlay of a tunnel is the route to each of its remote
//! endpoints, looked up the way the kernel routes the tunnel's own packets (from its
//! bound device, with its firewall mark), so a node with a jumbo cluster network and a
//! 1500-byte default route is judged by the network its peers are on.
//!
//! The endpoints come from the tunnel's configuration (`remote`), its FDB entries (a
//! VXLAN without a remote, as flannel's and Calico's), its peers (WireGuard), or the
//! routes through it: the gateway of a route through an IP tunnel without a remote
//! (Calico's `tunl0`), the `encap ... dst` of a route through a metadata-mode device.
//! Without any, the underlay is the bound device, else the device holding the local
//! address, else the default route's, else the largest physical interface.
//!
//! Each endpoint's path MTU learned by the route cache (a frag-needed or packet-too-big
//! from a hop beyond this node) is read too: a way out is one per learned MTU as well,
//! since a narrower hop towards one peer limits that peer's packets alone.

use std::{collections::HashMap, net::IpAddr};

use tracing::debug;

use super::{
    fdb::FdbEntry,
    interfaces::{ARPHRD_LOOPBACK, Family, LinkKind, UnderlaySource},
    links::{Link, Tunnel},
    routes::{self, FibLookup, LearnedPmtu, RouteEntry},
    rtnetlink::NetlinkError,
    wireguard::WgDevice,
};

/// At most this many distinct endpoints of one tunnel are looked up (one netlink round
/// trip each) per snapshot; a cluster larger than that is judged by the first ones.
pub(crate) const MAX_ENDPOINTS: usize = 1024;

/// The outer header's family: fixed by the kind for IP tunnels, else told by the
/// configured remote or local address.
pub(crate) fn tunnel_family(kind: &LinkKind, t: &Tunnel) -> Option<Family> {
    match kind {
        LinkKind::Ipip | LinkKind::Sit | LinkKind::Gre | LinkKind::Gretap => Some(Family::V4),
        LinkKind::Ip6tnl | LinkKind::Ip6gre | LinkKind::Ip6gretap => Some(Family::V6),
        _ => t.remote.or(t.local).map(Family::of),
    }
}

/// What the kernel answers the resolution: route lookups and address owners. The
/// inventory asks the kernel; the tests answer from fixtures.
pub(super) trait Kernel {
    /// The configured route to `dst` (see [`FibLookup::fib_match`]).
    fn fib_match(
        &self,
        dst: IpAddr,
        oif: Option<u32>,
        mark: Option<u32>,
    ) -> Result<Option<RouteEntry>, NetlinkError>;
    /// The interface holding local address `addr`.
    fn address_owner(&self, addr: IpAddr) -> Result<Option<u32>, NetlinkError>;
    /// The path MTU the route cache learned for `dst` (see [`FibLookup::learned_pmtu`]).
    fn learned_pmtu(
        &self,
        dst: IpAddr,
        oif: Option<u32>,
        mark: Option<u32>,
    ) -> Result<Option<LearnedPmtu>, NetlinkError>;
}

impl Kernel for FibLookup {
    fn fib_match(
        &self,
        dst: IpAddr,
        oif: Option<u32>,
        mark: Option<u32>,
    ) -> Result<Option<RouteEntry>, NetlinkError> {
        FibLookup::fib_match(self, dst, oif, mark)
    }

    fn address_owner(&self, addr: IpAddr) -> Result<Option<u32>, NetlinkError> {
        routes::address_owner(addr)
    }

    fn learned_pmtu(
        &self,
        dst: IpAddr,
        oif: Option<u32>,
        mark: Option<u32>,
    ) -> Result<Option<LearnedPmtu>, NetlinkError> {
        FibLookup::learned_pmtu(self, dst, oif, mark)
    }
}

/// The namespace's state the resolution reads, besides its links.
pub(super) struct Namespace<'a> {
    pub(crate) links: &'a [Link],
    pub(crate) routes: &'a [RouteEntry],
    pub(crate) fdb: &'a [FdbEntry],
    /// WireGuard devices by ifindex.
    pub(crate) wireguard: &'a HashMap<u32, WgDevice>,
}

/// One remote endpoint of a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Endpoint {
    addr: IpAddr,
    source: UnderlaySource,
    /// The device the endpoint is reached through, when its FDB entry names one.
    via: Option<u32>,
}

/// One way out of a tunnel, by ifindex (the inventory names the device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawUnderlay {
    pub(crate) ifindex: u32,
    pub(crate) source: UnderlaySource,
    pub(crate) endpoint: Option<IpAddr>,
    pub(crate) endpoints: u32,
    /// The route to the endpoint, when it has an `mtu` metric.
    pub(crate) route: Option<String>,
    pub(crate) route_mtu: Option<u32>,
    /// The path MTU the route cache learned towards the endpoint(s).
    pub(crate) learned: Option<LearnedPmtu>,
    /// The endpoints `learned` is for.
    pub(crate) learned_endpoints: Vec<IpAddr>,
}

impl RawUnderlay {
    fn device(ifindex: u32, source: UnderlaySource) -> Self {
        Self {
            ifindex,
            source,
            endpoint: None,
            endpoints: 0,
            route: None,
            route_mtu: None,
            learned: None,
            learned_endpoints: Vec::new(),
        }
    }
}

/// A tunnel's remote endpoints, each once, in the order: configured remote, FDB entries,
/// WireGuard peers, routes through it.
fn endpoints(link: &Link, kind: &LinkKind, t: &Tunnel, ns: &Namespace<'_>) -> Vec<Endpoint> {
    let mut out: Vec<Endpoint> = Vec::new();
    let mut push = |addr: IpAddr, source, via| {
        if !addr.is_unspecified() && !out.iter().any(|e| e.addr == addr) {
            out.push(Endpoint { addr, source, via });
        }
    };
    if let Some(remote) = t.remote {
        push(remote, UnderlaySource::RouteToRemote, None);
    }
    if *kind == LinkKind::Vxlan && !t.external {
        for e in ns.fdb.iter().filter(|e| e.ifindex == link.index) {
            push(e.dst, UnderlaySource::RouteToFdbDestination, e.via);
        }
    }
    if let Some(wg) = ns.wireguard.get(&link.index) {
        for &ep in &wg.endpoints {
            push(ep, UnderlaySource::RouteToWireguardPeer, None);
        }
    }
    // An IP tunnel without a remote (NBMA mode) sends each packet to the gateway of the
    // route that took it there; its outer family is fixed by its kind.
    let nbma = t.remote.is_none()
        && !t.external
        && matches!(
            kind,
            LinkKind::Ipip | LinkKind::Gre | LinkKind::Ip6tnl | LinkKind::Ip6gre
        );
    let outer = tunnel_family(kind, t);
    for r in ns.routes.iter().filter(|r| r.unicast && r.via(link.index)) {
        if let Some(dst) = r.encap_dst {
            push(dst, UnderlaySource::RouteToEncapDestination, None);
        }
        if nbma {
            for gw in r
                .hops
                .iter()
                .filter(|h| h.oif == link.index)
                .filter_map(|h| h.gateway)
            {
                if Some(Family::of(gw)) == outer {
                    push(gw, UnderlaySource::RouteToTunnelGateway, None);
                }
            }
        }
    }
    if out.len() > MAX_ENDPOINTS {
        debug!(tunnel = %link.name, endpoints = out.len(), "judging the first {MAX_ENDPOINTS} endpoints");
        out.truncate(MAX_ENDPOINTS);
    }
    out
}

/// The ways out of tunnel `link`: one per distinct (device, route `mtu`, outer family)
/// over its endpoints, else the single fallback device; empty when none is found.
pub(super) fn resolve_underlays(
    link: &Link,
    kind: &LinkKind,
    t: &Tunnel,
    ns: &Namespace<'_>,
    kernel: &impl Kernel,
) -> Vec<RawUnderlay> {
    // Created in another namespace and moved here: its bound device and routes live
    // there, out of reach from this one.
    if link.link_netnsid.is_some() {
        return Vec::new();
    }
    let bound = t.bound_to.or(link.link);
    // A route through the tunnel itself or to a local address says nothing about the
    // wire.
    let usable = |oif: u32| {
        oif != link.index
            && ns
                .links
                .iter()
                .any(|l| l.index == oif && l.link_type != ARPHRD_LOOPBACK)
    };
    let mark = ns.wireguard.get(&link.index).and_then(|w| w.fwmark);

    let mut ways: Vec<(RawUnderlay, Option<Family>)> = Vec::new();
    for ep in endpoints(link, kind, t, ns) {
        let oif = ep.via.or(bound);
        let route = match kernel.fib_match(ep.addr, oif, mark) {
            Ok(Some(r)) => r,
            Ok(None) => {
                debug!(tunnel = %link.name, endpoint = %ep.addr, "no route to the endpoint");
                continue;
            }
            Err(e) => {
                debug!(tunnel = %link.name, endpoint = %ep.addr, error = %e, "route lookup failed");
                continue;
            }
        };
        let route_dev = route.hops.first().map(|h| h.oif);
        // A bound tunnel leaves by its device whatever the lookup says; the route's
        // `mtu` counts only when the route is through that device.
        let (dev, source, route_mtu) = match oif {
            Some(dev) => (
                dev,
                if bound == Some(dev) {
                    UnderlaySource::Bound
                } else {
                    ep.source
                },
                route.mtu.filter(|_| route_dev == Some(dev)),
            ),
            None => match route_dev {
                Some(dev) => (dev, ep.source, route.mtu),
                None => continue,
            },
        };
        if !usable(dev) {
            continue;
        }
        let learned = match kernel.learned_pmtu(ep.addr, oif, mark) {
            Ok(l) => l,
            Err(e) => {
                debug!(tunnel = %link.name, endpoint = %ep.addr, error = %e, "learned PMTU lookup failed");
                None
            }
        };
        let learned_mtu = learned.map(|l| l.mtu);
        let family = Some(Family::of(ep.addr));
        if let Some((w, _)) = ways.iter_mut().find(|(w, f)| {
            w.ifindex == dev
                && w.route_mtu == route_mtu
                && w.source == source
                && *f == family
                && w.learned.map(|l| l.mtu) == learned_mtu
        }) {
            w.endpoints += 1;
            if learned.is_some() {
                w.learned_endpoints.push(ep.addr);
            }
            continue;
        }
        ways.push((
            RawUnderlay {
                ifindex: dev,
                source,
                endpoint: Some(ep.addr),
                endpoints: 1,
                route: route_mtu.map(|_| route.to_string()),
                route_mtu,
                learned,
                learned_endpoints: learned.map(|_| ep.addr).into_iter().collect(),
            },
            family,
        ));
    }
    if !ways.is_empty() {
        return ways.into_iter().map(|(w, _)| w).collect();
    }
    if let Some(dev) = bound {
        return vec![RawUnderlay::device(dev, UnderlaySource::Bound)];
    }
    if let Some(local) = t.local {
        match kernel.address_owner(local) {
            Ok(Some(oif)) if usable(oif) => {
                return vec![RawUnderlay::device(oif, UnderlaySource::LocalAddress)];
            }
            Ok(_) => {}
            Err(e) => debug!(tunnel = %link.name, error = %e, "address lookup failed"),
        }
    }
    let family = tunnel_family(kind, t).unwrap_or(Family::V4);
    if let Some(oif) = routes::default_route_oif_in(ns.routes, family).filter(|&o| usable(o)) {
        return vec![RawUnderlay::device(oif, UnderlaySource::DefaultRoute)];
    }
    ns.links
        .iter()
        .filter(|l| l.kind.is_none() && l.link_type != ARPHRD_LOOPBACK && l.up)
        .max_by_key(|l| (l.mtu.unwrap_or(0), std::cmp::Reverse(l.index)))
        .map(|l| {
            vec![RawUnderlay::device(
                l.index,
                UnderlaySource::LargestPhysical,
            )]
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, net::Ipv4Addr};

    use netlink_packet_route::link::{InfoIpTunnel, InfoVxlan};

    use super::*;
    use crate::host_network::{
        fdb,
        links::fixtures as link_fx,
        routes::fixtures::{Opts, route},
        wireguard,
    };

    /// Each lookup asked: destination, interface, mark.
    type Asked = Vec<(IpAddr, Option<u32>, Option<u32>)>;

    /// A kernel answering route lookups by longest prefix over fixture routes, and
    /// recording each lookup.
    struct Table {
        routes: Vec<RouteEntry>,
        asked: RefCell<Asked>,
        /// The route cache's exceptions by destination.
        learned: HashMap<IpAddr, LearnedPmtu>,
    }

    impl Table {
        fn new(routes: Vec<RouteEntry>) -> Self {
            Self {
                routes,
                asked: RefCell::new(Vec::new()),
                learned: HashMap::new(),
            }
        }
    }

    fn contains(r: &RouteEntry, a: IpAddr) -> bool {
        let bits = |x: IpAddr| -> u128 {
            match x {
                IpAddr::V4(v) => u128::from(u32::from(v)) << 96,
                IpAddr::V6(v) => u128::from(v),
            }
        };
        if r.dst.is_ipv4() != a.is_ipv4() {
            return false;
        }
        // IPv4 addresses sit in the top 32 bits, so a prefix length counts from the top
        // for both families.
        let len = u32::from(r.prefix_len);
        if len == 0 {
            return true;
        }
        let mask = u128::MAX << (128 - len);
        bits(r.dst) & mask == bits(a) & mask
    }

    impl Kernel for Table {
        fn fib_match(
            &self,
            dst: IpAddr,
            oif: Option<u32>,
            mark: Option<u32>,
        ) -> Result<Option<RouteEntry>, NetlinkError> {
            self.asked.borrow_mut().push((dst, oif, mark));
            Ok(self
                .routes
                .iter()
                .filter(|r| contains(r, dst))
                .max_by_key(|r| r.prefix_len)
                .cloned())
        }

        fn address_owner(&self, _: IpAddr) -> Result<Option<u32>, NetlinkError> {
            Ok(None)
        }

        fn learned_pmtu(
            &self,
            dst: IpAddr,
            _: Option<u32>,
            _: Option<u32>,
        ) -> Result<Option<LearnedPmtu>, NetlinkError> {
            Ok(self.learned.get(&dst).copied())
        }
    }

    const UL0: u32 = 2;
    const CL0: u32 = 3;

    fn v4(a: [u8; 4]) -> IpAddr {
        IpAddr::from(a)
    }

    /// A node with ul0 (1500, default route, 192.168.77.0/24) and cl0 (9000, the cluster
    /// network 192.168.88.0/24).
    fn nics() -> Vec<Link> {
        let mut ul0 = link_fx::parsed(UL0, "ul0", 1500, link_fx::InfoKind::Veth, None);
        ul0.kind = None;
        let mut cl0 = link_fx::parsed(CL0, "cl0", 9000, link_fx::InfoKind::Veth, None);
        cl0.kind = None;
        vec![ul0, cl0]
    }

    fn node_routes() -> Vec<RouteEntry> {
        vec![
            route(
                v4([0, 0, 0, 0]),
                0,
                UL0,
                Opts {
                    gateway: Some(v4([192, 168, 77, 254])),
                    ..Opts::default()
                },
            ),
            route(
                v4([192, 168, 77, 0]),
                24,
                UL0,
                Opts {
                    kernel: true,
                    ..Opts::default()
                },
            ),
            route(
                v4([192, 168, 88, 0]),
                24,
                CL0,
                Opts {
                    kernel: true,
                    ..Opts::default()
                },
            ),
        ]
    }

    fn resolve(
        tunnel: &Link,
        links: &[Link],
        routes: &[RouteEntry],
        k: &Table,
    ) -> Vec<RawUnderlay> {
        resolve_with(tunnel, links, routes, &[], &HashMap::new(), k)
    }

    fn resolve_with(
        tunnel: &Link,
        links: &[Link],
        routes: &[RouteEntry],
        fdb: &[FdbEntry],
        wg: &HashMap<u32, WgDevice>,
        k: &Table,
    ) -> Vec<RawUnderlay> {
        let kind = LinkKind::from_kernel(tunnel.kind.as_deref(), tunnel.link_type);
        let t = tunnel.tunnel.clone().unwrap_or_default();
        let ns = Namespace {
            links,
            routes,
            fdb,
            wireguard: wg,
        };
        resolve_underlays(tunnel, &kind, &t, &ns, k)
    }

    #[test]
    fn flannel_fdb_entries_on_the_jumbo_network_are_its_underlay() {
        // flannel.1: no remote, not bound; its peers are FDB entries on cl0's network,
        // while the default route is ul0's.
        let flannel = link_fx::vxlan(vec![
            InfoVxlan::Id(1),
            InfoVxlan::Local(Ipv4Addr::new(192, 168, 88, 1)),
        ]);
        let mut links = nics();
        links.push(flannel.clone());
        let fdb = [
            fdb::fixtures::entry(flannel.index, v4([192, 168, 88, 2])),
            fdb::fixtures::entry(flannel.index, v4([192, 168, 88, 3])),
            fdb::fixtures::entry(flannel.index, v4([192, 168, 88, 2])),
        ];
        let k = Table::new(node_routes());
        let ways = resolve_with(
            &flannel,
            &links,
            &k.routes.clone(),
            &fdb,
            &HashMap::new(),
            &k,
        );
        assert_eq!(ways.len(), 1, "{ways:?}");
        let w = &ways[0];
        assert_eq!(
            (w.ifindex, w.source, w.endpoint, w.endpoints),
            (
                CL0,
                UnderlaySource::RouteToFdbDestination,
                Some(v4([192, 168, 88, 2])),
                2
            )
        );
        assert_eq!(k.asked.borrow().len(), 2, "each endpoint once");
    }

    #[test]
    fn a_route_mtu_to_the_endpoints_network_caps_it() {
        let vx = link_fx::vxlan(vec![InfoVxlan::Group(Ipv4Addr::new(192, 168, 88, 2))]);
        let mut links = nics();
        links.push(vx.clone());
        let mut routes = node_routes();
        routes.push(route(
            v4([192, 168, 88, 0]),
            25,
            CL0,
            Opts {
                mtu: Some(1500),
                ..Opts::default()
            },
        ));
        let k = Table::new(routes.clone());
        let ways = resolve(&vx, &links, &routes, &k);
        assert_eq!(ways.len(), 1);
        assert_eq!(ways[0].source, UnderlaySource::RouteToRemote);
        assert_eq!(ways[0].route_mtu, Some(1500));
        assert_eq!(ways[0].route.as_deref(), Some("192.168.88.0/25"));
    }

    #[test]
    fn a_learned_path_mtu_is_its_own_way_out() {
        // flannel.1 with three peers on cl0; the route cache learned 1400 towards two of
        // them (a narrower hop beyond this node on their way).
        let vx = link_fx::vxlan(vec![InfoVxlan::Id(1)]);
        let mut links = nics();
        links.push(vx.clone());
        let fdb = [2, 3, 4].map(|p| fdb::fixtures::entry(vx.index, v4([192, 168, 88, p])));
        let routes = node_routes();
        let mut k = Table::new(routes.clone());
        for p in [3, 4] {
            k.learned.insert(
                v4([192, 168, 88, p]),
                LearnedPmtu {
                    mtu: 1400,
                    expires_secs: 590,
                },
            );
        }
        let ways = resolve_with(&vx, &links, &routes, &fdb, &HashMap::new(), &k);
        assert_eq!(ways.len(), 2, "{ways:?}");
        assert_eq!((ways[0].learned, ways[0].endpoints), (None, 1));
        let w = &ways[1];
        assert_eq!(
            (w.ifindex, w.endpoint, w.endpoints, w.learned.map(|l| l.mtu)),
            (CL0, Some(v4([192, 168, 88, 3])), 2, Some(1400))
        );
        assert_eq!(
            w.learned_endpoints,
            vec![v4([192, 168, 88, 3]), v4([192, 168, 88, 4])]
        );
    }

    #[test]
    fn endpoints_on_two_networks_are_two_ways_out() {
        let vx = link_fx::vxlan(vec![InfoVxlan::Id(1)]);
        let mut links = nics();
        links.push(vx.clone());
        let fdb = [
            fdb::fixtures::entry(vx.index, v4([192, 168, 88, 2])),
            fdb::fixtures::entry(vx.index, v4([192, 168, 77, 9])),
        ];
        let routes = node_routes();
        let k = Table::new(routes.clone());
        let ways = resolve_with(&vx, &links, &routes, &fdb, &HashMap::new(), &k);
        let devs: Vec<_> = ways.iter().map(|w| w.ifindex).collect();
        assert_eq!(devs, vec![CL0, UL0]);
    }

    #[test]
    fn bound_tunnels_keep_their_device_and_look_up_from_it() {
        let vx = link_fx::vxlan(vec![
            InfoVxlan::Group(Ipv4Addr::new(192, 168, 88, 2)),
            InfoVxlan::Link(UL0),
        ]);
        let mut links = nics();
        links.push(vx.clone());
        let routes = node_routes();
        let k = Table::new(routes.clone());
        let ways = resolve(&vx, &links, &routes, &k);
        assert_eq!(
            (ways[0].ifindex, ways[0].source, ways[0].route_mtu),
            (UL0, UnderlaySource::Bound, None),
            "the route via cl0 is not the bound device's: its metrics do not count"
        );
        assert_eq!(k.asked.borrow()[0].1, Some(UL0));
    }

    #[test]
    fn calico_tunl0_endpoints_are_its_routes_gateways() {
        // Calico's IPIP: tunl0 without remote, `10.244.2.0/26 via 192.168.88.2 dev tunl0
        // onlink` per remote block.
        let tunl0 = link_fx::ipip(link_fx::InfoKind::IpIp, vec![]);
        let mut links = nics();
        links.push(tunl0.clone());
        let mut routes = node_routes();
        for (block, peer) in [(2u8, 2u8), (3, 3)] {
            routes.push(route(
                v4([10, 244, block, 0]),
                26,
                tunl0.index,
                Opts {
                    gateway: Some(v4([192, 168, 88, peer])),
                    ..Opts::default()
                },
            ));
        }
        let k = Table::new(routes.clone());
        let ways = resolve(&tunl0, &links, &routes, &k);
        assert_eq!(ways.len(), 1, "{ways:?}");
        assert_eq!(
            (ways[0].ifindex, ways[0].source, ways[0].endpoints),
            (CL0, UnderlaySource::RouteToTunnelGateway, 2)
        );
    }

    #[test]
    fn metadata_mode_tunnels_use_their_routes_encap_destinations() {
        // tunl0 in collect_md mode, and an external VXLAN with IPv6 endpoints.
        let tunl0 = link_fx::ipip(link_fx::InfoKind::IpIp, vec![InfoIpTunnel::CollectMetadata]);
        let vx = link_fx::vxlan(vec![InfoVxlan::CollectMetadata(true)]);
        let mut links = nics();
        links.push(tunl0.clone());
        links.push(vx.clone());
        let v6: IpAddr = "fd00:88::2".parse().unwrap();
        let mut routes = node_routes();
        routes.push(route(
            v4([10, 244, 2, 0]),
            24,
            tunl0.index,
            Opts {
                encap_dst: Some(v4([192, 168, 88, 2])),
                ..Opts::default()
            },
        ));
        routes.push(route(
            v4([10, 244, 3, 0]),
            24,
            vx.index,
            Opts {
                encap_dst: Some(v6),
                ..Opts::default()
            },
        ));
        routes.push(route(
            "fd00:88::".parse().unwrap(),
            64,
            CL0,
            Opts {
                kernel: true,
                ..Opts::default()
            },
        ));
        let k = Table::new(routes.clone());
        let ways = resolve(&tunl0, &links, &routes, &k);
        assert_eq!(
            (ways[0].ifindex, ways[0].source),
            (CL0, UnderlaySource::RouteToEncapDestination)
        );
        let ways = resolve(&vx, &links, &routes, &k);
        assert_eq!(ways[0].endpoint, Some(v6));
        assert_eq!(ways[0].ifindex, CL0);
    }

    #[test]
    fn wireguard_peers_are_looked_up_with_its_fwmark() {
        let wg_link = link_fx::wireguard();
        let mut links = nics();
        links.push(wg_link.clone());
        let dev = wireguard::fixtures::device(
            0xca6c,
            &[Some(v4([192, 168, 88, 2])), Some(v4([192, 168, 88, 3]))],
        );
        let wg = HashMap::from([(wg_link.index, dev)]);
        let routes = node_routes();
        let k = Table::new(routes.clone());
        let ways = resolve_with(&wg_link, &links, &routes, &[], &wg, &k);
        assert_eq!(
            (ways[0].ifindex, ways[0].source, ways[0].endpoints),
            (CL0, UnderlaySource::RouteToWireguardPeer, 2)
        );
        assert!(k.asked.borrow().iter().all(|a| a.2 == Some(0xca6c)));
    }

    #[test]
    fn without_endpoints_the_fallbacks_hold() {
        let wg_link = link_fx::wireguard();
        let mut links = nics();
        links.push(wg_link.clone());
        let routes = node_routes();
        let k = Table::new(routes.clone());
        let ways = resolve(&wg_link, &links, &routes, &k);
        assert_eq!(
            (ways[0].ifindex, ways[0].source),
            (UL0, UnderlaySource::DefaultRoute)
        );
        // No default route: the largest physical interface.
        let k = Table::new(Vec::new());
        let ways = resolve(&wg_link, &links, &[], &k);
        assert_eq!(
            (ways[0].ifindex, ways[0].source),
            (CL0, UnderlaySource::LargestPhysical)
        );
        // An endpoint without a route is skipped, not a failure.
        let vx = link_fx::vxlan(vec![InfoVxlan::Group(Ipv4Addr::new(10, 9, 9, 9))]);
        let ways = resolve(&vx, &links, &[], &k);
        assert_eq!(ways[0].source, UnderlaySource::LargestPhysical);
    }
}
