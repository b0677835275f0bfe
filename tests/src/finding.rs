//! Reading the agent's findings (one JSON object per stdout line).
//!
//! The fields every finding carries: `kind`, `layer`, `severity`, `summary`,
//! `remediation`, `evidence` (object), `src`, `dst`, `dport`, `sport`, `netns`,
//! `count`, `first_seen`, `last_seen`.

use std::net::{IpAddr, Ipv4Addr};

use serde_json::Value;

/// A string field of a finding, or `""` when absent or not a string.
pub fn field<'a>(finding: &'a Value, name: &str) -> &'a str {
    finding[name].as_str().unwrap_or_default()
}

/// Whether the finding is about the connection `src` -> `dst`:`dport`.
pub fn flow_is(
    finding: &Value,
    src: impl Into<IpAddr>,
    dst: impl Into<IpAddr>,
    dport: u16,
) -> bool {
    field(finding, "src") == src.into().to_string()
        && field(finding, "dst") == dst.into().to_string()
        && finding["dport"].as_u64() == Some(u64::from(dport))
}

/// Whether `ip` is the finding's source or destination.
pub fn involves(finding: &Value, ip: Ipv4Addr) -> bool {
    let ip = ip.to_string();
    field(finding, "src") == ip || field(finding, "dst") == ip
}

/// Panics unless `finding` has every field of the contract with its type.
pub fn assert_shape(finding: &Value) {
    let problems: Vec<String> = shape_problems(finding);
    assert!(
        problems.is_empty(),
        "finding does not follow the contract ({}):\n{finding:#}",
        problems.join("; ")
    );
}

fn shape_problems(f: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if !f.is_object() {
        return vec!["not a JSON object".to_owned()];
    }
    // A server-side finding names its listener instead of one client's flow.
    let listener = f.get("listener").is_some();
    let (strings, numbers): (&[&str], &[&str]) = if listener {
        (&["listener"], &["count"])
    } else {
        (&["src", "dst"], &["dport", "sport", "count"])
    };
    for &name in ["kind", "layer", "severity", "summary", "remediation"]
        .iter()
        .chain(strings)
    {
        match f[name].as_str() {
            Some(s) if !s.is_empty() => {}
            _ => problems.push(format!("`{name}` is not a non-empty string")),
        }
    }
    for &name in numbers {
        if f[name].as_u64().is_none() {
            problems.push(format!("`{name}` is not an unsigned number"));
        }
    }
    if listener && (f.get("src").is_some() || f.get("dport").is_some()) {
        problems.push("a listener finding also names a flow".to_owned());
    }
    // Service/NAT fields: optional, typed, and the backend's address and port together.
    if f.get("service")
        .is_some_and(|s| !s.as_str().is_some_and(|s| s.contains('/')))
    {
        problems.push("`service` is not a \"<namespace>/<name>:<port>\" string".to_owned());
    }
    if f.get("backend").is_some() != f.get("backend_port").is_some() {
        problems.push("`backend` and `backend_port` come together".to_owned());
    }
    if f.get("backend").is_some_and(|b| {
        b.as_str()
            .and_then(|b| b.parse::<std::net::IpAddr>().ok())
            .is_none()
    }) {
        problems.push("`backend` is not an IP address".to_owned());
    }
    // Pods: {namespace, name, uid}, all non-empty strings, when present.
    for name in ["pod", "peer_pod"] {
        if let Some(p) = f.get(name)
            && ["namespace", "name", "uid"]
                .iter()
                .any(|k| p[k].as_str().is_none_or(|v| v.is_empty()))
        {
            problems.push(format!("`{name}` is not {{namespace, name, uid}}"));
        }
    }
    if f["count"].as_u64() == Some(0) {
        problems.push("`count` is 0".to_owned());
    }
    if !f["evidence"].is_object() {
        problems.push("`evidence` is not an object".to_owned());
    }
    for name in ["netns", "first_seen", "last_seen"] {
        if f.get(name).is_none_or(Value::is_null) {
            problems.push(format!("`{name}` is missing"));
        }
    }
    problems
}

