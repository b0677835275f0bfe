//! The agent's view of the kernel maps it polls: per-CPU counters and drop aggregates
//! (folded into metrics), the socket map of full-size retransmitters (which flows are
//! black-holed now), and the maps the agent writes (netns scope, L3 header offsets).

use std::collections::HashSet;

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, Map, MapData, MapError, PerCpuArray, PerCpuHashMap, RingBuf},
};
use node_diag_common::{
    DropKey, FlowKey, MAP_COUNTERS, MAP_DROPS, MAP_EVENTS, MAP_L3_OFFSET, MAP_OVERSIZE_BY_DEV,
    MAP_RETRANS, MAP_SCOPE, RetransState, counter,
};
use tracing::warn;

use crate::{metrics::KernelTotals, tracefs::DropReasons};

/// A black-holed flow stays "now" while its full-size retransmits keep coming.
const BLACKHOLE_QUIET_NS: u64 = 10_000_000_000;

#[derive(Debug, thiserror::Error)]
#[error("eBPF map {name} is missing or has the wrong type: {reason}")]
pub struct MapMissing {
    name: &'static str,
    reason: String,
}

pub struct KernelMaps {
    counters: PerCpuArray<MapData, u64>,
    drops: PerCpuHashMap<MapData, DropKey, u64>,
    oversize_by_dev: PerCpuHashMap<MapData, DropKey, u64>,
    retrans: BpfHashMap<MapData, u64, RetransState>,
    pub scope: BpfHashMap<MapData, u32, u32>,
    pub l3_offset: BpfHashMap<MapData, u32, u32>,
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
    /// Takes the ring buffer and the polled maps out of the loaded object.
    pub fn take(ebpf: &mut Ebpf) -> Result<(RingBuf<MapData>, Self), MapMissing> {
        Ok((
            take(ebpf, MAP_EVENTS, RingBuf::try_from)?,
            Self {
                counters: take(ebpf, MAP_COUNTERS, PerCpuArray::try_from)?,
                drops: take(ebpf, MAP_DROPS, PerCpuHashMap::try_from)?,
                oversize_by_dev: take(ebpf, MAP_OVERSIZE_BY_DEV, PerCpuHashMap::try_from)?,
                retrans: take(ebpf, MAP_RETRANS, BpfHashMap::try_from)?,
                scope: take(ebpf, MAP_SCOPE, BpfHashMap::try_from)?,
                l3_offset: take(ebpf, MAP_L3_OFFSET, BpfHashMap::try_from)?,
            },
        ))
    }

    /// Kernel counter totals summed over CPUs; `ifname` names `(netns, ifindex)`.
    pub fn totals(
        &self,
        reasons: &DropReasons,
        ifname: &dyn Fn(u32, u32) -> Option<String>,
        bad_records: u64,
    ) -> KernelTotals {
        let get = |idx: u32| -> u64 {
            self.counters
                .get(&idx, 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        let mut totals = KernelTotals {
            refused: get(counter::CONNECT_REFUSED),
            timeout: get(counter::CONNECT_TIMEOUT),
            unreachable: get(counter::CONNECT_UNREACHABLE),
            rst_sent: get(counter::RST_SENT),
            rst_received: get(counter::RST_RECEIVED),
            events_lost: get(counter::EVENTS_LOST) + bad_records,
            frag_sent: get(counter::ICMP_FRAG_SENT),
            frag_received: get(counter::ICMP_FRAG_RECEIVED),
            frag_dropped: get(counter::ICMP_FRAG_DROPPED),
            ..KernelTotals::default()
        };
        for (key, values) in self.drops.iter().flatten() {
            *totals.drops.entry(reasons.name(key.reason)).or_default() +=
                values.iter().sum::<u64>();
        }
        for (key, values) in self.oversize_by_dev.iter().flatten() {
            let name = ifname(key.netns, key.ifindex)
                .unwrap_or_else(|| format!("{}:{}", key.netns, key.ifindex));
            *totals.oversize.entry(name).or_default() += values.iter().sum::<u64>();
        }
        totals
    }

    /// Flows whose PMTUD stall was reported and whose full-size retransmits continue.
    pub fn active_blackholes(&self) -> HashSet<FlowKey> {
        let now = monotonic_ns();
        self.retrans
            .iter()
            .flatten()
            .filter(|(_, s)| s.reported != 0 && now.saturating_sub(s.last_ns) < BLACKHOLE_QUIET_NS)
            .map(|(_, s)| s.flow)
            .collect()
    }

    /// Makes the kernel's scope map equal to this node's current set of namespaces.
    pub fn refresh_scope(&mut self) {
        let scope = match crate::host_network::local_scope() {
            Ok(scope) => scope,
            Err(e) => {
                warn!(error = %e, "cannot list this node's network namespaces; keeping the previous scope");
                return;
            }
        };
        let stale: Vec<u32> = self
            .scope
            .keys()
            .flatten()
            .filter(|k| !scope.contains(k))
            .collect();
        for ns in stale {
            let _ = self.scope.remove(&ns);
        }
        for ns in &scope {
            if let Err(e) = self.scope.insert(ns, 1, 0) {
                warn!(netns = ns, error = %e, "scope map full; namespace not watched");
            }
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds, the clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
