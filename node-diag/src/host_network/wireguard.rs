//! WireGuard peers' endpoints, which decide the device's outer family and underlay. They
//! are not in its link attributes (the kernel sends no `IFLA_INFO_DATA` for wireguard):
//! WireGuard answers over generic netlink (`WG_CMD_GET_DEVICE`, as `wg show` asks),
//! which needs CAP_NET_ADMIN in the device's namespace.
//!
//! The messages are few and fixed, so they are built and read here byte by byte, after
//! `include/uapi/linux/wireguard.h` and `genetlink.h`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};

use super::rtnetlink::NetlinkError;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_HDRLEN: usize = 16;
const GENL_HDRLEN: usize = 4;
const NLA_HDRLEN: usize = 4;
/// Attribute type bits that are flags (nested, network byte order), not the type.
const NLA_TYPE_MASK: u16 = 0x3fff;

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

const WG_GENL_NAME: &str = "wireguard";
const WG_GENL_VERSION: u8 = 1;
const WG_CMD_GET_DEVICE: u8 = 0;
const WGDEVICE_A_IFINDEX: u16 = 1;
const WGDEVICE_A_PEERS: u16 = 8;
const WGPEER_A_ENDPOINT: u16 = 4;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// The endpoint addresses of WireGuard device `ifindex`'s peers, in the kernel's order;
/// peers without one (not yet heard from, no endpoint configured) are left out.
pub fn peer_endpoints(ifindex: u32) -> Result<Vec<IpAddr>, NetlinkError> {
    let mut sock = Socket::new(NETLINK_GENERIC)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let family = {
        let mut name = WG_GENL_NAME.as_bytes().to_vec();
        name.push(0);
        let request = message(
            GENL_ID_CTRL,
            NLM_F_REQUEST,
            1,
            CTRL_CMD_GETFAMILY,
            1,
            &attr(CTRL_ATTR_FAMILY_NAME, &name),
        );
        let replies = exchange(&sock, &request, false)?;
        replies
            .iter()
            .find_map(|payload| family_id(payload))
            .ok_or_else(|| NetlinkError::Decode("no wireguard family id".into()))?
    };
    let request = message(
        family,
        NLM_F_REQUEST | NLM_F_DUMP,
        2,
        WG_CMD_GET_DEVICE,
        WG_GENL_VERSION,
        &attr(WGDEVICE_A_IFINDEX, &ifindex.to_ne_bytes()),
    );
    let replies = exchange(&sock, &request, true)?;
    Ok(replies
        .iter()
        .flat_map(|payload| endpoints_of(payload))
        .collect())
}

/// The endpoint the MTU model judges a device by: an IPv6 one when any peer has one (its
/// outer header is 20 bytes larger: the device must fit it), else the first.
pub fn representative(endpoints: &[IpAddr]) -> Option<IpAddr> {
    endpoints
        .iter()
        .find(|a| a.is_ipv6())
        .or(endpoints.first())
        .copied()
}

/// A netlink message carrying a generic netlink header and `attrs`.
fn message(kind: u16, flags: u16, seq: u32, cmd: u8, version: u8, attrs: &[u8]) -> Vec<u8> {
    let len = NLMSG_HDRLEN + GENL_HDRLEN + attrs.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[cmd, version, 0, 0]);
    m.extend_from_slice(attrs);
    m
}

/// One attribute, padded to 4 bytes.
fn attr(kind: u16, value: &[u8]) -> Vec<u8> {
    let len = NLA_HDRLEN + value.len();
    let mut a = Vec::with_capacity(align(len));
    a.extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_ne_bytes());
    a.extend_from_slice(&kind.to_ne_bytes());
    a.extend_from_slice(value);
    a.resize(align(len), 0);
    a
}

fn align(len: usize) -> usize {
    (len + 3) & !3
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Sends `request` and returns each reply's payload after the generic netlink header:
/// every part of a dump, else the one answer.
fn exchange(sock: &Socket, request: &[u8], dump: bool) -> Result<Vec<Vec<u8>>, NetlinkError> {
    sock.send(request, 0)?;
    let mut out = Vec::new();
    loop {
        let (data, _) = sock.recv_from_full()?;
        let mut offset = 0;
        while offset + NLMSG_HDRLEN <= data.len() {
            let bad = || NetlinkError::Decode("truncated generic netlink message".into());
            let len = u32_at(&data, offset).ok_or_else(bad)? as usize;
            let kind = u16_at(&data, offset + 4).ok_or_else(bad)?;
            if len < NLMSG_HDRLEN || offset + len > data.len() {
                return Err(bad());
            }
            let body = &data[offset + NLMSG_HDRLEN..offset + len];
            match kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let code = body
                        .get(..4)
                        .map_or(0, |b| i32::from_ne_bytes(b.try_into().unwrap_or_default()));
                    return if code == 0 {
                        Ok(out)
                    } else {
                        Err(NetlinkError::Kernel(code))
                    };
                }
                _ => out.push(body.get(GENL_HDRLEN..).unwrap_or_default().to_vec()),
            }
            offset += align(len);
        }
        if !dump {
            return Ok(out);
        }
    }
}

/// The attributes of `b`: (type without flags, value).
fn attrs(b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut offset = 0;
    std::iter::from_fn(move || {
        let len = usize::from(u16_at(b, offset)?);
        let kind = u16_at(b, offset + 2)? & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || offset + len > b.len() {
            return None;
        }
        let value = &b[offset + NLA_HDRLEN..offset + len];
        offset += align(len);
        Some((kind, value))
    })
}

