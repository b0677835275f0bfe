//! Network namespaces: finding them (named ones and every process's, once each by inode),
//! the ids our namespace gives them (which is how a veth names its peer's namespace),
//! which of them make up this node ([`local_scope`]: the agent's own and every pod
//! namespace attached to it by a veth), and running code inside one ([`in_netns`]).

use std::{
    collections::{BTreeSet, HashSet},
    fs::{self, File},
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    thread,
    time::{Duration, Instant},
};

use netlink_packet_route::{
    RouteNetlinkMessage,
    nsid::{NsidAttribute, NsidMessage},
};
use netlink_sys::Socket;

use super::{
    links::{Link, links},
    rtnetlink::{NetlinkError, request, socket},
};

#[derive(Debug, thiserror::Error)]
pub(crate) enum NetnsError {
    #[error("network namespace {path}: {source}")]
    Enter {
        path: String,
        source: std::io::Error,
    },
    #[error("network namespace {0} changed while it was opened")]
    Gone(String),
    #[error("no network namespace with inode {0}")]
    Unknown(u32),
    #[error("thread: {0}")]
    Thread(std::io::Error),
    #[error("namespace reader thread panicked")]
    Panicked,
    #[error("{0}")]
    Failed(String),
}

/// The id our namespace uses for the namespace behind `fd`, if one is assigned.
fn nsid_of(sock: &Socket, fd: u32) -> Result<Option<i32>, NetlinkError> {
    let mut msg = NsidMessage::default();
    msg.attributes.push(NsidAttribute::Fd(fd));
    let replies = request(sock, RouteNetlinkMessage::GetNsId(msg), 0)?;
    Ok(replies.into_iter().find_map(|m| match m {
        RouteNetlinkMessage::NewNsId(n) => n.attributes.into_iter().find_map(|a| match a {
            NsidAttribute::Id(id) if id >= 0 => Some(id),
            _ => None,
        }),
        _ => None,
    }))
}

/// Inode of a network namespace file.
pub(crate) fn netns_inode(path: &Path) -> Option<u32> {
    fs::metadata(path).ok().map(|m| m.ino() as u32)
}

/// Network namespace files worth considering: named ones (`ip netns`, CNI plugins) and
/// every process's.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["/run/netns", "/var/run/netns"] {
        if let Ok(rd) = fs::read_dir(dir) {
            let mut named: Vec<_> = rd.flatten().map(|e| e.path()).collect();
            named.sort();
            out.extend(named);
        }
    }
    if let Ok(rd) = fs::read_dir("/proc") {
        let mut pids: Vec<u32> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        // Lowest pid first: a namespace is then named after its first process (a pod's
        // pause container, the host's init).
        pids.sort_unstable();
        out.extend(
            pids.into_iter()
                .map(|p| PathBuf::from(format!("/proc/{p}/ns/net"))),
        );
    }
    out
}

/// A network namespace found on this kernel, with a file that pins it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NetnsFile {
    pub(crate) inode: u32,
    pub(crate) path: PathBuf,
    /// Its `/run/netns` name if it has one, `host` for init's namespace, else `pid:N` of
    /// its lowest pid.
    pub(crate) name: String,
}

/// Every network namespace reachable through `/run/netns`, `/var/run/netns` or a
/// process, once each (by inode).
pub(crate) fn namespace_files() -> Vec<NetnsFile> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    // The node's own namespace is init's: call it that rather than after some pid.
    let host = netns_inode(Path::new("/proc/1/ns/net"));
    for path in candidates() {
        let Some(inode) = netns_inode(&path) else {
            continue;
        };
        if !seen.insert(inode) {
            continue;
        }
        let name = if Some(inode) == host {
            Some("host".to_string())
        } else if path.starts_with("/proc") {
            path.parent()
                .and_then(Path::parent)
                .and_then(Path::file_name)
                .map(|p| format!("pid:{}", p.to_string_lossy()))
        } else {
            path.file_name().map(|n| n.to_string_lossy().into_owned())
        }
        .unwrap_or_else(|| inode.to_string());
        out.push(NetnsFile { inode, path, name });
    }
    out
}

