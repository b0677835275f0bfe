//! The joined verdict of `node-diag findings --cluster`: the two ends of one failed
//! connect, reported by two agents, shown as one finding.
//!
//! A client's connect that times out on node A with nothing on node A to explain it is a
//! `tcp_timeout` / `unknown` there. When node B's firewall (a NetworkPolicy's ingress
//! rule, a host firewall) dropped that connect's SYNs on their way to a pod of node B,
//! node B's agent reports a `tcp_syn_dropped` for it. Each agent sees half; the merged
//! view puts them together: one `tcp_timeout` / `firewall` on node A whose evidence names
//! node B and what dropped the SYN there, both originals referenced by id (`joined`).
//!
//! Only the same flow joins, never on weaker evidence:
//! - the client's finding is a `tcp_timeout` whose layer is `unknown` (its own node had
//!   no verdict: a node-local one stands on its own);
//! - the inbound drop was made on another node;
//! - the drop's client address is the connect's source address, and its pod address and
//!   port are where the connect went (the backend where the client's node NATed it, else
//!   the destination);
//! - their times overlap: the drop's span meets the window from [`BEFORE`] before the
//!   client's first timeout (its SYNs were sent before it timed out) to [`SKEW`] after
//!   its last one (clocks of two nodes differ a little).
//!
//! A connect whose client node SNATs it (the drop then names the node's address) or
//! goes to another port stays two findings.

use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};

use super::{Fetched, query::parse_time};
use crate::findings::{Kind, Layer};

/// How long before its verdict a timed-out connect's SYNs may have been dropped: the
/// SYN and its retransmits (`--syn-retries` 2 spends 3 s; 4 spends 31 s).
pub(crate) const BEFORE: Duration = Duration::from_secs(35);
/// Clock difference allowed between two nodes.
pub(crate) const SKEW: Duration = Duration::from_secs(5);

/// Evidence keys of the inbound drop carried into the joined finding.
const CARRIED: &[&str] = &[
    "drop_reason",
    "syn_drops",
    "action",
    "rule",
    "policy",
    "program",
    "drop_interface",
    "pod_interface",
    "icmp_sent_type",
    "icmp_sent_code",
    "conntrack_cause",
];

/// Whether `f` is a client's unexplained connect timeout.
fn is_client_side(f: &Fetched) -> bool {
    f.finding.kind == Kind::TcpTimeout && f.finding.layer == Layer::Unknown
}

fn is_inbound(f: &Fetched) -> bool {
    f.finding.kind == Kind::TcpSynDropped
}

/// Whether any finding of `batch` could take part in a join on the client's side.
pub(crate) fn has_candidates(batch: &[Fetched]) -> bool {
    batch.iter().any(is_client_side)
}

/// `[from, to]` of a finding's occurrences, when its times read.
fn span(f: &Fetched) -> Option<(SystemTime, SystemTime)> {
    Some((
        parse_time(&f.finding.first_seen)?,
        parse_time(&f.finding.last_seen)?,
    ))
}

/// Whether the inbound drop `server` is of the connect `client` timed out on.
pub(crate) fn same_flow(client: &Fetched, server: &Fetched) -> bool {
    let (c, s) = (&client.finding, &server.finding);
    if !is_client_side(client) || !is_inbound(server) {
        return false;
    }
    let other_node = match (&client.node, &server.node) {
        (Some(a), Some(b)) => a != b,
        _ => false,
    };
    let to = c.backend.or(c.dst);
    let port = if c.backend.is_some() {
        c.backend_port.or(c.dport)
    } else {
        c.dport
    };
    let flow = c.src.is_some()
        && c.src == s.src
        && to.is_some()
        && to == s.dst
        && port.is_some()
        && port == s.dport;
    if !other_node || !flow {
        return false;
    }
    let (Some((c_first, c_last)), Some((s_first, s_last))) = (span(client), span(server)) else {
        return false;
    };
    let from = c_first
        .checked_sub(BEFORE)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let until = c_last + SKEW;
    s_first <= until && s_last >= from
}

