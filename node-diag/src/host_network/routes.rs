//! Route and address lookups: where the kernel sends a packet for an address, the
//! configured route that decides it (its `mtu` and `advmss` metrics included), the path
//! MTU the route cache learned for it (a route exception), the main table's routes, and
//! which device holds a local address. The inventory uses them to find each tunnel
//! endpoint's underlay and what the routes through an interface cap.

use std::{fmt, net::IpAddr};

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    route::{
        RouteAddress, RouteAttribute, RouteCacheInfo, RouteFlags, RouteHeader, RouteIp6Tunnel,
        RouteIpTunnel, RouteLwTunnelEncap, RouteMessage, RouteMetric, RouteProtocol, RouteType,
    },
};
use netlink_sys::Socket;

use super::{
    interfaces::Family,
    rtnetlink::{NetlinkError, request, socket},
};

/// What the kernel's route lookup answers for one destination (`ip route get`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    /// The output interface.
    pub(crate) oif: u32,
    /// The preferred source address, when the route names one.
    pub(crate) prefsrc: Option<IpAddr>,
    /// The route's `mtu` metric, when set.
    pub(crate) mtu: Option<u32>,
}

/// The kernel's route for `dst`. `Ok(None)` when the answer names no interface; a
/// refusal (ENETUNREACH, EHOSTUNREACH...) is `NetlinkError::Kernel`, for callers that
/// tell "no route" from other failures.
pub(crate) fn route_get(dst: IpAddr) -> Result<Option<Route>, NetlinkError> {
    let sock = socket()?;
    let mut msg = RouteMessage::default();
    msg.header.address_family = family_of(dst);
    msg.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
    msg.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(dst)));
    let replies = request(&sock, RouteNetlinkMessage::GetRoute(msg), 0)?;
    Ok(replies.into_iter().find_map(|m| {
        let RouteNetlinkMessage::NewRoute(r) = m else {
            return None;
        };
        let oif = route_oif_of(&r)?;
        let (mut prefsrc, mut mtu) = (None, None);
        for a in r.attributes {
            match a {
                RouteAttribute::PrefSource(RouteAddress::Inet(a)) => prefsrc = Some(a.into()),
                RouteAttribute::PrefSource(RouteAddress::Inet6(a)) => prefsrc = Some(a.into()),
                RouteAttribute::Metrics(metrics) => {
                    mtu = metrics.into_iter().find_map(|m| match m {
                        RouteMetric::Mtu(m) if m != 0 => Some(m),
                        _ => None,
                    });
                }
                _ => {}
            }
        }
        Some(Route { oif, prefsrc, mtu })
    }))
}

fn family_of(a: IpAddr) -> AddressFamily {
    if a.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn route_oif_of(r: &RouteMessage) -> Option<u32> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        RouteAttribute::MultiPath(hops) => hops.first().map(|h| h.interface_index),
        _ => None,
    })
}

/// The interface holding the local address `addr`, if any.
pub(crate) fn address_owner(addr: IpAddr) -> Result<Option<u32>, NetlinkError> {
    let sock = socket()?;
    let mut msg = AddressMessage::default();
    msg.header.family = family_of(addr);
    let replies = request(&sock, RouteNetlinkMessage::GetAddress(msg), NLM_F_DUMP)?;
    Ok(replies.into_iter().find_map(|m| match m {
        RouteNetlinkMessage::NewAddress(a)
            if a.attributes.iter().any(|at| {
                matches!(at, AddressAttribute::Local(x) | AddressAttribute::Address(x) if *x == addr)
            }) =>
        {
            Some(a.header.index)
        }
        _ => None,
    }))
}

/// A path MTU the kernel learned for one destination from an ICMP frag-needed (IPv4) or
/// packet-too-big (IPv6): a route exception, what `ip route get` prints as
/// `cache expires 598sec mtu 1400`. It lives until it expires
/// (`net.ipv4.route.mtu_expires`, `net.ipv6.route.mtu_expires`: 600 s by default) or the
/// cache is flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LearnedPmtu {
    pub(crate) mtu: u32,
    /// Seconds until the kernel forgets it.
    pub(crate) expires_secs: u32,
}

/// `rta_expires` counts clock ticks (`USER_HZ`, 100 on every architecture Linux exposes
/// to user space).
const USER_HZ: u32 = 100;

