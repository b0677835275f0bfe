//! MTU model: what each interface's MTU should be, from an inventory snapshot alone (no
//! traffic needed), and the findings when it is not.
//!
//! - An overlay (tunnel) device may carry at most `underlay MTU − encapsulation overhead`:
//!   a larger inner packet no longer fits the underlay once wrapped.
//! - A pod's interface (the pod end of its veth) and the node end of that veth may not
//!   exceed what the overlay their traffic routes through carries. This version takes the
//!   overlay devices of the agent's namespace that are up: with one, its limit; with
//!   several (say VXLAN plus WireGuard), the smallest, since a pod cannot know which one a
//!   packet will take. An overlay's limit is `underlay − overhead`, or its own MTU when
//!   that is lower (or when its underlay is unknown). Without an overlay, pod interfaces
//!   are not compared (native routing: their path MTU is the underlay's).
//! - `net.ipv4.ip_no_pmtu_disc` other than 0 in a namespace: PMTUD is off or partly off.
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

use std::{collections::HashSet, fmt::Write as _, time::SystemTime};

use serde::Serialize;

use crate::{
    findings::{Finding, Kind, Layer, Severity},
    host_network::{Family, Interface, LinkKind, Snapshot, UdpEncap, UnderlaySource},
};

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
pub enum Encapsulation {
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
    /// The encapsulation of a tunnel interface; `None` for other kinds. A tunnel whose
    /// configuration does not tell the outer family (WireGuard, metadata-mode or
    /// endpoint-less VXLAN/Geneve) is taken as IPv4, the kernel's own default for VXLAN,
    /// rather than risk false alarms on IPv4 nodes.
    pub fn for_interface(i: &Interface) -> Option<Self> {
        let t = i.tunnel.clone().unwrap_or_default();
        let family = i.remote_family.unwrap_or(Family::V4);
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

    pub fn family(&self) -> Family {
        match *self {
            Self::Vxlan { family, .. }
            | Self::Geneve { family, .. }
            | Self::WireGuard { family }
            | Self::IpInIp { family, .. }
            | Self::Gre { family, .. } => family,
        }
    }

    /// The name used in summaries ("VXLAN", "VXLAN/IPv6", "IP6GRE"...).
    pub fn label(&self) -> String {
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
    pub fn parts(&self) -> Vec<(u32, &'static str)> {
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

    pub fn overhead(&self) -> u32 {
        self.parts().iter().map(|(n, _)| n).sum()
    }

    /// `14 inner Ethernet + 20 IPv4 + 8 UDP + 8 VXLAN`.
    pub fn breakdown(&self) -> String {
        self.parts()
            .iter()
            .map(|(n, what)| format!("{n} {what}"))
            .collect::<Vec<_>>()
            .join(" + ")
    }
}

/// What an interface is to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    Mismatch,
    /// A tunnel whose underlay could not be found.
    Unknown,
    /// A tunnel that is down: not carrying traffic, not judged.
    Down,
    NotApplicable,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Mismatch => "mismatch",
            Self::Unknown => "unknown",
            Self::Down => "down",
            Self::NotApplicable => "-",
        }
    }
}

/// One interface as judged by the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MtuVerdict {
    pub netns: u32,
    pub netns_name: String,
    pub interface: String,
    pub ifindex: u32,
    pub kind: LinkKind,
    pub role: Role,
    pub up: bool,
    pub mtu: u32,
    /// For pod interfaces and node-side veths: the overlay they are compared with.
    pub overlay: Option<String>,
    pub overlay_mtu: Option<u32>,
    /// The overlay's underlay (for overlays: their own; for pods: their overlay's); for
    /// other devices, the device they sit on.
    pub underlay: Option<String>,
    pub underlay_mtu: Option<u32>,
    pub underlay_source: Option<UnderlaySource>,
    /// Label such as "VXLAN" or "VXLAN/IPv6".
    pub encapsulation: Option<String>,
    pub family: Option<Family>,
    /// The family was not in the tunnel's configuration and IPv4 was assumed.
    pub family_assumed: bool,
    pub overhead: Option<u32>,
    pub overhead_breakdown: Option<String>,
    /// The largest MTU this interface may have.
    pub expected_mtu: Option<u32>,
    /// `expected_mtu − mtu`: negative when the interface is too large.
    pub headroom: Option<i64>,
    pub verdict: Verdict,
    /// The arithmetic, or why there is none.
    pub detail: String,
}

impl MtuVerdict {
    fn new(i: &Interface, role: Role) -> Self {
        Self {
            netns: i.netns,
            netns_name: i.netns_name.clone(),
            interface: i.name.clone(),
            ifindex: i.ifindex,
            kind: i.kind.clone(),
            role,
            up: i.up,
            mtu: i.mtu,
            overlay: None,
            overlay_mtu: None,
            underlay: i.lower.as_ref().map(|l| l.name.clone()),
            underlay_mtu: i.lower.as_ref().map(|l| l.mtu),
            underlay_source: None,
            encapsulation: None,
            family: None,
            family_assumed: false,
            overhead: None,
            overhead_breakdown: None,
            expected_mtu: None,
            headroom: None,
            verdict: Verdict::NotApplicable,
            detail: String::new(),
        }
    }

    /// "pod eth0", "node-side veth veth1 (peer of pod-a eth0)", "vxlan vx0".
    fn subject(&self, peer: Option<(&str, &str)>) -> String {
        match self.role {
            Role::PodInterface => format!("pod {}", self.interface),
            Role::NodeVeth => match peer {
                Some((ns, name)) => {
                    format!("node-side veth {} (peer of {ns} {name})", self.interface)
                }
                None => format!("node-side veth {}", self.interface),
            },
            _ => format!("{} {}", self.kind, self.interface),
        }
    }

