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
//!   in `node_diag_events_lost_total`;
//! - the scale workloads (`scale_pods`): the agent's CPU while node A has 110 pods (their
//!   namespaces and veths), one replaced every 2 s, and while 1,000 interfaces are
//!   created and removed; 20 s each, in the first three pairs only.
//!
//! The pairs run as nodes do, with the kernel's run statistics off: with them on, the
//! kernel reads its clock twice around every program run, which on a nested VM costs more
//! than most of the programs themselves and would be charged to the agent.
//!
//! The `scale` workloads (`scale::`) are no pairs: with `--workload scale` the agent
//! idles in node A while the cluster around it grows (kube-proxy's rules of thousands of
//! Services), and its own CPU and memory are the figures, in a table of their own.
//!
//! With `--kernel 5.10` (or 6.1, 6.12) the same bench runs inside a guest of that Debian
//! kernel (`vm::bench`: this binary and the release agent built here, run over the
//! guest's 9p root), for the per-program figures of the hooks that kernel gives the agent,
//! its fallbacks on 5.10 among them; under TCG only ratios and costs relative to another
//! guest's mean anything.
//!
//! Ratios are agent ÷ baseline of each back-to-back pair; the table shows their median
//! and their spread (min–max). The targets are judged by people reading the table: the
//! command fails only when the benchmark itself breaks (a workload, the topology or the
//! agent fails).

mod agent;
mod floor;
mod load;
mod report;
mod sample;
mod scale;
mod scale_pods;
mod settings;
mod signal;
mod usage;
mod workload;

use std::{
    fs,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use node_diag_testbed::{Topology, netns};

use self::{
    agent::Agent,
    floor::EmptyPrograms,
    load::{DropRule, EchoServer, IperfServer},
    report::Report,
    sample::{Mode, Sample},
    scale_pods::PodFleet,
    settings::Settings,
    signal::{catch_signals, check_interrupted, interrupted},
    usage::{Before, empty_runs},
    workload::{
        CLOSED_PORT, CONN_THREADS, ECHO_PORT, ECHO_THREADS, FILL_PORTS, FLOOD_PORT, FLOOD_THREADS,
        IPERF_PORT, LOSS_PER_MILLE, POLL_CLIENTS, POLL_INTERVAL_MS, STORM_THREADS, Workload,
    },
};
pub(crate) use self::{settings::Options, workload::Choice};
use crate::{cmd, prereqs, say::bench as say};

/// Tools the bench drives: (binary, Debian package).
pub(crate) const BENCH_TOOLS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("ss", "iproute2"),
    ("sysctl", "procps"),
    ("ping", "iputils-ping"),
    ("bpftool", "bpftool"),
    ("iperf3", "iperf3"),
    ("nft", "nftables"),
];
/// Pause before each measurement (after the agent is ready, or none started), so the
/// agent's start-up and the previous workload's tail are out of the figures.
const SETTLE: Duration = Duration::from_secs(1);
/// Generous: under emulation (`--kernel` on a machine without KVM) the agent loads its
/// programs through a verifier running several times slower.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

pub fn run(options: &Options) -> Result<()> {
    if !cmd::is_root() {
        bail!(
            "the bench needs root (network namespaces, eBPF, sysctl): run `cargo xtask bench` as root"
        );
    }
    let settings = Settings::new(options);
    let command_line = settings.command_line(options);
    prereqs::ensure_system_tools(BENCH_TOOLS)?;
    let binary = match &options.agent {
        Some(agent) => agent.clone(),
        None => {
            prereqs::ensure(prereqs::Tools::BUILD)?;
            crate::agent::build(true)?;
            crate::agent::binary(true)?
        }
    };
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
    let cleaned = |err: anyhow::Error| {
        if interrupted() {
            anyhow::anyhow!("interrupted; namespaces, agent and sysctl cleaned up ({err:#})")
        } else {
            err
        }
    };
    if !settings.workloads.is_empty() {
        let started = Instant::now();
        let samples = (|| {
            let _stats = BpfStats::set(false)?;
            let bench = Bench::new(&binary, &settings)?;
            bench.measure_all()
        })()
        .map_err(cleaned)?;
        let report = Report::new(
            command_line.clone(),
            settings.clone(),
            machine.clone(),
            samples,
            started.elapsed(),
        );
        println!();
        let markdown = report.markdown();
        print!("{markdown}");
        report.write_json(&out)?;
        let table = out.with_extension("md");
        fs::write(&table, &markdown)
            .with_context(|| format!("cannot write {}", table.display()))?;
        println!();
        say(format_args!(
            "JSON: {} (table: {})",
            out.display(),
            table.display()
        ));
    }
    if !settings.scale.is_empty() {
        let started = Instant::now();
        let results = (|| {
            say("topology for the scale workloads: two nodes, vxlan overlay, a pod per node");
            let topo = build_topology()?;
            scale::measure(&binary, &topo, &settings)
        })()
        .map_err(cleaned)?;
        let out = scale::json_path(&out);
        let report = scale::Report::new(command_line, machine, results, started.elapsed());
        println!();
        print!("{}", report.markdown());
        report.write_json(&out)?;
        println!();
        say(format_args!("JSON (scale): {}", out.display()));
    }
    Ok(())
}

