//! Inbound verdicts: pod B (node B) connects to pod A (node A, where the agent runs) and
//! node A's firewall drops or rejects the SYN on its way to pod A, as a NetworkPolicy's
//! ingress rule does (a Calico-style `cali-tw-*` chain, a `np ns/name` comment). Node A
//! reports `tcp_syn_dropped` / `firewall`, one finding per client, pod and port whose
//! count grows with every SYN. The look-alikes make none: a closed port's RST, a full
//! accept queue, a connect made from node A itself, an established flow's packets
//! dropped, and a SYN node A forwards elsewhere.
//!
//! No ping warms the path before a connect: the first SYN waits for neighbour discovery,
//! as in a real cluster.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask integration`), one test at a time:
//! `cargo test -p node-diag-tests --test inbound -- --test-threads=1`.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use node_diag_tests::finding::{field, flow_is};
use node_diag_tests::{
    Agent, ConnectOutcome, ServerMode, TcpServer, Topology, cmd, in_netns, policy, spawn_in_netns,
    tcp_connect,
};
use serde_json::Value;

const KIND: &str = "tcp_syn_dropped";
const INBOUND_FINDINGS: &str = r#"node_diag_findings_total{kind="tcp_syn_dropped",layer="firewall",severity="warning",namespace=""}"#;
const NETFILTER_DROPS: &str = r#"node_diag_drops_total{reason="NETFILTER_DROP"}"#;
/// Long enough for a connect's SYN and its retransmits at 1 s and 3 s.
const TIMING_OUT: Duration = Duration::from_secs(4);
/// How long a look-alike is watched for a finding it must not make.
const WATCH: Duration = Duration::from_secs(4);

fn any_inbound(f: &Value) -> bool {
    field(f, "kind") == KIND
}

fn inbound_on(flow: (Ipv4Addr, Ipv4Addr, u16)) -> impl Fn(&Value) -> bool {
    move |f| any_inbound(f) && flow_is(f, flow.0, flow.1, flow.2)
}

/// Node A's Calico-style ingress policy for pod A (see [`policy::ingress`]).
fn ingress_policy(topo: &Topology, port: u16, target: &[&str]) {
    policy::ingress(&topo.node_a, "iptables-nft", port, target);
}

