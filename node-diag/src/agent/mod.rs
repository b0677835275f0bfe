//! `node-diag run`: loads the programs, drains verdict events into the correlator,
//! aggregates findings, keeps metrics in step with the kernel counters, serves HTTP, and
//! shuts down cleanly on SIGINT/SIGTERM (TC attachments are detached and the `clsact`
//! qdiscs the agent owns deleted, see `kernel::tc`; dropping the `Ebpf` detaches every
//! other link).
//!
//! [`Agent`] holds what the loop owns, with one method per event source: a kernel
//! event, the counters' tick, a link notification, the scope refresh, the MTU refresh.
//!
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

/// `node-diag run`'s options, as the command line gives them.
#[derive(clap::Args)]
pub(crate) struct RunOptions {
    /// Address of the scrape listener: /metrics, /healthz, /readyz (and /findings only
    /// over TLS with client certificates verified, see --web-config-file).
    #[arg(long, default_value = "127.0.0.1:9464", value_name = "ADDR")]
    listen: SocketAddr,
    /// Address of the findings listener (/findings, /healthz, /readyz), loopback by
    /// default: the findings name pods, Services and their addresses. `none` serves no
    /// findings listener.
    #[arg(long, default_value = "127.0.0.1:9465", value_name = "ADDR|none", value_parser = parse_findings_listen)]
    findings_listen: FindingsListen,
    /// Web config of the scrape listener in Prometheus exporter-toolkit's format
    /// (tls_server_config, basic_auth_users, http_server_config.headers), re-read when it
    /// or the files it names change.
    #[arg(long, value_name = "PATH")]
    web_config_file: Option<PathBuf>,
    /// Web config of the findings listener, same format; without it that listener
    /// speaks plain HTTP (loopback by default, where the probes and `node-diag findings`
    /// reach it).
    #[arg(long, value_name = "PATH")]
    findings_web_config_file: Option<PathBuf>,
    /// Time a client has to send a request head (from its connection, or from the
    /// previous answer on a kept-alive connection) and to finish a TLS handshake.
    #[arg(long, default_value = "10s", value_parser = parse_timeout, value_name = "DURATION")]
    http_header_timeout: Duration,
    /// A connection that moves no byte either way for this long is closed (e.g. a client
    /// that stopped reading its answer).
    #[arg(long, default_value = "60s", value_parser = parse_timeout, value_name = "DURATION")]
    http_idle_timeout: Duration,
    /// Connections open at once on each listener; more are closed as soon as accepted
    /// (counted in node_diag_http_connections_rejected_total).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536), value_name = "N")]
    http_max_connections: u32,
    /// Output format of findings on stdout.
    #[arg(short = 'o', long = "format", value_enum, default_value = "text")]
    format: OutputFormat,
    /// File written once every program is attached and the HTTP endpoints are up (the
    /// scrape listener's address on its first line, the findings listener's on the
    /// second when there is one); removed on exit.
    #[arg(long, value_name = "PATH")]
    ready_file: Option<PathBuf>,
    /// SYN retransmits after which a connect is reported as timing out (2 ≈ 3 s).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=10), value_name = "N")]
    syn_retries: u32,
    /// Report for every network namespace on this kernel. By default the agent reports for
    /// its own namespace and the pod namespaces attached to it by veth.
    #[arg(long)]
    all_netns: bool,
    /// Minimum seconds between repeated prints of the same aggregated finding.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    repeat_interval: u64,
    /// Log level of the eBPF programs themselves, forwarded to stderr under the target
    /// node_diag::ebpf (whatever --log-level says). They log only verdicts and lost
    /// events. `off` leaves the log calls out of the verified programs entirely.
    #[arg(long, value_enum, default_value = "off", value_name = "LEVEL")]
    pub(crate) ebpf_log: crate::kernel::ebpf_log::Level,
    /// How the TC ingress classifier is attached: `auto` uses TCX where the kernel has it
    /// (6.6+) and a netlink filter under a clsact qdisc elsewhere; `netlink` always uses
    /// the latter (the pre-6.6 path, to test it, or where TCX misbehaves).
    #[arg(long, value_enum, default_value = "auto", value_name = "MODE")]
    tc_attach: tc::AttachMode,
    /// When ICMP errors arriving from the network (frag-needed, unreachable, prohibited)
    /// are watched, by the TC ingress classifier. `on-trouble` attaches it once something
    /// shows trouble ICMP could explain (a failed connect other than a plain refusal, SYN
    /// or full-size retransmits, oversize drops) and detaches it after --icmp-watch-hold
    /// quiet seconds: no per-packet cost on a healthy node, but the first error of an
    /// episode goes unseen (its finding says so). `always` keeps it attached.
    #[arg(long, value_enum, default_value = "on-trouble", value_name = "WHEN")]
    icmp_watch: icmp_watch::Mode,
    /// With --icmp-watch on-trouble: seconds the classifier stays attached after the last
    /// trouble.
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..=86_400), value_name = "SECONDS")]
    icmp_watch_hold: u64,
    /// The container runtime's CRI socket, to name the pods of findings. By default the
    /// first of /run/containerd/containerd.sock and /var/run/crio/crio.sock that is a socket.
    /// Without one, findings carry network namespaces and addresses only.
    #[arg(long, value_name = "PATH")]
    cri_socket: Option<PathBuf>,
    /// Seconds between two probe runs of one peer's path, and so between the probes of
    /// an open path black hole's path that can resolve it. Hidden: the default fits
    /// production; tests shorten it to see a healed path resolve within their time.
    #[arg(long, hide = true, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600), value_name = "SECONDS")]
    path_probe_window: u64,
    /// This node's name, carried by every finding (`node`). The DaemonSet sets NODE_NAME
    /// from the downward API (`spec.nodeName`); without either, the hostname.
    #[arg(long, env = "NODE_NAME", hide_env_values = true, value_name = "NAME")]
    node_name: Option<String>,
}

