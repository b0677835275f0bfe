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
//! table docs/kernels.md's kernel support section records.

mod arch;
mod arm64;
mod guest;
mod initramfs;
mod kernel;
mod qemu;
mod results;
mod subset;

pub use self::arch::Arch;

use std::{
    collections::HashMap,
    fmt, fs,
    path::{Path, PathBuf},
    sync::{Condvar, Mutex, PoisonError},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use self::{
    results::{Outcome, doctor_summary, merge_readme, minutes, table},
    subset::{guest_filters, suite_name},
};
use crate::{agent, cmd, integration_tests, prereqs, say::integration as say, steps::Counts};

pub use self::qemu::cancel;

/// How long a guest may run: the whole suite under TCG takes most of it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(75 * 60);

/// Options of `cargo xtask integration`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// Kernels: host, 6.1, 6.12, 5.10 or all (host, 6.1, 6.12 and 5.10 on x86_64, plus
    /// the arm64 subset on 6.1). Repeatable.
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
    /// Record the outcome in docs/kernels.md's kernel support table (`--kernel all` always
    /// does).
    #[arg(long)]
    pub update_readme: bool,
    /// Boot the guests at once instead of one after another. Each guest has its own
    /// kernel, so their tests cannot meet; they share only the CPUs, and under TCG a
    /// guest spends most of its time waiting on the tests' clocks.
    #[arg(long)]
    pub parallel: bool,
    /// Split each guest's tests across N guests of its kernel (by test name in a
    /// subset or under --filter, else by test binary), booted at once (implies
    /// --parallel); the matrix still shows one row per kernel.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=4))]
    pub shards: u32,
    /// At most N guests at once with --parallel or --shards (0: no limit); the others
    /// wait their turn, in the matrix's order. A guest under TCG takes about a core.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_guests: u32,
    /// Scheduling niceness of the guests (`cargo xtask test` lowers them below the
    /// host's own tests, which wait on time without a scale).
    #[arg(long, value_name = "N", default_value_t = 0, hide = true,
          value_parser = clap::value_parser!(i32).range(0..=19))]
    pub niceness: i32,
    /// The x86_64 binaries, when the caller built them (`cargo xtask test`, which builds
    /// other things beside the guests and must not wait on cargo's lock here).
    #[arg(skip)]
    pub prebuilt: Option<Build>,
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
                    format!(
                        "unknown kernel `{name}`: expected host, {} or all",
                        kernel::names()
                    )
                })?;
                push(Entry::Vm(series, arch.unwrap_or(Arch::X86_64)));
            }
        }
    }
    Ok(out)
}

/// `cargo xtask integration`: the matrix `options` asks for; fails when an entry failed.
pub fn run(options: &Options) -> Result<()> {
    if let Some(failed) = failures(&run_matrix(options)?) {
        bail!("integration suite failed on: {failed}");
    }
    Ok(())
}

/// The entries of `ran` that failed, with why (`6.1 x86_64 kernel subset: why; ...`),
/// if any did.
pub fn failures(ran: &[Ran]) -> Option<String> {
    let failed: Vec<String> = ran
        .iter()
        .filter(|r| !r.passed)
        .map(|r| format!("{}: {}", r.name, r.error.as_deref().unwrap_or("failed")))
        .collect();
    (!failed.is_empty()).then(|| failed.join("; "))
}

