//! `node-diag services`: the Service catalog read back from kube-proxy's rules, in each
//! of kube-proxy's modes (iptables through iptables-nft and iptables-legacy, and
//! nftables), installed by the testbed as kube-proxy writes them; and those rules
//! really forwarding: a connect to a ClusterIP reaches its backend through the overlay,
//! one to a Service without endpoints is refused.
//!
//! No agent runs here: `services` needs no eBPF, and is run with `ip netns exec` in the
//! namespace it reads.
//!
//! `NODE_DIAG_BIN=target/debug/node-diag cargo test -p node-diag-tests --test services -- --test-threads=1` (root).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use node_diag_tests::kube_proxy::{
    IptablesBackend, Protocol, ServiceSpec, install_iptables_service, install_nftables_service,
    remove_kube_proxy_rules,
};
use node_diag_tests::netns::Netns;
use node_diag_tests::{
    ConnectOutcome, ServerMode, TcpServer, Topology, cmd, node_diag_bin, require_root, tcp_connect,
    unique_name,
};
use serde_json::Value;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Iptables(IptablesBackend),
    Nftables,
}

fn install(netns: &str, mode: Mode, svc: &ServiceSpec) {
    match mode {
        Mode::Iptables(backend) => install_iptables_service(netns, backend, svc),
        Mode::Nftables => install_nftables_service(netns, svc),
    }
}

fn spec(name: &str, port_name: &str, ip: Ipv4Addr, port: u16, backends: &[&str]) -> ServiceSpec {
    ServiceSpec {
        namespace: "default".into(),
        name: name.into(),
        port_name: port_name.into(),
        cluster_ip: ip,
        port,
        proto: Protocol::Tcp,
        backends: backends.iter().map(|b| b.parse().unwrap()).collect(),
    }
}

/// Runs `node-diag services -o json` inside `netns` and returns its report.
fn services(netns: &str) -> Value {
    let bin = node_diag_bin();
    let bin = bin.to_str().expect("NODE_DIAG_BIN is not UTF-8");
    let out = cmd::run_in(netns, &[bin, "services", "-o", "json"]);
    serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("services output is not JSON ({e}):\n{out}"))
}

fn service<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["services"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .unwrap_or_else(|| panic!("no Service {name}: {report:#}"))
}

fn source_status<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["sources"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .map(|s| &s["status"])
        .unwrap_or_else(|| panic!("no source {name}: {report:#}"))
}

/// A Service with two endpoints, one with none and an unnamed port, in `mode`, read
/// back by `node-diag services` from inside the namespace; then removed again.
fn catalog_in(mode: Mode) {
    require_root();
    let ns = Netns::create(&unique_name()).expect("netns");
    let ns = ns.name();
    let web = spec(
        "web",
        "http",
        Ipv4Addr::new(10, 96, 0, 20),
        80,
        &["10.244.1.5:8080", "10.244.2.6:8080"],
    );
    let empty = spec("empty", "http", Ipv4Addr::new(10, 96, 0, 30), 80, &[]);
    let unnamed = spec(
        "unnamed",
        "",
        Ipv4Addr::new(10, 96, 0, 40),
        8080,
        &["10.244.2.7:80"],
    );
    for svc in [&web, &empty, &unnamed] {
        install(ns, mode, svc);
    }

    let r = services(ns);
    assert_eq!(r["services"].as_array().map(Vec::len), Some(3), "{r:#}");
    let w = service(&r, "default/web:http");
    assert_eq!(w["proto"], "tcp", "{r:#}");
    assert_eq!(
        w["frontends"],
        serde_json::json!(["10.96.0.20:80"]),
        "{r:#}"
    );
    assert_eq!(
        w["backends"],
        serde_json::json!(["10.244.1.5:8080", "10.244.2.6:8080"]),
        "{r:#}"
    );
    assert_eq!(w["no_endpoints"], false, "{r:#}");
    let e = service(&r, "default/empty:http");
    assert_eq!(e["no_endpoints"], true, "{r:#}");
    assert_eq!(e["backends"], serde_json::json!([]), "{r:#}");
    assert_eq!(
        e["frontends"],
        serde_json::json!(["10.96.0.30:80"]),
        "{r:#}"
    );
    let u = service(&r, "default/unnamed");
    assert_eq!(u["backends"], serde_json::json!(["10.244.2.7:80"]), "{r:#}");

    let (read, absent) = match mode {
        Mode::Iptables(IptablesBackend::Nft) => ("iptables-nft-save", "iptables-legacy-save"),
        Mode::Iptables(IptablesBackend::Legacy) => ("iptables-legacy-save", "nft ip kube-proxy"),
        Mode::Nftables => ("nft ip kube-proxy", "iptables-legacy-save"),
    };
    assert_eq!(source_status(&r, read), "read", "{r:#}");
    assert_eq!(source_status(&r, absent), "absent", "{r:#}");

    remove_kube_proxy_rules(ns);
    let r = services(ns);
    assert_eq!(r["services"], serde_json::json!([]), "after removal: {r:#}");
}

