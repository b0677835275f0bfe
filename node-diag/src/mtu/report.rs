//! `node-diag mtu`'s output: every interface's verdict, every namespace's sysctls and the
//! findings, as a table with the arithmetic under it, or as one JSON object.

use std::fmt::Write as _;

use serde::Serialize;

use super::{
    model::{MtuVerdict, Role, Verdict},
    sysctls::{SysctlState, SysctlVerdict},
};
use crate::findings::{Finding, Kind};

/// `node-diag mtu`'s output.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) interfaces: Vec<MtuVerdict>,
    pub(crate) sysctls: Vec<SysctlVerdict>,
    pub(crate) findings: Vec<Finding>,
}

fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (c, w) in cells.zip(&widths) {
            let _ = write!(l, "{c:<w$}  ");
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
}

impl Report {
    pub(crate) fn text(&self) -> String {
        let dash = || "-".to_string();
        let num = |n: Option<u32>| n.map_or_else(dash, |n| n.to_string());
        let rows: Vec<Vec<String>> = self
            .interfaces
            .iter()
            .map(|v| {
                let underlay = match (&v.underlay, v.underlay_mtu) {
                    (Some(u), Some(m)) => format!("{u}/{m}"),
                    _ => dash(),
                };
                let underlay = match &v.overlay {
                    Some(o) if underlay == "-" => format!("via {o}"),
                    Some(o) => format!("{underlay} via {o}"),
                    None => underlay,
                };
                vec![
                    v.netns_name.clone(),
                    v.interface.clone(),
                    v.kind.to_string(),
                    v.mtu.to_string(),
                    // Only where routes make it differ: the arithmetic below says how.
                    v.effective_mtu
                        .filter(|e| *e != v.mtu)
                        .map_or_else(dash, |e| e.to_string()),
                    underlay,
                    num(v.overhead),
                    num(v.expected_mtu),
                    v.headroom.map_or_else(dash, |h| h.to_string()),
                    match v.verdict {
                        Verdict::Mismatch => "MISMATCH".into(),
                        other => other.as_str().into(),
                    },
                ]
            })
            .collect();
        let mut out = String::new();
        table(
            &mut out,
            &[
                "NETNS",
                "INTERFACE",
                "KIND",
                "MTU",
                "EFFECTIVE",
                "UNDERLAY",
                "OVERHEAD",
                "EXPECTED",
                "HEADROOM",
                "VERDICT",
            ],
            &rows,
        );
        // Pods without an overlay all say the same thing: say it once.
        let unchecked_pods = self.interfaces.iter().any(|v| {
            matches!(v.role, Role::PodInterface | Role::NodeVeth)
                && v.verdict == Verdict::NotApplicable
        });
        let details: Vec<_> = self
            .interfaces
            .iter()
            .filter(|v| {
                !v.detail.is_empty()
                    && (v.role == Role::Overlay || v.verdict != Verdict::NotApplicable)
            })
            .collect();
        if !details.is_empty() {
            out.push('\n');
            for v in details {
                let _ = write!(out, "{} {}: {}", v.netns_name, v.interface, v.detail);
                if let Some(b) = &v.overhead_breakdown {
                    let _ = write!(
                        out,
                        " [{} {} = {b}]",
                        v.encapsulation.as_deref().unwrap_or("overhead"),
                        v.overhead.unwrap_or(0)
                    );
                }
                out.push('\n');
            }
        }
        if unchecked_pods {
            out.push('\n');
            out.push_str(
                "Pod interfaces are not compared: no overlay device is up in the node's \
                 namespace (their path is the underlay's).\n",
            );
        }
        out.push('\n');
        let rows: Vec<Vec<String>> = self
            .sysctls
            .iter()
            .map(|s| {
                vec![
                    s.netns_name.clone(),
                    num(s.ip_no_pmtu_disc),
                    num(s.tcp_mtu_probing),
                    match s.verdict {
                        SysctlState::Ok => "ok".into(),
                        SysctlState::PmtudDisabled => "PMTUD_DISABLED".into(),
                        SysctlState::Unknown => "unknown".into(),
                    },
                    match &s.error {
                        Some(e) => format!("unreadable: {e}"),
                        None => s.detail.clone(),
                    },
                ]
            })
            .collect();
        table(
            &mut out,
            &[
                "NETNS",
                "IP_NO_PMTU_DISC",
                "TCP_MTU_PROBING",
                "VERDICT",
                "MEANING",
            ],
            &rows,
        );
        out.push('\n');
        let mismatches = self
            .findings
            .iter()
            .filter(|f| f.kind == Kind::OverlayMtuMismatch)
            .count();
        let sysctl = self.findings.len() - mismatches;
        if self.findings.is_empty() {
            out.push_str("No MTU or PMTUD configuration problem found.\n");
        } else {
            let _ = writeln!(
                out,
                "{mismatches} MTU mismatch(es), {sysctl} PMTUD sysctl finding(s):"
            );
            for f in &self.findings {
                let _ = writeln!(
                    out,
                    "  {} {}: {} Fix: {}",
                    f.severity.as_str().to_uppercase(),
                    f.kind,
                    f.summary,
                    f.remediation
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::super::{fixtures::*, report};

    #[test]
    fn report_text_and_json_shape() {
        let r = report(&node(1500, 1450, 1500, 1450), SystemTime::UNIX_EPOCH);
        let text = r.text();
        assert!(text.starts_with("NETNS"), "{text}");
        assert!(text.contains("ul0/1500 via vx0"), "{text}");
        assert!(text.contains("MISMATCH"), "{text}");
        assert!(text.contains("1 MTU mismatch(es)"), "{text}");
        assert!(text.contains("EFFECTIVE"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        for k in ["interfaces", "sysctls", "findings"] {
            assert!(json[k].is_array(), "{k}");
        }
        assert_eq!(json["interfaces"][0]["kind"], "loopback");
        assert_eq!(json["findings"][0]["kind"], "overlay_mtu_mismatch");
    }
}
