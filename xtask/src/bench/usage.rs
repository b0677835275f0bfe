//! What the agent used during one workload: its state just before, its programs' runs
//! and its accounting of the refused storm after, and the empty programs' runs.

use std::{
    collections::BTreeMap,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{
    agent::{self, Agent, ProcSample, RunStats},
    floor::{self, EmptyPrograms},
    load::StormStats,
    sample::{Accounting, AgentUsage, ProgramRuns},
    signal::interrupted,
};
use crate::say::bench as say;

/// Empty programs' runs since `earlier`: summed over the raw tracepoints (the whole
/// bench's floor, which the TC classifier is charged: the same kind of call; a trampoline's
/// is not), and by hook.
pub(super) fn empty_runs(
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
        if floor::TRACEPOINTS.contains(&tracepoint) {
            total.run_cnt += runs.run_cnt;
            total.run_time_ns += runs.run_time_ns;
        }
        by_tracepoint.insert(tracepoint.to_owned(), runs_of(Some(tracepoint), runs));
    }
    Ok((Some(runs_of(None, total)), by_tracepoint))
}

/// The agent's state just before a workload.
pub(super) struct Before {
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
    pub(super) fn take(agent: &Agent) -> Result<Self> {
        let startup_hwm_kib = agent.sample()?.hwm_kib;
        agent.reset_peak_rss()?;
        let names = agent::prog_names()?;
        let programs = agent.prog_stats(&names)?;
        if programs.is_empty() {
            bail!("the agent (pid {}) holds no nd_* eBPF program", agent.pid());
        }
        let mut tracepoints = agent.prog_tracepoints(&names)?;
        // An fentry/fexit program's link names no tracepoint: its function, as the agent
        // attaches it.
        for name in programs.keys() {
            if tracepoints.contains_key(name) {
                continue;
            }
            match floor::hook_of(name) {
                Some(hook) => {
                    tracepoints.insert(name.clone(), hook.to_owned());
                }
                None if names
                    .values()
                    .any(|p| &p.name == name && p.kind == "tracing") =>
                {
                    say(format_args!(
                        "{name} is attached through a trampoline the bench does not know \
                         (floor::TRAMPOLINES): judged net of the whole bench's floor"
                    ));
                }
                None => {}
            }
        }
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

/// What the agent used from `before` (taken just before the workload, which `began`
/// then) to now; after the refused `storm`, until it has accounted for it.
pub(super) fn measure(
    agent: &Agent,
    before: &Before,
    storm: Option<&StormStats>,
    began: Instant,
) -> Result<AgentUsage> {
    // The agent handles the storm's events after the client is done: its CPU time
    // counts until it has accounted for them (or given up).
    let accounting = match storm {
        Some(storm) => Some(account(agent, storm.refused, before)?),
        None => None,
    };
    let wall = began.elapsed().as_secs_f64();
    let after = agent.sample()?;
    let programs = agent.prog_stats(&before.names)?;
    let cpu_s = (after.cpu_secs - before.proc.cpu_secs).max(0.0);
    let maps = agent.maps()?;
    Ok(AgentUsage {
        startup_peak_rss_kib: before.startup_hwm_kib,
        peak_rss_kib: after.hwm_kib,
        rss_before_kib: before.proc.rss_kib,
        rss_after_kib: after.rss_kib,
        cpu_s,
        wall_s: wall,
        cpu_pct: 100.0 * cpu_s / wall,
        stdout_lines: agent.stdout_lines() - before.stdout_lines,
        programs: program_runs(before, &programs),
        map_memlock_bytes: maps.iter().map(|m| m.memlock_bytes).sum(),
        map_memlock_at_target_cpus_bytes: maps.iter().map(|m| m.memlock_at_target_cpus_bytes).sum(),
        maps,
        accounting,
    })
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
