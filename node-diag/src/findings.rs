//! Findings: the agent's output contract. A finding names what failed, the layer it failed
//! in, the kernel evidence and the fix. Repeats of the same finding (same kind, layer,
//! flow minus the ephemeral source port, and netns) aggregate into one entry.

use std::{
    collections::HashMap,
    time::{Duration, Instant, SystemTime},
};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    TcpRefused,
    TcpTimeout,
    TcpUnreachable,
    TcpReset,
    OverlayMtuMismatch,
    DfOversizeDrop,
    PmtudBlackhole,
    PmtudDisabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Listener,
    Firewall,
    CniRouting,
    Peer,
    OverlayMtu,
    IcmpFiltered,
    HostSysctl,
    Unknown,
}

/// Whether the condition behind a finding still holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    #[default]
    Active,
    Resolved,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

macro_rules! names {
    ($ty:ty { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// The contract name, identical to the serde form.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name),+
                }
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

names!(Kind {
    TcpRefused => "tcp_refused",
    TcpTimeout => "tcp_timeout",
    TcpUnreachable => "tcp_unreachable",
    TcpReset => "tcp_reset",
    OverlayMtuMismatch => "overlay_mtu_mismatch",
    DfOversizeDrop => "df_oversize_drop",
    PmtudBlackhole => "pmtud_blackhole",
    PmtudDisabled => "pmtud_disabled",
});
names!(Layer {
    Listener => "listener",
    Firewall => "firewall",
    CniRouting => "cni_routing",
    Peer => "peer",
    OverlayMtu => "overlay_mtu",
    IcmpFiltered => "icmp_filtered",
    HostSysctl => "host_sysctl",
    Unknown => "unknown",
});
names!(Status {
    Active => "active",
    Resolved => "resolved",
});
names!(Severity {
    Info => "info",
    Warning => "warning",
    Critical => "critical",
});

/// One finding as printed, served on `/findings` and read back by `node-diag findings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: Kind,
    pub layer: Layer,
    pub severity: Severity,
    pub summary: String,
    pub remediation: String,
    pub evidence: serde_json::Map<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<u32>,
    /// The interface an interface-level finding (MTU, oversize drops) is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    pub count: u64,
    pub first_seen: String,
    pub last_seen: String,
    /// `resolved` once the condition went away (see [`Store::resolve_missing`]).
    #[serde(default)]
    pub status: Status,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<String>,
}

pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

impl Finding {
    /// A finding seen once, now, with no flow or interface attached yet.
    pub fn new(
        kind: Kind,
        layer: Layer,
        severity: Severity,
        summary: String,
        remediation: String,
        now: SystemTime,
    ) -> Self {
        let now = rfc3339(now);
        Self {
            kind,
            layer,
            severity,
            summary,
            remediation,
            evidence: Default::default(),
            src: None,
            dst: None,
            dport: None,
            sport: None,
            netns: None,
            interface: None,
            count: 1,
            first_seen: now.clone(),
            last_seen: now,
            status: Status::Active,
            resolved_at: None,
        }
    }

    /// The aggregation key: the source port changes with every attempt, so it is left out.
    fn key(&self) -> Key {
        Key {
            kind: self.kind,
            layer: self.layer,
            src: self.src.clone(),
            dst: self.dst.clone(),
            dport: self.dport,
            netns: self.netns,
            interface: self.interface.clone(),
        }
    }

    /// The readable one-liner of the default output.
    pub fn one_line(&self) -> String {
        let flow = match (&self.src, &self.dst, self.dport) {
            (Some(s), Some(d), Some(p)) => {
                let sport = self.sport.map(|p| format!(":{p}")).unwrap_or_default();
                format!(" {s}{sport} -> {d}:{p}")
            }
            _ => String::new(),
        };
        let repeat = if self.count > 1 {
            format!(" (x{})", self.count)
        } else {
            String::new()
        };
        let iface = self
            .interface
            .as_ref()
            .map(|i| format!(" interface={i}"))
            .unwrap_or_default();
        if self.status == Status::Resolved {
            return format!(
                "{} RESOLVED {} layer={}{}{}: {}",
                self.resolved_at.as_deref().unwrap_or(&self.last_seen),
                self.kind,
                self.layer,
                iface,
                flow,
                self.summary
            );
        }
        format!(
            "{} {:<8} {} layer={}{}{}{}: {} Fix: {}",
            self.last_seen,
            self.severity.as_str().to_uppercase(),
            self.kind,
            self.layer,
            iface,
            flow,
            repeat,
            self.summary,
            self.remediation
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    kind: Kind,
    layer: Layer,
    src: Option<String>,
    dst: Option<String>,
    dport: Option<u16>,
    netns: Option<u32>,
    interface: Option<String>,
}

struct Entry {
    finding: Finding,
    printed_at: Instant,
    printed_count: u64,
}

/// Aggregated findings, in first-seen order.
pub struct Store {
    entries: HashMap<Key, usize>,
    list: Vec<Entry>,
    repeat_interval: Duration,
    max_entries: usize,
}

impl Store {
    pub fn new(repeat_interval: Duration, max_entries: usize) -> Self {
        Self {
            entries: HashMap::new(),
            list: Vec::new(),
            repeat_interval,
            max_entries,
        }
    }

    /// Records an occurrence. Returns the aggregated finding when it should be printed:
    /// the first time, and then at most once per repeat interval while it keeps recurring.
    pub fn record(&mut self, mut finding: Finding, now: Instant) -> Option<Finding> {
        let key = finding.key();
        if let Some(&idx) = self.entries.get(&key) {
            let entry = &mut self.list[idx];
            let agg = &mut entry.finding;
            agg.count += finding.count;
            agg.last_seen = finding.last_seen;
            agg.sport = finding.sport.or(agg.sport);
            agg.evidence = finding.evidence;
            agg.summary = finding.summary;
            agg.severity = finding.severity;
            let reopened = agg.status == Status::Resolved;
            agg.status = Status::Active;
            agg.resolved_at = None;
            if reopened || now.duration_since(entry.printed_at) >= self.repeat_interval {
                entry.printed_at = now;
                entry.printed_count = agg.count;
                return Some(agg.clone());
            }
            return None;
        }
        if self.list.len() >= self.max_entries {
            // Bounded memory: the oldest finding makes room.
            let old = self.list.remove(0);
            self.entries.remove(&old.finding.key());
            for idx in self.entries.values_mut() {
                *idx -= 1;
            }
        }
        finding.count = finding.count.max(1);
        self.entries.insert(key, self.list.len());
        self.list.push(Entry {
            finding: finding.clone(),
            printed_at: now,
            printed_count: finding.count,
        });
        Some(finding)
    }

    /// Makes the active findings of `kinds` equal to `current`, for conditions that are
    /// re-evaluated as a whole (the MTU model): new or reappearing ones are recorded,
    /// ones still holding only refresh `last_seen`, and ones gone are resolved. Returns
    /// what should be printed.
    pub fn sync_conditions(
        &mut self,
        kinds: &[Kind],
        current: Vec<Finding>,
        now_sys: SystemTime,
        now: Instant,
    ) -> Vec<Finding> {
        let mut out = Vec::new();
        let keys: Vec<Key> = current.iter().map(Finding::key).collect();
        for finding in current {
            match self.entries.get(&finding.key()) {
                Some(&idx) if self.list[idx].finding.status == Status::Active => {
                    let agg = &mut self.list[idx].finding;
                    agg.last_seen = finding.last_seen;
                    agg.summary = finding.summary;
                    agg.evidence = finding.evidence;
                }
                _ => out.extend(self.record(finding, now)),
            }
        }
        out.extend(self.resolve(
            |f| kinds.contains(&f.kind) && !keys.contains(&f.key()),
            now_sys,
        ));
        out
    }

    /// Marks the active findings matching `gone` resolved and returns them.
    pub fn resolve(&mut self, gone: impl Fn(&Finding) -> bool, now: SystemTime) -> Vec<Finding> {
        let stamp = rfc3339(now);
        self.list
            .iter_mut()
            .filter(|e| e.finding.status == Status::Active && gone(&e.finding))
            .map(|e| {
                e.finding.status = Status::Resolved;
                e.finding.resolved_at = Some(stamp.clone());
                e.finding.clone()
            })
            .collect()
    }

    /// Findings whose count grew since they were last printed (flushed on shutdown).
    pub fn unprinted(&mut self) -> Vec<Finding> {
        self.list
            .iter_mut()
            .filter(|e| e.finding.count > e.printed_count)
            .map(|e| {
                e.printed_count = e.finding.count;
                e.finding.clone()
            })
            .collect()
    }

    pub fn all(&self) -> Vec<Finding> {
        self.list.iter().map(|e| e.finding.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(sport: u16) -> Finding {
        let mut f = Finding::new(
            Kind::TcpRefused,
            Layer::Listener,
            Severity::Warning,
            "s".into(),
            "r".into(),
            SystemTime::UNIX_EPOCH,
        );
        f.src = Some("10.0.0.1".into());
        f.dst = Some("10.0.0.2".into());
        f.dport = Some(80);
        f.sport = Some(sport);
        f.netns = Some(1);
        f.first_seen = "t0".into();
        f.last_seen = "t0".into();
        f
    }

    #[test]
    fn repeats_aggregate_and_are_rate_limited() {
        let mut store = Store::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        assert!(store.record(refused(1000), t0).is_some());
        let mut again = refused(1001);
        again.last_seen = "t1".into();
        assert!(store.record(again, t0 + Duration::from_secs(1)).is_none());
        let all = store.all();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].count, 2);
        assert_eq!(all[0].first_seen, "t0");
        assert_eq!(all[0].last_seen, "t1");
        let printed = store
            .record(refused(1002), t0 + Duration::from_secs(11))
            .expect("printed again after the interval");
        assert_eq!(printed.count, 3);
        assert!(store.unprinted().is_empty());
    }

    #[test]
    fn different_ports_are_different_findings_and_memory_is_bounded() {
        let mut store = Store::new(Duration::from_secs(10), 2);
        let now = Instant::now();
        for port in [1, 2, 3] {
            let mut f = refused(5);
            f.dport = Some(port);
            store.record(f, now);
        }
        let ports: Vec<_> = store.all().iter().map(|f| f.dport.unwrap()).collect();
        assert_eq!(ports, vec![2, 3]);
        let mut f = refused(5);
        f.dport = Some(2);
        store.record(f, now);
        assert_eq!(store.all()[0].count, 2);
    }

    #[test]
    fn json_contract_field_names() {
        let v = serde_json::to_value(refused(7)).unwrap();
        for k in [
            "kind",
            "layer",
            "severity",
            "summary",
            "remediation",
            "evidence",
            "src",
            "dst",
            "dport",
            "sport",
            "netns",
            "count",
            "first_seen",
            "last_seen",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(v["kind"], "tcp_refused");
        assert_eq!(v["layer"], "listener");
        assert_eq!(v["severity"], "warning");
        for layer in [
            Layer::Listener,
            Layer::Firewall,
            Layer::CniRouting,
            Layer::Peer,
            Layer::Unknown,
        ] {
            assert_eq!(serde_json::to_value(layer).unwrap(), layer.as_str());
        }
    }

    fn mismatch(iface: &str) -> Finding {
        let mut f = Finding::new(
            Kind::OverlayMtuMismatch,
            Layer::OverlayMtu,
            Severity::Warning,
            format!("{iface} too big"),
            "r".into(),
            SystemTime::UNIX_EPOCH,
        );
        f.interface = Some(iface.into());
        f
    }

    #[test]
    fn conditions_appear_hold_resolve_and_reopen() {
        let mut store = Store::new(Duration::from_secs(10), 100);
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(60);
        let now = Instant::now();
        let kinds = [Kind::OverlayMtuMismatch];
        let printed = store.sync_conditions(&kinds, vec![mismatch("eth0")], t, now);
        assert_eq!(printed.len(), 1);
        // Still true: nothing printed, nothing counted.
        assert!(
            store
                .sync_conditions(&kinds, vec![mismatch("eth0")], t, now)
                .is_empty()
        );
        assert_eq!(store.all()[0].count, 1);
        // Gone: resolved once.
        let printed = store.sync_conditions(&kinds, vec![], t, now);
        assert_eq!(printed.len(), 1);
        assert_eq!(printed[0].status, Status::Resolved);
        assert_eq!(
            printed[0].resolved_at.as_deref(),
            Some("1970-01-01T00:01:00.000Z")
        );
        assert!(printed[0].one_line().contains("RESOLVED"));
        assert!(store.sync_conditions(&kinds, vec![], t, now).is_empty());
        // Back again: active, printed at once, counted.
        let printed = store.sync_conditions(&kinds, vec![mismatch("eth0")], t, now);
        assert_eq!(printed.len(), 1);
        assert_eq!(printed[0].status, Status::Active);
        assert_eq!(printed[0].count, 2);
        // Other kinds are left alone.
        store.record(refused(1), now);
        assert!(
            store
                .sync_conditions(&kinds, vec![mismatch("eth0")], t, now)
                .is_empty()
        );
        assert_eq!(store.all().len(), 2);
    }
}
