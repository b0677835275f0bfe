//! The integration tests (`node-diag-tests`) on this kernel: building their binaries
//! and running them one at a time. `cargo xtask test` runs them here, and `cargo xtask
//! integration` both here (`host`) and, built on the host, inside its guests; both
//! tasks sit above this module, so neither has to import the other.
//!
//! They are built as the invoking user, then their binaries run one after another, as
//! root or through `sudo -E` (which keeps the target directory owned by that user).

use std::{
    io::BufReader,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};
use cargo_metadata::{Artifact, Message};

use crate::{agent, cmd, say::test as say, steps::Counts};

/// The integration-test package.
pub(crate) const TESTS_PACKAGE: &str = "node-diag-tests";
/// Tells the integration tests which agent binary to drive.
const BIN_ENV: &str = "NODE_DIAG_BIN";

/// The privileged integration tests, one test at a time (they share the kernel): built,
/// then run as [`run_binaries`] does. Returns the tests they ran, passed or not.
pub(crate) fn run(privilege: &cmd::Privilege, filters: &[String]) -> (Counts, Result<()>) {
    const STEP: &str = "integration tests";
    let built = agent::binary(false).and_then(|agent| {
        let (manifest_dir, binaries) =
            build_test_binaries().with_context(|| format!("test step `{STEP}` failed to build"))?;
        Ok((agent, manifest_dir, binaries))
    });
    match built {
        Ok((agent, manifest_dir, binaries)) => {
            run_binaries(privilege, &agent, &manifest_dir, &binaries, filters)
        }
        Err(err) => (Counts::default(), Err(err)),
    }
}

/// Runs the test `binaries` one after another on `agent`, in `manifest_dir` as `cargo
/// test` would, with root (directly, or through `sudo -E`, which keeps the target
/// directory owned by the invoking user); stops at the first that fails. Running the
/// binaries rather than `cargo test` takes no lock on the target directory, so builds
/// can go on beside them.
pub(crate) fn run_binaries(
    privilege: &cmd::Privilege,
    agent: &Path,
    manifest_dir: &Path,
    binaries: &[PathBuf],
    filters: &[String],
) -> (Counts, Result<()>) {
    const STEP: &str = "integration tests";
    let harness_args = harness_args(filters);
    let mut counts = Counts::default();
    for binary in binaries {
        let mut test = privilege.command(binary);
        test.args(&harness_args)
            .current_dir(manifest_dir)
            .env("CARGO_MANIFEST_DIR", manifest_dir)
            .env(BIN_ENV, agent);
        say(format_args!(
            "{STEP}: {BIN_ENV}={} {}",
            agent.display(),
            cmd::display(&test)
        ));
        let (ran, result) = cmd::run_counting(&mut test);
        counts.add(ran);
        if let Err(err) = result {
            return (
                counts,
                Err(err).with_context(|| format!("test step `{STEP}` failed")),
            );
        }
    }
    (counts, Ok(()))
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
    cmd::cargo_with(&[
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
