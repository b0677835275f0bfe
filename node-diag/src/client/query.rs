//! The filters of `node-diag findings`: sent to the agent as `/findings` query
//! parameters, so a busy store is filtered where it is, and applied again to what comes
//! back, since an agent older than the parameters ignores them and sends everything.

use std::time::{Duration, SystemTime};

use crate::findings::{Finding, Kind, Severity, Status};

/// The largest `limit` an agent accepts.
pub(crate) const MAX_LIMIT: usize = 10_000;

/// Which findings to show; empty lists and `None` mean "any".
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Filters {
    pub(crate) kinds: Vec<Kind>,
    /// The least severe shown.
    pub(crate) severity: Option<Severity>,
    /// The Kubernetes namespace of the finding's pod or peer pod.
    pub(crate) namespace: Option<String>,
    /// `NAME` or `NAMESPACE/NAME` of the finding's pod or peer pod.
    pub(crate) pod: Option<String>,
    pub(crate) since: Option<Since>,
    pub(crate) statuses: Vec<Status>,
}

/// `--since`: a duration back from now, or a point in time, as the user wrote it (it is
/// sent as written, so the agent reads a duration against its own clock).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Since {
    pub(crate) text: String,
    pub(crate) when: SinceWhen,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum SinceWhen {
    Ago(Duration),
    At(SystemTime),
}

impl Since {
    /// The earliest `last_seen` shown, for a poll made at `now`.
    fn threshold(&self, now: SystemTime) -> SystemTime {
        match self.when {
            SinceWhen::Ago(d) => now.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH),
            SinceWhen::At(t) => t,
        }
    }
}

/// Parses `--since`: a duration (`10m`, `1h30m`) or an RFC 3339 time
/// (`2026-12-05T07:30:00Z`, `2026-12-05T09:30:00+02:00`).
pub(crate) fn parse_since(text: &str) -> Result<Since, String> {
    let when = match humantime::parse_duration(text) {
        Ok(d) => SinceWhen::Ago(d),
        Err(_) => SinceWhen::At(parse_time(text).ok_or_else(|| {
            format!(
                "{text:?} is neither a duration (10m, 1h30m) nor an RFC 3339 time (2026-12-05T07:30:00Z)"
            )
        })?),
    };
    Ok(Since {
        text: text.to_string(),
        when,
    })
}

/// An RFC 3339 time, `Z` or with a `+hh:mm`/`-hh:mm` offset (humantime reads only UTC).
pub(crate) fn parse_time(text: &str) -> Option<SystemTime> {
    if let Ok(t) = humantime::parse_rfc3339_weak(text.trim_end_matches(['Z', 'z'])) {
        return Some(t);
    }
    let (head, offset) = text.split_at(text.len().checked_sub(6)?);
    let sign = match offset.as_bytes()[0] {
        b'+' => 1i64,
        b'-' => -1,
        _ => return None,
    };
    let (h, m) = offset[1..].split_once(':')?;
    let secs = sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60);
    let local = humantime::parse_rfc3339_weak(head).ok()?;
    // Local time = UTC + offset, so UTC = local − offset.
    if secs >= 0 {
        local.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    } else {
        local.checked_add(Duration::from_secs(secs.unsigned_abs()))
    }
}

/// A contract name (`tcp_refused`, `warning`, `resolved`) read as its enum, through the
/// same serde names the agent writes.
pub(crate) fn parse_name<T: serde::de::DeserializeOwned>(
    what: &str,
    examples: &str,
    text: &str,
) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(text.to_string()))
        .map_err(|_| format!("unknown {what} {text:?} (expected {examples})"))
}

