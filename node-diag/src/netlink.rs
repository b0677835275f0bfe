//! rtnetlink access (no shelling out to `ip`): link dumps (with the tunnel and veth facts
//! the MTU model needs), route and address lookups, link notifications and
//! network-namespace ids, used to work out which network namespaces belong to this node:
//! the agent's own and every pod namespace attached to it by a veth.
//!
//! Everything here acts on the calling thread's network namespace: a netlink socket
//! belongs to the namespace it was opened in, so a thread that entered another namespace
//! (see `inventory`) can use these functions to look inside it.

use std::{
    collections::{BTreeSet, HashSet},
    fs,
    net::IpAddr,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    address::{AddressAttribute, AddressMessage},
    link::{
        GreEncapType, GreIOFlags, InfoData, InfoGeneve, InfoGre, InfoGre6, InfoIpTunnel, InfoVxlan,
        Ip6TunnelFlags, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, TunnelEncapType,
    },
    nsid::{NsidAttribute, NsidMessage},
    route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType},
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

/// A link as seen in the calling thread's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// The kernel's `IFLA_INFO_KIND` (`veth`, `vxlan`, `ip6gre`…); `None` for physical
    /// devices and loopback.
    pub kind: Option<String>,
    pub mtu: Option<u32>,
    /// ARPHRD_* link-layer type (1 Ethernet, 772 loopback, 65534 none, ...).
    pub link_type: u16,
    /// For veths and other cross-namespace links: the peer namespace's id in ours.
    pub link_netnsid: Option<i32>,
    /// `IFLA_LINK`: the lower device of a vlan, macvlan or bound IP tunnel; for a veth,
    /// the peer's ifindex (in `link_netnsid`'s namespace when that is set).
    pub link: Option<u32>,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// Tunnel configuration, for the kinds the MTU model knows.
    pub tunnel: Option<Tunnel>,
}

/// A tunnel's configuration as far as it decides the encapsulation overhead and the
/// underlay device.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tunnel {
    /// The device the tunnel is bound to (`IFLA_VXLAN_LINK`, `IFLA_IPTUN_LINK`,
    /// `IFLA_GRE_LINK`); `None` when unbound (0).
    pub bound_to: Option<u32>,
    /// Remote endpoint or multicast group; `None` when any (per-peer FDB entries or
    /// metadata mode).
    pub remote: Option<IpAddr>,
    pub local: Option<IpAddr>,
    /// Metadata mode (`external`/`collect_metadata`): endpoints come with each packet.
    pub external: bool,
    /// VXLAN-GPE, or Geneve with `innerprotoinherit`: no inner Ethernet header.
    pub inner_l3: bool,
    /// GRE output flags that each add 4 bytes to the GRE header.
    pub gre_key: bool,
    pub gre_checksum: bool,
    pub gre_sequence: bool,
    /// ip6tnl/ip6gre insert an 8-byte tunnel encapsulation limit option unless
    /// configured with `encaplimit none`.
    pub encap_limit: bool,
    /// FOU/GUE UDP encapsulation of an IPIP or GRE tunnel.
    pub udp_encap: Option<UdpEncap>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UdpEncap {
    Fou,
    Gue,
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

pub(crate) fn link_from(msg: LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        kind: None,
        mtu: None,
        link_type: u16::from(msg.header.link_layer_type),
        link_netnsid: None,
        link: None,
        up: msg.header.flags.contains(LinkFlags::Up),
        tunnel: None,
    };
    for attr in msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n,
            LinkAttribute::Mtu(m) => link.mtu = Some(m),
            LinkAttribute::LinkNetNsId(id) => link.link_netnsid = Some(id),
            LinkAttribute::Link(l) if l != 0 => link.link = Some(l),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(kind) => link.kind = Some(kind.to_string()),
                        LinkInfo::Data(data) => link.tunnel = tunnel_from(data),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    link
}

/// `IFLA_GRE_FLAGS`, which the crate leaves undecoded for ip6gre: the ip6 tunnel flags.
const IFLA_GRE_FLAGS: u16 = 13;

