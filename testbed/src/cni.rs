//! The device shapes real CNIs create, built on a [`Topology`] in place of its `vx0`
//! overlay, so the agent's MTU model can be tested against what it meets on real nodes
//! rather than against the testbed's own plain VXLAN.
//!
//! - [`flannel`]: `flannel.1`, a VXLAN without a remote whose peers are FDB entries
//!   (`bridge fdb append 00:00:00:00:00:00 dev flannel.1 dst <peer>`).
//! - [`calico_vxlan`]: `vxlan.calico` with per-peer MAC FDB and neighbour entries;
//!   [`flannel_vxlan`]: `flannel.1` the same way, as flannel's VXLAN backend programs it.
//! - [`calico_ipip`]: `tunl0`, the ipip module's fallback device: no remote, each packet
//!   sent to the gateway of its route.
//! - [`cilium`]: `cilium_vxlan`/`cilium_geneve` in metadata (`external`) mode, veths at
//!   1500 and routes with an `mtu`; a route's `encap` does what Cilium's eBPF datapath
//!   does, setting each packet's tunnel endpoint. Over an IPv4 or an IPv6 underlay.
//! - [`jumbo_cluster_network`] and [`wireguard_to_the_cluster_network`]: a multi-NIC node,
//!   a jumbo cluster network beside the 1500 one that holds the default route.
//!
//! Every device lives in the topology's namespaces and goes with them. Kinds this
//! kernel may lack (geneve, wireguard, ipip) fail with [`Error::MissingKind`] before
//! anything of the testbed is changed.

use std::net::Ipv4Addr;

use crate::topology::{POD_IF, UNDERLAY_IF, VXLAN_IF};
use crate::tunnel::{UNDERLAY_V6, add_link, peer_key};
use crate::{Error, Result, Topology, cmd};

/// The jumbo cluster network's veth between the nodes (9000).
pub const CLUSTER_IF: &str = "cl0";
/// The VXLAN over [`CLUSTER_IF`] on both nodes (8950).
pub const CLUSTER_VXLAN_IF: &str = "vxc";
/// The WireGuard device of [`wireguard_to_the_cluster_network`] in node A.
pub const CLUSTER_WIREGUARD_IF: &str = "wgc";
/// Node B's address on [`CLUSTER_IF`].
pub const NODE_B_CLUSTER: &str = "192.168.88.2";

/// One node's share of a shape: its namespaces and addresses, and its peer's.
struct Side<'a> {
    node: &'a str,
    pod: &'a str,
    /// 1 for node A, 2 for node B: the third octet of its pod subnet.
    index: u8,
    peer_index: u8,
    underlay: Ipv4Addr,
    peer_underlay: Ipv4Addr,
    peer_underlay_v6: &'a str,
}

impl Side<'_> {
    /// "10.244.2.0/24": the peer's pod subnet.
    fn peer_pod_cidr(&self) -> String {
        format!("10.244.{}.0/24", self.peer_index)
    }

    /// "10.244.1.<host>", an address of this node's pod subnet.
    fn own(&self, host: u8) -> String {
        format!("10.244.{}.{host}", self.index)
    }

    fn peer(&self, host: u8) -> String {
        format!("10.244.{}.{host}", self.peer_index)
    }
}

fn sides(topo: &Topology) -> [Side<'_>; 2] {
    [
        Side {
            node: &topo.node_a,
            pod: &topo.pod_a,
            index: 1,
            peer_index: 2,
            underlay: topo.node_a_underlay,
            peer_underlay: topo.node_b_underlay,
            peer_underlay_v6: UNDERLAY_V6[1],
        },
        Side {
            node: &topo.node_b,
            pod: &topo.pod_b,
            index: 2,
            peer_index: 1,
            underlay: topo.node_b_underlay,
            peer_underlay: topo.node_a_underlay,
            peer_underlay_v6: UNDERLAY_V6[0],
        },
    ]
}

