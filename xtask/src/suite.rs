//! `cargo xtask test`: the whole suite, in order, stopping at the first failing step.
//!
//! fmt, clippy, build, unit tests, the deploy checks (`deploy/tests/check.py`), then the
//! integration tests, which load the real eBPF programs and so need root (on this kernel,
//! then their kernel subset in a Debian 6.1 guest and the fallback subset in a Debian 11
//! 5.10 guest, `vm/subset.rs`), the release
//! cross builds for the container image's platforms (`cross.rs`), and last the bench
//! smoke run. How the integration tests run, as root or through `sudo -E`, is
//! `integration_tests.rs`'s.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};

use crate::{
    agent, cmd, cross,
    integration_tests::{self, TESTS_PACKAGE},
    prereqs,
    say::test as say,
    vm,
};

/// The eBPF package; it only builds for BPF targets, through the agent's build script.
const EBPF_PACKAGE: &str = "node-diag-ebpf";

/// Options of `cargo xtask test`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Stop after the unit tests; skip the privileged integration tests.
    #[arg(long)]
    pub skip_integration: bool,
    /// Run only the integration tests whose name contains NAME.
    #[arg(long, value_name = "NAME")]
    pub filter: Option<String>,
    /// Also run the integration tests in a VM on this kernel (see `integration`);
    /// repeatable; `none` skips it. By default 6.1 and 5.10 (the fallbacks' kernel);
    /// `--vm 6.1` alone saves about 10 minutes. Each guest runs its kernel's subset (see
    /// `integration --subset`) unless --vm-whole-suite or --filter is given.
    #[arg(long = "vm", value_name = "KERNEL", default_values = ["6.1", "5.10"])]
    pub vm: Vec<String>,
    /// Run the whole integration suite in the VMs, not the kernel subset.
    #[arg(long)]
    pub vm_whole_suite: bool,
}

pub fn run(options: &Options) -> Result<()> {
    // Fail before the long steps if the integration tests could not get root anyway.
    let privilege = if options.skip_integration {
        None
    } else {
        Some(cmd::Privilege::acquire(
            "the integration tests (they load eBPF programs)",
            "run `cargo xtask test` as root, or add --skip-integration",
        )?)
    };
    prereqs::ensure(prereqs::Tools::TEST)?;

    step("fmt", cmd::cargo_with(&["fmt", "--all", "--", "--check"]))?;
    step(
        "clippy",
        cmd::cargo_with(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--exclude",
            EBPF_PACKAGE,
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    step("build", cmd::cargo_with(&["build", "-p", agent::PACKAGE]))?;
    step(
        "unit tests",
        cmd::cargo_with(&[
            "test",
            "--workspace",
            "--exclude",
            EBPF_PACKAGE,
            "--exclude",
            TESTS_PACKAGE,
        ]),
    )?;

    step("deploy checks", deploy_checks())?;

    match privilege {
        None => say("integration tests: skipped (--skip-integration)"),
        Some(privilege) => {
            integration_tests::run(&privilege, options.filter.as_slice())?;
            vm_integration(options)?;
        }
    }
    if options.filter.is_some() {
        say("cross builds: skipped (--filter runs only the matching tests)");
    } else {
        cross::run().context("test step `cross builds` failed")?;
    }
    bench_smoke(options)?;
    say("all steps passed");
    Ok(())
}

/// The integration tests again inside Debian kernels (TCX-less 6.1 by default), which
/// is where kernel differences show: verifier limits, tracepoint layouts, TC attachment.
fn vm_integration(options: &Options) -> Result<()> {
    const STEP: &str = "integration tests in VMs";
    // `--vm none` leaves the step out.
    let kernels: Vec<String> = options
        .vm
        .iter()
        .filter(|k| *k != "none")
        .cloned()
        .collect();
    if kernels.is_empty() {
        say(format_args!("{STEP}: skipped (--vm none)"));
        return Ok(());
    }
    if !cmd::is_root() {
        say(format_args!(
            "{STEP}: skipped (needs root: run `cargo xtask test` as root)"
        ));
        return Ok(());
    }
    let subset = !options.vm_whole_suite && options.filter.is_none();
    say(format_args!(
        "{STEP}: cargo xtask integration --kernel {}{}",
        kernels.join(" --kernel "),
        if subset { " --subset" } else { "" }
    ));
    vm::run(&vm::Options {
        kernels,
        arch: None,
        filters: options.filter.iter().cloned().collect(),
        subset,
        keep: false,
        timeout: vm::DEFAULT_TIMEOUT.as_secs() / 60,
        update_readme: false,
    })
    .with_context(|| format!("test step `{STEP}` failed"))
}

/// Announces `cmd` as step `name`, runs it, and names the step if it fails.
fn step(name: &str, mut cmd: Command) -> Result<()> {
    say(format_args!("{name}: {}", cmd::display(&cmd)));
    cmd::run(&mut cmd).with_context(|| format!("test step `{name}` failed"))
}

/// Last step: `cargo xtask bench --smoke`, so the benchmark keeps working. It fails only
/// when the benchmark breaks; its table (targets included) is for people to read. It needs
/// root, and runs as root only: under sudo it would leave root-owned build files behind.
fn bench_smoke(options: &Options) -> Result<()> {
    const STEP: &str = "bench smoke";
    if options.filter.is_some() {
        say(format_args!("{STEP}: skipped (--filter)"));
    } else if options.skip_integration {
        say(format_args!("{STEP}: skipped (--skip-integration)"));
    } else if !cmd::is_root() {
        say(format_args!(
            "{STEP}: skipped (needs root: run `cargo xtask test` as root)"
        ));
    } else {
        step(STEP, cmd::cargo_with(&["xtask", "bench", "--smoke"]))?;
    }
    Ok(())
}

/// deploy/tests/check.py: the manifests rendered and validated against the Kubernetes
/// schemas, yamllint, promtool on the alert rules and their unit tests, the runbooks,
/// the Grafana dashboard and the Dockerfile.
fn deploy_checks() -> Command {
    let mut python = cmd::command("python3");
    python.arg(Path::new("deploy").join("tests").join("check.py"));
    if let Ok(metadata) = cmd::metadata() {
        python.current_dir(metadata.workspace_root.as_std_path());
    }
    python
}
