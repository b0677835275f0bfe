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
    helpers::bpf_get_smp_processor_id,
    maps::{LruHashMap, PerCpuHashMap},
};
use aya_log_ebpf::{
    debug,
    macro_support::{Level, level_enabled},
    warn,
};
use node_diag_common::{
    DropInfo, DropKey, Event, FlowKey, IcmpInfo, InboundAgg, VerdictAgg, VerdictKey, WINDOW_ALL,
    aggregated_kind, counter, drop_flag, event_flag, event_kind, icmp_key, verdict_class,
};

use crate::{
    config::{config, now},
    maps::{
        COUNTERS, EVENTS, EVIDENCE_GEN, FRAG_DROPPED, ICMP_ERR_RCVD, ICMP_RCVD, ICMP_SENT,
        SYN_DROPS, VERDICT_AGG,
    },
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

/// The current evidence generation (see [`note_evidence`]).
#[inline(always)]
pub fn evidence_gen() -> u64 {
    match EVIDENCE_GEN.get_ptr(0) {
        // SAFETY: the pointer comes from the map; one aligned load.
        Some(p) => unsafe { core::ptr::read_volatile(p) },
        None => 0,
    }
}

/// Announces evidence a connect verdict reads (a SYN drop, an ICMP error sent or
/// received), before it is written: a connect that began under the generation still
/// current when its verdict is given has none of its own, and skips the lookups (the
/// refused storm's path). Called only where such evidence is recorded, which is rare
/// next to connects.
#[inline(always)]
pub fn note_evidence() {
    if let Some(p) = EVIDENCE_GEN.get_ptr_mut(0) {
        // SAFETY: the pointer comes from the map, 8-aligned; every CPU adds atomically
        // (see `count_one`).
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
                p, 1,
            );
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
    store_lru(map, key, prev, info)
}

/// [`bump_lru`] for a caller that has looked the entry up already: `prev` is its count.
#[inline(always)]
pub fn store_lru<K, V: Counted>(
    map: &LruHashMap<K, V>,
    key: &K,
    prev: Option<u32>,
    info: &mut V,
) -> Option<bool> {
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
    /// No connect evidence was recorded since `since` (the evidence generation did not
    /// move): the ICMP lookups are skipped.
    pub quiet: bool,
}

/// What [`aggregate`] decided for a verdict.
enum Aggregated {
    /// Counted in its key's entry: no event.
    Counted,
    /// An event goes out for the key's entry (created when the key was new).
    Emit(*mut VerdictAgg),
    /// Not aggregated (another kind, or the map is full): one event for one verdict.
    Plain,
}

/// `BPF_NOEXIST`: create the entry only if no other CPU just did.
const BPF_NOEXIST: u64 = 1;

/// Finds (or creates) the aggregation entry of `vkey` and decides whether the verdict
/// only counts there: when an event for the key went out less than
/// `Config::verdict_window_ns` ago.
#[inline(always)]
fn aggregate(vkey: &VerdictKey, now_ns: u64) -> Aggregated {
    let agg = match VERDICT_AGG.get_ptr_mut(vkey) {
        Some(agg) => agg,
        None => {
            // Stamped, so the agent can tell an entry whose first event was lost is idle.
            let fresh = VerdictAgg {
                last_ns: now_ns,
                ..VerdictAgg::default()
            };
            let _ = VERDICT_AGG.insert(vkey, &fresh, BPF_NOEXIST);
            match VERDICT_AGG.get_ptr_mut(vkey) {
                Some(agg) => agg,
                None => return Aggregated::Plain,
            }
        }
    };
    // SAFETY: the pointer comes from the map. The key holds this CPU, so the entry is
    // this CPU's alone; a program that interrupts this one here (a softirq's classifier)
    // can at worst send an event too, each carrying the count it read, and never lose a
    // count (added atomically).
    let window = config!(verdict_window_ns);
    unsafe {
        if (*agg).emitted != 0 && now_ns.wrapping_sub((*agg).last_emit_ns) < window {
            count_one(agg);
            core::ptr::write_volatile(&raw mut (*agg).last_ns, now_ns);
            return Aggregated::Counted;
        }
    }
    Aggregated::Emit(agg)
}

/// Adds one to the entry's count, atomically: a program interrupting another on the same
/// CPU may count into the same entry. Uncontended, as no other CPU writes it.
#[inline(always)]
unsafe fn count_one(agg: *mut VerdictAgg) {
    // SAFETY: the caller's pointer comes from the map.
    unsafe { add_one(&raw mut (*agg).count) }
}

/// Adds one to a `u64` in a map value, atomically.
///
/// # Safety
/// `count` points into a map value, 8-aligned (every `u64` of a map value is).
#[inline(always)]
pub unsafe fn add_one(count: *mut u64) {
    // SAFETY: see above. The result is unused, so this is a plain BPF atomic add (no
    // BPF_FETCH needed): `core`'s atomic types have no read-modify-write methods on the
    // BPF target.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            count, 1,
        );
    }
}

