//! Route and address lookups: where the kernel sends a packet for an address, the
//! default route's device, and which device holds a local address. The inventory uses
//! them to find a tunnel's underlay when it is not bound to a device.

use std::net::IpAddr;

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType},
};

use super::rtnetlink::{NetlinkError, request, socket};

/// The output interface the kernel's route lookup picks for `dst` (`ip route get`).
/// `None` when there is no route.
pub fn route_oif(dst: IpAddr) -> Result<Option<u32>, NetlinkError> {
    let sock = socket()?;
    let mut msg = RouteMessage::default();
    msg.header.address_family = family_of(dst);
    msg.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
    msg.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(dst)));
    let replies = match request(&sock, RouteNetlinkMessage::GetRoute(msg), 0) {
        Ok(r) => r,
        // ENETUNREACH, EHOSTUNREACH...: no route is an answer, not a failure.
        Err(NetlinkError::Kernel(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(replies.into_iter().find_map(|m| match m {
        RouteNetlinkMessage::NewRoute(r) => route_oif_of(&r),
        _ => None,
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