/// The learned path MTU in a route lookup's answer (not a FIB match), if any. The kernel
/// puts an exception's PMTU in RTAX_MTU only while the exception has not expired, and its
/// expiry in RTA_CACHEINFO; a configured `mtu` metric comes without an expiry. An IPv6
/// exception is also flagged RTM_F_CLONED (RTF_CACHE), while IPv4 flags every answer so.
pub(crate) fn learned_pmtu_of(r: &RouteMessage) -> Option<LearnedPmtu> {
    let mut mtu = None;
    let mut expires = 0;
    for a in &r.attributes {
        match a {
            RouteAttribute::Metrics(metrics) => {
                mtu = metrics.iter().find_map(|m| match m {
                    RouteMetric::Mtu(m) if *m != 0 => Some(*m),
                    _ => None,
                });
            }
            RouteAttribute::CacheInfo(RouteCacheInfo { expires: e, .. }) => expires = *e,
            _ => {}
        }
    }
    if r.header.address_family == AddressFamily::Inet6
        && !r.header.flags.contains(RouteFlags::Cloned)
    {
        return None;
    }
    (expires > 0).then_some(())?;
    Some(LearnedPmtu {
        mtu: mtu?,
        expires_secs: expires.div_ceil(USER_HZ),
    })
}

/// One next hop of a configured route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NextHop {
    pub(crate) oif: u32,
    pub(crate) gateway: Option<IpAddr>,
}

/// A configured route (a FIB entry, never a cached exception: a PMTU learned from
/// frag-needed is the path's state, not its configuration), as the MTU model reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteEntry {
    pub(crate) family: Family,
    /// Destination network; the unspecified address with length 0 for a default route.
    pub(crate) dst: IpAddr,
    pub(crate) prefix_len: u8,
    /// The single next hop, or each hop of a multipath route.
    pub(crate) hops: Vec<NextHop>,
    /// The `mtu` metric (RTAX_MTU): the largest packet the kernel builds or forwards
    /// by this route, whatever the device's MTU.
    pub(crate) mtu: Option<u32>,
    /// The `advmss` metric (RTAX_ADVMSS): the TCP MSS advertised to peers reached by
    /// this route, which bounds the segments they send back.
    pub(crate) advmss: Option<u32>,
    /// Added by the kernel for an address's own subnet (`proto kernel`).
    pub(crate) connected: bool,
    /// The outer destination of a lightweight tunnel (`encap ip dst X`/`encap ip6 dst X`)
    /// for a metadata-mode tunnel device.
    pub(crate) encap_dst: Option<IpAddr>,
    /// Routing table id.
    pub(crate) table: u32,
    pub(crate) unicast: bool,
    /// The route's metric (priority): the lowest wins among equal prefixes.
    pub(crate) metric: u32,
}

impl RouteEntry {
    pub(crate) fn is_default(&self) -> bool {
        self.prefix_len == 0
    }

    /// Whether the route leaves by interface `ifindex` (any hop of a multipath route).
    pub(crate) fn via(&self, ifindex: u32) -> bool {
        self.hops.iter().any(|h| h.oif == ifindex)
    }

    /// Whether the route can carry packets beyond the link it leaves by: a default
    /// route, a route through a gateway, or a subnet routed onto the link. Host routes
    /// without a gateway, a device's own subnet (`proto kernel`) and IPv6 link-local
    /// routes only reach neighbours on the link itself (for a pod's veth, its node and the
    /// pods on the same bridge), so their packets never enter an overlay.
    pub(crate) fn leaves_the_link(&self) -> bool {
        if !self.unicast || self.table != u32::from(RouteHeader::RT_TABLE_MAIN) {
            return false;
        }
        if self.is_default() || self.hops.iter().any(|h| h.gateway.is_some()) {
            return true;
        }
        let host = self.prefix_len == if self.dst.is_ipv4() { 32 } else { 128 };
        let link_local = match self.dst {
            IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
            IpAddr::V4(_) => false,
        };
        !(host || self.connected || link_local)
    }
}

/// "default via 169.254.1.1", "10.244.2.0/24 via 10.244.2.0", "10.244.3.0/24".
impl fmt::Display for RouteEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_default() {
            f.write_str("default")?;
        } else {
            write!(f, "{}/{}", self.dst, self.prefix_len)?;
        }
        if let Some(gw) = self.hops.iter().find_map(|h| h.gateway) {
            write!(f, " via {gw}")?;
        }
        Ok(())
    }
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(a) => Some((*a).into()),
        RouteAddress::Inet6(a) => Some((*a).into()),
        _ => None,
    }
}

fn encap_dst_of(encap: &[RouteLwTunnelEncap]) -> Option<IpAddr> {
    encap.iter().find_map(|e| match e {
        RouteLwTunnelEncap::Ip(RouteIpTunnel::Destination(a)) => Some((*a).into()),
        RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Destination(a)) => Some((*a).into()),
        _ => None,
    })
}

