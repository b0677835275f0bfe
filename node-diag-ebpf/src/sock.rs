//! `sock:*` tracepoints: connection phase tracking and socket errors.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use node_diag_common::{FlowState, IPPROTO_TCP, counter, event_kind, tcp_state};

use crate::maps::{FLOWS, config, emit, field, in_scope, inc, now, read_tuple, scoped, sock_netns};

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
    if field::<u16>(ctx, config!(set_state_protocol))? != IPPROTO_TCP {
        return None;
    }
    let newstate = field::<i32>(ctx, config!(set_state_newstate))? as u32;
    if newstate != tcp_state::SYN_SENT && newstate != tcp_state::ESTABLISHED {
        return None;
    }
    let key = read_tuple(ctx, config!(set_state))?;
    if newstate == tcp_state::ESTABLISHED {
        // The connect succeeded: nothing left to diagnose, free the LRU slot.
        let _ = FLOWS.remove(&key);
        return Some(());
    }
    let sk = field::<u64>(ctx, config!(set_state_skaddr))?;
    let netns = sock_netns(sk);
    if !in_scope(netns) {
        return None;
    }
    let state = FlowState {
        start_ns: now(),
        netns,
        state: tcp_state::SYN_SENT,
        syn_retrans: 0,
        reported: 0,
    };
    FLOWS.insert(&key, &state, 0).ok()
}

#[tracepoint]
pub fn nd_err_report(ctx: TracePointContext) -> u32 {
    match try_err_report(&ctx) {
        Some(()) | None => 0,
    }
}

fn try_err_report(ctx: &TracePointContext) -> Option<()> {
    if field::<u16>(ctx, config!(err_report_protocol))? != IPPROTO_TCP {
        return None;
    }
    let error = field::<i32>(ctx, config!(err_report_error))?;
    let key = read_tuple(ctx, config!(err_report))?;
    let flow = FLOWS.get_ptr_mut(&key);
    // In-scope sockets always have an entry (made at SYN_SENT or at the received reset);
    // without one the socket belongs to a namespace of another node.
    if flow.is_none() && scoped() {
        return None;
    }
    let connecting = match flow {
        Some(f) => (unsafe { (*f).state }) == tcp_state::SYN_SENT,
        None => false,
    };
    let (kind, counter) = match error {
        ECONNREFUSED => (event_kind::CONNECT_REFUSED, counter::CONNECT_REFUSED),
        ECONNRESET | EPIPE => (event_kind::ESTABLISHED_RESET, counter::ESTABLISHED_RESET),
        EHOSTUNREACH | ENETUNREACH | EHOSTDOWN | ENONET => (
            event_kind::CONNECT_UNREACHABLE,
            counter::CONNECT_UNREACHABLE,
        ),
        // The verdict was given at the SYN retransmit threshold; this only confirms it.
        ETIMEDOUT if connecting => (event_kind::CONNECT_GAVE_UP, u32::MAX),
        _ => return None,
    };
    if counter != u32::MAX {
        inc(counter);
    }
    let (netns, syn_retrans) = match flow {
        Some(f) => unsafe {
            (*f).reported |= 1 << kind;
            ((*f).netns, (*f).syn_retrans)
        },
        None => (0, 0),
    };
    emit(kind, error as u32, &key, netns, syn_retrans);
    Some(())
}