impl Filters {
    /// The `/findings` query string (without `?`) asking for these findings, at most
    /// `limit` of them.
    pub(crate) fn query(&self, limit: usize) -> String {
        let mut params: Vec<(&str, String)> = Vec::new();
        if !self.kinds.is_empty() {
            let kinds: Vec<&str> = self.kinds.iter().map(|k| k.as_str()).collect();
            params.push(("kind", kinds.join(",")));
        }
        if let Some(s) = self.severity {
            params.push(("severity", s.as_str().to_string()));
        }
        if let Some(ns) = &self.namespace {
            params.push(("namespace", ns.clone()));
        }
        if let Some(pod) = &self.pod {
            params.push(("pod", pod.clone()));
        }
        if let Some(since) = &self.since {
            params.push(("since", since.text.clone()));
        }
        if !self.statuses.is_empty() {
            let statuses: Vec<&str> = self.statuses.iter().map(|s| s.as_str()).collect();
            params.push(("status", statuses.join(",")));
        }
        params.push(("limit", limit.clamp(1, MAX_LIMIT).to_string()));
        params
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect::<Vec<_>>()
            .join("&")
    }

    /// Whether a filter other than `--since` keeps findings away: one that could hide a
    /// timeout's other end in `--cluster`'s joins.
    pub(crate) fn narrows(&self) -> bool {
        !self.kinds.is_empty()
            || self.severity.is_some()
            || self.namespace.is_some()
            || self.pod.is_some()
            || !self.statuses.is_empty()
    }

    /// Whether `f` passes every filter, for a poll made at `now`.
    pub(crate) fn matches(&self, f: &Finding, now: SystemTime) -> bool {
        let pods = [f.pod.as_ref(), f.peer_pod.as_ref()];
        let kind = self.kinds.is_empty() || self.kinds.contains(&f.kind);
        let severity = self.severity.is_none_or(|min| f.severity >= min);
        let namespace = self.namespace.as_ref().is_none_or(|ns| {
            pods.iter()
                .flatten()
                .any(|p| p.namespace.eq_ignore_ascii_case(ns))
        });
        let pod = self.pod.as_ref().is_none_or(|want| {
            let (ns, name) = match want.split_once('/') {
                Some((ns, name)) => (Some(ns), name),
                None => (None, want.as_str()),
            };
            pods.iter()
                .flatten()
                .any(|p| p.name == name && ns.is_none_or(|ns| p.namespace == ns))
        });
        // A time this client cannot read is kept rather than hidden.
        let since = self
            .since
            .as_ref()
            .is_none_or(|s| parse_time(&f.last_seen).is_none_or(|seen| seen >= s.threshold(now)));
        let status = self.statuses.is_empty() || self.statuses.contains(&f.status);
        kind && severity && namespace && pod && since && status
    }
}

