//! VXLAN forwarding database entries (`bridge fdb show dev vx0`): for a VXLAN without a
//! configured remote (flannel's `flannel.1`, Calico's `vxlan.calico`), its remote
//! endpoints are the `dst` of these entries, one per peer node.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage},
};

use super::rtnetlink::{NetlinkError, request, socket};

/// One FDB entry that sends to a remote endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FdbEntry {
    /// The VXLAN device holding the entry.
    pub(crate) ifindex: u32,
    /// The remote endpoint (`dst`).
    pub(crate) dst: IpAddr,
    /// The device the entry sends through (`via`), when set.
    pub(crate) via: Option<u32>,
}

/// Every FDB entry of the calling thread's namespace that names a remote endpoint.
pub(crate) fn fdb_destinations() -> Result<Vec<FdbEntry>, NetlinkError> {
    let sock = socket()?;
    let mut msg = NeighbourMessage::default();
    msg.header.family = AddressFamily::Bridge;
    let replies = request(&sock, RouteNetlinkMessage::GetNeighbour(msg), NLM_F_DUMP)?;
    Ok(replies
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewNeighbour(n) => fdb_entry_from(n),
            _ => None,
        })
        .collect())
}

/// A bridge-family neighbour message as an [`FdbEntry`]; `None` without a `dst`.
pub(crate) fn fdb_entry_from(n: &NeighbourMessage) -> Option<FdbEntry> {
    let mut dst = None;
    let mut via = None;
    for a in &n.attributes {
        match a {
            // In the bridge family the crate leaves NDA_DST raw: its length tells the
            // address family.
            NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
                dst = match b.len() {
                    4 => Some(IpAddr::from(<[u8; 4]>::try_from(b.as_slice()).ok()?)),
                    16 => Some(IpAddr::from(<[u8; 16]>::try_from(b.as_slice()).ok()?)),
                    _ => None,
                };
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                dst = Some((*a).into());
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                dst = Some((*a).into());
            }
            NeighbourAttribute::IfIndex(i) if *i != 0 => via = Some(*i),
            _ => {}
        }
    }
    // An all-zero dst is how the kernel lists entries without a remote.
    let dst = dst.filter(|d| {
        *d != IpAddr::V4(Ipv4Addr::UNSPECIFIED) && *d != IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    })?;
    Some(FdbEntry {
        ifindex: n.header.ifindex,
        dst,
        via,
    })
}

/// FDB entries as the kernel dumps them, serialized and parsed back.
#[cfg(test)]
pub(crate) mod fixtures {
    use netlink_packet_core::{Emitable as _, Parseable as _};

    use super::*;

    /// `bridge fdb append 00:00:00:00:00:00 dev <ifindex> dst <dst>`, as dumped.
    pub(crate) fn entry(ifindex: u32, dst: IpAddr) -> FdbEntry {
        let mut msg = NeighbourMessage::default();
        msg.header.family = AddressFamily::Bridge;
        msg.header.ifindex = ifindex;
        let raw = match dst {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        msg.attributes = vec![
            NeighbourAttribute::LinkLayerAddress(vec![0; 6]),
            NeighbourAttribute::Destination(NeighbourAddress::Other(raw)),
        ];
        let mut buf = vec![0; msg.buffer_len()];
        msg.emit(&mut buf);
        let parsed = NeighbourMessage::parse(buf.as_slice()).expect("parses");
        fdb_entry_from(&parsed).expect("an entry with a dst")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_both_families_parse() {
        let e = fixtures::entry(7, IpAddr::from([192, 168, 77, 2]));
        assert_eq!(
            (e.ifindex, e.dst, e.via),
            (7, IpAddr::from([192, 168, 77, 2]), None)
        );
        let v6: IpAddr = "fd00:77::2".parse().unwrap();
        assert_eq!(fixtures::entry(7, v6).dst, v6);
    }

    #[test]
    fn dump_runs_without_privileges() {
        // An unprivileged dump of this namespace's FDB works (and may well be empty).
        fdb_destinations().expect("fdb dump");
    }
}
