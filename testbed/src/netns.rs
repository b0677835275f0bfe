//! Named network namespaces (`/run/netns/NAME`) and running code inside them.
//!
//! A thread that calls `setns(CLONE_NEWNET)` moves only itself; a socket it then creates
//! belongs to that namespace for its whole life, whichever thread uses it later. So
//! in-process traffic needs no external tool: [`in_netns`] runs a closure on a fresh
//! thread that first enters the namespace.

use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    thread::{self, JoinHandle},
};

use crate::{Error, Result, cmd};

/// Path of the bind mount that names a network namespace.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Whether a named network namespace exists.
pub fn netns_exists(name: &str) -> bool {
    netns_path(name).exists()
}

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates namespace `name` with its loopback up. A leftover of the same name (from a
    /// crashed run that had our pid) is deleted first.
    pub fn create(name: &str) -> Result<Netns> {
        if netns_exists(name) {
            cmd::try_run(&["ip", "netns", "del", name])?;
        }
        cmd::run(&["ip", "netns", "add", name])?;
        let ns = Netns {
            name: name.to_owned(),
        };
        cmd::run(&["ip", "-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name, as `ip netns` knows it.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(err) = cmd::run(&["ip", "netns", "del", &self.name]) {
            // Never panic in drop: it may run while unwinding from a failure.
            eprintln!("warning: cannot delete netns {}: {err}", self.name);
        }
    }
}

/// Empties the neighbour (ARP, NDP) tables of namespaces `names`, as on nodes that have
/// not talked yet: a topology's build checks its reachability, which leaves them warm;
/// emptied, a test's first packets wait for neighbour resolution as a cold node's do.
pub fn forget_neighbours(names: &[String]) -> Result<()> {
    for name in names {
        for family in ["-4", "-6"] {
            cmd::ip(name, &[family, "neigh", "flush", "all"])?;
        }
    }
    Ok(())
}

/// Deletes the namespaces named `<prefix><pid>-...` whose `pid` no longer runs: those of
/// a run killed before its cleanup. Returns the names deleted.
pub fn remove_stale(prefix: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    let mut deleted = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists()
            && cmd::run(&["ip", "netns", "del", &name]).is_ok()
        {
            deleted.push(name);
        }
    }
    deleted
}

/// Moves the calling thread into network namespace `name`.
pub fn enter_netns(name: &str) -> Result<()> {
    let path = netns_path(name);
    let file =
        File::open(&path).map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
    // SAFETY: `file` is an open namespace file descriptor for the duration of the call;
    // setns only changes the calling thread's namespace.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(Error::io(
            format!("setns({}, CLONE_NEWNET)", path.display()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Runs `f` on a new thread inside network namespace `netns` and returns its result; a
/// panic in `f` is re-raised in the caller.
pub fn in_netns<T, F>(netns: &str, f: F) -> Result<T>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    thread::scope(|s| {
        let handle = thread::Builder::new()
            .name(format!("in-{netns}"))
            .spawn_scoped(s, || {
                enter_netns(netns)?;
                Ok(f())
            })
            .map_err(|e| Error::io("cannot spawn a thread", e))?;
        handle
            .join()
            .unwrap_or_else(|payload| std::panic::resume_unwind(payload))
    })
}

/// Starts `f` on a new thread inside network namespace `netns` and returns at once; join
/// the handle for its result (an error when the thread could not enter `netns`).
pub fn spawn_in_netns<T, F>(netns: &str, f: F) -> Result<JoinHandle<Result<T>>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let ns = netns.to_owned();
    thread::Builder::new()
        .name(format!("in-{netns}"))
        .spawn(move || {
            enter_netns(&ns)?;
            Ok(f())
        })
        .map_err(|e| Error::io("cannot spawn a thread", e))
}
