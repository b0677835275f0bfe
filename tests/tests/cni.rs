//! The MTU model against the device shapes real CNIs create, built in the testbed's
//! network namespaces in place of its `vx0` overlay, with the real agent in node A.
//! Each shape has a clean case (no `overlay_mtu_mismatch`, and where the shape carries
//! the pods' traffic, a bulk transfer through it is clean) and a broken one (one
//! mismatch whose arithmetic names what is wrong).
//!
//! - flannel: `flannel.1`, a VXLAN without a remote whose peers are FDB entries
//!   (`bridge fdb append 00:00:00:00:00:00 dev flannel.1 dst <peer>`), routes to the
//!   peers' pod subnets through it.
//! - Calico VXLAN: `vxlan.calico` with per-peer MAC FDB and neighbour entries. Calico
//!   IPIP: `tunl0` (the ipip module's fallback device: no remote, each packet sent to the
//!   gateway of its route); this machine's kernel has no ipip, so here those tests skip
//!   and the netlink fixtures of `node-diag/src/host_network/underlay.rs` cover it. The
//!   VM runner's kernels have ipip (`NODE_DIAG_REQUIRE_TUNNELS=1` makes it mandatory, as
//!   geneve and wireguard: see `node_diag_tests::tunnel`).
//! - Cilium in tunnel mode: `cilium_vxlan` in metadata (`external`) mode, veths at 1500
//!   on both ends and the pod's default route with `mtu 1450`. Cilium's eBPF datapath sets
//!   each packet's tunnel endpoint; here a route's `encap ip dst` does the same in the
//!   kernel. Also over an IPv6 underlay (VXLAN/IPv6: 70 bytes), and with `cilium_geneve`
//!   where the kernel has geneve.
//! - A multi-NIC node: a jumbo (9000) cluster network beside a 1500 network holding the
//!   default route; a VXLAN whose peers are on the jumbo network, and a WireGuard device
//!   whose peer is (where the kernel has wireguard).
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test cni -- --test-threads=1`.

/// One module, so that the name filter `cni` (as in `cargo xtask integration --filter
/// cni`) selects these tests and no other binary's.
mod cni {
    use std::io::Write as _;
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use node_diag_tests::finding::{field, mismatch_on};
    use node_diag_tests::topology::{POD_HOST_IF, POD_IF, UNDERLAY_IF, VXLAN_IF};
    use node_diag_tests::tunnel::{add_tunnel_or_skip, is_missing_kind, tunnels_required};
    use node_diag_tests::{
        Agent, ServerMode, TcpServer, Topology, cmd, node_diag_bin, tcp_request,
    };
    use serde_json::Value;

    /// A transfer big enough to fill full-size segments for a while.
    const BULK: usize = 200 * 1024;
    /// The MTU findings are computed before the agent is ready; this only covers a slow
    /// VM.
    const FINDING_WITHIN: Duration = Duration::from_secs(5);
    /// How long a clean shape is watched for a finding.
    const QUIET: Duration = Duration::from_secs(3);
    /// Node A's and node B's IPv6 underlay addresses (on `ul0`).
    const NODE_V6: [&str; 2] = ["fd00:77::1", "fd00:77::2"];

    // Building ---------------------------------------------------------------------------

    /// One node's share of a shape: its namespaces and addresses, and its peer's.
    struct Side {
        node: String,
        pod: String,
        /// 1 for node A, 2 for node B: the third octet of its pod subnet.
        index: u8,
        peer_index: u8,
        underlay: Ipv4Addr,
        peer_underlay: Ipv4Addr,
    }

    impl Side {
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

    fn sides(topo: &Topology) -> [Side; 2] {
        [
            Side {
                node: topo.node_a.clone(),
                pod: topo.pod_a.clone(),
                index: 1,
                peer_index: 2,
                underlay: topo.node_a_underlay,
                peer_underlay: topo.node_b_underlay,
            },
            Side {
                node: topo.node_b.clone(),
                pod: topo.pod_b.clone(),
                index: 2,
                peer_index: 1,
                underlay: topo.node_b_underlay,
                peer_underlay: topo.node_a_underlay,
            },
        ]
    }

    /// `ip -n <netns> <args>`; panics unless it succeeds.
    fn ip(netns: &str, args: &[&str]) {
        let mut argv = vec!["ip", "-n", netns];
        argv.extend_from_slice(args);
        cmd::run(&argv);
    }

    /// `bridge <args>` inside `netns`.
    fn bridge(netns: &str, args: &[&str]) {
        let mut argv = vec!["bridge"];
        argv.extend_from_slice(args);
        cmd::run_in(netns, &argv);
    }

