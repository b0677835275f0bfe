//! `node-diag services`' output: the catalog as a table (SERVICE, PROTO, FRONTENDS,
//! BACKENDS or "no endpoints") followed by the sources, or as one JSON object.

use std::{fmt::Write as _, net::SocketAddr};

use serde::Serialize;

use super::{Service, ServiceCatalog, Source, SourceStatus, proto_name};

/// `node-diag services`' output.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) services: Vec<Service>,
    pub(crate) sources: Vec<Source>,
}

impl Report {
    /// Every Service of `catalog`.
    pub(crate) fn new(catalog: &ServiceCatalog, sources: Vec<Source>) -> Self {
        Self {
            services: catalog.services().cloned().collect(),
            sources,
        }
    }

    /// Only the Service answering on `addr` over `proto`, and the one `addr` is an
    /// endpoint of (both when they differ).
    pub(crate) fn lookup(
        catalog: &ServiceCatalog,
        sources: Vec<Source>,
        addr: SocketAddr,
        proto: u8,
    ) -> Self {
        let mut services: Vec<Service> = Vec::new();
        for found in [
            catalog.by_frontend(addr.ip(), proto, addr.port()),
            catalog.by_backend(addr.ip(), proto, addr.port()),
        ]
        .into_iter()
        .flatten()
        {
            if !services.contains(found) {
                services.push(found.clone());
            }
        }
        Self { services, sources }
    }

    /// The table, then one line per source.
    pub(crate) fn text(&self) -> String {
        let list = |v: &[SocketAddr]| {
            if v.is_empty() {
                "-".to_owned()
            } else {
                v.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            }
        };
        let rows: Vec<[String; 4]> = self
            .services
            .iter()
            .map(|s| {
                let backends = if s.no_endpoints && s.backends.is_empty() {
                    "no endpoints".to_owned()
                } else if s.no_endpoints {
                    format!("{} (no endpoints in one family)", list(&s.backends))
                } else {
                    list(&s.backends)
                };
                [
                    s.name.clone(),
                    proto_name(s.proto).map_or_else(|| s.proto.to_string(), str::to_owned),
                    list(&s.frontends),
                    backends,
                ]
            })
            .collect();
        let header = ["SERVICE", "PROTO", "FRONTENDS", "BACKENDS"];
        let mut widths = header.map(str::len);
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(header.map(str::to_owned)).chain(rows) {
            let mut line = String::new();
            for (c, w) in r.iter().zip(widths) {
                let _ = write!(line, "{c:<w$}  ");
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        if self.services.is_empty() {
            out.push_str("(no Service found in kube-proxy's rules)\n");
        }
        out.push('\n');
        for s in &self.sources {
            let status = match &s.status {
                SourceStatus::Read { services } => format!("read, {services} Service ports"),
                SourceStatus::Absent => "no kube-proxy rules there".to_owned(),
                SourceStatus::Unavailable { reason } => format!("unavailable: {reason}"),
            };
            let _ = writeln!(out, "source {}: {status}", s.name);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::fixtures::IPTABLES_NFT_SAVE_V4;

    #[test]
    fn table_and_lookup() {
        let c = ServiceCatalog::parse_iptables_save(IPTABLES_NFT_SAVE_V4);
        let text = Report::new(&c, Vec::new()).text();
        assert!(text.starts_with("SERVICE"), "{text}");
        let empty = text
            .lines()
            .find(|l| l.starts_with("default/empty:http"))
            .unwrap();
        assert!(empty.ends_with("no endpoints"), "{empty}");
        assert!(text.contains("10.244.1.5:8080,10.244.2.6:8080"), "{text}");

        let r = Report::lookup(&c, Vec::new(), "10.244.2.7:80".parse().unwrap(), 6);
        assert_eq!(r.services.len(), 1);
        assert_eq!(r.services[0].name, "default/unnamed");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["services"][0]["proto"], "tcp");
        assert_eq!(json["services"][0]["backends"][0], "10.244.2.7:80");
    }
}
