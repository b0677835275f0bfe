//! The one rtnetlink request/response loop every lookup in this folder goes through, the
//! socket it runs on, and the error all of them report.
//!
//! A socket belongs to the network namespace it was opened in: opened from a thread that
//! entered another namespace (see `namespaces::in_netns`), it answers for that one.

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

#[derive(Debug, thiserror::Error)]
pub(crate) enum NetlinkError {
    #[error("netlink socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("netlink: kernel answered error {0}")]
    Kernel(i32),
    #[error("netlink: undecodable message: {0}")]
    Decode(String),
}

/// Sends `msg` and collects the kernel's replies: every part of a dump (`NLM_F_DUMP`),
/// else the one answer.
pub(super) fn request(
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

/// A route socket of the calling thread's namespace, connected to the kernel.
pub(super) fn socket() -> Result<Socket, NetlinkError> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    Ok(sock)
}
