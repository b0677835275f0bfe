//! Where this node discarded a packet for a destination, when the kernel's drop reason
//! does not say (`NOT_SPECIFIED`) or names only a device (`NO_TX_TARGET`): the route
//! towards the destination when it is a `blackhole`, `unreachable` or `prohibit` route
//! (Calico's blackhole routes for its IPAM blocks), or the VXLAN it leaves by when that
//! has no forwarding entry for the next hop (flannel's and Calico's per-peer FDB
//! entries), or the next hop's neighbour entry when resolving it failed (the packets
//! queued on it are freed without a reason). Read from the main table, as the forwarding path looks it up without
//! policy rules.

use std::net::IpAddr;

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
    route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType},
};
use netlink_sys::Socket;

use super::{
    links::links,
    rtnetlink::{NetlinkError, request, socket},
};

/// What the calling thread's namespace does with packets for one destination.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct DropSite {
    /// The route the destination matches: "blackhole 10.244.3.0/26",
    /// "10.244.2.0/24 via 10.244.2.0 dev flannel.1".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) route: Option<String>,
    /// That route's type when it discards: `blackhole`, `unreachable`, `prohibit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) route_type: Option<&'static str>,
    /// The VXLAN the route leaves by, when it has no forwarding entry for the next hop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tunnel: Option<String>,
    /// The missing entry: the next hop's MAC and address ("02:00:00:00:02:01 for
    /// 10.244.2.0"), or "any entry for 10.244.2.0" when the next hop is unresolved and
    /// the device has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) missing_fdb_entry: Option<String>,
    /// The next hop whose link-layer address could not be resolved, with its state
    /// ("fd00:200::9 dev ul0 failed").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) neighbour: Option<String>,
}

/// Where the calling thread's namespace discards packets for `dst` (see [`DropSite`]).
pub(crate) fn drop_site(dst: IpAddr) -> Result<DropSite, NetlinkError> {
    let sock = socket()?;
    let family = family_of(dst);
    let mut msg = RouteMessage::default();
    msg.header.address_family = family;
    let routes: Vec<RouteMessage> = dump(&sock, RouteNetlinkMessage::GetRoute(msg))?
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewRoute(r) => Some(r),
            _ => None,
        })
        .collect();
    let Some(best) = best_route(&routes, dst) else {
        return Ok(DropSite::default());
    };
    let prefix = format!(
        "{}/{}",
        destination(best).unwrap_or(dst),
        best.header.destination_prefix_length
    );
    if let Some(kind) = discard_type(best.header.kind) {
        return Ok(DropSite {
            route: Some(format!("{kind} {prefix}")),
            route_type: Some(kind),
            ..DropSite::default()
        });
    }
    let Some(oif) = attr(best, |a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        _ => None,
    }) else {
        return Ok(DropSite::default());
    };
    let gateway = attr(best, |a| match a {
        RouteAttribute::Gateway(g) => ip_of(g),
        _ => None,
    });
    let next_hop = gateway.unwrap_or(dst);
    let mut msg = NeighbourMessage::default();
    msg.header.family = family;
    let entries = neighbours(&sock, msg)?;
    let entry = entries
        .iter()
        .find(|n| n.header.ifindex == oif && neighbour_dst(n) == Some(next_hop));
    let all_links = links()?;
    if let Some(n) = entry.filter(|n| unresolved(n.header.state)) {
        let dev = all_links
            .iter()
            .find(|l| l.index == oif)
            .map_or_else(|| format!("if{oif}"), |l| l.name.clone());
        return Ok(DropSite {
            route: Some(prefix),
            neighbour: Some(format!("{next_hop} dev {dev} {}", n.header.state)),
            ..DropSite::default()
        });
    }
    let Some(link) = all_links.into_iter().find(|l| {
        l.index == oif
            && l.kind.as_deref() == Some("vxlan")
            && l.tunnel
                .as_ref()
                .is_some_and(|t| t.remote.is_none() && !t.external)
    }) else {
        return Ok(DropSite::default());
    };
    let mut route = prefix;
    if let Some(gw) = gateway {
        route.push_str(&format!(" via {gw}"));
    }
    route.push_str(&format!(" dev {}", link.name));
    let mac = entry.and_then(lladdr);
    let mut msg = NeighbourMessage::default();
    msg.header.family = AddressFamily::Bridge;
    let fdb: Vec<Vec<u8>> = neighbours(&sock, msg)?
        .iter()
        .filter(|n| n.header.ifindex == oif)
        .filter_map(lladdr)
        .collect();
    let missing = missing_fdb_entry(mac.as_deref(), &fdb, next_hop);
    Ok(DropSite {
        route: Some(route),
        route_type: None,
        tunnel: missing.as_ref().map(|_| link.name.clone()),
        missing_fdb_entry: missing,
        neighbour: None,
    })
}

fn family_of(a: IpAddr) -> AddressFamily {
    if a.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn dump(sock: &Socket, msg: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
    request(sock, msg, NLM_F_DUMP)
}

fn neighbours(sock: &Socket, msg: NeighbourMessage) -> Result<Vec<NeighbourMessage>, NetlinkError> {
    Ok(dump(sock, RouteNetlinkMessage::GetNeighbour(msg))?
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewNeighbour(n) => Some(n),
            _ => None,
        })
        .collect())
}

fn attr<T>(r: &RouteMessage, f: impl Fn(&RouteAttribute) -> Option<T>) -> Option<T> {
    r.attributes.iter().find_map(f)
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(a) => Some((*a).into()),
        RouteAddress::Inet6(a) => Some((*a).into()),
        _ => None,
    }
}

fn destination(r: &RouteMessage) -> Option<IpAddr> {
    attr(r, |a| match a {
        RouteAttribute::Destination(d) => ip_of(d),
        _ => None,
    })
}

