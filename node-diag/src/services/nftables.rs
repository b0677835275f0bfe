//! kube-proxy's nftables mode, read back from table `ip kube-proxy` (or `ip6`): its maps
//! from `nft -j list map`, its endpoint chains' rules from a netlink rule dump
//! ([`super::nft_netlink`]); `nft -j list table` output, which holds both, parses too.
//!
//! What is taken:
//!
//! - map `service-ips` (`addr . proto . port : goto <chain>`): a frontend (ClusterIP,
//!   external IP or load-balancer IP). kube-proxy gives these elements no comment, so the
//!   Service is the one the target chain is named after:
//!   `service-<hash>-<ns>/<name>/<proto>/<port name>` (or `external-`, `local-`,
//!   `firewall-`).
//! - map `no-endpoint-services` (same key, `goto reject-chain` or `drop`), element
//!   comment `"<svc>"`: a Service without endpoints, and the address it rejects on.
//! - map `no-endpoint-nodeports` (`proto . port`), element comment `"<svc>"`: a Service
//!   without endpoints, on its NodePort.
//! - chains `endpoint-<hash>-<ns>/<name>/<proto>/<port name>__<ip>/<port>`, rule
//!   `meta l4proto <proto> dnat to <ip:port>`: a backend.
//!
//! Everything else (sets, `service-nodeports`, `firewall-ips`, masquerade and
//! affinity rules, other tables) is skipped, and so is an element or rule of an
//! unexpected shape: only JSON that is not nft's output at all fails the parse.

use std::net::{IpAddr, SocketAddr};

use serde_json::Value;
use tracing::debug;

use super::{
    ServicesError,
    catalog::{ServiceCatalog, is_service_port_name},
    nft_netlink::Dnat,
    proto_number,
};

/// kube-proxy's table, in both families.
pub(crate) const TABLE: &str = "kube-proxy";

/// The maps the catalog reads, each printed alone by `nft -j list map` (see
/// [`super::nft_netlink`] for why not the whole table).
pub(crate) const MAPS: [&str; 3] = [
    "service-ips",
    "no-endpoint-services",
    "no-endpoint-nodeports",
];

/// Prefixes of the per-Service and per-endpoint chains kube-proxy names after the
/// Service port.
const SERVICE_CHAIN_PREFIXES: [&str; 4] = ["service-", "external-", "local-", "firewall-"];
const ENDPOINT_CHAIN_PREFIX: &str = "endpoint-";

/// Parses `nft -j list table {ip,ip6} kube-proxy` output (or `nft -j list ruleset`:
/// other tables are skipped) into a catalog.
pub(crate) fn parse(json: &str) -> Result<ServiceCatalog, ServicesError> {
    let doc: Value = serde_json::from_str(json).map_err(ServicesError::NftJson)?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or(ServicesError::NftShape("no top-level \"nftables\" array"))?;
    let mut catalog = ServiceCatalog::new();
    for item in items {
        if let Some(map) = item.get("map") {
            read_map(map, &mut catalog);
        } else if let Some(rule) = item.get("rule") {
            read_rule(rule, &mut catalog);
        }
    }
    Ok(catalog)
}

fn in_table(obj: &Value) -> bool {
    obj.get("table").and_then(Value::as_str) == Some(TABLE)
}

