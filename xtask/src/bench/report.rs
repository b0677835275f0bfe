//! The bench's results: medians and spreads of the pair ratios, a markdown table judged
//! against the targets (with the per-program cost per workload and the eBPF maps below
//! it), a JSON file.

use std::{collections::BTreeMap, fmt::Write as _, fs, path::Path, time::Duration};

use anyhow::{Context as _, Result};
use serde::Serialize;

#[cfg(test)]
use super::sample::AgentUsage;
use super::{
    agent::{self, MapMemory},
    sample::{Mode, ProgramRuns, Sample},
    settings::Settings,
    workload::{CONN_THREADS, FLOOD_PORT, FLOOD_THREADS, LOSS_PER_MILLE, Workload},
};

/// Targets from the performance issue. Ratios are medians of the pair ratios.
const THROUGHPUT_RATIO: f64 = 0.99;
const CLOSED_LOOP_RATIO: f64 = 0.97;
const FLOOD_RATIO: f64 = 0.95;
const STORM_RATE_RATIO: f64 = 0.90;
/// Agent CPU during the refused storm, in % of one core.
const STORM_CPU_PCT: f64 = 5.0;
/// Steady RSS, judged per workload (VmHWM reset once the agent is ready).
const RSS_MIB: f64 = 40.0;
/// The start-up peak (parsing the kernel's BTF, loading the programs) is transient: it is
/// judged against the DaemonSet's memory request (`deploy/daemonset.yaml`), which it must
/// fit for the pod to start where the scheduler put it.
const STARTUP_RSS_MIB: f64 = 64.0;
/// Memory of the agent's eBPF maps on a node of [`agent::TARGET_CPUS`] CPUs.
const MAP_MIB: f64 = 24.0;
/// "Findings aggregate": at most this many findings and stdout lines for a whole storm.
const STORM_LINES: u64 = 10;

/// The average run time budget of a program, by how often its hook fires: per packet,
/// per connection (state changes, resets, retransmits, ICMP errors sent), or per failed
/// connect (the error report path, which builds an event). `None` for a program without
/// a budget (a new one: it is shown, not judged).
fn program_budget(name: &str) -> Option<(f64, &'static str)> {
    match name {
        "nd_tc_ingress" | "nd_kfree_skb" => Some((60.0, "per packet")),
        "nd_set_state" | "nd_rcv_reset" | "nd_snd_reset" | "nd_retransmit" | "nd_icmp_send" => {
            Some((150.0, "per connection"))
        }
        "nd_err_report" => Some((400.0, "error report")),
        _ => None,
    }
}

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
    /// For a ratio: the smallest and largest of the pair ratios `value` is the median of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_min: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_max: Option<f64>,
    /// For a ratio: where the median of the pair ratios lies, with at least 95 %
    /// confidence (see [`median_interval`]); none with fewer than six pairs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median_interval: Option<MedianInterval>,
    /// For a judged ratio with an interval: whether the interval lies wholly on one side
    /// of the target, so that the pairs settle the verdict; `false` shows as
    /// "(unresolved)" beside it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved: Option<bool>,
    /// How the table shows the row: baseline, with agent, value, spread.
    #[serde(skip)]
    cells: [String; 4],
    pub target: String,
    pub verdict: Verdict,
}

impl Row {
    /// A row without a target; `cells` are baseline, with agent, value.
    fn new(
        metric: impl Into<String>,
        [baseline, agent, value]: [Option<f64>; 3],
        [b, a, v]: [String; 3],
    ) -> Self {
        Self {
            metric: metric.into(),
            baseline,
            agent,
            value,
            ratio_min: None,
            ratio_max: None,
            median_interval: None,
            resolved: None,
            cells: [b, a, v, "—".to_owned()],
            target: "—".to_owned(),
            verdict: Verdict::Info,
        }
    }

    /// Judged against `target`: pass or fail.
    fn target(mut self, target: impl Into<String>, pass: bool) -> Self {
        self.target = target.into();
        self.verdict = Verdict::of(pass);
        self
    }

    /// Shows the spread of the pair ratios behind a ratio.
    fn spread(mut self, ratios: &[f64]) -> Self {
        self.ratio_min = ratios.iter().copied().reduce(f64::min);
        self.ratio_max = ratios.iter().copied().reduce(f64::max);
        self.median_interval = median_interval(ratios);
        self.cells[3] = match &self.median_interval {
            Some(i) => format!("{}; {:.3}–{:.3}", spread(ratios), i.low, i.high),
            None => spread(ratios),
        };
        self
    }

    /// The verdict's cell: pass or FAIL, "(unresolved)" when the median's interval
    /// straddles the target.
    fn verdict_cell(&self) -> String {
        match self.resolved {
            Some(false) => format!("{} (unresolved)", self.verdict.label()),
            _ => self.verdict.label().to_owned(),
        }
    }
}

/// Per-program figures over the profile measurements of every workload.
#[derive(Debug, Clone, Serialize)]
pub struct ProgramSummary {
    #[serde(rename = "type")]
    pub kind: String,
    /// The tracepoint it runs on (none for the TC classifier).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracepoint: Option<String>,
    pub run_cnt: u64,
    pub run_time_ns: u64,
    /// As the kernel's statistics measured it.
    pub avg_ns: Option<f64>,
    /// `avg_ns` less the floor: the program's own work.
    pub net_ns: Option<f64>,
    /// The floor `net_ns` is net of, per run on average: in each workload the empty
    /// program's on the same tracepoint, or the whole bench's floor where there is none
    /// (see [`programs`]).
    pub floor_ns: Option<f64>,
    /// The budget `net_ns` is judged against.
    pub budget_ns: Option<f64>,
    /// Average ns per run in each workload.
    pub avg_ns_by_workload: BTreeMap<Workload, Option<f64>>,
    /// The same net of that workload's floor.
    pub net_ns_by_workload: BTreeMap<Workload, Option<f64>>,
    /// Runs in each workload.
    pub run_cnt_by_workload: BTreeMap<Workload, u64>,
}

