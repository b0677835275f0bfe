//! Booting a guest under qemu: the command line per architecture, streaming the serial
//! console (prefixed, and saved to a log), a deadline, and the KVM probe.
//!
//! `/dev/kvm` can exist and accept KVM_CREATE_VM while its vCPUs never run (nested
//! virtualisation without support): the guest then hangs at boot. So KVM is used only
//! after a probe guest booted with it within seconds; otherwise TCG.

use std::{
    fs::File,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::arch::Arch;
use crate::cmd;

/// How qemu runs the guest's CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn name(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }
}

/// A host directory the guest mounts over 9p.
#[derive(Debug, Clone)]
pub struct Share {
    pub tag: &'static str,
    pub path: PathBuf,
    pub readonly: bool,
}

/// One guest to boot.
pub struct Machine<'a> {
    pub arch: Arch,
    pub accel: Accel,
    pub image: &'a Path,
    pub initramfs: &'a Path,
    pub shares: &'a [Share],
    pub memory_mib: u32,
    pub cpus: u32,
    /// Scheduling niceness of the qemu process (0: as the caller's).
    pub niceness: i32,
}

/// Set once the run this guest belongs to has failed elsewhere: every guest still
/// running is stopped, so a failure ends the run instead of waiting for the guests.
static CANCELLED: AtomicBool = AtomicBool::new(false);

/// Stops every guest booted from now on or still running (within 200 ms).
pub fn cancel() {
    CANCELLED.store(true, Ordering::Relaxed);
}

/// Whether [`cancel`] was called.
pub fn cancelled() -> bool {
    CANCELLED.load(Ordering::Relaxed)
}

/// How a boot ended.
#[derive(Debug)]
pub struct Boot {
    /// qemu exited by itself (the guest powered off, or it crashed) before the deadline.
    pub exited: bool,
    /// The console lines that carried one of the watched markers.
    pub markers: Vec<String>,
    pub elapsed: Duration,
}

/// The qemu binary for `arch`, and the Debian package that has it.
pub fn binary(arch: Arch) -> (&'static str, &'static str) {
    match arch {
        Arch::X86_64 => ("qemu-system-x86_64", "qemu-system-x86"),
        Arch::Aarch64 => ("qemu-system-aarch64", "qemu-system-arm"),
    }
}

