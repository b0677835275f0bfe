//! Conntrack verdicts: a SYN dropped because node A's conntrack table is full, and a
//! SYN-ACK conntrack found INVALID and a `ct state invalid drop` rule dropped, are
//! `layer: conntrack`; a plain drop rule while the table has room stays `firewall`.
//! The real agent in node A, real conntrack, real traffic.
//!
//! Filling a table: `net.netfilter.nf_conntrack_max` is global (writable only in the
//! initial namespace) and each namespace holds its own count to it. The test fills node
//! A's table with established (assured, so never evicted early) loopback connections,
//! then lowers the global limit to that many with a [`ConntrackMaxGuard`], which puts the
//! old limit back when it goes, panics included. The limit stays well above the count
//! of this namespace and of every named one, so the host keeps room; when it cannot
//! (a busy host), the test prints a SKIPPED line and passes.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test conntrack -- --test-threads=1`.

use std::fs;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::Duration;

use node_diag_tests::finding::{assert_shape, field, flow_is};
use node_diag_tests::{
    Agent, ConnectOutcome, ServerMode, TcpServer, Topology, cmd, in_netns, tcp_connect,
};
use serde_json::Value;

const MAX_PATH: &str = "/proc/sys/net/netfilter/nf_conntrack_max";
const COUNT_PATH: &str = "/proc/sys/net/netfilter/nf_conntrack_count";
/// New connections every other namespace may still open while the limit is lowered.
const HOST_ROOM: u64 = 64;
/// Beyond this many filler connections the host is too busy to lower the limit safely.
const MAX_FILL: u64 = 2000;

const TABLE_FULL: &str = r#"node_diag_conntrack_drops_total{reason="table_full"}"#;
const INVALID: &str = r#"node_diag_conntrack_drops_total{reason="invalid"}"#;
const TIMEOUT: &str = r#"node_diag_tcp_connect_failures_total{reason="timeout"}"#;
/// The agent's verdict comes at the second SYN retransmit, about 3 s in.
const CONNECT: Duration = Duration::from_secs(5);
const STEP: Duration = Duration::from_secs(5);

fn read_u64(path: &str) -> u64 {
    fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {path}: {e}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("parse {path}: {e}"))
}

/// The conntrack count of named namespace `netns`.
fn count_in(netns: &str) -> u64 {
    in_netns(netns, || read_u64(COUNT_PATH))
}

/// Puts the global `nf_conntrack_max` back to what it was when it goes, even when the
/// test panics.
struct ConntrackMaxGuard {
    old: u64,
}

impl ConntrackMaxGuard {
    /// Lowers the global limit to `max`.
    fn lower_to(max: u64) -> ConntrackMaxGuard {
        let old = read_u64(MAX_PATH);
        assert!(max < old, "{max} is no lower than the limit {old}");
        let guard = ConntrackMaxGuard { old };
        fs::write(MAX_PATH, max.to_string()).unwrap_or_else(|e| panic!("write {MAX_PATH}: {e}"));
        guard
    }
}

impl Drop for ConntrackMaxGuard {
    fn drop(&mut self) {
        if let Err(e) = fs::write(MAX_PATH, self.old.to_string()) {
            eprintln!("could not restore {MAX_PATH} to {}: {e}", self.old);
        }
    }
}

/// How low the global limit may go while the test runs: `HOST_ROOM` above the count of
/// this process's namespace (the initial one, the only one that can write the limit)
/// and of every named namespace but the topology's. `None`, with the reason, when the
/// limit cannot be lowered here.
fn safe_limit(topo: &Topology) -> Result<u64, String> {
    let own = fs::read_to_string(COUNT_PATH)
        .map_err(|e| format!("no conntrack in this namespace ({COUNT_PATH}: {e})"))?;
    let own: u64 = own
        .trim()
        .parse()
        .map_err(|e| format!("{COUNT_PATH}: {e}"))?;
    let writable = fs::OpenOptions::new().write(true).open(MAX_PATH).is_ok();
    if !writable {
        return Err(format!(
            "{MAX_PATH} is not writable here (not the initial namespace)"
        ));
    }
    let ours = topo.netns_names();
    let mut busiest = own;
    if let Ok(dir) = fs::read_dir("/run/netns") {
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if ours.contains(&name) {
                continue;
            }
            let count = node_diag_tests::netns::in_netns(&name, || {
                fs::read_to_string(COUNT_PATH)
                    .ok()
                    .and_then(|c| c.trim().parse::<u64>().ok())
            })
            .ok()
            .flatten()
            .unwrap_or(0);
            busiest = busiest.max(count);
        }
    }
    let limit = busiest + HOST_ROOM;
    if limit > MAX_FILL {
        return Err(format!(
            "the busiest namespace holds {busiest} conntrack entries: filling node A past {limit} is too much"
        ));
    }
    Ok(limit)
}