/// `--node-name` when given (and not blank), else the hostname.
fn node_name(given: Option<&str>) -> String {
    given.map(str::trim).filter(|n| !n.is_empty()).map_or_else(
        || {
            rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned()
        },
        str::to_owned,
    )
}

/// The listeners' web configs as read at start.
struct WebConfigs {
    scrape: Option<(PathBuf, serve::web_config::Loaded)>,
    findings: Option<(PathBuf, serve::web_config::Loaded)>,
}

/// Reads a web config given on the command line; its warnings logged.
fn load_web_config(
    path: Option<&Path>,
) -> Result<Option<(PathBuf, serve::web_config::Loaded)>, AgentError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let loaded = serve::web_config::load(path)?;
    for w in &loaded.warnings {
        warn!(file = %path.display(), "web config: {w}");
    }
    Ok(Some((path.to_owned(), loaded)))
}

/// Each listener's connection cap: `--http-max-connections`, but no more than its
/// share of the files HTTP may hold ([`fds::connection_budget`]), so that connections
/// on every listener together never take the files the agent's own work needs.
fn connection_cap(flag: u32, budget: u64, listeners: usize) -> usize {
    let share = budget / (listeners.max(1) as u64);
    usize::try_from(share.min(u64::from(flag)))
        .unwrap_or(usize::MAX)
        .max(1)
}

/// `--findings-listen`: an address, or none.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FindingsListen(Option<SocketAddr>);

fn parse_findings_listen(s: &str) -> Result<FindingsListen, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(FindingsListen(None));
    }
    s.parse()
        .map(|a| FindingsListen(Some(a)))
        .map_err(|e| format!("{e}: expected ADDR:PORT (e.g. 127.0.0.1:9465) or none"))
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 10s, 500ms, 1m)"))?;
    if d.is_zero() {
        return Err("must be above zero".into());
    }
    Ok(d)
}

