//! The shipped alert rules against a real Prometheus (Debian's `prometheus` 2.42) scraping
//! the real agent in the test topology, and `promtool check metrics` on a real scrape.
//!
//! Prometheus runs inside node A (`ip netns exec`), next to the agent, and scrapes its
//! `127.0.0.1` listener every second with `deploy/prometheus/rules.yaml` loaded, each
//! rule's `for:` set to `0s` and rules evaluated every second; the test reads
//! `/api/v1/alerts`. Root, `NODE_DIAG_BIN` set (or `cargo xtask test`), one test at a time:
//! `cargo test -p node-diag-tests --test prometheus -- --test-threads=1`.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write as _;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use node_diag_common::openmetrics::openmetrics_to_text;
use node_diag_testbed::{http, process::die_with_parent};
use node_diag_tests::topology::{POD_HOST_IF, POD_IF};
use node_diag_tests::{
    Agent, BULK, ConnectOutcome, ServerMode, TcpServer, Topology, bulk_to_pod_b, ok, tcp_connect,
    tcp_request, unique_name,
};
use serde_json::Value;

const READY: Duration = Duration::from_secs(30);
/// The `node` label the test's scrape config gives the agent, as the DaemonSet's
/// relabelling does from `__meta_kubernetes_pod_node_name`.
const NODE_LABEL: &str = "node-a";
/// Alerts that may fire while pods at MTU 1500 send over a 1450 overlay with frag-needed
/// dropped; anything else firing then is a false positive.
const FAULT_ALERTS: &[&str] = &[
    "NodeDiagOverlayMTUMismatch",
    "NodeDiagPMTUDBlackhole",
    "NodeDiagDFOversizeDrops",
    "NodeDiagFragNeededFiltered",
];

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
}

