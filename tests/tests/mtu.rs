//! MTU and PMTUD scenarios: the real agent in node A, pod A's MTU set above the overlay's,
//! bulk TCP from pod A to pod B, and assertions on the MTU/PMTUD findings and metrics.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test mtu -- --test-threads=1`.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use node_diag_tests::finding::{assert_shape, assert_shape_mtu, field, flow_is, mismatch_on};
use node_diag_tests::topology::{POD_HOST_IF, POD_IF, VXLAN_IF};
use node_diag_tests::{
    Agent, BULK, ServerMode, TcpServer, Topology, bulk_to_pod_b, cmd, tcp_request,
};
use serde_json::Value;

use node_diag_tests::agent::BLACKHOLES;
const FRAG_SENT: &str = r#"node_diag_icmp_frag_needed_total{direction="sent"}"#;
const FRAG_DROPPED: &str = r#"node_diag_icmp_frag_needed_total{direction="dropped"}"#;
const FRAG_RECEIVED: &str = r#"node_diag_icmp_frag_needed_total{direction="received"}"#;
const OVERSIZE_VX0: &str = r#"node_diag_df_oversize_drops_total{interface="vx0"}"#;

/// Sends `BULK` bytes from pod A to pod B's echo server on a background thread.
fn bulk_in_background(
    topo: &Topology,
    port: u16,
    timeout: Duration,
) -> thread::JoinHandle<std::io::Result<Vec<u8>>> {
    let (ns, addr) = (topo.pod_a.clone(), topo.pod_b_addr(port));
    thread::spawn(move || tcp_request(&ns, addr, &vec![0x5a; BULK], timeout))
}

fn kind_on_flow<'a>(kind: &'a str, topo: &'a Topology, dport: u16) -> impl Fn(&Value) -> bool + 'a {
    move |f| field(f, "kind") == kind && flow_is(f, topo.pod_a_ip, topo.pod_b_ip, dport)
}

fn is_mtu_kind(f: &Value) -> bool {
    matches!(
        field(f, "kind"),
        "overlay_mtu_mismatch" | "df_oversize_drop" | "pmtud_blackhole" | "pmtud_disabled"
    )
}

#[test]
fn correct_mtus_make_no_mtu_finding() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9001), ServerMode::Echo);
    let reply = bulk_to_pod_b(&topo, 9001, 1, Duration::from_secs(10))
        .expect("bulk transfer over a correctly sized overlay");
    assert_eq!(reply.len(), BULK);
    agent.expect_no_finding(is_mtu_kind, Duration::from_secs(3));
    assert_eq!(
        agent.metric(BLACKHOLES),
        Some(0.0),
        "{}",
        agent.diagnostics()
    );
    assert_eq!(agent.counter(OVERSIZE_VX0), 0.0);
}

