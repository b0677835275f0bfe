//! `skb:kfree_skb`: every drop aggregated by reason, netns and device; SYN drops with a
//! reason the agent asked for are remembered per flow as timeout evidence.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use node_diag_common::{DropInfo, DropKey};

use crate::maps::{
    DROPS, SYN_DROPS, TCP_FLAG_ACK, TCP_FLAG_SYN, config, field, in_scope, now, skb_dev,
    skb_tcp_flow,
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
    match DROPS.get_ptr_mut(&key) {
        Some(count) => unsafe { *count += 1 },
        None => {
            let _ = DROPS.insert(&key, &1, 0);
        }
    }
    if !flow_reason(reason) {
        return Some(());
    }
    let protocol = field::<u16>(ctx, config!(kfree_protocol))?;
    let (flow, flags) = skb_tcp_flow(skb, protocol)?;
    if flags & TCP_FLAG_SYN == 0 || flags & TCP_FLAG_ACK != 0 {
        return None;
    }
    let count = match unsafe { SYN_DROPS.get(&flow) } {
        Some(prev) => prev.count + 1,
        None => 1,
    };
    let info = DropInfo {
        last_ns: now(),
        reason,
        count,
        netns,
        ifindex,
    };
    SYN_DROPS.insert(&flow, &info, 0).ok()
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
