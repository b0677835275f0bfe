//! The integration tests' topology, self-contained: two nodes joined by an underlay veth
//! and a vxlan overlay, one pod per node.
//!
//! ```text
//!  pod A (10.244.1.7/32)                                   pod B (10.244.2.9/32)
//!   eth0 mtu 1450                                            eth0 mtu 1450
//!     |  default via 169.254.1.1 onlink                        |
//!   vpod0 169.254.1.1/32                                     vpod0 169.254.1.1/32
//!  node A   vx0 10.200.0.1/32 (vxlan 42) ======= vx0 10.200.0.2/32   node B
//!           ul0 192.168.77.1/24 ---- underlay veth ---- ul0 192.168.77.2/24
//! ```
//!
//! Every namespace is owned by a [`Netns`] guard: dropping the [`Topology`] (also when
//! unwinding from an error or after Ctrl-C) deletes the namespaces and with them every
//! device and route inside.

use std::{
    fs::File,
    net::Ipv4Addr,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

const UNDERLAY_IF: &str = "ul0";
const VXLAN_IF: &str = "vx0";
const POD_HOST_IF: &str = "vpod0";
const POD_IF: &str = "eth0";
const POD_MTU: &str = "1450";

/// The four namespaces and the addresses the workloads use.
pub struct Topology {
    pub node_a: String,
    pub node_b: String,
    pub pod_a: String,
    pub pod_b: String,
    pub node_a_underlay: Ipv4Addr,
    pub pod_b_ip: Ipv4Addr,
    // Declared last: dropped after everything else, deletes the namespaces.
    _namespaces: Vec<Netns>,
}

struct NodeSide<'a> {
    node: &'a str,
    pod: &'a str,
    underlay: Ipv4Addr,
    peer_underlay: Ipv4Addr,
    overlay: Ipv4Addr,
    peer_overlay: Ipv4Addr,
    pod_ip: Ipv4Addr,
    peer_pod_cidr: &'a str,
}

const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

impl Topology {
    /// Builds the namespaces, devices and routes, and checks that pod A reaches pod B
    /// through the overlay. Names are `ndb-<pid>-{na,nb,pa,pb}`; those of a bench that
    /// died without cleaning up (its pid is gone) are deleted first.
    pub fn build() -> Result<Self> {
        remove_stale();
        let base = format!("{PREFIX}{}", std::process::id());
        let names = ["na", "nb", "pa", "pb"].map(|suffix| format!("{base}-{suffix}"));
        let mut namespaces = Vec::new();
        for name in &names {
            namespaces.push(Netns::create(name)?);
        }
        let [node_a, node_b, pod_a, pod_b] = names;
        let topo = Self {
            node_a,
            node_b,
            pod_a,
            pod_b,
            node_a_underlay: Ipv4Addr::new(192, 168, 77, 1),
            pod_b_ip: Ipv4Addr::new(10, 244, 2, 9),
            _namespaces: namespaces,
        };
        let node_b_underlay = Ipv4Addr::new(192, 168, 77, 2);
        let (node_a_overlay, node_b_overlay) =
            (Ipv4Addr::new(10, 200, 0, 1), Ipv4Addr::new(10, 200, 0, 2));
        let pod_a_ip = Ipv4Addr::new(10, 244, 1, 7);

        ip(&[
            "-n",
            &topo.node_a,
            "link",
            "add",
            UNDERLAY_IF,
            "type",
            "veth",
            "peer",
            "name",
            UNDERLAY_IF,
            "netns",
            &topo.node_b,
        ])?;
        setup_node(&NodeSide {
            node: &topo.node_a,
            pod: &topo.pod_a,
            underlay: topo.node_a_underlay,
            peer_underlay: node_b_underlay,
            overlay: node_a_overlay,
            peer_overlay: node_b_overlay,
            pod_ip: pod_a_ip,
            peer_pod_cidr: "10.244.2.0/24",
        })?;
        setup_node(&NodeSide {
            node: &topo.node_b,
            pod: &topo.pod_b,
            underlay: node_b_underlay,
            peer_underlay: topo.node_a_underlay,
            overlay: node_b_overlay,
            peer_overlay: node_a_overlay,
            pod_ip: topo.pod_b_ip,
            peer_pod_cidr: "10.244.1.0/24",
        })?;
        // Pod A opens tens of thousands of short connections: give it every port.
        sysctl_in(&topo.pod_a, "net.ipv4.ip_local_port_range=1024 65535")?;
        sysctl_in(&topo.pod_a, "net.ipv4.tcp_tw_reuse=1")?;

        for (from, to) in [
            (&topo.pod_a, topo.pod_b_ip),
            (&topo.node_b, topo.node_a_underlay),
        ] {
            ping_until(from, to, Duration::from_secs(5))?;
        }
        Ok(topo)
    }
}

/// Prefix of the bench's namespace names, followed by the bench's pid.
const PREFIX: &str = "ndb-";

/// Deletes the namespaces of benches that no longer run (killed before their cleanup).
fn remove_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            println!("[bench] deleting netns {name} left by a bench that died (pid {pid})");
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

