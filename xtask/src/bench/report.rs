//! The bench's results: medians, a markdown table judged against the targets, a JSON file.

use std::{collections::BTreeMap, fmt::Write as _, fs, path::Path, time::Duration};

use anyhow::{Context as _, Result};
use serde::Serialize;

use super::{Mode, Sample, Settings, Workload};

/// Targets from issue 5.
const THROUGHPUT_RATIO: f64 = 0.98;
const CONN_RATE_RATIO: f64 = 0.95;
const PROGRAM_NS: f64 = 100.0;
const RSS_MIB: f64 = 64.0;
const CPU_PCT_AT_10K: f64 = 5.0;
/// "Findings aggregate": at most this many findings and stdout lines for a whole storm.
const STORM_LINES: u64 = 10;

/// The machine the bench ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub cpu_model: String,
    /// `/proc/loadavg` when the bench started.
    pub loadavg_start: String,
    /// `/proc/loadavg` when it ended.
    pub loadavg_end: String,
}

impl Machine {
    pub fn describe() -> Self {
        let read = |path: &str| fs::read_to_string(path).unwrap_or_default();
        let meminfo = read("/proc/meminfo");
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let cpu_model = read("/proc/cpuinfo")
            .lines()
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == "model name").then(|| value.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        Self {
            nproc: std::thread::available_parallelism().map_or(0, usize::from),
            memory_gib: mem_kib / (1024.0 * 1024.0),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            cpu_model,
            loadavg_start: loadavg(),
            loadavg_end: String::new(),
        }
    }
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Pass, fail, or a figure without a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    Info,
}

impl Verdict {
    fn of(pass: bool) -> Self {
        if pass { Self::Pass } else { Self::Fail }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "FAIL",
            Self::Info => "—",
        }
    }
}

/// One line of the table; the numbers go to the JSON too.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub metric: String,
    pub baseline: Option<f64>,
    pub agent: Option<f64>,
    /// The figure judged against the target (a ratio, ns, MiB, %...).
    pub value: Option<f64>,
    /// How the table shows the row: baseline, with agent, value.
    #[serde(skip)]
    cells: [String; 3],
    pub target: String,
    pub verdict: Verdict,
}

/// Per-program figures over every workload of every run.
#[derive(Debug, Clone, Serialize)]
pub struct ProgramSummary {
    #[serde(rename = "type")]
    pub kind: String,
    pub run_cnt: u64,
    pub run_time_ns: u64,
    pub avg_ns: Option<f64>,
    /// Average ns per run in each workload.
    pub avg_ns_by_workload: BTreeMap<Workload, Option<f64>>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub command: String,
    pub settings: Settings,
    pub machine: Machine,
    pub elapsed_s: f64,
    pub rows: Vec<Row>,
    pub programs: BTreeMap<String, ProgramSummary>,
    pub samples: Vec<Sample>,
}

