//! Two nodes, a vxlan overlay and one pod per node, in network namespaces.
//!
//! ```text
//!  pod A (10.244.1.7/32)                                   pod B (10.244.2.9/32)
//!   eth0 mtu 1450                                            eth0 mtu 1450
//!     |  default via 169.254.1.1 onlink                        |
//!   vpod0 169.254.1.1/32                                     vpod0 169.254.1.1/32
//!  node A   vx0 10.200.0.1/32 (vxlan 42) ======= vx0 10.200.0.2/32   node B
//!           ul0 192.168.77.1/24 ---- underlay veth ---- ul0 192.168.77.2/24
//! ```
//!
//! Node A routes `10.244.1.7/32 dev vpod0` and `10.244.2.0/24 via 10.200.0.2
//! dev vx0 onlink`; node B the mirror image. Both nodes forward.
//!
//! Every namespace is owned by a [`Netns`] guard: dropping the [`Topology`] (also when
//! unwinding from a failure) deletes the namespaces and with them every device, route
//! and nftables table inside. The fault injectors below change one thing each, as a
//! misconfigured node would.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use crate::{Error, Result, cmd, netns::Netns};

/// Underlay veth on each node.
pub const UNDERLAY_IF: &str = "ul0";
/// Vxlan device on each node.
pub const VXLAN_IF: &str = "vx0";
/// Node side of the pod veth.
pub const POD_HOST_IF: &str = "vpod0";
/// Pod side of the pod veth.
pub const POD_IF: &str = "eth0";
/// Vxlan network identifier.
pub const VXLAN_ID: u32 = 42;
/// Vxlan UDP port.
pub const VXLAN_PORT: u16 = 4789;
/// MTU of the underlay veth (the vxlan gets 50 less from the kernel).
pub const UNDERLAY_MTU: u32 = 1500;
/// MTU of the pod veth, matching the overlay.
pub const POD_MTU: u32 = 1450;

/// The four namespaces and their addresses. Dropping it deletes the
/// namespaces, which removes every device, route and nftables table in them.
#[derive(Debug)]
pub struct Topology {
    /// Netns name of node A (where the agent runs).
    pub node_a: String,
    /// Netns name of node B.
    pub node_b: String,
    /// Netns name of the pod on node A.
    pub pod_a: String,
    /// Netns name of the pod on node B.
    pub pod_b: String,
    /// Node A's underlay address (on [`UNDERLAY_IF`], /24).
    pub node_a_underlay: Ipv4Addr,
    /// Node B's underlay address.
    pub node_b_underlay: Ipv4Addr,
    /// Node A's overlay address (on [`VXLAN_IF`], /32).
    pub node_a_overlay: Ipv4Addr,
    /// Node B's overlay address.
    pub node_b_overlay: Ipv4Addr,
    /// Pod A's address (on its [`POD_IF`], /32).
    pub pod_a_ip: Ipv4Addr,
    /// Pod B's address.
    pub pod_b_ip: Ipv4Addr,
    /// Node-side address of each pod veth, the pods' default gateway.
    pub pod_gateway: Ipv4Addr,
    // Declared last: dropped after the names above, deletes the namespaces.
    namespaces: Vec<Netns>,
}

struct NodeSide<'a> {
    node: &'a str,
    pod: &'a str,
    underlay: Ipv4Addr,
    peer_underlay: Ipv4Addr,
    overlay: Ipv4Addr,
    peer_overlay: Ipv4Addr,
    pod_ip: Ipv4Addr,
    peer_pod_cidr: &'a str,
}

