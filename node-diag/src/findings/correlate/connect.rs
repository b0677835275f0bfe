//! The connect family: a connect refused, timed out (or abandoned), unreachable, or an
//! established connection reset. First what this node saw of the attempt is gathered
//! ([`Seen`]: its drop, the ICMP errors sent and received, conntrack) and classified
//! into one [`Cause`]; then each kind says what that cause means for it.

use std::{net::SocketAddr, ops::RangeInclusive};

use node_diag_common::{AF_INET, Event, FlowKey, drop_flag, errno, event_flag, icmp, icmpv6};

use super::{Context, addr, conntrack, errno_name, nat::service_remediation, with_flow};
use crate::{
    findings::{
        Finding, Kind, Layer, Severity,
        conntrack::Window,
        evidence::{
            ConnectEvidence, ConntrackCause, ConntrackEvidence, DropEvidence, Evidence,
            IcmpReceived, IcmpSent, IcmpWatch,
        },
    },
    host_network::drop_site::DropSite,
    kernel::{
        drop_family::{DropFamily, family},
        event::EventKind,
    },
};

/// ICMP destination-unreachable codes sent by filters (RFC 1812 administratively prohibited).
const ICMP_ADMIN_CODES: &[u32] = &icmp::ADMIN_PROHIBITED;
const ICMP_PORT_UNREACH: u32 = icmp::PORT_UNREACH;

/// Whether a received destination-unreachable code is a filter's refusal: IPv4 codes 9,
/// 10 and 13 (RFC 1812), ICMPv6 codes 1 (administratively prohibited), 5 (source
/// address failed policy) and 6 (reject route).
fn admin_prohibited(v6: bool, code: u32) -> bool {
    if v6 {
        icmpv6::ADMIN_PROHIBITED.contains(&code)
    } else {
        ICMP_ADMIN_CODES.contains(&code)
    }
}

/// Whether a received destination-unreachable code is "port unreachable".
fn port_unreachable(v6: bool, code: u32) -> bool {
    code == if v6 {
        icmpv6::PORT_UNREACH
    } else {
        ICMP_PORT_UNREACH
    }
}

/// What this node's evidence says failed the attempt.
enum Cause {
    Firewall(String),
    Routing(String),
    /// The listener's queues on this node were full.
    Listener(String),
    Conntrack(ConntrackCause, Window),
    /// This node dropped the packet, for a reason neither the kernel nor the drop's site
    /// names: not "beyond this node", yet no layer either.
    Unresolved(String),
    None,
}

/// What a drop of `reason` (of `family`) on this node says failed the attempt, with the
/// drop's site where one was looked up; `None` for a family that names no layer.
fn drop_cause(
    reason: &str,
    family: Option<DropFamily>,
    site: Option<&DropSite>,
    interface: Option<&str>,
    dropped: &str,
) -> Option<Cause> {
    let on = interface.map(|i| format!(" on {i}")).unwrap_or_default();
    let route = site.and_then(|s| s.route.as_deref());
    let discarding = site.and_then(|s| s.route_type.and(s.route.as_deref()));
    let missing = site.and_then(|s| Some((s.tunnel.as_deref()?, s.missing_fdb_entry.as_deref()?)));
    let neighbour = site.and_then(|s| s.neighbour.as_deref());
    Some(match family? {
        DropFamily::Firewall => Cause::Firewall(format!(
            "a netfilter/eBPF filter on this node dropped {dropped} ({reason})"
        )),
        DropFamily::Listener => Cause::Listener(format!(
            "the listener's queue on this node is full and the kernel dropped {dropped} ({reason})"
        )),
        _ if discarding.is_some() => Cause::Routing(format!(
            "this node's route `{}` discards it: the kernel dropped {dropped} ({reason})",
            discarding.unwrap_or_default()
        )),
        _ if missing.is_some() => {
            let (tunnel, entry) = missing.unwrap_or_default();
            Cause::Routing(format!(
                "the tunnel {tunnel} has no forwarding (FDB) entry for the next hop ({entry}), so the kernel dropped {dropped} ({reason})"
            ))
        }
        _ if neighbour.is_some() => Cause::Routing(format!(
            "this node could not resolve the next hop ({}) and the kernel dropped {dropped} queued on it ({reason})",
            neighbour.unwrap_or_default()
        )),
        DropFamily::Neighbour => Cause::Routing(format!(
            "this node could not resolve the next hop's link-layer address and the kernel dropped {dropped}{on} ({reason})"
        )),
        DropFamily::Tunnel => Cause::Routing(format!(
            "the tunnel device{on} had nowhere to send {dropped} ({reason}): no forwarding entry for its destination"
        )),
        DropFamily::Routing => Cause::Routing(match route {
            Some(r) => format!("the kernel dropped {dropped} with {reason}{on} (route `{r}`)"),
            None => format!("the kernel dropped {dropped} with {reason}{on}"),
        }),
        DropFamily::Unspecified => Cause::Unresolved(format!(
            "this node's kernel dropped {dropped}{on} without naming a reason ({reason}), and no discarding route or tunnel without a forwarding entry explains it"
        )),
    })
}

