//! Locked memory. Before Linux 5.11, eBPF maps and programs are charged to the loading
//! user's `RLIMIT_MEMLOCK` (summed over all of that user's processes): a container's
//! default (64 KiB to 8 MiB) is below what the agent's maps hold, and the load fails
//! with EPERM. Later kernels charge the memory cgroup and ignore the limit. As
//! cilium/ebpf's `rlimit.RemoveMemlock` and aya-template do, the limit is lifted before
//! anything is loaded; that takes `CAP_SYS_RESOURCE` (root has it; the DaemonSet grants
//! it only through its `kernel-5.10` component).

use std::sync::atomic::{AtomicBool, Ordering};

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tracing::{debug, info};

/// Whether the limit is unlimited (lifted, or so already).
static UNLIMITED: AtomicBool = AtomicBool::new(false);

/// What to add to a failed load's error: the limit, when it still holds.
pub(crate) fn hint() -> &'static str {
    if UNLIMITED.load(Ordering::Relaxed) {
        ""
    } else {
        " (before Linux 5.11 eBPF maps count against RLIMIT_MEMLOCK, which the agent could \
         not lift: grant it CAP_SYS_RESOURCE, see the DaemonSet's kernel-5.10 component)"
    }
}

/// Lifts `RLIMIT_MEMLOCK` (soft and hard) to unlimited, or else the soft limit to the
/// hard one. Never fails: on kernels that charge the cgroup the limit does not matter,
/// and where it does a refused load says so.
pub(crate) fn lift() {
    let now = getrlimit(Resource::Memlock);
    if now.current.is_none() {
        UNLIMITED.store(true, Ordering::Relaxed);
        debug!("locked-memory limit already unlimited");
        return;
    }
    let unlimited = Rlimit {
        current: None,
        maximum: None,
    };
    match setrlimit(Resource::Memlock, unlimited) {
        Ok(()) => {
            UNLIMITED.store(true, Ordering::Relaxed);
            info!(
                before = ?now.current,
                "locked-memory limit lifted (kernels before 5.11 charge eBPF maps to it)"
            );
        }
        Err(e) => {
            let raised = now.current != now.maximum
                && setrlimit(
                    Resource::Memlock,
                    Rlimit {
                        current: now.maximum,
                        maximum: now.maximum,
                    },
                )
                .is_ok();
            debug!(
                soft = ?now.current,
                hard = ?now.maximum,
                raised_to_hard = raised,
                error = %e,
                "locked-memory limit kept (no CAP_SYS_RESOURCE): kernels before 5.11 charge eBPF maps to it"
            );
        }
    }
}
