//! What a bench run measures and for how long: the command's options, and the sizes
//! they resolve to (the defaults, `--smoke`'s), which the report records.

use std::{path::PathBuf, time::Duration};

use serde::Serialize;

use super::{
    sample::Mode,
    workload::{Choice, ScaleWorkload, Workload},
};

/// Pairs per workload, and seconds per measurement, by default. Many short pairs rather
/// than a few long ones: this host's speed drifts by 10–20 % over tens of seconds, and
/// two measurements of a pair lie closer together the shorter they are. On a baseline
/// throughput series taken here, 21 pairs of 3 s put the median of the pair ratios
/// within about ±2 % (one standard deviation) of what it would be with a free agent;
/// 7 pairs of 10 s, about ±5 % (a run recorded in the history of docs/benchmarks.md).
pub(super) const DEFAULT_RUNS: u32 = 21;
pub(super) const DEFAULT_DURATION_S: u64 = 3;
/// Shortest profile measurement: a hook that runs rarely in a workload (the retransmit
/// hook in a clean transfer) runs there cold, at the start, and a short profile would
/// weigh those cold runs more than a node does.
pub(super) const PROFILE_MIN_S: u64 = 10;
/// Seconds of each scale workload measurement, at least (not with `--smoke`).
pub(super) const SCALE_MIN_S: u64 = 20;
/// Pairs of each scale workload, at most.
pub(super) const SCALE_RUNS: u32 = 3;

/// Options of `cargo xtask bench`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Options {
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
    /// Measure only this workload (repeatable; default every baseline/agent pair
    /// workload). `scale` (or one `scale_*` workload) measures the agent idle as the
    /// cluster grows, only when named: it takes minutes. Rows of the workloads left
    /// out are left out of the table.
    #[arg(long = "workload", value_name = "NAME")]
    pub workloads: Vec<Choice>,
    /// A null run: both measurements of every pair without the agent, and no profile.
    /// Its ratios show what this machine's noise alone does to them: how far from
    /// 1.000 a median lands when the agent costs nothing.
    #[arg(long)]
    pub null: bool,
    /// Where to write the JSON results (default target/bench/bench.json; with
    /// --kernel, target/bench/bench-<KERNEL>.json).
    #[arg(long, value_name = "PATH")]
    pub out: Option<PathBuf>,
    /// Run the bench inside a guest booted with this Debian kernel (5.10, 6.1 or 6.12;
    /// x86_64), as `cargo xtask integration` boots them: the per-program figures on the
    /// hooks that kernel gives the agent (5.10's fallbacks). Under emulation (TCG) only
    /// ratios and relative costs mean anything, no absolute throughput.
    #[arg(long, value_name = "KERNEL")]
    pub kernel: Option<String>,
    /// Minutes the guest of --kernel may run before it is killed.
    #[arg(long, value_name = "MINUTES", default_value_t = 90, requires = "kernel",
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub timeout: u64,
    /// The release agent to measure, instead of building it (how the guest of --kernel
    /// runs the bench: it has no toolchain to build with).
    #[arg(long, value_name = "PATH", hide = true, conflicts_with = "kernel")]
    pub agent: Option<PathBuf>,
}

impl Options {
    /// The options a guest's bench runs with, and the command line reproduces: these, but
    /// where it runs and where it writes, which the guest decides.
    pub(crate) fn guest_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if self.smoke {
            args.push("--smoke".to_owned());
        }
        let mut value = |flag: &str, value: Option<String>| {
            if let Some(value) = value {
                args.extend([flag.to_owned(), value]);
            }
        };
        value("--runs", self.runs.map(|v| v.to_string()));
        value("--duration", self.duration.map(|v| v.to_string()));
        value("--conn-rate", self.conn_rate.map(|v| v.to_string()));
        value("--storm", self.storm.map(|v| v.to_string()));
        for workload in &self.workloads {
            args.extend(["--workload".to_owned(), workload.name()]);
        }
        if self.null {
            args.push("--null".to_owned());
        }
        args
    }
}

/// The sizes this bench runs with.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Settings {
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
    /// The pair workloads measured, in the bench's order.
    pub workloads: Vec<Workload>,
    /// The scale workloads measured, in the group's order.
    pub scale: Vec<ScaleWorkload>,
    /// A null (A/A) run: the "agent" measurement of each pair runs without the agent
    /// too, and there is no profile, so the ratios measure the machine's noise alone.
    pub null: bool,
}

impl Settings {
    pub(super) fn new(options: &Options) -> Self {
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
                .filter(|w| {
                    options.workloads.is_empty() || options.workloads.contains(&Choice::Pair(*w))
                })
                .collect(),
            scale: ScaleWorkload::ALL
                .into_iter()
                .filter(|w| {
                    options.workloads.contains(&Choice::ScaleGroup)
                        || options.workloads.contains(&Choice::Scale(*w))
                })
                .collect(),
            null: options.null,
        }
    }

    /// How long a scale workload's measurement runs: its figure is an idle agent's CPU,
    /// which a few seconds' clock ticks (10 ms each) cannot tell apart from 2 %.
    pub(super) fn scale_duration(&self, duration: Duration) -> Duration {
        if self.smoke {
            duration
        } else {
            duration.max(Duration::from_secs(SCALE_MIN_S))
        }
    }

    /// Pairs a scale workload is measured in (the first ones): each takes
    /// [`SCALE_MIN_S`] at least, and its figure is no ratio that needs many.
    pub(super) fn scale_runs(&self) -> u32 {
        self.runs.min(SCALE_RUNS)
    }

    /// Pods the scale workload runs: the kubelet's maximum, fewer for a smoke run.
    pub(super) fn scale_pods(&self) -> usize {
        if self.smoke {
            8
        } else {
            super::scale_pods::PODS
        }
    }

    /// How long a measurement of `mode` runs its workload.
    pub(super) fn duration(&self, mode: Mode) -> Duration {
        Duration::from_secs(match mode {
            Mode::Profile => self.profile_duration_s,
            Mode::Baseline | Mode::Agent => self.duration_s,
        })
    }

    /// The command line that reproduces these settings.
    pub(super) fn command_line(&self, options: &Options) -> String {
        let mut line = String::from("cargo xtask bench");
        for arg in options.guest_args() {
            line.push(' ');
            line.push_str(&arg);
        }
        if let Some(out) = &options.out {
            line.push_str(&format!(" --out {}", out.display()));
        }
        line
    }
}
