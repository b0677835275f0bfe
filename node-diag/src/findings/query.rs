//! `/findings`' query: which findings a client asks for, parsed from the query
//! parameters, and the selection it makes (pure: the HTTP handler only moves bytes).
//!
//! `kind=K1,K2&severity=MIN&namespace=NS&pod=[NS/]NAME&since=SINCE&status=S1,S2&limit=N`:
//! every filter given must hold; a list matches any of its values. The answer is the
//! `limit` most recent matches by `last_seen`, oldest first, and how many matched.
//! A bad value is an error naming it and what is valid, never a silent default.

use std::time::{Duration, SystemTime};

use super::{Finding, Kind, Severity, Status};
use crate::pods::PodRef;

/// Findings returned when no `limit` is given.
pub(crate) const DEFAULT_LIMIT: usize = 1000;
/// The largest `limit` accepted: the store holds fewer.
pub(crate) const MAX_LIMIT: usize = 10_000;

const PARAMETERS: &str = "kind, severity, namespace, pod, since, status, limit";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QueryError {
    #[error("unknown kind {given:?}: valid kinds are {}", names(Kind::ALL))]
    Kind { given: String },
    #[error(
        "unknown severity {given:?}: valid severities are {}",
        names(Severity::ALL)
    )]
    Severity { given: String },
    #[error("unknown status {given:?}: valid statuses are {}", names(Status::ALL))]
    Status { given: String },
    #[error(
        "bad since {given:?}: give a duration (30s, 10m, 2h) or an RFC 3339 time (2026-01-02T15:04:05Z)"
    )]
    Since { given: String },
    #[error("bad pod {given:?}: give NAME or NAMESPACE/NAME")]
    Pod { given: String },
    #[error("bad limit {given:?}: give a number from 0 to {}", MAX_LIMIT)]
    Limit { given: String },
    #[error("{name} given twice: give it once (kind and status take a comma list)")]
    Repeated { name: String },
    #[error("unknown parameter {name:?}: valid parameters are {}", PARAMETERS)]
    Unknown { name: String },
}

fn names<T: Copy + std::fmt::Display>(all: &[T]) -> String {
    all.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `pod=`: a name, in any namespace unless one is given.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodFilter {
    namespace: Option<String>,
    name: String,
}

impl PodFilter {
    fn matches(&self, pod: &PodRef) -> bool {
        pod.name == self.name
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == pod.namespace)
    }
}

/// What a client asked for. The default asks for everything, up to [`DEFAULT_LIMIT`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Query {
    kinds: Option<Vec<Kind>>,
    min_severity: Option<Severity>,
    namespace: Option<String>,
    pod: Option<PodFilter>,
    since: Option<SystemTime>,
    statuses: Option<Vec<Status>>,
    limit: usize,
}

impl Default for Query {
    fn default() -> Self {
        Self {
            kinds: None,
            min_severity: None,
            namespace: None,
            pod: None,
            since: None,
            statuses: None,
            limit: DEFAULT_LIMIT,
        }
    }
}

impl Query {
    /// Parses the decoded query parameters; `now` anchors a relative `since`. An empty
    /// value counts as not given.
    pub(crate) fn parse(params: &[(String, String)], now: SystemTime) -> Result<Self, QueryError> {
        let mut q = Self::default();
        let mut seen: Vec<&str> = Vec::new();
        for (name, value) in params {
            let value = value.trim();
            if !PARAMETERS.split(", ").any(|p| p == name) {
                return Err(QueryError::Unknown { name: name.clone() });
            }
            if value.is_empty() {
                continue;
            }
            if seen.contains(&name.as_str()) {
                return Err(QueryError::Repeated { name: name.clone() });
            }
            seen.push(name);
            match name.as_str() {
                "kind" => {
                    q.kinds = Some(list(value, Kind::ALL, |given| QueryError::Kind { given })?);
                }
                "severity" => {
                    q.min_severity = Some(one(value, Severity::ALL, |given| {
                        QueryError::Severity { given }
                    })?);
                }
                "status" => {
                    q.statuses = Some(list(value, Status::ALL, |given| QueryError::Status {
                        given,
                    })?);
                }
                "namespace" => q.namespace = Some(value.to_owned()),
                "pod" => q.pod = Some(pod(value)?),
                "since" => q.since = Some(since(value, now)?),
                "limit" => {
                    q.limit = value
                        .parse()
                        .ok()
                        .filter(|&n| n <= MAX_LIMIT)
                        .ok_or_else(|| QueryError::Limit {
                            given: value.to_owned(),
                        })?;
                }
                _ => unreachable!("checked against PARAMETERS above"),
            }
        }
        Ok(q)
    }

