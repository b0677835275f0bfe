//! Storms of identical verdicts: the kernel aggregates them (one ring-buffer event per
//! verdict key per window, the rest counted in `VERDICT_AGG`), and the agent still
//! accounts for every refused connect the client saw, in a finding's `count` or in
//! `node_diag_events_lost_total`. The real agent in node A, real connects from pod A.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test storm -- --test-threads=1`.

use std::net::{Ipv4Addr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use node_diag_tests::finding::{field, flow_is};
use node_diag_tests::tcp::connects_taking_error_at_once;
use node_diag_tests::topology::{POD_IF, Reject};
use node_diag_tests::{Agent, ConnectOutcome, Topology, in_netns, ok};
use serde_json::Value;

const REFUSED: &str = r#"node_diag_tcp_connect_failures_total{reason="refused"}"#;
const LOST: &str = "node_diag_events_lost_total";
const SENT: &str = "node_diag_events_sent_total";

/// How long the agent may take to account for a storm (its map reads are every 500 ms).
const SETTLE: Duration = Duration::from_secs(10);

/// Connects from pod A to pod B's closed `ports`, round robin, `per_port` times each, as
/// fast as one thread goes. Returns how many connects were refused, per port.
fn storm(topo: &Topology, ports: &[u16], per_port: usize) -> Vec<u64> {
    let addrs: Vec<_> = ports.iter().map(|&p| topo.pod_b_addr(p)).collect();
    in_netns(&topo.pod_a, || {
        let mut refused = vec![0u64; addrs.len()];
        for _ in 0..per_port {
            for (i, addr) in addrs.iter().enumerate() {
                match TcpStream::connect(addr) {
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => refused[i] += 1,
                    other => panic!("connect to {addr}: expected refused, got {other:?}"),
                }
            }
        }
        refused
    })
}

/// The `tcp_refused` findings for `src` -> `dst`:`port`.
fn refused_findings(findings: &[Value], src: Ipv4Addr, dst: Ipv4Addr, port: u16) -> Vec<&Value> {
    findings
        .iter()
        .filter(|f| field(f, "kind") == "tcp_refused" && flow_is(f, src, dst, port))
        .collect()
}

/// The summed `count` of the `tcp_refused` findings for `src` -> `dst`:`port`.
fn refused_count(findings: &[Value], src: Ipv4Addr, dst: Ipv4Addr, port: u16) -> u64 {
    refused_findings(findings, src, dst, port)
        .iter()
        .map(|f| f["count"].as_u64().unwrap_or(0))
        .sum()
}

/// Waits until `accounted()` reaches `want` (it must never exceed it), and returns its
/// last value.
fn settle(want: u64, mut accounted: impl FnMut() -> u64) -> u64 {
    let deadline = Instant::now() + SETTLE;
    loop {
        let got = accounted();
        if got >= want || Instant::now() >= deadline {
            return got;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// 2,000 refused connects to one closed port: one finding whose `count` plus the events
/// lost is exactly 2,000, the refused metric counts 2,000, and the ring buffer carried a
/// handful of events, not 2,000.
#[test]
fn refused_storm_is_aggregated_in_the_kernel_and_accounted_exactly() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9301;
    let (refused0, lost0, sent0) = (
        agent.counter(REFUSED),
        agent.counter(LOST),
        agent.counter(SENT),
    );

    let n = 2000;
    let refused = storm(&topo, &[port], n)[0];
    assert_eq!(refused, n as u64, "every connect is refused");

    let (src, dst) = (topo.pod_a_ip, topo.pod_b_ip);
    let lost = || (agent.counter(LOST) - lost0) as u64;
    let total = settle(refused, || {
        refused_count(&agent.findings_endpoint(), src, dst, port) + lost()
    });
    let findings = agent.findings_endpoint();
    let counted = refused_count(&findings, src, dst, port);
    let ours = refused_findings(&findings, src, dst, port);
    assert_eq!(
        total,
        refused,
        "finding counts {counted} + events lost {} must equal the {refused} refused connects\n{ours:#?}\n{}",
        lost(),
        agent.metrics_text()
    );
    assert_eq!(ours.len(), 1, "one finding for the storm: {ours:#?}");
    // A map read after the settle must not add more.
    thread::sleep(Duration::from_millis(1200));
    let again = refused_count(&agent.findings_endpoint(), src, dst, port) + lost();
    assert_eq!(again, refused, "counted twice\n{}", agent.metrics_text());

    assert_eq!(
        agent.counter(REFUSED) - refused0,
        refused as f64,
        "{}",
        agent.metrics_text()
    );
    let sent = agent.counter(SENT) - sent0;
    assert!(
        (1.0..=50.0).contains(&sent),
        "{sent} events for {refused} identical verdicts: not aggregated\n{}",
        agent.metrics_text()
    );
}

/// Refused connects to two closed ports look alike but are two verdict keys: two
/// findings, each with its own exact count.
#[test]
fn refused_storms_to_two_ports_make_two_exact_findings() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let ports = [9302, 9303];
    let lost0 = agent.counter(LOST);
    let refused = storm(&topo, &ports, 600);
    assert_eq!(refused, vec![600, 600]);

    let (src, dst) = (topo.pod_a_ip, topo.pod_b_ip);
    let lost = || (agent.counter(LOST) - lost0) as u64;
    settle(1200, || {
        let f = agent.findings_endpoint();
        refused_count(&f, src, dst, ports[0]) + refused_count(&f, src, dst, ports[1]) + lost()
    });
    thread::sleep(Duration::from_millis(1200));
    let findings = agent.findings_endpoint();
    assert_eq!(
        lost(),
        0,
        "nothing lost at this rate\n{}",
        agent.metrics_text()
    );
    for port in ports {
        let ours = refused_findings(&findings, src, dst, port);
        assert_eq!(ours.len(), 1, "one finding for port {port}: {findings:#?}");
        assert_eq!(
            ours[0]["count"].as_u64(),
            Some(600),
            "port {port}: {:#}",
            ours[0]
        );
    }
}

/// A verdict key idle for a while is deleted from the kernel map once accounted; the
/// next storm on it starts a fresh entry and the finding's count carries on exactly.
#[test]
fn a_storm_after_its_key_went_idle_carries_the_count_on() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let port = 9304;
    let lost0 = agent.counter(LOST);
    let (src, dst) = (topo.pod_a_ip, topo.pod_b_ip);
    let lost = || (agent.counter(LOST) - lost0) as u64;
    let accounted = || refused_count(&agent.findings_endpoint(), src, dst, port) + lost();

    let first = storm(&topo, &[port], 500)[0];
    assert_eq!(settle(first, accounted), first, "{}", agent.metrics_text());
    // The agent forgets keys idle for 5 s.
    thread::sleep(Duration::from_secs(7));
    let second = storm(&topo, &[port], 700)[0];
    let total = settle(first + second, accounted);
    thread::sleep(Duration::from_millis(1200));
    assert_eq!(total, first + second, "{}", agent.metrics_text());
    assert_eq!(
        accounted(),
        first + second,
        "counted twice\n{}",
        agent.metrics_text()
    );
}

/// `n` connects from pod A to pod B's `port`, each of whose errors the client takes the
/// moment the kernel sets it: a non-blocking connect spinning on SO_ERROR on CPU 0, while
/// RPS hands pod A's received packets to CPU 1. The kernel wakes the client before its
/// error report runs, so the report can find the error gone. The answer the socket got
/// still decides, for every connect: one finding of `layer`, counting exactly `n`, and
/// `n` in the refused metric. `reject`: node B answers each SYN that way instead of pod
/// B's closed port answering with a RST.
fn refusals_taken_at_once(port: u16, reject: Option<Reject>, layer: &str) {
    if thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: the client and the packets it receives need two CPUs");
        return;
    }
    let topo = Topology::new();
    topo.steer_rx(&topo.pod_a, POD_IF, 0b10);
    if let Some(reject) = reject {
        topo.reject_forwarded_tcp(&topo.node_b, port, reject);
        // An ICMP error for every SYN: node B's errors are not rate limited.
        ok(topo.sysctl(&topo.node_b, "net.ipv4.icmp_ratemask=0"));
    }
    let agent = Agent::start_ready(&topo);
    let (refused0, lost0) = (agent.counter(REFUSED), agent.counter(LOST));

    let n = 300;
    let outcomes = connects_taking_error_at_once(
        &topo.pod_a,
        topo.pod_b_addr(port),
        n,
        Duration::from_secs(3),
    );
    let odd: Vec<_> = outcomes
        .iter()
        .filter(|o| !matches!(o, ConnectOutcome::Refused))
        .collect();
    assert!(odd.is_empty(), "every connect is refused: {odd:?}");

    let (src, dst) = (topo.pod_a_ip, topo.pod_b_ip);
    let lost = || (agent.counter(LOST) - lost0) as u64;
    let want = n as u64;
    let total = settle(want, || {
        refused_count(&agent.findings_endpoint(), src, dst, port) + lost()
    });
    let findings = agent.findings_endpoint();
    let ours = refused_findings(&findings, src, dst, port);
    assert_eq!(
        total,
        want,
        "finding counts + events lost {} must equal the {n} refused connects\n{ours:#?}\n{}",
        lost(),
        agent.metrics_text()
    );
    assert_eq!(
        lost(),
        0,
        "nothing lost at this rate\n{}",
        agent.metrics_text()
    );
    assert_eq!(ours.len(), 1, "one finding: {ours:#?}");
    assert_eq!(field(ours[0], "layer"), layer, "{:#}", ours[0]);
    assert_eq!(
        ours[0]["evidence"]["rst_received"],
        reject.is_none(),
        "{:#}",
        ours[0]
    );
    assert_eq!(
        agent.counter(REFUSED) - refused0,
        want as f64,
        "{}",
        agent.metrics_text()
    );
}

