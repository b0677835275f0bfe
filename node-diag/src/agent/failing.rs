//! Work the agent retries on every tick (the scope refresh, the interface list, the MTU
//! model) can fail for a while, e.g. while open files run short: one warning when it
//! starts failing, with the open files against the limit, debug lines while it goes on,
//! and one line when it works again. The next tick retries either way.

use std::{
    fmt::Display,
    sync::atomic::{AtomicBool, Ordering},
};

use tracing::{debug, info, warn};

use super::fds;

/// Whether one piece of recurring work is failing; a `static` per call site.
pub(crate) struct Failing {
    /// What fails, for the log lines ("list this node's network namespaces").
    what: &'static str,
    /// What stays meanwhile ("the previous scope stays").
    meanwhile: &'static str,
    failing: AtomicBool,
}

impl Failing {
    pub(crate) const fn new(what: &'static str, meanwhile: &'static str) -> Self {
        Self {
            what,
            meanwhile,
            failing: AtomicBool::new(false),
        }
    }

    /// Logs a failure: a warning the first time since it last worked.
    pub(crate) fn failed(&self, error: &dyn Display) {
        if self.failing.swap(true, Ordering::Relaxed) {
            debug!(error = %error, "still cannot {}", self.what);
            return;
        }
        let open = fds::open_now().map_or_else(|| "unreadable".into(), |n| n.to_string());
        warn!(
            error = %error,
            open_files = %open,
            fd_headroom = fds::fd_headroom_ok(),
            fd_limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
                .current
                .unwrap_or(u64::MAX),
            "cannot {}; {}, retried every tick (logged again when it works)",
            self.what,
            self.meanwhile
        );
    }

    /// Notes a success: logged when it had been failing.
    pub(crate) fn worked(&self) {
        if self.failing.swap(false, Ordering::Relaxed) {
            info!("can {} again", self.what);
        }
    }

    /// [`Failing::failed`] or [`Failing::worked`], by `result`; returns its value.
    pub(crate) fn check<T, E: Display>(&self, result: Result<T, E>) -> Option<T> {
        match result {
            Ok(v) => {
                self.worked();
                Some(v)
            }
            Err(e) => {
                self.failed(&e);
                None
            }
        }
    }

    #[cfg(test)]
    fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fails_once_and_recovers() {
        let f = Failing::new("do it", "nothing changes");
        assert_eq!(f.check(Ok::<_, String>(1)), Some(1));
        assert!(!f.is_failing());
        assert_eq!(f.check(Err::<u8, _>("EMFILE")), None);
        assert!(f.is_failing());
        assert_eq!(f.check(Err::<u8, _>("EMFILE")), None);
        assert!(f.is_failing());
        assert_eq!(f.check(Ok::<_, String>(2)), Some(2));
        assert!(!f.is_failing());
    }
}