/// The namespaces holding the peer of one of `links`' veths (the calling thread's
/// links; it must be in the agent's namespace, whose ids [`PEERS`] holds), each with the
/// id our namespace gives it, from the files earlier looks found (see [`PeerFiles`]).
pub(crate) fn veth_peer_namespaces(links: &[Link]) -> Result<Vec<(i32, NetnsFile)>, NetlinkError> {
    let mut peers: Vec<(i32, NetnsFile)> = PEERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .resolve(&veth_peer_ids(links))?
        .into_iter()
        .collect();
    peers.sort_by_key(|(id, _)| *id);
    Ok(peers)
}

/// The ids our namespace gives the namespaces of `links`' veth peers: every caller of
/// [`PeerFiles::resolve`] asks for the same set, so one's answer stays the other's cache.
fn veth_peer_ids(links: &[Link]) -> HashSet<i32> {
    links
        .iter()
        .filter(|l| l.kind.as_deref() == Some("veth"))
        .filter_map(|l| l.link_netnsid)
        .collect()
}

/// The pods' veths among `links` (this namespace's side), each with the namespace its
/// peer is in: veths whose peer is in a namespace this process can see (a pod's), except
/// veths a tunnel is bound to (an underlay to another node). A veth whose peer it cannot
/// see (a kind node's `eth0`, whose peer is the host's) is not a pod's.
fn pod_veth_peers(links: &[Link]) -> Result<Vec<(u32, NetnsFile)>, NetlinkError> {
    let underlays: HashSet<u32> = links
        .iter()
        .filter_map(|l| l.tunnel.as_ref()?.bound_to)
        .collect();
    let veths: Vec<&Link> = links
        .iter()
        .filter(|l| {
            l.kind.as_deref() == Some("veth")
                && l.link_netnsid.is_some()
                && !underlays.contains(&l.index)
        })
        .collect();
    if veths.is_empty() {
        return Ok(Vec::new());
    }
    let peers = PEERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .resolve(&veth_peer_ids(links))?;
    Ok(veths
        .iter()
        .filter_map(|l| Some((l.index, peers.get(&l.link_netnsid?)?.clone())))
        .collect())
}

/// The namespaces of veth peers found so far, by the id ours gives them.
static PEERS: std::sync::Mutex<PeerFiles> = std::sync::Mutex::new(PeerFiles {
    known: None,
    checked: None,
});

/// Namespace-id notifications seen (`RTM_NEWNSID`, `RTM_DELNSID`, or notifications
/// lost): an id our namespace gives is taken back only when its namespace dies, which
/// the kernel announces, so while this stands still the ids already resolved name the
/// same namespaces.
static NSID_CHANGES: AtomicU64 = AtomicU64::new(0);
/// Whether the link monitor follows namespace-id notifications (else every refresh
/// checks every id).
static NSID_FOLLOWED: AtomicBool = AtomicBool::new(false);
/// Even with notifications, each id is checked again this often: a pinning file may
/// stop pinning (its process gone) while the namespace lives on.
const RECHECK_IDS: Duration = Duration::from_secs(10);

/// The link monitor saw a namespace get or lose an id in ours (or lost notifications).
pub(crate) fn nsid_changed() {
    NSID_CHANGES.fetch_add(1, Ordering::AcqRel);
}

/// Whether namespace-id notifications are followed (see [`nsid_changed`]).
pub(crate) fn follow_nsids(followed: bool) {
    NSID_FOLLOWED.store(followed, Ordering::Release);
    nsid_changed();
}

/// The file pinning each namespace that holds a veth's peer (a pod's, or another node's
/// underlay), by the id our namespace gives it, as found by earlier refreshes of the scope
/// and of the MTU model: a refresh checks each (one netlink request) and scans `/proc` and
/// `/run/netns` only for an id none of them has, so following a node's pods costs what
/// they are, not what its processes are.
/// With notifications followed, ids are checked only after one came (or every
/// [`RECHECK_IDS`]): a churning node refreshes its scope several times a second, and
/// checking each of 110 pods' ids on every refresh was most of what that cost.
struct PeerFiles {
    known: Option<std::collections::HashMap<i32, NetnsFile>>,
    /// When every known id was last checked, and the notification count then.
    checked: Option<(Instant, u64)>,
}

