//! `cargo xtask test`: the whole suite, in order, stopping at the first failing step.
//!
//! fmt, clippy, build, unit tests, the deploy checks (`deploy/tests/check.py`), then the
//! integration tests, which load the real eBPF programs and so need root (on this kernel,
//! then their kernel subset in a Debian 6.1 guest, `vm::KERNEL_SUBSET`), the release
//! cross builds for the container image's platforms (`cross.rs`), and last the bench
//! smoke run. As root the integration tests run through `cargo test`; otherwise they
//! are built as the invoking user and their binaries run through `sudo -E`, which keeps
//! the target directory owned by that user.

use std::{
    io::BufReader,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};
use cargo_metadata::{Artifact, Message};

use crate::{agent, cmd, cross, prereqs, say::test as say, vm};

/// The integration-test package.
const TESTS_PACKAGE: &str = "node-diag-tests";
/// The eBPF package; it only builds for BPF targets, through the agent's build script.
const EBPF_PACKAGE: &str = "node-diag-ebpf";
/// Tells the integration tests which agent binary to drive.
const BIN_ENV: &str = "NODE_DIAG_BIN";

/// Options of `cargo xtask test`.
pub struct Options {
    /// Stop after the unit tests.
    pub skip_integration: bool,
    /// Only the integration tests whose name contains this.
    pub filter: Option<String>,
    /// Kernels to run the integration tests on in a VM as well (`cargo xtask
    /// integration --kernel K`); empty for none.
    pub vm: Vec<String>,
    /// The whole suite in those VMs instead of the kernel subset.
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

    step("fmt", cargo(&["fmt", "--all", "--", "--check"]))?;
    step(
        "clippy",
        cargo(&[
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
    step("build", cargo(&["build", "-p", agent::PACKAGE]))?;
    step(
        "unit tests",
        cargo(&[
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
            integration(&privilege, options.filter.as_slice())?;
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
    if options.vm.is_empty() {
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
        options.vm.join(" --kernel "),
        if subset { " --subset" } else { "" }
    ));
    vm::run(&vm::Options {
        kernels: options.vm.clone(),
        arch: None,
        filters: options.filter.iter().cloned().collect(),
        subset,
        keep: false,
        timeout: vm::DEFAULT_TIMEOUT,
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
        step(STEP, cargo(&["xtask", "bench", "--smoke"]))?;
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

fn cargo(args: &[&str]) -> Command {
    let mut cargo = cmd::cargo();
    cargo.args(args);
    cargo
}

/// The privileged integration tests, one test at a time (they share the kernel).
pub(crate) fn integration(privilege: &cmd::Privilege, filters: &[String]) -> Result<()> {
    const STEP: &str = "integration tests";
    let agent = agent::binary(false)?;
    let harness_args = harness_args(filters);
    match privilege {
        cmd::Privilege::Root => {
            let mut test = cargo(&["test", "-p", TESTS_PACKAGE, "--"]);
            test.args(&harness_args).env(BIN_ENV, &agent);
            say(format_args!(
                "{STEP}: {BIN_ENV}={} {}",
                agent.display(),
                cmd::display(&test)
            ));
            cmd::run(&mut test).with_context(|| format!("test step `{STEP}` failed"))
        }
        cmd::Privilege::Sudo(_) => {
            let (manifest_dir, binaries) = build_test_binaries()
                .with_context(|| format!("test step `{STEP}` failed to build"))?;
            for binary in binaries {
                let mut test = privilege.command(&binary);
                test.args(&harness_args)
                    .current_dir(&manifest_dir)
                    .env("CARGO_MANIFEST_DIR", &manifest_dir)
                    .env(BIN_ENV, &agent);
                say(format_args!(
                    "{STEP}: {BIN_ENV}={} {}",
                    agent.display(),
                    cmd::display(&test)
                ));
                cmd::run(&mut test).with_context(|| format!("test step `{STEP}` failed"))?;
            }
            Ok(())
        }
    }
}

/// Arguments for the libtest harness: one thread, then the optional name filter.
fn harness_args(filters: &[String]) -> Vec<&str> {
    let mut args = vec!["--test-threads=1"];
    args.extend(filters.iter().map(String::as_str));
    args
}

/// Builds the integration tests without running them; returns the package directory
/// (the tests' working directory under `cargo test`) and the test executables.
pub(crate) fn build_test_binaries() -> Result<(PathBuf, Vec<PathBuf>)> {
    build_test_binaries_with(test_build_command())
}

/// `cargo test -p node-diag-tests --no-run` with JSON messages, for callers to extend
/// (`--target`, a linker) before [`build_test_binaries_with`] runs it.
pub(crate) fn test_build_command() -> Command {
    cargo(&[
        "test",
        "-p",
        TESTS_PACKAGE,
        "--no-run",
        "--message-format=json-render-diagnostics",
    ])
}

/// Runs `build` (from [`test_build_command`]) and returns what it built, as
/// [`build_test_binaries`] does.
pub(crate) fn build_test_binaries_with(mut build: Command) -> Result<(PathBuf, Vec<PathBuf>)> {
    build.stdout(Stdio::piped());
    let line = cmd::display(&build);
    say(format_args!("integration tests (build): {line}"));
    let mut child = build
        .spawn()
        .with_context(|| format!("failed to spawn `{line}`"))?;
    let stdout = child
        .stdout
        .take()
        .context("cargo's stdout was not piped")?;
    let mut binaries = Vec::new();
    let mut manifest_dir = None;
    for message in Message::parse_stream(BufReader::new(stdout)) {
        let message = message.with_context(|| format!("failed to read the output of `{line}`"))?;
        if let Message::CompilerArtifact(artifact) = message
            && let Some(executable) = test_executable(&artifact)
        {
            manifest_dir = manifest_dir.or_else(|| {
                Path::new(artifact.manifest_path.as_std_path())
                    .parent()
                    .map(Path::to_path_buf)
            });
            binaries.push(executable);
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("failed to wait for `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    match manifest_dir {
        Some(dir) if !binaries.is_empty() => Ok((dir, binaries)),
        _ => bail!("`{line}` built no test executable"),
    }
}

/// The executable of `artifact` if it is a test target (only the package under test
/// builds with the test profile).
fn test_executable(artifact: &Artifact) -> Option<PathBuf> {
    let executable = artifact.executable.as_ref()?;
    artifact
        .profile
        .test
        .then(|| executable.clone().into_std_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harness_args_put_the_filter_last() {
        assert_eq!(harness_args(&[]), ["--test-threads=1"]);
        assert_eq!(
            harness_args(&["refused".to_owned()]),
            ["--test-threads=1", "refused"]
        );
    }
}