const MAX_FINDINGS: usize = 4096;
/// How often the conntrack counters are read, held stalls and black holes looked at
/// again, and the agent's own health checked; also how often the scope is refreshed
/// where link notifications cannot be had.
const REFRESH: Duration = Duration::from_secs(2);
/// How often the scope (the pods' namespaces and interfaces) is refreshed without a link
/// notification: they drive it, this is the safety net for notifications lost (a full
/// socket buffer is seen and handled as a change; this covers the rest).
const SCOPE_NET: Duration = Duration::from_secs(60);
/// The scope is refreshed at most this often on link notifications (bursts coalesce):
/// the first after a quiet spell at once, so a new pod's namespace is in before its
/// first connect; a node churning interfaces gets a refresh (a look at its links) at
/// most four times a second.
const SCOPE_SPACING: Duration = Duration::from_millis(250);
/// A burst's second scope refresh comes once its notifications paused this long (see
/// [`Coalesce::with_quiet`]).
const SCOPE_QUIET: Duration = Duration::from_millis(5);
/// The MTU model (which reads every pod's namespace) at most this often on them: a node
/// replacing a pod every 2 s is read whole once per replacement, not twice.
const MTU_SPACING: Duration = Duration::from_secs(2);
/// How often the MTU model is rebuilt without a link notification (pod namespaces
/// change without one in the agent's namespace).
const MTU_REFRESH: Duration = Duration::from_secs(10);

