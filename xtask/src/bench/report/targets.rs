//! The table's rows: every figure of the run, judged against its target where it has
//! one (the targets are the performance issue's), in the order people read them.

use std::collections::BTreeMap;

use super::{
    programs::{MapReport, ProgramSummary, program_budget},
    row::{Paired, Row, fmt, mib, of},
    stats::median,
};
use crate::bench::{
    sample::{Mode, Sample},
    settings::Settings,
    workload::{
        CONN_THREADS, FLOOD_PORT, FLOOD_THREADS, LOSS_PER_MILLE, POLL_CLIENTS, POLL_INTERVAL_MS,
        Workload,
    },
};

/// Targets from the performance issue. Ratios are medians of the pair ratios.
const THROUGHPUT_RATIO: f64 = 0.99;
const CLOSED_LOOP_RATIO: f64 = 0.97;
const FLOOD_RATIO: f64 = 0.95;
const STORM_RATE_RATIO: f64 = 0.90;
/// Agent CPU during the refused storm, in % of one core.
const STORM_CPU_PCT: f64 = 5.0;
/// Agent CPU while eight clients poll a full store's `/findings`, in % of one core.
const FINDINGS_POLL_CPU_PCT: f64 = 30.0;
/// Agent CPU while the node's pods and interfaces churn (the scale workloads), in % of
/// one core.
const SCALE_CPU_PCT: f64 = 2.0;
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

/// A program's average is judged only over this many runs: a handful of cold runs (the
/// drop program under iperf3 alone) measures cache misses, not the program.
const MIN_JUDGED_RUNS: u64 = 1_000;

/// The target of a program's row and, where its runs settle it, whether it passes.
fn program_target(name: &str, runs: u64, net_ns: Option<f64>) -> Option<(String, Option<bool>)> {
    let (budget, hook) = program_budget(name)?;
    let target = format!("≤ {budget:.0} ns ({hook})");
    Some(match net_ns {
        Some(_) if runs < MIN_JUDGED_RUNS => (
            format!("{target}; not judged under {MIN_JUDGED_RUNS} runs"),
            None,
        ),
        Some(ns) => (target, Some(ns <= budget)),
        None => (target, None),
    })
}

pub(super) fn rows(
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
        let floor = match &program.runs.tracepoint {
            Some(tp) => format!("the floor on `{tp}`"),
            None => "the bench's floor".to_owned(),
        };
        let row = Row::new(
            format!(
                "avg run time `{name}` ({}), net of {floor} (as measured)",
                program.runs.kind
            ),
            [None, program.avg_ns, net],
            [
                "—".to_owned(),
                format!("{} runs", program.runs.run_cnt),
                format!(
                    "{} ({})",
                    fmt(net, |ns| format!("{ns:.0} ns")),
                    fmt(program.avg_ns, |ns| format!("{ns:.0} ns"))
                ),
            ],
        );
        rows.push(match program_target(name, program.runs.run_cnt, net) {
            Some((target, Some(pass))) => row.target(target, pass),
            Some((target, None)) => Row { target, ..row },
            None => row,
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
            Workload::FindingsPoll => rows.push(
                Row::new(
                    format!(
                        "agent CPU (% of one core), {POLL_CLIENTS} clients each polling a full store's /findings every {POLL_INTERVAL_MS} ms"
                    ),
                    [None, cpu, cpu],
                    ["—".to_owned(), fmt(cpu, pct), fmt(cpu, pct)],
                )
                .target(
                    format!("≤ {FINDINGS_POLL_CPU_PCT:.0} %"),
                    cpu.is_some_and(|v| v <= FINDINGS_POLL_CPU_PCT),
                ),
            ),
            Workload::ScalePods | Workload::ScaleInterfaces => rows.push(
                Row::new(
                    format!("agent CPU (% of one core), {}", workload.label()),
                    [None, cpu, cpu],
                    ["—".to_owned(), fmt(cpu, pct), fmt(cpu, pct)],
                )
                .target(
                    format!("≤ {SCALE_CPU_PCT:.0} %"),
                    cpu.is_some_and(|v| v <= SCALE_CPU_PCT),
                ),
            ),
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
    fn a_program_is_judged_only_over_enough_runs() {
        assert_eq!(
            program_target("nd_kfree_skb", 18, Some(772.0)),
            Some((
                "≤ 60 ns (per packet); not judged under 1000 runs".to_owned(),
                None
            ))
        );
        assert_eq!(
            program_target("nd_kfree_skb", 4_000_000, Some(61.0)),
            Some(("≤ 60 ns (per packet)".to_owned(), Some(false)))
        );
        assert_eq!(
            program_target("nd_set_state", 3_259, Some(67.0)),
            Some(("≤ 150 ns (per connection)".to_owned(), Some(true)))
        );
        assert_eq!(
            program_target("nd_icmp_send", 0, None),
            Some(("≤ 150 ns (per connection)".to_owned(), None))
        );
        assert_eq!(program_target("nd_new", 5_000, Some(10.0)), None);
    }
}
