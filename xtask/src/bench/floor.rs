//! The measuring instrument's own cost: an empty program (`r0 = 0; exit`) attached as a
//! raw tracepoint to each tracepoint the agent hooks, and as fentry/fexit to each kernel
//! function it hooks through a BPF trampoline (its fallbacks on kernels without a
//! tracepoint or drop reasons, and ICMPv6), for the profile measurements only.
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
use crate::{cmd, say::bench as say};

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

/// The agent's programs attached through a BPF trampoline, with the hook each runs on
/// (`fentry:<function>` or `fexit:<function>`), as node-diag's `kernel/hooks.rs` attaches
/// them: before Linux 5.13 a tracing link does not say which function it is attached to,
/// so the bench cannot read it from the kernel. A tracing program missing here is judged
/// net of the whole bench's floor (and said so, see [`hook_of`]).
pub const TRAMPOLINES: &[(&str, &str)] = &[
    ("nd_err_fentry", "fentry:sock_def_error_report"),
    ("nd_icmp_fentry", "fentry:__icmp_send"),
    ("nd_icmp6_send", "fentry:icmp6_send"),
    ("nd_tc_shot4", "fexit:tcf_classify"),
    ("nd_tc_shot5", "fexit:tcf_classify"),
    ("nd_tc_shot_ingress", "fexit:tcf_classify_ingress"),
    ("nd_cgroup_shot", "fexit:__cgroup_bpf_run_filter_skb"),
];

/// The hook of the agent's trampoline program `program`, if known.
pub fn hook_of(program: &str) -> Option<&'static str> {
    TRAMPOLINES
        .iter()
        .find(|(name, _)| *name == program)
        .map(|(_, hook)| *hook)
}

/// Not `nd_`: the bench's check for other agents' programs must not count these.
const PROG_NAME: &[u8] = b"ndb_empty";

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_FENTRY: u32 = 24;
const BPF_TRACE_FEXIT: u32 = 25;
/// Large enough for every field written below; the kernel reads the rest as zeros.
const ATTR_SIZE: usize = 128;

