//! `cargo xtask test`, step "cross builds": what CI can prove of the container image
//! without a container engine. The release agent builds for each of the image's
//! platforms, linux/amd64 and linux/arm64 (Debian's cross gcc links the arm64 one), and
//! each binary is checked: an ELF for its architecture that embeds a little-endian
//! eBPF object (aya-build compiles the eBPF crate for the target's endianness) holding
//! the agent's programs. When `qemu-aarch64` is installed the arm64 binary also runs
//! (`--version`).
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

use crate::{agent, cmd};

/// ELF machine numbers (`e_machine`).
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;
const EM_BPF: u16 = 247;
/// Programs every build of the agent embeds (names from node-diag-ebpf).
const PROGRAMS: &[&str] = &["nd_set_state", "nd_kfree_skb", "nd_icmp_send"];

/// One platform of the container image.
pub struct Target {
    /// Rust target triple.
    pub triple: &'static str,
    /// The image's platform, for messages.
    pub platform: &'static str,
    /// `e_machine` of its binaries.
    machine: u16,
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
        machine: EM_X86_64,
        linker: None,
        runner: None,
    },
    Target {
        triple: "aarch64-unknown-linux-gnu",
        platform: "linux/arm64",
        machine: EM_AARCH64,
        linker: Some((
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            "aarch64-linux-gnu-gcc",
        )),
        runner: Some("qemu-aarch64"),
    },
];

fn say(what: impl std::fmt::Display) {
    println!("[test] cross builds: {what}");
}

/// Builds and checks every target; fails on the first broken build, skips (with the
/// reason) a target whose Rust standard library cannot be installed.
pub fn run() -> Result<()> {
    let host = host_triple()?;
    let installed = cmd::output(cmd::command("rustup").args(["target", "list", "--installed"]))
        .context("rustup is required for the cross builds")?;
    let mut built = 0;
    for target in TARGETS {
        if !installed.lines().any(|l| l.trim() == target.triple) {
            let mut add = cmd::command("rustup");
            add.args(["target", "add", target.triple]);
            say(format_args!("{}: {}", target.triple, cmd::display(&add)));
            if let Err(err) = cmd::output(&mut add) {
                say(format_args!(
                    "{} ({}): SKIPPED: its Rust standard library cannot be installed here: {err:#}",
                    target.triple, target.platform
                ));
                continue;
            }
        }
        build(target, &host)?;
        built += 1;
    }
    if built == 0 {
        bail!("no target could be built");
    }
    Ok(())
}

fn host_triple() -> Result<String> {
    let rustc = cmd::output(cmd::command("rustc").arg("-vV"))?;
    rustc
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .context("`rustc -vV` printed no host")
}

