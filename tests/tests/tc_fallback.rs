//! The TC attachment of kernels without TCX (before 6.6), forced here with
//! `--tc-attach netlink`: a `bpf` filter (priority 20036, handle 0x4e44, `nd_tc_ingress`)
//! under a `clsact` qdisc. Killed agents' filters are replaced, not piled up; a clean exit
//! leaves neither filter nor qdisc of the agent; another tool's qdisc and filters are never
//! touched; the pods' veths get neither; and the classifier still sees frag-needed.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test tc_fallback -- --test-threads=1`.

use std::time::Duration;

use node_diag_tests::finding::field;
use node_diag_tests::topology::{POD_HOST_IF, UNDERLAY_IF, VXLAN_IF};
use node_diag_tests::{Agent, BULK, ServerMode, TcpServer, Topology, bulk_to_pod_b, cmd};

/// Node A's interfaces the agent attaches to: every one but loopback and the pods' veths.
const INTERFACES: [&str; 2] = [UNDERLAY_IF, VXLAN_IF];
/// Where the tests put another tool's clsact and filter: an interface the agent attaches to.
const SHARED_IF: &str = UNDERLAY_IF;
/// Where the agent never attaches: ICMP errors do not come from a pod's side.
const POD_SIDE: [&str; 1] = [POD_HOST_IF];
/// Netlink filters, attached from the start (not only once trouble shows).
const NETLINK: [&str; 4] = ["--tc-attach", "netlink", "--icmp-watch", "always"];
/// A filter of another tool: u32 and cls_bpf are what this kernel has built in.
const FOREIGN: [&str; 11] = [
    "protocol", "all", "prio", "1", "u32", "match", "u32", "0", "0", "classid", "1:1",
];

fn foreign_filter(topo: &Topology, direction: &str) {
    let mut argv = vec!["tc", "filter", "add", "dev", SHARED_IF, direction];
    argv.extend(FOREIGN);
    cmd::run_in(&topo.node_a, &argv);
}

