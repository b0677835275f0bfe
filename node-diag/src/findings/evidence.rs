//! What a finding rests on, typed per verdict family. The correlator and the MTU model
//! fill these structs; the agent reads their fields (never keys); serialisation turns
//! them into the finding's flat `evidence` object of the JSON contract, keys sorted.
//!
//! A finding read back from an agent (`node-diag findings`) keeps its evidence as served
//! ([`Evidence::Received`]): the client only prints it again, so fields a newer agent
//! adds survive, and nothing judges on it.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize, Serializer};

use super::conntrack::Window;
use crate::{
    host_network::{Family, Role, UnderlaySource, drop_site::DropSite},
    kernel::hook_programs::HookProgram,
    services::netfilter_rules::{Rule, policy_of},
};

/// A finding's evidence: one variant per verdict family.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Evidence {
    /// `tcp_refused`, `tcp_timeout`, `tcp_unreachable`, `tcp_reset`.
    Connect(Box<ConnectEvidence>),
    /// `tcp_syn_dropped`: a client elsewhere's SYNs to a pod of this node, dropped here.
    Inbound(Box<InboundEvidence>),
    /// `tcp_stall`: the peer went silent.
    Stall(StallEvidence),
    /// `pmtud_blackhole`.
    Blackhole(BlackholeEvidence),
    /// `pmtud_blackhole` the kernel's MTU probing got the flow out of.
    Recovered(RecoveredEvidence),
    /// `df_oversize_drop`.
    Oversize(OversizeEvidence),
    /// `overlay_mtu_mismatch`: the model's arithmetic.
    Mtu(Box<MtuEvidence>),
    /// `pmtud_disabled`.
    Sysctl(SysctlEvidence),
    /// A flow verdict (`Connect`, `Stall` or `Blackhole`) with what probing its path
    /// found; serialised as the verdict's keys plus the probe's.
    Path(Box<PathEvidence>),
    /// As an agent served it, read back to be printed again.
    Received(serde_json::Map<String, serde_json::Value>),
}

impl Default for Evidence {
    fn default() -> Self {
        Self::Received(serde_json::Map::new())
    }
}

impl Evidence {
    /// Notes the Service's endpoints when NAT's choice among them is unknown. Only flow
    /// findings have them.
    pub(crate) fn set_candidates(&mut self, candidates: &[SocketAddr]) {
        let slot = match self {
            Self::Connect(e) => &mut e.candidate_backends,
            Self::Stall(e) => &mut e.candidate_backends,
            Self::Blackhole(e) => &mut e.candidate_backends,
            Self::Recovered(e) => &mut e.candidate_backends,
            Self::Oversize(e) => &mut e.candidate_backends,
            Self::Path(e) => return e.base.set_candidates(candidates),
            Self::Inbound(_) | Self::Mtu(_) | Self::Sysctl(_) | Self::Received(_) => return,
        };
        slot.clone_from(&candidates.to_vec());
    }

    /// Names the rule that dropped or rejected a connect verdict's packet.
    pub(crate) fn set_rule(&mut self, rule: &Rule) {
        let e = match self {
            Self::Connect(e) => e,
            Self::Path(e) => return e.base.set_rule(rule),
            Self::Inbound(e) => {
                e.policy = rule.comment.as_deref().and_then(policy_of);
                // The rule says what it did: a `tcp reset` REJECT sends nothing this
                // node's ICMP tracepoint shows.
                e.action = Some(if rule.verdict == "reject" {
                    InboundAction::Reject
                } else {
                    InboundAction::Drop
                });
                e.rule = Some(rule.clone());
                return;
            }
            _ => return,
        };
        e.policy = rule.comment.as_deref().and_then(policy_of);
        e.rule = Some(rule.clone());
    }

    /// Names the eBPF program that dropped a connect verdict's packet.
    pub(crate) fn set_program(&mut self, program: HookProgram) {
        match self {
            Self::Connect(e) => e.program = Some(program),
            Self::Inbound(e) => e.program = Some(program),
            Self::Path(e) => e.base.set_program(program),
            _ => {}
        }
    }

    /// Why conntrack, not a rule, dropped the flow, when a connect verdict says so.
    pub(crate) fn conntrack_cause(&self) -> Option<ConntrackCause> {
        match self {
            Self::Connect(e) => e.conntrack_cause,
            Self::Inbound(e) => e.conntrack_cause,
            Self::Path(e) => e.base.conntrack_cause(),
            _ => None,
        }
    }

