//! End-to-end scenarios: the real agent in node A, real faults made in the
//! namespaces, and assertions on its findings (kind, layer, flow) and metrics.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test scenarios -- --test-threads=1`.

use std::net::Ipv4Addr;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use node_diag_tests::finding::{assert_shape, field, flow_is, involves};
use node_diag_tests::process::run_with_timeout;
use node_diag_tests::tunnel::tunnels_required;
use node_diag_tests::{
    Agent, ConnectOutcome, ServerMode, TcpServer, Topology, cmd, node_diag_bin, tcp_connect,
    tcp_request,
};
use serde_json::Value;

/// One step of client traffic that should succeed or fail quickly.
const STEP: Duration = Duration::from_secs(3);

const REFUSED: &str = r#"node_diag_tcp_connect_failures_total{reason="refused"}"#;
const TIMEOUT: &str = r#"node_diag_tcp_connect_failures_total{reason="timeout"}"#;
const UNREACHABLE: &str = r#"node_diag_tcp_connect_failures_total{reason="unreachable"}"#;
const RESETS_RECEIVED: &str = r#"node_diag_tcp_resets_total{direction="received"}"#;
const RESETS_SENT: &str = r#"node_diag_tcp_resets_total{direction="sent"}"#;

/// Matches findings of `kind` (any of `kinds`) and `layer` about
/// `src` -> `dst`:`dport`.
fn finding_on_flow<'a>(
    kinds: &'a [&'a str],
    layer: &'a str,
    (src, dst, dport): (Ipv4Addr, Ipv4Addr, u16),
) -> impl Fn(&Value) -> bool + 'a {
    move |f| {
        kinds.contains(&field(f, "kind"))
            && field(f, "layer") == layer
            && flow_is(f, src, dst, dport)
    }
}

/// The time left of `budget` counted from `start`.
fn left(start: Instant, budget: Duration) -> Duration {
    budget.saturating_sub(start.elapsed())
}

/// Connects from `netns` to `addr` on a background thread.
fn connect_in_background(
    netns: &str,
    addr: std::net::SocketAddr,
    timeout: Duration,
) -> thread::JoinHandle<ConnectOutcome> {
    let ns = netns.to_owned();
    thread::spawn(move || tcp_connect(&ns, addr, timeout))
}

#[test]
fn healthy_traffic_makes_no_finding() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(8080), ServerMode::Echo);

    for i in 0..20 {
        let msg = format!("request {i}");
        let reply = tcp_request(&topo.pod_a, server.addr(), msg.as_bytes(), STEP)
            .unwrap_or_else(|e| panic!("healthy request {i} failed: {e}"));
        assert_eq!(reply, msg.as_bytes(), "echo of request {i}");
    }
    assert_eq!(server.accepted(), 20);

    let pods = (topo.pod_a_ip, topo.pod_b_ip);
    agent.expect_no_finding(
        |f| field(f, "kind").starts_with("tcp_") && (involves(f, pods.0) || involves(f, pods.1)),
        Duration::from_secs(4),
    );
    assert_eq!(
        agent.stdout_garbage(),
        Vec::<String>::new(),
        "stdout is JSON lines only"
    );
}

#[test]
fn refused_connect_is_a_listener_problem() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let before = agent.counter(REFUSED);

    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(8081), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");

    let flow = (topo.pod_a_ip, topo.pod_b_ip, 8081);
    let finding = agent.wait_finding(
        finding_on_flow(&["tcp_refused"], "listener", flow),
        Duration::from_secs(1),
    );
    assert_shape(&finding);
    agent.wait_counter_at_least(REFUSED, before + 1.0, STEP);

    let severity = field(&finding, "severity");
    let by_kind = format!(
        r#"node_diag_findings_total{{kind="tcp_refused",layer="listener",severity="{severity}",namespace=""}}"#
    );
    agent.wait_counter_at_least(&by_kind, 1.0, STEP);

    let served = agent.findings_endpoint();
    assert!(
        served
            .iter()
            .any(finding_on_flow(&["tcp_refused"], "listener", flow)),
        "GET /findings lacks the refused flow: {served:#?}"
    );
    assert_eq!(
        agent.stdout_garbage(),
        Vec::<String>::new(),
        "stdout is JSON lines only"
    );
}

