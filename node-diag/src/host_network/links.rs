//! Link dumps: every interface of the calling thread's namespace as a [`Link`], with the
//! veth facts (peer ifindex, peer namespace id) and, for tunnels, the configuration that
//! decides their encapsulation overhead and underlay ([`Tunnel`]).

use std::net::IpAddr;

use netlink_packet_core::{DecodeError, NlasIterator, ParseableParametrized as _};
use netlink_packet_route::link::{
    GreEncapType, GreIOFlags, InfoData, InfoGeneve, InfoGre, InfoGre6, InfoIpTunnel, InfoVxlan,
    Ip6TunnelFlags, LinkAttribute, LinkFlags, LinkHeader, LinkInfo, LinkMessage, TunnelEncapType,
};

use super::{
    nlmsg,
    rtnetlink::{NetlinkError, socket},
};

/// A link as seen in the calling thread's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Link {
    pub(crate) index: u32,
    pub(crate) name: String,
    /// The kernel's `IFLA_INFO_KIND` (`veth`, `vxlan`, `ip6gre`…); `None` for physical
    /// devices and loopback.
    pub(crate) kind: Option<String>,
    pub(crate) mtu: Option<u32>,
    /// ARPHRD_* link-layer type (1 Ethernet, 772 loopback, 65534 none, ...).
    pub(crate) link_type: u16,
    /// For veths and other cross-namespace links: the peer namespace's id in ours.
    pub(crate) link_netnsid: Option<i32>,
    /// `IFLA_LINK`: the lower device of a vlan, macvlan or bound IP tunnel; for a veth,
    /// the peer's ifindex (in `link_netnsid`'s namespace when that is set).
    pub(crate) link: Option<u32>,
    /// Administratively up (`IFF_UP`).
    pub(crate) up: bool,
    /// Tunnel configuration, for the kinds the MTU model knows.
    pub(crate) tunnel: Option<Tunnel>,
}

/// A tunnel's configuration as far as it decides the encapsulation overhead and the
/// underlay device.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Tunnel {
    /// The device the tunnel is bound to (`IFLA_VXLAN_LINK`, `IFLA_IPTUN_LINK`,
    /// `IFLA_GRE_LINK`); `None` when unbound (0).
    pub(crate) bound_to: Option<u32>,
    /// Remote endpoint or multicast group; `None` when any (per-peer FDB entries,
    /// metadata mode, WireGuard: the inventory reads those endpoints separately).
    pub(crate) remote: Option<IpAddr>,
    pub(crate) local: Option<IpAddr>,
    /// Metadata mode (`external`/`collect_metadata`): endpoints come with each packet.
    pub(crate) external: bool,
    /// VXLAN-GPE, or Geneve with `innerprotoinherit`: no inner Ethernet header.
    pub(crate) inner_l3: bool,
    /// GRE output flags that each add 4 bytes to the GRE header.
    pub(crate) gre_key: bool,
    pub(crate) gre_checksum: bool,
    pub(crate) gre_sequence: bool,
    /// ip6tnl/ip6gre insert an 8-byte tunnel encapsulation limit option unless
    /// configured with `encaplimit none`.
    pub(crate) encap_limit: bool,
    /// FOU/GUE UDP encapsulation of an IPIP or GRE tunnel.
    pub(crate) udp_encap: Option<UdpEncap>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum UdpEncap {
    Fou,
    Gue,
}

/// `RTM_NEWLINK`, the kind of each answer of a link dump.
const RTM_NEWLINK: u16 = 16;
/// `RTM_GETLINK`.
const RTM_GETLINK: u16 = 18;
/// `IFLA_EXT_MASK`: what a dump leaves out.
const IFLA_EXT_MASK: u16 = 29;
/// `RTEXT_FILTER_SKIP_STATS` (Linux 5.1+; older kernels ignore the bit): no `IFLA_STATS`,
/// `IFLA_STATS64` or per-family statistics, most of a link's answer, none of it read here.
const RTEXT_FILTER_SKIP_STATS: u32 = 1 << 3;
/// `struct ifinfomsg`'s size: the link header before the attributes.
const IFINFOMSG_LEN: usize = 16;
/// The attributes [`link_from`] reads (`IFLA_IFNAME`, `IFLA_MTU`, `IFLA_LINK`,
/// `IFLA_LINKINFO`, `IFLA_LINK_NETNSID`): the others (per-family configuration, queue
/// settings, ...) are skipped undecoded, since a node with a thousand interfaces is
/// dumped on every burst of link notifications.
const WANTED: [u16; 5] = [3, 4, 5, 18, 37];

