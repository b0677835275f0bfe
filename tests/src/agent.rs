//! The testbed's agent ([`node_diag_testbed::Agent`]) in node A, with the waits and
//! reads the tests assert on: each panics with the agent's findings and stderr.

use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::thread;
use std::time::{Duration, Instant};

use node_diag_testbed::metrics;
use serde_json::Value;

use crate::Topology;

/// The gauge of open PMTUD black holes.
pub const BLACKHOLES: &str = "node_diag_pmtud_blackholes";

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

/// A running agent. It borrows the [`Topology`] it runs in, so it always stops before
/// the namespaces are deleted. Everything the testbed's agent offers is reachable
/// through `Deref`.
pub struct Agent<'t>(node_diag_testbed::Agent<'t>);

impl<'t> Deref for Agent<'t> {
    type Target = node_diag_testbed::Agent<'t>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Agent<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// How long loading and attaching the eBPF programs may take (debug build included).
pub const READY: Duration = Duration::from_secs(30);

/// Environment variable multiplying every wait on the agent: the VM runner sets it for
/// guests under software emulation (TCG), where everything runs several times slower.
/// Verdict latency itself is measured on real hardware (`cargo xtask bench`); in a
/// guest the tests prove the verdicts, not their speed.
pub const TIME_SCALE_ENV: &str = "NODE_DIAG_TEST_TIME_SCALE";

/// `d` times [`TIME_SCALE_ENV`] (1 when unset or invalid, at most 20).
pub fn scaled(d: Duration) -> Duration {
    let scale = std::env::var(TIME_SCALE_ENV)
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .clamp(1, 20);
    d * scale
}

impl<'t> Agent<'t> {
    /// Starts the agent in node A with the standard flags and waits until it is ready
    /// (at most [`READY`]).
    pub fn start_ready(topo: &'t Topology) -> Agent<'t> {
        let mut agent = Agent::start(topo);
        agent.wait_ready(READY);
        agent
    }

    /// [`Agent::start_ready`] with `--icmp-watch always`: the TC classifier attached from
    /// the start, for tests of what it sees when nothing else would have attached it (a
    /// PMTUD that works, the first ICMP error of an episode).
    pub fn start_ready_watching_icmp(topo: &'t Topology) -> Agent<'t> {
        let mut agent = Agent::start_with_args(topo, &["--icmp-watch", "always"]);
        agent.wait_ready(READY);
        agent
    }

    /// [`Agent::start_ready`] in another topology's node A (a
    /// [`RoutedTopology`](node_diag_testbed::RoutedTopology)), which it borrows.
    pub fn start_ready_in<H: node_diag_testbed::AgentHost>(host: &'t H) -> Agent<'t> {
        Agent::start_ready_in_with_args(host, &[])
    }

    /// [`Agent::start_ready_in`] with `extra` flags.
    pub fn start_ready_in_with_args<H: node_diag_testbed::AgentHost>(
        host: &'t H,
        extra: &[&str],
    ) -> Agent<'t> {
        crate::require_root();
        let bin = node_diag_bin();
        let mut agent = Agent(crate::ok(node_diag_testbed::Agent::start_in(
            host, &bin, None, extra,
        )));
        agent.wait_ready(READY);
        agent
    }

    /// [`Agent::start_ready_in_with_args`] with its scrape listener on `listen`.
    pub fn start_ready_in_listening<H: node_diag_testbed::AgentHost>(
        host: &'t H,
        listen: &str,
        extra: &[&str],
    ) -> Agent<'t> {
        crate::require_root();
        let bin = node_diag_bin();
        let mut agent = Agent(crate::ok(node_diag_testbed::Agent::start_in(
            host,
            &bin,
            Some(listen),
            extra,
        )));
        agent.wait_ready(READY);
        agent
    }

    /// [`Agent::start_ready`] with open-files limits `(soft, hard)` as a container
    /// runtime sets them, and `extra` flags.
    pub fn start_ready_with_nofile(
        topo: &'t Topology,
        extra: &[&str],
        nofile: (u64, u64),
    ) -> Agent<'t> {
        crate::require_root();
        let bin = node_diag_bin();
        let host: &'t node_diag_testbed::Topology = topo;
        let mut agent = Agent(crate::ok(node_diag_testbed::Agent::start_with_nofile(
            host, &bin, None, extra, nofile,
        )));
        agent.wait_ready(READY);
        agent
    }

