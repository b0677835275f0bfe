//! Connections through this node's NAT (kube-proxy's DNAT of a Service address to a
//! backend pod): the verdict keeps the address the application connected to, names the
//! backend NAT chose and the Service kube-proxy's rules name, and finds the evidence the
//! kernel saw on the translated packets. The real agent in node A, with a plain DNAT rule
//! or kube-proxy's rules (iptables through iptables-nft and -legacy, and nftables mode,
//! as `testbed::kube_proxy` writes them) in node A's netfilter.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test nat -- --test-threads=1`.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::thread;
use std::time::{Duration, Instant};

use node_diag_tests::finding::{assert_shape, field, flow_is};
use node_diag_tests::kube_proxy::{
    IptablesBackend, Protocol, ServiceSpec, install_iptables_service, install_nftables_service,
};
use node_diag_tests::topology::Reject;
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

/// kube-proxy's rules on node A, in each of its modes, for the agent to read at start.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Iptables(IptablesBackend),
    Nftables,
}

fn install(topo: &Topology, mode: Mode, svc: &ServiceSpec) {
    match mode {
        Mode::Iptables(backend) => install_iptables_service(&topo.node_a, backend, svc),
        Mode::Nftables => install_nftables_service(&topo.node_a, svc),
    }
}

fn service(name: &str, ip: Ipv4Addr, backends: &[SocketAddrV4]) -> ServiceSpec {
    ServiceSpec {
        namespace: "shop".into(),
        name: name.into(),
        port_name: "http".into(),
        cluster_ip: ip,
        port: 80,
        proto: Protocol::Tcp,
        backends: backends.to_vec(),
    }
}

/// A Service without endpoints: kube-proxy's own REJECT answers, so the layer is the
/// Service (not a firewall, not the application), named as kube-proxy names it.
fn no_endpoints_is_the_service(mode: Mode) {
    let topo = Topology::new();
    topo.route_service_range(&topo.node_a);
    let gone = Ipv4Addr::new(10, 96, 0, 30);
    install(&topo, mode, &service("cart", gone, &[]));
    let agent = Agent::start_ready(&topo);

    let outcome = tcp_connect(&topo.pod_a, SocketAddrV4::new(gone, 80).into(), STEP);
    assert!(
        matches!(outcome, ConnectOutcome::Refused),
        "{mode:?}: {outcome:?}"
    );
    let f = agent.wait_finding(
        on_flow("tcp_refused", "service", (topo.pod_a_ip, gone, 80)),
        STEP,
    );
    assert_shape(&f);
    assert_eq!(field(&f, "service"), "shop/cart:http", "{f:#}");
    assert!(f.get("backend").is_none(), "no endpoint, no backend: {f:#}");
    assert!(field(&f, "summary").contains("no ready endpoints"), "{f:#}");
    assert!(field(&f, "remediation").contains("selector"), "{f:#}");
    assert_eq!(
        f["evidence"]["icmp_sent_code"], 3,
        "kube-proxy's port-unreachable: {f:#}"
    );
    agent.wait_counter_at_least(
        r#"node_diag_findings_total{kind="tcp_refused",layer="service",severity="warning",namespace=""}"#,
        1.0,
        STEP,
    );
}

#[test]
fn no_endpoints_is_the_service_with_iptables_nft() {
    no_endpoints_is_the_service(Mode::Iptables(IptablesBackend::Nft));
}

#[test]
fn no_endpoints_is_the_service_with_iptables_legacy() {
    no_endpoints_is_the_service(Mode::Iptables(IptablesBackend::Legacy));
}

#[test]
fn no_endpoints_is_the_service_with_nftables() {
    no_endpoints_is_the_service(Mode::Nftables);
}

