//! The conntrack family: whether conntrack itself (a full table, an INVALID packet),
//! not a rule, is behind a flow's `NETFILTER_DROP`, and what to say and do about it.
//! The counters and their windows are [`crate::findings::conntrack`]'s.

use node_diag_common::{DropInfo, Event, drop_flag};

use super::super::{conntrack::Window, evidence::ConntrackCause};

/// Whether conntrack explains a flow's drop, on the evidence for this drop only (the
/// rules and their reasons are in [`crate::findings::conntrack`]): a `NETFILTER_DROP` in
/// the namespace of `window`, and there, for a full table, conntrack's own drops rising
/// while the table was at its limit; for INVALID, a dropped SYN-ACK (the packet
/// conntrack calls INVALID when it never saw the SYN) with at least as many INVALID
/// packets counted as the flow had drops. Anything else stays the rule's.
pub(super) fn cause(drop: &DropInfo, reason: &str, window: &Window) -> Option<ConntrackCause> {
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

/// The summary's explanation and the remediation of a conntrack verdict.
pub(super) fn text(
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

#[cfg(test)]
mod tests {
    use node_diag_common::{drop_flag, event_kind};

    use super::super::testkit::*;
    use crate::findings::{Kind, Layer, Severity};

    #[test]
    fn netfilter_drop_in_a_full_table_is_conntrack() {
        let ev = netfilter_timeout(3, 0);
        let f = run_with(&ev, Some(window(1000, 1000, 3, 0))).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpTimeout, Layer::Conntrack));
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.evidence.to_map()["conntrack_cause"], "table_full");
        assert_eq!(f.evidence.to_map()["conntrack_count"], 1000);
        assert_eq!(f.evidence.to_map()["conntrack_max"], 1000);
        assert_eq!(f.evidence.to_map()["conntrack_stat_drop"], 3);
        assert_eq!(f.evidence.to_map()["drop_reason"], "NETFILTER_DROP");
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
        assert!(f.evidence.to_map().get("conntrack_cause").is_none());
        assert_eq!(
            f.evidence.to_map()["conntrack_count"],
            10,
            "the room is evidence too"
        );
        assert_eq!(f.evidence.to_map()["conntrack_max"], 1000);
        // A full table whose conntrack dropped nothing: the rule did.
        let f = run_with(&ev, Some(window(1000, 1000, 0, 0))).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        // Counters of another namespace are no evidence about this drop.
        let mut w = window(1000, 1000, 3, 0);
        w.netns = 78;
        let f = run_with(&ev, Some(w)).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        assert!(f.evidence.to_map().get("conntrack_count").is_none());
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
        assert_eq!(f.evidence.to_map()["conntrack_cause"], "invalid");
        assert_eq!(f.evidence.to_map()["conntrack_stat_invalid"], 2);
        assert_eq!(f.evidence.to_map()["return_path"], true);
        assert!(f.summary.contains("INVALID"), "{}", f.summary);
        // Fewer INVALID packets than drops of this flow: some drops were a rule's.
        let f = run_with(&ev, Some(window(10, 1000, 0, 1))).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        // A SYN that opens a connection is never INVALID: those were other flows'.
        let ev = netfilter_timeout(2, 0);
        let f = run_with(&ev, Some(window(10, 1000, 0, 50))).unwrap();
        assert_eq!(f.layer, Layer::Firewall);
        assert_eq!(f.evidence.to_map()["conntrack_stat_invalid"], 50);
    }

    #[test]
    fn a_refusal_is_never_conntrack() {
        let mut ev = refused_with_rst();
        ev.drop = dropped(12, 1, 77, 0);
        let f = run_with(&ev, Some(window(1000, 1000, 1, 0))).unwrap();
        assert_eq!((f.kind, f.layer), (Kind::TcpRefused, Layer::Firewall));
    }
}