/// `ip -n <netns> <args>`.
fn ip(netns: &str, args: &[&str]) -> Result<()> {
    let mut argv = vec!["ip", "-n", netns];
    argv.extend_from_slice(args);
    cmd::run(&argv).map(drop)
}

/// `bridge <args>` inside `netns`.
fn bridge(netns: &str, args: &[&str]) -> Result<()> {
    let mut argv = vec!["bridge"];
    argv.extend_from_slice(args);
    cmd::run_in(netns, &argv).map(drop)
}

/// Adds a peer `dst` to VXLAN `dev` in `netns` the way flannel does: an all-zero FDB
/// entry, appended beside the ones already there.
pub fn fdb_append(netns: &str, dev: &str, dst: &str) -> Result<()> {
    bridge(
        netns,
        &["fdb", "append", "00:00:00:00:00:00", "dev", dev, "dst", dst],
    )
}

/// The route from `netns` to its peer's pod subnet, through `dev` to `via` (on link).
fn route_to_peer_pods(s: &Side<'_>, via: &str, dev: &str) -> Result<()> {
    let cidr = s.peer_pod_cidr();
    ip(
        s.node,
        &["route", "add", &cidr, "via", via, "dev", dev, "onlink"],
    )
}

/// `<own pod subnet>.0/32` on `dev`: the tunnel's own address, as the CNIs give it.
fn add_tunnel_address(s: &Side<'_>, dev: &str) -> Result<()> {
    let addr = format!("{}/32", s.own(0));
    ip(s.node, &["addr", "add", &addr, "dev", dev])
}

/// Deletes the testbed's `vx0` on both nodes, and with it the routes through it: the
/// shape's devices carry the pods' traffic instead.
pub fn remove_testbed_overlay(topo: &Topology) -> Result<()> {
    for node in [&topo.node_a, &topo.node_b] {
        ip(node, &["link", "del", VXLAN_IF])?;
    }
    Ok(())
}

/// The MAC of node `index`'s tunnel device, fixed so each node can name its peer's.
fn mac(index: u8) -> String {
    format!("02:00:00:00:0{index}:01")
}

/// flannel's VXLAN on both nodes: `flannel.1` (VNI 1, port 8472, no learning, no
/// remote), bound to the underlay like flannel's unless `bound` is false (the kernel
/// then leaves it at 1500), one all-zero FDB entry per peer, and the peer's pod subnet
/// routed through it to the peer's `flannel.1` address (`10.244.<n>.0/32`).
pub fn flannel(topo: &Topology, bound: bool) -> Result<()> {
    remove_testbed_overlay(topo)?;
    for s in sides(topo) {
        let local = s.underlay.to_string();
        let mut args = vec![
            "link",
            "add",
            "flannel.1",
            "type",
            "vxlan",
            "id",
            "1",
            "local",
            &local,
            "dstport",
            "8472",
            "nolearning",
        ];
        if bound {
            args.extend(["dev", UNDERLAY_IF]);
        }
        ip(s.node, &args)?;
        add_tunnel_address(&s, "flannel.1")?;
        ip(s.node, &["link", "set", "flannel.1", "up"])?;
        fdb_append(s.node, "flannel.1", &s.peer_underlay.to_string())?;
        route_to_peer_pods(&s, &s.peer(0), "flannel.1")?;
    }
    Ok(())
}

/// Calico's VXLAN on both nodes: `vxlan.calico` (VNI 4096, port 4789, bound to the
/// underlay, no learning) at `mtu`, its VTEP address `10.244.<n>.0/32`, and per peer a
/// permanent neighbour entry for the peer's VTEP, an FDB entry from the peer's VTEP
/// MAC to its node, and the peer's pod subnet routed through it.
pub fn calico_vxlan(topo: &Topology, mtu: u32) -> Result<()> {
    vxlan_with_peer_macs(topo, "vxlan.calico", "4096", "4789", mtu)
}

