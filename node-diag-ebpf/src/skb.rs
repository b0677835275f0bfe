//! `skb:kfree_skb` (raw): every drop aggregated by reason, netns and device; SYN drops
//! with a reason the agent asked for are remembered per flow as timeout evidence, DF
//! packets too big for their route and frag-needed dropped by netfilter as MTU evidence.

use core::mem::MaybeUninit;

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use node_diag_common::{
    AF_INET6, DROP_REASON_SLOTS, DropInfo, DropKey, counter, drop_flag, event_kind, icmpv6, ipproto,
};

use crate::{
    config::{config, in_scope, in_scope_cached, now},
    emit::{Extra, bump, bump_lru, emit, inc, note_evidence},
    flow::reverse,
    icmp::note_sent,
    kernel::{btf_read, kread, skb_dev_btf},
    maps::{DROP_REASONS, DROPS, FRAG_DROPPED, OVERSIZE, OVERSIZE_BY_DEV, SYN_DROPS},
    nat::nat_join,
    packet::{Packet, TCP_FLAG_ACK, TCP_FLAG_SYN, ip_flow, is_frag_needed},
};

/// A BTF tracepoint: the arguments (`kfree_skb(skb, location, reason[, rx_sk])`,
/// positions checked in BTF by the agent) are read straight from the context, and the
/// verifier knows `skb` as a `struct sk_buff *`, so the skb, its device and namespace are
/// read with plain loads instead of a helper call each. A drop whose reason asks for
/// nothing more costs those loads and one array lookup (its reason's counter, which also
/// caches the scope decision).
#[btf_tracepoint(function = "kfree_skb")]
pub fn nd_kfree_skb(ctx: BtfTracePointContext) -> i32 {
    match try_kfree_skb(&ctx) {
        Some(()) | None => 0,
    }
}

fn try_kfree_skb(ctx: &BtfTracePointContext) -> Option<()> {
    let skb: u64 = ctx.arg(0);
    let reason = ctx.arg::<u64>(2) as u32;
    let (netns, ifindex) = skb_dev_btf(skb);
    if reason < DROP_REASON_SLOTS {
        let slot = DROP_REASONS.get_ptr_mut(reason)?;
        if !in_scope_cached(slot, netns) {
            return None;
        }
        // SAFETY: this CPU's slot, from the map.
        unsafe { (*slot).count += 1 };
    } else {
        if !in_scope(netns) {
            return None;
        }
        let key = DropKey {
            reason,
            netns: 0,
            ifindex: 0,
            _pad: 0,
        };
        bump(&DROPS, &key);
    }
    if reason == config!(reason_pkt_too_big)
        || reason == config!(reason_netfilter_drop)
        || flow_reason(reason)
    {
        evidence(ctx, skb, reason, netns, ifindex);
    }
    Some(())
}

/// The packet of a drop whose reason is evidence, parsed once for every use.
///
/// This and the per-reason paths are out of line (BPF-to-BPF calls) so that the
/// program's own frame stays small: the verifier adds the caller's frame to the deepest
/// callee's, and before Linux 6.13 (no private stacks) the sum must fit in 512 bytes.
#[inline(never)]
fn evidence(
    ctx: &BtfTracePointContext,
    skb: u64,
    reason: u32,
    netns: u32,
    ifindex: u32,
) -> Option<()> {
    let protocol = u16::from_be(btf_read::<u16>(skb, config!(skb_protocol)));
    let head: u64 = btf_read(skb, config!(skb_head));
    let nh: u16 = btf_read(skb, config!(skb_network_header));
    let mut slot = MaybeUninit::uninit();
    let p = Packet::zero_in(&mut slot);
    // Every protocol (and UDP's ports) matters only to an oversize drop's flow; the other
    // paths want a TCP SYN or an ICMP error, so a flood of UDP into a drop rule stops at
    // the IP header's protocol byte.
    let any_l4 = reason == config!(reason_pkt_too_big);
    let l4proto = if head != 0 && nh != 0xffff {
        ip_flow(head + nh as u64, protocol, p, any_l4)
    } else {
        None
    };
    if reason == config!(reason_pkt_too_big) {
        // Counted per device even when the packet cannot be parsed.
        oversize(ctx, skb, p, l4proto.is_some(), netns);
    }
    // Which path a packet takes is decided here, on the protocol in a register, not in
    // the callees on `p` (see `ip_flow`).
    let l4proto = l4proto?;
    if reason == config!(reason_netfilter_drop) && is_frag_needed(l4proto, p.flags, p.code) {
        frag_needed_dropped(p, protocol, netns, ifindex);
    }
    if flow_reason(reason) && l4proto == ipproto::TCP && p.flags & TCP_FLAG_SYN != 0 {
        syn_dropped(skb, p, reason, netns, ifindex);
    }
    Some(())
}