/// A route message as a [`RouteEntry`]; `None` for other families.
pub(crate) fn route_entry_from(r: &RouteMessage) -> Option<RouteEntry> {
    let family = match r.header.address_family {
        AddressFamily::Inet => Family::V4,
        AddressFamily::Inet6 => Family::V6,
        _ => return None,
    };
    let unspecified: IpAddr = match family {
        Family::V4 => std::net::Ipv4Addr::UNSPECIFIED.into(),
        Family::V6 => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let mut e = RouteEntry {
        family,
        dst: unspecified,
        prefix_len: r.header.destination_prefix_length,
        hops: Vec::new(),
        mtu: None,
        advmss: None,
        connected: r.header.protocol == RouteProtocol::Kernel,
        encap_dst: None,
        table: u32::from(r.header.table),
        unicast: r.header.kind == RouteType::Unicast,
        metric: 0,
    };
    let (mut oif, mut gateway) = (None, None);
    for a in &r.attributes {
        match a {
            RouteAttribute::Destination(d) => e.dst = ip_of(d).unwrap_or(unspecified),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Gateway(g) => gateway = ip_of(g),
            RouteAttribute::Table(t) => e.table = *t,
            RouteAttribute::Priority(p) => e.metric = *p,
            RouteAttribute::Encap(encap) => e.encap_dst = encap_dst_of(encap),
            RouteAttribute::Metrics(metrics) => {
                for m in metrics {
                    match m {
                        RouteMetric::Mtu(v) if *v != 0 => e.mtu = Some(*v),
                        RouteMetric::Advmss(v) if *v != 0 => e.advmss = Some(*v),
                        _ => {}
                    }
                }
            }
            RouteAttribute::MultiPath(hops) => {
                e.hops.extend(hops.iter().map(|h| NextHop {
                    oif: h.interface_index,
                    gateway: h.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Gateway(g) => ip_of(g),
                        _ => None,
                    }),
                }));
            }
            _ => {}
        }
    }
    if let Some(oif) = oif {
        e.hops.insert(0, NextHop { oif, gateway });
    }
    Some(e)
}

/// Every IPv4 and IPv6 route of the calling thread's namespace, all tables.
pub(crate) fn routes() -> Result<Vec<RouteEntry>, NetlinkError> {
    let sock = socket()?;
    let mut out = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family;
        let replies = request(&sock, RouteNetlinkMessage::GetRoute(msg), NLM_F_DUMP)?;
        out.extend(replies.iter().filter_map(|m| match m {
            RouteNetlinkMessage::NewRoute(r) => route_entry_from(r),
            _ => None,
        }));
    }
    Ok(out)
}

/// The main table's default route with the lowest metric, from a dump: its interface.
pub(crate) fn default_route_oif_in(routes: &[RouteEntry], family: Family) -> Option<u32> {
    routes
        .iter()
        .filter(|r| {
            r.family == family
                && r.is_default()
                && r.unicast
                && r.table == u32::from(RouteHeader::RT_TABLE_MAIN)
        })
        .filter_map(|r| Some((r.metric, r.hops.first()?.oif)))
        .min_by_key(|(metric, _)| *metric)
        .map(|(_, oif)| oif)
}

/// Route lookups on one socket of the calling thread's namespace: one round trip each,
/// however many endpoints a tunnel has.
pub(crate) struct FibLookup {
    sock: Socket,
}

impl FibLookup {
    pub(crate) fn new() -> Result<Self, NetlinkError> {
        Ok(Self { sock: socket()? })
    }

    /// The configured route the kernel picks for `dst` (`ip route get fibmatch`), from
    /// interface `oif` (a tunnel's bound device) and with firewall mark `mark` (a
    /// WireGuard device's fwmark) when given: the same lookup the tunnel's own packets
    /// get. `Ok(None)` when there is no route.
    pub(crate) fn fib_match(
        &self,
        dst: IpAddr,
        oif: Option<u32>,
        mark: Option<u32>,
    ) -> Result<Option<RouteEntry>, NetlinkError> {
        self.get_route(dst, oif, mark, RouteFlags::FibMatch, route_entry_from)
    }

    /// The path MTU the route cache learned for `dst` (`ip route get`, not `fibmatch`:
    /// only the resolved route carries the exception), looked up from `oif` with `mark`
    /// like [`FibLookup::fib_match`]. `Ok(None)` when nothing was learned or there is no
    /// route.
    pub(crate) fn learned_pmtu(
        &self,
        dst: IpAddr,
        oif: Option<u32>,
        mark: Option<u32>,
    ) -> Result<Option<LearnedPmtu>, NetlinkError> {
        self.get_route(dst, oif, mark, RouteFlags::empty(), learned_pmtu_of)
    }

