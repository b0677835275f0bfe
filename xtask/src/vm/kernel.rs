//! Debian kernel packages: which one a matrix entry means, downloading and unpacking it
//! into the cache, and the modules an initramfs must carry to mount the guest's root.
//!
//! The newest package of a series is picked from `apt-cache search` (Debian keeps
//! several ABIs of 6.1 and 6.12 in bookworm and its security updates), fetched with
//! `apt-get download` and unpacked with `dpkg-deb -x`; `depmod -b` then indexes its
//! modules so that `modprobe` works inside the guest.
//!
//! Series of another Debian release (5.10 is bullseye's) are looked up in a private apt
//! state under the cache (its own sources list, lists and archive cache), so the
//! machine's own package lists stay untouched.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

use crate::{cmd, say::integration as say};

use super::arch::Arch;

/// A kernel series of the matrix, e.g. Debian's 6.1 LTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    /// How users name it on the command line: `6.1`, `6.12`.
    pub name: &'static str,
    /// Package name prefix before the ABI part.
    prefix: &'static str,
    /// Package name suffix between the ABI and the Debian architecture.
    infix: &'static str,
    /// The Debian release whose lists carry it, when not the machine's own.
    release: Option<&'static str>,
    /// The tests `--subset` runs in its x86_64 guest (see [`super::subset`]).
    pub subset: &'static [&'static str],
}

/// The kernels nodes really run: Debian 12's 6.1 and the 6.12 of Debian 13 (shipped to
/// Debian 12 as `+deb12`), then Debian 11's 5.10 (the generation of Amazon Linux 2 and
/// COS LTS), which comes from bullseye's lists. The first entry is the arm64 kernel of
/// `--kernel all`.
pub const SERIES: &[Series] = &[
    Series {
        name: "6.1",
        prefix: "linux-image-6.1.0-",
        infix: "-",
        release: None,
        subset: super::subset::KERNEL_SUBSET,
    },
    Series {
        name: "6.12",
        prefix: "linux-image-6.12.",
        infix: "+deb12-",
        release: None,
        subset: super::subset::KERNEL_SUBSET,
    },
    Series {
        name: "5.10",
        prefix: "linux-image-5.10.0-",
        infix: "-",
        release: Some("bullseye"),
        subset: super::subset::FALLBACK_SUBSET,
    },
];

/// `apt-get`/`apt-cache` options that point at a series' package lists: none for the
/// machine's own release, else a private state under `cache` (created and updated once).
fn apt_options(series: &Series, arch: Arch, cache: &Path) -> Result<Vec<String>> {
    let Some(release) = series.release else {
        return Ok(Vec::new());
    };
    let dir = cache.join(format!("apt-{release}"));
    let lists = dir.join("lists");
    let sources = dir.join("sources.list");
    let options = vec![
        format!("-o=Dir::Etc::SourceList={}", sources.display()),
        "-o=Dir::Etc::SourceParts=/dev/null".to_owned(),
        format!("-o=Dir::State::Lists={}", lists.display()),
        format!("-o=Dir::Cache={}", dir.join("cache").display()),
        format!("-o=APT::Architectures={}", arch.debian()),
    ];
    let stamp = dir.join(format!(".updated-{}", arch.debian()));
    if !stamp.exists() {
        fs::create_dir_all(lists.join("partial"))?;
        fs::create_dir_all(dir.join("cache").join("archives").join("partial"))?;
        fs::write(&sources, sources_list(release))?;
        say(format_args!("apt-get update of {release}'s lists"));
        cmd::output(
            cmd::command("apt-get")
                .arg("update")
                .arg("-q")
                .args(&options),
        )
        .with_context(|| format!("failed to fetch Debian {release}'s package lists"))?;
        fs::write(&stamp, b"")?;
    }
    Ok(options)
}

/// The sources of a Debian release and its security updates (where kernel ABIs move).
fn sources_list(release: &str) -> String {
    let key = "signed-by=/usr/share/keyrings/debian-archive-keyring.gpg";
    format!(
        "deb [{key}] http://deb.debian.org/debian {release} main\n\
         deb [{key}] http://deb.debian.org/debian-security {release}-security main\n"
    )
}

/// Looks a series up by its command-line name.
pub fn series(name: &str) -> Option<Series> {
    SERIES.iter().copied().find(|s| s.name == name)
}

