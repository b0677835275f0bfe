//! Tunnel devices the kernel may lack, and what WireGuard needs to name a peer.
//!
//! The build machines' kernel has no geneve, wireguard, ipip or gre modules while
//! Debian's kernels have them all, so a missing device kind is its own error,
//! [`Error::MissingKind`]: the caller decides whether that skips a test or fails it.

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::{Error, Result, cmd};

/// Node A's and node B's IPv6 underlay addresses, added by [`add_ipv6_underlay`].
pub const UNDERLAY_V6: [&str; 2] = ["fd00:77::1", "fd00:77::2"];

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

/// `ip -n <netns> link add <name> type <kind> <options...>`; [`Error::MissingKind`]
/// when the kernel does not know `kind`.
pub fn add_link(netns: &str, name: &str, kind: &str, options: &[&str]) -> Result<()> {
    let mut argv = vec!["ip", "-n", netns, "link", "add", name, "type", kind];
    argv.extend_from_slice(options);
    let out = cmd::try_run(&argv)?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim_end().to_owned();
    let command = argv.join(" ");
    Err(if is_missing_kind(&stderr) {
        Error::MissingKind {
            kind: kind.to_owned(),
            release: kernel_release(),
            command,
            stderr,
        }
    } else {
        Error::Command {
            command,
            status: out.status,
            stderr,
            stdout: String::from_utf8_lossy(&out.stdout).trim_end().to_owned(),
        }
    })
}

/// The IPv6 addresses of [`UNDERLAY_V6`] on both ends of the underlay veth, without
/// duplicate address detection, which would keep them unusable for a while.
pub fn add_ipv6_underlay(topo: &crate::Topology) -> Result<()> {
    for (node, addr) in [&topo.node_a, &topo.node_b].into_iter().zip(UNDERLAY_V6) {
        let cidr = format!("{addr}/64");
        cmd::run(&[
            "ip",
            "-n",
            node,
            "addr",
            "add",
            &cidr,
            "dev",
            crate::topology::UNDERLAY_IF,
            "nodad",
        ])?;
    }
    Ok(())
}

/// A fresh WireGuard public key (of a private key nobody keeps): a peer to configure
/// that is never contacted.
pub fn peer_key() -> Result<String> {
    public_key(&cmd::run(&["wg", "genkey"])?)
}

/// `wg pubkey` of a private key.
pub fn public_key(private: &str) -> Result<String> {
    let mut command = Command::new("wg");
    command
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|source| Error::Spawn {
        command: "wg pubkey (install wireguard-tools)".to_owned(),
        source,
    })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(private.as_bytes())
            .map_err(|e| Error::io("wg pubkey: write the private key", e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io("wg pubkey", e))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: cmd::display(&command),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim_end().to_owned(),
            stdout: String::from_utf8_lossy(&out.stdout).trim_end().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
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
