//! Connections through this node's NAT (kube-proxy's DNAT of a Service address to a
//! backend pod): the verdict keeps the address the application connected to, names the
//! backend NAT chose, and finds the evidence the kernel saw on the translated packets.
//! The real agent in node A, a real DNAT rule in node A's netfilter.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test nat -- --test-threads=1`.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::thread;
use std::time::{Duration, Instant};

use node_diag_tests::finding::{assert_shape, field, flow_is};
use node_diag_tests::{Agent, ConnectOutcome, ServerMode, TcpServer, Topology, tcp_connect};
use serde_json::Value;

const STEP: Duration = Duration::from_secs(3);
/// A ClusterIP-like address no interface holds: only the DNAT makes it reachable.
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const TIMEOUT: &str = r#"node_diag_tcp_connect_failures_total{reason="timeout"}"#;

fn vip(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(VIP, port)
}

fn on_flow<'a>(
    kind: &'a str,
    layer: &'a str,
    (src, dst, dport): (Ipv4Addr, Ipv4Addr, u16),
) -> impl Fn(&Value) -> bool + 'a {
    move |f| field(f, "kind") == kind && field(f, "layer") == layer && flow_is(f, src, dst, dport)
}

fn assert_backend(f: &Value, backend: SocketAddrV4) {
    assert_eq!(
        field(f, "backend"),
        backend.ip().to_string(),
        "backend of {f:#}"
    );
    assert_eq!(
        f["backend_port"].as_u64(),
        Some(u64::from(backend.port())),
        "backend port of {f:#}"
    );
    assert!(
        field(f, "summary").contains(&backend.to_string()),
        "the summary names the backend: {f:#}"
    );
}

/// A connect from pod A on a background thread.
fn connect_in_background(topo: &Topology, to: SocketAddrV4) -> thread::JoinHandle<ConnectOutcome> {
    let ns = topo.pod_a.clone();
    thread::spawn(move || tcp_connect(&ns, to.into(), Duration::from_secs(6)))
}

/// DNATed, then dropped by this node's forward filter: the drop is seen on the backend's
/// tuple, yet the timeout keeps the VIP and carries the drop as its evidence.
#[test]
fn dnat_then_drop_on_this_node_is_the_firewall_with_its_backend() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9302), ServerMode::Echo);
    let backend = SocketAddrV4::new(topo.pod_b_ip, 9302);
    topo.dnat(&topo.node_a, vip(80), backend);
    // Matches the translated packet only: the rule names the backend's port.
    topo.drop_forwarded_tcp(&topo.node_a, 9302);
    let before = agent.counter(TIMEOUT);

    let start = Instant::now();
    let client = connect_in_background(&topo, vip(80));
    let f = agent.wait_finding(
        on_flow("tcp_timeout", "firewall", (topo.pod_a_ip, VIP, 80)),
        Duration::from_secs(5).saturating_sub(start.elapsed()),
    );
    assert_shape(&f);
    assert_eq!(f["evidence"]["drop_reason"], "NETFILTER_DROP", "{f:#}");
    assert_backend(&f, backend);
    let outcome = client.join().expect("client thread");
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    assert_eq!(server.accepted(), 0, "the SYN must never reach the backend");
    agent.wait_counter_at_least(TIMEOUT, before + 1.0, STEP);
}

/// DNATed here, dropped on the backend's node: nothing on this node explains it, so the
/// layer stays unknown, but the finding names both the VIP and the backend the SYNs went
/// to (the next place to look).
#[test]
fn dnat_then_drop_beyond_this_node_is_unknown_naming_vip_and_backend() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9303), ServerMode::Echo);
    let backend = SocketAddrV4::new(topo.pod_b_ip, 9303);
    topo.dnat(&topo.node_a, vip(80), backend);
    topo.drop_forwarded_tcp(&topo.node_b, 9303);

    let start = Instant::now();
    let client = connect_in_background(&topo, vip(80));
    let f = agent.wait_finding(
        on_flow("tcp_timeout", "unknown", (topo.pod_a_ip, VIP, 80)),
        Duration::from_secs(5).saturating_sub(start.elapsed()),
    );
    assert_shape(&f);
    assert!(f["evidence"].get("drop_reason").is_none(), "{f:#}");
    assert_backend(&f, backend);
    let outcome = client.join().expect("client thread");
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
}
