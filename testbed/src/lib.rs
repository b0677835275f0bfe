//! The network-namespace testbed shared by the integration tests (`node-diag-tests`)
//! and the bench (`cargo xtask bench`).
//!
//! Nothing here is mocked: it runs as root on a real kernel, builds real network
//! namespaces and runs the real `node-diag` binary with its real eBPF programs.
//!
//! # Pieces
//!
//! - [`Topology`]: two "nodes" joined by an underlay veth and a vxlan overlay, and one
//!   "pod" per node (the layout of `PLATFORM.md`, "Reproducing real node faults in
//!   network namespaces"), with fault injectors (nftables drops, MTU changes, a lost
//!   route). Dropping it deletes all four namespaces and everything inside.
//! - [`RoutedTopology`] ([`routed`]): two nodes in different subnets joined by a router
//!   namespace, a DF-setting VXLAN and a pod each (IPv6 underlay optional), with the
//!   router's faults (a narrower hop towards node B, ICMP frag-needed filtered, the
//!   tunnel's port dropped) and route-cache helpers (learn, read, flush a path MTU).
//! - [`pod_ipv6`]: IPv6 addresses for either topology's pods, routed through its
//!   overlay.
//! - [`cluster`]: a management network around node namespaces with a real DNS server
//!   (dnsmasq) serving the agents' headless Service, for `node-diag findings --cluster`.
//! - [`netns`]: the [`Netns`] guard, and [`in_netns`] / [`spawn_in_netns`], which run a
//!   closure on a thread that entered a namespace; sockets created there stay in it.
//! - [`cni`]: the device shapes real CNIs create (flannel, Calico VXLAN and IPIP,
//!   Cilium's tunnels, a multi-NIC node), built in place of the topology's overlay.
//! - [`tunnel`]: tunnel devices the kernel may lack ([`Error::MissingKind`]), an IPv6
//!   underlay, and WireGuard keys.
//! - [`Agent`]: `node-diag run` as a process inside node A, with its ready file, its
//!   stdout findings and stderr captured, and its HTTP endpoints read from node A.
//! - [`Containerd`]: a real containerd with its CRI plugin in node A, its own state and
//!   socket, a locally built sandbox image and a CNI bridge; pods created through CRI.
//! - [`http`]: `GET` from inside a namespace (ureq on a thread in that namespace).
//! - [`kube_proxy`]: a Service's rules as kube-proxy writes them (iptables through
//!   either backend, or nftables), so the agent can be tested against them.
//! - [`cmd`], [`process`]: commands, in a namespace or not, and child processes with
//!   deadlines.
//! - [`metrics`]: finding one series in an OpenMetrics exposition.
//!
//! Every operation returns [`Result`]; every resource is owned by a guard whose `Drop`
//! removes it, so an early return or a panic still cleans up. Agents borrow their
//! [`Topology`], so the compiler makes them stop before the namespaces go.

pub mod agent;
pub mod cluster;
pub mod cmd;
pub mod cni;
#[cfg(feature = "cri")]
pub mod containerd;
mod error;
pub mod http;
pub mod kube_proxy;
pub mod metrics;
pub mod netns;
pub mod pki;
pub mod pod_ipv6;
pub mod process;
pub mod routed;
pub mod topology;
pub mod tunnel;

use std::sync::atomic::{AtomicU32, Ordering};

pub use agent::{Agent, AgentHost, Termination};
#[cfg(feature = "cri")]
pub use containerd::{Containerd, PodPool};
pub use error::{Error, Result};
pub use netns::{Netns, in_netns, spawn_in_netns};
pub use routed::RoutedTopology;
pub use topology::Topology;

/// A name no other live run uses: `ndt-<pid%10000>-<n>`, `n` counting up within this
/// process. Short enough to append a few characters and still fit an interface name
/// (15 bytes); a leftover with the very same name is deleted before reuse.
pub fn unique_name() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("ndt-{}-{n}", std::process::id() % 10_000)
}

/// Fails unless this process runs as root: everything here needs it.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err(Error::NotRoot)
    }
}
