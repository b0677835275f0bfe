//! Maps, the load-time configuration and the small readers every hook shares.

use aya_ebpf::{
    Global,
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::TracePointContext,
};
use node_diag_common::{
    AF_INET, AF_INET6, Config, DROP_MAP_ENTRIES, DropInfo, DropKey, EVENTS_BYTES, Event,
    FLOW_MAP_ENTRIES, FlowKey, FlowState, IcmpInfo, RetransState, SCOPE_MAP_ENTRIES, TupleOffsets,
    counter, event_kind,
};

#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

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
pub static DROPS: PerCpuHashMap<DropKey, u64> =
    PerCpuHashMap::with_max_entries(DROP_MAP_ENTRIES, 0);
#[map]
pub static OVERSIZE_BY_DEV: PerCpuHashMap<DropKey, u64> =
    PerCpuHashMap::with_max_entries(DROP_MAP_ENTRIES, 0);
#[map]
pub static OVERSIZE: LruHashMap<FlowKey, DropInfo> =
    LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static ICMP_RCVD: LruHashMap<FlowKey, IcmpInfo> =
    LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static FRAG_DROPPED: LruHashMap<FlowKey, DropInfo> =
    LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static RETRANS: LruHashMap<u64, RetransState> =
    LruHashMap::with_max_entries(FLOW_MAP_ENTRIES, 0);
#[map]
pub static L3_OFFSET: HashMap<u32, u32> = HashMap::with_max_entries(SCOPE_MAP_ENTRIES, 0);
#[map]
pub static SCOPE: HashMap<u32, u32> = HashMap::with_max_entries(SCOPE_MAP_ENTRIES, 0);
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Reads one field of [`CONFIG`] without copying the whole struct onto the 512-byte stack.
macro_rules! config {
    ($($field:tt)+) => {
        // SAFETY: CONFIG is a repr(transparent) Global<Config>, always initialised.
        unsafe { core::ptr::read_volatile(&raw const (*$crate::maps::config_ptr()).$($field)+) }
    };
}
pub(crate) use config;

#[inline(always)]
pub fn config_ptr() -> *const Config {
    (&raw const CONFIG).cast()
}

#[inline(always)]
pub fn now() -> u64 {
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub fn inc(index: u32) {
    if let Some(p) = COUNTERS.get_ptr_mut(index) {
        // Per-CPU slot: no other writer.
        unsafe { *p += 1 };
    }
}

/// Whether this node reports for `netns` (unknown namespaces, 0, are never filtered out).
#[inline(always)]
pub fn in_scope(netns: u32) -> bool {
    netns == 0 || config!(scope_enabled) == 0 || SCOPE.get_ptr(&netns).is_some()
}

#[inline(always)]
pub fn field<T>(ctx: &TracePointContext, offset: u16) -> Option<T> {
    unsafe { ctx.read_at::<T>(offset as usize) }.ok()
}

#[inline(always)]
pub fn kread<T>(base: u64, offset: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T) }.ok()
}

/// The flow tuple of a sock-based tracepoint record (local end first).
#[inline(always)]
pub fn read_tuple(ctx: &TracePointContext, o: TupleOffsets) -> Option<FlowKey> {
    let mut key = FlowKey {
        saddr: [0; 16],
        daddr: [0; 16],
        sport: field(ctx, o.sport)?,
        dport: field(ctx, o.dport)?,
        family: field(ctx, o.family)?,
        _pad: 0,
    };
    if key.family == AF_INET {
        let s: [u8; 4] = field(ctx, o.saddr)?;
        let d: [u8; 4] = field(ctx, o.daddr)?;
        set_v4(&mut key.saddr, s);
        set_v4(&mut key.daddr, d);
    } else if key.family == AF_INET6 {
        key.saddr = field(ctx, o.saddr_v6)?;
        key.daddr = field(ctx, o.daddr_v6)?;
    } else {
        return None;
    }
    Some(key)
}

#[inline(always)]
pub fn set_v4(dst: &mut [u8; 16], v4: [u8; 4]) {
    dst[0] = v4[0];
    dst[1] = v4[1];
    dst[2] = v4[2];
    dst[3] = v4[3];
}

