//! What a matrix run leaves: each entry's outcome, the markdown table of them (in
//! `target/vm/results.md`, and merged into docs/kernels.md's kernel support section)
//! and the doctor's verdict as that table shows it.

use anyhow::{Result, bail};
use serde::Serialize;

use super::{Ran, arch::Arch};
use crate::steps::Counts;

/// The outcome of one matrix entry.
#[derive(Debug, Serialize)]
pub(super) struct Outcome {
    pub kernel: String,
    pub arch: Arch,
    /// `uname -r` (the host's for `host`).
    pub release: String,
    /// `host`, `kvm` or `tcg`.
    pub accel: String,
    /// Which tests: `whole suite`, `arm64 subset` or the filters.
    pub suite: String,
    /// Test binaries: (name, exit code, seconds).
    pub tests: Vec<(String, i32, u64)>,
    /// The tests they ran, from libtest's summaries.
    pub counts: Counts,
    /// The agent's `doctor` verdict and how it attaches TC programs there.
    pub doctor: String,
    pub tc_attach: String,
    pub passed: bool,
    pub seconds: u64,
    /// Why it failed, when it did not get as far as a test failure.
    pub error: Option<String>,
    /// Seconds its first guest waited for its turn to boot.
    #[serde(skip)]
    pub queued: u64,
}

impl Outcome {
    /// What it ran, for the record of `cargo xtask test`'s steps.
    pub(super) fn summary(&self) -> Ran {
        Ran {
            name: format!("{} {} {}", self.kernel, self.arch, self.suite)
                .trim_end()
                .to_owned(),
            passed: self.passed,
            seconds: self.seconds,
            queued: self.queued,
            tests: self.counts,
            error: self.error.clone(),
        }
    }
}

/// Doctor checks about the node rather than its kernel: a guest has no container
/// runtime, and the table is about kernels.
pub(super) const NODE_CHECKS: &[&str] = &["container runtime"];

/// (verdict, TC attachment) from `node-diag doctor -o json`. The verdict is the kernel's:
/// degraded only by checks not about the node (`ready (no CRI)` when a missing container
/// runtime socket was the only shortfall).
pub(super) fn doctor_summary(json: &str) -> (String, String) {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else {
        return ("no report".into(), "?".into());
    };
    let checks = value["checks"].as_array().cloned().unwrap_or_default();
    let mut verdict = value["verdict"].as_str().unwrap_or("?").to_owned();
    let shortfalls: Vec<&str> = checks
        .iter()
        .filter(|c| c["status"] != "ok")
        .filter_map(|c| c["name"].as_str())
        .collect();
    if verdict == "degraded"
        && !shortfalls.is_empty()
        && shortfalls.iter().all(|name| NODE_CHECKS.contains(name))
    {
        verdict = "ready (no CRI)".into();
    }
    let tc = checks
        .iter()
        .find(|c| c["name"] == "tc attach")
        .and_then(|c| c["detail"].as_str())
        .map(|d| d.split([' ', ',']).next().unwrap_or(d).to_owned())
        .unwrap_or_else(|| "?".into());
    (verdict, tc)
}

pub(super) fn minutes(seconds: u64) -> String {
    format!("{}m{:02}s", seconds / 60, seconds % 60)
}

/// The markdown table of a matrix run.
pub(super) fn table(outcomes: &[Outcome]) -> String {
    let mut t = format!("{TABLE_HEAD}\n| --- | --- | --- | --- | --- | --- | --- | --- | ---: |\n");
    for o in outcomes {
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            o.kernel,
            o.arch,
            o.release,
            o.accel,
            o.tc_attach,
            o.doctor,
            o.suite,
            if o.passed { "passed" } else { "FAILED" },
            minutes(o.seconds)
        ));
    }
    t
}

/// Markers around docs/kernels.md's kernel support table.
pub(super) const README_BEGIN: &str = "<!-- kernel-support:begin -->";
pub(super) const README_END: &str = "<!-- kernel-support:end -->";
pub(super) const TABLE_HEAD: &str =
    "| kernel | arch | release | accel | TC attach | doctor | suite | result | wall time |";

