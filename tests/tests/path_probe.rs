//! Trouble beyond the node, which only probing the path shows: the real agent in node A,
//! a fault on node B that node A's kernel cannot see, and the agent's own DF echo probes
//! of the path turning a `tcp_stall` or a `tcp_timeout` into what it is.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test path_probe -- --test-threads=1`.

use std::io::Write as _;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use node_diag_tests::agent::scaled;
use node_diag_tests::finding::{assert_shape, field, flow_is};
use node_diag_tests::topology::{POD_IF, UNDERLAY_IF, VXLAN_IF, VXLAN_PORT};
use node_diag_tests::{
    Agent, BULK, ConnectOutcome, ServerMode, TcpServer, Topology, cmd, in_netns, tcp_connect,
    tcp_request,
};
use serde_json::Value;

const BLACKHOLES: &str = "node_diag_pmtud_blackholes";

fn on_flow<'a>(
    kind: &'a str,
    layer: &'a str,
    topo: &'a Topology,
    dport: u16,
) -> impl Fn(&Value) -> bool + 'a {
    move |f| {
        field(f, "kind") == kind
            && field(f, "layer") == layer
            && flow_is(f, topo.pod_a_ip, topo.pod_b_ip, dport)
    }
}

fn num(f: &Value, key: &str) -> u64 {
    f["evidence"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("evidence {key}: {f:#}"))
}

/// Makes node B's underlay link 1400 under node A's 1500, the black hole beyond node A
/// the tests below probe; `mtu` 1500 heals it.
fn node_b_underlay_mtu(topo: &Topology, mtu: &str) {
    cmd::run(&[
        "ip",
        "-n",
        &topo.node_b,
        "link",
        "set",
        UNDERLAY_IF,
        "mtu",
        mtu,
    ]);
}

/// The black hole beyond node A (see the test below), set up.
fn black_hole_beyond_node_a(topo: &Topology) {
    node_b_underlay_mtu(topo, "1400");
    // A veth checks its peer's MTU only on packets that are not GSO: node A's tunnel
    // GSO bursts (pod A's TSO, encapsulated whole) would cross intact and the transfer
    // would succeed. A NIC segments before the wire; one segment per skb on node A's
    // underlay makes the veth do the same, so every full-size packet meets the limit.
    cmd::run(&[
        "ip",
        "-n",
        &topo.node_a,
        "link",
        "set",
        UNDERLAY_IF,
        "gso_max_segs",
        "1",
    ]);
    // CNIs take a node's tunnel address from its pod CIDR (Flannel's flannel.1 is
    // 10.244.X.0/32), so peers route it back through the tunnel; this topology's
    // 10.200.0.x are routed nowhere, and node B could not answer the agent's probes,
    // which leave node A from that address.
    for (node, peer) in [
        (&topo.node_a, topo.node_b_overlay),
        (&topo.node_b, topo.node_a_overlay),
    ] {
        cmd::run(&[
            "ip",
            "-n",
            node,
            "route",
            "add",
            &format!("{peer}/32"),
            "dev",
            VXLAN_IF,
        ]);
    }
}