/// The flow tuple of a `struct sock *` (local end first), read at the BTF offsets.
#[inline(always)]
pub fn sock_tuple(sk: u64) -> Option<FlowKey> {
    let mut key = FlowKey {
        saddr: [0; 16],
        daddr: [0; 16],
        sport: kread::<u16>(sk, config!(sk_num))?,
        dport: u16::from_be(kread::<u16>(sk, config!(sk_dport))?),
        family: kread::<u16>(sk, config!(sk_family))?,
        _pad: 0,
    };
    if key.family == AF_INET {
        set_v4(&mut key.saddr, kread::<[u8; 4]>(sk, config!(sk_saddr))?);
        set_v4(&mut key.daddr, kread::<[u8; 4]>(sk, config!(sk_daddr))?);
    } else if key.family == AF_INET6 && config!(sk_v6_daddr) != 0 {
        key.saddr = kread::<[u8; 16]>(sk, config!(sk_v6_saddr))?;
        key.daddr = kread::<[u8; 16]>(sk, config!(sk_v6_daddr))?;
    } else {
        return None;
    }
    Some(key)
}

/// Network namespace inode of a `struct net *`.
#[inline(always)]
fn net_inum(net: u64) -> u32 {
    kread::<u32>(net, config!(net_inum)).unwrap_or(0)
}

/// Network namespace inode of a `struct sock *` (0 when BTF offsets are unknown).
#[inline(always)]
pub fn sock_netns(sk: u64) -> u32 {
    if config!(btf_ok) == 0 {
        return 0;
    }
    kread::<u64>(sk, config!(sk_net)).map_or(0, net_inum)
}

/// `(netns inode, ifindex)` of the device an skb is on, zeros when unknown. A locally
/// generated packet before its output hook has no device yet: its route's device says
/// where it is.
#[inline(always)]
pub fn skb_dev(skb: u64) -> (u32, u32) {
    if config!(btf_ok) == 0 {
        return (0, 0);
    }
    let mut dev = kread::<u64>(skb, config!(skb_dev)).unwrap_or(0);
    if dev == 0 {
        dev = kread::<u64>(skb, config!(skb_refdst))
            .filter(|d| *d & !1 != 0)
            .and_then(|d| kread::<u64>(d & !1, config!(dst_dev)))
            .unwrap_or(0);
    }
    if dev == 0 {
        return (0, 0);
    }
    let ifindex = kread::<u32>(dev, config!(dev_ifindex)).unwrap_or(0);
    let netns = kread::<u64>(dev, config!(dev_net)).map_or(0, net_inum);
    (netns, ifindex)
}

pub const TCP_FLAG_SYN: u8 = 0x02;
pub const TCP_FLAG_ACK: u8 = 0x10;
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_ICMPV6: u8 = 58;

/// What [`skb_flow`] found at the network header of an skb.
pub struct Packet {
    /// Sender first; ports only for TCP/UDP.
    pub flow: FlowKey,
    pub l4proto: u8,
    /// TCP flags, or the ICMP type.
    pub flags: u8,
    /// ICMP code (0 otherwise).
    pub code: u8,
    /// Address of the transport header.
    pub l4: u64,
}

/// Parses the IP header (and ports) at the skb's network header. IPv6 extension headers
/// are not walked.
#[inline(always)]
pub fn skb_flow(skb: u64, protocol: u16) -> Option<Packet> {
    if config!(btf_ok) == 0 {
        return None;
    }
    let head = kread::<u64>(skb, config!(skb_head))?;
    let nh = kread::<u16>(skb, config!(skb_network_header))?;
    if nh == 0xffff {
        return None;
    }
    ip_flow(head + nh as u64, protocol)
}