fn build(target: &Target, host: &str) -> Result<()> {
    let mut cargo = cmd::cargo();
    cargo.args([
        "build",
        "--release",
        "-p",
        agent::PACKAGE,
        "--target",
        target.triple,
    ]);
    if target.triple != host
        && let Some((var, linker)) = target.linker
    {
        if which::which(linker).is_err() {
            bail!(
                "{linker} not found for the {} build: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross (`cargo xtask prereqs --test-tools` does)",
                target.triple
            );
        }
        cargo.env(var, linker);
        say(format_args!("{var}={linker} {}", cmd::display(&cargo)));
    } else {
        say(cmd::display(&cargo));
    }
    cmd::run(&mut cargo).with_context(|| format!("cross build for {} failed", target.triple))?;
    let binary = cmd::target_dir()?
        .join(target.triple)
        .join("release")
        .join(agent::PACKAGE);
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
    let Some(header) = elf_header(&bytes, 0) else {
        bail!("{} is not an ELF file", binary.display());
    };
    if header.machine != target.machine {
        bail!(
            "{} is for ELF machine {}, expected {} ({})",
            binary.display(),
            header.machine,
            target.machine,
            target.triple
        );
    }
    let objects = embedded_bpf_objects(&bytes);
    let Some(object) = objects.first() else {
        bail!(
            "{} embeds no eBPF object (no ELF with e_machine EM_BPF inside)",
            binary.display()
        );
    };
    if !object.little_endian {
        bail!(
            "{} embeds a big-endian eBPF object, but {} is little-endian",
            binary.display(),
            target.triple
        );
    }
    for program in PROGRAMS {
        if !contains(&bytes, program.as_bytes()) {
            bail!("{} lacks eBPF program {program}", binary.display());
        }
    }
    Ok(format!(
        "{:.1} MiB, ELF machine {}, embeds a little-endian eBPF object at offset {:#x} with {}",
        bytes.len() as f64 / (1024.0 * 1024.0),
        header.machine,
        object.offset,
        PROGRAMS.join(", ")
    ))
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ElfHeader {
    offset: usize,
    little_endian: bool,
    machine: u16,
}

/// The ELF header at `offset`, if there is a plausible one.
fn elf_header(bytes: &[u8], offset: usize) -> Option<ElfHeader> {
    let ident = bytes.get(offset..offset + 20)?;
    if &ident[..4] != b"\x7fELF" || !matches!(ident[4], 1 | 2) || ident[6] != 1 {
        return None;
    }
    let little_endian = match ident[5] {
        1 => true,
        2 => false,
        _ => return None,
    };
    let raw = [ident[18], ident[19]];
    let machine = if little_endian {
        u16::from_le_bytes(raw)
    } else {
        u16::from_be_bytes(raw)
    };
    Some(ElfHeader {
        offset,
        little_endian,
        machine,
    })
}

/// Every ELF object for EM_BPF embedded in `bytes` (past the outer header).
fn embedded_bpf_objects(bytes: &[u8]) -> Vec<ElfHeader> {
    let mut found = Vec::new();
    let mut from = 1;
    while let Some(pos) = find(&bytes[from..], b"\x7fELF") {
        let offset = from + pos;
        if let Some(header) = elf_header(bytes, offset)
            && header.machine == EM_BPF
        {
            found.push(header);
        }
        from = offset + 1;
    }
    found
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    find(haystack, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elf(machine: u16, little_endian: bool) -> Vec<u8> {
        let mut h = vec![
            0x7f,
            b'E',
            b'L',
            b'F',
            2,
            if little_endian { 1 } else { 2 },
            1,
        ];
        h.resize(18, 0);
        if little_endian {
            h.extend_from_slice(&machine.to_le_bytes());
        } else {
            h.extend_from_slice(&machine.to_be_bytes());
        }
        h.resize(64, 0);
        h
    }

    #[test]
    fn finds_the_embedded_bpf_object_and_its_endianness() {
        let mut binary = elf(EM_AARCH64, true);
        binary.extend_from_slice(b"some rodata \x7fELF but not a header");
        let at = binary.len();
        binary.extend(elf(EM_BPF, true));
        let outer = elf_header(&binary, 0).unwrap();
        assert_eq!(outer.machine, EM_AARCH64);
        let objects = embedded_bpf_objects(&binary);
        assert_eq!(objects.len(), 1);
        assert_eq!(objects[0].offset, at);
        assert!(objects[0].little_endian);
        let mut big = elf(EM_X86_64, true);
        big.extend(elf(EM_BPF, false));
        assert!(!embedded_bpf_objects(&big)[0].little_endian);
    }

    #[test]
    fn a_binary_without_bpf_object_has_none() {
        let binary = elf(EM_X86_64, true);
        assert!(embedded_bpf_objects(&binary).is_empty());
    }

    #[test]
    fn every_target_has_a_distinct_platform() {
        let platforms: Vec<_> = TARGETS.iter().map(|t| t.platform).collect();
        assert_eq!(platforms, ["linux/amd64", "linux/arm64"]);
    }
}