/// The topology and the servers every measurement uses.
struct Bench<'a> {
    binary: &'a Path,
    settings: &'a Settings,
    /// The scale workload's pods, created at its first measurement and kept for the
    /// rest (creating 110 takes a while).
    fleet: std::cell::RefCell<Option<PodFleet>>,
    // Drop order: the pods and servers first, then the namespaces they live in.
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
            fleet: std::cell::RefCell::new(None),
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
                if workload.scale() && run >= self.settings.scale_runs() {
                    continue;
                }
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
        // The scale workloads' figure is the agent's CPU in the pairs; their traffic is
        // none, so a profile would measure nothing per program.
        for &workload in profiled.iter().filter(|w| !w.scale()) {
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
        // The pods first: the agent finds them at its start, as on a node.
        if workload == Workload::ScalePods {
            self.pod_fleet()?;
        }
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
        // The findings poll's store is filled before the agent's figures start.
        let held = match (workload, agent.as_ref()) {
            (Workload::FindingsPoll, Some(agent)) => Some(self.fill_store(agent)?),
            _ => None,
        };
        let before = agent.as_ref().map(Before::take).transpose()?;
        let floor_before = profile.as_ref().map(|(_, e)| e.stats()).transpose()?;
        let lead_before = lead.as_ref().map(EmptyPrograms::stats).transpose()?;

        let began = Instant::now();
        let mut sample = Sample::new(run, workload, mode);
        let duration = self.settings.duration(mode);
        let duration = if workload.scale() {
            self.settings.scale_duration(duration)
        } else {
            duration
        };
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
            // Without the agent there is nothing to poll: no figure.
            Workload::FindingsPoll => {
                if let Some(findings) = held {
                    let url = format!("http://{}/findings?limit=10000", agent::FINDINGS_ADDR);
                    let mut stats = load::poll_findings(
                        &self.topo.node_a,
                        &url,
                        POLL_CLIENTS,
                        Duration::from_millis(POLL_INTERVAL_MS),
                        duration,
                        (
                            &self.topo.pod_a,
                            self.topo.pod_b_ip,
                            FILL_PORTS.start..FILL_PORTS.start + 64,
                        ),
                    )?;
                    stats.findings = findings;
                    sample.value = stats.rate;
                    sample.poll = Some(stats);
                }
            }
            Workload::ScalePods => {
                let mut fleet = self.fleet.borrow_mut();
                let fleet = fleet.as_mut().context("the pod fleet is gone")?;
                sample.value = fleet.churn(duration)?;
            }
            Workload::ScaleInterfaces => {
                sample.value = scale_pods::churn_interfaces(&self.topo.node_a, duration)?;
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
            sample.agent = Some(usage::measure(
                agent,
                &before,
                sample.storm.as_ref(),
                began,
            )?);
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

impl Bench<'_> {
    /// The scale workload's pods, created at the first call.
    fn pod_fleet(&self) -> Result<()> {
        let mut fleet = self.fleet.borrow_mut();
        if fleet.is_none() {
            say(format_args!(
                "scale: {} pods in node A",
                self.settings.scale_pods()
            ));
            *fleet = Some(PodFleet::start(
                &self.topo.node_a,
                &format!("{NETNS_PREFIX}{}-", std::process::id()),
                self.settings.scale_pods(),
            )?);
        }
        Ok(())
    }

    /// Fills the agent's store for the findings poll: a refused connect to each of
    /// [`FILL_PORTS`], then waits until the store stops growing. Returns the findings held.
    fn fill_store(&self, agent: &Agent) -> Result<u64> {
        let refused = load::refuse_each_port(&self.topo.pod_a, self.topo.pod_b_ip, FILL_PORTS, 4)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let (mut last, mut since) = (0, Instant::now());
        loop {
            check_interrupted()?;
            let held = agent.findings()?.len() as u64;
            if held != last {
                (last, since) = (held, Instant::now());
            }
            // A store still short of full is waited on to the deadline: an agent the
            // machine keeps from its events for 2 s is slow, not done.
            let settled = since.elapsed() >= Duration::from_secs(2) && held >= 4_000;
            if settled || Instant::now() >= deadline {
                if held < 4_000 {
                    bail!(
                        "the findings store holds {held} findings after {refused} refused connects to distinct ports; expected it full (4,096)"
                    );
                }
                return Ok(held);
            }
            thread::sleep(Duration::from_millis(250));
        }
    }
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