/// Makes conntrack track node A's traffic: nothing is tracked in a namespace until a
/// rule uses it. Table `inet ndct`, going with the namespace.
fn activate_conntrack(topo: &Topology) {
    for rule in [
        "add table inet ndct",
        "add chain inet ndct ndfwd { type filter hook forward priority 0; policy accept; }",
        "add rule inet ndct ndfwd ct state established,related accept",
    ] {
        cmd::run_in(&topo.node_a, &["nft", rule]);
    }
}

/// `count` established loopback connections in node A, both ends held: each an
/// assured conntrack entry there, which a full table never evicts.
struct Filler {
    _sockets: Vec<TcpStream>,
}

impl Filler {
    fn fill(topo: &Topology, count: u64) -> Filler {
        cmd::run(&["ip", "-n", &topo.node_a, "link", "set", "lo", "up"]);
        let sockets = in_netns(&topo.node_a, || {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind in node A");
            let addr = listener.local_addr().expect("local address");
            let mut sockets = Vec::new();
            for _ in 0..count {
                let client = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                    .expect("loopback connect in node A");
                let (server, _) = listener.accept().expect("accept");
                sockets.extend([client, server]);
            }
            sockets
        });
        Filler { _sockets: sockets }
    }
}

fn kind_on_flow(kind: &'static str, flow: (Ipv4Addr, Ipv4Addr, u16)) -> impl Fn(&Value) -> bool {
    move |f| field(f, "kind") == kind && flow_is(f, flow.0, flow.1, flow.2)
}

/// Connects pod A to pod B's `port`, which must time out, and returns the agent's
/// `tcp_timeout` finding for it.
fn timed_out_connect(topo: &Topology, agent: &Agent, port: u16) -> Value {
    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(port), CONNECT);
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    let flow = (topo.pod_a_ip, topo.pod_b_ip, port);
    agent.wait_finding(kind_on_flow("tcp_timeout", flow), STEP)
}

#[track_caller]
fn assert_layer(finding: &Value, layer: &str) {
    assert_eq!(field(finding, "layer"), layer, "layer of {finding:#}");
}

fn evidence_u64(finding: &Value, name: &str) -> u64 {
    finding["evidence"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("evidence `{name}` is not a number:\n{finding:#}"))
}

/// Node A's conntrack table is full: pod A's SYNs to pod B are dropped by conntrack on
/// node A (`NETFILTER_DROP`, like a rule's), and the connect times out. The finding
/// says conntrack, with the table's count and limit.
#[test]
fn syn_dropped_by_a_full_conntrack_table_is_conntrack() {
    let topo = Topology::new();
    let limit = match safe_limit(&topo) {
        Ok(limit) => limit,
        Err(why) => {
            println!("SKIPPED syn_dropped_by_a_full_conntrack_table_is_conntrack: {why}");
            return;
        }
    };
    let port = 9201;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    activate_conntrack(&topo);
    let agent = Agent::start_ready(&topo);
    let (before, timeouts) = (agent.counter(TABLE_FULL), agent.counter(TIMEOUT));
    assert_eq!(agent.metric(TABLE_FULL), Some(0.0), "series pre-created");

    // Node A holds `limit` assured entries (plus whatever else it tracks), so at a
    // limit of `limit` it has no room and nothing to evict.
    let _filler = Filler::fill(&topo, limit);
    let filled = count_in(&topo.node_a);
    assert!(filled >= limit, "node A tracks {filled} < {limit} entries");
    let guard = ConntrackMaxGuard::lower_to(limit);

    let f = timed_out_connect(&topo, &agent, port);
    // The agent's HTTP endpoints are in node A, whose table is full: room first.
    drop(guard);
    assert!(read_u64(MAX_PATH) > limit, "the limit is restored");

    assert_shape(&f);
    assert_layer(&f, "conntrack");
    assert_eq!(f["evidence"]["conntrack_cause"], "table_full", "{f:#}");
    assert_eq!(f["evidence"]["drop_reason"], "NETFILTER_DROP", "{f:#}");
    assert_eq!(evidence_u64(&f, "conntrack_max"), limit, "{f:#}");
    assert!(evidence_u64(&f, "conntrack_count") >= limit, "{f:#}");
    assert!(evidence_u64(&f, "conntrack_stat_drop") >= 1, "{f:#}");
    assert!(field(&f, "summary").contains("conntrack table"), "{f:#}");
    assert!(
        field(&f, "remediation").contains("nf_conntrack_max"),
        "{f:#}"
    );

    agent.wait_counter_at_least(TABLE_FULL, before + 1.0, STEP);
    agent.wait_counter_at_least(TIMEOUT, timeouts + 1.0, STEP);
    assert_eq!(agent.counter(INVALID), 0.0);
}

