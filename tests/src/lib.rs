//! Integration-test harness for node-diag: thin panicking conveniences over the testbed
//! (`node-diag-testbed`), plus what only the tests need.
//!
//! Nothing here is mocked: the tests run as root on a real kernel, build real network
//! namespaces, push real TCP traffic through a vxlan overlay, and run the real
//! `node-diag` binary (from `NODE_DIAG_BIN`) with its real eBPF programs.
//!
//! # Pieces
//!
//! - [`Topology`]: the testbed's two nodes, vxlan overlay and pods, named uniquely per
//!   test ([`unique_name`]); its fault injectors panic (with the command's output) on
//!   failure. It dereferences to the testbed's topology for names and addresses.
//! - [`Agent`]: the testbed's `node-diag run` in node A, whose waits and reads panic
//!   with the agent's findings and stderr.
//! - [`in_netns`] / [`spawn_in_netns`] and the TCP helpers ([`TcpServer`],
//!   [`tcp_connect`], [`tcp_request`]) make traffic from inside a namespace; [`http_get`]
//!   reads an HTTP endpoint there.
//! - [`cmd`], [`process`]: commands and child processes that panic with what ran.
//! - [`finding`]: reading and checking the agent's findings.
//! - [`policy`]: a policy controller's rules (a pod's ingress chain, or `FORWARD`).
//! - [`kube_proxy`]: a Service's rules as kube-proxy writes them (iptables through
//!   either backend, or nftables), installed into a namespace.
//! - [`tunnel`]: creating tunnel devices the kernel may lack, skipping (or, where
//!   `NODE_DIAG_REQUIRE_TUNNELS=1`, failing) when it does.
//!
//! # Rules every test follows
//!
//! - Run as root, one test at a time:
//!   `cargo test -p node-diag-tests -- --test-threads=1`.
//! - Every resource is owned by a guard whose `Drop` removes it, so a failing assertion
//!   (a panic) still cleans up. Agents borrow their [`Topology`], so the compiler makes
//!   them stop before the namespaces go.
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
pub mod finding;
pub mod policy;
pub mod tcp;
pub mod tunnel;

use std::fmt::Display;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::Deref;
use std::thread::JoinHandle;
use std::time::Duration;

pub use agent::{Agent, node_diag_bin};
pub use node_diag_testbed::{netns, topology, unique_name};
pub use tcp::{
    BULK, ConnectOutcome, ServerMode, TcpServer, bulk_to_pod_b, tcp_connect, tcp_request,
};

/// The running kernel's (major, minor), from `/proc/sys/kernel/osrelease`.
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .expect("/proc/sys/kernel/osrelease is readable");
    let mut parts = release.trim().split(['.', '-']);
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// Whether this kernel attaches TC programs through TCX links (Linux 6.6+); older ones
/// get netlink filters under `clsact`.
pub fn kernel_has_tcx() -> bool {
    kernel_version() >= (6, 6)
}

/// Lowers node B's veth to pod B to `mtu`, so that node B answers pod A's full-size
/// segments with frag-needed (PMTUD from beyond node A). Pod B's default route gets the
/// same MTU, with `advmss` left at its link's: pod B still advertises the full MSS (so
/// pod A's segments hit the narrow link) but sends no frame that the narrow veth would
/// drop without an ICMP (a veth drops oversize frames silently, unless they are GSO).
pub fn narrow_node_b_pod_link(topo: &Topology, mtu: u32) {
    topo.set_link_mtu(&topo.node_b, topology::POD_HOST_IF, mtu);
    let default = cmd::run(&["ip", "-n", &topo.pod_b, "route", "show", "default"]);
    let gateway = default
        .split_whitespace()
        .skip_while(|w| *w != "via")
        .nth(1)
        .unwrap_or_else(|| panic!("pod B has no default route via a gateway: {default}"))
        .to_owned();
    let advmss = (topology::POD_MTU - 40).to_string();
    cmd::run(&[
        "ip",
        "-n",
        &topo.pod_b,
        "route",
        "change",
        "default",
        "via",
        &gateway,
        "dev",
        topology::POD_IF,
        "onlink",
        "mtu",
        &mtu.to_string(),
        "advmss",
        &advmss,
    ]);
}

