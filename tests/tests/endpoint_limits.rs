//! The agent started as a container runtime starts it (containerd 2.0: a soft
//! `RLIMIT_NOFILE` of 1,024) while a port scan holds idle connections to its scrape
//! listener: it raises the soft limit to the hard one and keeps answering `/healthz` (on
//! the loopback findings listener, where the kubelet's probes go) and reporting; with
//! the hard limit at 1,024 as well (`ulimit -n 1024`), the scrape listener's cap keeps
//! the connections within the open-files budget, so it still answers `/healthz` and
//! reports a refused connect made meanwhile, its own work never short of files. Also
//! `/findings`' query parameters, end to end.
//!
//! Root, `NODE_DIAG_BIN` set (or `cargo xtask integration`), one test at a time:
//! `cargo test -p node-diag-tests --test endpoint_limits -- --test-threads=1`.

use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use node_diag_tests::finding::{assert_shape, field, flow_is};
use node_diag_tests::{Agent, ConnectOutcome, Topology, ok, tcp_connect};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use serde_json::Value;

/// Idle connections held: more than a soft limit of 1,024 allows.
const IDLE: usize = 1100;
const STEP: Duration = Duration::from_secs(3);

/// This test process holds the connections: its own soft limit goes up first.
fn raise_own_limit() {
    let now = getrlimit(Resource::Nofile);
    let want = now.maximum.unwrap_or(65_536).min(65_536);
    if now.current.is_none_or(|c| c < want) {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(want),
                maximum: now.maximum,
            },
        )
        .expect("raise the test's own open-files limit");
    }
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    assert!(
        soft >= IDLE as u64 + 256,
        "the test needs {IDLE} sockets and more; soft limit {soft}"
    );
}

/// Opens `n` idle TCP connections to `addr` from inside `netns` and holds them until
/// dropped. Returns the connections made: a connect whose SYN a full accept queue
/// dropped is retransmitted after 1 s, and after 3 s it is left out.
fn hold_connections(netns: &str, addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    ok(node_diag_tests::netns::in_netns(netns, || {
        (0..n)
            .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(3)).ok())
            .collect()
    }))
}

fn listen_addr(agent: &Agent) -> SocketAddr {
    agent.listen_addr().parse().expect("a socket address")
}

/// A refused connect pod A -> pod B:8081, and its finding `tcp_refused` / `listener`.
fn refused_meanwhile(topo: &Topology, agent: &Agent, within: Duration) -> Value {
    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(8081), STEP);
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    let flow = (topo.pod_a_ip, topo.pod_b_ip, 8081);
    let finding = agent.wait_finding(
        |f| {
            field(f, "kind") == "tcp_refused"
                && field(f, "layer") == "listener"
                && flow_is(f, flow.0, flow.1, flow.2)
        },
        within,
    );
    assert_shape(&finding);
    finding
}

