//! Developer tasks for node-diag, run as `cargo xtask <command>`.
//!
//! - `prereqs`: checks (and where it can, installs) what building needs: the nightly
//!   toolchain, its `rust-src` component and `bpf-linker` built against LLVM 22.
//! - `build`: builds the agent; its build script compiles the eBPF programs.
//! - `run`: builds the agent and runs it in the foreground as root.
//! - `test`: formatting, clippy, build, unit tests, then the privileged integration tests.
//! - `bench`: the agent's overhead against a no-agent baseline, in network namespaces.
//!
//! Every step prints one line prefixed with its task (`[prereqs]`, `[build]`, `[run]`,
//! `[test]`), and child processes inherit stdio so their output shows as it happens.

mod agent;
mod bench;
mod cmd;
mod cross;
mod integration_tests;
mod prereqs;
mod say;
mod steps;
mod suite;
mod vm;

use std::{ffi::OsString, process::ExitCode};

use clap::{Parser, Subcommand};

/// Developer tasks for node-diag.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check the build prerequisites and install the missing ones.
    ///
    /// Needs the nightly toolchain; installs its rust-src component and bpf-linker
    /// (with Debian's LLVM 22 development packages, as root) when they are missing.
    Prereqs {
        /// Also check the tools the integration tests drive (ip, nft, bpftool, ping).
        #[arg(long)]
        test_tools: bool,
    },
    /// Check the prerequisites, then build the agent (`cargo build -p node-diag`).
    Build {
        /// Build with the release profile.
        #[arg(long)]
        release: bool,
    },
    /// Build the agent and run `node-diag run` in the foreground (as root, or via `sudo -E`).
    Run {
        /// Build and run the release profile.
        #[arg(long)]
        release: bool,
        /// Arguments passed to `node-diag run`, after `--`.
        #[arg(last = true, value_name = "AGENT ARGS")]
        args: Vec<OsString>,
    },
    /// Run the whole suite: fmt, clippy, build, unit tests, integration tests (root).
    Test(suite::Options),
    /// Run the integration suite on other kernels: Debian's 6.1 and 6.12 booted under
    /// qemu (KVM when it works, else TCG), x86_64 and aarch64, or this machine's (`host`).
    ///
    /// Downloads and caches the kernel packages under target/vm, builds an initramfs,
    /// boots each kernel with the host's root (x86_64) or a Debian arm64 userland
    /// (aarch64) shared over 9p, runs the test binaries built on the host inside it and
    /// streams the console. Exits non-zero on a failed test, a guest crash or a timeout.
    /// Needs root.
    Integration(vm::Options),
    /// Measure the agent's overhead (root): throughput, short connections (closed loop
    /// and paced), a flood of dropped packets, per-program cost, agent RSS, CPU and eBPF
    /// map memory, and a refused-connect storm, each against a no-agent baseline in the
    /// same run (kernel run statistics off, as on a node), then one profile measurement
    /// per workload with them on for the per-program cost (net of an empty program's
    /// floor). Prints a markdown table and writes a JSON file.
    Bench(bench::Options),
}

fn main() -> ExitCode {
    match dispatch(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Bench(options) => match &options.kernel {
            Some(kernel) => vm::bench(kernel, &options),
            None => bench::run(&options),
        },
        Command::Integration(options) => vm::run(&options),
        Command::Prereqs { test_tools } => prereqs::ensure(prereqs::Tools { test_tools }),
        Command::Build { release } => {
            prereqs::ensure(prereqs::Tools::BUILD)?;
            agent::build(release)
        }
        Command::Run { release, args } => agent::run(release, &args),
        Command::Test(options) => suite::run(&options),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_agent_args_after_double_dash() {
        let cli = Cli::parse_from(["xtask", "run", "--release", "--", "--format", "json"]);
        let Command::Run { release, args } = cli.command else {
            panic!("expected run, got {:?}", cli.command);
        };
        assert!(release);
        assert_eq!(args, ["--format", "json"]);
    }
}