impl Topology {
    /// Builds the namespaces `<base>-{na,nb,pa,pb}`, their devices and routes, and checks
    /// that pod A reaches pod B through the overlay and node B reaches node A across the
    /// underlay. On failure, whatever was built is deleted again.
    pub fn build(base: &str) -> Result<Topology> {
        crate::require_root()?;
        let names = ["na", "nb", "pa", "pb"].map(|suffix| format!("{base}-{suffix}"));
        let namespaces = names
            .iter()
            .map(|n| Netns::create(n))
            .collect::<Result<Vec<Netns>>>()?;
        let [node_a, node_b, pod_a, pod_b] = names;

        let topo = Topology {
            node_a,
            node_b,
            pod_a,
            pod_b,
            node_a_underlay: Ipv4Addr::new(192, 168, 77, 1),
            node_b_underlay: Ipv4Addr::new(192, 168, 77, 2),
            node_a_overlay: Ipv4Addr::new(10, 200, 0, 1),
            node_b_overlay: Ipv4Addr::new(10, 200, 0, 2),
            pod_a_ip: Ipv4Addr::new(10, 244, 1, 7),
            pod_b_ip: Ipv4Addr::new(10, 244, 2, 9),
            pod_gateway: Ipv4Addr::new(169, 254, 1, 1),
            namespaces,
        };

        cmd::run(&[
            "ip",
            "-n",
            &topo.node_a,
            "link",
            "add",
            UNDERLAY_IF,
            "type",
            "veth",
            "peer",
            "name",
            UNDERLAY_IF,
            "netns",
            &topo.node_b,
        ])?;
        topo.setup_node(&NodeSide {
            node: &topo.node_a,
            pod: &topo.pod_a,
            underlay: topo.node_a_underlay,
            peer_underlay: topo.node_b_underlay,
            overlay: topo.node_a_overlay,
            peer_overlay: topo.node_b_overlay,
            pod_ip: topo.pod_a_ip,
            peer_pod_cidr: "10.244.2.0/24",
        })?;
        topo.setup_node(&NodeSide {
            node: &topo.node_b,
            pod: &topo.pod_b,
            underlay: topo.node_b_underlay,
            peer_underlay: topo.node_a_underlay,
            overlay: topo.node_b_overlay,
            peer_overlay: topo.node_a_overlay,
            pod_ip: topo.pod_b_ip,
            peer_pod_cidr: "10.244.1.0/24",
        })?;

        let timeout = Duration::from_secs(5);
        for (from, to) in [
            (&topo.pod_a, topo.pod_b_ip),
            (&topo.node_b, topo.node_a_underlay),
        ] {
            if !topo.ping_until(from, to, timeout)? {
                return Err(Error::Unreachable {
                    from: from.clone(),
                    to: to.to_string(),
                    timeout,
                });
            }
        }
        Ok(topo)
    }

    fn setup_node(&self, s: &NodeSide<'_>) -> Result<()> {
        let ends = (s.underlay.to_string(), s.peer_underlay.to_string());
        add_underlay(s.node, (&ends.0, &ends.1), s.overlay, UNDERLAY_MTU, &[])?;
        link_pod(&PodLink {
            node: s.node,
            pod: s.pod,
            pod_ip: s.pod_ip,
            gateway: self.pod_gateway,
            mtu: POD_MTU,
            peer_pod_cidr: s.peer_pod_cidr,
            peer_overlay: s.peer_overlay,
        })
    }

    /// All four namespace names: node A, node B, pod A, pod B.
    pub fn netns_names(&self) -> Vec<String> {
        self.namespaces
            .iter()
            .map(|n| n.name().to_owned())
            .collect()
    }

