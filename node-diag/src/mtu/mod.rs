//! MTU model: what each interface's MTU should be, from an inventory snapshot alone (no
//! traffic needed), and the findings when it is not.
//!
//! - An overlay (tunnel) device may carry at most `underlay MTU − encapsulation overhead`:
//!   a larger inner packet no longer fits the underlay once wrapped.
//! - A pod's interface (the pod end of its veth) and the node end of that veth may not
//!   exceed what the overlay their traffic routes through carries. This version takes the
//!   overlay devices of the agent's namespace that are up: with one, its limit; with
//!   several (say VXLAN plus WireGuard), the smallest, since a pod cannot know which one a
//!   packet will take. An overlay's limit is `underlay − overhead`, or its own MTU when
//!   that is lower (or when its underlay is unknown). Without an overlay, pod interfaces
//!   are not compared (native routing: their path MTU is the underlay's).
//! - `net.ipv4.ip_no_pmtu_disc` other than 0 in a namespace: PMTUD is off or partly off.
//!
//! Data flows one way: a [`Snapshot`] becomes a [`Model`] (`model`: each interface's
//! verdict, with the overheads of `encapsulation`; `sysctls`: each namespace's PMTUD
//! sysctls judged), judged once; from it come the `findings`, the metrics' gauges
//! ([`InterfaceMtu`], [`PathMtu`]) and `node-diag mtu`'s [`Report`] (`report`).
//!
//! The path MTU the route cache learned towards a tunnel's endpoint (from a frag-needed
//! or packet-too-big sent by a hop beyond this node) counts as the underlay when it is
//! smaller than the devices and routes here: a narrower hop on the way to a peer is as
//! much a limit as a small NIC, only not this node's.

mod encapsulation;
mod findings;
#[cfg(test)]
mod fixtures;
mod model;
mod report;
mod sysctls;

use std::{collections::BTreeMap, net::IpAddr, time::SystemTime};

pub(crate) use self::findings::name_frag_needed_senders;
use self::{model::MtuVerdict, report::Report, sysctls::SysctlVerdict};
use crate::{
    findings::Finding,
    host_network::{LinkKind, Snapshot},
};

/// A snapshot, judged: every interface's verdict and every namespace's sysctl verdict.
#[derive(Debug, Clone)]
pub(crate) struct Model {
    interfaces: Vec<MtuVerdict>,
    sysctls: Vec<SysctlVerdict>,
    path_mtus: Vec<PathMtu>,
}

impl From<&Snapshot> for Model {
    fn from(snap: &Snapshot) -> Self {
        Self {
            interfaces: model::verdicts(snap),
            sysctls: sysctls::sysctl_verdicts(snap),
            path_mtus: path_mtus(snap),
        }
    }
}

/// At most this many endpoints get a `node_diag_path_mtu_bytes` series: one per peer
/// node, and a cluster is seldom larger; beyond it the smallest path MTUs are kept, since
/// those are the ones that hurt.
pub(crate) const MAX_PATH_MTU_SERIES: usize = 256;

/// The smallest path MTU the route cache learned towards one remote tunnel endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PathMtu {
    pub(crate) endpoint: IpAddr,
    pub(crate) mtu: u32,
}

/// The learned path MTUs towards the endpoints of the node's own tunnels, the smallest
/// per endpoint (several tunnels may share a peer), smallest first, at most
/// [`MAX_PATH_MTU_SERIES`].
fn path_mtus(snap: &Snapshot) -> Vec<PathMtu> {
    let mut by_endpoint: BTreeMap<IpAddr, u32> = BTreeMap::new();
    let learned = snap
        .interfaces
        .iter()
        .filter(|i| i.netns == snap.own_netns)
        .flat_map(|i| &i.underlays)
        .filter_map(|u| Some((u.learned_mtu?, &u.learned_endpoints)));
    for (mtu, endpoints) in learned {
        for &endpoint in endpoints {
            by_endpoint
                .entry(endpoint)
                .and_modify(|m| *m = (*m).min(mtu))
                .or_insert(mtu);
        }
    }
    let mut out: Vec<PathMtu> = by_endpoint
        .into_iter()
        .map(|(endpoint, mtu)| PathMtu { endpoint, mtu })
        .collect();
    out.sort_by_key(|p| (p.mtu, p.endpoint));
    out.truncate(MAX_PATH_MTU_SERIES);
    out
}

