//! The one naming service for what the kernel reports by number: drop reasons (the
//! running kernel's `enum skb_drop_reason`, read from tracefs at load time) and
//! interfaces (`(netns, ifindex)`, named where the agent can see them).

use std::{path::Path, sync::Arc};

use crate::kernel::tracefs::DropReasons;

/// Resolves `(netns, ifindex)` to an interface name, or `None` where it cannot be seen.
type InterfaceNamer = dyn Fn(u32, u32) -> Option<String> + Send + Sync;

/// Names for kernel numbers, shared by the correlator and the metrics.
#[derive(Clone)]
pub(crate) struct Names {
    reasons: DropReasons,
    interfaces: Arc<InterfaceNamer>,
}

impl Names {
    /// Drop reasons from the loaded kernel; interfaces of the agent's own network
    /// namespace by `if_indextoname` (another namespace's ifindex means nothing here).
    pub(crate) fn for_this_node(reasons: DropReasons) -> Self {
        let own_netns =
            crate::host_network::netns_inode(Path::new("/proc/self/ns/net")).unwrap_or(0);
        Self::new(reasons, move |netns, ifindex| {
            (netns == own_netns).then(|| if_name(ifindex)).flatten()
        })
    }

    pub(crate) fn new(
        reasons: DropReasons,
        interfaces: impl Fn(u32, u32) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            reasons,
            interfaces: Arc::new(interfaces),
        }
    }

    /// The kernel's name of drop reason `value` (`REASON_<n>` when unknown).
    pub(crate) fn drop_reason(&self, value: u32) -> String {
        self.reasons.name(value)
    }

    /// The interface's name, where the agent can see it.
    pub(crate) fn interface(&self, netns: u32, ifindex: u32) -> Option<String> {
        (self.interfaces)(netns, ifindex)
    }

    /// The interface's name, or `<netns>:<ifindex>` where the agent cannot see it.
    pub(crate) fn interface_or_id(&self, netns: u32, ifindex: u32) -> String {
        self.interface(netns, ifindex)
            .unwrap_or_else(|| format!("{netns}:{ifindex}"))
    }
}

/// The name of interface `ifindex` in the calling thread's network namespace.
fn if_name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}
