//! Keeping a catalog current: re-read on demand (the agent calls it on its interface
//! snapshot tick), and say so in the log only when something changed.

use tracing::{info, warn};

use super::{Service, ServiceCatalog, ServicesError, Source, read};

type Reader = Box<dyn FnMut() -> Result<(ServiceCatalog, Vec<Source>), ServicesError> + Send>;

/// A catalog kept current by [`CatalogWatcher::refresh`].
pub(crate) struct CatalogWatcher {
    reader: Reader,
    catalog: ServiceCatalog,
    sources: Vec<Source>,
    /// What the last change log line described: each Service port and whether it had
    /// endpoints. Backends are left out: endpoints come and go with every rollout and
    /// are not worth a log line each time.
    summary: Option<Vec<(String, u8, bool)>>,
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
    /// A watcher reading this thread's network namespace with [`read`]; empty until the
    /// first [`CatalogWatcher::refresh`].
    pub(crate) fn new() -> Self {
        Self::with_reader(read)
    }

    /// A watcher reading through `reader` instead (tests; another namespace).
    pub(crate) fn with_reader(
        reader: impl FnMut() -> Result<(ServiceCatalog, Vec<Source>), ServicesError> + Send + 'static,
    ) -> Self {
        Self {
            reader: Box::new(reader),
            catalog: ServiceCatalog::new(),
            sources: Vec::new(),
            summary: None,
        }
    }

    /// The catalog as last read.
    pub(crate) fn catalog(&self) -> &ServiceCatalog {
        &self.catalog
    }

    /// What became of each source at the last read.
    pub(crate) fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// Re-reads the rules. Returns whether the set of Service ports, or which of them
    /// have no endpoints, changed (the first read counts as a change); logs the counts
    /// when it did, and the sources when what could be read changed. The catalog itself
    /// (backends included) is replaced on every successful read.
    ///
    /// # Errors
    ///
    /// What [`read`] returns; the previous catalog is kept.
    pub(crate) fn refresh(&mut self) -> Result<bool, ServicesError> {
        let (catalog, sources) = match (self.reader)() {
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
        let summary: Vec<_> = catalog.services().map(summary_of).collect();
        let changed = self.summary.as_ref() != Some(&summary);
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

fn summary_of(s: &Service) -> (String, u8, bool) {
    (s.name.clone(), s.proto, s.no_endpoints)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::services::{SourceStatus, fixtures::IPTABLES_NFT_SAVE_V4, iptables};

    #[test]
    fn refresh_reports_changes_only() {
        let text = Arc::new(Mutex::new(IPTABLES_NFT_SAVE_V4.to_owned()));
        let fail = Arc::new(Mutex::new(false));
        let (t, f) = (text.clone(), fail.clone());
        let mut w = CatalogWatcher::with_reader(move || {
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
            Ok((catalog, vec![source]))
        });
        assert!(w.refresh().unwrap(), "the first read is a change");
        assert_eq!(w.catalog().len(), 5);
        assert!(!w.refresh().unwrap(), "same rules");
        assert!(w.sources()[0].is_read());

        // A new backend alone is no change worth a log line, but the catalog has it.
        let more = IPTABLES_NFT_SAVE_V4.replace("10.244.2.6:8080", "10.244.2.66:8080");
        *text.lock().unwrap() = more;
        assert!(!w.refresh().unwrap());
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
        assert!(w.refresh().unwrap());
        assert_eq!(w.catalog().no_endpoints_count(), 0);

        *fail.lock().unwrap() = true;
        assert!(w.refresh().is_err());
        assert_eq!(w.catalog().len(), 4, "the last catalog is kept");
    }
}
