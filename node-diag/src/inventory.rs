//! Interface inventory: a snapshot of every interface of the agent's network namespace
//! and of each pod namespace attached to it by a veth, with what the MTU model needs:
//! kind, MTU, the lower or underlay device of tunnels, the tunnel family, veth peers,
//! and each namespace's PMTUD sysctls. Plus a watcher of link notifications, so the
//! agent re-snapshots when an MTU changes or a pod appears instead of waiting for its
//! next periodic pass.
//!
//! Another namespace is read from a short-lived thread that first joins it with
//! `setns(CLONE_NEWNET)`: a thread's namespace change does not affect the rest of the
//! process, netlink sockets belong to the namespace they are opened in, and
//! `/proc/sys/net` shows the namespace of whoever opens it. The thread is never reused.

use std::{
    collections::HashMap,
    fs::{self, File},
    net::IpAddr,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::Path,
    thread,
    time::Duration,
};

use serde::{Serialize, Serializer};
use tracing::{debug, warn};

use crate::netlink::{self, Link, NetlinkError, NetnsFile, Tunnel};

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("network namespace {path}: {source}")]
    Netns {
        path: String,
        source: std::io::Error,
    },
    #[error("network namespace {0} changed while it was opened")]
    NetnsGone(String),
    #[error("thread: {0}")]
    Thread(std::io::Error),
    #[error("namespace reader thread panicked")]
    Panicked,
}

/// `ARPHRD_LOOPBACK`.
const ARPHRD_LOOPBACK: u16 = 772;

/// What an interface is, from the kernel's `IFLA_INFO_KIND`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LinkKind {
    Loopback,
    /// No kind: a real (or virtio, ENA…) NIC.
    Physical,
    Veth,
    Bridge,
    Vxlan,
    Geneve,
    Wireguard,
    /// IPv4 in IPv4.
    Ipip,
    /// IPv6 in IPv4.
    Sit,
    /// IPv4 or IPv6 in IPv6.
    Ip6tnl,
    Gre,
    Gretap,
    Ip6gre,
    Ip6gretap,
    Vlan,
    Macvlan,
    Ipvlan,
    Bond,
    Tun,
    Dummy,
    /// Any other kernel kind, by its kernel name.
    Other(String),
}

impl LinkKind {
    pub fn from_kernel(kind: Option<&str>, link_type: u16) -> Self {
        match kind {
            None if link_type == ARPHRD_LOOPBACK => Self::Loopback,
            None => Self::Physical,
            Some(k) => match k {
                "veth" => Self::Veth,
                "bridge" => Self::Bridge,
                "vxlan" => Self::Vxlan,
                "geneve" => Self::Geneve,
                "wireguard" => Self::Wireguard,
                "ipip" => Self::Ipip,
                "sit" => Self::Sit,
                "ip6tnl" => Self::Ip6tnl,
                "gre" => Self::Gre,
                "gretap" => Self::Gretap,
                "ip6gre" => Self::Ip6gre,
                "ip6gretap" => Self::Ip6gretap,
                "vlan" => Self::Vlan,
                "macvlan" => Self::Macvlan,
                "ipvlan" => Self::Ipvlan,
                "bond" => Self::Bond,
                "tun" => Self::Tun,
                "dummy" => Self::Dummy,
                other => Self::Other(other.to_string()),
            },
        }
    }

    /// The snake_case name used in output and metrics labels.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Loopback => "loopback",
            Self::Physical => "physical",
            Self::Veth => "veth",
            Self::Bridge => "bridge",
            Self::Vxlan => "vxlan",
            Self::Geneve => "geneve",
            Self::Wireguard => "wireguard",
            Self::Ipip => "ipip",
            Self::Sit => "sit",
            Self::Ip6tnl => "ip6tnl",
            Self::Gre => "gre",
            Self::Gretap => "gretap",
            Self::Ip6gre => "ip6gre",
            Self::Ip6gretap => "ip6gretap",
            Self::Vlan => "vlan",
            Self::Macvlan => "macvlan",
            Self::Ipvlan => "ipvlan",
            Self::Bond => "bond",
            Self::Tun => "tun",
            Self::Dummy => "dummy",
            Self::Other(s) => s,
        }
    }

    /// Encapsulating devices: the overlays whose overhead the MTU model knows.
    pub fn is_tunnel(&self) -> bool {
        matches!(
            self,
            Self::Vxlan
                | Self::Geneve
                | Self::Wireguard
                | Self::Ipip
                | Self::Sit
                | Self::Ip6tnl
                | Self::Gre
                | Self::Gretap
                | Self::Ip6gre
                | Self::Ip6gretap
        )
    }
}

