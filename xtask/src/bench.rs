//! `cargo xtask bench`: what the agent costs the traffic it watches.
//!
//! Builds the release agent and the integration tests' topology (two nodes, a vxlan
//! overlay, a pod per node), then measures each workload without and with the agent
//! (running in node A), alternating the order from run to run because the machines are
//! shared and noisy, and reports medians:
//!
//! - bulk throughput (iperf3) across the overlay and across the plain underlay veth;
//! - short TCP connections pod A → pod B (our own load generator), closed loop (as many
//!   as the machine completes: the judged figure) and paced at an offered rate (for the
//!   latency of one connection);
//! - a flood of UDP datagrams from pod A into a drop rule in node A's forward hook, so
//!   that `skb:kfree_skb` fires, in the agent's scope, on every packet;
//! - the agent's programs' average run time against a budget per hook, from one profile
//!   measurement per workload after the pairs (the agent with `--icmp-watch always`, so
//!   that the TC classifier runs in every workload; `kernel.bpf_stats_enabled` on, with an
//!   empty program on each of the agent's tracepoints for the statistics' own floor, and
//!   one before the agent's on each, so that the agent's never run first: `floor`), its
//!   RSS and CPU, and the memory of its eBPF maps (here and computed for a
//!   128-CPU node);
//! - a storm of refused connects, each of which must show up in a finding's `count` or
//!   in `node_diag_events_lost_total`.
//!
//! The pairs run as nodes do, with the kernel's run statistics off: with them on, the
//! kernel reads its clock twice around every program run, which on a nested VM costs more
//! than most of the programs themselves and would be charged to the agent.
//!
//! Ratios are agent ÷ baseline of each back-to-back pair; the table shows their median
//! and their spread (min–max). The targets are judged by people reading the table: the
//! command fails only when the benchmark itself breaks (a workload, the topology or the
//! agent fails).

mod agent;
mod floor;
mod load;
mod report;

use std::{
    collections::BTreeMap,
    fs,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use node_diag_testbed::{Topology, netns};
use serde::Serialize;

use self::{
    agent::{Agent, MapMemory, ProcSample, RunStats},
    floor::EmptyPrograms,
    load::{ConnStats, DropRule, EchoServer, FloodStats, IperfServer, StormStats},
    report::Report,
};
use crate::{cmd, prereqs, say::bench as say};

/// Tools the bench drives: (binary, Debian package).
const BENCH_TOOLS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("ss", "iproute2"),
    ("sysctl", "procps"),
    ("ping", "iputils-ping"),
    ("bpftool", "bpftool"),
    ("iperf3", "iperf3"),
    ("nft", "nftables"),
];
const IPERF_PORT: u16 = 5201;
const ECHO_PORT: u16 = 7000;
/// Nothing listens there: the storm's target.
const CLOSED_PORT: u16 = 7999;
/// UDP port the drop flood sends to; node A's forward hook drops it.
const FLOOD_PORT: u16 = 7998;
/// Share of the lossy transfer's packets node A drops (‰).
const LOSS_PER_MILLE: u32 = 5;
/// Threads of the connection generator (paced and closed loop), of the echo server, of
/// the storm and of the drop flood's sender.
const CONN_THREADS: u32 = 16;
const ECHO_THREADS: usize = 8;
const STORM_THREADS: u32 = 4;
const FLOOD_THREADS: u32 = 4;
/// Pause before each measurement (after the agent is ready, or none started), so the
/// agent's start-up and the previous workload's tail are out of the figures.
const SETTLE: Duration = Duration::from_secs(1);
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Pairs per workload, and seconds per measurement, by default. Many short pairs rather
/// than a few long ones: this host's speed drifts by 10–20 % over tens of seconds, and
/// two measurements of a pair lie closer together the shorter they are. On a baseline
/// throughput series taken here, 21 pairs of 3 s put the median of the pair ratios
/// within about ±2 % (one standard deviation) of what it would be with a free agent;
/// 7 pairs of 10 s, about ±5 % (docs/benchmarks.md, "Noise").
const DEFAULT_RUNS: u32 = 21;
const DEFAULT_DURATION_S: u64 = 3;
/// Shortest profile measurement: a hook that runs rarely in a workload (the retransmit
/// hook in a clean transfer) runs there cold, at the start, and a short profile would
/// weigh those cold runs more than a node does.
const PROFILE_MIN_S: u64 = 10;