/// Loss recovery under load retransmits full-size segments too; it is no black hole.
#[test]
fn saturating_traffic_is_no_black_hole() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let mut server = Command::new("ip")
        .args([
            "netns",
            "exec",
            &topo.pod_b,
            "iperf3",
            "-s",
            "-1",
            "-p",
            "5299",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 server (install iperf3)");
    let pod_b = topo.pod_b_ip.to_string();
    // Give the server a moment to listen; the client retries its connect anyway.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ran = false;
    while Instant::now() < deadline && !ran {
        ran = cmd::try_run_in(
            &topo.pod_a,
            &["iperf3", "-c", &pod_b, "-p", "5299", "-t", "6", "-P", "4"],
        )
        .status
        .success();
    }
    let _ = server.kill();
    let _ = server.wait();
    assert!(ran, "iperf3 pod A -> pod B did not run");
    agent.expect_no_finding(is_mtu_kind, Duration::from_secs(2));
    assert_eq!(
        agent.metric(BLACKHOLES),
        Some(0.0),
        "{}",
        agent.diagnostics()
    );
}

#[test]
fn oversized_pod_mtu_with_icmp_allowed_is_an_oversize_drop_that_recovers() {
    let topo = Topology::new();
    topo.set_pod_mtu(1500);
    let agent = Agent::start_ready(&topo);
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9002), ServerMode::Echo);

    let reply = bulk_to_pod_b(&topo, 9002, 2, Duration::from_secs(10))
        .expect("PMTUD works when frag-needed gets back: the transfer completes");
    assert_eq!(reply.len(), BULK);

    let f = agent.wait_finding(
        kind_on_flow("df_oversize_drop", &topo, 9002),
        Duration::from_secs(3),
    );
    assert_shape(&f);
    assert_eq!(field(&f, "layer"), "overlay_mtu");
    assert_eq!(f["interface"], "vx0", "{f:#}");
    assert_eq!(f["evidence"]["egress_mtu"], 1450, "{f:#}");
    assert!(
        f["evidence"]["packet_len"].as_u64().unwrap() > 1450,
        "{f:#}"
    );
    // Frag-needed went back to pod A, so PMTUD recovered the flow: informational.
    assert_eq!(field(&f, "severity"), "info", "{f:#}");
    assert!(
        f["evidence"]["frag_needed_sent"].as_u64().unwrap() >= 1,
        "{f:#}"
    );
    agent.wait_counter_at_least(OVERSIZE_VX0, 1.0, Duration::from_secs(2));
    agent.wait_counter_at_least(FRAG_SENT, 1.0, Duration::from_secs(2));
    agent.expect_no_finding(
        |f| field(f, "kind") == "pmtud_blackhole",
        Duration::from_secs(2),
    );

    // The same misconfiguration, from netlink alone.
    let m = agent.wait_finding(mismatch_on(&topo.pod_a, POD_IF), Duration::from_secs(2));
    assert_shape_mtu(&m);
    assert!(
        field(&m, "summary").contains("1500 − VXLAN 50 = 1450"),
        "{m:#}"
    );
    let headroom = format!(
        r#"node_diag_overlay_mtu_headroom_bytes{{interface="{POD_IF}",netns="{}"}}"#,
        topo.pod_a
    );
    assert_eq!(
        agent.metric(&headroom),
        Some(-50.0),
        "{}",
        agent.metrics_text()
    );
}

#[test]
fn unbound_vxlan_above_its_underlay_is_an_overlay_mismatch() {
    let topo = Topology::new();
    // Not bound to a device, so the kernel does not derive its MTU: forced to 1500.
    cmd::run(&[
        "ip",
        "-n",
        &topo.node_a,
        "link",
        "add",
        "vx9",
        "type",
        "vxlan",
        "id",
        "99",
        "local",
        "192.168.77.1",
        "remote",
        "192.168.77.2",
        "dstport",
        "4799",
    ]);
    cmd::run(&[
        "ip",
        "-n",
        &topo.node_a,
        "link",
        "set",
        "vx9",
        "mtu",
        "1500",
        "up",
    ]);
    let agent = Agent::start_ready(&topo);
    let f = agent.wait_finding(mismatch_on(&topo.node_a, "vx9"), Duration::from_secs(3));
    assert_shape_mtu(&f);
    let summary = field(&f, "summary");
    assert!(summary.contains("1500 − VXLAN 50 = 1450"), "{summary}");
    assert!(summary.contains("ul0"), "the underlay is named: {summary}");
    assert_eq!(f["evidence"]["expected_mtu"], 1450, "{f:#}");
    assert_eq!(f["evidence"]["actual_mtu"], 1500, "{f:#}");
    assert!(field(&f, "remediation").contains("1450"), "{f:#}");
    let headroom = format!(
        r#"node_diag_overlay_mtu_headroom_bytes{{interface="vx9",netns="{}"}}"#,
        topo.node_a
    );
    assert_eq!(
        agent.metric(&headroom),
        Some(-50.0),
        "{}",
        agent.metrics_text()
    );
    // The bound overlay is fine.
    agent.expect_no_finding(mismatch_on(&topo.node_a, "vx0"), Duration::from_secs(1));
}