/// Every link of the calling thread's network namespace.
pub(crate) fn links() -> Result<Vec<Link>, NetlinkError> {
    let sock = socket()?;
    // An all-zero ifinfomsg (every family, every link), then the extension mask.
    let mut body = vec![0u8; IFINFOMSG_LEN - 4];
    nlmsg::put_attr(
        &mut body,
        IFLA_EXT_MASK,
        &RTEXT_FILTER_SKIP_STATS.to_ne_bytes(),
    );
    let msg = nlmsg::message(
        RTM_GETLINK,
        nlmsg::NLM_F_REQUEST | nlmsg::NLM_F_DUMP,
        [0; 4],
        &body,
    );
    let mut out = Vec::new();
    let mut bad = None;
    nlmsg::exchange(&sock, &msg, true, |kind, payload| {
        if kind != RTM_NEWLINK || bad.is_some() {
            return;
        }
        match parse_link(payload) {
            Ok(msg) => out.push(link_from(msg)),
            Err(e) => bad = Some(e),
        }
    })?;
    match bad {
        Some(e) => Err(NetlinkError::Decode(e.to_string())),
        None => Ok(out),
    }
}

/// A link message with only the [`WANTED`] attributes decoded.
pub(super) fn parse_link(payload: &[u8]) -> Result<LinkMessage, DecodeError> {
    let header = LinkHeader::parse(payload)?;
    let mut msg = LinkMessage::default();
    for nla in NlasIterator::new(payload.get(IFINFOMSG_LEN..).unwrap_or_default()) {
        let nla = nla?;
        if WANTED.contains(&nla.kind()) {
            msg.attributes.push(LinkAttribute::parse_with_param(
                &nla,
                header.interface_family,
            )?);
        }
    }
    msg.header = header;
    Ok(msg)
}

pub(crate) fn link_from(msg: LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        kind: None,
        mtu: None,
        link_type: u16::from(msg.header.link_layer_type),
        link_netnsid: None,
        link: None,
        up: msg.header.flags.contains(LinkFlags::Up),
        tunnel: None,
    };
    for attr in msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n,
            LinkAttribute::Mtu(m) => link.mtu = Some(m),
            LinkAttribute::LinkNetNsId(id) => link.link_netnsid = Some(id),
            LinkAttribute::Link(l) if l != 0 => link.link = Some(l),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(kind) => link.kind = Some(kind.to_string()),
                        LinkInfo::Data(data) => link.tunnel = tunnel_from(data),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    link
}

/// `IFLA_GRE_FLAGS`, which the crate leaves undecoded for ip6gre: the ip6 tunnel flags.
const IFLA_GRE_FLAGS: u16 = 13;

