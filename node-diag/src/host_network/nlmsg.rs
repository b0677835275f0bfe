//! Raw netlink messages for the families the `netlink-packet-*` crates do not cover
//! (generic netlink's WireGuard, nfnetlink's conntrack): the messages node-diag sends
//! there are few and small, so they are built and parsed by hand, once, here.

use netlink_sys::Socket;

use super::rtnetlink::NetlinkError;

pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;
pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLA_F_NESTED: u16 = 0x8000;
const NLA_F_NET_BYTEORDER: u16 = 0x4000;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);
const NLMSG_HDRLEN: usize = 16;

/// Sets `SO_RCVTIMEO` on a netlink socket, so a blocking receive returns after `timeout`.
pub(crate) fn set_recv_timeout(
    sock: &impl std::os::fd::AsFd,
    timeout: std::time::Duration,
) -> std::io::Result<()> {
    socket2::SockRef::from(sock).set_read_timeout(Some(timeout))
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends attribute `kind` holding `value`.
pub(crate) fn put_attr(buf: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(align4(buf.len()), 0);
}

/// A request: the netlink header, the family's 4-byte header (genl's `cmd`/`version`,
/// nfnetlink's `nfgenmsg`), attributes.
pub(crate) fn message(kind: u16, flags: u16, family_header: [u8; 4], attrs: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + family_header.len() + attrs.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
    m.extend_from_slice(&family_header);
    m.extend_from_slice(attrs);
    m
}

/// The attributes in `buf`, as (type without flags, value).
pub(crate) fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let value = &buf[4..len];
        buf = &buf[align4(len).min(buf.len())..];
        Some((kind, value))
    })
}

/// One reply datagram's messages: (type, payload after the netlink header).
pub(crate) fn messages(data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    messages_with_flags(data).map(|(kind, _, payload)| (kind, payload))
}

/// [`messages`], with each one's flags (`NLM_F_DUMP_INTR`...).
pub(crate) fn messages_with_flags(mut data: &[u8]) -> impl Iterator<Item = (u16, u16, &[u8])> {
    std::iter::from_fn(move || {
        if data.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes(data[..4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        let flags = u16::from_ne_bytes([data[6], data[7]]);
        if len < NLMSG_HDRLEN || len > data.len() {
            return None;
        }
        let payload = &data[NLMSG_HDRLEN..len];
        data = &data[align4(len).min(data.len())..];
        Some((kind, flags, payload))
    })
}

/// Sends `msg` and hands each reply payload to `each` until the answer is complete: for
/// a dump, its `NLMSG_DONE`; otherwise the first datagram, which holds the one answer.
pub(crate) fn exchange(
    sock: &Socket,
    msg: &[u8],
    dump: bool,
    mut each: impl FnMut(u16, &[u8]),
) -> Result<(), NetlinkError> {
    sock.send(msg, 0)?;
    loop {
        let (data, _) = sock.recv_from_full()?;
        let mut done = !dump;
        for (kind, payload) in messages(&data) {
            match kind {
                NLMSG_DONE => done = true,
                NLMSG_ERROR => {
                    let code = payload
                        .get(..4)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, i32::from_ne_bytes);
                    if code != 0 {
                        return Err(NetlinkError::Kernel(code));
                    }
                    // The acknowledgement ends the exchange.
                    done = true;
                }
                _ => each(kind, payload),
            }
        }
        if done || data.is_empty() {
            return Ok(());
        }
    }
}
