//! `cargo xtask test`: the whole suite, inside CI's budget on a 2-core machine.
//!
//! ```text
//! prereqs → fmt → build (release) → integration tests (build)
//!   ├─ VM guests (nice 15), two at a time: the 6.1 kernel subset split across three
//!   │    guests, and the 5.10 fallback subset
//!   ├─ builds (nice 19): clippy → unit tests → cross builds
//!   └─ deploy checks → host suite
//! → the guests' results → bench smoke, alone → the step table
//! ```
//!
//! The integration tests load the real eBPF programs and so need root: on this kernel
//! (the host suite), and their kernel subsets in Debian 6.1 and 5.10 guests (`vm/`).
//! Every one drives the release agent, the one that ships: one build of the agent, and
//! the guests start as soon as it and the test binaries are built (the debug agent's
//! start also cost seconds of emulated CPU per guest test). Debug assertions stay on in
//! the unit tests. What runs at once is chosen by what each part needs. The host
//! suite spends most of its time waiting on the tests' clocks (SYN retransmits,
//! timeouts, the agent's ticks); a guest under TCG keeps about one core busy; the
//! builds only need CPU. So two guests, each its own kernel, run beside the host suite,
//! and the builds take what CPU is left, at the lowest priority, while the host tests,
//! whose waits have no time scale, keep theirs. The host suite and the guests run hard
//! links of the binaries (`target/xtask-test/bin`), so the builds beside them cannot
//! replace what runs.
//!
//! A failing step stops the steps after it and the guests still running. At the end
//! (failed or not) the steps' table is printed, and written with its JSON to
//! `target/xtask-test/steps.{md,json}`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    thread,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    agent, cmd, cross,
    integration_tests::{self, TESTS_PACKAGE},
    prereqs,
    say::test as say,
    steps::{Counts, Record, Status},
    vm,
};

/// The eBPF package; it only builds for BPF targets, through the agent's build script.
const EBPF_PACKAGE: &str = "node-diag-ebpf";
/// The packages the unit tests cover: every one but the eBPF crate and the integration
/// tests.
const EXCLUDED: &[&str] = &["--exclude", EBPF_PACKAGE, "--exclude", TESTS_PACKAGE];
/// Niceness of the guests: well below the host suite, whose waits have no time scale
/// (its tests that must see a pod named within 2 s failed beside guests at nice 5,
/// which with their four vCPU threads outweighed a test's agent), above the builds,
/// which only need CPU.
const VM_NICENESS: i32 = 15;
/// Niceness of the builds that run beside the tests.
const BUILD_NICENESS: i32 = 19;
/// Guests the 6.1 kernel subset is split across: it is the longest step, and in three
/// parts it and the 5.10 guest make four of about the same length for two at a time.
const KERNEL_SUBSET_SHARDS: u32 = 3;
/// Guests at once: a guest under TCG keeps about one core busy, and a guest starved of
/// CPU fails tests whose waits its time scale does not cover.
const MAX_GUESTS: u32 = 2;
/// Where the run's record and the binaries under test go, under the target directory.
const OUT_DIR: &str = "xtask-test";
/// The guests' step, when it did not run.
const GUESTS: &str = "integration tests in VMs";

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
    /// repeatable; `none` skips it. By default 6.1 and 5.10 (the fallbacks' kernel),
    /// beside the host suite. Each guest runs its kernel's subset (see `integration
    /// --subset`) unless --vm-whole-suite or --filter is given.
    #[arg(long = "vm", value_name = "KERNEL", default_values = ["6.1", "5.10"])]
    pub vm: Vec<String>,
    /// Run the whole integration suite in the VMs, not the kernel subset.
    #[arg(long)]
    pub vm_whole_suite: bool,
}

pub fn run(options: &Options) -> Result<()> {
    let record = Record::new();
    let out = cmd::target_dir()?.join(OUT_DIR);
    let result = Run {
        options,
        record: &record,
        out: &out,
        failed: AtomicBool::new(false),
    }
    .all();
    if result.is_err() {
        vm::cancel();
    }
    let summary = record.summary(result.is_ok());
    let table = summary.table();
    println!("\n{table}");
    match summary.write(&out) {
        Ok(json) => say(format_args!(
            "steps: {} (and steps.md), {} tests passed, {} failed, in {:.0} s",
            json.display(),
            summary.tests.passed,
            summary.tests.failed,
            summary.seconds
        )),
        Err(err) => say(format_args!(
            "steps: not written to {}: {err:#}",
            out.display()
        )),
    }
    if result.is_ok() {
        say("all steps passed");
    }
    result
}

