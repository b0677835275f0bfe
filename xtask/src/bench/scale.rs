//! The scale workloads: what the agent costs, idle, as the cluster grows around it.
//! Each adds its rows to one table ([`Report`]); the group's members are listed in
//! [`ScaleWorkload::ALL`], and [`measure`] runs the ones asked for.
//!
//! `scale_services`: kube-proxy-shaped rules for 0, 5,000 and 20,000 Services (a
//! ClusterIP with one endpoint each: a KUBE-SVC and a KUBE-SEP chain per Service, with
//! kube-proxy's comments, in the iptables-nft shape; a service chain, an endpoint chain
//! and a `service-ips` element per Service in the nftables shape), written at once into
//! node A by the testbed's kube-proxy generator, then the agent started there. Measured
//! per size: the agent's CPU over an idle window (after it has read every Service), its
//! RSS and peak RSS, how long one more Service takes to reach its catalog, and what one
//! full read costs (`node-diag services`, the same read the agent makes at start and
//! every 5 min as a safety net).

use std::{
    fs,
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use node_diag_testbed::{
    Topology, cmd as tcmd,
    kube_proxy::{IptablesBackend, Protocol, ServiceSpec, flush_services, install_services},
};
use serde::Serialize;

use super::{
    READY_TIMEOUT, SETTLE,
    agent::{Agent, ProcSample},
    report::Machine,
    settings::Settings,
    signal::check_interrupted,
    workload::ScaleWorkload,
};
use crate::say::bench as say;

/// Service counts measured, and `--smoke`'s.
pub(super) const SERVICE_COUNTS: [u32; 3] = [0, 5_000, 20_000];
const SERVICE_COUNTS_SMOKE: [u32; 2] = [0, 1_000];
/// Targets (issue 42) at the largest count: idle CPU (% of a core), its distance from
/// the 0-Service figure (percentage points), RSS (MiB).
const SERVICES_CPU_PCT: f64 = 2.0;
const SERVICES_CPU_OVER_ZERO_PP: f64 = 1.0;
const SERVICES_RSS_MIB: f64 = 64.0;
/// The idle window, and `--smoke`'s.
const IDLE: Duration = Duration::from_secs(40);
const IDLE_SMOKE: Duration = Duration::from_secs(5);
/// How long the agent may take to read every Service at start.
const CATALOG_TIMEOUT: Duration = Duration::from_secs(120);

/// The two rule shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Shape {
    IptablesNft,
    Nftables,
}

impl Shape {
    fn backend(self) -> Option<IptablesBackend> {
        match self {
            Shape::IptablesNft => Some(IptablesBackend::Nft),
            Shape::Nftables => None,
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Shape::IptablesNft => "iptables-nft",
            Shape::Nftables => "nftables",
        }
    }
}

/// One size of one shape.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ServicesRow {
    pub shape: Shape,
    pub services: u32,
    /// Writing the rules (one restore): context, not the agent's.
    pub load_s: f64,
    /// The agent's CPU over the idle window, % of one core.
    pub idle_cpu_pct: f64,
    pub idle_s: f64,
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
    /// From one more Service's rules written to the agent's catalog holding it.
    pub change_seen_s: Option<f64>,
    /// One full read of every ruleset (`node-diag services`): wall time and CPU.
    pub full_read_s: f64,
    pub full_read_cpu_s: f64,
}

/// `n` Services `scale/svc-<i>:http`, ClusterIPs from 10.100.0.1 up, one endpoint each.
fn specs(n: u32, first: u32) -> Vec<ServiceSpec> {
    (first..first + n)
        .map(|i| {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 100, 0, 1)) + i);
            let ep = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 0, 1)) + i);
            ServiceSpec {
                namespace: "scale".into(),
                name: format!("svc-{i}"),
                port_name: "http".into(),
                cluster_ip: ip,
                port: 80,
                proto: Protocol::Tcp,
                backends: vec![SocketAddrV4::new(ep, 8080)],
            }
        })
        .collect()
}

/// What the scale workloads measured: one list per workload (empty when not run).
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Results {
    pub services: Vec<ServicesRow>,
    /// Cases that could not be measured (the agent never read every Service, a
    /// command failed), each with why: the table shows them, and the other cases run.
    pub failures: Vec<String>,
}

