//! The Kubernetes Services of this node, read from the rules kube-proxy programmed
//! (no API credentials): which Service a connection's destination is (its ClusterIP,
//! external or load-balancer IP, or one of its endpoints after DNAT), and whether
//! kube-proxy rejects it for lack of endpoints.
//!
//! - `sources`: [`read`] runs the dump tools present (`iptables-nft-save` /
//!   `ip6tables-nft-save` or plain `iptables-save`, the legacy ones when legacy tables
//!   are in use, table `{ip,ip6} kube-proxy`'s maps by `nft -j list map`), each with a
//!   deadline, and records what became of each ([`Source`]).
//! - `nft_netlink`: the `dnat` targets of kube-proxy's nftables rules, dumped over
//!   netlink (`nft` would fetch every anonymous set first: seconds at 20,000 Services).
//! - `iptables`, `nftables`: one parser per kube-proxy mode. Each takes the few rule
//!   shapes that name a Service and skips everything else, so an odd rule costs only
//!   itself.
//! - `netfilter_rules`: every dropping or rejecting rule with its packet counter (any
//!   table, not only kube-proxy's), what names the rule behind a firewall verdict.
//! - `catalog`: the [`ServiceCatalog`] both fill, looked up by frontend or backend.
//! - `watch`: [`CatalogWatcher`], taking each read and logging changes.
//! - `follow`: [`Follower`], reading again only the ruleset nftables' change feed (or,
//!   for iptables-legacy, the tables' size) says changed, and everything every 5 min.
//! - `report`: `node-diag services`' output.
//!
//! # Where the rule shapes come from
//!
//! kube-proxy's own sources, kubernetes/kubernetes (no code taken, only the shapes):
//!
//! - `pkg/proxy/iptables/proxier.go` (the stored copy readable here was an old one,
//!   commit 092dddd12ca4cc5e66597de66a81fc77fdd3f29b: chain names and their hash) and,
//!   for today's rules, the `iptables-restore` input its `proxier_test.go` expects
//!   (`TestOverallIPTablesRulesWithMultipleServices`, a version with `KUBE-EXT-*`,
//!   `KUBE-PROXY-FIREWALL` and the "has no endpoints" REJECTs in the filter table; its
//!   commit was not shown). The chain hashes (`KUBE-SVC-` +
//!   base32(sha256(name + protocol))[..16]) matter to nothing here.
//! - `pkg/proxy/nftables/proxier.go` at commit b0f823e6ccd8a10b3893fc75011b9981af39285c
//!   (and the earlier 01d7de5464ba38091b53e0a4d5077ddde9553c08): table `kube-proxy` in
//!   families `ip` and `ip6`, maps `service-ips`, `service-nodeports`,
//!   `no-endpoint-services`, `no-endpoint-nodeports` (only the latter two carry element
//!   comments), chains `service-<hash>-<ns>/<name>/<proto>/<port>` and
//!   `endpoint-<hash>-<ns>/<name>/<proto>/<port>__<ip>/<port>` ending in
//!   `meta l4proto <proto> dnat to <ip:port>`.
//!
//! The fixtures under `fixtures/` are what iptables 1.8.9 and nft 1.0.6 print for rules
//! of those shapes (`fixtures/regen.sh`), not hand-written guesses at their output.
//!
//! # Names
//!
//! A Service is named as kube-proxy names a Service port (`ServicePortName.String()`):
//! `<namespace>/<name>:<port name>`, and `<namespace>/<name>` when the port is unnamed
//! (allowed for a single-port Service). The port number is not made part of the name:
//! the same string then identifies a Service port in both modes, in both families, and
//! in kube-proxy's own logs and metrics.

mod catalog;
#[cfg(test)]
mod fixtures;
mod follow;
mod iptables;
pub(crate) mod netfilter_rules;
mod nft_netlink;
mod nftables;
mod report;
mod sources;
mod watch;

pub(crate) use catalog::{Service, ServiceCatalog};
pub(crate) use follow::Follower;
pub(crate) use report::Report;
pub(crate) use sources::{Source, SourceStatus, read};
pub(crate) use watch::CatalogWatcher;

use node_diag_common::ipproto;

/// Why the Service catalog could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServicesError {
    /// Every dump tool was missing or failed: the Services are unknown (not "none").
    #[error("no kube-proxy ruleset could be read ({})", describe(.0))]
    NothingReadable(Vec<Source>),
    #[error("nft -j printed what is not JSON: {0}")]
    NftJson(#[source] serde_json::Error),
    #[error("nft -j printed JSON of an unexpected shape: {0}")]
    NftShape(&'static str),
}

fn describe(sources: &[Source]) -> String {
    sources
        .iter()
        .map(|s| match &s.status {
            SourceStatus::Unavailable { reason } => format!("{}: {reason}", s.name),
            _ => s.name.clone(),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl ServiceCatalog {
    /// Parses `iptables-save` or `ip6tables-save` output (nft-backed or legacy).
    /// Rules it does not understand are skipped, never an error.
    pub(crate) fn parse_iptables_save(text: &str) -> ServiceCatalog {
        iptables::parse(text)
    }

    /// Parses `nft -j list map ... kube-proxy ...` or `nft -j list table {ip,ip6} kube-proxy` output.
    ///
    /// # Errors
    ///
    /// Only when the text is not nft's JSON at all; odd elements and rules are skipped.
    pub(crate) fn parse_nft_json(json: &str) -> Result<ServiceCatalog, ServicesError> {
        nftables::parse(json)
    }
}

/// `tcp`, `udp`, `sctp` (as iptables and nft print them) to the protocol number.
fn proto_number(name: &str) -> Option<u8> {
    match name.to_ascii_lowercase().as_str() {
        "tcp" => Some(ipproto::TCP),
        "udp" => Some(ipproto::UDP),
        "sctp" => Some(ipproto::SCTP),
        _ => None,
    }
}

/// The protocol number's name, for output.
fn proto_name(proto: u8) -> Option<&'static str> {
    match proto {
        ipproto::TCP => Some("tcp"),
        ipproto::UDP => Some("udp"),
        ipproto::SCTP => Some("sctp"),
        _ => None,
    }
}
