//! Link notifications: a socket subscribed to `RTNLGRP_LINK` (and `RTNLGRP_NSID`), and the
//! watcher thread that turns its notifications into "re-snapshot" messages for the agent,
//! so an MTU change or a new pod is seen at once: they drive the scope, the periodic
//! `/proc` scan being only a slow safety net.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    thread,
};

use netlink_packet_route::link::LinkHeader;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use tracing::warn;

use super::{links::Link, rtnetlink::NetlinkError};

#[derive(Debug, thiserror::Error)]
pub(crate) enum MonitorError {
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("thread: {0}")]
    Thread(std::io::Error),
}

/// `RTNLGRP_LINK` as a bind-time group mask (`RTMGRP_LINK`).
const RTMGRP_LINK: u32 = 1;
/// `RTNLGRP_NSID`: a namespace given an id in ours (a pod's, once its veth's peer is in
/// it) or losing it. Too high for the bind-time mask: joined by `NETLINK_ADD_MEMBERSHIP`.
const RTNLGRP_NSID: u32 = 28;

/// The notifications that change the scope: `RTM_NEWLINK`, `RTM_DELLINK`,
/// `RTM_NEWNSID`, `RTM_DELNSID`.
const NOTIFIED: [u16; 4] = [16, 17, 88, 89];
/// `RTM_NEWNSID`, `RTM_DELNSID`: the ids our namespace gives others changed.
const NSID_KINDS: [u16; 2] = [88, 89];

/// A socket subscribed to the link notifications of the namespace it was opened in
/// (`RTNLGRP_LINK`: links added, removed or changed, MTU changes included), and, where
/// the kernel allows it, of every namespace that has an id in ours (veth peers do), so a
/// pod-side MTU change is seen too.
pub(crate) struct LinkMonitor {
    sock: Socket,
    /// Whether it gets the namespace-id notifications too.
    nsids: bool,
    /// One datagram's room, kept: a churning node wakes the watcher many times a second.
    buf: Vec<u8>,
}

/// While alive, the scope trusts the namespace ids it resolved until a notification
/// says otherwise (`namespaces::nsid_changed`); the watching thread holds it.
struct FollowingNsids;

impl FollowingNsids {
    fn start(nsids: bool) -> Option<Self> {
        nsids.then(|| {
            super::namespaces::follow_nsids(true);
            Self
        })
    }
}

impl Drop for FollowingNsids {
    fn drop(&mut self) {
        super::namespaces::follow_nsids(false);
    }
}

impl LinkMonitor {
    pub(crate) fn new() -> Result<Self, NetlinkError> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind(&SocketAddr::new(0, RTMGRP_LINK))?;
        let nsids = match sock.add_membership(RTNLGRP_NSID) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "no namespace id notifications; link ones only");
                false
            }
        };
        if let Err(e) = sock.set_listen_all_namespaces(true) {
            tracing::debug!(error = %e, "link notifications limited to the agent's namespace");
        }
        sock.set_non_blocking(true)?;
        Ok(Self {
            sock,
            nsids,
            buf: vec![0u8; RECV_BUF],
        })
    }

    /// Reads what is queued; whether links changed. Only the messages' kinds are read:
    /// a link notification carries the whole link, statistics included, and a churning
    /// node sends thousands.
    fn drain(&mut self) -> Result<bool, NetlinkError> {
        let mut changed = false;
        loop {
            match recv_with_nsid(&self.sock, &mut self.buf) {
                Ok(Received::Datagram { len, nsid }) => {
                    let mut links = false;
                    for (kind, _) in super::nlmsg::messages(&self.buf[..len]) {
                        links |= NOTIFIED.contains(&kind);
                        if NSID_KINDS.contains(&kind) {
                            super::namespaces::nsid_changed();
                        }
                    }
                    // From inside a pod: its kept read (MTU model) no longer stands.
                    if links && let Some(nsid) = nsid {
                        super::inventory::pod_notified(Some(nsid));
                    }
                    changed |= links;
                }
                Ok(Received::Truncated) => {
                    super::inventory::pod_notified(None);
                    changed = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(changed),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // The receive queue overflowed: notifications were lost, so assume a change.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    super::namespaces::nsid_changed();
                    super::inventory::pod_notified(None);
                    changed = true;
                }
                Err(e) => return Err(NetlinkError::from(e)),
            }
        }
    }
}

/// Room for one datagram of notifications: the kernel sends each link notification
/// alone, a few KiB with its statistics.
const RECV_BUF: usize = 1 << 16;
/// `NETLINK_LISTEN_ALL_NSID` as a control message type (level `SOL_NETLINK`): the id
/// our namespace gives the one a notification came from.
const NETLINK_LISTEN_ALL_NSID: libc::c_int = 8;