/// What this node saw of one attempt: the evidence as served, and its reading.
struct Seen {
    evidence: ConnectEvidence,
    cause: Cause,
    /// What was dropped: the SYN on its way out, or the peer's SYN-ACK on its way back.
    dropped: &'static str,
    /// The ICMP error this node generated for the flow.
    icmp_sent_code: Option<u32>,
    rst_received: bool,
    /// An ICMP error ended the connect, but which one and from whom was not watched.
    icmp_unseen: bool,
}

fn gather(kind: EventKind, ev: &Event, ctx: &Context<'_>) -> Seen {
    let flow = &ev.flow;
    let mut evidence = ConnectEvidence {
        errno: (ev.error != 0).then(|| errno_name(ev.error)),
        syn_retransmits: (ev.retrans != 0).then_some(ev.retrans),
        ..Default::default()
    };
    let drop_reason = (ev.drop.count > 0).then(|| ctx.names.drop_reason(ev.drop.reason));
    let return_path = ev.drop.flags & drop_flag::SYN_ACK != 0;
    let dropped = if return_path {
        "the SYN-ACK coming back"
    } else {
        "its SYN"
    };
    evidence.drop = drop_reason.as_ref().map(|reason| {
        Box::new(DropEvidence {
            drop_reason: reason.clone(),
            syn_drops: ev.drop.count,
            return_path,
            drop_netns: (ev.drop.netns != 0).then_some(ev.drop.netns),
            drop_ifindex: (ev.drop.ifindex != 0).then_some(ev.drop.ifindex),
            drop_interface: (ev.drop.ifindex != 0)
                .then(|| ctx.names.interface(ev.drop.netns, ev.drop.ifindex))
                .flatten(),
        })
    });
    let icmp = (ev.icmp.last_ns != 0).then_some(ev.icmp);
    evidence.icmp_sent = icmp.map(|i| IcmpSent {
        icmp_sent_type: i.icmp_type,
        icmp_sent_code: i.icmp_code,
        icmp_sent_netns: (i.netns != 0).then_some(i.netns),
    });
    // An ICMP error that came back from the path (TC ingress).
    let received = (ev.icmp_rcvd.count > 0).then_some(ev.icmp_rcvd);
    let v6 = flow.family != AF_INET;
    // No sender when only the socket's error queue told (see the eBPF `queued_icmp_error`).
    let sender = received
        .filter(|r| r.from != [0; 16])
        .map(|r| addr(flow, &r.from));
    evidence.icmp_received = received.map(|r| IcmpReceived {
        icmp_received_type: r.icmp_type,
        icmp_received_code: r.icmp_code,
        icmp_received_from: sender,
    });
    let from = sender.map(|a| format!(" ({a})")).unwrap_or_default();
    let dst = addr(flow, &flow.daddr);
    // The destination answered for itself: a policy on it (Cilium's
    // `policyDenyResponse: icmp`, firewalld's reject), not a router on the way.
    let from_destination = sender == Some(dst);
    evidence.icmp_from_destination = from_destination && received.is_some();
    evidence.drop_site = ctx
        .drop_site
        .clone()
        .filter(|s| *s != DropSite::default())
        .map(Box::new);
    let by_drop = drop_reason.as_deref().and_then(|r| {
        drop_cause(
            r,
            family(r),
            ctx.drop_site.as_ref(),
            evidence
                .drop
                .as_ref()
                .and_then(|d| d.drop_interface.as_deref()),
            dropped,
        )
    });
    // A `prohibit` route answers with ICMP administratively prohibited too: routing.
    let prohibit_route = ctx
        .drop_site
        .as_ref()
        .is_some_and(|s| s.route_type == Some("prohibit"));
    // The namespace's conntrack counters around a netfilter drop of the flow: evidence
    // either way (a table with room is why a rule is blamed).
    let window = drop_reason.as_ref().and_then(|r| {
        ctx.conntrack
            .filter(|w| r == "NETFILTER_DROP" && w.netns == ev.drop.netns)
    });
    evidence.conntrack = window.as_ref().map(ConntrackEvidence::from);
    let by_conntrack = drop_reason
        .as_ref()
        .zip(window)
        .and_then(|(r, w)| Some((conntrack::cause(&ev.drop, r, &w)?, w)));
    // A refusal is an answer, which conntrack never gives: only drops can be its.
    let cause = if let Some((cause, w)) = by_conntrack.filter(|_| kind != EventKind::ConnectRefused)
    {
        evidence.conntrack_cause = Some(cause);
        Cause::Conntrack(cause, w)
    } else {
        match (by_drop, icmp, received) {
            (Some(c @ Cause::Firewall(_)), _, _) => c,
            // Before the ICMP sent here: a destination on this node sends its answer from
            // its own namespace, which the (global) tracepoint shows too.
            (_, _, Some(r)) if admin_prohibited(v6, r.icmp_code) && from_destination => {
                Cause::Firewall(format!(
                    "the destination{from} itself answered it with ICMP{} administratively prohibited (code {}): a policy on the destination (a NetworkPolicy enforced there, firewalld) rejects it",
                    if v6 { "v6" } else { "" },
                    r.icmp_code
                ))
            }
            (_, Some(i), _) if admin_prohibited(v6, i.icmp_code) && !prohibit_route => {
                Cause::Firewall(format!(
                    "this node answered it with ICMP{} administratively prohibited (code {})",
                    if v6 { "v6" } else { "" },
                    i.icmp_code
                ))
            }
            (Some(c), _, _) if !matches!(c, Cause::Unresolved(_)) => c,
            (_, Some(i), _) => Cause::Routing(format!(
                "this node answered it with ICMP{} destination unreachable code {}",
                if v6 { "v6" } else { "" },
                i.icmp_code
            )),
            (_, _, Some(r)) if admin_prohibited(v6, r.icmp_code) => Cause::Firewall(format!(
                "a filter on the path{from} answered it with ICMP{} administratively prohibited (code {})",
                if v6 { "v6" } else { "" },
                r.icmp_code
            )),
            (_, _, Some(r)) if port_unreachable(v6, r.icmp_code) => Cause::Firewall(format!(
                "an ICMP{} port-unreachable{from} answered it: a REJECT rule on the path",
                if v6 { "v6" } else { "" }
            )),
            (_, _, Some(r)) => Cause::Routing(format!(
                "a router on the path{from} answered it with ICMP{} destination unreachable code {}",
                if v6 { "v6" } else { "" },
                r.icmp_code
            )),
            // Last: an ICMP error tells more than a drop nothing explains.
            (Some(c), _, _) => c,
            _ => Cause::None,
        }
    };
    let rst_received = ev.flags & event_flag::RST_RECEIVED != 0;
    if kind == EventKind::ConnectRefused {
        evidence.rst_received = Some(rst_received);
    }
    let icmp_unseen = received.is_none()
        && !ctx.icmp_watched
        && (kind == EventKind::ConnectUnreachable
            || (kind == EventKind::ConnectRefused && !rst_received));
    if icmp_unseen {
        evidence.icmp_watch = Some(IcmpWatch::Off);
    }
    evidence.abandoned = kind == EventKind::ConnectAbandoned;
    Seen {
        evidence,
        cause,
        dropped,
        icmp_sent_code: icmp.map(|i| i.icmp_code),
        rst_received,
        icmp_unseen,
    }
}