/// Options of `cargo xtask bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Tiny sizes (1 run, 2 s per workload, 2,000 storm connects), for CI.
    #[arg(long)]
    pub smoke: bool,
    /// Baseline/agent pairs per workload (default 21; 1 with --smoke).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub runs: Option<u32>,
    /// Seconds per throughput, connection and drop-flood measurement (default 3; 2
    /// with --smoke).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=600))]
    pub duration: Option<u64>,
    /// Short connections offered per second (default 10000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub conn_rate: Option<u32>,
    /// Refused connects in the storm (default 50000; 2000 with --smoke).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub storm: Option<u64>,
    /// Measure only this workload (repeatable; default all). Rows of the workloads
    /// left out are left out of the table.
    #[arg(long = "workload", value_name = "NAME")]
    pub workloads: Vec<Workload>,
    /// A null run: both measurements of every pair without the agent, and no profile.
    /// Its ratios show what this machine's noise alone does to them: how far from
    /// 1.000 a median lands when the agent costs nothing.
    #[arg(long)]
    pub null: bool,
    /// Where to write the JSON results (default target/bench/bench.json).
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
}

/// The sizes this bench runs with.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub smoke: bool,
    pub runs: u32,
    pub duration_s: u64,
    /// Seconds of each profile measurement: at least [`PROFILE_MIN_S`] (not with
    /// `--smoke`), so the per-program figures rest on as many runs as before the pairs
    /// became short.
    pub profile_duration_s: u64,
    /// Offered short connections per second.
    pub conn_rate: u32,
    /// Refused connects in the storm.
    pub storm_connects: u64,
    /// The workloads measured, in the bench's order.
    pub workloads: Vec<Workload>,
    /// A null (A/A) run: the "agent" measurement of each pair runs without the agent
    /// too, and there is no profile, so the ratios measure the machine's noise alone.
    pub null: bool,
}

impl Settings {
    fn new(options: &Options) -> Self {
        let smoke = options.smoke;
        let duration_s = options
            .duration
            .unwrap_or(if smoke { 2 } else { DEFAULT_DURATION_S })
            .max(1);
        Self {
            smoke,
            runs: options
                .runs
                .unwrap_or(if smoke { 1 } else { DEFAULT_RUNS })
                .max(1),
            duration_s,
            profile_duration_s: if smoke {
                duration_s
            } else {
                duration_s.max(PROFILE_MIN_S)
            },
            conn_rate: options.conn_rate.unwrap_or(10_000).max(1),
            storm_connects: options
                .storm
                .unwrap_or(if smoke { 2_000 } else { 50_000 })
                .max(1),
            workloads: Workload::ALL
                .into_iter()
                .filter(|w| options.workloads.is_empty() || options.workloads.contains(w))
                .collect(),
            null: options.null,
        }
    }

    /// How long a measurement of `mode` runs its workload.
    fn duration(&self, mode: Mode) -> Duration {
        Duration::from_secs(match mode {
            Mode::Profile => self.profile_duration_s,
            Mode::Baseline | Mode::Agent => self.duration_s,
        })
    }

    /// The command line that reproduces these settings.
    fn command_line(&self, options: &Options) -> String {
        let mut line = String::from("cargo xtask bench");
        if self.smoke {
            line.push_str(" --smoke");
        }
        if options.runs.is_some() {
            line.push_str(&format!(" --runs {}", self.runs));
        }
        if options.duration.is_some() {
            line.push_str(&format!(" --duration {}", self.duration_s));
        }
        if options.conn_rate.is_some() {
            line.push_str(&format!(" --conn-rate {}", self.conn_rate));
        }
        if options.storm.is_some() {
            line.push_str(&format!(" --storm {}", self.storm_connects));
        }
        for workload in &options.workloads {
            line.push_str(&format!(" --workload {}", workload.name()));
        }
        if self.null {
            line.push_str(" --null");
        }
        if let Some(out) = &options.out {
            line.push_str(&format!(" --out {}", out.display()));
        }
        line
    }
}

/// One workload of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Workload {
    /// iperf3 pod A → pod B through the vxlan overlay.
    IperfOverlay,
    /// iperf3 node B → node A across the underlay veth.
    IperfVeth,
    /// iperf3 pod A → pod B through the overlay, a random share of the data dropped in
    /// node A's forward hook: pod A's socket retransmits, so `nd_retransmit` runs hot.
    IperfLossy,
    /// Paced short connections pod A → pod B.
    ConnRate,
    /// Short connections pod A → pod B, each thread's next as soon as the previous ends.
    ConnClosedLoop,
    /// UDP datagrams pod A → pod B, dropped in node A's forward hook.
    DropFlood,
    /// Refused connects pod A → a closed port on pod B, as fast as possible.
    Storm,
}