fn tunnel_from(data: InfoData) -> Option<Tunnel> {
    use netlink_packet_core::Nla as _;
    let mut t = Tunnel::default();
    let nonzero = |i: u32| (i != 0).then_some(i);
    let specified = |a: IpAddr| (!a.is_unspecified()).then_some(a);
    let gre_out = |t: &mut Tunnel, flags: GreIOFlags| {
        t.gre_key = flags.contains(GreIOFlags::Key);
        t.gre_checksum = flags.contains(GreIOFlags::Checksum);
        t.gre_sequence = flags.contains(GreIOFlags::Seq);
    };
    let gre_encap = |t: &mut Tunnel, e: GreEncapType| {
        t.udp_encap = match e {
            GreEncapType::Fou => Some(UdpEncap::Fou),
            GreEncapType::Gue => Some(UdpEncap::Gue),
            _ => None,
        }
    };
    match data {
        InfoData::Vxlan(attrs) => {
            for a in attrs {
                match a {
                    InfoVxlan::Link(i) => t.bound_to = nonzero(i),
                    InfoVxlan::Group(a) => t.remote = specified(a.into()),
                    InfoVxlan::Group6(a) => t.remote = specified(a.into()),
                    InfoVxlan::Local(a) => t.local = specified(a.into()),
                    InfoVxlan::Local6(a) => t.local = specified(a.into()),
                    InfoVxlan::CollectMetadata(on) => t.external = on,
                    InfoVxlan::Gpe => t.inner_l3 = true,
                    _ => {}
                }
            }
        }
        InfoData::Geneve(attrs) => {
            for a in attrs {
                match a {
                    InfoGeneve::Remote(a) => t.remote = specified(a.into()),
                    InfoGeneve::Remote6(a) => t.remote = specified(a.into()),
                    InfoGeneve::Local(a) => t.local = specified(a.into()),
                    InfoGeneve::Local6(a) => t.local = specified(a.into()),
                    InfoGeneve::CollectMetadata => t.external = true,
                    InfoGeneve::InnerProtoInherit => t.inner_l3 = true,
                    _ => {}
                }
            }
        }
        InfoData::IpTunnel(attrs) => {
            // The kernel applies the encapsulation limit option unless told to ignore it;
            // only ip6tnl reports the flag, so default to "applies" and let the model
            // use it for IPv6 outer headers only.
            t.encap_limit = true;
            for a in attrs {
                match a {
                    InfoIpTunnel::Link(i) => t.bound_to = nonzero(i),
                    InfoIpTunnel::Remote(a) => t.remote = specified(a),
                    InfoIpTunnel::Local(a) => t.local = specified(a),
                    InfoIpTunnel::CollectMetadata => t.external = true,
                    InfoIpTunnel::Ipv6Flags(f) => {
                        t.encap_limit = !f.contains(Ip6TunnelFlags::IgnEncapLimit);
                    }
                    InfoIpTunnel::EncapType(e) => {
                        t.udp_encap = match e {
                            TunnelEncapType::Fou => Some(UdpEncap::Fou),
                            TunnelEncapType::Gue => Some(UdpEncap::Gue),
                            _ => None,
                        }
                    }
                    _ => {}
                }
            }
        }
        InfoData::GreTun(attrs) | InfoData::GreTap(attrs) => {
            for a in attrs {
                match a {
                    InfoGre::Link(i) => t.bound_to = nonzero(i),
                    InfoGre::Remote(a) => t.remote = specified(a.into()),
                    InfoGre::Local(a) => t.local = specified(a.into()),
                    InfoGre::OFlags(f) => gre_out(&mut t, f),
                    InfoGre::CollectMetadata => t.external = true,
                    InfoGre::EncapType(e) => gre_encap(&mut t, e),
                    _ => {}
                }
            }
        }
        InfoData::GreTun6(attrs) | InfoData::GreTap6(attrs) => {
            t.encap_limit = true;
            for a in attrs {
                match a {
                    InfoGre6::Link(i) => t.bound_to = nonzero(i),
                    InfoGre6::Remote(a) => t.remote = specified(a.into()),
                    InfoGre6::Local(a) => t.local = specified(a.into()),
                    InfoGre6::OFlags(f) => gre_out(&mut t, f),
                    InfoGre6::CollectMetadata => t.external = true,
                    InfoGre6::EncapType(e) => gre_encap(&mut t, e),
                    InfoGre6::Other(nla)
                        if nla.kind() == IFLA_GRE_FLAGS && nla.value_len() == 4 =>
                    {
                        let mut b = [0u8; 4];
                        nla.emit_value(&mut b);
                        let flags = Ip6TunnelFlags::from_bits_retain(u32::from_ne_bytes(b));
                        t.encap_limit = !flags.contains(Ip6TunnelFlags::IgnEncapLimit);
                    }
                    _ => {}
                }
            }
        }
        // WireGuard keeps its peers in generic netlink (see `wireguard`): nothing here
        // tells the family.
        InfoData::Wireguard(_) => {}
        _ => return None,
    }
    Some(t)
}

