//! The Service and NAT behind a verdict's destination: kube-proxy's rules followed by
//! change on a thread of their own (running `iptables-save`/`nft` may take a moment), conntrack
//! asked off the event loop, the kernel's NAT map for translations conntrack never
//! confirmed.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, PoisonError, RwLock},
    time::{Duration, Instant},
};

use node_diag_common::{Event, ipproto};
use prometheus_client::metrics::{counter::Counter, gauge::Gauge};
use tracing::{debug, info, warn};

use crate::{
    findings::correlate::{Translation, addr},
    kernel::maps::KernelMaps,
    services::{Follower, ServiceCatalog, SourceStatus},
};

/// Finds the Service and NAT behind verdicts' destinations.
pub(super) struct Translator {
    /// Swapped whole on a change: a verdict's lookup holds the lock for a pointer copy.
    services: Arc<RwLock<Arc<ServiceCatalog>>>,
    untranslated: Untranslated,
}

impl Translator {
    /// Reads kube-proxy's rules once now (so findings from the start can name Services),
    /// then follows their changes on a thread of its own. `failures` counts the reads
    /// that failed, `size` holds the number of Service ports.
    pub(super) fn start(failures: Counter, size: Gauge) -> Self {
        Self {
            services: watch_services(failures, size),
            untranslated: Untranslated::default(),
        }
    }

    /// Where this node's NAT sent the event's connection: conntrack's current entry,
    /// else the translation the kernel hooks saw on its dropped or rejected packets
    /// (whose entry was never confirmed, so conntrack has none); and the Service
    /// kube-proxy's rules name.
    pub(super) async fn translate(&mut self, ev: &Event, maps: &KernelMaps) -> Translation {
        let flow = &ev.flow;
        if flow.sport == 0 || flow.dport == 0 {
            return Translation::default();
        }
        let (src, dst) = (
            SocketAddr::new(addr(flow, &flow.saddr), flow.sport),
            SocketAddr::new(addr(flow, &flow.daddr), flow.dport),
        );
        let tracked = if self.untranslated.recently(dst) {
            None
        } else {
            // A netlink round trip: off the event loop, which the HTTP server shares.
            let lookup = tokio::task::spawn_blocking(move || {
                crate::host_network::conntrack::translated_destination(ipproto::TCP, src, dst)
            });
            match lookup.await {
                Ok(Ok(found)) => found,
                Ok(Err(e)) => {
                    debug!(error = %e, %src, %dst, "conntrack lookup failed");
                    None
                }
                Err(e) => {
                    debug!(error = %e, %src, %dst, "conntrack lookup task failed");
                    None
                }
            }
        };
        if tracked.is_none() {
            self.untranslated.saw(dst);
        }
        let backend = tracked.or_else(|| {
            maps.nat(flow)
                .map(|n| SocketAddr::new(addr(flow, &n.backend), n.backend_port))
        });
        let services = Arc::clone(&self.services.read().unwrap_or_else(PoisonError::into_inner));
        let service = services
            .by_frontend(dst.ip(), ipproto::TCP, dst.port())
            .or_else(|| backend.and_then(|b| services.by_backend(b.ip(), ipproto::TCP, b.port())));
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
}

impl Translator {
    /// The Service `ip:port` (a pod's address and port, as a client elsewhere reached
    /// it) is an endpoint of, as kube-proxy's rules on this node name it.
    pub(super) fn service_of_backend(&self, ip: std::net::IpAddr, port: u16) -> Option<String> {
        let services = self.services.read().unwrap_or_else(PoisonError::into_inner);
        services
            .by_backend(ip, ipproto::TCP, port)
            .map(|s| s.name.clone())
    }
}

/// Destinations conntrack recently had no translation for: a storm of failures to one
/// destination asks conntrack once per [`Untranslated::TTL`], not once per connect.
#[derive(Default)]
struct Untranslated(HashMap<SocketAddr, Instant>);

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
        self.0.insert(dst, Instant::now());
    }
}

/// The Service catalog from kube-proxy's rules in the agent's namespace, followed by
/// change on a thread of its own (`services::Follower`). `size` is set to the number
/// of Service ports after every read.
fn watch_services(failures: Counter, size: Gauge) -> Arc<RwLock<Arc<ServiceCatalog>>> {
    let (follower, first) = Follower::start();
    match first {
        Ok(_) => {
            let read: Vec<String> = follower
                .sources()
                .iter()
                .filter(|s| matches!(s.status, SourceStatus::Read { .. }))
                .map(|s| s.name.clone())
                .collect();
            info!(services = follower.catalog().len(), from = ?read, "Service names from kube-proxy's rules");
        }
        Err(e) => {
            failures.inc();
            warn!(error = %e, "no Service names: kube-proxy's rules cannot be read");
        }
    }
    size.set(i64::try_from(follower.catalog().len()).unwrap_or(i64::MAX));
    // The follower's own catalog, shared: never copied on its way to the verdicts.
    let catalog = Arc::new(RwLock::new(Arc::clone(follower.catalog())));
    let shared = Arc::clone(&catalog);
    let spawned = std::thread::Builder::new()
        .name("services".into())
        .spawn(move || {
            follower.run(
                |c| {
                    size.set(i64::try_from(c.len()).unwrap_or(i64::MAX));
                    *shared.write().unwrap_or_else(PoisonError::into_inner) = Arc::clone(c);
                },
                || {
                    failures.inc();
                },
            )
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start following the Service rules: names stay as read at start");
    }
    catalog
}