fn tunnel_from(data: InfoData) -> Option<Tunnel> {
    use netlink_packet_core::Nla as _;
    let mut t = Tunnel::default();
    let nonzero = |i: u32| (i != 0).then_some(i);
    let specified = |a: IpAddr| (!a.is_unspecified()).then_some(a);
    let gre_out = |t: &mut Tunnel, flags: GreIOFlags| {
        t.gre_key = flags.contains(GreIOFlags::Key);
        t.gre_checksum = flags.contains(GreIOFlags::Checksum);
        t.gre_sequence = flags.contains(GreIOFlags::Seq);
    };
    let gre_encap = |t: &mut Tunnel, e: GreEncapType| {
        t.udp_encap = match e {
            GreEncapType::Fou => Some(UdpEncap::Fou),
            GreEncapType::Gue => Some(UdpEncap::Gue),
            _ => None,
        }
    };
    match data {
        InfoData::Vxlan(attrs) => {
            for a in attrs {
                match a {
                    InfoVxlan::Link(i) => t.bound_to = nonzero(i),
                    InfoVxlan::Group(a) => t.remote = specified(a.into()),
                    InfoVxlan::Group6(a) => t.remote = specified(a.into()),
                    InfoVxlan::Local(a) => t.local = specified(a.into()),
                    InfoVxlan::Local6(a) => t.local = specified(a.into()),
                    InfoVxlan::CollectMetadata(on) => t.external = on,
                    InfoVxlan::Gpe => t.inner_l3 = true,
                    _ => {}
                }
            }
        }
        InfoData::Geneve(attrs) => {
            for a in attrs {
                match a {
                    InfoGeneve::Remote(a) => t.remote = specified(a.into()),
                    InfoGeneve::Remote6(a) => t.remote = specified(a.into()),
                    InfoGeneve::Local(a) => t.local = specified(a.into()),
                    InfoGeneve::Local6(a) => t.local = specified(a.into()),
                    InfoGeneve::CollectMetadata => t.external = true,
                    InfoGeneve::InnerProtoInherit => t.inner_l3 = true,
                    _ => {}
                }
            }
        }
        InfoData::IpTunnel(attrs) => {
            // The kernel applies the encapsulation limit option unless told to ignore it;
            // only ip6tnl reports the flag, so default to "applies" and let the model
            // use it for IPv6 outer headers only.
            t.encap_limit = true;
            for a in attrs {
                match a {
                    InfoIpTunnel::Link(i) => t.bound_to = nonzero(i),
                    InfoIpTunnel::Remote(a) => t.remote = specified(a),
                    InfoIpTunnel::Local(a) => t.local = specified(a),
                    InfoIpTunnel::CollectMetadata => t.external = true,
                    InfoIpTunnel::Ipv6Flags(f) => {
                        t.encap_limit = !f.contains(Ip6TunnelFlags::IgnEncapLimit);
                    }
                    InfoIpTunnel::EncapType(e) => {
                        t.udp_encap = match e {
                            TunnelEncapType::Fou => Some(UdpEncap::Fou),
                            TunnelEncapType::Gue => Some(UdpEncap::Gue),
                            _ => None,
                        }
                    }
                    _ => {}
                }
            }
        }
        InfoData::GreTun(attrs) | InfoData::GreTap(attrs) => {
            for a in attrs {
                match a {
                    InfoGre::Link(i) => t.bound_to = nonzero(i),
                    InfoGre::Remote(a) => t.remote = specified(a.into()),
                    InfoGre::Local(a) => t.local = specified(a.into()),
                    InfoGre::OFlags(f) => gre_out(&mut t, f),
                    InfoGre::CollectMetadata => t.external = true,
                    InfoGre::EncapType(e) => gre_encap(&mut t, e),
                    _ => {}
                }
            }
        }
        InfoData::GreTun6(attrs) | InfoData::GreTap6(attrs) => {
            t.encap_limit = true;
            for a in attrs {
                match a {
                    InfoGre6::Link(i) => t.bound_to = nonzero(i),
                    InfoGre6::Remote(a) => t.remote = specified(a.into()),
                    InfoGre6::Local(a) => t.local = specified(a.into()),
                    InfoGre6::OFlags(f) => gre_out(&mut t, f),
                    InfoGre6::CollectMetadata => t.external = true,
                    InfoGre6::EncapType(e) => gre_encap(&mut t, e),
                    InfoGre6::Other(nla)
                        if nla.kind() == IFLA_GRE_FLAGS && nla.value_len() == 4 =>
                    {
                        let mut b = [0u8; 4];
                        nla.emit_value(&mut b);
                        let flags = Ip6TunnelFlags::from_bits_retain(u32::from_ne_bytes(b));
                        t.encap_limit = !flags.contains(Ip6TunnelFlags::IgnEncapLimit);
                    }
                    _ => {}
                }
            }
        }
        // WireGuard keeps its peers in generic netlink: nothing here tells the family.
        InfoData::Wireguard(_) => {}
        _ => return None,
    }
    Some(t)
}