/// Announces a new inbound SYN drop key (`agg` its fresh entry, `flow` the dropped SYN's,
/// `pod_netns` the pod's namespace): one event, the key's later drops only counted. A
/// failed reservation is counted lost; the agent still finds the key in the map.
#[inline(always)]
pub fn emit_inbound<C: EbpfContext>(
    ctx: &C,
    flow: &FlowKey,
    pod_netns: u32,
    reason: u32,
    agg: &InboundAgg,
) {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        inc(counter::EVENTS_LOST);
        warn!(ctx, "event ring buffer full: inbound SYN drop lost");
        return;
    };
    let ev = entry.as_mut_ptr();
    let rejected = agg.icmp_type != 0;
    // SAFETY: `ev` points at the reserved record, written field by field in place (see
    // `emit`).
    unsafe {
        (*ev).ts_ns = now();
        (*ev).kind = event_kind::INBOUND_SYN_DROPPED;
        (*ev).error = 0;
        (*ev).flow = *flow;
        (*ev).netns = pod_netns;
        (*ev).retrans = 0;
        (*ev).drop = DropInfo {
            last_ns: agg.first_ns,
            reason,
            count: 1,
            netns: agg.drop_netns,
            ifindex: agg.ifindex,
            flags: 0,
            mtu: 0,
        };
        (*ev).icmp = IcmpInfo {
            last_ns: if rejected { agg.first_ns } else { 0 },
            icmp_type: agg.icmp_type as u32,
            icmp_code: agg.icmp_code as u32,
            netns: if rejected { agg.drop_netns } else { 0 },
            ifindex: 0,
            mtu: 0,
            count: rejected as u32,
            from: [0; 16],
        };
        (*ev).icmp_rcvd = IcmpInfo::default();
        (*ev).frag_dropped = DropInfo::default();
        (*ev).mtu = 0;
        (*ev).len = agg.pod_ifindex;
        (*ev).flags = 0;
        (*ev).class = 0;
        (*ev).count = 1;
        (*ev).icmp_key = 0;
        (*ev).cpu = 0;
        (*ev).window_ms = WINDOW_ALL;
        (*ev)._pad = 0;
    }
    entry.submit(0);
    inc(counter::EVENTS_SENT);
}