impl Report {
    pub fn new(
        command: String,
        settings: Settings,
        mut machine: Machine,
        samples: Vec<Sample>,
        elapsed: Duration,
    ) -> Self {
        machine.loadavg_end = loadavg();
        let programs = programs(&samples);
        let rows = rows(&settings, &samples, &programs);
        Self {
            command,
            settings,
            machine,
            elapsed_s: elapsed.as_secs_f64(),
            rows,
            programs,
            samples,
        }
    }

    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut out = String::new();
        let _ = writeln!(out, "## node-diag bench: `{}`\n", self.command);
        let _ = writeln!(
            out,
            "{} CPU(s) ({}), {:.1} GiB, kernel {}; load average {} at start, {} at end; \
             {} run(s) of {} s per workload; medians; took {:.0} s.\n",
            m.nproc,
            m.cpu_model,
            m.memory_gib,
            m.kernel,
            m.loadavg_start,
            m.loadavg_end,
            self.settings.runs,
            self.settings.duration_s,
            self.elapsed_s
        );
        let _ = writeln!(out, "{}\n", self.contention());
        let _ = writeln!(
            out,
            "| metric | baseline | with agent | ratio / value | target | pass/fail |"
        );
        let _ = writeln!(out, "| --- | ---: | ---: | ---: | --- | --- |");
        for row in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                row.metric,
                row.cells[0],
                row.cells[1],
                row.cells[2],
                row.target,
                row.verdict.label()
            );
        }
        out
    }

    /// Whether another node-diag agent's programs ran during the measurements.
    fn contention(&self) -> String {
        let contended = |mode| {
            self.samples
                .iter()
                .filter(|s| s.mode == mode && s.foreign_nd_programs > 0)
                .count()
        };
        let (baseline, agent) = (contended(Mode::Baseline), contended(Mode::Agent));
        if baseline + agent == 0 {
            return "No other process had `nd_*` eBPF programs loaded during the measurements."
                .to_owned();
        }
        format!(
            "**Caveat:** {baseline} baseline and {agent} agent measurement(s) of {} ran while \
             another process (another node-diag agent) had `nd_*` eBPF programs loaded; their \
             tracepoints fire on the bench's traffic too, so the baseline is not agent-free.",
            self.samples.len()
        )
    }

    pub fn write_json(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let json = serde_json::to_string_pretty(self)?;
        fs::write(path, json + "\n").with_context(|| format!("cannot write {}", path.display()))
    }
}