impl std::fmt::Display for LinkKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// A plain string (not serde's `{"other": ...}`), so every kind reads the same in JSON.
impl Serialize for LinkKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Address family of a tunnel's outer (underlay) header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(a: IpAddr) -> Self {
        if a.is_ipv4() { Self::V4 } else { Self::V6 }
    }
}

/// A device in the same namespace, by index, with its name and MTU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceRef {
    pub ifindex: u32,
    pub name: String,
    pub mtu: u32,
}

/// How a tunnel's underlay device was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnderlaySource {
    /// The tunnel is bound to it (`dev` at creation: `IFLA_VXLAN_LINK`, `IFLA_*_LINK`).
    Bound,
    /// The route the kernel picks to the tunnel's remote (or multicast group).
    RouteToRemote,
    /// The device holding the tunnel's local address.
    LocalAddress,
    /// The device of the default route (no remote, no local: metadata mode, WireGuard).
    DefaultRoute,
    /// The largest-MTU physical interface that is up, as a last resort.
    LargestPhysical,
}

/// The device a tunnel's encapsulated packets leave by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Underlay {
    pub ifindex: u32,
    pub name: String,
    pub mtu: u32,
    pub source: UnderlaySource,
}

/// The other end of a veth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VethPeer {
    /// The peer's namespace (inode), when it is one of the snapshot's.
    pub netns: Option<u32>,
    pub netns_name: Option<String>,
    pub ifindex: u32,
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interface {
    /// Inode of the interface's network namespace.
    pub netns: u32,
    pub netns_name: String,
    pub name: String,
    pub ifindex: u32,
    pub kind: LinkKind,
    pub mtu: u32,
    pub up: bool,
    /// The device this one sits on (`IFLA_LINK`, or the device a tunnel is bound to).
    pub lower: Option<DeviceRef>,
    /// For tunnels: the device encapsulated packets leave by (bound, or found by route).
    pub underlay: Option<Underlay>,
    /// For tunnels: their configuration.
    pub tunnel: Option<Tunnel>,
    /// For tunnels: the outer header's family, when the configuration tells it.
    pub remote_family: Option<Family>,
    pub veth_peer: Option<VethPeer>,
}

/// The namespace's PMTUD sysctls (`None`: unreadable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Sysctls {
    pub ip_no_pmtu_disc: Option<u32>,
    pub tcp_mtu_probing: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Namespace {
    pub inode: u32,
    /// Its `/run/netns` name, `host` for init's namespace, else `pid:N`, else the inode.
    pub name: String,
    /// The agent's own namespace (the node's, for a hostNetwork agent).
    pub own: bool,
    pub sysctls: Sysctls,
    /// Why this namespace could not be read; it then has no interfaces.
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    pub own_netns: u32,
    /// The agent's namespace first, then pod namespaces by name.
    pub namespaces: Vec<Namespace>,
    /// In namespace order, then by ifindex.
    pub interfaces: Vec<Interface>,
}

/// One namespace as read from inside it.
struct Raw {
    links: Vec<Link>,
    sysctls: Sysctls,
    /// Tunnel ifindex → its underlay's ifindex and how it was found.
    underlays: HashMap<u32, (u32, UnderlaySource)>,
}

