//! Two nodes in different subnets joined by a router, a VXLAN overlay between them with
//! the outer Don't Fragment bit set, and one pod per node: a path whose narrow hop is
//! beyond node A, where only the route cache (a frag-needed from the router) tells node
//! A about it.
//!
//! ```text
//!  pod A (10.244.1.7/32)                                        pod B (10.244.2.9/32)
//!    eth0 1450 -- vpod0 169.254.1.1                  vpod0 169.254.1.1 -- eth0 1450
//!  node A   vx0 10.200.0.1/32 (vxlan 42, df set) ====== vx0 10.200.0.2/32   node B
//!           ul0 192.168.78.1/24                         ul0 192.168.79.2/24
//!              |      default via .78.254       default via .79.254     |
//!              +---- ra 192.168.78.254  router  rb 192.168.79.254 ----+
//! ```
//!
//! With [`RoutedTopology::build_with_ipv6`] the underlay also has fd00:78::/64 and
//! fd00:79::/64 on the same links, routed the same way, and each node a second VXLAN,
//! `vx6` (vxlan 43, port 4790), whose remote is the other node's IPv6 underlay address.
//!
//! Like [`Topology`](crate::Topology), the namespaces are named from a base
//! (`<base>-{na,nb,pa,pb,rt}`) and owned by [`Netns`] guards: dropping the topology,
//! also while unwinding from a failure, deletes them with every device, route, nftables
//! table and learned path MTU inside.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use crate::{
    Error, Result, cmd,
    netns::Netns,
    topology::{POD_HOST_IF, POD_IF, POD_MTU, UNDERLAY_IF, VXLAN_ID, VXLAN_IF, VXLAN_PORT},
};

/// The router's interface towards node A.
pub const ROUTER_TO_A_IF: &str = "ra";
/// The router's interface towards node B: the hop [`RoutedTopology::narrow_towards_b`]
/// narrows.
pub const ROUTER_TO_B_IF: &str = "rb";
/// The IPv6 VXLAN of [`RoutedTopology::build_with_ipv6`].
pub const VXLAN6_IF: &str = "vx6";
/// Its network identifier.
pub const VXLAN6_ID: u32 = 43;
/// Its UDP port.
pub const VXLAN6_PORT: u16 = 4790;

/// The five namespaces and their addresses. Dropping it deletes the namespaces.
#[derive(Debug)]
pub struct RoutedTopology {
    /// Netns name of node A (where the agent runs).
    pub node_a: String,
    /// Netns name of node B.
    pub node_b: String,
    /// Netns name of the pod on node A.
    pub pod_a: String,
    /// Netns name of the pod on node B.
    pub pod_b: String,
    /// Netns name of the router between the nodes.
    pub router: String,
    /// Node A's underlay address (on [`UNDERLAY_IF`], /24).
    pub node_a_underlay: Ipv4Addr,
    /// Node B's underlay address, in another subnet.
    pub node_b_underlay: Ipv4Addr,
    /// Node A's IPv6 underlay address, with [`RoutedTopology::build_with_ipv6`].
    pub node_a_underlay_v6: Option<Ipv6Addr>,
    /// Node B's IPv6 underlay address, with [`RoutedTopology::build_with_ipv6`].
    pub node_b_underlay_v6: Option<Ipv6Addr>,
    /// Pod A's address.
    pub pod_a_ip: Ipv4Addr,
    /// Pod B's address.
    pub pod_b_ip: Ipv4Addr,
    // Declared last: dropped after the names above, deletes the namespaces.
    namespaces: Vec<Netns>,
}

/// One node's side, for [`RoutedTopology::setup_node`].
struct NodeSide<'a> {
    node: &'a str,
    pod: &'a str,
    underlay: Ipv4Addr,
    router: Ipv4Addr,
    peer_underlay: Ipv4Addr,
    overlay: Ipv4Addr,
    peer_overlay: Ipv4Addr,
    pod_ip: Ipv4Addr,
    peer_pod_cidr: &'a str,
    /// (own, router's, peer's) IPv6 underlay addresses.
    v6: Option<(Ipv6Addr, Ipv6Addr, Ipv6Addr)>,
}

const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

impl RoutedTopology {
    /// Builds the namespaces `<base>-{na,nb,pa,pb,rt}`, their devices and routes, every
    /// link at 1500, and checks that pod A reaches pod B through the overlay across the
    /// router. On failure, whatever was built is deleted again.
    pub fn build(base: &str) -> Result<RoutedTopology> {
        Self::build_inner(base, false)
    }

    /// [`RoutedTopology::build`] with an IPv6 underlay beside the IPv4 one and a VXLAN
    /// over it ([`VXLAN6_IF`]) on each node.
    pub fn build_with_ipv6(base: &str) -> Result<RoutedTopology> {
        Self::build_inner(base, true)
    }

