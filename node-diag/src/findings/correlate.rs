//! Correlation: turns one kernel verdict [`Event`] plus the evidence it carries (the SYN
//! drop this kernel recorded for the flow, the ICMP error it generated) into a [`Finding`]
//! naming the failing layer. Pure: fed synthetic events in the unit tests.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    ops::RangeInclusive,
    time::SystemTime,
};

use node_diag_common::{AF_INET, DropInfo, Event, FlowKey, drop_flag, event_flag, event_kind};
use serde_json::{Map, Value, json};

use super::{Finding, Kind, Layer, Severity, conntrack::Window, names::Names};

/// Drop reasons that mean a firewall rule on this node discarded the packet.
const FIREWALL_REASONS: &[&str] = &[
    "NETFILTER_DROP",
    "BPF_CGROUP_EGRESS",
    "TC_EGRESS",
    "TC_INGRESS",
];
/// Drop reasons that mean this node could not route or resolve the next hop.
const ROUTING_REASONS: &[&str] = &[
    "IP_NOROUTE",
    "IP_INNOROUTES",
    "IP_OUTNOROUTES",
    "IP_RPFILTER",
    "NEIGH_CREATEFAIL",
    "NEIGH_FAILED",
    "NEIGH_QUEUEFULL",
    "NEIGH_DEAD",
];

/// ICMP destination-unreachable codes sent by filters (RFC 1812 administratively prohibited).
const ICMP_ADMIN_CODES: &[u32] = &[9, 10, 13];
const ICMP_PORT_UNREACH: u32 = 3;
/// The socket error an ICMPv6 administratively-prohibited leaves.
const EACCES: u32 = 13;

pub fn errno_name(errno: u32) -> &'static str {
    match errno {
        13 => "EACCES",
        32 => "EPIPE",
        64 => "ENONET",
        101 => "ENETUNREACH",
        104 => "ECONNRESET",
        110 => "ETIMEDOUT",
        111 => "ECONNREFUSED",
        112 => "EHOSTDOWN",
        113 => "EHOSTUNREACH",
        _ => "",
    }
}

/// The address as the user knows it: an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
/// what a dual-stack socket connecting to IPv4 holds) is the IPv4 address it maps.
pub fn addr(flow: &FlowKey, bytes: &[u8; 16]) -> IpAddr {
    if flow.family == AF_INET {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(*bytes)).to_canonical()
    }
}

/// Whether a received destination-unreachable code is a filter's refusal: IPv4 codes 9,
/// 10 and 13 (RFC 1812), ICMPv6 codes 1 (administratively prohibited), 5 (source
/// address failed policy) and 6 (reject route).
fn admin_prohibited(v6: bool, code: u32) -> bool {
    if v6 {
        matches!(code, 1 | 5 | 6)
    } else {
        ICMP_ADMIN_CODES.contains(&code)
    }
}

/// Whether a received destination-unreachable code is "port unreachable".
fn port_unreachable(v6: bool, code: u32) -> bool {
    code == if v6 { 4 } else { ICMP_PORT_UNREACH }
}

/// Context the correlator needs beyond the event.
pub struct Context<'a> {
    pub names: &'a Names,
    pub now: SystemTime,
    /// The node's ephemeral port range: a connection whose local port is outside it and
    /// whose peer port is inside it was accepted by a listener.
    pub ephemeral_ports: RangeInclusive<u16>,
    /// The Service and NAT behind the event's destination, as the agent found them.
    pub translation: Translation,
    /// The conntrack counters of the namespace where the event's flow packet was
    /// dropped, around that drop (see [`super::conntrack`]); `None` when the drop was
    /// not a `NETFILTER_DROP` or the namespace has no readings.
    pub conntrack: Option<Window>,
    /// Whether ICMP errors arriving from the network (the TC classifier) were watched
    /// throughout the event's evidence window. When not, an event without a received
    /// ICMP error says nothing about whether one came: "unknown", not "none".
    pub icmp_watched: bool,
}

/// What the agent knows of the Service and NAT behind a flow's destination: the
/// kernel's NAT map or conntrack for the backend, kube-proxy's rules for the name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Translation {
    /// Where this node's NAT sent the flow, when it changed the destination.
    pub backend: Option<SocketAddr>,
    /// kube-proxy's name for the Service: `<namespace>/<name>:<port>`.
    pub service: Option<String>,
    /// kube-proxy's rules reject this Service's connects: it has no endpoints.
    pub no_endpoints: bool,
    /// The Service's endpoints, when NAT's choice among them is not known.
    pub candidates: Vec<SocketAddr>,
}

impl Translation {
    /// A sentence for a summary: where the connection went.
    fn describe(&self) -> Option<String> {
        match (&self.service, self.backend) {
            (Some(s), Some(b)) => Some(format!(
                " It is Service {s}, NATed on this node to backend {b}."
            )),
            (Some(s), None) => Some(format!(" It is Service {s}.")),
            (None, Some(b)) => Some(format!(" This node's NAT sent it to {b}.")),
            (None, None) => None,
        }
    }

    /// Sets the finding's Service fields and says where the connection went.
    fn apply(&self, f: &mut Finding) {
        if f.dst.is_none() || f.listener.is_some() {
            return;
        }
        f.service.clone_from(&self.service);
        f.backend = self.backend.map(|b| b.ip());
        f.backend_port = self.backend.map(|b| b.port());
        if let Some(more) = self.describe() {
            f.summary.push_str(&more);
        }
        if self.backend.is_none() && !self.candidates.is_empty() {
            let candidates: Vec<String> = self.candidates.iter().map(ToString::to_string).collect();
            f.evidence
                .insert("candidate_backends".into(), json!(candidates));
            f.summary.push_str(&format!(
                " Its backend is one of {} (conntrack keeps no record of a connection refused at once).",
                candidates.join(", ")
            ));
        }
    }
}

enum Evidence {
    Firewall(String),
    Routing(String),
    Conntrack(ConntrackCause, Window),
    None,
}

/// Why conntrack, not a rule, is behind a flow's `NETFILTER_DROP`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConntrackCause {
    /// The namespace's table was full: conntrack could make no entry and dropped the
    /// packet itself.
    TableFull,
    /// Conntrack found the packet INVALID and a `ct state invalid` rule dropped it.
    Invalid,
}

impl ConntrackCause {
    /// The `reason` label of `node_diag_conntrack_drops_total` and the evidence's
    /// `conntrack_cause`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TableFull => "table_full",
            Self::Invalid => "invalid",
        }
    }
}

/// Whether conntrack explains a flow's drop, on the evidence for this drop only (the
/// rules and their reasons are in [`super::conntrack`]): a `NETFILTER_DROP` in the
/// namespace of `window`, and there, for a full table, conntrack's own drops rising
/// while the table was at its limit; for INVALID, a dropped SYN-ACK (the packet
/// conntrack calls INVALID when it never saw the SYN) with at least as many INVALID
/// packets counted as the flow had drops. Anything else stays the rule's.
pub fn conntrack_cause(drop: &DropInfo, reason: &str, window: &Window) -> Option<ConntrackCause> {
    if reason != "NETFILTER_DROP" || drop.count == 0 || drop.netns != window.netns {
        return None;
    }
    if window.full && window.drops() > 0 {
        return Some(ConntrackCause::TableFull);
    }
    let return_path = drop.flags & drop_flag::SYN_ACK != 0;
    if return_path && window.drops() == 0 && window.invalid() >= u64::from(drop.count) {
        return Some(ConntrackCause::Invalid);
    }
    None
}

/// The conntrack counters behind a verdict as evidence: the table's size and limit now,
/// and how much each statistic rose around the drop.
fn conntrack_evidence(w: &Window, evidence: &mut Map<String, Value>) {
    evidence.insert("conntrack_count".into(), json!(w.now.count));
    evidence.insert("conntrack_max".into(), json!(w.now.max));
    evidence.insert("conntrack_stat_drop".into(), json!(w.drops()));
    evidence.insert("conntrack_stat_early_drop".into(), json!(w.early_drops()));
    evidence.insert(
        "conntrack_stat_insert_failed".into(),
        json!(w.insert_failed()),
    );
    evidence.insert("conntrack_stat_invalid".into(), json!(w.invalid()));
}