fn read_map(map: &Value, catalog: &mut ServiceCatalog) {
    if !in_table(map) {
        return;
    }
    let name = map.get("name").and_then(Value::as_str).unwrap_or("");
    let elems = map.get("elem").and_then(Value::as_array);
    for pair in elems.into_iter().flatten() {
        let Some([key, verdict]) = pair.as_array().map(Vec::as_slice) else {
            continue;
        };
        let (key, comment) = unwrap_elem(key);
        let parsed = match name {
            "service-ips" => frontend_element(key, comment, verdict).map(|(svc, proto, addr)| {
                catalog.add_frontend(&svc, proto, addr);
            }),
            "no-endpoint-services" => comment
                .filter(|c| is_service_port_name(c))
                .zip(address_key(key))
                .map(|(svc, (proto, addr))| catalog.mark_no_endpoints(svc, proto, Some(addr))),
            "no-endpoint-nodeports" => comment
                .filter(|c| is_service_port_name(c))
                .zip(nodeport_key(key))
                .map(|(svc, proto)| catalog.mark_no_endpoints(svc, proto, None)),
            _ => Some(()),
        };
        if parsed.is_none() {
            debug!(map = name, element = %pair, "nft: skipped an element of an unexpected shape");
        }
    }
}

/// An element key, and its comment: nft prints a commented element as
/// `{"elem": {"val": KEY, "comment": "..."}}`, an uncommented one as KEY alone.
fn unwrap_elem(key: &Value) -> (&Value, Option<&str>) {
    match key.get("elem") {
        Some(elem) => (
            elem.get("val").unwrap_or(&Value::Null),
            elem.get("comment").and_then(Value::as_str),
        ),
        None => (key, None),
    }
}

/// `{"concat": ["10.96.0.10", "udp", 53]}`: protocol number and address.
fn address_key(key: &Value) -> Option<(u8, SocketAddr)> {
    let [ip, proto, port] = key.get("concat")?.as_array()?.as_slice() else {
        return None;
    };
    let ip: IpAddr = ip.as_str()?.parse().ok()?;
    let proto = proto_number(proto.as_str()?)?;
    Some((proto, SocketAddr::new(ip, port_of(port)?)))
}

/// `{"concat": ["tcp", 30090]}`: the protocol number (the NodePort itself answers on
/// every node address, which the map does not name).
fn nodeport_key(key: &Value) -> Option<u8> {
    let [proto, port] = key.get("concat")?.as_array()?.as_slice() else {
        return None;
    };
    port_of(port)?;
    proto_number(proto.as_str()?)
}