/// What a verdict says: its kind, layer, severity, summary and remediation.
type Said = (Kind, Layer, Severity, String, String);

pub(super) fn verdict(kind: EventKind, ev: &Event, ctx: &Context<'_>) -> Option<Finding> {
    let seen = gather(kind, ev, ctx);
    let said = match kind {
        EventKind::ConnectRefused => refused(ev, ctx, &seen),
        EventKind::ConnectTimeout | EventKind::ConnectAbandoned => timeout(kind, ev, &seen),
        EventKind::ConnectUnreachable => unreachable(ev, &seen),
        EventKind::EstablishedReset if server_side(&ev.flow, &ctx.ephemeral_ports) => {
            return Some(listener_reset(ev, ctx, seen.evidence));
        }
        EventKind::EstablishedReset => peer_reset(ev),
        _ => return None,
    };
    let (kind, layer, severity, summary, remediation) = said;
    let mut finding = with_flow(
        Finding::new(kind, layer, severity, summary, remediation, ctx.now),
        ev,
    );
    finding.evidence = Evidence::Connect(Box::new(seen.evidence));
    Some(finding)
}

/// Where to look for a REJECT rule on this node.
const FIND_REJECT: &str = "Find the REJECT rule for this port (`nft list ruleset`, `iptables-save`, NetworkPolicy) and allow the traffic.";

