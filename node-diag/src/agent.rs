//! `node-diag run`: loads the programs, drains verdict events into the correlator,
//! aggregates findings, keeps metrics in step with the kernel counters, serves HTTP, and
//! shuts down cleanly on SIGINT/SIGTERM (dropping the `Ebpf` detaches every link).

use std::{
    io::Write as _,
    net::SocketAddr,
    os::unix::fs::MetadataExt as _,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use node_diag_common::FlowKey;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc,
};
use tracing::{info, warn};

use crate::{
    OutputFormat, caps,
    correlate::{Context, correlate},
    findings::{Finding, Kind, Store},
    kernel::{KernelMaps, MapMissing},
    loader::{self, LoadError},
    metrics::Metrics,
    tc::TcIngress,
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
}

/// State shared between the event loop and the HTTP handlers.
pub struct Shared {
    pub metrics: Mutex<Metrics>,
    pub store: Mutex<Store>,
    pub ready: AtomicBool,
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
    let mut loaded = loader::load(&loader::Options {
        syn_retrans_threshold: opts.syn_retries,
        scoped: !opts.all_netns,
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

    let (ring, mut maps) = KernelMaps::take(&mut loaded.ebpf)?;
    if !opts.all_netns {
        maps.refresh_scope();
    }
    let mut tc = match TcIngress::load(&mut loaded.ebpf) {
        Ok(tc) => Some(tc),
        Err(e) => {
            warn!(error = %e, "TC ingress unavailable: frag-needed received is not seen");
            None
        }
    };
    if let Some(tc) = tc.as_mut() {
        sync_tc(tc, &mut loaded.ebpf, &mut maps);
    }

    let shared = Arc::new(Shared {
        metrics: Mutex::new(Metrics::new()),
        store: Mutex::new(Store::new(opts.repeat_interval, MAX_FINDINGS)),
        ready: AtomicBool::new(false),
    });

    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|source| AgentError::Listen {
            addr: opts.listen,
            source,
        })?;
    let local = listener.local_addr()?;
    let server = tokio::spawn({
        let app = crate::http::router(shared.clone());
        async move {
            if let Err(e) = axum::serve(listener, app).await {
                warn!(error = %e, "HTTP server stopped");
            }
        }
    });

    let (tx, mut rx) = mpsc::unbounded_channel();
    let bad_records = Arc::new(AtomicU64::new(0));
    let drainer = tokio::spawn(crate::events::drain(ring, tx, bad_records.clone()));

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;

    refresh_mtu(&shared, opts.format).await;

    if let Some(path) = &opts.ready_file {
        std::fs::write(path, format!("{local}\n")).map_err(|source| AgentError::ReadyFile {
            path: path.clone(),
            source,
        })?;
    }
    shared.ready.store(true, Ordering::Relaxed);
    info!(listen = %local, "ready");

    let own_netns = std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino() as u32)
        .unwrap_or(0);
    let ifname =
        move |netns: u32, ifindex: u32| (netns == own_netns).then(|| if_name(ifindex)).flatten();
    let reasons = loaded.drop_reasons.clone();
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
                let ctx = Context { drop_reasons: &reasons, now: SystemTime::now(), ifname: &ifname };
                if let Some(finding) = correlate(&ev, &ctx) {
                    shared.metrics.lock().unwrap_or_else(|e| e.into_inner()).finding(&finding);
                    let printed = shared.store.lock().unwrap_or_else(|e| e.into_inner()).record(finding, Instant::now());
                    if let Some(f) = printed {
                        print_finding(&f, opts.format);
                    }
                }
            }
            _ = tick.tick() => {
                let totals = maps.totals(&reasons, &ifname, bad_records.load(Ordering::Relaxed));
                let blackholes = maps.active_blackholes();
                let mut metrics = shared.metrics.lock().unwrap_or_else(|e| e.into_inner());
                metrics.sync_kernel(totals);
                metrics.set_blackholes(blackholes.len());
                drop(metrics);
                let resolved = shared.store.lock().unwrap_or_else(|e| e.into_inner()).resolve(
                    |f| f.kind == Kind::PmtudBlackhole && !blackholes.iter().any(|k| flow_matches(f, k)),
                    SystemTime::now(),
                );
                for f in resolved {
                    print_finding(&f, opts.format);
                }
            }
            _ = mtu_tick.tick() => refresh_mtu(&shared, opts.format).await,
            changed = next_change(&mut link_changes) => {
                if changed.is_none() {
                    warn!("link notifications stopped: MTU changes are picked up every {}s", MTU_REFRESH.as_secs());
                    link_changes = None;
                    continue;
                }
                refresh_mtu(&shared, opts.format).await;
                if let Some(tc) = tc.as_mut() {
                    sync_tc(tc, &mut loaded.ebpf, &mut maps);
                }
            }
            _ = refresh_tick.tick() => {
                if !opts.all_netns {
                    maps.refresh_scope();
                }
                if let Some(tc) = tc.as_mut() {
                    sync_tc(tc, &mut loaded.ebpf, &mut maps);
                }
            }
            _ = sigterm.recv() => { info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { info!("SIGINT: shutting down"); break; }
        }
    }

    shared.ready.store(false, Ordering::Relaxed);
    for f in shared
        .store
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unprinted()
    {
        print_finding(&f, opts.format);
    }
    drainer.abort();
    server.abort();
    if let Some(path) = &opts.ready_file {
        let _ = std::fs::remove_file(path);
    }
    // Dropping the Ebpf detaches every tracepoint link and unloads the programs.
    drop(loaded);
    Ok(())
}