/// Pushes a verdict for `key`, attaching the ICMP evidence the maps hold for the flow.
/// A failed reservation is counted, never silently lost.
///
/// Connect verdicts that come in storms ([`aggregated_kind`]) are aggregated by
/// [`VerdictKey`] (which holds the CPU): one event per key per window, carrying the
/// key's count; the rest
/// are only counted in [`VERDICT_AGG`]. A verdict whose event cannot be reserved is
/// counted lost and not in the key's count, so it is accounted exactly once.
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
    let mut class = 0u16;
    let mut icmp = 0u32;
    let mut agg = Aggregated::Plain;
    let mut cpu = 0;
    let quiet = extra.quiet && !mtu_verdict;
    // A verdict superseding a timeout is rare and the agent must see each one to withdraw
    // the timeout: never aggregated.
    if aggregated_kind(kind) && extra.flags & event_flag::AFTER_TIMEOUT == 0 {
        // SAFETY: only the timestamps, types and codes are read, at once.
        let (sent, rcvd) = if quiet {
            ((0, 0, false), (0, 0, false))
        } else {
            unsafe {
                (
                    recent_kind(ICMP_SENT.get(key), since),
                    recent_kind(received.get(key), since),
                )
            }
        };
        icmp = icmp_key(sent.0, sent.1, rcvd.0, rcvd.1);
        if extra.flags & event_flag::RST_RECEIVED != 0 {
            class |= verdict_class::RST_RECEIVED;
        }
        if sent.2 {
            class |= verdict_class::ICMP_SENT;
        }
        if rcvd.2 {
            class |= verdict_class::ICMP_RCVD;
        }
        if extra.drop.flags & drop_flag::SYN_ACK != 0 {
            class |= verdict_class::SYN_ACK_DROP;
        }
        // SAFETY: a helper without arguments; the program cannot migrate while it runs.
        cpu = unsafe { bpf_get_smp_processor_id() };
        let vkey = VerdictKey {
            saddr: key.saddr,
            daddr: key.daddr,
            netns,
            drop_reason: extra.drop.reason,
            dport: key.dport,
            family: key.family,
            kind: kind as u16,
            class,
            icmp,
            cpu,
        };
        agg = aggregate(&vkey, now());
        if let Aggregated::Counted = agg {
            return;
        }
    }
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        inc(counter::EVENTS_LOST);
        warn!(ctx, "event ring buffer full: verdict {} lost", kind);
        return;
    };
    let ts = now();
    let count = match agg {
        // SAFETY: the pointer comes from the map; see `aggregate` for the races.
        Aggregated::Emit(agg) => unsafe {
            count_one(agg);
            if (*agg).first_ns == 0 {
                (*agg).first_ns = ts;
            }
            (*agg).last_emit_ns = ts;
            (*agg).last_ns = ts;
            (*agg).emitted += 1;
            core::ptr::read_volatile(&raw const (*agg).count)
        },
        _ => 0,
    };
    let ev = entry.as_mut_ptr();
    // SAFETY: `ev` points at the reserved record, written field by field in place (an
    // `Event` built on the stack first would not fit the programs' 512-byte stack); map
    // values are copied out at once.
    unsafe {
        (*ev).ts_ns = ts;
        (*ev).kind = kind;
        (*ev).error = error;
        (*ev).flow = *key;
        (*ev).netns = netns;
        (*ev).retrans = retrans;
        (*ev).drop = extra.drop;
        if quiet {
            (*ev).icmp = IcmpInfo::default();
            (*ev).icmp_rcvd = IcmpInfo::default();
        } else {
            (*ev).icmp = recent_icmp(ICMP_SENT.get(key), since);
            (*ev).icmp_rcvd = recent_icmp(received.get(key), since);
        }
        (*ev).frag_dropped = if mtu_verdict {
            recent_drop(FRAG_DROPPED.get(key), since)
        } else {
            DropInfo::default()
        };
        (*ev).mtu = extra.mtu;
        (*ev).len = extra.len;
        (*ev).flags = extra.flags;
        (*ev).class = class as u32;
        (*ev).count = count;
        (*ev).icmp_key = icmp;
        (*ev).cpu = cpu;
        (*ev).window_ms = window_ms(ts, since);
        (*ev)._pad = 0;
    }
    entry.submit(0);
    inc(counter::EVENTS_SENT);
    // Checked here too, so that with logging off even the call is dead code.
    if level_enabled(Level::Debug) {
        log_verdict(ctx, kind, error, key, netns);
    }
}

/// [`Event::window_ms`]: how long before `ts` the evidence window that began at `since`
/// did, in milliseconds ([`WINDOW_ALL`] when it has no beginning).
#[inline(always)]
fn window_ms(ts: u64, since: u64) -> u32 {
    if since == 0 {
        return WINDOW_ALL;
    }
    let ms = ts.saturating_sub(since) / 1_000_000;
    if ms >= WINDOW_ALL as u64 {
        WINDOW_ALL - 1
    } else {
        ms as u32
    }
}

/// The type and code of an ICMP error last seen at or after `since`, and whether there
/// is one.
#[inline(always)]
fn recent_kind(info: Option<&IcmpInfo>, since: u64) -> (u32, u32, bool) {
    match info {
        Some(i) if i.last_ns >= since => (i.icmp_type, i.icmp_code, true),
        _ => (0, 0, false),
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

/// [`syn_drop`] for a connect that began at `since` under evidence generation
/// `generation`: when no evidence was recorded since, nothing is looked up.
#[inline(always)]
pub fn connect_evidence(key: &FlowKey, since: u64, generation: u64) -> Extra {
    if evidence_gen() == generation {
        return Extra {
            since,
            quiet: true,
            ..Extra::default()
        };
    }
    syn_drop(key, since)
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