pub fn correlate(ev: &Event, ctx: &Context<'_>) -> Option<Finding> {
    let mut f = match ev.kind {
        event_kind::DF_OVERSIZE => Some(df_oversize(ev, ctx)),
        event_kind::PMTUD_STALL => Some(pmtud_stall(ev, ctx)),
        event_kind::TCP_STALL => Some(tcp_stall(ev, ctx)),
        _ => connect_verdict(ev, ctx),
    }?;
    ctx.translation.apply(&mut f);
    Some(f)
}

/// The finding's flow fields from the event.
fn with_flow(mut f: Finding, ev: &Event) -> Finding {
    let flow = &ev.flow;
    f.src = Some(addr(flow, &flow.saddr));
    f.dst = Some(addr(flow, &flow.daddr));
    f.dport = Some(flow.dport);
    f.sport = (flow.sport != 0).then_some(flow.sport);
    f.netns = (ev.netns != 0).then_some(ev.netns);
    f
}

/// ICMP frag-needed evidence (generated here, received, dropped by netfilter) as JSON.
/// Received is `null` (unknown) when none was seen and ICMP from the network was not
/// watched throughout the window.
fn frag_evidence(ev: &Event, watched: bool, evidence: &mut Map<String, Value>) {
    let sent = (ev.icmp.last_ns != 0 && ev.icmp.icmp_type == 3 && ev.icmp.icmp_code == 4)
        .then_some(ev.icmp);
    evidence.insert(
        "frag_needed_sent".into(),
        json!(sent.map_or(0, |i| i.count)),
    );
    if let Some(i) = sent.filter(|i| i.mtu != 0) {
        evidence.insert("frag_needed_mtu".into(), json!(i.mtu));
    }
    if watched || ev.icmp_rcvd.count > 0 {
        evidence.insert("frag_needed_received".into(), json!(ev.icmp_rcvd.count));
    } else {
        evidence.insert("frag_needed_received".into(), Value::Null);
        evidence.insert("icmp_watch".into(), json!("off"));
    }
    if ev.icmp_rcvd.count > 0 && ev.icmp_rcvd.mtu != 0 {
        evidence.insert("frag_needed_received_mtu".into(), json!(ev.icmp_rcvd.mtu));
    }
    evidence.insert("frag_needed_dropped".into(), json!(ev.frag_dropped.count));
}

fn df_oversize(ev: &Event, ctx: &Context<'_>) -> Finding {
    let flow = &ev.flow;
    let (src, dst) = (addr(flow, &flow.saddr), addr(flow, &flow.daddr));
    let iface = ctx
        .names
        .interface(ev.drop.netns, ev.drop.ifindex)
        .unwrap_or_else(|| format!("ifindex {}", ev.drop.ifindex));
    let mut evidence = Map::new();
    evidence.insert(
        "drop_reason".into(),
        json!(ctx.names.drop_reason(ev.drop.reason)),
    );
    evidence.insert("packet_len".into(), json!(ev.len));
    evidence.insert("egress_interface".into(), json!(iface));
    evidence.insert("egress_mtu".into(), json!(ev.mtu));
    frag_evidence(ev, ctx.icmp_watched, &mut evidence);
    // IPv6 has no tracepoint for the packet-too-big the kernel sends, but a forwarding
    // IPv6 node sends one for every such drop (rate-limited): only netfilter dropping it
    // here is visible, and decides.
    let v6 = flow.family != AF_INET;
    let pmtud_worked =
        ev.frag_dropped.count == 0 && (v6 || (ev.icmp.icmp_code == 4 && ev.icmp.count > 0));
    let (severity, tail, remediation) = if pmtud_worked {
        (
            Severity::Info,
            if v6 {
                "; the kernel answers each with an ICMPv6 packet-too-big and none was dropped here, so PMTUD can recover the flow"
            } else {
                "; ICMP frag-needed went back to the sender, so PMTUD can recover the flow"
            },
            format!(
                "Nothing is broken yet, but every new flow pays a drop and a retransmit: set the pod/CNI MTU to at most {} so packets fit the overlay.",
                ev.mtu
            ),
        )
    } else {
        (
            Severity::Warning,
            if v6 {
                "; this node's netfilter drops the ICMPv6 packet-too-big meant for the sender, so it cannot learn the path MTU"
            } else {
                "; no ICMP frag-needed went back, so the sender cannot learn the path MTU"
            },
            format!(
                "Set the pod/CNI MTU to at most {}, or clamp TCP MSS (`iptables -t mangle -A POSTROUTING -p tcp --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu`).",
                ev.mtu
            ),
        )
    };
    let summary = format!(
        "DF packets of {src} -> {dst}:{} ({} bytes) are dropped: larger than {iface}'s MTU {}{tail}.",
        flow.dport, ev.len, ev.mtu
    );
    let mut f = with_flow(
        Finding::new(
            Kind::DfOversizeDrop,
            Layer::OverlayMtu,
            severity,
            summary,
            remediation,
            ctx.now,
        ),
        ev,
    );
    f.interface = Some(iface);
    f.evidence = with_sorted_keys(evidence);
    f
}

fn pmtud_stall(ev: &Event, ctx: &Context<'_>) -> Finding {
    let flow = &ev.flow;
    let (src, dst) = (addr(flow, &flow.saddr), addr(flow, &flow.daddr));
    let mut evidence = Map::new();
    evidence.insert("fullsize_retransmits".into(), json!(ev.retrans));
    evidence.insert("oversize_drops".into(), json!(ev.drop.count));
    evidence.insert("mss".into(), json!(ev.mtu));
    evidence.insert("segment_len".into(), json!(ev.len));
    frag_evidence(ev, ctx.icmp_watched, &mut evidence);
    let generated_here = ev.icmp.icmp_code == 4 && ev.icmp.count > 0;
    let why = if ev.frag_dropped.count > 0 {
        // A frag-needed this node generated is dropped on its way out; one it forwards
        // is dropped in forward (or input, when addressed to the node itself).
        let hook = if generated_here { "output" } else { "forward" };
        evidence.insert("netfilter_hook".into(), json!(hook));
        evidence.insert("drop_reason".into(), json!("NETFILTER_DROP"));
        format!(
            "the ICMP frag-needed meant for the sender is dropped by netfilter on this node ({hook} hook, {} times)",
            ev.frag_dropped.count
        )
    } else if ev.icmp_rcvd.count > 0 {
        format!(
            "ICMP frag-needed (MTU {}) reached this node {} times but the sender never shrank its segments (filtered before the pod, or PMTUD disabled there)",
            ev.icmp_rcvd.mtu, ev.icmp_rcvd.count
        )
    } else if generated_here {
        format!(
            "this node generated ICMP frag-needed (MTU {}) {} times, but it never took effect at the sender: it is lost or ignored between this node and the sender",
            ev.icmp.mtu, ev.icmp.count
        )
    } else {
        // The kernel reports a black hole only with MTU evidence: here, oversize drops.
        format!(
            "its full-size packets are dropped on this node as larger than the egress MTU ({} times) and no frag-needed goes back",
            ev.drop.count
        )
    };
    let summary = format!(
        "PMTUD black hole: {src}:{} -> {dst}:{} keeps retransmitting full-size segments ({} in a row, {} bytes, MSS {}) and {why}.",
        flow.sport, flow.dport, ev.retrans, ev.len, ev.mtu
    );
    let remediation = "Fix the MTU (pod/CNI MTU = underlay MTU - overlay overhead); clamp TCP MSS (`iptables -t mangle -A POSTROUTING -p tcp --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu`); allow ICMP type 3 code 4; or set `sysctl -w net.ipv4.tcp_mtu_probing=1` on the sender.".to_string();
    let mut f = with_flow(
        Finding::new(
            Kind::PmtudBlackhole,
            Layer::IcmpFiltered,
            Severity::Critical,
            summary,
            remediation,
            ctx.now,
        ),
        ev,
    );
    f.evidence = with_sorted_keys(evidence);
    f
}