/// Unwraps a testbed result, panicking with the error's message (which carries the
/// command's or the agent's output).
#[track_caller]
pub fn ok<T>(result: Result<T, impl Display>) -> T {
    result.unwrap_or_else(|e| panic!("{e}"))
}

/// Fails the test unless it runs as root: everything here needs it.
pub fn require_root() {
    ok(node_diag_testbed::require_root());
}

/// The testbed's [`node_diag_testbed::Topology`] under a name unique to this test, with
/// fault injectors that panic on failure.
#[derive(Debug)]
pub struct Topology(node_diag_testbed::Topology);

impl Deref for Topology {
    type Target = node_diag_testbed::Topology;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Topology {
    /// Builds the topology and checks that the pods and nodes reach each other. Panics
    /// (after cleaning up) when any step fails.
    pub fn new() -> Topology {
        require_root();
        Topology(ok(node_diag_testbed::Topology::build(&unique_name())))
    }

    /// See [`node_diag_testbed::Topology::drop_forwarded_tcp`].
    pub fn drop_forwarded_tcp(&self, node: &str, dport: u16) {
        ok(self.0.drop_forwarded_tcp(node, dport));
    }

    /// See [`node_diag_testbed::Topology::drop_forwarded_syn`].
    pub fn drop_forwarded_syn(&self, node: &str, dport: u16) {
        ok(self.0.drop_forwarded_syn(node, dport));
    }

    pub fn drop_forwarded_syn_ack(&self, node: &str, sport: u16) {
        ok(self.0.drop_forwarded_syn_ack(node, sport));
    }

    /// See [`node_diag_testbed::Topology::drop_forwarded_flow`].
    pub fn drop_forwarded_flow(&self, node: &str, a: SocketAddrV4, b: SocketAddrV4) {
        ok(self.0.drop_forwarded_flow(node, a, b));
    }

    /// See [`node_diag_testbed::Topology::reject_forwarded_tcp`].
    pub fn reject_forwarded_tcp(&self, node: &str, dport: u16, reject: topology::Reject) {
        ok(self.0.reject_forwarded_tcp(node, dport, reject));
    }

    /// See [`node_diag_testbed::Topology::steer_rx`].
    pub fn steer_rx(&self, netns: &str, dev: &str, mask: u32) {
        ok(self.0.steer_rx(netns, dev, mask));
    }

    /// See [`node_diag_testbed::Topology::masquerade`].
    pub fn masquerade(&self, node: &str, oif: &str) {
        ok(self.0.masquerade(node, oif));
    }

    /// See [`node_diag_testbed::Topology::drop_forwarded_frag_needed`].
    pub fn drop_forwarded_frag_needed(&self, node: &str) {
        ok(self.0.drop_forwarded_frag_needed(node));
    }

    /// See [`node_diag_testbed::Topology::route_service_range`].
    pub fn route_service_range(&self, node: &str) {
        ok(self.0.route_service_range(node));
    }

    /// See [`node_diag_testbed::Topology::dnat`].
    pub fn dnat(&self, node: &str, from: SocketAddrV4, to: SocketAddrV4) {
        ok(self.0.dnat(node, from, to));
    }

    /// See [`node_diag_testbed::Topology::remove_forward_rules`].
    pub fn remove_forward_rules(&self, node: &str) {
        ok(self.0.remove_forward_rules(node));
    }

    /// See [`node_diag_testbed::Topology::set_pod_mtu`].
    pub fn set_pod_mtu(&self, mtu: u32) {
        ok(self.0.set_pod_mtu(mtu));
    }

    /// See [`node_diag_testbed::Topology::drop_frag_needed`].
    pub fn drop_frag_needed(&self, node: &str) {
        ok(self.0.drop_frag_needed(node));
    }

    /// See [`node_diag_testbed::pod_ipv6::add_to`].
    pub fn add_pod_ipv6(&self) {
        ok(node_diag_testbed::pod_ipv6::add_to(&self.0));
    }

    /// See [`node_diag_testbed::Topology::delete_pod_route`].
    pub fn delete_pod_route(&self, node: &str, pod_ip: Ipv4Addr) {
        ok(self.0.delete_pod_route(node, pod_ip));
    }

    /// See [`node_diag_testbed::Topology::set_link_mtu`].
    pub fn set_link_mtu(&self, netns: &str, dev: &str, mtu: u32) {
        ok(self.0.set_link_mtu(netns, dev, mtu));
    }

    /// See [`node_diag_testbed::Topology::ping_until`].
    pub fn ping_until(&self, from: &str, to: Ipv4Addr, timeout: Duration) -> bool {
        ok(self.0.ping_until(from, to, timeout))
    }
}

impl Default for Topology {
    fn default() -> Topology {
        Topology::new()
    }
}

/// Runs `f` on a thread inside network namespace `netns` and returns its result.
pub fn in_netns<T: Send>(netns: &str, f: impl FnOnce() -> T + Send) -> T {
    ok(node_diag_testbed::in_netns(netns, f))
}

/// Starts `f` on a thread inside network namespace `netns`; join the handle for its
/// result (a thread that cannot enter `netns` panics).
pub fn spawn_in_netns<T, F>(netns: &str, f: F) -> JoinHandle<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let ns = netns.to_owned();
    ok(std::thread::Builder::new().spawn(move || ok(node_diag_testbed::in_netns(&ns, f))))
}

