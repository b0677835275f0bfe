//! `node-diag run`: loads the programs, drains verdict events into the correlator,
//! aggregates findings, keeps metrics in step with the kernel counters, serves HTTP, and
//! shuts down cleanly on SIGINT/SIGTERM (TC attachments are detached and the `clsact`
//! qdiscs the agent owns deleted, see `kernel::tc`; dropping the `Ebpf` detaches every
//! other link).
//!
//! [`Agent`] holds what the loop owns, with one method per event source: a kernel
//! event, the counters' tick, a link notification, the scope refresh, the MTU refresh.
//!
//! - [`options`]: the command line; [`start`]: the programs loaded, the first look at
//!   the node, the listeners served; [`run_loop`]: the loop, until a signal.
//! - [`judge`]: a kernel event scoped, judged and accounted, its effects carried out
//!   as `findings::ledger` decides; [`inbound_findings`]: the inbound SYN drops'.
//! - [`state`]: what the loop shares with the HTTP handlers ([`http`]), which [`serve`]
//!   serves on the scrape and findings listeners, with bounds, TLS and basic auth;
//!   [`findings_api`]: `/findings`, filtered and encoded from a snapshot of the store.
//! - [`allocator`]: glibc's malloc arenas capped before any thread starts, and the
//!   pages start-up freed given back once it is done.
//! - [`fds`]: the open-files limit raised at start, and the share HTTP may take;
//!   [`failing`]: work retried every tick warns once while it fails.
//! - [`metrics`]: the Prometheus registry, fed kernel totals and findings.
//! - [`blackholes`]: which reported PMTUD black holes are still open, by their sockets.
//! - [`conntrack_watch`]: each namespace's conntrack counters, the evidence of
//!   conntrack verdicts.
//! - [`mtu_refresh`]: the MTU model's conditions and gauges, rebuilt on link changes.
//! - [`translate`]: the Service and NAT behind a verdict's destination (kube-proxy's
//!   rules on their own thread, conntrack off the loop).
//! - [`verdicts`]: exact counts for the verdicts the kernel aggregates.
//! - [`inbound`]: exact counts for the inbound SYN drops the kernel aggregates (a
//!   client elsewhere's SYNs to a pod of this node, dropped here by a filter).
//! - [`icmp_watch`]: when the TC classifier is attached (always, or while trouble
//!   shows), and whether an event's evidence window was watched.
//! - [`rule_watch`]: the netfilter rule behind a firewall or service verdict, named
//!   from the counters that rose with the flow's next drop.
//! - [`path_probe`]: the bounded probes of a flow's path that a stall or a timeout
//!   without evidence on this node asks for, and their verdicts; [`path_findings`]:
//!   those verdicts recorded.
//! - [`tc_follow`]: the classifier attached to the node's interfaces as they change.
//! - [`health`]: the agent's own health as metrics (programs attached, the container
//!   runtime, failed refreshes, evictions); [`process`]: its process metrics.
//!
//! One kernel event travels: ring buffer (`kernel::ring`, its kind decoded there) →
//! [`Agent::on_event`] → `correlate` → metrics + findings store (served on `/findings`)
//! → printed once on stdout. Storms of identical connect verdicts arrive as one event
//! per key per second; the rest of their count is read from the kernel's `VERDICT_AGG`
//! map on every tick.

pub(crate) mod allocator;
mod blackholes;
mod coalesce;
mod conntrack_watch;
mod drop_sites;
mod failing;
mod fds;
mod findings_api;
mod health;
mod http;
pub(crate) mod icmp_watch;
mod inbound;
pub(crate) mod metrics;
mod mtu_refresh;
mod own_endpoints;
mod path_findings;
mod path_probe;
mod process;
mod rule_watch;
mod serve;
mod state;
mod tc_follow;
mod translate;
mod verdicts;

mod inbound_findings;
mod judge;
mod options;
mod run_loop;
mod start;

use self::options::{WebConfigs, connection_cap, load_web_config, node_name};
pub(crate) use self::{options::RunOptions, run_loop::run};

use std::{
    net::SocketAddr,
    ops::RangeInclusive,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use node_diag_common::Event;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
    task::JoinHandle,
};
use tracing::{debug, info, warn};

use self::{
    blackholes::{BlackholeWatch, Shrink},
    coalesce::Coalesce,
    conntrack_watch::ConntrackWatch,
    failing::Failing,
    icmp_watch::IcmpWatch,
    metrics::{HttpMetrics, KernelTotals, ListenerLabel, Metrics},
    mtu_refresh::refresh_mtu,
    state::Shared,
    translate::Translator,
};
use crate::{
    findings::{
        Finding, Layer, Store,
        correlate::{Context, ShrunkBy, correlate, inbound as inbound_verdict, path::reprobed},
        ledger::{self, Effect},
        names::Names,
    },
    host_network::{LocalNode, PodReads},
    kernel::{
        caps,
        event::EventKind,
        loader::{self, LoadError, Loaded},
        maps::{KernelMaps, MapMissing, monotonic_ns},
        tc::{self, TcIngress},
    },
    output::{OutputFormat, print_finding},
    pods::PodsHandle,
};

