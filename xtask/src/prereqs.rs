//! `cargo xtask prereqs`: what this machine needs to build (and test) node-diag.
//!
//! Each step prints exactly one line, `[prereqs] <what>: <state>`. Missing pieces that
//! can be installed are installed; the rest fail with the command that fixes them.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{cmd, say::prereqs as say};

/// LLVM major version of the nightly rustc; bpf-linker must be built against the same.
const LLVM_MAJOR: u32 = 22;
/// Debian packages bpf-linker's LLVM 22 build links against.
const LLVM_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
];
/// Tools the integration tests drive: (binary, Debian package).
const TEST_TOOLS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("nft", "nftables"),
    ("bpftool", "bpftool"),
    ("ping", "iputils-ping"),
    ("tc", "iproute2"),
    ("ss", "iproute2"),
    ("sysctl", "procps"),
    ("iperf3", "iperf3"),
    // The deploy checks and the Prometheus end-to-end tests.
    ("prometheus", "prometheus"),
    ("promtool", "prometheus"),
    ("python3", "python3"),
    // The HTTP endpoint tests: certificates for TLS, and a real TLS and basic-auth client.
    ("openssl", "openssl"),
    ("curl", "curl"),
    // The linux/arm64 cross build of the container image's binary.
    ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
    ("qemu-aarch64", "qemu-user"),
    // WireGuard peers in the tunnel MTU tests.
    ("wg", "wireguard-tools"),
    // kube-proxy's iptables-mode rules in the Service tests (nft-backed and legacy).
    ("iptables", "iptables"),
    ("iptables-legacy", "iptables"),
    // A real container runtime for the pod-naming tests (CRI).
    ("containerd", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
    // The DNS server of the cluster view's headless Service (findings --cluster).
    ("dnsmasq", "dnsmasq-base"),
];
/// Debian packages the tests need that install no binary of their own on `PATH`: the
/// aarch64 C library; the CNI plugins (in /usr/lib/cni) containerd's pods are wired
/// with; and busybox-static, the sleeping process of the locally built sandbox image
/// (the dynamic busybox installs the same /bin/busybox).
const TEST_PACKAGES: &[(&str, &[&str])] = &[
    ("aarch64 C library", &["libc6-dev-arm64-cross"]),
    ("CNI plugins", &["containernetworking-plugins"]),
    ("busybox-static", &["busybox-static"]),
];
/// Tools building the agent needs besides Rust: protoc compiles the CRI API (k8s-cri's
/// build script).
const BUILD_TOOLS: &[(&str, &str)] = &[("protoc", "protobuf-compiler")];
/// Python modules the deploy checks import: (module, pip requirement).
const PYTHON_MODULES: &[(&str, &str)] = &[
    ("yaml", "PyYAML"),
    ("kubernetes_validate", "kubernetes-validate==1.37.0"),
    ("yamllint", "yamllint==1.38.0"),
];

/// Which groups of prerequisites to check.
#[derive(Debug, Clone, Copy)]
pub struct Tools {
    /// Also the tools the integration tests drive.
    pub test_tools: bool,
}

impl Tools {
    /// What building the agent needs.
    pub const BUILD: Self = Self { test_tools: false };
    /// What building and testing needs.
    pub const TEST: Self = Self { test_tools: true };
}

/// Checks every prerequisite in order, installing what it can.
pub fn ensure(tools: Tools) -> Result<()> {
    let mut apt = Apt::default();
    nightly_toolchain()?;
    rust_src()?;
    system_tools(&mut apt, BUILD_TOOLS)?;
    bpf_linker(&mut apt)?;
    if tools.test_tools {
        test_tools(&mut apt)?;
    }
    Ok(())
}

fn rustup() -> Command {
    cmd::command("rustup")
}

/// (a) The nightly toolchain, which builds the eBPF crate with `-Z build-std=core`.
fn nightly_toolchain() -> Result<()> {
    let list = cmd::output(rustup().args(["toolchain", "list"]))
        .context("rustup is required to find the nightly toolchain")?;
    if has_nightly(&list) {
        say("nightly toolchain", "present");
        return Ok(());
    }
    say("nightly toolchain", "missing");
    bail!(
        "no `nightly` toolchain in `rustup toolchain list`; install it with \
         `rustup toolchain install nightly --profile minimal --component rust-src`"
    )
}

