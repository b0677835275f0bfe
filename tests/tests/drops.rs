//! Drop counting by reason (`node_diag_drops_total`): every packet the kernel frees as
//! dropped in one of this node's namespaces is counted under its `skb_drop_reason`, none
//! dropped in another node's, and a namespace that joins the node (a new pod) is counted
//! from the agent's next scope refresh, though drops of it were seen, and left out, while
//! it was a stranger. The real agent in node A, real nftables drop rules, real UDP.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test drops -- --test-threads=1`.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::thread;
use std::time::{Duration, Instant};

use node_diag_tests::netns::Netns;
use node_diag_tests::{Agent, Topology, cmd, in_netns, ok, unique_name};

const NETFILTER_DROP: &str = r#"node_diag_drops_total{reason="NETFILTER_DROP"}"#;
/// The port every drop rule here drops (UDP, in the output hook).
const DROP_PORT: u16 = 7997;
/// The agent reads its maps every 500 ms; a count is settled after a few reads.
const SETTLE: Duration = Duration::from_millis(1500);
/// The agent refreshes its scope on the new veth's link notification (every 60 s
/// without one); the bound is generous for a loaded machine.
const JOIN: Duration = Duration::from_secs(15);

/// Drops every UDP datagram to [`DROP_PORT`] that `netns` sends (nftables, output hook).
fn drop_udp_out(netns: &str) {
    let port = DROP_PORT.to_string();
    cmd::run_in(netns, &["nft", "add", "table", "inet", "nddrops"]);
    cmd::run_in(
        netns,
        &[
            "nft",
            "add",
            "chain",
            "inet",
            "nddrops",
            "out",
            "{ type filter hook output priority 0 ; }",
        ],
    );
    cmd::run_in(
        netns,
        &[
            "nft", "add", "rule", "inet", "nddrops", "out", "udp", "dport", &port, "drop",
        ],
    );
}

/// Sends `n` datagrams from `netns` to `to`, each dropped by the sender's own rule.
fn send(netns: &str, to: Ipv4Addr, n: usize) {
    in_netns(netns, || {
        let socket = UdpSocket::bind("0.0.0.0:0").expect("bind a UDP socket");
        for _ in 0..n {
            // EPERM: netfilter's verdict, reported to the sender.
            let _ = socket.send_to(b"dropped", SocketAddr::from((to, DROP_PORT)));
        }
    });
}

/// The counter once it has stopped moving (two reads [`SETTLE`] apart agree).
fn settled(agent: &Agent, series: &str) -> f64 {
    let mut last = agent.counter(series);
    for _ in 0..20 {
        thread::sleep(SETTLE);
        let now = agent.counter(series);
        if now == last {
            return now;
        }
        last = now;
    }
    panic!("{series} still moving\n{}", agent.metrics_text());
}

#[test]
fn drops_are_counted_by_reason_in_this_nodes_namespaces_only() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    drop_udp_out(&topo.pod_a);
    drop_udp_out(&topo.pod_b);
    let before = settled(&agent, NETFILTER_DROP);

    // Pod A is node A's: each of its drops counts.
    send(&topo.pod_a, topo.pod_b_ip, 40);
    let after_a = settled(&agent, NETFILTER_DROP);
    assert_eq!(
        after_a - before,
        40.0,
        "pod A's 40 drops, counted once each\n{}",
        agent.metrics_text()
    );

    // Pod B lives on node B: its drops are not this node's.
    send(&topo.pod_b, topo.pod_a_ip, 25);
    let after_b = settled(&agent, NETFILTER_DROP);
    assert_eq!(
        after_b,
        after_a,
        "pod B's drops (node B) counted by node A's agent\n{}",
        agent.metrics_text()
    );
}

#[test]
fn a_namespace_joining_the_node_is_counted_from_the_next_refresh() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let joining = ok(Netns::create(&unique_name()));
    let ns = joining.name().to_owned();
    drop_udp_out(&ns);
    let loopback = Ipv4Addr::new(127, 0, 0, 1);
    let before = settled(&agent, NETFILTER_DROP);

    // Not yet a pod of node A: its drops are seen (and the decision remembered by the
    // kernel's per-reason counters), but not counted.
    send(&ns, loopback, 30);
    let stranger = settled(&agent, NETFILTER_DROP);
    assert_eq!(
        stranger,
        before,
        "drops of a namespace outside the node counted\n{}",
        agent.metrics_text()
    );

    // Plugged into node A like a pod: a veth whose peer is in node A.
    let host_if = format!("ndj{}", std::process::id() % 100_000);
    cmd::run(&[
        "ip",
        "link",
        "add",
        &host_if,
        "netns",
        &topo.node_a,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &ns,
    ]);
    // One datagram at a time until the agent's scope has it (on the veth's notification).
    let deadline = Instant::now() + JOIN;
    let mut probes = 0.0;
    loop {
        send(&ns, loopback, 1);
        probes += 1.0;
        thread::sleep(Duration::from_millis(300));
        if agent.counter(NETFILTER_DROP) > before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "drops of a namespace joined to node A still not counted after {JOIN:?}\n{}",
            agent.metrics_text()
        );
    }
    let joined = settled(&agent, NETFILTER_DROP);
    assert!(
        joined - before >= 1.0 && joined - before <= probes,
        "{} counted of {probes} probes",
        joined - before
    );

    send(&ns, loopback, 20);
    let after = settled(&agent, NETFILTER_DROP);
    assert_eq!(
        after - joined,
        20.0,
        "a joined namespace's 20 drops, counted once each\n{}",
        agent.metrics_text()
    );
}