impl Workload {
    const ALL: [Self; 7] = [
        Self::IperfOverlay,
        Self::IperfVeth,
        Self::IperfLossy,
        Self::ConnRate,
        Self::ConnClosedLoop,
        Self::DropFlood,
        Self::Storm,
    ];

    /// The name `--workload` takes (and the JSON uses).
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self)
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::IperfOverlay => "iperf3 overlay",
            Self::IperfVeth => "iperf3 veth",
            Self::IperfLossy => "iperf3 overlay, lossy",
            Self::ConnRate => "connection rate",
            Self::ConnClosedLoop => "closed-loop connections",
            Self::DropFlood => "drop flood",
            Self::Storm => "refused storm",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Baseline,
    Agent,
    /// The agent with the kernel's run statistics on: per-program run times, not ratios.
    Profile,
}

/// One measurement: a workload, once, with or without the agent.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub run: u32,
    pub workload: Workload,
    pub mode: Mode,
    /// The workload's figure: bit/s (iperf3), completed connections/s, packets/s that
    /// reached the drop rule (drop flood), refused connects/s.
    pub value: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conn: Option<ConnStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood: Option<FloodStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storm: Option<StormStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentUsage>,
    /// Profile only: the empty programs' runs during the workload, summed (see `floor`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<ProgramRuns>,
    /// Profile only: the same by tracepoint.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub floor_by_tracepoint: BTreeMap<String, ProgramRuns>,
    /// Profile only: the lead empty programs' runs (attached before the agent, so first on
    /// each tracepoint), summed; shown, never charged (see `floor`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lead: Option<ProgramRuns>,
    /// Profile only: the same by tracepoint.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub lead_by_tracepoint: BTreeMap<String, ProgramRuns>,
    /// `nd_*` programs other processes (another node-diag agent, e.g. a concurrent test)
    /// had loaded before or after the workload: they fire on its traffic too.
    pub foreign_nd_programs: usize,
}

/// What the agent used during one workload.
#[derive(Debug, Clone, Serialize)]
pub struct AgentUsage {
    /// VmHWM from start-up to the workload (then reset).
    pub startup_peak_rss_kib: u64,
    /// VmHWM during the workload (reset before it).
    pub peak_rss_kib: u64,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    /// utime + stime, its waited-for children's included, during the workload (for the
    /// storm: until the agent accounted for it).
    pub cpu_s: f64,
    pub wall_s: f64,
    /// `cpu_s / wall_s`, in percent of one core.
    pub cpu_pct: f64,
    /// Lines the agent printed on stdout (findings) during the workload.
    pub stdout_lines: u64,
    /// Run statistics of each `nd_*` program during the workload.
    pub programs: BTreeMap<String, ProgramRuns>,
    /// Sum of the memlock of the agent's eBPF maps after the workload, on this machine.
    pub map_memlock_bytes: u64,
    /// The same computed for a node of [`agent::TARGET_CPUS`] CPUs.
    pub map_memlock_at_target_cpus_bytes: u64,
    /// Each map (the report keeps those of the measurement with the largest total).
    #[serde(skip)]
    pub maps: Vec<MapMemory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accounting: Option<Accounting>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProgramRuns {
    #[serde(rename = "type")]
    pub kind: String,
    /// The tracepoint it runs on (none for the TC classifier).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracepoint: Option<String>,
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

/// The storm's failures against what the agent accounted for.
#[derive(Debug, Clone, Serialize)]
pub struct Accounting {
    /// Refused connects the client saw.
    pub refused: u64,
    /// Growth of the sum of the `tcp_refused` findings' `count` during the storm.
    pub findings_count: u64,
    /// Growth of `node_diag_events_lost_total` during the storm.
    pub events_lost: u64,
    /// `findings_count + events_lost - refused`: 0 when every failure is accounted for.
    pub difference: i64,
    /// `tcp_refused` findings at the end of the storm.
    pub refused_findings: u64,
    /// Every finding at the end of the storm.
    pub findings: u64,
    /// How long the agent took to account for the storm after the client finished.
    pub settle_s: f64,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Whether SIGINT or SIGTERM arrived; every loop of the bench checks it.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

fn check_interrupted() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

/// Turns SIGINT and SIGTERM into [`interrupted`], so the bench unwinds through its guards
/// (namespaces, agent, servers, sysctl) instead of dying with them in place.
fn catch_signals() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, handler) };
    }
}