/// The line printed after each measurement.
pub fn progress_line(sample: &Sample) -> String {
    let figure = match sample.workload {
        Workload::IperfOverlay | Workload::IperfVeth => format!("{:.2} Gbit/s", sample.value / 1e9),
        Workload::ConnRate => {
            let failed = sample.conn.as_ref().map_or(0, |c| c.failed);
            format!("{:.0} conn/s ({failed} failed)", sample.value)
        }
        Workload::Storm => format!("{:.0} refused/s", sample.value),
    };
    let mut line = format!(
        "run {} {:<15} {:<8} {figure}",
        sample.run + 1,
        sample.workload.label(),
        match sample.mode {
            Mode::Baseline => "baseline",
            Mode::Agent => "agent",
        }
    );
    if let Some(agent) = &sample.agent {
        let _ = write!(
            line,
            "; agent {:.1}% CPU, peak RSS {:.1} MiB",
            agent.cpu_pct,
            mib(agent.peak_rss_kib)
        );
        if let Some(acc) = &agent.accounting {
            let _ = write!(
                line,
                "; refused {} = findings {} + lost {} ({:+}); {} stdout line(s)",
                acc.refused,
                acc.findings_count,
                acc.events_lost,
                acc.difference,
                agent.stdout_lines
            );
        }
    }
    line
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

/// The samples of one workload in one mode.
fn of(samples: &[Sample], workload: Workload, mode: Mode) -> impl Iterator<Item = &Sample> {
    samples
        .iter()
        .filter(move |s| s.workload == workload && s.mode == mode)
}

/// Median baseline, median with agent, and the median of the per-run ratios
/// (agent / baseline of the same run, measured back to back).
fn paired(
    samples: &[Sample],
    workload: Workload,
    figure: impl Fn(&Sample) -> Option<f64>,
) -> (Option<f64>, Option<f64>, Option<f64>) {
    let mut base: Vec<f64> = of(samples, workload, Mode::Baseline)
        .filter_map(&figure)
        .collect();
    let mut with: Vec<f64> = of(samples, workload, Mode::Agent)
        .filter_map(&figure)
        .collect();
    let mut ratios: Vec<f64> = of(samples, workload, Mode::Agent)
        .filter_map(|a| {
            let b = of(samples, workload, Mode::Baseline).find(|b| b.run == a.run)?;
            let (a, b) = (figure(a)?, figure(b)?);
            (b > 0.0).then(|| a / b)
        })
        .collect();
    (median(&mut base), median(&mut with), median(&mut ratios))
}

fn fmt(value: Option<f64>, f: impl Fn(f64) -> String) -> String {
    value.map_or_else(|| "n/a".to_owned(), f)
}

fn programs(samples: &[Sample]) -> BTreeMap<String, ProgramSummary> {
    let mut out: BTreeMap<String, ProgramSummary> = BTreeMap::new();
    let mut by_workload: BTreeMap<(String, Workload), (u64, u64)> = BTreeMap::new();
    for sample in samples {
        let Some(agent) = &sample.agent else { continue };
        for (name, runs) in &agent.programs {
            let entry = out.entry(name.clone()).or_insert_with(|| ProgramSummary {
                kind: runs.kind.clone(),
                run_cnt: 0,
                run_time_ns: 0,
                avg_ns: None,
                avg_ns_by_workload: BTreeMap::new(),
            });
            entry.run_cnt += runs.run_cnt;
            entry.run_time_ns += runs.run_time_ns;
            let w = by_workload
                .entry((name.clone(), sample.workload))
                .or_default();
            w.0 += runs.run_cnt;
            w.1 += runs.run_time_ns;
        }
    }
    let avg = |cnt: u64, ns: u64| (cnt > 0).then(|| ns as f64 / cnt as f64);
    for ((name, workload), (cnt, ns)) in by_workload {
        if let Some(entry) = out.get_mut(&name) {
            entry.avg_ns_by_workload.insert(workload, avg(cnt, ns));
        }
    }
    for entry in out.values_mut() {
        entry.avg_ns = avg(entry.run_cnt, entry.run_time_ns);
    }
    out
}

fn rows(
    settings: &Settings,
    samples: &[Sample],
    programs: &BTreeMap<String, ProgramSummary>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    let gbit = |v: f64| format!("{:.2} Gbit/s", v / 1e9);
    let ratio = |v: f64| format!("{v:.3}");

    // Throughput and connection rate: ratios against the baseline.
    for (workload, metric) in [
        (
            Workload::IperfOverlay,
            "throughput pod A → pod B, vxlan overlay (iperf3)",
        ),
        (
            Workload::IperfVeth,
            "throughput node B → node A, underlay veth (iperf3)",
        ),
    ] {
        let (b, a, r) = paired(samples, workload, |s| Some(s.value));
        rows.push(Row {
            metric: metric.to_owned(),
            baseline: b,
            agent: a,
            value: r,
            cells: [fmt(b, gbit), fmt(a, gbit), fmt(r, ratio)],
            target: format!("≥ {THROUGHPUT_RATIO}"),
            verdict: Verdict::of(r.is_some_and(|r| r >= THROUGHPUT_RATIO)),
        });
    }
    let per_s = |v: f64| format!("{v:.0}/s");
    let (b, a, r) = paired(samples, Workload::ConnRate, |s| Some(s.value));
    rows.push(Row {
        metric: format!(
            "short connections pod A → pod B, {} offered/s (completed/s)",
            settings.conn_rate
        ),
        baseline: b,
        agent: a,
        value: r,
        cells: [fmt(b, per_s), fmt(a, per_s), fmt(r, ratio)],
        target: format!("≥ {CONN_RATE_RATIO}"),
        verdict: Verdict::of(r.is_some_and(|r| r >= CONN_RATE_RATIO)),
    });
    let micros = |v: f64| format!("{v:.0} µs");
    for (metric, figure) in [
        (
            "connection latency p50",
            (|s: &Sample| s.conn.as_ref().map(|c| c.latency_p50_us)) as fn(&Sample) -> Option<f64>,
        ),
        ("connection latency p99", |s: &Sample| {
            s.conn.as_ref().map(|c| c.latency_p99_us)
        }),
    ] {
        let (b, a, r) = paired(samples, Workload::ConnRate, figure);
        rows.push(Row {
            metric: metric.to_owned(),
            baseline: b,
            agent: a,
            value: r,
            cells: [fmt(b, micros), fmt(a, micros), fmt(r, ratio)],
            target: "—".to_owned(),
            verdict: Verdict::Info,
        });
    }

    // Per-program cost.
    for (name, program) in programs {
        let value = program.avg_ns;
        rows.push(Row {
            metric: format!("avg run time `{name}` ({})", program.kind),
            baseline: None,
            agent: None,
            value,
            cells: [
                "—".to_owned(),
                format!("{} runs", program.run_cnt),
                fmt(value, |ns| format!("{ns:.0} ns")),
            ],
            target: format!("≤ {PROGRAM_NS:.0} ns"),
            verdict: value.map_or(Verdict::Info, |ns| Verdict::of(ns <= PROGRAM_NS)),
        });
    }

    // Agent resources: start-up, then per workload.
    let rss_row = |metric: String, peak: Option<f64>| Row {
        metric,
        baseline: None,
        agent: peak,
        value: peak,
        cells: [
            "—".to_owned(),
            "—".to_owned(),
            fmt(peak, |v| format!("{v:.1} MiB")),
        ],
        target: format!("≤ {RSS_MIB:.0} MiB"),
        verdict: Verdict::of(peak.is_some_and(|v| v <= RSS_MIB)),
    };
    let startup = samples
        .iter()
        .filter_map(|s| Some(s.agent.as_ref()?.startup_peak_rss_kib))
        .max()
        .map(mib);
    rows.push(rss_row(
        "agent peak RSS (VmHWM), start-up (loading the programs)".to_owned(),
        startup,
    ));
    for workload in Workload::ALL {
        let peak = of(samples, workload, Mode::Agent)
            .filter_map(|s| Some(s.agent.as_ref()?.peak_rss_kib))
            .max()
            .map(mib);
        rows.push(rss_row(
            format!("agent peak RSS (VmHWM), {}", workload.label()),
            peak,
        ));
        let mut cpu: Vec<f64> = of(samples, workload, Mode::Agent)
            .filter_map(|s| Some(s.agent.as_ref()?.cpu_pct))
            .collect();
        let cpu = median(&mut cpu);
        let pct = |v: f64| format!("{v:.2} %");
        if workload == Workload::ConnRate {
            // The target is at 10k conn/s: scale by the rate actually reached.
            let (_, rate, _) = paired(samples, workload, |s| Some(s.value));
            let at_10k = cpu
                .zip(rate)
                .and_then(|(cpu, rate)| (rate > 0.0).then(|| cpu * 10_000.0 / rate));
            rows.push(Row {
                metric: format!(
                    "agent CPU (% of one core), connection rate (at the {} completed/s reached; scaled to 10k/s)",
                    fmt(rate, |r| format!("{r:.0}"))
                ),
                baseline: None,
                agent: cpu,
                value: at_10k,
                cells: ["—".to_owned(), fmt(cpu, pct), fmt(at_10k, pct)],
                target: format!("≤ {CPU_PCT_AT_10K:.0} % at 10k/s"),
                verdict: Verdict::of(at_10k.is_some_and(|v| v <= CPU_PCT_AT_10K)),
            });
        } else {
            rows.push(Row {
                metric: format!("agent CPU (% of one core), {}", workload.label()),
                baseline: None,
                agent: cpu,
                value: cpu,
                cells: ["—".to_owned(), fmt(cpu, pct), fmt(cpu, pct)],
                target: "—".to_owned(),
                verdict: Verdict::Info,
            });
        }
    }

    storm_rows(settings, samples, &mut rows);
    rows
}

fn storm_rows(settings: &Settings, samples: &[Sample], rows: &mut Vec<Row>) {
    let (b, a, r) = paired(samples, Workload::Storm, |s| Some(s.value));
    rows.push(Row {
        metric: format!(
            "storm: {} refused connects, rate (refused/s)",
            settings.storm_connects
        ),
        baseline: b,
        agent: a,
        value: r,
        cells: [
            fmt(b, |v| format!("{v:.0}/s")),
            fmt(a, |v| format!("{v:.0}/s")),
            fmt(r, |v| format!("{v:.3}")),
        ],
        target: "—".to_owned(),
        verdict: Verdict::Info,
    });
    let mut per_connect = Vec::new();
    let mut cpu_ms = Vec::new();
    for usage in of(samples, Workload::Storm, Mode::Agent).filter_map(|s| s.agent.as_ref()) {
        if let Some(acc) = usage.accounting.as_ref().filter(|acc| acc.refused > 0) {
            per_connect.push(usage.cpu_s * 1e6 / acc.refused as f64);
            cpu_ms.push(usage.cpu_s * 1e3);
        }
    }
    let (per_connect, cpu_ms) = (median(&mut per_connect), median(&mut cpu_ms));
    rows.push(Row {
        // /proc/PID/stat counts CPU time in clock ticks (10 ms): the total shows how
        // precise the figure is.
        metric: "storm: agent CPU time per refused connect (total, in 10 ms ticks)".to_owned(),
        baseline: None,
        agent: cpu_ms,
        value: per_connect,
        cells: [
            "—".to_owned(),
            fmt(cpu_ms, |v| format!("{v:.0} ms")),
            fmt(per_connect, |v| format!("{v:.2} µs")),
        ],
        target: "—".to_owned(),
        verdict: Verdict::Info,
    });
    // The run that accounts worst (largest difference) stands for all.
    let worst = of(samples, Workload::Storm, Mode::Agent)
        .filter_map(|s| Some((s.agent.as_ref()?, s.agent.as_ref()?.accounting.as_ref()?)))
        .max_by_key(|(_, acc)| acc.difference.unsigned_abs());
    let Some((usage, acc)) = worst else {
        return;
    };
    let accounted = acc.findings_count + acc.events_lost;
    rows.push(Row {
        metric: "storm: refused seen by client vs. tcp_refused counts + events lost".to_owned(),
        baseline: Some(acc.refused as f64),
        agent: Some(accounted as f64),
        value: Some(acc.difference as f64),
        cells: [
            format!("{} refused", acc.refused),
            format!("{} + {} lost", acc.findings_count, acc.events_lost),
            format!("difference {:+}", acc.difference),
        ],
        target: "difference 0".to_owned(),
        verdict: Verdict::of(acc.difference == 0),
    });
    rows.push(Row {
        metric: "storm: findings aggregate (tcp_refused findings / agent stdout lines)".to_owned(),
        baseline: None,
        agent: Some(usage.stdout_lines as f64),
        value: Some(acc.refused_findings as f64),
        cells: [
            "—".to_owned(),
            format!("{} line(s)", usage.stdout_lines),
            format!("{} finding(s)", acc.refused_findings),
        ],
        target: format!("≤ {STORM_LINES} each"),
        verdict: Verdict::of(
            acc.refused_findings <= STORM_LINES && usage.stdout_lines <= STORM_LINES,
        ),
    });
    let (before, after) = (mib(usage.rss_before_kib), mib(usage.rss_after_kib));
    let peak = mib(usage.peak_rss_kib);
    rows.push(Row {
        metric: "storm: agent RSS before → after (peak)".to_owned(),
        baseline: Some(before),
        agent: Some(after),
        value: Some(peak),
        cells: [
            format!("{before:.1} MiB"),
            format!("{after:.1} MiB"),
            format!("peak {peak:.1} MiB"),
        ],
        target: format!("bounded, ≤ {RSS_MIB:.0} MiB"),
        verdict: Verdict::of(peak <= RSS_MIB),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    fn sample(run: u32, mode: Mode, value: f64) -> Sample {
        Sample {
            run,
            workload: Workload::IperfOverlay,
            mode,
            value,
            conn: None,
            storm: None,
            agent: None,
            foreign_nd_programs: 0,
        }
    }

    #[test]
    fn ratios_pair_runs() {
        let samples = [
            sample(0, Mode::Baseline, 10.0),
            sample(0, Mode::Agent, 9.0),
            sample(1, Mode::Agent, 20.0),
            sample(1, Mode::Baseline, 20.0),
            sample(2, Mode::Baseline, 10.0),
            sample(2, Mode::Agent, 10.0),
        ];
        let (b, a, r) = paired(&samples, Workload::IperfOverlay, |s| Some(s.value));
        assert_eq!((b, a, r), (Some(10.0), Some(10.0), Some(1.0)));
    }
}