fn setup_node(s: &NodeSide<'_>) -> Result<()> {
    let node = |args: &[&str]| {
        let mut argv = vec!["-n", s.node];
        argv.extend_from_slice(args);
        ip(&argv)
    };
    let pod = |args: &[&str]| {
        let mut argv = vec!["-n", s.pod];
        argv.extend_from_slice(args);
        ip(&argv)
    };
    let underlay_cidr = format!("{}/24", s.underlay);
    let (local, remote) = (s.underlay.to_string(), s.peer_underlay.to_string());
    let overlay_cidr = format!("{}/32", s.overlay);
    let gateway_cidr = format!("{GATEWAY}/32");
    let pod_cidr = format!("{}/32", s.pod_ip);
    let gateway = GATEWAY.to_string();
    let peer_overlay = s.peer_overlay.to_string();

    node(&["addr", "add", &underlay_cidr, "dev", UNDERLAY_IF])?;
    node(&["link", "set", UNDERLAY_IF, "mtu", "1500", "up"])?;
    // The kernel derives the vxlan MTU (1450) from `dev`.
    node(&[
        "link",
        "add",
        VXLAN_IF,
        "type",
        "vxlan",
        "id",
        "42",
        "local",
        &local,
        "remote",
        &remote,
        "dstport",
        "4789",
        "dev",
        UNDERLAY_IF,
    ])?;
    node(&["addr", "add", &overlay_cidr, "dev", VXLAN_IF])?;
    node(&["link", "set", VXLAN_IF, "up"])?;
    node(&[
        "link",
        "add",
        POD_HOST_IF,
        "type",
        "veth",
        "peer",
        "name",
        POD_IF,
        "netns",
        s.pod,
    ])?;
    node(&["addr", "add", &gateway_cidr, "dev", POD_HOST_IF])?;
    node(&["link", "set", POD_HOST_IF, "mtu", POD_MTU, "up"])?;
    pod(&["addr", "add", &pod_cidr, "dev", POD_IF])?;
    pod(&["link", "set", POD_IF, "mtu", POD_MTU, "up"])?;
    pod(&[
        "route", "add", "default", "via", &gateway, "dev", POD_IF, "onlink",
    ])?;
    node(&["route", "add", &pod_cidr, "dev", POD_HOST_IF])?;
    node(&[
        "route",
        "add",
        s.peer_pod_cidr,
        "via",
        &peer_overlay,
        "dev",
        VXLAN_IF,
        "onlink",
    ])?;
    sysctl_in(s.node, "net.ipv4.ip_forward=1")
}

fn ip(args: &[&str]) -> Result<()> {
    cmd::output(cmd::command("ip").args(args)).map(drop)
}

/// `ip netns exec <netns> <argv...>`.
pub fn exec_in(netns: &str, argv: &[&str]) -> Command {
    let mut command = cmd::command("ip");
    command.args(["netns", "exec", netns]).args(argv);
    command
}

fn sysctl_in(netns: &str, setting: &str) -> Result<()> {
    cmd::output(&mut exec_in(netns, &["sysctl", "-qw", setting])).map(drop)
}

/// Pings `to` from `from` once a second until it answers; fails after `timeout`.
fn ping_until(from: &str, to: Ipv4Addr, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let to = to.to_string();
    loop {
        let mut ping = exec_in(from, &["ping", "-n", "-q", "-c", "1", "-W", "1", &to]);
        let out = ping
            .output()
            .with_context(|| format!("failed to spawn `{}`", cmd::display(&ping)))?;
        if out.status.success() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("topology: {from} cannot ping {to} within {timeout:?}");
        }
    }
}

/// A named network namespace (`/run/netns/NAME`), deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    /// Creates `name` with loopback up; a leftover of the same name is deleted first.
    fn create(name: &str) -> Result<Self> {
        if netns_path(name).exists() {
            let _ = cmd::output(cmd::command("ip").args(["netns", "del", name]));
        }
        ip(&["netns", "add", name])?;
        let ns = Self {
            name: name.to_owned(),
        };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(err) = ip(&["netns", "del", &self.name]) {
            // Never panic in drop: it may run while unwinding.
            eprintln!(
                "[bench] warning: cannot delete netns {}: {err:#}",
                self.name
            );
        }
    }
}

fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Moves the calling thread into network namespace `name`; sockets it creates afterwards
/// belong to that namespace for their whole life.
pub fn enter(name: &str) -> Result<()> {
    let path = netns_path(name);
    let file = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: `file` is an open namespace descriptor for the duration of the call; setns
    // only changes the calling thread's namespace.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("setns({}, CLONE_NEWNET)", path.display()));
    }
    Ok(())
}

/// Runs `f` on a new thread inside network namespace `netns` and returns its result.
pub fn in_netns<T: Send>(netns: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    thread::scope(|scope| {
        thread::Builder::new()
            .name(format!("in-{netns}"))
            .spawn_scoped(scope, || {
                enter(netns)?;
                f()
            })
            .context("cannot spawn a thread")?
            .join()
            .unwrap_or_else(|payload| std::panic::resume_unwind(payload))
    })
}
