//! Issue 37, case 2: a path MTU node A learned but its overlay does not pass on. Node A
//! and node B are in different subnets behind a router whose link towards node B is
//! narrower (1400) than every device of node A (1500). With ICMP allowed, node A learns
//! the path MTU from the router's frag-needed (packet-too-big); the agent's MTU model
//! must then judge the VXLAN by that learned path MTU, not by its 1500 device.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test path_mtu -- --test-threads=1`.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use node_diag_testbed::routed::VXLAN6_IF;
use node_diag_testbed::{RoutedTopology, cmd};
use node_diag_tests::finding::{assert_shape_mtu, field, flow_is, mismatch_on};
use node_diag_tests::topology::{POD_IF, VXLAN_IF};
use node_diag_tests::{Agent, BULK, ServerMode, TcpServer, ok, tcp_request, unique_name};
use serde_json::Value;

/// The router's addresses on node A's subnet, the source of its frag-needed and
/// packet-too-big towards node A.
const ROUTER_A: &str = "192.168.78.254";
const ROUTER_A_V6: &str = "fd00:78::fe";

const WATCH_ICMP: &[&str] = &["--icmp-watch", "always"];

/// The MTU model is rebuilt every 10 s without a link change: a learned path MTU is seen
/// by the next rebuild.
const REFRESH: Duration = Duration::from_secs(15);

fn path_mtu_series(endpoint: IpAddr) -> String {
    format!(r#"node_diag_path_mtu_bytes{{endpoint="{endpoint}"}}"#)
}

fn is_mismatch(f: &Value) -> bool {
    field(f, "kind") == "overlay_mtu_mismatch"
}

/// Sends DF pings of `size` bytes from node A to `to` until node A's route cache shows a
/// learned path MTU for it, and returns it; panics when none is learned within 5 s.
fn learn(topo: &RoutedTopology, to: IpAddr, size: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let _ = ok(topo.ping_df(&topo.node_a, to, size));
        if let Some(mtu) = ok(topo.learned_mtu(&topo.node_a, to)) {
            return mtu;
        }
        assert!(
            Instant::now() < deadline,
            "node A learned no path MTU towards {to}"
        );
    }
}

#[test]
fn learned_path_mtu_below_the_overlays_need_is_an_overlay_mismatch() {
    let topo = ok(RoutedTopology::build(&unique_name()));
    ok(topo.narrow_towards_b(1400));
    // Watching ICMP from the start: nothing on node A is trouble before the router's
    // frag-needed, the one packet that names the hop.
    let agent = Agent::start_ready_in_with_args(&topo, WATCH_ICMP);
    let node_b = IpAddr::from(topo.node_b_underlay);
    // Nothing learned yet: every device of node A carries 1500.
    agent.expect_no_finding(is_mismatch, Duration::from_secs(1));

    // 1472 + 28 = 1500 bytes with DF: the router answers with frag-needed, mtu 1400.
    assert_eq!(learn(&topo, node_b, 1472), 1400);
    let f = agent.wait_finding(mismatch_on(&topo.node_a, VXLAN_IF), REFRESH);
    assert_shape_mtu(&f);
    let e = &f["evidence"];
    assert_eq!(e["underlay_source"], "learned_pmtu", "{f:#}");
    assert_eq!(e["underlay_endpoint"], node_b.to_string(), "{f:#}");
    assert_eq!(e["learned_pmtu"], 1400, "{f:#}");
    assert_eq!(e["underlay_mtu"], 1400, "{f:#}");
    assert_eq!(e["underlay_device_mtu"], 1500, "{f:#}");
    assert_eq!(e["underlay_found_by"], "bound", "{f:#}");
    assert_eq!(e["frag_needed_from"], ROUTER_A, "{f:#}");
    assert_eq!(e["expected_mtu"], 1350, "{f:#}");
    assert_eq!(e["actual_mtu"], 1450, "{f:#}");
    assert!(
        e["learned_pmtu_expires_secs"]
            .as_u64()
            .is_some_and(|s| s > 0),
        "{f:#}"
    );
    let summary = field(&f, "summary");
    assert!(
        summary.contains(&format!(
            "the route cache learned a path MTU of 1400 towards {node_b}"
        )) && summary.contains("− VXLAN 50 = 1350, but vxlan vx0 is 1450"),
        "{summary}"
    );
    assert!(
        field(&f, "remediation").contains(&format!("the hop towards {node_b}")),
        "{f:#}"
    );
    let series = path_mtu_series(node_b);
    assert_eq!(agent.wait_metric(&series, Duration::from_secs(2)), 1400.0);

    // The exception gone (what its expiry does, 10 minutes on): the finding resolves
    // and the series goes.
    ok(topo.flush_route_cache(&topo.node_a));
    let resolved = agent.wait_finding(
        |f| {
            is_mismatch(f)
                && f["interface"] == VXLAN_IF
                && f["evidence"]["netns_name"] == topo.node_a.as_str()
                && f["status"] == "resolved"
        },
        REFRESH,
    );
    assert!(resolved["resolved_at"].is_string(), "{resolved:#}");
    assert_eq!(agent.metric(&series), None, "{}", agent.metrics_text());
}