#[test]
fn mtu_change_while_running_appears_then_clears() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    agent.expect_no_finding(is_mtu_kind, Duration::from_secs(1));
    let headroom = format!(
        r#"node_diag_overlay_mtu_headroom_bytes{{interface="{POD_HOST_IF}",netns="{}"}}"#,
        topo.node_a
    );
    assert_eq!(
        agent.metric(&headroom),
        Some(0.0),
        "{}",
        agent.metrics_text()
    );

    topo.set_pod_mtu(1500);
    let f = agent.wait_finding(
        mismatch_on(&topo.node_a, POD_HOST_IF),
        Duration::from_secs(12),
    );
    assert_shape_mtu(&f);
    assert_eq!(
        agent.metric(&headroom),
        Some(-50.0),
        "{}",
        agent.metrics_text()
    );

    topo.set_pod_mtu(1450);
    let resolved = agent.wait_finding(
        |f| {
            field(f, "kind") == "overlay_mtu_mismatch"
                && f["interface"] == POD_HOST_IF
                && f["status"] == "resolved"
        },
        Duration::from_secs(12),
    );
    assert!(resolved["resolved_at"].is_string(), "{resolved:#}");
    assert_eq!(
        agent.metric(&headroom),
        Some(0.0),
        "{}",
        agent.metrics_text()
    );
}

#[test]
fn filtered_frag_needed_is_a_pmtud_black_hole() {
    let topo = Topology::new();
    topo.set_pod_mtu(1500);
    topo.drop_frag_needed(&topo.node_a);
    let agent = Agent::start_ready(&topo);
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9003), ServerMode::Echo);

    let start = Instant::now();
    let client = bulk_in_background(&topo, 9003, Duration::from_secs(8));
    let f = agent.wait_finding(
        kind_on_flow("pmtud_blackhole", &topo, 9003),
        Duration::from_secs(5),
    );
    assert!(
        start.elapsed() <= Duration::from_secs(5),
        "reported after {:?}",
        start.elapsed()
    );
    assert_shape(&f);
    assert_eq!(field(&f, "layer"), "icmp_filtered");
    assert_eq!(field(&f, "severity"), "critical");
    assert_eq!(f["evidence"]["netfilter_hook"], "output", "{f:#}");
    assert!(
        f["evidence"]["frag_needed_dropped"].as_u64().unwrap() >= 1,
        "{f:#}"
    );
    assert!(
        f["evidence"]["fullsize_retransmits"].as_u64().unwrap() >= 3,
        "{f:#}"
    );
    assert!(field(&f, "remediation").contains("tcp_mtu_probing=1"));
    agent.wait_counter_at_least(BLACKHOLES, 1.0, Duration::from_secs(2));
    agent.wait_counter_at_least(FRAG_DROPPED, 1.0, Duration::from_secs(2));

    // The transfer hangs: small requests work, large transfers do not.
    let outcome = client.join().expect("client thread");
    assert!(
        outcome.as_ref().map_or(true, |r| r.len() < BULK),
        "transfer completed: {outcome:?}"
    );
}

/// A smaller hop beyond this node: node B's veth to pod B at 1400, so node B answers pod
/// A's 1450-byte segments with frag-needed, which crosses node A's overlay on its way back
/// (the TC ingress classifier sees it there).
#[test]
fn frag_needed_from_beyond_this_node_is_counted_as_received() {
    let topo = Topology::new();
    node_diag_tests::narrow_node_b_pod_link(&topo, 1400);
    // PMTUD works here, so nothing is trouble: watched from the start.
    let agent = Agent::start_ready_watching_icmp(&topo);
    let before = agent.counter(FRAG_RECEIVED);
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9004), ServerMode::Echo);
    let reply = bulk_to_pod_b(&topo, 9004, 4, Duration::from_secs(10))
        .expect("PMTUD recovers: the transfer completes");
    assert_eq!(reply.len(), BULK);
    agent.wait_counter_at_least(FRAG_RECEIVED, before + 1.0, Duration::from_secs(3));
    // Node B's drop is not this node's: no oversize finding here.
    agent.expect_no_finding(
        |f| field(f, "kind") == "df_oversize_drop",
        Duration::from_secs(1),
    );
}

