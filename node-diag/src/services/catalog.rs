//! The catalog itself: Services keyed by kube-proxy's name and protocol, and the two
//! indexes findings look them up by (frontend address, backend address). Every map is
//! hashed: a verdict's lookup costs two hash probes whatever the cluster's size (20,000
//! Services or more); only the listing (`node-diag services`, the change log) sorts.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use serde::Serialize;

use super::proto_name;

/// One Service port as kube-proxy programmed it on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Service {
    /// kube-proxy's own name for the Service port, exactly as its rule comments write
    /// it: `<namespace>/<name>:<port name>`, or `<namespace>/<name>` for an unnamed port
    /// (a Service with a single port may leave it unnamed; kube-proxy then writes no
    /// colon). The port *number* is not part of it: it is in [`Service::frontends`].
    pub(crate) name: String,
    /// IP protocol number: 6 (TCP), 17 (UDP) or 132 (SCTP).
    #[serde(serialize_with = "serialize_proto")]
    pub(crate) proto: u8,
    /// Addresses the Service answers on: its ClusterIP(s), external IPs and
    /// load-balancer IPs, with the Service port. NodePorts are not listed: they answer
    /// on every node address, which the rules do not name.
    pub(crate) frontends: Vec<SocketAddr>,
    /// Where kube-proxy sends connections: each endpoint's DNAT destination.
    pub(crate) backends: Vec<SocketAddr>,
    /// kube-proxy rejects connections to this Service because it has no endpoints
    /// (iptables: a "has no endpoints" REJECT rule; nftables: an element of the
    /// `no-endpoint-services` or `no-endpoint-nodeports` map). In a dual-stack cluster
    /// this is set when either family rejects.
    pub(crate) no_endpoints: bool,
}

fn serialize_proto<S: serde::Serializer>(proto: &u8, s: S) -> Result<S::Ok, S::Error> {
    match proto_name(*proto) {
        Some(name) => s.serialize_str(name),
        None => s.serialize_u8(*proto),
    }
}

/// Key of a Service port: kube-proxy's name and the protocol. kube-proxy's name alone
/// is unique per Service port, but the protocol keeps two parsers that disagree (or a
/// hand-written rule) from merging a TCP and a UDP port.
type Key = (String, u8);

/// An L4 address: IP, protocol number, port.
type L4 = (IpAddr, u8, u16);

/// Every Service kube-proxy programmed on this node, read from its rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServiceCatalog {
    services: HashMap<Key, Service>,
    frontends: HashMap<L4, Key>,
    backends: HashMap<L4, Key>,
}

impl ServiceCatalog {
    /// An empty catalog.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The Service answering on `ip:port` over `proto` (a ClusterIP, external IP or
    /// load-balancer IP), e.g. the destination of a failed connect.
    pub(crate) fn by_frontend(&self, ip: IpAddr, proto: u8, port: u16) -> Option<&Service> {
        self.frontends
            .get(&(ip, proto, port))
            .and_then(|k| self.services.get(k))
    }

    /// The Service whose endpoint is `ip:port` over `proto` (a DNAT destination of
    /// kube-proxy), e.g. the destination of a connect seen after DNAT. When one endpoint
    /// backs several Services, the first one read is returned.
    pub(crate) fn by_backend(&self, ip: IpAddr, proto: u8, port: u16) -> Option<&Service> {
        self.backends
            .get(&(ip, proto, port))
            .and_then(|k| self.services.get(k))
    }

    /// Number of Service ports.
    pub(crate) fn len(&self) -> usize {
        self.services.len()
    }

    /// Whether no Service was found.
    pub(crate) fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// Every Service port, ordered by name then protocol (sorted on each call: for
    /// listings, not for lookups).
    pub(crate) fn services(&self) -> impl Iterator<Item = &Service> {
        let mut all: Vec<&Service> = self.services.values().collect();
        all.sort_unstable_by(|a, b| (&a.name, a.proto).cmp(&(&b.name, b.proto)));
        all.into_iter()
    }

