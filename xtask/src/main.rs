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
    Test {
        /// Stop after the unit tests; skip the privileged integration tests.
        #[arg(long)]
        skip_integration: bool,
        /// Run only the integration tests whose name contains NAME.
        #[arg(long, value_name = "NAME")]
        filter: Option<String>,
        /// Also run the integration tests in a VM on this kernel (see `integration`);
        /// repeatable; `none` skips it. The guest runs the kernel subset (see
        /// `integration --subset`) unless --vm-whole-suite or --filter is given.
        #[arg(long = "vm", value_name = "KERNEL", default_value = "6.1")]
        vm: Vec<String>,
        /// Run the whole integration suite in the VMs, not the kernel subset.
        #[arg(long)]
        vm_whole_suite: bool,
    },
    /// Run the integration suite on other kernels: Debian's 6.1 and 6.12 booted under
    /// qemu (KVM when it works, else TCG), x86_64 and aarch64, or this machine's (`host`).
    ///
    /// Downloads and caches the kernel packages under target/vm, builds an initramfs,
    /// boots each kernel with the host's root (x86_64) or a Debian arm64 userland
    /// (aarch64) shared over 9p, runs the test binaries built on the host inside it and
    /// streams the console. Exits non-zero on a failed test, a guest crash or a timeout.
    /// Needs root.
    Integration {
        /// Kernels: host, 6.1, 6.12 or all (host, 6.1 and 6.12 on x86_64, plus the
        /// arm64 subset on 6.1). Repeatable.
        #[arg(long = "kernel", value_name = "KERNEL", default_value = "host")]
        kernels: Vec<String>,
        /// Only this guest architecture (aarch64 runs a subset unless --filter is given).
        #[arg(long, value_enum)]
        arch: Option<vm::Arch>,
        /// Run only the tests whose name contains NAME (repeatable: any matches).
        #[arg(long = "filter", value_name = "NAME")]
        filters: Vec<String>,
        /// In x86_64 guests, run only the kernel subset (`cargo xtask test`'s VM step):
        /// the tests where kernels differ, not the whole suite.
        #[arg(long, conflicts_with = "filters")]
        subset: bool,
        /// Keep each guest's run directory (initramfs, console log, results).
        #[arg(long)]
        keep: bool,
        /// Minutes a guest may run before it is killed and the run fails.
        #[arg(long, value_name = "MINUTES", default_value_t = vm::DEFAULT_TIMEOUT.as_secs() / 60,
              value_parser = clap::value_parser!(u64).range(1..=600))]
        timeout: u64,
        /// Record the outcome in README.md's kernel support table.
        #[arg(long)]
        update_readme: bool,
    },
    /// Measure the agent's overhead (root): throughput, short connections (closed loop
    /// and paced), a flood of dropped packets, per-program cost, agent RSS, CPU and eBPF
    /// map memory, and a refused-connect storm, each against a no-agent baseline in the
    /// same run (kernel run statistics off, as on a node), then one profile measurement
    /// per workload with them on for the per-program cost (net of an empty program's
    /// floor). Prints a markdown table and writes a JSON file.
    Bench {
        /// Tiny sizes (1 run, 2 s per workload, 2,000 storm connects), for CI.
        #[arg(long)]
        smoke: bool,
        /// Baseline/agent pairs per workload (default 21; 1 with --smoke).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
        runs: Option<u32>,
        /// Seconds per throughput, connection and drop-flood measurement (default 3; 2
        /// with --smoke).
        #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=600))]
        duration: Option<u64>,
        /// Short connections offered per second (default 10000).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        conn_rate: Option<u32>,
        /// Refused connects in the storm (default 50000; 2000 with --smoke).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        storm: Option<u64>,
        /// Measure only this workload (repeatable; default all). Rows of the workloads
        /// left out are left out of the table.
        #[arg(long = "workload", value_name = "NAME")]
        workloads: Vec<bench::Workload>,
        /// A null run: both measurements of every pair without the agent, and no profile.
        /// Its ratios show what this machine's noise alone does to them: how far from
        /// 1.000 a median lands when the agent costs nothing.
        #[arg(long)]
        null: bool,
        /// Where to write the JSON results (default target/bench/bench.json).
        #[arg(long, value_name = "PATH")]
        out: Option<std::path::PathBuf>,
    },
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
        Command::Bench {
            smoke,
            runs,
            duration,
            conn_rate,
            storm,
            workloads,
            null,
            out,
        } => bench::run(&bench::Options {
            smoke,
            runs,
            duration,
            conn_rate,
            storm,
            workloads,
            null,
            out,
        }),
        Command::Integration {
            kernels,
            arch,
            filters,
            subset,
            keep,
            timeout,
            update_readme,
        } => vm::run(&vm::Options {
            kernels,
            arch,
            filters,
            subset,
            keep,
            timeout: std::time::Duration::from_secs(timeout * 60),
            update_readme,
        }),
        Command::Prereqs { test_tools } => prereqs::ensure(prereqs::Tools { test_tools }),
        Command::Build { release } => {
            prereqs::ensure(prereqs::Tools::BUILD)?;
            agent::build(release)
        }
        Command::Run { release, args } => agent::run(release, &args),
        Command::Test {
            skip_integration,
            filter,
            vm,
            vm_whole_suite,
        } => suite::run(&suite::Options {
            skip_integration,
            filter,
            vm: vm.into_iter().filter(|k| k != "none").collect(),
            vm_whole_suite,
        }),
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