fn refused(ev: &Event, ctx: &Context<'_>, seen: &Seen) -> Said {
    let (dst, dport) = (addr(&ev.flow, &ev.flow.daddr), ev.flow.dport);
    let v6 = ev.flow.family != AF_INET;
    let rejected_here = seen
        .icmp_sent_code
        .filter(|c| port_unreachable(v6, *c) || admin_prohibited(v6, *c));
    let no_endpoints = ctx.translation.without_endpoints();
    let admin_received = seen
        .evidence
        .icmp_received
        .is_some_and(|r| admin_prohibited(v6, r.icmp_received_code));
    let (layer, summary, remediation) = match (no_endpoints, rejected_here, &seen.cause) {
        (Some(svc), Some(code), _) if port_unreachable(v6, code) => (
            // kube-proxy's own REJECT for a Service without endpoints: the Service,
            // not a firewall, and not the application.
            Layer::Service,
            format!(
                "Connection to {dst}:{dport} was rejected by kube-proxy on this node (ICMP{} unreachable code {code}): Service {svc} has no ready endpoints.",
                if v6 { "v6" } else { "" }
            ),
            service_remediation(svc),
        ),
        // The same REJECT where the ICMP errors this node sends are not traced (ICMPv6
        // on a kernel without fentry on `icmp6_send`): the refusal without a RST, to a
        // Service kube-proxy rejects, is its.
        (Some(svc), None, _) if !seen.rst_received && !admin_received => (
            Layer::Service,
            format!(
                "Connection to {dst}:{dport} was rejected by kube-proxy on this node (an ICMP{} port unreachable, no RST): Service {svc} has no ready endpoints.",
                if v6 { "v6" } else { "" }
            ),
            service_remediation(svc),
        ),
        (_, Some(code), _) => (
            Layer::Firewall,
            format!(
                "Connection to {dst}:{dport} was rejected by a firewall rule on this node (ICMP{} unreachable code {code}), not by the application.",
                if v6 { "v6" } else { "" }
            ),
            FIND_REJECT.to_string(),
        ),
        // `reject with tcp reset`: the RST comes from this node's netfilter, which also
        // drops the SYN.
        (_, None, Cause::Firewall(why)) => (
            Layer::Firewall,
            format!(
                "Connection to {dst}:{dport} was rejected by a firewall rule on this node, not by the application: {why} and answered it with a reset."
            ),
            FIND_REJECT.to_string(),
        ),
        _ if !seen.rst_received => (
            Layer::Firewall,
            format!(
                "Connection to {dst}:{dport} was refused by an ICMP port-unreachable, not by a RST: a REJECT rule on a firewall between here and {dst} (a host firewall such as firewalld, a NetworkPolicy) answered instead of the application."
            ),
            format!(
                "Find the REJECT rule for port {dport} on the destination node and on the path (`nft list ruleset`, `iptables-save`, NetworkPolicies) and allow the traffic."
            ),
        ),
        _ => (
            Layer::Listener,
            format!(
                "Connection to {dst}:{dport} was refused: the packet arrived and the peer answered the SYN with a RST, so nothing listens on that port."
            ),
            format!(
                "Check the destination's listener (`ss -tlnp` in the pod): the app may be down, bound to 127.0.0.1, or the Service targetPort may not match {dport}."
            ),
        ),
    };
    (
        Kind::TcpRefused,
        layer,
        Severity::Warning,
        summary,
        remediation,
    )
}