    /// Starts the agent in node A with the standard flags.
    pub fn start(topo: &'t Topology) -> Agent<'t> {
        Agent::start_with_args(topo, &[])
    }

    /// Starts the agent in node A with the standard flags plus `extra`
    /// (e.g. `["--syn-retries", "2"]`), on a free port of node A.
    pub fn start_with_args(topo: &'t Topology, extra: &[&str]) -> Agent<'t> {
        crate::require_root();
        let bin = node_diag_bin();
        Agent(crate::ok(node_diag_testbed::Agent::start(
            topo, &bin, None, extra,
        )))
    }

    /// Waits for the ready file. Panics, with the agent's stderr, when the agent exits
    /// first or `timeout` passes.
    pub fn wait_ready(&mut self, timeout: Duration) {
        crate::ok(self.0.wait_ready(scaled(timeout)));
    }

    /// Its exit status if it has exited.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.0.exit_status()
    }

    /// Waits for a finding matching `pred` (including ones already printed) and returns
    /// it; panics with every finding and the agent's stderr after `timeout`.
    pub fn wait_finding(&self, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Value {
        let timeout = scaled(timeout);
        self.0.try_wait_finding(pred, timeout).unwrap_or_else(|| {
            panic!(
                "no matching finding within {timeout:?}\n{}",
                self.diagnostics()
            )
        })
    }

    /// The first finding matching `pred` within `timeout` (scaled), if any.
    pub fn try_wait_finding(
        &self,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Option<Value> {
        self.0.try_wait_finding(pred, scaled(timeout))
    }

    /// Watches the findings for `window` and panics (at once) if one matches `pred`,
    /// including ones already printed.
    pub fn expect_no_finding(&self, pred: impl Fn(&Value) -> bool, window: Duration) {
        if let Some(found) = self.0.try_wait_finding(pred, scaled(window)) {
            panic!("unexpected finding:\n{found:#}\n{}", self.diagnostics());
        }
        // The wait also ends early when stdout closes: that is a failure here.
        if self.stdout_closed() {
            panic!(
                "node-diag closed its stdout (exited?) while watched\n{}",
                self.diagnostics()
            );
        }
    }

    /// Started about 14 s into a black-holed flow's stall: the flow's next retransmit
    /// comes about 25 s into it (RTOs doubling from 0.2 s), and the agent reports the
    /// `pmtud_blackhole` / `icmp_filtered` within 10 s of that, counting the socket's
    /// own RTOs rather than only the retransmits it saw; the gauge reads 1.
    pub fn assert_black_hole_found_mid_stall(&self, on_flow: impl Fn(&Value) -> bool) {
        let started = Instant::now();
        // Scaled here and again by the wait: a guest under TCG starts the agent slowly
        // while the stalled socket's timers keep real time.
        let f = self.wait_finding(on_flow, scaled(Duration::from_secs(24)));
        crate::finding::assert_shape(&f);
        assert_eq!(f["layer"], "icmp_filtered", "{f:#}");
        assert!(
            f["evidence"]["fullsize_retransmits"].as_u64().unwrap_or(0) >= 3,
            "the socket's RTO count, not the retransmits this agent saw: {f:#}"
        );
        eprintln!("reported {:?} after the agent started", started.elapsed());
        self.wait_counter_at_least(BLACKHOLES, 1.0, Duration::from_secs(3));
    }

    /// A black hole masked by MTU probing: waits for the flow's `pmtud_blackhole`
    /// `recovered_by: tcp_mtu_probing` (its MSS at least `mss_at_least` before the
    /// shrink), then for it to turn `resolved`, with the black-hole gauge back at 0.
    pub fn assert_recovered_then_resolved(
        &self,
        on_flow: impl Fn(&Value) -> bool,
        mss_at_least: u64,
    ) {
        let recovered =
            |f: &Value| on_flow(f) && f["evidence"]["recovered_by"] == "tcp_mtu_probing";
        let f = self.wait_finding(recovered, Duration::from_secs(5));
        crate::finding::assert_recovered_by_probing(&f, mss_at_least);
        self.wait_finding(
            |f| recovered(f) && f["status"] == "resolved",
            Duration::from_secs(5),
        );
        assert_eq!(
            self.metric(BLACKHOLES),
            Some(0.0),
            "{}",
            self.metrics_text()
        );
    }

    /// `GET /metrics` from inside node A: the whole exposition text.
    pub fn metrics_text(&self) -> String {
        crate::ok(self.0.metrics_text())
    }

    /// `GET /findings` from inside node A: the agent's current findings (a JSON array).
    pub fn findings_endpoint(&self) -> Vec<Value> {
        crate::ok(self.0.findings_endpoint())
    }

    /// The value of one series, e.g.
    /// `node_diag_tcp_connect_failures_total{reason="refused"}` (labels in any order);
    /// `None` when not exposed.
    pub fn metric(&self, series: &str) -> Option<f64> {
        crate::ok(self.0.metric(series))
    }

    /// Like [`Agent::metric`], a counter not yet exposed reading as 0.
    pub fn counter(&self, series: &str) -> f64 {
        self.metric(series).unwrap_or(0.0)
    }

    /// Polls `series` until it is exposed and returns its value; panics after `timeout`
    /// (scaled) with the exposition.
    pub fn wait_metric(&self, series: &str, timeout: Duration) -> f64 {
        let timeout = scaled(timeout);
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.metrics_text();
            if let Some(value) = crate::ok(metrics::find_value(&text, series)) {
                return value;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{series} not exposed within {timeout:?}\n/metrics:\n{text}\n{}",
                    self.diagnostics()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Polls `series` until it reaches at least `min` and returns its value; panics
    /// after `timeout` with the last value and the exposition.
    pub fn wait_counter_at_least(&self, series: &str, min: f64, timeout: Duration) -> f64 {
        let timeout = scaled(timeout);
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.metrics_text();
            let value = crate::ok(metrics::find_value(&text, series)).unwrap_or(0.0);
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

    /// Polls `/findings` until a finding matches `pred` and returns it; panics after
    /// `timeout` (scaled) with what was served.
    pub fn wait_served(&self, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Value {
        let deadline = Instant::now() + scaled(timeout);
        loop {
            let served = self.findings_endpoint();
            if let Some(f) = served.iter().find(|f| pred(f)) {
                return f.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no matching finding served: {served:#?}\n{}",
                self.diagnostics()
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// For `hold` (not scaled: it is the condition's duration under test), every 2 s:
    /// gauge `series` is 1 and `/findings` serves an active finding matching `open`.
    pub fn assert_held(&self, series: &str, hold: Duration, open: impl Fn(&Value) -> bool) {
        let held = Instant::now();
        while held.elapsed() < hold {
            assert_eq!(
                self.metric(series),
                Some(1.0),
                "{series} after {:?} held\n{}",
                held.elapsed(),
                self.diagnostics()
            );
            assert!(
                self.findings_endpoint()
                    .iter()
                    .any(|f| open(f) && f["status"] == "active"),
                "resolved after {:?} held",
                held.elapsed()
            );
            thread::sleep(Duration::from_secs(2));
        }
    }

    /// Sends SIGTERM and waits (up to 10 s, then SIGKILL) for the exit. Returns the exit
    /// status and how long the exit took.
    pub fn terminate(&mut self) -> (ExitStatus, Duration) {
        let end = crate::ok(self.0.terminate());
        (end.status, end.elapsed)
    }

    /// SIGKILL, as a crash or an OOM kill: the agent gets no chance to clean up.
    pub fn kill(&mut self) -> ExitStatus {
        crate::ok(self.0.kill())
    }
}
