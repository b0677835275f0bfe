//! Each program's cost from the profile measurements, net of the floor (the empty
//! programs' runs on the same tracepoints), with the budget of its hook; and the
//! agent's eBPF maps. The figures the targets judge, apart from how the table shows them.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::bench::{
    agent::{self, MapMemory},
    sample::{Mode, ProgramRuns, Sample},
    workload::Workload,
};

/// The average run time budget of a program, by how often its hook fires: per packet,
/// per connection (state changes, resets, retransmits, ICMP errors sent), or per failed
/// connect (the error report path, which builds an event). `None` for a program without
/// a budget (a new one: it is shown, not judged).
pub(super) fn program_budget(name: &str) -> Option<(f64, &'static str)> {
    // The fallbacks of kernels without a tracepoint or drop reasons (5.10–5.16) are
    // held to the budget of the program they stand in for; the fexit companions of
    // `nd_kfree_site` run on every packet a tc or cgroup program classifies.
    match name {
        "nd_tc_ingress" | "nd_kfree_skb" | "nd_kfree_site" | "nd_tc_shot4" | "nd_tc_shot5"
        | "nd_tc_shot_ingress" | "nd_cgroup_shot" => Some((60.0, "per packet")),
        "nd_set_state" | "nd_rcv_reset" | "nd_snd_reset" | "nd_retransmit" | "nd_icmp_send"
        | "nd_icmp_fentry" | "nd_icmp6_send" => Some((150.0, "per connection")),
        "nd_err_report" | "nd_err_fentry" => Some((400.0, "error report")),
        _ => None,
    }
}

/// Per-program figures over the profile measurements of every workload.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ProgramSummary {
    /// Its type, tracepoint and runs summed over the profile measurements.
    #[serde(flatten)]
    pub runs: ProgramRuns,
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
pub(super) struct MapReport {
    /// CPUs the kernel sizes per-CPU maps for on this machine (possible CPUs).
    pub cpus: u32,
    pub target_cpus: u32,
    pub memlock_bytes: u64,
    pub memlock_at_target_cpus_bytes: u64,
    pub maps: Vec<MapMemory>,
}

impl MapReport {
    pub(super) fn new(samples: &[Sample]) -> Option<Self> {
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

/// The empty programs' runs over `samples`, and their Σ run_time_ns ÷ Σ run_cnt.
pub(super) fn floor_of<'a>(samples: impl Iterator<Item = &'a Sample>) -> (u64, Option<f64>) {
    empty_of(samples, |s| s.floor.as_ref())
}

/// Σ run_cnt and Σ run_time_ns ÷ Σ run_cnt of the empty programs `which` picks out of
/// each profile sample.
pub(super) fn empty_of<'a>(
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
pub(super) fn floor(samples: &[Sample]) -> (u64, Option<f64>) {
    floor_of(samples.iter())
}

/// The floor of each workload, for the per-workload table.
pub(super) fn floors(samples: &[Sample]) -> BTreeMap<Workload, Option<f64>> {
    by_workload(samples, |s| s.floor.as_ref())
}

/// The lead empty programs' average in each workload, for the per-workload table.
pub(super) fn leads(samples: &[Sample]) -> BTreeMap<Workload, Option<f64>> {
    by_workload(samples, |s| s.lead.as_ref())
}

/// [`empty_of`] in each workload where `which` found empty programs.
pub(super) fn by_workload<'a>(
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
pub(super) fn programs(samples: &[Sample], floor: Option<f64>) -> BTreeMap<String, ProgramSummary> {
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
                runs: ProgramRuns {
                    run_cnt: 0,
                    run_time_ns: 0,
                    ..runs.clone()
                },
                avg_ns: None,
                net_ns: None,
                floor_ns: None,
                budget_ns: program_budget(name).map(|(ns, _)| ns),
                avg_ns_by_workload: BTreeMap::new(),
                net_ns_by_workload: BTreeMap::new(),
                run_cnt_by_workload: BTreeMap::new(),
            });
            entry.runs.run_cnt += runs.run_cnt;
            entry.runs.run_time_ns += runs.run_time_ns;
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
        entry.avg_ns = avg(entry.runs.run_cnt, entry.runs.run_time_ns as f64);
        let charged = floors.get(name).copied().flatten();
        entry.floor_ns = charged.and_then(|ns| avg(entry.runs.run_cnt, ns));
        entry.net_ns = entry
            .avg_ns
            .zip(entry.floor_ns)
            .map(|(ns, floor)| ns - floor);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::sample::AgentUsage;

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
            agent: Some(AgentUsage {
                wall_s: 1.0,
                programs: programs
                    .iter()
                    .map(|&(name, tp, cnt, ns)| (name.to_owned(), runs(tp, cnt, ns)))
                    .collect(),
                ..AgentUsage::default()
            }),
            floor: Some(ProgramRuns {
                tracepoint: None,
                ..runs(Some("all"), cnt, ns)
            }),
            floor_by_tracepoint,
            ..Sample::new(0, workload, Mode::Profile)
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
        assert_eq!((x.runs.run_cnt, x.runs.run_time_ns), (400, 111_000));
        assert_eq!(x.runs.tracepoint.as_deref(), Some("tp_x"));
        // The JSON keeps the runs' fields at the summary's top level.
        let json = serde_json::to_value(x).unwrap();
        assert_eq!(
            (&json["type"], &json["tracepoint"], &json["run_cnt"]),
            (&"tracing".into(), &"tp_x".into(), &400.into())
        );
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
        assert_eq!(program_budget("nd_kfree_site"), Some((60.0, "per packet")));
        assert_eq!(
            program_budget("nd_tc_shot_ingress"),
            Some((60.0, "per packet"))
        );
        assert_eq!(
            program_budget("nd_err_fentry"),
            program_budget("nd_err_report")
        );
        assert_eq!(
            program_budget("nd_icmp_fentry"),
            program_budget("nd_icmp_send")
        );
        assert_eq!(program_budget("nd_new_hook"), None);
    }
}
