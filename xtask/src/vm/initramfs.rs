//! The guest's initramfs: a static busybox, the modules that mount the root, the init
//! script and the guest script, packed as a `newc` cpio archive (written here, so no
//! `cpio` is needed on the host).
//!
//! The init script loads the modules, mounts the root shared by the host over 9p
//! (read-only) under a tmpfs overlay, mounts the kernel's modules at `/lib/modules` and
//! the writable results share, then `chroot`s into it and runs the guest script there.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use super::kernel::ModuleFile;
use crate::cmd;

/// 9p mount tags the host shares and the init script mounts.
pub const TAG_ROOT: &str = "root";
pub const TAG_MODULES: &str = "modules";
pub const TAG_OUT: &str = "out";
pub const TAG_WORKSPACE: &str = "workspace";

/// Where the guest script finds the results share (inside the new root).
pub const GUEST_OUT: &str = "/run/nd-vm";

/// What goes into the archive.
pub struct Contents<'a> {
    /// A statically linked busybox for the guest's architecture.
    pub busybox: &'a Path,
    /// Modules to load before mounting the root, dependencies first.
    pub modules: &'a [ModuleFile],
    /// The workspace path to mount at the same path in the new root (an arm64 guest
    /// whose root is not the host's), if any.
    pub workspace: Option<&'a Path>,
    /// The script the guest runs inside its root.
    pub guest_script: &'a str,
}

/// Writes the initramfs for `contents` to `out`.
pub fn write(contents: &Contents<'_>, scratch: &Path, out: &Path) -> Result<()> {
    let mut archive = Newc::default();
    for dir in [
        "bin", "dev", "proc", "sys", "lib", "modules", "newroot", "rw", "root",
    ] {
        archive.dir(dir);
    }
    archive.file(
        "bin/busybox",
        0o755,
        &fs::read(contents.busybox)
            .with_context(|| format!("failed to read {}", contents.busybox.display()))?,
    );
    fs::create_dir_all(scratch)?;
    let mut load = String::new();
    for module in contents.modules {
        let file = format!("modules/{}.ko", module.name);
        archive.file(&file, 0o644, &plain_module(&module.path, scratch)?);
        load.push_str(&format!("insmod /{file}\n"));
    }
    archive.file(
        "init",
        0o755,
        init_script(&load, contents.workspace).as_bytes(),
    );
    archive.file("guest.sh", 0o755, contents.guest_script.as_bytes());
    fs::write(out, archive.finish()).with_context(|| format!("failed to write {}", out.display()))
}

/// Writes a minimal initramfs whose init is `init` (the KVM probe).
pub fn write_probe(busybox: &Path, init: &str, out: &Path) -> Result<()> {
    let mut archive = Newc::default();
    for dir in ["bin", "dev", "proc"] {
        archive.dir(dir);
    }
    archive.file(
        "bin/busybox",
        0o755,
        &fs::read(busybox).with_context(|| format!("failed to read {}", busybox.display()))?,
    );
    archive.file("init", 0o755, init.as_bytes());
    fs::write(out, archive.finish()).with_context(|| format!("failed to write {}", out.display()))
}

/// The module file uncompressed (busybox's insmod takes plain ELF only).
fn plain_module(path: &Path, scratch: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        "xz"
    } else if name.ends_with(".zst") {
        "zstd"
    } else {
        return fs::read(path).with_context(|| format!("failed to read {}", path.display()));
    };
    let plain: PathBuf = scratch.join("module.ko");
    let out = fs::File::create(&plain)?;
    let mut decompress = cmd::command(tool);
    decompress.args(["-dc"]).arg(path).stdout(out);
    cmd::run(&mut decompress)?;
    Ok(fs::read(&plain)?)
}

/// The guest's PID 1 (busybox sh).
fn init_script(load_modules: &str, workspace: Option<&Path>) -> String {
    let p9 = "trans=virtio,version=9p2000.L,msize=512000";
    let workspace = workspace
        .map(|dir| {
            let dir = dir.display();
            format!(
                "mkdir -p /newroot{dir}\nmount -t 9p -o {p9},ro,cache=loose {TAG_WORKSPACE} /newroot{dir} || fail 'cannot mount the workspace'\n"
            )
        })
        .unwrap_or_default();
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
fail() {{ echo "ND-VM-INIT-FAILED: $*"; echo o > /proc/sysrq-trigger; sleep 10; }}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "ND-VM-INIT: kernel $(uname -r) up"
{load_modules}
mkdir -p /lower
mount -t 9p -o {p9},ro,cache=loose {TAG_ROOT} /lower || fail 'cannot mount the root over 9p'
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot || fail 'cannot mount the overlay'
mkdir -p /newroot/lib/modules /newroot/run
mount -t tmpfs -o mode=0755 tmpfs /newroot/run
mount -t 9p -o {p9},ro {TAG_MODULES} /newroot/lib/modules || fail 'cannot mount the modules'
mkdir -p /newroot{GUEST_OUT}
mount -t 9p -o {p9} {TAG_OUT} /newroot{GUEST_OUT} || fail 'cannot mount the results share'
{workspace}cp /guest.sh /newroot{GUEST_OUT}/guest.sh
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
exec chroot /newroot /bin/sh {GUEST_OUT}/guest.sh
"#
    )
}

/// A `newc` (SVR4, no CRC) cpio archive, the format the kernel unpacks.
#[derive(Default)]
struct Newc {
    data: Vec<u8>,
    ino: u32,
}

impl Newc {
    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, data);
    }

    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let nlink = if mode & 0o040_000 != 0 { 2 } else { 1 };
        let namesize = name.len() + 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            nlink,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            namesize,
            0
        );
        self.data.extend_from_slice(header.as_bytes());
        self.data.extend_from_slice(name.as_bytes());
        self.data.push(0);
        self.pad();
        self.data.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.data.len().is_multiple_of(4) {
            self.data.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        // The kernel reads whole blocks; pad to 512 as cpio does.
        while !self.data.len().is_multiple_of(512) {
            self.data.push(0);
        }
        self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_entries_are_aligned_and_end_with_the_trailer() {
        let mut a = Newc::default();
        a.dir("bin");
        a.file("init", 0o755, b"#!/bin/sh\n");
        let data = a.finish();
        assert_eq!(data.len() % 512, 0);
        assert!(data.starts_with(b"070701"));
        // Header (110 bytes) + "bin\0" padded to 4: the next entry starts aligned.
        assert_eq!(&data[116..122], b"070701");
        let text = String::from_utf8_lossy(&data);
        assert!(text.contains("init\0"));
        assert!(text.contains("TRAILER!!!"));
        assert!(text.contains("#!/bin/sh\n"));
    }

    #[test]
    fn init_mounts_the_workspace_only_when_asked() {
        assert!(!init_script("", None).contains(TAG_WORKSPACE));
        let with = init_script("", Some(Path::new("/work/main")));
        assert!(with.contains("/newroot/work/main"), "{with}");
    }
}
