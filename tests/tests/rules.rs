//! The rule behind a `firewall` verdict, named: a NetworkPolicy-style REJECT (comment
//! `np default/deny-db`) in each rule set a node may carry (iptables-nft, iptables-legacy,
//! native nftables) and a DROP that times a connect out. The agent names the rule whose
//! counter rose with the flow's next drop: the client's next attempt, or its SYN's next
//! retransmit. Counters are read, nothing is installed: the rule sets stay as they were.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask integration`), one test at a time:
//! `cargo test -p node-diag-tests --test rules -- --test-threads=1`.

use std::net::Ipv4Addr;
use std::thread;
use std::time::{Duration, Instant};

use node_diag_tests::finding::{assert_shape, field, flow_is};
use node_diag_tests::policy::{self, COMMENT};
use node_diag_tests::{Agent, ConnectOutcome, ServerMode, TcpServer, Topology, cmd, tcp_connect};
use serde_json::Value;

const STEP: Duration = Duration::from_secs(3);
/// A rejected client's attempts after its first, a second apart, until the rule is named.
const ATTEMPTS: usize = 4;

fn on_flow(kind: &'static str, flow: (Ipv4Addr, Ipv4Addr, u16)) -> impl Fn(&Value) -> bool {
    move |f| field(f, "kind") == kind && flow_is(f, flow.0, flow.1, flow.2)
}