fn timeout(kind: EventKind, ev: &Event, seen: &Seen) -> Said {
    let (dst, dport) = (addr(&ev.flow, &ev.flow.daddr), ev.flow.dport);
    let (layer, summary, remediation) = match &seen.cause {
        Cause::Conntrack(cause, w) => {
            let (summary, remediation) =
                conntrack::text(*cause, w, ev, seen.dropped, &format!("{dst}:{dport}"));
            (
                Layer::Conntrack,
                format!("Connection to {dst}:{dport} is timing out: {summary}"),
                remediation,
            )
        }
        Cause::Firewall(why) => (
            Layer::Firewall,
            format!("Connection to {dst}:{dport} is timing out: {why}."),
            format!(
                "Find the rule dropping tcp dport {dport} on this node (`nft list ruleset`, `iptables-save`, NetworkPolicy) and allow the traffic."
            ),
        ),
        Cause::Routing(why) => (
            Layer::CniRouting,
            format!("Connection to {dst}:{dport} is timing out: {why}."),
            format!(
                "Check pod routing on the nodes (`ip route get {dst}`, neighbour tables, the CNI agent's health)."
            ),
        ),
        Cause::Listener(why) => (
            Layer::Listener,
            format!("Connection to {dst}:{dport} is timing out: {why}."),
            format!(
                "The listener on port {dport} does not accept connections fast enough: check the application's accept loop and its backlog (`ss -tln` shows Recv-Q against Send-Q)."
            ),
        ),
        Cause::Unresolved(why) => (
            Layer::Unknown,
            format!("Connection to {dst}:{dport} is timing out: {why}."),
            format!(
                "Find where this node drops it: `ip route get {dst}` and the tunnels' FDB (`bridge fdb show`), the firewall (`nft list ruleset`), and the drop's kernel location (`perf trace -e skb:kfree_skb`)."
            ),
        ),
        Cause::None => (
            Layer::Unknown,
            format!(
                "Connection to {dst}:{dport} is timing out: its SYNs left this node and nothing came back, so they are dropped beyond it (a remote host firewall, a cloud security group, or the peer node's routing)."
            ),
            format!(
                "Check the destination node's firewall and routing for {dst}:{dport}, then cloud security groups / NACLs between the nodes; `tcpdump -ni any host {dst} and port {dport}` on the destination node shows whether the SYNs arrive."
            ),
        ),
    };
    if kind != EventKind::ConnectAbandoned {
        return (
            Kind::TcpTimeout,
            layer,
            Severity::Critical,
            summary,
            remediation,
        );
    }
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
    (Kind::TcpTimeout, layer, severity, summary, remediation)
}

fn unreachable(ev: &Event, seen: &Seen) -> Said {
    let (dst, dport) = (addr(&ev.flow, &ev.flow.daddr), ev.flow.dport);
    let errno = errno_name(ev.error);
    let check_route = || {
        format!(
            "Check the route to {dst} on every node on the path (`ip route get {dst}`) and the CNI agent's health."
        )
    };
    let (layer, severity, summary, remediation) = match &seen.cause {
        Cause::Conntrack(cause, w) => {
            let (summary, remediation) =
                conntrack::text(*cause, w, ev, seen.dropped, &format!("{dst}:{dport}"));
            (
                Layer::Conntrack,
                Severity::Critical,
                format!("Connection to {dst}:{dport} failed with {errno}: {summary}"),
                remediation,
            )
        }
        Cause::Firewall(why) => (
            Layer::Firewall,
            Severity::Critical,
            format!("Connection to {dst}:{dport} failed with {errno}: {why}."),
            format!(
                "Find the rule rejecting traffic to {dst}:{dport} (`nft list ruleset`, NetworkPolicy) and allow it."
            ),
        ),
        // Only an ICMPv6 administratively-prohibited makes EACCES: a filter on the path
        // (ip6tables/nft REJECT, a NetworkPolicy) said no.
        Cause::None if ev.error == errno::EACCES => (
            Layer::Firewall,
            Severity::Critical,
            format!(
                "Connection to {dst}:{dport} failed with {errno}: a firewall on the path answered with ICMPv6 administratively prohibited."
            ),
            format!(
                "Find the rule rejecting traffic to {dst}:{dport} (`nft list ruleset`, NetworkPolicy) and allow it."
            ),
        ),
        Cause::Routing(why) => (
            Layer::CniRouting,
            Severity::Critical,
            format!("Connection to {dst}:{dport} failed with {errno}: {why}."),
            check_route(),
        ),
        Cause::Listener(why) => (
            Layer::Listener,
            Severity::Warning,
            format!("Connection to {dst}:{dport} failed with {errno}: {why}."),
            check_route(),
        ),
        Cause::Unresolved(why) => (
            Layer::Unknown,
            Severity::Warning,
            format!("Connection to {dst}:{dport} failed with {errno}: {why}."),
            check_route(),
        ),
        // An ICMP error from beyond this node that nobody watched: a router's
        // unreachable and a firewall's prohibited read alike in the errno.
        Cause::None if seen.icmp_unseen => (
            Layer::Unknown,
            Severity::Warning,
            format!(
                "Connection to {dst}:{dport} failed with {errno}: a host on the path answered it with an ICMP error while ICMP from the network was not watched, so whether a router (no route) or a firewall (prohibited) sent it is unknown."
            ),
            format!(
                "Retry: once ICMP is watched (metric `node_diag_icmp_watch` 1, or the agent run with `--icmp-watch always`) the next failure names its sender. Meanwhile check the route to {dst} (`ip route get {dst}`) and the REJECT rules on the path (`nft list ruleset`, NetworkPolicies)."
            ),
        ),
        Cause::None => (
            Layer::CniRouting,
            Severity::Critical,
            format!(
                "Connection to {dst}:{dport} failed with {errno}: a router on the path reported the destination unreachable."
            ),
            check_route(),
        ),
    };
    (Kind::TcpUnreachable, layer, severity, summary, remediation)
}

