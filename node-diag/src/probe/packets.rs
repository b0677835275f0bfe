//! The probe's packets, built and parsed with `pnet_packet`: ICMP and ICMPv6 echo
//! requests going out, and on the way back echo replies, ICMP destination unreachable
//! (frag-needed with its RFC 1191 next-hop MTU) and ICMPv6 packet too big, each matched
//! against the probe it quotes and classified as an [`Outcome`].
//!
//! [`Family`] holds the per-family sizes (header overhead, minimum MTU) the search and the
//! report work in.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use pnet_packet::{
    Packet as _,
    icmp::{
        self, IcmpPacket, IcmpTypes,
        destination_unreachable::{DestinationUnreachablePacket, IcmpCodes},
        echo_reply::EchoReplyPacket,
        echo_request::{EchoRequestPacket, MutableEchoRequestPacket},
    },
    icmpv6::{self, Icmpv6Packet, Icmpv6Types},
    ip::IpNextHeaderProtocols,
    ipv4::Ipv4Packet,
    ipv6::Ipv6Packet,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    V4,
    V6,
}

/// IPv4's total-length field (and IPv6's payload-length) cap a packet at 64 KiB.
pub(crate) const MAX_PACKET: u32 = 65_535;
pub(crate) const ICMP_HEADER: u32 = 8;

impl Family {
    pub(crate) fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub(crate) fn ip_header(self) -> u32 {
        match self {
            Family::V4 => 20,
            Family::V6 => 40,
        }
    }

    /// Bytes of IP + ICMP header around the echo payload.
    pub(crate) fn overhead(self) -> u32 {
        self.ip_header() + ICMP_HEADER
    }

