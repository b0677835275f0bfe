//! `node-diag doctor`: which kernel features the agent can use on this node, what is
//! missing, and a verdict. Read-only, except that it mounts tracefs when missing and
//! permitted, as the agent itself would.

use serde::Serialize;

use crate::kernel::{
    btf::{self, Btf},
    caps,
    hooks::{HOOKS, companions},
    loader,
    tracefs::{self, Format},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Serialize)]
pub(crate) struct Check {
    pub(crate) name: String,
    pub(crate) status: Status,
    pub(crate) detail: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) checks: Vec<Check>,
    /// `ready`, `degraded` or `cannot_run`.
    pub(crate) verdict: &'static str,
    pub(crate) summary: String,
}

fn check(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status,
        detail: detail.into(),
    }
}

/// `cri_socket` is `--cri-socket`; without it the usual runtime sockets are tried.
pub(crate) fn run(cri_socket: Option<&std::path::Path>) -> Report {
    let mut checks = Vec::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    checks.push(check("kernel", Status::Ok, format!("Linux {kernel}")));

    let mask = caps::effective();
    let held: Vec<_> = [
        caps::CAP_BPF,
        caps::CAP_PERFMON,
        caps::CAP_NET_ADMIN,
        caps::CAP_NET_RAW,
        caps::CAP_SYS_ADMIN,
        caps::CAP_SYS_RESOURCE,
    ]
    .into_iter()
    .filter(|c| caps::has(mask, *c))
    .map(caps::name)
    .collect();
    let missing = caps::missing_for_agent(mask);
    checks.push(if missing.is_empty() {
        check(
            "capabilities",
            Status::Ok,
            format!("held: {}", held.join(", ")),
        )
    } else {
        check(
            "capabilities",
            Status::Fail,
            format!(
                "missing {}; run as root or grant CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN (held: {})",
                missing.join(", "),
                if held.is_empty() {
                    "none".to_string()
                } else {
                    held.join(", ")
                }
            ),
        )
    });

    checks.push(path_probe(mask));

    let kernel_btf = Btf::from_sys_fs().and_then(|b| {
        b.member_offset("sk_buff", "network_header")?;
        b.path_offset("sock", "__sk_common.skc_net.net")?;
        Ok(b)
    });
    checks.push(match &kernel_btf {
        Ok(_) => check(
            "btf",
            Status::Ok,
            format!("{} (struct offsets resolved)", btf::VMLINUX),
        ),
        Err(e) => check(
            "btf",
            Status::Warn,
            format!("{e}: netns/interface attribution and packet evidence disabled"),
        ),
    });
    if let Ok(b) = &kernel_btf {
        checks.push(kernel_reads(b));
    }

    let root = match tracefs::find_mounted() {
        Some(root) => {
            checks.push(check(
                "tracefs",
                Status::Ok,
                format!("mounted at {}", root.display()),
            ));
            Some(root)
        }
        None if caps::has(mask, caps::CAP_SYS_ADMIN) => match tracefs::ensure_mounted() {
            Ok((root, _)) => {
                checks.push(check(
                    "tracefs",
                    Status::Ok,
                    format!(
                        "was not mounted; mounted it at {} (the agent does the same)",
                        root.display()
                    ),
                ));
                Some(root)
            }
            Err(e) => {
                checks.push(check("tracefs", Status::Fail, e.to_string()));
                None
            }
        },
        None => {
            checks.push(check(
                "tracefs",
                Status::Fail,
                "not mounted, and mounting it needs CAP_SYS_ADMIN: `mount -t tracefs nodev /sys/kernel/tracing`",
            ));
            None
        }
    };
    let btf = crate::kernel::btf::Btf::from_sys_fs().ok();
    for hook in HOOKS {
        let name = hook.describe();
        if hook.fentry {
            checks.push(match loader::fentry_target(hook, btf.as_ref()) {
                Ok(()) => check(name, Status::Ok, format!("used for {}", hook.feature)),
                Err(e) => check(name, Status::Warn, format!("{e}; lost: {}", hook.feature)),
            });
            continue;
        }
        let Some(root) = &root else {
            checks.push(check(name, Status::Fail, "tracefs unavailable"));
            continue;
        };
        checks.push(
            match Format::load(root, hook.category, hook.name)
                .and_then(|f| loader::check_format(hook, &f))
                .map_err(|e| e.to_string())
                .and_then(|()| btf.as_ref().map_or(Ok(()), |b| loader::check_args(hook, b)))
            {
                Ok(()) => check(
                    name,
                    Status::Ok,
                    format!("tracepoint, used for {}", hook.feature),
                ),
                Err(e) => match btf.as_ref().and_then(|b| loader::fallback(hook, b)) {
                    Some(f) => check(
                        name,
                        Status::Ok,
                        format!(
                            "{e}; {} ({}) instead, used for {}",
                            f.mechanism(),
                            f.program,
                            hook.feature
                        ),
                    ),
                    None => check(name, Status::Warn, format!("{e}; lost: {}", hook.feature)),
                },
            },
        );
    }

    let probe = |what: &str, r: Result<bool, String>, needed: &str| match r {
        Ok(true) => check(what, Status::Ok, format!("supported ({needed})")),
        Ok(false) => check(
            what,
            Status::Fail,
            format!("not supported by this kernel ({needed})"),
        ),
        Err(e) => check(what, Status::Warn, format!("could not probe: {e}")),
    };
    checks.push(probe(
        "tracepoint programs",
        aya::sys::is_program_supported(aya::programs::ProgramType::TracePoint)
            .map_err(|e| e.to_string()),
        "every hook",
    ));
    checks.push(probe(
        "ring buffer",
        aya::sys::is_map_supported(aya::maps::MapType::RingBuf).map_err(|e| e.to_string()),
        "verdict events",
    ));
    checks.push(probe(
        "tc classifier",
        aya::sys::is_program_supported(aya::programs::ProgramType::SchedClassifier)
            .map_err(|e| e.to_string()),
        "per-interface packet hooks",
    ));

    checks.push(tc_attach(&kernel));
    checks.push(sent_resets(&kernel));
    checks.push(service_names());
    checks.push(container_runtime(cri_socket));
    // The feature probes above load a trivial program; only loading the agent's own
    // programs, configured for this kernel, shows what its verifier says of them.
    if missing.is_empty() {
        programs(&mut checks);
    } else {
        checks.push(check(
            "programs",
            Status::Warn,
            "not verified: loading them needs the capabilities above",
        ));
    }

    let fails = checks.iter().filter(|c| c.status == Status::Fail).count();
    let warns = checks.iter().filter(|c| c.status == Status::Warn).count();
    let (verdict, summary) = if fails > 0 {
        (
            "cannot_run",
            format!("{fails} required feature(s) missing; the agent cannot run here"),
        )
    } else if warns > 0 {
        (
            "degraded",
            format!("the agent runs with {warns} feature(s) degraded"),
        )
    } else {
        (
            "ready",
            "every feature the agent uses is available".to_string(),
        )
    };
    Report {
        checks,
        verdict,
        summary,
    }
}