/// The output interface the kernel's route lookup picks for `dst` (`ip route get`).
/// `None` when there is no route.
pub fn route_oif(dst: IpAddr) -> Result<Option<u32>, NetlinkError> {
    let sock = socket()?;
    let mut msg = RouteMessage::default();
    msg.header.address_family = family_of(dst);
    msg.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
    msg.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(dst)));
    let replies = match request(&sock, RouteNetlinkMessage::GetRoute(msg), 0) {
        Ok(r) => r,
        // ENETUNREACH, EHOSTUNREACH...: no route is an answer, not a failure.
        Err(NetlinkError::Kernel(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(replies.into_iter().find_map(|m| match m {
        RouteNetlinkMessage::NewRoute(r) => route_oif_of(&r),
        _ => None,
    }))
}

fn family_of(a: IpAddr) -> AddressFamily {
    if a.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn route_oif_of(r: &RouteMessage) -> Option<u32> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        RouteAttribute::MultiPath(hops) => hops.first().map(|h| h.interface_index),
        _ => None,
    })
}

/// The interface of the main table's default route (the lowest metric one) for IPv4
/// (`v6 == false`) or IPv6.
pub fn default_route_oif(v6: bool) -> Result<Option<u32>, NetlinkError> {
    let sock = socket()?;
    let mut msg = RouteMessage::default();
    msg.header.address_family = if v6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    let replies = request(&sock, RouteNetlinkMessage::GetRoute(msg), NLM_F_DUMP)?;
    let mut best: Option<(u32, u32)> = None;
    for m in replies {
        let RouteNetlinkMessage::NewRoute(r) = m else {
            continue;
        };
        let table = r
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(u32::from(r.header.table));
        if r.header.destination_prefix_length != 0
            || r.header.kind != RouteType::Unicast
            || table != u32::from(RouteHeader::RT_TABLE_MAIN)
        {
            continue;
        }
        let metric = r
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Priority(p) => Some(*p),
                _ => None,
            })
            .unwrap_or(0);
        if let Some(oif) = route_oif_of(&r)
            && best.is_none_or(|(m, _)| metric < m)
        {
            best = Some((metric, oif));
        }
    }
    Ok(best.map(|(_, oif)| oif))
}

/// The interface holding the local address `addr`, if any.
pub fn address_owner(addr: IpAddr) -> Result<Option<u32>, NetlinkError> {
    let sock = socket()?;
    let mut msg = AddressMessage::default();
    msg.header.family = family_of(addr);
    let replies = request(&sock, RouteNetlinkMessage::GetAddress(msg), NLM_F_DUMP)?;
    Ok(replies.into_iter().find_map(|m| match m {
        RouteNetlinkMessage::NewAddress(a)
            if a.attributes.iter().any(|at| {
                matches!(at, AddressAttribute::Local(x) | AddressAttribute::Address(x) if *x == addr)
            }) =>
        {
            Some(a.header.index)
        }
        _ => None,
    }))
}

/// `RTNLGRP_LINK` as a bind-time group mask (`RTMGRP_LINK`).
const RTMGRP_LINK: u32 = 1;

/// A socket subscribed to the link notifications of the namespace it was opened in
/// (`RTNLGRP_LINK`: links added, removed or changed, MTU changes included), and, where
/// the kernel allows it, of every namespace that has an id in ours (veth peers do), so a
/// pod-side MTU change is seen too.
pub struct LinkMonitor {
    sock: Socket,
}

impl LinkMonitor {
    /// `poll` bounds each [`LinkMonitor::wait`], so its caller can notice it should stop.
    pub fn new(poll: Duration) -> Result<Self, NetlinkError> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind(&SocketAddr::new(0, RTMGRP_LINK))?;
        if let Err(e) = sock.set_listen_all_namespaces(true) {
            tracing::debug!(error = %e, "link notifications limited to the agent's namespace");
        }
        let tv = libc::timeval {
            tv_sec: poll.as_secs() as libc::time_t,
            tv_usec: poll.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: setsockopt reads `size_of::<timeval>()` bytes from a live timeval.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(Self { sock })
    }