pub fn run(options: &Options) -> Result<()> {
    if !cmd::is_root() {
        bail!(
            "the bench needs root (network namespaces, eBPF, sysctl): run `cargo xtask bench` as root"
        );
    }
    let settings = Settings::new(options);
    let command_line = settings.command_line(options);
    prereqs::ensure(prereqs::Tools::BUILD)?;
    prereqs::ensure_system_tools(BENCH_TOOLS)?;
    crate::agent::build(true)?;
    let binary = crate::agent::binary(true)?;
    let out = match &options.out {
        Some(out) => out.clone(),
        None => cmd::target_dir()?.join("bench").join("bench.json"),
    };

    catch_signals();
    let machine = report::Machine::describe();
    say(format_args!(
        "{command_line}: {} run(s), {} s per workload ({} s per profile), {} conn/s \
         offered, {} storm connects",
        settings.runs,
        settings.duration_s,
        settings.profile_duration_s,
        settings.conn_rate,
        settings.storm_connects
    ));
    let started = Instant::now();
    let samples = (|| {
        let _stats = BpfStats::set(false)?;
        let bench = Bench::new(&binary, &settings)?;
        bench.measure_all()
    })()
    .map_err(|err| {
        if interrupted() {
            anyhow::anyhow!("interrupted; namespaces, agent and sysctl cleaned up ({err:#})")
        } else {
            err
        }
    })?;
    let report = Report::new(command_line, settings, machine, samples, started.elapsed());
    println!();
    print!("{}", report.markdown());
    report.write_json(&out)?;
    println!();
    say(format_args!("JSON: {}", out.display()));
    Ok(())
}

/// The topology and the servers every measurement uses.
struct Bench<'a> {
    binary: &'a Path,
    settings: &'a Settings,
    // Drop order: servers first, then the namespaces they live in.
    _servers: (IperfServer, IperfServer, EchoServer),
    topo: Topology,
}

