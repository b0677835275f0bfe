//! Interface inventory: a [`Snapshot`] of every interface of the agent's network
//! namespace and of each pod namespace attached to it by a veth, with what the MTU model
//! needs: kind, MTU, the lower device and the underlays of tunnels (one per way out to
//! their endpoints), the tunnel family, the MTU metrics of the routes through each
//! interface, veth peers, and each namespace's PMTUD sysctls.
//!
//! Each namespace is read from inside it (`read_here`), the pod ones from a short-lived
//! thread that joined them (`namespaces::in_netns`): netlink sockets belong to the
//! namespace they are opened in, and `/proc/sys/net` shows the namespace of whoever opens
//! it. `assemble` then joins the reads: names the devices tunnels sit on and pairs the
//! two ends of each veth across namespaces.

use std::{
    collections::HashMap,
    fs,
    path::Path,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tracing::{debug, warn};

use super::{
    fdb,
    interfaces::{
        DeviceRef, Interface, LinkKind, Namespace, RouteMetrics, Snapshot, Sysctls, Underlay,
        VethPeer,
    },
    links::{self, Link},
    namespaces::{self, NetnsFile, in_each_netns},
    routes::{self, FibLookup, RouteEntry},
    rtnetlink::NetlinkError,
    underlay::{self, RawUnderlay, resolve_underlays, tunnel_family},
    wireguard,
};

/// One namespace as read from inside it.
#[derive(Clone)]
struct Raw {
    links: Vec<Link>,
    sysctls: Sysctls,
    /// Tunnel ifindex → its ways out.
    underlays: HashMap<u32, Vec<RawUnderlay>>,
    /// Interface ifindex → the MTU metrics of the routes through it that leave its link.
    routes: HashMap<u32, Vec<RouteMetrics>>,
}

/// Snapshot of the calling thread's namespace and the pod namespaces attached to it.
/// Blocking (netlink round trips, one thread per pod namespace): call it from a blocking
/// context (`spawn_blocking` in the agent). Only a failure to read the agent's own
/// namespace is an error; an unreadable pod namespace is recorded in its `error`.
pub(crate) fn snapshot() -> Result<Snapshot, NetlinkError> {
    snapshot_of(None, PodReads::Fresh)
}

/// Whether a pod namespace's last read may stand in for reading it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PodReads {
    /// Every pod namespace is read.
    Fresh,
    /// A pod namespace read less than [`KEPT_FOR`] ago whose veths on this side are as
    /// they were then, and from which no link notification came since, is not read
    /// again. For rebuilds asked by link notifications: on a node whose interfaces
    /// churn, entering each of 110 pods' namespaces on every rebuild was most of the
    /// agent's cost. What changes inside a pod without a link notification (a route's
    /// MTU, a sysctl) waits for the periodic, fresh, rebuild.
    Reuse,
}

/// How long a pod namespace's read may stand in for a new one ([`PodReads::Reuse`]).
const KEPT_FOR: Duration = Duration::from_secs(10);

/// A pod namespace's last read, with this namespace's links towards it and the
/// notifications counted from it at the time.
struct Kept {
    at: Instant,
    towards: Vec<Link>,
    notices: (u64, u64),
    raw: Raw,
}

/// Link notifications that came from inside other namespaces, by the id ours gives each
/// (the link monitor counts them, see [`pod_notified`]).
static POD_NOTICES: Mutex<Option<HashMap<i32, u64>>> = Mutex::new(None);
/// Notifications lost, or from a namespace we give no id: no kept read stands.
static ANY_NOTICES: AtomicU64 = AtomicU64::new(0);