enum Received {
    /// `len` bytes; `nsid`: the id of the namespace it came from, `None` for ours.
    Datagram { len: usize, nsid: Option<i32> },
    /// Larger than the buffer: its messages are lost.
    Truncated,
}

/// Receives one datagram without waiting, with the namespace id the kernel attaches
/// to a notification from another namespace.
fn recv_with_nsid(sock: &Socket, buf: &mut [u8]) -> std::io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for one control message of an int, 8-byte aligned as cmsghdr wants.
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control) as _;
    // SAFETY: `msg` points at `iov` (into `buf`) and `control`, both live and writable
    // for the lengths given; recvmsg writes within them.
    let n = unsafe {
        libc::recvmsg(
            std::os::fd::AsRawFd::as_raw_fd(sock),
            &raw mut msg,
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Ok(Received::Truncated);
    }
    let mut nsid = None;
    // SAFETY: the kernel filled `control` with `msg_controllen` bytes of well-formed
    // control messages; CMSG_FIRSTHDR/CMSG_NXTHDR stay within them, and CMSG_DATA of a
    // SOL_NETLINK / NETLINK_LISTEN_ALL_NSID message holds an int (read unaligned).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_NETLINK && (*c).cmsg_type == NETLINK_LISTEN_ALL_NSID {
                nsid = Some(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>()));
            }
            c = libc::CMSG_NXTHDR(&raw const msg, c);
        }
    }
    Ok(Received::Datagram {
        len: usize::try_from(n).unwrap_or(0),
        nsid,
    })
}

/// `RTM_NEWLINK`, `RTM_DELLINK`.
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
/// `struct ifinfomsg`'s size: the link header before the attributes.
const IFINFOMSG_LEN: usize = 16;
/// `IFLA_NEW_NETNSID`: on a `RTM_DELLINK`, the namespace the link moved to.
const IFLA_NEW_NETNSID: u16 = 45;

/// The agent's namespace's links as its notifications left them, so a refresh of the
/// scope costs what changed rather than a dump of every link (a node churning a
/// thousand interfaces would be dumped whole four times a second).
#[derive(Debug, Default)]
pub(crate) struct LinkTable {
    links: BTreeMap<u32, Link>,
    /// To be dumped before it is trusted: at start, after notifications were lost (a
    /// full socket buffer), when one could not be decoded, and when the safety net says.
    stale: bool,
    /// Notifications applied so far: a dump taken while one was applied may be older
    /// than it for that link, so it is trusted only once a dump passes without any.
    applied: u64,
}

/// The table the notification thread keeps and the scope reads.
pub(crate) type SharedLinks = Arc<Mutex<LinkTable>>;

impl LinkTable {
    fn apply(&mut self, kind: u16, payload: &[u8]) -> bool {
        match kind {
            RTM_NEWLINK => match super::links::parse_link(payload) {
                Ok(msg) => {
                    let link = super::links::link_from(msg);
                    self.links.insert(link.index, link);
                }
                Err(_) => self.stale = true,
            },
            RTM_DELLINK => match LinkHeader::parse(payload) {
                Ok(h) => {
                    self.links.remove(&h.index);
                    // Moved to another namespace rather than deleted (`IFLA_NEW_NETNSID`):
                    // a veth's end left here now has its peer there, which changes its
                    // own attributes without a notification of its own.
                    if super::nlmsg::attrs(payload.get(IFINFOMSG_LEN..).unwrap_or_default())
                        .any(|(kind, _)| kind == IFLA_NEW_NETNSID)
                    {
                        self.stale = true;
                    }
                }
                Err(_) => self.stale = true,
            },
            _ => return false,
        }
        self.applied += 1;
        true
    }
}

/// To be dumped again before it is trusted (the scope's safety net).
pub(crate) fn mark_stale(table: &SharedLinks) {
    lock(table).stale = true;
}

/// The agent's namespace's links: the table's when it can be trusted, else a dump
/// (which then becomes the table). Call it from the agent's namespace.
pub(crate) fn current_links(table: &SharedLinks) -> Result<Vec<Link>, NetlinkError> {
    let before = {
        let t = lock(table);
        if !t.stale {
            return Ok(t.links.values().cloned().collect());
        }
        t.applied
    };
    let dumped = super::links::links()?;
    let mut t = lock(table);
    t.links = dumped.iter().map(|l| (l.index, l.clone())).collect();
    t.stale = t.applied != before;
    Ok(dumped)
}

/// Whether the table waits for a dump.
#[cfg(test)]
pub(crate) fn is_stale(table: &SharedLinks) -> bool {
    lock(table).stale
}