impl<'a> Bench<'a> {
    fn new(binary: &'a Path, settings: &'a Settings) -> Result<Self> {
        say("topology: two nodes, vxlan overlay, a pod per node");
        let topo = build_topology()?;
        let servers = (
            IperfServer::start(&topo.pod_b, IPERF_PORT)?,
            IperfServer::start(&topo.node_a, IPERF_PORT)?,
            EchoServer::start(
                &topo.pod_b,
                SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, ECHO_PORT)),
                ECHO_THREADS,
            )?,
        );
        Ok(Self {
            binary,
            settings,
            _servers: servers,
            topo,
        })
    }

    /// Every workload in every run, baseline and agent in alternating order, then one
    /// profile measurement of each workload.
    fn measure_all(&self) -> Result<Vec<Sample>> {
        let mut samples = Vec::new();
        for run in 0..self.settings.runs {
            for (index, &workload) in self.settings.workloads.iter().enumerate() {
                let order = if (run as usize + index).is_multiple_of(2) {
                    [Mode::Baseline, Mode::Agent]
                } else {
                    [Mode::Agent, Mode::Baseline]
                };
                for mode in order {
                    check_interrupted()?;
                    let sample = self.measure(run, workload, mode).with_context(|| {
                        format!("run {}: {} ({mode:?})", run + 1, workload.label())
                    })?;
                    say(report::progress_line(&sample));
                    samples.push(sample);
                }
            }
        }
        // A null run has no agent to profile.
        let profiled = if self.settings.null {
            &[][..]
        } else {
            &self.settings.workloads[..]
        };
        for &workload in profiled {
            check_interrupted()?;
            let sample = self
                .measure(self.settings.runs, workload, Mode::Profile)
                .with_context(|| format!("profile: {}", workload.label()))?;
            say(report::progress_line(&sample));
            samples.push(sample);
        }
        Ok(samples)
    }

    fn measure(&self, run: u32, workload: Workload, mode: Mode) -> Result<Sample> {
        // The lead empty programs, attached before the agent so that they run first on
        // each tracepoint (a tracepoint calls its programs in the order they were
        // attached) and take the clock's cold reads; see `floor`.
        let lead = match mode {
            Mode::Profile => Some(EmptyPrograms::attach()?),
            _ => None,
        };
        let mut agent = match mode {
            Mode::Agent if self.settings.null => None,
            // As installed: the TC classifier attached only once trouble shows.
            Mode::Agent => Some(Agent::start(self.binary, &self.topo, READY_TIMEOUT, &[])?),
            // The classifier attached from the start, so that its cost per packet is
            // measured on every workload, not only where trouble attached it.
            Mode::Profile => Some(Agent::start(
                self.binary,
                &self.topo,
                READY_TIMEOUT,
                &["--icmp-watch", "always"],
            )?),
            Mode::Baseline => None,
        };
        // Statistics on, and the empty programs that measure their floor, for the profile
        // only; off again (and detached) when the measurement ends, however it ends.
        let profile = match mode {
            Mode::Profile => Some((BpfStats::set(true)?, EmptyPrograms::attach()?)),
            _ => None,
        };
        thread::sleep(SETTLE);
        let pid = agent.as_ref().map(Agent::pid);
        let foreign_before = agent::foreign_programs(pid)?;
        // Only for the flood and the lossy transfer: a forward hook in node A would cost
        // the other workloads.
        let drop_rule = match workload {
            Workload::DropFlood => Some(DropRule::udp_port(&self.topo.node_a, FLOOD_PORT)?),
            Workload::IperfLossy => Some(DropRule::tcp_loss(
                &self.topo.node_a,
                IPERF_PORT,
                LOSS_PER_MILLE,
            )?),
            _ => None,
        };
        let before = agent.as_ref().map(Before::take).transpose()?;
        let floor_before = profile.as_ref().map(|(_, e)| e.stats()).transpose()?;
        let lead_before = lead.as_ref().map(EmptyPrograms::stats).transpose()?;

        let began = Instant::now();
        let mut sample = Sample {
            run,
            workload,
            mode,
            value: 0.0,
            conn: None,
            flood: None,
            storm: None,
            agent: None,
            floor: None,
            floor_by_tracepoint: BTreeMap::new(),
            lead: None,
            lead_by_tracepoint: BTreeMap::new(),
            foreign_nd_programs: 0,
        };
        let duration = self.settings.duration(mode);
        match workload {
            Workload::IperfOverlay | Workload::IperfLossy => {
                let server = SocketAddr::V4(SocketAddrV4::new(self.topo.pod_b_ip, IPERF_PORT));
                sample.value = load::iperf(&self.topo.pod_a, server, duration)?;
            }
            Workload::IperfVeth => {
                let server =
                    SocketAddr::V4(SocketAddrV4::new(self.topo.node_a_underlay, IPERF_PORT));
                sample.value = load::iperf(&self.topo.node_b, server, duration)?;
            }
            Workload::ConnRate | Workload::ConnClosedLoop => {
                let server = SocketAddr::V4(SocketAddrV4::new(self.topo.pod_b_ip, ECHO_PORT));
                let rate = (workload == Workload::ConnRate).then_some(self.settings.conn_rate);
                let stats = load::short_connections(
                    &self.topo.pod_a,
                    server,
                    rate,
                    duration,
                    CONN_THREADS,
                )?;
                sample.value = stats.rate;
                sample.conn = Some(stats);
            }
            Workload::DropFlood => {
                let target = SocketAddr::V4(SocketAddrV4::new(self.topo.pod_b_ip, FLOOD_PORT));
                let rule = drop_rule
                    .as_ref()
                    .context("the drop flood runs without its drop rule")?;
                let stats =
                    load::drop_flood(&self.topo.pod_a, target, duration, FLOOD_THREADS, rule)?;
                sample.value = stats.drop_rate;
                sample.flood = Some(stats);
            }
            Workload::Storm => {
                let target = SocketAddr::V4(SocketAddrV4::new(self.topo.pod_b_ip, CLOSED_PORT));
                let limit = Duration::from_secs(300);
                let stats = load::refused_storm(
                    &self.topo.pod_a,
                    target,
                    self.settings.storm_connects,
                    STORM_THREADS,
                    limit,
                )?;
                sample.value = stats.rate;
                sample.storm = Some(stats);
            }
        }
        if let (Some((_, empty)), Some(earlier)) = (&profile, floor_before) {
            (sample.floor, sample.floor_by_tracepoint) = empty_runs(empty, &earlier)?;
        }
        if let (Some(empty), Some(earlier)) = (&lead, lead_before) {
            (sample.lead, sample.lead_by_tracepoint) = empty_runs(empty, &earlier)?;
        }
        if let (Some(agent), Some(before)) = (agent.as_mut(), before) {
            agent.check_alive()?;
            // The agent handles the storm's events after the client is done: its CPU
            // time counts until it has accounted for them (or given up).
            let accounting = match &sample.storm {
                Some(storm) => Some(account(agent, storm.refused, &before)?),
                None => None,
            };
            let wall = began.elapsed().as_secs_f64();
            let after = agent.sample()?;
            let programs = agent.prog_stats(&before.names)?;
            let cpu_s = (after.cpu_secs - before.proc.cpu_secs).max(0.0);
            let maps = agent.maps()?;
            sample.agent = Some(AgentUsage {
                startup_peak_rss_kib: before.startup_hwm_kib,
                peak_rss_kib: after.hwm_kib,
                rss_before_kib: before.proc.rss_kib,
                rss_after_kib: after.rss_kib,
                cpu_s,
                wall_s: wall,
                cpu_pct: 100.0 * cpu_s / wall,
                stdout_lines: agent.stdout_lines() - before.stdout_lines,
                programs: program_runs(&before, &programs),
                map_memlock_bytes: maps.iter().map(|m| m.memlock_bytes).sum(),
                map_memlock_at_target_cpus_bytes: maps
                    .iter()
                    .map(|m| m.memlock_at_target_cpus_bytes)
                    .sum(),
                maps,
                accounting,
            });
        }
        sample.foreign_nd_programs = foreign_before.max(agent::foreign_programs(pid)?);
        drop(profile);
        if let Some(agent) = agent {
            agent.stop()?;
        }
        drop(lead);
        drop(drop_rule);
        Ok(sample)
    }
}

