//! The C allocator's memory. glibc's malloc gives each thread that finds the main
//! arena busy an arena of its own, up to eight per CPU, and memory freed into an arena
//! is reused by that arena's allocations only; nor does it give back free pages below
//! the top of a heap. Measured on the findings poll (docs/benchmarks.md, "Findings
//! poll"): start-up (the kernel's BTF parsed, the programs loaded) left the main heap
//! at 23 MiB resident, mostly free, for good; the store's findings and their JSON,
//! allocated by the runtime's workers and the blocking pool that encodes `/findings`,
//! then went to other arenas, 7 MiB more, instead of into that free space.
//! [`limit_arenas`] caps the arenas at start, before any thread exists, and
//! [`release_free`] gives start-up's free pages back once it is done.
//!
//! Only glibc has these knobs; with another C library nothing changes. An operator's
//! own `MALLOC_ARENA_MAX` (or `glibc.malloc.arena_max` in `GLIBC_TUNABLES`) stands.

/// Arenas the agent's allocations share: the main one (the event loop runs on the
/// main thread) and one for every other thread. One alone measured about 2 MiB less,
/// but would have the event loop wait on the lock of every allocation the dozens of
/// blocking-pool threads a burst of verdicts spawns make.
pub(crate) const ARENAS: i32 = 2;

/// Caps glibc's malloc arenas at [`ARENAS`], unless the environment already sets the
/// cap. Call before the first thread is spawned: arenas already made stay. Returns
/// whether it set the cap.
pub(crate) fn limit_arenas() -> bool {
    if set_by_environment(
        std::env::var_os("MALLOC_ARENA_MAX").is_some(),
        std::env::var("GLIBC_TUNABLES").ok().as_deref(),
    ) {
        return false;
    }
    set_arena_max(ARENAS)
}

/// Whether the environment caps the arenas itself.
fn set_by_environment(malloc_arena_max: bool, tunables: Option<&str>) -> bool {
    malloc_arena_max || tunables.is_some_and(|t| t.contains("glibc.malloc.arena_max"))
}

/// Hands the allocator's free pages back to the kernel, wherever they lie in its heap
/// (not only at its top, which glibc gives back by itself). Start-up peaks above the
/// steady state (docs/benchmarks.md): without this the pages it freed stay resident
/// for as long as the agent runs.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn release_free() {
    // SAFETY: malloc_trim walks the arenas under their locks and only advises the
    // kernel about pages no allocation holds; 0 keeps no padding at the top.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_free() {}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(arenas: i32) -> bool {
    // SAFETY: mallopt sets one malloc parameter, under malloc's own lock; M_ARENA_MAX
    // takes any positive count.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_arenas: i32) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_s_cap_stands() {
        assert!(set_by_environment(true, None));
        assert!(set_by_environment(
            false,
            Some("glibc.malloc.check=0:glibc.malloc.arena_max=4")
        ));
        assert!(!set_by_environment(false, Some("glibc.malloc.check=0")));
        assert!(!set_by_environment(false, None));
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_takes_the_cap() {
        assert!(set_arena_max(ARENAS));
    }
}
