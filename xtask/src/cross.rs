//! `cargo xtask test`, step "cross builds": what CI can prove of the container image
//! without a container engine. The agent builds for each of the image's platforms,
//! linux/amd64 (the release agent) and linux/arm64 (dev profile, linked by Debian's
//! cross gcc), and
//! each binary is checked by parsing it (the `object` crate): an ELF for its
//! architecture that embeds a little-endian eBPF object (aya-build compiles the eBPF
//! crate for the target's endianness), itself parsed: every program of the agent is a
//! function symbol in a section of its program type, and the maps section is there.
//! A string that merely names a program (the loader's hook table does) does not pass.
//! When `qemu-aarch64` is installed the arm64 binary also runs (`--version`).
//!
//! The Rust standard library for aarch64 comes from `rustup target add`, which needs the
//! Rust distribution server; when it cannot be fetched, the arm64 build is reported as
//! skipped, with rustup's error, and the step goes on.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use object::{Architecture, Endianness, Object as _, ObjectSection as _, ObjectSymbol as _};

use crate::{agent, cmd, say::cross_builds as say};

/// Programs every build of the agent embeds (names from node-diag-ebpf), with the
/// section their program type puts them in (aya's `#[tracepoint]`, `#[raw_tracepoint]`,
/// `#[fexit]`, `#[classifier]`).
const PROGRAMS: &[(&str, &str)] = &[
    ("nd_set_state", "raw_tp"),
    ("nd_err_report", "tp_btf"),
    ("nd_err_fentry", "fentry"),
    ("nd_retransmit", "tp_btf"),
    ("nd_rcv_reset", "raw_tp"),
    ("nd_snd_reset", "raw_tp"),
    ("nd_kfree_skb", "tp_btf"),
    ("nd_kfree_site", "tp_btf"),
    ("nd_tc_shot4", "fexit"),
    ("nd_tc_shot5", "fexit"),
    ("nd_tc_shot_ingress", "fexit"),
    ("nd_cgroup_shot", "fexit"),
    ("nd_icmp_send", "tracepoint"),
    ("nd_icmp_fentry", "fentry"),
    ("nd_icmp6_send", "fentry"),
    ("nd_tc_ingress", "classifier"),
];
/// The section aya's `#[map]` puts map definitions in.
const MAPS_SECTION: &str = "maps";

/// One platform of the container image.
pub struct Target {
    /// Rust target triple.
    pub triple: &'static str,
    /// The image's platform, for messages.
    pub platform: &'static str,
    /// The architecture of its binaries.
    arch: Architecture,
    /// Linker for a cross build (`CARGO_TARGET_<TRIPLE>_LINKER`), when not the host's.
    linker: Option<(&'static str, &'static str)>,
    /// Runs a binary of this target on this machine, when installed.
    runner: Option<&'static str>,
}

/// The image's platforms, as the Dockerfile builds them.
pub const TARGETS: &[Target] = &[
    Target {
        triple: "x86_64-unknown-linux-gnu",
        platform: "linux/amd64",
        arch: Architecture::X86_64,
        linker: None,
        runner: None,
    },
    Target {
        triple: "aarch64-unknown-linux-gnu",
        platform: "linux/arm64",
        arch: Architecture::Aarch64,
        linker: Some((
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            "aarch64-linux-gnu-gcc",
        )),
        runner: Some("qemu-aarch64"),
    },
];

/// Builds and checks every target, cargo at scheduling niceness `niceness`; fails on
/// the first broken build, skips (with the reason) a target whose Rust standard library
/// cannot be installed.
pub fn run(niceness: i32) -> Result<()> {
    let host = host_triple()?;
    let mut built = 0;
    for target in TARGETS {
        if let Err(err) = ensure_std(target, say) {
            say(format_args!(
                "{} ({}): SKIPPED: {err:#}",
                target.triple, target.platform
            ));
            continue;
        }
        build(target, &host, niceness)?;
        built += 1;
    }
    if built == 0 {
        bail!("no target could be built");
    }
    Ok(())
}

/// The image platform whose Rust target is `triple`.
pub(crate) fn target(triple: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.triple == triple)
}

/// Installs `target`'s Rust standard library (`rustup target add`) unless it is there;
/// `announce` gets the command line before it runs.
pub(crate) fn ensure_std(target: &Target, announce: impl FnOnce(String)) -> Result<()> {
    let installed = cmd::output(cmd::command("rustup").args(["target", "list", "--installed"]))
        .context("rustup is required for the cross builds")?;
    if installed.lines().any(|l| l.trim() == target.triple) {
        return Ok(());
    }
    let mut add = cmd::command("rustup");
    add.args(["target", "add", target.triple]);
    announce(format!("{}: {}", target.triple, cmd::display(&add)));
    cmd::output(&mut add).map(drop).with_context(|| {
        format!(
            "the Rust standard library for {} cannot be installed here",
            target.triple
        )
    })
}

