//! Tunnel devices the kernel may lack: this repository's build machines have no geneve,
//! wireguard, ipip or gre modules, Debian's kernels have them all.
//!
//! [`add_tunnel_or_skip`] creates one; when the kernel does not know the kind, the test
//! skips with a `SKIPPED: kernel <release> has no <kind> support` line, unless
//! `NODE_DIAG_REQUIRE_TUNNELS=1` (set by the VM runner, whose kernels have every kind):
//! then a missing kind fails the test.

use std::io::Write as _;

use crate::cmd;

/// Set to `1` where every tunnel kind must be available: a missing one fails the test.
pub const REQUIRE_TUNNELS: &str = "NODE_DIAG_REQUIRE_TUNNELS";

/// Whether [`REQUIRE_TUNNELS`] is set to `1`.
pub fn tunnels_required() -> bool {
    std::env::var(REQUIRE_TUNNELS).is_ok_and(|v| v == "1")
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "(unknown)".to_owned())
}

/// Whether `ip link add`'s error says the kernel lacks the device kind (its module is
/// missing): "Error: Unknown device type." (iproute2 with extended acks) or
/// "RTNETLINK answers: Operation not supported".
pub fn is_missing_kind(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    s.contains("unknown device type") || s.contains("not supported")
}

/// `ip -n <netns> link add <name> type <kind> <options...>`. `true` when the device was
/// created. When the kernel lacks `kind`: writes `SKIPPED: kernel <release> has no
/// <kind> support` to stderr (past the test harness's capture, so it shows in the run's
/// output) and returns `false`, or panics when [`tunnels_required`]. Panics on any
/// other failure.
#[must_use = "the test must stop when the device was not created"]
pub fn add_tunnel_or_skip(netns: &str, name: &str, kind: &str, options: &[&str]) -> bool {
    let mut argv = vec!["ip", "-n", netns, "link", "add", name, "type", kind];
    argv.extend_from_slice(options);
    let out = cmd::try_run(&argv);
    if out.status.success() {
        return true;
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let release = kernel_release();
    if !is_missing_kind(&stderr) {
        panic!(
            "`{}` failed ({}): {}",
            argv.join(" "),
            out.status,
            stderr.trim_end()
        );
    }
    if tunnels_required() {
        panic!(
            "{REQUIRE_TUNNELS}=1 but kernel {release} has no {kind} support: `{}`: {}",
            argv.join(" "),
            stderr.trim_end()
        );
    }
    let _ = writeln!(
        std::io::stderr(),
        "\nSKIPPED: kernel {release} has no {kind} support"
    );
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_kind_messages() {
        assert!(is_missing_kind("Error: Unknown device type.\n"));
        assert!(is_missing_kind(
            "RTNETLINK answers: Operation not supported\n"
        ));
        assert!(!is_missing_kind("RTNETLINK answers: File exists\n"));
        assert!(!is_missing_kind(
            "Error: either \"local\" or \"remote\" is missing\n"
        ));
    }
}