impl Machine<'_> {
    fn command(&self) -> std::process::Command {
        let (qemu, _) = binary(self.arch);
        let mut q = cmd::command(qemu);
        if self.arch == Arch::Aarch64 {
            q.args(["-machine", "virt"]);
        }
        match self.accel {
            Accel::Kvm => q.args(["-accel", "kvm", "-cpu", "host"]),
            Accel::Tcg => q.args(["-accel", "tcg,thread=multi", "-cpu", self.arch.tcg_cpu()]),
        };
        if self.niceness > 0 {
            cmd::lower_priority(&mut q, self.niceness);
        }
        q.args(["-smp", &self.cpus.to_string()])
            .args(["-m", &format!("{}M", self.memory_mib)])
            .args(["-nodefaults", "-no-reboot", "-display", "none"])
            .args(["-serial", "stdio"])
            .arg("-kernel")
            .arg(self.image)
            .arg("-initrd")
            .arg(self.initramfs)
            .arg("-append")
            // Under TCG the kernel picks the HPET (no invariant TSC to trust), whose every
            // read (each packet's timestamp, each timer) traps to qemu's device model; the
            // TSC is a plain instruction. `mitigations=off`: the speculative-execution
            // defences (buffer clearing on every return to user space, retpolines) guard
            // against nothing in an emulated guest and cost emulated instructions. Together
            // about 14 % less CPU for the same tests.
            .arg(format!(
                "console={} rdinit=/init panic=-1 oops=panic loglevel=4 clocksource=tsc tsc=reliable mitigations=off",
                self.arch.console()
            ));
        for share in self.shares {
            q.arg("-virtfs").arg(format!(
                "local,path={},mount_tag={},security_model=none,multidevs=remap{}",
                share.path.display(),
                share.tag,
                if share.readonly { ",readonly=on" } else { "" }
            ));
        }
        q
    }

    /// Boots the guest, echoing its console as `prefix line` (unless `quiet`) and into
    /// `log` (each line after the seconds since the boot); kills it at `deadline`.
    /// `watch` lists substrings whose lines are returned.
    pub fn boot(
        &self,
        prefix: &str,
        log: &Path,
        timeout: Duration,
        quiet: bool,
        watch: &[&str],
    ) -> Result<Boot> {
        let mut q = self.command();
        q.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let line = cmd::display(&q);
        if !quiet {
            println!("{prefix} {line}");
        }
        let started = Instant::now();
        let mut child = q
            .spawn()
            .with_context(|| format!("failed to spawn `{line}`"))?;
        let mut log_file =
            File::create(log).with_context(|| format!("failed to create {}", log.display()))?;
        let (tx, rx) = mpsc::channel::<String>();
        let readers = [
            spawn_reader(child.stdout.take(), tx.clone()),
            spawn_reader(child.stderr.take(), tx),
        ];
        let mut markers = Vec::new();
        let deadline = started + timeout;
        let exited = loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(text) => {
                    // Seconds since the boot, so a slow test shows in the log.
                    let at = started.elapsed().as_secs_f64();
                    let _ = writeln!(log_file, "{at:7.1} {text}");
                    if !quiet {
                        println!("{prefix} {text}");
                    }
                    if watch.iter().any(|w| text.contains(w)) {
                        markers.push(text);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break wait(&mut child)?,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if Instant::now() >= deadline || cancelled() {
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
        };
        for reader in readers {
            let _ = reader.join();
        }
        Ok(Boot {
            exited,
            markers,
            elapsed: started.elapsed(),
        })
    }
}

fn wait(child: &mut Child) -> Result<bool> {
    child.wait().context("failed to wait for qemu")?;
    Ok(true)
}

fn spawn_reader(
    stream: Option<impl std::io::Read + Send + 'static>,
    tx: mpsc::Sender<String>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let Some(stream) = stream else { return };
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&buf);
                    let text = text.trim_end_matches(['\n', '\r']).to_owned();
                    if tx.send(text).is_err() {
                        return;
                    }
                }
            }
        }
    })
}

/// Marker the probe guest prints once it reached user space.
const PROBE_OK: &str = "ND-VM-PROBE-OK";

/// KVM if `/dev/kvm` is usable and a probe guest really runs with it, else TCG.
/// `probe_initramfs` must print [`PROBE_OK`] and power off.
pub fn pick_accel(arch: Arch, image: &Path, probe_initramfs: &Path, log: &Path) -> Result<Accel> {
    if !arch.is_host() {
        return Ok(Accel::Tcg);
    }
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return Ok(Accel::Tcg);
    }
    let machine = Machine {
        arch,
        accel: Accel::Kvm,
        image,
        initramfs: probe_initramfs,
        shares: &[],
        memory_mib: 512,
        cpus: 1,
        niceness: 0,
    };
    let boot = machine.boot("", log, Duration::from_secs(20), true, &[PROBE_OK])?;
    Ok(if boot.markers.is_empty() {
        Accel::Tcg
    } else {
        Accel::Kvm
    })
}

/// The probe guest's init script.
pub fn probe_init() -> String {
    format!(
        "#!/bin/busybox sh\n/bin/busybox echo {PROBE_OK}\n/bin/busybox mount -t proc proc /proc\n/bin/busybox echo o > /proc/sysrq-trigger\n/bin/busybox sleep 5\n"
    )
}

/// Fails with what to install when qemu for `arch` is missing.
pub fn require(arch: Arch) -> Result<()> {
    let (qemu, package) = binary(arch);
    if which::which(qemu).is_err() {
        bail!(
            "{qemu} not found: apt-get install {package} (`cargo xtask prereqs --vm` installs it)"
        );
    }
    Ok(())
}
