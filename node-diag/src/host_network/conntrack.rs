//! Where this node's NAT sent a connection, asked of conntrack over ctnetlink
//! (`IPCTNL_MSG_CT_GET` by original tuple, what `conntrack -G` sends): a Service address
//! DNATed to a backend keeps the VIP in the client's socket, while the entry's reply
//! tuple comes from the backend.
//!
//! This serves the verdicts without local evidence on the translated packets (a backend
//! refusing, SYNs lost beyond this node). A packet dropped on this node after NAT never
//! has a confirmed entry to ask about; the kernel hooks read its entry from the skb
//! instead (the eBPF `nat` module).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use netlink_sys::{Socket, SocketAddr as NlAddr, protocols::NETLINK_NETFILTER};

use super::{
    nlmsg::{NLA_F_NESTED, NLM_F_REQUEST, attrs, exchange, message, put_attr},
    rtnetlink::NetlinkError,
};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const NFGENMSG_LEN: usize = 4;

/// A conntrack tuple's TCP/UDP endpoints.
fn put_tuple(buf: &mut Vec<u8>, kind: u16, proto: u8, src: SocketAddr, dst: SocketAddr) {
    let mut ip = Vec::new();
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            put_attr(&mut ip, CTA_IP_V4_SRC, &s.octets());
            put_attr(&mut ip, CTA_IP_V4_DST, &d.octets());
        }
        (s, d) => {
            put_attr(&mut ip, CTA_IP_V6_SRC, &v6(s).octets());
            put_attr(&mut ip, CTA_IP_V6_DST, &v6(d).octets());
        }
    }
    let mut l4 = Vec::new();
    put_attr(&mut l4, CTA_PROTO_NUM, &[proto]);
    put_attr(&mut l4, CTA_PROTO_SRC_PORT, &src.port().to_be_bytes());
    put_attr(&mut l4, CTA_PROTO_DST_PORT, &dst.port().to_be_bytes());
    let mut tuple = Vec::new();
    put_attr(&mut tuple, NLA_F_NESTED | CTA_TUPLE_IP, &ip);
    put_attr(&mut tuple, NLA_F_NESTED | CTA_TUPLE_PROTO, &l4);
    put_attr(buf, NLA_F_NESTED | kind, &tuple);
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// The `IPCTNL_MSG_CT_GET` request for the entry whose original tuple is `src -> dst`.
fn get_request(proto: u8, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let family = if src.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    } as u8;
    let mut a = Vec::new();
    put_tuple(&mut a, CTA_TUPLE_ORIG, proto, src, dst);
    message(
        (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET,
        NLM_F_REQUEST,
        [family, 0, 0, 0],
        &a,
    )
}

/// The source of an entry's reply tuple (after the `nfgenmsg` header): who answers.
pub(crate) fn reply_source(payload: &[u8]) -> Option<SocketAddr> {
    let (_, tuple) = attrs(payload.get(NFGENMSG_LEN..)?).find(|(k, _)| *k == CTA_TUPLE_REPLY)?;
    let (mut ip, mut port) = (None, None);
    for (kind, value) in attrs(tuple) {
        match kind {
            CTA_TUPLE_IP => {
                for (k, v) in attrs(value) {
                    match k {
                        CTA_IP_V4_SRC => {
                            ip = <[u8; 4]>::try_from(v)
                                .ok()
                                .map(|o| Ipv4Addr::from(o).into());
                        }
                        CTA_IP_V6_SRC => {
                            ip = <[u8; 16]>::try_from(v)
                                .ok()
                                .map(|o| Ipv6Addr::from(o).into());
                        }
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                port = attrs(value)
                    .find(|(k, _)| *k == CTA_PROTO_SRC_PORT)
                    .and_then(|(_, v)| <[u8; 2]>::try_from(v).ok())
                    .map(u16::from_be_bytes);
            }
            _ => {}
        }
    }
    Some(SocketAddr::new(ip?, port?))
}

/// Where the calling thread's namespace's conntrack sent the connection `src -> dst`
/// (`proto`: IPPROTO_TCP, ...): the entry's reply source when NAT changed the
/// destination, `None` when it did not or there is no such entry.
pub(crate) fn translated_destination(
    proto: u8,
    src: SocketAddr,
    dst: SocketAddr,
) -> Result<Option<SocketAddr>, NetlinkError> {
    let mut sock = Socket::new(NETLINK_NETFILTER)?;
    sock.bind_auto()?;
    sock.connect(&NlAddr::new(0, 0))?;
    // A finding waits for this answer: never longer than a moment.
    super::nlmsg::set_recv_timeout(&sock, std::time::Duration::from_millis(250))?;
    let mut answer = None;
    let reply = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW;
    match exchange(
        &sock,
        &get_request(proto, src, dst),
        false,
        |kind, payload| {
            if kind == reply {
                answer = reply_source(payload);
            }
        },
    ) {
        Err(NetlinkError::Kernel(code)) if -code == libc::ENOENT => return Ok(None),
        r => r?,
    }
    Ok(answer.filter(|backend| *backend != dst))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_network::nlmsg::messages;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_reply_tuple_of_a_dnat_entry_names_the_backend() {
        // An entry as the kernel sends it: original pod -> VIP, reply backend -> pod.
        let mut payload = vec![libc::AF_INET as u8, 0, 0, 0];
        put_tuple(
            &mut payload,
            CTA_TUPLE_ORIG,
            6,
            addr("10.244.1.7:40000"),
            addr("10.96.0.10:80"),
        );
        put_tuple(
            &mut payload,
            CTA_TUPLE_REPLY,
            6,
            addr("10.244.2.9:8080"),
            addr("10.244.1.7:40000"),
        );
        assert_eq!(reply_source(&payload), Some(addr("10.244.2.9:8080")));
        assert_eq!(reply_source(&payload[..4]), None);
    }

    #[test]
    fn a_request_is_one_ctnetlink_get() {
        let m = get_request(6, addr("[fd00::1]:40000"), addr("[fd00::2]:80"));
        let parsed: Vec<_> = messages(&m).collect();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].0, 0x101);
        assert_eq!(parsed[0].1[0], libc::AF_INET6 as u8);
    }

    #[test]
    fn no_entry_is_no_translation() {
        // Nothing in this namespace talks to TEST-NET-3 port 9.
        let got = translated_destination(6, addr("192.0.2.1:40000"), addr("203.0.113.9:9"));
        assert!(
            matches!(got, Ok(None) | Err(NetlinkError::Kernel(_))),
            "{got:?}"
        );
    }
}
