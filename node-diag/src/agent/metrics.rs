//! Prometheus metrics (OpenMetrics text via prometheus-client). Kernel counters are
//! per-CPU maps; [`Metrics::sync_kernel`] folds their totals into monotonic counters.

use std::collections::HashMap;

use prometheus_client::{
    encoding::{EncodeLabel, EncodeLabelSet, LabelSetEncoder},
    metrics::{counter::Counter, family::Family, gauge::Gauge, info::Info},
    registry::Registry,
};

use node_diag_common::counter;

use crate::{
    findings::{Finding, names::Names},
    kernel::maps::KernelCounts,
    mtu::{InterfaceMtu, MAX_PATH_MTU_SERIES, PathMtu},
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabel {
    pub(crate) reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DirectionLabel {
    pub(crate) direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct InterfaceLabel {
    pub(crate) interface: String,
}

/// Pods all name their interface `eth0`: the namespace tells them apart.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct InterfaceNetnsLabels {
    pub(crate) interface: String,
    pub(crate) netns: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct InterfaceMtuLabels {
    pub(crate) interface: String,
    pub(crate) kind: String,
    pub(crate) netns: String,
}

/// A remote tunnel endpoint (a peer node's underlay address).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct EndpointLabel {
    pub(crate) endpoint: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct FindingLabels {
    pub(crate) kind: String,
    pub(crate) layer: String,
    pub(crate) severity: String,
    /// The pod's Kubernetes namespace, empty for host-network flows (or without a
    /// container runtime). Namespace only: bounded by the cluster's namespaces, where
    /// pod names would be unbounded.
    pub(crate) namespace: String,
}

/// One eBPF program's attachment: a tracepoint program's (`interface` none), or the TC
/// classifier's on one interface.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct ProgramLabels {
    pub(crate) program: String,
    pub(crate) interface: Option<String>,
}

/// By hand: a tracepoint program's series carries no `interface` label at all, rather
/// than an empty one.
impl EncodeLabelSet for ProgramLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        ("program", self.program.as_str()).encode(encoder.encode_label())?;
        if let Some(interface) = &self.interface {
            ("interface", interface.as_str()).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SocketLabel {
    pub(crate) socket: String,
}

/// Kernel-side totals read from the maps, summed over CPUs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct KernelTotals {
    pub(crate) refused: u64,
    pub(crate) timeout: u64,
    pub(crate) unreachable: u64,
    pub(crate) rst_sent: u64,
    pub(crate) rst_received: u64,
    pub(crate) events_lost: u64,
    /// Verdict events the kernel submitted to the ring buffer.
    pub(crate) events_sent: u64,
    pub(crate) frag_sent: u64,
    pub(crate) frag_received: u64,
    pub(crate) frag_dropped: u64,
    /// Drop counts by reason name.
    pub(crate) drops: HashMap<String, u64>,
    /// DF oversize drops by egress interface name.
    pub(crate) oversize: HashMap<String, u64>,
}

impl KernelTotals {
    /// The kernel's counts with their numbers named; `bad_records` are ring-buffer
    /// records user space could not decode, lost like the ones the kernel could not send.
    pub(crate) fn named(counts: &KernelCounts, names: &Names, bad_records: u64) -> Self {
        let mut totals = Self {
            refused: counts.get(counter::CONNECT_REFUSED),
            timeout: counts.get(counter::CONNECT_TIMEOUT),
            unreachable: counts.get(counter::CONNECT_UNREACHABLE),
            rst_sent: counts.get(counter::RST_SENT),
            rst_received: counts.get(counter::RST_RECEIVED),
            events_lost: counts.get(counter::EVENTS_LOST) + bad_records,
            events_sent: counts.get(counter::EVENTS_SENT),
            frag_sent: counts.get(counter::ICMP_FRAG_SENT),
            frag_received: counts.get(counter::ICMP_FRAG_RECEIVED),
            frag_dropped: counts.get(counter::ICMP_FRAG_DROPPED),
            ..Self::default()
        };
        for (&reason, &count) in &counts.drops {
            *totals.drops.entry(names.drop_reason(reason)).or_default() += count;
        }
        for (&(netns, ifindex), &count) in &counts.oversize {
            *totals
                .oversize
                .entry(names.interface_or_id(netns, ifindex))
                .or_default() += count;
        }
        totals
    }
}

pub(crate) struct Metrics {
    pub(crate) registry: Registry,
    connect_failures: Family<ReasonLabel, Counter>,
    resets: Family<DirectionLabel, Counter>,
    drops: Family<ReasonLabel, Counter>,
    findings: Family<FindingLabels, Counter>,
    events_lost: Counter,
    events_sent: Counter,
    frag_needed: Family<DirectionLabel, Counter>,
    oversize: Family<InterfaceLabel, Counter>,
    blackholes: Gauge,
    icmp_watch: Gauge,
    interface_mtu: Family<InterfaceMtuLabels, Gauge>,
    headroom: Family<InterfaceNetnsLabels, Gauge>,
    path_mtu: Family<EndpointLabel, Gauge>,
    conntrack_drops: Family<ReasonLabel, Counter>,
    programs: Family<ProgramLabels, Gauge>,
    runtime_up: Family<SocketLabel, Gauge>,
    service_rules_failures: Counter,
    services: Gauge,
    scope_failures: Counter,
    mtu_failures: Counter,
    findings_evicted: Counter,
    /// The store's eviction total at the last [`Metrics::set_findings_evicted`].
    last_evicted: u64,
    last: KernelTotals,
}

impl Metrics {
    pub(crate) fn new() -> Self {
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
            "TCP resets received and sent in this node's namespaces (sent: also those answering a packet no socket wanted, a closed port's, from Linux 6.10)",
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
            "Findings reported, by kind, layer, severity and pod namespace",
            findings.clone(),
        );
        let events_lost = Counter::default();
        registry.register(
            "node_diag_events_lost",
            "Kernel events lost because the ring buffer was full",
            events_lost.clone(),
        );
        let events_sent = Counter::default();
        registry.register(
            "node_diag_events_sent",
            "Verdict events the kernel sent on the ring buffer (identical verdicts within a window share one event)",
            events_sent.clone(),
        );
        let frag_needed = Family::<DirectionLabel, Counter>::default();
        registry.register(
            "node_diag_icmp_frag_needed",
            "ICMP frag-needed / packet-too-big sent by, received by (counted while ICMP is watched, see node_diag_icmp_watch), and dropped on this node",
            frag_needed.clone(),
        );
        let oversize = Family::<InterfaceLabel, Counter>::default();
        registry.register(
            "node_diag_df_oversize_drops",
            "DF packets dropped for exceeding the egress interface MTU, by that interface",
            oversize.clone(),
        );
        let blackholes = Gauge::default();
        registry.register(
            "node_diag_pmtud_blackholes",
            "Flows black-holed by PMTUD right now (beyond the node: until a probe shows the path healed)",
            blackholes.clone(),
        );
        let icmp_watch = Gauge::default();
        registry.register(
            "node_diag_icmp_watch",
            "1 while ICMP errors arriving from the network are watched (the TC classifier attached), 0 otherwise; without the watch, findings say frag-needed received is unknown",
            icmp_watch.clone(),
        );
        let interface_mtu = Family::<InterfaceMtuLabels, Gauge>::default();
        registry.register(
            "node_diag_interface_mtu_bytes",
            "MTU of each interface of this node and its pods",
            interface_mtu.clone(),
        );
        let headroom = Family::<InterfaceNetnsLabels, Gauge>::default();
        registry.register(
            "node_diag_overlay_mtu_headroom_bytes",
            "Expected MTU (underlay minus encapsulation) minus the effective MTU (the interface's, capped by its routes' mtu); negative when misconfigured",
            headroom.clone(),
        );
        let path_mtu = Family::<EndpointLabel, Gauge>::default();
        registry.register(
            "node_diag_path_mtu_bytes",
            format!(
                "Smallest path MTU the route cache learned (from ICMP frag-needed or packet-too-big) towards each remote tunnel endpoint; only endpoints with a learned path MTU, at most {MAX_PATH_MTU_SERIES} (the smallest)"
            ),
            path_mtu.clone(),
        );
        let conntrack_drops = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "node_diag_conntrack_drops",
            "SYNs and SYN-ACKs of failed connects dropped on this node because of conntrack: its table full (table_full), or found INVALID and dropped by a rule (invalid)",
            conntrack_drops.clone(),
        );
        let programs = Family::<ProgramLabels, Gauge>::default();
        registry.register(
            "node_diag_program_attached",
            "1 while the eBPF program is attached, 0 when it failed to load or attach (its feature degraded) or its attachment disappeared; the TC classifier by interface, while the ICMP watch holds it attached",
            programs.clone(),
        );
        let runtime_up = Family::<SocketLabel, Gauge>::default();
        registry.register(
            "node_diag_container_runtime_up",
            "1 when the last read of the container runtime's pods over its CRI socket worked, 0 when it failed (findings then name no pods); no series where no runtime socket was configured or ever found",
            runtime_up.clone(),
        );
        let service_rules_failures = Counter::default();
        registry.register(
            "node_diag_service_rules_read_failures",
            "Reads of kube-proxy's rules (for Service names) that failed; the last Service catalog read is kept",
            service_rules_failures.clone(),
        );
        let services = Gauge::default();
        registry.register(
            "node_diag_services",
            "Service ports in the catalog read from kube-proxy's rules (followed by change); what findings name Services from",
            services.clone(),
        );
        let scope_failures = Counter::default();
        registry.register(
            "node_diag_scope_refresh_failures",
            "Refreshes of the set of network namespaces reported for (this node's and its pods') that failed; the previous scope is kept",
            scope_failures.clone(),
        );
        let mtu_failures = Counter::default();
        registry.register(
            "node_diag_mtu_refresh_failures",
            "Rebuilds of the MTU model (interfaces of the node and its pods) that failed; the MTU gauges and findings stay as last built",
            mtu_failures.clone(),
        );
        let findings_evicted = Counter::default();
        registry.register(
            "node_diag_findings_evicted",
            "Findings pushed out of the full findings store (or not kept in it) to make room; still printed and counted, no longer on /findings",
            findings_evicted.clone(),
        );
        registry.register_collector(Box::new(super::process::ProcessCollector));
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
        for reason in ["table_full", "invalid"] {
            let _ = conntrack_drops.get_or_create(&ReasonLabel {
                reason: reason.into(),
            });
        }
        for direction in ["sent", "received", "dropped"] {
            let _ = frag_needed.get_or_create(&DirectionLabel {
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
            events_sent,
            frag_needed,
            oversize,
            blackholes,
            icmp_watch,
            interface_mtu,
            headroom,
            path_mtu,
            conntrack_drops,
            programs,
            runtime_up,
            service_rules_failures,
            services,
            scope_failures,
            mtu_failures,
            findings_evicted,
            last_evicted: 0,
            last: KernelTotals::default(),
        }
    }

    /// Replaces the program attachment gauges: `(program, interface, attached)`.
    pub(crate) fn set_programs(&self, programs: &[(&str, Option<&str>, bool)]) {
        self.programs.clear();
        for &(program, interface, attached) in programs {
            self.programs
                .get_or_create(&ProgramLabels {
                    program: program.to_string(),
                    interface: interface.map(str::to_string),
                })
                .set(i64::from(attached));
        }
    }

    /// The container runtime's state: `(socket, up)`, none without a runtime.
    pub(crate) fn set_runtime(&self, runtime: Option<(&str, bool)>) {
        self.runtime_up.clear();
        if let Some((socket, up)) = runtime {
            self.runtime_up
                .get_or_create(&SocketLabel {
                    socket: socket.to_string(),
                })
                .set(i64::from(up));
        }
    }

    /// The failure counter of kube-proxy rule reads, for the thread that reads them.
    pub(crate) fn service_rules_failures(&self) -> Counter {
        self.service_rules_failures.clone()
    }

    /// The number of Service ports, set by the thread that follows kube-proxy's rules.
    pub(crate) fn services(&self) -> Gauge {
        self.services.clone()
    }

    pub(crate) fn scope_refresh_failed(&self) {
        self.scope_failures.inc();
    }

    pub(crate) fn mtu_refresh_failed(&self) {
        self.mtu_failures.inc();
    }

    /// Advances the eviction counter to the store's `total` evictions.
    pub(crate) fn set_findings_evicted(&mut self, total: u64) {
        self.findings_evicted
            .inc_by(total.saturating_sub(self.last_evicted));
        self.last_evicted = self.last_evicted.max(total);
    }

    pub(crate) fn finding(&self, f: &Finding) {
        self.findings
            .get_or_create(&FindingLabels {
                kind: f.kind.as_str().into(),
                layer: f.layer.as_str().into(),
                severity: f.severity.as_str().into(),
                namespace: f
                    .pod
                    .as_ref()
                    .map(|p| p.namespace.clone())
                    .unwrap_or_default(),
            })
            .inc_by(f.count);
    }

    /// Counts `packets` drops of a connect's flow attributed to conntrack, by cause
    /// (`table_full`, `invalid`).
    pub(crate) fn conntrack_drops(&self, cause: &str, packets: u32) {
        self.conntrack_drops
            .get_or_create(&ReasonLabel {
                reason: cause.into(),
            })
            .inc_by(u64::from(packets));
    }

    /// Advances every counter by what the kernel counted since the last call.
    pub(crate) fn sync_kernel(&mut self, now: KernelTotals) {
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
        self.events_sent
            .inc_by(delta(now.events_sent, self.last.events_sent));
        for (direction, new, old) in [
            ("sent", now.frag_sent, self.last.frag_sent),
            ("received", now.frag_received, self.last.frag_received),
            ("dropped", now.frag_dropped, self.last.frag_dropped),
        ] {
            self.frag_needed
                .get_or_create(&dir(direction))
                .inc_by(delta(new, old));
        }
        for (name, count) in &now.drops {
            let old = self.last.drops.get(name).copied().unwrap_or(0);
            let d = delta(*count, old);
            if d > 0 {
                self.drops.get_or_create(&reason(name)).inc_by(d);
            }
        }
        for (name, count) in &now.oversize {
            let old = self.last.oversize.get(name).copied().unwrap_or(0);
            let d = delta(*count, old);
            if d > 0 {
                self.oversize
                    .get_or_create(&InterfaceLabel {
                        interface: name.clone(),
                    })
                    .inc_by(d);
            }
        }
        self.last = now;
    }

    pub(crate) fn set_blackholes(&self, flows: usize) {
        self.blackholes.set(flows as i64);
    }

    pub(crate) fn set_icmp_watch(&self, watching: bool) {
        self.icmp_watch.set(i64::from(watching));
    }

    /// Replaces the MTU gauges with the current model: each interface's MTU, and its
    /// headroom where the model holds it to a limit.
    pub(crate) fn set_mtu_model(&self, interfaces: &[InterfaceMtu]) {
        self.interface_mtu.clear();
        for i in interfaces {
            self.interface_mtu
                .get_or_create(&InterfaceMtuLabels {
                    interface: i.interface.clone(),
                    kind: i.kind.as_str().to_string(),
                    netns: i.netns.clone(),
                })
                .set(i64::from(i.mtu));
        }
        self.headroom.clear();
        for i in interfaces {
            if let Some(bytes) = i.headroom {
                self.headroom
                    .get_or_create(&InterfaceNetnsLabels {
                        interface: i.interface.clone(),
                        netns: i.netns.clone(),
                    })
                    .set(bytes);
            }
        }
    }

    /// Replaces the learned path MTU gauges: one series per endpoint in `paths` (the
    /// model caps them), none for an endpoint whose learned path MTU expired.
    pub(crate) fn set_path_mtus(&self, paths: &[PathMtu]) {
        self.path_mtu.clear();
        for p in paths.iter().take(MAX_PATH_MTU_SERIES) {
            self.path_mtu
                .get_or_create(&EndpointLabel {
                    endpoint: p.endpoint.to_string(),
                })
                .set(i64::from(p.mtu));
        }
    }

    /// The OpenMetrics exposition (what Prometheus asks for first).
    pub(crate) fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// The classic Prometheus text format (0.0.4), for clients that do not accept
    /// OpenMetrics (older scrapers, `promtool check metrics`).
    pub(crate) fn encode_text(&self) -> Result<String, std::fmt::Error> {
        Ok(openmetrics_to_text(&self.encode()?))
    }
}

pub(crate) use node_diag_common::openmetrics::openmetrics_to_text;

/// One of the agent's HTTP listeners (`scrape` or `findings`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ListenerLabel {
    pub(crate) listener: String,
}

/// The HTTP listeners' own metrics, updated by the serving tasks without the registry's
/// lock (prometheus-client's metrics are shared handles).
#[derive(Clone)]
pub(crate) struct HttpMetrics {
    pub(crate) rejected: Family<ListenerLabel, Counter>,
    pub(crate) open: Family<ListenerLabel, Gauge>,
    /// By listener: 1 while its web config's last read succeeded (or it has none).
    pub(crate) web_config_ok: Family<ListenerLabel, Gauge>,
}

impl Metrics {
    /// Registers the HTTP listeners' metrics, their series for `listeners` at 0.
    pub(crate) fn register_http(&mut self, listeners: &[&str]) -> HttpMetrics {
        let rejected = Family::<ListenerLabel, Counter>::default();
        self.registry.register(
            "node_diag_http_connections_rejected",
            "Connections closed as soon as accepted because the listener was at its cap (--http-max-connections, within the open-files budget), by listener (scrape, findings)",
            rejected.clone(),
        );
        let open = Family::<ListenerLabel, Gauge>::default();
        self.registry.register(
            "node_diag_http_connections",
            "Connections open on each HTTP listener (scrape, findings)",
            open.clone(),
        );
        let web_config_ok = Family::<ListenerLabel, Gauge>::default();
        self.registry.register(
            "node_diag_web_config_last_reload_successful",
            "By listener: 1 when the last read of its web config (--web-config-file for scrape, --findings-web-config-file for findings) succeeded or it has none, 0 when a changed file was refused and the previous config stays in force",
            web_config_ok.clone(),
        );
        for listener in listeners {
            let label = ListenerLabel {
                listener: (*listener).to_owned(),
            };
            let _ = rejected.get_or_create(&label);
            let _ = open.get_or_create(&label);
            web_config_ok.get_or_create(&label).set(1);
        }
        HttpMetrics {
            rejected,
            open,
            web_config_ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_network::LinkKind;

    #[test]
    fn kernel_totals_become_monotonic_counters() {
        let mut m = Metrics::new();
        let mut t = KernelTotals {
            refused: 3,
            rst_received: 1,
            ..Default::default()
        };
        t.drops.insert("NETFILTER_DROP".into(), 5);
        t.oversize.insert("vx0".into(), 2);
        t.frag_dropped = 3;
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
        assert!(text.contains("node_diag_df_oversize_drops_total{interface=\"vx0\"} 2"));
        assert!(text.contains("node_diag_icmp_frag_needed_total{direction=\"dropped\"} 3"));
        assert!(text.contains("node_diag_icmp_frag_needed_total{direction=\"sent\"} 0"));
        m.set_blackholes(1);
        m.set_icmp_watch(true);
        m.set_mtu_model(&[InterfaceMtu {
            interface: "eth0".to_string(),
            kind: LinkKind::Veth,
            netns: "pod-a".to_string(),
            mtu: 1500,
            headroom: Some(-50),
        }]);
        let text = m.encode().unwrap();
        assert!(text.contains("node_diag_pmtud_blackholes 1"));
        assert!(text.contains("node_diag_icmp_watch 1"));
        let classic = m.encode_text().unwrap();
        assert!(
            classic.contains("# TYPE node_diag_drops_total counter"),
            "{classic}"
        );
        assert!(classic.contains("# HELP node_diag_drops_total Packets dropped"));
        assert!(classic.contains("# TYPE node_diag_build_info gauge"));
        assert!(classic.contains("# TYPE node_diag_pmtud_blackholes gauge"));
        assert!(!classic.contains("# EOF"));
        assert!(classic.contains("node_diag_drops_total{reason=\"NETFILTER_DROP\"} 7"));
        assert!(text.contains("node_diag_interface_mtu_bytes{interface=\"eth0\",kind=\"veth\",netns=\"pod-a\"} 1500"), "{text}");
        assert!(text.contains(
            "node_diag_overlay_mtu_headroom_bytes{interface=\"eth0\",netns=\"pod-a\"} -50"
        ));
        assert!(text.contains("node_diag_build_info{version=\""));
        let path = |endpoint: &str, mtu| PathMtu {
            endpoint: endpoint.parse().unwrap(),
            mtu,
        };
        m.set_path_mtus(&[path("192.168.79.2", 1400), path("fd00:79::2", 1280)]);
        let text = m.encode().unwrap();
        assert!(
            text.contains("node_diag_path_mtu_bytes{endpoint=\"192.168.79.2\"} 1400"),
            "{text}"
        );
        assert!(text.contains("node_diag_path_mtu_bytes{endpoint=\"fd00:79::2\"} 1280"));
        // Expired: the series goes.
        m.set_path_mtus(&[path("fd00:79::2", 1280)]);
        assert!(!m.encode().unwrap().contains("192.168.79.2"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn self_health_series() {
        let mut m = Metrics::new();
        m.set_programs(&[
            ("nd_set_state", None, true),
            ("nd_icmp_send", None, false),
            ("nd_tc_ingress", None, true),
            ("nd_tc_ingress", Some("eth0"), true),
            ("nd_tc_ingress", Some("vx0"), false),
        ]);
        m.set_runtime(Some(("/run/containerd/containerd.sock", true)));
        m.scope_refresh_failed();
        m.service_rules_failures().inc();
        m.set_findings_evicted(3);
        m.set_findings_evicted(5);
        let text = m.encode().unwrap();
        for line in [
            "node_diag_program_attached{program=\"nd_set_state\"} 1",
            "node_diag_program_attached{program=\"nd_icmp_send\"} 0",
            "node_diag_program_attached{program=\"nd_tc_ingress\",interface=\"eth0\"} 1",
            "node_diag_program_attached{program=\"nd_tc_ingress\",interface=\"vx0\"} 0",
            "node_diag_container_runtime_up{socket=\"/run/containerd/containerd.sock\"} 1",
            "node_diag_scope_refresh_failures_total 1",
            "node_diag_service_rules_read_failures_total 1",
            "node_diag_mtu_refresh_failures_total 0",
            "node_diag_findings_evicted_total 5",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in {text}");
        }
        assert!(text.contains("# TYPE process_open_fds gauge"), "{text}");
        // The classifier's attachments come and go with the ICMP watch: replaced whole.
        m.set_programs(&[("nd_set_state", None, true)]);
        assert!(!m.encode().unwrap().contains("vx0"));
        // Without a runtime, no series: the agent names no pods by design.
        m.set_runtime(None);
        assert!(
            !m.encode()
                .unwrap()
                .contains("node_diag_container_runtime_up{")
        );
    }

    /// docs/metrics.md is the metrics' reference: every family the agent registers is
    /// there (a counter under its `_total` name), and every `node_diag_` metric it lists
    /// is registered.
    #[test]
    fn every_registered_metric_is_in_the_reference_and_back() {
        use syn::visit::{self, Visit};

        /// The names this file registers (`registry.register("name", ..)`): a family
        /// with labels and no series yet is not in the exposition.
        struct Registered(Vec<String>);
        impl<'ast> Visit<'ast> for Registered {
            fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
                if call.method.to_string().starts_with("register")
                    && let Some(syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(name),
                        ..
                    })) = call.args.first()
                {
                    self.0.push(name.value());
                }
                visit::visit_expr_method_call(self, call);
            }
        }
        let mut names = Registered(Vec::new());
        names.visit_file(&syn::parse_file(include_str!("metrics.rs")).unwrap());
        // And what collectors add (the process metrics).
        let text = Metrics::new().encode().unwrap();
        names.0.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix("# TYPE "))
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_owned),
        );
        let registered: Vec<&str> = names.0.iter().map(String::as_str).collect();
        assert!(
            registered.contains(&"node_diag_http_connections") && registered.len() > 25,
            "{registered:?}"
        );
        let doc = include_str!("../../../docs/metrics.md");
        for name in &registered {
            assert!(
                ["", "_total", "_info"]
                    .iter()
                    .any(|suffix| doc.contains(&format!("`{name}{suffix}`"))),
                "{name} is registered but not in docs/metrics.md"
            );
        }
        let listed: Vec<&str> = doc
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| w.starts_with("node_diag_") && !w.contains(['{', ' ', '=']))
            .collect();
        assert!(listed.len() > 20, "{listed:?}");
        for name in listed {
            let base = name
                .strip_suffix("_total")
                .or_else(|| name.strip_suffix("_info"))
                .unwrap_or(name);
            assert!(
                registered.contains(&name) || registered.contains(&base),
                "docs/metrics.md lists {name}, which the agent does not register"
            );
        }
    }
}