/// The same stall as a black hole, but with no sign that size is the problem: the peer
/// stopped answering altogether.
fn tcp_stall(ev: &Event, ctx: &Context<'_>) -> Finding {
    let flow = &ev.flow;
    let (src, dst) = (addr(flow, &flow.saddr), addr(flow, &flow.daddr));
    let mut evidence = Map::new();
    evidence.insert("retransmits".into(), json!(ev.retrans));
    evidence.insert("segment_len".into(), json!(ev.len));
    evidence.insert("mss".into(), json!(ev.mtu));
    evidence.insert("oversize_drops".into(), json!(0));
    frag_evidence(ev, ctx.icmp_watched, &mut evidence);
    let why = if ev.len < ev.mtu {
        format!(
            "The stalled segment ({} bytes) is shorter than the MSS ({}), so size is not the problem",
            ev.len, ev.mtu
        )
    } else if ctx.icmp_watched || ev.icmp_rcvd.count > 0 {
        "With no oversize drop and no ICMP frag-needed for this flow, size is not the problem"
            .to_owned()
    } else {
        // A frag-needed from a router beyond this node may have come and gone unwatched.
        "No oversize drop here and no ICMP frag-needed generated or dropped here, so size is probably not the problem (whether one arrived from the network was not watched)"
            .to_owned()
    };
    let summary = format!(
        "Connection {src}:{} -> {dst}:{} stalled: the same segment was retransmitted {} times and nothing came back. {why}: the peer went silent (node or pod gone, a firewall or NetworkPolicy applied mid-connection, an idle timeout on a middlebox).",
        flow.sport, flow.dport, ev.retrans
    );
    let remediation = format!(
        "Check that {dst} is still up and reachable (`ping`, the pod's status, its node), then rules changed on the path to {dst}:{}. If only large transfers hang while small requests work, run `node-diag probe {dst}` to look for a path MTU black hole beyond this node.",
        flow.dport
    );
    let mut f = with_flow(
        Finding::new(
            Kind::TcpStall,
            Layer::Unknown,
            Severity::Warning,
            summary,
            remediation,
            ctx.now,
        ),
        ev,
    );
    f.evidence = with_sorted_keys(evidence);
    f
}

/// For a connect reported as timing out that was established after all: which findings
/// it withdraws (kind, netns, destination, port).
pub fn withdrawn(ev: &Event) -> Option<(Kind, Option<u32>, IpAddr, u16)> {
    (ev.kind == event_kind::CONNECT_LATE).then(|| {
        let flow = &ev.flow;
        (
            Kind::TcpTimeout,
            (ev.netns != 0).then_some(ev.netns),
            addr(flow, &flow.daddr),
            flow.dport,
        )
    })
}

