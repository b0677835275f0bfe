//! Snapshots built by hand for the model's tests: a node with an underlay, a VXLAN bound
//! to it and one pod on a veth, in variations.

use std::{net::IpAddr, time::SystemTime};

use super::{Model, model::MtuVerdict};
use crate::{
    findings::Finding,
    host_network::{
        Family, Interface, LinkKind, Namespace, RouteMetrics, Snapshot, Sysctls, Tunnel, Underlay,
        UnderlaySource, VethPeer, tunnel_family,
    },
};

pub(super) const NODE: u32 = 100;
pub(super) const POD: u32 = 200;

/// An interface in `ns` (NODE is the agent's).
pub(super) fn iface(ns: u32, name: &str, ifindex: u32, kind: LinkKind, mtu: u32) -> Interface {
    Interface {
        netns: ns,
        netns_name: if ns == NODE { "node" } else { "pod-a" }.into(),
        name: name.into(),
        ifindex,
        kind,
        mtu,
        up: true,
        lower: None,
        underlays: Vec::new(),
        routes: Vec::new(),
        tunnel: None,
        remote_family: None,
        veth_peer: None,
    }
}

pub(super) fn tunnel(
    mut i: Interface,
    t: Tunnel,
    underlay: Option<(&str, u32, u32, UnderlaySource)>,
) -> Interface {
    i.remote_family = tunnel_family(&i.kind, &t);
    i.tunnel = Some(t);
    i.underlays = underlay
        .map(|(name, ifindex, mtu, source)| way(name, ifindex, mtu, source, None, 0))
        .into_iter()
        .collect();
    i
}

/// A way out of a tunnel: device `name` (`ifindex`, `mtu`), found by `source`, toward
/// `endpoint` (shared by `endpoints` endpoints).
pub(super) fn way(
    name: &str,
    ifindex: u32,
    mtu: u32,
    source: UnderlaySource,
    endpoint: Option<IpAddr>,
    endpoints: u32,
) -> Underlay {
    Underlay {
        ifindex,
        name: name.into(),
        mtu,
        source,
        endpoint,
        endpoints,
        route: None,
        route_mtu: None,
        learned_mtu: None,
        learned_expires_secs: None,
        learned_endpoints: Vec::new(),
    }
}

/// `i` with routes leaving its link: (route, its `mtu`, its `advmss`).
pub(super) fn routed(mut i: Interface, routes: &[(&str, Option<u32>, Option<u32>)]) -> Interface {
    i.routes = routes
        .iter()
        .map(|&(route, mtu, advmss)| RouteMetrics {
            route: route.into(),
            family: if route.contains(':') {
                Family::V6
            } else {
                Family::V4
            },
            mtu,
            advmss,
            routes: 1,
        })
        .collect();
    i
}

pub(super) fn peer(mut i: Interface, ns: u32, ifindex: u32, name: &str) -> Interface {
    i.veth_peer = Some(VethPeer {
        netns: Some(ns),
        netns_name: Some(if ns == NODE { "node" } else { "pod-a" }.into()),
        ifindex,
        name: Some(name.into()),
    });
    i
}

pub(super) fn namespace(inode: u32, own: bool, no_pmtu_disc: u32) -> Namespace {
    Namespace {
        inode,
        name: if own { "node" } else { "pod-a" }.into(),
        own,
        sysctls: Sysctls {
            ip_no_pmtu_disc: Some(no_pmtu_disc),
            tcp_mtu_probing: Some(0),
        },
        error: None,
    }
}

pub(super) fn bound_vxlan(remote: [u8; 4]) -> Tunnel {
    Tunnel {
        bound_to: Some(2),
        remote: Some(IpAddr::from(remote)),
        ..Tunnel::default()
    }
}

/// The seed's node: ul0 (underlay), vx0 bound to it, and one pod on a veth.
pub(super) fn node(ul_mtu: u32, vx_mtu: u32, pod_mtu: u32, node_veth_mtu: u32) -> Snapshot {
    Snapshot {
        own_netns: NODE,
        namespaces: vec![namespace(NODE, true, 0), namespace(POD, false, 0)],
        interfaces: vec![
            iface(NODE, "lo", 1, LinkKind::Loopback, 65536),
            iface(NODE, "ul0", 2, LinkKind::Physical, ul_mtu),
            tunnel(
                iface(NODE, "vx0", 3, LinkKind::Vxlan, vx_mtu),
                bound_vxlan([10, 0, 0, 2]),
                Some(("ul0", 2, ul_mtu, UnderlaySource::Bound)),
            ),
            peer(
                iface(NODE, "veth1", 4, LinkKind::Veth, node_veth_mtu),
                POD,
                2,
                "eth0",
            ),
            iface(POD, "lo", 1, LinkKind::Loopback, 65536),
            peer(
                iface(POD, "eth0", 2, LinkKind::Veth, pod_mtu),
                NODE,
                4,
                "veth1",
            ),
        ],
    }
}

/// `snap` with the route cache having learned path MTU `mtu` towards `endpoint`, the
/// endpoint of `tunnel`'s first way out, expiring in 590 s.
pub(super) fn learned(mut snap: Snapshot, tunnel: &str, endpoint: IpAddr, mtu: u32) -> Snapshot {
    let t = snap
        .interfaces
        .iter_mut()
        .find(|i| i.netns == NODE && i.name == tunnel)
        .unwrap_or_else(|| panic!("no tunnel {tunnel}"));
    let u = &mut t.underlays[0];
    u.endpoint = Some(endpoint);
    u.endpoints = u.endpoints.max(1);
    u.learned_mtu = Some(mtu);
    u.learned_expires_secs = Some(590);
    u.learned_endpoints = vec![endpoint];
    snap
}

pub(super) fn verdict<'a>(vs: &'a [MtuVerdict], ns: u32, name: &str) -> &'a MtuVerdict {
    vs.iter()
        .find(|v| v.netns == ns && v.interface == name)
        .unwrap_or_else(|| panic!("no verdict for {name}"))
}

/// The findings of a snapshot, as the agent gets them.
pub(super) fn findings(snap: &Snapshot, now: SystemTime) -> Vec<Finding> {
    Model::from(snap).findings(now)
}
