//! Encapsulation overheads: how many bytes each overlay adds around an inner packet, so
//! its underlay's MTU minus that overhead is the largest inner packet it carries.
//!
//! The overhead counts every byte the underlay's MTU must hold beyond the inner packet:
//! the 14 Ethernet bytes of VXLAN's classic `14 + 20 + 8 + 8` are the *inner* frame's
//! header (the underlay's own Ethernet header is not part of any MTU).
//!
//! | encapsulation | IPv4 underlay | IPv6 underlay |
//! | --- | --- | --- |
//! | VXLAN | 14 inner Ethernet + 20 IPv4 + 8 UDP + 8 VXLAN = 50 | 14 + 40 + 8 + 8 = 70 |
//! | VXLAN-GPE | 20 + 8 + 8 = 36 (no inner Ethernet) | 56 |
//! | Geneve | 14 + 20 + 8 UDP + 8 Geneve = 50, + options | 70, + options |
//! | WireGuard | 20 + 8 UDP + 16 message header + 16 auth tag = 60 | 80 |
//! | IPIP, sit / ip6tnl | 20 | 40, + 8 encapsulation limit option unless `encaplimit none` (the kernel's default: 48) |
//! | GRE / ip6gre | 20 + 4 GRE = 24, + 4 each for key, checksum, sequence | 44, + 8 encapsulation limit (default 52) |
//! | GRETAP / ip6gretap | 14 inner Ethernet + 24 = 38 | 58 (default 66) |
//!
//! FOU adds 8 (its UDP header) and GUE 12 (UDP + GUE) to IPIP and GRE. Geneve options
//! are per packet and invisible in the device's configuration: the model counts none,
//! the minimum (`Encapsulation::Geneve::option_bytes` carries them when known).

use serde::Serialize;

use crate::host_network::{Family, Interface, LinkKind, UdpEncap};

/// Inner Ethernet header, carried by layer-2 overlays (VXLAN, Geneve, GRETAP).
const INNER_ETHERNET: u32 = 14;
const IPV4: u32 = 20;
/// Fixed IPv6 header (no extension headers).
const IPV6: u32 = 40;
const UDP: u32 = 8;
/// Flags (1) + reserved (3) + VNI (3) + reserved (1), RFC 7348.
const VXLAN: u32 = 8;
/// Base header without options: version/option length, flags, protocol type, VNI,
/// reserved (RFC 8926).
const GENEVE: u32 = 8;
/// Data message header (type 4 + receiver index 4 + counter 8) + Poly1305 tag 16.
const WIREGUARD: u32 = 32;
/// Flags/version (2) + protocol type (2), RFC 2784.
const GRE: u32 = 4;
/// Each of GRE's optional checksum (+reserved), key and sequence number fields, RFC 2890.
const GRE_FIELD: u32 = 4;
/// Destination options extension header carrying the tunnel encapsulation limit
/// (RFC 2473), which ip6tnl and ip6gre insert unless `encaplimit none`.
const ENCAP_LIMIT: u32 = 8;
/// GUE header (without options) after its UDP header.
const GUE: u32 = 4;

/// An overlay's encapsulation, enough to compute its overhead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Encapsulation {
    /// VXLAN; `gpe` (VXLAN-GPE) carries no inner Ethernet header.
    Vxlan {
        family: Family,
        gpe: bool,
    },
    /// Geneve with `option_bytes` of options (a multiple of 4, at most 252);
    /// `inner_ethernet` is false in `innerprotoinherit` (layer 3) mode.
    Geneve {
        family: Family,
        option_bytes: u16,
        inner_ethernet: bool,
    },
    WireGuard {
        family: Family,
    },
    /// ipip and sit (IPv4 outer) and ip6tnl (IPv6 outer).
    IpInIp {
        family: Family,
        encap_limit: bool,
        udp: Option<UdpEncap>,
    },
    /// gre/gretap (IPv4 outer) and ip6gre/ip6gretap (IPv6 outer); `ethernet` for the
    /// tap variants.
    Gre {
        family: Family,
        ethernet: bool,
        key: bool,
        checksum: bool,
        sequence: bool,
        encap_limit: bool,
        udp: Option<UdpEncap>,
    },
}

