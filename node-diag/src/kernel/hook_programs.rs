//! The eBPF programs attached at the hook a packet was dropped at: what names the
//! program behind a `TC_INGRESS` or `TC_EGRESS` drop (an eBPF dataplane's policy,
//! `cil_from_container`, `calico_tc_...`, or any `tc filter ... bpf` returning
//! `TC_ACT_SHOT`) or a `BPF_CGROUP_EGRESS` one (a `cgroup_skb` egress program).
//!
//! Both ways a program sits at a device's TC hook are read, in the device's namespace:
//! TCX links (`BPF_PROG_QUERY` on the device, 6.6+) and `cls_bpf` filters under its
//! `clsact` qdisc (rtnetlink dump, their program ids). A cgroup program applies to the
//! sockets of its cgroup and those below: the sending socket's cgroup comes from
//! sock_diag (its cgroup v2 id, the directory's inode), and `BPF_PROG_QUERY` with
//! `BPF_F_QUERY_EFFECTIVE` on that directory lists every egress program that runs for
//! it; once the socket is gone, every cgroup's own egress programs are listed, and one
//! alone in the tree is named. The agent's own programs (`nd_` names) never drop and are left out.

use std::{
    ffi::CStr,
    fs::File,
    net::SocketAddr,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use aya::programs::{ProgramInfo, SchedClassifier, TcAttachType, loaded_programs};
use serde::Serialize;

use crate::host_network::{
    NetnsFile, in_netns,
    sock_diag::tcp_progress,
    tc::{ClsactSide, clsact_filters},
};

const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_CGROUP_INET_EGRESS: u32 = 1;
const BPF_F_QUERY_EFFECTIVE: u32 = 1;
/// Deeper cgroup trees are not searched for a socket's cgroup.
const MAX_CGROUP_DEPTH: usize = 12;

/// One program attached at the hook of a drop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct HookProgram {
    pub(crate) id: u32,
    pub(crate) name: String,
    /// `tc_ingress`, `tc_egress` or `cgroup_egress`.
    pub(crate) hook: &'static str,
    /// The device, by name in its namespace (TC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) interface: Option<String>,
    /// The sending socket's cgroup, under the cgroup v2 mount (cgroup programs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cgroup: Option<String>,
    /// `tcx`, `cls_bpf` or `cgroup`.
    pub(crate) attach: &'static str,
}

/// The programs at `ifindex`'s TC ingress (or egress) in the namespace `netns` pins,
/// but the agent's own. Empty when nothing can be read.
pub(crate) fn tc_programs(netns: &NetnsFile, ifindex: u32, ingress: bool) -> Vec<HookProgram> {
    in_netns(netns, || read(ifindex, ingress)).unwrap_or_default()
}

fn read(ifindex: u32, ingress: bool) -> Vec<HookProgram> {
    let Some(interface) = if_name(ifindex) else {
        return Vec::new();
    };
    let (hook, attach_type, side) = if ingress {
        ("tc_ingress", TcAttachType::Ingress, ClsactSide::Ingress)
    } else {
        ("tc_egress", TcAttachType::Egress, ClsactSide::Egress)
    };
    let program = |info: &ProgramInfo, attach| HookProgram {
        id: info.id(),
        name: info.name_as_str().unwrap_or_default().to_owned(),
        hook,
        interface: Some(interface.clone()),
        cgroup: None,
        attach,
    };
    // Kernels without TCX refuse the query: then only cls_bpf filters are there.
    let mut out: Vec<HookProgram> = SchedClassifier::query_tcx(&interface, attach_type)
        .map(|(_, infos)| infos.iter().map(|i| program(i, "tcx")).collect())
        .unwrap_or_default();
    let ids: Vec<u32> = clsact_filters(ifindex, side)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| f.bpf_id)
        .collect();
    if !ids.is_empty() {
        out.extend(
            loaded_programs()
                .flatten()
                .filter(|info| ids.contains(&info.id()))
                .map(|info| program(&info, "cls_bpf")),
        );
    }
    out.retain(|p| !p.name.starts_with("nd_"));
    out
}

