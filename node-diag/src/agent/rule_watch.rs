//! Naming what dropped a flow's packet: the eBPF program at the TC or cgroup hook of
//! such a drop ([`RuleWatch::program`], at once), or the netfilter rule behind a `firewall` or `service` verdict: the rule whose
//! packet counter rose with the flow's drop.
//!
//! A verdict whose packet netfilter dropped (`NETFILTER_DROP`, a REJECT included) arms a
//! watch on its flow (namespace of the drop, addresses, destination port): the drop
//! namespace's dropping rules are read once (`services::netfilter_rules`), the baseline.
//! The flow's next drop after it — the connect's next SYN retransmit, read from the
//! programs' `SYN_DROPS` on the tick, or the client's next attempt, its own verdict —
//! reads them again, and the one rule that rose between the two reads is the flow's.
//! When several rose (other flows hit other rules meanwhile) or none did (the drop fell
//! inside a read), nothing is named and the second read is the next baseline.
//!
//! Costs: nothing while no such verdict comes; then one read of the namespace's rules
//! per drop of a watched flow, at most one a second ([`READ_EVERY`]), on a thread of
//! its own, at most [`MAX_WATCHES`] flows at a time, each forgotten [`HOLD`] after its
//! last verdict. Nothing is installed in the kernel: no trace rule to remove.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::mpsc as std_mpsc,
    thread,
    time::{Duration, Instant},
};

use node_diag_common::{Event, FlowKey};
use tokio::sync::mpsc;
use tracing::{debug, info};

use crate::{
    findings::{Finding, Layer, correlate::addr},
    host_network::{NetnsFile, in_netns, namespace_files},
    kernel::{
        hook_programs::{HookProgram, cgroup_egress_programs, tc_programs},
        maps::{KernelMaps, monotonic_ns},
    },
    services::netfilter_rules::{self, Rule, Snapshot},
};

/// A watch ends this long after its flow's last verdict.
const HOLD: Duration = Duration::from_secs(10);
/// Flows watched at once: a storm of firewall verdicts reads no more rules than this.
const MAX_WATCHES: usize = 8;
/// Between two reads for one flow: a flow dropped on and on (a flood) is read at most
/// once a second, not at every drop.
const READ_EVERY: Duration = Duration::from_secs(1);

/// A watched flow: where it was dropped, and its addresses and port (not the source
/// port: the client's next attempt is the same flow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct WatchKey {
    pub(crate) netns: u32,
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
    pub(crate) dport: u16,
}

impl WatchKey {
    /// Whether `f` is a verdict on this flow that a dropping rule explains.
    pub(crate) fn covers(&self, f: &Finding) -> bool {
        matches!(f.layer, Layer::Firewall | Layer::Service)
            && f.src == Some(self.src)
            && f.dst == Some(self.dst)
            && f.dport == Some(self.dport)
    }
}

struct Watch {
    /// The last attempt's full tuple, whose SYN drops the tick reads.
    flow: FlowKey,
    /// The programs' clock when the baseline read ended; 0 while a read is running.
    since_ns: u64,
    until: Instant,
    /// When the last read was asked for.
    asked: Instant,
}

enum Hook {
    Tc { ingress: bool },
    CgroupEgress,
}

enum Job {
    Read { key: WatchKey, compare: bool },
    Forget(WatchKey),
}

/// A read of a watched flow's rules that ended.
pub(crate) struct Done {
    key: WatchKey,
    at_ns: u64,
    named: Option<(Rule, u64)>,
}

pub(crate) struct RuleWatch {
    jobs: std_mpsc::Sender<Job>,
    done: mpsc::UnboundedReceiver<Done>,
    watches: HashMap<WatchKey, Watch>,
    /// Namespace files by inode, for the TC programs' reads.
    files: HashMap<u32, NetnsFile>,
}

impl RuleWatch {
    pub(crate) fn start() -> Self {
        let (jobs, rx) = std_mpsc::channel();
        let (tx, done) = mpsc::unbounded_channel();
        // Detached: it ends when the agent drops `jobs`.
        let _ = thread::Builder::new()
            .name("rule-watch".into())
            .spawn(move || reader(&rx, &tx));
        Self {
            jobs,
            done,
            watches: HashMap::new(),
            files: HashMap::new(),
        }
    }

    pub(crate) async fn next(&mut self) -> Done {
        match self.done.recv().await {
            Some(done) => done,
            None => std::future::pending().await,
        }
    }