/// Points `cargo` at `target`'s cross linker when `target` is not `host`; returns the
/// variable set, for messages. Fails when that linker is not installed.
pub(crate) fn set_linker(
    cargo: &mut Command,
    target: &Target,
    host: &str,
) -> Result<Option<(&'static str, &'static str)>> {
    let Some((var, linker)) = target.linker.filter(|_| target.triple != host) else {
        return Ok(None);
    };
    if which::which(linker).is_err() {
        bail!(
            "{linker} not found for the {} build: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross (`cargo xtask prereqs --test-tools` does)",
            target.triple
        );
    }
    cargo.env(var, linker);
    Ok(Some((var, linker)))
}

/// The Rust target this machine builds for by default (`rustc -vV`).
pub(crate) fn host_triple() -> Result<String> {
    let rustc = cmd::output(cmd::command("rustc").arg("-vV"))?;
    rustc
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .context("`rustc -vV` printed no host")
}

fn build(target: &Target, host: &str, niceness: i32) -> Result<()> {
    let mut cargo = cmd::cargo();
    if niceness > 0 {
        cmd::lower_priority(&mut cargo, niceness);
    }
    cargo.args(["build", "-p", agent::PACKAGE]);
    // The host's own target is the release agent, built where a plain `--release` build
    // puts it (`cargo xtask test` has built it already). Another architecture's build is
    // the dev profile's: the same code, eBPF object (built optimised in every profile)
    // and cross linker, for about half the CPU of an optimised build of every
    // dependency, which on CI's two cores the tests beside it need more. The optimised
    // arm64 binary is the image build's (Dockerfile).
    let native = target.triple == host;
    if native {
        cargo.arg("--release");
    } else {
        cargo.args(["--target", target.triple]);
    }
    match set_linker(&mut cargo, target, host)? {
        Some((var, linker)) => say(format_args!("{var}={linker} {}", cmd::display(&cargo))),
        None => say(cmd::display(&cargo)),
    }
    cmd::run(&mut cargo).with_context(|| format!("cross build for {} failed", target.triple))?;
    let binary = if native {
        agent::binary(true)?
    } else {
        cmd::target_dir()?
            .join(target.triple)
            .join("debug")
            .join(agent::PACKAGE)
    };
    let summary = check_binary(&binary, target)?;
    say(format_args!(
        "{} ({}): {summary}",
        target.triple, target.platform
    ));
    if target.triple != host
        && let Some(runner) = target.runner
    {
        run_under(runner, &binary, target)?;
    }
    Ok(())
}

/// Checks `binary` is an ELF for `target` embedding a little-endian eBPF object with the
/// agent's programs; returns a one-line summary.
fn check_binary(binary: &Path, target: &Target) -> Result<String> {
    let bytes = fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
    let outer = object::File::parse(&*bytes)
        .with_context(|| format!("{} is not an object file", binary.display()))?;
    if outer.format() != object::BinaryFormat::Elf || outer.architecture() != target.arch {
        bail!(
            "{} is a {:?} {:?} file, expected an ELF for {:?} ({})",
            binary.display(),
            outer.format(),
            outer.architecture(),
            target.arch,
            target.triple
        );
    }
    let Some(object) = embedded_bpf_object(&bytes) else {
        bail!(
            "{} embeds no eBPF object (no ELF for the BPF architecture inside)",
            binary.display()
        );
    };
    if object.endianness != Endianness::Little {
        bail!(
            "{} embeds a big-endian eBPF object, but {} is little-endian",
            binary.display(),
            target.triple
        );
    }
    let missing = missing_programs(&object);
    if !missing.is_empty() {
        bail!(
            "the eBPF object in {} lacks {}",
            binary.display(),
            missing.join(", ")
        );
    }
    Ok(format!(
        "{:.1} MiB, {:?} ELF, embeds a little-endian eBPF object at offset {:#x} with {} programs and a {MAPS_SECTION} section",
        bytes.len() as f64 / (1024.0 * 1024.0),
        outer.architecture(),
        object.offset,
        PROGRAMS.len()
    ))
}

/// What the embedded eBPF object holds, as parsed.
#[derive(Debug)]
struct BpfObject {
    offset: usize,
    endianness: Endianness,
    /// `(function symbol, section name)` pairs.
    functions: Vec<(String, String)>,
    sections: Vec<String>,
}