/// One interface's MTU gauges: its MTU, and its headroom under the limit the model holds
/// it to, when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InterfaceMtu {
    pub(crate) interface: String,
    pub(crate) kind: LinkKind,
    pub(crate) netns: String,
    pub(crate) mtu: u32,
    /// `expected − mtu`: negative when the interface is too large.
    pub(crate) headroom: Option<i64>,
}

impl Model {
    /// `overlay_mtu_mismatch` and `pmtud_disabled` findings.
    pub(crate) fn findings(&self, now: SystemTime) -> Vec<Finding> {
        findings::findings_of(&self.interfaces, &self.sysctls, now)
    }

    /// What the metrics expose, one entry per interface.
    pub(crate) fn gauges(&self) -> Vec<InterfaceMtu> {
        self.interfaces
            .iter()
            .map(|v| InterfaceMtu {
                interface: v.interface.clone(),
                kind: v.kind.clone(),
                netns: v.netns_name.clone(),
                mtu: v.mtu,
                headroom: v.headroom,
            })
            .collect()
    }

    /// The learned path MTUs towards the node's tunnel endpoints (see [`PathMtu`]).
    pub(crate) fn path_mtus(&self) -> &[PathMtu] {
        &self.path_mtus
    }

    /// `node-diag mtu`'s output, its findings dated `now`.
    pub(crate) fn into_report(self, now: SystemTime) -> Report {
        let findings = self.findings(now);
        Report {
            interfaces: self.interfaces,
            sysctls: self.sysctls,
            findings,
        }
    }
}

/// `node-diag mtu`'s output for a snapshot.
pub(crate) fn report(snap: &Snapshot, now: SystemTime) -> Report {
    Model::from(snap).into_report(now)
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::{fixtures::*, *};
    use crate::host_network::{Tunnel, UnderlaySource};

    #[test]
    fn the_smallest_learned_path_mtu_per_endpoint_bounded() {
        let b = IpAddr::from([10, 0, 0, 2]);
        let mut snap = learned(node(1500, 1450, 1450, 1450), "vx0", b, 1400);
        // A second tunnel to the same peer learned less; one in a pod does not count.
        let mut vx2 = tunnel(
            iface(NODE, "vx2", 9, crate::host_network::LinkKind::Vxlan, 1450),
            Tunnel::default(),
            Some(("ul0", 2, 1500, UnderlaySource::RouteToRemote)),
        );
        vx2.underlays[0].learned_mtu = Some(1300);
        vx2.underlays[0].learned_endpoints = vec![b];
        snap.interfaces.push(vx2.clone());
        vx2.netns = POD;
        vx2.underlays[0].learned_mtu = Some(1200);
        snap.interfaces.push(vx2);
        assert_eq!(
            Model::from(&snap).path_mtus(),
            &[PathMtu {
                endpoint: b,
                mtu: 1300
            }]
        );
        // Nothing learned: no series.
        assert!(
            Model::from(&node(1500, 1450, 1450, 1450))
                .path_mtus()
                .is_empty()
        );
        // A huge FDB: the smallest are kept.
        let mut snap = node(1500, 1450, 1450, 1450);
        let vx = snap
            .interfaces
            .iter_mut()
            .find(|i| i.name == "vx0")
            .unwrap();
        let mut second = vx.underlays[0].clone();
        vx.underlays[0].learned_mtu = Some(1400);
        vx.underlays[0].learned_endpoints = (0..300u32)
            .map(|n| IpAddr::from((0x0a01_0000 + n).to_be_bytes()))
            .collect();
        second.learned_mtu = Some(1280);
        second.learned_endpoints = vec![IpAddr::from([10, 9, 9, 9])];
        vx.underlays.push(second);
        let paths = Model::from(&snap).path_mtus().to_vec();
        assert_eq!(paths.len(), MAX_PATH_MTU_SERIES);
        assert_eq!(paths[0].mtu, 1280);
    }
}