/// Link messages as the kernel sends them, built and serialized with the crate's types
/// and parsed back the way a dump is: fixtures for the tunnel kinds this kernel lacks.
#[cfg(test)]
pub(crate) mod fixtures {
    use netlink_packet_core::{DefaultNla, Emitable as _, Parseable as _};
    pub(crate) use netlink_packet_route::link::InfoKind;
    use netlink_packet_route::link::{LinkHeader, LinkLayerType};

    use super::*;

    /// Serializes a link message with `kind`/`data` and parses it back into a [`Link`].
    pub(crate) fn parsed(
        index: u32,
        name: &str,
        mtu: u32,
        kind: InfoKind,
        data: Option<InfoData>,
    ) -> Link {
        let header = LinkHeader {
            index,
            link_layer_type: LinkLayerType::Ether,
            flags: LinkFlags::Up,
            ..Default::default()
        };
        let mut info = vec![LinkInfo::Kind(kind)];
        info.extend(data.map(LinkInfo::Data));
        let mut msg = LinkMessage::default();
        msg.header = header;
        msg.attributes = vec![
            LinkAttribute::IfName(name.into()),
            LinkAttribute::Mtu(mtu),
            LinkAttribute::LinkInfo(info),
        ];
        let mut buf = vec![0; msg.buffer_len()];
        msg.emit(&mut buf);
        link_from(LinkMessage::parse(buf.as_slice()).expect("fixture parses"))
    }

    pub(crate) fn vxlan(attrs: Vec<InfoVxlan>) -> Link {
        parsed(
            10,
            "vx0",
            1450,
            InfoKind::Vxlan,
            Some(InfoData::Vxlan(attrs)),
        )
    }

    pub(crate) fn geneve(attrs: Vec<InfoGeneve>) -> Link {
        parsed(
            11,
            "gnv0",
            1450,
            InfoKind::Geneve,
            Some(InfoData::Geneve(attrs)),
        )
    }

    pub(crate) fn wireguard() -> Link {
        // The kernel sends no IFLA_INFO_DATA for wireguard.
        parsed(12, "wg0", 1420, InfoKind::Wireguard, None)
    }

    pub(crate) fn ipip(kind: InfoKind, attrs: Vec<InfoIpTunnel>) -> Link {
        parsed(13, "tun0", 1480, kind, Some(InfoData::IpTunnel(attrs)))
    }

    pub(crate) fn gre(tap: bool, attrs: Vec<InfoGre>) -> Link {
        let (kind, data) = if tap {
            (InfoKind::GreTap, InfoData::GreTap(attrs))
        } else {
            (InfoKind::GreTun, InfoData::GreTun(attrs))
        };
        parsed(14, "gre1", 1476, kind, Some(data))
    }