    fn judge(&mut self, arithmetic: &str, subject: &str, limit: u32) {
        let headroom = i64::from(limit) - i64::from(self.mtu);
        self.expected_mtu = Some(limit);
        self.headroom = Some(headroom);
        if headroom < 0 {
            self.verdict = Verdict::Mismatch;
            self.detail = format!("{arithmetic}, but {subject} is {}", self.mtu);
        } else {
            self.verdict = Verdict::Ok;
            self.detail = format!("{arithmetic}; {subject} is {}", self.mtu);
        }
    }
}

/// `underlays`: the (netns, ifindex) of every tunnel's underlay device.
fn role_of(i: &Interface, own: u32, underlays: &HashSet<(u32, u32)>) -> Role {
    if i.kind.is_tunnel() {
        return Role::Overlay;
    }
    if underlays.contains(&(i.netns, i.ifindex)) {
        return Role::Underlay;
    }
    if i.kind != LinkKind::Veth {
        return Role::Other;
    }
    let Some(peer) = i.veth_peer.as_ref() else {
        return Role::Other;
    };
    let Some(peer_ns) = peer.netns else {
        return Role::Other;
    };
    if underlays.contains(&(peer_ns, peer.ifindex)) {
        return Role::Underlay;
    }
    match peer_ns {
        p if i.netns != own && p == own => Role::PodInterface,
        p if i.netns == own && p != own => Role::NodeVeth,
        _ => Role::Other,
    }
}

fn source_note(i: &Interface, source: UnderlaySource, underlay: &str) -> Option<String> {
    let t = i.tunnel.as_ref();
    let how = match source {
        UnderlaySource::Bound => return None,
        UnderlaySource::RouteToRemote => format!(
            "the route to {}",
            t.and_then(|t| t.remote)
                .map_or_else(|| "its remote".into(), |a| a.to_string())
        ),
        UnderlaySource::LocalAddress => format!(
            "the device holding {}",
            t.and_then(|t| t.local)
                .map_or_else(|| "its local address".into(), |a| a.to_string())
        ),
        UnderlaySource::DefaultRoute => "the default route".into(),
        UnderlaySource::LargestPhysical => "the largest physical interface".into(),
    };
    Some(format!(
        "{} is not bound to a device; underlay {underlay} is {how}",
        i.name
    ))
}

fn overlay_verdict(i: &Interface) -> MtuVerdict {
    let mut v = MtuVerdict::new(i, Role::Overlay);
    let Some(enc) = Encapsulation::for_interface(i) else {
        return v;
    };
    v.encapsulation = Some(enc.label());
    v.family = Some(enc.family());
    v.family_assumed = i.remote_family.is_none();
    v.overhead = Some(enc.overhead());
    v.overhead_breakdown = Some(enc.breakdown());
    v.underlay = None;
    v.underlay_mtu = None;
    if !i.up {
        v.verdict = Verdict::Down;
        v.detail = format!("{} is down", i.name);
        return v;
    }
    let Some(u) = &i.underlay else {
        v.verdict = Verdict::Unknown;
        v.detail = format!(
            "no underlay found for {} (not bound to a device, no route to its remote, no \
             default route, no physical interface up)",
            i.name
        );
        return v;
    };
    v.underlay = Some(u.name.clone());
    v.underlay_mtu = Some(u.mtu);
    v.underlay_source = Some(u.source);
    let expected = u.mtu.saturating_sub(enc.overhead());
    let mut arithmetic = format!(
        "underlay {} {} − {} {} = {expected}",
        u.name,
        u.mtu,
        enc.label(),
        enc.overhead()
    );
    if v.family_assumed {
        arithmetic.push_str(" (IPv4 underlay assumed)");
    }
    if i.tunnel.as_ref().is_some_and(|t| t.external) {
        // Metadata-mode devices (Cilium's, for one) are left at a large MTU on purpose:
        // the kernel checks each packet against the route to its endpoint instead.
        v.expected_mtu = Some(expected);
        v.detail = format!(
            "{arithmetic}; {} is a metadata-mode (external) device, whose own MTU does not \
             limit encapsulated packets",
            i.name
        );
    } else {
        let subject = v.subject(None);
        v.judge(&arithmetic, &subject, expected);
    }
    if let Some(note) = source_note(i, u.source, &u.name) {
        let _ = write!(v.detail, " ({note})");
    }
    v
}

/// The limit pod interfaces are held to: the smallest over the agent namespace's overlays
/// that are up.
struct Ceiling {
    /// Index of the overlay's verdict.
    overlay: usize,
    limit: u32,
    /// "underlay ul0 1500 − VXLAN 50 = 1450 (overlay vx0)".
    arithmetic: String,
}

