//! `skb:kfree_skb`: every drop aggregated by reason, netns and device; SYN drops with a
//! reason the agent asked for are remembered per flow as timeout evidence.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use node_diag_common::{DropInfo, DropKey, counter, drop_flag, event_kind};

use crate::{
    config::{config, in_scope, now},
    emit::{Extra, bump, bump_lru, emit, inc},
    kernel::{field, kread, skb_dev},
    maps::{DROPS, FRAG_DROPPED, OVERSIZE, OVERSIZE_BY_DEV, SYN_DROPS},
    nat::nat_join,
    packet::{
        IPPROTO_TCP, Packet, TCP_FLAG_ACK, TCP_FLAG_SYN, ip_flow, is_frag_needed, reverse, skb_flow,
    },
};

#[tracepoint]
pub fn nd_kfree_skb(ctx: TracePointContext) -> u32 {
    match try_kfree_skb(&ctx) {
        Some(()) | None => 0,
    }
}

fn try_kfree_skb(ctx: &TracePointContext) -> Option<()> {
    let reason = field::<u32>(ctx, config!(kfree_reason))?;
    let skb = field::<u64>(ctx, config!(kfree_skbaddr))?;
    let (netns, ifindex) = skb_dev(skb);
    if !in_scope(netns) {
        return None;
    }
    let key = DropKey {
        reason,
        netns,
        ifindex,
        _pad: 0,
    };
    bump(&DROPS, &key);
    let protocol = field::<u16>(ctx, config!(kfree_protocol))?;
    if reason == config!(reason_pkt_too_big) {
        oversize(ctx, skb, protocol, netns);
    } else if reason == config!(reason_netfilter_drop) {
        frag_needed_dropped(skb, protocol, netns, ifindex);
    }
    if flow_reason(reason) {
        syn_dropped(skb, protocol, reason, netns, ifindex);
    }
    Some(())
}

/// A SYN (or SYN-ACK) dropped for a reason the agent asked for: remembered under the
/// connecting side's flow as timeout evidence.
///
/// This and the other per-reason paths are out of line (BPF-to-BPF calls) so that the
/// program's own frame stays small: the verifier adds the caller's frame to the deepest
/// callee's, and before Linux 6.13 (no private stacks) the sum must fit in 512 bytes.
#[inline(never)]
fn syn_dropped(skb: u64, protocol: u16, reason: u32, netns: u32, ifindex: u32) -> Option<()> {
    let mut p = Packet::default();
    skb_flow(skb, protocol, &mut p)?;
    if p.l4proto != IPPROTO_TCP || p.flags & TCP_FLAG_SYN == 0 {
        return None;
    }
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
    let mut info = DropInfo {
        last_ns: now(),
        reason,
        count: 0,
        netns,
        ifindex,
        flags: drop_flags,
        _pad: 0,
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
/// Out of line (see [`syn_dropped`]): the event it builds needs its own stack frame, and
/// only drops with this one reason pay for the call.
#[inline(never)]
fn oversize(ctx: &TracePointContext, skb: u64, protocol: u16, netns: u32) -> Option<()> {
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
    let mut packet = Packet::default();
    skb_flow(skb, protocol, &mut packet)?;
    let len = kread::<u32>(skb, config!(skb_len)).unwrap_or(0);
    let mut info = DropInfo {
        last_ns: now(),
        reason: config!(reason_pkt_too_big),
        count: 0,
        netns,
        ifindex: egress,
        flags: 0,
        _pad: 0,
    };
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

/// Netfilter dropped an ICMP frag-needed / packet-too-big: remember the flow it was about
/// (the quoted original packet), so a stalled sender can be told why PMTUD failed.
/// Out of line, see [`syn_dropped`].
#[inline(never)]
fn frag_needed_dropped(skb: u64, protocol: u16, netns: u32, ifindex: u32) -> Option<()> {
    let mut packet = Packet::default();
    skb_flow(skb, protocol, &mut packet)?;
    if !is_frag_needed(packet.l4proto, packet.flags, packet.code) {
        return None;
    }
    let quoted = packet.l4 + 8;
    let mut inner = Packet::default();
    ip_flow(quoted, protocol, &mut inner)?;
    inc(counter::ICMP_FRAG_DROPPED);
    let mut info = DropInfo {
        last_ns: now(),
        reason: config!(reason_netfilter_drop),
        count: 0,
        netns,
        ifindex,
        flags: 0,
        _pad: 0,
    };
    bump_lru(&FRAG_DROPPED, &inner.flow, &mut info).map(|_new| ())
}