/// The empty programs, attached; detached and unloaded on drop (their descriptors close).
pub struct EmptyPrograms {
    /// (tracepoint, program, raw tracepoint link) per attached tracepoint.
    attached: Vec<(&'static str, OwnedFd, OwnedFd)>,
}

impl EmptyPrograms {
    /// One empty program on each of [`TRACEPOINTS`] this kernel has, and on each of
    /// [`TRAMPOLINES`]' hooks it allows; fails only when no tracepoint could be attached.
    pub fn attach() -> Result<Self> {
        lift_memlock();
        let mut attached = Vec::new();
        let mut errors = Vec::new();
        for tracepoint in TRACEPOINTS {
            match load_raw_tracepoint().and_then(|prog| {
                let link = open_raw_tracepoint(&prog, Some(tracepoint))?;
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
        let mut hooks: Vec<&'static str> = TRAMPOLINES.iter().map(|(_, hook)| *hook).collect();
        hooks.sort_unstable();
        hooks.dedup();
        for hook in hooks {
            match attach_trampoline(hook) {
                Ok((prog, link)) => attached.push((hook, prog, link)),
                Err(err) => errors.push(format!("{hook}: {err:#}")),
            }
        }
        // The same hooks fail the same way at every measurement: said once.
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            for error in errors {
                say(format_args!("floor: {error} (left out)"));
            }
        });
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

/// Before Linux 5.11 a program's memory counts against `RLIMIT_MEMLOCK`, 64 KiB where
/// no systemd raised it (a guest's init): lifted, as the agent lifts its own. A failure
/// shows as the load's EPERM.
fn lift_memlock() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: `unlimited` is a valid rlimit that outlives the call.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
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
fn load_raw_tracepoint() -> Result<OwnedFd> {
    load(BPF_PROG_TYPE_RAW_TRACEPOINT, 0, 0)
}

/// An empty fentry or fexit program on `hook`'s function (`fentry:<function>`), attached.
fn attach_trampoline(hook: &str) -> Result<(OwnedFd, OwnedFd)> {
    let (attach_type, function) = match hook.split_once(':') {
        Some(("fentry", function)) => (BPF_TRACE_FENTRY, function),
        Some(("fexit", function)) => (BPF_TRACE_FEXIT, function),
        _ => bail!("`{hook}` is neither fentry:<function> nor fexit:<function>"),
    };
    let btf_id = vmlinux_func_id(function)?;
    let prog = load(BPF_PROG_TYPE_TRACING, attach_type, btf_id)?;
    let link = open_raw_tracepoint(&prog, None)?;
    Ok((prog, link))
}

/// Loads `r0 = 0; exit` as a program of `prog_type` (for a tracing program, attached at
/// `attach_type` to the kernel function whose BTF id is `attach_btf_id`).
fn load(prog_type: u32, attach_type: u32, attach_btf_id: u32) -> Result<OwnedFd> {
    // BPF_MOV64_IMM(BPF_REG_0, 0), BPF_EXIT_INSN(): code, registers, offset, immediate.
    let insns: [u8; 16] = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let license = c"GPL";
    let mut attr = [0u8; ATTR_SIZE];
    attr[0..4].copy_from_slice(&prog_type.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    // prog_name, at offset 48 (after log_level, log_size, log_buf, kern_version, flags).
    attr[48..48 + PROG_NAME.len()].copy_from_slice(PROG_NAME);
    // expected_attach_type at 68 (after prog_ifindex); attach_btf_id at 108 (after
    // prog_btf_fd and the func_info and line_info fields).
    attr[68..72].copy_from_slice(&attach_type.to_ne_bytes());
    attr[108..112].copy_from_slice(&attach_btf_id.to_ne_bytes());
    bpf_fd(BPF_PROG_LOAD, &mut attr, "BPF_PROG_LOAD")
}

/// The BTF id of the kernel function `name`, from `bpftool btf dump` of the kernel's BTF
/// (its raw format: `[ID] FUNC 'name' type_id=... linkage=...`).
fn vmlinux_func_id(name: &str) -> Result<u32> {
    static FUNCS: std::sync::OnceLock<std::result::Result<BTreeMap<String, u32>, String>> =
        std::sync::OnceLock::new();
    let funcs = FUNCS.get_or_init(|| {
        let wanted: Vec<&str> = TRAMPOLINES
            .iter()
            .filter_map(|(_, hook)| hook.split_once(':').map(|(_, f)| f))
            .collect();
        cmd::output(cmd::command("bpftool").args([
            "btf",
            "dump",
            "file",
            "/sys/kernel/btf/vmlinux",
        ]))
        .map(|dump| func_ids(&dump, &wanted))
        .map_err(|err| format!("{err:#}"))
    });
    match funcs {
        Ok(funcs) => funcs
            .get(name)
            .copied()
            .with_context(|| format!("the kernel's BTF has no function {name}")),
        Err(err) => bail!("cannot read the kernel's BTF: {err}"),
    }
}

/// The ids of the `wanted` functions in a raw `bpftool btf dump`.
fn func_ids(dump: &str, wanted: &[&str]) -> BTreeMap<String, u32> {
    dump.lines()
        .filter_map(|line| {
            let (id, rest) = line.strip_prefix('[')?.split_once("] FUNC '")?;
            let (name, _) = rest.split_once('\'')?;
            wanted
                .contains(&name)
                .then(|| Some((name.to_owned(), id.parse().ok()?)))?
        })
        .collect()
}

/// Attaches `prog` to the raw tracepoint `name`, or a tracing program (`None`) to the
/// function it was loaded for.
fn open_raw_tracepoint(prog: &OwnedFd, name: Option<&str>) -> Result<OwnedFd> {
    let name = name.map(CString::new).transpose()?;
    let mut attr = [0u8; ATTR_SIZE];
    let name_ptr = name.as_ref().map_or(0, |n| n.as_ptr() as u64);
    attr[0..8].copy_from_slice(&name_ptr.to_ne_bytes());
    let fd = prog.as_raw_fd() as u32;
    attr[8..12].copy_from_slice(&fd.to_ne_bytes());
    bpf_fd(
        BPF_RAW_TRACEPOINT_OPEN,
        &mut attr,
        "BPF_RAW_TRACEPOINT_OPEN",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_functions_in_a_raw_btf_dump() {
        let dump = "[1] INT 'int' size=4 bits_offset=0 nr_bits=32 encoding=SIGNED\n\
                    [2] FUNC_PROTO '(anon)' ret_type_id=1 vlen=1\n\
                    \t'skb' type_id=3\n\
                    [4050] FUNC 'tcf_classify' type_id=2 linkage=static\n\
                    [4051] FUNC 'tcf_classify_ingress' type_id=2 linkage=static\n\
                    [4052] FUNC 'other' type_id=2 linkage=static\n";
        let ids = func_ids(dump, &["tcf_classify", "tcf_classify_ingress", "absent"]);
        assert_eq!(
            ids.into_iter().collect::<Vec<_>>(),
            [
                ("tcf_classify".to_owned(), 4050),
                ("tcf_classify_ingress".to_owned(), 4051)
            ]
        );
    }

    #[test]
    fn every_trampoline_hook_names_its_kind_and_function() {
        for (program, hook) in TRAMPOLINES {
            assert!(program.starts_with("nd_"), "{program}");
            let (kind, function) = hook.split_once(':').expect(hook);
            assert!(matches!(kind, "fentry" | "fexit"), "{hook}");
            assert!(!function.is_empty(), "{hook}");
            assert_eq!(hook_of(program), Some(*hook));
        }
        assert_eq!(hook_of("nd_kfree_skb"), None);
    }
}
