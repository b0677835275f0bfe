//! The agent's self-health metrics move with what they report: every tracepoint program
//! and the TC classifier on each of node A's interfaces read 1 once attached; the
//! classifier's attachment removed from outside (`bpftool link detach` of its TCX link,
//! `tc filter del` of its netlink filter) reads 0 within seconds, and is not attached
//! again behind the remover's back; a real containerd stopped reads
//! `node_diag_container_runtime_up` 0, and 1 again once restarted (a configured socket
//! that is missing reads 0 from the start); the process metrics
//! read this agent's process.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time, bpftool and
//! containerd installed (`cargo xtask prereqs --test-tools`):
//! `cargo test -p node-diag-tests --test self_health -- --test-threads=1`.

use std::{
    net::Ipv4Addr,
    thread,
    time::{Duration, Instant, SystemTime},
};

use node_diag_testbed::containerd::{Containerd, PodPool};
use node_diag_tests::agent::scaled;
use node_diag_tests::topology::{UNDERLAY_IF, VXLAN_IF};
use node_diag_tests::{Agent, Topology, cmd, kernel_has_tcx, ok};
use serde_json::Value;

const READY: Duration = Duration::from_secs(60);
/// The agent checks its TC attachments every 2 s.
const NOTICED: Duration = Duration::from_secs(6);
/// The tracepoint programs every kernel of the test matrix attaches.
/// The core hooks, each by its program and the fallbacks that stand in for it on kernels
/// without its tracepoint (5.10's `kfree_skb` has no drop reason: `nd_kfree_site`).
const CORE: [&[&str]; 4] = [
    &["nd_set_state"],
    &["nd_retransmit"],
    &["nd_kfree_skb", "nd_kfree_site"],
    &["nd_rcv_reset"],
];

/// Every core hook has its program, or a fallback of it, attached.
fn assert_core_attached(agent: &Agent) {
    for programs in CORE {
        assert!(
            programs
                .iter()
                .any(|p| agent.metric(&attached(p)) == Some(1.0)),
            "none of {programs:?} attached:\n{}",
            agent.metrics_text()
        );
    }
}

fn attached(program: &str) -> String {
    format!("node_diag_program_attached{{program=\"{program}\"}}")
}

fn tc_attached(interface: &str) -> String {
    format!("node_diag_program_attached{{program=\"nd_tc_ingress\",interface=\"{interface}\"}}")
}