fn peer_reset(ev: &Event) -> Said {
    let flow = &ev.flow;
    let (src, dst) = (addr(flow, &flow.saddr), addr(flow, &flow.daddr));
    (
        Kind::TcpReset,
        Layer::Peer,
        Severity::Warning,
        format!(
            "Established connection {src}:{} -> {dst}:{} was reset by the peer ({}).",
            flow.sport,
            flow.dport,
            errno_name(ev.error)
        ),
        "Check the peer application's logs for crashes, restarts or aborted requests; a middlebox idle timeout can also reset long-lived connections.".to_string(),
    )
}

/// Whether the local end of `flow` is a listener's: its port is not ephemeral and the
/// peer's is.
fn server_side(flow: &FlowKey, ephemeral: &RangeInclusive<u16>) -> bool {
    !ephemeral.contains(&flow.sport) && ephemeral.contains(&flow.dport)
}

/// A reset of a connection a listener accepted: aggregated per listener, since every
/// client connects from a new port.
fn listener_reset(ev: &Event, ctx: &Context<'_>, mut evidence: ConnectEvidence) -> Finding {
    let flow = &ev.flow;
    let listener = SocketAddr::new(addr(flow, &flow.saddr), flow.sport);
    let client = SocketAddr::new(addr(flow, &flow.daddr), flow.dport);
    evidence.last_client = Some(client);
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
    f.evidence = Evidence::Connect(Box::new(evidence));
    f
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use node_diag_common::{event_flag, event_kind};

    use super::super::{testkit::*, withdrawn};
    use crate::{
        findings::{Kind, Layer, Severity},
        host_network::drop_site::DropSite,
    };

    #[test]
    fn refused_is_the_listener() {
        let f = run(&refused_with_rst()).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Listener));
        assert_eq!(f.evidence.to_map()["rst_received"], true);
        assert_eq!(f.src, Some("10.244.1.7".parse().unwrap()));
        assert_eq!(f.dst, Some("10.244.2.9".parse().unwrap()));
        assert_eq!(
            (f.dport, f.sport, f.netns),
            (Some(8080), Some(40000), Some(4026532000))
        );
        assert_eq!(f.evidence.to_map()["errno"], "ECONNREFUSED");
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
        ev.drop = dropped(12, 3, 77, 3);
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::Firewall));
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.evidence.to_map()["drop_reason"], "NETFILTER_DROP");
        assert_eq!(f.evidence.to_map()["syn_drops"], 3);
        assert_eq!(f.evidence.to_map()["drop_interface"], "vpod0");
        assert_eq!(f.evidence.to_map()["syn_retransmits"], 2);
    }

    #[test]
    fn timeout_with_routing_drop_is_cni_routing() {
        let mut ev = event(event_kind::CONNECT_TIMEOUT, 0);
        ev.drop = dropped(58, 1, 0, 0);
        let f = run(&ev).unwrap();
        assert_eq!(f.layer, Layer::CniRouting);
        assert!(f.summary.contains("NEIGH_FAILED"));
    }

    fn blackhole() -> DropSite {
        DropSite {
            route: Some("blackhole 10.244.2.0/26".into()),
            route_type: Some("blackhole"),
            ..DropSite::default()
        }
    }

    #[test]
    fn unspecified_drop_at_a_blackhole_route_is_cni_routing() {
        let mut ev = event(event_kind::CONNECT_TIMEOUT, 0);
        ev.drop = dropped(2, 3, 77, 3);
        let f = run_at_site(&ev, blackhole()).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::CniRouting));
        let e = f.evidence.to_map();
        assert_eq!(e["route"], "blackhole 10.244.2.0/26");
        assert_eq!(e["route_type"], "blackhole");
        assert_eq!(e["drop_reason"], "NOT_SPECIFIED");
        assert!(!f.summary.contains("left this node"), "{}", f.summary);
        // Without a site that explains it: no layer, yet not beyond this node.
        let f = run(&ev).unwrap();
        assert_eq!(f.layer, Layer::Unknown);
        assert!(
            f.summary.contains("this node's kernel dropped"),
            "{}",
            f.summary
        );
        assert!(!f.summary.contains("left this node"), "{}", f.summary);
        // An ICMP unreachable this node sent for it tells more than the bare drop.
        let mut ev = event(event_kind::CONNECT_UNREACHABLE, 113);
        ev.drop = dropped(2, 1, 77, 3);
        ev.icmp = icmp_sent_here(1);
        assert_eq!(run(&ev).unwrap().layer, Layer::CniRouting);
    }

    #[test]
    fn a_tunnel_without_a_forwarding_entry_is_cni_routing() {
        let mut ev = event(event_kind::CONNECT_TIMEOUT, 0);
        ev.drop = dropped(90, 2, 77, 3);
        let site = DropSite {
            route: Some("10.244.2.0/24 via 10.244.2.0 dev flannel.1".into()),
            tunnel: Some("flannel.1".into()),
            missing_fdb_entry: Some("02:00:00:00:02:01 for 10.244.2.0".into()),
            ..DropSite::default()
        };
        let f = run_at_site(&ev, site).unwrap();
        assert_eq!(f.layer, Layer::CniRouting);
        let e = f.evidence.to_map();
        assert_eq!(e["tunnel"], "flannel.1");
        assert_eq!(e["missing_fdb_entry"], "02:00:00:00:02:01 for 10.244.2.0");
        assert!(f.summary.contains("flannel.1"), "{}", f.summary);
        // The reason alone still names the layer.
        assert_eq!(run(&ev).unwrap().layer, Layer::CniRouting);
    }

    #[test]
    fn a_full_accept_queue_here_is_the_listener() {
        let mut ev = event(event_kind::CONNECT_TIMEOUT, 0);
        ev.drop = dropped(91, 2, 77, 3);
        assert_eq!(run(&ev).unwrap().layer, Layer::Listener);
    }

    #[test]
    fn admin_prohibited_from_the_destination_itself_is_its_firewall() {
        let mut ev = event(event_kind::CONNECT_UNREACHABLE, 113);
        ev.icmp_rcvd = icmp_received(13, [10, 244, 2, 9]);
        let f = run(&ev).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        assert_eq!(f.evidence.to_map()["icmp_from_destination"], true);
        assert!(f.summary.contains("the destination"), "{}", f.summary);
        // From a router on the way: not the destination.
        ev.icmp_rcvd = icmp_received(13, [10, 200, 0, 2]);
        let f = run(&ev).unwrap();
        assert!(f.evidence.to_map().get("icmp_from_destination").is_none());
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
        assert_eq!(f.evidence.to_map()["errno"], "EHOSTUNREACH");
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
        assert_eq!(f.evidence.to_map()["icmp_watch"], "off");
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
        assert!(f.evidence.to_map().get("icmp_watch").is_none());
        // Watched, the same errno with no ICMP received names the routing layer, as before.
        let f = run(&event(event_kind::CONNECT_UNREACHABLE, 113)).unwrap();
        assert!(f.evidence.to_map().get("icmp_watch").is_none());
    }

    #[test]
    fn refused_by_rst_does_not_mention_the_icmp_watch() {
        let mut ev = event(event_kind::CONNECT_REFUSED, 111);
        ev.flags = event_flag::RST_RECEIVED;
        let f = run_unwatched(&ev).unwrap();
        assert_eq!(f.layer, Layer::Listener);
        assert!(f.evidence.to_map().get("icmp_watch").is_none());
        let f = run_unwatched(&event(event_kind::CONNECT_REFUSED, 111)).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        assert_eq!(f.evidence.to_map()["icmp_watch"], "off");
    }

    #[test]
    fn established_reset_is_the_peer() {
        let f = run(&event(event_kind::ESTABLISHED_RESET, 104)).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpReset, Layer::Peer));
        assert_eq!(f.evidence.to_map()["errno"], "ECONNRESET");
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
    fn refused_without_rst_is_an_icmp_reject_on_the_path() {
        let f = run(&event(event_kind::CONNECT_REFUSED, 111)).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Firewall));
        assert_eq!(f.evidence.to_map()["rst_received"], false);
        assert!(f.summary.contains("ICMP port-unreachable"), "{}", f.summary);
    }

    #[test]
    fn reset_from_a_local_reject_rule_is_this_nodes_firewall() {
        let mut ev = refused_with_rst();
        ev.drop = dropped(12, 1, 4026532000, 0);
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Firewall));
        assert_eq!(f.evidence.to_map()["drop_reason"], "NETFILTER_DROP");
        assert!(f.summary.contains("on this node"), "{}", f.summary);
    }

    #[test]
    fn abandoned_connect_is_a_timeout_with_its_evidence() {
        let mut ev = event(event_kind::CONNECT_ABANDONED, 0);
        ev.drop = dropped(12, 1, 4026532000, 0);
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::Firewall));
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.evidence.to_map()["abandoned"], true);
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
        let w = withdrawn(kind_of(&ev), &ev).unwrap();
        assert_eq!(
            (w.kind, w.netns, w.dst, w.dport),
            (
                Kind::TcpTimeout,
                Some(4026532000),
                "10.244.2.9".parse().unwrap(),
                8080
            )
        );
        let timeout = event(event_kind::CONNECT_TIMEOUT, 0);
        assert_eq!(withdrawn(kind_of(&timeout), &timeout), None);
    }

    #[test]
    fn ipv6_admin_prohibited_is_a_firewall() {
        let mut ev = event(event_kind::CONNECT_UNREACHABLE, 13);
        ev.flow.family = node_diag_common::AF_INET6;
        ev.flow.daddr = "fd00::2".parse::<Ipv6Addr>().unwrap().octets();
        let f = run(&ev).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpUnreachable, Layer::Firewall));
        assert_eq!(f.evidence.to_map()["errno"], "EACCES");
        assert!(
            f.summary.contains("administratively prohibited"),
            "{}",
            f.summary
        );
    }

    #[test]
    fn icmpv6_sent_here_is_read_by_icmpv6_codes() {
        let v6 = |kind, errno, code| {
            let mut ev = event(kind, errno);
            ev.flow.family = node_diag_common::AF_INET6;
            ev.flow.daddr = "fd00::2".parse::<Ipv6Addr>().unwrap().octets();
            ev.icmp = icmp_sent_here(code);
            ev.icmp.icmp_type = node_diag_common::icmpv6::DEST_UNREACH;
            ev
        };
        // Address unreachable (3): a failed neighbour, routing. IPv4's 3 is a port.
        let f = run(&v6(event_kind::CONNECT_UNREACHABLE, 113, 3)).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpUnreachable, Layer::CniRouting));
        assert!(f.summary.contains("ICMPv6"), "{}", f.summary);
        // Administratively prohibited is 1 in ICMPv6 (13 in IPv4): a filter here.
        let f = run(&v6(event_kind::CONNECT_UNREACHABLE, 13, 1)).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        // Port unreachable (4) answering a connect: a REJECT rule on this node.
        let f = run(&v6(event_kind::CONNECT_REFUSED, 111, 4)).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Firewall));
        assert!(
            f.summary.contains("ICMPv6 unreachable code 4"),
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
        assert_eq!(f.evidence.to_map()["icmp_received_code"], 10);
        assert_eq!(f.evidence.to_map()["icmp_received_from"], "10.200.0.2");
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
        assert_eq!(f.evidence.to_map()["last_client"], "10.244.2.9:40001");
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
}