    /// One `RTM_GETROUTE` for `dst` from `oif` with `mark` and `flags`, and what `read`
    /// takes from the route the kernel answers with.
    fn get_route<T>(
        &self,
        dst: IpAddr,
        oif: Option<u32>,
        mark: Option<u32>,
        flags: RouteFlags,
        read: impl Fn(&RouteMessage) -> Option<T>,
    ) -> Result<Option<T>, NetlinkError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family_of(dst);
        msg.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
        msg.header.flags = flags;
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(dst)));
        if let Some(oif) = oif {
            msg.attributes.push(RouteAttribute::Oif(oif));
        }
        if let Some(mark) = mark {
            msg.attributes.push(RouteAttribute::Mark(mark));
        }
        match request(&self.sock, RouteNetlinkMessage::GetRoute(msg), 0) {
            Ok(replies) => Ok(replies.iter().find_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => read(r),
                _ => None,
            })),
            // ENETUNREACH, EHOSTUNREACH...: no route is an answer, not a failure.
            Err(NetlinkError::Kernel(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Route messages as the kernel dumps them, built with the crate's types and parsed
/// back: fixtures for routes this kernel cannot hold (through devices it lacks).
#[cfg(test)]
pub(crate) mod fixtures {
    use netlink_packet_core::{Emitable as _, Parseable as _};
    use netlink_packet_route::route::{RouteLwEnCapType, RouteScope};

    use super::*;

    /// Options of a fixture route beyond its destination and interface.
    #[derive(Default)]
    pub(crate) struct Opts {
        pub(crate) gateway: Option<IpAddr>,
        pub(crate) mtu: Option<u32>,
        pub(crate) advmss: Option<u32>,
        pub(crate) kernel: bool,
        pub(crate) encap_dst: Option<IpAddr>,
    }

    /// A main-table unicast route to `dst/len` out of `oif`, serialized and parsed back.
    pub(crate) fn route(dst: IpAddr, len: u8, oif: u32, o: Opts) -> RouteEntry {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family_of(dst);
        msg.header.destination_prefix_length = len;
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.header.kind = RouteType::Unicast;
        msg.header.protocol = if o.kernel {
            RouteProtocol::Kernel
        } else {
            RouteProtocol::Boot
        };
        msg.header.scope = if o.gateway.is_some() {
            RouteScope::Universe
        } else {
            RouteScope::Link
        };
        if len > 0 {
            msg.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(dst)));
        }
        msg.attributes.push(RouteAttribute::Oif(oif));
        if let Some(gw) = o.gateway {
            msg.attributes
                .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
        }
        let mut metrics = Vec::new();
        metrics.extend(o.mtu.map(RouteMetric::Mtu));
        metrics.extend(o.advmss.map(RouteMetric::Advmss));
        if !metrics.is_empty() {
            msg.attributes.push(RouteAttribute::Metrics(metrics));
        }
        if let Some(encap) = o.encap_dst {
            let (kind, attr) = match encap {
                IpAddr::V4(a) => (
                    RouteLwEnCapType::Ip,
                    RouteLwTunnelEncap::Ip(RouteIpTunnel::Destination(a)),
                ),
                IpAddr::V6(a) => (
                    RouteLwEnCapType::Ip6,
                    RouteLwTunnelEncap::Ip6(RouteIp6Tunnel::Destination(a)),
                ),
            };
            msg.attributes.push(RouteAttribute::EncapType(kind));
            msg.attributes.push(RouteAttribute::Encap(vec![attr]));
        }
        route_entry_from(&round_trip(&msg)).expect("an IP route")
    }

    fn round_trip(msg: &RouteMessage) -> RouteMessage {
        let mut buf = vec![0; msg.buffer_len()];
        msg.emit(&mut buf);
        RouteMessage::parse(buf.as_slice()).expect("fixture parses")
    }

    /// A route lookup's answer (`ip route get`) for `dst` out of `oif`: RTAX_MTU `mtu`,
    /// `rta_expires` `expires` clock ticks, flagged RTM_F_CLONED when `cloned`,
    /// serialized and parsed back.
    pub(crate) fn answer(
        dst: IpAddr,
        oif: u32,
        mtu: Option<u32>,
        expires: u32,
        cloned: bool,
    ) -> RouteMessage {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family_of(dst);
        msg.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.header.kind = RouteType::Unicast;
        if cloned {
            msg.header.flags = RouteFlags::Cloned;
        }
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(dst)));
        msg.attributes.push(RouteAttribute::Oif(oif));
        if let Some(mtu) = mtu {
            msg.attributes
                .push(RouteAttribute::Metrics(vec![RouteMetric::Mtu(mtu)]));
        }
        // struct rta_cacheinfo: clntref, lastuse, expires, error, used, id, ts, tsage.
        let mut raw = [0u8; 32];
        raw[8..12].copy_from_slice(&expires.to_ne_bytes());
        let info = RouteCacheInfo::parse(&raw).expect("cacheinfo parses");
        msg.attributes.push(RouteAttribute::CacheInfo(info));
        round_trip(&msg)
    }
}

