//! Integration-test harness for node-diag.
//!
//! Nothing here is mocked: the tests run as root on a real kernel, build real
//! network namespaces, push real TCP traffic through a vxlan overlay, and run the
//! real `node-diag` binary (from `NODE_DIAG_BIN`) with its real eBPF programs.
//!
//! # Pieces
//!
//! - [`Topology`]: two "nodes" joined by an underlay veth and a vxlan overlay, and
//!   one "pod" per node (the layout described in `PLATFORM.md`, "Reproducing real
//!   node faults in network namespaces"). Dropping it deletes all four namespaces,
//!   and with them every veth, vxlan and nftables table inside.
//! - [`in_netns`] / [`spawn_in_netns`]: run a closure on a thread that has entered
//!   a namespace; sockets created there stay in it. The TCP helpers
//!   ([`TcpServer`], [`tcp_connect`], [`tcp_request`], [`http_get`]) are built on
//!   them, so no external tool is needed to make traffic.
//! - [`Agent`]: `node-diag run` as a real process inside node A, with its stdout
//!   findings (JSON lines) and stderr captured, and its `/metrics` scraped over
//!   HTTP from inside node A.
//! - [`cmd`]: run commands (in a namespace or not) with panics that show stderr.
//!
//! # Rules every test follows
//!
//! - Run as root, one test at a time:
//!   `cargo test -p node-diag-tests -- --test-threads=1`.
//! - Every resource is owned by a guard whose `Drop` removes it, so a failing
//!   assertion (a panic) still cleans up. Agents borrow their [`Topology`], so the
//!   compiler makes them stop before the namespaces go.
//! - Names are unique per test and per process ([`unique_name`]:
//!   `ndt-<pid%10000>-<n>`), so a leftover from a crashed run never collides with a
//!   live one; a leftover with the very same name is deleted before reuse.
//!
//! ```no_run
//! use std::time::Duration;
//! use node_diag_tests::{Agent, ConnectOutcome, Topology, tcp_connect};
//!
//! let topo = Topology::new();
//! let mut agent = Agent::start(&topo);
//! agent.wait_ready(Duration::from_secs(30));
//! let outcome = tcp_connect(&topo.pod_a, topo.pod_b_addr(8081), Duration::from_secs(2));
//! assert!(matches!(outcome, ConnectOutcome::Refused), "{outcome:?}");
//! agent.wait_finding(|f| f["kind"] == "tcp_refused", Duration::from_secs(1));
//! ```

pub mod agent;
pub mod cmd;
pub mod finding;
pub mod metrics;
pub mod netns;
pub mod process;
pub mod tcp;
pub mod topology;

use std::sync::atomic::{AtomicU32, Ordering};

pub use agent::{Agent, node_diag_bin};
pub use netns::{Netns, in_netns, spawn_in_netns};
pub use tcp::{ConnectOutcome, ServerMode, TcpServer, http_get, tcp_connect, tcp_request};
pub use topology::Topology;

/// A name no other live test uses: `ndt-<pid%10000>-<n>`, `n` counting up
/// within this process. Short enough to append a few characters and still fit
/// an interface name (15 bytes).
pub fn unique_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("ndt-{}-{n}", std::process::id() % 10_000)
}

/// Fails the test unless it runs as root: everything here needs it.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "node-diag integration tests need root (network namespaces, eBPF); run them as root"
    );
}