fn ceiling(verdicts: &[MtuVerdict], own: u32) -> Option<Ceiling> {
    verdicts
        .iter()
        .enumerate()
        .filter(|(_, v)| v.role == Role::Overlay && v.netns == own && v.up)
        .filter_map(|(idx, v)| {
            let external = v.verdict == Verdict::NotApplicable;
            let (limit, arithmetic) = match (v.underlay.as_ref(), v.underlay_mtu, v.expected_mtu) {
                (Some(u), Some(umtu), Some(expected)) if external || expected <= v.mtu => (
                    expected,
                    format!(
                        "underlay {u} {umtu} − {} {} = {expected} (overlay {})",
                        v.encapsulation.as_deref()?,
                        v.overhead?,
                        v.interface
                    ),
                ),
                (Some(u), Some(umtu), Some(expected)) => (
                    v.mtu,
                    format!(
                        "overlay {} is {} (below underlay {u} {umtu} − {} {} = {expected})",
                        v.interface,
                        v.mtu,
                        v.encapsulation.as_deref()?,
                        v.overhead?
                    ),
                ),
                _ => (
                    v.mtu,
                    format!(
                        "overlay {} is {} (its underlay is unknown)",
                        v.interface, v.mtu
                    ),
                ),
            };
            Some(Ceiling {
                overlay: idx,
                limit,
                arithmetic,
            })
        })
        .min_by_key(|c| c.limit)
}

/// Every interface of the snapshot, judged.
pub fn verdicts(snap: &Snapshot) -> Vec<MtuVerdict> {
    let own = snap.own_netns;
    let underlays: HashSet<(u32, u32)> = snap
        .interfaces
        .iter()
        .filter_map(|i| Some((i.netns, i.underlay.as_ref()?.ifindex)))
        .collect();
    let mut out: Vec<MtuVerdict> = snap
        .interfaces
        .iter()
        .map(|i| match role_of(i, own, &underlays) {
            Role::Overlay => overlay_verdict(i),
            role => MtuVerdict::new(i, role),
        })
        .collect();
    let ceiling = ceiling(&out, own).map(|c| (out[c.overlay].clone(), c));
    for (v, i) in out.iter_mut().zip(&snap.interfaces) {
        if !matches!(v.role, Role::PodInterface | Role::NodeVeth) {
            continue;
        }
        let peer = i
            .veth_peer
            .as_ref()
            .and_then(|p| Some((p.netns_name.as_deref()?, p.name.as_deref()?)));
        let subject = v.subject(peer);
        let Some((ov, c)) = &ceiling else {
            v.detail = format!(
                "no overlay device is up in the node's namespace: {subject} has the \
                 underlay's path"
            );
            continue;
        };
        v.overlay = Some(ov.interface.clone());
        v.overlay_mtu = Some(ov.mtu);
        v.underlay = ov.underlay.clone();
        v.underlay_mtu = ov.underlay_mtu;
        v.underlay_source = ov.underlay_source;
        v.encapsulation = ov.encapsulation.clone();
        v.family = ov.family;
        v.family_assumed = ov.family_assumed;
        v.overhead = ov.overhead;
        v.overhead_breakdown = ov.overhead_breakdown.clone();
        let subject = if v.role == Role::PodInterface {
            format!("{subject} (netns {})", v.netns_name)
        } else {
            subject
        };
        v.judge(&c.arithmetic, &subject, c.limit);
    }
    out
}

/// A namespace's PMTUD sysctls, judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SysctlVerdict {
    pub netns: u32,
    pub netns_name: String,
    pub ip_no_pmtu_disc: Option<u32>,
    pub tcp_mtu_probing: Option<u32>,
    /// `ok`, `pmtud_disabled` or `unknown` (unreadable).
    pub verdict: SysctlState,
    pub detail: String,
    /// Why the namespace could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SysctlState {
    Ok,
    PmtudDisabled,
    Unknown,
}

fn no_pmtu_disc_meaning(v: u32) -> &'static str {
    match v {
        0 => "PMTUD on",
        1 => "PMTUD off: packets go out without DF, frag-needed only lowers the PMTU to min_pmtu",
        2 => "PMTUD off: packets go out without DF and frag-needed is discarded",
        3 => "hardened: frag-needed honoured only for TCP, SCTP and DCCP",
        _ => "unknown mode",
    }
}

fn mtu_probing_meaning(v: u32) -> &'static str {
    match v {
        0 => "TCP MTU probing off (no fallback when frag-needed is blocked)",
        1 => "TCP MTU probing once a black hole is detected",
        2 => "TCP MTU probing always on",
        _ => "TCP MTU probing in an unknown mode",
    }
}

pub fn sysctl_verdicts(snap: &Snapshot) -> Vec<SysctlVerdict> {
    snap.namespaces
        .iter()
        .map(|n| {
            let s = n.sysctls;
            let (verdict, mut detail) = match s.ip_no_pmtu_disc {
                None => (
                    SysctlState::Unknown,
                    "ip_no_pmtu_disc unreadable".to_string(),
                ),
                Some(0) => (SysctlState::Ok, no_pmtu_disc_meaning(0).to_string()),
                Some(v) => (
                    SysctlState::PmtudDisabled,
                    no_pmtu_disc_meaning(v).to_string(),
                ),
            };
            if let Some(p) = s.tcp_mtu_probing {
                let _ = write!(detail, "; {}", mtu_probing_meaning(p));
            }
            SysctlVerdict {
                netns: n.inode,
                netns_name: n.name.clone(),
                ip_no_pmtu_disc: s.ip_no_pmtu_disc,
                tcp_mtu_probing: s.tcp_mtu_probing,
                verdict,
                detail,
                error: n.error.clone(),
            }
        })
        .collect()
}