#[test]
fn catalog_from_iptables_nft() {
    catalog_in(Mode::Iptables(IptablesBackend::Nft));
}

#[test]
fn catalog_from_iptables_legacy() {
    catalog_in(Mode::Iptables(IptablesBackend::Legacy));
}

#[test]
fn catalog_from_nftables() {
    catalog_in(Mode::Nftables);
}

/// On node A, ClusterIP 10.96.0.10:80 to a server in pod B, and 10.96.0.30:80 without
/// endpoints: pod A connects to the first through node A's DNAT and the overlay, and is
/// refused by node A for the second (ICMP port unreachable, as kube-proxy's REJECT).
fn cluster_ip_forwards_in(mode: Mode) {
    let topo = Topology::new();
    topo.route_service_range(&topo.node_a);
    let backend = SocketAddrV4::new(topo.pod_b_ip, 8080);
    let server = TcpServer::start(&topo.pod_b, SocketAddr::V4(backend), ServerMode::Echo);
    let mut svc = spec("api", "http", Ipv4Addr::new(10, 96, 0, 10), 80, &[]);
    svc.backends = vec![backend];
    install(&topo.node_a, mode, &svc);
    install(
        &topo.node_a,
        mode,
        &spec("gone", "http", Ipv4Addr::new(10, 96, 0, 30), 80, &[]),
    );

    let outcome = tcp_connect(
        &topo.pod_a,
        "10.96.0.10:80".parse().unwrap(),
        Duration::from_secs(3),
    );
    assert!(
        matches!(outcome, ConnectOutcome::Connected),
        "{mode:?}: {outcome:?}"
    );
    assert_eq!(
        server.wait_accepted(1, Duration::from_secs(2)),
        1,
        "{mode:?}: the backend took it"
    );

    let outcome = tcp_connect(
        &topo.pod_a,
        "10.96.0.30:80".parse().unwrap(),
        Duration::from_secs(3),
    );
    assert!(
        matches!(outcome, ConnectOutcome::Refused),
        "{mode:?}: {outcome:?}"
    );

    let r = services(&topo.node_a);
    assert_eq!(
        service(&r, "default/api:http")["backends"],
        serde_json::json!(["10.244.2.9:8080"]),
        "{r:#}"
    );
    assert_eq!(
        service(&r, "default/gone:http")["no_endpoints"],
        true,
        "{r:#}"
    );
}

#[test]
fn cluster_ip_forwards_with_iptables_nft() {
    cluster_ip_forwards_in(Mode::Iptables(IptablesBackend::Nft));
}

#[test]
fn cluster_ip_forwards_with_iptables_legacy() {
    cluster_ip_forwards_in(Mode::Iptables(IptablesBackend::Legacy));
}

#[test]
fn cluster_ip_forwards_with_nftables() {
    cluster_ip_forwards_in(Mode::Nftables);
}
