//! Packet parsing from kernel memory: the IPv4/IPv6 header (and TCP/UDP ports or the
//! ICMP type/code) at an skb's network header, read at the BTF offsets of `struct
//! sk_buff`, by plain loads through `bpf_rdonly_cast` where the kernel has it and by probe
//! reads elsewhere. The TC classifier parses its own packets with direct loads; it shares only
//! the protocol numbers (`node_diag_common::ipproto`) and [`set_v4`].

use core::mem::MaybeUninit;

use node_diag_common::{AF_INET, AF_INET6, FlowKey, eth_p, icmp, icmpv6, ipproto};

use crate::{
    config::config,
    flow::set_v4,
    kernel::{btf_read, kread, kread_into, rdonly_cast},
};

pub const TCP_FLAG_SYN: u8 = 0x02;
pub const TCP_FLAG_ACK: u8 = 0x10;

/// What [`skb_flow`] found at the network header of an skb.
///
/// Parsed in place into one caller-owned value: every copy of a `FlowKey` (two 16-byte
/// arrays, copied byte by byte in BPF) is a separate stack slot, and the drop paths must
/// fit the 512-byte stack that kernels before 6.13 give a program and its calls together.
#[repr(C, align(8))]
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
const _: () = assert!(core::mem::size_of::<Packet>() == 7 * 8);

impl Packet {
    /// Zeroes `slot` in place, in seven 8-byte stores, and hands it out as a `Packet`. A
    /// derived `Default` (or a zeroed value moved into place) becomes a call to a
    /// byte-at-a-time `memset` loop in BPF, about 250 instructions for this struct, paid
    /// by every drop whose reason wants its packet before anything is parsed.
    #[inline(always)]
    pub fn zero_in(slot: &mut MaybeUninit<Self>) -> &mut Self {
        let words = slot.as_mut_ptr().cast::<u64>();
        for i in 0..7 {
            // SAFETY: `Packet` is 7 × 8 bytes, 8-byte aligned (asserted above); volatile
            // so that the stores are not merged into a `memset` call.
            unsafe { core::ptr::write_volatile(words.add(i), 0) };
        }
        // SAFETY: every byte is written; all zeros is a valid `Packet` (plain integers).
        unsafe { slot.assume_init_mut() }
    }
}