    fn build_inner(base: &str, ipv6: bool) -> Result<RoutedTopology> {
        crate::require_root()?;
        let names = ["na", "nb", "pa", "pb", "rt"].map(|suffix| format!("{base}-{suffix}"));
        let namespaces = names
            .iter()
            .map(|n| Netns::create(n))
            .collect::<Result<Vec<Netns>>>()?;
        let [node_a, node_b, pod_a, pod_b, router] = names;
        let v6 = |s: &str| s.parse::<Ipv6Addr>().ok().filter(|_| ipv6);
        let topo = RoutedTopology {
            node_a,
            node_b,
            pod_a,
            pod_b,
            router,
            node_a_underlay: Ipv4Addr::new(192, 168, 78, 1),
            node_b_underlay: Ipv4Addr::new(192, 168, 79, 2),
            node_a_underlay_v6: v6("fd00:78::1"),
            node_b_underlay_v6: v6("fd00:79::2"),
            pod_a_ip: Ipv4Addr::new(10, 244, 1, 7),
            pod_b_ip: Ipv4Addr::new(10, 244, 2, 9),
            namespaces,
        };
        let router_a = Ipv4Addr::new(192, 168, 78, 254);
        let router_b = Ipv4Addr::new(192, 168, 79, 254);
        let (router_a6, router_b6): (Ipv6Addr, Ipv6Addr) = (
            "fd00:78::fe".parse().expect("an address"),
            "fd00:79::fe".parse().expect("an address"),
        );
        for (node, router_if) in [
            (&topo.node_a, ROUTER_TO_A_IF),
            (&topo.node_b, ROUTER_TO_B_IF),
        ] {
            cmd::run(&[
                "ip",
                "-n",
                &topo.router,
                "link",
                "add",
                router_if,
                "type",
                "veth",
                "peer",
                "name",
                UNDERLAY_IF,
                "netns",
                node,
            ])?;
        }
        for (dev, addr, addr6) in [
            (ROUTER_TO_A_IF, router_a, router_a6),
            (ROUTER_TO_B_IF, router_b, router_b6),
        ] {
            topo.ip(
                &topo.router,
                &["addr", "add", &format!("{addr}/24"), "dev", dev],
            )?;
            if ipv6 {
                topo.ip(
                    &topo.router,
                    &["addr", "add", &format!("{addr6}/64"), "dev", dev, "nodad"],
                )?;
            }
            topo.ip(&topo.router, &["link", "set", dev, "mtu", "1500", "up"])?;
        }
        topo.sysctl(&topo.router, "net.ipv4.ip_forward=1")?;
        if ipv6 {
            topo.sysctl(&topo.router, "net.ipv6.conf.all.forwarding=1")?;
        }
        let pair = |own: Option<Ipv6Addr>, router: Ipv6Addr, peer: Option<Ipv6Addr>| {
            Some((own?, router, peer?))
        };
        topo.setup_node(&NodeSide {
            node: &topo.node_a,
            pod: &topo.pod_a,
            underlay: topo.node_a_underlay,
            router: router_a,
            peer_underlay: topo.node_b_underlay,
            overlay: Ipv4Addr::new(10, 200, 0, 1),
            peer_overlay: Ipv4Addr::new(10, 200, 0, 2),
            pod_ip: topo.pod_a_ip,
            peer_pod_cidr: "10.244.2.0/24",
            v6: pair(topo.node_a_underlay_v6, router_a6, topo.node_b_underlay_v6),
        })?;
        topo.setup_node(&NodeSide {
            node: &topo.node_b,
            pod: &topo.pod_b,
            underlay: topo.node_b_underlay,
            router: router_b,
            peer_underlay: topo.node_a_underlay,
            overlay: Ipv4Addr::new(10, 200, 0, 2),
            peer_overlay: Ipv4Addr::new(10, 200, 0, 1),
            pod_ip: topo.pod_b_ip,
            peer_pod_cidr: "10.244.1.0/24",
            v6: pair(topo.node_b_underlay_v6, router_b6, topo.node_a_underlay_v6),
        })?;

        let timeout = Duration::from_secs(5);
        let mut checks = vec![
            (topo.node_a.clone(), IpAddr::from(topo.node_b_underlay)),
            (topo.pod_a.clone(), IpAddr::from(topo.pod_b_ip)),
        ];
        checks.extend(
            topo.node_b_underlay_v6
                .map(|b| (topo.node_a.clone(), IpAddr::from(b))),
        );
        for (from, to) in checks {
            if !topo.ping_until(&from, to, timeout)? {
                return Err(Error::Unreachable {
                    from,
                    to: to.to_string(),
                    timeout,
                });
            }
        }
        // The checks above learn nothing (small packets), but start from a clean cache.
        topo.flush_route_cache(&topo.node_a)?;
        Ok(topo)
    }

