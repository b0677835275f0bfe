//! The agent's view of the kernel maps it polls: per-CPU counters and drop aggregates
//! (summed over CPUs, still keyed by the kernel's numbers: naming them is the findings
//! layer's job), the socket map of full-size retransmitters (which flows are black-holed
//! now), the inbound SYN drops aggregated per client, pod and port, and the maps the
//! agent writes (the netns scope and its generation, the pods' veths).

use std::{
    collections::{BTreeSet, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsFd, AsRawFd},
};

use aya::{
    Ebpf,
    maps::{
        Array, HashMap as BpfHashMap, IterableMap, Map, MapData, MapError, PerCpuArray,
        PerCpuHashMap, RingBuf,
    },
};
use node_diag_common::{
    AF_INET, DROP_REASON_SLOTS, DropInfo, DropKey, DropSlot, FlowKey, IcmpInfo, InboundAgg,
    InboundKey, MAP_COUNTERS, MAP_DROP_REASONS, MAP_DROPS, MAP_EVENTS, MAP_FRAG_DROPPED,
    MAP_ICMP_RCVD, MAP_ICMP_SENT, MAP_INBOUND, MAP_NAT, MAP_OVERSIZE, MAP_OVERSIZE_BY_DEV,
    MAP_POD_LINKS, MAP_RETRANS, MAP_SCOPE, MAP_SCOPE_GEN, MAP_SYN_DROPS, MAP_VERDICT_AGG, NatInfo,
    RETRANS_REPORTED_PMTUD, RetransState, SCOPE_MAP_ENTRIES, VerdictAgg, VerdictKey, counter,
    pod_link, scope_value,
};
use tracing::{debug, info, warn};

/// A flow the kernel reported as a PMTUD black hole (see [`KernelMaps::reported_blackholes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReportedBlackhole {
    pub(crate) flow: FlowKey,
    pub(crate) netns: u32,
    /// Since its last retransmit.
    pub(crate) quiet_ns: u64,
}

/// At most this many namespaces are marked out of scope at once: a quarter of the scope
/// map, the rest kept for this node's pods.
const SCOPE_OUT_MAX: usize = SCOPE_MAP_ENTRIES as usize / 4;

/// `BPF_EXIST`: update an element only if it is still there.
const BPF_EXIST: u64 = 2;

#[derive(Debug, thiserror::Error)]
#[error("eBPF map {name} is missing or has the wrong type: {reason}")]
pub(crate) struct MapMissing {
    name: &'static str,
    reason: String,
}

/// The kernel's counters summed over CPUs, keyed by the kernel's own numbers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct KernelCounts {
    /// Indexed by `node_diag_common::counter`.
    pub(crate) counters: [u64; counter::COUNT as usize],
    /// Drops by `skb_drop_reason` value.
    pub(crate) drops: HashMap<u32, u64>,
    /// DF oversize drops by egress `(netns, ifindex)`.
    pub(crate) oversize: HashMap<(u32, u32), u64>,
}

impl KernelCounts {
    /// The counter `index` (one of `node_diag_common::counter`).
    pub(crate) fn get(&self, index: u32) -> u64 {
        self.counters.get(index as usize).copied().unwrap_or(0)
    }
}

pub(crate) struct KernelMaps {
    counters: PerCpuArray<MapData, u64>,
    drop_reasons: PerCpuArray<MapData, DropSlot>,
    /// How many of `drop_reasons`' slots this kernel's reasons can fill (see
    /// [`crate::kernel::tracefs::DropReasons::slots`]): a read every 500 ms skips the
    /// rest.
    reason_slots: u32,
    /// Possible CPUs (the per-CPU maps' value count), when known: the per-CPU maps are
    /// then read in batches, until the kernel refuses one (before 5.6), after which they
    /// are read entry by entry.
    batch_cpus: std::cell::Cell<Option<usize>>,
    drops: PerCpuHashMap<MapData, DropKey, u64>,
    oversize_by_dev: PerCpuHashMap<MapData, DropKey, u64>,
    retrans: BpfHashMap<MapData, u64, RetransState>,
    /// A flow's MTU evidence, for a stall the programs judged before it arrived.
    evidence: FlowEvidenceMaps,
    nat: BpfHashMap<MapData, FlowKey, NatInfo>,
    syn_drops: BpfHashMap<MapData, FlowKey, DropInfo>,
    verdict_agg: BpfHashMap<MapData, VerdictKey, VerdictAgg>,
    scope: BpfHashMap<MapData, u32, u32>,
    scope_gen: Array<MapData, u64>,
    /// The pods' veths in the agent's namespace, for the inbound drops.
    pod_links: BpfHashMap<MapData, u64, u32>,
    /// What the agent last wrote to `scope` and `pod_links`, which the programs only
    /// read: a refresh writes the difference, not every entry (a churning node refreshes
    /// several times a second, and 110 pods made that hundreds of syscalls each time).
    /// `None` until the first write, which reads the map.
    scope_written: Option<BTreeSet<u32>>,
    /// The namespaces written as [`scope_value::OUT`]: looked at and not this node's.
    scope_out: BTreeSet<u32>,
    pod_links_written: Option<HashMap<u64, u32>>,
    inbound: BpfHashMap<MapData, InboundKey, InboundAgg>,
}