    /// Deletes the testbed's `vx0` on both nodes, and with it the routes through it: the
    /// shape's devices carry the pods' traffic instead.
    fn remove_testbed_overlay(topo: &Topology) {
        for node in [&topo.node_a, &topo.node_b] {
            ip(node, &["link", "del", VXLAN_IF]);
        }
    }

    /// The ipip module's `tunl0` in `netns`: it exists in every namespace once the module
    /// is loaded, and asking for one loads the module where the kernel can. `false` (the
    /// test skips, with a `SKIPPED:` line) when the kernel has no ipip, unless tunnels are
    /// required, which makes it a failure.
    fn tunl0_or_skip(netns: &str) -> bool {
        let out = cmd::try_run(&["ip", "-n", netns, "link", "add", "tunl0", "type", "ipip"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || stderr.contains("File exists") {
            return true;
        }
        assert!(
            is_missing_kind(&stderr),
            "ip link add tunl0 type ipip: {stderr}"
        );
        assert!(
            !tunnels_required(),
            "tunnels are required but this kernel has no ipip: {stderr}"
        );
        let _ = writeln!(
            std::io::stderr(),
            "\nSKIPPED: this kernel has no ipip support"
        );
        false
    }

    /// flannel's VXLAN on both nodes: `flannel.1` (VNI 1, port 8472, no learning, no
    /// remote), bound to the underlay like flannel's unless `bound` is false, one
    /// all-zero FDB entry per peer, and the peer's pod subnet routed through it to the
    /// peer's `flannel.1` address (`10.244.<n>.0/32`).
    fn flannel(topo: &Topology, bound: bool) {
        remove_testbed_overlay(topo);
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
            ip(&s.node, &args);
            let addr = format!("{}/32", s.own(0));
            ip(&s.node, &["addr", "add", &addr, "dev", "flannel.1"]);
            ip(&s.node, &["link", "set", "flannel.1", "up"]);
            let peer = s.peer_underlay.to_string();
            bridge(
                &s.node,
                &[
                    "fdb",
                    "append",
                    "00:00:00:00:00:00",
                    "dev",
                    "flannel.1",
                    "dst",
                    &peer,
                ],
            );
            let via = s.peer(0);
            ip(
                &s.node,
                &[
                    "route",
                    "add",
                    &s.peer_pod_cidr(),
                    "via",
                    &via,
                    "dev",
                    "flannel.1",
                    "onlink",
                ],
            );
        }
    }

    /// The MAC of node `index`'s tunnel device, fixed so each node can name its peer's.
    fn mac(index: u8) -> String {
        format!("02:00:00:00:0{index}:01")
    }

    /// Calico's VXLAN on both nodes: `vxlan.calico` (VNI 4096, port 4789, bound to the
    /// underlay, no learning) at `mtu`, its VTEP address `10.244.<n>.0/32`, and per peer a
    /// permanent neighbour entry for the peer's VTEP, an FDB entry from the peer's VTEP
    /// MAC to its node, and the peer's pod subnet routed through it.
    fn calico_vxlan(topo: &Topology, mtu: u32) {
        remove_testbed_overlay(topo);
        let mtu = mtu.to_string();
        for s in sides(topo) {
            let local = s.underlay.to_string();
            let own_mac = mac(s.index);
            ip(
                &s.node,
                &[
                    "link",
                    "add",
                    "vxlan.calico",
                    "address",
                    &own_mac,
                    "type",
                    "vxlan",
                    "id",
                    "4096",
                    "local",
                    &local,
                    "dev",
                    UNDERLAY_IF,
                    "dstport",
                    "4789",
                    "nolearning",
                ],
            );
            ip(&s.node, &["link", "set", "vxlan.calico", "mtu", &mtu, "up"]);
            let addr = format!("{}/32", s.own(0));
            ip(&s.node, &["addr", "add", &addr, "dev", "vxlan.calico"]);
            let (peer_vtep, peer_mac) = (s.peer(0), mac(s.peer_index));
            ip(
                &s.node,
                &[
                    "neigh",
                    "add",
                    &peer_vtep,
                    "lladdr",
                    &peer_mac,
                    "dev",
                    "vxlan.calico",
                    "nud",
                    "permanent",
                ],
            );
            let peer = s.peer_underlay.to_string();
            bridge(
                &s.node,
                &[
                    "fdb",
                    "add",
                    &peer_mac,
                    "dev",
                    "vxlan.calico",
                    "dst",
                    &peer,
                    "self",
                    "permanent",
                ],
            );
            ip(
                &s.node,
                &[
                    "route",
                    "add",
                    &s.peer_pod_cidr(),
                    "via",
                    &peer_vtep,
                    "dev",
                    "vxlan.calico",
                    "onlink",
                ],
            );
        }
    }

    /// Calico's IPIP on both nodes: the ipip module's `tunl0` (no remote, no local) at
    /// `mtu`, its address `10.244.<n>.0/32`, and the peer's pod subnet routed through it
    /// to the peer node's underlay address, which is where tunl0 sends each packet.
    /// `false` (the test skips) when the kernel has no ipip.
    fn calico_ipip(topo: &Topology, mtu: u32) -> bool {
        if !tunl0_or_skip(&topo.node_a) {
            return false;
        }
        remove_testbed_overlay(topo);
        let mtu = mtu.to_string();
        for s in sides(topo) {
            ip(&s.node, &["link", "set", "tunl0", "mtu", &mtu, "up"]);
            let addr = format!("{}/32", s.own(0));
            ip(&s.node, &["addr", "add", &addr, "dev", "tunl0"]);
            let peer = s.peer_underlay.to_string();
            ip(
                &s.node,
                &[
                    "route",
                    "add",
                    &s.peer_pod_cidr(),
                    "via",
                    &peer,
                    "dev",
                    "tunl0",
                    "onlink",
                ],
            );
        }
        true
    }

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Tunnel {
        Vxlan,
        Geneve,
    }

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Underlay {
        V4,
        V6,
    }

    impl Tunnel {
        fn device(self) -> &'static str {
            match self {
                Tunnel::Vxlan => "cilium_vxlan",
                Tunnel::Geneve => "cilium_geneve",
            }
        }
    }