/// A SYN (or SYN-ACK, `p` a TCP packet with SYN set) dropped for a reason the agent asked
/// for: remembered under the connecting side's flow as timeout evidence. Last of the
/// paths: it turns `p` around.
#[inline(never)]
fn syn_dropped(skb: u64, p: &mut Packet, reason: u32, netns: u32, ifindex: u32) -> Option<()> {
    // A SYN-ACK dropped here (the return path: rp_filter, a policy on the way back,
    // conntrack INVALID) leaves the connect timing out exactly like a dropped SYN; it is
    // kept under the connecting side's flow, marked.
    let syn_ack = p.flags & TCP_FLAG_ACK != 0;
    let drop_flags = if syn_ack {
        reverse(&mut p.flow);
        drop_flag::SYN_ACK
    } else {
        0
    };
    // Dropped after this node's NAT: filed under the flow the socket connected to.
    let _ = nat_join(skb, &mut p.flow, netns, syn_ack);
    note_evidence();
    let mut info = DropInfo {
        last_ns: now(),
        reason,
        count: 0,
        netns,
        ifindex,
        flags: drop_flags,
        mtu: 0,
    };
    bump_lru(&SYN_DROPS, &p.flow, &mut info).map(|_new| ())
}

#[inline(always)]
fn flow_reason(reason: u32) -> bool {
    if reason >= 256 {
        return false;
    }
    let word = match reason / 64 {
        0 => config!(flow_reasons[0]),
        1 => config!(flow_reasons[1]),
        2 => config!(flow_reasons[2]),
        _ => config!(flow_reasons[3]),
    };
    word & (1u64 << (reason % 64)) != 0
}

/// A DF packet dropped for exceeding its route's MTU (the forwarding path, where no
/// socket is involved): counted per egress device, and the flow's first one reported.
/// Out of line (see [`evidence`]): the event it builds needs its own stack frame, and
/// only drops with this one reason pay for the call.
#[inline(never)]
fn oversize(
    ctx: &BtfTracePointContext,
    skb: u64,
    packet: &Packet,
    parsed: bool,
    netns: u32,
) -> Option<()> {
    inc(counter::DF_OVERSIZE_DROPS);
    let refdst = kread::<u64>(skb, config!(skb_refdst))? & !1;
    let dev = kread::<u64>(refdst, config!(dst_dev))?;
    let egress = kread::<u32>(dev, config!(dev_ifindex)).unwrap_or(0);
    let mtu = kread::<u32>(dev, config!(dev_mtu)).unwrap_or(0);
    bump(
        &OVERSIZE_BY_DEV,
        &DropKey {
            reason: 0,
            // Forwarding: the egress device lives in the same namespace as the input one.
            netns,
            ifindex: egress,
            _pad: 0,
        },
    );
    if !parsed {
        return None;
    }
    let len = kread::<u32>(skb, config!(skb_len)).unwrap_or(0);
    let mut info = DropInfo {
        last_ns: now(),
        reason: config!(reason_pkt_too_big),
        count: 0,
        netns,
        ifindex: egress,
        flags: 0,
        mtu,
    };
    if packet.flow.family == AF_INET6 {
        packet_too_big_sent(packet, netns, egress, mtu);
    }
    if bump_lru(&OVERSIZE, &packet.flow, &mut info)? {
        emit(
            ctx,
            event_kind::DF_OVERSIZE,
            0,
            &packet.flow,
            netns,
            0,
            Extra {
                drop: info,
                mtu,
                len,
                ..Extra::default()
            },
        );
    }
    Some(())
}

/// IPv6 answers every packet it drops as too big (`ip6_forward`, `ip6_fragment`) with a
/// packet-too-big, sent just before the drop, and no tracepoint shows that send: the
/// drop stands for it, recorded as `icmp:icmp_send` records IPv4's frag-needed.
#[inline(never)]
fn packet_too_big_sent(packet: &Packet, netns: u32, ifindex: u32, mtu: u32) -> Option<()> {
    if in_scope(netns) {
        inc(counter::ICMP_FRAG_SENT);
    }
    note_sent(&packet.flow, (icmpv6::PKT_TOOBIG, 0), netns, ifindex, mtu)
}

/// Netfilter dropped an ICMP frag-needed / packet-too-big (`packet`): remember the flow it
/// was about (the quoted original packet), so a stalled sender can be told why PMTUD
/// failed. Out of line, see [`evidence`].
#[inline(never)]
fn frag_needed_dropped(packet: &Packet, protocol: u16, netns: u32, ifindex: u32) -> Option<()> {
    let quoted = packet.l4 + 8;
    let mut slot = MaybeUninit::uninit();
    let inner = Packet::zero_in(&mut slot);
    ip_flow(quoted, protocol, inner, true)?;
    inc(counter::ICMP_FRAG_DROPPED);
    let mut info = DropInfo {
        last_ns: now(),
        reason: config!(reason_netfilter_drop),
        count: 0,
        netns,
        ifindex,
        flags: 0,
        mtu: 0,
    };
    bump_lru(&FRAG_DROPPED, &inner.flow, &mut info).map(|_new| ())
}
