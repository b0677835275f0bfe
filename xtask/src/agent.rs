//! `cargo xtask build` and `cargo xtask run`: the agent binary.
//!
//! The agent's build script compiles the eBPF crate (aya-build), so building the agent
//! is a plain `cargo build -p node-diag`.

use std::{ffi::OsString, os::unix::process::CommandExt as _, path::PathBuf};

use anyhow::{Context as _, Result};

use crate::{cmd, prereqs, say};

/// The agent's package and binary name.
pub const PACKAGE: &str = "node-diag";

/// `cargo build -p node-diag [--release]`.
pub fn build(release: bool) -> Result<()> {
    let mut build = cmd::cargo();
    build.args(["build", "-p", PACKAGE]);
    if release {
        build.arg("--release");
    }
    say::say("build", cmd::display(&build));
    cmd::run(&mut build)
}

/// The built agent: `<target dir>/<debug|release>/node-diag`.
pub fn binary(release: bool) -> Result<PathBuf> {
    let profile = if release { "release" } else { "debug" };
    Ok(cmd::target_dir()?.join(profile).join(PACKAGE))
}

/// Builds the agent, then replaces this process with `node-diag run <args>` (through
/// `sudo -E` when not root), so the agent receives SIGINT/SIGTERM itself and its exit
/// code is the command's.
pub fn run(release: bool, args: &[OsString]) -> Result<()> {
    let privilege = cmd::Privilege::acquire(
        "the agent (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN)",
        "run `cargo xtask run` as root",
    )?;
    prereqs::ensure(prereqs::Tools::BUILD)?;
    build(release)?;
    let mut agent = privilege.command(binary(release)?);
    agent.arg("run").args(args);
    let line = cmd::display(&agent);
    say::say("run", &line);
    // exec only returns on failure.
    let err = agent.exec();
    Err(err).with_context(|| format!("failed to exec `{line}`"))
}
