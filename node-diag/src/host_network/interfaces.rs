//! What the inventory reports: a [`Snapshot`] of namespaces and their interfaces, each
//! with its [`LinkKind`], MTU, lower or underlay device, tunnel configuration and veth
//! peer, and each namespace's PMTUD sysctls. Plain data: the MTU model reads it, the
//! `node-diag mtu` JSON serializes it.

use std::net::IpAddr;

use serde::{Serialize, Serializer};

use super::links::Tunnel;

/// `ARPHRD_LOOPBACK`: the link type the inventory and the classifier's attach skip.
pub(crate) const ARPHRD_LOOPBACK: u16 = 772;
/// `ARPHRD_ETHER`: links whose frames start with a 14-byte Ethernet header.
pub(crate) const ARPHRD_ETHER: u16 = 1;

/// What an interface is, from the kernel's `IFLA_INFO_KIND`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum LinkKind {
    Loopback,
    /// No kind: a real (or virtio, ENA…) NIC.
    Physical,
    Veth,
    Bridge,
    Vxlan,
    Geneve,
    Wireguard,
    /// IPv4 in IPv4.
    Ipip,
    /// IPv6 in IPv4.
    Sit,
    /// IPv4 or IPv6 in IPv6.
    Ip6tnl,
    Gre,
    Gretap,
    Ip6gre,
    Ip6gretap,
    Vlan,
    Macvlan,
    Ipvlan,
    Bond,
    Tun,
    Dummy,
    /// Any other kernel kind, by its kernel name.
    Other(String),
}

impl LinkKind {
    pub(crate) fn from_kernel(kind: Option<&str>, link_type: u16) -> Self {
        match kind {
            None if link_type == ARPHRD_LOOPBACK => Self::Loopback,
            None => Self::Physical,
            Some(k) => match k {
                "veth" => Self::Veth,
                "bridge" => Self::Bridge,
                "vxlan" => Self::Vxlan,
                "geneve" => Self::Geneve,
                "wireguard" => Self::Wireguard,
                "ipip" => Self::Ipip,
                "sit" => Self::Sit,
                "ip6tnl" => Self::Ip6tnl,
                "gre" => Self::Gre,
                "gretap" => Self::Gretap,
                "ip6gre" => Self::Ip6gre,
                "ip6gretap" => Self::Ip6gretap,
                "vlan" => Self::Vlan,
                "macvlan" => Self::Macvlan,
                "ipvlan" => Self::Ipvlan,
                "bond" => Self::Bond,
                "tun" => Self::Tun,
                "dummy" => Self::Dummy,
                other => Self::Other(other.to_string()),
            },
        }
    }

    /// The snake_case name used in output and metrics labels.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Self::Loopback => "loopback",
            Self::Physical => "physical",
            Self::Veth => "veth",
            Self::Bridge => "bridge",
            Self::Vxlan => "vxlan",
            Self::Geneve => "geneve",
            Self::Wireguard => "wireguard",
            Self::Ipip => "ipip",
            Self::Sit => "sit",
            Self::Ip6tnl => "ip6tnl",
            Self::Gre => "gre",
            Self::Gretap => "gretap",
            Self::Ip6gre => "ip6gre",
            Self::Ip6gretap => "ip6gretap",
            Self::Vlan => "vlan",
            Self::Macvlan => "macvlan",
            Self::Ipvlan => "ipvlan",
            Self::Bond => "bond",
            Self::Tun => "tun",
            Self::Dummy => "dummy",
            Self::Other(s) => s,
        }
    }

    /// Encapsulating devices: the overlays whose overhead the MTU model knows.
    pub(crate) fn is_tunnel(&self) -> bool {
        matches!(
            self,
            Self::Vxlan
                | Self::Geneve
                | Self::Wireguard
                | Self::Ipip
                | Self::Sit
                | Self::Ip6tnl
                | Self::Gre
                | Self::Gretap
                | Self::Ip6gre
                | Self::Ip6gretap
        )
    }
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// A plain string (not serde's `{"other": ...}`), so every kind reads the same in JSON.
impl Serialize for LinkKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// What an interface is to the MTU model (`crate::mtu` decides which has which).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    /// A tunnel device: compared with its underlay.
    Overlay,
    /// The pod end of a veth whose other end is in the agent's namespace.
    PodInterface,
    /// The agent-namespace end of a pod's veth.
    NodeVeth,
    /// A device carrying an overlay's encapsulated packets (and, for a veth, its other
    /// end: two test "nodes" joined by a veth are not a node and its pod).
    Underlay,
    /// Anything else: listed, not compared.
    Other,
}

