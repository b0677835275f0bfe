//! `node-diag run`: loads the programs, drains verdict events into the correlator,
//! aggregates findings, keeps metrics in step with the kernel counters, serves HTTP, and
//! shuts down cleanly on SIGINT/SIGTERM (TC attachments are detached and the `clsact`
//! qdiscs the agent owns deleted, see `kernel::tc`; dropping the `Ebpf` detaches every
//! other link).
//!
//! - [`state`]: what the loop shares with the HTTP handlers ([`http`]).
//! - [`metrics`]: the Prometheus registry, fed kernel totals and findings.
//! - [`conntrack_watch`]: each namespace's conntrack counters, the evidence of
//!   conntrack verdicts.
//! - [`mtu_refresh`]: the MTU model's conditions and gauges, rebuilt on link changes.
//!
//! - [`verdicts`]: exact counts for the verdicts the kernel aggregates.
//! - [`icmp_watch`]: when the TC classifier is attached (always, or while trouble
//!   shows), and whether an event's evidence window was watched.
//!
//! One kernel event travels: ring buffer (`kernel::ring`) → this loop → `correlate` →
//! metrics + findings store (served on `/findings`) → printed once on stdout. Storms of
//! identical connect verdicts arrive as one event per key per second; the rest of their
//! count is read from the kernel's `VERDICT_AGG` map on every tick.

mod conntrack_watch;
mod http;
pub mod icmp_watch;
pub mod metrics;
mod mtu_refresh;
mod state;
mod verdicts;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    sync::{PoisonError, RwLock},
    time::{Duration, Instant, SystemTime},
};

use node_diag_common::{Event, FlowKey};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tracing::{debug, info, warn};