/// Whether `finding` is an active `overlay_mtu_mismatch` about `interface` in namespace
/// `netns` (by name).
pub fn is_mismatch_on(finding: &Value, netns: &str, interface: &str) -> bool {
    field(finding, "kind") == "overlay_mtu_mismatch"
        && finding["interface"] == interface
        && finding["evidence"]["netns_name"] == netns
        && finding["status"] == "active"
}

/// A predicate for [`is_mismatch_on`], for `Agent::wait_finding` and friends.
pub fn mismatch_on<'a>(netns: &'a str, interface: &'a str) -> impl Fn(&Value) -> bool + 'a {
    move |f| is_mismatch_on(f, netns, interface)
}

/// Panics unless `finding` is an MTU-model finding with the contract's fields: interface
/// findings carry no flow, the rest of the contract holds, and the evidence has the
/// arithmetic's numbers.
pub fn assert_shape_mtu(finding: &Value) {
    let f = finding;
    for key in [
        "kind",
        "layer",
        "severity",
        "summary",
        "remediation",
        "first_seen",
        "last_seen",
    ] {
        assert!(f[key].is_string(), "`{key}` missing: {f:#}");
    }
    assert!(f["evidence"].is_object() && f["count"].is_u64(), "{f:#}");
    assert_eq!(field(f, "layer"), "overlay_mtu");
    assert_eq!(field(f, "severity"), "warning");
    for key in [
        "underlay_mtu",
        "overhead",
        "expected_mtu",
        "actual_mtu",
        "headroom",
    ] {
        assert!(
            f["evidence"][key].is_i64() || f["evidence"][key].is_u64(),
            "evidence `{key}` missing: {f:#}"
        );
    }
}

/// Panics unless `f` is a black hole the sender's TCP MTU probing recovered: a warning
/// naming the probing, the MSS shrunk from at least `mss_at_least`, seconds lost and the
/// full-size retransmits before.
pub fn assert_recovered_by_probing(f: &Value, mss_at_least: u64) {
    assert_shape(f);
    assert_eq!(field(f, "layer"), "icmp_filtered", "{f:#}");
    assert_eq!(field(f, "severity"), "warning", "{f:#}");
    let e = &f["evidence"];
    assert_eq!(e["recovered_by"], "tcp_mtu_probing", "{f:#}");
    let (before, after) = (
        e["mss_before"].as_u64().unwrap(),
        e["mss_after"].as_u64().unwrap(),
    );
    assert!(before >= mss_at_least && after < before, "{f:#}");
    assert!(e["seconds_lost"].as_f64().unwrap() >= 0.5, "{f:#}");
    assert!(e["fullsize_retransmits"].as_u64().unwrap() >= 2, "{f:#}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Value {
        json!({
            "kind": "tcp_refused", "layer": "listener", "severity": "warning",
            "summary": "s", "remediation": "r", "evidence": {},
            "src": "10.244.1.7", "dst": "10.244.2.9", "dport": 8081, "sport": 40000,
            "netns": 4026532000u64, "count": 1,
            "first_seen": "2026-01-01T00:00:00Z", "last_seen": "2026-01-01T00:00:00Z",
        })
    }

    #[test]
    fn matches_flow() {
        let f = sample();
        let (a, b) = (Ipv4Addr::new(10, 244, 1, 7), Ipv4Addr::new(10, 244, 2, 9));
        assert!(flow_is(&f, a, b, 8081));
        assert!(!flow_is(&f, b, a, 8081));
        assert!(!flow_is(&f, a, b, 8082));
        assert!(involves(&f, b));
        assert!(!involves(&f, Ipv4Addr::LOCALHOST));
    }

    #[test]
    fn checks_shape() {
        assert!(shape_problems(&sample()).is_empty());
        let mut f = sample();
        f["evidence"] = json!("text");
        f.as_object_mut().unwrap().remove("last_seen");
        assert_eq!(shape_problems(&f).len(), 2);
        // A listener finding: no flow, a listener.
        let mut f = sample();
        for name in ["src", "dst", "dport", "sport"] {
            f.as_object_mut().unwrap().remove(name);
        }
        assert!(!shape_problems(&f).is_empty());
        f["listener"] = json!("10.244.1.7:8080");
        assert!(shape_problems(&f).is_empty(), "{:?}", shape_problems(&f));
    }
}