    /// Whether `f` passes every filter (not the limit).
    pub(crate) fn matches(&self, f: &Finding) -> bool {
        let pods = || f.pod.iter().chain(f.peer_pod.iter());
        self.kinds.as_ref().is_none_or(|k| k.contains(&f.kind))
            && self.min_severity.is_none_or(|min| f.severity >= min)
            && self.statuses.as_ref().is_none_or(|s| s.contains(&f.status))
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| pods().any(|p| p.namespace == *ns))
            && self
                .pod
                .as_ref()
                .is_none_or(|want| pods().any(|p| want.matches(p)))
            && self.since.is_none_or(|since| last_seen(f) >= since)
    }

    /// The findings of `items` (in store order) this query picks: the `limit` most
    /// recent matches by `last_seen` (ties: the later in store order), oldest first.
    pub(crate) fn select<'a, T>(
        &self,
        items: &'a [T],
        finding: impl Fn(&T) -> &Finding,
    ) -> Selection<'a, T> {
        let mut matched: Vec<(SystemTime, &T)> = items
            .iter()
            .filter_map(|item| {
                let f = finding(item);
                self.matches(f).then(|| (last_seen(f), item))
            })
            .collect();
        let total = matched.len();
        // Stable: equal times keep store order.
        matched.sort_by_key(|&(t, _)| t);
        let cut = total.saturating_sub(self.limit);
        Selection {
            picked: matched.drain(cut..).map(|(_, item)| item).collect(),
            total,
        }
    }
}

/// What [`Query::select`] picked.
#[derive(Debug)]
pub(crate) struct Selection<'a, T> {
    /// Oldest first.
    pub(crate) picked: Vec<&'a T>,
    /// How many matched before the limit.
    pub(crate) total: usize,
}

impl<T> Selection<'_, T> {
    /// Whether the limit left matches out.
    pub(crate) fn truncated(&self) -> bool {
        self.picked.len() < self.total
    }
}

/// When a finding was last seen; one the agent did not stamp (a hand-made one) counts
/// as the oldest.
fn last_seen(f: &Finding) -> SystemTime {
    humantime::parse_rfc3339(&f.last_seen).unwrap_or(SystemTime::UNIX_EPOCH)
}

fn one<T: Copy + std::fmt::Display>(
    value: &str,
    all: &[T],
    err: impl Fn(String) -> QueryError,
) -> Result<T, QueryError> {
    all.iter()
        .copied()
        .find(|v| v.to_string() == value)
        .ok_or_else(|| err(value.to_owned()))
}

fn list<T: Copy + std::fmt::Display>(
    value: &str,
    all: &[T],
    err: impl Fn(String) -> QueryError,
) -> Result<Vec<T>, QueryError> {
    value
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| one(v, all, &err))
        .collect()
}

fn pod(value: &str) -> Result<PodFilter, QueryError> {
    let bad = || QueryError::Pod {
        given: value.to_owned(),
    };
    let (namespace, name) = match value.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, value),
    };
    if name.is_empty() || name.contains('/') || namespace.is_some_and(str::is_empty) {
        return Err(bad());
    }
    Ok(PodFilter {
        namespace: namespace.map(str::to_owned),
        name: name.to_owned(),
    })
}