    /// The program at the hook of `ev`'s drop (reason `reason`: a TC hook of the
    /// drop's device, or the sending socket's cgroup egress), when exactly one other
    /// than the agent's is there: it returned the drop. Several leave it unknown which.
    pub(crate) fn program(&mut self, ev: &Event, reason: &str) -> Option<HookProgram> {
        let netns = ev.drop.netns;
        if ev.drop.count == 0 || netns == 0 {
            return None;
        }
        let hook = match reason {
            "TC_INGRESS" => Hook::Tc { ingress: true },
            "TC_EGRESS" => Hook::Tc { ingress: false },
            "BPF_CGROUP_EGRESS" => Hook::CgroupEgress,
            _ => return None,
        };
        if !self.files.contains_key(&netns) {
            self.files = namespace_files()
                .into_iter()
                .map(|f| (f.inode, f))
                .collect();
        }
        let file = self.files.get(&netns)?;
        let flow = &ev.flow;
        let mut found = match hook {
            Hook::Tc { ingress } if ev.drop.ifindex != 0 => {
                tc_programs(file, ev.drop.ifindex, ingress)
            }
            Hook::Tc { .. } => return None,
            Hook::CgroupEgress => cgroup_egress_programs(
                file,
                flow.family as u8,
                SocketAddr::new(addr(flow, &flow.saddr), flow.sport),
                SocketAddr::new(addr(flow, &flow.daddr), flow.dport),
            ),
        };
        if found.len() != 1 {
            debug!(?found, "not one program at the drop's TC hook: none named");
            return None;
        }
        found.pop()
    }

    /// A verdict was recorded: `finding` on `ev`, whose drop reason is `reason`.
    pub(crate) fn verdict(&mut self, finding: &Finding, ev: &Event, reason: &str) {
        // Where and when netfilter last ended the flow's packet: its drop, or (a REJECT
        // of a packet this node sent itself shows no drop) the ICMP error it answered.
        let (netns, last_ns) = if ev.drop.count > 0 && reason == "NETFILTER_DROP" {
            (ev.drop.netns, ev.drop.last_ns)
        } else {
            (ev.icmp.netns, ev.icmp.last_ns)
        };
        if netns == 0 || last_ns == 0 {
            return;
        }
        let flow = &ev.flow;
        let key = WatchKey {
            netns,
            src: addr(flow, &flow.saddr),
            dst: addr(flow, &flow.daddr),
            dport: flow.dport,
        };
        if !key.covers(finding) {
            return;
        }
        let until = Instant::now() + HOLD;
        if let Some(w) = self.watches.get_mut(&key) {
            w.flow = *flow;
            w.until = until;
            if w.since_ns != 0 && w.asked.elapsed() >= READ_EVERY && last_ns > w.since_ns {
                w.asked = Instant::now();
                w.since_ns = 0;
                let _ = self.jobs.send(Job::Read { key, compare: true });
            }
            return;
        }
        if self.watches.len() >= MAX_WATCHES {
            debug!(?key, "rule watch full: the rule stays unnamed");
            return;
        }
        self.watches.insert(
            key,
            Watch {
                flow: *flow,
                since_ns: 0,
                until,
                asked: Instant::now(),
            },
        );
        let _ = self.jobs.send(Job::Read {
            key,
            compare: false,
        });
    }

    /// On the tick: a watched connect's SYN dropped again since the baseline is
    /// compared; watches past their hold end.
    pub(crate) fn tick(&mut self, maps: &KernelMaps) {
        let now = Instant::now();
        let jobs = &self.jobs;
        self.watches.retain(|key, w| {
            if now >= w.until && w.since_ns != 0 {
                let _ = jobs.send(Job::Forget(*key));
                return false;
            }
            if w.since_ns != 0
                && now.duration_since(w.asked) >= READ_EVERY
                && maps
                    .syn_drops(&w.flow)
                    .is_some_and(|d| d.last_ns > w.since_ns)
            {
                w.since_ns = 0;
                w.asked = now;
                let _ = jobs.send(Job::Read {
                    key: *key,
                    compare: true,
                });
            }
            true
        });
    }

    /// A read ended: the rule it named, with its flow, if one rose alone.
    pub(crate) fn done(&mut self, done: Done) -> Option<(WatchKey, Rule)> {
        if let Some(w) = self.watches.get_mut(&done.key) {
            w.since_ns = done.at_ns;
        }
        let (rule, delta) = done.named?;
        info!(
            key = ?done.key, table = %rule.table, chain = %rule.chain,
            handle = ?rule.handle, comment = ?rule.comment, packets = delta,
            "named the rule that dropped the flow"
        );
        Some((done.key, rule))
    }
}

/// The reading thread: one baseline per watched flow, each compared with the next read.
fn reader(jobs: &std_mpsc::Receiver<Job>, done: &mpsc::UnboundedSender<Done>) {
    let mut baselines: HashMap<WatchKey, Snapshot> = HashMap::new();
    let mut files: HashMap<u32, NetnsFile> = HashMap::new();
    while let Ok(job) = jobs.recv() {
        let (key, compare) = match job {
            Job::Forget(key) => {
                baselines.remove(&key);
                continue;
            }
            Job::Read { key, compare } => (key, compare),
        };
        if !files.contains_key(&key.netns) {
            files = namespace_files()
                .into_iter()
                .map(|f| (f.inode, f))
                .collect();
        }
        let now = files
            .get(&key.netns)
            .and_then(|f| in_netns(f, netfilter_rules::snapshot).ok())
            .unwrap_or_default();
        let at_ns = monotonic_ns();
        let named = if compare {
            baselines
                .get(&key)
                .and_then(|before| netfilter_rules::rose(before, &now))
        } else {
            None
        };
        baselines.insert(key, now);
        if done.send(Done { key, at_ns, named }).is_err() {
            return;
        }
    }
}
