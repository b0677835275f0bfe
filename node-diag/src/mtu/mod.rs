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
//! ([`InterfaceMtu`]) and `node-diag mtu`'s [`Report`] (`report`).

mod encapsulation;
mod findings;
#[cfg(test)]
mod fixtures;
mod model;
mod report;
mod sysctls;

use std::time::SystemTime;

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
}

impl From<&Snapshot> for Model {
    fn from(snap: &Snapshot) -> Self {
        Self {
            interfaces: model::verdicts(snap),
            sysctls: sysctls::sysctl_verdicts(snap),
        }
    }
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
