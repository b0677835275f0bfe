//! What leaves the programs: verdict events on the ring buffer (with the per-flow ICMP
//! and drop evidence the maps hold), the per-CPU counters, and the count-and-remember
//! update every per-flow evidence map shares ([`bump_lru`]).
//!
//! Verdicts are rare, so this is also where the programs log (`aya-log`), and nowhere
//! else: no log call sits on a per-packet path. Every log call is behind aya-log's
//! `AYA_LOG_LEVEL`, a read-only global the agent sets at load (`--ebpf-log`, off by
//! default), so with logging off the verifier sees each log branch as dead and prunes it.

use aya_ebpf::{
    EbpfContext,
    maps::{LruHashMap, PerCpuHashMap},
};
use aya_log_ebpf::{
    debug,
    macro_support::{Level, level_enabled},
    warn,
};
use node_diag_common::{DropInfo, DropKey, Event, FlowKey, IcmpInfo, counter, event_kind};

use crate::{
    config::now,
    maps::{COUNTERS, EVENTS, FRAG_DROPPED, ICMP_ERR_RCVD, ICMP_RCVD, ICMP_SENT, SYN_DROPS},
};

/// Adds one to a [`counter`] slot.
#[inline(always)]
pub fn inc(index: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot, so no other writer; the pointer comes from the map.
        unsafe { *p += 1 };
    }
}

/// Adds one to a per-CPU hash map counter.
#[inline(always)]
pub fn bump(map: &PerCpuHashMap<DropKey, u64>, key: &DropKey) {
    match map.get_ptr_mut(key) {
        // SAFETY: a per-CPU value, so no other writer; the pointer comes from the map.
        Some(count) => unsafe { *count += 1 },
        None => {
            let _ = map.insert(key, &1, 0);
        }
    }
}

/// Per-flow evidence that counts how often it was seen.
pub trait Counted {
    fn count(&self) -> u32;
    fn set_count(&mut self, count: u32);
}

/// Both evidence records keep their count in a `count` field.
macro_rules! counted {
    ($($info:ty),+) => {$(
        impl Counted for $info {
            #[inline(always)]
            fn count(&self) -> u32 {
                self.count
            }
            #[inline(always)]
            fn set_count(&mut self, count: u32) {
                self.count = count;
            }
        }
    )+};
}
counted!(DropInfo, IcmpInfo);

/// Stores `info` as the latest evidence for `key`, its count one more than the entry it
/// replaces (1 for a flow not seen yet, or evicted). Returns whether the flow was new;
/// `None` when the insert failed.
#[inline(always)]
pub fn bump_lru<K, V: Counted>(map: &LruHashMap<K, V>, key: &K, info: &mut V) -> Option<bool> {
    // SAFETY: the count is copied out at once; a concurrent update can only lose a count.
    let prev = unsafe { map.get(key) }.map(Counted::count);
    info.set_count(prev.map_or(1, |count| count.wrapping_add(1)));
    map.insert(key, info, 0).ok()?;
    Some(prev.is_none())
}

/// Optional extras of a verdict.
#[derive(Default)]
pub struct Extra {
    pub drop: DropInfo,
    pub mtu: u32,
    pub len: u32,
    /// [`node_diag_common::event_flag`] bits.
    pub flags: u32,
    /// Evidence last seen before this `bpf_ktime_get_ns` belongs to an earlier attempt
    /// (a reused port, a rule since removed) and is left out of the event.
    pub since: u64,
}

/// Pushes a verdict for `key`, attaching the ICMP evidence the maps hold for the flow.
/// A failed reservation is counted, never silently lost.
#[inline(always)]
pub fn emit<C: EbpfContext>(
    ctx: &C,
    kind: u32,
    error: u32,
    key: &FlowKey,
    netns: u32,
    retrans: u32,
    extra: Extra,
) {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        inc(counter::EVENTS_LOST);
        warn!(ctx, "event ring buffer full: verdict {} lost", kind);
        return;
    };
    let since = extra.since;
    // Frag-needed received or dropped only explains MTU verdicts; connect verdicts carry
    // the ICMP error that answered the SYN, if one came back.
    let mtu_verdict = kind == event_kind::DF_OVERSIZE
        || kind == event_kind::PMTUD_STALL
        || kind == event_kind::TCP_STALL;
    let received = if mtu_verdict {
        &ICMP_RCVD
    } else {
        &ICMP_ERR_RCVD
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at the reserved record, written field by field in place (an
    // `Event` built on the stack first would not fit the programs' 512-byte stack); map
    // values are copied out at once.
    unsafe {
        (*ev).ts_ns = now();
        (*ev).kind = kind;
        (*ev).error = error;
        (*ev).flow = *key;
        (*ev).netns = netns;
        (*ev).retrans = retrans;
        (*ev).drop = extra.drop;
        (*ev).icmp = recent_icmp(ICMP_SENT.get(key), since);
        (*ev).icmp_rcvd = recent_icmp(received.get(key), since);
        (*ev).frag_dropped = if mtu_verdict {
            recent_drop(FRAG_DROPPED.get(key), since)
        } else {
            DropInfo::default()
        };
        (*ev).mtu = extra.mtu;
        (*ev).len = extra.len;
        (*ev).flags = extra.flags;
        (*ev)._pad = 0;
    }
    entry.submit(0);
    // Checked here too, so that with logging off even the call is dead code.
    if level_enabled(Level::Debug) {
        log_verdict(ctx, kind, error, key, netns);
    }
}

/// Logs an emitted verdict. Out of line: the log record is built on its own stack frame,
/// which the largest programs (kfree_skb) have no room for.
#[inline(never)]
fn log_verdict<C: EbpfContext>(ctx: &C, kind: u32, error: u32, key: &FlowKey, netns: u32) {
    debug!(
        ctx,
        "verdict {} error {} family {} sport {} dport {} netns {}",
        kind,
        error,
        key.family,
        key.sport,
        key.dport,
        netns
    );
}

/// The SYN drop recorded for a connecting flow since its attempt began at `since`, as
/// verdict evidence.
#[inline(always)]
pub fn syn_drop(key: &FlowKey, since: u64) -> Extra {
    Extra {
        // SAFETY: the value is copied out at once.
        drop: recent_drop(unsafe { SYN_DROPS.get(key) }, since),
        since,
        ..Extra::default()
    }
}

/// `info` when it was last seen at or after `since`, else nothing.
#[inline(always)]
pub fn recent_drop(info: Option<&DropInfo>, since: u64) -> DropInfo {
    match info {
        Some(i) if i.last_ns >= since => *i,
        _ => DropInfo::default(),
    }
}

/// `info` when it was last seen at or after `since`, else nothing.
#[inline(always)]
pub fn recent_icmp(info: Option<&IcmpInfo>, since: u64) -> IcmpInfo {
    match info {
        Some(i) if i.last_ns >= since => *i,
        _ => IcmpInfo::default(),
    }
}