/// Snapshot of the calling thread's namespace and the pod namespaces attached to it.
/// Blocking (netlink round trips, one thread per pod namespace): call it from a blocking
/// context (`spawn_blocking` in the agent). Only a failure to read the agent's own
/// namespace is an error; an unreadable pod namespace is recorded in its `error`.
pub fn snapshot() -> Result<Snapshot, InventoryError> {
    let own = netlink::netns_inode(Path::new("/proc/thread-self/ns/net"))
        .or_else(|| netlink::netns_inode(Path::new("/proc/self/ns/net")))
        .unwrap_or(0);
    let own_raw = read_here()?;
    let files = netlink::namespace_files();
    let own_name = files
        .iter()
        .find(|f| f.inode == own)
        .map_or_else(|| own.to_string(), |f| f.name.clone());
    let others: Vec<NetnsFile> = files.into_iter().filter(|f| f.inode != own).collect();
    let mut peers = netlink::veth_peer_namespaces(&own_raw.links, &others)?;
    peers.sort_by(|a, b| a.1.name.cmp(&b.1.name));

    let mut namespaces = vec![Namespace {
        inode: own,
        name: own_name,
        own: true,
        sysctls: own_raw.sysctls,
        error: None,
    }];
    let mut raws = vec![own_raw];
    let mut nsid_to_inode = HashMap::new();
    for (nsid, file) in peers {
        nsid_to_inode.insert(nsid, file.inode);
        let (raw, error) = match in_netns(&file, read_here) {
            Ok(Ok(raw)) => (raw, None),
            Ok(Err(e)) => (Raw::empty(), Some(e.to_string())),
            Err(e) => (Raw::empty(), Some(e.to_string())),
        };
        if let Some(e) = &error {
            warn!(netns = %file.name, error = %e, "cannot read a pod network namespace");
        }
        namespaces.push(Namespace {
            inode: file.inode,
            name: file.name,
            own: false,
            sysctls: raw.sysctls,
            error,
        });
        raws.push(raw);
    }
    Ok(assemble(namespaces, raws, &nsid_to_inode))
}

impl Raw {
    fn empty() -> Self {
        Self {
            links: Vec::new(),
            sysctls: Sysctls::default(),
            underlays: HashMap::new(),
        }
    }
}

/// Runs `f` on a fresh thread inside the namespace pinned by `file`.
fn in_netns<T: Send>(file: &NetnsFile, f: impl FnOnce() -> T + Send) -> Result<T, InventoryError> {
    let path = file.path.display().to_string();
    let fd = File::open(&file.path).map_err(|source| InventoryError::Netns {
        path: path.clone(),
        source,
    })?;
    // A /proc/<pid> entry may now belong to another process than when it was listed.
    if fd.metadata().map(|m| m.ino() as u32).ok() != Some(file.inode) {
        return Err(InventoryError::NetnsGone(path));
    }
    thread::scope(|s| {
        let handle = thread::Builder::new()
            .name("netns-reader".into())
            .spawn_scoped(s, || {
                // SAFETY: `fd` is an open namespace file; CLONE_NEWNET only moves this
                // thread, which exits when `f` returns.
                if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(InventoryError::Netns {
                        path: path.clone(),
                        source: std::io::Error::last_os_error(),
                    });
                }
                Ok(f())
            })
            .map_err(InventoryError::Thread)?;
        handle.join().map_err(|_| InventoryError::Panicked)?
    })
}