    /// Pod A's address with `port`.
    pub fn pod_a_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.pod_a_ip, port))
    }

    /// Pod B's address with `port`.
    pub fn pod_b_addr(&self, port: u16) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.pod_b_ip, port))
    }

    /// Drops forwarded TCP to `dport` in node namespace `node` (nftables
    /// table `inet ndtest`, forward hook), as a misconfigured firewall would.
    /// The table goes with the namespace.
    pub fn drop_forwarded_tcp(&self, node: &str, dport: u16) -> Result<()> {
        self.add_forward_rule(node, &format!("tcp dport {dport} drop"))
    }

    /// On `node`, drops forwarded SYNs (without ACK) to port `dport`: the connect's own
    /// SYN is lost, while the SYN-ACK a simultaneous open answers with passes.
    pub fn drop_forwarded_syn(&self, node: &str, dport: u16) -> Result<()> {
        self.add_forward_rule(
            node,
            &format!("tcp dport {dport} tcp flags & (syn | ack) == syn drop"),
        )
    }

    /// On `node`, drops forwarded SYN-ACKs from port `sport`: the connect's return path
    /// (what rp_filter, conntrack INVALID or a policy on the way back do).
    pub fn drop_forwarded_syn_ack(&self, node: &str, sport: u16) -> Result<()> {
        self.add_forward_rule(
            node,
            &format!("tcp sport {sport} tcp flags & (syn | ack) == syn | ack drop"),
        )
    }

    /// Drops, in node namespace `node`'s forward hook, the forwarded TCP of the one
    /// connection between `a` and `b`, in both directions (table `inet ndtest`), as a
    /// peer that went silent mid-connection looks from the sender. The table goes with
    /// the namespace, or with [`Topology::remove_forward_rules`].
    pub fn drop_forwarded_flow(&self, node: &str, a: SocketAddrV4, b: SocketAddrV4) -> Result<()> {
        for (from, to) in [(a, b), (b, a)] {
            self.add_forward_rule(
                node,
                &format!(
                    "ip saddr {} ip daddr {} tcp sport {} tcp dport {} drop",
                    from.ip(),
                    to.ip(),
                    from.port(),
                    to.port()
                ),
            )?;
        }
        Ok(())
    }

    /// Rejects forwarded TCP to `dport` in node namespace `node` (table `inet ndtest`,
    /// forward hook) the way `reject` says: a firewall that answers instead of
    /// dropping. The table goes with the namespace, or with
    /// [`Topology::remove_forward_rules`].
    pub fn reject_forwarded_tcp(&self, node: &str, dport: u16, reject: Reject) -> Result<()> {
        self.add_forward_rule(
            node,
            &format!("tcp dport {dport} reject with {}", reject.nft()),
        )
    }

    /// Masquerades what node namespace `node` forwards out of `oif` (as a CNI does for pod
    /// traffic leaving the cluster network). Table `ip ndmasq` goes with the namespace.
    pub fn masquerade(&self, node: &str, oif: &str) -> Result<()> {
        for rule in [
            "add table ip ndmasq".to_owned(),
            "add chain ip ndmasq post { type nat hook postrouting priority srcnat; policy accept; }"
                .to_owned(),
            format!("add rule ip ndmasq post oifname \"{oif}\" masquerade"),
        ] {
            cmd::run_in(node, &["nft", &rule])?;
        }
        Ok(())
    }

    /// Drops the ICMP frag-needed node namespace `node` forwards (a FORWARD-chain rule
    /// that filters ICMP), in table `inet ndtest`.
    pub fn drop_forwarded_frag_needed(&self, node: &str) -> Result<()> {
        self.add_forward_rule(
            node,
            "icmp type destination-unreachable icmp code frag-needed drop",
        )
    }

    /// Routes the Service range 10.96.0.0/12 from node namespace `node` towards node B's
    /// underlay: a real node has a default route, and without one a connect to a Service
    /// without endpoints never reaches the FORWARD hook where kube-proxy rejects it.
    pub fn route_service_range(&self, node: &str) -> Result<()> {
        let via = self.node_b_underlay.to_string();
        cmd::run(&[
            "ip",
            "-n",
            node,
            "route",
            "add",
            "10.96.0.0/12",
            "via",
            &via,
        ])
        .map(drop)
    }

    /// DNATs TCP to `from` arriving in node namespace `node` to `to`, as kube-proxy does
    /// for a Service's address (any DNAT: no Service name in the rule). Table `ip ndnat`
    /// goes with the namespace.
    pub fn dnat(&self, node: &str, from: SocketAddrV4, to: SocketAddrV4) -> Result<()> {
        for rule in [
            "add table ip ndnat".to_owned(),
            "add chain ip ndnat pre { type nat hook prerouting priority dstnat; policy accept; }"
                .to_owned(),
            format!(
                "add rule ip ndnat pre ip daddr {} tcp dport {} dnat to {to}",
                from.ip(),
                from.port()
            ),
        ] {
            cmd::run_in(node, &["nft", &rule])?;
        }
        Ok(())
    }

    /// Deletes the forward rules the injectors above (and [`Topology::drop_forwarded_tcp`])
    /// added in node namespace `node`: table `inet ndtest` goes, traffic flows again.
    pub fn remove_forward_rules(&self, node: &str) -> Result<()> {
        cmd::run_in(node, &["nft", "delete table inet ndtest"]).map(drop)
    }

    /// Appends `rule` to chain `ndfwd` (forward hook) of table `inet ndtest` in `node`,
    /// creating both if needed.
    fn add_forward_rule(&self, node: &str, rule: &str) -> Result<()> {
        cmd::run_in(node, &["nft", "add table inet ndtest"])?;
        // nft 1.0.6 reserves `fwd`, hence the chain name.
        cmd::run_in(
            node,
            &[
                "nft",
                "add chain inet ndtest ndfwd { type filter hook forward priority 0; policy accept; }",
            ],
        )?;
        cmd::run_in(
            node,
            &["nft", &format!("add rule inet ndtest ndfwd {rule}")],
        )
        .map(drop)
    }

    /// Sets every pod interface and its node-side veth to `mtu` on both nodes and
    /// flushes learned PMTUs. 1500 over the 1450 vxlan is the seed's misconfiguration;
    /// both pods, since a 1450 peer would advertise an MSS that hides it.
    pub fn set_pod_mtu(&self, mtu: u32) -> Result<()> {
        let mtu = mtu.to_string();
        for (node, pod) in [(&self.node_a, &self.pod_a), (&self.node_b, &self.pod_b)] {
            cmd::run(&["ip", "-n", pod, "link", "set", POD_IF, "mtu", &mtu])?;
            cmd::run(&["ip", "-n", node, "link", "set", POD_HOST_IF, "mtu", &mtu])?;
            cmd::run(&["ip", "-n", pod, "route", "flush", "cache"])?;
        }
        Ok(())
    }

    /// Drops the ICMP frag-needed and ICMPv6 packet-too-big node `node` generates
    /// (nftables table `inet ndicmp`, output hook), as a host firewall filtering ICMP
    /// would. The table goes with the namespace.
    pub fn drop_frag_needed(&self, node: &str) -> Result<()> {
        for rule in [
            "add table inet ndicmp",
            "add chain inet ndicmp out { type filter hook output priority 0; policy accept; }",
            "add rule inet ndicmp out icmp type destination-unreachable icmp code frag-needed drop",
            "add rule inet ndicmp out icmpv6 type packet-too-big drop",
        ] {
            cmd::run_in(node, &["nft", rule])?;
        }
        Ok(())
    }

    /// Deletes node `node`'s route to its pod `pod_ip` (`/32 dev vpod0`), the
    /// CNI fault of a node that lost a pod route.
    pub fn delete_pod_route(&self, node: &str, pod_ip: Ipv4Addr) -> Result<()> {
        let cidr = format!("{pod_ip}/32");
        cmd::run(&["ip", "-n", node, "route", "del", &cidr, "dev", POD_HOST_IF]).map(drop)
    }

    /// Steers what interface `dev` of namespace `netns` receives to the CPUs of `mask`
    /// (RPS, `queues/rx-0/rps_cpus`, a hex mask): the packets are then handled on those
    /// CPUs, not on the sender's. Goes with the namespace.
    pub fn steer_rx(&self, netns: &str, dev: &str, mask: u32) -> Result<()> {
        // `ip netns exec` mounts the namespace's own /sys.
        let write = format!("echo {mask:x} > /sys/class/net/{dev}/queues/rx-0/rps_cpus");
        cmd::run_in(netns, &["sh", "-c", &write]).map(drop)
    }

    /// Sets interface `dev` of namespace `netns` to `mtu`.
    pub fn set_link_mtu(&self, netns: &str, dev: &str, mtu: u32) -> Result<()> {
        cmd::ip(netns, &["link", "set", dev, "mtu", &mtu.to_string()])
    }

    /// Routes each node's overlay address (`/32`) to the other through the tunnel, as
    /// CNIs do (they take it from the node's pod CIDR: Flannel's `flannel.1` is
    /// `10.244.X.0/32`): otherwise what a node sends from it (an echo request to a peer
    /// pod, which leaves by the tunnel) gets no answer.
    pub fn route_tunnel_addresses(&self) -> Result<()> {
        for (node, peer) in [
            (&self.node_a, self.node_b_overlay),
            (&self.node_b, self.node_a_overlay),
        ] {
            cmd::ip(
                node,
                &["route", "add", &format!("{peer}/32"), "dev", VXLAN_IF],
            )?;
        }
        Ok(())
    }

    /// Gives each node a permanent neighbour entry for the other's tunnel address (its
    /// VXLAN's MAC), as Flannel and Calico install them: the next hop through the tunnel
    /// is then never resolved through it, and survives [`Topology::forget_neighbours`].
    pub fn pin_tunnel_neighbours(&self) -> Result<()> {
        for (node, peer, peer_overlay) in [
            (&self.node_a, &self.node_b, self.node_b_overlay),
            (&self.node_b, &self.node_a, self.node_a_overlay),
        ] {
            let mac = cmd::run_in(
                peer,
                &["cat", &format!("/sys/class/net/{VXLAN_IF}/address")],
            )?;
            cmd::ip(
                node,
                &[
                    "neigh",
                    "replace",
                    &peer_overlay.to_string(),
                    "lladdr",
                    mac.trim(),
                    "dev",
                    VXLAN_IF,
                    "nud",
                    "permanent",
                ],
            )?;
        }
        Ok(())
    }

    /// See [`crate::netns::forget_neighbours`], for the four namespaces.
    pub fn forget_neighbours(&self) -> Result<()> {
        crate::netns::forget_neighbours(&self.netns_names())
    }

    /// Sets `setting` (`name=value`) with `sysctl -qw` inside namespace `netns`.
    pub fn sysctl(&self, netns: &str, setting: &str) -> Result<()> {
        cmd::run_in(netns, &["sysctl", "-qw", setting]).map(drop)
    }

    /// Pings `to` from namespace `from` (one echo, 1 s wait) until it answers
    /// or `timeout` passes (`false`); the first echo may be lost to neighbour resolution.
    pub fn ping_until(&self, from: &str, to: Ipv4Addr, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let to = to.to_string();
        loop {
            let out = cmd::try_run_in(from, &["ping", "-n", "-q", "-c", "1", "-W", "1", &to])?;
            if out.status.success() {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
        }
    }
}

