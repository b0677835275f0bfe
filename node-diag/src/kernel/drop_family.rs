//! What each kernel drop reason says about where a connect failed: the family a SYN or
//! SYN-ACK drop on this node belongs to, and so the layer its verdict names. The names
//! are the running kernel's (`enum skb_drop_reason`, read from tracefs at load time);
//! reasons an older kernel lacks are simply never seen (6.1 drops a VXLAN's packet
//! without a forwarding entry as `NOT_SPECIFIED`, which the drop's site resolves).
//!
//! Every reason listed here has its SYN drops remembered per flow by the programs; a
//! reason not listed is counted per namespace only, and a verdict never rests on it.

/// The family of a drop reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DropFamily {
    /// A filter: netfilter, a TC or cgroup eBPF program, a socket filter, an LSM.
    Firewall,
    /// The route towards the destination, or the packet's addresses for it.
    Routing,
    /// The next hop's link-layer address could not be resolved.
    Neighbour,
    /// An overlay device with nowhere to send the packet (no FDB entry, no metadata).
    Tunnel,
    /// The local listener's queues were full.
    Listener,
    /// The kernel named no reason: the drop's site (the route towards the destination,
    /// the tunnel it leaves by) says which family it was.
    Unspecified,
}

/// The reasons with a family, by the kernel's names without `SKB_DROP_REASON_`.
const FAMILIES: &[(&str, DropFamily)] = &[
    ("NETFILTER_DROP", DropFamily::Firewall),
    // eBPF CNIs' and tc policy (Cilium, Calico eBPF, tc filters).
    ("TC_INGRESS", DropFamily::Firewall),
    ("TC_EGRESS", DropFamily::Firewall),
    ("BPF_CGROUP_EGRESS", DropFamily::Firewall),
    ("BPF_CGROUP_INGRESS", DropFamily::Firewall),
    ("XDP", DropFamily::Firewall),
    ("SOCKET_FILTER", DropFamily::Firewall),
    ("SECURITY_HOOK", DropFamily::Firewall),
    ("XFRM_POLICY", DropFamily::Firewall),
    ("IP_NOROUTE", DropFamily::Routing),
    ("IP_INNOROUTES", DropFamily::Routing),
    ("IP_OUTNOROUTES", DropFamily::Routing),
    // An `unreachable` route (EHOSTUNREACH at `ip_error`).
    ("IP_INADDRERRORS", DropFamily::Routing),
    ("IP_RPFILTER", DropFamily::Routing),
    ("IP_INVALID_SOURCE", DropFamily::Routing),
    ("IP_LOCAL_SOURCE", DropFamily::Routing),
    ("IP_INVALID_DEST", DropFamily::Routing),
    ("IP_LOCALNET", DropFamily::Routing),
    ("OTHERHOST", DropFamily::Routing),
    ("IPV6DISABLED", DropFamily::Routing),
    ("DEV_READY", DropFamily::Routing),
    ("NEIGH_CREATEFAIL", DropFamily::Neighbour),
    ("NEIGH_FAILED", DropFamily::Neighbour),
    ("NEIGH_QUEUEFULL", DropFamily::Neighbour),
    ("NEIGH_DEAD", DropFamily::Neighbour),
    ("NEIGH_HH_FILLFAIL", DropFamily::Neighbour),
    ("NO_TX_TARGET", DropFamily::Tunnel),
    ("VXLAN_VNI_NOT_FOUND", DropFamily::Tunnel),
    ("TUNNEL_TXINFO", DropFamily::Tunnel),
    ("TCP_LISTEN_OVERFLOW", DropFamily::Listener),
    ("TCP_REQQFULLDROP", DropFamily::Listener),
    // A `blackhole` or `prohibit` route (`ip_error`, `dst_discard`), a VXLAN without a
    // forwarding entry before 6.12, and more: resolved from the drop's site.
    ("NOT_SPECIFIED", DropFamily::Unspecified),
];

/// The family of drop reason `name`, when it has one.
pub(crate) fn family(name: &str) -> Option<DropFamily> {
    FAMILIES.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// The reasons whose SYN drops the programs remember per flow: every reason with a
/// family, and `PKT_TOO_BIG` (a SYN too big for its route, the MTU family's).
pub(crate) fn flow_reasons() -> impl Iterator<Item = &'static str> {
    FAMILIES
        .iter()
        .map(|(n, _)| *n)
        .chain(std::iter::once("PKT_TOO_BIG"))
}

/// The filters' reasons: a SYN towards a pod of this node dropped with one of these is
/// an inbound drop (`node_diag_common::MAP_INBOUND`).
pub(crate) fn firewall_reasons() -> impl Iterator<Item = &'static str> {
    FAMILIES
        .iter()
        .filter(|(_, f)| *f == DropFamily::Firewall)
        .map(|(n, _)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_one_family() {
        for (i, (name, _)) in FAMILIES.iter().enumerate() {
            assert!(
                FAMILIES[i + 1..].iter().all(|(n, _)| n != name),
                "{name} twice"
            );
        }
        assert_eq!(family("NO_TX_TARGET"), Some(DropFamily::Tunnel));
        assert_eq!(family("NOT_SPECIFIED"), Some(DropFamily::Unspecified));
        assert_eq!(family("TCP_CSUM"), None);
        assert!(flow_reasons().any(|n| n == "PKT_TOO_BIG"));
        assert!(firewall_reasons().any(|n| n == "NETFILTER_DROP"));
        // A full listener queue or a missing route is never a filter's inbound drop.
        assert!(!firewall_reasons().any(|n| n == "TCP_LISTEN_OVERFLOW" || n == "IP_NOROUTE"));
        assert!(firewall_reasons().all(|n| flow_reasons().any(|f| f == n)));
    }
}