/// Runs the matrix `options` asks for and records it (`target/vm/results.*`, and the
/// table in docs/kernels.md with --update-readme); returns what each entry ran, passed or
/// not.
pub fn run_matrix(options: &Options) -> Result<Vec<Ran>> {
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
    let mut builds = Builds {
        x86_64: options.prebuilt.clone(),
        aarch64: None,
    };
    // Every binary is built before a guest boots: the guests may run at once.
    for arch in &vm_arches {
        builds.get(*arch)?;
    }
    let mut outcomes = Vec::new();
    for entry in entries.iter().filter(|e| **e == Entry::Host) {
        outcomes.push(timed(*entry, || run_host(options)));
    }
    // Every guest of every entry, in the matrix's order: each entry's shards, then the
    // next entry's. They boot in that order, as many at once as the gate lets.
    let mut jobs = Vec::new();
    for entry in &entries {
        if let Entry::Vm(series, arch) = *entry {
            let build = builds.built(arch)?;
            for shard in shards(options, series, arch, build) {
                jobs.push((series, arch, build, shard));
            }
        }
    }
    let parallel = options.parallel || options.shards > 1;
    let gate = Gate::new(match (parallel, options.max_guests) {
        (false, _) => 1,
        (true, 0) => usize::MAX,
        (true, n) => n as usize,
    });
    let matrix_start = Instant::now();
    let parts: Vec<(Entry, Outcome)> = thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .enumerate()
            .map(|(turn, (series, arch, build, shard))| {
                let (gate, root) = (&gate, &root);
                scope.spawn(move || {
                    let entry = Entry::Vm(*series, *arch);
                    let _pass = gate.enter(turn);
                    let queued = matrix_start.elapsed().as_secs();
                    if shard.of.0 == 1 {
                        say(format_args!("=== {entry}: starting"));
                    }
                    let mut outcome = run_vm(*series, *arch, build, root, options, shard)
                        .unwrap_or_else(|err| failed(entry, &err));
                    outcome.queued = queued;
                    (entry, outcome)
                })
            })
            .collect();
        handles
            .into_iter()
            .zip(&jobs)
            .map(|(h, (series, arch, _, _))| {
                let entry = Entry::Vm(*series, *arch);
                h.join().unwrap_or_else(|_| {
                    (
                        entry,
                        failed(entry, &anyhow::anyhow!("its thread panicked")),
                    )
                })
            })
            .collect()
    });
    // One row per entry, in order, whatever its shards; its time is its longest guest's.
    let mut parts = parts;
    for entry in &entries {
        let (mine, rest): (Vec<_>, Vec<_>) = parts.into_iter().partition(|(e, _)| e == entry);
        parts = rest;
        if mine.is_empty() {
            continue;
        }
        let outcome = merge_shards(mine.into_iter().map(|(_, o)| o).collect());
        said_done(*entry, &outcome);
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
    if options.update_readme || options.kernels.iter().any(|k| k == "all") {
        let readme = cmd::metadata()?
            .workspace_root
            .join("docs")
            .join("kernels.md");
        let text = fs::read_to_string(&readme)?;
        fs::write(&readme, merge_readme(&text, &outcomes)?)?;
        say(format_args!("recorded in {readme}"));
    }
    say(format_args!(
        "results: {} and results.json",
        root.join("results.md").display()
    ));
    Ok(outcomes.iter().map(Outcome::summary).collect())
}

/// What one matrix entry ran, for `cargo xtask test`'s record of its steps.
#[derive(Debug, Clone)]
pub struct Ran {
    /// `6.1 x86_64 kernel subset`.
    pub name: String,
    pub passed: bool,
    pub seconds: u64,
    /// Seconds its first guest waited for its turn (`--max-guests`).
    pub queued: u64,
    pub tests: Counts,
    pub error: Option<String>,
}

/// Runs `f` for `entry`, announcing it and timing it; its error becomes a failed outcome.
fn timed(entry: Entry, f: impl FnOnce() -> Result<Outcome>) -> Outcome {
    say(format_args!("=== {entry}: starting"));
    let started = Instant::now();
    let mut outcome = f().unwrap_or_else(|err| failed(entry, &err));
    outcome.seconds = started.elapsed().as_secs();
    said_done(entry, &outcome);
    outcome
}

/// `=== ENTRY: PASSED in 3m02s (12 tests passed, 0 failed)`.
fn said_done(entry: Entry, outcome: &Outcome) {
    say(format_args!(
        "=== {entry}: {} in {} ({} tests passed, {} failed)",
        if outcome.passed { "PASSED" } else { "FAILED" },
        minutes(outcome.seconds),
        outcome.counts.passed,
        outcome.counts.failed,
    ));
}

