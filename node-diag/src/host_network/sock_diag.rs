//! One TCP socket's progress through sock_diag (`NETLINK_SOCK_DIAG`, `inet_diag`, what
//! `ss -ti` reads): its state, how many retransmission timeouts in a row it is in, its
//! backoff and MSS. A black hole lives as long as its flow is stuck, and a backed-off
//! flow may retransmit once in two minutes: only the socket can say whether it is
//! still waiting, moved on (an ACK resets its RTO count), shrank its segments or closed.
//!
//! The socket is asked for by its tuple in the calling thread's namespace (the kernel
//! looks the one socket up, no dump).

use std::net::{IpAddr, SocketAddr};

use netlink_sys::{Socket, SocketAddr as NlAddr};

use super::{
    nlmsg::{NLM_F_REQUEST, attrs, exchange, message},
    rtnetlink::NetlinkError,
};

const NETLINK_SOCK_DIAG: isize = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `inet_diag_req_v2.idiag_ext` bit and reply attribute of `struct tcp_info`.
const INET_DIAG_INFO: u16 = 2;
const INET_DIAG_NOCOOKIE: u32 = !0;
/// Reply attribute: the id of the socket's cgroup (v2), sent with every socket.
const INET_DIAG_CGROUP_ID: u16 = 21;
/// `struct inet_diag_msg` before its attributes.
const DIAG_MSG_LEN: usize = 72;
/// The `enum tcp_state`s in which sent data can wait for its ACK: ESTABLISHED,
/// FIN_WAIT1, CLOSE_WAIT, LAST_ACK, CLOSING.
const SENDING_STATES: [u8; 5] = [1, 4, 8, 9, 11];
/// FIN_WAIT2 and TIME_WAIT: the peer acknowledged everything this side sent.
const CLOSED_IN_ORDER: [u8; 2] = [5, 6];

/// What the kernel says of one TCP socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TcpProgress {
    /// `enum tcp_state`.
    pub(crate) state: u8,
    /// Retransmission timeouts in a row for the segment at the head of the queue
    /// (`icsk_retransmits`); 0 once an ACK moved the flow.
    pub(crate) rto_count: u8,
    /// Segments sent and not acknowledged.
    pub(crate) unacked: u32,
    /// The socket's cgroup v2 id (its directory's inode), when the kernel says.
    pub(crate) cgroup_id: Option<u64>,
}

impl TcpProgress {
    /// Whether the socket is waiting on a retransmission timeout: sent data no ACK
    /// has covered since the timer fired.
    pub(crate) fn stuck(&self) -> bool {
        SENDING_STATES.contains(&self.state) && self.rto_count > 0 && self.unacked > 0
    }

    /// Whether an ACK moved the flow since its last timeout (which resets the RTO count),
    /// or its side closed in order (all it sent, its FIN included, acknowledged).
    pub(crate) fn moved(&self) -> bool {
        CLOSED_IN_ORDER.contains(&self.state)
            || (SENDING_STATES.contains(&self.state) && self.rto_count == 0)
    }
}

