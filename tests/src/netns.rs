//! Named network namespaces (`/run/netns/NAME`) and running code inside them.
//!
//! A thread that calls `setns(CLONE_NEWNET)` moves only itself; a socket it then
//! creates belongs to that namespace for its whole life, whichever thread uses
//! it later. So in-process traffic needs no external tool: [`in_netns`] runs a
//! closure on a fresh thread that first enters the namespace.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::thread::{self, JoinHandle};

use crate::cmd;

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
    /// Creates namespace `name` with its loopback up. A leftover of the same
    /// name (from a crashed run that had our pid) is deleted first.
    pub fn create(name: &str) -> Netns {
        if netns_exists(name) {
            cmd::try_run(&["ip", "netns", "del", name]);
        }
        cmd::run(&["ip", "netns", "add", name]);
        let ns = Netns {
            name: name.to_owned(),
        };
        cmd::run(&["ip", "-n", name, "link", "set", "lo", "up"]);
        ns
    }

    /// The namespace's name, as `ip netns` knows it.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let out = cmd::try_run(&["ip", "netns", "del", &self.name]);
        if !out.status.success() {
            // Never panic in drop: it may run while unwinding from a failure.
            eprintln!(
                "warning: cannot delete netns {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim_end()
            );
        }
    }
}

/// Moves the calling thread into network namespace `name`.
/// Panics when the namespace does not exist or `setns` fails.
pub fn enter_netns(name: &str) {
    let path = netns_path(name);
    let file = File::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    // SAFETY: `file` is an open namespace file descriptor for the duration of
    // the call; setns only changes the calling thread's namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        panic!(
            "setns({}, CLONE_NEWNET) failed: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
}

/// Runs `f` on a new thread inside network namespace `netns` and returns its
/// result; a panic in `f` is re-raised in the caller.
pub fn in_netns<T, F>(netns: &str, f: F) -> T
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    thread::scope(|s| {
        let handle = thread::Builder::new()
            .name(format!("in-{netns}"))
            .spawn_scoped(s, || {
                enter_netns(netns);
                f()
            })
            .expect("cannot spawn thread");
        handle
            .join()
            .unwrap_or_else(|payload| std::panic::resume_unwind(payload))
    })
}

/// Starts `f` on a new thread inside network namespace `netns` and returns
/// at once; join the handle for its result.
pub fn spawn_in_netns<T, F>(netns: &str, f: F) -> JoinHandle<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let ns = netns.to_owned();
    thread::Builder::new()
        .name(format!("in-{netns}"))
        .spawn(move || {
            enter_netns(&ns);
            f()
        })
        .expect("cannot spawn thread")
}