/// Waits for the next link notification; never, without a watcher.
async fn next_change(rx: &mut Option<tokio::sync::mpsc::Receiver<()>>) -> Option<()> {
    match rx.as_mut() {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Rebuilds the MTU model from netlink: gauges, and the overlay_mtu_mismatch and
/// pmtud_disabled conditions (new ones printed, gone ones resolved).
async fn refresh_mtu(shared: &Shared, format: OutputFormat) {
    let snapshot = match tokio::task::spawn_blocking(crate::host_network::snapshot).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            warn!(error = %e, "cannot read this node's interfaces; MTU model unchanged");
            return;
        }
        Err(e) => {
            warn!(error = %e, "MTU snapshot task failed");
            return;
        }
    };
    let now = SystemTime::now();
    let model = crate::mtu::Model::from(&snapshot);
    shared
        .metrics
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .set_mtu_model(&model.gauges());
    let findings = model.findings(now);
    let printed = shared
        .store
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .sync_conditions(
            &[Kind::OverlayMtuMismatch, Kind::PmtudDisabled],
            findings,
            now,
            Instant::now(),
        );
    let metrics = shared.metrics.lock().unwrap_or_else(|e| e.into_inner());
    for f in &printed {
        if f.status == crate::findings::Status::Active {
            metrics.finding(f);
        }
        print_finding(f, format);
    }
}

/// Attaches TC ingress to the agent's namespace's interfaces as they come and go.
fn sync_tc(tc: &mut TcIngress, ebpf: &mut aya::Ebpf, maps: &mut KernelMaps) {
    match crate::host_network::links() {
        Ok(links) => tc.sync(ebpf, &links, &mut maps.l3_offset),
        Err(e) => warn!(error = %e, "cannot list interfaces; TC attachments unchanged"),
    }
}

/// Whether a flow finding is about `key`.
fn flow_matches(f: &Finding, key: &FlowKey) -> bool {
    let addr = |b: &[u8; 16]| crate::correlate::addr(key, b).to_string();
    f.src.as_deref() == Some(addr(&key.saddr).as_str())
        && f.dst.as_deref() == Some(addr(&key.daddr).as_str())
        && f.dport == Some(key.dport)
}

fn print_finding(f: &Finding, format: OutputFormat) {
    let line = match format {
        OutputFormat::Json => serde_json::to_string(f).unwrap_or_default(),
        OutputFormat::Text => f.one_line(),
    };
    let mut out = std::io::stdout().lock();
    // A closed stdout must not stop the agent: findings stay on /findings.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn if_name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}