#[derive(Debug, thiserror::Error)]
pub(crate) enum AgentError {
    #[error(
        "missing capabilities {0}: run as root, or grant CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (the DaemonSet in deploy/ does)"
    )]
    Privileges(String),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Map(#[from] MapMissing),
    #[error("cannot listen on {addr}: {source} (pick another address with {flag})")]
    Listen {
        flag: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0} (fix it, or run without --web-config-file)")]
    WebConfig(#[from] serve::web_config::WebConfigError),
    #[error("cannot write the ready file {path}: {source}")]
    ReadyFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// What the agent's loop owns.
struct Agent {
    /// The agent's namespace's links as link notifications keep them (the scope
    /// refreshes from it rather than dumping every link); `None` without them.
    links: Option<crate::host_network::SharedLinks>,
    opts: RunOptions,
    loaded: Loaded,
    maps: KernelMaps,
    conntrack: ConntrackWatch,
    /// The TC ingress classifier, when this kernel could load it.
    tc: Option<TcIngress>,
    watch: IcmpWatch,
    shared: Arc<Shared>,
    pods: PodsHandle,
    /// The pod index's generation the held findings were last named under.
    pods_named: u64,
    translator: Translator,
    drop_sites: drop_sites::DropSites,
    names: Names,
    ephemeral_ports: RangeInclusive<u16>,
    /// The agent's own listeners: what befalls their connections is not reported.
    own: own_endpoints::OwnEndpoints,
    verdicts: verdicts::VerdictTracker,
    /// The kernel's clock when the agent last looked at the node for its scope.
    scope_looked_ns: u64,
    inbound: inbound::InboundTracker,
    blackholes: BlackholeWatch,
    stalls: blackholes::StallRecheck,
    shrinks: blackholes::ShrinkConfirm,
    path_probes: path_probe::PathProbes,
    rules: rule_watch::RuleWatch,
    /// Ring-buffer records that could not be decoded, and verdicts whose events never
    /// came: both are events lost.
    bad_records: Arc<AtomicU64>,
    tasks: Vec<JoinHandle<()>>,
}

impl Agent {
    /// Every 500 ms: the verdict counts the kernel aggregated, the counters (and with
    /// them whether ICMP is watched), the black holes still open. `queued`: events wait.
    fn on_tick(&mut self, queued: bool) {
        self.rules.tick(&self.maps);
        self.name_new_pods();
        let (entries, now_ns) = self.maps.verdict_counts();
        let stamp = crate::findings::rfc3339(SystemTime::now());
        let read = self.verdicts.read(&entries, now_ns, queued, &stamp);
        self.bad_records.fetch_add(read.lost, Ordering::Relaxed);
        for finding in read.findings {
            self.record(finding);
        }
        for key in &read.forget {
            let last = self.maps.take_verdict(key);
            if let Some(finding) = self.verdicts.forgotten(key, last, &stamp) {
                self.record(finding);
            }
        }
        self.read_inbound(&stamp);
        let counts = self.maps.counts();
        let now = Instant::now();
        if self.watch.counters(&counts, now) {
            self.start_icmp_watch("kernel counters");
        } else if self.watch.quiet(now)
            && let Some(tc) = self.tc.as_mut()
        {
            tc.detach_all(&mut self.loaded.ebpf);
            self.watch.detached(monotonic_ns());
            info!(
                hold_secs = self.watch.hold().as_secs(),
                "ICMP watch off: no trouble for the hold time; TC ingress detached"
            );
        }
        self.shared.metrics().set_icmp_watch(self.watch.armed());
        let totals = KernelTotals::named(
            &counts,
            &self.names,
            self.bad_records.load(Ordering::Relaxed),
        );
        let blackholes = self.blackholes.open(&self.maps.reported_blackholes(), now);
        // Beyond the node, only the path's probes tell whether a black hole is open.
        let on_path = self.shared.store().active(reprobed).len();
        let mut metrics = self.shared.metrics();
        metrics.sync_kernel(totals);
        metrics.set_blackholes(blackholes.len() + on_path);
        drop(metrics);
        self.apply([ledger::blackholes_open(blackholes.into_iter().collect())]);
    }

    /// When the pod index changed: the held findings that name no pod yet are named from
    /// it, so a pod's first connects, made before the runtime was read, are named
    /// within the second that follows.
    fn name_new_pods(&mut self) {
        let generation = self.pods.generation();
        if generation == self.pods_named {
            return;
        }
        self.pods_named = generation;
        let index = self.pods.current();
        if index.len() == 0 {
            return;
        }
        self.shared.store().update(
            |f| f.pod.is_none() || f.peer_pod.is_none(),
            |f| f.name_pods(index.name(&f.ends())),
        );
    }

    /// A read of a watched flow's rules ended: the rule it named goes into the flow's
    /// findings held (served on `/findings`; printed with their next repeat).
    fn on_rule(&mut self, done: rule_watch::Done) {
        if let Some((key, rule)) = self.rules.done(done) {
            self.shared
                .store()
                .update(|f| key.covers(f), |f| f.evidence.set_rule(&rule));
            // Later counts of an inbound drop are added from its template: it keeps the rule.
            self.inbound
                .update(|f| key.covers(f), |f| f.evidence.set_rule(&rule));
        }
    }

    /// A link came, went or changed (or the safety net's time came): the scope (a new
    /// pod's veth brings its namespace in before its first connect), the namespaces whose
    /// conntrack counters are read, and the classifier's interfaces.
    fn on_scope(&mut self) {
        self.scope_looked_ns = monotonic_ns();
        let node = self.refresh_namespaces();
        self.follow_kept(node.as_ref());
    }

    /// Every [`REFRESH`]: the conntrack counters, and the agent's own health.
    fn on_refresh(&mut self) {
        if self.opts.all_netns {
            self.conntrack.refresh_all();
        } else {
            self.conntrack.read();
        }
        self.check_health();
    }

    /// Judges again the full-size stalls reported without MTU evidence, now that their
    /// evidence had time to arrive: with it, a stall is the black hole it was, reported
    /// as such (the stall withdrawn) and followed until it closes.
    async fn recheck_stalls(&mut self) {
        for ev in self.stalls.due(Instant::now()) {
            let Some(blackhole) = blackholes::as_blackhole(&ev, &self.maps) else {
                continue;
            };
            self.maps.mark_blackhole(&ev.flow);
            self.apply([ledger::stall_was_blackhole(ev.flow)]);
            self.on_event(EventKind::PmtudStall, blackhole).await;
        }
    }

    /// Asks the sockets of quiet black-holed flows whether they are still stuck.
    async fn ask_blackholes(&mut self) {
        let reported = self.maps.reported_blackholes();
        if !reported.is_empty() {
            self.blackholes.ask(&reported).await;
        }
    }

    async fn refresh_mtu(&self, pods: PodReads) {
        let senders = self.maps.frag_needed_senders();
        refresh_mtu(
            &self.shared,
            &self.pods,
            &senders,
            self.opts.format,
            self.links.clone(),
            pods,
        )
        .await;
    }

    /// Refreshes the scope (unless every namespace is watched) and follows the conntrack
    /// counters of the namespaces in it; without a scope, the counters wait. Returns the
    /// look at the node the scope came from.
    fn refresh_namespaces(&mut self) -> Option<LocalNode> {
        if self.opts.all_netns {
            // No scope to keep, but the pods' veths still tell inbound drops apart.
            if let Ok(node) = crate::host_network::local_node() {
                self.maps.set_pod_links(node.own, &node.pod_links);
            }
            return None;
        }
        let Some(node) = refresh_scope(&mut self.maps, self.links.as_ref()) else {
            self.shared.metrics().scope_refresh_failed();
            return None;
        };
        self.conntrack.follow(&node);
        Some(node)
    }

    /// Prints what the store has not printed yet, stops the tasks, removes the ready
    /// file and detaches everything.
    fn shutdown(mut self) {
        self.shared.set_ready(false);
        for f in self.shared.store().unprinted() {
            print_finding(&f, self.opts.format);
        }
        for task in &self.tasks {
            task.abort();
        }
        if let Some(path) = &self.opts.ready_file {
            let _ = std::fs::remove_file(path);
        }
        // Netlink filters first, so the clsact qdiscs they emptied can go.
        if let Some(tc) = self.tc.as_mut() {
            tc.detach_all(&mut self.loaded.ebpf);
        }
        // Dropping the Ebpf detaches every tracepoint link and unloads the programs.
        drop(self.loaded);
    }
}

/// Makes the kernel's scope map this node's current set of network namespaces, and
/// returns the look at the node it came from; on a netlink failure the previous scope
/// stays (`None`).
fn refresh_scope(
    maps: &mut KernelMaps,
    links: Option<&crate::host_network::SharedLinks>,
) -> Option<LocalNode> {
    let node = LIST_NAMESPACES.check(match links {
        Some(links) => {
            crate::host_network::current_links(links).and_then(crate::host_network::local_node_from)
        }
        None => crate::host_network::local_node(),
    })?;
    maps.set_scope(&node.scope);
    maps.set_pod_links(node.own, &node.pod_links);
    Some(node)
}

static LIST_NAMESPACES: Failing = Failing::new(
    "list this node's network namespaces",
    "the previous scope stays",
);