/// The outcome of an entry that failed before any test could say so.
fn failed(entry: Entry, err: &anyhow::Error) -> Outcome {
    Outcome {
        kernel: match entry {
            Entry::Vm(series, _) => series.name.to_owned(),
            Entry::Host => "host".to_owned(),
        },
        arch: match entry {
            Entry::Vm(_, arch) => arch,
            Entry::Host => Arch::X86_64,
        },
        release: String::new(),
        accel: String::new(),
        suite: String::new(),
        tests: Vec::new(),
        counts: Counts::default(),
        doctor: String::new(),
        tc_attach: String::new(),
        passed: false,
        seconds: 0,
        error: Some(format!("{err:#}")),
        queued: 0,
    }
}

/// Lets guests boot in their turn, at most `max` at once.
struct Gate {
    /// (the next turn to start, how many run)
    state: Mutex<(usize, usize)>,
    turn: Condvar,
    max: usize,
}

/// A guest's place in the gate, given back when dropped.
struct Pass<'a>(&'a Gate);

impl Gate {
    fn new(max: usize) -> Gate {
        Gate {
            state: Mutex::new((0, 0)),
            turn: Condvar::new(),
            max: max.max(1),
        }
    }

    /// Waits until it is `turn`'s turn and a place is free.
    fn enter(&self, turn: usize) -> Pass<'_> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.0 != turn || state.1 >= self.max {
            state = self
                .turn
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.0 += 1;
        state.1 += 1;
        self.turn.notify_all();
        Pass(self)
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.1 -= 1;
        self.0.turn.notify_all();
    }
}

/// One guest's share of an entry's tests.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shard {
    /// `(k, n)`: the k-th (from 1) of n guests of the entry; `(1, 1)` alone.
    of: (u32, u32),
    /// The libtest name filters it runs with (none: every test).
    filters: Vec<String>,
    /// The test binaries it runs.
    binaries: Vec<PathBuf>,
}

/// Names a guest gets at least when a list of names is split: each guest boots and
/// starts each test binary with a test to run once, which a few tests do not repay
/// (the 5.10 fallback subset, 22 names, stays in one guest; the 6.1 kernel subset
/// splits in up to three).
const MIN_NAMES_PER_SHARD: usize = 20;

/// How an entry's tests are split across `--shards` guests: by name where names select
/// them (a subset or filters), dealt in turn so that each guest gets some of every
/// binary's, at least [`MIN_NAMES_PER_SHARD`] each; else by binary. Never more guests
/// than there are things to split.
fn shards(options: &Options, series: kernel::Series, arch: Arch, build: &Build) -> Vec<Shard> {
    let filters = guest_filters(&options.filters, options.subset, arch, series.subset);
    let n = if filters.is_empty() {
        options.shards.min(build.binaries.len().max(1) as u32)
    } else {
        options
            .shards
            .min((filters.len() / MIN_NAMES_PER_SHARD).max(1) as u32)
    }
    .max(1);
    (0..n)
        .map(|k| {
            let pick = |i: usize| i % n as usize == k as usize;
            let (filters, binaries) = if filters.is_empty() {
                (
                    Vec::new(),
                    build
                        .binaries
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| pick(*i))
                        .map(|(_, b)| b.clone())
                        .collect(),
                )
            } else {
                let filters: Vec<String> = filters
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| pick(*i))
                    .map(|(_, f)| f.clone())
                    .collect();
                let binaries = selecting(&build.binaries, &filters, arch);
                (filters, binaries)
            };
            Shard {
                of: (k + 1, n),
                filters,
                binaries,
            }
        })
        .collect()
}