/// Runs every scale workload `settings` asks for, in node A of `topo`.
pub(super) fn measure(binary: &Path, topo: &Topology, settings: &Settings) -> Result<Results> {
    let mut results = Results::default();
    for &workload in &settings.scale {
        check_interrupted()?;
        match workload {
            ScaleWorkload::ScaleServices => {
                results.services = services(binary, topo, settings, &mut results.failures)?;
            }
        }
    }
    Ok(results)
}

/// Every shape at every size, in node A of `topo`.
fn services(
    binary: &Path,
    topo: &Topology,
    settings: &Settings,
    failures: &mut Vec<String>,
) -> Result<Vec<ServicesRow>> {
    let (idle, counts) = if settings.smoke {
        (IDLE_SMOKE, &SERVICE_COUNTS_SMOKE[..])
    } else {
        (IDLE, &SERVICE_COUNTS[..])
    };
    let mut rows = Vec::new();
    for shape in [Shape::IptablesNft, Shape::Nftables] {
        for &n in counts {
            check_interrupted()?;
            let row = one(binary, topo, shape, n, idle)
                .with_context(|| format!("scale_services: {} Services, {}", n, shape.label()));
            // Whatever happened, the next size starts from no rules.
            let flushed = flush_services(&topo.node_a, shape.backend())
                .with_context(|| format!("cannot remove the {} rules", shape.label()));
            flushed?;
            let row = match row {
                Ok(row) => row,
                Err(err) => {
                    check_interrupted()?;
                    let err = format!("{err:#}");
                    say(format_args!("not measured: {err}"));
                    failures.push(err);
                    continue;
                }
            };
            say(format_args!(
                "scale_services {} {:>6} Services: idle CPU {:.2} % over {:.0} s, RSS {:.1} MiB \
                 (peak {:.1}), one more seen after {}, full read {:.2} s ({:.2} s CPU)",
                shape.label(),
                row.services,
                row.idle_cpu_pct,
                row.idle_s,
                row.rss_mib,
                row.peak_rss_mib,
                row.change_seen_s
                    .map_or("—".to_owned(), |s| format!("{s:.2} s")),
                row.full_read_s,
                row.full_read_cpu_s,
            ));
            rows.push(row);
        }
    }
    Ok(rows)
}

fn one(
    binary: &Path,
    topo: &Topology,
    shape: Shape,
    n: u32,
    idle: Duration,
) -> Result<ServicesRow> {
    let node = &topo.node_a;
    let started = Instant::now();
    if n > 0 {
        install_services(node, shape.backend(), &specs(n, 0))?;
    }
    let load_s = started.elapsed().as_secs_f64();
    let (full_read_s, full_read_cpu_s) = full_read(binary, node)?;

    let mut agent = Agent::start(binary, topo, READY_TIMEOUT, &[])?;
    wait_services(&agent, n, CATALOG_TIMEOUT)?;
    thread::sleep(SETTLE);
    agent.reset_peak_rss()?;
    let before = agent.sample()?;
    let began = Instant::now();
    while began.elapsed() < idle {
        check_interrupted()?;
        thread::sleep(Duration::from_millis(250).min(idle.saturating_sub(began.elapsed())));
    }
    let after = agent.sample()?;
    let idle_s = began.elapsed().as_secs_f64();
    agent.check_alive()?;

    // One more Service while it runs: how long until its catalog holds it.
    let written = Instant::now();
    install_services(node, shape.backend(), &specs(1, n))?;
    let change_seen_s = wait_services(&agent, n + 1, Duration::from_secs(30))
        .ok()
        .map(|()| written.elapsed().as_secs_f64());
    agent.check_alive()?;
    agent.stop()?;

    Ok(ServicesRow {
        shape,
        services: n,
        load_s,
        idle_cpu_pct: cpu_pct(&before, &after, idle_s),
        idle_s,
        rss_mib: after.rss_kib as f64 / 1024.0,
        peak_rss_mib: after.hwm_kib as f64 / 1024.0,
        change_seen_s,
        full_read_s,
        full_read_cpu_s,
    })
}