/// Whether findings can name Services: kube-proxy's rules in this namespace, through the
/// dump tools of each of its modes.
/// How the programs read packet headers and sockets: plain loads where the kernel has
/// `bpf_rdonly_cast`, probe reads (a helper call each) before Linux 6.2. Both work.
fn kernel_reads(btf: &Btf) -> Check {
    if loader::plain_loads(btf) {
        check(
            "kernel reads",
            Status::Ok,
            "plain loads (bpf_rdonly_cast): packet headers and sockets cost no helper call",
        )
    } else {
        check(
            "kernel reads",
            Status::Ok,
            "probe reads: this kernel has no bpf_rdonly_cast (Linux 6.2+), each packet header or socket field read is a helper call",
        )
    }
}

fn service_names() -> Check {
    match crate::services::read() {
        Ok((catalog, sources)) => {
            let read: Vec<&str> = sources
                .iter()
                .filter(|s| matches!(s.status, crate::services::SourceStatus::Read { .. }))
                .map(|s| s.name.as_str())
                .collect();
            let detail = if catalog.is_empty() {
                format!(
                    "no kube-proxy rules here (read {}): findings name no Service (kube-proxy in IPVS mode or replaced by the CNI, or not a Kubernetes node)",
                    read.join(", ")
                )
            } else {
                format!("{} Services from {}", catalog.len(), read.join(", "))
            };
            check("service names", Status::Ok, detail)
        }
        Err(e) => check(
            "service names",
            Status::Warn,
            format!("{e}: install iptables and nftables for Service names"),
        ),
    }
}

/// Whether findings can name pods: the container runtime's CRI socket found and answering
/// `Version`. Without it the agent runs, with netns and addresses only (a warning).
fn container_runtime(configured: Option<&std::path::Path>) -> Check {
    const NAME: &str = "container runtime";
    let Some(path) = crate::pods::socket_path(configured) else {
        return check(
            NAME,
            Status::Warn,
            format!(
                "no CRI socket (tried {}): findings will not name pods; mount the runtime's socket or pass --cri-socket",
                crate::pods::DEFAULT_SOCKETS.join(", ")
            ),
        );
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return check(NAME, Status::Warn, format!("cannot start a runtime: {e}")),
    };
    let answer = rt.block_on(async {
        let mut cri = crate::pods::cri::Cri::connect(&path).await?;
        cri.version().await
    });
    match answer {
        Ok(v) => check(
            NAME,
            Status::Ok,
            format!(
                "{} {} (CRI {}) at {}: findings name pods",
                v.name,
                v.version,
                v.api_version,
                path.display()
            ),
        ),
        Err(e) => check(
            NAME,
            Status::Warn,
            format!("{e}: findings will not name pods"),
        ),
    }
}

