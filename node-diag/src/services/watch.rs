//! Keeping a catalog current: re-read on demand (or given a read made by
//! [`super::follow`]), and say so in the log only when something changed.

use std::{
    hash::{Hash as _, Hasher as _},
    sync::Arc,
};

use tracing::{info, warn};

use super::{ServiceCatalog, ServicesError, Source};

/// A catalog kept current by [`CatalogWatcher::apply`].
pub(crate) struct CatalogWatcher {
    /// The catalog [`super::follow`] read, shared (not copied) with whoever it is
    /// published to.
    catalog: Arc<ServiceCatalog>,
    sources: Vec<Source>,
    /// What the last change log line described, hashed (a second list of 20,000
    /// names would cost what the catalog does): each Service port and whether it had
    /// endpoints. Backends are left out: endpoints come and go with every rollout and
    /// are not worth a log line each time.
    summary: Option<u64>,
}

impl std::fmt::Debug for CatalogWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogWatcher")
            .field("services", &self.catalog.len())
            .field("sources", &self.sources)
            .finish_non_exhaustive()
    }
}

impl Default for CatalogWatcher {
    fn default() -> Self {
        Self::new()
    }
}

impl CatalogWatcher {
    /// An empty watcher, until the first [`CatalogWatcher::apply`].
    pub(crate) fn new() -> Self {
        Self {
            catalog: Arc::new(ServiceCatalog::new()),
            sources: Vec::new(),
            summary: None,
        }
    }

    /// The catalog as last read.
    pub(crate) fn catalog(&self) -> &Arc<ServiceCatalog> {
        &self.catalog
    }

    /// What became of each source at the last read.
    pub(crate) fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// Takes a read of the rules (by [`super::follow`]: only the rulesets that
    /// changed). Returns whether the set of Service ports, or which of them have no
    /// endpoints, changed (the first read counts as a change); logs the counts when it
    /// did, and the sources when what could be read changed. The catalog itself
    /// (backends included) is replaced on every successful read.
    ///
    /// # Errors
    ///
    /// `read`'s error; the previous catalog is kept.
    pub(crate) fn apply(
        &mut self,
        read: Result<(Arc<ServiceCatalog>, Vec<Source>), ServicesError>,
    ) -> Result<bool, ServicesError> {
        let (catalog, sources) = match read {
            Ok(read) => read,
            Err(e) => {
                warn!("cannot read kube-proxy's rules, keeping the last Service catalog: {e}");
                return Err(e);
            }
        };
        if sources != self.sources {
            let read: Vec<_> = sources
                .iter()
                .filter(|s| s.is_read())
                .map(|s| &s.name[..])
                .collect();
            let unavailable: Vec<_> = sources
                .iter()
                .filter(|s| !s.is_read())
                .map(|s| &s.name[..])
                .collect();
            info!(
                read = %read.join(", "),
                unavailable = %unavailable.join(", "),
                "Service catalog sources"
            );
        }
        let summary = summary_of(&catalog);
        let changed = self.summary != Some(summary);
        if changed {
            info!(
                services = catalog.len(),
                no_endpoints = catalog.no_endpoints_count(),
                "Service catalog changed"
            );
        }
        self.summary = Some(summary);
        self.catalog = catalog;
        self.sources = sources;
        Ok(changed)
    }
}

/// A hash of each Service port's name, protocol and whether it has endpoints, in name
/// order.
fn summary_of(catalog: &ServiceCatalog) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    for s in catalog.services() {
        (&s.name, s.proto, s.no_endpoints).hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::services::{SourceStatus, fixtures::IPTABLES_NFT_SAVE_V4, iptables};

    #[test]
    fn refresh_reports_changes_only() {
        let text = Arc::new(Mutex::new(IPTABLES_NFT_SAVE_V4.to_owned()));
        let fail = Arc::new(Mutex::new(false));
        let (t, f) = (text.clone(), fail.clone());
        let mut w = CatalogWatcher::new();
        let read = move || {
            if *f.lock().unwrap() {
                return Err(ServicesError::NothingReadable(Vec::new()));
            }
            let catalog = iptables::parse(&t.lock().unwrap());
            let source = Source {
                name: "iptables-nft-save".into(),
                status: SourceStatus::Read {
                    services: catalog.len(),
                },
            };
            Ok((Arc::new(catalog), vec![source]))
        };
        assert!(w.apply(read()).unwrap(), "the first read is a change");
        assert_eq!(w.catalog().len(), 5);
        assert!(!w.apply(read()).unwrap(), "same rules");
        assert!(w.sources()[0].is_read());

        // A new backend alone is no change worth a log line, but the catalog has it.
        let more = IPTABLES_NFT_SAVE_V4.replace("10.244.2.6:8080", "10.244.2.66:8080");
        *text.lock().unwrap() = more;
        assert!(!w.apply(read()).unwrap());
        assert!(
            w.catalog()
                .by_backend("10.244.2.66".parse().unwrap(), 6, 8080)
                .is_some()
        );

        // The empty Service got endpoints: its REJECT rules go.
        let fixed: String = IPTABLES_NFT_SAVE_V4
            .lines()
            .filter(|l| !l.contains("has no endpoints"))
            .map(|l| format!("{l}\n"))
            .collect();
        *text.lock().unwrap() = fixed;
        assert!(w.apply(read()).unwrap());
        assert_eq!(w.catalog().no_endpoints_count(), 0);

        *fail.lock().unwrap() = true;
        assert!(w.apply(read()).is_err());
        assert_eq!(w.catalog().len(), 4, "the last catalog is kept");
    }
}