fn read_sysctl(name: &str) -> Option<u32> {
    fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Reads the calling thread's namespace.
fn read_here() -> Result<Raw, NetlinkError> {
    let links = netlink::links()?;
    let sysctls = Sysctls {
        ip_no_pmtu_disc: read_sysctl("ip_no_pmtu_disc"),
        tcp_mtu_probing: read_sysctl("tcp_mtu_probing"),
    };
    let mut underlays = HashMap::new();
    for link in &links {
        let kind = LinkKind::from_kernel(link.kind.as_deref(), link.link_type);
        if !kind.is_tunnel() {
            continue;
        }
        let tunnel = link.tunnel.clone().unwrap_or_default();
        if let Some(u) = resolve_underlay(link, &kind, &tunnel, &links) {
            underlays.insert(link.index, u);
        }
    }
    Ok(Raw {
        links,
        sysctls,
        underlays,
    })
}

/// The outer header's family: fixed by the kind for IP tunnels, else told by the
/// configured remote or local address.
pub(crate) fn tunnel_family(kind: &LinkKind, t: &Tunnel) -> Option<Family> {
    match kind {
        LinkKind::Ipip | LinkKind::Sit | LinkKind::Gre | LinkKind::Gretap => Some(Family::V4),
        LinkKind::Ip6tnl | LinkKind::Ip6gre | LinkKind::Ip6gretap => Some(Family::V6),
        _ => t.remote.or(t.local).map(Family::of),
    }
}

/// Where a tunnel's encapsulated packets leave: its bound device; else the route to its
/// remote (what the kernel itself uses per packet); else the device holding its local
/// address; else the default route's device; else the largest-MTU physical interface.
fn resolve_underlay(
    link: &Link,
    kind: &LinkKind,
    t: &Tunnel,
    links: &[Link],
) -> Option<(u32, UnderlaySource)> {
    // Created in another namespace and moved here: its bound device and routes live
    // there, out of reach from this one.
    if link.link_netnsid.is_some() {
        return None;
    }
    if let Some(dev) = t.bound_to.or(link.link) {
        return Some((dev, UnderlaySource::Bound));
    }
    // A route through the tunnel itself or to a local address says nothing about the
    // wire.
    let usable = |oif: u32| {
        oif != link.index
            && links
                .iter()
                .any(|l| l.index == oif && l.link_type != ARPHRD_LOOPBACK)
    };
    let lookup = |what: &str, r: Result<Option<u32>, NetlinkError>| match r {
        Ok(Some(oif)) if usable(oif) => Some(oif),
        Ok(_) => None,
        Err(e) => {
            debug!(tunnel = %link.name, error = %e, "{what} lookup failed");
            None
        }
    };
    if let Some(remote) = t.remote
        && let Some(oif) = lookup("route", netlink::route_oif(remote))
    {
        return Some((oif, UnderlaySource::RouteToRemote));
    }
    if let Some(local) = t.local
        && let Some(oif) = lookup("address", netlink::address_owner(local))
    {
        return Some((oif, UnderlaySource::LocalAddress));
    }
    let v6 = tunnel_family(kind, t) == Some(Family::V6);
    if let Some(oif) = lookup("default route", netlink::default_route_oif(v6)) {
        return Some((oif, UnderlaySource::DefaultRoute));
    }
    links
        .iter()
        .filter(|l| l.kind.is_none() && l.link_type != ARPHRD_LOOPBACK && l.up)
        .max_by_key(|l| (l.mtu.unwrap_or(0), std::cmp::Reverse(l.index)))
        .map(|l| (l.index, UnderlaySource::LargestPhysical))
}

/// Joins the per-namespace reads: names the devices tunnels sit on and pairs veth ends.
fn assemble(
    namespaces: Vec<Namespace>,
    raws: Vec<Raw>,
    nsid_to_inode: &HashMap<i32, u32>,
) -> Snapshot {
    let own = namespaces[0].inode;
    // Node-side veth ends, by the (namespace, ifindex) of their pod-side peer.
    let mut node_end = HashMap::new();
    for l in &raws[0].links {
        if l.kind.as_deref() == Some("veth")
            && let (Some(id), Some(peer)) = (l.link_netnsid, l.link)
            && let Some(&ns) = nsid_to_inode.get(&id)
        {
            node_end.insert((ns, peer), l.index);
        }
    }
    let joined = Joined {
        own,
        namespaces: &namespaces,
        raws: &raws,
        nsid_to_inode,
        node_end,
    };

    let mut interfaces = Vec::new();
    for (pos, (ns, raw)) in namespaces.iter().zip(&raws).enumerate() {
        let mut links: Vec<&Link> = raw.links.iter().collect();
        links.sort_by_key(|l| l.index);
        for l in links {
            let kind = LinkKind::from_kernel(l.kind.as_deref(), l.link_type);
            let tunnel_cfg = kind
                .is_tunnel()
                .then(|| l.tunnel.clone().unwrap_or_default());
            let lower = if kind == LinkKind::Veth || l.link_netnsid.is_some() {
                None
            } else {
                tunnel_cfg
                    .as_ref()
                    .and_then(|t| t.bound_to)
                    .or(l.link)
                    .and_then(|i| device(raw, i))
            };
            let underlay = raw.underlays.get(&l.index).and_then(|&(idx, source)| {
                device(raw, idx).map(|d| Underlay {
                    ifindex: d.ifindex,
                    name: d.name,
                    mtu: d.mtu,
                    source,
                })
            });
            let veth_peer = if kind == LinkKind::Veth {
                joined.veth_peer(pos, l)
            } else {
                None
            };
            interfaces.push(Interface {
                netns: ns.inode,
                netns_name: ns.name.clone(),
                name: l.name.clone(),
                ifindex: l.index,
                mtu: l.mtu.unwrap_or(0),
                up: l.up,
                lower,
                underlay,
                remote_family: tunnel_cfg.as_ref().and_then(|t| tunnel_family(&kind, t)),
                tunnel: tunnel_cfg,
                veth_peer,
                kind,
            });
        }
    }
    Snapshot {
        own_netns: own,
        namespaces,
        interfaces,
    }
}

fn device(raw: &Raw, idx: u32) -> Option<DeviceRef> {
    raw.links
        .iter()
        .find(|l| l.index == idx)
        .map(|l| DeviceRef {
            ifindex: l.index,
            name: l.name.clone(),
            mtu: l.mtu.unwrap_or(0),
        })
}

/// Every namespace's read, for resolving links that cross namespaces.
struct Joined<'a> {
    own: u32,
    namespaces: &'a [Namespace],
    raws: &'a [Raw],
    nsid_to_inode: &'a HashMap<i32, u32>,
    /// Node-side veth ifindex by its pod-side peer's (namespace, ifindex).
    node_end: HashMap<(u32, u32), u32>,
}