    /// The smallest MTU every link must carry (RFC 791 / RFC 8200): the search floor.
    pub(crate) fn min_mtu(self) -> u32 {
        match self {
            Family::V4 => 68,
            Family::V6 => 1280,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// An ICMP (or ICMPv6) echo request with `payload_len` bytes of payload. The IPv4
/// checksum is filled in here; for ICMPv6 the kernel always computes it on raw sockets
/// (it covers a pseudo-header with addresses we do not pick), so it stays zero.
pub(crate) fn build_echo(family: Family, id: u16, seq: u16, payload_len: usize) -> Vec<u8> {
    const SIZED: &str = "the buffer holds an echo header";
    let mut pkt = vec![0; ICMP_HEADER as usize + payload_len];
    // A recognisable pattern (like ping's) makes the probes easy to spot in tcpdump.
    for (i, b) in pkt[ICMP_HEADER as usize..].iter_mut().enumerate() {
        *b = i as u8;
    }
    match family {
        Family::V4 => {
            let mut echo = MutableEchoRequestPacket::new(&mut pkt).expect(SIZED);
            echo.set_icmp_type(IcmpTypes::EchoRequest);
            echo.set_identifier(id);
            echo.set_sequence_number(seq);
            let sum = icmp::checksum(&IcmpPacket::new(echo.packet()).expect(SIZED));
            echo.set_checksum(sum);
        }
        Family::V6 => {
            let mut echo =
                icmpv6::echo_request::MutableEchoRequestPacket::new(&mut pkt).expect(SIZED);
            echo.set_icmpv6_type(Icmpv6Types::EchoRequest);
            echo.set_identifier(id);
            echo.set_sequence_number(seq);
        }
    }
    pkt
}

/// How one probe size fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Echo reply: a packet of this size crosses the path.
    Reply,
    /// ICMP frag-needed (IPv6 packet too big) quoting the probe, from a router on the path.
    FragNeeded {
        next_hop_mtu: Option<u32>,
        from: IpAddr,
    },
    /// Another destination-unreachable code quoting the probe (host or admin
    /// unreachable): no answer will come at this size.
    Unreachable { code: u8, from: IpAddr },
    /// `EMSGSIZE` on send: bigger than the outgoing interface's MTU.
    LocalTooBig,
    /// Nothing came back before the wait ran out.
    Lost,
}

/// Whether `quoted` (the offending packet an ICMP error carries: its IPv4 header and at
/// least 8 bytes of payload) is our echo request `id`/`seq` to `dst`.
fn quotes_our_echo_v4(quoted: &[u8], dst: Ipv4Addr, id: u16, seq: u16) -> bool {
    let Some(ip) = Ipv4Packet::new(quoted) else {
        return false;
    };
    ip.get_header_length() >= 5
        && ip.get_next_level_protocol() == IpNextHeaderProtocols::Icmp
        && Ipv4Addr::from(ip.get_destination().octets()) == dst
        && EchoRequestPacket::new(ip.payload()).is_some_and(|e| {
            e.get_icmp_type() == IcmpTypes::EchoRequest
                && e.get_identifier() == id
                && e.get_sequence_number() == seq
        })
}

/// [`quotes_our_echo_v4`] for IPv6: the fixed 40-byte header and our echo header right
/// behind it (we send no extension headers).
fn quotes_our_echo_v6(quoted: &[u8], dst: Ipv6Addr, id: u16, seq: u16) -> bool {
    let Some(ip) = Ipv6Packet::new(quoted) else {
        return false;
    };
    ip.get_version() == 6
        && ip.get_next_header() == IpNextHeaderProtocols::Icmpv6
        && Ipv6Addr::from(ip.get_destination().octets()) == dst
        && icmpv6::echo_request::EchoRequestPacket::new(ip.payload()).is_some_and(|e| {
            e.get_icmpv6_type() == Icmpv6Types::EchoRequest
                && e.get_identifier() == id
                && e.get_sequence_number() == seq
        })
}

/// Classifies an IPv4 packet read from a raw ICMP socket (IP header included) against
/// probe `id`/`seq` sent to `dst`. `None` when it is somebody else's ICMP.
pub(crate) fn parse_v4(pkt: &[u8], dst: Ipv4Addr, id: u16, seq: u16) -> Option<Outcome> {
    let ip = Ipv4Packet::new(pkt)?;
    if ip.get_version() != 4
        || ip.get_header_length() < 5
        || ip.get_next_level_protocol() != IpNextHeaderProtocols::Icmp
    {
        return None;
    }
    // Through octets: pnet's address types are `no_std_net`'s without its `std` feature.
    let src = Ipv4Addr::from(ip.get_source().octets());
    let icmp = IcmpPacket::new(ip.payload())?;
    match icmp.get_icmp_type() {
        IcmpTypes::EchoReply => {
            let reply = EchoReplyPacket::new(icmp.packet())?;
            (src == dst && reply.get_identifier() == id && reply.get_sequence_number() == seq)
                .then_some(Outcome::Reply)
        }
        IcmpTypes::DestinationUnreachable => {
            // RFC 792: 4 unused bytes (RFC 1191: the low two carry the next-hop MTU), then
            // the offending IP header and at least 8 bytes of its payload: our echo header.
            let unreach = DestinationUnreachablePacket::new(icmp.packet())?;
            if !quotes_our_echo_v4(unreach.payload(), dst, id, seq) {
                return None;
            }
            let from = IpAddr::V4(src);
            Some(match unreach.get_icmp_code() {
                IcmpCodes::FragmentationRequiredAndDFFlagSet => Outcome::FragNeeded {
                    // Pre-RFC 1191 routers send 0: no hint.
                    next_hop_mtu: Some(u32::from(unreach.get_next_hop_mtu())).filter(|m| *m != 0),
                    from,
                },
                code => Outcome::Unreachable { code: code.0, from },
            })
        }
        _ => None,
    }
}

/// Classifies an ICMPv6 message read from a raw ICMPv6 socket (no IP header: the
/// kernel strips it, the sender comes from `recvfrom`) against probe `id`/`seq` to `dst`.
pub(crate) fn parse_v6(
    icmp: &[u8],
    from: Ipv6Addr,
    dst: Ipv6Addr,
    id: u16,
    seq: u16,
) -> Option<Outcome> {
    let msg = Icmpv6Packet::new(icmp)?;
    match msg.get_icmpv6_type() {
        Icmpv6Types::EchoReply => {
            let reply = icmpv6::echo_reply::EchoReplyPacket::new(icmp)?;
            (from == dst && reply.get_identifier() == id && reply.get_sequence_number() == seq)
                .then_some(Outcome::Reply)
        }
        kind @ (Icmpv6Types::PacketTooBig | Icmpv6Types::DestinationUnreachable) => {
            // 4 bytes (the MTU for packet too big, RFC 4443 3.2), then as much of the
            // offending packet as fits.
            let (word, quoted) = msg.payload().split_first_chunk::<4>()?;
            if !quotes_our_echo_v6(quoted, dst, id, seq) {
                return None;
            }
            let from = IpAddr::V6(from);
            Some(if kind == Icmpv6Types::PacketTooBig {
                Outcome::FragNeeded {
                    next_hop_mtu: Some(u32::from_be_bytes(*word)).filter(|m| *m != 0),
                    from,
                }
            } else {
                Outcome::Unreachable {
                    code: msg.get_icmpv6_code().0,
                    from,
                }
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use pnet_packet::{
        icmp::destination_unreachable::MutableDestinationUnreachablePacket,
        ipv4::{self, MutableIpv4Packet},
        ipv6::MutableIpv6Packet,
        util,
    };

    use super::*;

    const DST4: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 9);
    const ROUTER4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

    /// An IPv4 header (no options) with the given addresses around `payload`.
    fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0; 20 + payload.len()];
        let mut ip = MutableIpv4Packet::new(&mut p).unwrap();
        ip.set_version(4);
        ip.set_header_length(5);
        ip.set_total_length((20 + payload.len()) as u16);
        ip.set_flags(ipv4::Ipv4Flags::DontFragment);
        ip.set_ttl(64);
        ip.set_next_level_protocol(IpNextHeaderProtocols::Icmp);
        ip.set_source(src.octets().into());
        ip.set_destination(dst.octets().into());
        ip.set_payload(payload);
        let sum = ipv4::checksum(&ip.to_immutable());
        ip.set_checksum(sum);
        p
    }

    fn echo_reply_v4(id: u16, seq: u16, payload_len: usize) -> Vec<u8> {
        let mut icmp = build_echo(Family::V4, id, seq, payload_len);
        icmp[0] = IcmpTypes::EchoReply.0;
        let sum = icmp::checksum(&IcmpPacket::new(&icmp).unwrap());
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        ipv4(DST4, ROUTER4, &icmp)
    }

    fn frag_needed_v4(quoted_dst: Ipv4Addr, id: u16, seq: u16, mtu: u16) -> Vec<u8> {
        let probe = ipv4(
            Ipv4Addr::new(10, 244, 1, 7),
            quoted_dst,
            &build_echo(Family::V4, id, seq, 1472),
        );
        // Routers quote the header and the first 8 bytes (Linux quotes more).
        let mut icmp = vec![0; 8 + 28];
        let mut msg = MutableDestinationUnreachablePacket::new(&mut icmp).unwrap();
        msg.set_icmp_type(IcmpTypes::DestinationUnreachable);
        msg.set_icmp_code(IcmpCodes::FragmentationRequiredAndDFFlagSet);
        msg.set_next_hop_mtu(mtu);
        msg.set_payload(&probe[..28]);
        let sum = icmp::checksum(&IcmpPacket::new(msg.packet()).unwrap());
        msg.set_checksum(sum);
        ipv4(ROUTER4, Ipv4Addr::new(10, 244, 1, 7), &icmp)
    }

    #[test]
    fn checksum_matches_rfc1071_examples() {
        // pnet skips the 16-bit word at the index given (the checksum field); past the
        // end, it sums every word.
        let all = usize::MAX;
        // RFC 1071 section 3: the one's-complement sum of these words is 0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(util::checksum(&data, all), !0xddf2);
        // Odd length: the last byte is padded on the right.
        assert_eq!(util::checksum(&[0x12], all), !0x1200);
        // A packet carrying its own checksum sums to zero.
        let pkt = build_echo(Family::V4, 0xbeef, 7, 13);
        assert_eq!(util::checksum(&pkt, all), 0);
        let reply = echo_reply_v4(1, 2, 3);
        assert_eq!(util::checksum(&reply[..20], all), 0, "IPv4 header");
        assert_eq!(util::checksum(&reply[20..], all), 0, "echo reply");
    }

    #[test]
    fn builds_echo_requests() {
        let pkt = build_echo(Family::V4, 0x1234, 0x0102, 1472);
        assert_eq!(pkt.len(), 1480, "8-byte header + payload");
        assert_eq!(&pkt[..2], &[IcmpTypes::EchoRequest.0, 0]);
        assert_eq!(&pkt[4..8], &[0x12, 0x34, 0x01, 0x02]);
        assert_eq!(pkt[8..12], [0, 1, 2, 3]);
        let v6 = build_echo(Family::V6, 1, 2, 0);
        assert_eq!(v6, vec![Icmpv6Types::EchoRequest.0, 0, 0, 0, 0, 1, 0, 2]);
        assert_eq!(Family::V4.overhead() + 1472, 1500, "1500 − 20 − 8 = 1472");
        assert_eq!(Family::V6.overhead(), 48);
    }

    #[test]
    fn matches_only_our_echo_reply() {
        let reply = echo_reply_v4(0x1234, 9, 100);
        assert_eq!(parse_v4(&reply, DST4, 0x1234, 9), Some(Outcome::Reply));
        assert_eq!(parse_v4(&reply, DST4, 0x1234, 8), None, "older sequence");
        assert_eq!(parse_v4(&reply, DST4, 0x4321, 9), None, "someone else's id");
        assert_eq!(
            parse_v4(&reply, ROUTER4, 0x1234, 9),
            None,
            "from another host"
        );
        assert_eq!(parse_v4(&reply[..22], DST4, 0x1234, 9), None, "truncated");
        let mut request = reply.clone();
        request[20] = IcmpTypes::EchoRequest.0;
        assert_eq!(
            parse_v4(&request, DST4, 0x1234, 9),
            None,
            "our own request looped back"
        );
        assert_eq!(parse_v4(&[], DST4, 0, 0), None);
    }

    #[test]
    fn parses_frag_needed_quoting_our_probe() {
        let msg = frag_needed_v4(DST4, 0x1234, 9, 1450);
        assert_eq!(
            parse_v4(&msg, DST4, 0x1234, 9),
            Some(Outcome::FragNeeded {
                next_hop_mtu: Some(1450),
                from: IpAddr::V4(ROUTER4)
            })
        );
        assert_eq!(
            parse_v4(&msg, DST4, 0x1234, 10),
            None,
            "quotes another probe"
        );
        let other = frag_needed_v4(Ipv4Addr::new(10, 0, 0, 1), 0x1234, 9, 1450);
        assert_eq!(
            parse_v4(&other, DST4, 0x1234, 9),
            None,
            "quotes another destination"
        );
        // RFC 792 routers leave the MTU field zero.
        let old = frag_needed_v4(DST4, 0x1234, 9, 0);
        assert_eq!(
            parse_v4(&old, DST4, 0x1234, 9),
            Some(Outcome::FragNeeded {
                next_hop_mtu: None,
                from: IpAddr::V4(ROUTER4)
            })
        );
        // Another unreachable code quoting our probe.
        let mut host = msg.clone();
        host[21] = 1;
        assert_eq!(
            parse_v4(&host, DST4, 0x1234, 9),
            Some(Outcome::Unreachable {
                code: 1,
                from: IpAddr::V4(ROUTER4)
            })
        );
        // Cut inside the quoted echo header: cannot be ours.
        assert_eq!(parse_v4(&msg[..20 + 8 + 20 + 4], DST4, 0x1234, 9), None);
    }

    #[test]
    fn parses_ipv6_reply_and_packet_too_big() {
        let dst: Ipv6Addr = "fd00::2".parse().unwrap();
        let router: Ipv6Addr = "fd00::1".parse().unwrap();
        let mut reply = build_echo(Family::V6, 7, 3, 16);
        reply[0] = Icmpv6Types::EchoReply.0;
        assert_eq!(parse_v6(&reply, dst, dst, 7, 3), Some(Outcome::Reply));
        assert_eq!(parse_v6(&reply, router, dst, 7, 3), None);

        let echo = build_echo(Family::V6, 7, 3, 1452);
        let mut quoted = vec![0; 40 + echo.len()];
        let mut ip = MutableIpv6Packet::new(&mut quoted).unwrap();
        ip.set_version(6);
        ip.set_payload_length(echo.len() as u16);
        ip.set_next_header(IpNextHeaderProtocols::Icmpv6);
        ip.set_hop_limit(64);
        ip.set_source("fd00::9".parse::<Ipv6Addr>().unwrap().segments().into());
        ip.set_destination(dst.segments().into());
        ip.set_payload(&echo);
        let mut ptb = vec![Icmpv6Types::PacketTooBig.0, 0, 0, 0];
        ptb.extend_from_slice(&1400u32.to_be_bytes());
        // RFC 4443: as much of the packet as fits in the minimum MTU.
        ptb.extend_from_slice(&quoted[..1280 - 40 - 8]);
        assert_eq!(
            parse_v6(&ptb, router, dst, 7, 3),
            Some(Outcome::FragNeeded {
                next_hop_mtu: Some(1400),
                from: IpAddr::V6(router)
            })
        );
        assert_eq!(parse_v6(&ptb, router, dst, 7, 4), None);
        let mut unreach = ptb.clone();
        unreach[0] = Icmpv6Types::DestinationUnreachable.0;
        unreach[1] = 3;
        assert_eq!(
            parse_v6(&unreach, router, dst, 7, 3),
            Some(Outcome::Unreachable {
                code: 3,
                from: IpAddr::V6(router)
            })
        );
    }
}