impl Encapsulation {
    /// The encapsulation of a tunnel interface toward an endpoint of `family` (the
    /// configured one when `None`); `None` for other kinds. A tunnel whose family neither
    /// its configuration nor an endpoint tells (a metadata-mode device or WireGuard
    /// without known endpoints) is taken as IPv4, the kernel's own default for VXLAN,
    /// rather than risk false alarms on IPv4 nodes. IP tunnels' kinds fix their family.
    pub(crate) fn for_interface(i: &Interface, family: Option<Family>) -> Option<Self> {
        let t = i.tunnel.clone().unwrap_or_default();
        let fixed = matches!(
            i.kind,
            LinkKind::Ipip
                | LinkKind::Sit
                | LinkKind::Gre
                | LinkKind::Gretap
                | LinkKind::Ip6tnl
                | LinkKind::Ip6gre
                | LinkKind::Ip6gretap
        );
        let family = if fixed {
            i.remote_family
        } else {
            family.or(i.remote_family)
        }
        .unwrap_or(Family::V4);
        let gre = |ethernet| Self::Gre {
            family,
            ethernet,
            key: t.gre_key,
            checksum: t.gre_checksum,
            sequence: t.gre_sequence,
            encap_limit: t.encap_limit,
            udp: t.udp_encap,
        };
        Some(match i.kind {
            LinkKind::Vxlan => Self::Vxlan {
                family,
                gpe: t.inner_l3,
            },
            LinkKind::Geneve => Self::Geneve {
                family,
                option_bytes: 0,
                inner_ethernet: !t.inner_l3,
            },
            LinkKind::Wireguard => Self::WireGuard { family },
            LinkKind::Ipip | LinkKind::Sit | LinkKind::Ip6tnl => Self::IpInIp {
                family,
                encap_limit: t.encap_limit,
                udp: t.udp_encap,
            },
            LinkKind::Gre | LinkKind::Ip6gre => gre(false),
            LinkKind::Gretap | LinkKind::Ip6gretap => gre(true),
            _ => return None,
        })
    }

    pub(crate) fn family(&self) -> Family {
        match *self {
            Self::Vxlan { family, .. }
            | Self::Geneve { family, .. }
            | Self::WireGuard { family }
            | Self::IpInIp { family, .. }
            | Self::Gre { family, .. } => family,
        }
    }

    /// The name used in summaries ("VXLAN", "VXLAN/IPv6", "IP6GRE"...).
    pub(crate) fn label(&self) -> String {
        let v6 = self.family() == Family::V6;
        let base = match *self {
            Self::Vxlan { gpe: false, .. } => "VXLAN",
            Self::Vxlan { gpe: true, .. } => "VXLAN-GPE",
            Self::Geneve { .. } => "Geneve",
            Self::WireGuard { .. } => "WireGuard",
            // The IP tunnels' kernel names already say the outer family.
            Self::IpInIp { .. } => return if v6 { "IP6TNL" } else { "IPIP" }.into(),
            Self::Gre { ethernet, .. } => {
                return match (v6, ethernet) {
                    (false, false) => "GRE",
                    (false, true) => "GRETAP",
                    (true, false) => "IP6GRE",
                    (true, true) => "IP6GRETAP",
                }
                .into();
            }
        };
        if v6 {
            format!("{base}/IPv6")
        } else {
            base.into()
        }
    }

    /// The overhead, header by header, in wire order of explanation (inner Ethernet
    /// first, as `14 + 20 + 8 + 8` for VXLAN).
    pub(crate) fn parts(&self) -> Vec<(u32, &'static str)> {
        let v6 = self.family() == Family::V6;
        let mut p = Vec::new();
        let outer_ip = |p: &mut Vec<_>| {
            if v6 {
                p.push((IPV6, "IPv6"));
            } else {
                p.push((IPV4, "IPv4"));
            }
        };
        let udp_encap = |p: &mut Vec<_>, udp: Option<UdpEncap>| match udp {
            Some(UdpEncap::Fou) => p.push((UDP, "FOU UDP")),
            Some(UdpEncap::Gue) => {
                p.push((UDP, "GUE UDP"));
                p.push((GUE, "GUE"));
            }
            None => {}
        };
        match *self {
            Self::Vxlan { gpe, .. } => {
                if !gpe {
                    p.push((INNER_ETHERNET, "inner Ethernet"));
                }
                outer_ip(&mut p);
                p.push((UDP, "UDP"));
                p.push((VXLAN, "VXLAN"));
            }
            Self::Geneve {
                option_bytes,
                inner_ethernet,
                ..
            } => {
                if inner_ethernet {
                    p.push((INNER_ETHERNET, "inner Ethernet"));
                }
                outer_ip(&mut p);
                p.push((UDP, "UDP"));
                p.push((GENEVE, "Geneve"));
                if option_bytes > 0 {
                    p.push((u32::from(option_bytes), "Geneve options"));
                }
            }
            Self::WireGuard { .. } => {
                outer_ip(&mut p);
                p.push((UDP, "UDP"));
                p.push((WIREGUARD, "WireGuard"));
            }
            Self::IpInIp {
                encap_limit, udp, ..
            } => {
                outer_ip(&mut p);
                if v6 && encap_limit {
                    p.push((ENCAP_LIMIT, "encapsulation limit option"));
                }
                udp_encap(&mut p, udp);
            }
            Self::Gre {
                ethernet,
                key,
                checksum,
                sequence,
                encap_limit,
                udp,
                ..
            } => {
                if ethernet {
                    p.push((INNER_ETHERNET, "inner Ethernet"));
                }
                outer_ip(&mut p);
                if v6 && encap_limit {
                    p.push((ENCAP_LIMIT, "encapsulation limit option"));
                }
                udp_encap(&mut p, udp);
                p.push((GRE, "GRE"));
                if checksum {
                    p.push((GRE_FIELD, "GRE checksum"));
                }
                if key {
                    p.push((GRE_FIELD, "GRE key"));
                }
                if sequence {
                    p.push((GRE_FIELD, "GRE sequence"));
                }
            }
        }
        p
    }

