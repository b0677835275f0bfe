//! `tcp:*` tracepoints: SYN retransmits (timeout verdicts) and reset accounting.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use node_diag_common::{FlowState, counter, event_kind, tcp_state};

use crate::maps::{
    CONNECTS, config, emit, field, in_scope, inc, now, read_tuple, skb_dev, sock_netns,
};

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
    let sk = field::<u64>(ctx, config!(retrans_skaddr))?;
    let Some(connect) = CONNECTS.get_ptr_mut(&sk) else {
        // Connect started before the agent: track it from its first retransmit.
        let netns = sock_netns(sk);
        if !in_scope(netns) {
            return None;
        }
        inc(counter::SYN_RETRANSMITS);
        let state = FlowState {
            start_ns: now(),
            netns,
            sport: 0,
            _pad: 0,
            syn_retrans: 1,
            reported: 0,
        };
        return CONNECTS.insert(&sk, &state, 0).ok();
    };
    inc(counter::SYN_RETRANSMITS);
    let threshold = config!(syn_retrans_threshold);
    let bit = 1 << event_kind::CONNECT_TIMEOUT;
    let (retrans, netns, fire) = unsafe {
        (*connect).syn_retrans += 1;
        let fire = (*connect).syn_retrans >= threshold && (*connect).reported & bit == 0;
        if fire {
            (*connect).reported |= bit;
        }
        ((*connect).syn_retrans, (*connect).netns, fire)
    };
    if fire {
        inc(counter::CONNECT_TIMEOUT);
        let key = read_tuple(ctx, config!(retrans))?;
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

fn try_rcv_reset(ctx: &TracePointContext) -> Option<()> {
    let sk = field::<u64>(ctx, config!(rcv_reset_skaddr))?;
    if in_scope(sock_netns(sk)) {
        inc(counter::RST_RECEIVED);
    }
    Some(())
}

#[tracepoint]
pub fn nd_snd_reset(ctx: TracePointContext) -> u32 {
    match try_snd_reset(&ctx) {
        Some(()) | None => 0,
    }
}

/// Counts the reset, attributed through the socket or, for resets answering a packet no
/// socket wanted (`skaddr` is NULL), through the device of the packet being answered.
fn try_snd_reset(ctx: &TracePointContext) -> Option<()> {
    let sk = field::<u64>(ctx, config!(snd_reset_skaddr))?;
    let netns = if sk != 0 {
        sock_netns(sk)
    } else {
        skb_dev(field::<u64>(ctx, config!(snd_reset_skbaddr))?).0
    };
    if in_scope(netns) {
        inc(counter::RST_SENT);
    }
    Some(())
}
