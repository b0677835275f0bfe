//! One measurement's figures, as the bench takes them and the report reads them (and
//! the JSON file keeps them): the workload's, the agent's usage, its programs' runs.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    agent::MapMemory,
    load::{ConnStats, FloodStats, PollStats, StormStats},
    workload::Workload,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Mode {
    Baseline,
    Agent,
    /// The agent with the kernel's run statistics on: per-program run times, not ratios.
    Profile,
}

/// One measurement: a workload, once, with or without the agent.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Sample {
    pub run: u32,
    pub workload: Workload,
    pub mode: Mode,
    /// The workload's figure: bit/s (iperf3), completed connections/s, packets/s that
    /// reached the drop rule (drop flood), refused connects/s, `/findings` answers/s
    /// (findings poll; 0 without the agent).
    pub value: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conn: Option<ConnStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood: Option<FloodStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storm: Option<StormStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll: Option<PollStats>,
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

impl Sample {
    /// A measurement of `workload` in `mode`, before any figure is in.
    pub(crate) fn new(run: u32, workload: Workload, mode: Mode) -> Self {
        Self {
            run,
            workload,
            mode,
            value: 0.0,
            conn: None,
            flood: None,
            storm: None,
            poll: None,
            agent: None,
            floor: None,
            floor_by_tracepoint: BTreeMap::new(),
            lead: None,
            lead_by_tracepoint: BTreeMap::new(),
            foreign_nd_programs: 0,
        }
    }
}

/// What the agent used during one workload.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct AgentUsage {
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
    /// The same computed for a node of [`super::agent::TARGET_CPUS`] CPUs.
    pub map_memlock_at_target_cpus_bytes: u64,
    /// Each map (the report keeps those of the measurement with the largest total).
    #[serde(skip)]
    pub maps: Vec<MapMemory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accounting: Option<Accounting>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProgramRuns {
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
pub(crate) struct Accounting {
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