/// Configures `node`'s [`UNDERLAY_IF`] (`local`/24, `mtu`) and its VXLAN [`VXLAN_IF`]
/// towards `remote` ([`add_vxlan`] with `extra`), whose address is `overlay`/32.
pub(crate) fn add_underlay(
    node: &str,
    (local, remote): (&str, &str),
    overlay: Ipv4Addr,
    mtu: u32,
    extra: &[&str],
) -> Result<()> {
    let ip = |args: &[&str]| cmd::ip(node, args);
    ip(&["addr", "add", &format!("{local}/24"), "dev", UNDERLAY_IF])?;
    ip(&["link", "set", UNDERLAY_IF, "mtu", &mtu.to_string(), "up"])?;
    add_vxlan(node, VXLAN_IF, VXLAN_ID, VXLAN_PORT, (local, remote), extra)?;
    ip(&["addr", "add", &format!("{overlay}/32"), "dev", VXLAN_IF])?;
    ip(&["link", "set", VXLAN_IF, "up"])
}

/// Adds VXLAN `name` to `node` between `local` and `remote` (its underlay addresses),
/// bound to [`UNDERLAY_IF`], with `extra` arguments: the kernel derives its MTU from that
/// device's, less the encapsulation.
pub(crate) fn add_vxlan(
    node: &str,
    name: &str,
    id: u32,
    port: u16,
    (local, remote): (&str, &str),
    extra: &[&str],
) -> Result<()> {
    let (id, port) = (id.to_string(), port.to_string());
    let mut args = vec![
        "link",
        "add",
        name,
        "type",
        "vxlan",
        "id",
        &id,
        "local",
        local,
        "remote",
        remote,
        "dstport",
        &port,
        "dev",
        UNDERLAY_IF,
    ];
    args.extend_from_slice(extra);
    cmd::ip(node, &args)
}