fn mismatch_finding(v: &MtuVerdict, now: SystemTime) -> Finding {
    let limit = v.expected_mtu.unwrap_or(0);
    let excess = -v.headroom.unwrap_or(0);
    let remediation = match v.role {
        Role::Overlay => format!(
            "Set {}'s MTU to {limit} (the CNI's tunnel MTU setting), or raise the underlay {}'s \
             MTU by {excess} bytes.",
            v.interface,
            v.underlay.as_deref().unwrap_or("device")
        ),
        _ => {
            let by_arithmetic = v
                .underlay_mtu
                .zip(v.overhead)
                .map(|(u, o)| u.saturating_sub(o));
            // When the overlay device itself is set below what its underlay allows, it is
            // the one to raise; otherwise only the underlay can make room.
            let alternative = match (by_arithmetic, &v.overlay) {
                (Some(max), Some(ov)) if max > limit && max >= v.mtu => {
                    format!("raise {ov}'s MTU to {}", v.mtu)
                }
                _ => format!("raise the underlay MTU by {excess} bytes"),
            };
            format!(
                "Set the CNI MTU to {limit} (pod interfaces and their node-side veths; \
                 running pods pick it up when recreated), or {alternative}. Until then clamp \
                 TCP MSS to the path MTU (iptables -t mangle -A POSTROUTING -p tcp \
                 --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu)."
            )
        }
    };
    let mut f = Finding::new(
        Kind::OverlayMtuMismatch,
        Layer::OverlayMtu,
        Severity::Warning,
        format!(
            "{}: packets above {limit} bytes do not fit the overlay and are dropped or \
             need PMTUD.",
            v.detail
        ),
        remediation,
        now,
    );
    f.interface = Some(v.interface.clone());
    f.netns = Some(v.netns);
    let e = &mut f.evidence;
    let mut put = |k: &str, val: serde_json::Value| {
        e.insert(k.into(), val);
    };
    put("underlay", v.underlay.clone().into());
    put("underlay_mtu", v.underlay_mtu.into());
    put("encapsulation", v.encapsulation.clone().into());
    put("overhead", v.overhead.into());
    put("expected_mtu", v.expected_mtu.into());
    put("actual_mtu", v.mtu.into());
    put("headroom", v.headroom.into());
    put("overhead_breakdown", v.overhead_breakdown.clone().into());
    put(
        "underlay_source",
        serde_json::to_value(v.underlay_source).unwrap_or_default(),
    );
    put("family", serde_json::to_value(v.family).unwrap_or_default());
    put("overlay", v.overlay.clone().into());
    put("overlay_mtu", v.overlay_mtu.into());
    put("role", serde_json::to_value(v.role).unwrap_or_default());
    put("netns_name", v.netns_name.clone().into());
    f
}

fn sysctl_finding(s: &SysctlVerdict, now: SystemTime) -> Option<Finding> {
    let value = s.ip_no_pmtu_disc.filter(|v| *v != 0)?;
    // Mode 3 still honours frag-needed for TCP.
    let severity = if value == 3 {
        Severity::Info
    } else {
        Severity::Warning
    };
    let mut f = Finding::new(
        Kind::PmtudDisabled,
        Layer::HostSysctl,
        severity,
        format!(
            "net.ipv4.ip_no_pmtu_disc is {value} in netns {} ({}).",
            s.netns_name,
            no_pmtu_disc_meaning(value)
        ),
        "Set net.ipv4.ip_no_pmtu_disc=0 in this namespace; where frag-needed cannot get \
         through, also set net.ipv4.tcp_mtu_probing=1."
            .into(),
        now,
    );
    f.netns = Some(s.netns);
    f.evidence
        .insert("sysctl".into(), "net.ipv4.ip_no_pmtu_disc".into());
    f.evidence.insert("value".into(), value.into());
    f.evidence
        .insert("tcp_mtu_probing".into(), s.tcp_mtu_probing.into());
    f.evidence
        .insert("netns_name".into(), s.netns_name.clone().into());
    Some(f)
}

/// The findings of judged interfaces and sysctls.
pub fn findings_of(
    verdicts: &[MtuVerdict],
    sysctls: &[SysctlVerdict],
    now: SystemTime,
) -> Vec<Finding> {
    verdicts
        .iter()
        .filter(|v| v.verdict == Verdict::Mismatch)
        .map(|v| mismatch_finding(v, now))
        .chain(sysctls.iter().filter_map(|s| sysctl_finding(s, now)))
        .collect()
}

/// `overlay_mtu_mismatch` and `pmtud_disabled` findings of a snapshot.
pub fn findings(snap: &Snapshot, now: SystemTime) -> Vec<Finding> {
    findings_of(&verdicts(snap), &sysctl_verdicts(snap), now)
}

/// `node-diag mtu`'s output.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub interfaces: Vec<MtuVerdict>,
    pub sysctls: Vec<SysctlVerdict>,
    pub findings: Vec<Finding>,
}

pub fn report(snap: &Snapshot, now: SystemTime) -> Report {
    let interfaces = verdicts(snap);
    let sysctls = sysctl_verdicts(snap);
    let findings = findings_of(&interfaces, &sysctls, now);
    Report {
        interfaces,
        sysctls,
        findings,
    }
}

fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (c, w) in cells.zip(&widths) {
            let _ = write!(l, "{c:<w$}  ");
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
}

