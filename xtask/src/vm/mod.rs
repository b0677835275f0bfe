//! `cargo xtask integration`: the integration suite on the kernels nodes run.
//!
//! `host` runs the test binaries on this machine's kernel, as `cargo xtask test` does.
//! Every other entry boots a Debian kernel under qemu and runs the same binaries, built
//! on the host, inside it:
//!
//! ```text
//! kernel.rs    apt-get download + dpkg-deb -x + depmod  →  Kernel (image, modules)
//! initramfs.rs busybox + root modules + init + guest.sh  →  newc cpio
//! qemu.rs      qemu-system-* (KVM when a probe boot works, else TCG), 9p shares,
//!              console streamed as `[vm 6.1] ...`, deadline
//! guest.rs     inside the guest: mounts, doctor, each test binary  →  results share
//! arm64.rs     the aarch64 userland (mmdebstrap) and the cross-built tests
//! ```
//!
//! An x86_64 guest's root is the host's `/` (read-only over 9p, under a tmpfs overlay),
//! so the host's `ip`, `nft`, `python3` and the built binaries run unchanged. An aarch64
//! guest's root is a Debian arm64 userland, with the workspace shared at its host path.
//! Each run leaves `target/vm/runs/<kernel>-<arch>/` (console log, doctor report,
//! results) and the matrix's outcome in `target/vm/results.json` and `results.md`, the
//! table the README's kernel support section records.

mod arch;
mod arm64;
mod guest;
mod initramfs;
mod kernel;
mod qemu;

pub use self::arch::Arch;