fn connect_verdict(ev: &Event, ctx: &Context<'_>) -> Option<Finding> {
    let flow = &ev.flow;
    let src = addr(flow, &flow.saddr);
    let dst = addr(flow, &flow.daddr);
    let dport = flow.dport;
    let mut evidence = Map::new();
    if ev.error != 0 {
        evidence.insert("errno".into(), json!(errno_name(ev.error)));
    }
    if ev.retrans != 0 {
        evidence.insert("syn_retransmits".into(), json!(ev.retrans));
    }
    let drop_reason = (ev.drop.count > 0).then(|| ctx.names.drop_reason(ev.drop.reason));
    let return_path = ev.drop.flags & drop_flag::SYN_ACK != 0;
    // What was dropped: the SYN on its way out, or the peer's SYN-ACK on its way back.
    let dropped = if return_path {
        "the SYN-ACK coming back"
    } else {
        "its SYN"
    };
    if let Some(reason) = &drop_reason {
        if return_path {
            evidence.insert("return_path".into(), json!(true));
        }
        evidence.insert("drop_reason".into(), json!(reason));
        evidence.insert("syn_drops".into(), json!(ev.drop.count));
        if ev.drop.netns != 0 {
            evidence.insert("drop_netns".into(), json!(ev.drop.netns));
        }
        if ev.drop.ifindex != 0 {
            evidence.insert("drop_ifindex".into(), json!(ev.drop.ifindex));
            if let Some(name) = ctx.names.interface(ev.drop.netns, ev.drop.ifindex) {
                evidence.insert("drop_interface".into(), json!(name));
            }
        }
    }
    let icmp = (ev.icmp.last_ns != 0).then_some(ev.icmp);
    if let Some(icmp) = icmp {
        evidence.insert("icmp_sent_type".into(), json!(icmp.icmp_type));
        evidence.insert("icmp_sent_code".into(), json!(icmp.icmp_code));
        if icmp.netns != 0 {
            evidence.insert("icmp_sent_netns".into(), json!(icmp.netns));
        }
    }
    // An ICMP error that came back from the path (TC ingress), for connect verdicts.
    let received = (ev.icmp_rcvd.count > 0).then_some(ev.icmp_rcvd);
    let v6 = flow.family != AF_INET;
    // No sender when only the socket's error queue told (see the eBPF `queued_icmp_error`).
    let sender = received
        .filter(|r| r.from != [0; 16])
        .map(|r| addr(flow, &r.from));
    if let Some(r) = received {
        evidence.insert("icmp_received_type".into(), json!(r.icmp_type));
        evidence.insert("icmp_received_code".into(), json!(r.icmp_code));
        if let Some(sender) = sender {
            evidence.insert("icmp_received_from".into(), json!(sender));
        }
    }
    let from = sender.map(|a| format!(" ({a})")).unwrap_or_default();
    // The namespace's conntrack counters around a netfilter drop of the flow: evidence
    // either way (a table with room is why a rule is blamed).
    let conntrack = drop_reason.as_ref().and_then(|r| {
        let w = ctx
            .conntrack
            .filter(|w| r == "NETFILTER_DROP" && w.netns == ev.drop.netns)?;
        conntrack_evidence(&w, &mut evidence);
        Some((conntrack_cause(&ev.drop, r, &w)?, w))
    });
    // A refusal is an answer, which conntrack never gives: only drops can be its.
    let classified = if let Some((cause, w)) =
        conntrack.filter(|_| ev.kind != event_kind::CONNECT_REFUSED)
    {
        evidence.insert("conntrack_cause".into(), json!(cause.as_str()));
        Evidence::Conntrack(cause, w)
    } else {
        match (&drop_reason, icmp, received) {
            (Some(r), _, _) if FIREWALL_REASONS.contains(&r.as_str()) => Evidence::Firewall(
                format!("a netfilter/eBPF filter on this node dropped {dropped} ({r})"),
            ),
            (_, Some(i), _) if ICMP_ADMIN_CODES.contains(&i.icmp_code) => {
                Evidence::Firewall(format!(
                    "this node answered it with ICMP administratively prohibited (code {})",
                    i.icmp_code
                ))
            }
            (Some(r), _, _) if ROUTING_REASONS.contains(&r.as_str()) => {
                Evidence::Routing(format!("the kernel dropped {dropped} with {r}"))
            }
            (_, Some(i), _) => Evidence::Routing(format!(
                "this node answered it with ICMP destination unreachable code {}",
                i.icmp_code
            )),
            (_, _, Some(r)) if admin_prohibited(v6, r.icmp_code) => Evidence::Firewall(format!(
                "a filter on the path{from} answered it with ICMP{} administratively prohibited (code {})",
                if v6 { "v6" } else { "" },
                r.icmp_code
            )),
            (_, _, Some(r)) if port_unreachable(v6, r.icmp_code) => Evidence::Firewall(format!(
                "an ICMP{} port-unreachable{from} answered it: a REJECT rule on the path",
                if v6 { "v6" } else { "" }
            )),
            (_, _, Some(r)) => Evidence::Routing(format!(
                "a router on the path{from} answered it with ICMP{} destination unreachable code {}",
                if v6 { "v6" } else { "" },
                r.icmp_code
            )),
            _ => Evidence::None,
        }
    };

    let rst_received = ev.flags & event_flag::RST_RECEIVED != 0;
    if ev.kind == event_kind::CONNECT_REFUSED {
        evidence.insert("rst_received".into(), json!(rst_received));
    }
    // An ICMP error ended the connect, but which one and from whom was not watched.
    let icmp_unseen = received.is_none()
        && !ctx.icmp_watched
        && (ev.kind == event_kind::CONNECT_UNREACHABLE
            || (ev.kind == event_kind::CONNECT_REFUSED && !rst_received));
    if icmp_unseen {
        evidence.insert("icmp_watch".into(), json!("off"));
    }
    let abandoned = ev.kind == event_kind::CONNECT_ABANDONED;
    if abandoned {
        evidence.insert("abandoned".into(), json!(true));
    }
    let (kind, layer, severity, summary, remediation) = match ev.kind {
        event_kind::CONNECT_REFUSED => {
            let service = ctx.translation.service.as_deref().filter(|_| ctx.translation.no_endpoints);
            if let (Some(svc), Some(i)) = (service, icmp.filter(|i| i.icmp_code == ICMP_PORT_UNREACH)) {
                // kube-proxy's own REJECT for a Service without endpoints: the Service,
                // not a firewall, and not the application.
                (
                    Kind::TcpRefused,
                    Layer::Service,
                    Severity::Warning,
                    format!(
                        "Connection to {dst}:{dport} was rejected by kube-proxy on this node (ICMP unreachable code {}): Service {svc} has no ready endpoints.",
                        i.icmp_code
                    ),
                    service_remediation(svc),
                )
            } else if let Some(i) = icmp.filter(|i| {
                i.icmp_code == ICMP_PORT_UNREACH || ICMP_ADMIN_CODES.contains(&i.icmp_code)
            }) {
                (
                    Kind::TcpRefused,
                    Layer::Firewall,
                    Severity::Warning,
                    format!(
                        "Connection to {dst}:{dport} was rejected by a firewall rule on this node (ICMP unreachable code {}), not by the application.",
                        i.icmp_code
                    ),
                    "Find the REJECT rule for this port (`nft list ruleset`, `iptables-save`, NetworkPolicy) and allow the traffic.".to_string(),
                )
            } else if let Evidence::Firewall(why) = &classified {
                // `reject with tcp reset`: the RST comes from this node's netfilter, which
                // also drops the SYN.
                (
                    Kind::TcpRefused,
                    Layer::Firewall,
                    Severity::Warning,
                    format!(
                        "Connection to {dst}:{dport} was rejected by a firewall rule on this node, not by the application: {why} and answered it with a reset."
                    ),
                    "Find the REJECT rule for this port (`nft list ruleset`, `iptables-save`, NetworkPolicy) and allow the traffic.".to_string(),
                )
            } else if !rst_received {
                (
                    Kind::TcpRefused,
                    Layer::Firewall,
                    Severity::Warning,
                    format!(
                        "Connection to {dst}:{dport} was refused by an ICMP port-unreachable, not by a RST: a REJECT rule on a firewall between here and {dst} (a host firewall such as firewalld, a NetworkPolicy) answered instead of the application."
                    ),
                    format!(
                        "Find the REJECT rule for port {dport} on the destination node and on the path (`nft list ruleset`, `iptables-save`, NetworkPolicies) and allow the traffic."
                    ),
                )
            } else {
                (
                    Kind::TcpRefused,
                    Layer::Listener,
                    Severity::Warning,
                    format!(
                        "Connection to {dst}:{dport} was refused: the packet arrived and the peer answered the SYN with a RST, so nothing listens on that port."
                    ),
                    format!(
                        "Check the destination's listener (`ss -tlnp` in the pod): the app may be down, bound to 127.0.0.1, or the Service targetPort may not match {dport}."
                    ),
                )
            }
        }
        event_kind::CONNECT_TIMEOUT | event_kind::CONNECT_ABANDONED => {
            let (layer, summary, remediation) = match classified {
                Evidence::Conntrack(cause, w) => {
                    let (summary, remediation) =
                        conntrack_text(cause, &w, ev, dropped, &format!("{dst}:{dport}"));
                    (
                        Layer::Conntrack,
                        format!("Connection to {dst}:{dport} is timing out: {summary}"),
                        remediation,
                    )
                }
                Evidence::Firewall(why) => (
                    Layer::Firewall,
                    format!("Connection to {dst}:{dport} is timing out: {why}."),
                    format!(
                        "Find the rule dropping tcp dport {dport} on this node (`nft list ruleset`, `iptables-save`, NetworkPolicy) and allow the traffic."
                    ),
                ),
                Evidence::Routing(why) => (
                    Layer::CniRouting,
                    format!("Connection to {dst}:{dport} is timing out: {why}."),
                    format!(
                        "Check pod routing on the nodes (`ip route get {dst}`, neighbour tables, the CNI agent's health)."
                    ),
                ),
                Evidence::None => (
                    Layer::Unknown,
                    format!(
                        "Connection to {dst}:{dport} is timing out: its SYNs left this node and nothing came back, so they are dropped beyond it (a remote host firewall, a cloud security group, or the peer node's routing)."
                    ),
                    format!(
                        "Check the destination node's firewall and routing for {dst}:{dport}, then cloud security groups / NACLs between the nodes; `tcpdump -ni any host {dst} and port {dport}` on the destination node shows whether the SYNs arrive."
                    ),
                ),
            };
            let (severity, summary) = if abandoned {
                let summary = format!(
                    "{summary} The application gave up on the connect first (its own connect timeout) after {} SYN retransmits.",
                    ev.retrans
                );
                // Without evidence on this node an impatient client is no page.
                let severity = if layer == Layer::Unknown {
                    Severity::Warning
                } else {
                    Severity::Critical
                };
                (severity, summary)
            } else {
                (Severity::Critical, summary)
            };
            (Kind::TcpTimeout, layer, severity, summary, remediation)
        }
        event_kind::CONNECT_UNREACHABLE => {
            let errno = errno_name(ev.error);
            let classified = match classified {
                // Only an ICMPv6 administratively-prohibited makes EACCES: a filter on
                // the path (ip6tables/nft REJECT, a NetworkPolicy) said no.
                Evidence::None if ev.error == EACCES => Evidence::Firewall(
                    "a firewall on the path answered with ICMPv6 administratively prohibited"
                        .to_string(),
                ),
                other => other,
            };
            match classified {
                Evidence::Conntrack(cause, w) => {
                    let (summary, remediation) =
                        conntrack_text(cause, &w, ev, dropped, &format!("{dst}:{dport}"));
                    (
                        Kind::TcpUnreachable,
                        Layer::Conntrack,
                        Severity::Critical,
                        format!("Connection to {dst}:{dport} failed with {errno}: {summary}"),
                        remediation,
                    )
                }
                Evidence::Firewall(why) => (
                    Kind::TcpUnreachable,
                    Layer::Firewall,
                    Severity::Critical,
                    format!("Connection to {dst}:{dport} failed with {errno}: {why}."),
                    format!(
                        "Find the rule rejecting traffic to {dst}:{dport} (`nft list ruleset`, NetworkPolicy) and allow it."
                    ),
                ),
                Evidence::Routing(why) => (
                    Kind::TcpUnreachable,
                    Layer::CniRouting,
                    Severity::Critical,
                    format!("Connection to {dst}:{dport} failed with {errno}: {why}."),
                    format!(
                        "Check the route to {dst} on every node on the path (`ip route get {dst}`) and the CNI agent's health."
                    ),
                ),
                // An ICMP error from beyond this node that nobody watched: a router's
                // unreachable and a firewall's prohibited read alike in the errno.
                Evidence::None if icmp_unseen => (
                    Kind::TcpUnreachable,
                    Layer::Unknown,
                    Severity::Warning,
                    format!(
                        "Connection to {dst}:{dport} failed with {errno}: a host on the path answered it with an ICMP error while ICMP from the network was not watched, so whether a router (no route) or a firewall (prohibited) sent it is unknown."
                    ),
                    format!(
                        "Retry: once ICMP is watched (metric `node_diag_icmp_watch` 1, or the agent run with `--icmp-watch always`) the next failure names its sender. Meanwhile check the route to {dst} (`ip route get {dst}`) and the REJECT rules on the path (`nft list ruleset`, NetworkPolicies)."
                    ),
                ),
                Evidence::None => (
                    Kind::TcpUnreachable,
                    Layer::CniRouting,
                    Severity::Critical,
                    format!(
                        "Connection to {dst}:{dport} failed with {errno}: a router on the path reported the destination unreachable."
                    ),
                    format!(
                        "Check the route to {dst} on every node on the path (`ip route get {dst}`) and the CNI agent's health."
                    ),
                ),
            }
        }
        event_kind::ESTABLISHED_RESET if server_side(flow, &ctx.ephemeral_ports) => {
            return Some(listener_reset(ev, ctx, evidence));
        }
        event_kind::ESTABLISHED_RESET => (
            Kind::TcpReset,
            Layer::Peer,
            Severity::Warning,
            format!(
                "Established connection {src}:{} -> {dst}:{dport} was reset by the peer ({}).",
                flow.sport,
                errno_name(ev.error)
            ),
            "Check the peer application's logs for crashes, restarts or aborted requests; a middlebox idle timeout can also reset long-lived connections.".to_string(),
        ),
        _ => return None,
    };

    let mut finding = with_flow(
        Finding::new(kind, layer, severity, summary, remediation, ctx.now),
        ev,
    );
    finding.evidence = with_sorted_keys(evidence);
    Some(finding)
}

