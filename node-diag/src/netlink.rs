//! rtnetlink access (no shelling out to `ip`): link dumps and network-namespace ids, used
//! to work out which network namespaces belong to this node: the agent's own and every
//! pod namespace attached to it by a veth.

use std::{
    collections::{BTreeSet, HashSet},
    fs,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::Path,
};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage},
    nsid::{NsidAttribute, NsidMessage},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("netlink: kernel answered error {0}")]
    Kernel(i32),
    #[error("netlink: undecodable message: {0}")]
    Decode(String),
}

/// A link as seen in the agent's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub kind: Option<String>,
    pub mtu: Option<u32>,
    /// ARPHRD_* link-layer type (1 Ethernet, 772 loopback, 65534 none, ...).
    pub link_type: u16,
    /// For veths and other cross-namespace links: the peer namespace's id in ours.
    pub link_netnsid: Option<i32>,
}

fn request(
    sock: &Socket,
    msg: RouteNetlinkMessage,
    flags: u16,
) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | flags;
    header.sequence_number = 1;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    packet.finalize();
    let mut buf = vec![0; packet.header.length as usize];
    packet.serialize(&mut buf);
    sock.send(&buf, 0)?;

    let mut out = Vec::new();
    loop {
        let (data, _) = sock.recv_from_full()?;
        let mut offset = 0;
        while offset < data.len() {
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..])
                .map_err(|e| NetlinkError::Decode(e.to_string()))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::InnerMessage(inner) => out.push(inner),
                NetlinkPayload::Done(_) => return Ok(out),
                NetlinkPayload::Error(e) => {
                    return match e.code {
                        None => Ok(out),
                        Some(code) => Err(NetlinkError::Kernel(code.get())),
                    };
                }
                _ => {}
            }
            if len == 0 {
                break;
            }
            offset += len;
        }
        if flags & NLM_F_DUMP == 0 {
            return Ok(out);
        }
    }
}

fn socket() -> Result<Socket, NetlinkError> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    Ok(sock)
}

/// Every link of the calling thread's network namespace.
pub fn links() -> Result<Vec<Link>, NetlinkError> {
    let sock = socket()?;
    let msgs = request(
        &sock,
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
        NLM_F_DUMP,
    )?;
    Ok(msgs
        .into_iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => Some(link_from(l)),
            _ => None,
        })
        .collect())
}

fn link_from(msg: LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        kind: None,
        mtu: None,
        link_type: u16::from(msg.header.link_layer_type),
        link_netnsid: None,
    };
    for attr in msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n,
            LinkAttribute::Mtu(m) => link.mtu = Some(m),
            LinkAttribute::LinkNetNsId(id) => link.link_netnsid = Some(id),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    if let LinkInfo::Kind(kind) = info {
                        link.kind = Some(kind_name(&kind));
                    }
                }
            }
            _ => {}
        }
    }
    link
}

fn kind_name(kind: &InfoKind) -> String {
    match kind {
        InfoKind::Other(s) => s.clone(),
        other => format!("{other:?}").to_ascii_lowercase(),
    }
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
pub fn netns_inode(path: &Path) -> Option<u32> {
    fs::metadata(path).ok().map(|m| m.ino() as u32)
}

/// Network namespace files worth considering: named ones (`ip netns`, CNI plugins) and
/// every process's.
fn candidates() -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for dir in ["/run/netns", "/var/run/netns"] {
        if let Ok(rd) = fs::read_dir(dir) {
            out.extend(rd.flatten().map(|e| e.path()));
        }
    }
    if let Ok(rd) = fs::read_dir("/proc") {
        out.extend(
            rd.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .bytes()
                        .all(|b| b.is_ascii_digit())
                })
                .map(|e| e.path().join("ns/net")),
        );
    }
    out
}

/// The network namespaces this node's agent reports for (by inode): its own, and each
/// namespace holding the peer of one of its veths.
pub fn local_scope() -> Result<BTreeSet<u32>, NetlinkError> {
    let own = netns_inode(Path::new("/proc/self/ns/net")).unwrap_or(0);
    let mut scope = BTreeSet::from([own]);
    let peer_ids: HashSet<i32> = links()?
        .into_iter()
        .filter(|l| l.kind.as_deref() == Some("veth"))
        .filter_map(|l| l.link_netnsid)
        .collect();
    if peer_ids.is_empty() {
        return Ok(scope);
    }
    let sock = socket()?;
    let mut seen = HashSet::from([own]);
    for path in candidates() {
        let Some(ino) = netns_inode(&path) else {
            continue;
        };
        if !seen.insert(ino) {
            continue;
        }
        let Ok(file) = fs::File::open(&path) else {
            continue;
        };
        if let Ok(Some(id)) = nsid_of(&sock, file.as_raw_fd() as u32)
            && peer_ids.contains(&id)
        {
            scope.insert(ino);
        }
    }
    Ok(scope)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_loopback() {
        // Every namespace has `lo`; netlink needs no privileges to dump links.
        let links = links().expect("link dump");
        assert!(
            links.iter().any(|l| l.name == "lo" && l.mtu.is_some()),
            "{links:?}"
        );
    }

    #[test]
    fn own_namespace_is_in_scope() {
        let own = netns_inode(Path::new("/proc/self/ns/net")).unwrap();
        assert!(local_scope().unwrap().contains(&own));
    }
}