impl Report {
    pub fn text(&self) -> String {
        let dash = || "-".to_string();
        let num = |n: Option<u32>| n.map_or_else(dash, |n| n.to_string());
        let rows: Vec<Vec<String>> = self
            .interfaces
            .iter()
            .map(|v| {
                let underlay = match (&v.underlay, v.underlay_mtu) {
                    (Some(u), Some(m)) => format!("{u}/{m}"),
                    _ => dash(),
                };
                let underlay = match &v.overlay {
                    Some(o) if underlay == "-" => format!("via {o}"),
                    Some(o) => format!("{underlay} via {o}"),
                    None => underlay,
                };
                vec![
                    v.netns_name.clone(),
                    v.interface.clone(),
                    v.kind.to_string(),
                    v.mtu.to_string(),
                    underlay,
                    num(v.overhead),
                    num(v.expected_mtu),
                    v.headroom.map_or_else(dash, |h| h.to_string()),
                    match v.verdict {
                        Verdict::Mismatch => "MISMATCH".into(),
                        other => other.as_str().into(),
                    },
                ]
            })
            .collect();
        let mut out = String::new();
        table(
            &mut out,
            &[
                "NETNS",
                "INTERFACE",
                "KIND",
                "MTU",
                "UNDERLAY",
                "OVERHEAD",
                "EXPECTED",
                "HEADROOM",
                "VERDICT",
            ],
            &rows,
        );
        // Pods without an overlay all say the same thing: say it once.
        let unchecked_pods = self.interfaces.iter().any(|v| {
            matches!(v.role, Role::PodInterface | Role::NodeVeth)
                && v.verdict == Verdict::NotApplicable
        });
        let details: Vec<_> = self
            .interfaces
            .iter()
            .filter(|v| {
                !v.detail.is_empty()
                    && (v.role == Role::Overlay || v.verdict != Verdict::NotApplicable)
            })
            .collect();
        if !details.is_empty() {
            out.push('\n');
            for v in details {
                let _ = write!(out, "{} {}: {}", v.netns_name, v.interface, v.detail);
                if let Some(b) = &v.overhead_breakdown {
                    let _ = write!(
                        out,
                        " [{} {} = {b}]",
                        v.encapsulation.as_deref().unwrap_or("overhead"),
                        v.overhead.unwrap_or(0)
                    );
                }
                out.push('\n');
            }
        }
        if unchecked_pods {
            out.push('\n');
            out.push_str(
                "Pod interfaces are not compared: no overlay device is up in the node's \
                 namespace (their path is the underlay's).\n",
            );
        }
        out.push('\n');
        let rows: Vec<Vec<String>> = self
            .sysctls
            .iter()
            .map(|s| {
                vec![
                    s.netns_name.clone(),
                    num(s.ip_no_pmtu_disc),
                    num(s.tcp_mtu_probing),
                    match s.verdict {
                        SysctlState::Ok => "ok".into(),
                        SysctlState::PmtudDisabled => "PMTUD_DISABLED".into(),
                        SysctlState::Unknown => "unknown".into(),
                    },
                    match &s.error {
                        Some(e) => format!("unreadable: {e}"),
                        None => s.detail.clone(),
                    },
                ]
            })
            .collect();
        table(
            &mut out,
            &[
                "NETNS",
                "IP_NO_PMTU_DISC",
                "TCP_MTU_PROBING",
                "VERDICT",
                "MEANING",
            ],
            &rows,
        );
        out.push('\n');
        let mismatches = self
            .findings
            .iter()
            .filter(|f| f.kind == Kind::OverlayMtuMismatch)
            .count();
        let sysctl = self.findings.len() - mismatches;
        if self.findings.is_empty() {
            out.push_str("No MTU or PMTUD configuration problem found.\n");
        } else {
            let _ = writeln!(
                out,
                "{mismatches} MTU mismatch(es), {sysctl} PMTUD sysctl finding(s):"
            );
            for f in &self.findings {
                let _ = writeln!(
                    out,
                    "  {} {}: {} Fix: {}",
                    f.severity.as_str().to_uppercase(),
                    f.kind,
                    f.summary,
                    f.remediation
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::host_network::{
        Link, Namespace, Sysctls, Tunnel, Underlay, VethPeer, fixtures, tunnel_family,
    };

    const NODE: u32 = 100;
    const POD: u32 = 200;

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

    /// An interface in `ns` (NODE is the agent's).
    fn iface(ns: u32, name: &str, ifindex: u32, kind: LinkKind, mtu: u32) -> Interface {
        Interface {
            netns: ns,
            netns_name: if ns == NODE { "node" } else { "pod-a" }.into(),
            name: name.into(),
            ifindex,
            kind,
            mtu,
            up: true,
            lower: None,
            underlay: None,
            tunnel: None,
            remote_family: None,
            veth_peer: None,
        }
    }

    fn tunnel(
        mut i: Interface,
        t: Tunnel,
        underlay: Option<(&str, u32, u32, UnderlaySource)>,
    ) -> Interface {
        i.remote_family = tunnel_family(&i.kind, &t);
        i.tunnel = Some(t);
        i.underlay = underlay.map(|(name, ifindex, mtu, source)| Underlay {
            ifindex,
            name: name.into(),
            mtu,
            source,
        });
        i
    }

    fn peer(mut i: Interface, ns: u32, ifindex: u32, name: &str) -> Interface {
        i.veth_peer = Some(VethPeer {
            netns: Some(ns),
            netns_name: Some(if ns == NODE { "node" } else { "pod-a" }.into()),
            ifindex,
            name: Some(name.into()),
        });
        i
    }

    fn namespace(inode: u32, own: bool, no_pmtu_disc: u32) -> Namespace {
        Namespace {
            inode,
            name: if own { "node" } else { "pod-a" }.into(),
            own,
            sysctls: Sysctls {
                ip_no_pmtu_disc: Some(no_pmtu_disc),
                tcp_mtu_probing: Some(0),
            },
            error: None,
        }
    }

    fn bound_vxlan(remote: [u8; 4]) -> Tunnel {
        Tunnel {
            bound_to: Some(2),
            remote: Some(IpAddr::from(remote)),
            ..Tunnel::default()
        }
    }

    /// The seed's node: ul0 (underlay), vx0 bound to it, and one pod on a veth.
    fn node(ul_mtu: u32, vx_mtu: u32, pod_mtu: u32, node_veth_mtu: u32) -> Snapshot {
        Snapshot {
            own_netns: NODE,
            namespaces: vec![namespace(NODE, true, 0), namespace(POD, false, 0)],
            interfaces: vec![
                iface(NODE, "lo", 1, LinkKind::Loopback, 65536),
                iface(NODE, "ul0", 2, LinkKind::Physical, ul_mtu),
                tunnel(
                    iface(NODE, "vx0", 3, LinkKind::Vxlan, vx_mtu),
                    bound_vxlan([10, 0, 0, 2]),
                    Some(("ul0", 2, ul_mtu, UnderlaySource::Bound)),
                ),
                peer(
                    iface(NODE, "veth1", 4, LinkKind::Veth, node_veth_mtu),
                    POD,
                    2,
                    "eth0",
                ),
                iface(POD, "lo", 1, LinkKind::Loopback, 65536),
                peer(
                    iface(POD, "eth0", 2, LinkKind::Veth, pod_mtu),
                    NODE,
                    4,
                    "veth1",
                ),
            ],
        }
    }

    fn verdict<'a>(vs: &'a [MtuVerdict], ns: u32, name: &str) -> &'a MtuVerdict {
        vs.iter()
            .find(|v| v.netns == ns && v.interface == name)
            .unwrap_or_else(|| panic!("no verdict for {name}"))
    }

    #[test]
    fn pod_at_1500_over_a_1450_vxlan() {
        let snap = node(1500, 1450, 1500, 1500);
        let vs = verdicts(&snap);
        let vx = verdict(&vs, NODE, "vx0");
        assert_eq!(vx.verdict, Verdict::Ok);
        assert_eq!((vx.expected_mtu, vx.headroom), (Some(1450), Some(0)));
        let pod = verdict(&vs, POD, "eth0");
        assert_eq!(pod.role, Role::PodInterface);
        assert_eq!(pod.verdict, Verdict::Mismatch);
        assert_eq!((pod.expected_mtu, pod.headroom), (Some(1450), Some(-50)));
        assert_eq!(verdict(&vs, NODE, "veth1").role, Role::NodeVeth);
        assert_eq!(verdict(&vs, NODE, "ul0").role, Role::Underlay);
        assert_eq!(verdict(&vs, NODE, "lo").verdict, Verdict::NotApplicable);

        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        assert_eq!(fs.len(), 2, "{fs:#?}");
        let f = fs
            .iter()
            .find(|f| f.interface.as_deref() == Some("eth0"))
            .unwrap();
        assert_eq!(f.kind, Kind::OverlayMtuMismatch);
        assert_eq!(f.layer, Layer::OverlayMtu);
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.netns, Some(POD));
        assert!(
            f.summary
                .starts_with("underlay ul0 1500 − VXLAN 50 = 1450 (overlay vx0), but pod eth0"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("is 1500"), "{}", f.summary);
        assert!(
            f.remediation.starts_with("Set the CNI MTU to 1450"),
            "{}",
            f.remediation
        );
        let e = &f.evidence;
        assert_eq!(e["underlay"], "ul0");
        assert_eq!(e["underlay_mtu"], 1500);
        assert_eq!(e["encapsulation"], "VXLAN");
        assert_eq!(e["overhead"], 50);
        assert_eq!(e["expected_mtu"], 1450);
        assert_eq!(e["actual_mtu"], 1500);
        assert_eq!(e["headroom"], -50);
        assert_eq!(e["overlay"], "vx0");
        let node_side = fs
            .iter()
            .find(|f| f.interface.as_deref() == Some("veth1"))
            .unwrap();
        assert!(
            node_side
                .summary
                .contains("but node-side veth veth1 (peer of pod-a eth0) is 1500"),
            "{}",
            node_side.summary
        );
    }

    #[test]
    fn correct_setup_has_no_findings() {
        for (ul, vx) in [(1500, 1450), (9000, 8950), (9001, 8951), (1500, 1400)] {
            let snap = node(ul, vx, vx, vx);
            let fs = findings(&snap, SystemTime::UNIX_EPOCH);
            assert!(fs.is_empty(), "{ul}/{vx}: {fs:#?}");
            let vs = verdicts(&snap);
            assert!(
                vs.iter()
                    .all(|v| matches!(v.verdict, Verdict::Ok | Verdict::NotApplicable)),
                "{vs:#?}"
            );
        }
    }

    #[test]
    fn jumbo_underlays() {
        let vs = verdicts(&node(9001, 9001, 9001, 9001));
        let vx = verdict(&vs, NODE, "vx0");
        assert_eq!(vx.expected_mtu, Some(8951));
        assert_eq!(vx.headroom, Some(-50));
        assert!(
            vx.detail
                .starts_with("underlay ul0 9001 − VXLAN 50 = 8951, but vxlan vx0 is 9001")
        );
        assert_eq!(verdict(&vs, POD, "eth0").expected_mtu, Some(8951));

        // Every encapsulation, both families, on 9000 and 9001.
        let expect = [
            (9000, Family::V4, LinkKind::Vxlan, 8950),
            (9000, Family::V6, LinkKind::Vxlan, 8930),
            (9001, Family::V4, LinkKind::Geneve, 8951),
            (9001, Family::V6, LinkKind::Geneve, 8931),
            (9000, Family::V4, LinkKind::Wireguard, 8940),
            (9001, Family::V6, LinkKind::Wireguard, 8921),
            (9000, Family::V4, LinkKind::Gre, 8976),
            (9001, Family::V4, LinkKind::Ipip, 8981),
        ];
        for (ul, family, kind, want) in expect {
            let remote = match family {
                Family::V4 => IpAddr::from([10, 0, 0, 2]),
                Family::V6 => IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 2]),
            };
            let t = Tunnel {
                remote: Some(remote),
                ..Tunnel::default()
            };
            let i = tunnel(
                iface(NODE, "t0", 3, kind.clone(), ul),
                t,
                Some(("ul0", 2, ul, UnderlaySource::RouteToRemote)),
            );
            let v = overlay_verdict(&i);
            assert_eq!(v.expected_mtu, Some(want), "{kind} {family:?} over {ul}");
        }
    }