use std::{
    fmt, fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use crate::{agent, cmd, integration_tests, prereqs, say::integration as say};

/// The tests an aarch64 guest runs when no `--filter` is given: TCG emulating another
/// architecture is several times slower, so the subset that proves the eBPF object
/// passes the arm64 verifier and its BTF offsets resolve: doctor (always run), refused,
/// timeout, reset, the PMTUD black hole and a clean shutdown.
pub const ARM64_SUBSET: &[&str] = &[
    "refused_connect_is_a_listener_problem",
    "forward_drop_timeout_is_a_firewall_problem",
    "reset_by_peer_is_reported_as_reset_not_refused",
    "sigterm_exits_cleanly_and_detaches",
    "filtered_frag_needed_is_a_pmtud_black_hole",
];

/// The tests `cargo xtask test` runs in its x86_64 guest when no `--filter` is given
/// (`integration --subset` runs them too). The whole suite under TCG takes 45-50 minutes,
/// which CI's 90 cannot hold beside everything else on a slow day, and most of it tests
/// user space the host run already proved. These are the tests where the kernel differs:
/// every program through this kernel's verifier and read paths (probe reads before 6.2),
/// each verdict's kernel evidence (resets sent and received, ICMP errors through the TC
/// classifier, drop reasons by this kernel's numbering, retransmits and stalls), TC
/// attachment through netlink and its cleanup after SIGTERM and `kill -9` (no TCX before
/// 6.6), conntrack drops, IPv6 and IPv4-mapped sockets, the PMTUD black hole, Services
/// rejected by netfilter, and the real tunnels (Geneve, WireGuard, IPIP, GRE), which this
/// machine's kernel does not have. Each name matches one test, except `tunnels`, which
/// matches that binary's module.
pub const KERNEL_SUBSET: &[&str] = &[
    // scenarios
    "refused_connect_is_a_listener_problem",
    "reset_sent_for_a_closed_port_counts_on_the_node_that_sent_it",
    "forward_drop_timeout_is_a_firewall_problem",
    "reset_by_peer_is_reported_as_reset_not_refused",
    "missing_pod_route_is_a_cni_routing_problem",
    "sigterm_exits_cleanly_and_detaches",
    "drop_beyond_this_node_is_a_timeout_of_unknown_layer",
    "doctor_has_every_program_accepted_and_reads_as_this_kernel_allows",
    // verdicts
    "dead_peer_bulk_transfer_is_a_stall_not_a_black_hole",
    "local_reject_with_tcp_reset_is_this_nodes_firewall",
    "remote_icmp_port_unreachable_is_a_firewall_not_the_listener",
    "abandoned_connect_with_local_drop_is_a_timeout",
    "connect_that_succeeds_late_resolves_its_timeout",
    "connect_completed_by_a_simultaneous_open_resolves_its_timeout",
    "one_socket_connecting_again_is_judged_per_attempt",
    "v4_mapped_sockets_keep_their_evidence",
    "syn_ack_dropped_on_the_return_path_is_this_nodes_firewall",
    "server_side_resets_aggregate_per_listener",
    "icmp_watched_on_trouble_names_the_sender_from_the_next_failure",
    // storm
    "refused_storm_is_aggregated_in_the_kernel_and_accounted_exactly",
    "resets_whose_error_the_client_takes_at_once_are_each_the_listeners_refusal",
    // tc_fallback
    "netlink_mode_sigterm_leaves_no_filter_and_no_clsact",
    "killed_agents_filters_are_replaced_and_their_clsact_removed_on_exit",
    "foreign_clsact_and_filter_survive_start_and_sigterm",
    "netlink_filter_sees_frag_needed_from_beyond_this_node",
    // drops, conntrack
    "drops_are_counted_by_reason_in_this_nodes_namespaces_only",
    "syn_dropped_by_a_full_conntrack_table_is_conntrack",
    "syn_ack_dropped_as_invalid_is_conntrack",
    // ipv6
    "ipv6_port_unreachable_reject_is_a_firewall_not_the_listener",
    "ipv6_admin_prohibited_is_a_firewall",
    "ipv6_closed_port_is_the_listener",
    "ipv6_oversize_drop_with_pmtud_working_is_info",
    // mtu
    "filtered_frag_needed_is_a_pmtud_black_hole",
    "oversized_pod_mtu_with_icmp_allowed_is_an_oversize_drop_that_recovers",
    "unbound_vxlan_above_its_underlay_is_an_overlay_mismatch",
    "frag_needed_from_beyond_this_node_is_counted_as_received",
    "masqueraded_flow_with_frag_needed_filtered_is_a_black_hole",
    // nat
    "service_rejected_on_this_node_is_the_firewall_not_the_listener",
    "service_rejected_by_icmp_beyond_this_node_is_a_firewall_not_the_service",
    "no_endpoints_is_the_service_with_nftables",
    // every real tunnel kind
    "tunnels",
];

/// How long a guest may run: the whole suite under TCG takes most of it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(75 * 60);

/// Options of `cargo xtask integration`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Kernels: host, 6.1, 6.12 or all (host, 6.1 and 6.12 on x86_64, plus the
    /// arm64 subset on 6.1). Repeatable.
    #[arg(long = "kernel", value_name = "KERNEL", default_value = "host")]
    pub kernels: Vec<String>,
    /// Only this guest architecture (aarch64 runs a subset unless --filter is given).
    #[arg(long, value_enum)]
    pub arch: Option<Arch>,
    /// Run only the tests whose name contains NAME (repeatable: any matches).
    #[arg(long = "filter", value_name = "NAME")]
    pub filters: Vec<String>,
    /// In x86_64 guests, run only the kernel subset (`cargo xtask test`'s VM step):
    /// the tests where kernels differ, not the whole suite.
    #[arg(long, conflicts_with = "filters")]
    pub subset: bool,
    /// Keep each guest's run directory (initramfs, console log, results).
    #[arg(long)]
    pub keep: bool,
    /// Minutes a guest may run before it is killed and the run fails.
    #[arg(long, value_name = "MINUTES", default_value_t = DEFAULT_TIMEOUT.as_secs() / 60,
          value_parser = clap::value_parser!(u64).range(1..=600))]
    pub timeout: u64,
    /// Record the outcome in README.md's kernel support table.
    #[arg(long)]
    pub update_readme: bool,
}

impl Options {
    /// Deadline per guest.
    fn deadline(&self) -> Duration {
        Duration::from_secs(self.timeout * 60)
    }
}

