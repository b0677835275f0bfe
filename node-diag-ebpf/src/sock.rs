//! Socket hooks: `sock:inet_sock_set_state` tracks connecting sockets, and the raw
//! tracepoint `inet_sk_error_report` (raw, because the regular record carries no socket
//! pointer) judges the socket error.
//!
//! The error is read from the socket itself: `sk_err`, or `sk_err_soft` when an ICMP error
//! arrived while the connecting thread held the socket lock (the kernel then reports with
//! `sk_err` still 0). Each verdict is reported once per connecting socket.

use aya_ebpf::{
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use node_diag_common::{FlowState, IPPROTO_TCP, counter, event_kind, tcp_state};

use crate::{
    config::{config, in_scope, now},
    emit::{Extra, emit, inc, syn_drop},
    kernel::{field, kread, read_tuple, sock_netns, sock_tuple},
    maps::{CONNECTS, ICMP_SENT},
};

/// How recent a generated ICMP error must be to explain a connect failure.
const ICMP_WINDOW_NS: u64 = 3_000_000_000;

const EPIPE: i32 = 32;
const ENONET: i32 = 64;
const ENETUNREACH: i32 = 101;
const ECONNRESET: i32 = 104;
const ETIMEDOUT: i32 = 110;
const ECONNREFUSED: i32 = 111;
const EHOSTDOWN: i32 = 112;
const EHOSTUNREACH: i32 = 113;

#[tracepoint]
pub fn nd_set_state(ctx: TracePointContext) -> u32 {
    match try_set_state(&ctx) {
        Some(()) | None => 0,
    }
}

fn try_set_state(ctx: &TracePointContext) -> Option<()> {
    // Most transitions (FIN_WAIT, TIME_WAIT, ...) matter to nobody: leave first.
    let newstate = field::<i32>(ctx, config!(set_state_newstate))? as u32;
    if newstate != tcp_state::SYN_SENT
        && newstate != tcp_state::ESTABLISHED
        && newstate != tcp_state::CLOSE
    {
        return None;
    }
    if field::<u16>(ctx, config!(set_state_protocol))? != IPPROTO_TCP {
        return None;
    }
    let sk = field::<u64>(ctx, config!(set_state_skaddr))?;
    if newstate == tcp_state::SYN_SENT {
        let netns = sock_netns(sk);
        if !in_scope(netns) {
            return None;
        }
        let state = FlowState {
            start_ns: now(),
            netns,
            sport: 0,
            _pad: 0,
            syn_retrans: 0,
            reported: 0,
        };
        return CONNECTS.insert(&sk, &state, 0).ok();
    }
    if newstate == tcp_state::ESTABLISHED {
        // The connect succeeded: nothing left to diagnose, free the LRU slot. Failed
        // connects keep theirs until evicted, because the error report follows CLOSE.
        let _ = CONNECTS.remove(&sk);
        return Some(());
    }
    // CLOSE. The record still has the local port the kernel is about to release.
    if let Some(connect) = CONNECTS.get_ptr_mut(&sk) {
        let sport = field::<u16>(ctx, config!(set_state.sport))?;
        unsafe { (*connect).sport = sport };
        return Some(());
    }
    // An established connection closing on a received reset: tcp_reset() sets sk_err
    // before it closes the socket.
    if config!(btf_ok) == 0 {
        return None;
    }
    let error = kread::<i32>(sk, config!(sk_err))?;
    if error != ECONNRESET && error != EPIPE {
        return None;
    }
    let netns = sock_netns(sk);
    if !in_scope(netns) {
        return None;
    }
    let key = read_tuple(ctx, config!(set_state))?;
    inc(counter::ESTABLISHED_RESET);
    emit(
        ctx,
        event_kind::ESTABLISHED_RESET,
        error as u32,
        &key,
        netns,
        0,
        Extra::default(),
    );
    Some(())
}

#[raw_tracepoint(tracepoint = "inet_sk_error_report")]
pub fn nd_err_report(ctx: RawTracePointContext) -> i32 {
    match try_err_report(&ctx) {
        Some(()) | None => 0,
    }
}

fn try_err_report(ctx: &RawTracePointContext) -> Option<()> {
    let sk: u64 = ctx.arg(0);
    if config!(btf_ok) == 0 {
        return None;
    }
    if kread::<u16>(sk, config!(sk_protocol))? != IPPROTO_TCP {
        return None;
    }
    // Only connecting sockets (in scope by construction); resets of established
    // connections are judged at their CLOSE transition.
    let connect = CONNECTS.get_ptr_mut(&sk)?;
    let mut key = sock_tuple(sk)?;
    let mut error = match kread::<i32>(sk, config!(sk_err)) {
        Some(e) if e != 0 => e,
        _ => kread::<i32>(sk, config!(sk_err_soft)).unwrap_or(0),
    };
    if error == 0 {
        // An ICMP error that hit the socket while its owner held the lock is only stored
        // in sk_err_soft after this report; the ICMP this kernel generated names it.
        error = icmp_sent_errno(&key).unwrap_or(0);
    }
    let (kind, counter) = match error {
        ECONNREFUSED => (event_kind::CONNECT_REFUSED, counter::CONNECT_REFUSED),
        EHOSTUNREACH | ENETUNREACH | EHOSTDOWN | ENONET => (
            event_kind::CONNECT_UNREACHABLE,
            counter::CONNECT_UNREACHABLE,
        ),
        // The verdict was given at the SYN retransmit threshold; this only confirms it.
        ETIMEDOUT => (event_kind::CONNECT_GAVE_UP, u32::MAX),
        _ => return None,
    };
    let (netns, syn_retrans) = unsafe {
        let bit = 1 << kind;
        if (*connect).reported & bit != 0 {
            return None;
        }
        (*connect).reported |= bit;
        if key.sport == 0 {
            key.sport = (*connect).sport;
        }
        ((*connect).netns, (*connect).syn_retrans)
    };
    if counter != u32::MAX {
        inc(counter);
    }
    emit(
        ctx,
        kind,
        error as u32,
        &key,
        netns,
        syn_retrans,
        syn_drop(&key),
    );
    Some(())
}

/// The errno the kernel derives from an ICMP destination-unreachable code
/// (`icmp_err_convert`), for an ICMP this kernel generated for `key` just now.
#[inline(always)]
fn icmp_sent_errno(key: &node_diag_common::FlowKey) -> Option<i32> {
    let icmp = unsafe { ICMP_SENT.get(key) }?;
    if now().saturating_sub(icmp.last_ns) > ICMP_WINDOW_NS {
        return None;
    }
    match icmp.icmp_code {
        0 | 6 | 9 | 11 => Some(ENETUNREACH),
        1 | 10 | 12..=15 => Some(EHOSTUNREACH),
        3 => Some(ECONNREFUSED),
        7 => Some(EHOSTDOWN),
        8 => Some(ENONET),
        _ => None,
    }
}
