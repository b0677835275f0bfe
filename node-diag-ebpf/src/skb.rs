//! `skb:kfree_skb` (raw): every drop aggregated by reason, netns and device; SYN drops
//! with a reason the agent asked for are remembered per flow as timeout evidence, DF
//! packets too big for their route and frag-needed dropped by netfilter as MTU evidence.
//! A SYN from elsewhere on its way to a pod of this node that a filter here dropped is
//! counted per client, pod and port in `INBOUND`, its first drop announced.
//!
//! Kernels before 5.17 give `kfree_skb` no reason: there `nd_kfree_site` reads the drop's
//! location instead (the return address into the function that dropped), looks it up
//! among the functions the agent resolved at load time ([`DROP_SITES`]) and goes on with
//! the reason that function stands for, through the same paths. Drops by other eBPF
//! programs (tc, `cgroup_skb`) are told apart there with the `shot` module's marks.

use core::mem::MaybeUninit;

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use node_diag_common::{
    AF_INET6, DROP_REASON_SLOTS, DROP_SITE_ENTRIES, DROP_SITE_UNKNOWN, DropInfo, DropKey,
    InboundAgg, InboundKey, counter, drop_flag, event_kind, icmpv6, ipproto, pod_link,
};

use crate::{
    config::{config, in_scope, in_scope_cached, now},
    emit::{Extra, add_one, bump, bump_lru, emit, emit_inbound, inc, note_evidence},
    flow::reverse,
    icmp::note_sent,
    kernel::{btf_read, kread, skb_dev_btf},
    maps::{
        DROP_REASONS, DROP_SITES, DROPS, FRAG_DROPPED, ICMP_SENT, INBOUND, OVERSIZE,
        OVERSIZE_BY_DEV, POD_LINKS, SYN_DROPS,
    },
    nat::nat_join,
    packet::{Packet, TCP_FLAG_ACK, TCP_FLAG_SYN, ip_flow, is_frag_needed},
    shot::condemned,
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
    dropped(ctx, ctx.arg(0), ctx.arg::<u64>(2) as u32)
}

/// `kfree_skb(skb, location)` on kernels without drop reasons: the reason is that of the
/// function the location falls in (see the module's note), else `NOT_SPECIFIED`'s.
/// Both are the agent's numbering ([`DROP_SITES`]).
#[btf_tracepoint(function = "kfree_skb")]
pub fn nd_kfree_site(ctx: BtfTracePointContext) -> i32 {
    // The site is resolved out of line and the skb read again after it, so that this
    // frame holds no more than `nd_kfree_skb`'s: before 6.13 the deepest path's frames
    // (this one, `evidence`, `oversize`, ...) share 512 bytes, and one more spilled
    // register here rounds this frame up by 32.
    let reason = site_reason(&ctx);
    match dropped(&ctx, ctx.arg(0), reason) {
        Some(()) | None => 0,
    }
}

/// The reason of the [`DROP_SITES`] entry whose function holds the drop's location;
/// `ip_forward` and `ip6_forward` drop for other causes too (hop limit, policy), so
/// there only a packet longer than its route's MTU is the too-big drop, and the sites of
/// other eBPF programs' drops need the packet marked by `shot`.
#[inline(never)]
fn site_reason(ctx: &BtfTracePointContext) -> u32 {
    let location: u64 = ctx.arg(1);
    let mut reason = DROP_SITE_UNKNOWN;
    for i in 0..DROP_SITE_ENTRIES {
        let Some(site) = DROP_SITES.get(i) else {
            break;
        };
        if site.end == 0 {
            break;
        }
        if location >= site.start && location < site.end {
            // A site that also drops for other causes stands for its reason only for
            // the packet another eBPF program just condemned (see `shot`).
            if site.needs == 0 || condemned(ctx.arg(0), site.needs) {
                reason = site.reason;
            }
            break;
        }
    }
    if reason == config!(reason_pkt_too_big) && !longer_than_route(ctx.arg(0)) {
        return DROP_SITE_UNKNOWN;
    }
    reason
}

/// Whether `skb` is longer than its route's device MTU (its route already attached).
#[inline(always)]
fn longer_than_route(skb: u64) -> bool {
    let mtu = kread::<u64>(skb, config!(skb_refdst))
        .and_then(|dst| kread::<u64>(dst & !1, config!(dst_dev)))
        .and_then(|dev| kread::<u32>(dev, config!(dev_mtu)));
    let len = kread::<u32>(skb, config!(skb_len));
    matches!((len, mtu), (Some(len), Some(mtu)) if mtu != 0 && len > mtu)
}