/// What to check for a Service without endpoints.
fn service_remediation(svc: &str) -> String {
    let (ns, name) = svc
        .split_once('/')
        .map(|(ns, rest)| (ns, rest.split(':').next().unwrap_or(rest)))
        .unwrap_or(("default", svc));
    format!(
        "Check the Service's selector and its pods' readiness: `kubectl -n {ns} get endpointslices -l kubernetes.io/service-name={name}`, `kubectl -n {ns} describe service {name}`, and whether the selected pods are Ready (failing readiness probes take them out)."
    )
}

/// The summary's explanation and the remediation of a conntrack verdict.
fn conntrack_text(
    cause: ConntrackCause,
    w: &Window,
    ev: &Event,
    dropped: &str,
    target: &str,
) -> (String, String) {
    let (count, max, netns) = (w.now.count, w.now.max, w.netns);
    match cause {
        ConntrackCause::TableFull => (
            format!(
                "the conntrack table of netns {netns} on this node is full ({count} entries of nf_conntrack_max {max}), so conntrack could not track {dropped} and dropped it (NETFILTER_DROP, `nf_conntrack: table full, dropping packet`; {} packets dropped by conntrack there around this attempt). No firewall rule dropped it.",
                w.drops()
            ),
            format!(
                "Raise the limit on the node: `sysctl -w net.netfilter.nf_conntrack_max=<higher>` (it holds every namespace) and the hash table with it (`net.netfilter.nf_conntrack_buckets`, writable in the initial namespace; recent kernels make it as large as the limit) so lookups stay short. Find what fills the table: `conntrack -C` (per namespace: `ip netns exec` or `nsenter -n`), `conntrack -S` (drop, early_drop), the top sources with `conntrack -L | awk '{{for (i = 1; i <= NF; i++) if ($i ~ /^src=/) {{ print $i; next }}}}' | sort | uniq -c | sort -rn | head`; shorten the timeouts of what lingers (`net.netfilter.nf_conntrack_tcp_timeout_time_wait`, `nf_conntrack_udp_timeout`, `nf_conntrack_tcp_timeout_established`). Connections to {target} work again once entries free up."
            ),
        ),
        ConntrackCause::Invalid => (
            format!(
                "conntrack on this node (netns {netns}) found {dropped} INVALID, no connection it tracks matches it, and a `ct state invalid drop` rule (kube-proxy's `KUBE-FORWARD --ctstate INVALID -j DROP`) dropped it ({} INVALID packets counted there around this attempt, {} drops of this flow).",
                w.invalid(),
                ev.drop.count
            ),
            "A SYN-ACK is INVALID when conntrack on this node never saw its SYN: the connection's two directions take different paths (asymmetric routing, ECMP, a SYN that left through another node), or a NOTRACK rule exempted the SYN. Route both directions through the same node, remove the NOTRACK for this traffic, or check `conntrack -S` (invalid) while reproducing; `net.netfilter.nf_conntrack_tcp_be_liberal=1` only helps out-of-window packets.".to_string(),
        ),
    }
}

/// Whether the local end of `flow` is a listener's: its port is not ephemeral and the
/// peer's is.
fn server_side(flow: &FlowKey, ephemeral: &RangeInclusive<u16>) -> bool {
    !ephemeral.contains(&flow.sport) && ephemeral.contains(&flow.dport)
}

/// A reset of a connection a listener accepted: aggregated per listener, since every
/// client connects from a new port.
fn listener_reset(ev: &Event, ctx: &Context<'_>, mut evidence: Map<String, Value>) -> Finding {
    let flow = &ev.flow;
    let listener = SocketAddr::new(addr(flow, &flow.saddr), flow.sport);
    let client = SocketAddr::new(addr(flow, &flow.daddr), flow.dport);
    evidence.insert("last_client".into(), json!(client.to_string()));
    let mut f = Finding::new(
        Kind::TcpReset,
        Layer::Peer,
        Severity::Warning,
        format!(
            "Connections accepted by the listener {listener} are reset by their clients ({}); the last from {client}.",
            errno_name(ev.error)
        ),
        "Clients are aborting their requests: check their timeouts (a client giving up before this server answers resets the connection) and whether this server answers slowly; a load balancer's or middlebox's idle timeout resets long-lived connections too.".to_string(),
        ctx.now,
    );
    f.listener = Some(listener);
    f.netns = (ev.netns != 0).then_some(ev.netns);
    f.evidence = with_sorted_keys(evidence);
    f
}