impl PeerFiles {
    /// The files of the namespaces with the ids `wanted`, those found.
    fn resolve(
        &mut self,
        wanted: &HashSet<i32>,
    ) -> Result<std::collections::HashMap<i32, NetnsFile>, NetlinkError> {
        let sock = socket()?;
        // Read before the check: a notification during it has the next refresh check.
        let changes = NSID_CHANGES.load(Ordering::Acquire);
        let trusted = NSID_FOLLOWED.load(Ordering::Acquire)
            && self
                .checked
                .is_some_and(|(at, seen)| seen == changes && at.elapsed() < RECHECK_IDS);
        let known = self.known.get_or_insert_with(Default::default);
        if trusted {
            known.retain(|id, _| wanted.contains(id));
        } else {
            // A namespace gone, or its id now another's (ids are reused), is found anew.
            known.retain(|id, f| wanted.contains(id) && still_has(&sock, f, *id));
            self.checked = Some((Instant::now(), changes));
        }
        let missing: HashSet<i32> = wanted
            .iter()
            .filter(|id| !known.contains_key(id))
            .copied()
            .collect();
        if !missing.is_empty() {
            let own = netns_inode(Path::new("/proc/self/ns/net")).unwrap_or(0);
            let files: Vec<_> = namespace_files()
                .into_iter()
                .filter(|f| f.inode != own)
                .collect();
            known.extend(ids_of(&sock, &files, &missing));
        }
        Ok(known.clone())
    }
}

/// Whether `file` still pins the namespace our namespace calls `id`.
fn still_has(sock: &Socket, file: &NetnsFile, id: i32) -> bool {
    let Ok(fd) = fs::File::open(&file.path) else {
        return false;
    };
    fd.metadata().map(|m| m.ino() as u32).ok() == Some(file.inode)
        && matches!(nsid_of(sock, fd.as_raw_fd() as u32), Ok(Some(got)) if got == id)
}

/// The namespaces among `files` our namespace gives one of the ids `wanted`, each once;
/// the scan stops once every id is found.
fn ids_of(sock: &Socket, files: &[NetnsFile], wanted: &HashSet<i32>) -> Vec<(i32, NetnsFile)> {
    let mut out: Vec<(i32, NetnsFile)> = Vec::new();
    for f in files {
        if out.len() == wanted.len() {
            break;
        }
        let Ok(file) = fs::File::open(&f.path) else {
            continue;
        };
        if let Ok(Some(id)) = nsid_of(sock, file.as_raw_fd() as u32)
            && wanted.contains(&id)
            && !out.iter().any(|(seen, _)| *seen == id)
        {
            out.push((id, f.clone()));
        }
    }
    out
}

/// The interface indices of the pods' veths among `links` (see [`pod_veth_peers`]).
pub(crate) fn pod_veths(links: &[Link]) -> Result<HashSet<u32>, NetlinkError> {
    Ok(pod_veth_peers(links)?
        .into_iter()
        .map(|(index, _)| index)
        .collect())
}

/// This node as the agent's namespace sees it, from one listing of its links and the
/// pod namespaces' files (see [`PeerFiles`]): what the scope refresh and the TC sync both need.
#[derive(Debug)]
pub(crate) struct LocalNode {
    /// The agent's namespace's links.
    pub(crate) links: Vec<Link>,
    /// The pods' veths among them (see [`pod_veths`]).
    pub(crate) pod_veths: HashSet<u32>,
    /// The network namespaces this node's agent reports for (by inode): its own, and
    /// each namespace holding the peer of one of its pods' veths.
    pub(crate) scope: BTreeSet<u32>,
    /// The agent's own namespace (inode; 0 when unreadable).
    pub(crate) own: u32,
    /// Each pod veth (ifindex, this namespace's side) with its pod's namespace (inode).
    pub(crate) pod_links: Vec<(u32, u32)>,
    /// A file pinning each pod namespace of the scope, once each.
    pub(crate) pod_files: Vec<NetnsFile>,
}

/// Looks at this node once (see [`LocalNode`]).
pub(crate) fn local_node() -> Result<LocalNode, NetlinkError> {
    local_node_from(links()?)
}