/// flannel's VXLAN backend as flannel itself programs it on both nodes: `flannel.1` (VNI
/// 1, port 8472, bound to the underlay, no learning, no remote) at 1450, and per peer a
/// permanent neighbour entry for the peer's VTEP (`10.244.<n>.0`), one FDB entry from
/// that VTEP's MAC to the peer node, and the peer's pod subnet routed through it.
pub fn flannel_vxlan(topo: &Topology) -> Result<()> {
    vxlan_with_peer_macs(topo, FLANNEL_IF, "1", "8472", 1450)
}

/// flannel's VXLAN device.
pub const FLANNEL_IF: &str = "flannel.1";

/// Deletes node A's FDB entry for node B's VTEP on `dev` (built by [`flannel_vxlan`] or
/// [`calico_vxlan`]): what a CNI agent that missed node B's node object leaves behind.
pub fn delete_peer_fdb_entry(topo: &Topology, dev: &str) -> Result<()> {
    let peer = topo.node_b_underlay.to_string();
    bridge(
        &topo.node_a,
        &["fdb", "del", &mac(2), "dev", dev, "dst", &peer, "self"],
    )
}

/// Node B's VTEP MAC on the tunnel of [`flannel_vxlan`] or [`calico_vxlan`].
pub fn node_b_vtep_mac() -> String {
    mac(2)
}

/// A VXLAN `name` (VNI `vni`, UDP port `port`, bound to the underlay, no learning, no
/// remote) at `mtu` on both nodes, with per-peer neighbour and MAC FDB entries (see
/// [`calico_vxlan`]).
fn vxlan_with_peer_macs(
    topo: &Topology,
    name: &str,
    vni: &str,
    port: &str,
    mtu: u32,
) -> Result<()> {
    remove_testbed_overlay(topo)?;
    let mtu = mtu.to_string();
    for s in sides(topo) {
        let local = s.underlay.to_string();
        let own_mac = mac(s.index);
        ip(
            s.node,
            &[
                "link",
                "add",
                name,
                "address",
                &own_mac,
                "type",
                "vxlan",
                "id",
                vni,
                "local",
                &local,
                "dev",
                UNDERLAY_IF,
                "dstport",
                port,
                "nolearning",
            ],
        )?;
        ip(s.node, &["link", "set", name, "mtu", &mtu, "up"])?;
        add_tunnel_address(&s, name)?;
        let (peer_vtep, peer_mac) = (s.peer(0), mac(s.peer_index));
        permanent_neighbour(s.node, &peer_vtep, &peer_mac, name)?;
        let peer = s.peer_underlay.to_string();
        bridge(
            s.node,
            &[
                "fdb",
                "add",
                &peer_mac,
                "dev",
                name,
                "dst",
                &peer,
                "self",
                "permanent",
            ],
        )?;
        route_to_peer_pods(&s, &peer_vtep, name)?;
    }
    Ok(())
}

/// Calico's route for an IPAM block this node holds, in node A: `blackhole <cidr>`, so
/// that packets for the block's addresses without a pod (a deleted pod's) are dropped
/// here rather than sent on by a broader route.
pub fn ipam_block_blackhole(topo: &Topology, cidr: &str) -> Result<()> {
    discarding_route(topo, "blackhole", cidr)
}

/// A route of type `kind` (`blackhole`, `unreachable`, `prohibit`) for `cidr` in node A.
pub fn discarding_route(topo: &Topology, kind: &str, cidr: &str) -> Result<()> {
    ip(&topo.node_a, &["route", "add", kind, cidr])
}

/// A neighbour entry that never expires nor is resolved: what CNIs that know their
/// peers' MACs write instead of letting ARP cross the tunnel.
fn permanent_neighbour(netns: &str, addr: &str, mac: &str, dev: &str) -> Result<()> {
    ip(
        netns,
        &[
            "neigh",
            "add",
            addr,
            "lladdr",
            mac,
            "dev",
            dev,
            "nud",
            "permanent",
        ],
    )
}

/// The ipip module's `tunl0` in `netns`. It exists in every namespace once the module
/// is loaded, so "File exists" is success; asking for one loads the module where the
/// kernel can.
fn tunl0(netns: &str) -> Result<()> {
    match add_link(netns, "tunl0", "ipip", &[]) {
        Err(Error::Command { stderr, .. }) if stderr.contains("File exists") => Ok(()),
        other => other,
    }
}

