//! Packet parsing from kernel memory: the IPv4/IPv6 header (and TCP/UDP ports or the
//! ICMP type/code) at an skb's network header, read at the BTF offsets of `struct
//! sk_buff`. The TC classifier parses its own packets with direct loads; it shares only
//! the protocol numbers and [`set_v4`].

use node_diag_common::{AF_INET, AF_INET6, FlowKey};

use crate::{
    config::config,
    kernel::{kread, kread_into},
};

pub const TCP_FLAG_SYN: u8 = 0x02;
pub const TCP_FLAG_ACK: u8 = 0x10;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_ICMPV6: u8 = 58;

/// Stores an IPv4 address in the first four bytes of a [`FlowKey`] address.
#[inline(always)]
pub fn set_v4(dst: &mut [u8; 16], v4: [u8; 4]) {
    dst[0] = v4[0];
    dst[1] = v4[1];
    dst[2] = v4[2];
    dst[3] = v4[3];
}

/// What [`skb_flow`] found at the network header of an skb.
///
/// Parsed in place into one caller-owned value: every copy of a `FlowKey` (two 16-byte
/// arrays, copied byte by byte in BPF) is a separate stack slot, and the drop paths must
/// fit the 512-byte stack that kernels before 6.13 give a program and its calls together.
#[derive(Default)]
pub struct Packet {
    /// Sender first; ports only for TCP/UDP.
    pub flow: FlowKey,
    pub l4proto: u8,
    /// TCP flags, or the ICMP type.
    pub flags: u8,
    /// ICMP code (0 otherwise).
    pub code: u8,
    /// Address of the transport header.
    pub l4: u64,
}

/// Parses the IP header (and ports) at the skb's network header into `p`. IPv6
/// extension headers are not walked.
#[inline(always)]
pub fn skb_flow(skb: u64, protocol: u16, p: &mut Packet) -> Option<()> {
    if config!(btf_ok) == 0 {
        return None;
    }
    let head = kread::<u64>(skb, config!(skb_head))?;
    let nh = kread::<u16>(skb, config!(skb_network_header))?;
    if nh == 0xffff {
        return None;
    }
    ip_flow(head + nh as u64, protocol, p, true)
}

/// Parses an IPv4/IPv6 header at kernel address `ip` into `p`. Each header is read in
/// one probe read (a helper call costs far more than the bytes it copies). `udp_ports`:
/// whether a UDP packet's ports are wanted (TCP's always are).
#[inline(always)]
pub fn ip_flow(ip: u64, protocol: u16, p: &mut Packet, udp_ports: bool) -> Option<()> {
    let flow = &mut p.flow;
    let (l4, l4proto) = if protocol == ETH_P_IP {
        let mut h = [0u8; 20];
        kread_into(&mut h, ip, 0)?;
        if h[0] >> 4 != 4 {
            return None;
        }
        flow.family = AF_INET;
        set_v4(&mut flow.saddr, [h[12], h[13], h[14], h[15]]);
        set_v4(&mut flow.daddr, [h[16], h[17], h[18], h[19]]);
        (ip + ((h[0] & 0x0f) as u64) * 4, h[9])
    } else if protocol == ETH_P_IPV6 {
        flow.family = AF_INET6;
        kread_into(&mut flow.saddr, ip, 8)?;
        kread_into(&mut flow.daddr, ip, 24)?;
        (ip + 40, kread::<u8>(ip, 6)?)
    } else {
        return None;
    };
    if l4proto == IPPROTO_TCP || (l4proto == IPPROTO_UDP && udp_ports) {
        // Ports, and for TCP the flags at byte 13.
        let mut t = [0u8; 14];
        if l4proto == IPPROTO_TCP {
            kread_into(&mut t, l4, 0)?;
            p.flags = t[13];
        } else {
            kread_into(&mut t[..4], l4, 0)?;
        }
        flow.sport = u16::from_be_bytes([t[0], t[1]]);
        flow.dport = u16::from_be_bytes([t[2], t[3]]);
    } else if l4proto == IPPROTO_ICMP || l4proto == IPPROTO_ICMPV6 {
        let t = kread::<[u8; 2]>(l4, 0)?;
        p.flags = t[0];
        p.code = t[1];
    }
    p.l4proto = l4proto;
    p.l4 = l4;
    Some(())
}

/// Turns `flow` around in place: the flow seen from its other end.
#[inline(always)]
pub fn reverse(flow: &mut FlowKey) {
    core::mem::swap(&mut flow.saddr, &mut flow.daddr);
    core::mem::swap(&mut flow.sport, &mut flow.dport);
}

/// Whether an ICMP(v6) type/code is "fragmentation needed" / "packet too big".
#[inline(always)]
pub fn is_frag_needed(l4proto: u8, icmp_type: u8, code: u8) -> bool {
    (l4proto == IPPROTO_ICMP && icmp_type == 3 && code == 4)
        || (l4proto == IPPROTO_ICMPV6 && icmp_type == 2)
}