/// One entry of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Host,
    Vm(kernel::Series, Arch),
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Host => f.write_str("host"),
            Self::Vm(series, arch) => write!(f, "{} {arch}", series.name),
        }
    }
}

/// Expands the command line into matrix entries, in order, each once.
fn entries(kernels: &[String], arch: Option<Arch>) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut push = |e: Entry| {
        if !out.contains(&e) {
            out.push(e);
        }
    };
    let kernels: Vec<&str> = if kernels.is_empty() {
        vec!["host"]
    } else {
        kernels.iter().map(String::as_str).collect()
    };
    for name in kernels {
        match name {
            "host" => match arch {
                None | Some(Arch::X86_64) => push(Entry::Host),
                Some(Arch::Aarch64) => bail!(
                    "--kernel host runs on this machine, which is x86_64: use --kernel 6.1 or 6.12 with --arch aarch64"
                ),
            },
            "all" => {
                if arch != Some(Arch::Aarch64) {
                    push(Entry::Host);
                    for s in kernel::SERIES {
                        push(Entry::Vm(*s, Arch::X86_64));
                    }
                }
                if arch != Some(Arch::X86_64) {
                    // The arm64 subset on the oldest kernel nodes run, under TCG.
                    push(Entry::Vm(kernel::SERIES[0], Arch::Aarch64));
                }
            }
            name => {
                let series = kernel::series(name).with_context(|| {
                    let known: Vec<_> = kernel::SERIES.iter().map(|s| s.name).collect();
                    format!(
                        "unknown kernel `{name}`: expected host, {} or all",
                        known.join(", ")
                    )
                })?;
                push(Entry::Vm(series, arch.unwrap_or(Arch::X86_64)));
            }
        }
    }
    Ok(out)
}

/// The outcome of one matrix entry.
#[derive(Debug, Serialize)]
pub struct Outcome {
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
    /// The agent's `doctor` verdict and how it attaches TC programs there.
    pub doctor: String,
    pub tc_attach: String,
    pub passed: bool,
    pub seconds: u64,
    /// Why it failed, when it did not get as far as a test failure.
    pub error: Option<String>,
}

pub fn run(options: &Options) -> Result<()> {
    let entries = entries(&options.kernels, options.arch)?;
    if !cmd::is_root() {
        bail!(
            "`cargo xtask integration` needs root (the tests load eBPF programs; the guests' 9p shares map root): run it as root"
        );
    }
    let vm_arches: Vec<Arch> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Vm(_, arch) => Some(*arch),
            Entry::Host => None,
        })
        .collect();
    prereqs::ensure(prereqs::Tools::TEST)?;
    if !vm_arches.is_empty() {
        prereqs::ensure_vm(vm_arches.contains(&Arch::Aarch64))?;
    }
    let target = cmd::target_dir()?;
    let root = target.join("vm");
    let mut outcomes = Vec::new();
    let mut builds = Builds::default();
    for entry in &entries {
        say(format_args!("=== {entry}: starting"));
        let started = Instant::now();
        let outcome = match *entry {
            Entry::Host => run_host(options),
            Entry::Vm(series, arch) => builds
                .get(arch)
                .and_then(|build| run_vm(series, arch, build, &root, options)),
        };
        let mut outcome = outcome.unwrap_or_else(|err| Outcome {
            kernel: entry.to_string(),
            arch: match entry {
                Entry::Vm(_, arch) => *arch,
                Entry::Host => Arch::X86_64,
            },
            release: String::new(),
            accel: String::new(),
            suite: String::new(),
            tests: Vec::new(),
            doctor: String::new(),
            tc_attach: String::new(),
            passed: false,
            seconds: 0,
            error: Some(format!("{err:#}")),
        });
        outcome.seconds = started.elapsed().as_secs();
        say(format_args!(
            "=== {entry}: {} in {}",
            if outcome.passed { "PASSED" } else { "FAILED" },
            minutes(outcome.seconds)
        ));
        outcomes.push(outcome);
    }
    fs::create_dir_all(&root)?;
    let table = table(&outcomes);
    fs::write(root.join("results.md"), &table)?;
    fs::write(
        root.join("results.json"),
        serde_json::to_string_pretty(&outcomes)?,
    )?;
    println!("\n{table}");
    if options.update_readme {
        let readme = cmd::metadata()?.workspace_root.join("README.md");
        let text = fs::read_to_string(&readme)?;
        fs::write(&readme, merge_readme(&text, &outcomes)?)?;
        say(format_args!("recorded in {readme}"));
    }
    say(format_args!(
        "results: {} and results.json",
        root.join("results.md").display()
    ));
    let failed: Vec<_> = outcomes
        .iter()
        .filter(|o| !o.passed)
        .map(|o| format!("{} {}", o.kernel, o.error.as_deref().unwrap_or("")))
        .collect();
    if !failed.is_empty() {
        bail!("integration suite failed on: {}", failed.join("; "));
    }
    Ok(())
}