    /// Cilium's tunnel mode on both nodes: `cilium_vxlan`/`cilium_geneve` in metadata
    /// mode (left at its 1500), the `cilium_host`/`cilium_net` pair holding the router
    /// address `10.244.<n>.1`, pod veths at 1500 on both ends, and routes with `mtu
    /// route_mtu`: the pod's default route (its router's host route has none, as
    /// Cilium's), and the node's route to the peer's pod subnet, whose `encap` names the
    /// peer node (on `underlay`) as Cilium's datapath would. `false` when the kernel lacks
    /// the tunnel kind.
    fn cilium(topo: &Topology, tunnel: Tunnel, underlay: Underlay, route_mtu: u32) -> bool {
        let dev = tunnel.device();
        let kind = match tunnel {
            Tunnel::Vxlan => "vxlan",
            Tunnel::Geneve => "geneve",
        };
        let port = match tunnel {
            Tunnel::Vxlan => "8472",
            Tunnel::Geneve => "6081",
        };
        let [a, b] = sides(topo);
        for s in [&a, &b] {
            if !add_tunnel_or_skip(&s.node, dev, kind, &["external", "dstport", port]) {
                return false;
            }
            ip(&s.node, &["link", "set", dev, "address", &mac(s.index)]);
        }
        remove_testbed_overlay(topo);
        topo.set_pod_mtu(1500);
        let route_mtu = route_mtu.to_string();
        for (i, s) in [&a, &b].into_iter().enumerate() {
            if underlay == Underlay::V6 {
                let cidr = format!("{}/64", NODE_V6[i]);
                ip(
                    &s.node,
                    &["addr", "add", &cidr, "dev", UNDERLAY_IF, "nodad"],
                );
            }
            ip(&s.node, &["link", "set", dev, "up"]);
            ip(
                &s.node,
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
            );
            let router = format!("{}/32", s.own(1));
            ip(&s.node, &["addr", "add", &router, "dev", "cilium_host"]);
            for d in ["cilium_host", "cilium_net"] {
                ip(&s.node, &["link", "set", d, "up"]);
            }
            let peer_router = s.peer(1);
            let id = s.peer_index.to_string();
            let peer_cidr = s.peer_pod_cidr();
            let peer_node = match underlay {
                Underlay::V4 => s.peer_underlay.to_string(),
                Underlay::V6 => NODE_V6[1 - i].to_string(),
            };
            let mut route = vec!["route", "add", &peer_cidr, "encap"];
            match underlay {
                Underlay::V4 => route.extend(["ip", "id", &id, "dst", &peer_node]),
                // Over IPv6 the outer UDP needs its checksum: the receiving socket drops
                // zero-checksum datagrams.
                Underlay::V6 => route.extend(["ip6", "id", &id, "dst", &peer_node, "csum"]),
            }
            route.extend(["via", &peer_router, "dev", dev, "onlink", "mtu", &route_mtu]);
            ip(&s.node, &route);
            let peer_mac = mac(s.peer_index);
            ip(
                &s.node,
                &[
                    "neigh",
                    "add",
                    &peer_router,
                    "lladdr",
                    &peer_mac,
                    "dev",
                    dev,
                    "nud",
                    "permanent",
                ],
            );
            let gateway = topo.pod_gateway.to_string();
            ip(
                &s.pod,
                &["route", "add", &gateway, "dev", POD_IF, "scope", "link"],
            );
            ip(
                &s.pod,
                &[
                    "route", "replace", "default", "via", &gateway, "dev", POD_IF, "mtu",
                    &route_mtu,
                ],
            );
        }
        true
    }