fn with_sorted_keys(m: Map<String, Value>) -> Map<String, Value> {
    let mut v: Vec<_> = m.into_iter().collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_network::conntrack_stats::ConntrackStats;
    use crate::{
        findings::fixtures::event,
        kernel::tracefs::{DropReasons, Format},
    };
    use node_diag_common::{DropInfo, IcmpInfo};

    fn reasons() -> DropReasons {
        DropReasons::from_format(&Format::parse(
            "skb:kfree_skb",
            r#"print fmt: "reason: %s", __print_symbolic(REC->reason, { 2, "NOT_SPECIFIED" }, { 12, "NETFILTER_DROP" }, { 88, "IP_INNOROUTES" }, { 58, "NEIGH_FAILED" })"#,
        ))
    }

    /// A destination-unreachable of `code` that this node's stack sent (netns 1, ifindex 2).
    fn icmp_sent_here(code: u32) -> IcmpInfo {
        IcmpInfo {
            last_ns: 5,
            icmp_type: 3,
            icmp_code: code,
            netns: 1,
            ifindex: 2,
            ..Default::default()
        }
    }

    /// One destination-unreachable of `code` received from the IPv4 address `from`.
    fn icmp_received(code: u32, from: [u8; 4]) -> IcmpInfo {
        let mut icmp = IcmpInfo {
            last_ns: 5,
            icmp_type: 3,
            icmp_code: code,
            count: 1,
            ..Default::default()
        };
        icmp.from[..4].copy_from_slice(&from);
        icmp
    }

    fn run(ev: &Event) -> Option<Finding> {
        run_with(ev, None)
    }

    fn run_with(ev: &Event, conntrack: Option<Window>) -> Option<Finding> {
        run_ctx(ev, conntrack, true)
    }

    /// As the agent correlates an event whose window ICMP from the network was not
    /// watched in (the classifier not attached yet, or unavailable).
    fn run_unwatched(ev: &Event) -> Option<Finding> {
        run_ctx(ev, None, false)
    }

    fn run_ctx(ev: &Event, conntrack: Option<Window>, icmp_watched: bool) -> Option<Finding> {
        let names = Names::new(reasons(), |_, i| (i == 3).then(|| "vpod0".to_string()));
        correlate(
            ev,
            &Context {
                names: &names,
                now: SystemTime::UNIX_EPOCH,
                ephemeral_ports: 32768..=60999,
                translation: Translation::default(),
                conntrack,
                icmp_watched,
            },
        )
    }

    fn run_translated(ev: &Event, translation: Translation) -> Option<Finding> {
        let names = Names::new(reasons(), |_, _| None);
        correlate(
            ev,
            &Context {
                names: &names,
                now: SystemTime::UNIX_EPOCH,
                ephemeral_ports: 32768..=60999,
                translation,
                conntrack: None,
                icmp_watched: true,
            },
        )
    }

    fn rejected_here() -> Event {
        let mut ev = event(event_kind::CONNECT_REFUSED, 111);
        ev.icmp = IcmpInfo {
            last_ns: 5,
            icmp_type: 3,
            icmp_code: 3,
            netns: 1,
            ..Default::default()
        };
        ev
    }

    /// A timeout whose SYNs (or SYN-ACKs) got `NETFILTER_DROP` in netns 77.
    fn netfilter_timeout(drops: u32, flags: u32) -> Event {
        let mut ev = event(event_kind::CONNECT_TIMEOUT, 0);
        ev.retrans = 2;
        ev.drop = DropInfo {
            last_ns: 9,
            reason: 12,
            count: drops,
            netns: 77,
            ifindex: 3,
            flags,
            ..Default::default()
        };
        ev
    }

    #[test]
    fn kube_proxys_no_endpoints_reject_is_the_service() {
        let f = run_translated(
            &rejected_here(),
            Translation {
                service: Some("shop/cart:http".into()),
                no_endpoints: true,
                ..Translation::default()
            },
        )
        .unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Service));
        assert_eq!(f.service.as_deref(), Some("shop/cart:http"));
        assert!(
            f.summary
                .contains("Service shop/cart:http has no ready endpoints"),
            "{}",
            f.summary
        );
        assert!(f.remediation.contains("selector"), "{}", f.remediation);
        assert!(
            f.remediation.contains("-n shop") && f.remediation.contains("service-name=cart"),
            "{}",
            f.remediation
        );
    }

    #[test]
    fn a_reject_for_a_service_with_endpoints_stays_the_firewall() {
        // A NetworkPolicy or host firewall rejecting a Service that has endpoints.
        let f = run_translated(
            &rejected_here(),
            Translation {
                service: Some("shop/cart:http".into()),
                no_endpoints: false,
                ..Translation::default()
            },
        )
        .unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        assert_eq!(f.service.as_deref(), Some("shop/cart:http"));
    }

    #[test]
    fn a_backend_refusing_is_its_listener_with_service_and_backend() {
        let backend: SocketAddr = "10.244.2.9:8080".parse().unwrap();
        let f = run_translated(
            &refused_with_rst(),
            Translation {
                service: Some("shop/cart:http".into()),
                no_endpoints: false,
                backend: Some(backend),
                ..Translation::default()
            },
        )
        .unwrap();
        assert_eq!(f.layer, Layer::Listener);
        assert_eq!(
            (f.backend, f.backend_port),
            (Some(backend.ip()), Some(8080))
        );
        assert!(
            f.summary.contains("backend 10.244.2.9:8080"),
            "{}",
            f.summary
        );
        let plain = run(&refused_with_rst()).unwrap();
        assert_eq!((plain.service, plain.backend), (None, None));
    }

    /// Netns 77's conntrack counters: `count`/`max` now, `drop` and `invalid` risen by
    /// the given amounts.
    fn window(count: u64, max: u64, drop: u64, invalid: u64) -> Window {
        let before = ConntrackStats {
            count,
            max,
            drop: 40,
            invalid: 7,
            ..Default::default()
        };
        Window {
            netns: 77,
            before,
            now: ConntrackStats {
                drop: 40 + drop,
                invalid: 7 + invalid,
                ..before
            },
            full: count >= max,
        }
    }

    fn refused_with_rst() -> Event {
        let mut ev = event(event_kind::CONNECT_REFUSED, 111);
        ev.flags = event_flag::RST_RECEIVED;
        ev
    }

    #[test]
    fn refused_is_the_listener() {
        let f = run(&refused_with_rst()).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Listener));
        assert_eq!(f.evidence["rst_received"], true);
        assert_eq!(f.src, Some("10.244.1.7".parse().unwrap()));
        assert_eq!(f.dst, Some("10.244.2.9".parse().unwrap()));
        assert_eq!(
            (f.dport, f.sport, f.netns),
            (Some(8080), Some(40000), Some(4026532000))
        );
        assert_eq!(f.evidence["errno"], "ECONNREFUSED");
        assert_eq!(f.first_seen, "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn refused_by_local_reject_rule_is_the_firewall() {
        let mut ev = event(event_kind::CONNECT_REFUSED, 111);
        ev.icmp = icmp_sent_here(3);
        assert_eq!(run(&ev).unwrap().layer, Layer::Firewall);
    }

    #[test]
    fn timeout_with_netfilter_drop_is_the_firewall() {
        let mut ev = event(event_kind::CONNECT_TIMEOUT, 0);
        ev.retrans = 2;
        ev.drop = DropInfo {
            last_ns: 9,
            reason: 12,
            count: 3,
            netns: 77,
            ifindex: 3,
            ..Default::default()
        };
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::Firewall));
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.evidence["drop_reason"], "NETFILTER_DROP");
        assert_eq!(f.evidence["syn_drops"], 3);
        assert_eq!(f.evidence["drop_interface"], "vpod0");
        assert_eq!(f.evidence["syn_retransmits"], 2);
    }

    #[test]
    fn timeout_with_routing_drop_is_cni_routing() {
        let mut ev = event(event_kind::CONNECT_TIMEOUT, 0);
        ev.drop = DropInfo {
            last_ns: 9,
            reason: 58,
            count: 1,
            netns: 0,
            ifindex: 0,
            ..Default::default()
        };
        let f = run(&ev).unwrap();
        assert_eq!(f.layer, Layer::CniRouting);
        assert!(f.summary.contains("NEIGH_FAILED"));
    }

    #[test]
    fn timeout_without_local_evidence_points_beyond_the_node() {
        let f = run(&event(event_kind::CONNECT_TIMEOUT, 0)).unwrap();
        assert_eq!(f.layer, Layer::Unknown);
        assert!(f.summary.contains("cloud security group"));
    }

    #[test]
    fn unreachable_is_cni_routing_unless_admin_prohibited() {
        let f = run(&event(event_kind::CONNECT_UNREACHABLE, 113)).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpUnreachable, Layer::CniRouting));
        assert_eq!(f.evidence["errno"], "EHOSTUNREACH");
        let mut ev = event(event_kind::CONNECT_UNREACHABLE, 113);
        ev.icmp = icmp_sent_here(13);
        assert_eq!(run(&ev).unwrap().layer, Layer::Firewall);
    }

    #[test]
    fn unreachable_with_icmp_unwatched_is_unknown_not_routing() {
        // A firewall's prohibited and a router's unreachable read alike in the errno:
        // without the ICMP itself, no layer is named and nobody is paged.
        let f = run_unwatched(&event(event_kind::CONNECT_UNREACHABLE, 113)).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpUnreachable, Layer::Unknown));
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.evidence["icmp_watch"], "off");
        assert!(f.summary.contains("not watched"), "{}", f.summary);
        // Evidence from this node still decides: the ICMP it generated itself.
        let mut ev = event(event_kind::CONNECT_UNREACHABLE, 113);
        ev.icmp = icmp_sent_here(13);
        assert_eq!(run_unwatched(&ev).unwrap().layer, Layer::Firewall);
        // As does a received one, seen before the watch window was known to be whole.
        let mut ev = event(event_kind::CONNECT_UNREACHABLE, 113);
        ev.icmp_rcvd = icmp_received(1, [10, 0, 0, 9]);
        let f = run_unwatched(&ev).unwrap();
        assert_eq!(f.layer, Layer::CniRouting);
        assert!(f.evidence.get("icmp_watch").is_none());
        // Watched, the same errno with no ICMP received names the routing layer, as before.
        let f = run(&event(event_kind::CONNECT_UNREACHABLE, 113)).unwrap();
        assert!(f.evidence.get("icmp_watch").is_none());
    }

    #[test]
    fn refused_by_rst_does_not_mention_the_icmp_watch() {
        let mut ev = event(event_kind::CONNECT_REFUSED, 111);
        ev.flags = event_flag::RST_RECEIVED;
        let f = run_unwatched(&ev).unwrap();
        assert_eq!(f.layer, Layer::Listener);
        assert!(f.evidence.get("icmp_watch").is_none());
        let f = run_unwatched(&event(event_kind::CONNECT_REFUSED, 111)).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        assert_eq!(f.evidence["icmp_watch"], "off");
    }

    #[test]
    fn established_reset_is_the_peer() {
        let f = run(&event(event_kind::ESTABLISHED_RESET, 104)).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpReset, Layer::Peer));
        assert_eq!(f.evidence["errno"], "ECONNRESET");
    }

    #[test]
    fn kernel_give_up_is_not_a_new_finding() {
        assert!(run(&event(event_kind::CONNECT_GAVE_UP, 110)).is_none());
    }

    #[test]
    fn ipv6_addresses_render() {
        let mut ev = event(event_kind::CONNECT_REFUSED, 111);
        ev.flow.family = node_diag_common::AF_INET6;
        ev.flow.daddr = "fd00::2".parse::<Ipv6Addr>().unwrap().octets();
        assert_eq!(run(&ev).unwrap().dst, Some("fd00::2".parse().unwrap()));
        ev.flow.saddr = "::ffff:10.244.1.7".parse::<Ipv6Addr>().unwrap().octets();
        ev.flow.daddr = "::ffff:10.244.2.9".parse::<Ipv6Addr>().unwrap().octets();
        let f = run(&ev).unwrap();
        assert_eq!(
            f.src,
            Some("10.244.1.7".parse().unwrap()),
            "v4-mapped shown as IPv4"
        );
        assert_eq!(f.dst, Some("10.244.2.9".parse().unwrap()));
    }

    #[test]
    fn oversize_drop_without_frag_needed_is_a_warning() {
        let mut ev = event(event_kind::DF_OVERSIZE, 0);
        ev.drop = DropInfo {
            last_ns: 1,
            reason: 93,
            count: 1,
            netns: 77,
            ifindex: 3,
            ..Default::default()
        };
        ev.mtu = 1450;
        ev.len = 1500;
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::DfOversizeDrop, Layer::OverlayMtu));
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.interface.as_deref(), Some("vpod0"));
        assert_eq!(f.evidence["egress_mtu"], 1450);
        assert_eq!(f.evidence["packet_len"], 1500);
        assert!(f.summary.contains("MTU 1450"), "{}", f.summary);
    }

    #[test]
    fn oversize_drop_with_frag_needed_sent_back_is_info() {
        let mut ev = event(event_kind::DF_OVERSIZE, 0);
        ev.icmp = IcmpInfo {
            last_ns: 5,
            icmp_type: 3,
            icmp_code: 4,
            mtu: 1450,
            count: 1,
            ..Default::default()
        };
        let f = run(&ev).unwrap();
        assert_eq!(f.severity, Severity::Info);
        assert_eq!(f.evidence["frag_needed_sent"], 1);
        assert_eq!(f.evidence["frag_needed_mtu"], 1450);
    }

    #[test]
    fn stall_with_locally_dropped_frag_needed_names_the_hook() {
        let mut ev = event(event_kind::PMTUD_STALL, 0);
        ev.retrans = 3;
        ev.mtu = 1448;
        ev.len = 1448;
        ev.icmp = IcmpInfo {
            last_ns: 5,
            icmp_type: 3,
            icmp_code: 4,
            count: 4,
            ..Default::default()
        };
        ev.frag_dropped = DropInfo {
            last_ns: 6,
            reason: 12,
            count: 4,
            netns: 77,
            ifindex: 0,
            ..Default::default()
        };
        let f = run(&ev).unwrap();
        assert_eq!(
            (f.kind, f.layer),
            (Kind::PmtudBlackhole, Layer::IcmpFiltered)
        );
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.evidence["netfilter_hook"], "output");
        assert_eq!(f.evidence["frag_needed_dropped"], 4);
        assert!(f.remediation.contains("tcp_mtu_probing=1"));
    }

    #[test]
    fn black_hole_on_oversize_drops_alone_names_them() {
        let mut ev = event(event_kind::PMTUD_STALL, 0);
        ev.drop = DropInfo {
            last_ns: 1,
            reason: 12,
            count: 2,
            netns: 1,
            ifindex: 3,
            ..Default::default()
        };
        let f = run(&ev).unwrap();
        assert_eq!(f.layer, Layer::IcmpFiltered);
        assert!(
            f.summary.contains("larger than the egress MTU (2 times)"),
            "{}",
            f.summary
        );
        assert!(f.evidence.get("netfilter_hook").is_none());
    }

    #[test]
    fn stall_without_mtu_evidence_is_a_silent_peer_not_a_black_hole() {
        let mut ev = event(event_kind::TCP_STALL, 0);
        ev.retrans = 3;
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpStall, Layer::Unknown));
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.evidence["oversize_drops"], 0);
        assert_eq!(f.evidence["frag_needed_dropped"], 0);
        assert!(
            f.summary.contains("size is not the problem"),
            "{}",
            f.summary
        );
    }

    #[test]
    fn stall_with_icmp_unwatched_says_frag_needed_received_is_unknown() {
        let mut ev = event(event_kind::TCP_STALL, 0);
        ev.retrans = 3;
        (ev.len, ev.mtu) = (1398, 1398);
        let f = run_unwatched(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpStall, Layer::Unknown));
        assert_eq!(f.evidence["frag_needed_received"], Value::Null);
        assert_eq!(f.evidence["icmp_watch"], "off");
        assert!(f.summary.contains("probably not"), "{}", f.summary);
        assert!(
            !f.summary.contains("size is not the problem"),
            "{}",
            f.summary
        );
        // Watched: none received is a fact.
        let f = run(&ev).unwrap();
        assert_eq!(f.evidence["frag_needed_received"], 0);
        assert!(f.evidence.get("icmp_watch").is_none());
    }

    #[test]
    fn stall_of_a_short_segment_says_size_is_not_the_problem() {
        let mut ev = event(event_kind::TCP_STALL, 0);
        ev.retrans = 3;
        (ev.len, ev.mtu) = (200, 1398);
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpStall, Layer::Unknown));
        assert_eq!(f.evidence["segment_len"], 200);
        assert!(
            f.summary
                .contains("(200 bytes) is shorter than the MSS (1398)"),
            "{}",
            f.summary
        );
    }

    #[test]
    fn refused_without_rst_is_an_icmp_reject_on_the_path() {
        let f = run(&event(event_kind::CONNECT_REFUSED, 111)).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Firewall));
        assert_eq!(f.evidence["rst_received"], false);
        assert!(f.summary.contains("ICMP port-unreachable"), "{}", f.summary);
    }

    #[test]
    fn reset_from_a_local_reject_rule_is_this_nodes_firewall() {
        let mut ev = refused_with_rst();
        ev.drop = DropInfo {
            last_ns: 1,
            reason: 12,
            count: 1,
            netns: 4026532000,
            ifindex: 0,
            ..Default::default()
        };
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Firewall));
        assert_eq!(f.evidence["drop_reason"], "NETFILTER_DROP");
        assert!(f.summary.contains("on this node"), "{}", f.summary);
    }

    #[test]
    fn abandoned_connect_is_a_timeout_with_its_evidence() {
        let mut ev = event(event_kind::CONNECT_ABANDONED, 0);
        ev.drop = DropInfo {
            last_ns: 1,
            reason: 12,
            count: 1,
            netns: 4026532000,
            ifindex: 0,
            ..Default::default()
        };
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::Firewall));
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.evidence["abandoned"], true);
        // Without evidence on this node: unknown, and no page.
        let mut ev = event(event_kind::CONNECT_ABANDONED, 0);
        ev.retrans = 1;
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::Unknown));
        assert_eq!(f.severity, Severity::Warning);
    }

    #[test]
    fn late_success_withdraws_the_timeout_and_makes_no_finding() {
        let ev = event(event_kind::CONNECT_LATE, 0);
        assert!(run(&ev).is_none());
        assert_eq!(
            withdrawn(&ev),
            Some((
                Kind::TcpTimeout,
                Some(4026532000),
                "10.244.2.9".parse().unwrap(),
                8080
            ))
        );
        assert_eq!(withdrawn(&event(event_kind::CONNECT_TIMEOUT, 0)), None);
    }

    #[test]
    fn ipv6_admin_prohibited_is_a_firewall() {
        let mut ev = event(event_kind::CONNECT_UNREACHABLE, 13);
        ev.flow.family = node_diag_common::AF_INET6;
        ev.flow.daddr = "fd00::2".parse::<Ipv6Addr>().unwrap().octets();
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpUnreachable, Layer::Firewall));
        assert_eq!(f.evidence["errno"], "EACCES");
        assert!(
            f.summary.contains("administratively prohibited"),
            "{}",
            f.summary
        );
    }

    #[test]
    fn icmp_received_from_the_path_decides_the_layer() {
        let mut ev = event(event_kind::CONNECT_UNREACHABLE, 113);
        ev.icmp_rcvd = icmp_received(10, [10, 200, 0, 2]);
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpUnreachable, Layer::Firewall));
        assert_eq!(f.evidence["icmp_received_code"], 10);
        assert_eq!(f.evidence["icmp_received_from"], "10.200.0.2");
        assert!(f.summary.contains("(10.200.0.2)"), "{}", f.summary);
        assert!(
            f.summary.contains("administratively prohibited"),
            "{}",
            f.summary
        );
        // Host unreachable from a router: routing, not a firewall.
        ev.icmp_rcvd.icmp_code = 1;
        let f = run(&ev).unwrap();
        assert_eq!(f.layer, Layer::CniRouting);
        assert!(f.summary.contains("a router on the path"), "{}", f.summary);
    }

    #[test]
    fn resets_of_accepted_connections_aggregate_per_listener() {
        let mut ev = event(event_kind::ESTABLISHED_RESET, 104);
        (ev.flow.sport, ev.flow.dport) = (8080, 40001);
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpReset, Layer::Peer));
        assert_eq!(f.listener, Some("10.244.1.7:8080".parse().unwrap()));
        assert_eq!((f.src, f.dst, f.dport), (None, None, None));
        assert_eq!(f.evidence["last_client"], "10.244.2.9:40001");
        // Another client port, the same finding.
        ev.flow.dport = 40002;
        let mut store = crate::findings::Store::new(std::time::Duration::from_secs(10), 10);
        let now = std::time::Instant::now();
        store.record(f, now);
        store.record(run(&ev).unwrap(), now);
        assert_eq!(store.all().len(), 1);
        assert_eq!(store.all()[0].count, 2);
        // A client's own connection (ephemeral local port) stays a flow finding.
        let f = run(&event(event_kind::ESTABLISHED_RESET, 104)).unwrap();
        assert_eq!(f.listener, None);
        assert_eq!(f.dport, Some(8080));
    }

    #[test]
    fn ipv6_oversize_drop_is_not_called_unanswered() {
        let mut ev = event(event_kind::DF_OVERSIZE, 0);
        ev.flow.family = node_diag_common::AF_INET6;
        ev.flow.daddr = "fd00::2".parse::<Ipv6Addr>().unwrap().octets();
        (ev.mtu, ev.len) = (1450, 1500);
        let f = run(&ev).unwrap();
        assert_eq!(f.severity, Severity::Info, "{}", f.summary);
        assert!(f.summary.contains("packet-too-big"), "{}", f.summary);
        assert!(
            !f.summary.contains("no ICMP frag-needed went back"),
            "{}",
            f.summary
        );
        ev.frag_dropped = DropInfo {
            last_ns: 1,
            reason: 12,
            count: 1,
            ..Default::default()
        };
        let f = run(&ev).unwrap();
        assert_eq!(f.severity, Severity::Warning);
        assert!(
            f.summary.contains("drops the ICMPv6 packet-too-big"),
            "{}",
            f.summary
        );
    }

    #[test]
    fn netfilter_drop_in_a_full_table_is_conntrack() {
        let ev = netfilter_timeout(3, 0);
        let f = run_with(&ev, Some(window(1000, 1000, 3, 0))).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::Conntrack));
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.evidence["conntrack_cause"], "table_full");
        assert_eq!(f.evidence["conntrack_count"], 1000);
        assert_eq!(f.evidence["conntrack_max"], 1000);
        assert_eq!(f.evidence["conntrack_stat_drop"], 3);
        assert_eq!(f.evidence["drop_reason"], "NETFILTER_DROP");
        assert!(f.summary.contains("conntrack table"), "{}", f.summary);
        assert!(f.summary.contains("is full"), "{}", f.summary);
        assert!(
            f.remediation.contains("nf_conntrack_max"),
            "{}",
            f.remediation
        );
        assert!(f.remediation.contains("conntrack -C"), "{}", f.remediation);
        // The application giving up first changes nothing.
        let mut ev = ev;
        ev.kind = event_kind::CONNECT_ABANDONED;
        let f = run_with(&ev, Some(window(1000, 1000, 1, 0))).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::Conntrack));
    }

    #[test]
    fn a_rule_drop_while_the_table_has_room_stays_the_firewall() {
        let ev = netfilter_timeout(3, 0);
        // Room in the table, even with conntrack drops (another cause) counted.
        let f = run_with(&ev, Some(window(10, 1000, 5, 0))).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        assert!(f.evidence.get("conntrack_cause").is_none());
        assert_eq!(
            f.evidence["conntrack_count"], 10,
            "the room is evidence too"
        );
        assert_eq!(f.evidence["conntrack_max"], 1000);
        // A full table whose conntrack dropped nothing: the rule did.
        let f = run_with(&ev, Some(window(1000, 1000, 0, 0))).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        // Counters of another namespace are no evidence about this drop.
        let mut w = window(1000, 1000, 3, 0);
        w.netns = 78;
        let f = run_with(&ev, Some(w)).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        assert!(f.evidence.get("conntrack_count").is_none());
        // Nor about a drop for another reason.
        let mut ev = ev;
        ev.drop.reason = 58;
        let f = run_with(&ev, Some(window(1000, 1000, 3, 0))).unwrap();
        assert_eq!(f.layer, Layer::CniRouting);
    }

    #[test]
    fn invalid_needs_a_dropped_syn_ack_and_invalid_packets_counted() {
        let ev = netfilter_timeout(2, drop_flag::SYN_ACK);
        let f = run_with(&ev, Some(window(10, 1000, 0, 2))).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::Conntrack));
        assert_eq!(f.evidence["conntrack_cause"], "invalid");
        assert_eq!(f.evidence["conntrack_stat_invalid"], 2);
        assert_eq!(f.evidence["return_path"], true);
        assert!(f.summary.contains("INVALID"), "{}", f.summary);
        // Fewer INVALID packets than drops of this flow: some drops were a rule's.
        let f = run_with(&ev, Some(window(10, 1000, 0, 1))).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        // A SYN that opens a connection is never INVALID: those were other flows'.
        let ev = netfilter_timeout(2, 0);
        let f = run_with(&ev, Some(window(10, 1000, 0, 50))).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        assert_eq!(f.evidence["conntrack_stat_invalid"], 50);
    }

    #[test]
    fn a_refusal_is_never_conntrack() {
        let mut ev = refused_with_rst();
        ev.drop = DropInfo {
            last_ns: 1,
            reason: 12,
            count: 1,
            netns: 77,
            ..Default::default()
        };
        let f = run_with(&ev, Some(window(1000, 1000, 1, 0))).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Firewall));
    }
}