    /// The evidence as the JSON object of the contract.
    pub(crate) fn to_map(&self) -> serde_json::Map<String, serde_json::Value> {
        let value = match self {
            Self::Connect(e) => serde_json::to_value(e),
            Self::Inbound(e) => serde_json::to_value(e),
            Self::Stall(e) => serde_json::to_value(e),
            Self::Blackhole(e) => serde_json::to_value(e),
            Self::Recovered(e) => serde_json::to_value(e),
            Self::Oversize(e) => serde_json::to_value(e),
            Self::Mtu(e) => serde_json::to_value(e),
            Self::Sysctl(e) => serde_json::to_value(e),
            Self::Path(e) => {
                let mut m = e.base.to_map();
                if let Ok(serde_json::Value::Object(probe)) = serde_json::to_value(&e.probe) {
                    m.extend(probe);
                }
                return m;
            }
            Self::Received(m) => return m.clone(),
        };
        // Plain structs of numbers, strings and addresses always serialise.
        match value {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        }
    }
}

impl Serialize for Evidence {
    // Through a map, so the keys come out sorted whatever the struct's field order.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_map().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Evidence {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde_json::Map::deserialize(d).map(Self::Received)
    }
}

/// `icmp_watch: "off"`: ICMP from the network was not watched for this verdict, so
/// what arrived from it is unknown rather than absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum IcmpWatch {
    Off,
}

/// Why conntrack, not a rule, is behind a flow's `NETFILTER_DROP`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ConntrackCause {
    /// The namespace's table was full: conntrack could make no entry and dropped the
    /// packet itself.
    TableFull,
    /// Conntrack found the packet INVALID and a `ct state invalid` rule dropped it.
    Invalid,
}

impl ConntrackCause {
    /// The `reason` label of `node_diag_conntrack_drops_total`, as in the evidence.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::TableFull => "table_full",
            Self::Invalid => "invalid",
        }
    }
}

/// The netfilter hook a frag-needed was dropped in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NetfilterHook {
    Output,
    Forward,
}

impl NetfilterHook {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Output => "output",
            Self::Forward => "forward",
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The evidence of a connect verdict or a reset.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct ConnectEvidence {
    /// The socket error, by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) errno: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) syn_retransmits: Option<u32>,
    /// The SYN or SYN-ACK drop this node recorded for the flow.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub(crate) drop: Option<DropEvidence>,
    /// An ICMP error this node generated for the flow.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub(crate) icmp_sent: Option<IcmpSent>,
    /// An ICMP error that came back from the path.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub(crate) icmp_received: Option<IcmpReceived>,
    /// The destination itself sent that ICMP error (a policy on the destination
    /// answering for it: Cilium's `policyDenyResponse`, firewalld).
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) icmp_from_destination: bool,
    /// Where this node discarded the flow's packet, when its drop reason did not say:
    /// the route or tunnel towards the destination.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub(crate) drop_site: Option<DropSite>,
    /// The namespace's conntrack counters around a netfilter drop of the flow.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub(crate) conntrack: Option<ConntrackEvidence>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) conntrack_cause: Option<ConntrackCause>,
    /// The netfilter rule whose counter rose with the flow's drop (`agent::rule_watch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rule: Option<Rule>,
    /// The NetworkPolicy that rule's comment names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) policy: Option<String>,
    /// The eBPF program at the TC hook that dropped the packet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) program: Option<HookProgram>,
    /// For a refusal: whether a RST answered the SYN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rst_received: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) icmp_watch: Option<IcmpWatch>,
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) abandoned: bool,
    /// For a reset of an accepted connection: the last client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_client: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) candidate_backends: Vec<SocketAddr>,
}

/// What the filter did with an inbound SYN, when this node can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum InboundAction {
    /// Dropped silently: the client times out.
    Drop,
    /// Answered (an ICMP error this node sent, or a rule whose verdict is `reject`): the
    /// client is refused or unreachable at once.
    Reject,
}

/// The evidence of a `tcp_syn_dropped`: the drop (reason, namespace, the interface it
/// came in on), the pod's veth it was going to, the ICMP error a REJECT sent, and the
/// rule or program behind it when named.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct InboundEvidence {
    /// `drop`, `reject`; absent when nothing tells (a drop whose rule is not named
    /// may be a `reject with tcp reset`, which sends no ICMP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) action: Option<InboundAction>,
    #[serde(flatten)]
    pub(crate) drop: DropEvidence,
    /// The pod's veth (node side) the SYN was routed to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pod_interface: Option<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub(crate) icmp_sent: Option<IcmpSent>,
    /// The drop namespace's conntrack counters around the first drop.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub(crate) conntrack: Option<ConntrackEvidence>,
    /// `table_full`: conntrack, not a rule, dropped the SYNs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) conntrack_cause: Option<ConntrackCause>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rule: Option<Rule>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) program: Option<HookProgram>,
}