/// The binaries a guest runs.
#[derive(Debug, Clone)]
struct Build {
    agent: PathBuf,
    manifest_dir: PathBuf,
    binaries: Vec<PathBuf>,
}

/// Each architecture's binaries, built once per invocation.
#[derive(Default)]
struct Builds {
    x86_64: Option<Build>,
    aarch64: Option<Build>,
}

impl Builds {
    fn get(&mut self, arch: Arch) -> Result<&Build> {
        let slot = match arch {
            Arch::X86_64 => &mut self.x86_64,
            Arch::Aarch64 => &mut self.aarch64,
        };
        if slot.is_none() {
            *slot = Some(match arch {
                Arch::X86_64 => build_host()?,
                Arch::Aarch64 => build_arm64()?,
            });
        }
        Ok(slot.as_ref().expect("just built"))
    }
}

fn build_arm64() -> Result<Build> {
    let build = arm64::cross_build(false)?;
    Ok(Build {
        agent: build.agent,
        manifest_dir: build.test_manifest_dir,
        binaries: build.test_binaries,
    })
}

fn build_host() -> Result<Build> {
    agent::build(false)?;
    let (manifest_dir, binaries) = integration_tests::build_test_binaries()?;
    Ok(Build {
        agent: agent::binary(false)?,
        manifest_dir,
        binaries,
    })
}

fn run_host(options: &Options) -> Result<Outcome> {
    agent::build(false)?;
    let privilege = cmd::Privilege::Root;
    let ok = integration_tests::run(&privilege, &options.filters).is_ok();
    let release = cmd::output(cmd::command("uname").arg("-r"))?
        .trim()
        .to_owned();
    let doctor = doctor_summary(
        &cmd::output(cmd::command(agent::binary(false)?).args(["doctor", "-o", "json"]))
            .unwrap_or_default(),
    );
    Ok(Outcome {
        kernel: "host".into(),
        arch: Arch::X86_64,
        release,
        accel: "host".into(),
        suite: suite_name(&options.filters, false, Arch::X86_64),
        tests: Vec::new(),
        doctor: doctor.0,
        tc_attach: doctor.1,
        passed: ok,
        seconds: 0,
        error: (!ok).then(|| "a test failed (output above)".to_owned()),
    })
}

fn suite_name(filters: &[String], subset: bool, arch: Arch) -> String {
    match (filters.is_empty(), arch) {
        (true, Arch::X86_64) if subset => "kernel subset".into(),
        (true, Arch::X86_64) => "whole suite".into(),
        (true, Arch::Aarch64) => "arm64 subset".into(),
        (false, _) => format!("filter: {}", filters.join(" ")),
    }
}

/// The name filters a guest of `arch` runs with.
fn guest_filters(filters: &[String], subset: bool, arch: Arch) -> Vec<String> {
    if !filters.is_empty() {
        return filters.to_vec();
    }
    let named: &[&str] = match arch {
        Arch::Aarch64 => ARM64_SUBSET,
        Arch::X86_64 if subset => KERNEL_SUBSET,
        Arch::X86_64 => &[],
    };
    named.iter().map(|s| (*s).to_owned()).collect()
}