impl Joined<'_> {
    fn peer_in(&self, inode: u32, ifindex: u32) -> VethPeer {
        let pos = self.namespaces.iter().position(|n| n.inode == inode);
        VethPeer {
            netns: Some(inode),
            netns_name: pos.map(|p| self.namespaces[p].name.clone()),
            ifindex,
            name: pos.and_then(|p| {
                self.raws[p]
                    .links
                    .iter()
                    .find(|l| l.index == ifindex)
                    .map(|l| l.name.clone())
            }),
        }
    }

    /// The other end of veth `l` of the namespace at `pos`.
    fn veth_peer(&self, pos: usize, l: &Link) -> Option<VethPeer> {
        let ns = self.namespaces[pos].inode;
        if ns != self.own
            && let Some(&node) = self.node_end.get(&(ns, l.index))
        {
            return Some(self.peer_in(self.own, node));
        }
        let peer = l.link?;
        let unmapped = VethPeer {
            netns: None,
            netns_name: None,
            ifindex: peer,
            name: None,
        };
        Some(match l.link_netnsid {
            // Both ends in this namespace.
            None => self.peer_in(ns, peer),
            Some(id) if ns == self.own => match self.nsid_to_inode.get(&id) {
                Some(&peer_ns) => self.peer_in(peer_ns, peer),
                None => unmapped,
            },
            // A pod's veth to something other than the node: its namespace ids are the
            // pod's own, which this snapshot does not map.
            Some(_) => unmapped,
        })
    }
}

