//! Drops on this node that the kernel names vaguely or not at all, each mapped to the
//! layer that made them: a Calico-style `blackhole` route for a pod CIDR block
//! (`NOT_SPECIFIED`, resolved from the route towards the destination), and a
//! flannel-style VXLAN without the FDB entry for its peer (`NO_TX_TARGET`; before 6.12
//! `NOT_SPECIFIED`, resolved from the tunnel's FDB). The real agent in node A, the
//! faults in node A, connects from pod A that the application abandons.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test local_drops -- --test-threads=1`.

/// One module, so that the name filter `local_drops` selects these tests and no other
/// binary's.
mod local_drops {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;

    use node_diag_testbed::cni::{self as shapes, FLANNEL_IF};
    use node_diag_tests::finding::{assert_shape, field, flow_is};
    use node_diag_tests::{
        Agent, ConnectOutcome, ServerMode, TcpServer, Topology, cmd, ok, tcp_connect,
    };
    use serde_json::Value;

    const TIMEOUT: &str = r#"node_diag_tcp_connect_failures_total{reason="timeout"}"#;
    /// How long the client waits before it gives up: one SYN retransmit.
    const ABANDON_AFTER: Duration = Duration::from_millis(1500);

    /// Pod A connects to `dst`:`port` and gives up after [`ABANDON_AFTER`]; returns the
    /// `tcp_timeout` finding on that flow, checked for the contract's shape and `layer`,
    /// once the timeout counter has counted it. The summary must not send the SRE beyond
    /// this node: this node dropped the SYNs.
    #[track_caller]
    fn timeout_here(
        topo: &Topology,
        agent: &Agent,
        dst: Ipv4Addr,
        port: u16,
        layer: &str,
    ) -> Value {
        let before = agent.counter(TIMEOUT);
        let outcome = tcp_connect(&topo.pod_a, SocketAddr::from((dst, port)), ABANDON_AFTER);
        assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
        let f = agent.wait_finding(
            |f| field(f, "kind") == "tcp_timeout" && flow_is(f, topo.pod_a_ip, dst, port),
            Duration::from_secs(3),
        );
        assert_shape(&f);
        assert_eq!(field(&f, "layer"), layer, "layer of {f:#}");
        assert!(
            !field(&f, "summary").contains("left this node"),
            "this node dropped them: {f:#}"
        );
        agent.wait_counter_at_least(TIMEOUT, before + 1.0, Duration::from_secs(3));
        f
    }

    /// Whether this kernel's `skb:kfree_skb` carries a drop reason (its tracefs format),
    /// as the agent probes it. The agent mounts tracefs in its own mount namespace (`ip
    /// netns exec` gives it one), so where the host has none mounted this mounts one for
    /// the read and unmounts it after.
    fn kfree_skb_has_reasons() -> bool {
        const TRACEFS: &str = "/sys/kernel/tracing";
        let format = format!("{TRACEFS}/events/skb/kfree_skb/format");
        let mounted_here = !std::path::Path::new(TRACEFS).join("events").exists();
        if mounted_here {
            cmd::run(&["mount", "-t", "tracefs", "nodev", TRACEFS]);
        }
        let read = std::fs::read_to_string(&format);
        if mounted_here {
            cmd::run(&["umount", TRACEFS]);
        }
        read.expect("kfree_skb's tracefs format")
            .contains("reason;")
    }