fn cpu_pct(before: &ProcSample, after: &ProcSample, secs: f64) -> f64 {
    (after.cpu_secs - before.cpu_secs) / secs * 100.0
}

/// Polls the agent's `node_diag_services` until it reads `n`.
fn wait_services(agent: &Agent, n: u32, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        check_interrupted()?;
        let now = agent.metric("node_diag_services")?;
        if now == Some(f64::from(n)) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("node_diag_services is {now:?}, not {n}, after {timeout:?}");
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// `node-diag services -o json` in `netns`: its wall time and CPU (its children's
/// included: the dump tools it runs).
fn full_read(binary: &Path, netns: &str) -> Result<(f64, f64)> {
    let bin = binary.to_str().context("the agent's path is not UTF-8")?;
    let cpu_before = children_cpu();
    let started = Instant::now();
    tcmd::run_in(netns, &[bin, "services", "-o", "json"]).context("node-diag services failed")?;
    let wall = started.elapsed().as_secs_f64();
    Ok((wall, children_cpu() - cpu_before))
}

/// CPU seconds of every child waited for so far (`RUSAGE_CHILDREN`).
fn children_cpu() -> f64 {
    // SAFETY: `usage` is a writable `struct rusage`; getrusage only writes into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is a valid `who`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &raw mut usage) };
    if rc != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// The scale workloads' report: one table, a row per case, judged where a target
/// applies; the JSON holds every figure.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub command: String,
    pub machine: Machine,
    pub elapsed_s: f64,
    pub results: Results,
}

/// The JSON of the scale workloads: next to the pairs' (`bench.json` → `bench-scale.json`).
pub(super) fn json_path(pairs: &Path) -> PathBuf {
    let stem = pairs
        .file_stem()
        .map_or_else(|| "bench".to_owned(), |s| s.to_string_lossy().into_owned());
    pairs.with_file_name(format!("{stem}-scale.json"))
}

/// One line of the table.
struct Line {
    workload: String,
    case: String,
    cpu: f64,
    rss: f64,
    peak: f64,
    change: Option<f64>,
    detail: String,
    /// The targets that apply, and whether they are met.
    target: Option<(String, bool)>,
}

impl Report {
    pub(super) fn new(
        command: String,
        mut machine: Machine,
        results: Results,
        elapsed: Duration,
    ) -> Self {
        machine.loadavg_end = fs::read_to_string("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        Self {
            command,
            machine,
            elapsed_s: elapsed.as_secs_f64(),
            results,
        }
    }

    fn lines(&self) -> Vec<Line> {
        let mut lines = Vec::new();
        let services = &self.results.services;
        let largest = services.iter().map(|r| r.services).max().unwrap_or(0);
        for r in services {
            let zero = services
                .iter()
                .find(|z| z.shape == r.shape && z.services == 0)
                .map(|z| z.idle_cpu_pct);
            let target = (r.services == largest && largest > 0).then(|| {
                let over = zero.map(|z| r.idle_cpu_pct - z);
                let pass = r.idle_cpu_pct <= SERVICES_CPU_PCT
                    && over.is_some_and(|o| o <= SERVICES_CPU_OVER_ZERO_PP)
                    && r.rss_mib <= SERVICES_RSS_MIB;
                (
                    format!(
                        "CPU ≤ {SERVICES_CPU_PCT:.0} % and ≤ 0-Service + {SERVICES_CPU_OVER_ZERO_PP:.0} ({}); RSS ≤ {SERVICES_RSS_MIB:.0} MiB",
                        over.map_or("no 0-Service row".to_owned(), |o| format!("{o:+.2}"))
                    ),
                    pass,
                )
            });
            lines.push(Line {
                workload: ScaleWorkload::ScaleServices.name(),
                case: format!("{}, {} Services", r.shape.label(), thousands(r.services)),
                cpu: r.idle_cpu_pct,
                rss: r.rss_mib,
                peak: r.peak_rss_mib,
                change: r.change_seen_s,
                detail: format!(
                    "full read {:.2} s wall / {:.2} s CPU; rules written in {:.1} s",
                    r.full_read_s, r.full_read_cpu_s, r.load_s
                ),
                target,
            });
        }
        lines
    }

    /// The table, with the run's command and machine.
    pub(super) fn markdown(&self) -> String {
        use std::fmt::Write as _;
        let m = &self.machine;
        let mut out = String::new();
        let _ = writeln!(out, "## node-diag bench, scale: `{}`\n", self.command);
        let _ = writeln!(
            out,
            "{} CPUs ({}), {:.1} GiB, kernel {}; load {} → {}; {:.0} s.\n",
            m.nproc,
            m.cpu_model,
            m.memory_gib,
            m.kernel,
            m.loadavg_start,
            m.loadavg_end,
            self.elapsed_s
        );
        let _ = writeln!(
            out,
            "| workload | case | idle CPU (% of a core) | RSS (MiB) | peak RSS (MiB) | a change followed in | detail | target | |"
        );
        let _ = writeln!(
            out,
            "| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |"
        );
        for l in self.lines() {
            let (target, verdict) = match &l.target {
                Some((t, pass)) => (t.clone(), if *pass { "pass" } else { "FAIL" }),
                None => ("—".to_owned(), "—"),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} | {:.1} | {:.1} | {} | {} | {} | {} |",
                l.workload,
                l.case,
                l.cpu,
                l.rss,
                l.peak,
                l.change.map_or("—".to_owned(), |s| format!("{s:.2} s")),
                l.detail,
                target,
                verdict,
            );
        }
        for failure in &self.results.failures {
            let _ = writeln!(out, "\nNot measured: {failure}");
        }
        out
    }

    pub(super) fn write_json(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let json = serde_json::to_string_pretty(self)?;
        fs::write(path, json + "\n").with_context(|| format!("cannot write {}", path.display()))
    }
}

