//! Tunnel devices the kernel may lack: this repository's build machines have no geneve,
//! wireguard, ipip or gre modules, Debian's kernels have them all.
//!
//! The testbed reports a missing kind as [`Error::MissingKind`]; here [`or_skip`] turns
//! it into a skipped test, with a `SKIPPED: kernel <release> has no <kind> support`
//! line, unless `NODE_DIAG_REQUIRE_TUNNELS=1` (set by the VM runner, whose kernels have
//! every kind): then a missing kind fails the test.

use std::io::Write as _;

use node_diag_testbed::{Error, Result, tunnel};

pub use node_diag_testbed::tunnel::{is_missing_kind, kernel_release};

/// Set to `1` where every tunnel kind must be available: a missing one fails the test.
pub const REQUIRE_TUNNELS: &str = "NODE_DIAG_REQUIRE_TUNNELS";

/// Whether [`REQUIRE_TUNNELS`] is set to `1`.
pub fn tunnels_required() -> bool {
    std::env::var(REQUIRE_TUNNELS).is_ok_and(|v| v == "1")
}

/// `true` when `built` succeeded. When the kernel lacks a device kind: writes `SKIPPED:
/// kernel <release> has no <kind> support` to stderr (past the test harness's capture,
/// so it shows in the run's output) and returns `false`, or panics when
/// [`tunnels_required`]. Panics on any other failure.
#[must_use = "the test must stop when the devices were not created"]
#[track_caller]
pub fn or_skip(built: Result<()>) -> bool {
    match built {
        Ok(()) => true,
        Err(e @ Error::MissingKind { .. }) if tunnels_required() => {
            panic!("{REQUIRE_TUNNELS}=1 but {e}")
        }
        Err(Error::MissingKind { kind, release, .. }) => {
            let _ = writeln!(
                std::io::stderr(),
                "\nSKIPPED: kernel {release} has no {kind} support"
            );
            false
        }
        Err(e) => panic!("{e}"),
    }
}

/// `ip -n <netns> link add <name> type <kind> <options...>`: `true` when the device was
/// created, `false` when the test skips; see [`or_skip`].
#[must_use = "the test must stop when the device was not created"]
#[track_caller]
pub fn add_tunnel_or_skip(netns: &str, name: &str, kind: &str, options: &[&str]) -> bool {
    or_skip(tunnel::add_link(netns, name, kind, options))
}