/// Parses an IPv4/IPv6 header at kernel address `ip`.
#[inline(always)]
pub fn ip_flow(ip: u64, protocol: u16) -> Option<Packet> {
    let mut flow = FlowKey::default();
    let (l4, l4proto) = if protocol == ETH_P_IP {
        let ver_ihl = kread::<u8>(ip, 0)?;
        if ver_ihl >> 4 != 4 {
            return None;
        }
        flow.family = AF_INET;
        set_v4(&mut flow.saddr, kread::<[u8; 4]>(ip, 12)?);
        set_v4(&mut flow.daddr, kread::<[u8; 4]>(ip, 16)?);
        (ip + ((ver_ihl & 0x0f) as u64) * 4, kread::<u8>(ip, 9)?)
    } else if protocol == ETH_P_IPV6 {
        flow.family = AF_INET6;
        flow.saddr = kread::<[u8; 16]>(ip, 8)?;
        flow.daddr = kread::<[u8; 16]>(ip, 24)?;
        (ip + 40, kread::<u8>(ip, 6)?)
    } else {
        return None;
    };
    let (mut flags, mut code) = (0, 0);
    if l4proto == IPPROTO_TCP || l4proto == IPPROTO_UDP {
        flow.sport = u16::from_be(kread::<u16>(l4, 0)?);
        flow.dport = u16::from_be(kread::<u16>(l4, 2)?);
        if l4proto == IPPROTO_TCP {
            flags = kread::<u8>(l4, 13)?;
        }
    } else if l4proto == IPPROTO_ICMP || l4proto == IPPROTO_ICMPV6 {
        flags = kread::<u8>(l4, 0)?;
        code = kread::<u8>(l4, 1)?;
    }
    Some(Packet {
        flow,
        l4proto,
        flags,
        code,
        l4,
    })
}

/// The TCP flow of a packet (sender first) and its TCP flags.
#[inline(always)]
pub fn skb_tcp_flow(skb: u64, protocol: u16) -> Option<(FlowKey, u8)> {
    let p = skb_flow(skb, protocol)?;
    (p.l4proto == IPPROTO_TCP).then_some((p.flow, p.flags))
}

/// Whether an ICMP(v6) type/code is "fragmentation needed" / "packet too big".
#[inline(always)]
pub fn is_frag_needed(l4proto: u8, icmp_type: u8, code: u8) -> bool {
    (l4proto == IPPROTO_ICMP && icmp_type == 3 && code == 4)
        || (l4proto == IPPROTO_ICMPV6 && icmp_type == 2)
}

/// Optional extras of a verdict.
#[derive(Default)]
pub struct Extra {
    pub drop: DropInfo,
    pub mtu: u32,
    pub len: u32,
}

/// Pushes a verdict for `key`, attaching the ICMP evidence the maps hold for the flow.
/// A failed reservation is counted, never silently lost.
#[inline(always)]
pub fn emit(kind: u32, error: u32, key: &FlowKey, netns: u32, retrans: u32, extra: Extra) {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        inc(counter::EVENTS_LOST);
        return;
    };
    let icmp = unsafe { ICMP_SENT.get(key) }.copied().unwrap_or_default();
    // Frag-needed received or dropped only explains MTU verdicts.
    let mtu_verdict = kind == event_kind::DF_OVERSIZE || kind == event_kind::PMTUD_STALL;
    let (icmp_rcvd, frag_dropped) = if mtu_verdict {
        (
            unsafe { ICMP_RCVD.get(key) }.copied().unwrap_or_default(),
            unsafe { FRAG_DROPPED.get(key) }
                .copied()
                .unwrap_or_default(),
        )
    } else {
        (IcmpInfo::default(), DropInfo::default())
    };
    entry.write(Event {
        ts_ns: now(),
        kind,
        error,
        flow: *key,
        netns,
        retrans,
        drop: extra.drop,
        icmp,
        icmp_rcvd,
        frag_dropped,
        mtu: extra.mtu,
        len: extra.len,
    });
    entry.submit(0);
}

/// The SYN drop recorded for a connecting flow, as verdict evidence.
#[inline(always)]
pub fn syn_drop(key: &FlowKey) -> Extra {
    Extra {
        drop: unsafe { SYN_DROPS.get(key) }.copied().unwrap_or_default(),
        ..Extra::default()
    }
}

/// Adds one to a per-CPU hash map counter.
#[inline(always)]
pub fn bump(map: &PerCpuHashMap<DropKey, u64>, key: &DropKey) {
    match map.get_ptr_mut(key) {
        Some(count) => unsafe { *count += 1 },
        None => {
            let _ = map.insert(key, &1, 0);
        }
    }
}