    #[test]
    fn unbound_vxlan_forced_above_underlay_minus_50() {
        let mut snap = node(1500, 1450, 1450, 1450);
        snap.interfaces.push(tunnel(
            iface(NODE, "vxu", 5, LinkKind::Vxlan, 1500),
            Tunnel {
                remote: Some(IpAddr::from([10, 0, 0, 2])),
                ..Tunnel::default()
            },
            Some(("ul0", 2, 1500, UnderlaySource::RouteToRemote)),
        ));
        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        assert_eq!(fs.len(), 1, "{fs:#?}");
        let f = &fs[0];
        assert_eq!(f.interface.as_deref(), Some("vxu"));
        assert!(
            f.summary
                .starts_with("underlay ul0 1500 − VXLAN 50 = 1450, but vxlan vxu is 1500"),
            "{}",
            f.summary
        );
        assert!(f.summary.contains("the route to 10.0.0.2"), "{}", f.summary);
        assert!(f.remediation.starts_with("Set vxu's MTU to 1450"));
        assert_eq!(f.evidence["underlay_source"], "route_to_remote");
        assert_eq!(f.evidence["headroom"], -50);
    }

    #[test]
    fn smallest_overlay_limits_pods() {
        // VXLAN (1450) and WireGuard (1440 over IPv4) on the same node: pods at 1450 are
        // too big for the WireGuard path.
        let mut snap = node(1500, 1450, 1450, 1440);
        snap.interfaces.push(tunnel(
            iface(NODE, "wg0", 6, LinkKind::Wireguard, 1440),
            Tunnel::default(),
            Some(("ul0", 2, 1500, UnderlaySource::DefaultRoute)),
        ));
        let vs = verdicts(&snap);
        let wg = verdict(&vs, NODE, "wg0");
        assert!(wg.family_assumed);
        assert_eq!(wg.verdict, Verdict::Ok);
        let pod = verdict(&vs, POD, "eth0");
        assert_eq!(pod.overlay.as_deref(), Some("wg0"));
        assert_eq!((pod.expected_mtu, pod.headroom), (Some(1440), Some(-10)));
        assert_eq!(verdict(&vs, NODE, "veth1").verdict, Verdict::Ok);
    }

