//! TC ingress (`sched_cls`) on this node's interfaces: ICMP frag-needed and IPv6
//! packet-too-big arriving for a flow, remembered per original flow with the next-hop MTU
//! they carry; other destination-unreachable errors (a filter's admin-prohibited, a
//! router's host unreachable, a REJECT's port unreachable) remembered per flow as what
//! answered its connect. The program never changes the verdict (`TC_ACT_UNSPEC`).

use core::mem::MaybeUninit;

use aya_ebpf::{
    EbpfContext,
    bindings::{TC_ACT_UNSPEC, bpf_hdr_start_off::BPF_HDR_START_NET},
    helpers::bpf_skb_load_bytes_relative,
    macros::classifier,
    programs::TcContext,
};
use node_diag_common::{
    AF_INET, AF_INET6, ETH_HLEN, FlowKey, IcmpInfo, counter, eth_p, icmp, icmpv6, ipproto,
};

use crate::{
    config::now,
    emit::{bump_lru, inc, note_evidence},
    flow::set_v4,
    maps::{ICMP_ERR_RCVD, ICMP_RCVD, LINK_HDR},
};

/// A `T` at `off` bytes from the packet's network header. Relative to the network header,
/// so no per-device link-layer length is looked up (Ethernet, or none on WireGuard and
/// IPIP devices): the kernel set the header before TC ingress runs.
#[inline(always)]
fn load<T: Copy>(ctx: &TcContext, off: u32) -> Option<T> {
    let mut v = MaybeUninit::<T>::uninit();
    // SAFETY: the helper writes at most size_of::<T>() bytes into `v`, and fails (leaving
    // it unread) when the packet is shorter.
    let r = unsafe {
        bpf_skb_load_bytes_relative(
            ctx.as_ptr(),
            off,
            v.as_mut_ptr().cast(),
            core::mem::size_of::<T>() as u32,
            BPF_HDR_START_NET,
        )
    };
    // SAFETY: a zero return means all bytes were written.
    (r == 0).then(|| unsafe { v.assume_init() })
}

/// The byte `off` bytes past the network header, read straight from the frame on an
/// interface the agent knows as Ethernet ([`LINK_HDR`]): the helper call of [`load`] was
/// about half of what the classifier cost per packet on its common path (profiles of the
/// overlay transfer: 9-37 ns net with this read, 79-91 with the helper; see
/// docs/benchmarks.md). `None`
/// where the frame is not that (its EtherType is not the packet's protocol, a VLAN's
/// say) or the byte is not in the linear part: [`load`] reads it then.
#[inline(always)]
fn load_eth_u8(ctx: &TcContext, ifindex: u32, protocol: u16, off: usize) -> Option<u8> {
    // An array lookup: the verifier inlines it, no helper call.
    if *LINK_HDR.get(ifindex)? != ETH_HLEN {
        return None;
    }
    const ETH: usize = ETH_HLEN as usize;
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + ETH + off + 1 > end {
        return None;
    }
    // SAFETY: the frame's first ETH + off + 1 bytes are in the packet's linear part, as
    // checked above (and by the verifier).
    let (ethertype, byte) = unsafe {
        let frame = data as *const u8;
        (
            u16::from_be_bytes([*frame.add(12), *frame.add(13)]),
            *frame.add(ETH + off),
        )
    };
    (ethertype == protocol).then_some(byte)
}

#[classifier]
pub fn nd_tc_ingress(ctx: TcContext) -> i32 {
    let _ = try_tc_ingress(&ctx);
    TC_ACT_UNSPEC
}

fn try_tc_ingress(ctx: &TcContext) -> Option<()> {
    // SAFETY: `__sk_buff` context fields, read directly.
    let (protocol, ifindex) = unsafe { ((*ctx.skb.skb).protocol, (*ctx.skb.skb).ifindex) };
    let protocol = u16::from_be(protocol as u16);
    let v4 = protocol == eth_p::IP;
    if !v4 && protocol != eth_p::IPV6 {
        return None;
    }
    // Every IP packet passes here: one load decides whether it can be an ICMP error.
    let at = if v4 { 9 } else { 6 };
    let l4proto = match load_eth_u8(ctx, ifindex, protocol, at) {
        Some(l4proto) => l4proto,
        None => load::<u8>(ctx, at as u32)?,
    };
    let (icmp_off, icmp_type, code, mtu) = if v4 {
        if l4proto != ipproto::ICMP {
            return None;
        }
        let off = ((load::<u8>(ctx, 0)? & 0x0f) as u32) * 4;
        // type, code, checksum, unused, next-hop MTU
        let h = load::<[u8; 8]>(ctx, off)?;
        if u32::from(h[0]) != icmp::DEST_UNREACH {
            return None;
        }
        let mtu = if u32::from(h[1]) == icmp::FRAG_NEEDED {
            u16::from_be_bytes([h[6], h[7]]) as u32
        } else {
            0
        };
        (off, h[0], h[1], mtu)
    } else {
        if l4proto != ipproto::ICMPV6 {
            return None;
        }
        let off = 40;
        // type, code, checksum, MTU
        let h = load::<[u8; 8]>(ctx, off)?;
        let icmp_type = u32::from(h[0]);
        if icmp_type != icmpv6::PKT_TOOBIG && icmp_type != icmpv6::DEST_UNREACH {
            return None;
        }
        let mtu = if icmp_type == icmpv6::PKT_TOOBIG {
            u32::from_be_bytes([h[4], h[5], h[6], h[7]])
        } else {
            0
        };
        (off, h[0], h[1], mtu)
    };
    // The quoted packet: the original sender's IP header and the first 8 transport bytes.
    let inner = icmp_off + 8;
    let mut flow = FlowKey::default();
    let (proto, l4) = if v4 {
        let q = load::<[u8; 20]>(ctx, inner)?;
        flow.family = AF_INET;
        set_v4(&mut flow.saddr, [q[12], q[13], q[14], q[15]]);
        set_v4(&mut flow.daddr, [q[16], q[17], q[18], q[19]]);
        (q[9], inner + ((q[0] & 0x0f) as u32) * 4)
    } else {
        flow.family = AF_INET6;
        flow.saddr = load::<[u8; 16]>(ctx, inner + 8)?;
        flow.daddr = load::<[u8; 16]>(ctx, inner + 24)?;
        (load::<u8>(ctx, inner + 6)?, inner + 40)
    };
    if proto == ipproto::TCP || proto == ipproto::UDP {
        let ports = load::<[u8; 4]>(ctx, l4)?;
        flow.sport = u16::from_be_bytes([ports[0], ports[1]]);
        flow.dport = u16::from_be_bytes([ports[2], ports[3]]);
    }
    let mut info = IcmpInfo {
        last_ns: now(),
        icmp_type: u32::from(icmp_type),
        icmp_code: u32::from(code),
        netns: 0,
        ifindex,
        mtu,
        count: 0,
        from: [0; 16],
    };
    if v4 {
        set_v4(&mut info.from, load::<[u8; 4]>(ctx, 12)?);
    } else {
        info.from = load::<[u8; 16]>(ctx, 8)?;
    }
    let frag_needed = if v4 {
        u32::from(code) == icmp::FRAG_NEEDED
    } else {
        u32::from(icmp_type) == icmpv6::PKT_TOOBIG
    };
    if !frag_needed {
        note_evidence();
        return bump_lru(&ICMP_ERR_RCVD, &flow, &mut info).map(|_new| ());
    }
    inc(counter::ICMP_FRAG_RECEIVED);
    bump_lru(&ICMP_RCVD, &flow, &mut info).map(|_new| ())
}