/// docs/kernels.md with this run's rows in its kernel support table: a row per (kernel,
/// arch), replaced when run again, others kept; host first, then by kernel and arch.
pub(super) fn merge_readme(readme: &str, outcomes: &[Outcome]) -> Result<String> {
    let (Some(begin), Some(end)) = (readme.find(README_BEGIN), readme.find(README_END)) else {
        bail!("docs/kernels.md has no {README_BEGIN} … {README_END} block");
    };
    let block = &readme[begin + README_BEGIN.len()..end];
    let mut rows: Vec<(String, String)> = block
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with(TABLE_HEAD) && !l.starts_with("| ---"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            Some((format!("{} {}", cells.get(1)?, cells.get(2)?), l.to_owned()))
        })
        .collect();
    let fresh = table(outcomes);
    for line in fresh.lines().skip(2) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let key = format!("{} {}", cells[1], cells[2]);
        rows.retain(|(k, _)| *k != key);
        rows.push((key, line.to_owned()));
    }
    rows.sort_by_key(|(k, _)| (!k.starts_with("host"), k.ends_with("aarch64"), k.clone()));
    let mut out = String::from(&readme[..begin + README_BEGIN.len()]);
    out.push('\n');
    out.push_str(&fresh.lines().take(2).collect::<Vec<_>>().join("\n"));
    out.push('\n');
    for (_, row) in rows {
        out.push_str(&row);
        out.push('\n');
    }
    out.push_str(&readme[end..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(kernel: &str, arch: Arch, passed: bool) -> Outcome {
        Outcome {
            kernel: kernel.into(),
            arch,
            release: "r".into(),
            accel: "tcg".into(),
            suite: "whole suite".into(),
            tests: Vec::new(),
            counts: Counts::default(),
            doctor: "ready".into(),
            tc_attach: "tcx".into(),
            passed,
            seconds: 61,
            error: None,
            queued: 0,
        }
    }

    #[test]
    fn readme_rows_are_replaced_per_kernel_and_kept_otherwise() {
        let readme = format!("intro\n{README_BEGIN}\n{README_END}\nrest\n");
        let once = merge_readme(
            &readme,
            &[
                outcome("6.1", Arch::X86_64, false),
                outcome("host", Arch::X86_64, true),
            ],
        )
        .unwrap();
        let twice = merge_readme(&once, &[outcome("6.1", Arch::X86_64, true)]).unwrap();
        let rows: Vec<&str> = twice.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(rows.len(), 4, "{twice}");
        assert!(rows[2].starts_with("| host |"), "{twice}");
        assert!(
            rows[3].starts_with("| 6.1 | x86_64 |") && rows[3].contains("passed"),
            "{twice}"
        );
        assert!(twice.starts_with("intro\n") && twice.ends_with(&format!("{README_END}\nrest\n")));
        assert!(merge_readme("no block", &[]).is_err());
    }

    #[test]
    fn doctor_summary_reads_verdict_and_tc_attach() {
        let json = r#"{"checks":[{"name":"tc attach","status":"ok","detail":"netlink clsact filters (no TCX before Linux 6.6)"}],"verdict":"ready"}"#;
        assert_eq!(
            doctor_summary(json),
            ("ready".to_owned(), "netlink".to_owned())
        );
        assert_eq!(doctor_summary("").0, "no report");
    }

    #[test]
    fn doctor_summary_leaves_a_missing_cri_socket_out_of_the_kernels_verdict() {
        let only_cri = r#"{"checks":[{"name":"btf","status":"ok"},{"name":"container runtime","status":"warn"}],"verdict":"degraded"}"#;
        assert_eq!(doctor_summary(only_cri).0, "ready (no CRI)");
        let kernel_too = r#"{"checks":[{"name":"btf","status":"warn"},{"name":"container runtime","status":"warn"}],"verdict":"degraded"}"#;
        assert_eq!(doctor_summary(kernel_too).0, "degraded");
    }
}