/// The joined finding of `client` (on its node) and `server` (the drop on another).
pub(crate) fn joined(client: &Fetched, server: &Fetched) -> Fetched {
    let mut raw = client.raw.clone();
    let (c, s) = (&client.finding, &server.finding);
    let server_node = server.node.clone().unwrap_or_default();
    let server_evidence = server.raw.get("evidence").and_then(Value::as_object);
    let carried = |k: &str| {
        server_evidence
            .and_then(|e| e.get(k))
            .filter(|v| !v.is_null())
    };

    let mut evidence: Map<String, Value> = client
        .raw
        .get("evidence")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    evidence.insert("drop_node".into(), Value::String(server_node.clone()));
    for key in CARRIED {
        if let Some(v) = carried(key) {
            evidence.insert((*key).into(), v.clone());
        }
    }

    let reason = carried("drop_reason")
        .and_then(Value::as_str)
        .unwrap_or("a filter's drop");
    let policy = carried("policy").and_then(Value::as_str);
    let rule = carried("rule").map(describe_rule);
    let target = match &s.pod {
        Some(p) => format!("pod {p}"),
        None => s.dst.map(|d| d.to_string()).unwrap_or_default(),
    };
    let dst = match (c.dst, c.dport) {
        (Some(std::net::IpAddr::V6(d)), Some(p)) => format!("[{d}]:{p}"),
        (Some(d), Some(p)) => format!("{d}:{p}"),
        _ => String::new(),
    };
    let mut by = vec![reason.to_string()];
    if let Some(r) = &rule {
        by.push(format!("rule {r}"));
    }
    if let Some(p) = policy {
        by.push(format!("NetworkPolicy {p}"));
    }
    let summary = format!(
        "Connection to {dst} is timing out: node {server_node}'s firewall dropped its SYN on the way to {target} ({})",
        by.join(", ")
    );
    let port = s.dport.map(|p| p.to_string()).unwrap_or_default();
    let remediation = match policy {
        Some(p) => format!(
            "Allow this client in NetworkPolicy {p} (ingress to {target} on port {port}), or the rule on node {server_node} that drops it."
        ),
        None => format!(
            "On node {server_node}, find the rule dropping tcp dport {port} towards {target} (`nft list ruleset`, `iptables-save`, NetworkPolicy) and allow the traffic. {}",
            s.remediation
        ),
    };

    let id = format!(
        "{}+{}",
        client.id.as_deref().unwrap_or(""),
        server.id.as_deref().unwrap_or("")
    );
    if let Some(obj) = raw.as_object_mut() {
        obj.insert("id".into(), Value::String(id.clone()));
        obj.insert("layer".into(), Value::String(Layer::Firewall.to_string()));
        obj.insert("summary".into(), Value::String(summary));
        obj.insert("remediation".into(), Value::String(remediation));
        obj.insert("evidence".into(), Value::Object(evidence));
        if obj.get("peer_pod").is_none_or(Value::is_null)
            && let Some(p) = server.raw.get("pod").filter(|p| !p.is_null())
        {
            obj.insert("peer_pod".into(), p.clone());
        }
        let end = |f: &Fetched| {
            serde_json::json!({
                "node": f.node,
                "id": f.id,
                "kind": f.finding.kind,
                "layer": f.finding.layer,
            })
        };
        obj.insert(
            "joined".into(),
            serde_json::json!({"client": end(client), "server": end(server)}),
        );
    }
    // The finding is the client's with these fields changed, so it reads as one.
    let mut out = Fetched::from_value(raw.clone()).unwrap_or_else(|_| client.clone());
    out.raw = raw;
    out.id = Some(id);
    out
}

/// `chain` (`table`, `handle N`) of a rule the agent named.
fn describe_rule(rule: &Value) -> String {
    let text = |k: &str| {
        rule.get(k).and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
    };
    let mut out = text("chain").unwrap_or_else(|| "?".into());
    let mut at = Vec::new();
    if let Some(t) = text("table") {
        at.push(format!("table {t}"));
    }
    if let Some(h) = text("handle") {
        at.push(format!("handle {h}"));
    }
    if !at.is_empty() {
        out.push_str(&format!(" ({})", at.join(", ")));
    }
    out
}