/// Whether `rustup toolchain list` output has the `nightly` channel (not a dated one).
fn has_nightly(list: &str) -> bool {
    list.lines()
        .filter_map(|line| line.split_whitespace().next())
        .any(|name| {
            name == "nightly"
                || name
                    .strip_prefix("nightly-")
                    .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
        })
}

/// (b) `rust-src` for nightly, which `-Z build-std` compiles `core` from.
fn rust_src() -> Result<()> {
    const STEP: &str = "rust-src for nightly";
    let installed =
        cmd::output(rustup().args(["component", "list", "--toolchain", "nightly", "--installed"]))?;
    if has_component(&installed, "rust-src") {
        say(STEP, "present");
        return Ok(());
    }
    say(STEP, "installing");
    cmd::run(rustup().args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

/// Whether `rustup component list --installed` output lists `component`.
fn has_component(installed: &str, component: &str) -> bool {
    installed.lines().any(|line| {
        let name = line.trim();
        name == component
            || name
                .strip_prefix(component)
                .is_some_and(|rest| rest.starts_with('-'))
    })
}

/// (c) `bpf-linker`, built against Debian's LLVM 22 (the default build wants a newer LLVM).
fn bpf_linker(apt: &mut Apt) -> Result<()> {
    const STEP: &str = "bpf-linker";
    if let Some(path) = find_bpf_linker() {
        match bpf_linker_version(&path) {
            Ok(version) => {
                say(
                    STEP,
                    format_args!("present ({version}, {})", path.display()),
                );
                return Ok(());
            }
            Err(err) => {
                say(STEP, format_args!("broken ({err:#}), reinstalling"));
                return install_bpf_linker(apt, true);
            }
        }
    }
    say(STEP, format_args!("installing (against LLVM {LLVM_MAJOR})"));
    install_bpf_linker(apt, false)
}

/// `bpf-linker` on `PATH`, else in cargo's bin directory.
fn find_bpf_linker() -> Option<PathBuf> {
    which::which("bpf-linker").ok().or_else(|| {
        cmd::cargo_bin_dir()
            .map(|dir| dir.join("bpf-linker"))
            .filter(|path| path.is_file())
    })
}

fn bpf_linker_version(path: &Path) -> Result<String> {
    let out = cmd::output(cmd::command(path).arg("--version"))?;
    Ok(out.trim().to_owned())
}

fn install_bpf_linker(apt: &mut Apt, force: bool) -> Result<()> {
    apt.ensure(&format!("LLVM {LLVM_MAJOR} packages"), LLVM_PACKAGES)?;
    let mut install = cmd::cargo();
    install
        .env("LLVM_PREFIX", format!("/usr/lib/llvm-{LLVM_MAJOR}"))
        .args([
            "install",
            "bpf-linker",
            "--no-default-features",
            "--features",
        ])
        .arg(format!("llvm-{LLVM_MAJOR}"));
    if force {
        install.arg("--force");
    }
    cmd::run(&mut install)?;
    if find_bpf_linker().is_none() {
        bail!(
            "`cargo install bpf-linker` succeeded but bpf-linker is neither on PATH nor in cargo's bin directory"
        );
    }
    Ok(())
}

/// (d) The tools the integration tests drive.
fn test_tools(apt: &mut Apt) -> Result<()> {
    system_tools(apt, TEST_TOOLS)?;
    for (what, packages) in TEST_PACKAGES {
        apt.ensure(what, packages)?;
    }
    python_modules(apt)
}

/// The Python modules of `deploy/tests/check.py`, installed with pip when missing (with
/// Debian's python3-pip when python3 has no pip; `--break-system-packages` when the
/// interpreter is Debian's own, which refuses pip installs otherwise).
fn python_modules(apt: &mut Apt) -> Result<()> {
    let missing: Vec<&str> = PYTHON_MODULES
        .iter()
        .filter(|(module, _)| {
            let import = format!("import {module}");
            let present = cmd::command("python3")
                .args(["-c", &import])
                .output()
                .is_ok_and(|out| out.status.success());
            let step = format!("python3 module {module}");
            say(&step, if present { "present" } else { "installing" });
            !present
        })
        .map(|&(_, requirement)| requirement)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !cmd::is_root() {
        bail!(
            "missing Python modules; run: python3 -m pip install {}",
            missing.join(" ")
        );
    }
    let has_pip = cmd::command("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !has_pip {
        apt.install(&["python3-pip"])?;
    }
    let pip = |extra: &[&str]| {
        let mut pip = cmd::command("python3");
        pip.args(["-m", "pip", "install", "--quiet"])
            .args(extra)
            .args(&missing);
        pip
    };
    if cmd::run(&mut pip(&[])).is_ok() {
        return Ok(());
    }
    cmd::run(&mut pip(&["--break-system-packages"]))
}

/// What booting guest kernels needs: qemu for each architecture, a static busybox for
/// the initramfs, xz/zstd for compressed modules, depmod, and for aarch64 guests the
/// arm64 package lists and mmdebstrap (their userland).
pub fn ensure_vm(aarch64: bool) -> Result<()> {
    let mut apt = Apt::default();
    let mut tools = vec![
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("busybox", "busybox-static"),
        ("xz", "xz-utils"),
        ("zstd", "zstd"),
        ("depmod", "kmod"),
        ("dpkg-deb", "dpkg"),
    ];
    if aarch64 {
        tools.push(("qemu-system-aarch64", "qemu-system-arm"));
        tools.push(("mmdebstrap", "mmdebstrap"));
        foreign_arch(&mut apt, "arm64")?;
    }
    system_tools(&mut apt, &tools)?;
    // busybox (dynamic) and busybox-static both install /bin/busybox.
    apt.ensure("busybox-static", &["busybox-static"])
}

/// Adds a dpkg foreign architecture (for `apt-get download pkg:arm64`), then refreshes
/// the package lists.
fn foreign_arch(apt: &mut Apt, arch: &str) -> Result<()> {
    let step = format!("dpkg architecture {arch}");
    let foreign = cmd::output(cmd::command("dpkg").arg("--print-foreign-architectures"))?;
    if foreign.lines().any(|l| l.trim() == arch) {
        say(&step, "present");
        return Ok(());
    }
    if !cmd::is_root() {
        bail!("as root run: dpkg --add-architecture {arch} && apt-get update");
    }
    say(&step, "adding");
    cmd::run(cmd::command("dpkg").args(["--add-architecture", arch]))?;
    apt.updated = false;
    apt.update()
}

/// Checks other system tools, (binary, Debian package) pairs, and installs the missing
/// ones (as root): what `cargo xtask bench` drives on top of the test tools.
pub fn ensure_system_tools(tools: &[(&str, &str)]) -> Result<()> {
    system_tools(&mut Apt::default(), tools)
}

fn system_tools(apt: &mut Apt, tools: &[(&str, &str)]) -> Result<()> {
    let mut missing = Vec::new();
    for &(tool, package) in tools {
        let step = format!("{tool} ({package})");
        match find_system_tool(tool) {
            Some(path) => say(&step, format_args!("present ({})", path.display())),
            None => {
                say(&step, "installing");
                missing.push(package);
            }
        }
    }
    apt.install(&missing)
}

/// `tool` on `PATH`, else in the sbin directories a non-root `PATH` often lacks.
fn find_system_tool(tool: &str) -> Option<PathBuf> {
    which::which(tool).ok().or_else(|| {
        ["/usr/sbin", "/sbin"]
            .iter()
            .map(|dir| Path::new(dir).join(tool))
            .find(|path| path.is_file())
    })
}

/// Debian packages through dpkg-query and apt-get; runs `apt-get update` at most once.
#[derive(Default)]
struct Apt {
    updated: bool,
}

impl Apt {
    /// Installs whichever of `packages` are not installed, announcing it as `step`.
    fn ensure(&mut self, step: &str, packages: &[&str]) -> Result<()> {
        let missing = packages
            .iter()
            .copied()
            .filter_map(|package| match is_installed(package) {
                Ok(true) => None,
                Ok(false) => Some(Ok(package)),
                Err(err) => Some(Err(err)),
            })
            .collect::<Result<Vec<_>>>()?;
        if missing.is_empty() {
            say(step, "present");
            return Ok(());
        }
        say(step, format_args!("installing {}", missing.join(" ")));
        self.install(&missing)
    }

    /// `apt-get install -y packages` as root; otherwise fails with the exact command.
    fn install(&mut self, packages: &[&str]) -> Result<()> {
        if packages.is_empty() {
            return Ok(());
        }
        if !cmd::is_root() {
            bail!(
                "missing Debian packages; as root run: apt-get update && apt-get install -y {}",
                packages.join(" ")
            );
        }
        self.update()?;
        let install = |extra: &[String]| {
            let mut apt = cmd::command("apt-get");
            apt.env("DEBIAN_FRONTEND", "noninteractive")
                // Without recommends: prometheus would pull in node-exporter, and
                // wireguard-tools a whole kernel image.
                .args(["install", "-y", "--no-install-recommends"])
                .args(["-o", "DPkg::Lock::Timeout=300"])
                .args(packages)
                .args(extra);
            apt
        };
        let first = cmd::run(&mut install(&[]));
        if first.is_ok() || !packages.iter().any(|p| p.starts_with("qemu-")) {
            return first;
        }
        // A qemu-utils newer than the release's (from backports, as on these machines)
        // breaks the release's qemu-system: take the release's qemu-utils too.
        let codename = os_codename()?;
        say(
            "qemu",
            format_args!(
                "retrying with qemu-utils/{codename} (the installed one is from another suite)"
            ),
        );
        cmd::run(&mut install(&[
            "--allow-downgrades".to_owned(),
            format!("qemu-utils/{codename}"),
        ]))
    }

    /// `apt-get update`, once.
    fn update(&mut self) -> Result<()> {
        if !self.updated {
            cmd::run(cmd::command("apt-get").args(["update", "-q"]))?;
            self.updated = true;
        }
        Ok(())
    }
}

/// `VERSION_CODENAME` from /etc/os-release (`bookworm`).
fn os_codename() -> Result<String> {
    let release = std::fs::read_to_string("/etc/os-release")?;
    release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|c| c.trim_matches('"').to_owned())
        .context("/etc/os-release has no VERSION_CODENAME")
}

/// Whether dpkg reports `package` as installed.
fn is_installed(package: &str) -> Result<bool> {
    let mut query = cmd::command("dpkg-query");
    query.args(["-W", "-f=${Status}", package]);
    let line = cmd::display(&query);
    let out = query.output().with_context(|| {
        format!("failed to spawn `{line}` (installing the LLVM packages needs Debian's dpkg)")
    })?;
    // dpkg-query exits 1 for a package it has never seen: that is "not installed".
    Ok(out.status.success()
        && String::from_utf8_lossy(&out.stdout).trim() == "install ok installed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nightly_channel_is_found() {
        let list = "stable-x86_64-unknown-linux-gnu (active, default)\n\
                    nightly-x86_64-unknown-linux-gnu\n";
        assert!(has_nightly(list));
    }

    #[test]
    fn dated_nightly_is_not_the_nightly_channel() {
        let list = "stable-x86_64-unknown-linux-gnu (default)\n\
                    nightly-2026-05-19-x86_64-unknown-linux-gnu\n";
        assert!(!has_nightly(list));
        assert!(!has_nightly("no installed toolchains\n"));
    }

    #[test]
    fn components_match_with_or_without_target() {
        let installed =
            "cargo-x86_64-unknown-linux-gnu\nrust-src\nrustc-x86_64-unknown-linux-gnu\n";
        assert!(has_component(installed, "rust-src"));
        assert!(has_component(installed, "rustc"));
        assert!(!has_component(installed, "rustfmt"));
        assert!(!has_component(
            "rust-std-x86_64-unknown-linux-gnu\n",
            "rust-src"
        ));
    }
}