/// A drop of the flow's SYN (or, on the return path, its SYN-ACK) on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct DropEvidence {
    pub(crate) drop_reason: String,
    pub(crate) syn_drops: u32,
    #[serde(skip_serializing_if = "is_false")]
    pub(crate) return_path: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) drop_netns: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) drop_ifindex: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) drop_interface: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct IcmpSent {
    pub(crate) icmp_sent_type: u32,
    pub(crate) icmp_sent_code: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) icmp_sent_netns: Option<u32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct IcmpReceived {
    pub(crate) icmp_received_type: u32,
    pub(crate) icmp_received_code: u32,
    /// Unknown when only the socket's error queue told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) icmp_received_from: Option<IpAddr>,
}

/// The conntrack table's size and limit now, and how much each statistic rose around
/// the drop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ConntrackEvidence {
    pub(crate) conntrack_count: u64,
    pub(crate) conntrack_max: u64,
    pub(crate) conntrack_stat_drop: u64,
    pub(crate) conntrack_stat_early_drop: u64,
    pub(crate) conntrack_stat_insert_failed: u64,
    pub(crate) conntrack_stat_invalid: u64,
}

impl From<&Window> for ConntrackEvidence {
    fn from(w: &Window) -> Self {
        Self {
            conntrack_count: w.now.count,
            conntrack_max: w.now.max,
            conntrack_stat_drop: w.drops(),
            conntrack_stat_early_drop: w.early_drops(),
            conntrack_stat_insert_failed: w.insert_failed(),
            conntrack_stat_invalid: w.invalid(),
        }
    }
}

/// ICMP frag-needed for a flow: generated here, received, dropped by netfilter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct FragEvidence {
    pub(crate) frag_needed_sent: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) frag_needed_mtu: Option<u32>,
    /// `null`: none seen while ICMP from the network was not watched (unknown).
    pub(crate) frag_needed_received: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) frag_needed_received_mtu: Option<u32>,
    pub(crate) frag_needed_dropped: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) icmp_watch: Option<IcmpWatch>,
}

/// A flow whose segment is retransmitted with no sign that size is the problem.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct StallEvidence {
    pub(crate) retransmits: u32,
    pub(crate) segment_len: u32,
    pub(crate) mss: u32,
    pub(crate) oversize_drops: u32,
    #[serde(flatten)]
    pub(crate) frag: FragEvidence,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) candidate_backends: Vec<SocketAddr>,
}

/// A flow retransmitting full-size segments with MTU evidence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct BlackholeEvidence {
    pub(crate) fullsize_retransmits: u32,
    pub(crate) oversize_drops: u32,
    pub(crate) mss: u32,
    pub(crate) segment_len: u32,
    #[serde(flatten)]
    pub(crate) frag: FragEvidence,
    /// Where netfilter dropped the frag-needed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) netfilter_hook: Option<NetfilterHook>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) drop_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) candidate_backends: Vec<SocketAddr>,
}

/// What got a flow out of a black hole nothing on the path explained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Recovery {
    /// The kernel's black-hole detection (`net.ipv4.tcp_mtu_probing`) shrank the MSS
    /// after retransmission timeouts.
    TcpMtuProbing,
}

/// A black hole the sender got out of by itself, seconds late.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct RecoveredEvidence {
    pub(crate) recovered_by: Recovery,
    /// Full-size retransmits before the segment was sent smaller.
    pub(crate) fullsize_retransmits: u32,
    pub(crate) mss_before: u32,
    pub(crate) mss_after: u32,
    /// From the stall's first retransmit to the smaller one.
    pub(crate) seconds_lost: f64,
    #[serde(flatten)]
    pub(crate) frag: FragEvidence,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) candidate_backends: Vec<SocketAddr>,
}

/// DF packets dropped as larger than the egress MTU.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct OversizeEvidence {
    pub(crate) drop_reason: String,
    pub(crate) packet_len: u32,
    pub(crate) egress_interface: String,
    pub(crate) egress_mtu: u32,
    #[serde(flatten)]
    pub(crate) frag: FragEvidence,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) candidate_backends: Vec<SocketAddr>,
}

