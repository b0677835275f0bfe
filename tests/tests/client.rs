//! `node-diag findings`, the binary, against a fixture agent: a loopback HTTP server
//! serving `/findings` JSON the way today's agent does (no `id`, query parameters
//! ignored), recording each request. No root, no eBPF: what is tested is what the SRE
//! sees, from the command line to stdout, stderr and the exit status.
//!
//! `NODE_DIAG_BIN=target/debug/node-diag cargo test -p node-diag-tests --test client`.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpListener,
    process::{Command, Output, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use node_diag_tests::node_diag_bin;
use serde_json::{Value, json};

/// The fixture agent: what it answers, and the request targets it was asked.
struct Fixture {
    url: String,
    body: Arc<Mutex<String>>,
    targets: Arc<Mutex<Vec<String>>>,
}

impl Fixture {
    /// Serves `findings` on 127.0.0.1 until the test process ends.
    fn serve(findings: &Value) -> Fixture {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let body = Arc::new(Mutex::new(findings.to_string()));
        let targets = Arc::new(Mutex::new(Vec::new()));
        let (b, t) = (body.clone(), targets.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.ends_with(b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let target = head.split(' ').nth(1).unwrap_or("").to_string();
                t.lock().unwrap().push(target);
                let body = b.lock().unwrap().clone();
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Fixture { url, body, targets }
    }

    fn set(&self, findings: &Value) {
        *self.body.lock().unwrap() = findings.to_string();
    }
}

/// A finding as today's agent serves it.
fn finding(kind: &str, layer: &str, extra: Value) -> Value {
    let mut f = json!({
        "kind": kind,
        "layer": layer,
        "severity": "warning",
        "summary": format!("{kind} summary"),
        "remediation": "fix it",
        "evidence": {},
        "count": 1,
        "first_seen": "2026-12-05T07:00:00.000Z",
        "last_seen": "2026-12-05T07:00:00.000Z",
        "status": "active",
    });
    for (k, v) in extra.as_object().unwrap() {
        f[k] = v.clone();
    }
    f
}

fn pod(name: &str) -> Value {
    json!({"namespace": "shop", "name": name, "uid": format!("uid-{name}")})
}

/// Findings the client of before merged into two: they differ only in listener,
/// interface, pod or status.
fn look_alikes() -> Value {
    json!([
        finding("tcp_reset", "peer", json!({"listener": "10.0.0.2:80"})),
        finding("tcp_reset", "peer", json!({"listener": "10.0.0.2:443"})),
        finding(
            "overlay_mtu_mismatch",
            "overlay_mtu",
            json!({"interface": "veth1"})
        ),
        finding(
            "overlay_mtu_mismatch",
            "overlay_mtu",
            json!({"interface": "veth2"})
        ),
        finding(
            "tcp_refused",
            "listener",
            json!({"src": "10.0.0.1", "dst": "10.0.0.2", "dport": 80, "pod": pod("cart")})
        ),
        finding(
            "tcp_refused",
            "listener",
            json!({"src": "10.0.0.1", "dst": "10.0.0.2", "dport": 80, "pod": pod("db")})
        ),
        finding(
            "overlay_mtu_mismatch",
            "overlay_mtu",
            json!({"interface": "veth1", "status": "resolved", "resolved_at": "2026-12-05T07:05:00.000Z"})
        ),
    ])
}

fn findings(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(node_diag_bin());
    cmd.arg("findings").args(args).env_remove("NO_COLOR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run node-diag findings")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_look_alike_is_shown_in_text_and_json() {
    let agent = Fixture::serve(&look_alikes());
    let text = stdout(&findings(&["--server", &agent.url], &[]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 7, "{text}");
    for needle in [
        "listener 10.0.0.2:80 ",
        "listener 10.0.0.2:443 ",
        "dev veth2 ",
        "shop/cart → 10.0.0.2:80 ",
        "shop/db → 10.0.0.2:80 ",
        "RESOLVED: overlay_mtu_mismatch summary",
    ] {
        assert_eq!(
            lines.iter().filter(|l| l.contains(needle)).count(),
            1,
            "{needle}:\n{text}"
        );
    }
    assert!(lines.iter().all(|l| l.chars().count() <= 120), "{text}");

    let json = stdout(&findings(&["--server", &agent.url, "-o", "json"], &[]));
    let back: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        Value::Array(back),
        look_alikes(),
        "each as the agent sent it"
    );
}

#[test]
fn colour_on_request_only() {
    let agent = Fixture::serve(&look_alikes());
    let url = agent.url.as_str();
    // stdout is a pipe here: no colour unless asked, and NO_COLOR loses to the flag.
    assert!(!stdout(&findings(&["--server", url], &[])).contains('\x1b'));
    let always = stdout(&findings(
        &["--server", url, "--color", "always"],
        &[("NO_COLOR", "1")],
    ));
    assert!(always.contains("\x1b[33mWARN\x1b[0m"), "{always:?}");
    assert!(always.contains("\x1b[32mRESOLVED:\x1b[0m"), "{always:?}");
    let never = stdout(&findings(&["--server", url, "--color", "never"], &[]));
    assert!(!never.contains('\x1b'));
}

#[test]
fn filters_are_sent_as_query_parameters_and_applied_again() {
    let agent = Fixture::serve(&look_alikes());
    let out = stdout(&findings(
        &[
            "--server",
            &agent.url,
            "--kind",
            "tcp_refused,tcp_timeout",
            "--kind",
            "pmtud_blackhole",
            "--severity",
            "warning",
            "--namespace",
            "shop",
            "--pod",
            "shop/cart",
            "--since",
            "2026-12-05T06:00:00Z",
            "--status",
            "active",
        ],
        &[],
    ));
    assert_eq!(
        agent.targets.lock().unwrap().as_slice(),
        [
            "/findings?kind=tcp_refused,tcp_timeout,pmtud_blackhole&severity=warning&namespace=shop&pod=shop/cart&since=2026-12-05T06:00:00Z&status=active&limit=10000"
        ]
    );
    // This agent ignored them: the client filtered.
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert!(lines[0].contains("shop/cart → 10.0.0.2:80"), "{out}");

    let bad = findings(&["--server", &agent.url, "--severity", "high"], &[]);
    assert_eq!(bad.status.code(), Some(2), "a usage error");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("info, warning or critical"), "{stderr}");
}

#[test]
fn follow_prints_a_condition_turning_resolved() {
    let mut all = look_alikes();
    let agent = Fixture::serve(&all);
    let mut child = Command::new(node_diag_bin())
        .args([
            "findings", "--server", &agent.url, "--follow", "--last", "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start node-diag findings --follow");
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = |within: Duration| rx.recv_timeout(within).ok();
    let start = Instant::now();
    let first: Vec<String> = (0..2)
        .filter_map(|_| next(Duration::from_secs(5)))
        .collect();
    assert_eq!(first.len(), 2, "the last two: {first:?}");
    assert!(
        next(Duration::from_millis(1500)).is_none(),
        "then nothing new"
    );

    // veth2's mismatch goes away.
    all[3]["status"] = "resolved".into();
    all[3]["resolved_at"] = "2026-12-05T07:06:00.000Z".into();
    agent.set(&all);
    let line = next(Duration::from_secs(5));
    let _ = child.kill();
    let _ = child.wait();
    let line = line.expect("the resolution is printed");
    assert!(
        line.starts_with("07:06:00 WARN overlay_mtu_mismatch/overlay_mtu"),
        "{line}"
    );
    assert!(line.contains("dev veth2 "), "{line}");
    assert!(line.contains("RESOLVED:"), "{line}");
    assert!(start.elapsed() < Duration::from_secs(15));
}

#[test]
fn a_dead_agent_is_one_line_with_its_cause_once() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = findings(&["--server", &format!("http://127.0.0.1:{port}")], &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert_eq!(stderr.matches("Connection refused").count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("node-diag: cannot reach the agent at "),
        "{stderr}"
    );
}