fn run_vm(
    series: kernel::Series,
    arch: Arch,
    build: &Build,
    root: &Path,
    options: &Options,
) -> Result<Outcome> {
    qemu::require(arch)?;
    let cache = root.join("cache");
    let package = series.newest_package(arch)?;
    let kernel = kernel::fetch(&package, arch, &cache)?;
    say(format_args!("{package}: kernel {}", kernel.release));
    let run_dir = root.join("runs").join(format!("{}-{arch}", series.name));
    if run_dir.exists() {
        fs::remove_dir_all(&run_dir)?;
    }
    let out = run_dir.join("out");
    fs::create_dir_all(&out)?;

    let busybox = match arch {
        Arch::X86_64 => host_busybox()?,
        Arch::Aarch64 => arm64::busybox(&arm64::userland(&cache)?),
    };
    let modules = kernel.modules_for(ROOT_MODULES)?;
    let filters = guest_filters(&options.filters, options.subset, arch);
    let (root_dir, workspace) = match arch {
        Arch::X86_64 => (PathBuf::from("/"), None::<PathBuf>),
        Arch::Aarch64 => (
            arm64::userland(&cache)?,
            Some(cmd::metadata()?.workspace_root.into_std_path_buf()),
        ),
    };
    let probe = run_dir.join("probe.cpio");
    initramfs::write_probe(&busybox, &qemu::probe_init(), &probe)?;
    let accel = qemu::pick_accel(arch, &kernel.image, &probe, &run_dir.join("probe.log"))?;
    say(format_args!("accelerator: {}", accel.name()));

    let script = guest::script(&guest::Plan {
        agent: &build.agent,
        manifest_dir: &build.manifest_dir,
        binaries: &build.binaries,
        filters: &filters,
        // Emulated CPUs run several times slower than the host's.
        time_scale: match accel {
            qemu::Accel::Kvm => 1,
            qemu::Accel::Tcg => TCG_TIME_SCALE,
        },
    });
    let initrd = run_dir.join("initramfs.cpio");
    initramfs::write(
        &initramfs::Contents {
            busybox: &busybox,
            modules: &modules,
            workspace: workspace.as_deref(),
            guest_script: &script,
        },
        &run_dir.join("scratch"),
        &initrd,
    )?;

    let mut shares = vec![
        qemu::Share {
            tag: initramfs::TAG_ROOT,
            path: root_dir,
            readonly: true,
        },
        qemu::Share {
            tag: initramfs::TAG_MODULES,
            path: kernel.modules.clone(),
            readonly: true,
        },
        qemu::Share {
            tag: initramfs::TAG_OUT,
            path: out.clone(),
            readonly: false,
        },
    ];
    if let Some(ws) = &workspace {
        shares.push(qemu::Share {
            tag: initramfs::TAG_WORKSPACE,
            path: ws.clone(),
            readonly: true,
        });
    }
    let machine = qemu::Machine {
        arch,
        accel,
        image: &kernel.image,
        initramfs: &initrd,
        shares: &shares,
        memory_mib: 4096,
        cpus: 2,
    };
    let prefix = format!(
        "[vm {}{}]",
        series.name,
        if arch.is_host() { "" } else { " arm64" }
    );
    let mut attempt = 1;
    let boot = loop {
        let boot = machine.boot(
            &prefix,
            &run_dir.join("console.log"),
            options.deadline(),
            false,
            &[
                INIT_UP,
                "ND-VM-INIT-FAILED",
                "Kernel panic",
                "ND-VM-TEST-END",
                POWER_OFF,
            ],
        )?;
        // A kernel that dies before reaching the init script ran nothing of ours: seen
        // under TCG (an int3 oops in early boot), it says nothing about the agent.
        let reached_init = boot.markers.iter().any(|l| l.contains(INIT_UP));
        if reached_init || attempt == BOOT_ATTEMPTS {
            break boot;
        }
        say(format_args!(
            "the guest died before its init ran (attempt {attempt} of {BOOT_ATTEMPTS}): booting again"
        ));
        attempt += 1;
    };

    let tests = read_results(&out.join("results"));
    let done = out.join("done").exists();
    let (doctor, tc_attach) =
        doctor_summary(&fs::read_to_string(out.join("doctor.json")).unwrap_or_default());
    let error = if !boot.exited {
        Some(format!(
            "the guest did not finish within {} (console: {})",
            minutes(options.deadline().as_secs()),
            run_dir.join("console.log").display()
        ))
    } else if let Some(line) = boot
        .markers
        .iter()
        // What happens once the power-off began is not the tests' doing.
        .take_while(|l| !l.contains(POWER_OFF))
        .find(|l| l.contains("ND-VM-INIT-FAILED") || l.contains("Kernel panic"))
    {
        Some(format!("the guest failed: {line}"))
    } else if !done {
        Some("the guest stopped before the tests finished (crash?)".to_owned())
    } else if tests.len() != build.binaries.len() {
        Some(format!(
            "{} of {} test binaries reported",
            tests.len(),
            build.binaries.len()
        ))
    } else {
        tests
            .iter()
            .filter(|(_, rc, _)| *rc != 0)
            .map(|(name, rc, _)| format!("{name} exited {rc}"))
            .reduce(|a, b| format!("{a}, {b}"))
    };
    if options.keep {
        say(format_args!("kept {}", run_dir.display()));
    } else {
        let _ = fs::remove_file(&initrd);
        let _ = fs::remove_dir_all(run_dir.join("scratch"));
    }
    Ok(Outcome {
        kernel: series.name.to_owned(),
        arch,
        release: kernel.release,
        accel: accel.name().to_owned(),
        suite: suite_name(&options.filters, options.subset, arch),
        tests,
        doctor,
        tc_attach,
        passed: error.is_none(),
        seconds: boot.elapsed.as_secs(),
        error,
    })
}