    fn ip(&self, netns: &str, args: &[&str]) -> Result<()> {
        let mut argv = vec!["ip", "-n", netns];
        argv.extend_from_slice(args);
        cmd::run(&argv).map(drop)
    }

    fn setup_node(&self, s: &NodeSide<'_>) -> Result<()> {
        let ip = |args: &[&str]| self.ip(s.node, args);
        let pod_ip = |args: &[&str]| self.ip(s.pod, args);
        let (local, remote) = (s.underlay.to_string(), s.peer_underlay.to_string());
        let router = s.router.to_string();
        let pod_mtu = POD_MTU.to_string();
        let pod_cidr = format!("{}/32", s.pod_ip);
        let gateway = POD_GATEWAY.to_string();

        // Underlay: the router is the way to the other node's subnet (and the default).
        ip(&["addr", "add", &format!("{local}/24"), "dev", UNDERLAY_IF])?;
        ip(&["link", "set", UNDERLAY_IF, "mtu", "1500", "up"])?;
        ip(&[
            "route",
            "add",
            "default",
            "via",
            &router,
            "dev",
            UNDERLAY_IF,
        ])?;
        // Overlay: the kernel derives the vxlan MTU (1450) from `dev`; the outer header
        // carries DF, so a narrower hop answers with frag-needed instead of fragmenting.
        ip(&[
            "link",
            "add",
            VXLAN_IF,
            "type",
            "vxlan",
            "id",
            &VXLAN_ID.to_string(),
            "local",
            &local,
            "remote",
            &remote,
            "dstport",
            &VXLAN_PORT.to_string(),
            "dev",
            UNDERLAY_IF,
            "df",
            "set",
        ])?;
        ip(&["addr", "add", &format!("{}/32", s.overlay), "dev", VXLAN_IF])?;
        ip(&["link", "set", VXLAN_IF, "up"])?;
        if let Some((own6, router6, peer6)) = s.v6 {
            let (own6, router6, peer6) = (own6.to_string(), router6.to_string(), peer6.to_string());
            ip(&[
                "addr",
                "add",
                &format!("{own6}/64"),
                "dev",
                UNDERLAY_IF,
                "nodad",
            ])?;
            ip(&[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &router6,
                "dev",
                UNDERLAY_IF,
            ])?;
            ip(&[
                "link",
                "add",
                VXLAN6_IF,
                "type",
                "vxlan",
                "id",
                &VXLAN6_ID.to_string(),
                "local",
                &own6,
                "remote",
                &peer6,
                "dstport",
                &VXLAN6_PORT.to_string(),
                "dev",
                UNDERLAY_IF,
            ])?;
            ip(&["link", "set", VXLAN6_IF, "up"])?;
        }
        // Pod veth, and the routes the two-node topology has.
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
            s.pod,
        ])?;
        ip(&["addr", "add", &format!("{gateway}/32"), "dev", POD_HOST_IF])?;
        ip(&["link", "set", POD_HOST_IF, "mtu", &pod_mtu, "up"])?;
        pod_ip(&["addr", "add", &pod_cidr, "dev", POD_IF])?;
        pod_ip(&["link", "set", POD_IF, "mtu", &pod_mtu, "up"])?;
        pod_ip(&[
            "route", "add", "default", "via", &gateway, "dev", POD_IF, "onlink",
        ])?;
        ip(&["route", "add", &pod_cidr, "dev", POD_HOST_IF])?;
        ip(&[
            "route",
            "add",
            s.peer_pod_cidr,
            "via",
            &s.peer_overlay.to_string(),
            "dev",
            VXLAN_IF,
            "onlink",
        ])?;
        self.sysctl(s.node, "net.ipv4.ip_forward=1")
    }

    /// All five namespace names: node A, node B, pod A, pod B, router.
    pub fn netns_names(&self) -> Vec<String> {
        self.namespaces
            .iter()
            .map(|n| n.name().to_owned())
            .collect()
    }

    /// Sets the MTU of the router's link towards node B ([`ROUTER_TO_B_IF`]): the
    /// narrower hop beyond node A. The router answers node A's larger DF packets (its
    /// VXLAN packets, a `ping -M do`) with frag-needed or packet-too-big.
    pub fn narrow_towards_b(&self, mtu: u32) -> Result<()> {
        self.ip(
            &self.router,
            &["link", "set", ROUTER_TO_B_IF, "mtu", &mtu.to_string()],
        )
    }

    /// Drops the frag-needed and packet-too-big the router sends (nftables table
    /// `inet ndrouter`, output hook), as a path that filters ICMP: the nodes then learn
    /// nothing.
    pub fn drop_router_frag_needed(&self) -> Result<()> {
        for rule in [
            "add rule inet ndrouter out icmp type destination-unreachable icmp code frag-needed drop",
            "add rule inet ndrouter out icmpv6 type packet-too-big drop",
        ] {
            self.router_rule("out", "output", rule)?;
        }
        Ok(())
    }

    /// Drops the tunnel's UDP (port [`VXLAN_PORT`]) the router forwards (table
    /// `inet ndrouter`, forward hook): the overlay is cut while the underlay still pings.
    pub fn drop_tunnel_port(&self) -> Result<()> {
        self.router_rule(
            "ndfwd",
            "forward",
            &format!("add rule inet ndrouter ndfwd udp dport {VXLAN_PORT} drop"),
        )
    }

    /// Deletes the router's rules from the injectors above.
    pub fn remove_router_rules(&self) -> Result<()> {
        cmd::run_in(&self.router, &["nft", "delete table inet ndrouter"]).map(drop)
    }

    fn router_rule(&self, chain: &str, hook: &str, rule: &str) -> Result<()> {
        cmd::run_in(&self.router, &["nft", "add table inet ndrouter"])?;
        cmd::run_in(
            &self.router,
            &[
                "nft",
                &format!(
                    "add chain inet ndrouter {chain} {{ type filter hook {hook} priority 0; policy accept; }}"
                ),
            ],
        )?;
        cmd::run_in(&self.router, &["nft", rule]).map(drop)
    }

    /// Forgets the path MTUs namespace `netns` learned, both families: they outlive a
    /// test otherwise (10 minutes by default).
    pub fn flush_route_cache(&self, netns: &str) -> Result<()> {
        self.ip(netns, &["-4", "route", "flush", "cache"])?;
        self.ip(netns, &["-6", "route", "flush", "cache"])
    }

    /// Sends one echo of `size` payload bytes with Don't Fragment (`ping -M do`) from
    /// `from` to `to`, waiting 1 s; whether it was answered. A too-big one draws a
    /// frag-needed (packet-too-big) from the narrow hop, which `from` learns from.
    pub fn ping_df(&self, from: &str, to: IpAddr, size: u32) -> Result<bool> {
        let (to, size) = (to.to_string(), size.to_string());
        let out = cmd::try_run_in(
            from,
            &[
                "ping", "-n", "-q", "-M", "do", "-s", &size, "-c", "1", "-W", "1", &to,
            ],
        )?;
        Ok(out.status.success())
    }

    /// The path MTU namespace `netns`'s route cache learned for `dst`, as
    /// `ip route get` prints it (`cache expires 598sec mtu 1400`).
    pub fn learned_mtu(&self, netns: &str, dst: IpAddr) -> Result<Option<u32>> {
        let out = cmd::run(&["ip", "-n", netns, "route", "get", &dst.to_string()])?;
        Ok(parse_learned_mtu(&out))
    }

    /// Pings `to` from namespace `from` (one echo, 1 s wait) until it answers or
    /// `timeout` passes (`false`).
    pub fn ping_until(&self, from: &str, to: IpAddr, timeout: Duration) -> Result<bool> {
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

    /// Sets `setting` (`name=value`) with `sysctl -qw` inside namespace `netns`.
    pub fn sysctl(&self, netns: &str, setting: &str) -> Result<()> {
        cmd::run_in(netns, &["sysctl", "-qw", setting]).map(drop)
    }
}