/// The look-alike: conntrack active in node A, its table with room, and a plain drop
/// rule for the port. The same `NETFILTER_DROP`, the same timeout: the rule's, so
/// `firewall`, with the table's room as evidence and no conntrack drop counted.
#[test]
fn drop_rule_with_room_in_the_table_stays_firewall() {
    let topo = Topology::new();
    let port = 9202;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    activate_conntrack(&topo);
    let agent = Agent::start_ready(&topo);
    topo.drop_forwarded_tcp(&topo.node_a, port);

    let f = timed_out_connect(&topo, &agent, port);
    assert_shape(&f);
    assert_layer(&f, "firewall");
    assert_eq!(f["evidence"]["drop_reason"], "NETFILTER_DROP", "{f:#}");
    assert!(f["evidence"].get("conntrack_cause").is_none(), "{f:#}");
    // The agent looked at node A's table and saw room.
    assert!(
        evidence_u64(&f, "conntrack_count") < evidence_u64(&f, "conntrack_max"),
        "{f:#}"
    );
    assert_eq!(evidence_u64(&f, "conntrack_stat_drop"), 0, "{f:#}");
    assert_eq!(agent.metric(TABLE_FULL), Some(0.0));
    assert_eq!(agent.metric(INVALID), Some(0.0));
}

/// Node A lets pod A's SYN through untracked (`notrack`), so the SYN-ACK coming back
/// matches no connection it knows: conntrack calls it INVALID and kube-proxy's kind of
/// rule (`ct state invalid drop`) drops it. The connect times out on the return path,
/// and the finding says conntrack INVALID.
#[test]
fn syn_ack_dropped_as_invalid_is_conntrack() {
    let topo = Topology::new();
    let port = 9203;
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(port), ServerMode::Echo);
    let pod_a = topo.pod_a_ip.to_string();
    for rule in [
        "add table inet ndct".to_owned(),
        "add chain inet ndct ndraw { type filter hook prerouting priority -300; policy accept; }"
            .to_owned(),
        format!("add rule inet ndct ndraw ip saddr {pod_a} tcp flags & (syn | ack) == syn notrack"),
        "add chain inet ndct ndfwd { type filter hook forward priority 0; policy accept; }"
            .to_owned(),
        "add rule inet ndct ndfwd ct state invalid drop".to_owned(),
    ] {
        cmd::run_in(&topo.node_a, &["nft", &rule]);
    }
    let agent = Agent::start_ready(&topo);
    let before = agent.counter(INVALID);

    let f = timed_out_connect(&topo, &agent, port);
    assert_shape(&f);
    assert_layer(&f, "conntrack");
    assert_eq!(f["evidence"]["conntrack_cause"], "invalid", "{f:#}");
    assert_eq!(f["evidence"]["return_path"], true, "{f:#}");
    assert_eq!(f["evidence"]["drop_reason"], "NETFILTER_DROP", "{f:#}");
    assert!(
        evidence_u64(&f, "conntrack_stat_invalid") >= evidence_u64(&f, "syn_drops"),
        "{f:#}"
    );
    assert!(field(&f, "summary").contains("INVALID"), "{f:#}");
    agent.wait_counter_at_least(INVALID, before + 1.0, STEP);
    assert_eq!(agent.metric(TABLE_FULL), Some(0.0));
}

/// The guard restores the limit when a test panics with it held.
#[test]
fn conntrack_max_guard_restores_on_panic() {
    let Ok(old) = fs::read_to_string(MAX_PATH) else {
        println!("SKIPPED conntrack_max_guard_restores_on_panic: no {MAX_PATH}");
        return;
    };
    let old: u64 = old.trim().parse().expect("a number");
    if fs::OpenOptions::new().write(true).open(MAX_PATH).is_err() {
        println!("SKIPPED conntrack_max_guard_restores_on_panic: {MAX_PATH} not writable");
        return;
    }
    // Lowered by one only: nothing on the host notices.
    let result = std::panic::catch_unwind(|| {
        let _guard = ConntrackMaxGuard::lower_to(old - 1);
        assert_eq!(read_u64(MAX_PATH), old - 1);
        panic!("test failure while lowered");
    });
    assert!(result.is_err());
    assert_eq!(read_u64(MAX_PATH), old);
}