/// What the init script prints once the kernel ran it.
const INIT_UP: &str = "ND-VM-INIT: kernel";
/// Boots tried when a guest dies before its init runs.
const BOOT_ATTEMPTS: u32 = 3;

/// What the guest's kernel prints when the guest script powers it off.
const POWER_OFF: &str = "sysrq: Power Off";

/// How much longer the tests wait on the agent in a TCG guest.
const TCG_TIME_SCALE: u32 = 4;

/// Modules the initramfs loads to mount its root: virtio PCI, 9p over virtio, overlayfs
/// (built-in ones are skipped; their dependencies come along).
const ROOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "overlay"];

fn host_busybox() -> Result<PathBuf> {
    let path = PathBuf::from("/bin/busybox");
    let data =
        fs::read(&path).context("/bin/busybox is missing: apt-get install busybox-static")?;
    // busybox (dynamic) links against the host's libc, absent from the initramfs.
    let elf = object::File::parse(&*data).context("/bin/busybox is not an ELF file")?;
    if object::Object::section_by_name(&elf, ".interp").is_some() {
        bail!("/bin/busybox is dynamically linked: apt-get install busybox-static");
    }
    Ok(path)
}

/// `name exit seconds` lines.
fn read_results(path: &Path) -> Vec<(String, i32, u64)> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut it = line.split_whitespace();
            Some((
                it.next()?.to_owned(),
                it.next()?.parse().ok()?,
                it.next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// Doctor checks about the node rather than its kernel: a guest has no container
/// runtime, and the table is about kernels.
const NODE_CHECKS: &[&str] = &["container runtime"];

/// (verdict, TC attachment) from `node-diag doctor -o json`. The verdict is the kernel's:
/// degraded only by checks not about the node (`ready (no CRI)` when a missing container
/// runtime socket was the only shortfall).
fn doctor_summary(json: &str) -> (String, String) {
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

fn minutes(seconds: u64) -> String {
    format!("{}m{:02}s", seconds / 60, seconds % 60)
}

/// The markdown table of a matrix run.
fn table(outcomes: &[Outcome]) -> String {
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

/// Markers around the README's kernel support table.
const README_BEGIN: &str = "<!-- kernel-support:begin -->";
const README_END: &str = "<!-- kernel-support:end -->";
const TABLE_HEAD: &str =
    "| kernel | arch | release | accel | TC attach | doctor | suite | result | wall time |";

/// The README with this run's rows in its kernel support table: a row per (kernel,
/// arch), replaced when run again, others kept; host first, then by kernel and arch.
fn merge_readme(readme: &str, outcomes: &[Outcome]) -> Result<String> {
    let (Some(begin), Some(end)) = (readme.find(README_BEGIN), readme.find(README_END)) else {
        bail!("README.md has no {README_BEGIN} … {README_END} block");
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

    fn names(kernels: &[&str], arch: Option<Arch>) -> Vec<String> {
        let kernels: Vec<String> = kernels.iter().map(|k| (*k).to_owned()).collect();
        entries(&kernels, arch)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// A renamed test would silently leave the subset, and a name that is part of another
    /// would bring that one in: every name (a libtest substring filter) must select one
    /// test function of the integration suite, or, for `tunnels`, just its module.
    #[test]
    fn every_subset_name_selects_one_integration_test() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tests");
        let mut sources = String::new();
        for entry in fs::read_dir(&dir).unwrap() {
            sources.push_str(&fs::read_to_string(entry.unwrap().path()).unwrap());
        }
        let tests: Vec<&str> = sources
            .split("#[test]")
            .skip(1)
            .filter_map(|after| after.split("fn ").nth(1)?.split('(').next())
            .collect();
        assert!(tests.len() > 100, "found only {} tests", tests.len());
        for name in KERNEL_SUBSET.iter().chain(ARM64_SUBSET) {
            let selected = tests.iter().filter(|t| t.contains(name)).count();
            let modules = sources.matches(&format!("mod {name} {{")).count();
            assert_eq!(
                (selected, modules),
                if modules == 1 { (0, 1) } else { (1, 0) },
                "{name} selects {selected} test functions and names {modules} modules"
            );
        }
    }

    #[test]
    fn filters_win_then_the_arch_subset_then_the_kernel_subset() {
        let given = vec!["mtu".to_owned()];
        assert_eq!(guest_filters(&given, true, Arch::X86_64), given);
        assert_eq!(
            guest_filters(&[], true, Arch::Aarch64).len(),
            ARM64_SUBSET.len()
        );
        assert_eq!(
            guest_filters(&[], true, Arch::X86_64).len(),
            KERNEL_SUBSET.len()
        );
        assert!(guest_filters(&[], false, Arch::X86_64).is_empty());
        assert_eq!(suite_name(&[], true, Arch::X86_64), "kernel subset");
        assert_eq!(suite_name(&[], false, Arch::X86_64), "whole suite");
    }

    #[test]
    fn all_is_host_both_series_and_the_arm64_subset() {
        assert_eq!(
            names(&["all"], None),
            ["host", "6.1 x86_64", "6.12 x86_64", "6.1 aarch64"]
        );
        assert_eq!(names(&["all"], Some(Arch::Aarch64)), ["6.1 aarch64"]);
        assert_eq!(names(&["6.1", "host", "6.1"], None), ["6.1 x86_64", "host"]);
        assert_eq!(names(&[], None), ["host"]);
        assert!(entries(&["5.4".to_owned()], None).is_err());
        assert!(entries(&["host".to_owned()], Some(Arch::Aarch64)).is_err());
    }

    fn outcome(kernel: &str, arch: Arch, passed: bool) -> Outcome {
        Outcome {
            kernel: kernel.into(),
            arch,
            release: "r".into(),
            accel: "tcg".into(),
            suite: "whole suite".into(),
            tests: Vec::new(),
            doctor: "ready".into(),
            tc_attach: "tcx".into(),
            passed,
            seconds: 61,
            error: None,
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