/// A reset answering a SYN no socket wanted is traced without a socket and counted
/// through the device the SYN came in on: counted when that device is in one of this
/// node's namespaces (pod A's), not when it is in another node's (pod B's).
#[test]
fn reset_sent_for_a_closed_port_counts_on_the_node_that_sent_it() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let sent_before = agent.counter(RESETS_SENT);

    // Pod B (node B) refuses pod A: the reset leaves node B's pod.
    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(8084), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    agent.wait_finding(
        finding_on_flow(
            &["tcp_refused"],
            "listener",
            (topo.pod_a_ip, topo.pod_b_ip, 8084),
        ),
        Duration::from_secs(1),
    );
    assert_eq!(
        agent.counter(RESETS_SENT),
        sent_before,
        "a reset sent in another node's pod was counted"
    );

    // Pod A refuses pod B: the reset leaves this node's pod. Kernels before 6.10 (6.1
    // among them) trace only resets sent by a socket, so there it is not seen at all.
    if node_diag_tests::kernel_version() < (6, 10) {
        eprintln!("socketless resets are not traced on this kernel: second half skipped");
        return;
    }
    let outcome = tcp_connect(&topo.pod_b, topo.pod_a_addr(8084), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    agent.wait_counter_at_least(RESETS_SENT, sent_before + 1.0, STEP);
    // The connect was pod B's, another node's: no finding here.
    agent.expect_no_finding(
        |f| field(f, "kind") == "tcp_refused" && flow_is(f, topo.pod_b_ip, topo.pod_a_ip, 8084),
        Duration::from_secs(1),
    );
}

#[test]
fn forward_drop_timeout_is_a_firewall_problem() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(8082), ServerMode::Echo);
    topo.drop_forwarded_tcp(&topo.node_a, 8082);
    let before = agent.counter(TIMEOUT);

    let start = Instant::now();
    let client = connect_in_background(&topo.pod_a, server.addr(), Duration::from_secs(6));
    let flow = (topo.pod_a_ip, topo.pod_b_ip, 8082);
    let finding = agent.try_wait_finding(
        finding_on_flow(&["tcp_timeout"], "firewall", flow),
        left(start, Duration::from_secs(5)),
    );
    let outcome = client.join().expect("client thread");
    let finding = finding.unwrap_or_else(|| {
        panic!(
            "no tcp_timeout/firewall finding within 5 s of the connect (client: {outcome:?})\n{}",
            agent.diagnostics()
        )
    });
    assert_shape(&finding);
    assert_eq!(
        finding["evidence"]["drop_reason"], "NETFILTER_DROP",
        "evidence of the firewall drop: {finding:#}"
    );
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
    assert_eq!(server.accepted(), 0, "the SYN must never reach the server");
    agent.wait_counter_at_least(TIMEOUT, before + 1.0, STEP);
}

#[test]
fn reset_by_peer_is_reported_as_reset_not_refused() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let server = TcpServer::start(
        &topo.pod_b,
        topo.pod_b_addr(8083),
        ServerMode::ResetAfterFirstByte,
    );
    let before = agent.counter(RESETS_RECEIVED);

    let err = tcp_request(&topo.pod_a, server.addr(), b"x", STEP)
        .expect_err("the server aborts the connection");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");

    let flow = (topo.pod_a_ip, topo.pod_b_ip, 8083);
    let finding = agent.wait_finding(
        finding_on_flow(&["tcp_reset"], "peer", flow),
        Duration::from_secs(2),
    );
    assert_shape(&finding);
    agent.wait_counter_at_least(RESETS_RECEIVED, before + 1.0, STEP);
    agent.expect_no_finding(
        |f| field(f, "kind") == "tcp_refused" && f["dport"].as_u64() == Some(8083),
        Duration::from_secs(1),
    );
}

#[test]
fn missing_pod_route_is_a_cni_routing_problem() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    topo.delete_pod_route(&topo.node_b, topo.pod_b_ip);
    let (unreachable_before, timeout_before) = (agent.counter(UNREACHABLE), agent.counter(TIMEOUT));

    // Node B has no route to its pod: it answers the SYN with an ICMP unreachable, which
    // fails the connect at once (not a timeout).
    let start = Instant::now();
    let client = connect_in_background(&topo.pod_a, topo.pod_b_addr(8084), Duration::from_secs(6));
    let flow = (topo.pod_a_ip, topo.pod_b_ip, 8084);
    let finding = agent.try_wait_finding(
        finding_on_flow(&["tcp_unreachable"], "cni_routing", flow),
        left(start, Duration::from_secs(3)),
    );
    let outcome = client.join().expect("client thread");
    let failed_after = start.elapsed();
    let finding = finding.unwrap_or_else(|| {
        panic!(
            "no tcp_unreachable/cni_routing finding within 3 s of the connect \
             (client: {outcome:?})\n{}",
            agent.diagnostics()
        )
    });
    assert_shape(&finding);
    assert!(
        outcome.is_icmp_failure() && failed_after < Duration::from_secs(3),
        "{outcome:?} after {failed_after:?}"
    );
    let errno = field(&finding["evidence"], "errno");
    assert!(
        errno == "EHOSTUNREACH" || errno == "ENETUNREACH",
        "the ICMP unreachable's errno: {finding:#}"
    );
    agent.wait_counter_at_least(UNREACHABLE, unreachable_before + 1.0, STEP);
    assert_eq!(
        agent.counter(TIMEOUT),
        timeout_before,
        "an unreachable is not also a timeout"
    );
}