/// Node B's underlay link is 1400 while node A's is 1500: node A's full-size VXLAN
/// packets (1500 bytes) are dropped as they arrive at node B, without any ICMP, as a
/// router with a smaller link and its frag-needed filtered would. Small packets pass.
/// Node A sees nothing of it: only the path probe can tell this from a dead peer.
#[test]
fn black_hole_beyond_the_node_is_found_by_probing_the_path() {
    let topo = Topology::new();
    black_hole_beyond_node_a(&topo);
    let agent = Agent::start_ready(&topo);
    let port = 9301;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    assert!(
        topo.ping_until(&topo.pod_a, topo.pod_b_ip, Duration::from_secs(3)),
        "small packets must still cross"
    );

    let started = Instant::now();
    let (ns, addr) = (topo.pod_a.clone(), topo.pod_b_addr(port));
    let transfer =
        thread::spawn(move || tcp_request(&ns, addr, &vec![0x5a; BULK], Duration::from_secs(25)));

    // The first stalled retransmit comes within the first RTO of the transfer.
    let f = agent.wait_finding(
        on_flow("pmtud_blackhole", "path", &topo, port),
        scaled(Duration::from_secs(15)),
    );
    let took = started.elapsed();
    assert_shape(&f);
    assert_eq!(field(&f, "severity"), "critical", "{f:#}");
    assert_eq!(f["evidence"]["path_probe"], "blackhole", "{f:#}");
    assert_eq!(
        f["evidence"]["path_probe_target"],
        topo.pod_b_ip.to_string()
    );
    let (ok, lost) = (
        num(&f, "path_probe_largest_ok"),
        num(&f, "path_probe_smallest_lost"),
    );
    // 1400 on node B's link - 50 of VXLAN = 1350 for the inner packet, plus the 4 bytes
    // of a VLAN tag a veth lets through above its MTU: 1354 (1404 on the underlay).
    assert!(ok <= 1354 && lost > 1354 && lost - ok <= 16, "{f:#}");
    assert!(num(&f, "path_probe_packets") <= 20, "{f:#}");
    assert_eq!(
        f["evidence"]["underlay_probe_target"],
        topo.node_b_underlay.to_string(),
        "{f:#}"
    );
    assert!(num(&f, "underlay_probe_largest_ok") <= 1404, "{f:#}");
    assert!(took < scaled(Duration::from_secs(15)), "took {took:?}");
    // The stall it replaces is withdrawn.
    let served = agent.findings_endpoint();
    assert!(
        !served
            .iter()
            .any(|s| on_flow("tcp_stall", "unknown", &topo, port)(s)
                && field(s, "status") == "active"),
        "an active stall remains beside the black hole: {served:#?}"
    );
    assert!(
        served
            .iter()
            .any(|s| on_flow("pmtud_blackhole", "path", &topo, port)(s)
                && field(s, "status") == "active"),
        "the black hole is no longer active: {served:#?}"
    );
    drop(transfer);
}

/// The control: MTUs right end to end, and the peer's interface goes down mid-transfer.
/// The stall stays a stall; the probe finds nothing answering and says so.
#[test]
fn dead_peer_behind_the_tunnel_stays_a_stall() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9302;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    let addr = topo.pod_b_addr(port);
    let pod_b = topo.pod_b.clone();
    let sent = in_netns(&topo.pod_a, move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        s.write_all(b"hello\n")?;
        thread::sleep(Duration::from_millis(200));
        cmd::run(&["ip", "-n", &pod_b, "link", "set", POD_IF, "down"]);
        s.set_write_timeout(Some(Duration::from_secs(2)))?;
        // Full-size segments into the silence; the send buffer takes them at once.
        s.write_all(&vec![0x5a; 64 * 1024])?;
        Ok::<_, std::io::Error>(s)
    })
    .expect("connect and write before the peer goes away");

    let stall = agent.wait_finding(
        on_flow("tcp_stall", "unknown", &topo, port),
        scaled(Duration::from_secs(15)),
    );
    let (seg, mss) = (num(&stall, "segment_len"), num(&stall, "mss"));
    assert!(seg >= mss, "the stalled segment is full-size: {stall:#}");
    // The probe's result joins the stall's evidence.
    let deadline = Instant::now() + scaled(Duration::from_secs(10));
    let probed = loop {
        let served = agent.findings_endpoint();
        if let Some(f) = served
            .iter()
            .find(|f| on_flow("tcp_stall", "unknown", &topo, port)(f))
            .filter(|f| !f["evidence"]["path_probe"].is_null())
        {
            break f.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no path probe on the stall: {served:#?}\n{}",
            agent.diagnostics()
        );
        thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(probed["evidence"]["path_probe"], "no_reply", "{probed:#}");
    assert_eq!(field(&probed, "status"), "active", "{probed:#}");
    agent.expect_no_finding(
        |f| {
            matches!(
                field(f, "kind"),
                "pmtud_blackhole" | "df_oversize_drop" | "overlay_mtu_mismatch"
            )
        },
        Duration::from_secs(2),
    );
    drop(sent);
}

/// Node B drops the tunnel's UDP as it arrives while everything else between the nodes
/// works: every connect from pod A to pod B times out, and nothing on node A drops it.
#[test]
fn tunnel_dropped_on_the_path_is_the_overlay() {
    let topo = Topology::new();
    let port_s = VXLAN_PORT.to_string();
    for argv in [
        vec!["nft", "add", "table", "inet", "nd_test"],
        vec![
            "nft",
            "add",
            "chain",
            "inet",
            "nd_test",
            "input",
            "{ type filter hook input priority 0; }",
        ],
        vec![
            "nft", "add", "rule", "inet", "nd_test", "input", "udp", "dport", &port_s, "drop",
        ],
    ] {
        cmd::run_in(&topo.node_b, &argv);
    }
    assert!(
        topo.ping_until(&topo.node_a, topo.node_b_underlay, Duration::from_secs(3)),
        "the underlay still answers"
    );
    let agent = Agent::start_ready(&topo);
    let port = 9303;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(port), Duration::from_secs(6));
    assert!(
        matches!(outcome, ConnectOutcome::TimedOut),
        "the connect must time out: {outcome:?}"
    );

    let f = agent.wait_finding(
        on_flow("tcp_timeout", "overlay", &topo, port),
        scaled(Duration::from_secs(15)),
    );
    assert_shape(&f);
    assert_eq!(f["evidence"]["path_probe"], "overlay_lost", "{f:#}");
    assert_eq!(f["evidence"]["underlay_probe_answered"], true, "{f:#}");
    assert!(field(&f, "remediation").contains("check UDP 4789"), "{f:#}");
}

