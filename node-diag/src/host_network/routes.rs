//! Route and address lookups: where the kernel sends a packet for an address, the
//! default route's device, and which device holds a local address. The inventory uses
//! them to find a tunnel's underlay when it is not bound to a device.

use std::net::IpAddr;

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteMetric, RouteType},
};

use super::rtnetlink::{NetlinkError, request, socket};

/// What the kernel's route lookup answers for one destination (`ip route get`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The output interface.
    pub oif: u32,
    /// The preferred source address, when the route names one.
    pub prefsrc: Option<IpAddr>,
    /// The route's `mtu` metric, when set.
    pub mtu: Option<u32>,
}

/// The kernel's route for `dst`. `Ok(None)` when the answer names no interface; a
/// refusal (ENETUNREACH, EHOSTUNREACH...) is `NetlinkError::Kernel`, for callers that
/// tell "no route" from other failures.
pub fn route_get(dst: IpAddr) -> Result<Option<Route>, NetlinkError> {
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

/// The output interface the kernel's route lookup picks for `dst`. `None` when there is
/// no route.
pub fn route_oif(dst: IpAddr) -> Result<Option<u32>, NetlinkError> {
    match route_get(dst) {
        Ok(route) => Ok(route.map(|r| r.oif)),
        // ENETUNREACH, EHOSTUNREACH...: no route is an answer, not a failure.
        Err(NetlinkError::Kernel(_)) => Ok(None),
        Err(e) => Err(e),
    }
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

/// The interface of the main table's default route (the lowest metric one) for IPv4
/// (`v6 == false`) or IPv6.
pub fn default_route_oif(v6: bool) -> Result<Option<u32>, NetlinkError> {
    let sock = socket()?;
    let mut msg = RouteMessage::default();
    msg.header.address_family = if v6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    let replies = request(&sock, RouteNetlinkMessage::GetRoute(msg), NLM_F_DUMP)?;
    let mut best: Option<(u32, u32)> = None;
    for m in replies {
        let RouteNetlinkMessage::NewRoute(r) = m else {
            continue;
        };
        let table = r
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(u32::from(r.header.table));
        if r.header.destination_prefix_length != 0
            || r.header.kind != RouteType::Unicast
            || table != u32::from(RouteHeader::RT_TABLE_MAIN)
        {
            continue;
        }
        let metric = r
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Priority(p) => Some(*p),
                _ => None,
            })
            .unwrap_or(0);
        if let Some(oif) = route_oif_of(&r)
            && best.is_none_or(|(m, _)| metric < m)
        {
            best = Some((metric, oif));
        }
    }
    Ok(best.map(|(_, oif)| oif))
}

/// The interface holding the local address `addr`, if any.
pub fn address_owner(addr: IpAddr) -> Result<Option<u32>, NetlinkError> {
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