#[test]
fn a_path_mtu_of_1500_everywhere_learns_nothing_and_reports_no_mismatch() {
    let topo = ok(RoutedTopology::build(&unique_name()));
    let agent = Agent::start_ready_in(&topo);
    let node_b = IpAddr::from(topo.node_b_underlay);
    assert!(
        ok(topo.ping_df(&topo.node_a, node_b, 1472)),
        "1500-byte DF packets cross the router"
    );
    assert_eq!(ok(topo.learned_mtu(&topo.node_a, node_b)), None);
    // Across one rebuild of the model at least.
    agent.expect_no_finding(is_mismatch, Duration::from_secs(11));
    assert_eq!(
        agent.metric(&path_mtu_series(node_b)),
        None,
        "{}",
        agent.metrics_text()
    );
    ok(topo.flush_route_cache(&topo.node_a));
}

/// The same over IPv6: the router's packet-too-big towards node B's IPv6 address, and the
/// VXLAN over it, whose IPv6 headers cost 70 bytes.
#[test]
fn learned_ipv6_path_mtu_below_the_overlays_need_is_an_overlay_mismatch() {
    let topo = ok(RoutedTopology::build_with_ipv6(&unique_name()));
    ok(topo.narrow_towards_b(1400));
    let agent = Agent::start_ready_in_with_args(&topo, WATCH_ICMP);
    let node_b = IpAddr::from(topo.node_b_underlay_v6.expect("an IPv6 underlay"));
    // vx6 itself fits its 1500 underlay (1430); the pods, at 1450 for vx0, do not fit it
    // and are reported from the start, which is not what this test is about.
    agent.expect_no_finding(mismatch_on(&topo.node_a, VXLAN6_IF), Duration::from_secs(1));

    // 1452 + 48 = 1500 bytes.
    assert_eq!(learn(&topo, node_b, 1452), 1400);
    let f = agent.wait_finding(mismatch_on(&topo.node_a, VXLAN6_IF), REFRESH);
    assert_shape_mtu(&f);
    let e = &f["evidence"];
    assert_eq!(e["underlay_source"], "learned_pmtu", "{f:#}");
    assert_eq!(e["underlay_endpoint"], node_b.to_string(), "{f:#}");
    assert_eq!(e["learned_pmtu"], 1400, "{f:#}");
    assert_eq!(e["encapsulation"], "VXLAN/IPv6", "{f:#}");
    assert_eq!(e["frag_needed_from"], ROUTER_A_V6, "{f:#}");
    assert_eq!(e["expected_mtu"], 1330, "{f:#}");
    assert_eq!(
        agent.wait_metric(&path_mtu_series(node_b), Duration::from_secs(2)),
        1400.0
    );
    // The IPv4 path learned nothing: its VXLAN is fine.
    agent.expect_no_finding(mismatch_on(&topo.node_a, VXLAN_IF), Duration::from_secs(1));
    ok(topo.flush_route_cache(&topo.node_a));
}

/// Issue 37, case 4: the narrow hop with the router's frag-needed filtered, and pod A's
/// `tcp_mtu_probing=1` (Cilium sets it for its pods). The kernel detects the black hole
/// after a few RTOs and shrinks the MSS: the transfer completes seconds late, with
/// nothing on the path saying why. That is a black hole, recovered: a warning that names
/// the probing, the MSS before and after and the seconds lost, resolved as the flow
/// moves; never the critical gauge.
#[test]
fn a_black_hole_masked_by_mtu_probing_is_reported_recovered() {
    let topo = ok(RoutedTopology::build(&unique_name()));
    ok(topo.narrow_towards_b(1400));
    ok(topo.drop_router_frag_needed());
    ok(topo.sysctl(&topo.pod_a, "net.ipv4.tcp_mtu_probing=1"));
    // The echo back crosses the same hop: node B's full-size packets that are not GSO
    // meet the router's 1400 end of the veth and vanish (a veth checks its peer's MTU
    // only on those). Where TCP sends them unbatched (an emulated guest), pod B's echo
    // stalls in that second black hole, which only its own MTU probing gets out of.
    ok(topo.sysctl(&topo.pod_b, "net.ipv4.tcp_mtu_probing=1"));
    let agent = Agent::start_ready_in(&topo);
    let port = 9021;
    let addr = SocketAddr::new(topo.pod_b_ip.into(), port);
    let _server = TcpServer::start(&topo.pod_b, addr, ServerMode::Echo);
    let reply = tcp_request(
        &topo.pod_a,
        addr,
        &vec![0x5a; BULK],
        Duration::from_secs(30),
    )
    .expect("MTU probing gets the transfer through");
    assert_eq!(reply.len(), BULK);

    let on_flow = |f: &Value| {
        field(f, "kind") == "pmtud_blackhole" && flow_is(f, topo.pod_a_ip, topo.pod_b_ip, port)
    };
    // 1450 − 20 of IPv4 − 20 of TCP − 12 of timestamps.
    agent.assert_recovered_then_resolved(on_flow, 1398);
    ok(topo.flush_route_cache(&topo.node_a));
}

