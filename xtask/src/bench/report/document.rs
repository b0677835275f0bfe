//! The report as a whole: what the JSON file holds, and the markdown people read (the
//! judged table, each program per workload, the eBPF maps), with the line printed
//! after each measurement.

use std::{collections::BTreeMap, fmt::Write as _, fs, path::Path, time::Duration};

use anyhow::{Context as _, Result};
use serde::Serialize;

use super::{
    machine::{Machine, loadavg},
    programs::{MapReport, ProgramSummary, floor, floors, leads, programs},
    row::{Row, fmt, mib},
    targets::rows,
};
use crate::bench::{
    agent::MapMemory,
    sample::{Mode, Sample},
    settings::Settings,
    workload::Workload,
};

#[derive(Debug, Serialize)]
pub(crate) struct Report {
    command: String,
    settings: Settings,
    machine: Machine,
    elapsed_s: f64,
    rows: Vec<Row>,
    programs: BTreeMap<String, ProgramSummary>,
    /// The floor of the run statistics: an empty program's average run time over every
    /// profile measurement (judged figures are net of it), and per workload (shown).
    floor_ns: Option<f64>,
    floor_ns_by_workload: BTreeMap<Workload, Option<f64>>,
    /// The lead empty programs' average (first on each tracepoint, so they take the
    /// clock's cold reads), per workload: shown beside the floor, never charged.
    lead_ns_by_workload: BTreeMap<Workload, Option<f64>>,
    maps: Option<MapReport>,
    samples: Vec<Sample>,
}

impl Report {
    pub(crate) fn new(
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

    pub(crate) fn markdown(&self) -> String {
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

    pub(crate) fn write_json(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let json = serde_json::to_string_pretty(self)?;
        fs::write(path, json + "\n").with_context(|| format!("cannot write {}", path.display()))
    }
}

/// The line printed after each measurement.
pub(crate) fn progress_line(sample: &Sample) -> String {
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
        Workload::ScalePods => format!("{:.2} pods replaced/s", sample.value),
        Workload::ScaleInterfaces => {
            format!("{:.0} interfaces created and removed/s", sample.value)
        }
        Workload::FindingsPoll => match &sample.poll {
            Some(p) => format!(
                "{:.1} polls/s of {} findings, {:.2} MB each, p99 {:.0} ms ({} failed)",
                sample.value,
                p.findings,
                p.bytes_per_poll / 1e6,
                p.latency_p99_ms,
                p.failed
            ),
            None => "no agent, no poll".to_owned(),
        },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_counts() {
        assert_eq!(compact_count(999), "999");
        assert_eq!(compact_count(12_345), "12.3k");
        assert_eq!(compact_count(4_541_191), "4.5M");
    }
}
