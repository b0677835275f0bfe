//! `tcp:*` tracepoints: SYN retransmits (timeout verdicts) and reset accounting.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use node_diag_common::{FlowState, counter, event_kind, tcp_state};

use crate::maps::{FLOWS, config, emit, field, inc, now, read_tuple, sock_netns};

#[tracepoint]
pub fn nd_retransmit(ctx: TracePointContext) -> u32 {
    match try_retransmit(&ctx) {
        Some(()) | None => 0,
    }
}

fn try_retransmit(ctx: &TracePointContext) -> Option<()> {
    if field::<i32>(ctx, config!(retrans_state))? as u32 != tcp_state::SYN_SENT {
        return None;
    }
    inc(counter::SYN_RETRANSMITS);
    let key = read_tuple(ctx, config!(retrans))?;
    let Some(flow) = FLOWS.get_ptr_mut(&key) else {
        // Connect started before the agent: track it from its first retransmit.
        let sk = field::<u64>(ctx, config!(retrans_skaddr))?;
        let state = FlowState {
            start_ns: now(),
            netns: sock_netns(sk),
            state: tcp_state::SYN_SENT,
            syn_retrans: 1,
            reported: 0,
        };
        return FLOWS.insert(&key, &state, 0).ok();
    };
    let threshold = config!(syn_retrans_threshold);
    let bit = 1 << event_kind::CONNECT_TIMEOUT;
    let (retrans, netns, fire) = unsafe {
        (*flow).syn_retrans += 1;
        let fire = (*flow).syn_retrans >= threshold && (*flow).reported & bit == 0;
        if fire {
            (*flow).reported |= bit;
        }
        ((*flow).syn_retrans, (*flow).netns, fire)
    };
    if fire {
        inc(counter::CONNECT_TIMEOUT);
        emit(event_kind::CONNECT_TIMEOUT, 0, &key, netns, retrans);
    }
    Some(())
}

#[tracepoint]
pub fn nd_rcv_reset(ctx: TracePointContext) -> u32 {
    match try_rcv_reset(&ctx) {
        Some(()) | None => 0,
    }
}

/// Counts the reset and makes sure the error report that follows it in `tcp_reset()`
/// finds the socket's netns.
fn try_rcv_reset(ctx: &TracePointContext) -> Option<()> {
    inc(counter::RST_RECEIVED);
    let key = read_tuple(ctx, config!(rcv_reset))?;
    if FLOWS.get_ptr(&key).is_some() {
        return Some(());
    }
    let sk = field::<u64>(ctx, config!(rcv_reset_skaddr))?;
    let state = FlowState {
        start_ns: now(),
        netns: sock_netns(sk),
        state: tcp_state::ESTABLISHED,
        syn_retrans: 0,
        reported: 0,
    };
    FLOWS.insert(&key, &state, 0).ok()
}

#[tracepoint]
pub fn nd_snd_reset(_ctx: TracePointContext) -> u32 {
    inc(counter::RST_SENT);
    0
}
