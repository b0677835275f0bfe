//! The read-only global [`CONFIG`] the agent fills at load time (tracepoint field offsets
//! from tracefs, kernel struct offsets from BTF, thresholds, scoping), its accessor
//! [`config!`] and, for the few settings a cold path wants without a load, [`imm!`]; the
//! clock, and the namespace scope check every hook applies.

use aya_ebpf::{Global, helpers::bpf_ktime_get_ns};
use node_diag_common::{Config, DropSlot, IMM_MARK, scope_memo, scope_value};

use crate::maps::{SCOPE, SCOPE_GEN, SCOPE_MEMO};

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

/// A setting of [`node_diag_common::imm`] as an instruction immediate: the same value as
/// [`config!`] gives, without the load of the global's cache line (and page), which a
/// hook that runs a few hundred times a second finds cold on every run. For the common
/// path of such a hook only; everything else reads [`CONFIG`].
macro_rules! imm {
    ($name:ident) => {
        $crate::config::immediate(node_diag_common::imm::$name)
    };
}
pub(crate) use imm;

#[inline(always)]
pub fn immediate(id: i32) -> u64 {
    // SAFETY: the marked id is a call the agent rewrites into `w0 = value` before the
    // object is loaded (no kernel has a helper of that id); it takes no arguments, and
    // `w0 =` leaves the upper half of r0 zero.
    let mark: unsafe extern "C" fn() -> u64 =
        unsafe { core::mem::transmute((IMM_MARK + id) as usize) };
    // SAFETY: see above.
    unsafe { mark() }
}

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
/// Sockets come in runs from one namespace (a client's connects, a storm of them): the
/// decision for the last one is remembered per CPU in [`SCOPE_MEMO`] under the scope
/// generation, as [`in_scope_cached`] does per drop reason, and the hash map is looked
/// up only when either changed.
#[inline(always)]
pub fn in_scope(netns: u32) -> bool {
    if netns == 0 || config!(scope_enabled) == 0 {
        return true;
    }
    let (Some(gen_ptr), Some(memo)) = (SCOPE_GEN.get_ptr(0), SCOPE_MEMO.get_ptr_mut(0)) else {
        return scope_lookup(netns);
    };
    // SAFETY: pointers from the maps, 8-aligned; the generation is written by the agent
    // only and read once; the memo is this CPU's, read and written whole (see
    // `scope_memo`).
    unsafe {
        let tag = scope_memo::tag(netns, core::ptr::read_volatile(gen_ptr));
        let seen = core::ptr::read_volatile(memo);
        if seen & !scope_memo::INSIDE == tag {
            return seen & scope_memo::INSIDE != 0;
        }
        let inside = scope_lookup(netns);
        core::ptr::write_volatile(
            memo,
            if inside {
                tag | scope_memo::INSIDE
            } else {
                tag
            },
        );
        inside
    }
}

/// The hash map's answer alone, for a caller that memoises it itself: in scope when the
/// agent wrote [`scope_value::IN`] for the namespace.
#[inline(always)]
fn scope_lookup(netns: u32) -> bool {
    // SAFETY: a pointer from the map, to a `u32` value, read once.
    SCOPE
        .get_ptr(&netns)
        .is_some_and(|v| unsafe { core::ptr::read_volatile(v) } == scope_value::IN)
}

/// Whether the agent has judged `netns` not to be this node's ([`scope_value::OUT`]):
/// false for a namespace it has never looked at, which may be a pod whose veth appeared
/// after its last look. Only for a caller that [`in_scope`] already told "not in".
#[inline(always)]
pub fn known_out_of_scope(netns: u32) -> bool {
    SCOPE.get_ptr(&netns).is_some()
}

/// [`in_scope`] for a drop counted in `slot`, which remembers the decision for the last
/// namespace it counted, under the scope generation it was taken in: a flood of drops
/// from one namespace looks the scope up once per agent refresh, not once per drop.
///
/// The generation is read before the scope map, and the agent bumps it after writing the
/// map, so a decision taken from a map being rewritten is stored under the old
/// generation and retaken at the next drop.
#[inline(always)]
pub fn in_scope_cached(slot: *mut DropSlot, netns: u32) -> bool {
    if netns == 0 || config!(scope_enabled) == 0 {
        return true;
    }
    let Some(gen_ptr) = SCOPE_GEN.get_ptr(0) else {
        return scope_lookup(netns);
    };
    // SAFETY: pointers from the maps; the slot is this CPU's, so no other writer; the
    // generation is written by the agent only, and read once.
    unsafe {
        let generation = core::ptr::read_volatile(gen_ptr);
        if (*slot).netns == netns && (*slot).scope_gen == generation {
            return (*slot).in_scope != 0;
        }
        let inside = scope_lookup(netns);
        (*slot).netns = netns;
        (*slot).scope_gen = generation;
        (*slot).in_scope = inside as u32;
        inside
    }
}