/// Ids of loaded eBPF programs whose name starts with `nd_`.
fn nd_program_ids() -> Vec<u64> {
    let out = cmd::run(&["bpftool", "prog", "show", "--json"]);
    let progs: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("bpftool prog show --json: {e}\n{out}"));
    progs
        .as_array()
        .expect("bpftool prints an array")
        .iter()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("nd_")))
        .filter_map(|p| p["id"].as_u64())
        .collect()
}

#[test]
fn sigterm_exits_cleanly_and_detaches() {
    let topo = Topology::new();
    // Programs of another agent on this machine (a developer's) are not ours.
    let foreign = nd_program_ids();
    let mut agent = Agent::start_ready(&topo);
    let ours: Vec<u64> = nd_program_ids()
        .into_iter()
        .filter(|id| !foreign.contains(id))
        .collect();
    assert!(
        !ours.is_empty(),
        "a ready agent shows no `nd_` program in `bpftool prog show`\n{}",
        agent.diagnostics()
    );
    let build_info = format!(
        r#"node_diag_build_info{{version="{}"}}"#,
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(agent.metric(&build_info), Some(1.0), "{build_info}");

    let (status, elapsed) = agent.terminate();
    assert!(
        status.success(),
        "exit after SIGTERM: {status}\n{}",
        agent.diagnostics()
    );
    assert!(
        elapsed <= Duration::from_secs(2),
        "took {elapsed:?} to exit after SIGTERM"
    );

    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left_over: Vec<u64> = nd_program_ids()
            .into_iter()
            .filter(|id| ours.contains(id))
            .collect();
        if left_over.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "programs {left_over:?} still loaded 3 s after exit"
        );
        thread::sleep(Duration::from_millis(100));
    }
    let qdiscs = cmd::run_in(&topo.node_a, &["tc", "qdisc", "show"]);
    assert!(
        !qdiscs.contains("clsact"),
        "clsact qdisc left in node A:\n{qdiscs}"
    );
}

#[test]
fn unprivileged_run_fails_with_one_clear_line() {
    let bin = node_diag_bin();
    let run = run_with_timeout(
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ])
            .arg(&bin)
            .arg("run"),
        Duration::from_secs(10),
    );
    let status = run
        .status
        .unwrap_or_else(|| panic!("still running after 10 s as nobody: {run:?}"));
    assert!(!status.success(), "succeeded without privileges: {run:?}");
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(lines.len(), 1, "stderr must be one line: {run:?}");
    assert!(
        lines[0].starts_with("node-diag: "),
        "stderr: {:?}",
        lines[0]
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

#[test]
fn cli_help_and_usage_errors() {
    let bin = node_diag_bin();
    let help = |args: &[&str], must_mention: &[&str]| {
        let run = run_with_timeout(Command::new(&bin).args(args), STEP);
        assert_eq!(
            run.code(),
            Some(0),
            "`node-diag {}`: {run:?}",
            args.join(" ")
        );
        for word in must_mention {
            assert!(
                run.stdout.contains(word),
                "`node-diag {}` does not mention {word}:\n{}",
                args.join(" "),
                run.stdout
            );
        }
    };
    help(&["--help"], &["run", "findings", "doctor", "--help"]);
    help(
        &["run", "--help"],
        &["--listen", "--format", "--ready-file", "--syn-retries"],
    );
    help(
        &["findings", "--help"],
        &["--server", "--follow", "--format"],
    );
    help(&["doctor", "--help"], &["--format"]);

    let run = run_with_timeout(Command::new(&bin).args(["run", "--bogus"]), STEP);
    assert_eq!(run.code(), Some(2), "`node-diag run --bogus`: {run:?}");
    assert!(run.stderr.contains("--bogus"), "{}", run.stderr);
}

#[test]
fn drop_beyond_this_node_is_a_timeout_of_unknown_layer() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(8085), ServerMode::Echo);
    // The other node's firewall: this node sees its SYNs leave and nothing come back.
    topo.drop_forwarded_tcp(&topo.node_b, 8085);
    let before = agent.counter(TIMEOUT);

    let start = Instant::now();
    let client = connect_in_background(&topo.pod_a, topo.pod_b_addr(8085), Duration::from_secs(6));
    let flow = (topo.pod_a_ip, topo.pod_b_ip, 8085);
    let finding = agent.wait_finding(
        finding_on_flow(&["tcp_timeout"], "unknown", flow),
        left(start, Duration::from_secs(5)),
    );
    assert_shape(&finding);
    assert!(
        finding["evidence"].get("drop_reason").is_none(),
        "no drop on this node: {finding:#}"
    );
    assert!(
        field(&finding, "summary").contains("left this node"),
        "{finding:#}"
    );
    agent.wait_counter_at_least(TIMEOUT, before + 1.0, STEP);
    let outcome = client.join().expect("client thread");
    assert!(matches!(outcome, ConnectOutcome::TimedOut), "{outcome:?}");
}