/// A duration back from `now`, or an RFC 3339 time (`Z` or a `±HH:MM` offset).
fn since(value: &str, now: SystemTime) -> Result<SystemTime, QueryError> {
    let bad = || QueryError::Since {
        given: value.to_owned(),
    };
    if value.starts_with(|c: char| c.is_ascii_digit())
        && let Ok(d) = humantime::parse_duration(value)
    {
        return Ok(now.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH));
    }
    if let Ok(t) = humantime::parse_rfc3339(value) {
        return Ok(t);
    }
    // humantime reads UTC (`Z`) only: take an offset off by hand.
    let at = value.len().saturating_sub(6);
    if !value.is_char_boundary(at) {
        return Err(bad());
    }
    let (local, offset) = value.split_at(at);
    let sign = match offset.as_bytes().first() {
        Some(b'+') => 1,
        Some(b'-') => -1,
        _ => return Err(bad()),
    };
    let (h, m) = offset[1..].split_once(':').ok_or_else(bad)?;
    let (h, m): (u64, u64) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if h > 23 || m > 59 {
        return Err(bad());
    }
    let t = humantime::parse_rfc3339(&format!("{local}Z")).map_err(|_| bad())?;
    let shift = Duration::from_secs(h * 3600 + m * 60);
    // 12:00+02:00 is 10:00Z.
    if sign > 0 {
        t.checked_sub(shift).ok_or_else(bad)
    } else {
        t.checked_add(shift).ok_or_else(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::findings::{Layer, fixtures};

    fn t(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    const NOW: &str = "2026-01-01T12:00:00Z";

    fn parse(q: &str) -> Result<Query, QueryError> {
        let params: Vec<(String, String)> = q
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_owned(), v.to_owned())
            })
            .collect();
        Query::parse(&params, t(NOW))
    }

    fn pod_ref(ns: &str, name: &str) -> PodRef {
        PodRef {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{ns}-{name}"),
        }
    }

    /// A finding of `kind` last seen at `seen`, told apart by `dport`.
    fn finding(kind: Kind, severity: Severity, seen: &str, dport: u16) -> Finding {
        let mut f = fixtures::refused(1000);
        f.kind = kind;
        f.severity = severity;
        f.last_seen = seen.into();
        f.dport = Some(dport);
        f
    }

    fn picked(q: &Query, items: &[Finding]) -> Vec<u16> {
        q.select(items, |f| f)
            .picked
            .iter()
            .map(|f| f.dport.unwrap())
            .collect()
    }

    fn store() -> Vec<Finding> {
        let mut a = finding(
            Kind::TcpRefused,
            Severity::Warning,
            "2026-01-01T11:59:50Z",
            1,
        );
        a.pod = Some(pod_ref("shop", "web-1"));
        let mut b = finding(
            Kind::TcpTimeout,
            Severity::Critical,
            "2026-01-01T11:00:00Z",
            2,
        );
        b.peer_pod = Some(pod_ref("db", "pg-0"));
        b.status = Status::Resolved;
        let mut c = finding(
            Kind::OverlayMtuMismatch,
            Severity::Info,
            "2026-01-01T11:59:00Z",
            3,
        );
        c.layer = Layer::OverlayMtu;
        c.pod = Some(pod_ref("db", "web-1"));
        vec![a, b, c]
    }

    #[test]
    fn no_parameters_select_everything_oldest_first() {
        let q = parse("").unwrap();
        assert_eq!(q, Query::default());
        let items = store();
        let sel = q.select(&items, |f| f);
        assert_eq!(sel.total, 3);
        assert!(!sel.truncated());
        assert_eq!(picked(&q, &store()), [2, 3, 1]);
    }

    #[test]
    fn kind_takes_a_list() {
        assert_eq!(picked(&parse("kind=tcp_refused").unwrap(), &store()), [1]);
        assert_eq!(
            picked(
                &parse("kind=tcp_timeout,overlay_mtu_mismatch").unwrap(),
                &store()
            ),
            [2, 3]
        );
    }

    #[test]
    fn severity_is_a_minimum() {
        assert_eq!(
            picked(&parse("severity=info").unwrap(), &store()),
            [2, 3, 1]
        );
        assert_eq!(
            picked(&parse("severity=warning").unwrap(), &store()),
            [2, 1]
        );
        assert_eq!(picked(&parse("severity=critical").unwrap(), &store()), [2]);
    }

    #[test]
    fn namespace_matches_either_pod() {
        assert_eq!(picked(&parse("namespace=shop").unwrap(), &store()), [1]);
        assert_eq!(picked(&parse("namespace=db").unwrap(), &store()), [2, 3]);
        assert!(picked(&parse("namespace=none").unwrap(), &store()).is_empty());
    }

    #[test]
    fn pod_matches_a_name_or_a_namespaced_name_on_either_end() {
        assert_eq!(picked(&parse("pod=web-1").unwrap(), &store()), [3, 1]);
        assert_eq!(picked(&parse("pod=shop/web-1").unwrap(), &store()), [1]);
        assert_eq!(picked(&parse("pod=db/pg-0").unwrap(), &store()), [2]);
        assert!(picked(&parse("pod=shop/pg-0").unwrap(), &store()).is_empty());
        for bad in ["pod=/web", "pod=shop/", "pod=a/b/c"] {
            assert!(
                matches!(parse(bad), Err(QueryError::Pod { .. })),
                "{bad} is refused"
            );
        }
    }

    #[test]
    fn since_takes_a_duration_or_a_time() {
        // 11:59:50 and 11:59:00 are within 5 minutes of noon; 11:00 is not.
        assert_eq!(picked(&parse("since=5m").unwrap(), &store()), [3, 1]);
        assert_eq!(picked(&parse("since=30s").unwrap(), &store()), [1]);
        assert_eq!(picked(&parse("since=2h").unwrap(), &store()), [2, 3, 1]);
        // At or after: the boundary itself is in.
        assert_eq!(
            picked(&parse("since=2026-01-01T11:59:00Z").unwrap(), &store()),
            [3, 1]
        );
        assert_eq!(
            picked(&parse("since=2026-01-01T13:59:00+02:00").unwrap(), &store()),
            [3, 1]
        );
        assert_eq!(
            parse("since=2026-01-01T06:00:00-05:00").unwrap().since,
            Some(t("2026-01-01T11:00:00Z"))
        );
        for bad in [
            "since=yesterday",
            "since=10",
            "since=2026-13-01T00:00:00Z",
            "since=-5m",
            "since=2026-01-01T12:00:00+25:00",
            "since=ééé",
        ] {
            assert!(
                matches!(parse(bad), Err(QueryError::Since { .. })),
                "{bad} is refused"
            );
        }
    }

    #[test]
    fn status_takes_a_list() {
        assert_eq!(picked(&parse("status=active").unwrap(), &store()), [3, 1]);
        assert_eq!(
            picked(&parse("status=resolved,superseded").unwrap(), &store()),
            [2]
        );
    }

    #[test]
    fn filters_combine() {
        let q = parse("severity=warning&namespace=shop&status=active&since=1m").unwrap();
        assert_eq!(picked(&q, &store()), [1]);
        assert!(picked(&parse("kind=tcp_timeout&status=active").unwrap(), &store()).is_empty());
    }

    #[test]
    fn limit_keeps_the_most_recent_oldest_first() {
        let q = parse("limit=2").unwrap();
        let items = store();
        let sel = q.select(&items, |f| f);
        assert_eq!(sel.total, 3);
        assert!(sel.truncated());
        assert_eq!(picked(&q, &items), [3, 1]);
        let none = parse("limit=0").unwrap();
        let sel = none.select(&items, |f| f);
        assert_eq!((sel.picked.len(), sel.total, sel.truncated()), (0, 3, true));
        // The total counts the matches, not the store.
        let sel = parse("kind=tcp_refused&limit=1").unwrap();
        let sel = sel.select(&items, |f| f);
        assert_eq!(
            (sel.picked.len(), sel.total, sel.truncated()),
            (1, 1, false)
        );
    }

    #[test]
    fn equal_times_keep_store_order_and_the_limit_keeps_the_later() {
        let seen = "2026-01-01T11:00:00Z";
        let items: Vec<Finding> = (1..=4)
            .map(|p| finding(Kind::TcpRefused, Severity::Warning, seen, p))
            .collect();
        assert_eq!(picked(&parse("").unwrap(), &items), [1, 2, 3, 4]);
        assert_eq!(picked(&parse("limit=2").unwrap(), &items), [3, 4]);
    }

    #[test]
    fn the_default_limit_caps_a_large_store() {
        let items: Vec<Finding> = (0..1500)
            .map(|p| finding(Kind::TcpRefused, Severity::Warning, NOW, p))
            .collect();
        let sel = parse("").unwrap();
        let sel = sel.select(&items, |f| f);
        assert_eq!((sel.picked.len(), sel.total), (DEFAULT_LIMIT, 1500));
        assert_eq!(sel.picked[0].dport, Some(500));
        let q = parse("limit=10000").unwrap();
        assert_eq!(q.select(&items, |f| f).picked.len(), 1500);
    }

    #[test]
    fn bad_values_name_what_is_valid() {
        let e = parse("kind=tcp_refused,nope").unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown kind \"nope\": valid kinds are tcp_refused, tcp_timeout, tcp_unreachable, \
             tcp_reset, tcp_stall, overlay_mtu_mismatch, df_oversize_drop, pmtud_blackhole, \
             pmtud_disabled, tcp_syn_dropped"
        );
        assert_eq!(
            parse("severity=warn").unwrap_err().to_string(),
            "unknown severity \"warn\": valid severities are info, warning, critical"
        );
        assert!(matches!(
            parse("status=open"),
            Err(QueryError::Status { .. })
        ));
        for bad in ["limit=10001", "limit=-1", "limit=ten", "limit=1.5"] {
            assert!(
                matches!(parse(bad), Err(QueryError::Limit { .. })),
                "{bad} is refused"
            );
        }
        assert!(parse("limit=10000").is_ok());
        assert_eq!(
            parse("kinds=tcp_reset").unwrap_err().to_string(),
            "unknown parameter \"kinds\": valid parameters are kind, severity, namespace, pod, since, status, limit"
        );
        assert!(matches!(
            parse("limit=1&limit=2"),
            Err(QueryError::Repeated { .. })
        ));
        for e in [
            parse("since=x").unwrap_err(),
            parse("pod=/").unwrap_err(),
            parse("limit=x").unwrap_err(),
        ] {
            assert!(!e.to_string().contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn empty_values_are_not_given() {
        assert_eq!(
            parse("kind=&severity=&namespace=&pod=&since=&status=&limit=").unwrap(),
            Query::default()
        );
    }
}