/// `/healthz` on the findings listener, the probes' (127.0.0.1, as the DaemonSet's
/// probes use it), answers `ok` (within the testbed's 5 s bound); returns how long it
/// took.
fn healthz(agent: &Agent) -> Result<Duration, String> {
    let start = Instant::now();
    match agent.get_findings_listener("/healthz", None) {
        Ok(r) if r.status == 200 && r.body == "ok\n" => Ok(start.elapsed()),
        Ok(r) => Err(format!("status {}: {:?}", r.status, r.body)),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn a_soft_limit_of_1024_is_raised_and_idle_connections_do_not_blind_the_agent() {
    raise_own_limit();
    let topo = Topology::new();
    let mut agent =
        Agent::start_ready_with_nofile(&topo, &["--node-name", "node-a-test"], (1024, 4096));
    let held = hold_connections(&topo.node_a, listen_addr(&agent), IDLE);
    assert_eq!(held.len(), IDLE, "every idle connection is taken");
    // Let the server accept them all: each is one of the agent's files from then on.
    thread::sleep(Duration::from_secs(1));

    let took = healthz(&agent).unwrap_or_else(|e| {
        panic!(
            "/healthz with {IDLE} idle connections: {e}\n{}",
            agent.diagnostics()
        )
    });
    assert!(took < Duration::from_secs(1), "/healthz took {took:?}");

    let finding = refused_meanwhile(&topo, &agent, Duration::from_secs(5));
    assert_eq!(finding["node"], "node-a-test", "{finding:#}");
    // Over the scrape listener's cap (256 by default) the rest were closed at once.
    let rejected = agent.counter(r#"node_diag_http_connections_rejected_total{listener="scrape"}"#);
    assert!(
        rejected >= (IDLE - 256) as f64,
        "{rejected} connections rejected of {IDLE} with a cap of 256"
    );
    let id = field(&finding, "id").to_owned();
    assert_eq!(id.len(), 16, "{finding:#}");

    // The agent's own work did not run out of files: the limit was raised.
    ok(agent.check_alive());
    let stderr = agent.stderr();
    assert!(
        stderr.contains("open-files limit raised to the hard limit"),
        "{stderr}"
    );
    assert!(!stderr.contains("Too many open files"), "{stderr}");
    drop(held);
}

/// `ulimit -n 1024`: soft and hard limits at 1,024. The connection cap is lowered to the
/// listeners' share of the budget (1,024 less 256 kept for the agent's own work, split
/// between two listeners: 384), so 1,100 idle connections to the scrape listener leave
/// files for `/healthz` on the findings listener and for the agent's own work, and a
/// refused connect made meanwhile is reported.
#[test]
fn with_a_hard_limit_of_1024_the_agent_keeps_answering_and_reporting() {
    raise_own_limit();
    let topo = Topology::new();
    let mut agent = Agent::start_ready_with_nofile(&topo, &[], (1024, 1024));
    let held = hold_connections(&topo.node_a, listen_addr(&agent), IDLE);
    assert!(held.len() >= 1024, "{} connections held", held.len());
    // Long enough for a scope refresh (every 2 s) and an MTU refresh to run meanwhile.
    thread::sleep(Duration::from_secs(5));

    let took = healthz(&agent).unwrap_or_else(|e| {
        panic!(
            "/healthz with {} idle connections under a hard limit of 1,024: {e}\n{}",
            held.len(),
            agent.diagnostics()
        )
    });
    assert!(took < Duration::from_secs(1), "/healthz took {took:?}");
    // The verdict comes from the ring buffer, opened at start: it needs no new file.
    let finding = refused_meanwhile(&topo, &agent, Duration::from_secs(10));
    assert!(!field(&finding, "node").is_empty(), "{finding:#}");
    ok(agent.check_alive());
    let stderr = agent.stderr();
    assert!(
        stderr.contains("HTTP connection cap lowered") && stderr.contains("cap=384"),
        "the cap in force is not logged:\n{stderr}"
    );
    assert!(
        !stderr.contains("Too many open files"),
        "the agent's own work ran out of files:\n{stderr}"
    );

    drop(held);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match healthz(&agent) {
            Ok(_) => break,
            Err(e) => assert!(
                Instant::now() < deadline,
                "/healthz after the idle connections closed: {e}\n{}",
                agent.diagnostics()
            ),
        }
        thread::sleep(Duration::from_millis(200));
    }
    // The first answer can wait for the accept loop's pause after running out of files
    // (a second); the next one is prompt.
    let took = healthz(&agent).unwrap_or_else(|e| panic!("/healthz: {e}"));
    assert!(took < Duration::from_secs(1), "/healthz took {took:?}");

    // A failing refresh warned once, not every tick.
    let stderr = agent.stderr();
    for line in stderr
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("again"))
    {
        eprintln!("agent: {line}");
    }
    for what in [
        "cannot list this node's network namespaces",
        "cannot read this node's interfaces for the MTU model",
    ] {
        let warned = stderr
            .lines()
            .filter(|l| l.contains("WARN") && l.contains(what))
            .count();
        assert!(warned <= 1, "{what}: warned {warned} times\n{stderr}");
    }
    ok(agent.check_alive());
}

/// `GET /findings` with query parameters, against the real agent: the filters apply,
/// the entry's id is the one printed, and a bad value is a one-line `400`.
#[test]
fn findings_are_served_filtered_with_their_id() {
    let topo = Topology::new();
    let agent = Agent::start_ready_with_nofile(&topo, &["--node-name", "n1"], (1024, 4096));
    let printed = refused_meanwhile(&topo, &agent, Duration::from_secs(5));

    let get = |path: &str| ok(agent.get_findings_listener(path, None));
    let parse = |body: &str| -> Vec<Value> { serde_json::from_str(body).expect("a JSON array") };

    let r = get("/findings?kind=tcp_refused,tcp_reset&severity=warning&since=5m&status=active");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.content_type, "application/json");
    let served = parse(&r.body);
    let same: Vec<&Value> = served.iter().filter(|f| f["id"] == printed["id"]).collect();
    assert_eq!(same.len(), 1, "{served:#?}");
    assert_eq!(same[0]["node"], "n1");
    assert!(served.iter().all(|f| f["kind"] == "tcp_refused"));

    for (query, why) in [
        ("kind=tcp_timeout", "another kind"),
        ("severity=critical", "below the minimum"),
        ("status=resolved", "another status"),
        ("namespace=kube-system", "no pod in that namespace"),
        ("pod=nobody", "no such pod"),
        ("since=2999-01-01T00:00:00Z", "seen before"),
        ("limit=0", "limit 0"),
    ] {
        let r = get(&format!("/findings?{query}"));
        assert_eq!(r.status, 200, "{query}: {}", r.body);
        assert!(
            !parse(&r.body).iter().any(|f| f["id"] == printed["id"]),
            "{query} ({why}) still serves it: {}",
            r.body
        );
    }

    for query in ["kind=tcp_nope", "limit=10001", "since=soon", "colour=red"] {
        let r = get(&format!("/findings?{query}"));
        assert_eq!(r.status, 400, "{query}: {}", r.body);
        assert_eq!(r.body.lines().count(), 1, "{query}: {:?}", r.body);
    }
    let r = get("/findings?kind=tcp_nope");
    assert!(r.body.contains("valid kinds are tcp_refused"), "{}", r.body);
}
