//! Where DST's packets leave this node: the kernel's route to DST and the MTU of its
//! output interface, which is where the search starts. Both come from rtnetlink through
//! [`crate::host_network`].

use std::{io, net::IpAddr};

use crate::host_network::{self as netlink, NetlinkError, Route};

use super::ProbeError;

/// The interface the kernel would send DST's packets out of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Egress {
    pub(crate) interface: String,
    pub(crate) mtu: u32,
}

/// Looks up the route to `dst` (`ip route get`) and the MTU of its output interface.
/// The link's own MTU is what counts: a path MTU the kernel cached for the route is
/// exactly what this probe re-measures.
pub(crate) fn egress(dst: IpAddr) -> Result<Egress, ProbeError> {
    let route = netlink::route_get(dst).map_err(|e| match e {
        NetlinkError::Kernel(code) => match -code {
            libc::ENETUNREACH | libc::EHOSTUNREACH | libc::EINVAL => ProbeError::NoRoute(dst),
            errno => ProbeError::RouteRefused {
                dst,
                source: io::Error::from_raw_os_error(errno),
            },
        },
        source => ProbeError::Route { dst, source },
    })?;
    let Some(Route {
        oif,
        prefsrc,
        mtu: route_mtu,
    }) = route
    else {
        return Err(ProbeError::NoRoute(dst));
    };
    tracing::debug!(%dst, oif, ?prefsrc, ?route_mtu, "route");
    let link = netlink::links()
        .map_err(|source| ProbeError::Route { dst, source })?
        .into_iter()
        .find(|l| l.index == oif)
        .ok_or(ProbeError::NoInterface { dst, oif })?;
    let interface = if link.name.is_empty() {
        format!("if{oif}")
    } else {
        link.name
    };
    let mtu = link.mtu.ok_or_else(|| ProbeError::NoMtu {
        dst,
        interface: interface.clone(),
    })?;
    Ok(Egress { interface, mtu })
}