    /// Number of Service ports kube-proxy rejects for lack of endpoints.
    pub(crate) fn no_endpoints_count(&self) -> usize {
        self.services.values().filter(|s| s.no_endpoints).count()
    }

    /// Adds everything `other` holds: Services, their frontends and backends, and
    /// their no-endpoints marks (the IPv4 and IPv6 rules of one Service merge into one).
    pub(crate) fn merge(&mut self, other: &ServiceCatalog) {
        // In name order (`services` sorts), so that which Service an endpoint shared by
        // several maps to (the first one added) does not depend on the hash's order.
        for svc in other.services() {
            let entry = self.service(&svc.name, svc.proto);
            entry.no_endpoints |= svc.no_endpoints;
            for &f in &svc.frontends {
                self.add_frontend(&svc.name, svc.proto, f);
            }
            for &b in &svc.backends {
                self.add_backend(&svc.name, svc.proto, b);
            }
        }
    }

    /// The catalog of all of `parts` (each ruleset's), holding a copy only when it must:
    /// none or one of them with Services (a single-stack cluster, the common case) is
    /// that one shared, not copied; at 20,000 Services a copy is tens of MiB.
    pub(crate) fn merged(parts: &[&Arc<ServiceCatalog>]) -> Arc<ServiceCatalog> {
        let mut full = parts.iter().filter(|p| !p.is_empty());
        match (full.next(), full.next()) {
            (None, _) => Arc::new(ServiceCatalog::new()),
            (Some(only), None) => Arc::clone(only),
            (Some(_), Some(_)) => {
                let mut all = ServiceCatalog::new();
                for part in parts {
                    all.merge(part);
                }
                Arc::new(all)
            }
        }
    }

    fn service(&mut self, name: &str, proto: u8) -> &mut Service {
        self.services
            .entry((name.to_owned(), proto))
            .or_insert_with(|| Service {
                name: name.to_owned(),
                proto,
                frontends: Vec::new(),
                backends: Vec::new(),
                no_endpoints: false,
            })
    }

    /// Records that Service port `name` answers on `addr`.
    pub(super) fn add_frontend(&mut self, name: &str, proto: u8, addr: SocketAddr) {
        insert_sorted(&mut self.service(name, proto).frontends, addr);
        self.frontends
            .entry((addr.ip(), proto, addr.port()))
            .or_insert_with(|| (name.to_owned(), proto));
    }

    /// Records that Service port `name` sends connections to `addr`.
    pub(super) fn add_backend(&mut self, name: &str, proto: u8, addr: SocketAddr) {
        insert_sorted(&mut self.service(name, proto).backends, addr);
        self.backends
            .entry((addr.ip(), proto, addr.port()))
            .or_insert_with(|| (name.to_owned(), proto));
    }

    /// Records that kube-proxy rejects Service port `name` for lack of endpoints, and
    /// the address it rejects on when the rule names one (not for a NodePort).
    pub(super) fn mark_no_endpoints(&mut self, name: &str, proto: u8, addr: Option<SocketAddr>) {
        self.service(name, proto).no_endpoints = true;
        if let Some(addr) = addr {
            self.add_frontend(name, proto, addr);
        }
    }
}

fn insert_sorted(v: &mut Vec<SocketAddr>, addr: SocketAddr) {
    if let Err(at) = v.binary_search(&addr) {
        v.insert(at, addr);
    }
}