    /// ip6gre as the kernel dumps it: IFLA_GRE_FLAGS carries the ip6 tunnel flags.
    pub(crate) fn ip6gre(tap: bool, ignore_encap_limit: bool, mut attrs: Vec<InfoGre6>) -> Link {
        let flags: u32 = if ignore_encap_limit { 0x1 } else { 0 };
        attrs.push(InfoGre6::EncapLimit(4));
        attrs.push(InfoGre6::Other(DefaultNla::new(
            IFLA_GRE_FLAGS,
            flags.to_ne_bytes().to_vec(),
        )));
        let (kind, data) = if tap {
            (InfoKind::GreTap6, InfoData::GreTap6(attrs))
        } else {
            (InfoKind::GreTun6, InfoData::GreTun6(attrs))
        };
        parsed(15, "ip6gre1", 1448, kind, Some(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_loopback() {
        // Every namespace has `lo`; netlink needs no privileges to dump links.
        let links = links().expect("link dump");
        assert!(
            links.iter().any(|l| l.name == "lo" && l.mtu.is_some()),
            "{links:?}"
        );
    }

    #[test]
    fn vxlan_fixture_tunnel_facts() {
        use std::net::Ipv4Addr;
        let l = fixtures::vxlan(vec![
            InfoVxlan::Id(42),
            InfoVxlan::Group(Ipv4Addr::new(10, 0, 0, 2)),
            InfoVxlan::Link(3),
            InfoVxlan::Local(Ipv4Addr::UNSPECIFIED),
            InfoVxlan::Port(4789),
        ]);
        assert_eq!(l.kind.as_deref(), Some("vxlan"));
        assert!(l.up);
        let t = l.tunnel.unwrap();
        assert_eq!(t.bound_to, Some(3));
        assert_eq!(t.remote, Some(IpAddr::from([10, 0, 0, 2])));
        assert_eq!(t.local, None, "an unspecified address is no address");
        assert!(!t.external && !t.inner_l3);

        let t = fixtures::vxlan(vec![InfoVxlan::CollectMetadata(true), InfoVxlan::Link(0)])
            .tunnel
            .unwrap();
        assert!(t.external);
        assert_eq!(t.bound_to, None, "ifindex 0 is unbound");
        assert!(
            fixtures::vxlan(vec![InfoVxlan::Gpe])
                .tunnel
                .unwrap()
                .inner_l3
        );
    }

    #[test]
    fn geneve_wireguard_ipip_fixtures() {
        use std::net::Ipv6Addr;
        let t = fixtures::geneve(vec![
            InfoGeneve::Id(7),
            InfoGeneve::Remote6(Ipv6Addr::LOCALHOST),
            InfoGeneve::InnerProtoInherit,
        ])
        .tunnel
        .unwrap();
        assert_eq!(t.remote, Some(IpAddr::from(Ipv6Addr::LOCALHOST)));
        assert!(t.inner_l3);

        let wg = fixtures::wireguard();
        assert_eq!(wg.kind.as_deref(), Some("wireguard"));
        assert_eq!(
            wg.tunnel, None,
            "no info data: nothing known beyond the kind"
        );

        let l = fixtures::ipip(
            fixtures::InfoKind::IpIp,
            vec![
                InfoIpTunnel::Link(2),
                InfoIpTunnel::Remote(IpAddr::from([192, 0, 2, 9])),
                InfoIpTunnel::EncapType(TunnelEncapType::Fou),
            ],
        );
        assert_eq!(l.kind.as_deref(), Some("ipip"));
        let t = l.tunnel.unwrap();
        assert_eq!(t.bound_to, Some(2));
        assert_eq!(t.udp_encap, Some(UdpEncap::Fou));

        let l = fixtures::ipip(
            fixtures::InfoKind::Ip6Tnl,
            vec![InfoIpTunnel::Ipv6Flags(Ip6TunnelFlags::IgnEncapLimit)],
        );
        assert_eq!(l.kind.as_deref(), Some("ip6tnl"));
        assert!(!l.tunnel.unwrap().encap_limit);
        let l = fixtures::ipip(
            fixtures::InfoKind::Ip6Tnl,
            vec![InfoIpTunnel::EncapLimit(4)],
        );
        assert!(l.tunnel.unwrap().encap_limit);
    }

    #[test]
    fn gre_fixtures() {
        let l = fixtures::gre(
            false,
            vec![InfoGre::OFlags(GreIOFlags::Key | GreIOFlags::Seq)],
        );
        assert_eq!(l.kind.as_deref(), Some("gre"));
        let t = l.tunnel.unwrap();
        assert!(t.gre_key && t.gre_sequence && !t.gre_checksum);
        assert_eq!(fixtures::gre(true, vec![]).kind.as_deref(), Some("gretap"));

        let l = fixtures::ip6gre(false, false, vec![]);
        assert_eq!(l.kind.as_deref(), Some("ip6gre"));
        assert!(l.tunnel.unwrap().encap_limit);
        let l = fixtures::ip6gre(true, true, vec![InfoGre6::OFlags(GreIOFlags::Checksum)]);
        assert_eq!(l.kind.as_deref(), Some("ip6gretap"));
        let t = l.tunnel.unwrap();
        assert!(!t.encap_limit && t.gre_checksum);
    }
}