/// The type of a route that discards its packets, as `ip route` names it.
fn discard_type(kind: RouteType) -> Option<&'static str> {
    match kind {
        RouteType::BlackHole => Some("blackhole"),
        RouteType::Unreachable => Some("unreachable"),
        RouteType::Prohibit => Some("prohibit"),
        _ => None,
    }
}

/// Whether `prefix_len` bits of `net` and `dst` agree.
fn contains(net: IpAddr, prefix_len: u8, dst: IpAddr) -> bool {
    let (a, b, bits) = match (net, dst) {
        (IpAddr::V4(n), IpAddr::V4(d)) => (u128::from(n.to_bits()), u128::from(d.to_bits()), 32),
        (IpAddr::V6(n), IpAddr::V6(d)) => (n.to_bits(), d.to_bits(), 128),
        _ => return false,
    };
    let len = u32::from(prefix_len).min(bits);
    if len == 0 {
        return true;
    }
    let shift = bits - len;
    (a >> shift) == (b >> shift)
}

/// The main table's route for `dst`: the longest prefix, then the lowest metric, among
/// the unicast and discarding routes.
fn best_route(routes: &[RouteMessage], dst: IpAddr) -> Option<&RouteMessage> {
    let unspecified: IpAddr = match dst {
        IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    routes
        .iter()
        .filter(|r| {
            let table = attr(r, |a| match a {
                RouteAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(u32::from(r.header.table));
            table == u32::from(RouteHeader::RT_TABLE_MAIN)
                && (r.header.kind == RouteType::Unicast || discard_type(r.header.kind).is_some())
                && contains(
                    destination(r).unwrap_or(unspecified),
                    r.header.destination_prefix_length,
                    dst,
                )
        })
        .max_by_key(|r| {
            let metric = attr(r, |a| match a {
                RouteAttribute::Priority(p) => Some(*p),
                _ => None,
            })
            .unwrap_or(0);
            (
                r.header.destination_prefix_length,
                std::cmp::Reverse(metric),
            )
        })
}

/// A neighbour entry whose resolution failed or is still under way: what it holds
/// queued is dropped when it fails.
fn unresolved(state: NeighbourState) -> bool {
    matches!(state, NeighbourState::Failed | NeighbourState::Incomplete)
}

fn neighbour_dst(n: &NeighbourMessage) -> Option<IpAddr> {
    n.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => Some((*a).into()),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => Some((*a).into()),
        _ => None,
    })
}

fn lladdr(n: &NeighbourMessage) -> Option<Vec<u8>> {
    n.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(m) if m.len() == 6 => Some(m.clone()),
        _ => None,
    })
}

fn mac_text(m: &[u8]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The forwarding entry a VXLAN lacks for `next_hop` (whose MAC, when resolved, is
/// `mac`), given the MACs of the entries it has: none when an entry for the MAC or an
/// all-zero (default) one sends it somewhere.
fn missing_fdb_entry(mac: Option<&[u8]>, fdb: &[Vec<u8>], next_hop: IpAddr) -> Option<String> {
    if fdb.iter().any(|m| m.iter().all(|b| *b == 0)) {
        return None;
    }
    match mac {
        Some(mac) if fdb.iter().any(|m| m == mac) => None,
        Some(mac) => Some(format!("{} for {next_hop}", mac_text(mac))),
        None if fdb.is_empty() => Some(format!("any entry for {next_hop}")),
        // Unresolved, and the device sends to some peers: ARP would find the MAC.
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn route(dst: [u8; 4], len: u8, kind: RouteType) -> RouteMessage {
        let mut r = RouteMessage::default();
        r.header.address_family = AddressFamily::Inet;
        r.header.destination_prefix_length = len;
        r.header.table = RouteHeader::RT_TABLE_MAIN;
        r.header.kind = kind;
        r.attributes
            .push(RouteAttribute::Destination(RouteAddress::Inet(
                Ipv4Addr::from(dst),
            )));
        r
    }

    #[test]
    fn the_longest_prefix_decides_and_a_blackhole_discards() {
        let routes = [
            route([0, 0, 0, 0], 0, RouteType::Unicast),
            route([10, 244, 3, 0], 24, RouteType::Unicast),
            route([10, 244, 3, 0], 26, RouteType::BlackHole),
        ];
        let best = best_route(&routes, "10.244.3.5".parse().unwrap()).unwrap();
        assert_eq!(discard_type(best.header.kind), Some("blackhole"));
        let best = best_route(&routes, "10.244.3.70".parse().unwrap()).unwrap();
        assert_eq!(best.header.destination_prefix_length, 24);
        let best = best_route(&routes, "10.9.0.1".parse().unwrap()).unwrap();
        assert_eq!(best.header.destination_prefix_length, 0);
    }

    #[test]
    fn a_vxlan_without_an_entry_for_the_next_hop_misses_it() {
        let nh: IpAddr = "10.244.2.0".parse().unwrap();
        let mac = vec![2, 0, 0, 0, 2, 1];
        let other = vec![2, 0, 0, 0, 3, 1];
        assert_eq!(
            missing_fdb_entry(Some(&mac), std::slice::from_ref(&other), nh).as_deref(),
            Some("02:00:00:00:02:01 for 10.244.2.0")
        );
        assert_eq!(
            missing_fdb_entry(Some(&mac), std::slice::from_ref(&mac), nh),
            None
        );
        // flannel's all-zero entries send every MAC to the peers.
        assert_eq!(missing_fdb_entry(Some(&mac), &[vec![0; 6]], nh), None);
        assert_eq!(
            missing_fdb_entry(None, &[], nh).as_deref(),
            Some("any entry for 10.244.2.0")
        );
    }
}