    /// Calico routes each IPAM block it holds as a blackhole, so a deleted pod's address
    /// is dropped on its node: the kernel's reason is `NOT_SPECIFIED`, and the route
    /// towards the destination names the layer.
    #[test]
    fn blackhole_route_for_a_pod_block_is_cni_routing() {
        let topo = Topology::new();
        ok(shapes::ipam_block_blackhole(&topo, "10.244.2.0/26"));
        let agent = Agent::start_ready(&topo);
        let deleted_pod = Ipv4Addr::new(10, 244, 2, 20);

        let f = timeout_here(&topo, &agent, deleted_pod, 9301, "cni_routing");
        let e = &f["evidence"];
        assert_eq!(e["route"], "blackhole 10.244.2.0/26", "{f:#}");
        assert_eq!(e["route_type"], "blackhole", "{f:#}");
        // Where `kfree_skb` names no reason (before 5.17) the agent reads the drop by the
        // function that dropped, `ip_error`, which serves unreachable routes too: the
        // coarser reason. The layer and the route are the same.
        let reason = if kfree_skb_has_reasons() {
            "NOT_SPECIFIED"
        } else {
            "IP_INADDRERRORS"
        };
        assert_eq!(e["drop_reason"], reason, "{f:#}");
        assert!(
            field(&f, "summary").contains("blackhole 10.244.2.0/26"),
            "{f:#}"
        );
    }

    /// An `unreachable` or `prohibit` route for a pod block: node A answers the SYN with
    /// an ICMP host unreachable (`IP_INADDRERRORS`) or administratively prohibited (no
    /// reason named), and the client fails at once. Routing in both cases, with the route
    /// in evidence: a `prohibit` route's ICMP says prohibited, yet no filter sent it.
    fn discarding_route_is_cni_routing(kind: &str, port: u16) {
        let topo = Topology::new();
        ok(shapes::discarding_route(&topo, kind, "10.244.2.0/26"));
        let agent = Agent::start_ready(&topo);
        let deleted_pod = Ipv4Addr::new(10, 244, 2, 21);

        let outcome = tcp_connect(
            &topo.pod_a,
            SocketAddr::from((deleted_pod, port)),
            ABANDON_AFTER,
        );
        assert!(outcome.is_icmp_failure(), "{kind}: {outcome:?}");
        let f = agent.wait_finding(
            |f| {
                field(f, "kind") == "tcp_unreachable"
                    && flow_is(f, topo.pod_a_ip, deleted_pod, port)
            },
            Duration::from_secs(3),
        );
        assert_shape(&f);
        assert_eq!(field(&f, "layer"), "cni_routing", "{f:#}");
        let route = format!("{kind} 10.244.2.0/26");
        assert_eq!(f["evidence"]["route"], route.as_str(), "{f:#}");
        assert_eq!(f["evidence"]["route_type"], kind, "{f:#}");
    }

    #[test]
    fn unreachable_route_for_a_pod_block_is_cni_routing() {
        discarding_route_is_cni_routing("unreachable", 9303);
    }

    #[test]
    fn prohibit_route_for_a_pod_block_is_cni_routing_not_a_firewall() {
        discarding_route_is_cni_routing("prohibit", 9304);
    }

    /// flannel's VXLAN backend sends each peer's VTEP MAC to its node by one FDB entry;
    /// without node B's, the VXLAN device drops the SYN (`NO_TX_TARGET` since 6.12). The
    /// finding names the tunnel and the missing entry.
    #[test]
    fn vxlan_without_the_peers_fdb_entry_is_cni_routing() {
        let topo = Topology::new();
        ok(shapes::flannel_vxlan(&topo));
        ok(shapes::delete_peer_fdb_entry(&topo, FLANNEL_IF));
        let port = 9302;
        let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
        let agent = Agent::start_ready(&topo);

        let f = timeout_here(&topo, &agent, topo.pod_b_ip, port, "cni_routing");
        let e = &f["evidence"];
        assert_eq!(e["tunnel"], FLANNEL_IF, "{f:#}");
        let entry = format!("{} for 10.244.2.0", shapes::node_b_vtep_mac());
        assert_eq!(e["missing_fdb_entry"], entry.as_str(), "{f:#}");
        assert_eq!(e["drop_interface"], FLANNEL_IF, "{f:#}");
        assert!(
            matches!(field(e, "drop_reason"), "NO_TX_TARGET" | "NOT_SPECIFIED"),
            "{f:#}"
        );
        assert!(field(&f, "summary").contains(FLANNEL_IF), "{f:#}");
    }
}