use self::{
    conntrack_watch::ConntrackWatch,
    icmp_watch::IcmpWatch,
    metrics::{KernelTotals, Metrics},
    mtu_refresh::refresh_mtu,
    state::Shared,
};
use crate::{
    OutputFormat,
    findings::{
        Finding, Kind, Layer, Store,
        correlate::{Context, Translation, correlate, withdrawn},
        names::Names,
    },
    host_network::LocalNode,
    kernel::{
        caps,
        loader::{self, LoadError},
        maps::{KernelMaps, MapMissing, monotonic_ns},
        tc::{self, TcIngress},
    },
    output::print_finding,
    services::{CatalogWatcher, ServiceCatalog, SourceStatus},
};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(
        "missing capabilities {0}: run as root, or grant CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (the DaemonSet in deploy/ does)"
    )]
    Privileges(String),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Map(#[from] MapMissing),
    #[error("cannot listen on {addr}: {source} (pick another address with --listen)")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot write the ready file {path}: {source}")]
    ReadyFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

pub struct RunOptions {
    pub listen: SocketAddr,
    pub format: OutputFormat,
    pub ready_file: Option<PathBuf>,
    pub syn_retries: u32,
    pub repeat_interval: Duration,
    /// Report for every network namespace on the kernel, not just this node's.
    pub all_netns: bool,
    /// The eBPF programs' own log level.
    pub ebpf_log: crate::kernel::ebpf_log::Level,
    /// How the TC ingress classifier is attached (TCX or a netlink filter).
    pub tc_attach: tc::AttachMode,
    /// When the TC ingress classifier is attached: always, or while trouble shows.
    pub icmp_watch: icmp_watch::Mode,
    /// How long it stays attached after the last trouble (`on-trouble`).
    pub icmp_watch_hold: Duration,
    /// `--cri-socket`: the runtime socket to read pods from (default: the usual ones).
    pub cri_socket: Option<PathBuf>,
}

const MAX_FINDINGS: usize = 4096;
/// How often new pod namespaces and interfaces are picked up.
const REFRESH: Duration = Duration::from_secs(2);
/// How often the MTU model is rebuilt without a link notification (pod namespaces
/// change without one in the agent's namespace).
const MTU_REFRESH: Duration = Duration::from_secs(10);

pub async fn run(opts: RunOptions) -> Result<(), AgentError> {
    let missing = caps::missing_for_agent(caps::effective());
    if !missing.is_empty() {
        return Err(AgentError::Privileges(missing.join(", ")));
    }
    // The programs' maps are empty before this: evidence begins here.
    let loaded_ns = monotonic_ns();
    let mut loaded = loader::load(&loader::Options {
        syn_retrans_threshold: opts.syn_retries,
        scoped: !opts.all_netns,
        ebpf_log: opts.ebpf_log,
    })?;
    info!(
        attached = ?loaded.attached,
        degraded = loaded.degraded.len(),
        btf = loaded.btf_ok,
        tracefs = %loaded.tracefs.display(),
        mounted_tracefs = loaded.mounted_tracefs,
        drop_reasons = loaded.drop_reasons.len(),
        "eBPF programs attached"
    );

    let (ring, mut maps) = KernelMaps::take(&mut loaded.ebpf, loaded.drop_reasons.slots())?;
    let mut conntrack = ConntrackWatch::default();
    let node = refresh_namespaces(&mut maps, &mut conntrack, opts.all_netns);
    // Bound before TC is attached: a second agent in this namespace (the listen address
    // taken) fails here, before it could mistake the first one's filters for leftovers.
    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|source| AgentError::Listen {
            addr: opts.listen,
            source,
        })?;
    let local = listener.local_addr()?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;

    let mut tc = match TcIngress::load(&mut loaded.ebpf, opts.tc_attach) {
        Ok(tc) => Some(tc),
        Err(e) => {
            warn!(error = %e, "TC ingress unavailable: frag-needed received is not seen");
            None
        }
    };
    let mut watch = IcmpWatch::new(opts.icmp_watch, opts.icmp_watch_hold, loaded_ns);
    if let Some(tc) = tc.as_mut() {
        match watch.mode() {
            icmp_watch::Mode::Always => {
                follow_interfaces(tc, &mut loaded.ebpf, node.as_ref(), &mut watch, loaded_ns);
            }
            icmp_watch::Mode::OnTrouble => {
                match node.as_ref() {
                    Some(node) => tc.remove_leftovers(&node.links),
                    None => match crate::host_network::links() {
                        Ok(links) => tc.remove_leftovers(&links),
                        Err(e) => {
                            warn!(error = %e, "cannot list interfaces; TC filters a previous agent left stay")
                        }
                    },
                }
                info!(
                    hold_secs = watch.hold().as_secs(),
                    "ICMP from the network is watched only once trouble shows (--icmp-watch on-trouble)"
                );
            }
        }
    }
    // Stale from here on: the loop takes a fresh look every refresh.
    drop(node);

    let shared = Arc::new(Shared::new(
        Metrics::new(),
        Store::new(opts.repeat_interval, MAX_FINDINGS),
    ));
    let server = tokio::spawn({
        let app = http::router(shared.clone());
        async move {
            if let Err(e) = axum::serve(listener, app).await {
                warn!(error = %e, "HTTP server stopped");
            }
        }
    });

    let (tx, mut rx) = mpsc::unbounded_channel();
    let bad_records = Arc::new(AtomicU64::new(0));
    let drainer = tokio::spawn(crate::kernel::ring::drain(ring, tx, bad_records.clone()));
    let ebpf_logs = loaded.ebpf_log.take().map(|logs| {
        tokio::spawn(async {
            if let Err(e) = crate::kernel::ebpf_log::drain(logs).await {
                warn!(error = %e, "eBPF log stream stopped");
            }
        })
    });

    let pods = crate::pods::watch(opts.cri_socket.clone()).await;
    refresh_mtu(&shared, &pods, opts.format).await;

    if let Some(path) = &opts.ready_file
        && let Err(source) = std::fs::write(path, format!("{local}\n"))
    {
        if let Some(tc) = tc.as_mut() {
            tc.detach_all(&mut loaded.ebpf);
        }
        return Err(AgentError::ReadyFile {
            path: path.clone(),
            source,
        });
    }
    let services = watch_services();
    let mut untranslated = Untranslated::default();
    shared.set_ready(true);
    info!(listen = %local, "ready");

    let names = Names::for_this_node(loaded.drop_reasons.clone());
    let ephemeral_ports = crate::host_network::local_port_range();
    let mut verdicts = verdicts::VerdictTracker::default();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut refresh_tick = tokio::time::interval(REFRESH);
    refresh_tick.tick().await;
    let mut mtu_tick = tokio::time::interval(MTU_REFRESH);
    mtu_tick.tick().await;
    let mut link_changes = match crate::host_network::watch() {
        Ok(rx) => Some(rx),
        Err(e) => {
            warn!(error = %e, "no link notifications: MTU changes are picked up every {}s", MTU_REFRESH.as_secs());
            None
        }
    };
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else {
                    warn!("event stream ended");
                    break;
                };
                let ctx = Context {
                    names: &names,
                    now: SystemTime::now(),
                    ephemeral_ports: ephemeral_ports.clone(),
                    translation: translate(
                        &ev,
                        &maps,
                        &services.read().unwrap_or_else(PoisonError::into_inner),
                        &mut untranslated,
                    ),
                    conntrack: conntrack.window(&ev, &names),
                    icmp_watched: watch.covers(&ev),
                };
                if watch.event(&ev, Instant::now()) {
                    start_icmp_watch(tc.as_mut(), &mut loaded.ebpf, &mut watch, "a verdict");
                }
                let mut finding = correlate(&ev, &ctx);
                if let Some(f) = finding.as_mut() {
                    crate::pods::name_pods(f, &pods.current());
                }
                let made = finding.is_some();
                if let Some(finding) = verdicts.event(&ev, finding) {
                    if finding.layer == Layer::Conntrack
                        && let Some(cause) = finding.evidence.get("conntrack_cause").and_then(|c| c.as_str())
                    {
                        shared.metrics().conntrack_drops(cause, ev.drop.count);
                    }
                    record(&shared, finding, opts.format);
                } else if !made && let Some((kind, netns, dst, dport)) = withdrawn(&ev) {
                    // The connect that was timing out got through: a slow listener or a
                    // transient drop, not a standing failure.
                    let resolved = shared.store().resolve(
                        |f| f.kind == kind && f.netns == netns && f.dst == Some(dst) && f.dport == Some(dport),
                        SystemTime::now(),
                    );
                    for f in resolved {
                        print_finding(&f, opts.format);
                    }
                }
            }
            _ = tick.tick() => {
                let (entries, now_ns) = maps.verdict_counts();
                let stamp = crate::findings::rfc3339(SystemTime::now());
                let read = verdicts.read(&entries, now_ns, &stamp);
                bad_records.fetch_add(read.lost, Ordering::Relaxed);
                for finding in read.findings {
                    record(&shared, finding, opts.format);
                }
                for key in &read.forget {
                    let last = maps.take_verdict(key);
                    if let Some(finding) = verdicts.forgotten(key, last, &stamp) {
                        record(&shared, finding, opts.format);
                    }
                }
                let counts = maps.counts();
                let now = Instant::now();
                if watch.counters(&counts, now) {
                    start_icmp_watch(tc.as_mut(), &mut loaded.ebpf, &mut watch, "kernel counters");
                } else if watch.quiet(now)
                    && let Some(tc) = tc.as_mut()
                {
                    tc.detach_all(&mut loaded.ebpf);
                    watch.detached(monotonic_ns());
                    info!(hold_secs = watch.hold().as_secs(), "ICMP watch off: no trouble for the hold time; TC ingress detached");
                }
                shared.metrics().set_icmp_watch(watch.armed());
                let totals = KernelTotals::named(&counts, &names, bad_records.load(Ordering::Relaxed));
                let blackholes = maps.active_blackholes();
                let mut metrics = shared.metrics();
                metrics.sync_kernel(totals);
                metrics.set_blackholes(blackholes.len());
                drop(metrics);
                let resolved = shared.store().resolve(
                    |f| f.kind == Kind::PmtudBlackhole && !blackholes.iter().any(|k| flow_matches(f, k)),
                    SystemTime::now(),
                );
                for f in resolved {
                    print_finding(&f, opts.format);
                }
            }
            _ = mtu_tick.tick() => refresh_mtu(&shared, &pods, opts.format).await,
            changed = next_change(&mut link_changes) => {
                if changed.is_none() {
                    warn!("link notifications stopped: MTU changes are picked up every {}s", MTU_REFRESH.as_secs());
                    link_changes = None;
                    continue;
                }
                refresh_mtu(&shared, &pods, opts.format).await;
                if let Some(tc) = tc.as_mut().filter(|_| watch.keeps_attached()) {
                    follow_interfaces(tc, &mut loaded.ebpf, None, &mut watch, monotonic_ns());
                }
            }
            _ = refresh_tick.tick() => {
                let node = refresh_namespaces(&mut maps, &mut conntrack, opts.all_netns);
                if let Some(tc) = tc.as_mut().filter(|_| watch.keeps_attached()) {
                    follow_interfaces(tc, &mut loaded.ebpf, node.as_ref(), &mut watch, monotonic_ns());
                }
            }
            _ = sigterm.recv() => { info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { info!("SIGINT: shutting down"); break; }
        }
    }

    shared.set_ready(false);
    for f in shared.store().unprinted() {
        print_finding(&f, opts.format);
    }
    drainer.abort();
    if let Some(task) = ebpf_logs {
        task.abort();
    }
    server.abort();
    if let Some(path) = &opts.ready_file {
        let _ = std::fs::remove_file(path);
    }
    // Netlink filters first, so the clsact qdiscs they emptied can go.
    if let Some(tc) = tc.as_mut() {
        tc.detach_all(&mut loaded.ebpf);
    }
    // Dropping the Ebpf detaches every tracepoint link and unloads the programs.
    drop(loaded);
    Ok(())
}

