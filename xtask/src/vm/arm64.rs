//! aarch64 guests: the arm64 userland they boot into and the binaries they run, cross
//! built on this x86_64 machine.
//!
//! The host's `/` cannot be an arm64 guest's root, so [`userland`] builds a minimal
//! Debian bookworm arm64 root once with `mmdebstrap --variant=extract`: packages are
//! resolved by apt and unpacked, but no maintainer script runs, so no arm64 code runs
//! on the host and no binfmt_misc handler is needed. What the scripts would have done
//! and the guest relies on, the extract hook does instead ([`EXTRACT_HOOK`]).
//! The guest mounts that directory read-only over 9p under a tmpfs overlay, exactly like
//! the host's `/` for an x86_64 guest, and the workspace at its host path, so that the
//! binaries [`cross_build`] returns run at the paths it returns.
//!
//! # What an aarch64 guest needs
//!
//! Seen working with Debian's `6.1.0-57-arm64` and `6.12.117+deb12-arm64` under qemu 7.2
//! TCG: doctor ready (BTF, every tracepoint, all programs through the verifier, TC) and
//! the subset (refused, timeout, reset, SIGTERM, PMTUD black hole) passing on both.
//!
//! - qemu: `qemu-system-aarch64 -machine virt -cpu max,pauth-impdef=on -accel
//!   tcg,thread=multi -smp 2 -m 2048` ([`super::arch::Arch::tcg_cpu`]). Plain `-cpu
//!   max` emulates pointer authentication with the architected QARMA algorithm, which
//!   Debian's kernel uses on every function call: boot and doctor take 2.5 times longer.
//! - Kernel command line: `console=ttyAMA0` ([`super::arch::Arch::console`], the virt
//!   machine's PL011, built in), plus `rdinit=/init panic=-1` as for x86_64.
//! - Modules: `-virtfs` on the virt machine is a virtio-9p PCI device, so the same
//!   [`super::ROOT_MODULES`] as x86_64. arm64 6.1 ships plain `.ko` files, has `virtio`
//!   and `virtio_ring` built in, and resolves them to `virtio_pci_legacy_dev
//!   virtio_pci_modern_dev virtio_pci netfs fscache 9pnet 9pnet_virtio 9p overlay`.
//!   arm64 6.12 ships `.ko.xz`, has `virtio_pci` built in, and needs `netfs 9pnet
//!   9pnet_virtio 9p overlay`.
//! - initramfs busybox: the userland's own `busybox-static` ([`busybox`]).
//! - The init script must `exec chroot` (PID 1 itself changes root): kernel threads share
//!   PID 1's root, so the kernel's module autoloading (`/sbin/modprobe` for `ip link add
//!   type veth`, nft expressions...) then finds the userland's `modprobe` and modules. A
//!   `chroot` run as a child leaves them in the initramfs, where autoloading fails
//!   ("Unknown device type").
//! - Mounts: the userland read-only at `/` (overlay), the kernel package's `lib/modules`
//!   at `/lib/modules` (indexed by `depmod -b` on the host: it reads arm64 modules
//!   fine), the workspace read-only at its host path, then proc, sysfs, devtmpfs,
//!   devpts, tmpfs `/run` and `/tmp`, bpffs; the agent mounts tracefs itself.
//! - Times on a 2-core host (busy with other builds for some of them): root over 9p
//!   ready 4.5-14 s after qemu starts; `node-diag doctor` 3 s (release agent) or 5-10 s
//!   (debug); the subset with `NODE_DIAG_TEST_TIME_SCALE=4` 215-300 s on 6.1 and 80 s
//!   on 6.12, each test 30-75 s on 6.1.
use std::{
    fs,
    path::{Component, Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

use crate::{agent, cmd, cross, integration_tests, say::integration as say};

/// The Rust target of arm64 nodes.
pub const TARGET: &str = "aarch64-unknown-linux-gnu";

/// The Debian release of the userland.
pub const SUITE: &str = "bookworm";

/// The userland's packages; apt adds their dependencies (not their recommendations).
/// What the tests and the guest script run: `ip`/`tc`/`ss`, `nft`, `iptables`, `ping`,
/// `sysctl`, `modprobe`, `mount`, `chroot`, `setpriv`, `bpftool`, `iperf3`, `wg`,
/// `python3`, and a shell with coreutils, sed, grep and hostname.
pub const PACKAGES: &[&str] = &[
    "base-passwd",
    "bpftool",
    "busybox-static",
    "coreutils",
    "dash",
    "grep",
    "hostname",
    "iperf3",
    "iproute2",
    "iptables",
    "iputils-ping",
    "kmod",
    "mount",
    "nftables",
    "procps",
    "python3",
    "sed",
    "util-linux",
    "wireguard-tools",
];

/// Run in the unpacked root (`$1`) instead of the maintainer scripts: the iptables
/// alternatives (nft backend, as `update-alternatives` would pick), `/etc/passwd` and
/// `/etc/group` (base-passwd's postinst), `/etc/hosts`, the mount points, and no
/// documentation, translations or iconv modules (a third of the size).
pub const EXTRACT_HOOK: &str = r#"set -e
cd "$1"
rm -rf usr/share/doc usr/share/man usr/share/info usr/share/locale usr/share/lintian \
  usr/share/bash-completion usr/lib/aarch64-linux-gnu/gconv
for t in iptables ip6tables; do
  for s in "" -save -restore; do ln -sf "$t-nft$s" "usr/sbin/$t$s"; done
done
cp usr/share/base-passwd/passwd.master etc/passwd
cp usr/share/base-passwd/group.master etc/group
printf '127.0.0.1 localhost\n::1 localhost ip6-localhost\n' > etc/hosts
mkdir -p dev proc sys run tmp root usr/lib/modules
chmod 1777 tmp
"#;

/// Files the userland must have, relative to its root (symlinks resolved inside it).
const REQUIRED: &[&str] = &[
    "usr/lib/ld-linux-aarch64.so.1",
    "bin/sh",
    "usr/bin/busybox",
    "usr/bin/ip",
    "usr/sbin/tc",
    "usr/bin/ss",
    "usr/sbin/nft",
    "usr/sbin/iptables",
    "usr/bin/ping",
    "usr/sbin/sysctl",
    "usr/sbin/modprobe",
    "usr/bin/mount",
    "usr/sbin/chroot",
    "usr/bin/setpriv",
    "usr/sbin/bpftool",
    "usr/bin/iperf3",
    "usr/bin/wg",
    "usr/bin/python3",
    "usr/bin/hostname",
    "usr/bin/sed",
    "etc/passwd",
];

/// mmdebstrap's hook that makes the root merged-/usr (`/bin` → `usr/bin`...), as
/// bookworm systems are; the extract variant does not do it by itself.
const MERGED_USR_HOOKS: &str = "/usr/share/mmdebstrap/hooks/merged-usr";

/// Changing what [`userland`] does (beyond the package list and hook) bumps this.
const RECIPE: u32 = 1;

/// The arm64 root directory under `cache` (`<cache>/arm64-userland`), built unless the
/// one there was built from the same recipe. Building runs `mmdebstrap` as root
/// (about 10 s and 30 MB of downloads; 95 MB on disk).
pub fn userland(cache: &Path) -> Result<PathBuf> {
    let dir = cache.join("arm64-userland");
    let stamp = cache.join("arm64-userland.stamp");
    let key = stamp_key();
    if dir.is_dir() && fs::read_to_string(&stamp).is_ok_and(|s| s == key) {
        return Ok(dir);
    }
    if !cmd::is_root() {
        bail!(
            "building the arm64 userland ({}) needs root: mmdebstrap unpacks packages owned by root",
            dir.display()
        );
    }
    if !Path::new(MERGED_USR_HOOKS).is_dir() {
        bail!("{MERGED_USR_HOOKS} is missing: apt-get install mmdebstrap");
    }
    fs::create_dir_all(cache)?;
    let _ = fs::remove_file(&stamp);
    let building = cache.join("arm64-userland.new");
    for old in [&building, &dir] {
        if old.exists() {
            fs::remove_dir_all(old)
                .with_context(|| format!("failed to remove {}", old.display()))?;
        }
    }
    let mut mmdebstrap = mmdebstrap_command(&building);
    say(format_args!(
        "building the arm64 userland: {}",
        cmd::display(&mmdebstrap)
    ));
    cmd::run(&mut mmdebstrap).context("failed to build the arm64 userland")?;
    check(&building)?;
    fs::rename(&building, &dir)?;
    fs::write(&stamp, key)?;
    smoke_test(&dir);
    Ok(dir)
}

/// The static busybox of the userland, for the initramfs.
pub fn busybox(userland: &Path) -> PathBuf {
    userland.join("usr").join("bin").join("busybox")
}

/// What identifies a userland: the recipe, suite, packages and hook.
fn stamp_key() -> String {
    format!(
        "recipe {RECIPE}\nsuite {SUITE}\npackages {}\nhook\n{EXTRACT_HOOK}",
        PACKAGES.join(",")
    )
}

fn mmdebstrap_command(target: &Path) -> std::process::Command {
    let mut mmdebstrap = cmd::command("mmdebstrap");
    mmdebstrap
        .args([
            "--mode=root",
            "--variant=extract",
            "--architectures=arm64",
            "--format=directory",
            "--aptopt=APT::Install-Recommends \"false\"",
        ])
        .arg(format!("--hook-dir={MERGED_USR_HOOKS}"))
        .arg(format!("--include={}", PACKAGES.join(",")))
        .arg(format!("--extract-hook={EXTRACT_HOOK}"))
        .arg(SUITE)
        .arg(target);
    mmdebstrap
}

/// Fails unless every [`REQUIRED`] file is in `root`.
fn check(root: &Path) -> Result<()> {
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|rel| resolve_in(root, Path::new(rel)).is_none_or(|p| !p.is_file()))
        .collect();
    if !missing.is_empty() {
        bail!(
            "the arm64 userland {} lacks {}",
            root.display(),
            missing.join(", ")
        );
    }
    Ok(())
}

/// `rel` inside `root` with symlinks followed as the guest would (absolute targets are
/// relative to `root`); `None` on a dangling link or a loop.
fn resolve_in(root: &Path, rel: &Path) -> Option<PathBuf> {
    let mut pending: Vec<PathBuf> = rel
        .components()
        .rev()
        .map(|c| c.as_os_str().into())
        .collect();
    let mut at = PathBuf::new();
    let mut hops = 0;
    while let Some(part) = pending.pop() {
        match Path::new(&part).components().next()? {
            Component::RootDir => at.clear(),
            Component::ParentDir => {
                at.pop();
            }
            Component::CurDir => {}
            Component::Normal(name) => {
                let candidate = at.join(name);
                let full = root.join(&candidate);
                match fs::read_link(&full) {
                    Ok(target) => {
                        hops += 1;
                        if hops > 40 {
                            return None;
                        }
                        pending.extend(
                            target
                                .components()
                                .rev()
                                .map(|c| PathBuf::from(c.as_os_str())),
                        );
                    }
                    Err(_) if full.symlink_metadata().is_ok() => at = candidate,
                    Err(_) => return None,
                }
            }
            Component::Prefix(_) => return None,
        }
    }
    Some(root.join(at))
}

/// Runs a few of the userland's programs under qemu-user when it is installed (only
/// messages: the guest is what counts). `nft` is left out: qemu-user has no netfilter
/// netlink sockets.
fn smoke_test(root: &Path) {
    let Ok(qemu) = which::which("qemu-aarch64") else {
        return;
    };
    for argv in [
        &["usr/bin/ip", "-V"][..],
        &["usr/bin/python3", "-c", "print('python3 ok')"],
    ] {
        let mut run = cmd::command(&qemu);
        run.arg("-L")
            .arg(root)
            .arg(root.join(argv[0]))
            .args(&argv[1..]);
        match cmd::output(&mut run) {
            Ok(out) => say(format_args!("arm64 userland: {}", out.trim())),
            Err(err) => say(format_args!("arm64 userland: {err:#}")),
        }
    }
}

/// The aarch64 binaries an arm64 guest runs, at their host paths.
#[derive(Debug, Clone)]
pub struct CrossBuild {
    /// The agent (`node-diag`).
    pub agent: PathBuf,
    /// The integration tests' package directory (their working directory and
    /// `CARGO_MANIFEST_DIR`).
    pub test_manifest_dir: PathBuf,
    /// The integration test executables.
    pub test_binaries: Vec<PathBuf>,
}

/// Cross-compiles the agent (release profile when `release`) and the integration tests
/// (test profile) for [`TARGET`], linked by Debian's `aarch64-linux-gnu-gcc`; installs
/// the target's standard library with rustup when missing.
pub fn cross_build(release: bool) -> Result<CrossBuild> {
    let target = cross::target(TARGET).context("no cross target for aarch64")?;
    cross::ensure_std(target, say)?;
    let host = cross::host_triple()?;

    let mut build = cmd::cargo();
    build.args(["build", "-p", agent::PACKAGE, "--target", TARGET]);
    if release {
        build.arg("--release");
    }
    cross::set_linker(&mut build, target, &host)?;
    say(cmd::display(&build));
    cmd::run(&mut build)
        .with_context(|| format!("cross build of the agent for {TARGET} failed"))?;
    let profile = if release { "release" } else { "debug" };
    let agent = cmd::target_dir()?
        .join(TARGET)
        .join(profile)
        .join(agent::PACKAGE);

    let mut tests = integration_tests::test_build_command();
    tests.args(["--target", TARGET]);
    cross::set_linker(&mut tests, target, &host)?;
    let (test_manifest_dir, test_binaries) = integration_tests::build_test_binaries_with(tests)
        .with_context(|| format!("cross build of the integration tests for {TARGET} failed"))?;
    Ok(CrossBuild {
        agent,
        test_manifest_dir,
        test_binaries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mmdebstrap_gets_every_package_and_the_hook() {
        let line = cmd::display(&mmdebstrap_command(Path::new("/c/arm64-userland.new")));
        assert!(
            line.contains("--variant=extract --architectures=arm64"),
            "{line}"
        );
        assert!(line.contains("--include=base-passwd,bpftool,"), "{line}");
        assert!(line.ends_with(" bookworm /c/arm64-userland.new"), "{line}");
        assert!(line.contains("--extract-hook=set -e\ncd \"$1\""), "{line}");
    }

    #[test]
    fn the_stamp_changes_with_the_packages_and_hook() {
        let key = stamp_key();
        assert!(key.contains(&PACKAGES.join(",")));
        assert!(key.contains(EXTRACT_HOOK));
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let root = std::env::temp_dir().join(format!("nd-arm64-resolve-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        fs::create_dir_all(root.join("usr/sbin")).unwrap();
        std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
        fs::write(root.join("usr/bin/kmod"), b"").unwrap();
        // Absolute, through the merged-/usr link, as Debian's kmod ships it.
        std::os::unix::fs::symlink("/bin/kmod", root.join("usr/sbin/modprobe")).unwrap();
        std::os::unix::fs::symlink("../bin/gone", root.join("usr/sbin/dangling")).unwrap();
        std::os::unix::fs::symlink("loop", root.join("usr/sbin/loop")).unwrap();

        assert_eq!(
            resolve_in(&root, Path::new("usr/sbin/modprobe")),
            Some(root.join("usr/bin/kmod"))
        );
        assert_eq!(
            resolve_in(&root, Path::new("bin/kmod")),
            Some(root.join("usr/bin/kmod"))
        );
        assert_eq!(resolve_in(&root, Path::new("usr/sbin/dangling")), None);
        assert_eq!(resolve_in(&root, Path::new("usr/sbin/loop")), None);
        fs::remove_dir_all(&root).unwrap();
    }

    /// Builds (or reuses) the userland under `target/vm/cache` and checks it; needs root,
    /// mmdebstrap and the Debian mirror: `cargo test -p xtask -- --ignored arm64`.
    #[test]
    #[ignore = "needs root, mmdebstrap and the network"]
    fn arm64_userland_builds_and_has_the_tools() {
        let cache = cmd::target_dir().unwrap().join("vm").join("cache");
        let root = userland(&cache).unwrap();
        check(&root).unwrap();
        assert!(busybox(&root).is_file());
    }

    /// Cross-builds the agent and the tests: `cargo test -p xtask -- --ignored arm64`.
    #[test]
    #[ignore = "builds the workspace for aarch64 (minutes)"]
    fn arm64_cross_build_makes_aarch64_executables() {
        let build = cross_build(false).unwrap();
        let mut files = vec![build.agent.clone()];
        files.extend(build.test_binaries.iter().cloned());
        for file in &files {
            let bytes = fs::read(file).unwrap();
            let elf = object::File::parse(&*bytes).unwrap();
            assert_eq!(
                object::Object::architecture(&elf),
                object::Architecture::Aarch64,
                "{}",
                file.display()
            );
        }
        assert!(build.test_manifest_dir.join("Cargo.toml").is_file());
        assert!(
            build
                .test_binaries
                .iter()
                .any(|b| super::super::guest::test_name(b) == "scenarios"),
            "{:?}",
            build.test_binaries
        );
        println!("{build:#?}");
    }
}