/// Pod A's traffic masqueraded by node A (out of the overlay, as a CNI masquerades traffic
/// leaving the cluster network), a smaller hop beyond: node B's frag-needed comes back
/// addressed to node A, whose conntrack translates it to pod A's flow. Delivered, PMTUD
/// recovers the transfer; filtered by node A's FORWARD chain after that translation, it
/// is pod A's black hole, with the drop as its evidence.
fn masqueraded_flow_with_frag_needed(filtered: bool) {
    let topo = Topology::new();
    node_diag_tests::narrow_node_b_pod_link(&topo, 1400);
    topo.masquerade(&topo.node_a, VXLAN_IF);
    // Node B answers node A's overlay address, which the masquerade puts on the packets.
    let overlay = format!("{}/32", topo.node_a_overlay);
    cmd::run(&[
        "ip",
        "-n",
        &topo.node_b,
        "route",
        "add",
        &overlay,
        "dev",
        VXLAN_IF,
    ]);
    if filtered {
        topo.drop_forwarded_frag_needed(&topo.node_a);
    }
    // Recovering, the flow shows no trouble, so its frag-needed is seen only when ICMP is
    // watched from the start; filtered, the trouble switches the watch on by itself.
    let agent = if filtered {
        Agent::start_ready(&topo)
    } else {
        Agent::start_ready_watching_icmp(&topo)
    };
    let received = agent.counter(FRAG_RECEIVED);
    let port = 9006;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);

    if !filtered {
        let reply = bulk_to_pod_b(&topo, port, 6, Duration::from_secs(10))
            .expect("PMTUD recovers through the masquerade");
        assert_eq!(reply.len(), BULK);
        agent.wait_counter_at_least(FRAG_RECEIVED, received + 1.0, Duration::from_secs(3));
        agent.expect_no_finding(is_mtu_kind, Duration::from_secs(1));
        assert_eq!(agent.counter(BLACKHOLES), 0.0);
        return;
    }
    let client = bulk_in_background(&topo, port, Duration::from_secs(8));
    let f = agent.wait_finding(
        kind_on_flow("pmtud_blackhole", &topo, port),
        node_diag_tests::agent::scaled(Duration::from_secs(6)),
    );
    assert_shape(&f);
    assert_eq!(field(&f, "layer"), "icmp_filtered", "{f:#}");
    assert_eq!(f["evidence"]["netfilter_hook"], "forward", "{f:#}");
    assert!(
        f["evidence"]["frag_needed_dropped"].as_u64().unwrap() >= 1,
        "the drop, seen after node A translated the error to pod A's flow: {f:#}"
    );
    agent.wait_counter_at_least(BLACKHOLES, 1.0, Duration::from_secs(2));
    agent.wait_counter_at_least(FRAG_RECEIVED, received + 1.0, Duration::from_secs(2));
    let outcome = client.join().expect("client thread");
    assert!(
        outcome.as_ref().map_or(true, |r| r.len() < BULK),
        "transfer completed: {outcome:?}"
    );
}

#[test]
fn masqueraded_flow_recovers_with_frag_needed() {
    masqueraded_flow_with_frag_needed(false);
}

#[test]
fn masqueraded_flow_with_frag_needed_filtered_is_a_black_hole() {
    masqueraded_flow_with_frag_needed(true);
}

