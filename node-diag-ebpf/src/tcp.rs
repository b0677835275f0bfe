//! TCP hooks: the BTF tracepoint `tcp_retransmit_skb` counts SYN retransmits (timeout
//! verdicts) and repeated data retransmits (stalls, PMTUD black holes); the raw
//! tracepoints `tcp_receive_reset` and `tcp_send_reset` count resets and mark a connect
//! that got one.

use aya_ebpf::{
    macros::{btf_tracepoint, raw_tracepoint},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use node_diag_common::{
    AF_INET6, DropInfo, FlowKey, FlowState, RETRANS_REPORTED_PMTUD, RETRANS_REPORTED_STALL,
    RetransState, counter, event_kind, flow_flag, ipproto, stall, tcp_state,
};

use crate::{
    config::{config, imm, in_scope, now},
    emit::{Extra, emit, evidence_gen, inc, recent_drop, recent_icmp, syn_drop},
    kernel::{
        btf_read, btf_read_at, kread, skb_dev_raw, sock_netns, sock_tuple, tcp_sock_read,
        tcp_sock_read_as,
    },
    maps::{FRAG_DROPPED, ICMP_RCVD, ICMP_SENT, OVERSIZE, RETRANS},
    packet::is_frag_needed,
    sock::{live_connect, start_connect},
};

/// How long before a stall's first retransmit MTU evidence still explains it: the
/// oversize drop or frag-needed of a black hole comes with the segment's first
/// transmission, one RTO before its first retransmit.
const STALL_EVIDENCE_NS: u64 = 10_000_000_000;

/// A BTF tracepoint, `tcp_retransmit_skb(sk, skb[, err])` (positions checked in BTF by
/// the agent): the socket's state and RTO count, which decide whether there is anything
/// to do, are plain loads, at offsets that are immediates ([`imm!`]): the hook runs a few
/// hundred times a second at most, cold, and the global's two cache lines were most of
/// what a run cost (in the bench's clean overlay transfer about 430 ns net per run with
/// them, 220 without, alternating runs).
#[btf_tracepoint(function = "tcp_retransmit_skb")]
pub fn nd_retransmit(ctx: BtfTracePointContext) -> i32 {
    match try_retransmit(&ctx) {
        Some(()) | None => 0,
    }
}

fn try_retransmit(ctx: &BtfTracePointContext) -> Option<()> {
    let sk: u64 = ctx.arg(0);
    let state = btf_read_at::<u8>(sk, imm!(SK_STATE)) as u32;
    if state == tcp_state::SYN_SENT {
        return syn_retransmit(ctx, sk);
    }
    // A retransmit the local stack could not send (queue full, TSQ) is retried as is
    // and says nothing about the path. Kernels without the argument trace only sent ones.
    if imm!(RETRANS_ERR_ARG) != 0 && ctx.arg::<u64>(2) as i32 != 0 {
        return None;
    }
    // Loss recovery (fast retransmits, RACK, tail loss probes) runs with the socket's
    // RTO count at 0: most retransmits of a lossy but working path leave here.
    let rto_count = tcp_sock_read_as::<u8>(sk, imm!(CAST_TCP_SOCK), imm!(TCP_RTO_COUNT))?;
    if rto_count == 0 {
        return None;
    }
    data_retransmit(ctx, sk, u32::from(rto_count))
}

/// A connecting socket's SYN retransmit: counted, and the connect reported as timing out
/// at the threshold.
///
/// This and [`data_retransmit`] are out of line (BPF-to-BPF calls, which the kernel
/// compiles as functions of their own): the program itself is then the few instructions
/// that most runs execute, in one or two cache lines. The hook fires a few hundred times
/// a second at most, so a run mostly starts with its code out of the caches, and each
/// further line of code it passes through is another miss (inlined, the early exits
/// jumped to the end of a 16 KB program: in the bench's clean transfer that cost about
/// 45 ns more per run, 200 against 155 as measured, in three profiles each).
#[inline(never)]
fn syn_retransmit(ctx: &BtfTracePointContext, sk: u64) -> Option<()> {
    let Some(connect) = live_connect(sk) else {
        // Connect started before the agent: track it from its first retransmit.
        let netns = sock_netns(sk);
        if !in_scope(netns) {
            return None;
        }
        inc(counter::SYN_RETRANSMITS);
        let evidence_gen = evidence_gen();
        let state = FlowState {
            start_ns: now(),
            netns,
            sport: 0,
            flags: 0,
            syn_retrans: 1,
            reported: 0,
            evidence_gen,
        };
        return start_connect(sk, &state);
    };
    inc(counter::SYN_RETRANSMITS);
    let threshold = config!(syn_retrans_threshold);
    let bit = 1 << event_kind::CONNECT_TIMEOUT;
    let (retrans, netns, since, fire) = unsafe {
        (*connect).syn_retrans += 1;
        let fire = (*connect).syn_retrans >= threshold && (*connect).reported & bit == 0;
        if fire {
            (*connect).reported |= bit;
        }
        (
            (*connect).syn_retrans,
            (*connect).netns,
            (*connect).start_ns,
            fire,
        )
    };
    if fire {
        inc(counter::CONNECT_TIMEOUT);
        // Probe reads: `sk` has served as a map key (see `sock::try_err_report`).
        let key = sock_tuple(sk)?;
        emit(
            ctx,
            event_kind::CONNECT_TIMEOUT,
            0,
            &key,
            netns,
            retrans,
            syn_drop(&key, since),
        );
    }
    Some(())
}

/// Tracks repeated retransmits of one data segment. A sender whose segment gets no answer
/// retransmits that one segment (the head of its retransmit queue) again and again on its
/// backed-off RTO; loss recovery under congestion retransmits different segments, or
/// bursts of them, and moves on. So only repeats of one segment count.
///
/// A stall is a PMTUD black hole only when the repeated segment is full-size and MTU
/// evidence exists for the flow. Any other repeat is a plain stall: the head segment of a
/// peer that went silent is often shorter than the MSS (the tail of a partial write),
/// and a black hole passes short segments.
///
/// Only the retransmits of a retransmission timeout count: a segment that keeps getting
/// no answer is retried on the timer, each time with the socket's RTO count raised
/// first, which the caller has checked (`rto_count`). A stall that began before the
/// programs were loaded is tracked from its next retransmit with the repeats that RTO
/// count says it has had, so an agent restarted during a black hole judges it at once.
/// Out of line, see [`syn_retransmit`].
#[inline(never)]
fn data_retransmit(ctx: &BtfTracePointContext, sk: u64, rto_count: u32) -> Option<()> {
    let skb: u64 = ctx.arg(1);
    // The write-queue skb holds payload only, possibly several MSS when segmentation is
    // offloaded; at least one MSS is a full-size segment.
    let len: u32 = btf_read(skb, config!(skb_len));
    let mss = tcp_sock_read::<u32>(sk, config!(tcp_mss_cache))?;
    // After a timeout the sender is down to one segment per retransmit; several at once
    // (a GSO burst) is loss recovery with a window, not a stall.
    if len == 0 || len >= 2 * mss {
        return None;
    }
    let full_size = len >= mss;
    // `cb` is a byte array the verifier lets a plain load read a u32 of (it is meant as
    // scratch space); kept to the kernels with the casts (6.2+), where that is tested,
    // and a probe read before.
    let seq = if config!(cast_tcp_sock) != 0 {
        btf_read::<u32>(skb, config!(skb_cb))
    } else {
        kread::<u32>(skb, config!(skb_cb))?
    };
    let now = now();
    let threshold = config!(fullsize_retrans_threshold);
    let Some(state) = RETRANS.get_ptr_mut(&sk) else {
        let netns = sock_netns(sk);
        if !in_scope(netns) {
            return None;
        }
        if full_size {
            inc(counter::FULLSIZE_RETRANSMITS);
        }
        let entry = RetransState {
            first_ns: now,
            last_ns: now,
            // Probe reads: `sk` has served as a map key (see `sock::try_err_report`).
            flow: sock_tuple(sk)?,
            repeats: if rto_count > 1 { rto_count } else { 1 },
            reported: 0,
            netns,
            seq,
            len,
            _pad: 0,
        };
        RETRANS.insert(&sk, &entry, 0).ok()?;
        if entry.repeats < threshold {
            return Some(());
        }
        let state = RETRANS.get_ptr_mut(&sk)?;
        return judge_stall(ctx, state, entry.repeats, full_size, len, mss);
    };
    // SAFETY: the entry belongs to this socket, whose retransmits the kernel serialises
    // under the socket lock; the values are copied out at once.
    let (repeats, reported, shrunk) = unsafe {
        let shrunk = (*state).seq == seq && len < (*state).len;
        if shrunk {
            // The segment is retried smaller: the MSS shrank (a frag-needed took
            // effect, or the kernel's MTU probing gave up on the size), that stall is
            // over. Reported below when nothing on the path had said why.
            let before = (
                (*state).repeats,
                (*state).reported,
                (*state).len,
                (*state).first_ns,
            );
            (*state).repeats = 1;
            (*state).reported = 0;
            (*state).first_ns = now;
            (*state).len = len;
            (*state).last_ns = now;
            (1, before.1, Some(before))
        } else {
            if (*state).seq == seq {
                (*state).repeats += 1;
            } else {
                (*state).seq = seq;
                (*state).repeats = 1;
                (*state).reported = 0;
                (*state).first_ns = now;
            }
            (*state).len = len;
            (*state).last_ns = now;
            ((*state).repeats, (*state).reported, None)
        }
    };
    if let Some((stalled, was_reported, before_len, since)) = shrunk
        && stalled >= 2
        && was_reported != RETRANS_REPORTED_PMTUD
    {
        // SAFETY: as above.
        let (flow, netns) = unsafe { ((*state).flow, (*state).netns) };
        emit(
            ctx,
            event_kind::MSS_SHRUNK,
            0,
            &flow,
            netns,
            stalled,
            Extra {
                mtu: mss,
                len: before_len,
                since,
                ..Extra::default()
            },
        );
        return Some(());
    }
    if full_size {
        inc(counter::FULLSIZE_RETRANSMITS);
    }
    if repeats < threshold || reported == RETRANS_REPORTED_PMTUD {
        return Some(());
    }
    judge_stall(ctx, state, repeats, full_size, len, mss)
}

/// Reports a stall of `repeats` retransmits of a `len`-byte segment (the socket's MSS
/// `mss`): a PMTUD black hole with MTU evidence the segment still exceeds, else a plain
/// stall (once).
#[inline(always)]
fn judge_stall(
    ctx: &BtfTracePointContext,
    state: *mut RetransState,
    repeats: u32,
    full_size: bool,
    len: u32,
    mss: u32,
) -> Option<()> {
    // SAFETY: as in the caller; the values are copied out at once.
    let (netns, flow, first_ns, reported) = unsafe {
        (
            (*state).netns,
            (*state).flow,
            (*state).first_ns,
            (*state).reported,
        )
    };
    // A stall is a black hole only with evidence that size is the problem; a peer that
    // went silent (a dead node, a drop rule, an idle timeout) stalls the same way.
    let since = first_ns.saturating_sub(STALL_EVIDENCE_NS);
    // The smallest packet the segment makes (IP and TCP headers without options): once
    // it fits what a drop or a frag-needed said, PMTUD has worked for this flow and the
    // stall is not that MTU's.
    let packet = stall::smallest_packet(flow.family, len);
    let exceeds = |mtu: u32| stall::exceeds(packet, mtu);
    let (pmtud, oversize) = if full_size {
        // SAFETY: the value is copied out at once.
        let oversize = recent_drop(unsafe { OVERSIZE.get(&flow) }, since);
        let oversize = if exceeds(oversize.mtu) {
            oversize
        } else {
            DropInfo::default()
        };
        (
            oversize.count > 0 || has_frag_needed(&flow, since, packet),
            oversize,
        )
    } else {
        (false, Default::default())
    };
    let (kind, mark) = if pmtud {
        (event_kind::PMTUD_STALL, RETRANS_REPORTED_PMTUD)
    } else if reported == 0 {
        (event_kind::TCP_STALL, RETRANS_REPORTED_STALL)
    } else {
        // Already reported as a plain stall, and still no MTU evidence.
        return Some(());
    };
    // SAFETY: as above.
    unsafe { (*state).reported = mark };
    emit(
        ctx,
        kind,
        0,
        &flow,
        netns,
        repeats,
        Extra {
            drop: oversize,
            mtu: mss,
            len,
            since,
            ..Extra::default()
        },
    );
    Some(())
}

/// Whether frag-needed / packet-too-big was generated, dropped or received for `flow`
/// since `since`, announcing an MTU a `packet`-byte packet exceeds (one dropped here
/// never reached the sender, so it counts whatever it announced).
#[inline(always)]
fn has_frag_needed(flow: &FlowKey, since: u64, packet: u32) -> bool {
    // SAFETY (all map reads): values are copied out at once.
    let sent = recent_icmp(unsafe { ICMP_SENT.get(flow) }, since);
    let rcvd = recent_icmp(unsafe { ICMP_RCVD.get(flow) }, since);
    let exceeds = |mtu: u32| stall::exceeds(packet, mtu);
    // IPv4's from icmp:icmp_send; IPv6's packet-too-big recorded with the oversize drop
    // it answers (ICMPv6 has no such tracepoint).
    let proto = if flow.family == AF_INET6 {
        ipproto::ICMPV6
    } else {
        ipproto::ICMP
    };
    (sent.count > 0
        && is_frag_needed(proto, sent.icmp_type as u8, sent.icmp_code as u8)
        && exceeds(sent.mtu))
        || (rcvd.count > 0 && exceeds(rcvd.mtu))
        || recent_drop(unsafe { FRAG_DROPPED.get(flow) }, since).count > 0
}

/// `tcp_receive_reset(sk)`, raw: the socket is the argument.
#[raw_tracepoint(tracepoint = "tcp_receive_reset")]
pub fn nd_rcv_reset(ctx: RawTracePointContext) -> i32 {
    match try_rcv_reset(&ctx) {
        Some(()) | None => 0,
    }
}

fn try_rcv_reset(ctx: &RawTracePointContext) -> Option<()> {
    let sk: u64 = ctx.arg(0);
    // A connecting socket's RST is what makes a refusal the listener's: an ICMP error
    // refuses a connect the same way (ECONNREFUSED) without one.
    if let Some(connect) = live_connect(sk) {
        // SAFETY: the pointer comes from the map; a racing writer can only lose the bit.
        // An entry exists only for a socket in scope, so its namespace need not be read.
        unsafe { (*connect).flags |= flow_flag::RST_RECEIVED };
        inc(counter::RST_RECEIVED);
        return Some(());
    }
    if in_scope(sock_netns(sk)) {
        inc(counter::RST_RECEIVED);
    }
    Some(())
}

/// `tcp_send_reset(sk, skb[, reason])`, raw.
#[raw_tracepoint(tracepoint = "tcp_send_reset")]
pub fn nd_snd_reset(ctx: RawTracePointContext) -> i32 {
    match try_snd_reset(&ctx) {
        Some(()) | None => 0,
    }
}

/// Counts the reset, attributed through the socket or, for resets answering a packet no
/// socket wanted (`sk` is NULL), through the device of the packet being answered.
fn try_snd_reset(ctx: &RawTracePointContext) -> Option<()> {
    let sk: u64 = ctx.arg(0);
    let netns = if sk != 0 {
        sock_netns(sk)
    } else {
        skb_dev_raw(ctx.arg(1)).0
    };
    if in_scope(netns) {
        inc(counter::RST_SENT);
    }
    Some(())
}