/// Calico's IPIP on both nodes: the ipip module's `tunl0` (no remote, no local) at
/// `mtu`, its address `10.244.<n>.0/32`, and the peer's pod subnet routed through it
/// to the peer node's underlay address, which is where tunl0 sends each packet.
pub fn calico_ipip(topo: &Topology, mtu: u32) -> Result<()> {
    tunl0(&topo.node_a)?;
    remove_testbed_overlay(topo)?;
    let mtu = mtu.to_string();
    for s in sides(topo) {
        ip(s.node, &["link", "set", "tunl0", "mtu", &mtu, "up"])?;
        add_tunnel_address(&s, "tunl0")?;
        route_to_peer_pods(&s, &s.peer_underlay.to_string(), "tunl0")?;
    }
    Ok(())
}

/// Cilium's tunnel protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tunnel {
    Vxlan,
    Geneve,
}

impl Tunnel {
    /// The device Cilium creates for it.
    pub fn device(self) -> &'static str {
        match self {
            Tunnel::Vxlan => "cilium_vxlan",
            Tunnel::Geneve => "cilium_geneve",
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Tunnel::Vxlan => "vxlan",
            Tunnel::Geneve => "geneve",
        }
    }

    fn port(self) -> &'static str {
        match self {
            Tunnel::Vxlan => "8472",
            Tunnel::Geneve => "6081",
        }
    }
}

/// The underlay's address family, which the tunnel's overhead depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Underlay {
    V4,
    /// [`UNDERLAY_V6`] on both nodes' underlay veth.
    V6,
}

/// Cilium's tunnel mode on both nodes: `cilium_vxlan`/`cilium_geneve` in metadata
/// mode (left at its 1500), the `cilium_host`/`cilium_net` pair holding the router
/// address `10.244.<n>.1`, pod veths at 1500 on both ends, and routes with `mtu
/// route_mtu`: the pod's default route (its router's host route has none, as
/// Cilium's), and the node's route to the peer's pod subnet, whose `encap` names the
/// peer node (on `underlay`) as Cilium's datapath would.
pub fn cilium(topo: &Topology, tunnel: Tunnel, underlay: Underlay, route_mtu: u32) -> Result<()> {
    let dev = tunnel.device();
    for s in sides(topo) {
        add_link(
            s.node,
            dev,
            tunnel.kind(),
            &["external", "dstport", tunnel.port()],
        )?;
        ip(s.node, &["link", "set", dev, "address", &mac(s.index)])?;
    }
    remove_testbed_overlay(topo)?;
    topo.set_pod_mtu(1500)?;
    if underlay == Underlay::V6 {
        crate::tunnel::add_ipv6_underlay(topo)?;
    }
    let route_mtu = route_mtu.to_string();
    for s in sides(topo) {
        ip(s.node, &["link", "set", dev, "up"])?;
        ip(
            s.node,
            &[
                "link",
                "add",
                "cilium_host",
                "type",
                "veth",
                "peer",
                "name",
                "cilium_net",
            ],
        )?;
        let router = format!("{}/32", s.own(1));
        ip(s.node, &["addr", "add", &router, "dev", "cilium_host"])?;
        for d in ["cilium_host", "cilium_net"] {
            ip(s.node, &["link", "set", d, "up"])?;
        }
        let peer_router = s.peer(1);
        let id = s.peer_index.to_string();
        let peer_cidr = s.peer_pod_cidr();
        let peer_node = match underlay {
            Underlay::V4 => s.peer_underlay.to_string(),
            Underlay::V6 => s.peer_underlay_v6.to_owned(),
        };
        let mut route = vec!["route", "add", &peer_cidr, "encap"];
        match underlay {
            Underlay::V4 => route.extend(["ip", "id", &id, "dst", &peer_node]),
            // Over IPv6 the outer UDP needs its checksum: the receiving socket drops
            // zero-checksum datagrams.
            Underlay::V6 => route.extend(["ip6", "id", &id, "dst", &peer_node, "csum"]),
        }
        route.extend(["via", &peer_router, "dev", dev, "onlink", "mtu", &route_mtu]);
        ip(s.node, &route)?;
        permanent_neighbour(s.node, &peer_router, &mac(s.peer_index), dev)?;
        let gateway = topo.pod_gateway.to_string();
        ip(
            s.pod,
            &["route", "add", &gateway, "dev", POD_IF, "scope", "link"],
        )?;
        ip(
            s.pod,
            &[
                "route", "replace", "default", "via", &gateway, "dev", POD_IF, "mtu", &route_mtu,
            ],
        )?;
    }
    Ok(())
}