/// How TC programs attach here: TCX links from Linux 6.6, else netlink filters under
/// `clsact` (which outlive a crashed agent; the next start removes them).
/// Whether the agent can probe a flow's path (raw ICMP echo sockets).
fn path_probe(mask: u64) -> Check {
    if caps::has(mask, caps::CAP_NET_RAW) {
        check(
            "path probe",
            Status::Ok,
            "CAP_NET_RAW held: stalls and timeouts without evidence on this node are checked by probing their path",
        )
    } else {
        check(
            "path probe",
            Status::Warn,
            "CAP_NET_RAW missing: no path probes, so a black hole or a dropped tunnel beyond this node stays a tcp_stall or tcp_timeout on layer unknown",
        )
    }
}

fn tc_attach(kernel: &str) -> Check {
    let version = kernel_version(kernel);
    match version {
        Some(v) if v >= (6, 6) => check("tc attach", Status::Ok, "tcx links (Linux 6.6+)"),
        Some(_) => check(
            "tc attach",
            Status::Ok,
            "netlink filters under clsact (no TCX before Linux 6.6): removed on exit, and a crashed agent's are removed at the next start",
        ),
        None => check(
            "tc attach",
            Status::Ok,
            "tcx when the kernel has it, else netlink filters under clsact",
        ),
    }
}

/// What `node_diag_tcp_resets_total{direction="sent"}` counts here: `tcp:tcp_send_reset`
/// fires for a reset sent without a socket (a SYN to a closed port: a refusal's reset)
/// only from Linux 6.10; before, it counts the resets of sockets alone.
fn sent_resets(kernel: &str) -> Check {
    let detail = match kernel_version(kernel) {
        Some(v) if v >= (6, 10) => {
            "counted for sockets and for packets no socket wanted (a closed port's refusals)"
        }
        Some(_) => {
            "counted for sockets only: before Linux 6.10, tcp_send_reset does not fire for a reset answering a packet no socket wanted, so node_diag_tcp_resets_total{direction=\"sent\"} misses this node's refusals (the refused verdicts, on the client's node, are unaffected)"
        }
        None => "counted for sockets, and from Linux 6.10 for packets no socket wanted",
    };
    check("sent resets", Status::Ok, detail)
}

/// `6.1.0-57-amd64` → (6, 1).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Each program loaded (not attached) through the verifier, as the agent configures it.
fn programs(checks: &mut Vec<Check>) {
    let opts = loader::Options {
        syn_retrans_threshold: 2,
        scoped: true,
        ebpf_log: crate::kernel::ebpf_log::Level::Off,
    };
    match loader::verify(&opts) {
        Ok(results) => {
            for (program, result) in results {
                let name = format!("program {program}");
                checks.push(match result {
                    Some(Ok(())) => check(name, Status::Ok, "accepted by this kernel's verifier"),
                    // An fentry hook only adds evidence, and some kernels refuse fentry
                    // outright (arm64 before 6.0, lockdown): the agent runs without it.
                    // A companion of a fallback only sharpens its evidence.
                    Some(Err(e)) if companions().any(|c| c.program == program) => {
                        let lost = companions()
                            .find(|c| c.program == program)
                            .map_or("", |c| c.feature);
                        check(name, Status::Warn, format!("refused: {e}; lost: {lost}"))
                    }
                    Some(Err(e)) if HOOKS.iter().any(|h| h.fentry && h.program == program) => {
                        let lost = HOOKS
                            .iter()
                            .find(|h| h.program == program)
                            .map_or("", |h| h.feature);
                        check(name, Status::Warn, format!("refused: {e}; lost: {lost}"))
                    }
                    Some(Err(e)) => check(name, Status::Fail, format!("rejected: {e}")),
                    // Its tracepoint's check above says what is lost.
                    None => check(
                        name,
                        Status::Warn,
                        "not loaded: its tracepoint is unusable on this kernel",
                    ),
                });
            }
        }
        Err(e) => checks.push(check("programs", Status::Fail, e.to_string())),
    }
}

impl Report {
    pub(crate) fn text(&self) -> String {
        let mut out = String::new();
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for c in &self.checks {
            let mark = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "WARN",
                Status::Fail => "FAIL",
            };
            out.push_str(&format!("{mark}  {:<width$}  {}\n", c.name, c.detail));
        }
        out.push_str(&format!("verdict: {} ({})\n", self.verdict, self.summary));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sent_resets_says_what_the_kernel_traces() {
        let old = sent_resets("6.1.0-57-amd64");
        assert!(old.detail.contains("sockets only"), "{}", old.detail);
        let new = sent_resets("6.12.48+deb13-amd64");
        assert!(new.detail.contains("no socket wanted"), "{}", new.detail);
        assert!(!new.detail.contains("sockets only"), "{}", new.detail);
        assert!(sent_resets("6.10.0").detail.contains("closed port"));
        assert!(matches!(old.status, Status::Ok));
    }
}
