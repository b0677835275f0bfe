//! The read-only global [`CONFIG`] the agent fills at load time (tracepoint field offsets
//! from tracefs, kernel struct offsets from BTF, thresholds, scoping), its accessor
//! [`config!`], the clock, and the namespace scope check every hook applies.

use aya_ebpf::{Global, helpers::bpf_ktime_get_ns};
use node_diag_common::Config;

use crate::maps::SCOPE;

// Named by `node_diag_common::GLOBAL_CONFIG`; read-only, so the verifier sees constants.
#[unsafe(no_mangle)]
// SAFETY: Config is plain integers, for which all zeros is a valid value.
static CONFIG: Global<Config> = Global::new(unsafe { core::mem::zeroed() });

/// Reads one field of [`CONFIG`] without copying the whole struct onto the 512-byte stack.
macro_rules! config {
    ($($field:tt)+) => {
        // SAFETY: CONFIG is a repr(transparent) Global<Config>, always initialised.
        unsafe { core::ptr::read_volatile(&raw const (*$crate::config::config_ptr()).$($field)+) }
    };
}
pub(crate) use config;

#[inline(always)]
pub fn config_ptr() -> *const Config {
    (&raw const CONFIG).cast()
}

#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: a helper without arguments or side effects.
    unsafe { bpf_ktime_get_ns() }
}

/// Whether this node reports for `netns` (unknown namespaces, 0, are never filtered out).
#[inline(always)]
pub fn in_scope(netns: u32) -> bool {
    netns == 0 || config!(scope_enabled) == 0 || SCOPE.get_ptr(&netns).is_some()
}