/// `batch` with each client timeout that meets an inbound drop of `partners` (another
/// node's, the batch's own or fetched apart) replaced by their joined finding, and the
/// drops joined removed from the batch. Each drop joins at most one timeout.
pub(crate) fn join(batch: Vec<Fetched>, partners: &[Fetched]) -> Vec<Fetched> {
    let mut used: Vec<String> = Vec::new();
    let key = |f: &Fetched| super::follow::identity(f);
    let mut out: Vec<Fetched> = batch
        .iter()
        .map(|f| {
            if !is_client_side(f) {
                return f.clone();
            }
            let partner = partners
                .iter()
                .chain(batch.iter())
                .find(|s| same_flow(f, s) && !used.contains(&key(s)));
            match partner {
                Some(s) => {
                    used.push(key(s));
                    joined(f, s)
                }
                None => f.clone(),
            }
        })
        .collect();
    out.retain(|f| !(is_inbound(f) && used.contains(&key(f))));
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::client::parse_findings;

    fn timeout(node: &str, dport: u16, first: &str, last: &str) -> Value {
        json!({
            "id": format!("c{dport}"), "node": node,
            "kind": "tcp_timeout", "layer": "unknown", "severity": "critical",
            "summary": "Connection to 10.244.1.7 is timing out", "remediation": "look",
            "evidence": {"syn_retransmits": 2, "path_probe": "passed"},
            "src": "10.244.2.9", "sport": 40000, "dst": "10.244.1.7", "dport": dport,
            "netns": 7,
            "pod": {"namespace": "shop", "name": "cart", "uid": "u-cart"},
            "count": 1, "first_seen": first, "last_seen": last, "status": "active",
        })
    }

    fn drop(node: &str, src: &str, dport: u16, first: &str, last: &str) -> Value {
        json!({
            "id": format!("s{dport}"), "node": node,
            "kind": "tcp_syn_dropped", "layer": "firewall", "severity": "warning",
            "summary": "SYNs dropped", "remediation": "allow it",
            "evidence": {
                "drop_reason": "NETFILTER_DROP", "syn_drops": 3, "action": "drop",
                "drop_interface": "vx0", "pod_interface": "vpod0",
                "policy": "default/deny-db",
                "rule": {"chain": "cali-tw-vpod0", "table": "filter", "handle": 4,
                         "verdict": "drop", "comment": "np default/deny-db"},
            },
            "src": src, "dst": "10.244.1.7", "dport": dport, "netns": 9,
            "pod": {"namespace": "default", "name": "db-0", "uid": "u-db"},
            "count": 3, "first_seen": first, "last_seen": last, "status": "active",
        })
    }

    const T0: &str = "2026-12-05T08:00:00.000Z";
    const T3: &str = "2026-12-05T08:00:03.000Z";
    const T4: &str = "2026-12-05T08:00:04.000Z";
    const LATER: &str = "2026-12-05T09:00:00.000Z";
    const LATER2: &str = "2026-12-05T09:00:03.000Z";

    fn batch(values: &[Value]) -> Vec<Fetched> {
        parse_findings(&Value::Array(values.to_vec()).to_string()).unwrap()
    }

    #[test]
    fn the_two_ends_of_one_connect_become_one_finding() {
        let b = batch(&[
            timeout("node-a", 80, T4, T4),
            drop("node-b", "10.244.2.9", 80, T0, T3),
        ]);
        let out = join(b, &[]);
        assert_eq!(out.len(), 1, "{out:#?}");
        let j = &out[0];
        assert_eq!(j.finding.kind, Kind::TcpTimeout);
        assert_eq!(j.finding.layer, Layer::Firewall);
        assert_eq!(j.node.as_deref(), Some("node-a"));
        assert_eq!(j.id.as_deref(), Some("c80+s80"));
        let e = &j.raw["evidence"];
        assert_eq!(e["drop_node"], "node-b");
        assert_eq!(e["drop_reason"], "NETFILTER_DROP");
        assert_eq!(e["policy"], "default/deny-db");
        assert_eq!(e["rule"]["chain"], "cali-tw-vpod0");
        assert_eq!(e["path_probe"], "passed", "the client's evidence stays");
        assert_eq!(j.raw["joined"]["client"]["id"], "c80");
        assert_eq!(j.raw["joined"]["server"]["id"], "s80");
        assert_eq!(j.raw["joined"]["server"]["node"], "node-b");
        assert_eq!(j.raw["peer_pod"]["name"], "db-0");
        assert!(
            j.finding.summary.contains("node node-b"),
            "{}",
            j.finding.summary
        );
        assert!(j.finding.summary.contains("NetworkPolicy default/deny-db"));
        assert!(j.finding.remediation.contains("default/deny-db"));
        // The typed finding reads the same.
        assert_eq!(j.finding.peer_pod.as_ref().unwrap().name, "db-0");
    }

    #[test]
    fn weaker_evidence_stays_two_findings() {
        let cases = [
            // Another port.
            (
                timeout("node-a", 81, T4, T4),
                drop("node-b", "10.244.2.9", 80, T0, T3),
            ),
            // Another client address (a node that SNATs).
            (
                timeout("node-a", 80, T4, T4),
                drop("node-b", "10.0.0.2", 80, T0, T3),
            ),
            // Times apart: the drops an hour later.
            (
                timeout("node-a", 80, T4, T4),
                drop("node-b", "10.244.2.9", 80, LATER, LATER2),
            ),
            // The same node.
            (
                timeout("node-b", 80, T4, T4),
                drop("node-b", "10.244.2.9", 80, T0, T3),
            ),
        ];
        for (c, s) in cases {
            let out = join(batch(&[c.clone(), s.clone()]), &[]);
            assert_eq!(out.len(), 2, "{c:#}\n{s:#}");
            assert!(out.iter().all(|f| f.raw.get("joined").is_none()));
        }
        // A timeout its own node explained stays its own.
        let mut own = timeout("node-a", 80, T4, T4);
        own["layer"] = "firewall".into();
        let out = join(batch(&[own, drop("node-b", "10.244.2.9", 80, T0, T3)]), &[]);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn a_partner_fetched_apart_joins_and_counts_once() {
        let b = batch(&[timeout("node-a", 80, T4, T4)]);
        let partners = batch(&[drop("node-b", "10.244.2.9", 80, T0, T3)]);
        let out = join(b, &partners);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].finding.layer, Layer::Firewall);
        // Drops that came 30 s before the timeout still overlap its attempt.
        let b = batch(&[timeout(
            "node-a",
            80,
            "2026-12-05T08:00:30.000Z",
            "2026-12-05T08:00:30.000Z",
        )]);
        assert_eq!(join(b, &partners)[0].finding.layer, Layer::Firewall);
    }
}
