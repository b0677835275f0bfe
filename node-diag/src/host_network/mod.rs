//! This node's network as the kernel describes it over rtnetlink (no shelling out to
//! `ip`), and the interface inventory the MTU model judges.
//!
//! - `rtnetlink`: the one request/response loop and socket every lookup goes through.
//! - `links`: link dumps, with the veth facts and the tunnel configuration.
//! - `routes`: route dumps and lookups (where a tunnel's packets to an endpoint leave,
//!   the `mtu`/`advmss` metrics of the routes through an interface, the probe's egress
//!   route) and address lookups.
//! - `fdb`: VXLAN FDB entries, the peers of a VXLAN without a remote.
//! - `wireguard`: a WireGuard device's peers' endpoints, over generic netlink.
//! - `conntrack`: where this node's NAT sent a connection, over ctnetlink.
//! - `sock_diag`: one TCP socket's progress (RTO count, backoff, MSS), over inet_diag.
//! - `sender_path`: a flow's namespace's MTU probing setting and route MTU towards its
//!   peer, what a segment sent again smaller was shrunk by.
//! - `nlmsg`: the raw netlink messages of those families.
//! - `namespaces`: network namespaces, their ids, which ones make up this node
//!   ([`local_scope`]: the agent's own and every pod namespace attached to it by a veth),
//!   and running code inside one.
//! - `conntrack_stats`: a namespace's conntrack table size, limit and statistics.
//! - `monitor`: link notifications, turned into "re-snapshot" messages ([`watch`]).
//! - `tc`: `clsact` qdiscs and their filters (dump, delete), for the TC attachment on
//!   kernels without TCX.
//! - `interfaces`, `underlay`, `inventory`: the [`Snapshot`] of every interface of those
//!   namespaces ([`snapshot`]), each tunnel with its underlays (the route to each of its
//!   endpoints), each interface with the MTU metrics of its routes.
//!
//! Everything acts on the calling thread's network namespace: a netlink socket belongs to
//! the namespace it was opened in, so a thread that entered another namespace looks
//! inside it with the same functions.

pub(crate) mod conntrack;
pub(crate) mod conntrack_stats;
pub(crate) mod drop_site;
mod fdb;
mod interfaces;
mod inventory;
mod links;
mod monitor;
mod namespaces;
pub(crate) mod nlmsg;
mod routes;
mod rtnetlink;
mod sender_path;
pub(crate) mod sock_diag;
pub(crate) mod tc;
mod underlay;
mod wireguard;

pub(crate) use fdb::fdb_destinations;
pub(crate) use interfaces::{ARPHRD_ETHER, ARPHRD_LOOPBACK};
pub(crate) use interfaces::{
    Family, Interface, LinkKind, Role, RouteMetrics, Snapshot, UnderlaySource,
};
pub(crate) use inventory::{PodReads, local_port_range, snapshot, snapshot_of};
pub(crate) use links::{Link, UdpEncap, links};
pub(crate) use monitor::{SharedLinks, current_links, mark_stale, watch};
pub(crate) use namespaces::{
    LocalNode, NetnsFile, in_netns, local_node, local_node_from, namespace_files, netns_inode,
    pod_veths,
};
pub(crate) use routes::{Route, RouteEntry, route_get, routes};
pub(crate) use rtnetlink::NetlinkError;
pub(crate) use sender_path::{SenderPath, sender_path};

#[cfg(test)]
pub(crate) use {
    interfaces::{Namespace, Sysctls, Underlay, VethPeer},
    links::{Tunnel, fixtures},
    routes::NextHop,
    underlay::tunnel_family,
};