/// `rules` with every `for:` set to `0s`, so that the test sees an alert fire as soon as
/// its expression holds instead of minutes later.
fn without_for(rules: &str) -> String {
    let mut out = String::with_capacity(rules.len());
    for line in rules.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("for:") {
            out.push_str(&line[..line.len() - trimmed.len()]);
            out.push_str("for: 0s");
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// A Prometheus server inside node A, as a guard: dropping it kills the server and
/// deletes its configuration and storage (printing its log first if the test failed).
/// It borrows the topology, so it stops before the namespaces go.
struct Prometheus<'t> {
    child: Child,
    netns: String,
    addr: String,
    dir: PathBuf,
    _topo: PhantomData<&'t Topology>,
}

impl<'t> Prometheus<'t> {
    /// Starts Prometheus in node A scraping `target` (job `node-diag`, label
    /// `node="node-a"`) every second with the shipped rules (`for: 0s`), and waits until
    /// it is ready.
    fn start(topo: &'t Topology, target: &str) -> Prometheus<'t> {
        let bin = which("prometheus");
        let dir = std::env::temp_dir().join(format!("{}-prometheus", unique_name()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("data")).expect("cannot create Prometheus' directory");
        let rules = fs::read_to_string(repo_path("deploy/prometheus/rules.yaml"))
            .expect("cannot read deploy/prometheus/rules.yaml");
        fs::write(dir.join("rules.yaml"), without_for(&rules)).expect("write rules");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: node-diag\n    static_configs:\n\
             \x20     - targets: ['{target}']\n        labels:\n          node: {NODE_LABEL}\n",
            rules = dir.join("rules.yaml").display(),
        );
        fs::write(dir.join("prometheus.yml"), &config).expect("write config");
        let port = ok(node_diag_testbed::agent::free_port(&topo.node_a));
        let addr = format!("127.0.0.1:{port}");
        let log = fs::File::create(dir.join("prometheus.log")).expect("create log");
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &topo.node_a])
            .arg(&bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log);
        // If the test runner dies, the kernel kills Prometheus too.
        die_with_parent(&mut command);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let mut prometheus = Prometheus {
            child,
            netns: topo.node_a.clone(),
            addr,
            dir,
            _topo: PhantomData,
        };
        prometheus.wait_ready(Duration::from_secs(30));
        prometheus
    }

    fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "prometheus exited ({status}) before it was ready\n{}",
                    self.log()
                );
            }
            if matches!(self.get("/-/ready"), Ok((200, _))) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready after {timeout:?}\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn get(&self, path: &str) -> Result<(u16, String), node_diag_testbed::Error> {
        http_get_accept(&self.netns, &self.addr, path, "application/json").map(|r| (r.0, r.2))
    }

    /// `data` of a successful API answer.
    fn api(&self, path: &str) -> Value {
        let (status, body) = self
            .get(path)
            .unwrap_or_else(|e| panic!("GET {path} from prometheus failed: {e}\n{}", self.log()));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"));
        assert!(
            status == 200 && v["status"] == "success",
            "GET {path} answered {status}: {body}"
        );
        v["data"].clone()
    }

    /// Active (pending or firing) alerts.
    fn alerts(&self) -> Vec<Value> {
        self.api("/api/v1/alerts")["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until the agent's target has been scraped successfully.
    fn wait_target_up(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let targets = self.api("/api/v1/targets");
            let active = targets["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if active
                .iter()
                .any(|t| t["labels"]["job"] == "node-diag" && t["health"] == "up")
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the agent's target is not up after {timeout:?}: {active:#?}\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until alert `name` is firing and returns it.
    fn wait_firing(&self, name: &str, timeout: Duration) -> Value {
        let timeout = node_diag_tests::agent::scaled(timeout);
        let deadline = Instant::now() + timeout;
        loop {
            let alerts = self.alerts();
            if let Some(a) = alerts
                .iter()
                .find(|a| a["labels"]["alertname"] == name && a["state"] == "firing")
            {
                return a.clone();
            }
            assert!(
                Instant::now() < deadline,
                "{name} not firing after {timeout:?}; active alerts: {alerts:#?}\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(250));
        }
    }

    /// Panics unless every rule of the shipped group evaluates without error.
    fn assert_rules_healthy(&self) {
        let rules = self.api("/api/v1/rules");
        let mut names = Vec::new();
        for group in rules["groups"].as_array().into_iter().flatten() {
            for rule in group["rules"].as_array().into_iter().flatten() {
                assert_eq!(
                    rule["health"], "ok",
                    "rule {} does not evaluate: {rule:#}",
                    rule["name"]
                );
                names.push(rule["name"].as_str().unwrap_or_default().to_owned());
            }
        }
        assert!(
            names.iter().any(|n| n == "NodeDiagPMTUDBlackhole"),
            "shipped rules not loaded: {names:?}"
        );
    }

    fn log(&self) -> String {
        let log = fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("--- prometheus log (tail) ---\n{}", tail.join("\n"))
    }
}

impl Drop for Prometheus<'_> {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if thread::panicking() {
            eprintln!("{}", self.log());
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn which(tool: &str) -> PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin"] {
        let path = Path::new(dir).join(tool);
        if path.is_file() {
            return path;
        }
    }
    panic!("{tool} not found: apt-get install prometheus (or run `cargo xtask test`)");
}

/// `GET path` on `addr` from inside `netns` with an `Accept` header: (status,
/// content type, body).
fn http_get_accept(
    netns: &str,
    addr: &str,
    path: &str,
    accept: &str,
) -> Result<(u16, String, String), node_diag_testbed::Error> {
    let response = http::get(netns, addr, path, Some(accept))?;
    Ok((response.status, response.content_type, response.body))
}

/// `promtool check metrics` on `text`: (success, what it printed).
fn promtool_check_metrics(text: &str) -> (bool, String) {
    let mut child = Command::new(which("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start promtool");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("wait for promtool");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

/// Metric names the shipped rules use (other than Prometheus' own `up`).
fn rule_metrics() -> BTreeSet<String> {
    let rules = fs::read_to_string(repo_path("deploy/prometheus/rules.yaml")).expect("rules");
    let mut names = BTreeSet::new();
    for line in rules
        .lines()
        .filter(|l| l.trim_start().starts_with("expr:"))
    {
        let mut rest = line;
        while let Some(i) = rest.find("node_diag_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names
}

fn alert_names(alerts: &[Value]) -> Vec<String> {
    alerts
        .iter()
        .map(|a| format!("{} ({})", a["labels"]["alertname"], a["state"]))
        .collect()
}

#[test]
fn agent_metrics_pass_promtool_check_metrics() {
    let topo = Topology::new();
    let mut agent = Agent::start(&topo);
    agent.wait_ready(READY);
    // Traffic, so that the labelled families have samples: a refused connect and a bulk
    // exchange between the pods.
    let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(9401), Duration::from_secs(2));
    assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9402), ServerMode::Echo);
    let reply = bulk_to_pod_b(&topo, 9402, 7, Duration::from_secs(10)).expect("bulk transfer");
    assert_eq!(reply.len(), BULK);
    agent.wait_counter_at_least(
        r#"node_diag_tcp_connect_failures_total{reason="refused"}"#,
        1.0,
        Duration::from_secs(3),
    );

    // Ask for the Prometheus text format, as promtool reads only that; an agent that
    // negotiates answers in it, one that always speaks OpenMetrics is converted.
    let (status, content_type, body) = http_get_accept(
        &topo.node_a,
        agent.listen_addr(),
        "/metrics",
        "text/plain;version=0.0.4",
    )
    .expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    let (text, how) = if content_type.starts_with("application/openmetrics-text") {
        let (ok, printed) = promtool_check_metrics(&body);
        eprintln!(
            "note: /metrics answers OpenMetrics ({content_type}) even to Accept: text/plain; \
             promtool check metrics on it as is: {} {}",
            if ok { "passes" } else { "fails:" },
            printed.trim()
        );
        (openmetrics_to_text(&body), "converted from OpenMetrics")
    } else {
        assert!(
            content_type.starts_with("text/plain"),
            "unexpected Content-Type {content_type:?}"
        );
        (body, "text format served by the agent")
    };
    let (ok, printed) = promtool_check_metrics(&text);
    assert!(
        ok && printed.trim().is_empty(),
        "promtool check metrics ({how}) failed:\n{printed}\n--- exposition ---\n{text}"
    );
    eprintln!(
        "promtool check metrics: clean ({how}, {} lines)",
        text.lines().count()
    );
}

#[test]
fn healthy_node_fires_no_alert() {
    let topo = Topology::new();
    let mut agent = Agent::start(&topo);
    agent.wait_ready(READY);
    let prometheus = Prometheus::start(&topo, agent.listen_addr());
    prometheus.wait_target_up(Duration::from_secs(15));

    // Correct MTUs, bulk traffic both ways and a second connection: a healthy node.
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9411), ServerMode::Echo);
    for _ in 0..2 {
        let reply = bulk_to_pod_b(&topo, 9411, 3, Duration::from_secs(10))
            .expect("bulk transfer over a correctly sized overlay");
        assert_eq!(reply.len(), BULK);
    }

    // Let the scrape and the evaluations catch up (rules run every second, `for: 0s`),
    // then watch: no alert may even be pending.
    thread::sleep(Duration::from_secs(3));
    prometheus.assert_rules_healthy();
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        let alerts = prometheus.alerts();
        assert!(
            alerts.is_empty(),
            "alerts on a healthy node: {:?}\n{alerts:#?}\n/metrics:\n{}",
            alert_names(&alerts),
            agent.metrics_text()
        );
        thread::sleep(Duration::from_millis(500));
    }
    assert!(agent.exit_status().is_none(), "{}", agent.diagnostics());
}