    /// Blocks until links change (`true`) or the poll interval passes (`false`).
    pub fn wait(&self) -> Result<bool, NetlinkError> {
        match self.sock.recv_from_full() {
            Ok((data, _)) => {
                let mut offset = 0;
                while offset < data.len() {
                    let Ok(msg) =
                        NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..])
                    else {
                        // A notification we cannot decode still says something changed.
                        return Ok(true);
                    };
                    if matches!(
                        msg.payload,
                        NetlinkPayload::InnerMessage(
                            RouteNetlinkMessage::NewLink(_) | RouteNetlinkMessage::DelLink(_)
                        )
                    ) {
                        return Ok(true);
                    }
                    let len = msg.header.length as usize;
                    if len == 0 {
                        break;
                    }
                    offset += len;
                }
                Ok(false)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) || e.raw_os_error() == Some(libc::EINTR) =>
            {
                Ok(false)
            }
            // The receive queue overflowed: notifications were lost, so assume a change.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Ok(true),
            Err(e) => Err(e.into()),
        }
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
pub struct NetnsFile {
    pub inode: u32,
    pub path: PathBuf,
    /// Its `/run/netns` name if it has one, `host` for init's namespace, else `pid:N` of
    /// its lowest pid.
    pub name: String,
}

/// Every network namespace reachable through `/run/netns`, `/var/run/netns` or a
/// process, once each (by inode).
pub fn namespace_files() -> Vec<NetnsFile> {
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

/// The namespaces among `files` holding the peer of one of `links` (the calling thread's
/// links), each with the id our namespace gives it.
pub fn veth_peer_namespaces(
    links: &[Link],
    files: &[NetnsFile],
) -> Result<Vec<(i32, NetnsFile)>, NetlinkError> {
    let peer_ids: HashSet<i32> = links
        .iter()
        .filter(|l| l.kind.as_deref() == Some("veth"))
        .filter_map(|l| l.link_netnsid)
        .collect();
    if peer_ids.is_empty() {
        return Ok(Vec::new());
    }
    let sock = socket()?;
    let mut out = Vec::new();
    for f in files {
        let Ok(file) = fs::File::open(&f.path) else {
            continue;
        };
        if let Ok(Some(id)) = nsid_of(&sock, file.as_raw_fd() as u32)
            && peer_ids.contains(&id)
        {
            out.push((id, f.clone()));
        }
    }
    Ok(out)
}

/// The network namespaces this node's agent reports for (by inode): its own, and each
/// namespace holding the peer of one of its veths, except veths a tunnel is bound to.
pub fn local_scope() -> Result<BTreeSet<u32>, NetlinkError> {
    let own = netns_inode(Path::new("/proc/self/ns/net")).unwrap_or(0);
    let mut scope = BTreeSet::from([own]);
    let mut links = links()?;
    // A veth carrying a tunnel is an underlay to another node, not a pod's link.
    let underlays: HashSet<u32> = links
        .iter()
        .filter_map(|l| l.tunnel.as_ref()?.bound_to)
        .collect();
    links.retain(|l| !underlays.contains(&l.index));
    if !links
        .iter()
        .any(|l| l.kind.as_deref() == Some("veth") && l.link_netnsid.is_some())
    {
        return Ok(scope);
    }
    let files: Vec<_> = namespace_files()
        .into_iter()
        .filter(|f| f.inode != own)
        .collect();
    scope.extend(
        veth_peer_namespaces(&links, &files)?
            .into_iter()
            .map(|(_, f)| f.inode),
    );
    Ok(scope)
}

/// The kernel's route lookup for `dst` (`ip route get DST`): the output interface, the
/// preferred source address and the route's MTU metric (a locked `mtu`, or a path MTU
/// learnt for DST), each of the last two when the answer carries it. `Ok(None)` when the
/// answer names no output interface. A lookup the kernel refuses stays
/// [`NetlinkError::Kernel`] (negative errno: `ENETUNREACH`, `EHOSTUNREACH`, `EINVAL` for
/// no route), so callers can tell "no route" from other failures.
#[expect(
    clippy::type_complexity,
    reason = "the route's three facts travel as a tuple so this lookup adds one item, not two"
)]
pub fn route_get(dst: IpAddr) -> Result<Option<(u32, Option<IpAddr>, Option<u32>)>, NetlinkError> {
    use netlink_packet_route::route::RouteMetric;
    let sock = socket()?;
    let mut msg = RouteMessage::default();
    msg.header.address_family = family_of(dst);
    msg.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
    msg.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(dst)));
    let replies = request(&sock, RouteNetlinkMessage::GetRoute(msg), 0)?;
    Ok(replies.into_iter().find_map(|m| {
        let RouteNetlinkMessage::NewRoute(r) = m else {
            return None;
        };
        let oif = route_oif_of(&r)?;
        let (mut src, mut mtu) = (None, None);
        for a in r.attributes {
            match a {
                RouteAttribute::PrefSource(RouteAddress::Inet(a)) => src = Some(a.into()),
                RouteAttribute::PrefSource(RouteAddress::Inet6(a)) => src = Some(a.into()),
                RouteAttribute::Metrics(metrics) => {
                    mtu = metrics.into_iter().find_map(|m| match m {
                        RouteMetric::Mtu(m) if m != 0 => Some(m),
                        _ => None,
                    });
                }
                _ => {}
            }
        }
        Some((oif, src, mtu))
    }))
}
/// Link messages as the kernel sends them, built and serialized with the crate's types
/// and parsed back the way a dump is: fixtures for the tunnel kinds this kernel lacks.
#[cfg(test)]
pub(crate) mod fixtures {
    use netlink_packet_core::{DefaultNla, Emitable as _, Parseable as _};
    pub use netlink_packet_route::link::InfoKind;
    use netlink_packet_route::link::{LinkHeader, LinkLayerType};