/// Whether `name` looks like kube-proxy's name of a Service port (`ns/name[:port]`):
/// a guard against taking some other comment (or a truncated chain name) for one.
pub(super) fn is_service_port_name(name: &str) -> bool {
    let Some((ns, rest)) = name.split_once('/') else {
        return false;
    };
    let (svc, port) = rest
        .split_once(':')
        .map_or((rest, None), |(s, p)| (s, Some(p)));
    // Namespaces and Service names are DNS labels; port names IANA service names.
    let ok = |s: &str, dot: bool| {
        !s.is_empty()
            && s.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (dot && c == '.')
            })
    };
    ok(ns, true) && ok(svc, true) && port.is_none_or(|p| ok(p, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A dual-stack Service's IPv4 rules: `default/web:http`, a frontend and a backend.
    fn ipv4_rules() -> ServiceCatalog {
        let mut v4 = ServiceCatalog::new();
        v4.add_frontend("default/web:http", 6, sa("10.96.0.20:80"));
        v4.add_backend("default/web:http", 6, sa("10.244.1.5:8080"));
        v4
    }

    /// Its IPv6 rules: the same Service's IPv6 frontend, and `default/empty` without
    /// endpoints.
    fn ipv6_rules() -> ServiceCatalog {
        let mut v6 = ServiceCatalog::new();
        v6.add_frontend("default/web:http", 6, sa("[fd00:96::20]:80"));
        v6.mark_no_endpoints("default/empty", 6, None);
        v6
    }

    #[test]
    fn merge_joins_families_and_keeps_marks() {
        let mut v4 = ipv4_rules();
        let v6 = ipv6_rules();
        v4.merge(&v6);
        assert_eq!(v4.len(), 2);
        assert_eq!(v4.no_endpoints_count(), 1);
        let web = v4
            .by_frontend("fd00:96::20".parse().unwrap(), 6, 80)
            .unwrap();
        assert_eq!(web.frontends.len(), 2);
        assert_eq!(web.backends, vec![sa("10.244.1.5:8080")]);
        assert!(
            v4.by_frontend("10.96.0.20".parse().unwrap(), 17, 80)
                .is_none()
        );
    }

    #[test]
    fn one_ruleset_with_services_is_shared_not_copied() {
        let v4 = Arc::new(ipv4_rules());
        let empty = Arc::new(ServiceCatalog::new());
        let merged = ServiceCatalog::merged(&[&empty, &v4, &empty]);
        assert!(
            Arc::ptr_eq(&merged, &v4),
            "the only part with Services, shared"
        );
        assert_eq!(
            merged
                .by_frontend("10.96.0.20".parse().unwrap(), 6, 80)
                .map(|s| &s.backends[..]),
            Some(&[sa("10.244.1.5:8080")][..])
        );
        let none = ServiceCatalog::merged(&[&empty, &empty]);
        assert!(none.is_empty());
        assert!(ServiceCatalog::merged(&[]).is_empty());
    }

    #[test]
    fn two_rulesets_with_services_merge_into_a_catalog_of_their_own() {
        let (v4, v6) = (Arc::new(ipv4_rules()), Arc::new(ipv6_rules()));
        let merged = ServiceCatalog::merged(&[&v4, &v6]);
        assert!(!Arc::ptr_eq(&merged, &v4) && !Arc::ptr_eq(&merged, &v6));
        assert_eq!(merged.len(), 2);
        assert_eq!(merged.no_endpoints_count(), 1);
        let web = merged
            .by_frontend("fd00:96::20".parse().unwrap(), 6, 80)
            .unwrap();
        assert_eq!(web.frontends.len(), 2);
        assert_eq!(web.backends, vec![sa("10.244.1.5:8080")]);
        // The parts are left as they were.
        assert_eq!(v4.len(), 1);
        assert_eq!(v6.len(), 2);
        assert!(
            v4.by_frontend("fd00:96::20".parse().unwrap(), 6, 80)
                .is_none()
        );
    }

    #[test]
    fn service_port_names() {
        for ok in [
            "default/web:http",
            "default/unnamed",
            "kube-system/kube-dns:dns-tcp",
        ] {
            assert!(is_service_port_name(ok), "{ok}");
        }
        for bad in [
            "kubernetes service portals",
            "default/web:http cluster IP",
            "default/web/tcp/http",
            "noslash",
            "/x",
            "ns/truncated:p...",
            "ns/svc:",
        ] {
            assert!(!is_service_port_name(bad), "{bad}");
        }
    }
}
