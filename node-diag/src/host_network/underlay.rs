//! A tunnel's underlay: the device its encapsulated packets leave by, and the family of
//! its outer header. Bound tunnels name their device; the others are resolved the way
//! the kernel routes their packets.

use tracing::debug;

use super::{
    interfaces::{ARPHRD_LOOPBACK, Family, LinkKind, UnderlaySource},
    links::{Link, Tunnel},
    routes,
    rtnetlink::NetlinkError,
};

/// The outer header's family: fixed by the kind for IP tunnels, else told by the
/// configured remote or local address.
pub fn tunnel_family(kind: &LinkKind, t: &Tunnel) -> Option<Family> {
    match kind {
        LinkKind::Ipip | LinkKind::Sit | LinkKind::Gre | LinkKind::Gretap => Some(Family::V4),
        LinkKind::Ip6tnl | LinkKind::Ip6gre | LinkKind::Ip6gretap => Some(Family::V6),
        _ => t.remote.or(t.local).map(Family::of),
    }
}

/// remote (what the kernel itself uses per packet); else the device holding its local
/// address; else the default route's device; else the largest-MTU physical interface.
pub(super) fn resolve_underlay(
    link: &Link,
    kind: &LinkKind,
    t: &Tunnel,
    links: &[Link],
) -> Option<(u32, UnderlaySource)> {
    // Created in another namespace and moved here: its bound device and routes live
    // there, out of reach from this one.
    if link.link_netnsid.is_some() {
        return None;
    }
    if let Some(dev) = t.bound_to.or(link.link) {
        return Some((dev, UnderlaySource::Bound));
    }
    // A route through the tunnel itself or to a local address says nothing about the
    // wire.
    let usable = |oif: u32| {
        oif != link.index
            && links
                .iter()
                .any(|l| l.index == oif && l.link_type != ARPHRD_LOOPBACK)
    };
    let lookup = |what: &str, r: Result<Option<u32>, NetlinkError>| match r {
        Ok(Some(oif)) if usable(oif) => Some(oif),
        Ok(_) => None,
        Err(e) => {
            debug!(tunnel = %link.name, error = %e, "{what} lookup failed");
            None
        }
    };
    if let Some(remote) = t.remote
        && let Some(oif) = lookup("route", routes::route_oif(remote))
    {
        return Some((oif, UnderlaySource::RouteToRemote));
    }
    if let Some(local) = t.local
        && let Some(oif) = lookup("address", routes::address_owner(local))
    {
        return Some((oif, UnderlaySource::LocalAddress));
    }
    let v6 = tunnel_family(kind, t) == Some(Family::V6);
    if let Some(oif) = lookup("default route", routes::default_route_oif(v6)) {
        return Some((oif, UnderlaySource::DefaultRoute));
    }
    links
        .iter()
        .filter(|l| l.kind.is_none() && l.link_type != ARPHRD_LOOPBACK && l.up)
        .max_by_key(|l| (l.mtu.unwrap_or(0), std::cmp::Reverse(l.index)))
        .map(|l| (l.index, UnderlaySource::LargestPhysical))
}