/// The per-flow evidence maps the programs fill.
struct FlowEvidenceMaps {
    oversize: BpfHashMap<MapData, FlowKey, DropInfo>,
    icmp_sent: BpfHashMap<MapData, FlowKey, IcmpInfo>,
    icmp_rcvd: BpfHashMap<MapData, FlowKey, IcmpInfo>,
    frag_dropped: BpfHashMap<MapData, FlowKey, DropInfo>,
}

/// A flow's MTU evidence as the programs recorded it (entries last seen before the
/// window asked for are left out, as zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FlowEvidence {
    pub(crate) oversize: DropInfo,
    pub(crate) icmp_sent: IcmpInfo,
    pub(crate) icmp_rcvd: IcmpInfo,
    pub(crate) frag_dropped: DropInfo,
}

fn take<M>(
    ebpf: &mut Ebpf,
    name: &'static str,
    conv: impl FnOnce(Map) -> Result<M, MapError>,
) -> Result<M, MapMissing> {
    let map = ebpf.take_map(name).ok_or_else(|| MapMissing {
        name,
        reason: "not in the object".into(),
    })?;
    conv(map).map_err(|e| MapMissing {
        name,
        reason: e.to_string(),
    })
}

impl KernelMaps {
    /// Takes the ring buffer and the polled maps out of the loaded object; `reason_slots`
    /// of the drop-reason array are read.
    pub(crate) fn take(
        ebpf: &mut Ebpf,
        reason_slots: u32,
    ) -> Result<(RingBuf<MapData>, Self), MapMissing> {
        Ok((
            take(ebpf, MAP_EVENTS, RingBuf::try_from)?,
            Self {
                counters: take(ebpf, MAP_COUNTERS, PerCpuArray::try_from)?,
                drop_reasons: take(ebpf, MAP_DROP_REASONS, PerCpuArray::try_from)?,
                reason_slots: reason_slots.min(DROP_REASON_SLOTS),
                batch_cpus: std::cell::Cell::new(aya::util::nr_cpus().ok()),
                drops: take(ebpf, MAP_DROPS, PerCpuHashMap::try_from)?,
                oversize_by_dev: take(ebpf, MAP_OVERSIZE_BY_DEV, PerCpuHashMap::try_from)?,
                retrans: take(ebpf, MAP_RETRANS, BpfHashMap::try_from)?,
                evidence: FlowEvidenceMaps {
                    oversize: take(ebpf, MAP_OVERSIZE, BpfHashMap::try_from)?,
                    icmp_sent: take(ebpf, MAP_ICMP_SENT, BpfHashMap::try_from)?,
                    icmp_rcvd: take(ebpf, MAP_ICMP_RCVD, BpfHashMap::try_from)?,
                    frag_dropped: take(ebpf, MAP_FRAG_DROPPED, BpfHashMap::try_from)?,
                },
                nat: take(ebpf, MAP_NAT, BpfHashMap::try_from)?,
                syn_drops: take(ebpf, MAP_SYN_DROPS, BpfHashMap::try_from)?,
                verdict_agg: take(ebpf, MAP_VERDICT_AGG, BpfHashMap::try_from)?,
                scope: take(ebpf, MAP_SCOPE, BpfHashMap::try_from)?,
                scope_gen: take(ebpf, MAP_SCOPE_GEN, Array::try_from)?,
                pod_links: take(ebpf, MAP_POD_LINKS, BpfHashMap::try_from)?,
                scope_written: None,
                scope_out: BTreeSet::new(),
                pod_links_written: None,
                inbound: take(ebpf, MAP_INBOUND, BpfHashMap::try_from)?,
            },
        ))
    }

    /// The kernel's counters, each summed over CPUs: in batches (a few syscalls a tick
    /// for every per-CPU map), else entry by entry.
    pub(crate) fn counts(&self) -> KernelCounts {
        if let Some(cpus) = self.batch_cpus.get() {
            match self.counts_batched(cpus) {
                Ok(counts) => return counts,
                Err(e) => {
                    tracing::info!(error = %e, "per-CPU maps read entry by entry: this kernel has no batch lookups for them");
                    self.batch_cpus.set(None);
                }
            }
        }
        self.counts_by_entry()
    }