    /// A jumbo cluster network beside the testbed's 1500 one: `cl0` veth (9000) between
    /// the nodes on 192.168.88.0/24, node A's default route via node B on `ul0`, and on
    /// both nodes `vxc`, a VXLAN at 8950 without a device or remote whose peer (an FDB
    /// entry) is the other node's cluster address, addressed 10.99.0.<n>/24.
    fn jumbo_cluster_network(topo: &Topology) {
        ip(
            &topo.node_a,
            &[
                "link",
                "add",
                "cl0",
                "mtu",
                "9000",
                "type",
                "veth",
                "peer",
                "name",
                "cl0",
                "mtu",
                "9000",
                "netns",
                &topo.node_b,
            ],
        );
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
        );
        for (node, n, peer) in [(&topo.node_a, 1, 2), (&topo.node_b, 2, 1)] {
            let cidr = format!("192.168.88.{n}/24");
            ip(node, &["addr", "add", &cidr, "dev", "cl0"]);
            ip(node, &["link", "set", "cl0", "up"]);
            let local = format!("192.168.88.{n}");
            ip(
                node,
                &[
                    "link",
                    "add",
                    "vxc",
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
            );
            ip(node, &["link", "set", "vxc", "mtu", "8950", "up"]);
            let overlay = format!("10.99.0.{n}/24");
            ip(node, &["addr", "add", &overlay, "dev", "vxc"]);
            let dst = format!("192.168.88.{peer}");
            bridge(
                node,
                &[
                    "fdb",
                    "append",
                    "00:00:00:00:00:00",
                    "dev",
                    "vxc",
                    "dst",
                    &dst,
                ],
            );
        }
    }

    // Checking ---------------------------------------------------------------------------

    fn any_mismatch(f: &Value) -> bool {
        field(f, "kind") == "overlay_mtu_mismatch"
    }

    /// Any finding a clean transfer must not cause.
    fn is_transfer_trouble(f: &Value) -> bool {
        matches!(
            field(f, "kind"),
            "overlay_mtu_mismatch" | "df_oversize_drop" | "pmtud_blackhole" | "tcp_stall"
        )
    }

    /// Sends `BULK` bytes from pod A to an echo server in pod B and checks they all come
    /// back, with nothing about MTUs, oversize drops or stalls from the agent.
    fn bulk_transfer_is_clean(topo: &Topology, agent: &Agent, port: u16) {
        let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
        let reply = tcp_request(
            &topo.pod_a,
            topo.pod_b_addr(port),
            &vec![0x5a; BULK],
            Duration::from_secs(20),
        )
        .expect("bulk transfer pod A -> pod B through the shape");
        assert_eq!(reply.len(), BULK);
        agent.expect_no_finding(is_transfer_trouble, QUIET);
    }

    /// `node-diag mtu` in node A, as text.
    fn mtu_text(topo: &Topology) -> String {
        let bin = node_diag_bin();
        cmd::run_in(&topo.node_a, &[bin.to_str().expect("utf-8 path"), "mtu"])
    }

    /// `node-diag mtu -o json` in node A.
    fn mtu_report(topo: &Topology) -> Value {
        let bin = node_diag_bin();
        let out = cmd::run_in(
            &topo.node_a,
            &[bin.to_str().expect("utf-8 path"), "mtu", "-o", "json"],
        );
        serde_json::from_str(&out).expect("node-diag mtu -o json")
    }