fn family_id(payload: &[u8]) -> Option<u16> {
    attrs(payload).find_map(|(kind, value)| match kind {
        CTRL_ATTR_FAMILY_ID => u16_at(value, 0),
        _ => None,
    })
}

/// The peers' endpoint addresses in one `WG_CMD_GET_DEVICE` reply.
fn endpoints_of(payload: &[u8]) -> Vec<IpAddr> {
    attrs(payload)
        .filter(|(kind, _)| *kind == WGDEVICE_A_PEERS)
        .flat_map(|(_, peers)| attrs(peers))
        .filter_map(|(_, peer)| {
            attrs(peer).find_map(|(kind, value)| match kind {
                WGPEER_A_ENDPOINT => sockaddr_ip(value),
                _ => None,
            })
        })
        .collect()
}

/// The address of a `struct sockaddr_in` or `sockaddr_in6`.
fn sockaddr_ip(b: &[u8]) -> Option<IpAddr> {
    match u16_at(b, 0)? {
        AF_INET => {
            let a: [u8; 4] = b.get(4..8)?.try_into().ok()?;
            Some(Ipv4Addr::from(a).into())
        }
        AF_INET6 => {
            let a: [u8; 16] = b.get(8..24)?.try_into().ok()?;
            Some(Ipv6Addr::from(a).into())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NLA_F_NESTED: u16 = 0x8000;

    fn sockaddr_in(a: [u8; 4], port: u16) -> Vec<u8> {
        let mut s = AF_INET.to_ne_bytes().to_vec();
        s.extend_from_slice(&port.to_be_bytes());
        s.extend_from_slice(&a);
        s.resize(16, 0);
        s
    }

    fn sockaddr_in6(a: Ipv6Addr, port: u16) -> Vec<u8> {
        let mut s = AF_INET6.to_ne_bytes().to_vec();
        s.extend_from_slice(&port.to_be_bytes());
        s.extend_from_slice(&0u32.to_ne_bytes());
        s.extend_from_slice(&a.octets());
        s.extend_from_slice(&0u32.to_ne_bytes());
        s
    }

    /// A peer as the kernel nests it: public key, endpoint (when known), allowed IPs.
    fn peer(index: u16, endpoint: Option<Vec<u8>>) -> Vec<u8> {
        let mut p = attr(1, &[7; 32]);
        if let Some(e) = endpoint {
            p.extend(attr(WGPEER_A_ENDPOINT, &e));
        }
        p.extend(attr(9 | NLA_F_NESTED, &attr(NLA_F_NESTED, &[])));
        attr(index | NLA_F_NESTED, &p)
    }

    #[test]
    fn reads_peer_endpoints_of_a_device_reply() {
        let mut payload = attr(WGDEVICE_A_IFINDEX, &9u32.to_ne_bytes());
        payload.extend(attr(2, b"wg9\0"));
        let peers = [
            peer(0, Some(sockaddr_in([192, 168, 77, 2], 51820))),
            peer(1, None),
            peer(2, Some(sockaddr_in6("fd00:77::2".parse().unwrap(), 51820))),
        ]
        .concat();
        payload.extend(attr(WGDEVICE_A_PEERS | NLA_F_NESTED, &peers));
        let got = endpoints_of(&payload);
        assert_eq!(
            got,
            [
                IpAddr::from([192, 168, 77, 2]),
                "fd00:77::2".parse::<IpAddr>().unwrap()
            ]
        );
        assert_eq!(representative(&got), Some(got[1]), "IPv6 when any");
        assert_eq!(representative(&got[..1]), Some(got[0]));
        assert_eq!(representative(&[]), None);
        // A device without peers has no endpoints; a truncated one yields what is whole.
        assert!(endpoints_of(&attr(WGDEVICE_A_IFINDEX, &9u32.to_ne_bytes())).is_empty());
        assert!(endpoints_of(&payload[..payload.len() - 3]).len() <= 2);
    }

    #[test]
    fn builds_requests_and_reads_the_family_id() {
        let m = message(
            GENL_ID_CTRL,
            NLM_F_REQUEST,
            1,
            CTRL_CMD_GETFAMILY,
            1,
            &attr(2, b"wireguard\0"),
        );
        assert_eq!(m.len(), NLMSG_HDRLEN + GENL_HDRLEN + 16);
        assert_eq!(u32_at(&m, 0), Some(36));
        assert_eq!(&m[16..20], &[CTRL_CMD_GETFAMILY, 1, 0, 0]);
        assert_eq!(
            u16_at(&m, 20),
            Some(14),
            "attribute length excludes padding"
        );
        let mut reply = attr(CTRL_ATTR_FAMILY_NAME, b"wireguard\0");
        reply.extend(attr(CTRL_ATTR_FAMILY_ID, &0x1bu16.to_ne_bytes()));
        assert_eq!(family_id(&reply), Some(0x1b));
    }

    #[test]
    fn sockaddrs() {
        assert_eq!(
            sockaddr_ip(&sockaddr_in([10, 0, 0, 1], 1)),
            Some(IpAddr::from([10, 0, 0, 1]))
        );
        assert_eq!(
            sockaddr_ip(&sockaddr_in6(Ipv6Addr::LOCALHOST, 1)),
            Some(IpAddr::from(Ipv6Addr::LOCALHOST))
        );
        assert_eq!(sockaddr_ip(&[0; 16]), None, "AF_UNSPEC: no endpoint");
        assert_eq!(sockaddr_ip(&AF_INET6.to_ne_bytes()), None, "truncated");
    }
}
