//! Every map the programs share with the agent. Names are the statics' names, which the
//! agent looks up through the `MAP_*` constants of `node_diag_common`; sizes come from
//! there too. Hooks fill the LRU maps with per-flow evidence, `emit` reads it back when a
//! verdict goes out on [`EVENTS`]. A connect attempt's own state lives on its socket
//! ([`CONNECTS`], socket-local storage), reached through [`connect_of`] and
//! [`connect_begin`].

use aya_ebpf::{
    bindings::BPF_SK_STORAGE_GET_F_CREATE,
    btf_maps::SkStorage,
    helpers::generated::{bpf_sk_storage_delete, bpf_sk_storage_get},
    macros::{btf_map, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use node_diag_common::{
    DEV_MAP_ENTRIES, DROP_MAP_ENTRIES, DROP_REASON_SLOTS, DropInfo, DropKey, DropSlot,
    EVENTS_BYTES, FLOW_MAP_ENTRIES, FlowKey, FlowState, IcmpInfo, NatInfo, RetransState,
    SCOPE_MAP_ENTRIES, VERDICT_MAP_ENTRIES, VerdictAgg, VerdictKey, counter,
};

#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);
/// The connect attempt of a socket, stored on the socket itself: found without hashing,
/// never evicted by other sockets' attempts, and freed by the kernel with the socket, so
/// a failed attempt ends by marking its state idle ([`connect_end`]) instead of a delete
/// (the socket is closed soon after), and a socket reused by the allocator starts with
/// none. An established connection frees it at once ([`connect_free`]). Only BTF tracepoints reach it: the
/// helper takes the socket as a pointer the verifier knows.
#[btf_map]
pub static CONNECTS: SkStorage<FlowState> = SkStorage::new();
#[map]
pub static SYN_DROPS: LruHashMap<FlowKey, DropInfo> =
    LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static ICMP_SENT: LruHashMap<FlowKey, IcmpInfo> =
    LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static DROP_REASONS: PerCpuArray<DropSlot> =
    PerCpuArray::with_max_entries(DROP_REASON_SLOTS, 0);
#[map]
pub static DROPS: PerCpuHashMap<DropKey, u64> =
    PerCpuHashMap::with_max_entries(DROP_MAP_ENTRIES, 0);
#[map]
pub static SCOPE_GEN: Array<u64> = Array::with_max_entries(1, 0);
#[map]
pub static SCOPE_MEMO: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub static EVIDENCE_GEN: Array<u64> = Array::with_max_entries(1, 0);
#[map]
pub static OVERSIZE_BY_DEV: PerCpuHashMap<DropKey, u64> =
    PerCpuHashMap::with_max_entries(DEV_MAP_ENTRIES, 0);
#[map]
pub static OVERSIZE: LruHashMap<FlowKey, DropInfo> =
    LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static ICMP_RCVD: LruHashMap<FlowKey, IcmpInfo> =
    LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static ICMP_ERR_RCVD: LruHashMap<FlowKey, IcmpInfo> =
    LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static FRAG_DROPPED: LruHashMap<FlowKey, DropInfo> =
    LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static RETRANS: LruHashMap<u64, RetransState> =
    LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static NAT: LruHashMap<FlowKey, NatInfo> = LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static SCOPE: HashMap<u32, u32> = HashMap::with_max_entries(SCOPE_MAP_ENTRIES, 0);
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);
#[map]
pub static VERDICT_AGG: HashMap<VerdictKey, VerdictAgg> =
    HashMap::with_max_entries(VERDICT_MAP_ENTRIES, 0);

/// The storage of socket `sk`, created zeroed when `create` and it has none.
#[inline(always)]
fn connect_storage(sk: u64, create: bool) -> Option<*mut FlowState> {
    let flags = if create {
        u64::from(BPF_SK_STORAGE_GET_F_CREATE)
    } else {
        0
    };
    // SAFETY: `sk` is a BTF tracepoint's `struct sock *` argument, which the verifier
    // checks; the map pointer is the map's definition, which the loader relocates; no
    // initial value (the kernel zeroes new storage).
    let p = unsafe {
        bpf_sk_storage_get(
            (&raw const CONNECTS).cast_mut().cast(),
            sk as *mut core::ffi::c_void,
            core::ptr::null_mut(),
            flags,
        )
    };
    (!p.is_null()).then_some(p.cast())
}

/// The connect attempt in progress on socket `sk` (a BTF `struct sock *`), if any.
#[inline(always)]
pub fn connect_of(sk: u64) -> Option<*mut FlowState> {
    let p = connect_storage(sk, false)?;
    // SAFETY: the pointer comes from the map; one aligned load.
    (unsafe { core::ptr::read_volatile(&raw const (*p).start_ns) } != 0).then_some(p)
}

/// Starts socket `sk`'s attempt as `state` (whose `start_ns` is not 0), replacing whatever
/// an earlier attempt on the same socket left.
#[inline(always)]
pub fn connect_begin(sk: u64, state: &FlowState) -> Option<()> {
    let p = connect_storage(sk, true)?;
    // SAFETY: the pointer comes from the map; the socket's state changes are serialised
    // by its lock, so no other program writes it meanwhile.
    unsafe { core::ptr::write_volatile(p, *state) };
    Some(())
}

/// Ends the attempt whose state is `connect`: nothing more is reported for it.
#[inline(always)]
pub fn connect_end(connect: *mut FlowState) {
    // SAFETY: the caller's pointer comes from the map; one aligned store.
    unsafe { core::ptr::write_volatile(&raw mut (*connect).start_ns, 0) };
}

/// Frees socket `sk`'s storage: for a connection that is established, which may live for
/// days and would otherwise hold it all that time.
#[inline(always)]
pub fn connect_free(sk: u64) {
    // SAFETY: as in `connect_storage`; a socket without storage is an error return only.
    let _ = unsafe {
        bpf_sk_storage_delete(
            (&raw const CONNECTS).cast_mut().cast(),
            sk as *mut core::ffi::c_void,
        )
    };
}

/// Ends the attempt on socket `sk`, if one is in progress.
#[inline(always)]
pub fn connect_end_of(sk: u64) {
    if let Some(connect) = connect_of(sk) {
        connect_end(connect);
    }
}
