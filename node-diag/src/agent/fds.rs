//! Open files. Container runtimes start processes with a soft `RLIMIT_NOFILE` of 1,024
//! (containerd 2.0 no longer raises it), which a port scan's idle connections exhaust;
//! the agent's own work (namespace files, netlink sockets, `/proc`) then fails. At start
//! the soft limit is raised to the hard one ([`raise_limit`]); what remains is shared
//! between the HTTP connections and the agent's own work, and [`connection_budget`]
//! says how many connections the HTTP server may hold so that [`RESERVE`] stay free.

use std::sync::atomic::{AtomicU64, Ordering};

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tracing::{debug, info, warn};

/// Files kept for the agent's own work: every namespace file of a scope refresh is
/// open at once (one per pod), plus netlink sockets, the CRI connection and `/proc`
/// reads.
pub(crate) const RESERVE: u64 = 256;
/// Connections the HTTP server is granted however low the limit.
const MIN_CONNECTIONS: u64 = 16;

/// The soft limit after [`raise_limit`] (0 before).
static SOFT: AtomicU64 = AtomicU64::new(0);

/// The limits before and after [`raise_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) soft_before: u64,
    pub(crate) soft: u64,
    pub(crate) hard: u64,
}

/// Raises the soft open-files limit to the hard one and logs both. An unlimited hard
/// limit cannot be the soft one (the kernel caps files at `fs.nr_open`): that is taken.
pub(crate) fn raise_limit() -> Limits {
    let now = getrlimit(Resource::Nofile);
    let soft_before = now.current.unwrap_or(u64::MAX);
    let hard = now.maximum.unwrap_or_else(nr_open);
    let mut soft = soft_before;
    if soft_before < hard {
        match setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(hard),
                maximum: now.maximum,
            },
        ) {
            Ok(()) => {
                soft = hard;
                info!(
                    soft_before,
                    soft, hard, "open-files limit raised to the hard limit"
                );
            }
            Err(e) => warn!(
                soft,
                hard,
                error = %e,
                "cannot raise the open-files limit: many idle HTTP connections can starve the agent's own work"
            ),
        }
    } else {
        debug!(soft, hard, "open-files limit already at the hard limit");
    }
    SOFT.store(soft, Ordering::Relaxed);
    Limits {
        soft_before,
        soft,
        hard,
    }
}

/// `fs.nr_open`, the most files a process may have; the kernel's default when unread.
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

/// How many connections the HTTP server may hold at once and leave [`RESERVE`] files
/// to the agent's own work: the soft limit less the reserve, at least
/// [`MIN_CONNECTIONS`].
pub(crate) fn connection_budget() -> u64 {
    budget(SOFT.load(Ordering::Relaxed))
}

fn budget(soft: u64) -> u64 {
    soft.saturating_sub(RESERVE).max(MIN_CONNECTIONS)
}

/// Files open now, from `/proc/self/fd`; `None` when that cannot be read (which,
/// at the limit, is itself the answer).
pub(crate) fn open_now() -> Option<u64> {
    let dir = std::fs::read_dir("/proc/self/fd").ok()?;
    // Less the directory's own descriptor.
    Some((dir.count() as u64).saturating_sub(1))
}

/// Whether at least [`RESERVE`] files are left under the soft limit: an accept loop can
/// ask before taking one more connection. Costs a directory read.
pub(crate) fn fd_headroom_ok() -> bool {
    let soft = SOFT.load(Ordering::Relaxed);
    let soft = if soft == 0 {
        getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
    } else {
        soft
    };
    open_now().is_some_and(|open| open.saturating_add(RESERVE) <= soft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_leaves_the_reserve() {
        assert_eq!(budget(1024), 768);
        assert_eq!(budget(1 << 20), (1 << 20) - RESERVE);
        assert_eq!(budget(100), MIN_CONNECTIONS, "a tiny limit still serves");
    }

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let limits = raise_limit();
        assert!(limits.soft >= limits.soft_before);
        assert_eq!(limits.soft, limits.hard);
        assert_eq!(
            getrlimit(Resource::Nofile).current,
            Some(limits.soft),
            "the process's own limit"
        );
        assert!(open_now().is_some_and(|n| n >= 3));
        assert!(fd_headroom_ok());
    }
}