/// The first ELF object for the BPF architecture embedded in `bytes` (past the outer
/// header). Candidates start at every ELF magic; only ones that parse count.
fn embedded_bpf_object(bytes: &[u8]) -> Option<BpfObject> {
    let mut from = 1;
    while let Some(pos) = find(&bytes[from..], b"\x7fELF") {
        let offset = from + pos;
        from = offset + 1;
        let Ok(file) = object::File::parse(&bytes[offset..]) else {
            continue;
        };
        if file.architecture() != Architecture::Bpf {
            continue;
        }
        let section_name = |index| {
            file.section_by_index(index)
                .ok()
                .and_then(|s| s.name().ok().map(str::to_owned))
                .unwrap_or_default()
        };
        let functions = file
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text)
            .filter_map(|s| {
                let name = s.name().ok()?.to_owned();
                Some((name, section_name(s.section_index()?)))
            })
            .collect();
        let sections = file
            .sections()
            .filter_map(|s| s.name().ok().map(str::to_owned))
            .collect();
        return Some(BpfObject {
            offset,
            endianness: file.endianness(),
            functions,
            sections,
        });
    }
    None
}

/// The programs (and maps section) `object` lacks, as `name (section)`.
fn missing_programs(object: &BpfObject) -> Vec<String> {
    let mut missing: Vec<String> = PROGRAMS
        .iter()
        .filter(|(program, section)| {
            !object
                .functions
                .iter()
                .any(|(name, sec)| name == program && sec.starts_with(section))
        })
        .map(|(program, section)| format!("program {program} (in a {section} section)"))
        .collect();
    if !object.sections.iter().any(|s| s == MAPS_SECTION) {
        missing.push(format!("the {MAPS_SECTION} section"));
    }
    missing
}

/// Runs `binary --version` under a user-mode emulator, when one is installed.
fn run_under(runner: &str, binary: &Path, target: &Target) -> Result<()> {
    let Ok(runner) = which::which(runner) else {
        say(format_args!(
            "{}: not run ({runner} not installed; Debian's qemu-user provides it)",
            target.triple
        ));
        return Ok(());
    };
    let sysroot = PathBuf::from("/usr").join(target.triple.replace("-unknown", ""));
    let mut run = Command::new(&runner);
    run.arg("-L").arg(&sysroot).arg(binary).arg("--version");
    let out = cmd::output(&mut run)?;
    say(format_args!(
        "{}: `{}` printed {}",
        target.triple,
        cmd::display(&run),
        out.trim()
    ));
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's eBPF object as this workspace built it (the build script's output),
    /// the newest when a build has run; the tests below need a real object to be meaningful.
    fn built_object() -> Option<Vec<u8>> {
        let build = cmd::target_dir().ok()?.join("debug").join("build");
        fs::read_dir(build)
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("node-diag-"))
            .map(|e| e.path().join("out").join("node-diag"))
            // Older build directories stay behind after the eBPF crate changes: the
            // newest object is the one the current sources built.
            .filter_map(|p| Some((fs::metadata(&p).ok()?.modified().ok()?, p)))
            .max_by_key(|(modified, _)| *modified)
            .and_then(|(_, p)| fs::read(p).ok())
    }

    #[test]
    fn the_real_object_passes_and_a_renamed_program_fails() {
        let Some(object_bytes) = built_object() else {
            eprintln!("no eBPF object built yet; run `cargo build -p node-diag` first");
            return;
        };
        // Wrapped in bytes the way the agent binary holds it: after other data.
        let mut binary = b"\x7fELF not a header, then the object: ".to_vec();
        binary.extend_from_slice(&object_bytes);
        let object = embedded_bpf_object(&binary).expect("embedded object found");
        assert_eq!(object.endianness, Endianness::Little);
        assert!(missing_programs(&object).is_empty(), "{object:?}");

        // Program names present only as strings (as in the loader's hook table) fail.
        let mut renamed = object;
        for (name, _) in &mut renamed.functions {
            if name == "nd_tc_ingress" {
                *name = "nd_tc_ingresz".into();
            }
        }
        assert_eq!(
            missing_programs(&renamed),
            ["program nd_tc_ingress (in a classifier section)"]
        );
        // A program in the wrong kind of section fails too.
        let mut moved = embedded_bpf_object(&binary).unwrap();
        for (name, section) in &mut moved.functions {
            if name == "nd_err_report" {
                *section = "tracepoint".into();
            }
        }
        assert_eq!(
            missing_programs(&moved),
            ["program nd_err_report (in a tp_btf section)"]
        );
    }

    #[test]
    fn bytes_without_a_bpf_object_have_none() {
        assert!(embedded_bpf_object(b"\x7fELF\x02\x01\x01 truncated header").is_none());
        let host = fs::read(std::env::current_exe().unwrap()).unwrap();
        // The test binary itself is an ELF, but not a BPF one (its offset 0 is skipped).
        assert!(embedded_bpf_object(&host).is_none());
    }

    #[test]
    fn every_target_has_a_distinct_platform() {
        let platforms: Vec<_> = TARGETS.iter().map(|t| t.platform).collect();
        assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    }
}