    use super::*;

    /// Serializes a link message with `kind`/`data` and parses it back into a [`Link`].
    pub fn parsed(
        index: u32,
        name: &str,
        mtu: u32,
        kind: InfoKind,
        data: Option<InfoData>,
    ) -> Link {
        let header = LinkHeader {
            index,
            link_layer_type: LinkLayerType::Ether,
            flags: LinkFlags::Up,
            ..Default::default()
        };
        let mut info = vec![LinkInfo::Kind(kind)];
        info.extend(data.map(LinkInfo::Data));
        let mut msg = LinkMessage::default();
        msg.header = header;
        msg.attributes = vec![
            LinkAttribute::IfName(name.into()),
            LinkAttribute::Mtu(mtu),
            LinkAttribute::LinkInfo(info),
        ];
        let mut buf = vec![0; msg.buffer_len()];
        msg.emit(&mut buf);
        link_from(LinkMessage::parse(buf.as_slice()).expect("fixture parses"))
    }

    pub fn vxlan(attrs: Vec<InfoVxlan>) -> Link {
        parsed(
            10,
            "vx0",
            1450,
            InfoKind::Vxlan,
            Some(InfoData::Vxlan(attrs)),
        )
    }

    pub fn geneve(attrs: Vec<InfoGeneve>) -> Link {
        parsed(
            11,
            "gnv0",
            1450,
            InfoKind::Geneve,
            Some(InfoData::Geneve(attrs)),
        )
    }

    pub fn wireguard() -> Link {
        // The kernel sends no IFLA_INFO_DATA for wireguard.
        parsed(12, "wg0", 1420, InfoKind::Wireguard, None)
    }

    pub fn ipip(kind: InfoKind, attrs: Vec<InfoIpTunnel>) -> Link {
        parsed(13, "tun0", 1480, kind, Some(InfoData::IpTunnel(attrs)))
    }

    pub fn gre(tap: bool, attrs: Vec<InfoGre>) -> Link {
        let (kind, data) = if tap {
            (InfoKind::GreTap, InfoData::GreTap(attrs))
        } else {
            (InfoKind::GreTun, InfoData::GreTun(attrs))
        };
        parsed(14, "gre1", 1476, kind, Some(data))
    }

    /// ip6gre as the kernel dumps it: IFLA_GRE_FLAGS carries the ip6 tunnel flags.
    pub fn ip6gre(tap: bool, ignore_encap_limit: bool, mut attrs: Vec<InfoGre6>) -> Link {
        let flags: u32 = if ignore_encap_limit { 0x1 } else { 0 };
        attrs.push(InfoGre6::EncapLimit(4));
        attrs.push(InfoGre6::Other(DefaultNla::new(
            IFLA_GRE_FLAGS,
            flags.to_ne_bytes().to_vec(),
        )));
        let (kind, data) = if tap {
            (InfoKind::GreTap6, InfoData::GreTap6(attrs))
        } else {
            (InfoKind::GreTun6, InfoData::GreTun6(attrs))
        };
        parsed(15, "ip6gre1", 1448, kind, Some(data))
    }
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