/// Resets from pod B's closed port, each error taken at once by the client: every
/// connect is the listener's refusal.
#[test]
fn resets_whose_error_the_client_takes_at_once_are_each_the_listeners_refusal() {
    refusals_taken_at_once(9305, None, "listener");
}

/// ICMP port unreachables from a REJECT rule on node B, each error taken at once by the
/// client: every connect is the firewall's refusal (TC ingress saw each ICMP arrive).
#[test]
fn icmp_rejects_whose_error_the_client_takes_at_once_are_each_the_firewalls_refusal() {
    refusals_taken_at_once(9306, Some(Reject::IcmpPortUnreachable), "firewall");
}

/// 20,000 refused connects, each to its own closed port: 20,000 verdict keys, more than
/// the store keeps findings for, none aggregated with another. The refused metric counts
/// exactly 20,000, and the findings counted plus the events lost account for every one:
/// a key that cannot be aggregated is still sent or counted as lost, never dropped
/// silently, and none is counted twice.
#[test]
fn refusals_to_twenty_thousand_distinct_ports_are_accounted_exactly() {
    const FINDINGS: &str = r#"node_diag_findings_total{kind="tcp_refused",layer="listener",severity="warning",namespace=""}"#;
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let (refused0, lost0, found0) = (
        agent.counter(REFUSED),
        agent.counter(LOST),
        agent.counter(FINDINGS),
    );

    let ports: Vec<u16> = (20_000..40_000).collect();
    let refused: u64 = storm(&topo, &ports, 1).iter().sum();
    assert_eq!(refused, ports.len() as u64, "every connect is refused");

    // 20,000 findings to make, each printed: an emulated guest takes minutes. What is
    // asserted is the accounting, not the speed (that is the bench's): wait while the
    // count still moves.
    let accounted =
        || (agent.counter(FINDINGS) - found0) as u64 + (agent.counter(LOST) - lost0) as u64;
    let (mut last, mut moved) = (0, Instant::now());
    while last < refused && moved.elapsed() < SETTLE {
        thread::sleep(Duration::from_millis(500));
        let now = accounted();
        if now != last {
            (last, moved) = (now, Instant::now());
        }
    }
    // A map read after the settle must not add more.
    thread::sleep(Duration::from_millis(1200));
    assert_eq!(
        accounted(),
        refused,
        "findings counted {} + events lost {} must equal the {refused} refused connects\n{}",
        agent.counter(FINDINGS) - found0,
        agent.counter(LOST) - lost0,
        agent.metrics_text()
    );
    assert_eq!(
        agent.counter(REFUSED) - refused0,
        refused as f64,
        "{}",
        agent.metrics_text()
    );
    // The store keeps the newest findings: the last port's is there, whole.
    let (src, dst, last) = (topo.pod_a_ip, topo.pod_b_ip, *ports.last().unwrap());
    let lost = (agent.counter(LOST) - lost0) as u64;
    if lost == 0 {
        assert_eq!(
            refused_count(&agent.findings_endpoint(), src, dst, last),
            1,
            "the newest refusal's finding is served"
        );
    }
}