/// A Service whose one endpoint refuses: its listener, with the Service and the backend
/// named (conntrack forgets a connection refused at once; the one endpoint is certain).
/// With two endpoints that both refuse, the finding lists both as candidates.
fn backend_refusing_is_its_listener(mode: Mode) {
    let topo = Topology::new();
    let one = SocketAddrV4::new(topo.pod_b_ip, 9311);
    let vip_one = Ipv4Addr::new(10, 96, 0, 11);
    install(&topo, mode, &service("cart", vip_one, &[one]));
    let two = [
        SocketAddrV4::new(topo.pod_b_ip, 9312),
        SocketAddrV4::new(topo.pod_b_ip, 9313),
    ];
    let vip_two = Ipv4Addr::new(10, 96, 0, 12);
    install(&topo, mode, &service("checkout", vip_two, &two));
    let agent = Agent::start_ready(&topo);

    let outcome = tcp_connect(&topo.pod_a, SocketAddrV4::new(vip_one, 80).into(), STEP);
    assert!(
        matches!(outcome, ConnectOutcome::Refused),
        "{mode:?}: {outcome:?}"
    );
    let f = agent.wait_finding(
        on_flow("tcp_refused", "listener", (topo.pod_a_ip, vip_one, 80)),
        STEP,
    );
    assert_shape(&f);
    assert_eq!(field(&f, "service"), "shop/cart:http", "{f:#}");
    assert_backend(&f, one);

    let outcome = tcp_connect(&topo.pod_a, SocketAddrV4::new(vip_two, 80).into(), STEP);
    assert!(
        matches!(outcome, ConnectOutcome::Refused),
        "{mode:?}: {outcome:?}"
    );
    let f = agent.wait_finding(
        on_flow("tcp_refused", "listener", (topo.pod_a_ip, vip_two, 80)),
        STEP,
    );
    assert_shape(&f);
    assert_eq!(field(&f, "service"), "shop/checkout:http", "{f:#}");
    assert!(f.get("backend").is_none(), "NAT's choice is unknown: {f:#}");
    let candidates = &f["evidence"]["candidate_backends"];
    for b in two {
        assert!(
            candidates
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c == &b.to_string())),
            "{b} among the candidates: {f:#}"
        );
    }
}

#[test]
fn backend_refusing_is_its_listener_with_nftables() {
    backend_refusing_is_its_listener(Mode::Nftables);
}

#[test]
fn backend_refusing_is_its_listener_with_iptables_nft() {
    backend_refusing_is_its_listener(Mode::Iptables(IptablesBackend::Nft));
}

/// kube-proxy DNATs to the backend, then this node's firewall drops the translated SYN:
/// the firewall, with the Service and the backend named.
#[test]
fn service_dropped_on_this_node_is_the_firewall_naming_service_and_backend() {
    let topo = Topology::new();
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9314), ServerMode::Echo);
    let backend = SocketAddrV4::new(topo.pod_b_ip, 9314);
    let ip = Ipv4Addr::new(10, 96, 0, 14);
    install(&topo, Mode::Nftables, &service("orders", ip, &[backend]));
    topo.drop_forwarded_tcp(&topo.node_a, 9314);
    let agent = Agent::start_ready(&topo);

    let start = Instant::now();
    let client = connect_in_background(&topo, SocketAddrV4::new(ip, 80));
    let f = agent.wait_finding(
        on_flow("tcp_timeout", "firewall", (topo.pod_a_ip, ip, 80)),
        Duration::from_secs(5).saturating_sub(start.elapsed()),
    );
    assert_shape(&f);
    assert_eq!(field(&f, "service"), "shop/orders:http", "{f:#}");
    assert_backend(&f, backend);
    assert!(matches!(
        client.join().expect("client"),
        ConnectOutcome::TimedOut
    ));
}

