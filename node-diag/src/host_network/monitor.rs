//! Link notifications: a socket subscribed to `RTNLGRP_LINK` (and `RTNLGRP_NSID`), and the
//! watcher thread that turns its notifications into "re-snapshot" messages for the agent,
//! so an MTU change or a new pod is seen at once: they drive the scope, the periodic
//! `/proc` scan being only a slow safety net.

use std::{thread, time::Duration};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use tracing::warn;

use super::rtnetlink::NetlinkError;

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

/// A socket subscribed to the link notifications of the namespace it was opened in
/// (`RTNLGRP_LINK`: links added, removed or changed, MTU changes included), and, where
/// the kernel allows it, of every namespace that has an id in ours (veth peers do), so a
/// pod-side MTU change is seen too.
pub(crate) struct LinkMonitor {
    sock: Socket,
}

impl LinkMonitor {
    /// `poll` bounds each [`LinkMonitor::wait`], so its caller can notice it should stop.
    pub(crate) fn new(poll: Duration) -> Result<Self, NetlinkError> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind(&SocketAddr::new(0, RTMGRP_LINK))?;
        if let Err(e) = sock.add_membership(RTNLGRP_NSID) {
            tracing::debug!(error = %e, "no namespace id notifications; link ones only");
        }
        if let Err(e) = sock.set_listen_all_namespaces(true) {
            tracing::debug!(error = %e, "link notifications limited to the agent's namespace");
        }
        set_recv_timeout(&sock, poll)?;
        Ok(Self { sock })
    }

    /// Blocks until links change (`true`) or the poll interval passes (`false`).
    pub(crate) fn wait(&self) -> Result<bool, NetlinkError> {
        match self.sock.recv_from_full() {
            // Only the messages' kinds are read: a link notification carries the whole
            // link, statistics included, and a churning node sends thousands.
            Ok((data, _)) => {
                Ok(super::nlmsg::messages(&data).any(|(kind, _)| NOTIFIED.contains(&kind)))
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

/// Link notifications of the agent's namespace (and, where the kernel allows it, of the
/// namespaces with an id in it, which includes veth-attached pods): each `()` means
/// "links changed since you last looked; re-snapshot". Bursts coalesce into one message.
/// The watching thread stops once the receiver is dropped (within a second); the
/// channel closes if notifications fail, leaving the agent's periodic snapshots.
pub(crate) fn watch() -> Result<tokio::sync::mpsc::Receiver<()>, MonitorError> {
    let monitor = LinkMonitor::new(Duration::from_secs(1))?;
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
        .map_err(MonitorError::Thread)?;
    Ok(rx)
}

/// Sets `SO_RCVTIMEO` on a netlink socket, so a blocking receive returns after `timeout`.
pub(super) fn set_recv_timeout(
    sock: &impl std::os::fd::AsRawFd,
    timeout: std::time::Duration,
) -> std::io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
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
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
