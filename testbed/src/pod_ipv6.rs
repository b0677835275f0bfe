//! IPv6 pods on either topology: pod A and pod B get IPv6 addresses beside their IPv4
//! ones, the nodes IPv6 addresses on an overlay device, and routes that carry each
//! pod's /64 through that overlay, as a dual-stack CNI does.
//!
//! ```text
//!  pod A fd00:244:1::7/64                                   pod B fd00:244:2::9/64
//!    default via fd00:244:1::1                      default via fd00:244:2::1
//!  node A  vpod0 fd00:244:1::1/64                   vpod0 fd00:244:2::1/64  node B
//!          <overlay> fd00:10:200::1/64 ========== <overlay> fd00:10:200::2/64
//!          fd00:244:2::/64 via fd00:10:200::2       fd00:244:1::/64 via fd00:10:200::1
//! ```
//!
//! Nothing is pinged: the first packet of a test waits for neighbour discovery, as
//! the first packet to a new peer does on a real node. What is waited for is the
//! interfaces' duplicate address detection: a real node's links finished it long ago,
//! and until it ends their link-local addresses are tentative and the neighbour
//! advertisements the first packets wait for are lost, holding them a second or two.
//! Everything added goes with the namespaces.

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::{Duration, Instant};

use crate::{
    Error, Result, RoutedTopology, Topology, cmd,
    topology::{POD_HOST_IF, POD_IF, VXLAN_IF},
};

/// Pod A's IPv6 address.
pub const POD_A_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 7);
/// Pod B's IPv6 address.
pub const POD_B_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 9);
/// Node A's IPv6 address on the overlay.
pub const NODE_A_OVERLAY_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x200, 0, 0, 0, 0, 1);
/// Node B's IPv6 address on the overlay.
pub const NODE_B_OVERLAY_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x200, 0, 0, 0, 0, 2);

/// Pod B's IPv6 address with `port`.
pub fn pod_b_v6_addr(port: u16) -> SocketAddr {
    SocketAddr::V6(SocketAddrV6::new(POD_B_V6, port, 0, 0))
}

/// Gives [`Topology`]'s pods IPv6 addresses routed through its [`VXLAN_IF`].
pub fn add_to(topo: &Topology) -> Result<()> {
    add([&topo.node_a, &topo.pod_a], [&topo.node_b, &topo.pod_b])
}

/// Gives [`RoutedTopology`]'s pods IPv6 addresses routed through its [`VXLAN_IF`], the
/// IPv4 tunnel whose outer packets meet the router's narrow hop.
pub fn add_to_routed(topo: &RoutedTopology) -> Result<()> {
    add([&topo.node_a, &topo.pod_a], [&topo.node_b, &topo.pod_b])
}

/// Adds the layout above to nodes and pods `[node, pod]` `a` and `b`.
fn add(a: [&str; 2], b: [&str; 2]) -> Result<()> {
    let sides = [
        (
            a,
            1u16,
            POD_A_V6,
            NODE_A_OVERLAY_V6,
            NODE_B_OVERLAY_V6,
            2u16,
        ),
        (b, 2, POD_B_V6, NODE_B_OVERLAY_V6, NODE_A_OVERLAY_V6, 1),
    ];
    let mut sides_done = Vec::new();
    for (side, subnet, pod_ip, overlay, peer_overlay, peer_subnet) in sides {
        let gateway = Ipv6Addr::new(0xfd00, 0x244, subnet, 0, 0, 0, 0, 1);
        let peer_cidr = format!("fd00:244:{peer_subnet}::/64");
        let [node, pod] = side;
        let ip = |ns: &str, args: &[&str]| {
            let mut argv = vec!["ip", "-n", ns];
            argv.extend_from_slice(args);
            cmd::run(&argv).map(drop)
        };
        let addr = |ns: &str, a: Ipv6Addr, dev: &str| {
            ip(
                ns,
                &["addr", "add", &format!("{a}/64"), "dev", dev, "nodad"],
            )
        };
        addr(node, gateway, POD_HOST_IF)?;
        addr(pod, pod_ip, POD_IF)?;
        addr(node, overlay, VXLAN_IF)?;
        ip(
            pod,
            &["-6", "route", "add", "default", "via", &gateway.to_string()],
        )?;
        ip(
            node,
            &[
                "-6",
                "route",
                "add",
                &peer_cidr,
                "via",
                &peer_overlay.to_string(),
                "dev",
                VXLAN_IF,
            ],
        )?;
        cmd::run_in(node, &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])?;
        sides_done.extend([node.to_owned(), pod.to_owned()]);
    }
    for ns in &sides_done {
        wait_dad(ns)?;
    }
    Ok(())
}

/// Waits until no IPv6 address of namespace `netns` is tentative.
fn wait_dad(netns: &str) -> Result<()> {
    let timeout = Duration::from_secs(10);
    let deadline = Instant::now() + timeout;
    loop {
        let addrs = cmd::run(&["ip", "-n", netns, "-6", "-o", "addr", "show", "tentative"])?;
        if addrs.trim().is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Tentative {
                netns: netns.to_owned(),
                addrs,
                timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