/// A Service with one listening endpoint (pod B, `port`), whose translated SYN `reject`
/// answers on node A, or on node B when `beyond`: the client is refused, though no
/// listener refused anything. The finding is the firewall's, names the Service, and
/// passes `check` (given the finding, the backend and the connect's flow).
fn service_rejected(
    beyond: bool,
    reject: Reject,
    name: &str,
    port: u16,
    check: impl Fn(&Agent, &Value, SocketAddrV4, (Ipv4Addr, Ipv4Addr, u16)),
) {
    let topo = Topology::new();
    let server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    let backend = SocketAddrV4::new(topo.pod_b_ip, port);
    let ip = Ipv4Addr::new(10, 96, 0, (port % 100) as u8);
    install(&topo, Mode::Nftables, &service(name, ip, &[backend]));
    let node = if beyond { &topo.node_b } else { &topo.node_a };
    topo.reject_forwarded_tcp(node, port, reject);
    let agent = Agent::start_ready(&topo);

    let outcome = tcp_connect(&topo.pod_a, SocketAddrV4::new(ip, 80).into(), STEP);
    let refused = match reject {
        Reject::TcpReset => matches!(outcome, ConnectOutcome::Refused),
        _ => outcome.is_refused_by_icmp(),
    };
    assert!(refused, "{outcome:?}");
    let f = agent.wait_finding(
        |f| field(f, "kind") == "tcp_refused" && flow_is(f, topo.pod_a_ip, ip, 80),
        STEP,
    );
    assert_shape(&f);
    assert_eq!(field(&f, "layer"), "firewall", "{f:#}");
    assert_eq!(field(&f, "service"), format!("shop/{name}:http"), "{f:#}");
    check(&agent, &f, backend, (topo.pod_a_ip, ip, 80));
    assert_eq!(server.accepted(), 0, "the SYN must never reach the backend");
}

/// This node's firewall answers the translated SYN with a RST (`reject with tcp
/// reset`): to the client exactly the refused connect of a closed backend port. The
/// firewall, with the backend named and the drop as evidence; never the listener.
#[test]
fn service_rejected_on_this_node_is_the_firewall_not_the_listener() {
    service_rejected(
        false,
        Reject::TcpReset,
        "payments",
        9315,
        |agent, f, backend, flow| {
            assert_backend(f, backend);
            assert_eq!(f["evidence"]["drop_reason"], "NETFILTER_DROP", "{f:#}");
            agent.expect_no_finding(
                on_flow("tcp_refused", "listener", flow),
                Duration::from_millis(500),
            );
        },
    );
}

/// The backend's node rejects the translated SYN with an ICMP port unreachable: the
/// client sees `ECONNREFUSED` without a RST, after a DNAT. Neither the listener nor the
/// Service (kube-proxy's own REJECT, for a Service without endpoints, looks the same on
/// the wire but comes from this node): a firewall.
#[test]
fn service_rejected_by_icmp_beyond_this_node_is_a_firewall_not_the_service() {
    service_rejected(
        true,
        Reject::IcmpPortUnreachable,
        "ledger",
        9316,
        |_, f, _, _| {
            assert_eq!(f["evidence"]["rst_received"], false, "{f:#}");
            // The ICMP quotes the translated flow; the socket's own error says what it
            // was. Its sender reached the socket rewritten by this node's NAT (the
            // Service address): no sender is named rather than a wrong one.
            let ev = &f["evidence"];
            assert_eq!(ev["icmp_received_type"], 3, "{f:#}");
            assert_eq!(ev["icmp_received_code"], 3, "{f:#}");
            assert!(ev.get("icmp_received_from").is_none(), "{f:#}");
        },
    );
}