/// The egress programs that run for the socket `src -> dst` of `family` in the
/// namespace `netns` pins (effective in its cgroup), but the agent's own. Empty when the
/// socket is gone or nothing can be read.
pub(crate) fn cgroup_egress_programs(
    netns: &NetnsFile,
    family: u8,
    src: SocketAddr,
    dst: SocketAddr,
) -> Vec<HookProgram> {
    let socket = in_netns(netns, || tcp_progress(family, src, dst));
    let id = socket
        .ok()
        .and_then(Result::ok)
        .flatten()
        .and_then(|p| p.cgroup_id);
    let Some(root) = cgroup2_root() else {
        return Vec::new();
    };
    // The programs effective for the socket's cgroup; once the socket is gone (an
    // abandoned connect), those attached anywhere in the tree: one alone is the one.
    let found: Vec<(PathBuf, u32)> = match id.and_then(|id| find_inode(&root, id, 0)) {
        Some(dir) => egress_programs(&dir, BPF_F_QUERY_EFFECTIVE)
            .into_iter()
            .map(|id| (dir.clone(), id))
            .collect(),
        None => {
            let mut out = Vec::new();
            attached_anywhere(&root, 0, &mut out);
            out
        }
    };
    if found.is_empty() {
        return Vec::new();
    }
    loaded_programs()
        .flatten()
        .filter_map(|info| {
            let (dir, _) = found.iter().find(|(_, id)| *id == info.id())?;
            Some(HookProgram {
                id: info.id(),
                name: info.name_as_str().unwrap_or_default().to_owned(),
                hook: "cgroup_egress",
                interface: None,
                cgroup: Some(format!(
                    "/{}",
                    dir.strip_prefix(&root).unwrap_or(dir).display()
                )),
                attach: "cgroup",
            })
        })
        .filter(|p| !p.name.starts_with("nd_"))
        .collect()
}

/// Every egress program attached to a cgroup under `dir`, with its cgroup.
fn attached_anywhere(dir: &Path, depth: usize, out: &mut Vec<(PathBuf, u32)>) {
    out.extend(
        egress_programs(dir, 0)
            .into_iter()
            .map(|id| (dir.to_owned(), id)),
    );
    if depth >= MAX_CGROUP_DEPTH {
        return;
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            attached_anywhere(&e.path(), depth + 1, out);
        }
    }
}

/// Where the agent mounts the cgroup v2 hierarchy when its mount namespace has none
/// (one started by `ip netns exec` gets a /sys of its own, without cgroup mounts).
const OWN_CGROUP2: &str = "/run/node-diag/cgroup2";

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `.../unified` on a
/// hybrid host); mounted at [`OWN_CGROUP2`] when nowhere.
fn cgroup2_root() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mounted = mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mount = left.split_whitespace().nth(4)?;
        right.starts_with("cgroup2 ").then(|| PathBuf::from(mount))
    });
    if mounted.is_some() {
        return mounted;
    }
    std::fs::create_dir_all(OWN_CGROUP2).ok()?;
    let target = std::ffi::CString::new(OWN_CGROUP2).ok()?;
    // SAFETY: all pointers are valid NUL-terminated strings; data is null.
    let rc = unsafe {
        libc::mount(
            c"cgroup2".as_ptr(),
            target.as_ptr(),
            c"cgroup2".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    (rc == 0).then(|| PathBuf::from(OWN_CGROUP2))
}

/// The directory under `dir` whose inode is `ino`: a cgroup's id.
fn find_inode(dir: &Path, ino: u64, depth: usize) -> Option<PathBuf> {
    if std::fs::metadata(dir).ok()?.ino() == ino {
        return Some(dir.to_owned());
    }
    if depth >= MAX_CGROUP_DEPTH {
        return None;
    }
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .find_map(|e| find_inode(&e.path(), ino, depth + 1))
}

/// The ids of the egress programs attached to cgroup `dir` (`flags` 0), or effective
/// in it (`BPF_F_QUERY_EFFECTIVE`).
fn egress_programs(dir: &Path, flags: u32) -> Vec<u32> {
    let Ok(fd) = File::open(dir) else {
        return Vec::new();
    };
    let mut ids = [0u32; 64];
    // `union bpf_attr`'s query: target_fd, attach_type, query_flags, attach_flags,
    // prog_ids, prog_cnt.
    let mut attr = [0u8; 40];
    attr[0..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&BPF_CGROUP_INET_EGRESS.to_ne_bytes());
    attr[8..12].copy_from_slice(&flags.to_ne_bytes());
    attr[16..24].copy_from_slice(&(ids.as_mut_ptr() as u64).to_ne_bytes());
    attr[24..28].copy_from_slice(&(ids.len() as u32).to_ne_bytes());
    // SAFETY: `attr` is a bpf_attr prefix for BPF_PROG_QUERY whose `prog_ids` points at
    // `ids`, with room for `prog_cnt` ids; the kernel writes no more than that.
    let r = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_QUERY, attr.as_mut_ptr(), attr.len()) };
    if r != 0 {
        return Vec::new();
    }
    let count = u32::from_ne_bytes([attr[24], attr[25], attr[26], attr[27]]) as usize;
    ids[..count.min(ids.len())].to_vec()
}

/// The name of interface `ifindex` in the calling thread's namespace.
fn if_name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` holds IF_NAMESIZE bytes, as if_indextoname requires; it writes a
    // NUL-terminated name into it or returns NULL.
    let named = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if named.is_null() {
        return None;
    }
    // SAFETY: on success `buf` holds a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}
