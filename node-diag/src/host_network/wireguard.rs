//! A WireGuard device's peers' endpoints and its firewall mark, read over generic netlink
//! (`WG_CMD_GET_DEVICE`, what `wg show` asks): WireGuard keeps no peer in its link
//! attributes, and each peer's endpoint is where its encapsulated packets go.
//!
//! The messages are small and fixed (uapi `linux/wireguard.h`, `linux/genetlink.h`), so
//! they are built and parsed by hand ([`super::nlmsg`]) rather than through another crate.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};
use node_diag_common::{AF_INET, AF_INET6};

use super::{
    nlmsg::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, attrs, exchange, message, put_attr},
    rtnetlink::NetlinkError,
};

/// What the MTU model needs of a WireGuard device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct WgDevice {
    /// The mark its encapsulated packets carry (policy routing may route them by it).
    pub(crate) fwmark: Option<u32>,
    /// Each peer's endpoint, in the order the kernel lists them; peers without one
    /// (they have not yet written to us, nor been given one) are left out.
    pub(crate) endpoints: Vec<IpAddr>,
}

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const WG_GENL_NAME: &str = "wireguard";
const WG_GENL_VERSION: u8 = 1;
const WG_CMD_GET_DEVICE: u8 = 0;
const WGDEVICE_A_IFINDEX: u16 = 1;
const WGDEVICE_A_FWMARK: u16 = 7;
const WGDEVICE_A_PEERS: u16 = 8;
const WGPEER_A_ENDPOINT: u16 = 4;
const GENL_HDRLEN: usize = 4;

/// A generic netlink request: header, `cmd`/`version`, attributes.
fn genl_message(family: u16, flags: u16, cmd: u8, version: u8, attrs: &[u8]) -> Vec<u8> {
    message(family, flags, [cmd, version, 0, 0], attrs)
}

fn u32_of(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?))
}

/// A `struct sockaddr_in`/`sockaddr_in6`'s address.
fn sockaddr_ip(v: &[u8]) -> Option<IpAddr> {
    let family = u16::from_ne_bytes(v.get(..2)?.try_into().ok()?);
    match family {
        AF_INET => Some(Ipv4Addr::from(<[u8; 4]>::try_from(v.get(4..8)?).ok()?).into()),
        AF_INET6 => Some(Ipv6Addr::from(<[u8; 16]>::try_from(v.get(8..24)?).ok()?).into()),
        _ => None,
    }
}

/// Folds one `WG_CMD_GET_DEVICE` reply's generic payload (after its genl header) into
/// `dev`: a device with many peers arrives split over several messages.
pub(crate) fn parse_device(payload: &[u8], dev: &mut WgDevice) {
    for (kind, value) in attrs(payload) {
        match kind {
            WGDEVICE_A_FWMARK => dev.fwmark = u32_of(value).filter(|m| *m != 0),
            WGDEVICE_A_PEERS => {
                for (_, peer) in attrs(value) {
                    let endpoint = attrs(peer)
                        .find(|(k, _)| *k == WGPEER_A_ENDPOINT)
                        .and_then(|(_, v)| sockaddr_ip(v))
                        .filter(|a| !a.is_unspecified());
                    dev.endpoints.extend(endpoint);
                }
            }
            _ => {}
        }
    }
}

/// A generic netlink socket of the calling thread's namespace whose receives give up
/// after a second: a snapshot must never hang on one device's answer.
fn genl_socket() -> Result<Socket, NetlinkError> {
    let mut sock = Socket::new(NETLINK_GENERIC)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    super::nlmsg::set_recv_timeout(&sock, std::time::Duration::from_secs(1))?;
    Ok(sock)
}

/// The id of generic netlink family `name`; `None` when the kernel has no such family
/// (its module is not loaded).
fn family_id(sock: &Socket, name: &str) -> Result<Option<u16>, NetlinkError> {
    let mut name = name.as_bytes().to_vec();
    name.push(0);
    let mut a = Vec::new();
    put_attr(&mut a, CTRL_ATTR_FAMILY_NAME, &name);
    let mut family = None;
    let lookup = genl_message(GENL_ID_CTRL, NLM_F_REQUEST, CTRL_CMD_GETFAMILY, 1, &a);
    match exchange(sock, &lookup, false, |_, payload| {
        for (kind, v) in attrs(payload.get(GENL_HDRLEN..).unwrap_or_default()) {
            if kind == CTRL_ATTR_FAMILY_ID && v.len() >= 2 {
                family = Some(u16::from_ne_bytes([v[0], v[1]]));
            }
        }
    }) {
        Err(NetlinkError::Kernel(code)) if -code == libc::ENOENT => Ok(None),
        r => r.map(|()| family),
    }
}

/// The peers and fwmark of WireGuard device `ifindex` in the calling thread's
/// namespace. `Ok(None)` when the kernel has no WireGuard support.
pub(crate) fn device(ifindex: u32) -> Result<Option<WgDevice>, NetlinkError> {
    let sock = genl_socket()?;
    let Some(family) = family_id(&sock, WG_GENL_NAME)? else {
        return Ok(None);
    };
    let mut a = Vec::new();
    put_attr(&mut a, WGDEVICE_A_IFINDEX, &ifindex.to_ne_bytes());
    let get = genl_message(
        family,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP,
        WG_CMD_GET_DEVICE,
        WG_GENL_VERSION,
        &a,
    );
    let mut dev = WgDevice::default();
    exchange(&sock, &get, true, |kind, payload| {
        if kind == family {
            parse_device(payload.get(GENL_HDRLEN..).unwrap_or_default(), &mut dev);
        }
    })?;
    Ok(Some(dev))
}