/// A link notification came from inside the namespace our namespace calls `nsid`
/// (`None`: from one unknown, or notifications were lost): its kept read no longer
/// stands.
pub(crate) fn pod_notified(nsid: Option<i32>) {
    match nsid {
        Some(id) => {
            *POD_NOTICES
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get_or_insert_with(HashMap::new)
                .entry(id)
                .or_default() += 1;
        }
        None => {
            ANY_NOTICES.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// The notifications counted so far for the namespace of id `nsid`.
fn notices(nsid: i32) -> (u64, u64) {
    let any = ANY_NOTICES.load(Ordering::Acquire);
    let own = POD_NOTICES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .and_then(|m| m.get(&nsid).copied())
        .unwrap_or(0);
    (any, own)
}

/// The pod namespaces' last reads, by the inode of the namespace they were read from
/// (the agent's; a test's own) and their own.
static KEPT: Mutex<Option<HashMap<(u32, u32), Kept>>> = Mutex::new(None);

/// This namespace's links whose peer is in the namespace of id `nsid`: a change to
/// any of them (MTU, state, a veth added or gone) has the pod namespace read again.
fn links_towards(links: &[Link], nsid: i32) -> Vec<Link> {
    links
        .iter()
        .filter(|l| l.link_netnsid == Some(nsid))
        .cloned()
        .collect()
}

/// [`snapshot`], with the agent's namespace's links given (`own_links`: as its link
/// notifications left them, see `monitor::LinkTable`) rather than dumped again, and
/// the pods' namespaces read as `pods` says; the rest (routes, FDB entries) is read as
/// ever.
pub(crate) fn snapshot_of(
    own_links: Option<Vec<Link>>,
    pods: PodReads,
) -> Result<Snapshot, NetlinkError> {
    let own = namespaces::netns_inode(Path::new("/proc/thread-self/ns/net"))
        .or_else(|| namespaces::netns_inode(Path::new("/proc/self/ns/net")))
        .unwrap_or(0);
    let own_raw = match own_links {
        Some(links) => read_links_here(links)?,
        None => read_here()?,
    };
    let own_name = own_name(own);
    let mut peers = namespaces::veth_peer_namespaces(&own_raw.links)?;
    peers.retain(|(_, f)| f.inode != own);
    peers.sort_by(|a, b| a.1.name.cmp(&b.1.name));

    let mut namespaces = vec![Namespace {
        inode: own,
        name: own_name,
        own: true,
        sysctls: own_raw.sysctls,
        error: None,
    }];
    let towards: Vec<Vec<Link>> = peers
        .iter()
        .map(|(nsid, _)| links_towards(&own_raw.links, *nsid))
        .collect();
    let mut kept = KEPT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let kept = kept.get_or_insert_with(HashMap::new);
    let mine: Vec<(u32, u32)> = kept
        .keys()
        .filter(|(from, _)| *from == own)
        .copied()
        .collect();
    let mut last: HashMap<u32, Kept> = mine
        .into_iter()
        .filter_map(|key| Some((key.1, kept.remove(&key)?)))
        .collect();
    let now = Instant::now();
    // Counted before the reads: a notification during one has the next rebuild read again.
    let counted: Vec<(u64, u64)> = peers.iter().map(|(nsid, _)| notices(*nsid)).collect();
    // The reads that stand, taken out of the last ones; `None`: to be read.
    let mut reads: Vec<Option<Result<Kept, String>>> = peers
        .iter()
        .zip(&towards)
        .zip(&counted)
        .map(|(((_, file), towards), counted)| {
            let k = last.remove(&file.inode)?;
            let stands = pods == PodReads::Reuse
                && now.duration_since(k.at) < KEPT_FOR
                && k.towards == *towards
                && k.notices == *counted;
            stands.then_some(Ok(k))
        })
        .collect();
    let to_read: Vec<NetnsFile> = peers
        .iter()
        .zip(&reads)
        .filter(|(_, read)| read.is_none())
        .map(|((_, f), _)| f.clone())
        .collect();
    let mut fresh = in_each_netns(&to_read, read_here).into_iter();
    for ((read, towards), counted) in reads.iter_mut().zip(&towards).zip(&counted) {
        if read.is_some() {
            continue;
        }
        *read = Some(match fresh.next() {
            Some(Ok(Ok(raw))) => Ok(Kept {
                at: now,
                towards: towards.clone(),
                notices: *counted,
                raw,
            }),
            Some(Ok(Err(e))) => Err(e.to_string()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("not read".to_string()),
        });
    }
    let mut raws = vec![own_raw];
    let mut nsid_to_inode = HashMap::new();
    // Only the namespaces still attached are kept: those gone are forgotten.
    let mut still: HashMap<u32, Kept> = HashMap::new();
    for ((nsid, file), read) in peers.into_iter().zip(reads) {
        nsid_to_inode.insert(nsid, file.inode);
        let (raw, error) = match read {
            Some(Ok(k)) => {
                let raw = k.raw.clone();
                still.insert(file.inode, k);
                (raw, None)
            }
            Some(Err(e)) => (Raw::empty(), Some(e)),
            None => (Raw::empty(), Some("not read".to_string())),
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
    kept.extend(still.into_iter().map(|(inode, k)| ((own, inode), k)));
    Ok(assemble(namespaces, raws, &nsid_to_inode))
}

/// The name of the namespace with inode `own` (see [`NetnsFile::name`]), found by a scan
/// of `/run/netns` and `/proc` once and kept: it is the agent's own, refreshed on every
/// link notification, and the scan costs what the node's processes are.
fn own_name(own: u32) -> String {
    static NAME: std::sync::Mutex<Option<(u32, String)>> = std::sync::Mutex::new(None);
    let mut name = NAME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match name.as_ref() {
        Some((inode, n)) if *inode == own => n.clone(),
        _ => {
            let found = namespaces::namespace_files()
                .into_iter()
                .find(|f| f.inode == own)
                .map_or_else(|| own.to_string(), |f| f.name);
            *name = Some((own, found.clone()));
            found
        }
    }
}

impl Raw {
    fn empty() -> Self {
        Self {
            links: Vec::new(),
            sysctls: Sysctls::default(),
            underlays: HashMap::new(),
            routes: HashMap::new(),
        }
    }
}

/// The calling thread's namespace's ephemeral port range
/// (`net.ipv4.ip_local_port_range`), or the kernel's default when unreadable.
pub(crate) fn local_port_range() -> std::ops::RangeInclusive<u16> {
    const DEFAULT: std::ops::RangeInclusive<u16> = 32768..=60999;
    let Ok(text) = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range") else {
        return DEFAULT;
    };
    let mut bounds = text.split_whitespace().map(str::parse::<u16>);
    match (bounds.next(), bounds.next()) {
        (Some(Ok(low)), Some(Ok(high))) if low <= high => low..=high,
        _ => DEFAULT,
    }
}

fn read_sysctl(name: &str) -> Option<u32> {
    fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The routes that leave their link, grouped per interface by their MTU metrics, in
/// dump order.
fn route_metrics(routes: &[RouteEntry]) -> HashMap<u32, Vec<RouteMetrics>> {
    let mut out: HashMap<u32, Vec<RouteMetrics>> = HashMap::new();
    for r in routes.iter().filter(|r| r.leaves_the_link()) {
        let mut oifs: Vec<u32> = r.hops.iter().map(|h| h.oif).collect();
        oifs.sort_unstable();
        oifs.dedup();
        for oif in oifs {
            let groups = out.entry(oif).or_default();
            match groups
                .iter_mut()
                .find(|g| g.family == r.family && g.mtu == r.mtu && g.advmss == r.advmss)
            {
                Some(g) => g.routes += 1,
                None => groups.push(RouteMetrics {
                    route: r.to_string(),
                    family: r.family,
                    mtu: r.mtu,
                    advmss: r.advmss,
                    routes: 1,
                }),
            }
        }
    }
    out
}

/// Reads the calling thread's namespace.
fn read_here() -> Result<Raw, NetlinkError> {
    read_links_here(links::links()?)
}

/// Reads the calling thread's namespace, whose links are `links`.
fn read_links_here(links: Vec<Link>) -> Result<Raw, NetlinkError> {
    let sysctls = Sysctls {
        ip_no_pmtu_disc: read_sysctl("ip_no_pmtu_disc"),
        tcp_mtu_probing: read_sysctl("tcp_mtu_probing"),
    };
    let routes = routes::routes()?;
    let kinds: Vec<(&Link, LinkKind)> = links
        .iter()
        .map(|l| (l, LinkKind::from_kernel(l.kind.as_deref(), l.link_type)))
        .collect();
    // Only what some tunnel here needs is read: an FDB dump for VXLANs that may have
    // per-peer entries, a generic netlink query per WireGuard device.
    let needs_fdb = kinds
        .iter()
        .any(|(l, k)| *k == LinkKind::Vxlan && !l.tunnel.as_ref().is_some_and(|t| t.external));
    let fdb = if needs_fdb {
        fdb::fdb_destinations().unwrap_or_else(|e| {
            debug!(error = %e, "FDB dump failed; VXLAN peers unknown");
            Vec::new()
        })
    } else {
        Vec::new()
    };
    let mut wg = HashMap::new();
    for (l, _) in kinds.iter().filter(|(_, k)| *k == LinkKind::Wireguard) {
        match wireguard::device(l.index) {
            Ok(Some(dev)) => {
                wg.insert(l.index, dev);
            }
            Ok(None) => {}
            Err(e) => debug!(device = %l.name, error = %e, "WireGuard peers unreadable"),
        }
    }
    let ns = underlay::Namespace {
        links: &links,
        routes: &routes,
        fdb: &fdb,
        wireguard: &wg,
    };
    let lookup = FibLookup::new()?;
    let mut underlays = HashMap::new();
    for (link, kind) in kinds.iter().filter(|(_, k)| k.is_tunnel()) {
        let tunnel = link.tunnel.clone().unwrap_or_default();
        let ways = resolve_underlays(link, kind, &tunnel, &ns, &lookup);
        if !ways.is_empty() {
            underlays.insert(link.index, ways);
        }
    }
    let routes = route_metrics(&routes);
    Ok(Raw {
        links,
        sysctls,
        underlays,
        routes,
    })
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
            let underlays = raw
                .underlays
                .get(&l.index)
                .into_iter()
                .flatten()
                .filter_map(|w| {
                    device(raw, w.ifindex).map(|d| Underlay {
                        ifindex: d.ifindex,
                        name: d.name,
                        mtu: d.mtu,
                        source: w.source,
                        endpoint: w.endpoint,
                        endpoints: w.endpoints,
                        route: w.route.clone(),
                        route_mtu: w.route_mtu,
                        learned_mtu: w.learned.map(|l| l.mtu),
                        learned_expires_secs: w.learned.map(|l| l.expires_secs),
                        learned_endpoints: w.learned_endpoints.clone(),
                    })
                })
                .collect();
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
                underlays,
                routes: raw.routes.get(&l.index).cloned().unwrap_or_default(),
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

#[cfg(test)]
mod tests {
    use std::{process::Command, thread, time::Duration, time::Instant};

    use super::*;
    use crate::host_network::{
        in_netns,
        interfaces::{Family, UnderlaySource},
        monitor::{current_links, is_stale, watch},
    };

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

    /// A rebuild asked by the node's link notifications reuses a pod namespace's recent
    /// read, so a change inside the pod waits for the periodic (fresh) one; a change of
    /// the node's side of the pod's veth has the pod read again at once.
    #[test]
    fn pod_reads_reused_only_while_the_node_side_is_unchanged() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 || Command::new("ip").arg("-V").output().is_err() {
            eprintln!("skipped: needs root and iproute2");
            return;
        }
        let tag = std::process::id() % 100_000;
        let (node, pod) = (format!("mtur{tag}n"), format!("mtur{tag}p"));
        let _guard = Netns(vec![node.clone(), pod.clone()]);
        for n in [&node, &pod] {
            ip(&format!("netns add {n}"));
        }
        ip(&format!(
            "-n {node} link add veth1 type veth peer name eth0 netns {pod}"
        ));
        ip(&format!("-n {node} link set veth1 up"));
        ip(&format!("-n {pod} link set eth0 up"));
        let node_file = NetnsFile {
            inode: namespaces::netns_inode(Path::new(&format!("/run/netns/{node}"))).unwrap(),
            path: format!("/run/netns/{node}").into(),
            name: node.clone(),
        };
        let pod_mtu = |pods: PodReads| {
            let snap = in_netns(&node_file, || snapshot_of(None, pods).expect("snapshot"))
                .expect("enter node namespace");
            snap.interfaces
                .iter()
                .find(|i| i.name == "eth0" && i.netns != snap.own_netns)
                .map(|i| i.mtu)
        };
        assert_eq!(pod_mtu(PodReads::Fresh), Some(1500));
        ip(&format!("-n {pod} link set eth0 mtu 1400"));
        assert_eq!(
            pod_mtu(PodReads::Reuse),
            Some(1500),
            "the recent read stands"
        );
        assert_eq!(pod_mtu(PodReads::Fresh), Some(1400));
        ip(&format!("-n {pod} link set eth0 mtu 1300"));
        ip(&format!("-n {node} link set veth1 mtu 1300"));
        assert_eq!(
            pod_mtu(PodReads::Reuse),
            Some(1300),
            "the node's side changed: the pod is read again"
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
        // SAFETY: geteuid has no preconditions and cannot fail.
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
        // Routes and FDB entries: a VXLAN without a remote whose peer is an FDB entry, one
        // whose peer's network has a route `mtu`, and the pod's routes (its default route
        // with metrics, the router's host route that leaves no link).
        ip(&format!(
            "-n {node} link add vxf type vxlan id 44 dstport 4791"
        ));
        sh(&format!(
            "ip netns exec {node} bridge fdb append 00:00:00:00:00:00 dev vxf dst 10.78.0.2"
        ));
        ip(&format!(
            "-n {node} route add 10.79.0.0/24 dev ul0 mtu 1400"
        ));
        ip(&format!(
            "-n {node} link add vxr type vxlan id 45 dstport 4792"
        ));
        sh(&format!(
            "ip netns exec {node} bridge fdb append 00:00:00:00:00:00 dev vxr dst 10.79.0.5"
        ));
        ip(&format!("-n {node} link set vxf mtu 1450 up"));
        ip(&format!("-n {node} link set vxr mtu 1350 up"));
        ip(&format!("-n {pod} addr add 10.244.1.7/32 dev eth0"));
        ip(&format!(
            "-n {pod} route add 169.254.1.1 dev eth0 scope link"
        ));
        ip(&format!(
            "-n {pod} route add default via 169.254.1.1 dev eth0 mtu 1500 advmss 1410"
        ));

        let node_file = NetnsFile {
            inode: namespaces::netns_inode(Path::new(&format!("/run/netns/{node}"))).unwrap(),
            path: format!("/run/netns/{node}").into(),
            name: node.clone(),
        };
        let (snap, changes, table) = in_netns(&node_file, || {
            let snap = snapshot().expect("snapshot");
            let watch = watch().expect("watch");
            let table = watch.links.expect("a link table");
            // The first look dumps (from inside the node), then the table is trusted.
            let dumped = current_links(&table).expect("first look");
            assert!(dumped.iter().any(|l| l.name == "vxu"), "{dumped:?}");
            (snap, watch.changes, table)
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
        let u = &vx0.underlays[0];
        assert_eq!(
            (u.name.as_str(), u.mtu, u.source),
            ("ul0", 1500, UnderlaySource::Bound)
        );
        let vxu = get(&node, "vxu");
        assert_eq!(vxu.lower, None);
        let u = &vxu.underlays[0];
        assert_eq!(
            (u.name.as_str(), u.source),
            ("ul0", UnderlaySource::RouteToRemote)
        );
        let vxf = get(&node, "vxf");
        let u = &vxf.underlays[0];
        assert_eq!(
            (u.name.as_str(), u.source, u.endpoint, u.route_mtu),
            (
                "ul0",
                UnderlaySource::RouteToFdbDestination,
                Some("10.78.0.2".parse().unwrap()),
                None
            )
        );
        let u = &get(&node, "vxr").underlays[0];
        assert_eq!(
            (u.route.as_deref(), u.route_mtu, u.path_mtu()),
            (Some("10.79.0.0/24"), Some(1400), 1400),
            "the route's mtu, from a FIB match (no cached exception)"
        );
        let eth0 = get(&pod, "eth0");
        assert_eq!(eth0.routes.len(), 1, "{:?}", eth0.routes);
        let r = &eth0.routes[0];
        assert_eq!(
            (r.route.as_str(), r.mtu, r.advmss),
            ("default via 169.254.1.1", Some(1500), Some(1410))
        );
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

        let findings = crate::mtu::Model::from(&snap).findings(std::time::SystemTime::now());
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
        // The table follows the notifications: from this thread (outside the node) it
        // answers without a dump, which would list this namespace's links instead.
        let link = |name: &str| {
            current_links(&table)
                .expect("table")
                .into_iter()
                .find(|l| l.name == name)
        };
        assert_eq!(link("vxu").and_then(|l| l.mtu), Some(1450));
        ip(&format!("-n {node} link add tbla type veth peer name tblb"));
        assert!(notified(&mut changes), "no notification for a new veth");
        thread::sleep(Duration::from_millis(100));
        let a = link("tbla").expect("a new link is in the table");
        assert_eq!(a.kind.as_deref(), Some("veth"));
        assert!(link("tblb").is_some());
        ip(&format!("-n {node} link del tbla"));
        assert!(notified(&mut changes), "no notification for a deleted veth");
        thread::sleep(Duration::from_millis(100));
        assert!(link("tbla").is_none() && link("tblb").is_none());
        assert!(!is_stale(&table));
        // A veth's end moved out: the end left behind changed without a notification
        // of its own, so the table is dumped again before it is trusted.
        ip(&format!("-n {node} link add tblc type veth peer name tbld"));
        assert!(notified(&mut changes));
        ip(&format!("-n {node} link set tbld netns {pod}"));
        assert!(notified(&mut changes), "no notification for a moved link");
        thread::sleep(Duration::from_millis(100));
        assert!(is_stale(&table), "a moved link makes the table stale");
        thread::sleep(Duration::from_millis(100));
        while changes.try_recv().is_ok() {}
        ip(&format!("-n {pod} link set eth0 mtu 1450"));
        assert!(
            notified(&mut changes),
            "no notification for the pod's MTU change"
        );
    }
}