/// The series' command-line names, for an error about an unknown one.
pub fn names() -> String {
    SERIES.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

impl Series {
    /// The package's ABI number if `package` belongs to this series on `arch` (and is
    /// not a cloud, rt or dbg flavour).
    fn abi(&self, package: &str, arch: Arch) -> Option<u32> {
        let rest = package.strip_prefix(self.prefix)?;
        let (abi, tail) = rest.split_once(self.infix)?;
        (tail == arch.debian()).then_some(())?;
        abi.parse().ok()
    }

    /// The newest package of this series for `arch`, from the apt package lists.
    pub fn newest_package(&self, arch: Arch, cache: &Path) -> Result<String> {
        let pattern = format!("^{}", self.prefix.replace('.', "\\."));
        let options = apt_options(self, arch, cache)?;
        let listing = cmd::output(cmd::command("apt-cache").args(&options).args([
            "search",
            "--names-only",
            &pattern,
        ]))
        .context("apt-cache is needed to find Debian's kernel packages")?;
        newest(self, arch, &listing).with_context(|| {
            format!(
                "no {} kernel package for {} in the apt lists: run `apt-get update`{}",
                self.name,
                arch.debian(),
                if arch.is_host() {
                    ""
                } else {
                    " after `dpkg --add-architecture arm64`"
                }
            )
        })
    }
}

/// The newest package of `series` in an `apt-cache search` listing.
fn newest(series: &Series, arch: Arch, listing: &str) -> Option<String> {
    listing
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|package| Some((series.abi(package, arch)?, package)))
        .max_by_key(|(abi, _)| *abi)
        .map(|(_, package)| package.to_owned())
}

/// An unpacked kernel package.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// `uname -r` of the kernel.
    pub release: String,
    /// The bootable image.
    pub image: PathBuf,
    /// `lib/modules` of the package (holds `<release>/`), indexed by depmod.
    pub modules: PathBuf,
}

/// Downloads and unpacks `package` of `series` under `cache` unless already there.
pub fn fetch(series: &Series, package: &str, arch: Arch, cache: &Path) -> Result<Kernel> {
    let dir = cache.join(package);
    let stamp = dir.join(".unpacked");
    if !stamp.exists() {
        let download = cache.join("download");
        fs::create_dir_all(&download)?;
        let spec = if arch.is_host() {
            package.to_owned()
        } else {
            format!("{package}:{}", arch.debian())
        };
        say(format_args!("downloading {spec}"));
        let options = apt_options(series, arch, cache)?;
        cmd::output(
            cmd::command("apt-get")
                .args(&options)
                .args(["download", "-q", &spec])
                .current_dir(&download),
        )
        .with_context(|| format!("failed to download {spec}"))?;
        let deb = find_deb(&download, package)?;
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        cmd::run(cmd::command("dpkg-deb").arg("-x").arg(&deb).arg(&dir))?;
        fs::remove_file(&deb)?;
        let release = release_of(&dir)?;
        // Index the modules so `modprobe` inside the guest finds them.
        cmd::output(cmd::command("depmod").arg("-b").arg(&dir).arg(&release))?;
        fs::write(&stamp, b"")?;
    }
    let release = release_of(&dir)?;
    let image = dir.join("boot").join(format!("vmlinuz-{release}"));
    if !image.is_file() {
        bail!("{} has no kernel image {}", package, image.display());
    }
    Ok(Kernel {
        release,
        image,
        modules: dir.join("lib").join("modules"),
    })
}

fn find_deb(dir: &Path, package: &str) -> Result<PathBuf> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with(&format!("{package}_")) && name.ends_with(".deb") {
            return Ok(path);
        }
    }
    bail!(
        "apt-get download left no {package}_*.deb in {}",
        dir.display()
    )
}

/// The one `lib/modules/<release>` directory of an unpacked package.
fn release_of(dir: &Path) -> Result<String> {
    let modules = dir.join("lib").join("modules");
    let mut releases = fs::read_dir(&modules)
        .with_context(|| format!("{} is not an unpacked kernel package", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned());
    match (releases.next(), releases.next()) {
        (Some(release), None) => Ok(release),
        _ => bail!("expected one kernel release in {}", modules.display()),
    }
}

/// A module file to load in the initramfs, in dependency order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleFile {
    /// The module's name (`9pnet_virtio`).
    pub name: String,
    /// Its file in the unpacked package (`.ko`, `.ko.xz` or `.ko.zst`).
    pub path: PathBuf,
}

impl Kernel {
    /// The files of `wanted` modules and everything they depend on, dependencies first;
    /// modules built into the kernel are left out.
    pub fn modules_for(&self, wanted: &[&str]) -> Result<Vec<ModuleFile>> {
        let base = self.modules.join(&self.release);
        let dep = fs::read_to_string(base.join("modules.dep"))
            .context("modules.dep is missing: depmod did not run")?;
        let builtin = fs::read_to_string(base.join("modules.builtin")).unwrap_or_default();
        let order = resolve(&dep, &builtin, wanted)?;
        Ok(order
            .into_iter()
            .map(|rel| ModuleFile {
                name: module_name(&rel),
                path: base.join(rel),
            })
            .collect())
    }
}

