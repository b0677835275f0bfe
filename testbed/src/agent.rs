//! The real `node-diag run` process inside node A, as a guard.
//!
//! Started as `ip netns exec <node A> <binary> run --format json --listen <addr>
//! --findings-listen <addr> --ready-file <tmp> [extra...]` (the findings listener on a
//! free port of `127.0.0.1` unless `extra` names one). Background threads capture its
//! stdout (one JSON finding per line, kept in order; other lines are kept apart as
//! garbage) and its stderr (the last [`STDERR_KEEP`] bytes). Its HTTP endpoints are read
//! from inside node A. Dropping the guard kills the process if it still runs, and prints
//! what it captured when the thread is unwinding from a panic.

use std::{
    cell::Cell,
    io::{BufRead, BufReader, Read},
    marker::PhantomData,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    Error, Result, Topology, cmd, http, metrics,
    netns::in_netns,
    process::{die_with_parent, limit_open_files, send_signal, wait_timeout},
};

/// How much of the agent's stderr is kept (its tail).
pub const STDERR_KEEP: usize = 1024 * 1024;
/// How long [`Agent::terminate`] waits after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(10);

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
        // A failing caller must still be able to dump what was captured.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How [`Agent::terminate`] ended the agent.
#[derive(Debug, Clone, Copy)]
pub struct Termination {
    pub status: ExitStatus,
    /// From SIGTERM to the exit.
    pub elapsed: Duration,
    /// Whether it had to be killed (it did not exit within 10 s of SIGTERM).
    pub killed: bool,
}

/// A topology the agent can run in: the namespace of its node A.
pub trait AgentHost {
    /// The network namespace the agent runs in.
    fn agent_netns(&self) -> &str;
}

impl AgentHost for Topology {
    fn agent_netns(&self) -> &str {
        &self.node_a
    }
}

/// A running agent. It borrows the [`Topology`] (or other [`AgentHost`]) it runs in, so
/// it always stops before the namespaces are deleted.
pub struct Agent<'t> {
    /// The namespace it runs in (node A), borrowed from the topology for `'t`.
    netns: String,
    _topology: PhantomData<&'t ()>,
    child: Child,
    listen: String,
    /// The findings listener's address, `None` when `extra` said `--findings-listen none`.
    findings_listen: Option<String>,
    ready_file: PathBuf,
    shared: Arc<Shared>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
    /// Whether [`Agent::diagnostics`] went into a message already, so a failure does
    /// not print it twice.
    diagnosed: Cell<bool>,
}