    fn counts_batched(&self, cpus: usize) -> std::io::Result<KernelCounts> {
        use super::batch::lookup_percpu;
        let total = |v: &[u64]| v.iter().sum::<u64>();
        let mut counts = KernelCounts::default();
        let fd = self.counters.map().fd().as_fd();
        for (idx, n) in lookup_percpu::<u32, u64, u64>(fd, cpus, counter::COUNT as usize, total)? {
            if let Some(c) = counts.counters.get_mut(idx as usize) {
                *c = n;
            }
        }
        let fd = self.drop_reasons.map().fd().as_fd();
        let slots =
            lookup_percpu::<u32, DropSlot, u64>(fd, cpus, self.reason_slots as usize, |v| {
                v.iter().map(|slot| slot.count).sum()
            })?;
        counts
            .drops
            .extend(slots.into_iter().filter(|(_, n)| *n > 0));
        let fd = self.drops.map().fd().as_fd();
        for (key, n) in lookup_percpu::<DropKey, u64, u64>(fd, cpus, usize::MAX, total)? {
            *counts.drops.entry(key.reason).or_default() += n;
        }
        let fd = self.oversize_by_dev.map().fd().as_fd();
        for (key, n) in lookup_percpu::<DropKey, u64, u64>(fd, cpus, usize::MAX, total)? {
            *counts.oversize.entry((key.netns, key.ifindex)).or_default() += n;
        }
        Ok(counts)
    }