/// The agent's eBPF maps, from the measurement whose total at [`agent::TARGET_CPUS`] was
/// the largest.
#[derive(Debug, Clone, Serialize)]
pub struct MapReport {
    /// CPUs the kernel sizes per-CPU maps for on this machine (possible CPUs).
    pub cpus: u32,
    pub target_cpus: u32,
    pub memlock_bytes: u64,
    pub memlock_at_target_cpus_bytes: u64,
    pub maps: Vec<MapMemory>,
}

impl MapReport {
    fn new(samples: &[Sample]) -> Option<Self> {
        let usage = samples
            .iter()
            .filter_map(|s| s.agent.as_ref())
            .max_by_key(|usage| usage.map_memlock_at_target_cpus_bytes)?;
        Some(Self {
            cpus: agent::possible_cpus(),
            target_cpus: agent::TARGET_CPUS,
            memlock_bytes: usage.map_memlock_bytes,
            memlock_at_target_cpus_bytes: usage.map_memlock_at_target_cpus_bytes,
            maps: usage.maps.clone(),
        })
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub command: String,
    pub settings: Settings,
    pub machine: Machine,
    pub elapsed_s: f64,
    pub rows: Vec<Row>,
    pub programs: BTreeMap<String, ProgramSummary>,
    /// The floor of the run statistics: an empty program's average run time over every
    /// profile measurement (judged figures are net of it), and per workload (shown).
    pub floor_ns: Option<f64>,
    pub floor_ns_by_workload: BTreeMap<Workload, Option<f64>>,
    /// The lead empty programs' average (first on each tracepoint, so they take the
    /// clock's cold reads), per workload: shown beside the floor, never charged.
    pub lead_ns_by_workload: BTreeMap<Workload, Option<f64>>,
    pub maps: Option<MapReport>,
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
        let floors = floors(&samples);
        let leads = leads(&samples);
        let floor = floor(&samples);
        let programs = programs(&samples, floor.1);
        let maps = MapReport::new(&samples);
        let rows = rows(&settings, &samples, &programs, floor, maps.as_ref());
        Self {
            command,
            settings,
            machine,
            elapsed_s: elapsed.as_secs_f64(),
            rows,
            programs,
            floor_ns: floor.1,
            floor_ns_by_workload: floors,
            lead_ns_by_workload: leads,
            maps,
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
             {} run(s) of {} s per workload; medians; took {:.0} s. The pairs ran with the \
             kernel's run statistics off, as on a node; program run times come from one \
             profile measurement per workload ({} s) with them on.\n",
            m.nproc,
            m.cpu_model,
            m.memory_gib,
            m.kernel,
            m.loadavg_start,
            m.loadavg_end,
            self.settings.runs,
            self.settings.duration_s,
            self.elapsed_s,
            self.settings.profile_duration_s
        );
        if self.settings.null {
            let _ = writeln!(
                out,
                "**A null run (`--null`)**: neither measurement of a pair had the agent. \
                 Every ratio below is the machine's noise alone; a median's distance from \
                 1.000 and its interval show how finely this machine can judge a target.\n"
            );
        }
        let _ = writeln!(out, "{}\n", self.contention());
        let _ = writeln!(
            out,
            "| metric | baseline | with agent | ratio / value | spread (pair ratios); the median's 95 % interval | target | pass/fail |"
        );
        let _ = writeln!(out, "| --- | ---: | ---: | ---: | ---: | --- | --- |");
        for row in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                row.metric,
                row.cells[0],
                row.cells[1],
                row.cells[2],
                row.cells[3],
                row.target,
                row.verdict_cell()
            );
        }
        self.programs_by_workload(&mut out);
        self.map_table(&mut out);
        out
    }

    /// Each program's average run time in each workload, with its runs: which workload
    /// makes a hook expensive (the drop flood for `nd_kfree_skb`...).
    fn programs_by_workload(&self, out: &mut String) {
        if self.programs.is_empty() {
            return;
        }
        let workloads: Vec<Workload> = Workload::ALL
            .into_iter()
            .filter(|w| {
                self.programs
                    .values()
                    .any(|p| p.avg_ns_by_workload.contains_key(w))
            })
            .collect();
        let _ = writeln!(
            out,
            "\nAverage run time per program and workload in the profile measurements: ns per \
             run as measured / net of the floor (runs), Σ run_time_ns ÷ Σ run_cnt; — where it \
             did not run. A program's floor is the empty program's on its own tracepoint in \
             the same workload (the classifier's, the whole bench's); the floor row is the \
             empty programs' on all the agent's tracepoints in that workload. The lead row is \
             that of the empty programs attached before the agent, which run first on each \
             tracepoint and take the statistics' cold clock reads (shown, not charged).\n"
        );
        let mut header = "| program | budget |".to_owned();
        let mut rule = "| --- | --- |".to_owned();
        for workload in &workloads {
            let _ = write!(header, " {} |", workload.label());
            rule.push_str(" ---: |");
        }
        let _ = writeln!(out, "{header}\n{rule}");
        let mut floor = "| floor (empty program) | — |".to_owned();
        for workload in &workloads {
            let ns = self.floor_ns_by_workload.get(workload).copied().flatten();
            let _ = write!(floor, " {} |", fmt(ns, |ns| format!("{ns:.0}")));
        }
        let _ = writeln!(out, "{floor}");
        let mut lead = "| lead (empty program, first on its tracepoint) | — |".to_owned();
        for workload in &workloads {
            let ns = self.lead_ns_by_workload.get(workload).copied().flatten();
            let _ = write!(lead, " {} |", fmt(ns, |ns| format!("{ns:.0}")));
        }
        let _ = writeln!(out, "{lead}");
        for (name, program) in &self.programs {
            let budget = program
                .budget_ns
                .map_or_else(|| "—".to_owned(), |ns| format!("≤ {ns:.0} ns"));
            let mut line = format!("| `{name}` | {budget} |");
            for workload in &workloads {
                let avg = program.avg_ns_by_workload.get(workload).copied().flatten();
                let net = program.net_ns_by_workload.get(workload).copied().flatten();
                let runs = program
                    .run_cnt_by_workload
                    .get(workload)
                    .copied()
                    .unwrap_or(0);
                let cell = avg.map_or_else(
                    || "—".to_owned(),
                    |ns| {
                        let net = fmt(net, |ns| format!("{ns:.0}"));
                        format!("{ns:.0} / {net} ({})", compact_count(runs))
                    },
                );
                let _ = write!(line, " {cell} |");
            }
            let _ = writeln!(out, "{line}");
        }
    }

    /// The agent's eBPF maps, largest at the target CPU count first.
    fn map_table(&self, out: &mut String) {
        let Some(maps) = &self.maps else { return };
        let _ = writeln!(
            out,
            "\neBPF maps the agent holds (`memlock` of `/proc/PID/fdinfo`, here with {} CPUs; \
             at {} CPUs a per-CPU map adds max_entries × value_size rounded up to 8 per CPU):\n",
            maps.cpus, maps.target_cpus
        );
        let _ = writeln!(
            out,
            "| map | type | key / value size | max entries | memlock | at {} CPUs |",
            maps.target_cpus
        );
        let _ = writeln!(out, "| --- | --- | ---: | ---: | ---: | ---: |");
        let mut sorted: Vec<&MapMemory> = maps.maps.iter().collect();
        sorted.sort_by(|a, b| {
            b.memlock_at_target_cpus_bytes
                .cmp(&a.memlock_at_target_cpus_bytes)
                .then_with(|| a.name.cmp(&b.name))
        });
        for map in sorted {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} / {} B | {} | {} | {} |",
                map.name,
                map.kind,
                map.key_size,
                map.value_size,
                map.max_entries,
                bytes(map.memlock_bytes),
                bytes(map.memlock_at_target_cpus_bytes)
            );
        }
    }

    /// Whether another node-diag agent's programs ran during the measurements.
    fn contention(&self) -> String {
        let contended = |mode| {
            self.samples
                .iter()
                .filter(|s| s.mode == mode && s.foreign_nd_programs > 0)
                .count()
        };
        let (baseline, agent) = (
            contended(Mode::Baseline),
            contended(Mode::Agent) + contended(Mode::Profile),
        );
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
        Workload::IperfOverlay | Workload::IperfVeth | Workload::IperfLossy => {
            format!("{:.2} Gbit/s", sample.value / 1e9)
        }
        Workload::ConnRate | Workload::ConnClosedLoop => {
            let failed = sample.conn.as_ref().map_or(0, |c| c.failed);
            format!("{:.0} conn/s ({failed} failed)", sample.value)
        }
        Workload::DropFlood => {
            let (sent, failed) = sample
                .flood
                .as_ref()
                .map_or((0.0, 0), |f| (f.sent_rate, f.failed));
            format!(
                "{:.0} dropped/s at the rule ({sent:.0} sent/s, {failed} failed sends)",
                sample.value
            )
        }
        Workload::Storm => format!("{:.0} refused/s", sample.value),
    };
    let run = match sample.mode {
        Mode::Profile => "profile".to_owned(),
        _ => format!("run {}", sample.run + 1),
    };
    let mut line = format!(
        "{run:<7} {:<23} {:<8} {figure}",
        sample.workload.label(),
        match sample.mode {
            Mode::Baseline => "baseline",
            // The second baseline of a null run's pair.
            Mode::Agent if sample.agent.is_none() => "null",
            Mode::Agent => "agent",
            Mode::Profile => "profile",
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

/// Bytes as KiB or MiB, for the map table.
fn bytes(bytes: u64) -> String {
    let kib = bytes as f64 / 1024.0;
    if kib < 1024.0 {
        format!("{kib:.1} KiB")
    } else {
        format!("{:.2} MiB", kib / 1024.0)
    }
}

/// A run count in a few characters: 950, 12.3k, 4.5M.
fn compact_count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// The spread of the pair ratios: `min–max`, or the one ratio of a single pair.
fn spread(ratios: &[f64]) -> String {
    let min = ratios.iter().copied().reduce(f64::min);
    let max = ratios.iter().copied().reduce(f64::max);
    match (min, max, ratios.len()) {
        (Some(only), _, 1) => format!("{only:.3} (1 pair)"),
        (Some(min), Some(max), _) => format!("{min:.3}–{max:.3}"),
        _ => "n/a".to_owned(),
    }
}

/// A distribution-free confidence interval of a median: the `k`-th smallest and the
/// `k`-th largest of `n` values, which hold the true median between them with probability
/// `1 − 2·P(Bin(n, ½) < k)` whatever the values' distribution (the pairs need only be
/// independent).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MedianInterval {
    pub low: f64,
    pub high: f64,
    /// The exact coverage of the interval, ≥ [`INTERVAL_CONFIDENCE`].
    pub confidence: f64,
}

pub const INTERVAL_CONFIDENCE: f64 = 0.95;

/// The narrowest order-statistic interval of the median of `values` with at least
/// [`INTERVAL_CONFIDENCE`]; none with fewer than six values (even the smallest and the
/// largest of five hold the median with only 94 %).
pub fn median_interval(values: &[f64]) -> Option<MedianInterval> {
    let n = values.len();
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    // P(Bin(n, ½) = i), i = 0..n, built up from 2⁻ⁿ.
    let mut p = 0.5f64.powi(i32::try_from(n).ok()?);
    let mut below = 0.0; // P(Bin(n, ½) < k)
    let mut best = None;
    for k in 1..=n / 2 {
        below += p;
        p *= (n - (k - 1)) as f64 / k as f64;
        let confidence = 1.0 - 2.0 * below;
        if confidence < INTERVAL_CONFIDENCE {
            break;
        }
        best = Some(MedianInterval {
            low: sorted[k - 1],
            high: sorted[n - k],
            confidence,
        });
    }
    best
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

/// A figure of one workload with and without the agent.
#[derive(Debug, Clone, PartialEq)]
struct Paired {
    /// Medians.
    baseline: Option<f64>,
    agent: Option<f64>,
    /// Agent ÷ baseline of each pair (the same run, measured back to back).
    ratios: Vec<f64>,
}

impl Paired {
    fn of(samples: &[Sample], workload: Workload, figure: impl Fn(&Sample) -> Option<f64>) -> Self {
        let mut base: Vec<f64> = of(samples, workload, Mode::Baseline)
            .filter_map(&figure)
            .collect();
        let mut with: Vec<f64> = of(samples, workload, Mode::Agent)
            .filter_map(&figure)
            .collect();
        let ratios: Vec<f64> = of(samples, workload, Mode::Agent)
            .filter_map(|a| {
                let b = of(samples, workload, Mode::Baseline).find(|b| b.run == a.run)?;
                let (a, b) = (figure(a)?, figure(b)?);
                (b > 0.0).then(|| a / b)
            })
            .collect();
        Self {
            baseline: median(&mut base),
            agent: median(&mut with),
            ratios,
        }
    }

    /// The median of the pair ratios.
    fn ratio(&self) -> Option<f64> {
        median(&mut self.ratios.clone())
    }

    /// A row of the two medians (shown by `show`), the median ratio and its spread.
    fn row(&self, metric: impl Into<String>, show: impl Fn(f64) -> String) -> Row {
        let ratio = self.ratio();
        Row::new(
            metric,
            [self.baseline, self.agent, ratio],
            [
                fmt(self.baseline, &show),
                fmt(self.agent, &show),
                fmt(ratio, |r| format!("{r:.3}")),
            ],
        )
        .spread(&self.ratios)
    }

    /// The row judged: the median ratio at least `target`.
    fn row_at_least(
        &self,
        metric: impl Into<String>,
        show: impl Fn(f64) -> String,
        target: f64,
    ) -> Row {
        let pass = self.ratio().is_some_and(|r| r >= target);
        let mut row = self
            .row(metric, show)
            .target(format!("≥ {target:.2}"), pass);
        row.resolved = row
            .median_interval
            .map(|i| i.low >= target || i.high < target);
        row
    }
}

fn fmt(value: Option<f64>, f: impl Fn(f64) -> String) -> String {
    value.map_or_else(|| "n/a".to_owned(), f)
}

/// The empty programs' runs over `samples`, and their Σ run_time_ns ÷ Σ run_cnt.
fn floor_of<'a>(samples: impl Iterator<Item = &'a Sample>) -> (u64, Option<f64>) {
    empty_of(samples, |s| s.floor.as_ref())
}

/// Σ run_cnt and Σ run_time_ns ÷ Σ run_cnt of the empty programs `which` picks out of
/// each profile sample.
fn empty_of<'a>(
    samples: impl Iterator<Item = &'a Sample>,
    which: impl Fn(&'a Sample) -> Option<&'a ProgramRuns>,
) -> (u64, Option<f64>) {
    let (cnt, ns) = samples
        .filter(|s| s.mode == Mode::Profile)
        .filter_map(which)
        .fold((0u64, 0u64), |(cnt, ns), f| {
            (cnt + f.run_cnt, ns + f.run_time_ns)
        });
    (cnt, (cnt > 0).then(|| ns as f64 / cnt as f64))
}

/// The floor over every profile measurement. One figure, not one per workload: a
/// workload in which the hooked tracepoints fire rarely (iperf3's few drops) measures a
/// cold floor from a handful of runs, which says nothing about a program running hot
/// there (the classifier on every ACK); the whole bench's is made of the hot runs.
fn floor(samples: &[Sample]) -> (u64, Option<f64>) {
    floor_of(samples.iter())
}

/// The floor of each workload, for the per-workload table.
fn floors(samples: &[Sample]) -> BTreeMap<Workload, Option<f64>> {
    by_workload(samples, |s| s.floor.as_ref())
}

/// The lead empty programs' average in each workload, for the per-workload table.
fn leads(samples: &[Sample]) -> BTreeMap<Workload, Option<f64>> {
    by_workload(samples, |s| s.lead.as_ref())
}

/// [`empty_of`] in each workload where `which` found empty programs.
fn by_workload<'a>(
    samples: &'a [Sample],
    which: impl Fn(&'a Sample) -> Option<&'a ProgramRuns> + Copy,
) -> BTreeMap<Workload, Option<f64>> {
    Workload::ALL
        .into_iter()
        .filter(|&w| {
            samples
                .iter()
                .any(|s| s.workload == w && which(s).is_some())
        })
        .map(|w| {
            (
                w,
                empty_of(samples.iter().filter(|s| s.workload == w), which).1,
            )
        })
        .collect()
}

/// Each program's figures over the profile measurements, and net of the floor.
///
/// The floor a program's runs in one workload are net of is the empty program's on the
/// same tracepoint in the same workload: it fired as often, at the same moments, so it
/// was as hot or as cold (a program that runs a few hundred times in a workload pays
/// cold caches in its clock reads as much as in its own work). Where there is none (the
/// TC classifier, which has no tracepoint; a tracepoint whose empty program did not run)
/// it is `floor`, the whole bench's.
fn programs(samples: &[Sample], floor: Option<f64>) -> BTreeMap<String, ProgramSummary> {
    let mut out: BTreeMap<String, ProgramSummary> = BTreeMap::new();
    /// Σ run_cnt, Σ run_time_ns, Σ floor ns charged (none once a run had no floor).
    #[derive(Default)]
    struct Acc {
        cnt: u64,
        ns: u64,
        floor_ns: Option<f64>,
    }
    let mut by_workload: BTreeMap<(String, Workload), Acc> = BTreeMap::new();
    // Only the profile measurements ran with the statistics on.
    for sample in samples.iter().filter(|s| s.mode == Mode::Profile) {
        let Some(agent) = &sample.agent else { continue };
        for (name, runs) in &agent.programs {
            let entry = out.entry(name.clone()).or_insert_with(|| ProgramSummary {
                kind: runs.kind.clone(),
                tracepoint: runs.tracepoint.clone(),
                run_cnt: 0,
                run_time_ns: 0,
                avg_ns: None,
                net_ns: None,
                floor_ns: None,
                budget_ns: program_budget(name).map(|(ns, _)| ns),
                avg_ns_by_workload: BTreeMap::new(),
                net_ns_by_workload: BTreeMap::new(),
                run_cnt_by_workload: BTreeMap::new(),
            });
            entry.run_cnt += runs.run_cnt;
            entry.run_time_ns += runs.run_time_ns;
            let matched = runs
                .tracepoint
                .as_ref()
                .and_then(|tp| sample.floor_by_tracepoint.get(tp))
                .filter(|f| f.run_cnt > 0)
                .map(|f| f.run_time_ns as f64 / f.run_cnt as f64);
            let w = by_workload
                .entry((name.clone(), sample.workload))
                .or_insert_with(|| Acc {
                    floor_ns: Some(0.0),
                    ..Acc::default()
                });
            w.cnt += runs.run_cnt;
            w.ns += runs.run_time_ns;
            w.floor_ns = w
                .floor_ns
                .zip(matched.or(floor))
                .map(|(sum, ns)| sum + ns * runs.run_cnt as f64);
        }
    }
    let avg = |cnt: u64, ns: f64| (cnt > 0).then(|| ns / cnt as f64);
    let mut floors: BTreeMap<String, Option<f64>> = BTreeMap::new();
    for ((name, workload), acc) in by_workload {
        if let Some(entry) = out.get_mut(&name) {
            entry
                .avg_ns_by_workload
                .insert(workload, avg(acc.cnt, acc.ns as f64));
            let net = acc
                .floor_ns
                .and_then(|floor| avg(acc.cnt, acc.ns as f64 - floor));
            entry.net_ns_by_workload.insert(workload, net);
            entry.run_cnt_by_workload.insert(workload, acc.cnt);
        }
        let total = floors.entry(name).or_insert(Some(0.0));
        *total = total.zip(acc.floor_ns).map(|(a, b)| a + b);
    }
    for (name, entry) in &mut out {
        entry.avg_ns = avg(entry.run_cnt, entry.run_time_ns as f64);
        let charged = floors.get(name).copied().flatten();
        entry.floor_ns = charged.and_then(|ns| avg(entry.run_cnt, ns));
        entry.net_ns = entry
            .avg_ns
            .zip(entry.floor_ns)
            .map(|(ns, floor)| ns - floor);
    }
    out
}

fn rows(
    settings: &Settings,
    samples: &[Sample],
    programs: &BTreeMap<String, ProgramSummary>,
    (floor_runs, floor): (u64, Option<f64>),
    maps: Option<&MapReport>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    let gbit = |v: f64| format!("{:.2} Gbit/s", v / 1e9);
    let per_s = |v: f64| format!("{v:.0}/s");
    let value = |s: &Sample| Some(s.value);

    // Throughput, connections and the drop flood: ratios against the baseline.
    rows.push(
        Paired::of(samples, Workload::IperfOverlay, value).row_at_least(
            "throughput pod A → pod B, vxlan overlay (iperf3)",
            gbit,
            THROUGHPUT_RATIO,
        ),
    );
    rows.push(
        Paired::of(samples, Workload::IperfVeth, value).row_at_least(
            "throughput node B → node A, underlay veth (iperf3)",
            gbit,
            THROUGHPUT_RATIO,
        ),
    );
    rows.push(Paired::of(samples, Workload::IperfLossy, value).row(
        format!(
            "throughput pod A → pod B, vxlan overlay, {:.1} % of the data dropped in node A \
             (iperf3; makes pod A retransmit)",
            f64::from(LOSS_PER_MILLE) / 10.0
        ),
        gbit,
    ));
    rows.push(
        Paired::of(samples, Workload::ConnClosedLoop, value).row_at_least(
            format!(
                "short connections pod A → pod B, closed loop, {CONN_THREADS} threads (completed/s)"
            ),
            per_s,
            CLOSED_LOOP_RATIO,
        ),
    );
    rows.push(Paired::of(samples, Workload::ConnRate, value).row(
        format!(
            "short connections pod A → pod B, paced, {} offered/s (completed/s)",
            settings.conn_rate
        ),
        per_s,
    ));
    let micros = |v: f64| format!("{v:.0} µs");
    rows.push(
        Paired::of(samples, Workload::ConnRate, |s| {
            s.conn.as_ref().map(|c| c.latency_p50_us)
        })
        .row("paced connection latency p50", micros),
    );
    rows.push(
        Paired::of(samples, Workload::ConnRate, |s| {
            s.conn.as_ref().map(|c| c.latency_p99_us)
        })
        .row("paced connection latency p99", micros),
    );
    rows.push(
        Paired::of(samples, Workload::DropFlood, value).row_at_least(
            format!(
                "drop flood: UDP pod A → :{FLOOD_PORT}, dropped in node A's forward hook, \
                 {FLOOD_THREADS} threads (drops/s at the rule)"
            ),
            per_s,
            FLOOD_RATIO,
        ),
    );
    rows.push(
        Paired::of(samples, Workload::DropFlood, |s| {
            s.flood.as_ref().map(|f| f.sent_rate)
        })
        .row(
            "drop flood: datagrams sent/s (the senders' successful sends)",
            per_s,
        ),
    );

    // Per-program cost net of the statistics' floor, against the budget of its hook.
    rows.push(Row::new(
        "floor: avg run time of an empty program on the agent's tracepoints (the statistics' \
         clock reads and the call; profile)",
        [None, None, floor],
        [
            "—".to_owned(),
            format!("{floor_runs} runs"),
            fmt(floor, |ns| format!("{ns:.0} ns")),
        ],
    ));
    for (name, program) in programs {
        let net = program.net_ns;
        let floor = match &program.tracepoint {
            Some(tp) => format!("the floor on `{tp}`"),
            None => "the bench's floor".to_owned(),
        };
        let row = Row::new(
            format!(
                "avg run time `{name}` ({}), net of {floor} (as measured)",
                program.kind
            ),
            [None, program.avg_ns, net],
            [
                "—".to_owned(),
                format!("{} runs", program.run_cnt),
                format!(
                    "{} ({})",
                    fmt(net, |ns| format!("{ns:.0} ns")),
                    fmt(program.avg_ns, |ns| format!("{ns:.0} ns"))
                ),
            ],
        );
        rows.push(match (program_budget(name), net) {
            (Some((budget, hook)), Some(ns)) => {
                row.target(format!("≤ {budget:.0} ns ({hook})"), ns <= budget)
            }
            (Some((budget, hook)), None) => Row {
                target: format!("≤ {budget:.0} ns ({hook})"),
                ..row
            },
            (None, _) => row,
        });
    }

    // The eBPF maps' memory.
    if let Some(maps) = maps {
        let (here, there) = (
            maps.memlock_bytes as f64 / (1024.0 * 1024.0),
            maps.memlock_at_target_cpus_bytes as f64 / (1024.0 * 1024.0),
        );
        rows.push(
            Row::new(
                format!(
                    "eBPF map memory (memlock of the agent's {} maps), here and at {} CPUs",
                    maps.maps.len(),
                    maps.target_cpus
                ),
                [None, Some(here), Some(there)],
                [
                    "—".to_owned(),
                    format!("{here:.1} MiB ({} CPUs)", maps.cpus),
                    format!("{there:.1} MiB"),
                ],
            )
            .target(
                format!("≤ {MAP_MIB:.0} MiB at {} CPUs", maps.target_cpus),
                there <= MAP_MIB,
            ),
        );
    }

    // Agent resources: start-up, then per workload.
    let rss_row = |metric: String, peak: Option<f64>, limit: f64| {
        Row::new(
            metric,
            [None, peak, peak],
            [
                "—".to_owned(),
                "—".to_owned(),
                fmt(peak, |v| format!("{v:.1} MiB")),
            ],
        )
        .target(
            format!("≤ {limit:.0} MiB"),
            peak.is_some_and(|v| v <= limit),
        )
    };
    let startup = samples
        .iter()
        .filter_map(|s| Some(s.agent.as_ref()?.startup_peak_rss_kib))
        .max()
        .map(mib);
    rows.push(rss_row(
        "agent peak RSS (VmHWM), start-up (loading the programs; the DaemonSet's memory request)"
            .to_owned(),
        startup,
        STARTUP_RSS_MIB,
    ));
    let pct = |v: f64| format!("{v:.2} %");
    for workload in Workload::ALL {
        let peak = of(samples, workload, Mode::Agent)
            .filter_map(|s| Some(s.agent.as_ref()?.peak_rss_kib))
            .max()
            .map(mib);
        rows.push(rss_row(
            format!("agent peak RSS (VmHWM), {}", workload.label()),
            peak,
            RSS_MIB,
        ));
        let mut cpu: Vec<f64> = of(samples, workload, Mode::Agent)
            .filter_map(|s| Some(s.agent.as_ref()?.cpu_pct))
            .collect();
        let cpu = median(&mut cpu);
        match workload {
            Workload::ConnRate => {
                // Scaled by the rate actually reached, for comparison with 10k conn/s.
                let rate = Paired::of(samples, workload, value).agent;
                let at_10k = cpu
                    .zip(rate)
                    .and_then(|(cpu, rate)| (rate > 0.0).then(|| cpu * 10_000.0 / rate));
                rows.push(Row::new(
                    format!(
                        "agent CPU (% of one core), connection rate (at the {} completed/s reached; scaled to 10k/s)",
                        fmt(rate, |r| format!("{r:.0}"))
                    ),
                    [None, cpu, at_10k],
                    ["—".to_owned(), fmt(cpu, pct), fmt(at_10k, pct)],
                ));
            }
            Workload::Storm => {
                // Until the agent has accounted for the storm (see `account`).
                rows.push(
                    Row::new(
                        format!("agent CPU (% of one core), {}", workload.label()),
                        [None, cpu, cpu],
                        ["—".to_owned(), fmt(cpu, pct), fmt(cpu, pct)],
                    )
                    .target(
                        format!("≤ {STORM_CPU_PCT:.0} %"),
                        cpu.is_some_and(|v| v <= STORM_CPU_PCT),
                    ),
                );
            }
            _ => rows.push(Row::new(
                format!("agent CPU (% of one core), {}", workload.label()),
                [None, cpu, cpu],
                ["—".to_owned(), fmt(cpu, pct), fmt(cpu, pct)],
            )),
        }
    }

    storm_rows(settings, samples, &mut rows);
    if settings.workloads.len() < Workload::ALL.len() {
        // A row without a single figure is about a workload left out (`--workload`); in
        // a full run it stays, and fails its target, because a figure went missing.
        rows.retain(|row| row.baseline.is_some() || row.agent.is_some() || row.value.is_some());
    }
    rows
}

fn storm_rows(settings: &Settings, samples: &[Sample], rows: &mut Vec<Row>) {
    rows.push(
        Paired::of(samples, Workload::Storm, |s| Some(s.value)).row_at_least(
            format!(
                "storm: {} refused connects, rate (refused/s)",
                settings.storm_connects
            ),
            |v| format!("{v:.0}/s"),
            STORM_RATE_RATIO,
        ),
    );
    let mut per_connect = Vec::new();
    let mut cpu_ms = Vec::new();
    for usage in of(samples, Workload::Storm, Mode::Agent).filter_map(|s| s.agent.as_ref()) {
        if let Some(acc) = usage.accounting.as_ref().filter(|acc| acc.refused > 0) {
            per_connect.push(usage.cpu_s * 1e6 / acc.refused as f64);
            cpu_ms.push(usage.cpu_s * 1e3);
        }
    }
    let (per_connect, cpu_ms) = (median(&mut per_connect), median(&mut cpu_ms));
    // /proc/PID/stat counts CPU time in clock ticks (10 ms): the total shows how precise
    // the figure is.
    rows.push(Row::new(
        "storm: agent CPU time per refused connect (total, in 10 ms ticks)",
        [None, cpu_ms, per_connect],
        [
            "—".to_owned(),
            fmt(cpu_ms, |v| format!("{v:.0} ms")),
            fmt(per_connect, |v| format!("{v:.2} µs")),
        ],
    ));
    // The run that accounts worst (largest difference) stands for all.
    let worst = of(samples, Workload::Storm, Mode::Agent)
        .filter_map(|s| Some((s.agent.as_ref()?, s.agent.as_ref()?.accounting.as_ref()?)))
        .max_by_key(|(_, acc)| acc.difference.unsigned_abs());
    let Some((usage, acc)) = worst else {
        return;
    };
    let accounted = acc.findings_count + acc.events_lost;
    rows.push(
        Row::new(
            "storm: refused seen by client vs. tcp_refused counts + events lost",
            [
                Some(acc.refused as f64),
                Some(accounted as f64),
                Some(acc.difference as f64),
            ],
            [
                format!("{} refused", acc.refused),
                format!("{} + {} lost", acc.findings_count, acc.events_lost),
                format!("difference {:+}", acc.difference),
            ],
        )
        .target("difference 0", acc.difference == 0),
    );
    rows.push(
        Row::new(
            "storm: findings aggregate (tcp_refused findings / agent stdout lines)",
            [
                None,
                Some(usage.stdout_lines as f64),
                Some(acc.refused_findings as f64),
            ],
            [
                "—".to_owned(),
                format!("{} line(s)", usage.stdout_lines),
                format!("{} finding(s)", acc.refused_findings),
            ],
        )
        .target(
            format!("≤ {STORM_LINES} each"),
            acc.refused_findings <= STORM_LINES && usage.stdout_lines <= STORM_LINES,
        ),
    );
    let (before, after) = (mib(usage.rss_before_kib), mib(usage.rss_after_kib));
    let peak = mib(usage.peak_rss_kib);
    rows.push(
        Row::new(
            "storm: agent RSS before → after (peak)",
            [Some(before), Some(after), Some(peak)],
            [
                format!("{before:.1} MiB"),
                format!("{after:.1} MiB"),
                format!("peak {peak:.1} MiB"),
            ],
        )
        .target(format!("bounded, ≤ {RSS_MIB:.0} MiB"), peak <= RSS_MIB),
    );
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
            flood: None,
            storm: None,
            agent: None,
            floor: None,
            floor_by_tracepoint: BTreeMap::new(),
            lead: None,
            lead_by_tracepoint: BTreeMap::new(),
            foreign_nd_programs: 0,
        }
    }

    fn runs(tracepoint: Option<&str>, run_cnt: u64, run_time_ns: u64) -> ProgramRuns {
        ProgramRuns {
            kind: if tracepoint.is_some() {
                "tracing"
            } else {
                "sched_cls"
            }
            .to_owned(),
            tracepoint: tracepoint.map(str::to_owned),
            run_cnt,
            run_time_ns,
        }
    }

    /// A profile sample of `workload` in which the agent's `programs` and the empty
    /// programs `empty` ran: (name or tracepoint, tracepoint, runs, ns).
    fn profiled(
        workload: Workload,
        programs: &[(&str, Option<&str>, u64, u64)],
        empty: &[(&str, u64, u64)],
    ) -> Sample {
        let floor_by_tracepoint: BTreeMap<String, ProgramRuns> = empty
            .iter()
            .map(|&(tp, cnt, ns)| (tp.to_owned(), runs(Some(tp), cnt, ns)))
            .collect();
        let (cnt, ns) = empty
            .iter()
            .fold((0, 0), |(c, n), &(_, cnt, ns)| (c + cnt, n + ns));
        Sample {
            workload,
            agent: Some(AgentUsage {
                startup_peak_rss_kib: 0,
                peak_rss_kib: 0,
                rss_before_kib: 0,
                rss_after_kib: 0,
                cpu_s: 0.0,
                wall_s: 1.0,
                cpu_pct: 0.0,
                stdout_lines: 0,
                programs: programs
                    .iter()
                    .map(|&(name, tp, cnt, ns)| (name.to_owned(), runs(tp, cnt, ns)))
                    .collect(),
                map_memlock_bytes: 0,
                map_memlock_at_target_cpus_bytes: 0,
                maps: Vec::new(),
                accounting: None,
            }),
            floor: Some(ProgramRuns {
                tracepoint: None,
                ..runs(Some("all"), cnt, ns)
            }),
            floor_by_tracepoint,
            ..sample(0, Mode::Profile, 0.0)
        }
    }

    #[test]
    fn program_cost_is_net_of_the_floor_on_its_tracepoint() {
        // nd_x on tp_x: 100 cold runs at 900 ns in one workload, 300 hot ones at 70 in the
        // other; the empty program on tp_x ran as often, at 200 and 30 ns. nd_tc (no
        // tracepoint): 1,000 runs at 60 ns. The empty program on tp_y: 900 at 40, 700 at
        // 30; on tp_z it did not run in the storm, where nd_z ran.
        let mut samples = vec![
            profiled(
                Workload::IperfOverlay,
                &[
                    ("nd_x", Some("tp_x"), 100, 90_000),
                    ("nd_tc", None, 1_000, 60_000),
                ],
                &[("tp_x", 100, 20_000), ("tp_y", 900, 36_000)],
            ),
            profiled(
                Workload::Storm,
                &[
                    ("nd_x", Some("tp_x"), 300, 21_000),
                    ("nd_z", Some("tp_z"), 10, 1_000),
                ],
                &[("tp_x", 300, 9_000), ("tp_y", 700, 21_000), ("tp_z", 0, 0)],
            ),
        ];
        // The pairs ran without statistics: their figures must not count.
        let mut unprofiled = profiled(
            Workload::Storm,
            &[("nd_x", Some("tp_x"), 1_000, 1_000_000)],
            &[("tp_x", 1_000, 1_000_000)],
        );
        unprofiled.mode = Mode::Agent;
        samples.push(unprofiled);
        let floors = floors(&samples);
        assert_eq!(floors[&Workload::IperfOverlay], Some(56_000.0 / 1_000.0));
        assert_eq!(floors[&Workload::Storm], Some(30.0));
        // Over every empty program and profile: 86_000 ns / 2_000 runs.
        assert_eq!(floor(&samples), (2_000, Some(43.0)));
        let summary = programs(&samples, floor(&samples).1);
        let x = &summary["nd_x"];
        assert_eq!((x.run_cnt, x.run_time_ns), (400, 111_000));
        assert_eq!(x.tracepoint.as_deref(), Some("tp_x"));
        assert_eq!(x.avg_ns, Some(277.5));
        // Each workload's runs net of tp_x's floor there: (70_000 + 12_000) / 400.
        assert_eq!(x.net_ns, Some(205.0));
        assert_eq!(x.floor_ns, Some(72.5));
        assert_eq!(x.avg_ns_by_workload[&Workload::IperfOverlay], Some(900.0));
        assert_eq!(x.net_ns_by_workload[&Workload::IperfOverlay], Some(700.0));
        assert_eq!(x.net_ns_by_workload[&Workload::Storm], Some(40.0));
        // No tracepoint, or no run of its empty program: the whole bench's floor.
        assert_eq!(summary["nd_tc"].net_ns, Some(17.0));
        assert_eq!(summary["nd_z"].net_ns, Some(57.0));
        // Without the bench's floor, only the programs with a floor of their own have a
        // net figure.
        let summary = programs(&samples, None);
        assert_eq!(summary["nd_x"].net_ns, Some(205.0));
        assert_eq!(summary["nd_tc"].net_ns, None);
        assert_eq!(summary["nd_z"].net_ns, None);
    }

    #[test]
    fn lead_empty_programs_are_shown_not_charged() {
        // nd_x between a lead empty program on tp_x (first: 150 ns, the cold clock reads)
        // and the floor's (last: 50 ns). The lead is the workload's row; nd_x stays
        // charged the floor: (30_000 − 100 × 50) / 100.
        let mut sample = profiled(
            Workload::IperfLossy,
            &[("nd_x", Some("tp_x"), 100, 30_000)],
            &[("tp_x", 100, 5_000)],
        );
        sample.lead = Some(runs(None, 100, 15_000));
        sample
            .lead_by_tracepoint
            .insert("tp_x".to_owned(), runs(Some("tp_x"), 100, 15_000));
        let samples = [sample];
        assert_eq!(leads(&samples)[&Workload::IperfLossy], Some(150.0));
        assert!(!leads(&samples).contains_key(&Workload::Storm));
        let summary = programs(&samples, floor(&samples).1);
        assert_eq!(summary["nd_x"].net_ns, Some(250.0));
        assert_eq!(summary["nd_x"].floor_ns, Some(50.0));
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
        let paired = Paired::of(&samples, Workload::IperfOverlay, |s| Some(s.value));
        assert_eq!(
            (paired.baseline, paired.agent, paired.ratio()),
            (Some(10.0), Some(10.0), Some(1.0))
        );
        assert_eq!(paired.ratios, [0.9, 1.0, 1.0]);
        let row = paired.row("overlay", |v| format!("{v}"));
        assert_eq!((row.ratio_min, row.ratio_max), (Some(0.9), Some(1.0)));
        assert_eq!(row.cells[3], "0.900–1.000");
    }

    #[test]
    fn median_intervals_hold_95_percent() {
        // Five values cannot give 95 %: even min–max holds the median with 1 − 2/32.
        assert_eq!(median_interval(&[1.0, 2.0, 3.0, 4.0, 5.0]), None);
        // Six: min–max, 1 − 2/64.
        let six = median_interval(&[6.0, 1.0, 5.0, 2.0, 4.0, 3.0]).unwrap();
        assert_eq!((six.low, six.high), (1.0, 6.0));
        assert!((six.confidence - (1.0 - 2.0 / 64.0)).abs() < 1e-12);
        // Seven, the old default: still min–max (1 − 2/128); the second smallest would
        // leave 1 − 16/128 = 87.5 %.
        let seven: Vec<f64> = (1..=7).map(f64::from).collect();
        let i = median_interval(&seven).unwrap();
        assert_eq!((i.low, i.high), (1.0, 7.0));
        // 21 pairs: the 6th smallest and the 6th largest (P(Bin(21, ½) ≤ 5) = 0.0133,
        // so 97.3 %; the 7th would give 92.2 %).
        let many: Vec<f64> = (1..=21).rev().map(f64::from).collect();
        let i = median_interval(&many).unwrap();
        assert_eq!((i.low, i.high), (6.0, 16.0));
        assert!((i.confidence - 0.9734).abs() < 1e-4, "{}", i.confidence);
    }

    #[test]
    fn unresolved_when_the_interval_straddles_the_target() {
        let pairs = |ratios: &[f64]| {
            let samples: Vec<Sample> = ratios
                .iter()
                .enumerate()
                .flat_map(|(run, &r)| {
                    let run = run as u32;
                    [
                        sample(run, Mode::Baseline, 100.0),
                        sample(run, Mode::Agent, 100.0 * r),
                    ]
                })
                .collect();
            Paired::of(&samples, Workload::IperfOverlay, |s| Some(s.value)).row_at_least(
                "x",
                |v| format!("{v}"),
                0.99,
            )
        };
        let row = pairs(&[0.97, 0.98, 0.985, 0.995, 1.0, 1.01, 1.02]);
        assert_eq!(row.verdict, Verdict::Pass);
        assert_eq!(row.resolved, Some(false));
        assert_eq!(row.verdict_cell(), "pass (unresolved)");
        assert_eq!(row.cells[3], "0.970–1.020; 0.970–1.020");
        let row = pairs(&[0.995, 0.996, 0.997, 0.998, 0.999, 1.0, 1.001]);
        assert_eq!(
            (row.verdict_cell(), row.resolved),
            ("pass".to_owned(), Some(true))
        );
        let row = pairs(&[0.90, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96]);
        assert_eq!(row.verdict_cell(), "FAIL");
        // Too few pairs for an interval: judged on the median alone.
        let row = pairs(&[0.90, 1.0]);
        assert_eq!(
            (row.resolved, row.verdict_cell()),
            (None, "FAIL".to_owned())
        );
    }

    #[test]
    fn spreads_of_pair_ratios() {
        assert_eq!(spread(&[]), "n/a");
        assert_eq!(spread(&[0.984]), "0.984 (1 pair)");
        assert_eq!(spread(&[1.02, 0.968, 0.99]), "0.968–1.020");
    }

    #[test]
    fn budgets_by_hook() {
        assert_eq!(program_budget("nd_kfree_skb"), Some((60.0, "per packet")));
        assert_eq!(program_budget("nd_tc_ingress"), Some((60.0, "per packet")));
        assert_eq!(
            program_budget("nd_icmp_send"),
            Some((150.0, "per connection"))
        );
        assert_eq!(
            program_budget("nd_err_report"),
            Some((400.0, "error report"))
        );
        assert_eq!(program_budget("nd_new_hook"), None);
    }

    #[test]
    fn compact_counts() {
        assert_eq!(compact_count(999), "999");
        assert_eq!(compact_count(12_345), "12.3k");
        assert_eq!(compact_count(4_541_191), "4.5M");
    }
}