/// `doctor` loads every program into this kernel as the agent would: each one is
/// accepted, and the programs read packets and sockets the way this kernel allows,
/// plain loads through `bpf_rdonly_cast` from Linux 6.2, probe reads before (the
/// rewritten kfunc calls are then dead code the verifier must drop).
#[test]
fn doctor_has_every_program_accepted_and_reads_as_this_kernel_allows() {
    let out = Command::new(node_diag_bin())
        .args(["doctor", "-o", "json"])
        .output()
        .expect("node-diag doctor runs");
    let report: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("doctor JSON: {e}: {out:?}"));
    let checks = report["checks"].as_array().expect("checks");
    let programs: Vec<&Value> = checks
        .iter()
        .filter(|c| {
            c["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("program nd_"))
        })
        .collect();
    // Nine programs, and where drops carry no reason (before 5.17) the fexit programs
    // that serve their fallback (checked below).
    let companions = [
        "nd_tc_shot4",
        "nd_tc_shot5",
        "nd_tc_shot_ingress",
        "nd_cgroup_shot",
    ];
    let core = programs
        .iter()
        .filter(|p| {
            !companions
                .iter()
                .any(|c| p["name"].as_str() == Some(&format!("program {c}")))
        })
        .count();
    assert_eq!(core, 9, "{report:#}");
    for program in programs {
        // fentry is refused outright on this repository's build machines, never under
        // the VM runner's Debian kernels: there the program is one more warning.
        let optional = program["name"] == "program nd_icmp6_send" && !tunnels_required();
        if optional && program["status"] == "warn" {
            continue;
        }
        assert_eq!(program["status"], "ok", "{program:#}");
    }
    let reads = checks
        .iter()
        .find(|c| c["name"] == "kernel reads")
        .unwrap_or_else(|| panic!("no kernel reads check: {report:#}"));
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut numbers = release.split(|c: char| !c.is_ascii_digit());
    let version = (
        numbers
            .next()
            .and_then(|n| n.parse::<u32>().ok())
            .expect("major"),
        numbers
            .next()
            .and_then(|n| n.parse::<u32>().ok())
            .expect("minor"),
    );
    let detail = reads["detail"].as_str().unwrap_or_default();
    if version >= (6, 2) {
        assert!(
            detail.starts_with("plain loads"),
            "Linux {release}: {reads:#}"
        );
    } else {
        assert!(
            detail.starts_with("probe reads"),
            "Linux {release}: {reads:#}"
        );
    }
    // Every hook runs, through its tracepoint or, where that is missing or lacks the
    // drop reason (5.10), its fallback, which the check names.
    for hook in checks.iter().filter(|c| {
        c["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("tracepoint ") && n != "tracepoint programs")
    }) {
        assert_eq!(hook["status"], "ok", "Linux {release}: {hook:#}");
        let detail = hook["detail"].as_str().unwrap_or_default();
        assert!(
            detail.starts_with("tracepoint, used for") || detail.contains(") instead, used for"),
            "Linux {release}: {hook:#}"
        );
    }
    let fallbacks = ["nd_err_fentry", "nd_kfree_site", "nd_icmp_fentry"];
    let named = |p: &str| checks.iter().any(|c| c["name"] == format!("program {p}"));
    if version < (5, 14) {
        // No inet_sk_error_report, icmp_send or drop reasons: every fallback runs.
        for p in fallbacks {
            assert!(named(p), "Linux {release}: no program {p}: {report:#}");
        }
    } else if version >= (5, 17) {
        for p in fallbacks {
            assert!(!named(p), "Linux {release}: program {p} runs: {report:#}");
        }
    }
    // Without drop reasons, fexit companions tell other eBPF programs' drops apart:
    // one `tcf_classify` program of the two (by its argument count), the ingress one
    // before 5.14, and the cgroup one.
    // arm64 has fexit from 6.0 only, where doctor warns instead.
    let status = |p: &str| {
        checks
            .iter()
            .find(|c| c["name"] == format!("program {p}"))
            .map(|c| c["status"].as_str().unwrap_or_default().to_owned())
    };
    if version < (5, 17) && cfg!(target_arch = "x86_64") {
        // Before 5.14 clsact ingress classifies through its own function.
        if version < (5, 14) {
            assert_eq!(
                status("nd_tc_shot_ingress").as_deref(),
                Some("ok"),
                "Linux {release}: {report:#}"
            );
        }
        let tc: Vec<_> = companions[..2].iter().filter(|p| named(p)).collect();
        assert_eq!(tc.len(), 1, "Linux {release}: {tc:?}: {report:#}");
        assert_eq!(
            status(tc[0]).as_deref(),
            Some("ok"),
            "Linux {release}: {report:#}"
        );
        assert_eq!(
            status("nd_cgroup_shot").as_deref(),
            Some("ok"),
            "Linux {release}: {report:#}"
        );
    } else if version >= (5, 17) {
        for p in companions {
            assert!(!named(p), "Linux {release}: program {p} runs: {report:#}");
        }
    }
}

/// A pod namespace joined to node A by a veth made while the agent runs, with
/// `10.99.<i>.2/30` on its side and `10.99.<i>.1` on node A's. Deleted on drop.
struct LatePod {
    netns: node_diag_tests::netns::Netns,
    ip: Ipv4Addr,
    gateway: Ipv4Addr,
}

impl LatePod {
    fn create(topo: &Topology, i: u8) -> LatePod {
        let name = format!("{}-lp{i}", node_diag_tests::unique_name());
        let netns = node_diag_tests::ok(node_diag_tests::netns::Netns::create(&name));
        let (host_if, gateway, ip) = (
            format!("lp{i}"),
            Ipv4Addr::new(10, 99, i, 1),
            Ipv4Addr::new(10, 99, i, 2),
        );
        cmd::run_in(
            &topo.node_a,
            &[
                "ip", "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns",
                &name,
            ],
        );
        cmd::run_in(
            &topo.node_a,
            &[
                "ip",
                "addr",
                "add",
                &format!("{gateway}/30"),
                "dev",
                &host_if,
            ],
        );
        cmd::run_in(&topo.node_a, &["ip", "link", "set", &host_if, "up"]);
        cmd::run_in(
            &name,
            &["ip", "addr", "add", &format!("{ip}/30"), "dev", "eth0"],
        );
        cmd::run_in(&name, &["ip", "link", "set", "eth0", "up"]);
        LatePod { netns, ip, gateway }
    }
}

/// Four pods created while the agent runs, each refused 0.5 s after its veth appeared
/// (a closed port on node A): each pod's namespace enters the scope on the link
/// notification, not at the next periodic refresh, so each first connect is judged.
#[test]
fn pods_refused_half_a_second_after_their_veth_appears_are_each_reported() {
    let topo = Topology::new();
    let agent = Agent::start_ready(&topo);
    let before = agent.counter(REFUSED);
    let port = 8095;
    let mut pods = Vec::new();
    for i in 0..4 {
        let created = Instant::now();
        let pod = LatePod::create(&topo, i);
        thread::sleep(Duration::from_millis(500).saturating_sub(created.elapsed()));
        let target = std::net::SocketAddr::new(pod.gateway.into(), port);
        let outcome = tcp_connect(pod.netns.name(), target, STEP);
        assert!(
            matches!(outcome, ConnectOutcome::Refused),
            "pod {i}: {outcome:?}"
        );
        pods.push(pod);
    }
    for (i, pod) in pods.iter().enumerate() {
        let f = agent.wait_finding(
            finding_on_flow(&["tcp_refused"], "listener", (pod.ip, pod.gateway, port)),
            STEP,
        );
        assert_shape(&f);
        let inode = std::fs::metadata(node_diag_tests::netns::netns_path(pod.netns.name()))
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap_or_else(|e| panic!("pod {i}'s namespace: {e}"));
        assert_eq!(f["netns"].as_u64(), Some(inode), "pod {i}: {f:#}");
    }
    agent.wait_counter_at_least(REFUSED, before + 4.0, STEP);
}