/// nft prints a port as a number, or as a service name (`"http"`) when asked to
/// resolve them; only numbers are usable.
fn port_of(v: &Value) -> Option<u16> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A `service-ips` element: the Service from its comment when it has one (a future
/// kube-proxy may add it), else from the chain its verdict goes to.
fn frontend_element(
    key: &Value,
    comment: Option<&str>,
    verdict: &Value,
) -> Option<(String, u8, SocketAddr)> {
    let (proto, addr) = address_key(key)?;
    let name = match comment.filter(|c| is_service_port_name(c)) {
        Some(c) => c.to_owned(),
        None => {
            let target = ["goto", "jump"]
                .iter()
                .find_map(|v| verdict.get(v)?.get("target")?.as_str())?;
            let (name, chain_proto) = service_of_chain(target, &SERVICE_CHAIN_PREFIXES)?;
            if chain_proto != proto {
                return None;
            }
            name
        }
    };
    Some((name, proto, addr))
}

fn read_rule(rule: &Value, catalog: &mut ServiceCatalog) {
    if !in_table(rule) {
        return;
    }
    let Some(chain) = rule.get("chain").and_then(Value::as_str) else {
        return;
    };
    if !is_endpoint_chain(chain) {
        return;
    }
    let exprs = rule.get("expr").and_then(Value::as_array);
    for dnat in exprs.into_iter().flatten().filter_map(|e| e.get("dnat")) {
        let addr = dnat
            .get("addr")
            .and_then(Value::as_str)
            .and_then(|a| a.parse::<IpAddr>().ok());
        match (addr, dnat.get("port").and_then(port_of)) {
            (Some(ip), Some(port)) => add_backend(chain, SocketAddr::new(ip, port), catalog),
            _ => debug!(chain, %dnat, "nft: skipped a dnat of an unexpected shape"),
        }
    }
}

/// Whether `chain` is one of kube-proxy's per-endpoint chains, whose `dnat` names a
/// backend.
pub(crate) fn is_endpoint_chain(chain: &str) -> bool {
    chain.starts_with(ENDPOINT_CHAIN_PREFIX)
}

/// Adds the backends that the `dnat` rules of kube-proxy's endpoint chains name (read
/// from a rule dump, see [`super::nft_netlink`]).
pub(crate) fn add_backends(dnats: &[Dnat], catalog: &mut ServiceCatalog) {
    for dnat in dnats.iter().filter(|d| is_endpoint_chain(&d.chain)) {
        add_backend(&dnat.chain, dnat.to, catalog);
    }
}

/// A `dnat to addr` in endpoint chain `chain`: a backend of the Service port the chain
/// is named after.
fn add_backend(chain: &str, addr: SocketAddr, catalog: &mut ServiceCatalog) {
    match service_of_chain(chain, &[ENDPOINT_CHAIN_PREFIX]) {
        Some((name, proto)) => catalog.add_backend(&name, proto, addr),
        None => debug!(
            chain,
            "nft: skipped an endpoint chain whose name does not parse"
        ),
    }
}

/// The Service port a kube-proxy chain is named after, and its protocol:
/// `<prefix><hash>-<ns>/<name>/<proto>/<port name>[__<endpoint>]` gives
/// `("<ns>/<name>:<port name>", proto)`, or `"<ns>/<name>"` for an unnamed port, as
/// kube-proxy's comments write it. `None` for other chains, and for a name kube-proxy
/// had to truncate (it ends in `...`).
fn service_of_chain(chain: &str, prefixes: &[&str]) -> Option<(String, u8)> {
    let rest = prefixes.iter().find_map(|p| chain.strip_prefix(p))?;
    let (_hash, base) = rest.split_once('-')?;
    let base = base.split_once("__").map_or(base, |(svc, _endpoint)| svc);
    let mut parts = base.split('/');
    let (ns, svc, proto, port) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let name = if port.is_empty() {
        format!("{ns}/{svc}")
    } else {
        format!("{ns}/{svc}:{port}")
    };
    if !is_service_port_name(&name) {
        return None;
    }
    Some((name, proto_number(proto)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::fixtures::{NFT_IP_JSON, NFT_IP6_JSON};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn nft_ip_table() {
        let c = parse(NFT_IP_JSON).unwrap();
        let web = c
            .by_frontend(ip("10.96.0.20"), 6, 80)
            .expect("web by ClusterIP");
        assert_eq!(web.name, "default/web:http");
        assert_eq!(
            web.backends,
            vec![sa("10.244.1.5:8080"), sa("10.244.2.6:8080")]
        );
        assert_eq!(
            web.frontends,
            vec![sa("10.96.0.20:80"), sa("192.168.99.20:80")]
        );
        assert!(!web.no_endpoints);

        let empty = c
            .by_frontend(ip("10.96.0.30"), 6, 80)
            .expect("no-endpoint Service");
        assert_eq!(empty.name, "default/empty:http");
        assert!(empty.no_endpoints);
        assert!(empty.backends.is_empty());

        let dns = c.by_frontend(ip("10.96.0.10"), 17, 53).expect("kube-dns");
        assert_eq!(dns.name, "kube-system/kube-dns:dns");
        assert_eq!(dns.backends, vec![sa("10.244.1.3:53")]);

        let unnamed = c
            .by_backend(ip("10.244.2.7"), 6, 80)
            .expect("unnamed by backend");
        assert_eq!(unnamed.name, "default/unnamed");
        assert_eq!(unnamed.frontends, vec![sa("10.96.0.40:8080")]);

        assert_eq!(c.len(), 4);
        assert_eq!(c.no_endpoints_count(), 1);
    }

    #[test]
    fn nft_ip6_table() {
        let c = parse(NFT_IP6_JSON).unwrap();
        let web = c.by_frontend(ip("fd00:96::20"), 6, 80).expect("web6");
        assert_eq!(web.name, "default/web6:http");
        assert_eq!(
            web.backends,
            vec![sa("[fd00:244::5]:8080"), sa("[fd00:244::6]:8080")]
        );
        assert!(
            c.by_frontend(ip("fd00:96::30"), 6, 80)
                .unwrap()
                .no_endpoints
        );
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn odd_elements_and_rules_are_skipped() {
        let mut doc: Value = serde_json::from_str(NFT_IP_JSON).unwrap();
        let items = doc["nftables"].as_array_mut().unwrap();
        let junk: Value = serde_json::json!([
            {"map": {"table": "kube-proxy", "name": "service-ips", "elem": [
                [{"concat": ["not-an-ip", "tcp", 80]}, {"goto": {"target": "service-X-a/b/tcp/p"}}],
                [{"concat": ["10.96.0.77", "tcp", 80]}, {"goto": {"target": "services"}}],
                [{"concat": ["10.96.0.78", "tcp", 80]}, {"goto": {"target": "service-AAAAAAAA-ns/truncated/tcp/p..."}}],
                "not a pair",
                [{"concat": ["10.96.0.79", "tcp"]}, {"drop": null}]
            ]}},
            {"map": {"table": "kube-proxy", "name": "no-endpoint-services", "elem": [
                [{"elem": {"val": {"concat": ["10.96.0.80", "tcp", 80]}, "comment": "free text"}}, {"drop": null}]
            ]}},
            {"rule": {"table": "kube-proxy", "chain": "endpoint-XXXXXXXX-ns/svc/tcp/p__10.0.0.1/80",
                      "expr": [{"dnat": {"addr": "bogus", "port": 80}}]}},
            {"rule": {"table": "kube-proxy", "chain": "endpoint-garbage", "expr": []}},
            {"rule": {"table": "other", "chain": "endpoint-XXXXXXXX-ns/other/tcp/p__10.0.0.2/80",
                      "expr": [{"dnat": {"addr": "10.0.0.2", "port": 80}}]}},
            {"something-new": {"table": "kube-proxy"}}
        ]);
        items.extend(junk.as_array().unwrap().iter().cloned());
        let c = parse(&doc.to_string()).unwrap();
        assert_eq!(
            c.len(),
            4,
            "{:?}",
            c.services().map(|s| &s.name).collect::<Vec<_>>()
        );
        assert!(c.by_frontend(ip("10.96.0.78"), 6, 80).is_none());
        assert!(
            c.by_backend(ip("10.0.0.2"), 6, 80).is_none(),
            "other tables are not kube-proxy's"
        );
    }

    #[test]
    fn not_nft_output_fails() {
        assert!(matches!(parse("not json"), Err(ServicesError::NftJson(_))));
        assert!(matches!(
            parse("{\"x\": 1}"),
            Err(ServicesError::NftShape(_))
        ));
        assert!(parse("{\"nftables\": []}").unwrap().is_empty());
    }

    #[test]
    fn chain_names() {
        assert_eq!(
            service_of_chain(
                "service-SUSTUHLJ-default/web/tcp/http",
                &SERVICE_CHAIN_PREFIXES
            ),
            Some(("default/web:http".into(), 6))
        );
        assert_eq!(
            service_of_chain(
                "endpoint-KLK4TTGV-default/unnamed/tcp/__10.244.2.7/80",
                &["endpoint-"]
            ),
            Some(("default/unnamed".into(), 6))
        );
        assert_eq!(
            service_of_chain(
                "endpoint-KSX5SURN-default/web6/sctp/http__fd00.244..5/8080",
                &["endpoint-"]
            ),
            Some(("default/web6:http".into(), 132))
        );
        assert_eq!(service_of_chain("services", &SERVICE_CHAIN_PREFIXES), None);
        assert_eq!(
            service_of_chain("service-endpoints-check", &SERVICE_CHAIN_PREFIXES),
            None
        );
    }
}