/// Empty programs' runs since `earlier`: summed over their tracepoints, and by tracepoint.
fn empty_runs(
    empty: &EmptyPrograms,
    earlier: &BTreeMap<&'static str, RunStats>,
) -> Result<(Option<ProgramRuns>, BTreeMap<String, ProgramRuns>)> {
    let runs_of = |tracepoint: Option<&str>, runs: RunStats| ProgramRuns {
        kind: "raw_tracepoint".to_owned(),
        tracepoint: tracepoint.map(str::to_owned),
        run_cnt: runs.run_cnt,
        run_time_ns: runs.run_time_ns,
    };
    let mut total = RunStats::default();
    let mut by_tracepoint = BTreeMap::new();
    for (tracepoint, stats) in empty.stats()? {
        let runs = stats.since(earlier.get(tracepoint).copied().unwrap_or_default());
        total.run_cnt += runs.run_cnt;
        total.run_time_ns += runs.run_time_ns;
        by_tracepoint.insert(tracepoint.to_owned(), runs_of(Some(tracepoint), runs));
    }
    Ok((Some(runs_of(None, total)), by_tracepoint))
}

/// Prefix of the bench's namespace names, followed by the bench's pid.
const NETNS_PREFIX: &str = "ndb-";

/// The testbed's topology as `ndb-<pid>-{na,nb,pa,pb}`, after deleting those of benches
/// that died without cleaning up (their pid is gone), with pod A tuned for the load.
fn build_topology() -> Result<Topology> {
    for name in netns::remove_stale(NETNS_PREFIX) {
        say(format_args!(
            "deleted netns {name} left by a bench that died"
        ));
    }
    let topo = Topology::build(&format!("{NETNS_PREFIX}{}", std::process::id()))?;
    // Pod A opens tens of thousands of short connections: give it every port.
    topo.sysctl(&topo.pod_a, "net.ipv4.ip_local_port_range=1024 65535")?;
    topo.sysctl(&topo.pod_a, "net.ipv4.tcp_tw_reuse=1")?;
    Ok(topo)
}

/// The agent's state just before a workload.
struct Before {
    startup_hwm_kib: u64,
    proc: ProcSample,
    names: BTreeMap<u32, agent::ProgName>,
    programs: BTreeMap<String, RunStats>,
    /// The tracepoint of each program, by name.
    tracepoints: BTreeMap<String, String>,
    stdout_lines: u64,
    refused_count: u64,
    events_lost: u64,
}