/// One run of the suite.
struct Run<'a> {
    options: &'a Options,
    record: &'a Record,
    out: &'a Path,
    /// Set by the first failing step of any thread: the others start no new step.
    failed: AtomicBool,
}

impl Run<'_> {
    fn all(&self) -> Result<()> {
        let options = self.options;
        // Fail before the long steps if the integration tests could not get root anyway.
        let privilege = if options.skip_integration {
            None
        } else {
            Some(cmd::Privilege::acquire(
                "the integration tests (they load eBPF programs)",
                "run `cargo xtask test` as root, or add --skip-integration",
            )?)
        };
        let kernels = self.vm_kernels(privilege.is_some());
        self.step("prereqs", || {
            prereqs::ensure(prereqs::Tools::TEST)?;
            if !kernels.is_empty() {
                prereqs::ensure_vm(false)?;
            }
            Ok(((), None))
        })?;
        self.command("fmt", cmd::cargo_with(&["fmt", "--all", "--", "--check"]))?;
        // The release agent: what ships, what every integration test drives (here and in
        // the guests), the cross build's x86_64 binary and the bench's.
        self.command(
            "build (release)",
            cmd::cargo_with(&["build", "--release", "-p", agent::PACKAGE]),
        )?;

        // The integration tests' binaries, with the agent they drive, for the host suite
        // and the guests alike.
        let staged = match &privilege {
            Some(_) => Some(self.step("integration tests (build)", || {
                let (manifest_dir, binaries) = integration_tests::build_test_binaries()?;
                let staged = stage(
                    &self.out.join("bin"),
                    &agent::binary(true)?,
                    manifest_dir,
                    &binaries,
                )?;
                Ok((staged, None))
            })?),
            None => None,
        };

        thread::scope(|scope| {
            let guests = match &staged {
                Some(staged) if !kernels.is_empty() => {
                    Some(scope.spawn(|| self.guests(&kernels, staged)))
                }
                _ => {
                    self.skip_guests(&kernels);
                    None
                }
            };
            let builds = scope.spawn(|| self.builds());
            let host = self.host(privilege.as_ref(), staged.as_ref());
            if host.is_err() {
                // Nothing else is worth waiting for.
                vm::cancel();
            }
            let builds = builds
                .join()
                .unwrap_or_else(|_| bail!("the builds panicked"));
            if builds.is_err() {
                vm::cancel();
            }
            let guests = guests
                .map(|g| g.join().unwrap_or_else(|_| bail!("the VM guests panicked")))
                .unwrap_or(Ok(()));
            // Last, alone: the bench's load at nice 0 would starve the guests for its
            // minutes, past what their tests' time scale covers.
            let bench = match (&host, &builds, &guests) {
                (Ok(()), Ok(()), Ok(())) => self.bench_smoke(),
                _ => Ok(()),
            };
            host.and(builds).and(guests).and(bench)
        })
    }

    /// The kernels whose guests run: none without root or with --skip-integration.
    fn vm_kernels(&self, integration: bool) -> Vec<String> {
        let kernels: Vec<String> = self
            .options
            .vm
            .iter()
            .filter(|k| *k != "none")
            .cloned()
            .collect();
        if integration && cmd::is_root() {
            kernels
        } else {
            Vec::new()
        }
    }

    fn skip_guests(&self, requested: &[String]) {
        const STEP: &str = GUESTS;
        let why = if self.options.skip_integration {
            "--skip-integration"
        } else if !cmd::is_root() {
            "needs root: run `cargo xtask test` as root"
        } else if requested.is_empty() {
            "--vm none"
        } else {
            "the binaries were not built"
        };
        say(format_args!("{STEP}: skipped ({why})"));
        self.record.skip(STEP, why);
    }

    /// The guests, two at a time (a guest under TCG takes about a core), each its
    /// kernel's subset (the 6.1 one split in three, booted first), with a row per kernel
    /// in the record.
    fn guests(&self, kernels: &[String], staged: &vm::Build) -> Result<()> {
        const STEP: &str = GUESTS;
        let subset = !self.options.vm_whole_suite && self.options.filter.is_none();
        let options = vm::Options {
            kernels: kernels.to_vec(),
            arch: None,
            filters: self.options.filter.iter().cloned().collect(),
            subset,
            keep: false,
            timeout: vm::DEFAULT_TIMEOUT.as_secs() / 60,
            update_readme: false,
            parallel: true,
            shards: if subset { KERNEL_SUBSET_SHARDS } else { 1 },
            max_guests: MAX_GUESTS,
            niceness: VM_NICENESS,
            prebuilt: Some(staged.clone()),
        };
        say(format_args!(
            "{STEP}: cargo xtask integration --kernel {}{} --parallel --shards {} --max-guests {}, beside the host suite",
            kernels.join(" --kernel "),
            if subset { " --subset" } else { "" },
            options.shards,
            options.max_guests,
        ));
        let start = self.record.elapsed();
        let ran = vm::run_matrix(&options);
        let ran = match ran {
            Ok(ran) => ran,
            Err(err) => {
                self.record.push(
                    STEP,
                    start,
                    self.record.elapsed() - start,
                    Status::Failed,
                    None,
                    Some(format!("{err:#}")),
                );
                return Err(err).with_context(|| format!("test step `{STEP}` failed"));
            }
        };
        for guest in &ran {
            self.record.push(
                format!("VM {}", guest.name),
                start + guest.queued as f64,
                guest.seconds as f64,
                if guest.passed {
                    Status::Passed
                } else {
                    Status::Failed
                },
                Some(guest.tests),
                guest.error.clone(),
            );
        }
        if let Some(failed) = vm::failures(&ran) {
            self.failed.store(true, Ordering::Relaxed);
            bail!("test step `{STEP}` failed on {failed}");
        }
        Ok(())
    }

    /// What only needs CPU, at the lowest priority, beside the tests: clippy, the unit
    /// tests, the cross builds (whose x86_64 one is built already).
    fn builds(&self) -> Result<()> {
        let mut clippy = cmd::cargo_with(&["clippy", "--workspace", "--all-targets"]);
        clippy.args(["--exclude", EBPF_PACKAGE, "--", "-D", "warnings"]);
        cmd::lower_priority(&mut clippy, BUILD_NICENESS);
        self.command("clippy", clippy)?;

        let mut unit = cmd::cargo_with(&["test", "--workspace"]);
        unit.args(EXCLUDED);
        cmd::lower_priority(&mut unit, BUILD_NICENESS);
        self.counted("unit tests", unit)?;

        if self.options.filter.is_some() {
            self.skip("cross builds", "--filter runs only the matching tests");
            return Ok(());
        }
        self.step("cross builds", || {
            cross::run(BUILD_NICENESS)?;
            Ok(((), None))
        })
    }

    /// The deploy checks, then the integration tests on this kernel.
    fn host(&self, privilege: Option<&cmd::Privilege>, staged: Option<&vm::Build>) -> Result<()> {
        self.command("deploy checks", deploy_checks())?;
        const STEP: &str = "host suite";
        let (Some(privilege), Some(staged)) = (privilege, staged) else {
            say(format_args!("{STEP}: skipped (--skip-integration)"));
            self.record.skip(STEP, "--skip-integration");
            return Ok(());
        };
        self.step(STEP, || {
            let (counts, result) = integration_tests::run_binaries(
                privilege,
                &staged.agent,
                &staged.manifest_dir,
                &staged.binaries,
                self.options.filter.as_slice(),
            );
            result.map(|()| ((), Some(counts))).map_err(|err| {
                err.context(format!(
                    "{} tests passed, {} failed",
                    counts.passed, counts.failed
                ))
            })
        })
    }

    /// Last: `cargo xtask bench --smoke`, so the benchmark keeps working. It fails only
    /// when the benchmark breaks; its table (targets included) is for people to read,
    /// and taken beside the guests it measures nothing. It needs root, and runs as root
    /// only: under sudo it would leave root-owned build files behind.
    fn bench_smoke(&self) -> Result<()> {
        const STEP: &str = "bench smoke";
        let why = if self.options.filter.is_some() {
            Some("--filter")
        } else if self.options.skip_integration {
            Some("--skip-integration")
        } else if !cmd::is_root() {
            Some("needs root: run `cargo xtask test` as root")
        } else {
            None
        };
        match why {
            Some(why) => {
                self.skip(STEP, why);
                Ok(())
            }
            None => self.command(STEP, cmd::cargo_with(&["xtask", "bench", "--smoke"])),
        }
    }

    /// Runs `f` as step `name` unless a step failed already; `f` returns the tests it
    /// counted, if any.
    fn step<T>(&self, name: &str, f: impl FnOnce() -> Result<(T, Option<Counts>)>) -> Result<T> {
        if self.failed.load(Ordering::Relaxed) {
            self.record.skip(name, "an earlier step failed");
            bail!("test step `{name}` not run: an earlier step failed");
        }
        let result = self
            .record
            .run(name, f)
            .with_context(|| format!("test step `{name}` failed"));
        if result.is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
        result
    }

    /// Announces `cmd` as step `name` and runs it.
    fn command(&self, name: &str, mut cmd: Command) -> Result<()> {
        self.step(name, || {
            say(format_args!("{name}: {}", cmd::display(&cmd)));
            cmd::run(&mut cmd).map(|()| ((), None))
        })
    }

    /// [`Run::command`], counting the tests `cmd` runs.
    fn counted(&self, name: &str, mut cmd: Command) -> Result<()> {
        self.step(name, || {
            say(format_args!("{name}: {}", cmd::display(&cmd)));
            let (counts, result) = cmd::run_counting(&mut cmd);
            result.map(|()| ((), Some(counts)))
        })
    }

    fn skip(&self, name: &str, why: &str) {
        say(format_args!("{name}: skipped ({why})"));
        self.record.skip(name, why);
    }
}