/// Polls `/findings` until the inbound finding on `flow` passes `pred`; panics with what
/// is served after `timeout`.
fn wait_inbound(
    agent: &Agent,
    flow: (Ipv4Addr, Ipv4Addr, u16),
    pred: impl Fn(&Value) -> bool,
    timeout: Duration,
) -> Value {
    let deadline = Instant::now() + node_diag_tests::agent::scaled(timeout);
    loop {
        let served = agent.findings_endpoint();
        if let Some(f) = served.iter().find(|f| inbound_on(flow)(f) && pred(f)) {
            return f.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {KIND} finding as expected on {flow:?}: {served:#?}"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// The served inbound findings.
fn served_inbound(agent: &Agent) -> Vec<Value> {
    agent
        .findings_endpoint()
        .into_iter()
        .filter(any_inbound)
        .collect()
}

/// The shape every inbound finding has: pod B's address as the client, pod A's address
/// and port, pod A's namespace, the drop in node A on its way from the overlay to pod A's
/// veth, no source port (the client's attempts are one finding).
fn assert_inbound(f: &Value, topo: &Topology, port: u16) {
    assert_eq!(field(f, "layer"), "firewall", "{f:#}");
    assert_eq!(field(f, "severity"), "warning", "{f:#}");
    assert!(flow_is(f, topo.pod_b_ip, topo.pod_a_ip, port), "{f:#}");
    assert!(f.get("sport").is_none(), "aggregated over ports: {f:#}");
    assert!(f["netns"].as_u64().is_some(), "pod A's namespace: {f:#}");
    let e = &f["evidence"];
    assert_eq!(e["drop_reason"], "NETFILTER_DROP", "{f:#}");
    assert_eq!(e["drop_interface"], "vx0", "{f:#}");
    assert_eq!(e["pod_interface"], "vpod0", "{f:#}");
}

/// A NetworkPolicy-shaped DROP of pod A's port: pod B's connects time out, node A says
/// why, names the rule and its policy, and the client's next attempt adds to the one
/// finding.
#[test]
fn syn_dropped_by_an_ingress_policy_is_an_inbound_firewall_finding() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9411;
    let server = TcpServer::start(&topo.pod_a, topo.pod_a_addr(port), ServerMode::Echo);
    ingress_policy(&topo, port, &["DROP"]);
    let flow = (topo.pod_b_ip, topo.pod_a_ip, port);

    let outcome = tcp_connect(&topo.pod_b, topo.pod_a_addr(port), TIMING_OUT);
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    // The first SYN's retransmits are the drops the rule's counter is compared on.
    let f = wait_inbound(
        &agent,
        flow,
        |f| f["evidence"].get("rule").is_some(),
        Duration::from_secs(6),
    );
    assert_inbound(&f, &topo, port);
    let e = &f["evidence"];
    assert_eq!(e["action"], "drop", "{f:#}");
    assert_eq!(e["policy"], "default/deny-db", "{f:#}");
    let rule = &e["rule"];
    assert_eq!(rule["chain"], policy::INGRESS_CHAIN, "{f:#}");
    assert_eq!(rule["comment"], policy::COMMENT, "{f:#}");
    assert_eq!(rule["verdict"], "drop", "{f:#}");
    assert!(f["count"].as_u64() >= Some(2), "{f:#}");
    assert!(field(&f, "summary").contains("timing out"), "{f:#}");

    // The client tries again from another port: the same finding counts on.
    let before = f["count"].as_u64().unwrap_or(0);
    let outcome = tcp_connect(&topo.pod_b, topo.pod_a_addr(port), TIMING_OUT);
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let f = wait_inbound(
        &agent,
        flow,
        |f| f["count"].as_u64() >= Some(before + 2),
        Duration::from_secs(3),
    );
    assert_eq!(
        served_inbound(&agent).len(),
        1,
        "one finding per client, pod and port"
    );
    assert!(
        f["evidence"].get("rule").is_some(),
        "the rule stays named: {f:#}"
    );
    // Every drop counted once, in the finding and in the metric alike.
    thread::sleep(Duration::from_secs(1));
    let f = wait_inbound(&agent, flow, |_| true, Duration::from_secs(1));
    assert_eq!(
        agent.counter(INBOUND_FINDINGS),
        f["count"].as_u64().unwrap_or(0) as f64,
        "{f:#}"
    );
    assert_eq!(server.accepted(), 0, "the SYN must never reach the server");
}

/// A REJECT answering with ICMP port unreachable: pod B is refused at once, and node A
/// says its firewall rejected the SYN (the ICMP it sent).
#[test]
fn syn_rejected_by_an_ingress_policy_is_an_inbound_reject() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9412;
    let _server = TcpServer::start(&topo.pod_a, topo.pod_a_addr(port), ServerMode::Echo);
    ingress_policy(&topo, port, &["REJECT"]);
    let flow = (topo.pod_b_ip, topo.pod_a_ip, port);

    let outcome = tcp_connect(&topo.pod_b, topo.pod_a_addr(port), TIMING_OUT);
    assert!(outcome.is_refused_by_icmp(), "{outcome:?}");
    let f = agent.wait_finding(inbound_on(flow), Duration::from_secs(3));
    assert_inbound(&f, &topo, port);
    let e = &f["evidence"];
    assert_eq!(e["action"], "reject", "{f:#}");
    assert_eq!(
        (&e["icmp_sent_type"], &e["icmp_sent_code"]),
        (&3.into(), &3.into()),
        "{f:#}"
    );
    assert!(field(&f, "summary").contains("rejected"), "{f:#}");
}

/// A REJECT with a TCP reset sends no ICMP: the rule, named from the client's next
/// attempt, says it rejected.
#[test]
fn syn_reset_by_an_ingress_policy_is_named_a_reject_by_its_rule() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9413;
    let _server = TcpServer::start(&topo.pod_a, topo.pod_a_addr(port), ServerMode::Echo);
    ingress_policy(&topo, port, &["REJECT", "--reject-with", "tcp-reset"]);
    let flow = (topo.pod_b_ip, topo.pod_a_ip, port);

    let outcome = tcp_connect(&topo.pod_b, topo.pod_a_addr(port), TIMING_OUT);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    let f = agent.wait_finding(inbound_on(flow), Duration::from_secs(3));
    assert_inbound(&f, &topo, port);
    // A reset looks like the listener's own until the rule says otherwise.
    assert!(f["evidence"].get("action").is_none(), "{f:#}");

    // Clients retry: the next attempt's drop names the rule.
    let deadline = Instant::now() + node_diag_tests::agent::scaled(Duration::from_secs(10));
    let named = loop {
        thread::sleep(Duration::from_millis(1200));
        let outcome = tcp_connect(&topo.pod_b, topo.pod_a_addr(port), TIMING_OUT);
        assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
        thread::sleep(Duration::from_millis(800));
        if let Some(f) = served_inbound(&agent)
            .into_iter()
            .find(|f| f["evidence"].get("rule").is_some())
        {
            break f;
        }
        assert!(Instant::now() < deadline, "{:#?}", served_inbound(&agent));
    };
    let e = &named["evidence"];
    assert_eq!(e["action"], "reject", "{named:#}");
    assert_eq!(e["rule"]["verdict"], "reject", "{named:#}");
    assert_eq!(e["rule"]["chain"], policy::INGRESS_CHAIN, "{named:#}");
    assert_eq!(served_inbound(&agent).len(), 1);
}

/// A closed port: pod A's own kernel answers with a RST (the client's `tcp_refused` /
/// `listener` on its node), no firewall of node A is involved.
#[test]
fn a_closed_pod_port_is_no_inbound_drop() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9414;
    let outcome = tcp_connect(&topo.pod_b, topo.pod_a_addr(port), TIMING_OUT);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    agent.expect_no_finding(any_inbound, WATCH);
}

