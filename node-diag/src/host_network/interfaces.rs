//! What the inventory reports: a [`Snapshot`] of namespaces and their interfaces, each
//! with its [`LinkKind`], MTU, lower or underlay device, tunnel configuration and veth
//! peer, and each namespace's PMTUD sysctls. Plain data: the MTU model reads it, the
//! `node-diag mtu` JSON serializes it.

use std::net::IpAddr;

use serde::{Serialize, Serializer};

use super::links::Tunnel;

/// `ARPHRD_LOOPBACK`.
pub(super) const ARPHRD_LOOPBACK: u16 = 772;

/// What an interface is, from the kernel's `IFLA_INFO_KIND`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LinkKind {
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
    pub fn from_kernel(kind: Option<&str>, link_type: u16) -> Self {
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
    pub fn as_str(&self) -> &str {
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
    pub fn is_tunnel(&self) -> bool {
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

/// Address family of a tunnel's outer (underlay) header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(a: IpAddr) -> Self {
        if a.is_ipv4() { Self::V4 } else { Self::V6 }
    }
}

/// A device in the same namespace, by index, with its name and MTU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceRef {
    pub ifindex: u32,
    pub name: String,
    pub mtu: u32,
}

/// How a tunnel's underlay device was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnderlaySource {
    /// The tunnel is bound to it (`dev` at creation: `IFLA_VXLAN_LINK`, `IFLA_*_LINK`).
    Bound,
    /// The route the kernel picks to the tunnel's remote (or multicast group).
    RouteToRemote,
    /// The device holding the tunnel's local address.
    LocalAddress,
    /// The device of the default route (no remote, no local: metadata mode, WireGuard
    /// without peer endpoints).
    DefaultRoute,
    /// The largest-MTU physical interface that is up, as a last resort.
    LargestPhysical,
}

/// The device a tunnel's encapsulated packets leave by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Underlay {
    pub ifindex: u32,
    pub name: String,
    pub mtu: u32,
    pub source: UnderlaySource,
}

/// The other end of a veth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VethPeer {
    /// The peer's namespace (inode), when it is one of the snapshot's.
    pub netns: Option<u32>,
    pub netns_name: Option<String>,
    pub ifindex: u32,
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interface {
    /// Inode of the interface's network namespace.
    pub netns: u32,
    pub netns_name: String,
    pub name: String,
    pub ifindex: u32,
    pub kind: LinkKind,
    pub mtu: u32,
    pub up: bool,
    /// The device this one sits on (`IFLA_LINK`, or the device a tunnel is bound to).
    pub lower: Option<DeviceRef>,
    /// For tunnels: the device encapsulated packets leave by (bound, or found by route).
    pub underlay: Option<Underlay>,
    /// For tunnels: their configuration.
    pub tunnel: Option<Tunnel>,
    /// For tunnels: the outer header's family, when the configuration tells it.
    pub remote_family: Option<Family>,
    pub veth_peer: Option<VethPeer>,
}

/// The namespace's PMTUD sysctls (`None`: unreadable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Sysctls {
    pub ip_no_pmtu_disc: Option<u32>,
    pub tcp_mtu_probing: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Namespace {
    pub inode: u32,
    /// Its `/run/netns` name, `host` for init's namespace, else `pid:N`, else the inode.
    pub name: String,
    /// The agent's own namespace (the node's, for a hostNetwork agent).
    pub own: bool,
    pub sysctls: Sysctls,
    /// Why this namespace could not be read; it then has no interfaces.
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub own_netns: u32,
    /// The agent's namespace first, then pod namespaces by name.
    pub namespaces: Vec<Namespace>,
    /// In namespace order, then by ifindex.
    pub interfaces: Vec<Interface>,
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