/// Percent-encodes a query value: RFC 3986's unreserved characters, and the `,`, `/` and
/// `:` of lists, pods and times, stay as they are; `+` (a space to form decoders) does not.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~,/:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::fixtures::refused;
    use crate::pods::PodRef;

    fn pod(ns: &str, name: &str) -> PodRef {
        PodRef {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{ns}-{name}"),
        }
    }

    #[test]
    fn every_filter_is_a_query_parameter() {
        assert_eq!(Filters::default().query(10_000), "limit=10000");
        let f = Filters {
            kinds: vec![Kind::TcpRefused, Kind::TcpTimeout],
            severity: Some(Severity::Warning),
            namespace: Some("shop".into()),
            pod: Some("shop/cart-7d9f".into()),
            since: Some(parse_since("2026-12-05T09:30:00+02:00").unwrap()),
            statuses: vec![Status::Active, Status::Resolved],
        };
        assert_eq!(
            f.query(10),
            "kind=tcp_refused,tcp_timeout&severity=warning&namespace=shop&pod=shop/cart-7d9f\
             &since=2026-12-05T09:30:00%2B02:00&status=active,resolved&limit=10"
        );
        assert_eq!(encode("a b&c=d"), "a%20b%26c%3Dd");
        // The agent takes 1..=10000.
        assert!(Filters::default().query(0).ends_with("limit=1"));
        assert!(Filters::default().query(50_000).ends_with("limit=10000"));
    }

    #[test]
    fn since_is_a_duration_or_a_time() {
        assert_eq!(
            parse_since("10m").unwrap().when,
            SinceWhen::Ago(Duration::from_secs(600))
        );
        let utc = parse_since("2026-12-05T07:30:00Z").unwrap().when;
        let offset = parse_since("2026-12-05T09:30:00+02:00").unwrap().when;
        let behind = parse_since("2026-12-05T02:30:00-05:00").unwrap().when;
        assert_eq!(utc, offset);
        assert_eq!(utc, behind);
        let err = parse_since("yesterday").unwrap_err();
        assert!(err.contains("10m") && err.contains("RFC 3339"), "{err}");
    }

    #[test]
    fn local_filtering_matches_what_the_agent_would_send() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(3600);
        let mut f = refused(4000);
        f.pod = Some(pod("shop", "cart"));
        f.peer_pod = Some(pod("db", "pg-0"));
        f.last_seen = "1970-01-01T00:55:00.000Z".into();
        let pass = |filters: Filters| filters.matches(&f, now);
        assert!(pass(Filters::default()));
        assert!(pass(Filters {
            kinds: vec![Kind::TcpTimeout, Kind::TcpRefused],
            ..Default::default()
        }));
        assert!(!pass(Filters {
            kinds: vec![Kind::TcpTimeout],
            ..Default::default()
        }));
        assert!(pass(Filters {
            severity: Some(Severity::Warning),
            ..Default::default()
        }));
        assert!(!pass(Filters {
            severity: Some(Severity::Critical),
            ..Default::default()
        }));
        for ns in ["shop", "db"] {
            assert!(pass(Filters {
                namespace: Some(ns.into()),
                ..Default::default()
            }));
        }
        assert!(!pass(Filters {
            namespace: Some("kube-system".into()),
            ..Default::default()
        }));
        for p in ["cart", "shop/cart", "pg-0", "db/pg-0"] {
            assert!(
                pass(Filters {
                    pod: Some(p.into()),
                    ..Default::default()
                }),
                "{p}"
            );
        }
        for p in ["car", "db/cart", "other/pg-0"] {
            assert!(
                !pass(Filters {
                    pod: Some(p.into()),
                    ..Default::default()
                }),
                "{p}"
            );
        }
        assert!(pass(Filters {
            since: Some(parse_since("10m").unwrap()),
            ..Default::default()
        }));
        assert!(!pass(Filters {
            since: Some(parse_since("2m").unwrap()),
            ..Default::default()
        }));
        assert!(!pass(Filters {
            since: Some(parse_since("1970-01-01T00:56:00Z").unwrap()),
            ..Default::default()
        }));
        assert!(!pass(Filters {
            statuses: vec![Status::Resolved, Status::Superseded],
            ..Default::default()
        }));
        let mut resolved = f.clone();
        resolved.status = Status::Resolved;
        assert!(
            Filters {
                statuses: vec![Status::Resolved],
                ..Default::default()
            }
            .matches(&resolved, now)
        );
        // A finding without pods never matches a pod or namespace filter.
        let bare = refused(1);
        assert!(
            !Filters {
                namespace: Some("shop".into()),
                ..Default::default()
            }
            .matches(&bare, now)
        );
    }

    #[test]
    fn names_are_the_contract_names() {
        assert_eq!(
            parse_name::<Kind>("kind", "", "pmtud_blackhole"),
            Ok(Kind::PmtudBlackhole)
        );
        assert_eq!(
            parse_name::<Severity>("severity", "", "critical"),
            Ok(Severity::Critical)
        );
        let err =
            parse_name::<Status>("status", "active, resolved, superseded", "gone").unwrap_err();
        assert!(
            err.contains("\"gone\"") && err.contains("resolved"),
            "{err}"
        );
    }
}