/// Hard links (copies across file systems) of the agent and the test binaries into
/// `dir`, replacing what was there: what the tests run stays as built while builds
/// beside them replace cargo's files.
fn stage(
    dir: &Path,
    agent: &Path,
    manifest_dir: PathBuf,
    binaries: &[PathBuf],
) -> Result<vm::Build> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("cannot empty {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let link = |from: &Path| -> Result<PathBuf> {
        let name = from
            .file_name()
            .with_context(|| format!("{} has no file name", from.display()))?;
        let to = dir.join(name);
        if fs::hard_link(from, &to).is_err() {
            fs::copy(from, &to)
                .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
        }
        Ok(to)
    };
    Ok(vm::Build {
        agent: link(agent)?,
        manifest_dir,
        binaries: binaries.iter().map(|b| link(b)).collect::<Result<_>>()?,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_binaries_stay_as_built_when_cargo_replaces_its_own() {
        let dir = std::env::temp_dir().join(format!("xtask-stage-{}", std::process::id()));
        let built = dir.join("built");
        fs::create_dir_all(&built).unwrap();
        let agent = built.join("node-diag");
        let test = built.join("scenarios-0123abcd");
        fs::write(&agent, "agent v1").unwrap();
        fs::write(&test, "test v1").unwrap();
        let staged = stage(
            &dir.join("bin"),
            &agent,
            built.clone(),
            std::slice::from_ref(&test),
        )
        .unwrap();
        // cargo replaces an output by removing it and linking the new one.
        fs::remove_file(&agent).unwrap();
        fs::write(&agent, "agent v2").unwrap();
        assert_eq!(fs::read_to_string(&staged.agent).unwrap(), "agent v1");
        assert_eq!(
            staged.binaries,
            [dir.join("bin").join("scenarios-0123abcd")]
        );
        assert_eq!(staged.manifest_dir, built);
        // Staging again replaces the copies.
        let again = stage(&dir.join("bin"), &agent, built, &[test]).unwrap();
        assert_eq!(fs::read_to_string(&again.agent).unwrap(), "agent v2");
        fs::remove_dir_all(&dir).unwrap();
    }
}
