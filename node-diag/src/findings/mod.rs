//! Findings: the agent's output contract. A finding names what failed, the layer it failed
//! in, the kernel evidence and the fix.
//!
//! - [`conntrack`] keeps each namespace's conntrack counters, the evidence that tells a
//!   full table's (or an INVALID packet's) `NETFILTER_DROP` from a rule's.
//! - [`correlate`] turns one kernel verdict event into a [`Finding`] (pure), one
//!   module per verdict family.
//! - [`evidence`] types what each finding rests on; serialised flat into `evidence`.
//! - [`names`] names what the kernel reports by number: drop reasons and interfaces.
//! - [`query`] parses `/findings`' query parameters and picks the findings they ask for
//!   (pure).
//! - [`store`] aggregates repeats (same kind, layer, flow minus the ephemeral source port,
//!   and netns) and resolves conditions that went away.
//!
//! Addresses stay typed ([`IpAddr`]) here; they become text only when printed or
//! serialised (`crate::output`, serde).

pub(crate) mod conntrack;
pub(crate) mod correlate;
pub(crate) mod evidence;
#[cfg(test)]
pub(crate) mod fixtures;
pub(crate) mod ledger;
pub(crate) mod names;
pub(crate) mod query;
pub(crate) mod store;

use std::{
    net::{IpAddr, SocketAddr},
    time::SystemTime,
};

use serde::{Deserialize, Serialize};