/// `node_diag_pmtud_blackholes` once it reads `value`; panics after `timeout`.
fn wait_blackholes(agent: &Agent, value: f64, timeout: Duration) {
    let deadline = Instant::now() + scaled(timeout);
    loop {
        let now = agent.metric(BLACKHOLES);
        if now == Some(value) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{BLACKHOLES} is {now:?}, expected {value}\n{}",
            agent.diagnostics()
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// A black hole found by the path probe stays open while the path still loses the
/// large size, however quiet its flow, and resolves once a probe of the healed path (node
/// B's link back at 1500) carries it: probed again once per window (shortened here).
#[test]
fn a_path_black_hole_resolves_once_the_hop_heals() {
    let topo = Topology::new();
    black_hole_beyond_node_a(&topo);
    let window = Duration::from_secs(4);
    let mut agent = Agent::start_with_args(
        &topo,
        &["--path-probe-window", &window.as_secs().to_string()],
    );
    agent.wait_ready(Duration::from_secs(30));
    let port = 9304;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    let (ns, addr) = (topo.pod_a.clone(), topo.pod_b_addr(port));
    let transfer =
        thread::spawn(move || tcp_request(&ns, addr, &vec![0x5a; BULK], Duration::from_secs(60)));
    let open = |f: &Value| {
        on_flow("pmtud_blackhole", "path", &topo, port)(f) && field(f, "status") == "active"
    };
    agent.wait_finding(open, Duration::from_secs(15));
    wait_blackholes(&agent, 1.0, Duration::from_secs(2));

    // Probed again (a window and a run later) while the hop still loses 1400 and up: it
    // stays open, with the new run in its evidence.
    thread::sleep(window * 2 + Duration::from_secs(3));
    let served = agent.findings_endpoint();
    let hole = served
        .iter()
        .find(|f| on_flow("pmtud_blackhole", "path", &topo, port)(f))
        .unwrap_or_else(|| panic!("the black hole is gone: {served:#?}"));
    assert_eq!(field(hole, "status"), "active", "{hole:#}");
    assert_eq!(hole["evidence"]["path_probe"], "blackhole", "{hole:#}");
    assert_eq!(agent.metric(BLACKHOLES), Some(1.0));

    node_b_underlay_mtu(&topo, "1500");
    let healed = Instant::now();
    let resolved = agent.wait_finding(
        |f| on_flow("pmtud_blackhole", "path", &topo, port)(f) && field(f, "status") == "resolved",
        window + Duration::from_secs(10),
    );
    let took = healed.elapsed();
    assert_eq!(resolved["evidence"]["path_probe"], "passed", "{resolved:#}");
    assert!(
        resolved["evidence"]["path_mtu"].is_null(),
        "a healed path names no smaller MTU: {resolved:#}"
    );
    assert!(!resolved["resolved_at"].is_null(), "{resolved:#}");
    // One window, the 2 s refresh that asks, the run itself.
    assert!(
        took < scaled(window + Duration::from_secs(8)),
        "took {took:?}"
    );
    wait_blackholes(&agent, 0.0, Duration::from_secs(2));
    assert!(
        agent.findings_endpoint().iter().all(|f| !open(f)),
        "resolved, yet served active"
    );
    drop(transfer);
}