/// The filtered-frag-needed black hole of [`filtered_frag_needed_is_a_pmtud_black_hole`],
/// with its client holding the stuck flow for `hold`.
fn black_hole_held(
    topo: &Topology,
    port: u16,
    hold: Duration,
) -> thread::JoinHandle<std::io::Result<Vec<u8>>> {
    topo.set_pod_mtu(1500);
    topo.drop_frag_needed(&topo.node_a);
    bulk_in_background(topo, port, hold)
}

/// A stuck flow backs off to tens of seconds between retransmits: its black hole stays
/// open, and the gauge at 1, for as long as the socket waits, not for as long as
/// retransmits come often.
#[test]
fn a_black_hole_stays_open_while_its_flow_is_stuck() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9011;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    let client = black_hole_held(&topo, port, Duration::from_secs(80));
    agent.wait_finding(
        kind_on_flow("pmtud_blackhole", &topo, port),
        Duration::from_secs(5),
    );
    // The gauge follows on the agent's next 500 ms tick.
    agent.wait_counter_at_least(BLACKHOLES, 1.0, Duration::from_secs(2));
    agent.assert_held(
        BLACKHOLES,
        Duration::from_secs(60),
        kind_on_flow("pmtud_blackhole", &topo, port),
    );
    // The client gives up on its own timeout, in the background: waiting for it here
    // would only lengthen the test (several times over in an emulated guest).
    drop(client);
}

/// An agent (re)started 14 s into a black hole, the flow's retransmits backed off to
/// tens of seconds: the next retransmit is enough to report it.
#[test]
fn an_agent_started_during_a_black_hole_reports_it_at_the_next_retransmit() {
    let topo = Topology::new();
    let port = 9012;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    let client = black_hole_held(&topo, port, Duration::from_secs(70));
    thread::sleep(Duration::from_secs(14));
    let agent = Agent::start_ready(&topo);
    agent.assert_black_hole_found_mid_stall(kind_on_flow("pmtud_blackhole", &topo, port));
    // As above: the client ends on its own timeout.
    drop(client);
}

/// PMTUD worked for the flow (node A's frag-needed reached pod A, its MSS shrank), then
/// the peer went silent: a stall of the shrunk segments is the peer's, not a black hole,
/// although a frag-needed for the flow is recent.
#[test]
fn a_stall_after_pmtud_worked_is_no_black_hole() {
    use std::io::{Read as _, Write as _};

    let topo = Topology::new();
    topo.set_pod_mtu(1500);
    let agent = Agent::start_ready(&topo);
    let port = 9013;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    let addr = topo.pod_b_addr(port);
    let mut stream = node_diag_tests::in_netns(&topo.pod_a, || {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
    })
    .expect("connect to pod B");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // Sent and echoed whole: the first full-size segments drew node A's frag-needed and
    // were sent again smaller.
    let chunk = vec![0x5au8; 64 * 1024];
    stream.write_all(&chunk).unwrap();
    let mut echoed = vec![0u8; chunk.len()];
    stream
        .read_exact(&mut echoed)
        .expect("PMTUD recovers the transfer");
    agent.wait_counter_at_least(FRAG_SENT, 1.0, Duration::from_secs(3));

    // Then pod B goes silent for this flow.
    topo.drop_forwarded_tcp(&topo.node_b, port);
    stream.write_all(&chunk).unwrap();
    let f = agent.wait_finding(
        kind_on_flow("tcp_stall", &topo, port),
        Duration::from_secs(10),
    );
    assert_eq!(field(&f, "layer"), "unknown", "{f:#}");
    assert!(
        field(&f, "summary").contains("PMTUD already worked"),
        "{f:#}"
    );
    agent.expect_no_finding(
        kind_on_flow("pmtud_blackhole", &topo, port),
        Duration::from_secs(4),
    );
    assert_eq!(agent.metric(BLACKHOLES), Some(0.0));
}