/// Parses the IP header (and ports) at the skb's network header into `p`. IPv6
/// extension headers are not walked.
#[inline(always)]
pub fn skb_flow(skb: u64, protocol: u16, p: &mut Packet) -> Option<u8> {
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
/// one probe read (a helper call costs far more than the bytes it copies). `any_l4`:
/// every transport protocol is wanted, UDP's ports too; otherwise only TCP and ICMP(v6)
/// packets are, and any other leaves with `None` once its protocol is known.
///
/// Returns the transport protocol (also in `p.l4proto`) for the caller to decide on in a
/// register: a decision a callee takes on a value it reads through a pointer into the
/// caller's stack is not tracked as precise by Linux 6.1's verifier, which may then take
/// the packets of two protocols for one state and drop as dead the code of the second.
#[inline(always)]
pub fn ip_flow(ip: u64, protocol: u16, p: &mut Packet, any_l4: bool) -> Option<u8> {
    if config!(cast_iphdr) != 0 {
        return ip_flow_cast(ip, protocol, p, any_l4);
    }
    let flow = &mut p.flow;
    let (l4, l4proto) = if protocol == eth_p::IP {
        let mut h = [0u8; 20];
        kread_into(&mut h, ip, 0)?;
        if h[0] >> 4 != 4 || !(any_l4 || wanted(h[9])) {
            return None;
        }
        flow.family = AF_INET;
        set_v4(&mut flow.saddr, [h[12], h[13], h[14], h[15]]);
        set_v4(&mut flow.daddr, [h[16], h[17], h[18], h[19]]);
        (ip + ((h[0] & 0x0f) as u64) * 4, h[9])
    } else if protocol == eth_p::IPV6 {
        let next = kread::<u8>(ip, 6)?;
        if !(any_l4 || wanted(next)) {
            return None;
        }
        flow.family = AF_INET6;
        kread_into(&mut flow.saddr, ip, 8)?;
        kread_into(&mut flow.daddr, ip, 24)?;
        (ip + 40, next)
    } else {
        return None;
    };
    if l4proto == ipproto::TCP || (l4proto == ipproto::UDP && any_l4) {
        // Ports, and for TCP the flags at byte 13.
        let mut t = [0u8; 14];
        if l4proto == ipproto::TCP {
            kread_into(&mut t, l4, 0)?;
            p.flags = t[13];
        } else {
            kread_into(&mut t[..4], l4, 0)?;
        }
        flow.sport = u16::from_be_bytes([t[0], t[1]]);
        flow.dport = u16::from_be_bytes([t[2], t[3]]);
    } else if l4proto == ipproto::ICMP || l4proto == ipproto::ICMPV6 {
        let t = kread::<[u8; 2]>(l4, 0)?;
        p.flags = t[0];
        p.code = t[1];
    }
    p.l4proto = l4proto;
    p.l4 = l4;
    Some(l4proto)
}

/// [`ip_flow`] by plain loads, on a kernel with `bpf_rdonly_cast`: each header's address
/// cast to its vmlinux struct, so a drop's packet costs no helper call. Same reads, same
/// result; a faulting load reads zeros (an IPv4 header then fails its version check).
#[inline(always)]
fn ip_flow_cast(ip: u64, protocol: u16, p: &mut Packet, any_l4: bool) -> Option<u8> {
    let flow = &mut p.flow;
    let (l4, l4proto) = if protocol == eth_p::IP {
        let h = rdonly_cast(ip, config!(cast_iphdr));
        let first: u8 = btf_read(h, 0);
        let proto: u8 = btf_read(h, 9);
        if first >> 4 != 4 || !(any_l4 || wanted(proto)) {
            return None;
        }
        flow.family = AF_INET;
        // Loaded as the u32 fields they are; the bytes stay in network order.
        set_v4(&mut flow.saddr, btf_read::<u32>(h, 12).to_ne_bytes());
        set_v4(&mut flow.daddr, btf_read::<u32>(h, 16).to_ne_bytes());
        (ip + ((first & 0x0f) as u64) * 4, proto)
    } else if protocol == eth_p::IPV6 {
        let h = rdonly_cast(ip, config!(cast_ipv6hdr));
        let next: u8 = btf_read(h, 6);
        if !(any_l4 || wanted(next)) {
            return None;
        }
        flow.family = AF_INET6;
        // The addresses 4 bytes at a time: the verifier matches each load to one member
        // of `struct in6_addr`'s union (`u6_addr32[i]`).
        for i in 0..4 {
            let s: u32 = btf_read(h, 8 + 4 * i as u32);
            let d: u32 = btf_read(h, 24 + 4 * i as u32);
            flow.saddr[4 * i..4 * i + 4].copy_from_slice(&s.to_ne_bytes());
            flow.daddr[4 * i..4 * i + 4].copy_from_slice(&d.to_ne_bytes());
        }
        (ip + 40, next)
    } else {
        return None;
    };
    if l4proto == ipproto::TCP {
        let t = rdonly_cast(l4, config!(cast_tcphdr));
        flow.sport = u16::from_be(btf_read(t, 0));
        flow.dport = u16::from_be(btf_read(t, 2));
        p.flags = btf_read(t, 13);
    } else if l4proto == ipproto::UDP && any_l4 {
        let u = rdonly_cast(l4, config!(cast_udphdr));
        flow.sport = u16::from_be(btf_read(u, 0));
        flow.dport = u16::from_be(btf_read(u, 2));
    } else if l4proto == ipproto::ICMP {
        let t = rdonly_cast(l4, config!(cast_icmphdr));
        p.flags = btf_read(t, 0);
        p.code = btf_read(t, 1);
    } else if l4proto == ipproto::ICMPV6 {
        // A cast of its own: the verifier wants each call's type id a known constant.
        let t = rdonly_cast(l4, config!(cast_icmp6hdr));
        p.flags = btf_read(t, 0);
        p.code = btf_read(t, 1);
    }
    p.l4proto = l4proto;
    p.l4 = l4;
    Some(l4proto)
}

/// The transport protocols every parse wants (a SYN's flags, an ICMP error's type).
#[inline(always)]
fn wanted(l4proto: u8) -> bool {
    l4proto == ipproto::TCP || l4proto == ipproto::ICMP || l4proto == ipproto::ICMPV6
}

/// Whether an ICMP(v6) type/code is "fragmentation needed" / "packet too big".
#[inline(always)]
pub fn is_frag_needed(l4proto: u8, icmp_type: u8, code: u8) -> bool {
    let (icmp_type, code) = (u32::from(icmp_type), u32::from(code));
    (l4proto == ipproto::ICMP && icmp_type == icmp::DEST_UNREACH && code == icmp::FRAG_NEEDED)
        || (l4proto == ipproto::ICMPV6 && icmp_type == icmpv6::PKT_TOOBIG)
}
