//! The measuring instrument's own cost: an empty program (`r0 = 0; exit`) attached as a
//! raw tracepoint to each tracepoint the agent hooks, for the profile measurements only.
//!
//! With `kernel.bpf_stats_enabled=1` the kernel reads its clock before and after every
//! program run and counts the difference in `run_time_ns`. An empty program's average is
//! therefore what those clock reads and the call into a program cost on this machine,
//! under the same workload: the floor beneath every program's figure. On a nested VM it
//! is tens of nanoseconds, a large share of a per-packet budget, and it says nothing about
//! the program's own work; the report shows each program's figure as measured and net of
//! this floor. The floor is kept per tracepoint: a program is judged net of the empty
//! program that ran on its own tracepoint in the same workload, as often and as hot or
//! cold as it did.
//!
//! Where on its tracepoint a program runs matters: a tracepoint calls its programs in the
//! order they were attached, and the first one's window holds the statistics' own clock
//! reads and call path cold, which the programs after it find warm. On this project's VMs
//! an empty program attached first measures 80–200 ns more per run than one attached last
//! where a tracepoint fires rarely, 5–20 ns more where it fires hot: a cost of the
//! statistics, absent when they are off, which the agent's programs (attached first when
//! nothing else was) would otherwise carry. So a profile measurement attaches two sets: a
//! lead set before the agent starts, first on each tracepoint, which takes that cost and
//! is shown but never charged, and the floor's set after the agent, last, warm like the
//! agent's programs in between.

use std::{
    collections::BTreeMap,
    ffi::CString,
    fs,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
};

use anyhow::{Context as _, Result, bail};

use super::agent::{RunStats, fdinfo_field};
use crate::say::bench as say;

/// Every tracepoint the agent's programs hook (its TC classifier aside: the floor of a
/// classifier's statistics is the same clock reads around the same kind of call).
pub const TRACEPOINTS: &[&str] = &[
    "kfree_skb",
    "inet_sock_set_state",
    "inet_sk_error_report",
    "tcp_retransmit_skb",
    "tcp_receive_reset",
    "tcp_send_reset",
    "icmp_send",
];

/// Not `nd_`: the bench's check for other agents' programs must not count these.
const PROG_NAME: &[u8] = b"ndb_empty";

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
/// Large enough for every field written below; the kernel reads the rest as zeros.
const ATTR_SIZE: usize = 128;

/// The empty programs, attached; detached and unloaded on drop (their descriptors close).
pub struct EmptyPrograms {
    /// (tracepoint, program, raw tracepoint link) per attached tracepoint.
    attached: Vec<(&'static str, OwnedFd, OwnedFd)>,
}

impl EmptyPrograms {
    /// One empty program on each of [`TRACEPOINTS`] this kernel has; fails only when none
    /// could be attached.
    pub fn attach() -> Result<Self> {
        let mut attached = Vec::new();
        let mut errors = Vec::new();
        for tracepoint in TRACEPOINTS {
            match load().and_then(|prog| {
                let link = open_raw_tracepoint(&prog, tracepoint)?;
                Ok((*tracepoint, prog, link))
            }) {
                Ok(pair) => attached.push(pair),
                Err(err) => errors.push(format!("{tracepoint}: {err:#}")),
            }
        }
        if attached.is_empty() {
            bail!(
                "cannot attach an empty program to any of the agent's tracepoints: {}",
                errors.join("; ")
            );
        }
        for error in errors {
            say(format_args!("floor: {error} (left out)"));
        }
        Ok(Self { attached })
    }

    /// The empty programs' run statistics, by tracepoint.
    pub fn stats(&self) -> Result<BTreeMap<&'static str, RunStats>> {
        let mut by_tracepoint = BTreeMap::new();
        for (tracepoint, prog, _) in &self.attached {
            let fd = prog.as_raw_fd();
            let path = format!("/proc/self/fdinfo/{fd}");
            let info = fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
            let (Some(run_time_ns), Some(run_cnt)) = (
                fdinfo_field(&info, "run_time_ns"),
                fdinfo_field(&info, "run_cnt"),
            ) else {
                bail!("{path} lacks run_time_ns/run_cnt:\n{info}");
            };
            by_tracepoint.insert(
                *tracepoint,
                RunStats {
                    run_time_ns,
                    run_cnt,
                },
            );
        }
        Ok(by_tracepoint)
    }
}

/// `bpf(cmd, attr)`, its result as a new descriptor.
fn bpf_fd(cmd: libc::c_long, attr: &mut [u8; ATTR_SIZE], what: &str) -> Result<OwnedFd> {
    // SAFETY: `attr` is a zero-padded `union bpf_attr` prefix of ATTR_SIZE bytes, and every
    // pointer in it refers to memory the caller keeps alive for the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), ATTR_SIZE) };
    if fd < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Loads `r0 = 0; exit` as a raw tracepoint program.
fn load() -> Result<OwnedFd> {
    // BPF_MOV64_IMM(BPF_REG_0, 0), BPF_EXIT_INSN(): code, registers, offset, immediate.
    let insns: [u8; 16] = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let license = c"GPL";
    let mut attr = [0u8; ATTR_SIZE];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_RAW_TRACEPOINT.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    // prog_name, at offset 48 (after log_level, log_size, log_buf, kern_version, flags).
    attr[48..48 + PROG_NAME.len()].copy_from_slice(PROG_NAME);
    bpf_fd(BPF_PROG_LOAD, &mut attr, "BPF_PROG_LOAD")
}

/// Attaches `prog` to the raw tracepoint `name`.
fn open_raw_tracepoint(prog: &OwnedFd, name: &str) -> Result<OwnedFd> {
    let name = CString::new(name)?;
    let mut attr = [0u8; ATTR_SIZE];
    attr[0..8].copy_from_slice(&(name.as_ptr() as u64).to_ne_bytes());
    let fd = prog.as_raw_fd() as u32;
    attr[8..12].copy_from_slice(&fd.to_ne_bytes());
    bpf_fd(
        BPF_RAW_TRACEPOINT_OPEN,
        &mut attr,
        "BPF_RAW_TRACEPOINT_OPEN",
    )
}