/// The binaries of `binaries` that have a test `filters` select, as each binary lists
/// them (natively: only binaries built for this machine can be asked); one that cannot
/// be asked is kept. A guest starts every binary it is given, a second or more each
/// under TCG, even one with nothing to run.
fn selecting(binaries: &[PathBuf], filters: &[String], arch: Arch) -> Vec<PathBuf> {
    if filters.is_empty() || !arch.is_host() {
        return binaries.to_vec();
    }
    binaries
        .iter()
        .filter(|binary| lists_any(binary, filters) != Some(false))
        .cloned()
        .collect()
}

/// Whether the libtest binary `binary` has a test `filters` select (`--list`); `None`
/// when it cannot be asked.
fn lists_any(binary: &Path, filters: &[String]) -> Option<bool> {
    let out = std::process::Command::new(binary)
        .arg("--list")
        .args(filters)
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.ends_with(": test")),
    )
}

/// The shards' outcomes as one row of the matrix: passed when all passed, the longest
/// wall time, every binary and count.
fn merge_shards(parts: Vec<Outcome>) -> Outcome {
    let mut parts = parts.into_iter();
    let Some(mut merged) = parts.next() else {
        unreachable!("an entry has at least one shard");
    };
    for part in parts {
        merged.passed &= part.passed;
        merged.seconds = merged.seconds.max(part.seconds);
        merged.queued = merged.queued.min(part.queued);
        merged.tests.extend(part.tests);
        merged.counts.add(part.counts);
        merged.error = match (merged.error.take(), part.error) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
        if merged.release.is_empty() {
            merged.release = part.release;
            merged.accel = part.accel;
            merged.doctor = part.doctor;
            merged.tc_attach = part.tc_attach;
        }
    }
    merged.suite = merged
        .suite
        .split(" (")
        .next()
        .unwrap_or_default()
        .to_owned();
    merged
}

/// The binaries a guest runs.
#[derive(Debug, Clone)]
pub struct Build {
    /// The agent (`NODE_DIAG_BIN`).
    pub agent: PathBuf,
    /// The tests' package directory, their working directory.
    pub manifest_dir: PathBuf,
    /// The test executables.
    pub binaries: Vec<PathBuf>,
}

/// Each architecture's binaries, built once per invocation.
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

    /// `arch`'s binaries, built by an earlier [`Builds::get`].
    fn built(&self, arch: Arch) -> Result<&Build> {
        match arch {
            Arch::X86_64 => self.x86_64.as_ref(),
            Arch::Aarch64 => self.aarch64.as_ref(),
        }
        .context("the binaries for this architecture were not built")
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
    let (counts, result) = integration_tests::run(&privilege, &options.filters);
    let ok = result.is_ok();
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
        suite: suite_name(&options.filters, false, Arch::X86_64, &[]),
        tests: Vec::new(),
        counts,
        doctor: doctor.0,
        tc_attach: doctor.1,
        passed: ok,
        seconds: 0,
        error: (!ok).then(|| "a test failed (output above)".to_owned()),
        queued: 0,
    })
}

fn run_vm(
    series: kernel::Series,
    arch: Arch,
    build: &Build,
    root: &Path,
    options: &Options,
    shard: &Shard,
) -> Result<Outcome> {
    let (k, n) = shard.of;
    let (run_name, label) = if n == 1 {
        (format!("{}-{arch}", series.name), String::new())
    } else {
        (
            format!("{}-{arch}-{k}of{n}", series.name),
            format!(" {k}/{n}"),
        )
    };
    let guest = boot_guest(
        series,
        arch,
        root,
        &run_name,
        &label,
        options.deadline(),
        options.keep,
        options.niceness,
        |accel| {
            guest::script(&guest::Plan {
                agent: &build.agent,
                manifest_dir: &build.manifest_dir,
                binaries: &shard.binaries,
                filters: &shard.filters,
                // Emulated CPUs run several times slower than the host's.
                time_scale: match accel {
                    qemu::Accel::Kvm => 1,
                    qemu::Accel::Tcg => TCG_TIME_SCALE,
                },
            })
        },
    )?;
    let tests = read_results(&guest.out.join("results"));
    let counts = Counts::from_text(&fs::read_to_string(&guest.console).unwrap_or_default());
    let (doctor, tc_attach) =
        doctor_summary(&fs::read_to_string(guest.out.join("doctor.json")).unwrap_or_default());
    let error = guest.failure.or_else(|| {
        if tests.len() != shard.binaries.len() {
            Some(format!(
                "{} of {} test binaries reported",
                tests.len(),
                shard.binaries.len()
            ))
        } else {
            tests
                .iter()
                .filter(|(_, rc, _)| *rc != 0)
                .map(|(name, rc, _)| format!("{name} exited {rc}"))
                .reduce(|a, b| format!("{a}, {b}"))
        }
    });
    Ok(Outcome {
        kernel: series.name.to_owned(),
        arch,
        release: guest.release,
        accel: guest.accel.name().to_owned(),
        suite: format!(
            "{}{}",
            suite_name(&options.filters, options.subset, arch, series.subset),
            if n == 1 {
                String::new()
            } else {
                format!(" ({k}/{n})")
            }
        ),
        tests,
        counts,
        doctor,
        tc_attach,
        passed: error.is_none(),
        seconds: guest.seconds,
        error,
        queued: 0,
    })
}