/// Address family of a tunnel's outer (underlay) header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Family {
    V4,
    V6,
}

impl Family {
    pub(crate) fn of(a: IpAddr) -> Self {
        if a.is_ipv4() { Self::V4 } else { Self::V6 }
    }
}

/// A device in the same namespace, by index, with its name and MTU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct DeviceRef {
    pub(crate) ifindex: u32,
    pub(crate) name: String,
    pub(crate) mtu: u32,
}

/// How a tunnel's underlay device was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum UnderlaySource {
    /// The tunnel is bound to it (`dev` at creation: `IFLA_VXLAN_LINK`, `IFLA_*_LINK`).
    Bound,
    /// The route the kernel picks to the tunnel's remote (or multicast group).
    RouteToRemote,
    /// The route to the `dst` of one of its FDB entries (a VXLAN without a remote).
    RouteToFdbDestination,
    /// The route to one of its peers' endpoints (WireGuard).
    RouteToWireguardPeer,
    /// The route to the gateway of a route through it: the outer destination of an IP
    /// tunnel without a remote (Calico's `tunl0`).
    RouteToTunnelGateway,
    /// The route to the `encap ... dst` of a route through it (a metadata-mode device).
    RouteToEncapDestination,
    /// The device holding the tunnel's local address.
    LocalAddress,
    /// The device of the default route (no endpoint known: metadata mode, a WireGuard
    /// device without peers).
    DefaultRoute,
    /// The largest-MTU physical interface that is up, as a last resort.
    LargestPhysical,
    /// Not how the device was found but what limits it: the path MTU the route cache
    /// learned towards an endpoint (from an ICMP frag-needed or packet-too-big), below
    /// the device's MTU and its route's `mtu`. The MTU model reports it in place of the
    /// way the device was found, which then goes to `underlay_found_by`.
    LearnedPmtu,
}

impl UnderlaySource {
    /// For sources that are a route to an endpoint: what the endpoint is.
    pub(crate) fn endpoint_kind(self) -> Option<&'static str> {
        Some(match self {
            Self::RouteToRemote => "its remote",
            Self::RouteToFdbDestination => "an FDB destination",
            Self::RouteToWireguardPeer => "a WireGuard peer's endpoint",
            Self::RouteToTunnelGateway => "the gateway of a route through it",
            Self::RouteToEncapDestination => "the encap destination of a route through it",
            _ => return None,
        })
    }
}

/// One way out of a tunnel: the device its encapsulated packets to one endpoint (or to
/// every endpoint, when there is one way) leave by, and the route they take there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Underlay {
    pub(crate) ifindex: u32,
    pub(crate) name: String,
    /// The device's MTU.
    pub(crate) mtu: u32,
    pub(crate) source: UnderlaySource,
    /// The endpoint (outer destination) whose route this is, when known; with several
    /// endpoints on the same way out, the first.
    pub(crate) endpoint: Option<IpAddr>,
    /// How many of the tunnel's endpoints take this way out (0 when none is known).
    pub(crate) endpoints: u32,
    /// The route to the endpoint ("192.168.88.0/24"), when it has an `mtu` metric.
    pub(crate) route: Option<String>,
    /// That route's `mtu` metric, which caps the device's for encapsulated packets.
    pub(crate) route_mtu: Option<u32>,
    /// The path MTU the route cache learned towards `endpoint`, when it has one.
    pub(crate) learned_mtu: Option<u32>,
    /// Seconds until that learned path MTU expires.
    pub(crate) learned_expires_secs: Option<u32>,
    /// Every endpoint of this way out the learned path MTU is for (ways are split by it,
    /// so they share it); empty without one.
    pub(crate) learned_endpoints: Vec<IpAddr>,
}

impl Underlay {
    /// What the configuration lets this way out carry: the device's MTU, capped by the
    /// route's `mtu` (a larger route `mtu` does not make the device carry more).
    pub(crate) fn configured_mtu(&self) -> u32 {
        self.route_mtu.map_or(self.mtu, |r| r.min(self.mtu))
    }