/// A jumbo cluster network beside the testbed's 1500 one: [`CLUSTER_IF`] veth (9000)
/// between the nodes on 192.168.88.0/24, node A's default route via node B on `ul0`,
/// and on both nodes [`CLUSTER_VXLAN_IF`], a VXLAN at 8950 without a device or remote
/// whose peer (an FDB entry) is the other node's cluster address, addressed
/// 10.99.0.<n>/24.
pub fn jumbo_cluster_network(topo: &Topology) -> Result<()> {
    ip(
        &topo.node_a,
        &[
            "link",
            "add",
            CLUSTER_IF,
            "mtu",
            "9000",
            "type",
            "veth",
            "peer",
            "name",
            CLUSTER_IF,
            "mtu",
            "9000",
            "netns",
            &topo.node_b,
        ],
    )?;
    let gateway = topo.node_b_underlay.to_string();
    ip(
        &topo.node_a,
        &[
            "route",
            "add",
            "default",
            "via",
            &gateway,
            "dev",
            UNDERLAY_IF,
        ],
    )?;
    for (node, n, peer) in [(&topo.node_a, 1, 2), (&topo.node_b, 2, 1)] {
        let cidr = format!("192.168.88.{n}/24");
        ip(node, &["addr", "add", &cidr, "dev", CLUSTER_IF])?;
        ip(node, &["link", "set", CLUSTER_IF, "up"])?;
        let local = format!("192.168.88.{n}");
        ip(
            node,
            &[
                "link",
                "add",
                CLUSTER_VXLAN_IF,
                "type",
                "vxlan",
                "id",
                "7",
                "local",
                &local,
                "dstport",
                "4788",
                "nolearning",
            ],
        )?;
        ip(
            node,
            &["link", "set", CLUSTER_VXLAN_IF, "mtu", "8950", "up"],
        )?;
        let overlay = format!("10.99.0.{n}/24");
        ip(node, &["addr", "add", &overlay, "dev", CLUSTER_VXLAN_IF])?;
        fdb_append(node, CLUSTER_VXLAN_IF, &format!("192.168.88.{peer}"))?;
    }
    Ok(())
}

/// [`jumbo_cluster_network`], and in node A [`CLUSTER_WIREGUARD_IF`], a WireGuard device
/// at `mtu` whose one peer's endpoint is node B's cluster address, while the default
/// route is on the 1500 network. Nothing is sent: the device has no private key.
pub fn wireguard_to_the_cluster_network(topo: &Topology, mtu: u32) -> Result<()> {
    jumbo_cluster_network(topo)?;
    add_link(&topo.node_a, CLUSTER_WIREGUARD_IF, "wireguard", &[])?;
    let peer = peer_key()?;
    let endpoint = format!("{NODE_B_CLUSTER}:51820");
    cmd::run_in(
        &topo.node_a,
        &[
            "wg",
            "set",
            CLUSTER_WIREGUARD_IF,
            "fwmark",
            "51820",
            "peer",
            &peer,
            "endpoint",
            &endpoint,
            "allowed-ips",
            "10.98.0.2/32",
        ],
    )?;
    let mtu = mtu.to_string();
    ip(
        &topo.node_a,
        &["link", "set", CLUSTER_WIREGUARD_IF, "mtu", &mtu, "up"],
    )
}