/// An interface above its limit: the MTU model's arithmetic, every field present
/// (`null` where the model has no value), except the learned path MTU's, present only
/// when the route cache's learned path MTU limits the underlay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct MtuEvidence {
    pub(crate) underlay: Option<String>,
    pub(crate) underlay_mtu: Option<u32>,
    pub(crate) underlay_device_mtu: Option<u32>,
    pub(crate) underlay_route: Option<String>,
    pub(crate) underlay_route_mtu: Option<u32>,
    pub(crate) underlay_endpoint: Option<IpAddr>,
    pub(crate) underlay_endpoints: Option<u32>,
    pub(crate) underlay_source: Option<UnderlaySource>,
    /// With `underlay_source: learned_pmtu`, how the underlay device was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) underlay_found_by: Option<UnderlaySource>,
    /// The path MTU the route cache learned towards `underlay_endpoint`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) learned_pmtu: Option<u32>,
    /// Seconds until the kernel forgets it (and the finding resolves, unless learned
    /// again).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) learned_pmtu_expires_secs: Option<u32>,
    /// Who sent the frag-needed (packet too big) the path MTU was learned from: the
    /// hop, when this node's TC classifier saw one arrive for the endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) frag_needed_from: Option<IpAddr>,
    pub(crate) encapsulation: Option<String>,
    pub(crate) overhead: Option<u32>,
    pub(crate) overhead_breakdown: Option<String>,
    pub(crate) expected_mtu: Option<u32>,
    pub(crate) actual_mtu: u32,
    pub(crate) effective_mtu: Option<u32>,
    pub(crate) route: Option<String>,
    pub(crate) route_mtu: Option<u32>,
    pub(crate) route_advmss: Option<u32>,
    pub(crate) headroom: Option<i64>,
    pub(crate) family: Option<Family>,
    pub(crate) overlay: Option<String>,
    pub(crate) overlay_mtu: Option<u32>,
    pub(crate) role: Option<Role>,
    pub(crate) netns_name: String,
}

/// What the agent's own probe of a flow's path found ([`Evidence::Path`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PathEvidence {
    /// The verdict's own evidence, keys unchanged.
    pub(crate) base: Evidence,
    pub(crate) probe: PathProbeEvidence,
}

/// How a path probe came out, as the `path_probe` key says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PathProbeResult {
    /// Small probes answered, large ones vanished without a frag-needed.
    Blackhole,
    /// Large probes drew a frag-needed: PMTUD works on the path.
    FragNeeded,
    /// Every size up to the probe's ceiling was answered.
    Passed,
    /// Nothing answered, at any size: a silent peer, or echo filtered on the way
    /// (inconclusive).
    NoReply,
    /// Nothing crossed the tunnel while the tunnel's remote endpoint answered on the
    /// underlay.
    OverlayLost,
    /// Probes through the tunnel were answered: the tunnel carries packets.
    OverlayPassed,
}

/// One probe run, DF echo requests of increasing size, from the agent's namespace.
/// `path_probe_*` is the run towards the flow's peer (through the overlay when the node
/// routes it there), `underlay_probe_*` the one towards the tunnel's remote endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct PathProbeEvidence {
    pub(crate) path_probe: Option<PathProbeResult>,
    pub(crate) path_probe_target: Option<IpAddr>,
    /// Largest IP packet that got an echo reply.
    pub(crate) path_probe_largest_ok: Option<u32>,
    /// Smallest IP packet that got none (or a frag-needed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) path_probe_smallest_lost: Option<u32>,
    /// The path MTU the run names: the largest size that passed, when the smallest lost
    /// is one more (else the two bracket it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) path_mtu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) path_probe_frag_needed_from: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) path_probe_frag_needed_mtu: Option<u32>,
    /// Echo requests sent by the whole run (both targets), at most 20.
    pub(crate) path_probe_packets: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) underlay_probe_target: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) underlay_probe_answered: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) underlay_probe_largest_ok: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) underlay_probe_smallest_lost: Option<u32>,
}

/// A namespace with PMTUD off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct SysctlEvidence {
    pub(crate) sysctl: &'static str,
    pub(crate) value: u32,
    pub(crate) tcp_mtu_probing: Option<u32>,
    pub(crate) netns_name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_connect_fields_are_left_out_and_flattened_groups_are_flat() {
        let e = Evidence::Connect(Box::new(ConnectEvidence {
            errno: Some("ECONNREFUSED"),
            drop: Some(DropEvidence {
                drop_reason: "NETFILTER_DROP".into(),
                syn_drops: 2,
                ..Default::default()
            }),
            rst_received: Some(false),
            ..Default::default()
        }));
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "errno": "ECONNREFUSED",
                "drop_reason": "NETFILTER_DROP",
                "syn_drops": 2,
                "rst_received": false,
            })
        );
        let text = serde_json::to_string(&e).unwrap();
        assert!(text.starts_with(r#"{"drop_reason""#), "sorted keys: {text}");
    }

    #[test]
    fn unknown_frag_needed_received_is_null_not_absent() {
        let e = Evidence::Stall(StallEvidence {
            frag: FragEvidence {
                frag_needed_received: None,
                icmp_watch: Some(IcmpWatch::Off),
                ..Default::default()
            },
            ..Default::default()
        });
        let m = e.to_map();
        assert_eq!(m["frag_needed_received"], serde_json::Value::Null);
        assert_eq!(m["icmp_watch"], "off");
    }

    #[test]
    fn read_back_evidence_prints_as_served() {
        let served = serde_json::json!({"a_newer_field": 1, "errno": "EPIPE"});
        let e: Evidence = serde_json::from_value(served.clone()).unwrap();
        assert_eq!(serde_json::to_value(&e).unwrap(), served);
        assert_eq!(e.conntrack_cause(), None);
    }
}