    #[test]
    fn vxlan_fixture_tunnel_facts() {
        use std::net::Ipv4Addr;
        let l = fixtures::vxlan(vec![
            InfoVxlan::Id(42),
            InfoVxlan::Group(Ipv4Addr::new(10, 0, 0, 2)),
            InfoVxlan::Link(3),
            InfoVxlan::Local(Ipv4Addr::UNSPECIFIED),
            InfoVxlan::Port(4789),
        ]);
        assert_eq!(l.kind.as_deref(), Some("vxlan"));
        assert!(l.up);
        let t = l.tunnel.unwrap();
        assert_eq!(t.bound_to, Some(3));
        assert_eq!(t.remote, Some(IpAddr::from([10, 0, 0, 2])));
        assert_eq!(t.local, None, "an unspecified address is no address");
        assert!(!t.external && !t.inner_l3);

        let t = fixtures::vxlan(vec![InfoVxlan::CollectMetadata(true), InfoVxlan::Link(0)])
            .tunnel
            .unwrap();
        assert!(t.external);
        assert_eq!(t.bound_to, None, "ifindex 0 is unbound");
        assert!(
            fixtures::vxlan(vec![InfoVxlan::Gpe])
                .tunnel
                .unwrap()
                .inner_l3
        );
    }

    #[test]
    fn geneve_wireguard_ipip_fixtures() {
        use std::net::Ipv6Addr;
        let t = fixtures::geneve(vec![
            InfoGeneve::Id(7),
            InfoGeneve::Remote6(Ipv6Addr::LOCALHOST),
            InfoGeneve::InnerProtoInherit,
        ])
        .tunnel
        .unwrap();
        assert_eq!(t.remote, Some(IpAddr::from(Ipv6Addr::LOCALHOST)));
        assert!(t.inner_l3);

        let wg = fixtures::wireguard();
        assert_eq!(wg.kind.as_deref(), Some("wireguard"));
        assert_eq!(
            wg.tunnel, None,
            "no info data: nothing known beyond the kind"
        );

        let l = fixtures::ipip(
            fixtures::InfoKind::IpIp,
            vec![
                InfoIpTunnel::Link(2),
                InfoIpTunnel::Remote(IpAddr::from([192, 0, 2, 9])),
                InfoIpTunnel::EncapType(TunnelEncapType::Fou),
            ],
        );
        assert_eq!(l.kind.as_deref(), Some("ipip"));
        let t = l.tunnel.unwrap();
        assert_eq!(t.bound_to, Some(2));
        assert_eq!(t.udp_encap, Some(UdpEncap::Fou));

        let l = fixtures::ipip(
            fixtures::InfoKind::Ip6Tnl,
            vec![InfoIpTunnel::Ipv6Flags(Ip6TunnelFlags::IgnEncapLimit)],
        );
        assert_eq!(l.kind.as_deref(), Some("ip6tnl"));
        assert!(!l.tunnel.unwrap().encap_limit);
        let l = fixtures::ipip(
            fixtures::InfoKind::Ip6Tnl,
            vec![InfoIpTunnel::EncapLimit(4)],
        );
        assert!(l.tunnel.unwrap().encap_limit);
    }

    #[test]
    fn gre_fixtures() {
        let l = fixtures::gre(
            false,
            vec![InfoGre::OFlags(GreIOFlags::Key | GreIOFlags::Seq)],
        );
        assert_eq!(l.kind.as_deref(), Some("gre"));
        let t = l.tunnel.unwrap();
        assert!(t.gre_key && t.gre_sequence && !t.gre_checksum);
        assert_eq!(fixtures::gre(true, vec![]).kind.as_deref(), Some("gretap"));

        let l = fixtures::ip6gre(false, false, vec![]);
        assert_eq!(l.kind.as_deref(), Some("ip6gre"));
        assert!(l.tunnel.unwrap().encap_limit);
        let l = fixtures::ip6gre(true, true, vec![InfoGre6::OFlags(GreIOFlags::Checksum)]);
        assert_eq!(l.kind.as_deref(), Some("ip6gretap"));
        let t = l.tunnel.unwrap();
        assert!(!t.encap_limit && t.gre_checksum);
    }
}