    fn counts_by_entry(&self) -> KernelCounts {
        let get = |idx: u32| -> u64 {
            self.counters
                .get(&idx, 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        let mut counts = KernelCounts {
            counters: std::array::from_fn(|idx| get(idx as u32)),
            ..KernelCounts::default()
        };
        for reason in 0..self.reason_slots {
            let count: u64 = self
                .drop_reasons
                .get(&reason, 0)
                .map(|slots| slots.iter().map(|slot| slot.count).sum())
                .unwrap_or(0);
            if count > 0 {
                counts.drops.insert(reason, count);
            }
        }
        for (key, values) in self.drops.iter().flatten() {
            *counts.drops.entry(key.reason).or_default() += values.iter().sum::<u64>();
        }
        for (key, values) in self.oversize_by_dev.iter().flatten() {
            *counts.oversize.entry((key.netns, key.ifindex)).or_default() +=
                values.iter().sum::<u64>();
        }
        counts
    }

    /// The flows reported as PMTUD black holes whose sockets the kernel still tracks,
    /// each with its namespace and how long ago its last retransmit was (ns). Whether
    /// one is still stuck is the socket's to say (`agent::blackholes`).
    pub(crate) fn reported_blackholes(&self) -> Vec<ReportedBlackhole> {
        let now = monotonic_ns();
        self.retrans
            .iter()
            .flatten()
            .filter(|(_, s)| s.reported == RETRANS_REPORTED_PMTUD)
            .map(|(_, s)| ReportedBlackhole {
                flow: s.flow,
                netns: s.netns,
                quiet_ns: now.saturating_sub(s.last_ns),
            })
            .collect()
    }

    /// Who sent the latest frag-needed (packet too big) received for packets to each
    /// destination, whatever the flow (a tunnel's packets to its remote endpoint change
    /// source port per flow). Only what the TC classifier saw while attached, and what
    /// the LRU map still holds.
    pub(crate) fn frag_needed_senders(&self) -> HashMap<IpAddr, IpAddr> {
        let ip = |family: u16, b: &[u8; 16]| -> IpAddr {
            if family == AF_INET {
                Ipv4Addr::new(b[0], b[1], b[2], b[3]).into()
            } else {
                Ipv6Addr::from(*b).to_canonical()
            }
        };
        let mut latest: HashMap<IpAddr, (u64, IpAddr)> = HashMap::new();
        for (flow, info) in self.evidence.icmp_rcvd.iter().flatten() {
            let dst = ip(flow.family, &flow.daddr);
            let from = ip(flow.family, &info.from);
            let e = latest.entry(dst).or_insert((info.last_ns, from));
            if info.last_ns >= e.0 {
                *e = (info.last_ns, from);
            }
        }
        latest
            .into_iter()
            .map(|(dst, (_, from))| (dst, from))
            .collect()
    }

    /// The MTU evidence recorded for `flow` since `since_ns` (the programs' clock).
    pub(crate) fn flow_evidence(&self, flow: &FlowKey, since_ns: u64) -> FlowEvidence {
        let m = &self.evidence;
        let drop = |d: Option<DropInfo>| d.filter(|d| d.last_ns >= since_ns).unwrap_or_default();
        let icmp = |i: Option<IcmpInfo>| i.filter(|i| i.last_ns >= since_ns).unwrap_or_default();
        FlowEvidence {
            oversize: drop(m.oversize.get(flow, 0).ok()),
            icmp_sent: icmp(m.icmp_sent.get(flow, 0).ok()),
            icmp_rcvd: icmp(m.icmp_rcvd.get(flow, 0).ok()),
            frag_dropped: drop(m.frag_dropped.get(flow, 0).ok()),
        }
    }

    /// Marks `flow`'s retransmit state as a reported black hole, as the programs do
    /// when they report one themselves, so that it is followed until it closes and not
    /// reported again.
    pub(crate) fn mark_blackhole(&mut self, flow: &FlowKey) {
        let found: Vec<(u64, RetransState)> = self
            .retrans
            .iter()
            .flatten()
            .filter(|(_, s)| s.flow == *flow)
            .collect();
        for (sk, mut state) in found {
            state.reported = RETRANS_REPORTED_PMTUD;
            // The socket may have closed meanwhile: then there is nothing to follow.
            let _ = self.retrans.insert(sk, state, BPF_EXIST);
        }
    }

    /// Where this node's NAT sent `flow` (as its socket knows it), when a hook saw the
    /// flow's packets translated.
    pub(crate) fn nat(&self, flow: &FlowKey) -> Option<NatInfo> {
        self.nat.get(flow, 0).ok()
    }

    /// The drops of `flow`'s SYN (or SYN-ACK) the programs recorded, if any.
    pub(crate) fn syn_drops(&self, flow: &FlowKey) -> Option<DropInfo> {
        self.syn_drops.get(flow, 0).ok()
    }

    /// Every aggregated verdict key with its counts, and the kernel's clock now.
    pub(crate) fn verdict_counts(&self) -> (Vec<(VerdictKey, VerdictAgg)>, u64) {
        let now = monotonic_ns();
        let fd = self.verdict_agg.map().fd().as_fd();
        let entries = super::batch::lookup_all(fd)
            .unwrap_or_else(|_| self.verdict_agg.iter().flatten().collect());
        (entries, now)
    }

    /// Deletes an idle verdict key and returns its last counts, read by the same
    /// syscall (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`), so a verdict counted after the agent's
    /// last read is not deleted unseen. The kernel recreates the key on its next verdict,
    /// which then goes out as an event. `None`: already gone, or the kernel cannot
    /// (before 5.14; the key is then deleted after a plain lookup).
    pub(crate) fn take_verdict(&mut self, key: &VerdictKey) -> Option<VerdictAgg> {
        take_entry(&mut self.verdict_agg, key)
    }

    /// Every inbound SYN drop key with its counts, and the kernel's clock now.
    pub(crate) fn inbound_counts(&self) -> (Vec<(InboundKey, InboundAgg)>, u64) {
        let now = monotonic_ns();
        (self.inbound.iter().flatten().collect(), now)
    }

    /// Deletes an idle inbound key and returns its last counts, as [`Self::take_verdict`].
    pub(crate) fn take_inbound(&mut self, key: &InboundKey) -> Option<InboundAgg> {
        take_entry(&mut self.inbound, key)
    }

    /// Makes the kernel's pod veth map equal to `links`: `(ifindex, pod netns)` of each
    /// pod veth in the agent's namespace `own`.
    pub(crate) fn set_pod_links(&mut self, own: u32, links: &[(u32, u32)]) {
        let wanted: HashMap<u64, u32> = links
            .iter()
            .map(|&(ifindex, pod)| (pod_link::key(own, ifindex), pod))
            .collect();
        let written = match self.pod_links_written.take() {
            Some(w) => w,
            None => self
                .pod_links
                .iter()
                .flatten()
                .collect::<HashMap<u64, u32>>(),
        };
        let mut now = written.clone();
        for k in written.keys().filter(|k| !wanted.contains_key(k)) {
            let _ = self.pod_links.remove(k);
            now.remove(k);
        }
        for (&k, &pod) in &wanted {
            if written.get(&k) == Some(&pod) {
                continue;
            }
            match self.pod_links.insert(k, pod, 0) {
                Ok(()) => {
                    now.insert(k, pod);
                }
                Err(e) => {
                    warn!(netns = pod, error = %e, "pod link map full; drops towards this pod are not seen as inbound");
                }
            }
        }
        self.pod_links_written = Some(now);
    }

    /// Makes the kernel's scope map equal to `scope`, this node's current set of
    /// network namespaces (inodes).
    pub(crate) fn set_scope(&mut self, scope: &BTreeSet<u32>) {
        let written = match self.scope_written.take() {
            Some(w) => w,
            None => self
                .scope
                .iter()
                .flatten()
                .filter(|(_, v)| *v == scope_value::IN)
                .map(|(k, _)| k)
                .collect::<BTreeSet<u32>>(),
        };
        if written != *scope {
            debug!(
                added = ?scope.difference(&written).collect::<Vec<_>>(),
                removed = ?written.difference(scope).collect::<Vec<_>>(),
                "scope changed"
            );
        }
        // Rare on a node (a pod deleted), and what would explain connects going unseen in
        // a namespace that still exists: said at the default level.
        let removed: Vec<&u32> = written.difference(scope).collect();
        if !removed.is_empty() {
            info!(netns = ?removed, "namespaces left the scope");
        }
        let mut now = written.clone();
        for ns in written.difference(scope) {
            let _ = self.scope.remove(ns);
            now.remove(ns);
        }
        for ns in scope.difference(&written) {
            // Overwrites a namespace marked out of scope, now this node's.
            match self.scope.insert(ns, scope_value::IN, 0) {
                Ok(()) => {
                    now.insert(*ns);
                    self.scope_out.remove(ns);
                }
                Err(e) => warn!(netns = ns, error = %e, "scope map full; namespace not watched"),
            }
        }
        self.scope_written = Some(now);
        // After the map is written: the drop counters' cached scope decisions are retaken
        // (see the eBPF `in_scope_cached`). Every refresh, changed or not, so a decision
        // taken in a race with a write lasts one refresh at most.
        let generation = self.scope_gen.get(&0, 0).unwrap_or(0);
        if let Err(e) = self.scope_gen.set(0, generation.wrapping_add(1), 0) {
            warn!(error = %e, "cannot bump the scope generation; drop counts may use a stale scope");
        }
    }

    /// Whether `netns` is in the scope last written: `None` when no scope is kept (every
    /// namespace watched, or none written yet). Namespace 0 (unknown to the programs) is
    /// never filtered out.
    pub(crate) fn scope_has(&self, netns: u32) -> Option<bool> {
        let written = self.scope_written.as_ref()?;
        Some(netns == 0 || written.contains(&netns))
    }

    /// Writes `netns` as [`scope_value::OUT`], so that the programs stop tracking its
    /// connects. The marks are bounded ([`SCOPE_OUT_MAX`]): past it they are all cleared
    /// (namespaces that went away leave theirs behind), and a namespace still there is
    /// marked again at its next verdict.
    pub(crate) fn mark_out_of_scope(&mut self, netns: u32) {
        if self.scope_out.len() >= SCOPE_OUT_MAX {
            for ns in std::mem::take(&mut self.scope_out) {
                let _ = self.scope.remove(&ns);
            }
        }
        match self.scope.insert(netns, scope_value::OUT, 0) {
            Ok(()) => {
                self.scope_out.insert(netns);
            }
            Err(e) => debug!(netns, error = %e, "cannot mark a namespace out of scope"),
        }
    }
}

/// Deletes `key` from `map` and returns its last value, read by the same syscall
/// (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`), so a count the kernel added after the agent's
/// last read is not deleted unseen. `None`: already gone, or the kernel cannot (before
/// 5.14; the key is then deleted after a plain lookup).
fn take_entry<K: aya::Pod, V: aya::Pod + Default>(
    map: &mut BpfHashMap<MapData, K, V>,
    key: &K,
) -> Option<V> {
    let fd = map.map().fd().as_fd().as_raw_fd();
    let mut value = V::default();
    // The `BPF_MAP_*_ELEM` commands' part of `union bpf_attr`.
    #[repr(C)]
    struct ElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
    let attr = ElemAttr {
        map_fd: fd as u32,
        _pad: 0,
        key: (key as *const K) as u64,
        value: (&raw mut value) as u64,
        flags: 0,
    };
    // SAFETY: `attr` is a valid bpf_attr prefix for this command; key and value point
    // at objects of the map's key and value sizes (the map's own types) that outlive
    // the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_AND_DELETE_ELEM,
            &raw const attr,
            size_of::<ElemAttr>() as libc::c_uint,
        )
    };
    if rc == 0 {
        return Some(value);
    }
    let last = map.get(key, 0).ok();
    let _ = map.remove(key);
    last
}

/// CLOCK_MONOTONIC in nanoseconds, the clock of `bpf_ktime_get_ns`.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