fn lock(table: &SharedLinks) -> std::sync::MutexGuard<'_, LinkTable> {
    table
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A socket subscribed to the link notifications of the agent's namespace alone, whose
/// messages keep a [`LinkTable`].
struct OwnLinks {
    sock: Socket,
    table: SharedLinks,
}

/// What the own socket's receive buffer is raised to (`SO_RCVBUFFORCE`, the agent holds
/// CAP_NET_ADMIN): a batch of a hundred veths is a few hundred notifications of about
/// 2 KiB, more than the default 208 KiB, and an overflow costs a dump.
const OWN_RCVBUF: libc::c_int = 4 << 20;

impl OwnLinks {
    fn new() -> Result<Self, NetlinkError> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind(&SocketAddr::new(0, RTMGRP_LINK))?;
        sock.set_non_blocking(true)?;
        let size = OWN_RCVBUF;
        // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live c_int.
        let rc = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&sock),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&raw const size).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "link table: default receive buffer");
        }
        // Subscribed before the first dump, so nothing between the two is missed.
        let table = Arc::new(Mutex::new(LinkTable {
            stale: true,
            ..LinkTable::default()
        }));
        Ok(Self { sock, table })
    }

    /// Applies what is queued to the table; whether links changed.
    fn drain(&self) -> bool {
        let mut changed = false;
        loop {
            match self.sock.recv_from_full() {
                Ok((data, _)) => {
                    let mut t = lock(&self.table);
                    for (kind, payload) in super::nlmsg::messages(&data) {
                        changed |= t.apply(kind, payload);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return changed,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => {
                    // Lost notifications (ENOBUFS) or a failed socket: dump next time.
                    if e.raw_os_error() != Some(libc::ENOBUFS) {
                        tracing::debug!(error = %e, "link table: receive failed");
                    }
                    lock(&self.table).stale = true;
                    return true;
                }
            }
        }
    }
}

/// The link notifications the agent follows: `changes` gets a `()` for each batch that
/// changed something (the agent's namespace's links, a veth-attached pod's, or their
/// namespace ids; bursts coalesce), `links` the table of the agent's namespace's links
/// kept from them (`None` where its socket could not be had: the scope dumps).
pub(crate) struct LinkWatch {
    pub(crate) changes: tokio::sync::mpsc::Receiver<()>,
    pub(crate) links: Option<SharedLinks>,
}

/// Link notifications of the agent's namespace (and, where the kernel allows it, of the
/// namespaces with an id in it, which includes veth-attached pods): each `()` means
/// "links changed since you last looked; re-snapshot". Bursts coalesce into one message.
/// The watching thread stops once the receiver is dropped (within a second); the
/// channel closes if notifications fail, leaving the agent's periodic snapshots.
pub(crate) fn watch() -> Result<LinkWatch, MonitorError> {
    let mut monitor = LinkMonitor::new()?;
    let own = match OwnLinks::new() {
        Ok(own) => Some(own),
        Err(e) => {
            tracing::debug!(error = %e, "no link table: the scope dumps the links");
            None
        }
    };
    let links = own.as_ref().map(|o| Arc::clone(&o.table));
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    thread::Builder::new()
        .name("link-watch".into())
        .spawn(move || {
            let timeout = Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            };
            let _following = FollowingNsids::start(monitor.nsids);
            loop {
                let mut fds = vec![PollFd::new(&monitor.sock, PollFlags::IN)];
                if let Some(own) = &own {
                    fds.push(PollFd::new(&own.sock, PollFlags::IN));
                }
                match poll(&mut fds, Some(&timeout)) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => {
                        warn!(error = %e, "link notifications failed; relying on periodic snapshots");
                        return;
                    }
                }
                drop(fds);
                // The table first, and again after the other socket: the kernel queues
                // one notification on both, so the agent never refreshes from a
                // table that lacks what it was told of.
                let mut changed = own.as_ref().is_some_and(OwnLinks::drain);
                match monitor.drain() {
                    Ok(c) => changed |= c,
                    Err(e) => {
                        warn!(error = %e, "link notifications failed; relying on periodic snapshots");
                        return;
                    }
                }
                changed |= own.as_ref().is_some_and(OwnLinks::drain);
                if changed {
                    tracing::trace!("links changed");
                }
                if changed
                    && let Err(tokio::sync::mpsc::error::TrySendError::Closed(())) =
                        tx.try_send(())
                {
                    return;
                }
                if tx.is_closed() {
                    return;
                }
            }
        })
        .map_err(MonitorError::Thread)?;
    Ok(LinkWatch { changes: rx, links })
}