    #[test]
    fn overlay_set_below_its_underlay_limits_pods() {
        let snap = node(1500, 1400, 1450, 1400);
        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        assert_eq!(fs.len(), 1, "{fs:#?}");
        assert!(
            fs[0].summary.starts_with(
                "overlay vx0 is 1400 (below underlay ul0 1500 − VXLAN 50 = 1450), but pod eth0"
            ),
            "{}",
            fs[0].summary
        );
        assert!(fs[0].remediation.contains("or raise vx0's MTU to 1450"));
    }

    #[test]
    fn external_down_and_underlay_unknown_tunnels() {
        let mut snap = node(1500, 1450, 1450, 1450);
        // Cilium-style metadata-mode device left at 1500: not a mismatch itself, but it
        // still holds pods to 1450.
        snap.interfaces.push(tunnel(
            iface(NODE, "cilium_vxlan", 7, LinkKind::Vxlan, 1500),
            Tunnel {
                external: true,
                ..Tunnel::default()
            },
            Some(("ul0", 2, 1500, UnderlaySource::DefaultRoute)),
        ));
        let mut down = tunnel(
            iface(NODE, "gre0", 8, LinkKind::Gre, 1476),
            Tunnel::default(),
            None,
        );
        down.up = false;
        snap.interfaces.push(down);
        snap.interfaces.push(tunnel(
            iface(NODE, "tunl0", 9, LinkKind::Ipip, 1480),
            Tunnel::default(),
            None,
        ));
        let vs = verdicts(&snap);
        let ext = verdict(&vs, NODE, "cilium_vxlan");
        assert_eq!(ext.verdict, Verdict::NotApplicable);
        assert_eq!(ext.expected_mtu, Some(1450));
        assert_eq!(ext.headroom, None);
        assert_eq!(verdict(&vs, NODE, "gre0").verdict, Verdict::Down);
        assert_eq!(verdict(&vs, NODE, "tunl0").verdict, Verdict::Unknown);
        // tunl0's 1480 (underlay unknown) does not beat the 1450 limits.
        assert_eq!(verdict(&vs, POD, "eth0").expected_mtu, Some(1450));
        assert!(findings(&snap, SystemTime::UNIX_EPOCH).is_empty());
    }

