//! Every map the programs share with the agent. Names are the statics' names, which the
//! agent looks up through the `MAP_*` constants of `node_diag_common`; sizes come from
//! there too. Hooks fill the LRU maps with per-flow evidence, `emit` reads it back when a
//! verdict goes out on [`EVENTS`].

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use node_diag_common::{
    DEV_MAP_ENTRIES, DROP_MAP_ENTRIES, DROP_REASON_SLOTS, DROP_SITE_ENTRIES, DropInfo, DropKey,
    DropSite, DropSlot, EVENTS_BYTES, FLOW_MAP_ENTRIES, FlowKey, FlowState, INBOUND_MAP_ENTRIES,
    IcmpInfo, InboundAgg, InboundKey, LINK_MAP_ENTRIES, NatInfo, POD_LINK_MAP_ENTRIES,
    RetransState, SCOPE_MAP_ENTRIES, Shot, VERDICT_MAP_ENTRIES, VerdictAgg, VerdictKey, counter,
};

#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);
#[map]
pub static CONNECTS: LruHashMap<u64, FlowState> = LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
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
pub static LINK_HDR: Array<u32> = Array::with_max_entries(LINK_MAP_ENTRIES, 0);
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);
#[map]
pub static VERDICT_AGG: HashMap<VerdictKey, VerdictAgg> =
    HashMap::with_max_entries(VERDICT_MAP_ENTRIES, 0);
#[map]
pub static POD_LINKS: HashMap<u64, u32> = HashMap::with_max_entries(POD_LINK_MAP_ENTRIES, 0);
#[map]
pub static INBOUND: HashMap<InboundKey, InboundAgg> =
    HashMap::with_max_entries(INBOUND_MAP_ENTRIES, 0);
#[map]
pub static DROP_SITES: Array<DropSite> = Array::with_max_entries(DROP_SITE_ENTRIES, 0);
#[map]
pub static SHOT: PerCpuArray<Shot> = PerCpuArray::with_max_entries(1, 0);
