//! Prometheus metrics (OpenMetrics text via prometheus-client). Kernel counters are
//! per-CPU maps; [`Metrics::sync_kernel`] folds their totals into monotonic counters.

use std::collections::HashMap;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, info::Info},
    registry::Registry,
};

use crate::findings::Finding;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FindingLabels {
    pub kind: String,
    pub layer: String,
    pub severity: String,
}

/// Kernel-side totals read from the maps, summed over CPUs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KernelTotals {
    pub refused: u64,
    pub timeout: u64,
    pub unreachable: u64,
    pub rst_sent: u64,
    pub rst_received: u64,
    pub events_lost: u64,
    /// Drop counts by reason name.
    pub drops: HashMap<String, u64>,
}

pub struct Metrics {
    pub registry: Registry,
    connect_failures: Family<ReasonLabel, Counter>,
    resets: Family<DirectionLabel, Counter>,
    drops: Family<ReasonLabel, Counter>,
    findings: Family<FindingLabels, Counter>,
    events_lost: Counter,
    last: KernelTotals,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let connect_failures = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "node_diag_tcp_connect_failures",
            "TCP connects that failed, by reason (refused, timeout, unreachable)",
            connect_failures.clone(),
        );
        let resets = Family::<DirectionLabel, Counter>::default();
        registry.register(
            "node_diag_tcp_resets",
            "TCP resets sent and received by this node's sockets",
            resets.clone(),
        );
        let drops = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "node_diag_drops",
            "Packets dropped by the kernel, by skb drop reason",
            drops.clone(),
        );
        let findings = Family::<FindingLabels, Counter>::default();
        registry.register(
            "node_diag_findings",
            "Findings reported, by kind, layer and severity",
            findings.clone(),
        );
        let events_lost = Counter::default();
        registry.register(
            "node_diag_events_lost",
            "Kernel events lost because the ring buffer was full",
            events_lost.clone(),
        );
        registry.register(
            "node_diag_build",
            "node-diag build information",
            Info::new(vec![(
                "version".to_string(),
                env!("CARGO_PKG_VERSION").to_string(),
            )]),
        );
        // Pre-create the contract's fixed series so they read 0 rather than being absent.
        for reason in ["refused", "timeout", "unreachable"] {
            let _ = connect_failures.get_or_create(&ReasonLabel {
                reason: reason.into(),
            });
        }
        for direction in ["sent", "received"] {
            let _ = resets.get_or_create(&DirectionLabel {
                direction: direction.into(),
            });
        }
        Self {
            registry,
            connect_failures,
            resets,
            drops,
            findings,
            events_lost,
            last: KernelTotals::default(),
        }
    }

    pub fn finding(&self, f: &Finding) {
        self.findings
            .get_or_create(&FindingLabels {
                kind: f.kind.as_str().into(),
                layer: f.layer.as_str().into(),
                severity: f.severity.as_str().into(),
            })
            .inc();
    }

    /// Advances every counter by what the kernel counted since the last call.
    pub fn sync_kernel(&mut self, now: KernelTotals) {
        let delta = |new: u64, old: u64| new.saturating_sub(old);
        let reason = |r: &str| ReasonLabel { reason: r.into() };
        let dir = |d: &str| DirectionLabel {
            direction: d.into(),
        };
        self.connect_failures
            .get_or_create(&reason("refused"))
            .inc_by(delta(now.refused, self.last.refused));
        self.connect_failures
            .get_or_create(&reason("timeout"))
            .inc_by(delta(now.timeout, self.last.timeout));
        self.connect_failures
            .get_or_create(&reason("unreachable"))
            .inc_by(delta(now.unreachable, self.last.unreachable));
        self.resets
            .get_or_create(&dir("sent"))
            .inc_by(delta(now.rst_sent, self.last.rst_sent));
        self.resets
            .get_or_create(&dir("received"))
            .inc_by(delta(now.rst_received, self.last.rst_received));
        self.events_lost
            .inc_by(delta(now.events_lost, self.last.events_lost));
        for (name, count) in &now.drops {
            let old = self.last.drops.get(name).copied().unwrap_or(0);
            let d = delta(*count, old);
            if d > 0 {
                self.drops.get_or_create(&reason(name)).inc_by(d);
            }
        }
        self.last = now;
    }

    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_totals_become_monotonic_counters() {
        let mut m = Metrics::new();
        let mut t = KernelTotals {
            refused: 3,
            rst_received: 1,
            ..Default::default()
        };
        t.drops.insert("NETFILTER_DROP".into(), 5);
        m.sync_kernel(t.clone());
        t.refused = 4;
        t.drops.insert("NETFILTER_DROP".into(), 7);
        m.sync_kernel(t);
        let text = m.encode().unwrap();
        assert!(
            text.contains("node_diag_tcp_connect_failures_total{reason=\"refused\"} 4"),
            "{text}"
        );
        assert!(text.contains("node_diag_tcp_connect_failures_total{reason=\"timeout\"} 0"));
        assert!(text.contains("node_diag_tcp_resets_total{direction=\"received\"} 1"));
        assert!(text.contains("node_diag_drops_total{reason=\"NETFILTER_DROP\"} 7"));
        assert!(text.contains("node_diag_events_lost_total 0"));
        assert!(text.contains("node_diag_build_info{version=\""));
        assert!(text.ends_with("# EOF\n"));
    }
}