impl crate::agent::AgentHost for RoutedTopology {
    fn agent_netns(&self) -> &str {
        &self.node_a
    }
}

/// The learned MTU in `ip route get`'s output: the `mtu` of an entry that expires (a
/// configured route's `mtu` never does).
fn parse_learned_mtu(out: &str) -> Option<u32> {
    let words: Vec<&str> = out.split_whitespace().collect();
    if !words.contains(&"expires") {
        return None;
    }
    words
        .windows(2)
        .find(|w| w[0] == "mtu")
        .and_then(|w| w[1].parse().ok())
}

#[cfg(test)]
mod tests {
    use super::parse_learned_mtu;

    #[test]
    fn learned_mtus_from_ip_route_get() {
        let v4 = "192.168.79.2 via 192.168.78.254 dev ul0 src 192.168.78.1 uid 0 \n    \
                  cache expires 597sec mtu 1400 \n";
        assert_eq!(parse_learned_mtu(v4), Some(1400));
        let v6 = "fd00:79::2 from :: via fd00:78::fe dev ul0 proto static src fd00:78::1 \
                  metric 1024 expires 598sec mtu 1400 pref medium\n";
        assert_eq!(parse_learned_mtu(v6), Some(1400));
        let configured = "10.79.0.5 dev ul0 src 10.78.0.1 uid 0 \n    cache mtu 1400\n";
        assert_eq!(parse_learned_mtu(configured), None);
        assert_eq!(
            parse_learned_mtu("192.168.79.2 dev ul0 \n    cache \n"),
            None
        );
    }
}