impl Before {
    fn take(agent: &Agent) -> Result<Self> {
        let startup_hwm_kib = agent.sample()?.hwm_kib;
        agent.reset_peak_rss()?;
        let names = agent::prog_names()?;
        let programs = agent.prog_stats(&names)?;
        if programs.is_empty() {
            bail!("the agent (pid {}) holds no nd_* eBPF program", agent.pid());
        }
        let tracepoints = agent.prog_tracepoints(&names)?;
        let (refused_count, _, _) = refused_findings(agent)?;
        Ok(Self {
            startup_hwm_kib,
            names,
            programs,
            tracepoints,
            stdout_lines: agent.stdout_lines(),
            refused_count,
            events_lost: events_lost(agent)?,
            // Last: the workload's CPU time starts here.
            proc: agent.sample()?,
        })
    }
}

fn program_runs(
    before: &Before,
    after: &BTreeMap<String, RunStats>,
) -> BTreeMap<String, ProgramRuns> {
    after
        .iter()
        .map(|(name, stats)| {
            let delta = stats.since(before.programs.get(name).copied().unwrap_or_default());
            let kind = before
                .names
                .values()
                .find(|prog| &prog.name == name)
                .map_or_else(|| "?".to_owned(), |prog| prog.kind.clone());
            let runs = ProgramRuns {
                kind,
                tracepoint: before.tracepoints.get(name).cloned(),
                run_cnt: delta.run_cnt,
                run_time_ns: delta.run_time_ns,
            };
            (name.clone(), runs)
        })
        .collect()
}

/// (sum of the `tcp_refused` findings' counts, how many such findings, all findings).
fn refused_findings(agent: &Agent) -> Result<(u64, u64, u64)> {
    let findings = agent.findings()?;
    let refused: Vec<_> = findings
        .iter()
        .filter(|f| f["kind"] == "tcp_refused")
        .collect();
    let count = refused
        .iter()
        .map(|f| {
            f["count"]
                .as_u64()
                .context("a finding without a numeric count")
        })
        .sum::<Result<u64>>()?;
    Ok((count, refused.len() as u64, findings.len() as u64))
}

fn events_lost(agent: &Agent) -> Result<u64> {
    const METRIC: &str = "node_diag_events_lost_total";
    let lost = agent
        .metric(METRIC)?
        .with_context(|| format!("/metrics has no {METRIC}"))?;
    Ok(lost as u64)
}

/// Waits until the agent accounts for all `refused` connects (findings' counts plus lost
/// events), or its figures stop moving for 3 s, or 30 s pass.
fn account(agent: &Agent, refused: u64, before: &Before) -> Result<Accounting> {
    const QUIET: Duration = Duration::from_secs(3);
    const LIMIT: Duration = Duration::from_secs(30);
    let began = Instant::now();
    let mut last = None;
    let mut last_change = began;
    loop {
        let (count, refused_findings, findings) = refused_findings(agent)?;
        let lost = events_lost(agent)?;
        let findings_count = count.saturating_sub(before.refused_count);
        let events_lost = lost.saturating_sub(before.events_lost);
        let accounted = findings_count + events_lost;
        let now = Instant::now();
        if last != Some(accounted) {
            last = Some(accounted);
            last_change = now;
        }
        if accounted == refused
            || now - last_change >= QUIET
            || now - began >= LIMIT
            || interrupted()
        {
            return Ok(Accounting {
                refused,
                findings_count,
                events_lost,
                difference: accounted as i64 - refused as i64,
                refused_findings,
                findings,
                settle_s: (now - began).as_secs_f64(),
            });
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// `kernel.bpf_stats_enabled` set for a while; the previous value is restored on drop.
struct BpfStats {
    previous: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    fn set(on: bool) -> Result<Self> {
        let previous = fs::read_to_string(BPF_STATS)
            .with_context(|| format!("cannot read {BPF_STATS}"))?
            .trim()
            .to_owned();
        let value = if on { "1" } else { "0" };
        fs::write(BPF_STATS, value)
            .with_context(|| format!("cannot write {value} to {BPF_STATS}"))?;
        if previous != value {
            say(format_args!(
                "kernel.bpf_stats_enabled: {previous} -> {value}"
            ));
        }
        Ok(Self { previous })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Err(err) = fs::write(BPF_STATS, &self.previous) {
            eprintln!(
                "[bench] warning: cannot restore {BPF_STATS} to {}: {err}",
                self.previous
            );
        }
    }
}