    /// The report's verdict on `interface` in namespace `netns`.
    fn verdict<'a>(report: &'a Value, netns: &str, interface: &str) -> &'a Value {
        report["interfaces"]
            .as_array()
            .expect("interfaces")
            .iter()
            .find(|v| v["netns_name"] == netns && v["interface"] == interface)
            .unwrap_or_else(|| panic!("no verdict on {netns} {interface}: {report:#}"))
    }

    fn headroom(agent: &Agent, netns: &str, interface: &str) -> Option<f64> {
        agent.metric(&format!(
            r#"node_diag_overlay_mtu_headroom_bytes{{interface="{interface}",netns="{netns}"}}"#
        ))
    }

    fn summary_contains(f: &Value, part: &str) {
        assert!(field(f, "summary").contains(part), "{part:?} not in {f:#}");
    }

    // flannel ----------------------------------------------------------------------------

    #[test]
    fn flannel_vxlan_with_fdb_peers_is_clean() {
        let topo = Topology::new();
        flannel(&topo, true);
        let agent = Agent::start_ready(&topo);
        agent.expect_no_finding(any_mismatch, QUIET);
        bulk_transfer_is_clean(&topo, &agent, 9101);
        let report = mtu_report(&topo);
        let v = verdict(&report, &topo.node_a, "flannel.1");
        assert_eq!(v["verdict"], "ok", "{v:#}");
        assert_eq!(v["expected_mtu"], 1450, "{v:#}");
        assert_eq!(v["underlay"], UNDERLAY_IF, "{v:#}");
        assert_eq!(v["underlay_source"], "bound", "{v:#}");
        assert_eq!(
            v["underlay_endpoint"],
            topo.node_b_underlay.to_string(),
            "the FDB entry's peer: {v:#}"
        );
    }

    /// Without its `dev`, the kernel leaves a VXLAN at 1500: flannel.1's only way to
    /// its peer is found through its FDB entry.
    #[test]
    fn flannel_vxlan_without_its_device_is_a_mismatch_through_its_fdb_peer() {
        let topo = Topology::new();
        flannel(&topo, false);
        let agent = Agent::start_ready(&topo);
        let f = agent.wait_finding(mismatch_on(&topo.node_a, "flannel.1"), FINDING_WITHIN);
        summary_contains(
            &f,
            "underlay ul0 1500 − VXLAN 50 = 1450, but vxlan flannel.1 is 1500",
        );
        summary_contains(
            &f,
            &format!(
                "underlay ul0 is the route to {}, an FDB destination",
                topo.node_b_underlay
            ),
        );
        let e = &f["evidence"];
        assert_eq!(e["underlay_source"], "route_to_fdb_destination", "{f:#}");
        assert_eq!(e["underlay_endpoint"], topo.node_b_underlay.to_string());
        assert_eq!(e["headroom"], -50, "{f:#}");
        assert!(field(&f, "remediation").starts_with("Set flannel.1's MTU to 1450"));
        assert_eq!(headroom(&agent, &topo.node_a, "flannel.1"), Some(-50.0));
    }

    // Calico -----------------------------------------------------------------------------

    #[test]
    fn calico_vxlan_is_clean() {
        let topo = Topology::new();
        calico_vxlan(&topo, 1450);
        let agent = Agent::start_ready(&topo);
        agent.expect_no_finding(any_mismatch, QUIET);
        bulk_transfer_is_clean(&topo, &agent, 9102);
        let report = mtu_report(&topo);
        let v = verdict(&report, &topo.node_a, "vxlan.calico");
        assert_eq!(v["verdict"], "ok", "{v:#}");
        assert_eq!(
            v["underlay_endpoint"],
            topo.node_b_underlay.to_string(),
            "the per-MAC FDB entry's peer: {v:#}"
        );
        assert_eq!(headroom(&agent, &topo.node_a, "vxlan.calico"), Some(0.0));
    }

    /// Calico's `veth_mtu` left at the NIC's 1500 over its 1450 VXLAN (bound to the
    /// underlay, the kernel keeps vxlan.calico itself within 1450).
    #[test]
    fn calico_vxlan_with_veth_mtu_1500_is_a_mismatch() {
        let topo = Topology::new();
        calico_vxlan(&topo, 1450);
        topo.set_pod_mtu(1500);
        let agent = Agent::start_ready(&topo);
        let f = agent.wait_finding(mismatch_on(&topo.pod_a, POD_IF), FINDING_WITHIN);
        summary_contains(
            &f,
            &format!(
                "underlay ul0 1500 − VXLAN 50 = 1450 (overlay vxlan.calico), but pod eth0 \
                 (netns {}) is 1500",
                topo.pod_a
            ),
        );
        let e = &f["evidence"];
        assert_eq!(e["underlay_source"], "bound", "{f:#}");
        assert_eq!(
            e["underlay_endpoint"],
            topo.node_b_underlay.to_string(),
            "{f:#}"
        );
        assert!(field(&f, "remediation").starts_with("Set the CNI MTU to 1450"));
        agent.wait_finding(mismatch_on(&topo.node_a, POD_HOST_IF), FINDING_WITHIN);
        agent.expect_no_finding(
            mismatch_on(&topo.node_a, "vxlan.calico"),
            Duration::from_secs(1),
        );
    }

    #[test]
    fn calico_ipip_tunl0_is_clean() {
        let topo = Topology::new();
        if !calico_ipip(&topo, 1480) {
            return;
        }
        topo.set_pod_mtu(1480);
        let agent = Agent::start_ready(&topo);
        agent.expect_no_finding(any_mismatch, QUIET);
        bulk_transfer_is_clean(&topo, &agent, 9103);
        let report = mtu_report(&topo);
        let v = verdict(&report, &topo.node_a, "tunl0");
        assert_eq!(v["verdict"], "ok", "{v:#}");
        assert_eq!(v["expected_mtu"], 1480, "{v:#}");
        assert_eq!(v["underlay_source"], "route_to_tunnel_gateway", "{v:#}");
        assert_eq!(v["underlay_endpoint"], topo.node_b_underlay.to_string());
    }

    #[test]
    fn calico_ipip_tunl0_at_the_nic_mtu_is_a_mismatch() {
        let topo = Topology::new();
        if !calico_ipip(&topo, 1500) {
            return;
        }
        let agent = Agent::start_ready(&topo);
        let f = agent.wait_finding(mismatch_on(&topo.node_a, "tunl0"), FINDING_WITHIN);
        summary_contains(
            &f,
            "underlay ul0 1500 − IPIP 20 = 1480, but ipip tunl0 is 1500",
        );
        summary_contains(
            &f,
            &format!(
                "underlay ul0 is the route to {}, the gateway of a route through it",
                topo.node_b_underlay
            ),
        );
    }

    // Cilium -----------------------------------------------------------------------------

    /// Veths at 1500 whose routes carry `mtu 1450`: healthy, and `node-diag mtu` says
    /// why.
    fn cilium_clean(tunnel: Tunnel, port: u16) {
        let topo = Topology::new();
        if !cilium(&topo, tunnel, Underlay::V4, 1450) {
            return;
        }
        let dev = tunnel.device();
        let agent = Agent::start_ready(&topo);
        agent.expect_no_finding(any_mismatch, QUIET);
        assert_eq!(headroom(&agent, &topo.pod_a, POD_IF), Some(0.0));
        assert_eq!(headroom(&agent, &topo.node_a, POD_HOST_IF), Some(0.0));
        bulk_transfer_is_clean(&topo, &agent, port);

        let text = mtu_text(&topo);
        let arithmetic = format!(
            "underlay ul0 1500 − {} 50 = 1450 (overlay {dev}); pod eth0 (netns {}) is 1450: \
             route default via {} mtu 1450 caps veth 1500",
            if tunnel == Tunnel::Vxlan {
                "VXLAN"
            } else {
                "Geneve"
            },
            topo.pod_a,
            topo.pod_gateway
        );
        assert!(text.contains(&arithmetic), "{arithmetic:?} not in:\n{text}");
        let report = mtu_report(&topo);
        let pod = verdict(&report, &topo.pod_a, POD_IF);
        assert_eq!(
            (&pod["mtu"], &pod["effective_mtu"], &pod["verdict"]),
            (&Value::from(1500), &Value::from(1450), &Value::from("ok")),
            "{pod:#}"
        );
        let ext = verdict(&report, &topo.node_a, dev);
        assert_eq!(ext["underlay"], UNDERLAY_IF, "{ext:#}");
        assert_eq!(
            ext["underlay_source"], "route_to_encap_destination",
            "{ext:#}"
        );
        assert_eq!(ext["family_assumed"], false, "{ext:#}");
        // Cilium's host pair is neither a pod nor an underlay.
        assert_eq!(
            verdict(&report, &topo.node_a, "cilium_host")["verdict"],
            "not_applicable"
        );
    }

    #[test]
    fn cilium_vxlan_with_route_mtu_1450_on_1500_veths_is_clean() {
        cilium_clean(Tunnel::Vxlan, 9104);
    }

    #[test]
    fn cilium_geneve_with_route_mtu_1450_on_1500_veths_is_clean() {
        cilium_clean(Tunnel::Geneve, 9105);
    }

    /// The routes' `mtu` left at 1500 over the 1450 tunnel: a mismatch naming the route.
    #[test]
    fn cilium_route_mtu_1500_over_the_tunnel_is_a_mismatch_naming_the_route() {
        let topo = Topology::new();
        assert!(cilium(&topo, Tunnel::Vxlan, Underlay::V4, 1500));
        let agent = Agent::start_ready(&topo);
        let f = agent.wait_finding(mismatch_on(&topo.pod_a, POD_IF), FINDING_WITHIN);
        let route = format!("default via {}", topo.pod_gateway);
        summary_contains(
            &f,
            &format!(
                "underlay ul0 1500 − VXLAN 50 = 1450 (overlay cilium_vxlan), but pod eth0 \
                 (netns {}) is 1500 (route {route} mtu 1500 does not cap it)",
                topo.pod_a
            ),
        );
        let e = &f["evidence"];
        assert_eq!(e["route"], route.as_str(), "{f:#}");
        assert_eq!(e["route_mtu"], 1500, "{f:#}");
        assert_eq!(e["effective_mtu"], 1500, "{f:#}");
        assert!(
            field(&f, "remediation").starts_with("Set the mtu of the pod's routes"),
            "{f:#}"
        );
        assert_eq!(headroom(&agent, &topo.pod_a, POD_IF), Some(-50.0));
        let node_side = agent.wait_finding(mismatch_on(&topo.node_a, POD_HOST_IF), FINDING_WITHIN);
        summary_contains(&node_side, "its pod's route");
    }

    /// Over an IPv6 underlay the tunnel carries 1500 − 70: routes at 1450 are 20 too big,
    /// and 1430 is clean end to end.
    #[test]
    fn cilium_over_an_ipv6_underlay_counts_70_bytes() {
        let topo = Topology::new();
        assert!(cilium(&topo, Tunnel::Vxlan, Underlay::V6, 1450));
        let agent = Agent::start_ready(&topo);
        let f = agent.wait_finding(mismatch_on(&topo.pod_a, POD_IF), FINDING_WITHIN);
        summary_contains(&f, "underlay ul0 1500 − VXLAN/IPv6 70 = 1430");
        let e = &f["evidence"];
        assert_eq!(
            (&e["family"], &e["overhead"], &e["headroom"]),
            (&Value::from("v6"), &Value::from(70), &Value::from(-20)),
            "{f:#}"
        );
        assert_eq!(e["underlay_endpoint"], NODE_V6[1], "{f:#}");
    }

    #[test]
    fn cilium_over_an_ipv6_underlay_with_route_mtu_1430_is_clean() {
        let topo = Topology::new();
        assert!(cilium(&topo, Tunnel::Vxlan, Underlay::V6, 1430));
        let agent = Agent::start_ready(&topo);
        agent.expect_no_finding(any_mismatch, QUIET);
        assert_eq!(headroom(&agent, &topo.pod_a, POD_IF), Some(0.0));
        bulk_transfer_is_clean(&topo, &agent, 9106);
    }

    // A multi-NIC node ---------------------------------------------------------------------

    /// The default route is on the 1500 network; vxc's peer on the jumbo one: vxc at
    /// 8950 is right, and carries 8950-byte packets.
    #[test]
    fn multi_nic_vxlan_follows_the_route_to_its_peer_not_the_default_route() {
        let topo = Topology::new();
        jumbo_cluster_network(&topo);
        let agent = Agent::start_ready(&topo);
        agent.expect_no_finding(any_mismatch, QUIET);
        assert_eq!(headroom(&agent, &topo.node_a, "vxc"), Some(0.0));
        let report = mtu_report(&topo);
        let v = verdict(&report, &topo.node_a, "vxc");
        assert_eq!(
            (&v["underlay"], &v["underlay_mtu"], &v["expected_mtu"]),
            (&Value::from("cl0"), &Value::from(9000), &Value::from(8950)),
            "{v:#}"
        );
        assert_eq!(v["underlay_source"], "route_to_fdb_destination", "{v:#}");
        // 8950 − 20 IPv4 − 8 ICMP: a full-size packet crosses with DF set.
        let ok = cmd::try_run_in(
            &topo.node_a,
            &[
                "ping",
                "-n",
                "-q",
                "-c",
                "2",
                "-W",
                "2",
                "-M",
                "do",
                "-s",
                "8922",
                "10.99.0.2",
            ],
        );
        assert!(
            ok.status.success(),
            "8950-byte DF ping over vxc: {}",
            String::from_utf8_lossy(&ok.stdout)
        );
    }

    /// A peer on the 1500 network: its route is the smallest way out.
    #[test]
    fn multi_nic_peer_on_the_1500_network_is_a_mismatch() {
        let topo = Topology::new();
        jumbo_cluster_network(&topo);
        let stray = topo.node_b_underlay.to_string();
        bridge(
            &topo.node_a,
            &[
                "fdb",
                "append",
                "00:00:00:00:00:00",
                "dev",
                "vxc",
                "dst",
                &stray,
            ],
        );
        let agent = Agent::start_ready(&topo);
        let f = agent.wait_finding(mismatch_on(&topo.node_a, "vxc"), FINDING_WITHIN);
        summary_contains(
            &f,
            "underlay ul0 1500 − VXLAN 50 = 1450, but vxlan vxc is 8950",
        );
        summary_contains(
            &f,
            &format!(
                "underlay ul0 is the route to {stray}, an FDB destination, the smallest path \
                 of its 2 endpoints"
            ),
        );
        assert_eq!(f["evidence"]["underlay_endpoints"], 2, "{f:#}");
    }

    /// A route `mtu` on the way to the peer caps the jumbo device.
    #[test]
    fn multi_nic_route_mtu_capping_the_cluster_network_is_a_mismatch() {
        let topo = Topology::new();
        jumbo_cluster_network(&topo);
        ip(
            &topo.node_a,
            &[
                "route",
                "add",
                "192.168.88.2/32",
                "dev",
                "cl0",
                "mtu",
                "1500",
            ],
        );
        let agent = Agent::start_ready(&topo);
        let f = agent.wait_finding(mismatch_on(&topo.node_a, "vxc"), FINDING_WITHIN);
        let arithmetic = "underlay cl0 1500 (route 192.168.88.2/32 mtu 1500 caps cl0 9000) − \
                          VXLAN 50 = 1450, but vxlan vxc is 8950";
        summary_contains(&f, arithmetic);
        let e = &f["evidence"];
        assert_eq!(
            (&e["underlay_route_mtu"], &e["underlay_device_mtu"]),
            (&Value::from(1500), &Value::from(9000)),
            "{f:#}"
        );
        assert!(
            field(&f, "remediation").contains("raise the mtu of route 192.168.88.2/32"),
            "{f:#}"
        );
        assert!(mtu_text(&topo).contains(arithmetic));
    }

    /// A WireGuard device whose peer is on the jumbo network, while the default route is
    /// on the 1500 one: its underlay is the route to the peer (at `mtu`).
    fn wireguard_to_the_cluster_network(topo: &Topology, mtu: u32) -> bool {
        jumbo_cluster_network(topo);
        if !add_tunnel_or_skip(&topo.node_a, "wgc", "wireguard", &[]) {
            return false;
        }
        let key = cmd::run(&["wg", "genkey"]);
        let peer = public_key(&key);
        cmd::run_in(
            &topo.node_a,
            &[
                "wg",
                "set",
                "wgc",
                "fwmark",
                "51820",
                "peer",
                &peer,
                "endpoint",
                "192.168.88.2:51820",
                "allowed-ips",
                "10.98.0.2/32",
            ],
        );
        let mtu = mtu.to_string();
        ip(&topo.node_a, &["link", "set", "wgc", "mtu", &mtu, "up"]);
        true
    }

    /// `wg pubkey` of a private key.
    fn public_key(private: &str) -> String {
        use std::process::{Command, Stdio};
        let mut child = Command::new("wg")
            .arg("pubkey")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("wg pubkey (install wireguard-tools)");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(private.as_bytes())
            .expect("write the private key");
        let out = child.wait_with_output().expect("wg pubkey");
        assert!(out.status.success(), "wg pubkey: {out:?}");
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_owned()
    }

    #[test]
    fn multi_nic_wireguard_follows_the_route_to_its_peer() {
        let topo = Topology::new();
        if !wireguard_to_the_cluster_network(&topo, 8940) {
            return;
        }
        let agent = Agent::start_ready(&topo);
        agent.expect_no_finding(mismatch_on(&topo.node_a, "wgc"), QUIET);
        let report = mtu_report(&topo);
        let v = verdict(&report, &topo.node_a, "wgc");
        assert_eq!(v["verdict"], "ok", "{v:#}");
        assert_eq!(v["underlay"], "cl0", "{v:#}");
        assert_eq!(v["underlay_source"], "route_to_wireguard_peer", "{v:#}");
        assert_eq!(v["family_assumed"], false, "{v:#}");
    }

    #[test]
    fn multi_nic_wireguard_above_the_route_to_its_peer_is_a_mismatch() {
        let topo = Topology::new();
        if !wireguard_to_the_cluster_network(&topo, 8960) {
            return;
        }
        let agent = Agent::start_ready(&topo);
        let f = agent.wait_finding(mismatch_on(&topo.node_a, "wgc"), FINDING_WITHIN);
        summary_contains(
            &f,
            "underlay cl0 9000 − WireGuard 60 = 8940, but wireguard wgc is 8960",
        );
        summary_contains(
            &f,
            "underlay cl0 is the route to 192.168.88.2, a WireGuard peer's endpoint",
        );
    }
}
