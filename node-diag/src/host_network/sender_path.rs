//! What a flow's own network namespace says of its path right now: whether TCP MTU
//! probing is on there, and the MTU its route gives the destination. A segment the
//! kernel sends again smaller was shrunk by one of the two, and only these tell which.

use std::{collections::BTreeSet, fs, net::IpAddr};

use super::{
    conntrack_stats::scope_files,
    links::links,
    namespaces::{NetnsError, in_netns},
    routes::route_get,
};

/// A sending namespace's view of one destination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SenderPath {
    /// `net.ipv4.tcp_mtu_probing` (IPv6 flows too); `None`: unreadable.
    pub(crate) tcp_mtu_probing: Option<u32>,
    /// The smallest of the route's `mtu` (a configured metric, or a path MTU learned
    /// from a frag-needed, which the lookup reports the same way) and its output
    /// device's MTU; `None`: no route.
    pub(crate) path_mtu: Option<u32>,
}

/// Looks from inside namespace `netns` (an inode) towards `dst`. Blocking (netlink, a
/// thread entering the namespace).
pub(crate) fn sender_path(netns: u32, dst: IpAddr) -> Result<SenderPath, NetnsError> {
    let file = scope_files(Some(&BTreeSet::from([netns])))
        .into_iter()
        .next()
        .ok_or(NetnsError::Unknown(netns))?;
    in_netns(&file, || {
        let tcp_mtu_probing = fs::read_to_string("/proc/sys/net/ipv4/tcp_mtu_probing")
            .ok()
            .and_then(|v| v.trim().parse().ok());
        let route = route_get(dst).ok().flatten();
        let device = route.and_then(|r| links().ok()?.into_iter().find(|l| l.index == r.oif)?.mtu);
        let path_mtu = [route.and_then(|r| r.mtu), device]
            .into_iter()
            .flatten()
            .filter(|m| *m > 0)
            .min();
        SenderPath {
            tcp_mtu_probing,
            path_mtu,
        }
    })
}