    #[test]
    fn without_overlay_pods_are_not_compared() {
        let mut snap = node(1500, 1450, 9000, 9000);
        snap.interfaces.retain(|i| i.name != "vx0");
        let vs = verdicts(&snap);
        assert_eq!(verdict(&vs, POD, "eth0").verdict, Verdict::NotApplicable);
        assert!(findings(&snap, SystemTime::UNIX_EPOCH).is_empty());
    }

    #[test]
    fn underlay_veth_to_another_node_is_not_a_pod() {
        // Two test "nodes" joined by a veth: the far end is not a pod interface.
        let mut snap = node(1500, 1450, 1450, 1450);
        snap.interfaces[1] = peer(iface(NODE, "ul0", 2, LinkKind::Veth, 1500), POD, 3, "ul1");
        snap.interfaces.push(peer(
            iface(POD, "ul1", 3, LinkKind::Veth, 1500),
            NODE,
            2,
            "ul0",
        ));
        let vs = verdicts(&snap);
        assert_eq!(verdict(&vs, NODE, "ul0").role, Role::Underlay);
        assert_eq!(verdict(&vs, POD, "ul1").role, Role::Underlay);
        assert!(findings(&snap, SystemTime::UNIX_EPOCH).is_empty());
    }

    #[test]
    fn sysctl_verdicts_and_findings() {
        let mut snap = node(1500, 1450, 1450, 1450);
        snap.namespaces[1].sysctls.ip_no_pmtu_disc = Some(1);
        snap.namespaces[0].sysctls.tcp_mtu_probing = Some(1);
        let ss = sysctl_verdicts(&snap);
        assert_eq!(ss[0].verdict, SysctlState::Ok);
        assert!(ss[0].detail.contains("once a black hole is detected"));
        assert_eq!(ss[1].verdict, SysctlState::PmtudDisabled);
        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        assert_eq!(fs.len(), 1);
        let f = &fs[0];
        assert_eq!(
            (f.kind, f.layer, f.severity),
            (Kind::PmtudDisabled, Layer::HostSysctl, Severity::Warning)
        );
        assert_eq!(f.netns, Some(POD));
        assert_eq!(f.evidence["value"], 1);
        assert!(
            f.summary
                .contains("net.ipv4.ip_no_pmtu_disc is 1 in netns pod-a")
        );

        snap.namespaces[1].sysctls.ip_no_pmtu_disc = Some(3);
        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        assert_eq!(fs[0].severity, Severity::Info, "mode 3 still honours TCP's");

        snap.namespaces[1].sysctls.ip_no_pmtu_disc = None;
        assert_eq!(sysctl_verdicts(&snap)[1].verdict, SysctlState::Unknown);
        assert!(findings(&snap, SystemTime::UNIX_EPOCH).is_empty());
    }

    /// An interface from a parsed link message, as the inventory builds it.
    fn from_link(l: Link, underlay_mtu: u32) -> Interface {
        let kind = LinkKind::from_kernel(l.kind.as_deref(), l.link_type);
        let t = l.tunnel.clone().unwrap_or_default();
        let mut i = iface(NODE, &l.name, l.index, kind, l.mtu.unwrap());
        i = tunnel(i, t, Some(("eth0", 2, underlay_mtu, UnderlaySource::Bound)));
        i
    }

    #[test]
    fn parsed_fixtures_match_the_kernels_default_mtus() {
        use netlink_packet_route::link::{InfoGeneve, InfoGre6, InfoIpTunnel, InfoVxlan};
        use std::net::{Ipv4Addr, Ipv6Addr};
        // (link as dumped, the MTU the kernel gives it on a 1500 underlay)
        let cases = [
            (
                fixtures::vxlan(vec![
                    InfoVxlan::Group6(Ipv6Addr::LOCALHOST),
                    InfoVxlan::Link(2),
                ]),
                1430,
            ),
            (
                fixtures::geneve(vec![InfoGeneve::Remote(Ipv4Addr::new(10, 0, 0, 2))]),
                1450,
            ),
            (fixtures::wireguard(), 1440),
            (
                fixtures::ipip(fixtures::InfoKind::IpIp, vec![InfoIpTunnel::Link(2)]),
                1480,
            ),
            (fixtures::ipip(fixtures::InfoKind::Ip6Tnl, vec![]), 1452),
            (fixtures::gre(false, vec![]), 1476),
            (fixtures::gre(true, vec![]), 1462),
            (fixtures::ip6gre(false, false, vec![]), 1448),
            (
                fixtures::ip6gre(false, true, vec![InfoGre6::Remote(Ipv6Addr::LOCALHOST)]),
                1456,
            ),
        ];
        for (link, want) in cases {
            let name = format!("{:?}", link.kind);
            let v = overlay_verdict(&from_link(link, 1500));
            assert_eq!(v.expected_mtu, Some(want), "{name}: {}", v.detail);
        }
    }

    #[test]
    fn report_text_and_json_shape() {
        let r = report(&node(1500, 1450, 1500, 1450), SystemTime::UNIX_EPOCH);
        let text = r.text();
        assert!(text.starts_with("NETNS"), "{text}");
        assert!(text.contains("ul0/1500 via vx0"), "{text}");
        assert!(text.contains("MISMATCH"), "{text}");
        assert!(text.contains("1 MTU mismatch(es)"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        for k in ["interfaces", "sysctls", "findings"] {
            assert!(json[k].is_array(), "{k}");
        }
        assert_eq!(json["interfaces"][0]["kind"], "loopback");
        assert_eq!(json["findings"][0]["kind"], "overlay_mtu_mismatch");
    }
}