#[inline(always)]
fn dropped(ctx: &BtfTracePointContext, skb: u64, reason: u32) -> Option<()> {
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
        // Before `syn_dropped`, which turns `p` around and into the NAT's original flow.
        if p.flags & TCP_FLAG_ACK == 0 && firewall_reason(reason) {
            inbound(ctx, skb, p, reason, netns, ifindex);
        }
        syn_dropped(skb, p, reason, netns, ifindex);
    }
    Some(())
}

/// How long after this node sent an ICMP error for a SYN its drop still counts as that
/// REJECT's: the error goes out just before the drop, in the same hook, and a
/// rate-limited error is not sent at all (the retransmits of one attempt keep their
/// port, so the first SYN's error still tells).
const REJECT_WINDOW_NS: u64 = 1_000_000_000;

/// A SYN (no ACK) dropped by a filter (`reason`) in namespace `netns`, which came in on
/// device `ifindex`: when its route leaves by a pod's veth ([`POD_LINKS`]) and it did
/// not come from one, it is a client elsewhere connecting to a pod of this node, counted
/// in [`INBOUND`]; the key's first drop sends an event. A SYN sent from this node (no
/// device before its output hook, or leaving by the one it is on) or by one of its pods
/// is left to that connect's own verdict. Out of line, see [`evidence`].
#[inline(never)]
fn inbound(
    ctx: &BtfTracePointContext,
    skb: u64,
    p: &Packet,
    reason: u32,
    netns: u32,
    ifindex: u32,
) -> Option<()> {
    let dev: u64 = btf_read(skb, config!(skb_dev));
    if dev == 0 || netns == 0 {
        return None;
    }
    let refdst = btf_read::<u64>(skb, config!(skb_refdst)) & !1;
    let out_dev = kread::<u64>(refdst, config!(dst_dev))?;
    let out = kread::<u32>(out_dev, config!(dev_ifindex))?;
    if out == ifindex {
        return None;
    }
    // SAFETY: the value is copied out at once.
    let pod_netns = unsafe { *POD_LINKS.get(&pod_link::key(netns, out))? };
    if POD_LINKS.get_ptr(&pod_link::key(netns, ifindex)).is_some() {
        return None;
    }
    let key = InboundKey {
        saddr: p.flow.saddr,
        daddr: p.flow.daddr,
        netns: pod_netns,
        reason,
        dport: p.flow.dport,
        family: p.flow.family,
        _pad: 0,
    };
    let now_ns = now();
    if let Some(agg) = INBOUND.get_ptr_mut(&key) {
        // SAFETY: the pointer comes from the map; the count is added atomically, the
        // timestamp is one aligned store.
        unsafe {
            add_one(&raw mut (*agg).count);
            core::ptr::write_volatile(&raw mut (*agg).last_ns, now_ns);
        }
        return Some(());
    }
    // SAFETY: the value is copied out at once.
    let (icmp_type, icmp_code) = match unsafe { ICMP_SENT.get(&p.flow) } {
        Some(i) if now_ns.saturating_sub(i.last_ns) < REJECT_WINDOW_NS => {
            (i.icmp_type as u16, i.icmp_code as u16)
        }
        _ => (0, 0),
    };
    let fresh = InboundAgg {
        first_ns: now_ns,
        last_ns: now_ns,
        count: 1,
        drop_netns: netns,
        ifindex,
        pod_ifindex: out,
        icmp_type,
        icmp_code,
    };
    if INBOUND.insert(&key, &fresh, BPF_NOEXIST).is_ok() {
        emit_inbound(ctx, &p.flow, pod_netns, reason, &fresh);
        return Some(());
    }
    match INBOUND.get_ptr_mut(&key) {
        // Another CPU made the entry first: this drop only counts.
        // SAFETY: as above.
        Some(agg) => unsafe { add_one(&raw mut (*agg).count) },
        // The map is full: the drop is lost to the agent, and counted so.
        None => inc(counter::EVENTS_LOST),
    }
    Some(())
}

/// `BPF_NOEXIST`: create the entry only if no other CPU just did.
const BPF_NOEXIST: u64 = 1;

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

/// Whether `reason` is a filter's ([`node_diag_common::Config::firewall_reasons`]).
#[inline(always)]
fn firewall_reason(reason: u32) -> bool {
    if reason >= 256 {
        return false;
    }
    let word = match reason / 64 {
        0 => config!(firewall_reasons[0]),
        1 => config!(firewall_reasons[1]),
        2 => config!(firewall_reasons[2]),
        _ => config!(firewall_reasons[3]),
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