/// An HTTP response: status code and body.
pub type HttpResponse = (u16, String);

/// `GET path` on `addr` (e.g. `"127.0.0.1:9090"`) from inside `netns`, with
/// `Connection: close`. Panics on any failure but the status.
pub fn http_get(netns: &str, addr: &str, path: &str) -> HttpResponse {
    let response = ok(node_diag_testbed::http::get(netns, addr, path, None));
    (response.status, response.body)
}

/// Commands that panic (showing stdout and stderr) when they cannot run or fail.
pub mod cmd {
    use std::process::Output;

    use node_diag_testbed::cmd;

    use crate::ok;

    /// Runs `argv` and returns its output whatever its exit status.
    pub fn try_run(argv: &[&str]) -> Output {
        ok(cmd::try_run(argv))
    }

    /// Runs `argv` and returns its stdout; panics unless it exits 0.
    pub fn run(argv: &[&str]) -> String {
        ok(cmd::run(argv))
    }

    /// Runs `argv` inside network namespace `netns`; see [`try_run`].
    pub fn try_run_in(netns: &str, argv: &[&str]) -> Output {
        ok(cmd::try_run_in(netns, argv))
    }

    /// Runs `argv` inside network namespace `netns`; see [`run`].
    pub fn run_in(netns: &str, argv: &[&str]) -> String {
        ok(cmd::run_in(netns, argv))
    }
}

/// kube-proxy's rules for a Service, installed into a namespace; see
/// [`node_diag_testbed::kube_proxy`]. Each panics (with the command's output) on failure.
pub mod kube_proxy {
    pub use node_diag_testbed::kube_proxy::{IptablesBackend, Protocol, ServiceSpec};

    use node_diag_testbed::kube_proxy;

    use crate::ok;

    /// See [`kube_proxy::install_iptables_service`].
    pub fn install_iptables_service(netns: &str, backend: IptablesBackend, svc: &ServiceSpec) {
        ok(kube_proxy::install_iptables_service(netns, backend, svc));
    }

    /// See [`kube_proxy::install_nftables_service`].
    pub fn install_nftables_service(netns: &str, svc: &ServiceSpec) {
        ok(kube_proxy::install_nftables_service(netns, svc));
    }

    /// See [`kube_proxy::remove_kube_proxy_rules`].
    pub fn remove_kube_proxy_rules(netns: &str) {
        ok(kube_proxy::remove_kube_proxy_rules(netns));
    }
}

/// Child processes with deadlines.
pub mod process {
    use std::process::Command;
    use std::time::Duration;

    pub use node_diag_testbed::process::{CapturedRun, send_signal, wait_timeout};

    /// Runs `command` with captured output, killed after `timeout`; panics when it
    /// cannot be started.
    pub fn run_with_timeout(command: &mut Command, timeout: Duration) -> CapturedRun {
        crate::ok(node_diag_testbed::process::run_with_timeout(
            command, timeout,
        ))
    }
}