/// `tc filter show dev <interface> <direction>` in node A (empty without a clsact).
fn filters(topo: &Topology, interface: &str, direction: &str) -> String {
    let out = cmd::try_run_in(
        &topo.node_a,
        &["tc", "filter", "show", "dev", interface, direction],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The program ids of the agent's filters on `interface`'s ingress.
fn our_filter_ids(topo: &Topology, interface: &str) -> Vec<u32> {
    filters(topo, interface, "ingress")
        .lines()
        .filter(|l| l.contains("nd_tc_ingress"))
        .map(|l| {
            assert!(
                l.contains("pref 20036 bpf") && l.contains("handle 0x4e44"),
                "the agent's filter is not at its documented priority and handle: {l}"
            );
            let mut words = l.split_whitespace();
            words
                .by_ref()
                .find(|w| *w == "id")
                .and_then(|_| words.next())
                .and_then(|id| id.parse().ok())
                .unwrap_or_else(|| panic!("no program id in {l}"))
        })
        .collect()
}

/// One filter of the agent on every interface; returns their program ids.
fn one_filter_each(topo: &Topology, agent: &Agent, when: &str) -> Vec<u32> {
    INTERFACES
        .iter()
        .map(|i| {
            let ids = our_filter_ids(topo, i);
            assert_eq!(
                ids.len(),
                1,
                "{when}: {i} has {} nd_tc_ingress filters, expected 1:\n{}\n{}",
                ids.len(),
                filters(topo, i, "ingress"),
                agent.diagnostics()
            );
            ids[0]
        })
        .collect()
}

fn qdiscs(topo: &Topology, interface: &str) -> String {
    cmd::run_in(&topo.node_a, &["tc", "qdisc", "show", "dev", interface])
}

fn has_clsact(topo: &Topology, interface: &str) -> bool {
    qdiscs(topo, interface).contains("clsact")
}

fn terminate_ok(agent: &mut Agent) {
    let (status, _) = agent.terminate();
    assert!(
        status.success(),
        "exit after SIGTERM: {status}\n{}",
        agent.diagnostics()
    );
}

/// No bpf filter and no clsact on `interfaces` of node A.
fn nothing_left(topo: &Topology, interfaces: &[&str], agent: &Agent) {
    for i in interfaces {
        for direction in ["ingress", "egress"] {
            let left = filters(topo, i, direction);
            assert!(
                !left.contains("bpf"),
                "bpf filter on {i} {direction}:\n{left}\n{}",
                agent.diagnostics()
            );
        }
        assert!(
            !has_clsact(topo, i),
            "clsact qdisc on {i}:\n{}\n{}",
            qdiscs(topo, i),
            agent.diagnostics()
        );
    }
}

fn start_netlink(topo: &Topology) -> Agent<'_> {
    let mut agent = Agent::start_with_args(topo, &NETLINK);
    agent.wait_ready(node_diag_tests::agent::READY);
    agent
}

#[test]
fn netlink_mode_sigterm_leaves_no_filter_and_no_clsact() {
    let topo = Topology::new();
    let mut agent = start_netlink(&topo);
    one_filter_each(&topo, &agent, "ready agent");
    for i in INTERFACES {
        assert!(
            has_clsact(&topo, i),
            "no clsact on {i}:\n{}",
            qdiscs(&topo, i)
        );
    }
    // The pod's veth: neither filter nor clsact, from the start.
    nothing_left(&topo, &POD_SIDE, &agent);
    terminate_ok(&mut agent);
    nothing_left(&topo, &INTERFACES, &agent);
}

/// In the default attach mode (TCX on this kernel, netlink filters before 6.6), the
/// classifier goes on the underlay and the overlay, never on a pod's veth.
#[test]
fn default_mode_leaves_the_pods_veths_alone() {
    let topo = Topology::new();
    let mut agent = Agent::start_with_args(&topo, &["--icmp-watch", "always"]);
    agent.wait_ready(node_diag_tests::agent::READY);
    let log = agent.stderr();
    for i in INTERFACES {
        assert!(
            log.contains(&format!("TC ingress attached interface={i} ")),
            "no TC ingress on {i}\n{}",
            agent.diagnostics()
        );
    }
    for i in POD_SIDE {
        assert!(
            !log.contains(&format!("TC ingress attached interface={i} ")),
            "TC ingress on the pod's veth {i}\n{}",
            agent.diagnostics()
        );
    }
    nothing_left(&topo, &POD_SIDE, &agent);
    terminate_ok(&mut agent);
}

/// A crash loop: each killed agent leaves its filters (they keep running: the leak this
/// guards against), each new one replaces them, and the last one's clean exit removes the
/// filters and the clsact the first one added.
#[test]
fn killed_agents_filters_are_replaced_and_their_clsact_removed_on_exit() {
    let topo = Topology::new();
    let mut agent = start_netlink(&topo);
    let mut ids = one_filter_each(&topo, &agent, "first agent");
    for round in 1..=2 {
        agent.kill();
        let left = one_filter_each(&topo, &agent, "after kill -9");
        assert_eq!(left, ids, "a killed agent's filters stay as they were");
        drop(agent);

        agent = start_netlink(&topo);
        let now = one_filter_each(&topo, &agent, &format!("agent {} after a kill", round + 1));
        for ((i, old), new) in INTERFACES.iter().zip(&ids).zip(&now) {
            assert_ne!(
                old,
                new,
                "{i} still runs the killed agent's program {old}, not the new agent's\n{}",
                agent.diagnostics()
            );
        }
        ids = now;
    }
    terminate_ok(&mut agent);
    nothing_left(&topo, &INTERFACES, &agent);
}

/// `auto` removes what a killed netlink-mode agent left (filters and clsact): on a TCX
/// kernel it then attaches by TCX, so no filter of ours is left; on an older kernel
/// (no TCX) it attaches its own filter, so exactly one per interface.
#[test]
fn auto_mode_removes_a_killed_netlink_agents_leftovers() {
    let topo = Topology::new();
    let mut agent = start_netlink(&topo);
    let killed = one_filter_each(&topo, &agent, "netlink agent");
    agent.kill();
    drop(agent);

    let mut agent =
        Agent::start_with_args(&topo, &["--tc-attach", "auto", "--icmp-watch", "always"]);
    agent.wait_ready(node_diag_tests::agent::READY);
    if !node_diag_tests::kernel_has_tcx() {
        let now = one_filter_each(&topo, &agent, "auto agent without TCX");
        assert!(
            now.iter().all(|id| !killed.contains(id)),
            "the killed agent's programs {killed:?} are still attached: {now:?}\n{}",
            agent.diagnostics()
        );
        terminate_ok(&mut agent);
        nothing_left(&topo, &INTERFACES, &agent);
        return;
    }
    for i in INTERFACES {
        let left = filters(&topo, i, "ingress");
        assert!(
            !left.contains("nd_tc_ingress"),
            "the killed agent's filter is still on {i}:\n{left}\n{}",
            agent.diagnostics()
        );
    }
    terminate_ok(&mut agent);
    nothing_left(&topo, &INTERFACES, &agent);
}

/// An agent that watches ICMP only once trouble shows (the default) attaches nothing at
/// start, but still removes what a killed agent left: its filters would otherwise run on
/// every packet until the next trouble.
#[test]
fn on_trouble_agent_removes_a_killed_agents_leftovers_without_attaching() {
    let topo = Topology::new();
    let mut agent = start_netlink(&topo);
    one_filter_each(&topo, &agent, "netlink agent");
    agent.kill();
    drop(agent);

    let mut agent = Agent::start_with_args(&topo, &["--tc-attach", "netlink"]);
    agent.wait_ready(node_diag_tests::agent::READY);
    assert!(
        agent
            .stderr()
            .contains("deleted TC filters a previous agent left"),
        "{}",
        agent.diagnostics()
    );
    nothing_left(&topo, &INTERFACES, &agent);
    assert_eq!(agent.counter("node_diag_icmp_watch"), 0.0);
    terminate_ok(&mut agent);
    nothing_left(&topo, &INTERFACES, &agent);
}

/// Asserts the foreign filter is on [`SHARED_IF`]'s `direction`.
fn foreign_intact(topo: &Topology, agent: &Agent, direction: &str, when: &str) {
    assert!(
        has_clsact(topo, SHARED_IF),
        "{when}: the foreign clsact on {SHARED_IF} is gone\n{}",
        agent.diagnostics()
    );
    let shown = filters(topo, SHARED_IF, direction);
    assert!(
        shown.contains("pref 1 u32") && shown.contains("flowid 1:1"),
        "{when}: the foreign u32 filter on {SHARED_IF} {direction} is gone:\n{shown}\n{}",
        agent.diagnostics()
    );
}

/// Another tool's clsact on [`SHARED_IF`], with its filter on `direction`, there before
/// the agent.
fn foreign_clsact_with_filter(topo: &Topology, direction: &str) {
    cmd::run_in(
        &topo.node_a,
        &["tc", "qdisc", "add", "dev", SHARED_IF, "clsact"],
    );
    foreign_filter(topo, direction);
}

/// Once the agent has exited: the foreign filter on `direction` as it was, and nothing
/// of the agent's anywhere.
fn only_the_foreign_filter_left(topo: &Topology, agent: &Agent, direction: &str) {
    foreign_intact(topo, agent, direction, "after exit");
    let left = filters(topo, SHARED_IF, "ingress");
    assert!(!left.contains("bpf"), "bpf filter left:\n{left}");
    nothing_left(topo, &[VXLAN_IF, POD_HOST_IF], agent);
}

#[test]
fn foreign_clsact_and_filter_survive_start_and_sigterm() {
    let topo = Topology::new();
    foreign_clsact_with_filter(&topo, "ingress");

    let mut agent = start_netlink(&topo);
    one_filter_each(&topo, &agent, "ready agent");
    foreign_intact(&topo, &agent, "ingress", "agent running");
    terminate_ok(&mut agent);

    only_the_foreign_filter_left(&topo, &agent, "ingress");
}

/// A killed agent's filter beside another tool's: the next agent removes only its own,
/// and since the clsact is not empty after that, it is not taken for the agent's.
#[test]
fn killed_agents_filter_beside_a_foreign_one_goes_alone() {
    let topo = Topology::new();
    foreign_clsact_with_filter(&topo, "egress");

    let mut agent = start_netlink(&topo);
    one_filter_each(&topo, &agent, "first agent");
    agent.kill();
    drop(agent);

    let mut agent = start_netlink(&topo);
    one_filter_each(&topo, &agent, "agent after a kill");
    foreign_intact(&topo, &agent, "egress", "agent after a kill");
    terminate_ok(&mut agent);

    only_the_foreign_filter_left(&topo, &agent, "egress");
}

/// A clsact the agent added but another tool started using is kept on exit, with the
/// other tool's filter.
#[test]
fn agents_clsact_holding_a_foreign_filter_is_kept() {
    let topo = Topology::new();
    let mut agent = start_netlink(&topo);
    one_filter_each(&topo, &agent, "ready agent");
    foreign_filter(&topo, "egress");
    terminate_ok(&mut agent);

    only_the_foreign_filter_left(&topo, &agent, "egress");
}

/// `mtu.rs`'s `frag_needed_from_beyond_this_node_is_counted_as_received` through the
/// netlink filter: node B's veth to pod B at 1400, so node B answers pod A's 1450-byte
/// segments with frag-needed, which crosses node A's overlay on its way back.
#[test]
fn netlink_filter_sees_frag_needed_from_beyond_this_node() {
    const FRAG_RECEIVED: &str = r#"node_diag_icmp_frag_needed_total{direction="received"}"#;
    let topo = Topology::new();
    node_diag_tests::narrow_node_b_pod_link(&topo, 1400);
    let agent = start_netlink(&topo);
    one_filter_each(&topo, &agent, "ready agent");
    let before = agent.counter(FRAG_RECEIVED);
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9004), ServerMode::Echo);
    let reply = bulk_to_pod_b(&topo, 9004, 4, Duration::from_secs(10)).unwrap_or_else(|e| {
        let route = cmd::try_run_in(
            &topo.pod_a,
            &["ip", "route", "get", &topo.pod_b_ip.to_string()],
        );
        let snmp = cmd::try_run_in(&topo.node_b, &["cat", "/proc/net/snmp"]);
        panic!(
            "PMTUD recovers: the transfer completes: {e}\npod A: {}\nnode B snmp:\n{}\nvx0 filters:\n{}\n{}",
            String::from_utf8_lossy(&route.stdout),
            String::from_utf8_lossy(&snmp.stdout),
            filters(&topo, "vx0", "ingress"),
            agent.diagnostics()
        )
    });
    assert_eq!(reply.len(), BULK);
    agent.wait_counter_at_least(FRAG_RECEIVED, before + 1.0, Duration::from_secs(3));
    agent.expect_no_finding(
        |f| field(f, "kind") == "df_oversize_drop",
        Duration::from_secs(1),
    );
}
