//! The scale workloads of pods and interfaces: what following a busy node costs the
//! agent when nothing goes wrong on it.
//!
//! - [`PodFleet`]: [`PODS`] pods in node A as a CNI plugin wires them (a network
//!   namespace each, joined to node A by a veth, an address on its `eth0`); during the
//!   workload one pod is replaced (the oldest removed, a new one created) every
//!   [`POD_CHURN_EVERY`], as a node's pods come and go. No container runtime: xtask
//!   builds without the testbed's CRI client (it needs protoc, which xtask installs), so
//!   the pods are what the agent's scope sees of them, their namespaces and veths; the
//!   runtime side (events, status reads) is the pod tests' (`tests/pods.rs`).
//! - [`churn_interfaces`]: [`INTERFACES`] interfaces (veth pairs, both ends in node A)
//!   created, then removed, in batches spread over the workload.
//!
//! The figure judged is the agent's CPU (≤ 2 % of a core); the workload's own figure is
//! the churn it made (pods replaced or interfaces created and removed per second).

use std::{
    collections::VecDeque,
    io::Write as _,
    net::Ipv4Addr,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use node_diag_testbed::{cmd, netns::Netns};

use super::signal::check_interrupted;
use crate::say::bench as say;

/// Pods on the node: the kubelet's default maximum.
pub(super) const PODS: usize = 110;
/// One pod replaced this often during the pod workload.
pub(super) const POD_CHURN_EVERY: Duration = Duration::from_secs(2);
/// Interfaces created and removed during the interface workload.
pub(super) const INTERFACES: usize = 1_000;
/// Veth pairs created (or removed) at once: one `ip -batch` run.
const PAIRS_PER_BATCH: usize = 25;

/// A pod: its namespace (deleted on drop, which deletes its veth pair too).
struct FleetPod {
    _netns: Netns,
}

/// The pods of node `node`; all removed on drop.
pub(super) struct PodFleet {
    node: String,
    prefix: String,
    pods: VecDeque<FleetPod>,
    created: u32,
}

impl PodFleet {
    /// Creates `count` pods in node `node` ([`PODS`] but in a smoke run); their
    /// namespaces are named `<prefix>p<n>` (the bench's prefix, so a bench that dies
    /// leaves none for long).
    pub(super) fn start(node: &str, prefix: &str, count: usize) -> Result<Self> {
        let started = Instant::now();
        let mut fleet = Self {
            node: node.to_owned(),
            prefix: prefix.to_owned(),
            pods: VecDeque::new(),
            created: 0,
        };
        while fleet.pods.len() < count {
            check_interrupted()?;
            fleet.create()?;
        }
        say(format_args!(
            "{count} pods (namespaces and veths) in node A in {:.0} s",
            started.elapsed().as_secs_f64()
        ));
        Ok(fleet)
    }

    /// One pod more: a namespace, a veth into node A, its address, both ends up.
    fn create(&mut self) -> Result<()> {
        let n = self.created;
        self.created += 1;
        let netns = Netns::create(&format!("{}p{n}", self.prefix))?;
        let ns = netns.name().to_owned();
        let host_if = format!("ndbp{n}");
        cmd::run(&[
            "ip", "link", "add", &host_if, "netns", &self.node, "type", "veth", "peer", "name",
            "eth0", "netns", &ns,
        ])?;
        // Addresses from 10.89.0.0/16, as a node's pod CIDR.
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 89, 0, 10)) + n % 60_000);
        cmd::run(&[
            "ip",
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{ip}/32"),
            "dev",
            "eth0",
        ])?;
        cmd::run(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
        cmd::run(&["ip", "-n", &self.node, "link", "set", &host_if, "up"])?;
        self.pods.push_back(FleetPod { _netns: netns });
        Ok(())
    }

    /// Replaces one pod every [`POD_CHURN_EVERY`] for `duration`: the oldest removed, a
    /// new one created. Returns pods replaced per second.
    pub(super) fn churn(&mut self, duration: Duration) -> Result<f64> {
        let began = Instant::now();
        let mut replaced = 0u32;
        let mut next = began;
        while next < began + duration {
            check_interrupted()?;
            thread::sleep(next.saturating_duration_since(Instant::now()));
            // Dropped: its namespace deleted, and its veth pair with it.
            drop(self.pods.pop_front());
            self.create()?;
            replaced += 1;
            next += POD_CHURN_EVERY;
        }
        thread::sleep((began + duration).saturating_duration_since(Instant::now()));
        Ok(f64::from(replaced) / began.elapsed().as_secs_f64())
    }
}

/// Creates [`INTERFACES`] interfaces in `netns` (veth pairs, both ends there) in batches
/// over the first half of `duration`, removes them over the second half. Returns the
/// interfaces created and removed per second (each counted once).
pub(super) fn churn_interfaces(netns: &str, duration: Duration) -> Result<f64> {
    let pairs = INTERFACES / 2;
    let batches = pairs.div_ceil(PAIRS_PER_BATCH);
    // Half the window to create them all, half to remove them.
    let step = duration / (2 * batches as u32);
    let prefix = format!("nds{}", std::process::id() % 10_000);
    let name = |pair: usize, end: char| format!("{prefix}{end}{pair}");
    let began = Instant::now();
    let mut created = Vec::new();
    let result = (|| {
        for batch in 0..2 * batches {
            check_interrupted()?;
            let at = began + step * batch as u32;
            thread::sleep(at.saturating_duration_since(Instant::now()));
            let range = (batch % batches) * PAIRS_PER_BATCH
                ..((batch % batches + 1) * PAIRS_PER_BATCH).min(pairs);
            let script: String = if batch < batches {
                range
                    .clone()
                    .map(|p| {
                        format!(
                            "link add {} type veth peer name {}\n",
                            name(p, 'a'),
                            name(p, 'b')
                        )
                    })
                    .collect()
            } else {
                // Deleting one end of a veth pair deletes both.
                range
                    .clone()
                    .map(|p| format!("link del {}\n", name(p, 'a')))
                    .collect()
            };
            ip_batch(netns, &script)?;
            if batch < batches {
                created.extend(range);
            } else {
                created.retain(|p| !range.contains(p));
            }
        }
        Ok::<_, anyhow::Error>(())
    })();
    // Whatever went wrong, none is left behind.
    if !created.is_empty() {
        let script: String = created
            .iter()
            .map(|&p| format!("link del {}\n", name(p, 'a')))
            .collect();
        let _ = ip_batch(netns, &script);
    }
    result?;
    thread::sleep((began + duration).saturating_duration_since(Instant::now()));
    Ok(INTERFACES as f64 / began.elapsed().as_secs_f64())
}

/// Runs `ip -n NETNS -batch -` on `script`.
fn ip_batch(netns: &str, script: &str) -> Result<()> {
    let mut child = Command::new("ip")
        .args(["-n", netns, "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("ip -batch")?;
    child
        .stdin
        .take()
        .context("ip -batch: no stdin")?
        .write_all(script.as_bytes())
        .context("ip -batch: write")?;
    let out = child.wait_with_output().context("ip -batch")?;
    if !out.status.success() {
        bail!(
            "ip -n {netns} -batch failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