pub(crate) async fn run(opts: RunOptions) -> Result<(), AgentError> {
    let missing = caps::missing_for_agent(caps::effective());
    if !missing.is_empty() {
        return Err(AgentError::Privileges(missing.join(", ")));
    }
    // Before anything opens files: a runtime's default soft limit (1,024) is a port
    // scan's worth of idle connections.
    let limits = fds::raise_limit();
    info!(
        soft = limits.soft,
        hard = limits.hard,
        http_connection_budget = fds::connection_budget(),
        reserve = fds::RESERVE,
        "open-files limit"
    );
    // Subscribed before the agent takes its first look at the node and says it is ready:
    // a pod whose veth appears in between is then refreshed into the scope at the loop's
    // first turn, not 60 s later, and its first connect is judged.
    let link_changes = crate::host_network::watch();
    let (mut agent, mut events) = Agent::start(opts).await?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut refresh_tick = tokio::time::interval(REFRESH);
    refresh_tick.tick().await;
    let mut mtu_tick = tokio::time::interval(MTU_REFRESH);
    mtu_tick.tick().await;
    let mut link_changes = match link_changes {
        Ok(watch) => {
            agent.links = watch.links;
            Some(watch.changes)
        }
        Err(e) => {
            warn!(error = %e, "no link notifications: the scope is refreshed every {}s, MTU changes picked up every {}s", REFRESH.as_secs(), MTU_REFRESH.as_secs());
            None
        }
    };
    let mut scope_tick = scope_interval(link_changes.is_some()).await;
    let mut scope_due = Coalesce::with_quiet(SCOPE_SPACING, SCOPE_QUIET);
    let mut mtu_due = Coalesce::new(MTU_SPACING);
    loop {
        tokio::select! {
            ev = events.recv() => {
                let Some((kind, ev)) = ev else {
                    warn!("event stream ended");
                    break;
                };
                agent.on_event(kind, ev).await;
            }
            _ = tick.tick() => {
                agent.on_tick(!events.is_empty());
                agent.confirm_shrinks().await;
            }
            _ = mtu_tick.tick() => {
                agent.refresh_mtu(PodReads::Fresh).await;
                mtu_due.done(Instant::now());
            }
            changed = next_change(&mut link_changes) => {
                if changed.is_none() {
                    warn!("link notifications stopped: the scope is refreshed every {}s, MTU changes picked up every {}s", REFRESH.as_secs(), MTU_REFRESH.as_secs());
                    link_changes = None;
                    agent.links = None;
                    scope_tick = scope_interval(false).await;
                    continue;
                }
                scope_due.changed(Instant::now());
                mtu_due.changed(Instant::now());
            }
            () = coalesce::until(scope_due.due()) => {
                agent.on_scope();
                scope_due.done(Instant::now());
            }
            () = coalesce::until(mtu_due.due()) => {
                // The same notification made both due: the scope first, as the MTU model
                // enters every pod's namespace (long on a busy node) and a new pod's
                // first connect is tracked only once its namespace is in scope.
                if scope_due.due().is_some_and(|due| due <= Instant::now()) {
                    agent.on_scope();
                    scope_due.done(Instant::now());
                }
                agent.refresh_mtu(PodReads::Reuse).await;
                mtu_due.done(Instant::now());
            }
            _ = scope_tick.tick() => {
                // The safety net dumps the links again, whatever the notifications said.
                if let Some(links) = &agent.links {
                    crate::host_network::mark_stale(links);
                }
                agent.on_scope();
                scope_due.done(Instant::now());
            }
            _ = refresh_tick.tick() => {
                agent.on_refresh();
                agent.recheck_stalls().await;
                agent.ask_blackholes().await;
                agent.reprobe_path_blackholes();
            }
            done = agent.path_probes.next() => agent.on_path_probe(done),
            done = agent.rules.next() => agent.on_rule(done),
            _ = sigterm.recv() => { info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { info!("SIGINT: shutting down"); break; }
        }
    }
    agent.shutdown();
    Ok(())
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
    /// Loads and attaches the programs, binds the listener, starts the HTTP server and
    /// the ring buffer's drain, and writes the ready file: from its return on, the
    /// agent is ready and its events arrive on the receiver.
    async fn start(
        opts: RunOptions,
    ) -> Result<(Self, mpsc::Receiver<(EventKind, Event)>), AgentError> {
        // Before anything is loaded: a bad web config is the operator's to fix first.
        let web = WebConfigs {
            scrape: load_web_config(opts.web_config_file.as_deref())?,
            findings: load_web_config(opts.findings_web_config_file.as_deref())?,
        };
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
        let (ring, maps) = KernelMaps::take(&mut loaded.ebpf, loaded.drop_reasons.slots())?;
        // Bound before TC is attached: a second agent in this namespace (the listen
        // address taken) fails here, before it could mistake the first one's filters
        // for leftovers.
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .map_err(|source| AgentError::Listen {
                flag: "--listen",
                addr: opts.listen,
                source,
            })?;
        let local = listener.local_addr()?;
        let findings_listener =
            match opts.findings_listen.0 {
                Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(
                    |source| AgentError::Listen {
                        flag: "--findings-listen",
                        addr,
                        source,
                    },
                )?),
                None => None,
            };
        let findings_local = match &findings_listener {
            Some(l) => Some(l.local_addr()?),
            None => None,
        };
        let tc = match TcIngress::load(&mut loaded.ebpf, opts.tc_attach) {
            Ok(tc) => Some(tc),
            Err(e) => {
                warn!(error = %e, "TC ingress unavailable: frag-needed received is not seen");
                None
            }
        };
        let watch = IcmpWatch::new(
            opts.icmp_watch,
            Duration::from_secs(opts.icmp_watch_hold),
            loaded_ns,
        );
        let shared = Arc::new(Shared::new(
            Metrics::new(),
            Store::new(Duration::from_secs(opts.repeat_interval), MAX_FINDINGS)
                .on_node(node_name(opts.node_name.as_deref())),
        ));
        let names = Names::for_this_node(loaded.drop_reasons.clone());
        let service_failures = shared.metrics().service_rules_failures();
        let service_count = shared.metrics().services();
        let mut agent = Self {
            loaded,
            maps,
            conntrack: ConntrackWatch::default(),
            tc,
            watch,
            shared,
            pods: crate::pods::watch(opts.cri_socket.clone()).await,
            pods_named: 0,
            translator: Translator::start(service_failures, service_count),
            drop_sites: drop_sites::DropSites::default(),
            names,
            ephemeral_ports: crate::host_network::local_port_range(),
            own: own_endpoints::OwnEndpoints::new(
                crate::host_network::conntrack_stats::own_netns(),
                std::iter::once(local).chain(findings_local).collect(),
            ),
            verdicts: verdicts::VerdictTracker::default(),
            scope_looked_ns: 0,
            inbound: inbound::InboundTracker::default(),
            blackholes: BlackholeWatch::default(),
            stalls: blackholes::StallRecheck::default(),
            shrinks: blackholes::ShrinkConfirm::default(),
            path_probes: path_probe::PathProbes::new(path_probe::Limits {
                window: Duration::from_secs(opts.path_probe_window),
                ..Default::default()
            }),
            rules: rule_watch::RuleWatch::start(),
            bad_records: Arc::new(AtomicU64::new(0)),
            tasks: Vec::new(),
            links: None,
            opts,
        };
        let node = agent.refresh_namespaces();
        agent.start_tc(node.as_ref(), loaded_ns);
        // The first conntrack readings, and the first look at the agent's health.
        agent.on_refresh();
        // Stale from here on: the loop takes a fresh look every refresh.
        drop(node);

        agent.serve(listener, findings_listener, web);
        let (tx, rx) = mpsc::channel(crate::kernel::ring::QUEUE);
        let drain = crate::kernel::ring::drain(ring, tx, agent.bad_records.clone());
        agent.tasks.push(tokio::spawn(async move {
            if let Err(e) = drain.await {
                warn!(error = %e, "ring buffer drain stopped");
            }
        }));
        if let Some(logs) = agent.loaded.ebpf_log.take() {
            agent.tasks.push(tokio::spawn(async {
                if let Err(e) = crate::kernel::ebpf_log::drain(logs).await {
                    warn!(error = %e, "eBPF log stream stopped");
                }
            }));
        }
        agent.refresh_mtu(PodReads::Fresh).await;
        // Start-up's scratch (the kernel's BTF parsed, the programs' objects relocated
        // and verified) is freed by now; the pages it leaves free go back.
        allocator::release_free();
        if let Some(path) = &agent.opts.ready_file
            && let Err(source) = std::fs::write(
                path,
                match findings_local {
                    Some(findings) => format!("{local}\n{findings}\n"),
                    None => format!("{local}\n"),
                },
            )
        {
            let path = path.clone();
            agent.shutdown();
            return Err(AgentError::ReadyFile { path, source });
        }
        agent.shared.set_ready(true);
        match findings_local {
            Some(findings) => info!(listen = %local, findings_listen = %findings, "ready"),
            None => info!(listen = %local, "ready"),
        }
        Ok((agent, rx))
    }

    /// Serves the HTTP endpoints on the listeners (and keeps the web config, when there
    /// is one, in step with its files).
    fn serve(
        &mut self,
        scrape: tokio::net::TcpListener,
        findings: Option<tokio::net::TcpListener>,
        web: WebConfigs,
    ) {
        let shared = self.shared.clone();
        let names: &[&str] = if findings.is_some() {
            &["scrape", "findings"]
        } else {
            &["scrape"]
        };
        let metrics = shared.metrics().register_http(names);
        let mut listeners = vec![serve::Listener {
            name: "scrape",
            tcp: scrape,
            routes: serve::Routes::Scrape {
                plain: http::scrape_router(shared.clone(), false),
                with_findings: http::scrape_router(shared.clone(), true),
            },
            web: self.web_config("scrape", web.scrape, &metrics),
        }];
        if let Some(tcp) = findings {
            listeners.push(serve::Listener {
                name: "findings",
                tcp,
                routes: serve::Routes::Findings(http::findings_router(shared.clone())),
                web: self.web_config("findings", web.findings, &metrics),
            });
        }
        let max_connections = connection_cap(
            self.opts.http_max_connections,
            fds::connection_budget(),
            listeners.len(),
        );
        if max_connections < self.opts.http_max_connections as usize {
            warn!(
                flag = self.opts.http_max_connections,
                budget = fds::connection_budget(),
                listeners = listeners.len(),
                cap = max_connections,
                "HTTP connection cap lowered to the listeners' share of the open-files budget"
            );
        } else {
            info!(
                cap = max_connections,
                budget = fds::connection_budget(),
                "HTTP connection cap per listener"
            );
        }
        let limits = serve::Limits {
            header_timeout: self.opts.http_header_timeout,
            idle_timeout: self.opts.http_idle_timeout,
            max_connections,
        };
        self.tasks.push(serve::spawn(listeners, limits, metrics));
    }

    /// One listener's web config, kept in step with its files when it has one.
    fn web_config(
        &mut self,
        listener: &'static str,
        loaded: Option<(PathBuf, serve::web_config::Loaded)>,
        metrics: &HttpMetrics,
    ) -> serve::WebConfig {
        let Some((path, loaded)) = loaded else {
            return tokio::sync::watch::channel(Arc::new(serve::web_config::Active::default())).1;
        };
        let watch = serve::web_config::Watch::new(&path, &loaded);
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(loaded.active));
        let ok = metrics
            .web_config_ok
            .get_or_create(&ListenerLabel {
                listener: listener.to_owned(),
            })
            .clone();
        self.tasks.push(serve::spawn_reload(path, watch, tx, ok));
        rx
    }

    /// A kernel verdict: judged, its pods named, counted and recorded; a late success
    /// resolves the timeout it had been reported as, and a refusal or unreachable ending
    /// that attempt supersedes it.
    async fn on_event(&mut self, kind: EventKind, ev: Event) {
        debug!(
            ?kind,
            sport = ev.flow.sport,
            dport = ev.flow.dport,
            count = ev.count,
            len = ev.len,
            mtu = ev.mtu,
            "kernel event"
        );
        if kind == EventKind::InboundSynDropped {
            self.on_inbound(&ev);
            return;
        }
        if kind.is_connect() && !self.scope_admits(&ev) {
            return;
        }
        if self.own.owns(&ev) {
            // A connection one of the agent's own listeners accepted (a scraper or
            // `node-diag findings` resetting it, say): node-diag's, not the workload's.
            debug!(
                ?kind,
                sport = ev.flow.sport,
                dport = ev.flow.dport,
                "event on the agent's own listener ignored"
            );
            return;
        }
        if kind == EventKind::MssShrunk {
            let by = blackholes::shrunk_by(&ev).await;
            if by != ShrunkBy::MtuProbing {
                // A route or link MTU shrank it (or nothing nameable did): no black hole
                // was shown, and the stall stands as it was judged.
                info!(
                    ?by,
                    dport = ev.flow.dport,
                    "segment sent smaller, not by MTU probing: no black hole"
                );
                return;
            }
            // Judged once the smaller segment shows it got through (`confirm_shrinks`).
            self.shrinks.push(ev, Instant::now());
            return;
        }
        self.judge(kind, ev).await;
    }

    /// Whether a connect verdict's namespace is this node's. The programs track the
    /// connects of namespaces the agent has not looked at yet (a pod connecting the moment
    /// its veth appeared, before the refresh that veth set off), so one may not be: the
    /// node is looked at again unless a look since the verdict was stamped already
    /// answered, and a namespace still not in the scope is marked out of it in the
    /// kernel (its next connects untracked) and its verdict accounted as nobody's.
    fn scope_admits(&mut self, ev: &Event) -> bool {
        if self.maps.scope_has(ev.netns) != Some(false) {
            return true;
        }
        if self.scope_looked_ns < ev.ts_ns {
            self.on_scope();
        }
        if self.maps.scope_has(ev.netns) != Some(false) {
            return true;
        }
        debug!(
            netns = ev.netns,
            dport = ev.flow.dport,
            "connect verdict from a namespace not this node's; namespace marked out of scope"
        );
        self.maps.mark_out_of_scope(ev.netns);
        self.verdicts.event(ev, None);
        false
    }

    /// The segments sent smaller after a stall whose fate their sockets now show: those
    /// that got through judged as the black holes MTU probing masked, the others left
    /// the stalls they were.
    async fn confirm_shrinks(&mut self) {
        for shrink in self.shrinks.check().await {
            match shrink {
                Shrink::Through(ev) => self.judge(EventKind::MssShrunk, ev).await,
                Shrink::NotShown(ev, why) => info!(
                    dport = ev.flow.dport,
                    mss_before = ev.len,
                    mss_after = ev.mtu,
                    why,
                    "segment sent smaller by MTU probing, not shown to get through: the stall stands, no black hole"
                ),
            }
        }
    }

    /// Judges the kernel verdict `ev` (see [`Self::on_event`]).
    async fn judge(&mut self, kind: EventKind, ev: Event) {
        let translation = self.translator.translate(&ev, &self.maps).await;
        let drop_site = self.drop_site(kind, &ev, &translation).await;
        // Whether the evidence window was watched, before this event attaches anything.
        let icmp_watched = self.watch.covers(&ev);
        if self.watch.event(kind, &ev, Instant::now()) {
            self.start_icmp_watch("a verdict");
        }
        let ctx = Context {
            names: &self.names,
            now: SystemTime::now(),
            ephemeral_ports: self.ephemeral_ports.clone(),
            translation,
            conntrack: self.conntrack.window(&ev, &self.names),
            icmp_watched,
            drop_site,
        };
        let mut finding = correlate(kind, &ev, &ctx);
        if kind == EventKind::TcpStall && ev.mtu != 0 && ev.len >= ev.mtu {
            // A full-size segment: its MTU evidence may follow the retransmit the
            // programs judged it on (an agent started mid-stall sees none before).
            self.stalls.push(ev, Instant::now());
        }
        if let Some(f) = finding.as_mut() {
            f.name_pods(self.pods.current().name(&f.ends()));
        }
        // Before the verdict tracker keeps it as the template of later counts.
        let finding = finding.map(|f| self.path_probes.judge_cached(f));
        let made = finding.is_some();
        let finding = match self.verdicts.event(&ev, finding) {
            Some(mut finding) => {
                if let Some(cause) = finding.evidence.conntrack_cause() {
                    self.shared
                        .metrics()
                        .conntrack_drops(cause.as_str(), ev.drop.count);
                }
                let reason = self.names.drop_reason(ev.drop.reason);
                if finding.layer == Layer::Firewall
                    && let Some(program) = self.rules.program(&ev, &reason)
                {
                    finding.evidence.set_program(program);
                }
                self.rules.verdict(&finding, &ev, &reason);
                Some(finding)
            }
            None => None,
        };
        self.apply(ledger::verdict(kind, &ev, made, finding));
    }

    /// Carries out what the ledger decided for the findings held.
    fn apply(&self, effects: impl IntoIterator<Item = Effect>) {
        for effect in effects {
            match effect {
                Effect::Record(finding) => self.record(finding),
                Effect::Keep(finding) => self.keep(finding),
                Effect::End(which, status) => {
                    let ended =
                        self.shared
                            .store()
                            .end_as(status, |f| which.covers(f), SystemTime::now());
                    for f in ended {
                        print_finding(&f, self.opts.format);
                    }
                }
            }
        }
    }

    /// The first drop of an inbound key (a client elsewhere's SYN to a pod of this node,
    /// dropped here): its finding, unless a map read made it first; either way the
    /// rule behind it is followed from this SYN.
    fn on_inbound(&mut self, ev: &Event) {
        let (key, agg) = inbound_verdict::entry_of(ev);
        let reason = self.names.drop_reason(ev.drop.reason);
        if self.inbound.seen(&key, agg.first_ns) {
            if let Some(template) = self.inbound.template(&key).cloned() {
                self.rules.verdict(&template, ev, &reason);
            }
            return;
        }
        // Read now: the counters around the first drop tell a full table from a rule.
        let window = self.conntrack.window(ev, &self.names);
        let finding = self.inbound_finding(&key, &agg, ev, window.as_ref());
        if let Some(cause) = finding.evidence.conntrack_cause() {
            self.shared
                .metrics()
                .conntrack_drops(cause.as_str(), u32::try_from(agg.count).unwrap_or(u32::MAX));
        }
        self.rules.verdict(&finding, ev, &reason);
        self.inbound.start(key, &agg, &finding);
        self.record(finding);
    }

    /// The finding of an inbound entry, its pods, Service and program named.
    fn inbound_finding(
        &mut self,
        key: &node_diag_common::InboundKey,
        agg: &node_diag_common::InboundAgg,
        ev: &Event,
        window: Option<&crate::findings::conntrack::Window>,
    ) -> Finding {
        let mut f =
            inbound_verdict::finding(key, agg, agg.count, &self.names, SystemTime::now(), window);
        let (client, pod) = (inbound_verdict::client(key), inbound_verdict::pod_addr(key));
        let pods = self.pods.current();
        // The local side is the pod the SYN was going to. A client pod of this node is
        // rare here (its own SYN from its veth is left to its connect's verdict): one
        // whose SYN came back in from elsewhere, routed through another node unSNATed.
        f.pod = pods
            .by_netns
            .get(&key.netns)
            .or_else(|| pods.by_ip.get(&pod))
            .cloned();
        f.peer_pod = pods.by_ip.get(&client).cloned();
        f.service = self.translator.service_of_backend(pod, key.dport);
        let reason = self.names.drop_reason(key.reason);
        if let Some(program) = self.rules.program(ev, &reason) {
            f.evidence.set_program(program);
        }
        f
    }

    /// Every tick: what the inbound entries counted since the last read, the entries no
    /// event announced, and the idle ones deleted with their last counts.
    fn read_inbound(&mut self, stamp: &str) {
        let (entries, now_ns) = self.maps.inbound_counts();
        let read = self.inbound.read(&entries, now_ns, stamp);
        for (key, agg, finding) in read.grown {
            // A later drop (a retransmit, or the client's next attempt from another
            // port): the rule read it may call for compares against the baseline.
            let mut ev = inbound_verdict::event_of(&key, &agg);
            ev.drop.last_ns = agg.last_ns;
            let reason = self.names.drop_reason(key.reason);
            self.rules.verdict(&finding, &ev, &reason);
            if let Some(cause) = finding.evidence.conntrack_cause() {
                self.shared.metrics().conntrack_drops(
                    cause.as_str(),
                    u32::try_from(finding.count).unwrap_or(u32::MAX),
                );
            }
            self.record(finding);
        }
        for (key, agg) in read.new {
            let ev = inbound_verdict::event_of(&key, &agg);
            let window = self.conntrack.window(&ev, &self.names);
            let finding = self.inbound_finding(&key, &agg, &ev, window.as_ref());
            if let Some(cause) = finding.evidence.conntrack_cause() {
                self.shared.metrics().conntrack_drops(
                    cause.as_str(),
                    u32::try_from(finding.count).unwrap_or(u32::MAX),
                );
            }
            let reason = self.names.drop_reason(key.reason);
            self.rules.verdict(&finding, &ev, &reason);
            self.inbound.start(key, &agg, &finding);
            self.record(finding);
        }
        for key in read.idle {
            let last = self.maps.take_inbound(&key);
            if let Some(finding) = self.inbound.taken(&key, last, stamp) {
                self.record(finding);
            }
        }
    }

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

    /// Counts a finding in the metrics and the store, and prints it when the store says
    /// so. A finding with `count` 0 (an event whose verdicts a map read already
    /// accounted) only refreshes a finding the store holds.
    fn record(&self, finding: Finding) {
        if finding.count == 0 && !self.shared.store().contains(&finding) {
            return;
        }
        self.shared.metrics().finding(&finding);
        self.keep(finding);
    }

    /// Stores and prints a finding without counting it in `node_diag_findings_total`
    /// (the verdict superseding a timeout: its attempt was counted as that timeout).
    fn keep(&self, finding: Finding) {
        let printed = self.shared.store().record(finding, Instant::now());
        if let Some(f) = printed {
            print_finding(&f, self.opts.format);
        }
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

/// The scope's periodic refresh: the safety net with link notifications, else every
/// [`REFRESH`]; its first tick (at once) taken.
async fn scope_interval(notified: bool) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(if notified { SCOPE_NET } else { REFRESH });
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    tick
}

/// Waits for the next link notification; never, without a watcher.
async fn next_change(rx: &mut Option<tokio::sync::mpsc::Receiver<()>>) -> Option<()> {
    match rx.as_mut() {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
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

#[cfg(test)]
mod tests {
    use super::{connection_cap, node_name};

    #[test]
    fn the_connection_cap_stays_within_the_open_files_budget() {
        // A raised limit: the flag decides.
        assert_eq!(connection_cap(256, (1 << 20) - 256, 2), 256);
        // A hard limit of 1,024 (budget 768): each of two listeners gets its half.
        assert_eq!(connection_cap(1000, 768, 2), 384);
        assert_eq!(connection_cap(1000, 768, 1), 768);
        assert_eq!(connection_cap(256, 768, 2), 256);
        assert_eq!(connection_cap(256, 16, 2), 8);
        assert_eq!(connection_cap(256, 0, 2), 1, "never none at all");
    }

    #[test]
    fn the_node_name_is_the_flag_else_the_hostname() {
        assert_eq!(node_name(Some(" worker-1 ")), "worker-1");
        let host = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        assert_eq!(node_name(None), host);
        assert_eq!(node_name(Some("  ")), host, "blank is not a name");
    }
}