/// A Service fronts pod B's port, but the client connects to pod B's address itself,
/// where nothing listens: no NAT touched the connect, so the finding is the listener's
/// and names neither the Service nor a backend, though the address is an endpoint.
#[test]
fn direct_refused_connect_to_an_endpoint_names_no_service_or_backend() {
    let topo = Topology::new();
    let backend = SocketAddrV4::new(topo.pod_b_ip, 9317);
    let ip = Ipv4Addr::new(10, 96, 0, 17);
    install(&topo, Mode::Nftables, &service("search", ip, &[backend]));
    let agent = Agent::start_ready(&topo);

    let outcome = tcp_connect(&topo.pod_a, backend.into(), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    let f = agent.wait_finding(
        on_flow(
            "tcp_refused",
            "listener",
            (topo.pod_a_ip, topo.pod_b_ip, 9317),
        ),
        STEP,
    );
    assert_shape(&f);
    assert!(f.get("backend").is_none(), "no NAT, no backend: {f:#}");
    assert!(f.get("service").is_none(), "not through the Service: {f:#}");
    assert!(
        f["evidence"].get("candidate_backends").is_none(),
        "no NAT, no candidates: {f:#}"
    );
}

/// What the agent promises for a Service created (or removed) while it runs: named
/// from its rules this soon after they are written. Unscaled: the bound is the claim.
const FOLLOW_BOUND: Duration = Duration::from_secs(2);

/// Polls the agent's count of Service ports until it is `want`, at most until `since`
/// plus [`FOLLOW_BOUND`]; panics past it.
fn wait_services(agent: &Agent, want: f64, since: Instant) {
    loop {
        let now = agent.metric("node_diag_services");
        if now == Some(want) {
            return;
        }
        assert!(
            since.elapsed() < FOLLOW_BOUND,
            "node_diag_services is {now:?}, not {want}, {:?} after the change\n{}",
            since.elapsed(),
            agent.metrics_text()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// A Service created while the agent runs (kube-proxy's rules followed by change, not
/// re-read every 10 s) is named in a finding within 2 s of its rules being written: a
/// refused connect to its ClusterIP as soon as the agent's catalog holds it is the
/// Service's (no endpoints) finding naming it, all within the bound. Removed, it
/// leaves the catalog within 2 s too.
fn service_created_while_running_is_named(mode: Mode) {
    let topo = Topology::new();
    topo.route_service_range(&topo.node_a);
    let agent = Agent::start_ready(&topo);
    assert_eq!(
        agent.wait_metric("node_diag_services", STEP),
        0.0,
        "{mode:?}: no Service yet"
    );

    let vip = Ipv4Addr::new(10, 96, 0, 31);
    install(&topo, mode, &service("late", vip, &[]));
    let written = Instant::now();
    wait_services(&agent, 1.0, written);
    let in_catalog = written.elapsed();
    let outcome = tcp_connect(&topo.pod_a, SocketAddrV4::new(vip, 80).into(), STEP);
    assert!(
        matches!(outcome, ConnectOutcome::Refused),
        "{mode:?}: {outcome:?}"
    );
    let f = agent.wait_finding(
        |f| {
            on_flow("tcp_refused", "service", (topo.pod_a_ip, vip, 80))(f)
                && f.get("service").is_some()
        },
        FOLLOW_BOUND.saturating_sub(written.elapsed()),
    );
    let named = written.elapsed();
    assert!(
        named <= FOLLOW_BOUND,
        "{mode:?}: the Service named {named:?} after its rules were written: {f:#}"
    );
    assert_shape(&f);
    assert_eq!(field(&f, "layer"), "service", "{mode:?}: {f:#}");
    assert_eq!(field(&f, "service"), "shop/late:http", "{mode:?}: {f:#}");
    assert!(
        field(&f, "summary").contains("Service shop/late:http has no ready endpoints"),
        "{mode:?}: {f:#}"
    );
    eprintln!(
        "{mode:?}: Service in the catalog {in_catalog:?}, named in a finding {named:?} after its rules"
    );

    node_diag_tests::kube_proxy::remove_kube_proxy_rules(&topo.node_a);
    let removed = Instant::now();
    wait_services(&agent, 0.0, removed);
    eprintln!(
        "{mode:?}: Service out of the catalog {:?} after its rules went",
        removed.elapsed()
    );
}

#[test]
fn service_created_while_running_is_named_with_iptables_nft() {
    service_created_while_running_is_named(Mode::Iptables(IptablesBackend::Nft));
}

#[test]
fn service_created_while_running_is_named_with_iptables_legacy() {
    service_created_while_running_is_named(Mode::Iptables(IptablesBackend::Legacy));
}

#[test]
fn service_created_while_running_is_named_with_nftables() {
    service_created_while_running_is_named(Mode::Nftables);
}