/// `WG_CMD_GET_DEVICE` replies as the kernel builds them, for the tests of everything
/// that reads them (this machine's kernel has no WireGuard).
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use crate::host_network::nlmsg::NLA_F_NESTED;

    fn sockaddr(a: IpAddr, port: u16) -> Vec<u8> {
        let mut s = Vec::new();
        match a {
            IpAddr::V4(a) => {
                s.extend_from_slice(&AF_INET.to_ne_bytes());
                s.extend_from_slice(&port.to_be_bytes());
                s.extend_from_slice(&a.octets());
                s.extend_from_slice(&[0; 8]);
            }
            IpAddr::V6(a) => {
                s.extend_from_slice(&AF_INET6.to_ne_bytes());
                s.extend_from_slice(&port.to_be_bytes());
                s.extend_from_slice(&0u32.to_ne_bytes()); // flow info
                s.extend_from_slice(&a.octets());
                s.extend_from_slice(&0u32.to_ne_bytes()); // scope id
            }
        }
        s
    }

    /// The generic payload (after the genl header) of a device with `fwmark` and one
    /// peer per endpoint (`None`: a peer without one).
    pub(crate) fn device_payload(fwmark: u32, endpoints: &[Option<IpAddr>]) -> Vec<u8> {
        let mut peers = Vec::new();
        for (i, ep) in endpoints.iter().enumerate() {
            let mut peer = Vec::new();
            put_attr(&mut peer, 1, &[7; 32]); // public key
            if let Some(ep) = ep {
                put_attr(&mut peer, WGPEER_A_ENDPOINT, &sockaddr(*ep, 51820));
            }
            put_attr(&mut peer, 10, &1u32.to_ne_bytes()); // protocol version
            put_attr(&mut peers, NLA_F_NESTED | i as u16, &peer);
        }
        let mut p = Vec::new();
        put_attr(&mut p, WGDEVICE_A_IFINDEX, &5u32.to_ne_bytes());
        put_attr(&mut p, 2, b"wg0\0");
        put_attr(&mut p, 6, &51820u16.to_ne_bytes()); // listen port
        put_attr(&mut p, WGDEVICE_A_FWMARK, &fwmark.to_ne_bytes());
        put_attr(&mut p, NLA_F_NESTED | WGDEVICE_A_PEERS, &peers);
        p
    }

    /// A device parsed from its fixture payload.
    pub(crate) fn device(fwmark: u32, endpoints: &[Option<IpAddr>]) -> WgDevice {
        let mut dev = WgDevice::default();
        parse_device(&device_payload(fwmark, endpoints), &mut dev);
        dev
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_network::nlmsg::messages;

    #[test]
    fn peers_endpoints_of_both_families_and_the_fwmark() {
        let v6: IpAddr = "fd00:77::2".parse().unwrap();
        let dev = fixtures::device(
            0xca6c,
            &[Some(IpAddr::from([192, 168, 88, 2])), None, Some(v6)],
        );
        assert_eq!(dev.fwmark, Some(0xca6c));
        assert_eq!(dev.endpoints, vec![IpAddr::from([192, 168, 88, 2]), v6]);
        assert_eq!(fixtures::device(0, &[]).fwmark, None, "0 is no mark");
    }

    #[test]
    fn split_replies_accumulate_peers() {
        let mut dev = WgDevice::default();
        parse_device(
            &fixtures::device_payload(0, &[Some(IpAddr::from([10, 0, 0, 1]))]),
            &mut dev,
        );
        parse_device(
            &fixtures::device_payload(0, &[Some(IpAddr::from([10, 0, 0, 2]))]),
            &mut dev,
        );
        assert_eq!(dev.endpoints.len(), 2);
    }

    #[test]
    fn a_request_is_one_well_formed_message() {
        let mut a = Vec::new();
        put_attr(&mut a, CTRL_ATTR_FAMILY_NAME, b"wireguard\0");
        let m = genl_message(GENL_ID_CTRL, NLM_F_REQUEST, CTRL_CMD_GETFAMILY, 1, &a);
        let parsed: Vec<_> = messages(&m).collect();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].0, GENL_ID_CTRL);
        let names: Vec<_> = attrs(&parsed[0].1[GENL_HDRLEN..]).collect();
        assert_eq!(names, vec![(CTRL_ATTR_FAMILY_NAME, &b"wireguard\0"[..])]);
    }

    #[test]
    fn family_lookup_against_this_kernel() {
        // The controller's own family is always there; a made-up one never is.
        let sock = genl_socket().expect("generic netlink socket");
        assert_eq!(family_id(&sock, "nlctrl").unwrap(), Some(GENL_ID_CTRL));
        assert_eq!(family_id(&sock, "no-such-family").unwrap(), None);
        // A dump (every family) ends with its NLMSG_DONE, as WG_CMD_GET_DEVICE's does.
        let dump = genl_message(
            GENL_ID_CTRL,
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP,
            CTRL_CMD_GETFAMILY,
            1,
            &[],
        );
        let mut families = 0;
        exchange(&sock, &dump, true, |kind, _| {
            assert_eq!(kind, GENL_ID_CTRL);
            families += 1;
        })
        .expect("family dump");
        assert!(families >= 1);
    }

    #[test]
    fn no_wireguard_device_here() {
        // This kernel may lack WireGuard (Ok(None)); with it, ifindex 0 is no device,
        // which the kernel refuses. Either way, no peer comes back and nothing panics.
        if let Ok(Some(dev)) = device(0) {
            assert!(dev.endpoints.is_empty());
        }
    }
}