/// A node's pod, for [`link_pod`]: the same in every topology here.
pub(crate) struct PodLink<'a> {
    pub(crate) node: &'a str,
    pub(crate) pod: &'a str,
    pub(crate) pod_ip: Ipv4Addr,
    /// The node side's address, the pod's default gateway.
    pub(crate) gateway: Ipv4Addr,
    pub(crate) mtu: u32,
    pub(crate) peer_pod_cidr: &'a str,
    pub(crate) peer_overlay: Ipv4Addr,
}

/// The pod's veth and address, its default route `onlink` via the node side, the node's
/// routes to it and to the peer node's pods (via the peer's overlay address, `onlink`
/// on [`VXLAN_IF`]), and forwarding on the node.
pub(crate) fn link_pod(p: &PodLink<'_>) -> Result<()> {
    let ip = |args: &[&str]| cmd::ip(p.node, args);
    let pod_ip = |args: &[&str]| cmd::ip(p.pod, args);
    let (mtu, gateway) = (p.mtu.to_string(), p.gateway.to_string());
    let pod_cidr = format!("{}/32", p.pod_ip);
    ip(&[
        "link",
        "add",
        POD_HOST_IF,
        "type",
        "veth",
        "peer",
        "name",
        POD_IF,
        "netns",
        p.pod,
    ])?;
    ip(&["addr", "add", &format!("{gateway}/32"), "dev", POD_HOST_IF])?;
    ip(&["link", "set", POD_HOST_IF, "mtu", &mtu, "up"])?;
    pod_ip(&["addr", "add", &pod_cidr, "dev", POD_IF])?;
    pod_ip(&["link", "set", POD_IF, "mtu", &mtu, "up"])?;
    pod_ip(&[
        "route", "add", "default", "via", &gateway, "dev", POD_IF, "onlink",
    ])?;
    ip(&["route", "add", &pod_cidr, "dev", POD_HOST_IF])?;
    ip(&[
        "route",
        "add",
        p.peer_pod_cidr,
        "via",
        &p.peer_overlay.to_string(),
        "dev",
        VXLAN_IF,
        "onlink",
    ])?;
    cmd::run_in(p.node, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]).map(drop)
}

/// How a firewall rule from [`Topology::reject_forwarded_tcp`] answers the packets it
/// rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// A TCP RST, sent by the node in the peer's name (`reject with tcp reset`).
    TcpReset,
    /// An ICMP port unreachable from the node (`reject with icmpx type port-unreachable`):
    /// the client gets `ECONNREFUSED` without any RST.
    IcmpPortUnreachable,
    /// An ICMP host-prohibited (`reject with icmp type host-prohibited`, firewalld's
    /// default): the client gets `EHOSTUNREACH`. IPv4 only.
    IcmpHostProhibited,
}

impl Reject {
    /// The nftables `reject with` argument.
    fn nft(self) -> &'static str {
        match self {
            Reject::TcpReset => "tcp reset",
            Reject::IcmpPortUnreachable => "icmpx type port-unreachable",
            Reject::IcmpHostProhibited => "icmp type host-prohibited",
        }
    }
}