/// Polls `series` until it reads `want`; panics after `timeout` (scaled) with the
/// exposition and the agent's log. Returns how long it took.
fn wait_value(agent: &Agent, series: &str, want: f64, timeout: Duration) -> Duration {
    let start = Instant::now();
    let deadline = start + scaled(timeout);
    loop {
        let value = agent.metric(series);
        if value == Some(want) {
            return start.elapsed();
        }
        if Instant::now() >= deadline {
            panic!(
                "{series} is {value:?}, expected {want} within {timeout:?}\n/metrics:\n{}\n{}",
                agent.metrics_text(),
                agent.diagnostics()
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Every core program and the classifier on both of node A's interfaces attached; the
/// process metrics this agent's.
fn assert_healthy(agent: &Agent) {
    assert_core_attached(agent);
    assert_eq!(agent.metric(&attached("nd_tc_ingress")), Some(1.0));
    for interface in [UNDERLAY_IF, VXLAN_IF] {
        wait_value(agent, &tc_attached(interface), 1.0, NOTICED);
    }
    let open = agent.metric("process_open_fds").expect("process_open_fds");
    let max = agent.metric("process_max_fds").expect("process_max_fds");
    // Program, map, link and perf event descriptors, the listener, netlink sockets.
    assert!(open >= 10.0 && open <= max, "open fds {open}, max {max}");
    let rss = agent
        .metric("process_resident_memory_bytes")
        .expect("process_resident_memory_bytes");
    assert!(rss > 4e6, "RSS {rss}");
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = agent
        .metric("process_start_time_seconds")
        .expect("process_start_time_seconds");
    assert!(
        started <= now + 1.0 && started > now - 600.0,
        "started {started}, now {now}"
    );
    assert!(agent.metric("process_cpu_seconds_total").expect("cpu") > 0.0);
    assert_eq!(
        agent.metric("node_diag_scope_refresh_failures_total"),
        Some(0.0)
    );
    assert_eq!(
        agent.metric("node_diag_mtu_refresh_failures_total"),
        Some(0.0)
    );
}

/// `ip -j link show dev <interface>` in `netns`: its ifindex.
fn ifindex(netns: &str, interface: &str) -> u64 {
    let out = cmd::run_in(netns, &["ip", "-j", "link", "show", "dev", interface]);
    let links: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    links[0]["ifindex"].as_u64().expect("ifindex")
}

/// The id of the agent's TCX link on ifindex `index`, from the fdinfo of its link
/// descriptors (`link_type: tcx`, `link_id`, `ifindex`): exact, and needs no bpftool
/// that knows TCX links.
fn tcx_link(pid: u32, index: u64) -> u64 {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir}: {e}")) {
        let Ok(text) = std::fs::read_to_string(entry.unwrap().path()) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        if field("link_type") != Some("tcx") {
            continue;
        }
        seen.push(text.clone());
        if field("ifindex").and_then(|i| i.parse().ok()) == Some(index) {
            return field("link_id")
                .and_then(|i| i.parse().ok())
                .expect("link_id");
        }
    }
    panic!("no TCX link of pid {pid} on ifindex {index}; its TCX links: {seen:#?}")
}

#[test]
fn a_tcx_attachment_detached_from_outside_reads_0() {
    if !kernel_has_tcx() {
        eprintln!("skipped: no TCX before Linux 6.6 (the netlink test covers this kernel)");
        return;
    }
    let topo = Topology::new();
    let mut agent = Agent::start_with_args(&topo, &["--icmp-watch", "always"]);
    agent.wait_ready(READY);
    assert_healthy(&agent);

    let link = tcx_link(agent.pid(), ifindex(&topo.node_a, UNDERLAY_IF));
    cmd::run(&["bpftool", "link", "detach", "id", &link.to_string()]);
    let took = wait_value(&agent, &tc_attached(UNDERLAY_IF), 0.0, NOTICED);
    eprintln!("detached link {link}: read 0 after {took:?}");
    // The other interface and the tracepoints are untouched.
    assert_eq!(agent.metric(&tc_attached(VXLAN_IF)), Some(1.0));
    assert_eq!(agent.metric(&attached("nd_set_state")), Some(1.0));
    assert!(
        agent
            .stderr()
            .contains("TC ingress attachment removed from outside the agent"),
        "{}",
        agent.diagnostics()
    );
    // Not attached again behind the remover's back.
    thread::sleep(scaled(NOTICED));
    assert_eq!(agent.metric(&tc_attached(UNDERLAY_IF)), Some(0.0));
}

#[test]
fn a_netlink_filter_deleted_from_outside_reads_0() {
    let topo = Topology::new();
    let mut agent =
        Agent::start_with_args(&topo, &["--icmp-watch", "always", "--tc-attach", "netlink"]);
    agent.wait_ready(READY);
    assert_healthy(&agent);

    cmd::run_in(
        &topo.node_a,
        &[
            "tc", "filter", "del", "dev", VXLAN_IF, "ingress", "pref", "20036",
        ],
    );
    let took = wait_value(&agent, &tc_attached(VXLAN_IF), 0.0, NOTICED);
    eprintln!("deleted the filter: read 0 after {took:?}");
    assert_eq!(agent.metric(&tc_attached(UNDERLAY_IF)), Some(1.0));
    thread::sleep(scaled(NOTICED));
    assert_eq!(agent.metric(&tc_attached(VXLAN_IF)), Some(0.0));
    let filters = cmd::run_in(
        &topo.node_a,
        &["tc", "filter", "show", "dev", VXLAN_IF, "ingress"],
    );
    assert!(
        !filters.contains("nd_tc_ingress"),
        "the filter came back: {filters}"
    );
}

/// A one-address pool of its own (no pod is created here).
const POOL: PodPool = PodPool {
    subnet: Ipv4Addr::new(10, 88, 9, 0),
    prefix: 24,
    first: Ipv4Addr::new(10, 88, 9, 10),
    last: Ipv4Addr::new(10, 88, 9, 10),
};

/// The runtime's series: labelled with its socket.
fn runtime_up(socket: &str) -> String {
    format!("node_diag_container_runtime_up{{socket=\"{socket}\"}}")
}

#[test]
fn the_container_runtime_stopped_reads_0_and_1_once_back() {
    // Read every 5 s, synced into the metric every 2 s.
    const READ: Duration = Duration::from_secs(12);
    let topo = Topology::new();
    let mut containerd = ok(Containerd::start(&topo.node_a, POOL));
    let socket = containerd.socket().display().to_string();
    let mut agent = Agent::start_with_args(&topo, &["--cri-socket", &socket]);
    agent.wait_ready(READY);
    let series = runtime_up(&socket);
    assert_eq!(agent.metric(&series), Some(1.0), "{}", agent.metrics_text());

    ok(containerd.stop());
    let took = wait_value(&agent, &series, 0.0, READ);
    eprintln!("runtime stopped: read 0 after {took:?}");

    ok(containerd.restart());
    let took = wait_value(&agent, &series, 1.0, READ);
    eprintln!("runtime restarted: read 1 after {took:?}");
}

#[test]
fn a_configured_runtime_socket_missing_reads_0() {
    let topo = Topology::new();
    let missing = std::env::temp_dir().join(format!("{}.sock", node_diag_tests::unique_name()));
    let missing = missing.display().to_string();
    let mut agent = Agent::start_with_args(&topo, &["--cri-socket", &missing]);
    agent.wait_ready(READY);
    assert_eq!(
        agent.metric(&runtime_up(&missing)),
        Some(0.0),
        "{}",
        agent.metrics_text()
    );
    // Everything else is healthy: the alert names the runtime only.
    assert_core_attached(&agent);
}