/// The `struct inet_diag_sockid` of `src -> dst` (ports and addresses in network order).
fn sockid(src: SocketAddr, dst: SocketAddr) -> [u8; 48] {
    let mut id = [0u8; 48];
    id[0..2].copy_from_slice(&src.port().to_be_bytes());
    id[2..4].copy_from_slice(&dst.port().to_be_bytes());
    let put = |slot: &mut [u8], ip: IpAddr| match ip {
        IpAddr::V4(a) => slot[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => slot.copy_from_slice(&a.octets()),
    };
    put(&mut id[4..20], src.ip());
    put(&mut id[20..36], dst.ip());
    // Interface 0 (any), then no cookie: looked up by the tuple alone.
    id[40..44].copy_from_slice(&INET_DIAG_NOCOOKIE.to_ne_bytes());
    id[44..48].copy_from_slice(&INET_DIAG_NOCOOKIE.to_ne_bytes());
    id
}

/// The request for the one socket `src -> dst` of `family` (`AF_INET`, or `AF_INET6`
/// for an IPv6 socket, IPv4-mapped addresses included), with its `tcp_info`.
fn request(family: u8, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    // `struct inet_diag_req_v2`: family, protocol, extensions, pad, then the states
    // (every one) and the socket id.
    let header = [
        family,
        libc::IPPROTO_TCP as u8,
        1 << (INET_DIAG_INFO - 1),
        0,
    ];
    let mut body = Vec::with_capacity(52);
    body.extend_from_slice(&u32::MAX.to_ne_bytes());
    body.extend_from_slice(&sockid(src, dst));
    message(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, header, &body)
}

/// The progress in one `SOCK_DIAG_BY_FAMILY` reply.
fn parse(payload: &[u8]) -> Option<TcpProgress> {
    let state = *payload.get(1)?;
    let attr = |want: u16| {
        attrs(payload.get(DIAG_MSG_LEN..)?)
            .find(|(kind, _)| *kind == want)
            .map(|(_, v)| v)
    };
    let cgroup_id = attr(INET_DIAG_CGROUP_ID)
        .and_then(|v| v.get(..8)?.try_into().ok())
        .map(u64::from_ne_bytes);
    let Some(info) = attr(INET_DIAG_INFO) else {
        // A socket closed in order lives on as a time-wait entry, which has no
        // `tcp_info`: nothing of it waits on a timer.
        return CLOSED_IN_ORDER.contains(&state).then_some(TcpProgress {
            state,
            rto_count: 0,
            unacked: 0,
            cgroup_id,
        });
    };
    let u32_at = |off: usize| {
        info.get(off..off + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
    };
    Some(TcpProgress {
        state,
        rto_count: *info.get(2)?,
        unacked: u32_at(24)?,
        cgroup_id,
    })
}

/// The socket `src -> dst` of `family` in the calling thread's namespace, `None` when it
/// no longer exists.
pub(crate) fn tcp_progress(
    family: u8,
    src: SocketAddr,
    dst: SocketAddr,
) -> Result<Option<TcpProgress>, NetlinkError> {
    let mut sock = Socket::new(NETLINK_SOCK_DIAG)?;
    sock.bind_auto()?;
    sock.connect(&NlAddr::new(0, 0))?;
    super::nlmsg::set_recv_timeout(&sock, std::time::Duration::from_millis(250))?;
    let mut found = None;
    match exchange(&sock, &request(family, src, dst), false, |kind, payload| {
        if kind == SOCK_DIAG_BY_FAMILY {
            found = parse(payload);
        }
    }) {
        Err(NetlinkError::Kernel(code)) if -code == libc::ENOENT => Ok(None),
        r => r.map(|()| found),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read as _, Write as _},
        net::{TcpListener, TcpStream},
    };

    use super::*;

    #[test]
    fn the_request_names_the_socket_by_its_tuple() {
        let m = request(
            libc::AF_INET as u8,
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:80".parse().unwrap(),
        );
        assert_eq!(m.len(), 16 + 56);
        let req = &m[16..];
        assert_eq!(&req[..4], &[libc::AF_INET as u8, 6, 2, 0]);
        assert_eq!(&req[8..10], &40000u16.to_be_bytes());
        assert_eq!(&req[10..12], &80u16.to_be_bytes());
        assert_eq!(&req[12..16], &[10, 0, 0, 1]);
        assert_eq!(&req[28..32], &[10, 0, 0, 2]);
    }

    #[test]
    fn a_live_connection_is_found_and_not_stuck_and_a_closed_one_is_gone() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(server).unwrap();
        let (mut accepted, _) = listener.accept().unwrap();
        client.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        accepted.read_exact(&mut buf).unwrap();
        let local = client.local_addr().unwrap();
        let p = tcp_progress(libc::AF_INET as u8, local, server)
            .unwrap()
            .expect("the client's socket");
        assert_eq!(p.state, 1, "established");
        assert!(!p.stuck(), "{p:?}");
        assert!(p.moved(), "{p:?}");
        drop((client, accepted));
        let gone = "127.0.0.1:9".parse().unwrap();
        assert_eq!(
            tcp_progress(libc::AF_INET as u8, gone, server).unwrap(),
            None
        );
    }

    #[test]
    fn a_time_wait_entry_without_tcp_info_is_closed_in_order() {
        // `inet_diag_msg`: family, state (TIME_WAIT), timer, retrans, then the rest.
        let mut payload = vec![0u8; DIAG_MSG_LEN];
        payload[0] = libc::AF_INET as u8;
        payload[1] = 6;
        let p = parse(&payload).expect("a time-wait entry");
        assert!(p.moved() && !p.stuck(), "{p:?}");
        // Any other state without `tcp_info` says nothing.
        payload[1] = 1;
        assert_eq!(parse(&payload), None);
    }
}