/// A listener whose accept queue is full drops SYNs in pod A: the listener's problem,
/// not a filter's.
#[test]
fn a_full_accept_queue_is_no_inbound_drop() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9415;
    let addr = topo.pod_a_addr(port);
    // Never accepts; a backlog of 0 holds one connection.
    let _listener = in_netns(&topo.pod_a, move || {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        s.bind(&addr.into()).expect("bind");
        s.listen(0).expect("listen");
        s
    });
    let clients: Vec<_> = (0..4)
        .map(|_| {
            spawn_in_netns(&topo.pod_b, move || {
                TcpStream::connect_timeout(&addr, TIMING_OUT)
            })
        })
        .collect();
    // A client may count as connected on a SYN-ACK whose ACK the full queue then drops.
    for c in clients {
        let _ = c.join().expect("client thread");
    }
    let overflows = listen_overflows(&topo.pod_a);
    assert!(overflows > 0, "no listen overflow counted in pod A");
    agent.expect_no_finding(any_inbound, WATCH);
}

/// `TcpExt: ListenOverflows` of namespace `netns`.
fn listen_overflows(netns: &str) -> u64 {
    let text = cmd::run_in(netns, &["cat", "/proc/net/netstat"]);
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "ListenOverflows")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Node A's own socket connecting to pod A, its SYN dropped by node A's OUTPUT chain:
/// that connect's own verdict (`tcp_timeout` / `firewall`), not an inbound one.
#[test]
fn a_connect_from_this_node_is_its_own_verdict_not_an_inbound_one() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9416;
    let _server = TcpServer::start(&topo.pod_a, topo.pod_a_addr(port), ServerMode::Echo);
    let pod = topo.pod_a_ip.to_string();
    let port_s = port.to_string();
    cmd::run_in(
        &topo.node_a,
        &[
            "iptables-nft",
            "-A",
            "OUTPUT",
            "-d",
            &pod,
            "-p",
            "tcp",
            "--dport",
            &port_s,
            "-j",
            "DROP",
        ],
    );
    let outcome = tcp_connect(&topo.node_a, topo.pod_a_addr(port), TIMING_OUT);
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let f = agent.wait_finding(
        |f| {
            field(f, "kind") == "tcp_timeout"
                && field(f, "dst") == pod
                && f["dport"].as_u64() == Some(u64::from(port))
        },
        Duration::from_secs(4),
    );
    assert_eq!(field(&f, "layer"), "firewall", "{f:#}");
    agent.expect_no_finding(any_inbound, Duration::from_secs(2));
}

/// An established flow's segments dropped by node A once a rule appears: no SYN, no
/// inbound verdict.
#[test]
fn an_established_flows_dropped_segments_are_no_inbound_drop() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9417;
    let _server = TcpServer::start(&topo.pod_a, topo.pod_a_addr(port), ServerMode::Echo);
    let addr = topo.pod_a_addr(port);
    let stream = in_netns(&topo.pod_b, move || {
        TcpStream::connect_timeout(&addr, TIMING_OUT).expect("connect before the rule")
    });
    let before = agent.counter(NETFILTER_DROPS);
    topo.drop_forwarded_tcp(&topo.node_a, port);
    use std::io::Write as _;
    (&stream)
        .write_all(b"data the rule now drops")
        .expect("write");
    agent.wait_counter_at_least(NETFILTER_DROPS, before + 1.0, Duration::from_secs(4));
    agent.expect_no_finding(any_inbound, WATCH);
    drop(stream);
}