    pub(crate) fn overhead(&self) -> u32 {
        self.parts().iter().map(|(n, _)| n).sum()
    }

    /// `14 inner Ethernet + 20 IPv4 + 8 UDP + 8 VXLAN`.
    pub(crate) fn breakdown(&self) -> String {
        self.parts()
            .iter()
            .map(|(n, what)| format!("{n} {what}"))
            .collect::<Vec<_>>()
            .join(" + ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both_families(encap: fn(Family) -> Encapsulation) -> (u32, u32) {
        (encap(Family::V4).overhead(), encap(Family::V6).overhead())
    }

    fn gre(family: Family) -> Encapsulation {
        Encapsulation::Gre {
            family,
            ethernet: false,
            key: false,
            checksum: false,
            sequence: false,
            encap_limit: false,
            udp: None,
        }
    }

    #[test]
    fn overhead_of_every_encapsulation_and_family() {
        let vxlan = |family| Encapsulation::Vxlan { family, gpe: false };
        let geneve = |family| Encapsulation::Geneve {
            family,
            option_bytes: 0,
            inner_ethernet: true,
        };
        let wg = |family| Encapsulation::WireGuard { family };
        let ipip = |family| Encapsulation::IpInIp {
            family,
            encap_limit: false,
            udp: None,
        };
        assert_eq!(both_families(vxlan), (50, 70));
        assert_eq!(both_families(geneve), (50, 70));
        assert_eq!(both_families(wg), (60, 80));
        assert_eq!(both_families(ipip), (20, 40));
        assert_eq!(both_families(gre), (24, 44));

        assert_eq!(
            vxlan(Family::V4).breakdown(),
            "14 inner Ethernet + 20 IPv4 + 8 UDP + 8 VXLAN"
        );
        assert_eq!(vxlan(Family::V6).label(), "VXLAN/IPv6");
        assert_eq!(wg(Family::V6).breakdown(), "40 IPv6 + 8 UDP + 32 WireGuard");

        // Variants: no inner Ethernet in layer-3 modes, Geneve options, the ip6 tunnels'
        // encapsulation limit option (the kernel's default: ip6tnl 1452, ip6gre 1448 on
        // 1500), GRE's optional fields, GRETAP's inner Ethernet, FOU/GUE.
        let gpe = Encapsulation::Vxlan {
            family: Family::V4,
            gpe: true,
        };
        assert_eq!(gpe.overhead(), 36);
        let gnv = |option_bytes, inner_ethernet| Encapsulation::Geneve {
            family: Family::V4,
            option_bytes,
            inner_ethernet,
        };
        assert_eq!(gnv(8, true).overhead(), 58);
        assert_eq!(gnv(0, false).overhead(), 36);
        let ip6tnl = Encapsulation::IpInIp {
            family: Family::V6,
            encap_limit: true,
            udp: None,
        };
        assert_eq!(ip6tnl.overhead(), 48);
        assert_eq!(ip6tnl.label(), "IP6TNL");
        let ipip_limit = Encapsulation::IpInIp {
            family: Family::V4,
            encap_limit: true,
            udp: None,
        };
        assert_eq!(ipip_limit.overhead(), 20, "IPv4 has no encapsulation limit");
        let ipip_udp = |udp| Encapsulation::IpInIp {
            family: Family::V4,
            encap_limit: false,
            udp: Some(udp),
        };
        assert_eq!(ipip_udp(UdpEncap::Fou).overhead(), 28);
        assert_eq!(ipip_udp(UdpEncap::Gue).overhead(), 32);
        let full_gre = |family, ethernet, encap_limit| Encapsulation::Gre {
            family,
            ethernet,
            key: true,
            checksum: true,
            sequence: true,
            encap_limit,
            udp: None,
        };
        assert_eq!(full_gre(Family::V4, false, false).overhead(), 36);
        assert_eq!(full_gre(Family::V4, true, false).overhead(), 50);
        assert_eq!(full_gre(Family::V6, false, true).overhead(), 64);
        let gretap = Encapsulation::Gre {
            family: Family::V4,
            ethernet: true,
            key: false,
            checksum: false,
            sequence: false,
            encap_limit: false,
            udp: None,
        };
        assert_eq!(
            gretap.overhead(),
            38,
            "the kernel's gretap0 is 1462 on 1500"
        );
        assert_eq!(gretap.label(), "GRETAP");
        let ip6gre = Encapsulation::Gre {
            family: Family::V6,
            ethernet: false,
            key: false,
            checksum: false,
            sequence: false,
            encap_limit: true,
            udp: None,
        };
        assert_eq!(ip6gre.overhead(), 52);
        assert_eq!(ip6gre.label(), "IP6GRE");
    }
}