    /// The learned path MTU, when it is below what the configuration carries: the path
    /// beyond this node is narrower than its own devices and routes.
    pub(crate) fn learned_below(&self) -> Option<u32> {
        self.learned_mtu.filter(|&l| l < self.configured_mtu())
    }

    /// The largest encapsulated packet this way out carries: the configured MTU, or the
    /// path MTU the route cache learned when it is smaller.
    pub(crate) fn path_mtu(&self) -> u32 {
        self.learned_below()
            .unwrap_or_else(|| self.configured_mtu())
    }

    /// The outer header's family, when the endpoint tells it.
    pub(crate) fn family(&self) -> Option<Family> {
        self.endpoint.map(Family::of)
    }
}

/// The routes through an interface that carry packets beyond its link (see
/// `RouteEntry::leaves_the_link`), grouped by their MTU metrics: what the kernel builds
/// packets to when it sends by them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RouteMetrics {
    /// The first such route ("default via 169.254.1.1").
    pub(crate) route: String,
    pub(crate) family: Family,
    /// The `mtu` metric, when set.
    pub(crate) mtu: Option<u32>,
    /// The `advmss` metric, when set.
    pub(crate) advmss: Option<u32>,
    /// How many routes through the interface have these metrics.
    pub(crate) routes: u32,
}

/// The other end of a veth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct VethPeer {
    /// The peer's namespace (inode), when it is one of the snapshot's.
    pub(crate) netns: Option<u32>,
    pub(crate) netns_name: Option<String>,
    pub(crate) ifindex: u32,
    pub(crate) name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Interface {
    /// Inode of the interface's network namespace.
    pub(crate) netns: u32,
    pub(crate) netns_name: String,
    pub(crate) name: String,
    pub(crate) ifindex: u32,
    pub(crate) kind: LinkKind,
    pub(crate) mtu: u32,
    pub(crate) up: bool,
    /// The device this one sits on (`IFLA_LINK`, or the device a tunnel is bound to).
    pub(crate) lower: Option<DeviceRef>,
    /// For tunnels: the devices encapsulated packets leave by (bound, or found by the
    /// route to each endpoint), one per distinct way out; empty when none was found.
    pub(crate) underlays: Vec<Underlay>,
    /// The routes through it that leave its link, grouped by their MTU metrics; empty
    /// when there are none.
    pub(crate) routes: Vec<RouteMetrics>,
    /// For tunnels: their configuration.
    pub(crate) tunnel: Option<Tunnel>,
    /// For tunnels: the outer header's family, when the configuration tells it.
    pub(crate) remote_family: Option<Family>,
    pub(crate) veth_peer: Option<VethPeer>,
}

/// The namespace's PMTUD sysctls (`None`: unreadable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Sysctls {
    pub(crate) ip_no_pmtu_disc: Option<u32>,
    pub(crate) tcp_mtu_probing: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Namespace {
    pub(crate) inode: u32,
    /// Its `/run/netns` name, `host` for init's namespace, else `pid:N`, else the inode.
    pub(crate) name: String,
    /// The agent's own namespace (the node's, for a hostNetwork agent).
    pub(crate) own: bool,
    pub(crate) sysctls: Sysctls,
    /// Why this namespace could not be read; it then has no interfaces.
    pub(crate) error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Snapshot {
    pub(crate) own_netns: u32,
    /// The agent's namespace first, then pod namespaces by name.
    pub(crate) namespaces: Vec<Namespace>,
    /// In namespace order, then by ifindex.
    pub(crate) interfaces: Vec<Interface>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_from_the_kernel() {
        assert_eq!(
            LinkKind::from_kernel(None, ARPHRD_LOOPBACK),
            LinkKind::Loopback
        );
        assert_eq!(LinkKind::from_kernel(None, 1), LinkKind::Physical);
        assert_eq!(LinkKind::from_kernel(Some("ip6gre"), 823), LinkKind::Ip6gre);
        let other = LinkKind::from_kernel(Some("nlmon"), 824);
        assert_eq!(serde_json::to_value(&other).unwrap(), "nlmon");
        assert_eq!(
            serde_json::to_value(LinkKind::Wireguard).unwrap(),
            "wireguard"
        );
        assert!(LinkKind::Ip6tnl.is_tunnel() && !LinkKind::Veth.is_tunnel());
        assert_eq!(serde_json::to_value(Family::V6).unwrap(), "v6");
    }
}