/// `20000` as `20,000`.
fn thousands(n: u32) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(5_000), "5,000");
        assert_eq!(thousands(20_000), "20,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn the_json_sits_next_to_the_pairs() {
        assert_eq!(
            json_path(Path::new("target/bench/bench.json")),
            Path::new("target/bench/bench-scale.json")
        );
    }

    fn row(shape: Shape, services: u32, cpu: f64, rss: f64) -> ServicesRow {
        ServicesRow {
            shape,
            services,
            load_s: 1.0,
            idle_cpu_pct: cpu,
            idle_s: 40.0,
            rss_mib: rss,
            peak_rss_mib: rss,
            change_seen_s: Some(0.4),
            full_read_s: 0.1,
            full_read_cpu_s: 0.1,
        }
    }

    /// Only the largest count is judged, against its shape's 0-Service figure.
    #[test]
    fn the_largest_count_is_judged_against_zero() {
        let report = |rows: Vec<ServicesRow>| Report {
            command: String::new(),
            machine: Machine::describe(),
            elapsed_s: 0.0,
            results: Results {
                services: rows,
                failures: vec!["scale_services: 20,000 Services, nftables: no catalog".into()],
            },
        };
        let r = report(vec![
            row(Shape::IptablesNft, 0, 0.3, 20.0),
            row(Shape::IptablesNft, 20_000, 1.2, 40.0),
            row(Shape::Nftables, 0, 0.3, 20.0),
            row(Shape::Nftables, 20_000, 1.5, 40.0),
        ]);
        let lines = r.lines();
        assert!(lines[0].target.is_none());
        assert!(lines[1].target.as_ref().unwrap().1, "0.9 points over zero");
        assert!(!lines[3].target.as_ref().unwrap().1, "1.2 points over zero");
        let md = r.markdown();
        assert!(
            md.contains("| scale_services | iptables-nft, 20,000 Services | 1.20 |"),
            "{md}"
        );
        assert!(md.contains("FAIL"), "{md}");
        assert!(md.contains("Not measured: scale_services: 20,000"), "{md}");

        let r = report(vec![row(Shape::Nftables, 20_000, 0.5, 80.0)]);
        assert!(
            !r.lines()[0].target.as_ref().unwrap().1,
            "RSS over 64 MiB, no zero row"
        );
    }
}