/// `kernel/fs/9p/9p.ko.xz` → `9p`.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// Orders the module files `wanted` needs (relative paths from modules.dep),
/// dependencies before dependants, each once.
fn resolve(dep: &str, builtin: &str, wanted: &[&str]) -> Result<Vec<String>> {
    let mut deps: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for line in dep.lines() {
        let Some((module, needs)) = line.split_once(':') else {
            continue;
        };
        deps.insert(
            module_name(module),
            (
                module.to_owned(),
                needs.split_whitespace().map(module_name).collect(),
            ),
        );
    }
    let builtin: BTreeSet<String> = builtin.lines().map(module_name).collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    fn visit(
        name: &str,
        deps: &BTreeMap<String, (String, Vec<String>)>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) {
        if !seen.insert(name.to_owned()) {
            return;
        }
        if let Some((path, needs)) = deps.get(name) {
            for need in needs {
                visit(need, deps, seen, order);
            }
            order.push(path.clone());
        }
    }
    for name in wanted {
        let name = name.replace('-', "_");
        if builtin.contains(&name) {
            continue;
        }
        if !deps.contains_key(&name) {
            bail!("module {name} is neither built in nor in modules.dep");
        }
        visit(&name, &deps, &mut seen, &mut order);
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "\
linux-image-6.1.0-47-amd64 - Linux 6.1 for 64-bit PCs (signed)
linux-image-6.1.0-47-cloud-amd64 - Linux 6.1 for x86-64 cloud (signed)
linux-image-6.1.0-57-amd64 - Linux 6.1 for 64-bit PCs (signed)
linux-image-6.1.0-57-rt-amd64 - Linux 6.1 for 64-bit PCs, PREEMPT_RT (signed)
linux-image-6.1.0-9-amd64 - Linux 6.1 for 64-bit PCs (signed)
linux-image-6.1.0-57-arm64 - Linux 6.1 for 64-bit ARMv8 machines (signed)
linux-image-6.12.117+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.12.99+deb12-amd64 - Linux 6.12 for 64-bit PCs (signed)
linux-image-6.12.117+deb12-cloud-amd64 - Linux 6.12 for x86-64 cloud (signed)
linux-image-6.12-amd64 - Linux for 64-bit PCs (meta-package)
linux-image-5.10.0-46-amd64 - Linux 5.10 for 64-bit PCs (signed)
linux-image-5.10.0-46-cloud-amd64 - Linux 5.10 for x86-64 cloud (signed)
linux-image-5.10.0-9-amd64 - Linux 5.10 for 64-bit PCs (signed)
";

    #[test]
    fn newest_picks_the_highest_abi_of_the_plain_flavour() {
        let s61 = series("6.1").unwrap();
        let s612 = series("6.12").unwrap();
        assert_eq!(
            newest(&s61, Arch::X86_64, LISTING).as_deref(),
            Some("linux-image-6.1.0-57-amd64")
        );
        assert_eq!(
            newest(&s61, Arch::Aarch64, LISTING).as_deref(),
            Some("linux-image-6.1.0-57-arm64")
        );
        assert_eq!(
            newest(&s612, Arch::X86_64, LISTING).as_deref(),
            Some("linux-image-6.12.117+deb12-amd64")
        );
        assert_eq!(newest(&s612, Arch::Aarch64, LISTING), None);
        assert_eq!(
            newest(&series("5.10").unwrap(), Arch::X86_64, LISTING).as_deref(),
            Some("linux-image-5.10.0-46-amd64")
        );
    }

    #[test]
    fn modules_come_dependencies_first_and_skip_builtins() {
        let dep = "\
kernel/fs/9p/9p.ko.xz: kernel/fs/netfs/netfs.ko.xz kernel/net/9p/9pnet.ko.xz
kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/drivers/virtio/virtio_ring.ko.xz
kernel/net/9p/9pnet.ko.xz:
kernel/fs/netfs/netfs.ko.xz:
kernel/drivers/virtio/virtio_ring.ko.xz:
kernel/fs/overlayfs/overlay.ko.xz:
";
        let builtin = "kernel/drivers/virtio/virtio_pci.ko\n";
        let order = resolve(
            dep,
            builtin,
            &["virtio_pci", "9pnet_virtio", "9p", "overlay"],
        )
        .unwrap();
        let names: Vec<_> = order.iter().map(|p| module_name(p)).collect();
        assert_eq!(
            names,
            [
                "9pnet",
                "virtio_ring",
                "9pnet_virtio",
                "netfs",
                "9p",
                "overlay"
            ]
        );
        assert!(resolve(dep, builtin, &["nope"]).is_err());
    }
}