/// The look-alike of a masked black hole: MTU probing off in pod A, its transfer stalled
/// on the filtered 1400 hop, and pod A's route MTU lowered by hand (1300) mid-stall. The
/// kernel sends the stalled segment again smaller, as MTU probing would, and the
/// transfer completes; but the route's MTU made it smaller, not the sender's probing:
/// no `recovered_by: tcp_mtu_probing`.
#[test]
fn a_route_mtu_lowered_mid_stall_is_not_mtu_probing() {
    let topo = ok(RoutedTopology::build(&unique_name()));
    ok(topo.narrow_towards_b(1400));
    ok(topo.drop_router_frag_needed());
    ok(topo.sysctl(&topo.pod_a, "net.ipv4.tcp_mtu_probing=0"));
    let agent = Agent::start_ready_in(&topo);
    let port = 9023;
    let addr = SocketAddr::new(topo.pod_b_ip.into(), port);
    let _server = TcpServer::start(&topo.pod_b, addr, ServerMode::Echo);
    let pod_a = topo.pod_a.clone();
    let transfer = std::thread::spawn(move || {
        tcp_request(&pod_a, addr, &vec![0x5a; BULK], Duration::from_secs(40))
    });
    let on_flow = |f: &Value| flow_is(f, topo.pod_a_ip, topo.pod_b_ip, port);
    // Stalled: reported as a stall, or as the black hole the path probe finds.
    agent.wait_finding(
        |f| on_flow(f) && matches!(field(f, "kind"), "tcp_stall" | "pmtud_blackhole"),
        Duration::from_secs(15),
    );
    // Both pods, as one lowers an MTU by hand: the echo back crosses the same hop, and
    // node B's full-size packets that are not GSO vanish at the router's 1400 end of
    // the veth (see the test above).
    for pod in [&topo.pod_a, &topo.pod_b] {
        cmd::run_in(
            pod,
            &[
                "ip",
                "route",
                "change",
                "default",
                "via",
                "169.254.1.1",
                "dev",
                POD_IF,
                "onlink",
                "mtu",
                "1300",
            ],
        )
        .expect("lower the pods' route MTU");
    }
    let reply = transfer
        .join()
        .expect("transfer thread")
        .expect("the smaller segments cross the 1400 hop");
    assert_eq!(reply.len(), BULK);
    agent.expect_no_finding(
        |f| on_flow(f) && f["evidence"]["recovered_by"] == "tcp_mtu_probing",
        Duration::from_secs(3),
    );
    // The shrink was seen, and judged.
    let diag = agent.diagnostics();
    assert!(diag.contains("not by MTU probing"), "{diag}");
    ok(topo.flush_route_cache(&topo.node_a));
}

/// Probing on, a clean path: nothing stalls, nothing is reported.
#[test]
fn mtu_probing_on_a_clean_path_reports_nothing() {
    let topo = ok(RoutedTopology::build(&unique_name()));
    ok(topo.sysctl(&topo.pod_a, "net.ipv4.tcp_mtu_probing=1"));
    let agent = Agent::start_ready_in(&topo);
    let port = 9022;
    let addr = SocketAddr::new(topo.pod_b_ip.into(), port);
    let _server = TcpServer::start(&topo.pod_b, addr, ServerMode::Echo);
    let reply = tcp_request(
        &topo.pod_a,
        addr,
        &vec![0x5a; BULK],
        Duration::from_secs(10),
    )
    .expect("a clean transfer");
    assert_eq!(reply.len(), BULK);
    agent.expect_no_finding(
        |f| matches!(field(f, "kind"), "pmtud_blackhole" | "tcp_stall"),
        Duration::from_secs(3),
    );
}
