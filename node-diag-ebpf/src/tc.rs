//! TC ingress (`sched_cls`) on this node's interfaces: ICMP frag-needed and IPv6
//! packet-too-big arriving for a flow, remembered per original flow with the next-hop MTU
//! they carry; other destination-unreachable errors (a filter's admin-prohibited, a
//! router's host unreachable, a REJECT's port unreachable) remembered per flow as what
//! answered its connect. The program never changes the verdict (`TC_ACT_UNSPEC`).

use aya_ebpf::{bindings::TC_ACT_UNSPEC, macros::classifier, programs::TcContext};
use node_diag_common::{AF_INET, AF_INET6, FlowKey, IcmpInfo, counter};

use crate::{
    config::now,
    emit::{bump_lru, inc},
    maps::{ICMP_ERR_RCVD, ICMP_RCVD, L3_OFFSET},
    packet::{
        ETH_P_IP, ETH_P_IPV6, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, IPPROTO_UDP, set_v4,
    },
};

const ICMP_DEST_UNREACH: u8 = 3;
const ICMPV6_DEST_UNREACH: u8 = 1;
const ICMPV6_PKT_TOOBIG: u8 = 2;

/// Largest link-layer header the classifier skips (bounds the offset for the verifier).
const MAX_L2: usize = 64;

/// One byte of the packet. Direct packet access would spare the helper call, but a
/// variable header offset defeats the verifier's range tracking.
#[inline(always)]
fn byte_at(ctx: &TcContext, off: usize) -> Option<u8> {
    ctx.load::<u8>(off).ok()
}

#[classifier]
pub fn nd_tc_ingress(ctx: TcContext) -> i32 {
    let _ = try_tc_ingress(&ctx);
    TC_ACT_UNSPEC
}

fn try_tc_ingress(ctx: &TcContext) -> Option<()> {
    let (protocol, ifindex) = unsafe { ((*ctx.skb.skb).protocol, (*ctx.skb.skb).ifindex) };
    let protocol = u16::from_be(protocol as u16);
    if protocol != ETH_P_IP && protocol != ETH_P_IPV6 {
        return None;
    }
    let nh = match unsafe { L3_OFFSET.get(&ifindex) } {
        Some(off) => (*off as usize).min(MAX_L2),
        None => 14,
    };
    // Every IP packet passes here: one read decides whether it can be an ICMP error.
    let l4proto = byte_at(ctx, nh + if protocol == ETH_P_IP { 9 } else { 6 })?;
    if l4proto != IPPROTO_ICMP && l4proto != IPPROTO_ICMPV6 {
        return None;
    }
    let (mut flow, icmp_off, icmp_type, code, mtu) = if protocol == ETH_P_IP {
        let ver_ihl = ctx.load::<u8>(nh).ok()?;
        if l4proto != IPPROTO_ICMP {
            return None;
        }
        let icmp = nh + ((ver_ihl & 0x0f) as usize) * 4;
        let (t, c) = (ctx.load::<u8>(icmp).ok()?, ctx.load::<u8>(icmp + 1).ok()?);
        if t != ICMP_DEST_UNREACH {
            return None;
        }
        let mtu = if c == 4 {
            u16::from_be(ctx.load::<u16>(icmp + 6).ok()?) as u32
        } else {
            0
        };
        (FlowKey::default(), icmp, t, c, mtu)
    } else if protocol == ETH_P_IPV6 {
        if l4proto != IPPROTO_ICMPV6 {
            return None;
        }
        let icmp = nh + 40;
        let (t, c) = (ctx.load::<u8>(icmp).ok()?, ctx.load::<u8>(icmp + 1).ok()?);
        if t != ICMPV6_PKT_TOOBIG && t != ICMPV6_DEST_UNREACH {
            return None;
        }
        let mtu = if t == ICMPV6_PKT_TOOBIG {
            u32::from_be(ctx.load::<u32>(icmp + 4).ok()?)
        } else {
            0
        };
        (FlowKey::default(), icmp, t, c, mtu)
    } else {
        return None;
    };
    // The quoted packet: the original sender's IP header and the first 8 transport bytes.
    let inner = icmp_off + 8;
    let l4 = if protocol == ETH_P_IP {
        let ver_ihl = ctx.load::<u8>(inner).ok()?;
        flow.family = AF_INET;
        set_v4(&mut flow.saddr, ctx.load::<[u8; 4]>(inner + 12).ok()?);
        set_v4(&mut flow.daddr, ctx.load::<[u8; 4]>(inner + 16).ok()?);
        let proto = ctx.load::<u8>(inner + 9).ok()?;
        (proto, inner + ((ver_ihl & 0x0f) as usize) * 4)
    } else {
        flow.family = AF_INET6;
        flow.saddr = ctx.load::<[u8; 16]>(inner + 8).ok()?;
        flow.daddr = ctx.load::<[u8; 16]>(inner + 24).ok()?;
        (ctx.load::<u8>(inner + 6).ok()?, inner + 40)
    };
    if l4.0 == IPPROTO_TCP || l4.0 == IPPROTO_UDP {
        flow.sport = u16::from_be(ctx.load::<u16>(l4.1).ok()?);
        flow.dport = u16::from_be(ctx.load::<u16>(l4.1 + 2).ok()?);
    }
    let mut info = IcmpInfo {
        last_ns: now(),
        icmp_type: icmp_type as u32,
        icmp_code: code as u32,
        netns: 0,
        ifindex,
        mtu,
        count: 0,
        from: [0; 16],
    };
    if protocol == ETH_P_IP {
        set_v4(&mut info.from, ctx.load::<[u8; 4]>(nh + 12).ok()?);
    } else {
        info.from = ctx.load::<[u8; 16]>(nh + 8).ok()?;
    }
    let frag_needed = if protocol == ETH_P_IP {
        code == 4
    } else {
        icmp_type == ICMPV6_PKT_TOOBIG
    };
    if !frag_needed {
        return bump_lru(&ICMP_ERR_RCVD, &flow, &mut info).map(|_new| ());
    }
    inc(counter::ICMP_FRAG_RECEIVED);
    bump_lru(&ICMP_RCVD, &flow, &mut info).map(|_new| ())
}