pub(crate) use self::evidence::Evidence;
use crate::pods::{Ends, Named, PodRef};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Kind {
    TcpRefused,
    TcpTimeout,
    TcpUnreachable,
    TcpReset,
    TcpStall,
    OverlayMtuMismatch,
    DfOversizeDrop,
    PmtudBlackhole,
    PmtudDisabled,
    /// A client elsewhere's SYNs to a pod of this node, dropped or rejected here.
    TcpSynDropped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Layer {
    Listener,
    Service,
    Firewall,
    CniRouting,
    Peer,
    OverlayMtu,
    IcmpFiltered,
    HostSysctl,
    Conntrack,
    /// Beyond this node, on the path to the peer, as the agent's own probe showed.
    Path,
    /// The tunnel between the nodes: its packets are lost while the underlay works.
    Overlay,
    Unknown,
}

/// Whether the condition behind a finding still holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    #[default]
    Active,
    Resolved,
    /// Withdrawn by a later verdict on the same attempt: a connect reported as timing out
    /// whose attempt then ended refused, unreachable or reset. That verdict stands.
    Superseded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Severity {
    Info,
    Warning,
    Critical,
}

macro_rules! names {
    ($ty:ty { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order (for parsing and for error messages that
            /// list the valid names). Not every type uses it.
            #[allow(dead_code)]
            pub(crate) const ALL: &[Self] = &[$(Self::$variant),+];

            /// The contract name, identical to the serde form.
            pub(crate) fn as_str(self) -> &'static str {
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

impl Kind {
    /// A condition holds until it is re-evaluated and found gone (and is then printed
    /// again as resolved); every other kind is an event that happened once.
    pub(crate) fn is_condition(self) -> bool {
        matches!(
            self,
            Self::OverlayMtuMismatch | Self::PmtudDisabled | Self::PmtudBlackhole
        )
    }
}

names!(Kind {
    TcpRefused => "tcp_refused",
    TcpTimeout => "tcp_timeout",
    TcpUnreachable => "tcp_unreachable",
    TcpReset => "tcp_reset",
    TcpStall => "tcp_stall",
    OverlayMtuMismatch => "overlay_mtu_mismatch",
    DfOversizeDrop => "df_oversize_drop",
    PmtudBlackhole => "pmtud_blackhole",
    PmtudDisabled => "pmtud_disabled",
    TcpSynDropped => "tcp_syn_dropped",
});
names!(Layer {
    Listener => "listener",
    Service => "service",
    Firewall => "firewall",
    CniRouting => "cni_routing",
    Peer => "peer",
    OverlayMtu => "overlay_mtu",
    IcmpFiltered => "icmp_filtered",
    HostSysctl => "host_sysctl",
    Conntrack => "conntrack",
    Path => "path",
    Overlay => "overlay",
    Unknown => "unknown",
});
names!(Status {
    Active => "active",
    Resolved => "resolved",
    Superseded => "superseded",
});
names!(Severity {
    Info => "info",
    Warning => "warning",
    Critical => "critical",
});

/// One finding as printed, served on `/findings` and read back by `node-diag findings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Finding {
    /// Stable for the life of its store entry, and across nodes: a hash of the node and
    /// the store's aggregation key. Clients de-duplicate on it. Empty until stored.
    #[serde(default)]
    pub(crate) id: String,
    /// The node whose agent made it (`--node-name`, else the hostname).
    #[serde(default)]
    pub(crate) node: String,
    pub(crate) kind: Kind,
    pub(crate) layer: Layer,
    pub(crate) severity: Severity,
    pub(crate) summary: String,
    pub(crate) remediation: String,
    pub(crate) evidence: Evidence,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) src: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) dst: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) dport: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sport: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) netns: Option<u32>,
    /// For a server-side finding (resets of accepted connections): the listener, local
    /// address and port. Its clients' ports change with every connection, so such a
    /// finding aggregates per listener; `src`/`dst` are not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) listener: Option<SocketAddr>,
    /// The Kubernetes Service `dst:dport` belongs to, as kube-proxy's rules name it:
    /// `<namespace>/<name>:<port>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) service: Option<String>,
    /// Where this node's NAT sent the connection, when it changed `dst`/`dport` (a
    /// Service's backend pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) backend: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) backend_port: Option<u16>,
    /// The interface an interface-level finding (MTU, oversize drops) is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) interface: Option<String>,
    /// The pod on the local side: the pod of `netns` (or, for an interface finding,
    /// whose interface it is), else the pod with address `src`; from the container
    /// runtime (`crate::pods`). Unset for host-network flows or without a runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pod: Option<PodRef>,
    /// The pod at the other end (`backend`, else `dst`) when it runs on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) peer_pod: Option<PodRef>,
    pub(crate) count: u64,
    pub(crate) first_seen: String,
    pub(crate) last_seen: String,
    /// `resolved` once the condition went away (see [`store::Store::resolve`]),
    /// `superseded` once a later verdict on the same attempt replaced it
    /// ([`store::Store::end_as`]).
    #[serde(default)]
    pub(crate) status: Status,
    /// When it stopped being active (resolved or superseded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resolved_at: Option<String>,
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

impl Finding {
    /// A finding seen once, now, with no flow or interface attached yet.
    pub(crate) fn new(
        kind: Kind,
        layer: Layer,
        severity: Severity,
        summary: String,
        remediation: String,
        now: SystemTime,
    ) -> Self {
        let now = rfc3339(now);
        Self {
            id: String::new(),
            node: String::new(),
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
            listener: None,
            service: None,
            backend: None,
            backend_port: None,
            interface: None,
            pod: None,
            peer_pod: None,
            count: 1,
            first_seen: now.clone(),
            last_seen: now,
            status: Status::Active,
            resolved_at: None,
        }
    }
}

impl Finding {
    /// Where the finding's flow or listener runs, to name its pods from.
    pub(crate) fn ends(&self) -> Ends {
        Ends {
            netns: self.netns,
            src: self.src,
            listener: self.listener,
            peer: self.backend.or(self.dst),
        }
    }

    /// Names the finding's pods; fields already set are kept.
    pub(crate) fn name_pods(&mut self, named: Named) {
        if self.pod.is_none() {
            self.pod = named.pod;
        }
        if self.peer_pod.is_none() {
            self.peer_pod = named.peer_pod;
        }
    }
}

pub(crate) use store::Store;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_contract_field_names() {
        let f = fixtures::refused(7);
        let v = serde_json::to_value(&f).unwrap();
        for k in [
            "id",
            "node",
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
        assert_eq!(v["src"], "10.0.0.1");
        assert_eq!(v["dst"], "10.0.0.2");
        for layer in [
            Layer::Listener,
            Layer::Firewall,
            Layer::CniRouting,
            Layer::Peer,
            Layer::Conntrack,
            Layer::Unknown,
        ] {
            assert_eq!(serde_json::to_value(layer).unwrap(), layer.as_str());
        }
        let back: Finding = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&back).unwrap(), v);
    }

    #[test]
    fn findings_without_id_or_node_still_read() {
        let mut v = serde_json::to_value(fixtures::refused(7)).unwrap();
        let obj = v.as_object_mut().unwrap();
        obj.remove("id");
        obj.remove("node");
        let back: Finding = serde_json::from_value(v).unwrap();
        assert_eq!((back.id.as_str(), back.node.as_str()), ("", ""));
    }
}