/// Counts a finding in the metrics and the store, and prints it when the store says so.
/// A finding with `count` 0 (an event whose verdicts a map read already accounted) only
/// refreshes a finding the store holds.
fn record(shared: &Shared, finding: Finding, format: OutputFormat) {
    if finding.count == 0 && !shared.store().contains(&finding) {
        return;
    }
    shared.metrics().finding(&finding);
    let printed = shared.store().record(finding, Instant::now());
    if let Some(f) = printed {
        print_finding(&f, format);
    }
}

/// Waits for the next link notification; never, without a watcher.
async fn next_change(rx: &mut Option<tokio::sync::mpsc::Receiver<()>>) -> Option<()> {
    match rx.as_mut() {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Attaches the classifier now that trouble shows (`why`), and notes since when ICMP is
/// watched. Without it (unavailable), nothing is watched and findings say so.
fn start_icmp_watch(
    tc: Option<&mut TcIngress>,
    ebpf: &mut aya::Ebpf,
    watch: &mut IcmpWatch,
    why: &str,
) {
    let Some(tc) = tc else {
        watch.attach_failed(Instant::now());
        return;
    };
    if follow_interfaces(tc, ebpf, None, watch, monotonic_ns()) {
        info!(
            trigger = why,
            "ICMP watch on: trouble shows; TC ingress attached"
        );
    } else {
        watch.attach_failed(Instant::now());
        warn!(
            trigger = why,
            "trouble shows but TC ingress attached to no interface: ICMP from the network stays unwatched"
        );
    }
}

/// Brings the classifier's attachments in line with the node's interfaces
/// ([`sync_tc_from`]) and, when some interface holds it, notes that ICMP from the network
/// is watched from `now_ns` on. Returns whether any interface holds it.
fn follow_interfaces(
    tc: &mut TcIngress,
    ebpf: &mut aya::Ebpf,
    node: Option<&LocalNode>,
    watch: &mut IcmpWatch,
    now_ns: u64,
) -> bool {
    sync_tc_from(tc, ebpf, node);
    let any = tc.attached_any();
    if any {
        watch.attached(now_ns);
    }
    any
}

/// Attaches TC ingress to the agent's namespace's interfaces as they come and go, except
/// the pods' veths, where it would run on every packet a pod sends: ICMP errors from
/// outside the node arrive on the underlay and the overlay, and the IPv4 ones a pod's
/// namespace generates are seen where they are generated (`icmp_send`; an ICMPv6 error
/// between two pods of this node goes unseen).
fn sync_tc(tc: &mut TcIngress, ebpf: &mut aya::Ebpf) {
    match crate::host_network::links() {
        Ok(links) => {
            let pods = crate::host_network::pod_veths(&links).unwrap_or_else(|e| {
                warn!(error = %e, "cannot tell the pods' veths; TC ingress on them too");
                Default::default()
            });
            tc.sync(ebpf, &links, &pods);
        }
        Err(e) => warn!(error = %e, "cannot list interfaces; TC attachments unchanged"),
    }
}

/// [`sync_tc`] from a look at the node just taken for the scope, rather than a second
/// scan of every namespace; `None` (none was taken, or it failed): its own look.
fn sync_tc_from(tc: &mut TcIngress, ebpf: &mut aya::Ebpf, node: Option<&LocalNode>) {
    match node {
        Some(node) => tc.sync(ebpf, &node.links, &node.pod_veths),
        None => sync_tc(tc, ebpf),
    }
}

/// Destinations conntrack recently had no translation for: a storm of failures to one
/// destination asks conntrack once per [`Untranslated::TTL`], not once per connect.
#[derive(Default)]
struct Untranslated(std::collections::HashMap<SocketAddr, std::time::Instant>);

impl Untranslated {
    const TTL: Duration = Duration::from_secs(2);
    /// Bounds the memory a scan of many destinations can take.
    const MAX: usize = 4096;

    fn recently(&self, dst: SocketAddr) -> bool {
        self.0.get(&dst).is_some_and(|t| t.elapsed() < Self::TTL)
    }

    fn saw(&mut self, dst: SocketAddr) {
        if self.0.len() >= Self::MAX {
            self.0.retain(|_, t| t.elapsed() < Self::TTL);
            if self.0.len() >= Self::MAX {
                self.0.clear();
            }
        }
        self.0.insert(dst, std::time::Instant::now());
    }
}

/// How often kube-proxy's rules are re-read for Service names. kube-proxy itself
/// resyncs on change and at least every 30 s to an hour; a Service created since the
/// last read is named from the next one.
const SERVICES_REFRESH: Duration = Duration::from_secs(10);

/// The Service catalog from kube-proxy's rules in the agent's namespace: read once now
/// (so findings from the start can name Services), then every [`SERVICES_REFRESH`] on a
/// thread of its own, since reading runs `iptables-save`/`nft` and may take a moment.
fn watch_services() -> Arc<RwLock<ServiceCatalog>> {
    let mut watcher = CatalogWatcher::new();
    match watcher.refresh() {
        Ok(_) => {
            let read: Vec<String> = watcher
                .sources()
                .iter()
                .filter(|s| matches!(s.status, SourceStatus::Read { .. }))
                .map(|s| s.name.clone())
                .collect();
            info!(services = watcher.catalog().len(), from = ?read, "Service names from kube-proxy's rules");
        }
        Err(e) => warn!(error = %e, "no Service names: kube-proxy's rules cannot be read"),
    }
    let catalog = Arc::new(RwLock::new(watcher.catalog().clone()));
    let shared = Arc::clone(&catalog);
    let spawned = std::thread::Builder::new()
        .name("services".into())
        .spawn(move || {
            loop {
                std::thread::sleep(SERVICES_REFRESH);
                // Errors are logged by the watcher when what can be read changes.
                if watcher.refresh().is_ok() {
                    *shared.write().unwrap_or_else(PoisonError::into_inner) =
                        watcher.catalog().clone();
                }
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the Service catalog refresh: names stay as read at start");
    }
    catalog
}

/// Where this node's NAT sent the event's connection: conntrack's current entry, else
/// the translation the kernel hooks saw on its dropped or rejected packets (whose entry
/// was never confirmed, so conntrack has none); and the Service kube-proxy's rules name.
fn translate(
    ev: &Event,
    maps: &KernelMaps,
    services: &ServiceCatalog,
    untranslated: &mut Untranslated,
) -> Translation {
    let flow = &ev.flow;
    let addr = |b: &[u8; 16]| crate::findings::correlate::addr(flow, b);
    if flow.sport == 0 || flow.dport == 0 {
        return Translation::default();
    }
    let (src, dst) = (
        SocketAddr::new(addr(&flow.saddr), flow.sport),
        SocketAddr::new(addr(&flow.daddr), flow.dport),
    );
    let tracked = if untranslated.recently(dst) {
        None
    } else {
        match crate::host_network::conntrack::translated_destination(
            libc::IPPROTO_TCP as u8,
            src,
            dst,
        ) {
            Ok(found) => found,
            Err(e) => {
                debug!(error = %e, %src, %dst, "conntrack lookup failed");
                None
            }
        }
    };
    if tracked.is_none() {
        untranslated.saw(dst);
    }
    let backend = tracked.or_else(|| {
        maps.nat(flow).map(|n| {
            SocketAddr::new(
                crate::findings::correlate::addr(flow, &n.backend),
                n.backend_port,
            )
        })
    });
    let tcp = crate::services::IPPROTO_TCP;
    let service = services
        .by_frontend(dst.ip(), tcp, dst.port())
        .or_else(|| backend.and_then(|b| services.by_backend(b.ip(), tcp, b.port())));
    let Some(service) = service else {
        return Translation {
            backend,
            ..Translation::default()
        };
    };
    // Conntrack forgets an entry whose only answer was a RST: with one endpoint the
    // backend is still certain, with several only the candidates are.
    let (backend, candidates) = match (backend, service.backends.as_slice()) {
        (Some(b), _) => (Some(b), Vec::new()),
        (None, [only]) => (Some(*only), Vec::new()),
        (None, several) => (None, several.to_vec()),
    };
    Translation {
        backend,
        candidates,
        service: Some(service.name.clone()),
        no_endpoints: service.no_endpoints,
    }
}

/// Whether a flow finding is about `key`.
fn flow_matches(f: &Finding, key: &FlowKey) -> bool {
    let addr = |b: &[u8; 16]| crate::findings::correlate::addr(key, b);
    f.src == Some(addr(&key.saddr)) && f.dst == Some(addr(&key.daddr)) && f.dport == Some(key.dport)
}

/// Refreshes the scope (unless every namespace is watched) and reads the conntrack
/// counters of the namespaces in it; without a scope, the counters wait. Returns the
/// look at the node the scope came from.
fn refresh_namespaces(
    maps: &mut KernelMaps,
    conntrack: &mut ConntrackWatch,
    all_netns: bool,
) -> Option<LocalNode> {
    if all_netns {
        conntrack.refresh(None);
        return None;
    }
    let node = refresh_scope(maps)?;
    conntrack.refresh(Some(&node.scope));
    Some(node)
}

/// Makes the kernel's scope map this node's current set of network namespaces, and
/// returns the look at the node it came from; on a netlink failure the previous scope
/// stays (`None`).
fn refresh_scope(maps: &mut KernelMaps) -> Option<LocalNode> {
    match crate::host_network::local_node() {
        Ok(node) => {
            maps.set_scope(&node.scope);
            Some(node)
        }
        Err(e) => {
            warn!(error = %e, "cannot list this node's network namespaces; keeping the previous scope");
            None
        }
    }
}