/// A SYN node A forwards elsewhere (an address of pod A's range that is no pod of node
/// A, routed back out of the underlay) and drops on the way: not towards a pod of
/// this node, so no inbound verdict.
#[test]
fn a_syn_forwarded_elsewhere_is_no_inbound_drop() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9418;
    let elsewhere = Ipv4Addr::new(10, 244, 1, 99);
    let via = topo.node_b_underlay.to_string();
    cmd::run_in(
        &topo.node_a,
        &[
            "ip",
            "route",
            "add",
            &elsewhere.to_string(),
            "via",
            &via,
            "dev",
            "ul0",
        ],
    );
    topo.drop_forwarded_tcp(&topo.node_a, port);
    let before = agent.counter(NETFILTER_DROPS);
    let target = SocketAddr::V4(SocketAddrV4::new(elsewhere, port));
    let outcome = tcp_connect(&topo.pod_b, target, TIMING_OUT);
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    agent.wait_counter_at_least(NETFILTER_DROPS, before + 1.0, Duration::from_secs(2));
    agent.expect_no_finding(any_inbound, WATCH);
}

/// A second pod on node A connecting to pod A, its SYN dropped by pod A's ingress
/// policy on node A: the client pod's own verdict (`tcp_timeout` / `firewall`) says it,
/// and no inbound one doubles it.
#[test]
fn a_connect_from_a_pod_of_this_node_is_its_own_verdict_not_an_inbound_one() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9419;
    let _server = TcpServer::start(&topo.pod_a, topo.pod_a_addr(port), ServerMode::Echo);
    // Declared after the topology: deleted first, its veth with it.
    let second = node_diag_tests::ok(node_diag_testbed::Netns::create(&format!(
        "{}2",
        topo.pod_a
    )));
    let second_ip = Ipv4Addr::new(10, 244, 1, 8);
    let gateway = format!("{}/32", topo.pod_gateway);
    let via = topo.pod_gateway.to_string();
    let node = |args: &[&str]| {
        let mut argv = vec!["ip"];
        argv.extend_from_slice(args);
        cmd::run_in(&topo.node_a, &argv);
    };
    let pod = |args: &[&str]| {
        let mut argv = vec!["ip"];
        argv.extend_from_slice(args);
        cmd::run_in(second.name(), &argv);
    };
    node(&[
        "link",
        "add",
        "vpod1",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        second.name(),
    ]);
    node(&["addr", "add", &gateway, "dev", "vpod1"]);
    node(&["link", "set", "vpod1", "up"]);
    pod(&["addr", "add", &format!("{second_ip}/32"), "dev", "eth0"]);
    pod(&["link", "set", "eth0", "up"]);
    pod(&[
        "route", "add", "default", "via", &via, "dev", "eth0", "onlink",
    ]);
    node(&["route", "add", &format!("{second_ip}/32"), "dev", "vpod1"]);
    ingress_policy(&topo, port, &["DROP"]);
    // The new pod's namespace enters the scope with its veth's notification.
    thread::sleep(Duration::from_secs(1));

    let outcome = tcp_connect(second.name(), topo.pod_a_addr(port), TIMING_OUT);
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let f = agent.wait_finding(
        |f| field(f, "kind") == "tcp_timeout" && flow_is(f, second_ip, topo.pod_a_ip, port),
        Duration::from_secs(4),
    );
    assert_eq!(field(&f, "layer"), "firewall", "{f:#}");
    agent.expect_no_finding(any_inbound, Duration::from_secs(2));
}

/// The same policy over IPv6: pod B's SYNs to pod A's IPv6 address, dropped by
/// ip6tables on node A, are the same inbound finding with IPv6 addresses.
#[test]
fn an_ipv6_ingress_policy_drop_is_the_same_inbound_finding() {
    use node_diag_testbed::pod_ipv6::{POD_A_V6, POD_B_V6};
    let topo = Topology::new();
    topo.add_pod_ipv6();
    let agent = Agent::start_ready(&topo);
    let port = 9420;
    let addr = SocketAddr::new(POD_A_V6.into(), port);
    let server = TcpServer::start(&topo.pod_a, addr, ServerMode::Echo);
    policy::ingress(&topo.node_a, "ip6tables-nft", port, &["DROP"]);

    let outcome = tcp_connect(&topo.pod_b, addr, TIMING_OUT);
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let f = agent.wait_served(
        |f| {
            any_inbound(f) && flow_is(f, POD_B_V6, POD_A_V6, port) && f["count"].as_u64() >= Some(2)
        },
        Duration::from_secs(4),
    );
    assert_eq!(field(&f, "layer"), "firewall", "{f:#}");
    let e = &f["evidence"];
    assert_eq!(e["drop_reason"], "NETFILTER_DROP", "{f:#}");
    assert_eq!(e["pod_interface"], "vpod0", "{f:#}");
    assert_eq!(served_inbound(&agent).len(), 1, "{f:#}");
    assert_eq!(server.accepted(), 0, "the SYN must never reach the server");
}