/// A guest that ran its script and powered off (or was stopped).
struct Guest {
    /// The kernel's release (`uname -r`).
    release: String,
    accel: qemu::Accel,
    /// The results share, as the guest left it.
    out: PathBuf,
    /// Why the guest did not finish its script: a timeout, a panic, a crash.
    failure: Option<String>,
    seconds: u64,
    /// Its console log.
    console: PathBuf,
}

/// Held while a guest's kernel, userland and accelerator are looked up: guests booted
/// at once share the download cache and apt state under `target/vm/cache`.
static PREPARE: Mutex<()> = Mutex::new(());
/// The accelerator picked per architecture, so the KVM probe boots once per run.
static ACCEL: Mutex<Option<HashMap<Arch, qemu::Accel>>> = Mutex::new(None);

/// Boots `series` on `arch` with the init script `script` gives for the accelerator
/// picked, in `root`/runs/`run_name` (replaced), at scheduling niceness `niceness`, and
/// waits (at most `deadline`) for it to power off. Its console lines are prefixed
/// `[vm SERIES{label}]`.
#[expect(clippy::too_many_arguments, reason = "each is one fact of the boot")]
fn boot_guest(
    series: kernel::Series,
    arch: Arch,
    root: &Path,
    run_name: &str,
    label: &str,
    deadline: Duration,
    keep: bool,
    niceness: i32,
    script: impl FnOnce(qemu::Accel) -> String,
) -> Result<Guest> {
    qemu::require(arch)?;
    let cache = root.join("cache");
    let prepare = PREPARE.lock().unwrap_or_else(PoisonError::into_inner);
    let package = series.newest_package(arch, &cache)?;
    let kernel = kernel::fetch(&series, &package, arch, &cache)?;
    say(format_args!("{package}: kernel {}", kernel.release));
    let run_dir = root.join("runs").join(run_name);
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
    let (root_dir, workspace) = match arch {
        Arch::X86_64 => (PathBuf::from("/"), None::<PathBuf>),
        Arch::Aarch64 => (
            arm64::userland(&cache)?,
            Some(cmd::metadata()?.workspace_root.into_std_path_buf()),
        ),
    };
    let mut picked = ACCEL.lock().unwrap_or_else(PoisonError::into_inner);
    let accel = match picked.get_or_insert_with(HashMap::new).get(&arch) {
        Some(accel) => *accel,
        None => {
            let probe = run_dir.join("probe.cpio");
            initramfs::write_probe(&busybox, &qemu::probe_init(), &probe)?;
            let accel = qemu::pick_accel(arch, &kernel.image, &probe, &run_dir.join("probe.log"))?;
            picked.get_or_insert_with(HashMap::new).insert(arch, accel);
            accel
        }
    };
    drop(picked);
    drop(prepare);
    say(format_args!("accelerator: {}", accel.name()));

    let script = script(accel);
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
        niceness,
    };
    let prefix = format!(
        "[vm {}{}{label}]",
        series.name,
        if arch.is_host() { "" } else { " arm64" }
    );
    let mut attempt = 1;
    let boot = loop {
        let boot = machine.boot(
            &prefix,
            &run_dir.join("console.log"),
            deadline,
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
        if reached_init || attempt == BOOT_ATTEMPTS || qemu::cancelled() {
            break boot;
        }
        say(format_args!(
            "the guest died before its init ran (attempt {attempt} of {BOOT_ATTEMPTS}): booting again"
        ));
        attempt += 1;
    };

    let done = out.join("done").exists();
    let failure = if !boot.exited && qemu::cancelled() {
        Some("stopped: the run failed in another step".to_owned())
    } else if !boot.exited {
        Some(format!(
            "the guest did not finish within {} (console: {})",
            minutes(deadline.as_secs()),
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
    } else {
        None
    };
    if keep {
        say(format_args!("kept {}", run_dir.display()));
    } else {
        let _ = fs::remove_file(&initrd);
        let _ = fs::remove_dir_all(run_dir.join("scratch"));
    }
    Ok(Guest {
        release: kernel.release,
        accel,
        out,
        failure,
        seconds: boot.elapsed.as_secs(),
        console: run_dir.join("console.log"),
    })
}

/// `cargo xtask bench --kernel KERNEL`: the bench inside a guest of that kernel, on the
/// release agent built here, its JSON and table copied to target/bench/bench-KERNEL.*.
pub fn bench(kernel: &str, options: &crate::bench::Options) -> Result<()> {
    let series = kernel::series(kernel).with_context(|| {
        format!(
            "unknown kernel `{kernel}` for the bench: expected {}",
            kernel::names()
        )
    })?;
    if options
        .workloads
        .iter()
        .any(|w| !matches!(w, crate::bench::Choice::Pair(_)))
    {
        bail!(
            "--kernel measures the baseline/agent pairs and the per-program figures; run the scale workloads without it, on this machine"
        );
    }
    if !cmd::is_root() {
        bail!(
            "`cargo xtask bench --kernel` needs root (the guests' 9p shares map root; the bench loads eBPF): run it as root"
        );
    }
    prereqs::ensure(prereqs::Tools::BUILD)?;
    prereqs::ensure_vm(false)?;
    prereqs::ensure_system_tools(crate::bench::BENCH_TOOLS)?;
    agent::build(true)?;
    let agent = agent::binary(true)?;
    // This very binary runs the bench in the guest, whose root is this machine's.
    let xtask = std::env::current_exe().context("cannot find the xtask binary")?;
    let target = cmd::target_dir()?;
    let guest = boot_guest(
        series,
        Arch::X86_64,
        &target.join("vm"),
        // Not the integration suite's run directory: both may run at once.
        &format!("bench-{}-{}", series.name, Arch::X86_64),
        "",
        Duration::from_secs(options.timeout * 60),
        false,
        0,
        |_| guest::bench_script(&agent, &xtask, &options.guest_args()),
    )?;
    let json = guest.out.join(guest::BENCH_JSON);
    let out = match &options.out {
        Some(out) => out.clone(),
        None => target.join("bench").join(format!("bench-{kernel}.json")),
    };
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    let copied = fs::copy(&json, &out).is_ok();
    let table = json.with_extension("md");
    if let Ok(markdown) = fs::read_to_string(&table) {
        fs::write(out.with_extension("md"), &markdown)?;
        println!("\n{markdown}");
    }
    let rc = read_results(&guest.out.join("results"))
        .into_iter()
        .find(|(name, _, _)| name == guest::BENCH)
        .map(|(_, rc, _)| rc);
    if let Some(failure) = guest.failure {
        bail!("the bench on {kernel} failed: {failure}");
    }
    match rc {
        Some(0) if copied => {}
        Some(0) => bail!("the bench on {kernel} wrote no {}", json.display()),
        Some(rc) => bail!("the bench on {kernel} exited {rc} (its output above)"),
        None => bail!("the bench on {kernel} did not report (its output above)"),
    }
    say(format_args!(
        "bench on {kernel} ({} {}, {}): JSON {} (table: {})",
        guest.release,
        Arch::X86_64,
        guest.accel.name(),
        out.display(),
        out.with_extension("md").display()
    ));
    Ok(())
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

    fn options(shards: u32, subset: bool, filters: &[&str]) -> Options {
        Options {
            kernels: vec!["6.1".into()],
            arch: None,
            filters: filters.iter().map(|f| (*f).to_owned()).collect(),
            subset,
            keep: false,
            timeout: 1,
            update_readme: false,
            parallel: true,
            shards,
            max_guests: 0,
            niceness: 0,
            prebuilt: None,
        }
    }

    fn build(binaries: &[&str]) -> Build {
        Build {
            agent: "/t/node-diag".into(),
            manifest_dir: "/t".into(),
            binaries: binaries.iter().map(PathBuf::from).collect(),
        }
    }

    #[test]
    fn a_subset_is_dealt_by_name_and_every_name_runs_once() {
        let series = kernel::series("6.1").unwrap();
        let build = build(&["/t/a-1", "/t/b-2", "/t/c-3"]);
        let split = shards(&options(2, true, &[]), series, Arch::X86_64, &build);
        assert_eq!(split.len(), 2);
        assert_eq!(split[0].of, (1, 2));
        assert_eq!(split[1].of, (2, 2));
        // Each guest runs every binary with its share of the names.
        assert!(split.iter().all(|s| s.binaries == build.binaries));
        let mut names: Vec<&String> = split.iter().flat_map(|s| &s.filters).collect();
        assert_eq!(names.len(), series.subset.len());
        names.sort();
        names.dedup();
        assert_eq!(names.len(), series.subset.len(), "a name ran twice");
        assert!(split[0].filters.len().abs_diff(split[1].filters.len()) <= 1);
        // One shard is the entry as it was.
        let whole = shards(&options(1, true, &[]), series, Arch::X86_64, &build);
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0].filters.len(), series.subset.len());
    }

    /// A guest is not given a binary with no test its names select: this test binary,
    /// asked as the guests' are, lists this test for its name and nothing for another.
    #[test]
    fn a_guest_gets_only_the_binaries_its_names_select() {
        let me = std::env::current_exe().unwrap();
        let name = "a_guest_gets_only_the_binaries_its_names_select".to_owned();
        assert_eq!(lists_any(&me, std::slice::from_ref(&name)), Some(true));
        assert_eq!(lists_any(&me, &["no_test_is_named_so".into()]), Some(false));
        assert_eq!(
            lists_any(Path::new("/t/missing"), std::slice::from_ref(&name)),
            None
        );
        let binaries = [me.clone(), "/t/missing".into()];
        // Kept: the binary that selects it, and the one that cannot be asked.
        assert_eq!(selecting(&binaries, &[name], Arch::X86_64), binaries);
        assert_eq!(
            selecting(&binaries, &["no_test_is_named_so".into()], Arch::X86_64),
            [PathBuf::from("/t/missing")]
        );
        // Another architecture's binaries cannot be asked here: all kept.
        assert_eq!(
            selecting(&binaries, &["no_test_is_named_so".into()], Arch::Aarch64),
            binaries
        );
    }

    #[test]
    fn the_whole_suite_is_dealt_by_binary_and_never_into_empty_guests() {
        let series = kernel::series("6.1").unwrap();
        let build = build(&["/t/a-1", "/t/b-2", "/t/c-3"]);
        let split = shards(&options(2, false, &[]), series, Arch::X86_64, &build);
        assert_eq!(split.len(), 2);
        assert!(split.iter().all(|s| s.filters.is_empty()));
        assert_eq!(
            split[0].binaries,
            [PathBuf::from("/t/a-1"), "/t/c-3".into()]
        );
        assert_eq!(split[1].binaries, [PathBuf::from("/t/b-2")]);
        // One filter: one guest, whatever --shards says; so is the 5.10 fallback subset.
        let one = shards(&options(3, false, &["mtu"]), series, Arch::X86_64, &build);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].filters, ["mtu"]);
        let fallback = kernel::series("5.10").unwrap();
        assert_eq!(
            shards(&options(2, true, &[]), fallback, Arch::X86_64, &build).len(),
            1
        );
    }

    /// Runs five guests' turns through a gate of `places`, spawned last turn first;
    /// returns the order they came in and the most inside at once.
    fn through_gate(places: usize) -> (Vec<usize>, usize) {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let gate = Gate::new(places);
        let (log, running, most) = (
            Mutex::new(Vec::new()),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        thread::scope(|scope| {
            for turn in (0..5).rev() {
                let (gate, log, running, most) = (&gate, &log, &running, &most);
                scope.spawn(move || {
                    let _pass = gate.enter(turn);
                    log.lock().unwrap().push(turn);
                    most.fetch_max(running.fetch_add(1, SeqCst) + 1, SeqCst);
                    thread::sleep(Duration::from_millis(20));
                    running.fetch_sub(1, SeqCst);
                });
            }
        });
        (log.into_inner().unwrap(), most.load(SeqCst))
    }

    #[test]
    fn the_gate_lets_guests_in_by_turn_and_never_more_than_its_places() {
        // One place: strictly in turn, whatever the spawn order.
        assert_eq!(through_gate(1), (vec![0, 1, 2, 3, 4], 1));
        let (log, most) = through_gate(2);
        assert!(most <= 2, "{most} guests at once");
        assert_eq!(log.len(), 5);
    }

    #[test]
    fn shards_merge_into_one_row_that_passes_only_when_all_did() {
        let part = |k: u32, passed: bool, seconds: u64, passed_tests: u64| {
            let mut o = failed(
                Entry::Vm(kernel::series("6.1").unwrap(), Arch::X86_64),
                &anyhow::anyhow!("x"),
            );
            o.error = (!passed).then(|| format!("shard {k} failed"));
            o.passed = passed;
            o.seconds = seconds;
            o.suite = format!("kernel subset ({k}/2)");
            o.release = "6.1.0-1-amd64".into();
            o.tests = vec![(format!("bin{k}"), i32::from(!passed), seconds)];
            o.counts = Counts {
                passed: passed_tests,
                failed: u64::from(!passed),
                ignored: 0,
                binaries: 1,
            };
            o
        };
        let merged = merge_shards(vec![part(1, true, 600, 40), part(2, false, 700, 30)]);
        assert!(!merged.passed);
        assert_eq!(merged.seconds, 700);
        assert_eq!(merged.suite, "kernel subset");
        assert_eq!(merged.counts.passed, 70);
        assert_eq!(merged.counts.failed, 1);
        assert_eq!(merged.tests.len(), 2);
        assert_eq!(merged.error.as_deref(), Some("shard 2 failed"));
        assert!(merge_shards(vec![part(1, true, 1, 1), part(2, true, 2, 2)]).passed);
    }

    #[test]
    fn all_is_host_every_series_and_the_arm64_subset() {
        assert_eq!(
            names(&["all"], None),
            [
                "host",
                "6.1 x86_64",
                "6.12 x86_64",
                "5.10 x86_64",
                "6.1 aarch64"
            ]
        );
        assert_eq!(names(&["5.10"], None), ["5.10 x86_64"]);
        assert_eq!(names(&["all"], Some(Arch::Aarch64)), ["6.1 aarch64"]);
        assert_eq!(names(&["6.1", "host", "6.1"], None), ["6.1 x86_64", "host"]);
        assert_eq!(names(&[], None), ["host"]);
        assert!(entries(&["5.4".to_owned()], None).is_err());
        assert!(entries(&["host".to_owned()], Some(Arch::Aarch64)).is_err());
    }
}
