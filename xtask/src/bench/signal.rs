//! SIGINT and SIGTERM turned into a flag every loop of the bench checks, so that it
//! unwinds through its guards (namespaces, agent, servers, sysctl) instead of dying
//! with them in place.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Result, bail};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Whether SIGINT or SIGTERM arrived; every loop of the bench checks it.
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

pub(super) fn check_interrupted() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

/// Turns SIGINT and SIGTERM into [`interrupted`], so the bench unwinds through its guards
/// (namespaces, agent, servers, sysctl) instead of dying with them in place.
pub(super) fn catch_signals() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, handler) };
    }
}