#[test]
fn mtu_mismatch_and_pmtud_black_hole_fire_their_alerts() {
    let topo = Topology::new();
    topo.set_pod_mtu(1500);
    topo.drop_frag_needed(&topo.node_a);
    let mut agent = Agent::start(&topo);
    agent.wait_ready(READY);
    let prometheus = Prometheus::start(&topo, agent.listen_addr());
    prometheus.wait_target_up(Duration::from_secs(15));

    // From netlink alone, before any traffic: pod eth0 / vpod0 at 1500 over vx0 at 1450.
    let mismatch = prometheus.wait_firing("NodeDiagOverlayMTUMismatch", Duration::from_secs(20));
    let interface = mismatch["labels"]["interface"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        [POD_IF, POD_HOST_IF].contains(&interface.as_str()),
        "mismatch on unexpected interface: {mismatch:#}"
    );
    assert_eq!(mismatch["labels"]["node"], NODE_LABEL, "{mismatch:#}");
    assert_eq!(mismatch["labels"]["severity"], "warning", "{mismatch:#}");
    let summary = mismatch["annotations"]["summary"]
        .as_str()
        .unwrap_or_default();
    assert!(
        summary.contains(NODE_LABEL)
            && summary.contains(&interface)
            && summary.contains("50 bytes"),
        "summary must name the node, the interface and the excess: {summary}"
    );

    // The black hole: a 200 KB send from pod A stalls on full-size segments.
    let _server = TcpServer::start(&topo.pod_b, topo.pod_b_addr(9421), ServerMode::Echo);
    let (ns, addr) = (topo.pod_a.clone(), topo.pod_b_addr(9421));
    let client = thread::spawn(move || tcp_request(&ns, addr, &[9; BULK], Duration::from_secs(8)));
    let blackhole = prometheus.wait_firing("NodeDiagPMTUDBlackhole", Duration::from_secs(20));
    assert_eq!(blackhole["labels"]["node"], NODE_LABEL, "{blackhole:#}");
    assert_eq!(blackhole["labels"]["severity"], "critical", "{blackhole:#}");
    let summary = blackhole["annotations"]["summary"]
        .as_str()
        .unwrap_or_default();
    assert!(
        summary.contains(NODE_LABEL),
        "summary must name the node: {summary}"
    );
    let description = blackhole["annotations"]["description"]
        .as_str()
        .unwrap_or_default();
    assert!(
        description.contains(agent.listen_addr()),
        "description must say where the findings are: {description}"
    );

    // Nothing unrelated fires (no connect timeouts, no lost events, agent up).
    prometheus.assert_rules_healthy();
    let alerts = prometheus.alerts();
    let unexpected: Vec<&Value> = alerts
        .iter()
        .filter(|a| !FAULT_ALERTS.contains(&a["labels"]["alertname"].as_str().unwrap_or_default()))
        .collect();
    assert!(unexpected.is_empty(), "unexpected alerts: {unexpected:#?}");

    // Every metric the rules use exists in the agent's exposition, under that name.
    let exposition = agent.metrics_text();
    let missing: Vec<String> = rule_metrics()
        .into_iter()
        .filter(|m| !exposition.contains(m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics the rules use but the agent does not expose: {missing:?}\n{exposition}"
    );
    eprintln!("firing: {:?}", alert_names(&alerts));

    let outcome = client.join().expect("client thread");
    assert!(
        outcome.as_ref().map_or(true, |r| r.len() < BULK),
        "the transfer completed through a black hole: {outcome:?}"
    );
}

/// An agent whose container runtime does not answer: `NodeDiagAgentDegraded` fires,
/// naming the node, the socket and what is degraded, and for nothing else (every program
/// attached, no refresh failing).
#[test]
fn an_agent_without_its_runtime_fires_agent_degraded() {
    let topo = Topology::new();
    let missing = std::env::temp_dir().join(format!("{}.sock", unique_name()));
    let missing = missing.display().to_string();
    let mut agent = Agent::start_with_args(&topo, &["--cri-socket", &missing]);
    agent.wait_ready(READY);
    let prometheus = Prometheus::start(&topo, agent.listen_addr());
    prometheus.wait_target_up(Duration::from_secs(15));

    let alert = prometheus.wait_firing("NodeDiagAgentDegraded", Duration::from_secs(20));
    assert_eq!(
        alert["labels"]["degraded"], "container_runtime",
        "{alert:#}"
    );
    assert_eq!(alert["labels"]["socket"], missing.as_str(), "{alert:#}");
    assert_eq!(alert["labels"]["node"], NODE_LABEL, "{alert:#}");
    let summary = alert["annotations"]["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(NODE_LABEL) && summary.contains("container runtime does not answer"),
        "{summary}"
    );
    prometheus.assert_rules_healthy();
    let degraded: Vec<Value> = prometheus
        .alerts()
        .into_iter()
        .filter(|a| a["labels"]["alertname"] == "NodeDiagAgentDegraded")
        .collect();
    assert_eq!(degraded.len(), 1, "only the runtime: {degraded:#?}");
}

#[test]
fn test_rules_only_change_for() {
    let rules = fs::read_to_string(repo_path("deploy/prometheus/rules.yaml")).expect("rules");
    let changed = without_for(&rules);
    assert_eq!(rules.lines().count(), changed.lines().count());
    let fors = changed
        .lines()
        .filter(|l| l.trim_start().starts_with("for:"));
    assert!(fors.clone().count() >= 6, "rules without `for:`?");
    assert!(fors.into_iter().all(|l| l.trim() == "for: 0s"));
    for (a, b) in rules.lines().zip(changed.lines()) {
        if !a.trim_start().starts_with("for:") {
            assert_eq!(a, b);
        }
    }
}

#[test]
fn openmetrics_conversion_renames_counter_and_info_families() {
    let om = "# HELP x_requests Requests.\n# TYPE x_requests counter\nx_requests_total{a=\"b\"} 1\n\
              # HELP x_build Build.\n# TYPE x_build info\nx_build_info{version=\"1\"} 1\n\
              # HELP x_up Up.\n# TYPE x_up gauge\n# UNIT x_up seconds\nx_up 1\n# EOF\n";
    assert_eq!(
        openmetrics_to_text(om),
        "# HELP x_requests_total Requests.\n# TYPE x_requests_total counter\nx_requests_total{a=\"b\"} 1\n\
         # HELP x_build_info Build.\n# TYPE x_build_info gauge\nx_build_info{version=\"1\"} 1\n\
         # HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n"
    );
}
