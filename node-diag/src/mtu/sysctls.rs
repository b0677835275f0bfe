//! The PMTUD sysctls of each namespace (`net.ipv4.ip_no_pmtu_disc`,
//! `net.ipv4.tcp_mtu_probing`), judged and explained.

use std::fmt::Write as _;

use serde::Serialize;

use crate::host_network::Snapshot;

/// A namespace's PMTUD sysctls, judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct SysctlVerdict {
    pub(crate) netns: u32,
    pub(crate) netns_name: String,
    pub(crate) ip_no_pmtu_disc: Option<u32>,
    pub(crate) tcp_mtu_probing: Option<u32>,
    /// `ok`, `pmtud_disabled` or `unknown` (unreadable).
    pub(crate) verdict: SysctlState,
    pub(crate) detail: String,
    /// Why the namespace could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SysctlState {
    Ok,
    PmtudDisabled,
    Unknown,
}

pub(super) fn no_pmtu_disc_meaning(v: u32) -> &'static str {
    match v {
        0 => "PMTUD on",
        1 => "PMTUD off: packets go out without DF, frag-needed only lowers the PMTU to min_pmtu",
        2 => "PMTUD off: packets go out without DF and frag-needed is discarded",
        3 => "hardened: frag-needed honoured only for TCP, SCTP and DCCP",
        _ => "unknown mode",
    }
}

fn mtu_probing_meaning(v: u32) -> &'static str {
    match v {
        0 => "TCP MTU probing off (no fallback when frag-needed is blocked)",
        1 => "TCP MTU probing once a black hole is detected",
        2 => "TCP MTU probing always on",
        _ => "TCP MTU probing in an unknown mode",
    }
}

pub(super) fn sysctl_verdicts(snap: &Snapshot) -> Vec<SysctlVerdict> {
    snap.namespaces
        .iter()
        .map(|n| {
            let s = n.sysctls;
            let (verdict, mut detail) = match s.ip_no_pmtu_disc {
                None => (
                    SysctlState::Unknown,
                    "ip_no_pmtu_disc unreadable".to_string(),
                ),
                Some(0) => (SysctlState::Ok, no_pmtu_disc_meaning(0).to_string()),
                Some(v) => (
                    SysctlState::PmtudDisabled,
                    no_pmtu_disc_meaning(v).to_string(),
                ),
            };
            if let Some(p) = s.tcp_mtu_probing {
                let _ = write!(detail, "; {}", mtu_probing_meaning(p));
            }
            SysctlVerdict {
                netns: n.inode,
                netns_name: n.name.clone(),
                ip_no_pmtu_disc: s.ip_no_pmtu_disc,
                tcp_mtu_probing: s.tcp_mtu_probing,
                verdict,
                detail,
                error: n.error.clone(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::{super::fixtures::*, *};
    use crate::findings::{Kind, Layer, Severity};

    #[test]
    fn sysctl_verdicts_and_findings() {
        let mut snap = node(1500, 1450, 1450, 1450);
        snap.namespaces[1].sysctls.ip_no_pmtu_disc = Some(1);
        snap.namespaces[0].sysctls.tcp_mtu_probing = Some(1);
        let ss = sysctl_verdicts(&snap);
        assert_eq!(ss[0].verdict, SysctlState::Ok);
        assert!(ss[0].detail.contains("once a black hole is detected"));
        assert_eq!(ss[1].verdict, SysctlState::PmtudDisabled);
        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        assert_eq!(fs.len(), 1);
        let f = &fs[0];
        assert_eq!(
            (f.kind, f.layer, f.severity),
            (Kind::PmtudDisabled, Layer::HostSysctl, Severity::Warning)
        );
        assert_eq!(f.netns, Some(POD));
        assert_eq!(f.evidence.to_map()["value"], 1);
        assert!(
            f.summary
                .contains("net.ipv4.ip_no_pmtu_disc is 1 in netns pod-a")
        );

        snap.namespaces[1].sysctls.ip_no_pmtu_disc = Some(3);
        let fs = findings(&snap, SystemTime::UNIX_EPOCH);
        assert_eq!(fs[0].severity, Severity::Info, "mode 3 still honours TCP's");

        snap.namespaces[1].sysctls.ip_no_pmtu_disc = None;
        assert_eq!(sysctl_verdicts(&snap)[1].verdict, SysctlState::Unknown);
        assert!(findings(&snap, SystemTime::UNIX_EPOCH).is_empty());
    }
}