/// This node from `links`, the agent's namespace's links as a dump or the notifications
/// left them (see [`LocalNode`]).
pub(crate) fn local_node_from(links: Vec<Link>) -> Result<LocalNode, NetlinkError> {
    let peers = pod_veth_peers(&links)?;
    tracing::trace!(
        veths = ?links.iter().filter(|l| l.kind.as_deref() == Some("veth")).map(|l| (l.index, l.name.clone(), l.link_netnsid)).collect::<Vec<_>>(),
        peers = ?peers.iter().map(|(i, f)| (*i, f.inode)).collect::<Vec<_>>(),
        "local node"
    );
    let own = netns_inode(Path::new("/proc/self/ns/net")).unwrap_or(0);
    let mut scope = BTreeSet::from([own]);
    scope.extend(peers.iter().map(|(_, f)| f.inode));
    let mut pod_files: Vec<NetnsFile> = Vec::new();
    for (_, f) in &peers {
        if f.inode != own && !pod_files.iter().any(|p| p.inode == f.inode) {
            pod_files.push(f.clone());
        }
    }
    Ok(LocalNode {
        pod_files,
        pod_veths: peers.iter().map(|(index, _)| *index).collect(),
        pod_links: peers.iter().map(|(index, f)| (*index, f.inode)).collect(),
        own,
        scope,
        links,
    })
}

/// Moves the calling thread into the namespace pinned by `file`, once the file is seen
/// to pin it still: a /proc/<pid> entry may now belong to another process than when it
/// was listed. Only for threads of this module's own, which exit when done.
fn enter(file: &NetnsFile) -> Result<(), NetnsError> {
    let path = || file.path.display().to_string();
    let fd = File::open(&file.path).map_err(|source| NetnsError::Enter {
        path: path(),
        source,
    })?;
    if fd.metadata().map(|m| m.ino() as u32).ok() != Some(file.inode) {
        return Err(NetnsError::Gone(path()));
    }
    // SAFETY: `fd` is an open namespace file; CLONE_NEWNET only moves the calling
    // thread, a fresh one of [`in_netns`] or [`in_each_netns`] that exits after its work.
    if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(NetnsError::Enter {
            path: path(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Runs `f` on a fresh thread inside the namespace pinned by `file`.
pub(crate) fn in_netns<T: Send>(
    file: &NetnsFile,
    f: impl FnOnce() -> T + Send,
) -> Result<T, NetnsError> {
    thread::scope(|s| {
        let handle = thread::Builder::new()
            .name("netns-reader".into())
            .spawn_scoped(s, || {
                enter(file)?;
                Ok(f())
            })
            .map_err(NetnsError::Thread)?;
        handle.join().map_err(|_| NetnsError::Panicked)?
    })
}

/// Runs `f` inside each namespace of `files` in turn, from one fresh thread that enters
/// them one after the other: a thread for each costs more than the reads themselves on
/// a node with a hundred pods. The answers come in `files`' order; a namespace that
/// cannot be entered is an error in its place, the others still read.
pub(crate) fn in_each_netns<T: Send>(
    files: &[NetnsFile],
    f: impl Fn() -> T + Sync,
) -> Vec<Result<T, NetnsError>> {
    let enter_all = || {
        files
            .iter()
            .map(|file| {
                enter(file)?;
                Ok(f())
            })
            .collect::<Vec<_>>()
    };
    if files.is_empty() {
        return Vec::new();
    }
    let joined = thread::scope(|s| {
        thread::Builder::new()
            .name("netns-reader".into())
            .spawn_scoped(s, enter_all)
            .map_err(NetnsError::Thread)?
            .join()
            .map_err(|_| NetnsError::Panicked)
    });
    match joined {
        Ok(all) => all,
        Err(e) => {
            let why = e.to_string();
            files
                .iter()
                .map(|_| Err(NetnsError::Failed(why.clone())))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_namespace_is_in_scope() {
        let own = netns_inode(Path::new("/proc/self/ns/net")).unwrap();
        let node = local_node().unwrap();
        assert!(node.scope.contains(&own));
        // A pod's veth is a link of this namespace.
        assert!(
            node.pod_veths
                .iter()
                .all(|i| node.links.iter().any(|l| l.index == *i))
        );
    }
}