/// Link notifications of the agent's namespace (and, where the kernel allows it, of the
/// namespaces with an id in it, which includes veth-attached pods): each `()` means
/// "links changed since you last looked; re-snapshot". Bursts coalesce into one message.
/// The watching thread stops once the receiver is dropped (within a second); the
/// channel closes if notifications fail, leaving the agent's periodic snapshots.
#[allow(
    dead_code,
    reason = "the agent's re-snapshot trigger; the mtu subcommand takes one snapshot"
)]
pub fn watch() -> Result<tokio::sync::mpsc::Receiver<()>, InventoryError> {
    let monitor = netlink::LinkMonitor::new(Duration::from_secs(1))?;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    thread::Builder::new()
        .name("link-watch".into())
        .spawn(move || {
            loop {
                match monitor.wait() {
                    Ok(true) => {
                        if let Err(tokio::sync::mpsc::error::TrySendError::Closed(())) =
                            tx.try_send(())
                        {
                            return;
                        }
                    }
                    Ok(false) => {}
                    Err(e) => {
                        warn!(error = %e, "link notifications failed; relying on periodic snapshots");
                        return;
                    }
                }
                if tx.is_closed() {
                    return;
                }
            }
        })
        .map_err(InventoryError::Thread)?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use std::{process::Command, time::Instant};

    use super::*;

    #[test]
    fn kinds_from_the_kernel() {
        assert_eq!(
            LinkKind::from_kernel(None, ARPHRD_LOOPBACK),
            LinkKind::Loopback
        );
        assert_eq!(LinkKind::from_kernel(None, 1), LinkKind::Physical);
        assert_eq!(LinkKind::from_kernel(Some("ip6gre"), 823), LinkKind::Ip6gre);
        let other = LinkKind::from_kernel(Some("nlmon"), 824);
        assert_eq!(serde_json::to_value(&other).unwrap(), "nlmon");
        assert_eq!(
            serde_json::to_value(LinkKind::Wireguard).unwrap(),
            "wireguard"
        );
        assert!(LinkKind::Ip6tnl.is_tunnel() && !LinkKind::Veth.is_tunnel());
        assert_eq!(serde_json::to_value(Family::V6).unwrap(), "v6");
    }

    #[test]
    fn snapshot_of_this_namespace() {
        let snap = snapshot().expect("snapshot");
        assert!(snap.namespaces[0].own);
        assert!(
            snap.interfaces
                .iter()
                .any(|i| i.kind == LinkKind::Loopback && i.netns == snap.own_netns),
            "{snap:#?}"
        );
    }

    /// Named namespaces built with `ip`, deleted on drop.
    struct Netns(Vec<String>);

    impl Drop for Netns {
        fn drop(&mut self) {
            for n in &self.0 {
                let _ = Command::new("ip").args(["netns", "del", n]).status();
            }
        }
    }

    fn ip(args: &str) {
        let ok = Command::new("ip")
            .args(args.split_whitespace())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip {args}");
    }

    fn sh(cmd: &str) {
        let ok = Command::new("sh")
            .args(["-c", cmd])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "{cmd}");
    }

    /// A node namespace with an underlay veth to a peer "node", a bound vxlan, an unbound
    /// one forced to 1500, and a pod at 1500 with PMTUD disabled; read from inside the
    /// node namespace like the agent reads its own. Needs root (skipped otherwise).
    #[test]
    fn live_node_with_vxlan_and_pod() {
        if unsafe { libc::geteuid() } != 0 || Command::new("ip").arg("-V").output().is_err() {
            eprintln!("skipped: needs root and iproute2");
            return;
        }
        let tag = std::process::id() % 100_000;
        let (node, far, pod) = (
            format!("mtuu{tag}n"),
            format!("mtuu{tag}f"),
            format!("mtuu{tag}p"),
        );
        let _guard = Netns(vec![node.clone(), far.clone(), pod.clone()]);
        for n in [&node, &far, &pod] {
            ip(&format!("netns add {n}"));
        }
        ip(&format!(
            "-n {node} link add ul0 type veth peer name ul1 netns {far}"
        ));
        ip(&format!("-n {node} addr add 10.78.0.1/24 dev ul0"));
        ip(&format!("-n {node} link set ul0 up"));
        ip(&format!("-n {far} link set ul1 up"));
        ip(&format!(
            "-n {node} link add vx0 type vxlan id 42 remote 10.78.0.2 dev ul0 dstport 4789"
        ));
        ip(&format!(
            "-n {node} link add vxu type vxlan id 43 remote 10.78.0.2 dstport 4790"
        ));
        ip(&format!("-n {node} link set vxu mtu 1500"));
        ip(&format!(
            "-n {node} link add veth1 type veth peer name eth0 netns {pod}"
        ));
        for (n, dev) in [
            (&node, "vx0"),
            (&node, "vxu"),
            (&node, "veth1"),
            (&pod, "eth0"),
        ] {
            ip(&format!("-n {n} link set {dev} up"));
        }
        sh(&format!(
            "ip netns exec {pod} sysctl -qw net.ipv4.ip_no_pmtu_disc=1"
        ));

        let node_file = NetnsFile {
            inode: netlink::netns_inode(Path::new(&format!("/run/netns/{node}"))).unwrap(),
            path: format!("/run/netns/{node}").into(),
            name: node.clone(),
        };
        let (snap, changes) = in_netns(&node_file, || {
            let snap = snapshot().expect("snapshot");
            let rx = watch().expect("watch");
            (snap, rx)
        })
        .expect("enter node namespace");

        assert_eq!(snap.namespaces[0].name, node);
        let names: Vec<_> = snap.namespaces.iter().map(|n| n.name.as_str()).collect();
        assert!(names.contains(&pod.as_str()), "{names:?}");
        let get = |ns: &str, name: &str| {
            snap.interfaces
                .iter()
                .find(|i| i.netns_name == ns && i.name == name)
                .unwrap_or_else(|| panic!("{ns}/{name} missing: {snap:#?}"))
        };
        let vx0 = get(&node, "vx0");
        assert_eq!(vx0.kind, LinkKind::Vxlan);
        assert_eq!(vx0.mtu, 1450);
        assert_eq!(vx0.remote_family, Some(Family::V4));
        assert_eq!(vx0.lower.as_ref().map(|l| l.name.as_str()), Some("ul0"));
        let u = vx0.underlay.as_ref().unwrap();
        assert_eq!(
            (u.name.as_str(), u.mtu, u.source),
            ("ul0", 1500, UnderlaySource::Bound)
        );
        let vxu = get(&node, "vxu");
        assert_eq!(vxu.lower, None);
        let u = vxu.underlay.as_ref().unwrap();
        assert_eq!(
            (u.name.as_str(), u.source),
            ("ul0", UnderlaySource::RouteToRemote)
        );
        let eth0 = get(&pod, "eth0");
        let p = eth0.veth_peer.as_ref().unwrap();
        assert_eq!(
            (p.netns, p.name.as_deref()),
            (Some(snap.own_netns), Some("veth1"))
        );
        let p = get(&node, "veth1").veth_peer.as_ref().unwrap();
        assert_eq!(
            (p.netns_name.as_deref(), p.name.as_deref()),
            (Some(pod.as_str()), Some("eth0"))
        );
        let pod_ns = snap.namespaces.iter().find(|n| n.name == pod).unwrap();
        assert_eq!(pod_ns.sysctls.ip_no_pmtu_disc, Some(1));
        assert_eq!(snap.namespaces[0].sysctls.ip_no_pmtu_disc, Some(0));

        let findings = crate::mtu::findings(&snap, std::time::SystemTime::now());
        let about: Vec<_> = findings
            .iter()
            .map(|f| (f.kind.as_str(), f.interface.clone().unwrap_or_default()))
            .collect();
        for want in [
            ("overlay_mtu_mismatch", "vxu"),
            ("overlay_mtu_mismatch", "veth1"),
            ("overlay_mtu_mismatch", "eth0"),
            ("pmtud_disabled", ""),
        ] {
            assert!(
                about.contains(&(want.0, want.1.to_string())),
                "{want:?} not in {about:?}"
            );
        }
        assert_eq!(about.len(), 4, "{about:?}");

        // MTU changes are notified: the node's own, and a pod's (through its nsid).
        let mut changes = changes;
        let notified = |rx: &mut tokio::sync::mpsc::Receiver<()>| {
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until {
                if rx.try_recv().is_ok() {
                    return true;
                }
                thread::sleep(Duration::from_millis(20));
            }
            false
        };
        while changes.try_recv().is_ok() {}
        ip(&format!("-n {node} link set vxu mtu 1450"));
        assert!(
            notified(&mut changes),
            "no notification for the node's MTU change"
        );
        thread::sleep(Duration::from_millis(100));
        while changes.try_recv().is_ok() {}
        ip(&format!("-n {pod} link set eth0 mtu 1450"));
        assert!(
            notified(&mut changes),
            "no notification for the pod's MTU change"
        );
    }
}