/// Polls `/findings` for `timeout` (scaled) for the finding of `kind` on `flow` naming
/// a rule.
fn try_named(
    agent: &Agent,
    kind: &'static str,
    flow: (Ipv4Addr, Ipv4Addr, u16),
    timeout: Duration,
) -> Option<Value> {
    let deadline = Instant::now() + node_diag_tests::agent::scaled(timeout);
    loop {
        let found = agent
            .findings_endpoint()
            .into_iter()
            .find(|f| on_flow(kind, flow)(f) && f["evidence"].get("rule").is_some());
        if found.is_some() || Instant::now() >= deadline {
            return found;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// Polls `/findings` until the finding of `kind` on `flow` names a rule; panics with
/// what it holds after `timeout`.
fn wait_named(
    agent: &Agent,
    kind: &'static str,
    flow: (Ipv4Addr, Ipv4Addr, u16),
    timeout: Duration,
) -> Value {
    let deadline = Instant::now() + node_diag_tests::agent::scaled(timeout);
    loop {
        let findings = agent.findings_endpoint();
        if let Some(f) = findings
            .iter()
            .find(|f| on_flow(kind, flow)(f) && f["evidence"].get("rule").is_some())
        {
            return f.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {kind} finding naming its rule: {findings:#?}"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

/// Pod A's connects to pod B's `port` are rejected by the rule `install` adds; the
/// first attempt's verdict is the firewall's, and after the next attempt the finding
/// names the rule and its policy. Returns the rule's evidence.
fn rejected_rule_is_named(install: impl FnOnce(&Topology, u16), port: u16) -> Value {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    // The application listens: only the rule refuses.
    let server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    install(&topo, port);
    let flow = (topo.pod_a_ip, topo.pod_b_ip, port);
    let before = rulesets(&topo);

    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(port), STEP);
    assert!(outcome.is_refused_by_icmp(), "{outcome:?}");
    let f = agent.wait_finding(on_flow("tcp_refused", flow), STEP);
    assert_shape(&f);
    assert_eq!(field(&f, "layer"), "firewall", "{f:#}");
    assert!(
        f["evidence"].get("rule").is_none(),
        "no baseline yet: {f:#}"
    );

    // The client tries again, as clients do: the first attempt whose drop comes after the
    // agent's baseline read is the one counted. The read runs the rule sets' tools, a
    // second or more in an emulated guest, so an attempt a second later may still fall
    // inside it; the client keeps trying, a second apart, as a retrying client would.
    let mut named = None;
    for _attempt in 0..ATTEMPTS {
        thread::sleep(Duration::from_secs(1));
        let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(port), STEP);
        assert!(outcome.is_refused_by_icmp(), "{outcome:?}");
        named = try_named(&agent, "tcp_refused", flow, Duration::from_secs(2));
        if named.is_some() {
            break;
        }
    }
    let f = match named {
        Some(f) => f,
        None => wait_named(&agent, "tcp_refused", flow, Duration::from_secs(2)),
    };
    assert_eq!(field(&f, "layer"), "firewall", "{f:#}");
    let evidence = &f["evidence"];
    assert_eq!(evidence["policy"], "default/deny-db", "{f:#}");
    let rule = &evidence["rule"];
    assert_eq!(rule["comment"], COMMENT, "{f:#}");
    assert_eq!(rule["verdict"], "reject", "{f:#}");
    assert_eq!(server.accepted(), 0, "the SYN must never reach the server");
    // Naming reads counters: it adds no rule (no trace rule to outlive the flow).
    assert_eq!(rulesets(&topo), before, "the agent changed a rule set");
    rule.clone()
}

/// The nftables rule sets of node A and pod A without their counters (`-s`).
fn rulesets(topo: &Topology) -> Vec<String> {
    [&topo.node_a, &topo.pod_a]
        .map(|netns| cmd::run_in(netns, &["nft", "-s", "list", "ruleset"]))
        .to_vec()
}

/// A policy controller's rule ending TCP to `port` with `target`, straight in
/// `FORWARD` (see [`policy::rule`]).
fn iptables(netns: &str, tool: &str, port: u16, target: &str) {
    policy::rule(netns, tool, "FORWARD", port, &[target]);
}

/// kube-proxy-era nodes: a policy controller's REJECT through iptables-nft, in node
/// A's FORWARD chain.
#[test]
fn iptables_nft_reject_rule_is_named() {
    let rule = rejected_rule_is_named(
        |topo, port| iptables(&topo.node_a, "iptables-nft", port, "REJECT"),
        9301,
    );
    assert_eq!(rule["backend"], "iptables-nft", "{rule:#}");
    assert_eq!(
        (&rule["family"], &rule["table"], &rule["chain"]),
        (&"ip".into(), &"filter".into(), &"FORWARD".into()),
        "{rule:#}"
    );
    assert!(
        rule["handle"].as_u64().is_some(),
        "the nft handle: {rule:#}"
    );
    assert_eq!(rule["position"], 1, "{rule:#}");
}

/// The same rule through iptables-legacy: no handle, its number in the chain.
#[test]
fn iptables_legacy_reject_rule_is_named() {
    let rule = rejected_rule_is_named(
        |topo, port| iptables(&topo.node_a, "iptables-legacy", port, "REJECT"),
        9302,
    );
    assert_eq!(rule["backend"], "iptables-legacy", "{rule:#}");
    assert_eq!(
        (&rule["table"], &rule["chain"], &rule["position"]),
        (&"filter".into(), &"FORWARD".into(), &1.into()),
        "{rule:#}"
    );
    assert!(rule.get("handle").is_none(), "{rule:#}");
}

/// Native nftables in the client pod's own namespace, beside a counted DROP of
/// another port that must not be named.
#[test]
fn nftables_reject_rule_is_named() {
    let rule = rejected_rule_is_named(
        |topo, port| {
            for rule in [
                "add table inet ndpolicy".to_owned(),
                "add chain inet ndpolicy out { type filter hook output priority 0; policy accept; }"
                    .to_owned(),
                "add rule inet ndpolicy out tcp dport 1 counter drop".to_owned(),
                format!("add rule inet ndpolicy out tcp dport {port} counter reject comment \"{COMMENT}\""),
            ] {
                cmd::run_in(&topo.pod_a, &["nft", &rule]);
            }
        },
        9303,
    );
    assert_eq!(rule["backend"], "nftables", "{rule:#}");
    assert_eq!(
        (&rule["family"], &rule["table"], &rule["chain"]),
        (&"inet".into(), &"ndpolicy".into(), &"out".into()),
        "{rule:#}"
    );
    assert!(rule["handle"].as_u64().is_some(), "{rule:#}");
}

/// A DROP times the connect out: the rule is named from the SYN's next retransmit after
/// the verdict, while the same connect still waits.
#[test]
fn dropping_rule_of_a_timing_out_connect_is_named() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9304;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    iptables(&topo.node_a, "iptables-nft", port, "DROP");
    let flow = (topo.pod_a_ip, topo.pod_b_ip, port);

    // SYNs at 0, 1 and 3 s (the verdict), the next at 7 s.
    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(port), Duration::from_secs(9));
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let f = wait_named(&agent, "tcp_timeout", flow, Duration::from_secs(3));
    assert_eq!(field(&f, "layer"), "firewall", "{f:#}");
    assert_eq!(f["evidence"]["policy"], "default/deny-db", "{f:#}");
    let rule = &f["evidence"]["rule"];
    assert_eq!(
        (&rule["chain"], &rule["verdict"], &rule["comment"]),
        (&"FORWARD".into(), &"drop".into(), &COMMENT.into()),
        "{f:#}"
    );
}
