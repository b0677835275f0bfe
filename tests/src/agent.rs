//! The real `node-diag run` process inside node A, as a guard.
//!
//! Started as `ip netns exec <node A> $NODE_DIAG_BIN run --format json
//! --listen 127.0.0.1:<port> --ready-file <tmp>`. Its stdout (one JSON finding
//! per line) and stderr are captured by background threads; a failing test
//! prints both. Dropping the guard kills the process if it still runs.

use std::cell::Cell;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::netns::in_netns;
use crate::process::{send_signal, wait_timeout};
use crate::tcp::try_http_get;
use crate::{Topology, metrics};

/// The agent binary: `$NODE_DIAG_BIN`. Panics with instructions when unset.
pub fn node_diag_bin() -> PathBuf {
    let Some(bin) = std::env::var_os("NODE_DIAG_BIN") else {
        panic!("set NODE_DIAG_BIN or run `cargo xtask test`");
    };
    let bin = PathBuf::from(bin);
    assert!(
        bin.is_file(),
        "NODE_DIAG_BIN={} is not a file; build the agent or run `cargo xtask test`",
        bin.display()
    );
    bin
}

#[derive(Default)]
struct Captured {
    findings: Vec<Value>,
    /// Stdout lines that are not a JSON object.
    garbage: Vec<String>,
    stderr: String,
    stdout_closed: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<Captured>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Captured> {
        // A panicking test must still be able to dump what was captured.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running agent. It borrows the [`Topology`] it runs in, so it always
/// stops before the namespaces are deleted.
pub struct Agent<'t> {
    topo: &'t Topology,
    child: Child,
    listen: String,
    ready_file: PathBuf,
    shared: Arc<Shared>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
    /// Whether [`Agent::diagnostics`] went into a message already, so a
    /// failing test does not print it twice.
    diagnosed: Cell<bool>,
}

impl<'t> Agent<'t> {
    /// Starts the agent in node A with the standard flags.
    pub fn start(topo: &'t Topology) -> Agent<'t> {
        Agent::start_with_args(topo, &[])
    }

    /// Starts the agent in node A with the standard flags plus `extra`
    /// (e.g. `["--syn-retries", "2"]`).
    pub fn start_with_args(topo: &'t Topology, extra: &[&str]) -> Agent<'t> {
        crate::require_root();
        let bin = node_diag_bin();
        let port = in_netns(&topo.node_a, || {
            TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("no free port in node A")
                .port()
        });
        let listen = format!("127.0.0.1:{port}");
        let ready_file = std::env::temp_dir().join(format!("{}.ready", crate::unique_name()));
        let _ = std::fs::remove_file(&ready_file);

        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &topo.node_a])
            .arg(&bin)
            .args([
                "run",
                "--format",
                "json",
                "--listen",
                &listen,
                "--ready-file",
            ])
            .arg(&ready_file)
            .args(extra)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure only calls prctl, which is async-signal-safe.
        // If the test runner dies (crash, ^C), the kernel kills the agent too;
        // `ip netns exec` execs the agent, which keeps the setting.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));

        let shared = Arc::new(Shared::default());
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let readers = vec![
            spawn_stdout_reader(stdout, Arc::clone(&shared)),
            spawn_stderr_reader(stderr, Arc::clone(&shared)),
        ];
        Agent {
            topo,
            child,
            listen,
            ready_file,
            shared,
            readers,
            status: None,
            diagnosed: Cell::new(false),
        }
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The `--listen` address (valid inside node A).
    pub fn listen_addr(&self) -> &str {
        &self.listen
    }

    /// Waits for the ready file. Panics, with the agent's stderr, when the
    /// agent exits first or `timeout` passes.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.ready_file.exists() {
                return;
            }
            if let Some(status) = self.exit_status() {
                self.join_readers();
                panic!(
                    "node-diag exited ({status}) before it was ready\n{}",
                    self.diagnostics()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "node-diag not ready after {timeout:?} (no {})\n{}",
                    self.ready_file.display(),
                    self.diagnostics()
                );
            }
            // The agent's own exit wakes us at once; the file is polled.
            let _ = wait_timeout(&mut self.child, Duration::from_millis(20));
        }
    }

    /// Its exit status if it has exited.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// The findings printed so far.
    pub fn findings(&self) -> Vec<Value> {
        self.shared.lock().findings.clone()
    }

    /// Stdout lines that were not a JSON object (the contract says none).
    pub fn stdout_garbage(&self) -> Vec<String> {
        self.shared.lock().garbage.clone()
    }

    /// Everything the agent wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.shared.lock().stderr.clone()
    }

    /// Waits for a finding matching `pred` (including ones already printed)
    /// and returns it; panics with every finding and the agent's stderr after
    /// `timeout`.
    pub fn wait_finding(&self, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Value {
        self.try_wait_finding(pred, timeout).unwrap_or_else(|| {
            panic!(
                "no matching finding within {timeout:?}\n{}",
                self.diagnostics()
            )
        })
    }

    /// Like [`Agent::wait_finding`], `None` instead of a panic. Returns early
    /// when the agent closes its stdout (it exited).
    pub fn try_wait_finding(
        &self,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        loop {
            if let Some(found) = state.findings.iter().find(|f| pred(f)) {
                return Some(found.clone());
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() || state.stdout_closed {
                return None;
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, remaining)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Watches the findings for `window` and panics (at once) if one matches
    /// `pred`, including ones already printed.
    pub fn expect_no_finding(&self, pred: impl Fn(&Value) -> bool, window: Duration) {
        if let Some(found) = self.try_wait_finding(pred, window) {
            panic!("unexpected finding:\n{found:#}\n{}", self.diagnostics());
        }
        // The wait also ends early when stdout closes: that is a failure here.
        if self.shared.lock().stdout_closed {
            panic!(
                "node-diag closed its stdout (exited?) while watched\n{}",
                self.diagnostics()
            );
        }
    }

    /// `GET /metrics` from inside node A: the whole exposition text.
    pub fn metrics_text(&self) -> String {
        match try_http_get(&self.topo.node_a, &self.listen, "/metrics") {
            Ok((200, body)) => body,
            Ok((status, body)) => panic!(
                "GET /metrics answered {status}: {body}\n{}",
                self.diagnostics()
            ),
            Err(e) => panic!("GET /metrics failed: {e}\n{}", self.diagnostics()),
        }
    }

    /// `GET /findings` from inside node A: the agent's current findings (a
    /// JSON array).
    pub fn findings_endpoint(&self) -> Vec<Value> {
        match try_http_get(&self.topo.node_a, &self.listen, "/findings") {
            Ok((200, body)) => match serde_json::from_str::<Value>(&body) {
                Ok(Value::Array(findings)) => findings,
                _ => panic!("GET /findings is not a JSON array: {body}"),
            },
            Ok((status, body)) => panic!(
                "GET /findings answered {status}: {body}\n{}",
                self.diagnostics()
            ),
            Err(e) => panic!("GET /findings failed: {e}\n{}", self.diagnostics()),
        }
    }

    /// The value of one series, e.g.
    /// `node_diag_tcp_connect_failures_total{reason="refused"}` (labels in
    /// any order); `None` when not exposed.
    pub fn metric(&self, series: &str) -> Option<f64> {
        metrics::find_value(&self.metrics_text(), series)
    }

    /// Like [`Agent::metric`], a counter not yet exposed reading as 0.
    pub fn counter(&self, series: &str) -> f64 {
        self.metric(series).unwrap_or(0.0)
    }

    /// Polls `series` until it reaches at least `min` and returns its value;
    /// panics after `timeout` with the last value and the exposition.
    pub fn wait_counter_at_least(&self, series: &str, min: f64, timeout: Duration) -> f64 {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.metrics_text();
            let value = metrics::find_value(&text, series).unwrap_or(0.0);
            if value >= min {
                return value;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{series} is {value}, expected >= {min} within {timeout:?}\n/metrics:\n{text}\n{}",
                    self.diagnostics()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends SIGTERM and waits (up to 10 s, then SIGKILL) for the exit.
    /// Returns the exit status and how long the exit took.
    pub fn terminate(&mut self) -> (ExitStatus, Duration) {
        if let Some(status) = self.exit_status() {
            return (status, Duration::ZERO);
        }
        let start = Instant::now();
        send_signal(self.pid(), libc::SIGTERM).expect("cannot send SIGTERM to node-diag");
        let status = match wait_timeout(&mut self.child, Duration::from_secs(10)) {
            Ok(Some(status)) => status,
            _ => {
                let _ = self.child.kill();
                self.child.wait().expect("cannot reap node-diag")
            }
        };
        let elapsed = start.elapsed();
        self.status = Some(status);
        self.join_readers();
        (status, elapsed)
    }

    /// The agent's findings, odd stdout lines and stderr, for failure messages.
    pub fn diagnostics(&self) -> String {
        self.diagnosed.set(true);
        let state = self.shared.lock();
        let findings: Vec<String> = state.findings.iter().map(Value::to_string).collect();
        format!(
            "--- node-diag findings ({}) ---\n{}\n--- node-diag non-JSON stdout ---\n{}\n--- node-diag stderr ---\n{}",
            findings.len(),
            findings.join("\n"),
            state.garbage.join("\n"),
            state.stderr.trim_end()
        )
    }

    fn join_readers(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

impl Drop for Agent<'_> {
    fn drop(&mut self) {
        if self.exit_status().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        self.join_readers();
        let _ = std::fs::remove_file(&self.ready_file);
        if thread::panicking() && !self.diagnosed.get() {
            eprintln!("{}", self.diagnostics());
        }
    }
}

fn spawn_stdout_reader(stdout: impl Read + Send + 'static, shared: Arc<Shared>) -> JoinHandle<()> {
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.trim().is_empty() {
                continue;
            }
            let mut state = shared.lock();
            match serde_json::from_str::<Value>(&line) {
                Ok(v) if v.is_object() => state.findings.push(v),
                _ => state.garbage.push(line),
            }
            drop(state);
            shared.changed.notify_all();
        }
        shared.lock().stdout_closed = true;
        shared.changed.notify_all();
    })
}

fn spawn_stderr_reader(stderr: impl Read + Send + 'static, shared: Arc<Shared>) -> JoinHandle<()> {
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let mut state = shared.lock();
            state.stderr.push_str(&line);
            state.stderr.push('\n');
        }
    })
}