impl<'t> Agent<'t> {
    /// Starts `binary run` in node A listening on `listen` (a free port of node A's
    /// `127.0.0.1` when `None`) with `extra` arguments (e.g. `["--syn-retries", "2"]`).
    /// Returns at once: see [`Agent::wait_ready`].
    pub fn start(
        topo: &'t Topology,
        binary: &Path,
        listen: Option<&str>,
        extra: &[&str],
    ) -> Result<Agent<'t>> {
        Agent::start_in(topo, binary, listen, extra)
    }

    /// [`Agent::start`] in any [`AgentHost`] (e.g. a
    /// [`RoutedTopology`](crate::routed::RoutedTopology)), which it borrows.
    pub fn start_in<H: AgentHost>(
        host: &'t H,
        binary: &Path,
        listen: Option<&str>,
        extra: &[&str],
    ) -> Result<Agent<'t>> {
        Agent::launch(host, binary, listen, extra, None)
    }

    /// [`Agent::start_in`] with open-files limits `(soft, hard)`, as a container
    /// runtime sets them (containerd 2.0: a soft limit of 1,024).
    pub fn start_with_nofile<H: AgentHost>(
        host: &'t H,
        binary: &Path,
        listen: Option<&str>,
        extra: &[&str],
        nofile: (u64, u64),
    ) -> Result<Agent<'t>> {
        Agent::launch(host, binary, listen, extra, Some(nofile))
    }

    fn launch<H: AgentHost>(
        host: &'t H,
        binary: &Path,
        listen: Option<&str>,
        extra: &[&str],
        nofile: Option<(u64, u64)>,
    ) -> Result<Agent<'t>> {
        crate::require_root()?;
        let netns = host.agent_netns().to_owned();
        let [port, findings_port] = free_ports(&netns)?;
        let listen = match listen {
            Some(listen) => listen.to_owned(),
            None => format!("127.0.0.1:{port}"),
        };
        let given = extra
            .iter()
            .position(|a| *a == "--findings-listen")
            .and_then(|i| extra.get(i + 1));
        let (findings_listen, findings_args) = match given {
            Some(addr) if addr.eq_ignore_ascii_case("none") => (None, Vec::new()),
            Some(addr) => (Some((*addr).to_owned()), Vec::new()),
            None => {
                let addr = format!("127.0.0.1:{findings_port}");
                (
                    Some(addr.clone()),
                    vec!["--findings-listen".to_owned(), addr],
                )
            }
        };
        let ready_file = std::env::temp_dir().join(format!("{}.ready", crate::unique_name()));
        let _ = std::fs::remove_file(&ready_file);

        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &netns])
            .arg(binary)
            .args([
                "run",
                "--format",
                "json",
                "--listen",
                &listen,
                "--ready-file",
            ])
            .arg(&ready_file)
            .args(&findings_args)
            .args(extra)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        die_with_parent(&mut command);
        if let Some((soft, hard)) = nofile {
            limit_open_files(&mut command, soft, hard);
        }
        let mut child = command.spawn().map_err(|source| Error::Spawn {
            command: cmd::display(&command),
            source,
        })?;

        let shared = Arc::new(Shared::default());
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            readers.push(spawn_stdout_reader(stdout, Arc::clone(&shared)));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.push(spawn_stderr_reader(stderr, Arc::clone(&shared)));
        }
        Ok(Agent {
            netns,
            _topology: PhantomData,
            child,
            listen,
            findings_listen,
            ready_file,
            shared,
            readers,
            status: None,
            diagnosed: Cell::new(false),
        })
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The `--listen` address (valid inside node A).
    pub fn listen_addr(&self) -> &str {
        &self.listen
    }

    /// The `--findings-listen` address (valid inside node A), `None` when disabled.
    pub fn findings_addr(&self) -> Option<&str> {
        self.findings_listen.as_deref()
    }

    /// Waits for the ready file; fails, with the agent's output, when the agent exits
    /// first or `timeout` passes.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        self.wait_ready_or(timeout, || false)
    }

    /// Like [`Agent::wait_ready`], also giving up as soon as `cancelled` says so.
    pub fn wait_ready_or(&mut self, timeout: Duration, cancelled: impl Fn() -> bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.ready_file.exists() {
                return Ok(());
            }
            if let Some(status) = self.exit_status() {
                self.join_readers();
                return Err(self.error(format!("node-diag exited ({status}) before it was ready")));
            }
            if cancelled() {
                return Err(self.error("interrupted while waiting for node-diag to be ready"));
            }
            if Instant::now() >= deadline {
                return Err(self.error(format!(
                    "node-diag not ready after {timeout:?} (no {})",
                    self.ready_file.display()
                )));
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

    /// Fails, with the agent's output, when the agent has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.exit_status() {
            Some(status) => {
                self.join_readers();
                Err(self.error(format!("node-diag exited ({status})")))
            }
            None => Ok(()),
        }
    }

    /// The findings printed so far.
    pub fn findings(&self) -> Vec<Value> {
        self.shared.lock().findings.clone()
    }

    /// Stdout lines that were not a JSON object (the contract says none).
    pub fn stdout_garbage(&self) -> Vec<String> {
        self.shared.lock().garbage.clone()
    }

    /// Lines printed on stdout so far (one per finding printed).
    pub fn stdout_lines(&self) -> u64 {
        let state = self.shared.lock();
        (state.findings.len() + state.garbage.len()) as u64
    }

    /// Whether the agent closed its stdout (it exited).
    pub fn stdout_closed(&self) -> bool {
        self.shared.lock().stdout_closed
    }

    /// What the agent wrote to stderr so far (its last [`STDERR_KEEP`] bytes).
    pub fn stderr(&self) -> String {
        self.shared.lock().stderr.clone()
    }

    /// Waits for a finding matching `pred` (including ones already printed) and returns
    /// it; `None` after `timeout`, or as soon as the agent closes its stdout (it exited).
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

    /// `GET path` on the agent from inside node A, whatever the status.
    pub fn get(&self, path: &str, accept: Option<&str>) -> Result<http::Response> {
        http::get(&self.netns, &self.listen, path, accept)
    }

    /// `GET path` on the agent's findings listener from inside node A, whatever the
    /// status; an error when the agent runs with `--findings-listen none`.
    pub fn get_findings_listener(
        &self,
        path: &str,
        accept: Option<&str>,
    ) -> Result<http::Response> {
        let Some(addr) = &self.findings_listen else {
            return Err(self.error(format!(
                "GET {path}: the agent runs with --findings-listen none"
            )));
        };
        http::get(&self.netns, addr, path, accept)
    }

    /// `GET /metrics`: the whole exposition text.
    pub fn metrics_text(&self) -> Result<String> {
        self.get_ok("/metrics")
    }

    /// `GET /findings` on the findings listener: every finding the agent holds (a JSON
    /// array, oldest first; the endpoint's largest limit is above the store's size).
    pub fn findings_endpoint(&self) -> Result<Vec<Value>> {
        let Some(addr) = &self.findings_listen else {
            return Err(self.error("GET /findings: the agent runs with --findings-listen none"));
        };
        let body = http::get_ok(&self.netns, addr, "/findings?limit=10000")
            .map_err(|e| self.error(e.to_string()))?;
        serde_json::from_str(&body).map_err(|source| Error::Json {
            what: format!("GET /findings (a JSON array expected): {body}"),
            source,
        })
    }

    /// The value of one series, e.g. `node_diag_tcp_connect_failures_total{reason="refused"}`
    /// (labels in any order); `None` when not exposed.
    pub fn metric(&self, series: &str) -> Result<Option<f64>> {
        metrics::find_value(&self.metrics_text()?, series)
    }

    fn get_ok(&self, path: &str) -> Result<String> {
        http::get_ok(&self.netns, &self.listen, path).map_err(|e| self.error(e.to_string()))
    }

    /// Sends SIGTERM and waits (up to 10 s, then SIGKILL) for the exit.
    pub fn terminate(&mut self) -> Result<Termination> {
        if let Some(status) = self.exit_status() {
            return Ok(Termination {
                status,
                elapsed: Duration::ZERO,
                killed: false,
            });
        }
        let start = Instant::now();
        send_signal(self.pid(), libc::SIGTERM)
            .map_err(|e| Error::io("cannot send SIGTERM to node-diag", e))?;
        let (status, killed) = match wait_timeout(&mut self.child, TERM_GRACE) {
            Ok(Some(status)) => (status, false),
            _ => {
                let _ = self.child.kill();
                let status = self
                    .child
                    .wait()
                    .map_err(|e| Error::io("cannot reap node-diag", e))?;
                (status, true)
            }
        };
        let elapsed = start.elapsed();
        self.status = Some(status);
        self.join_readers();
        Ok(Termination {
            status,
            elapsed,
            killed,
        })
    }

    /// Sends SIGKILL (a crash, an OOM kill: no cleanup runs) and waits for the exit.
    pub fn kill(&mut self) -> Result<ExitStatus> {
        if let Some(status) = self.exit_status() {
            return Ok(status);
        }
        send_signal(self.pid(), libc::SIGKILL)
            .map_err(|e| Error::io("cannot send SIGKILL to node-diag", e))?;
        let status = self
            .child
            .wait()
            .map_err(|e| Error::io("cannot reap node-diag", e))?;
        self.status = Some(status);
        self.join_readers();
        Ok(status)
    }

    /// The agent's findings, odd stdout lines and stderr, for failure messages.
    pub fn diagnostics(&self) -> String {
        self.diagnosed.set(true);
        // Whether the kernel's events all came: a verdict missing for want of its event
        // reads differently from one judged otherwise.
        let events = match http::get_ok(&self.netns, &self.listen, "/metrics") {
            Ok(text) => text
                .lines()
                .filter(|l| l.starts_with("node_diag_events_"))
                .collect::<Vec<_>>()
                .join("\n"),
            Err(e) => format!("(no /metrics: {e})"),
        };
        let state = self.shared.lock();
        let findings: Vec<String> = state.findings.iter().map(Value::to_string).collect();
        format!(
            "--- node-diag findings ({}) ---\n{}\n--- node-diag events ---\n{events}\n--- node-diag non-JSON stdout ---\n{}\n--- node-diag stderr ---\n{}",
            findings.len(),
            findings.join("\n"),
            state.garbage.join("\n"),
            state.stderr.trim_end()
        )
    }

    /// An [`Error::Agent`]: `what` with the agent's [`Agent::diagnostics`].
    pub fn error(&self, what: impl Into<String>) -> Error {
        Error::Agent {
            what: what.into(),
            diagnostics: self.diagnostics(),
        }
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

/// Two distinct free TCP ports on `127.0.0.1` inside `netns` (both held while the
/// second is picked).
pub fn free_ports(netns: &str) -> Result<[u16; 2]> {
    in_netns(netns, || -> std::io::Result<[u16; 2]> {
        let a = TcpListener::bind("127.0.0.1:0")?;
        let b = TcpListener::bind("127.0.0.1:0")?;
        Ok([a.local_addr()?.port(), b.local_addr()?.port()])
    })?
    .map_err(|e| Error::io(format!("no free port in {netns}"), e))
}

/// A free TCP port on `127.0.0.1` inside `netns`.
pub fn free_port(netns: &str) -> Result<u16> {
    in_netns(netns, || {
        TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr())
    })?
    .map(|addr| addr.port())
    .map_err(|e| Error::io(format!("no free port in {netns}"), e))
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
            if state.stderr.len() > 2 * STDERR_KEEP {
                let cut = state.stderr.len() - STDERR_KEEP;
                let cut = (cut..state.stderr.len())
                    .find(|&i| state.stderr.is_char_boundary(i))
                    .unwrap_or(state.stderr.len());
                state.stderr.drain(..cut);
            }
        }
    })
}