#[cfg(test)]
mod tests {
    use super::{
        fixtures::{Opts, route},
        *,
    };

    fn a(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn which_routes_leave_their_link() {
        let gw = || Opts {
            gateway: Some(a("169.254.1.1")),
            ..Opts::default()
        };
        let default = route(a("0.0.0.0"), 0, 2, gw());
        assert!(default.is_default() && default.leaves_the_link());
        assert_eq!(default.to_string(), "default via 169.254.1.1");
        let subnet = route(a("10.244.2.0"), 24, 3, Opts::default());
        assert!(subnet.leaves_the_link(), "a subnet routed onto the link");
        assert_eq!(subnet.to_string(), "10.244.2.0/24");
        for (r, why) in [
            (
                route(a("169.254.1.1"), 32, 2, Opts::default()),
                "the router's host route",
            ),
            (
                route(
                    a("10.244.1.0"),
                    24,
                    2,
                    Opts {
                        kernel: true,
                        ..Opts::default()
                    },
                ),
                "the address's own subnet",
            ),
            (
                route(a("fe80::"), 64, 2, Opts::default()),
                "IPv6 link-local",
            ),
        ] {
            assert!(!r.leaves_the_link(), "{why}: {r:?}");
        }
        let mut local = route(a("0.0.0.0"), 0, 2, gw());
        local.table = 255;
        assert!(!local.leaves_the_link(), "not the main table");
    }

    #[test]
    fn metrics_and_encapsulation_parse() {
        let r = route(
            a("10.244.2.0"),
            24,
            7,
            Opts {
                gateway: Some(a("10.200.0.2")),
                mtu: Some(1450),
                advmss: Some(1410),
                encap_dst: Some(a("fd00:77::2")),
                ..Opts::default()
            },
        );
        assert_eq!((r.mtu, r.advmss), (Some(1450), Some(1410)));
        assert_eq!(r.encap_dst, Some(a("fd00:77::2")));
        assert!(r.via(7) && !r.via(2));
        assert_eq!(r.family, Family::V4);
    }

    #[test]
    fn learned_path_mtus_are_the_exceptions_that_expire() {
        use super::fixtures::answer;
        // `cache expires 598sec mtu 1400`: an IPv4 exception.
        let v4 = answer(a("192.168.79.2"), 2, Some(1400), 59_712, true);
        assert_eq!(
            learned_pmtu_of(&v4),
            Some(LearnedPmtu {
                mtu: 1400,
                expires_secs: 598
            })
        );
        // A route's own `mtu` metric has no expiry: configured, not learned.
        assert_eq!(
            learned_pmtu_of(&answer(a("192.168.79.2"), 2, Some(1400), 0, true)),
            None
        );
        // Nothing learned: no metric.
        assert_eq!(
            learned_pmtu_of(&answer(a("192.168.79.2"), 2, None, 0, true)),
            None
        );
        // IPv6 (packet-too-big): an RTF_CACHE clone with an expiry.
        let v6 = answer(a("fd00:79::2"), 2, Some(1280), 30_000, true);
        assert_eq!(learned_pmtu_of(&v6).map(|l| l.mtu), Some(1280));
        // An IPv6 route that expires (from a router advertisement) is no exception.
        assert_eq!(
            learned_pmtu_of(&answer(a("fd00:79::2"), 2, Some(1280), 30_000, false)),
            None
        );
    }

    #[test]
    fn default_route_of_the_lowest_metric() {
        let mut high = route(a("0.0.0.0"), 0, 2, Opts::default());
        high.metric = 200;
        let mut low = route(a("0.0.0.0"), 0, 3, Opts::default());
        low.metric = 100;
        assert_eq!(default_route_oif_in(&[high, low], Family::V4), Some(3));
        assert_eq!(default_route_oif_in(&[], Family::V6), None);
    }
}
