//! `node-diag probe DST`: the path MTU to DST and whether PMTUD works on the way, found
//! the way `ping -M do -s N` would, plus an optional TCP connect check.
//!
//! - The outgoing interface and its MTU come from the kernel's route to DST (rtnetlink
//!   `RTM_GETROUTE`, then the link), so the search starts at the largest packet this
//!   node could send at all.
//! - Probes are ICMP echo requests on a raw socket with `IP_PMTUDISC_PROBE`
//!   (`IPV6_PMTUDISC_PROBE`): DF set, and the kernel's cached path MTU ignored, so every
//!   size really goes out and a local `EMSGSIZE` only means "bigger than the interface".
//! - Each size is classified ([`Outcome`]): an echo reply means it fits; an ICMP
//!   frag-needed (IPv6 packet too big) quoting our probe means a router refused it and
//!   said which MTU it has; silence, twice, means it vanished, which is what a PMTUD black
//!   hole looks like from the sender. [`search`] binary-searches the largest size that
//!   fits over an abstract probe function, so it is tested without sockets.
//! - `--port` classifies a TCP connect to DST:P as ok, refused, timed out or unreachable.
//!
//! Sizes are IP packet sizes throughout (ICMP payload + 28 for IPv4, + 48 for IPv6), the
//! unit MTUs are given in. Every wait is bounded by `--timeout-ms`.

use std::{
    fmt::Write as _,
    io::{self, ErrorKind},
    mem::MaybeUninit,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs},
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    link::{LinkAttribute, LinkMessage},
    route::{RouteAddress, RouteAttribute, RouteMessage},
};
use netlink_sys::{Socket as NlSocket, SocketAddr as NlSocketAddr, protocols::NETLINK_ROUTE};
use serde::Serialize;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("invalid destination {0:?}: expected an IPv4 or IPv6 address or a resolvable name")]
    BadDestination(String),
    #[error("cannot probe {0}: the destination must be a unicast address")]
    NotUnicast(IpAddr),
    #[error("no route to {0} from this network namespace")]
    NoRoute(IpAddr),
    #[error("route lookup for {dst}: {reason}")]
    Route { dst: IpAddr, reason: String },
    #[error(
        "opening a raw ICMP socket needs CAP_NET_RAW: run as root or grant the capability ({0})"
    )]
    NoRawSocket(io::Error),
    #[error("raw ICMP socket: {0}")]
    Socket(io::Error),
    #[error("sending a {size}-byte probe to {dst}: {source}")]
    Send {
        dst: IpAddr,
        size: u32,
        source: io::Error,
    },
    #[error("receiving ICMP: {0}")]
    Receive(io::Error),
}

/// What `node-diag probe` was asked to do.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Address (or name) to probe.
    pub dst: String,
    /// TCP port to connect to, if any.
    pub port: Option<u16>,
    /// Bound on every wait: each echo, and the TCP connect.
    pub timeout: Duration,
    /// Largest packet size to try, when lower than the interface MTU.
    pub max_mtu: Option<u32>,
}

// ---------------------------------------------------------------------------------------
// Address families
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// IPv4's total-length field (and IPv6's payload-length) cap a packet at 64 KiB.
const MAX_PACKET: u32 = 65_535;
const ICMP_HEADER: u32 = 8;

impl Family {
    fn of(addr: IpAddr) -> Family {
        match addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    fn ip_header(self) -> u32 {
        match self {
            Family::V4 => 20,
            Family::V6 => 40,
        }
    }

    /// Bytes of IP + ICMP header around the echo payload.
    pub fn overhead(self) -> u32 {
        self.ip_header() + ICMP_HEADER
    }

    /// The smallest MTU every link must carry (RFC 791 / RFC 8200): the search floor.
    fn min_mtu(self) -> u32 {
        match self {
            Family::V4 => 68,
            Family::V6 => 1280,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    fn echo_request(self) -> u8 {
        match self {
            Family::V4 => ICMP_ECHO_REQUEST,
            Family::V6 => ICMP6_ECHO_REQUEST,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Packets
// ---------------------------------------------------------------------------------------

const ICMP_ECHO_REPLY: u8 = 0;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_FRAG_NEEDED: u8 = 4;
const ICMP_ECHO_REQUEST: u8 = 8;
const ICMP6_DEST_UNREACH: u8 = 1;
const ICMP6_PACKET_TOO_BIG: u8 = 2;
const ICMP6_ECHO_REQUEST: u8 = 128;
const ICMP6_ECHO_REPLY: u8 = 129;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_ICMPV6: u8 = 58;

/// The Internet checksum (RFC 1071): one's complement of the one's-complement sum of
/// 16-bit big-endian words, an odd last byte padded with zero.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        sum += u32::from(u16::from_be_bytes([*last, 0]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An ICMP (or ICMPv6) echo request with `payload_len` bytes of payload. The IPv4
/// checksum is filled in here; for ICMPv6 the kernel always computes it on raw sockets
/// (it covers a pseudo-header with addresses we do not pick), so it stays zero.
pub fn build_echo(family: Family, id: u16, seq: u16, payload_len: usize) -> Vec<u8> {
    let mut pkt = Vec::with_capacity(ICMP_HEADER as usize + payload_len);
    pkt.extend_from_slice(&[family.echo_request(), 0, 0, 0]);
    pkt.extend_from_slice(&id.to_be_bytes());
    pkt.extend_from_slice(&seq.to_be_bytes());
    // A recognisable pattern (like ping's) makes the probes easy to spot in tcpdump.
    pkt.extend((0..payload_len).map(|i| i as u8));
    if family == Family::V4 {
        let sum = checksum(&pkt);
        pkt[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    pkt
}

/// How one probe size fared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
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

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// Whether `icmp` (an ICMP header and what follows) is our echo request `id`/`seq`.
fn is_our_echo(icmp: &[u8], family: Family, id: u16, seq: u16) -> bool {
    icmp.first() == Some(&family.echo_request())
        && be16(icmp, 4) == Some(id)
        && be16(icmp, 6) == Some(seq)
}

/// Classifies an IPv4 packet read from a raw ICMP socket (IP header included) against
/// probe `id`/`seq` sent to `dst`. `None` when it is somebody else's ICMP.
pub fn parse_v4(pkt: &[u8], dst: Ipv4Addr, id: u16, seq: u16) -> Option<Outcome> {
    let ihl = usize::from(pkt.first()? & 0x0f) * 4;
    if pkt.first()? >> 4 != 4 || ihl < 20 || *pkt.get(9)? != IPPROTO_ICMP {
        return None;
    }
    let src = Ipv4Addr::from(<[u8; 4]>::try_from(pkt.get(12..16)?).ok()?);
    let icmp = pkt.get(ihl..)?;
    match *icmp.first()? {
        ICMP_ECHO_REPLY => {
            (src == dst && be16(icmp, 4)? == id && be16(icmp, 6)? == seq).then_some(Outcome::Reply)
        }
        ICMP_DEST_UNREACH => {
            // RFC 792: 4 unused bytes (RFC 1191: the low two carry the next-hop MTU), then
            // the offending IP header and at least 8 bytes of its payload: our echo header.
            let quoted = icmp.get(8..)?;
            let qihl = usize::from(quoted.first()? & 0x0f) * 4;
            let qdst = Ipv4Addr::from(<[u8; 4]>::try_from(quoted.get(16..20)?).ok()?);
            if qihl < 20
                || *quoted.get(9)? != IPPROTO_ICMP
                || qdst != dst
                || !is_our_echo(quoted.get(qihl..)?, Family::V4, id, seq)
            {
                return None;
            }
            let from = IpAddr::V4(src);
            Some(match icmp[1] {
                ICMP_FRAG_NEEDED => Outcome::FragNeeded {
                    // Pre-RFC 1191 routers send 0: no hint.
                    next_hop_mtu: Some(u32::from(be16(icmp, 6)?)).filter(|m| *m != 0),
                    from,
                },
                code => Outcome::Unreachable { code, from },
            })
        }
        _ => None,
    }
}

/// Classifies an ICMPv6 message read from a raw ICMPv6 socket (no IP header: the
/// kernel strips it, the sender comes from `recvfrom`) against probe `id`/`seq` to `dst`.
pub fn parse_v6(icmp: &[u8], from: Ipv6Addr, dst: Ipv6Addr, id: u16, seq: u16) -> Option<Outcome> {
    match *icmp.first()? {
        ICMP6_ECHO_REPLY => {
            (from == dst && be16(icmp, 4)? == id && be16(icmp, 6)? == seq).then_some(Outcome::Reply)
        }
        kind @ (ICMP6_PACKET_TOO_BIG | ICMP6_DEST_UNREACH) => {
            // 4 bytes (the MTU for packet too big), then as much of the offending packet
            // as fits: its fixed 40-byte header and our echo header right behind it (we
            // send no extension headers).
            let quoted = icmp.get(8..)?;
            let qdst = Ipv6Addr::from(<[u8; 16]>::try_from(quoted.get(24..40)?).ok()?);
            if quoted.first()? >> 4 != 6
                || *quoted.get(6)? != IPPROTO_ICMPV6
                || qdst != dst
                || !is_our_echo(quoted.get(40..)?, Family::V6, id, seq)
            {
                return None;
            }
            let from = IpAddr::V6(from);
            Some(if kind == ICMP6_PACKET_TOO_BIG {
                let mtu = u32::from_be_bytes(icmp.get(4..8)?.try_into().ok()?);
                Outcome::FragNeeded {
                    next_hop_mtu: Some(mtu).filter(|m| *m != 0),
                    from,
                }
            } else {
                Outcome::Unreachable {
                    code: icmp[1],
                    from,
                }
            })
        }
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// The search
// ---------------------------------------------------------------------------------------

/// A frag-needed (packet too big) message a probe drew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragNeeded {
    /// Size of the probe it refused.
    pub size: u32,
    pub next_hop_mtu: Option<u32>,
    pub from: IpAddr,
}

/// What the binary search found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Search {
    /// Largest size that got an echo reply; `None` when even the smallest did not.
    pub path_mtu: Option<u32>,
    pub frag_needed: Vec<FragNeeded>,
    /// Sizes that drew nothing, twice (ascending).
    pub vanished: Vec<u32>,
    /// Sizes the local interface refused (`EMSGSIZE`).
    pub local_too_big: Vec<u32>,
    /// A non-MTU destination-unreachable that a probe drew: `(size, code, from)`.
    pub unreachable: Option<(u32, u8, IpAddr)>,
    /// Echo requests sent (retries included).
    pub probes: u32,
}

/// Finds the largest size in `min..=max` that `probe` reports as fitting.
///
/// `min` goes first, to tell "the destination does not answer at all" from MTU trouble;
/// then `max`, the common case where the whole local MTU fits. After that it bisects
/// between the largest size that fitted and the smallest that did not, except that a
/// frag-needed naming a next-hop MTU is tried at once (and then that MTU + 1), so a
/// working PMTUD path converges in four probes. A size that draws nothing is retried
/// once before it counts as vanished, so one lost packet is not a black hole.
pub fn search<E>(
    min: u32,
    max: u32,
    mut probe: impl FnMut(u32) -> Result<Outcome, E>,
) -> Result<Search, E> {
    let mut s = Search::default();
    let mut attempt = |s: &mut Search, size: u32| -> Result<Outcome, E> {
        s.probes += 1;
        let outcome = probe(size)?;
        if outcome != Outcome::Lost {
            return Ok(outcome);
        }
        s.probes += 1;
        probe(size)
    };

    match attempt(&mut s, min)? {
        Outcome::Reply => {}
        Outcome::Unreachable { code, from } => {
            s.unreachable = Some((min, code, from));
            return Ok(s);
        }
        Outcome::FragNeeded { next_hop_mtu, from } => {
            s.frag_needed.push(FragNeeded {
                size: min,
                next_hop_mtu,
                from,
            });
            return Ok(s);
        }
        Outcome::LocalTooBig => {
            s.local_too_big.push(min);
            return Ok(s);
        }
        // Not evidence of a black hole: nothing answers at any size.
        Outcome::Lost => return Ok(s),
    }

    // Invariant: `lo` fits, `hi` does not (max + 1 stands for "beyond the range").
    let mut lo = min;
    let mut hi = max.max(min) + 1;
    let mut next = Some((max, false));
    loop {
        let (size, hinted) = match next.take() {
            Some(n) if n.0 > lo && n.0 < hi => n,
            _ if hi - lo <= 1 => break,
            _ => (lo + (hi - lo) / 2, false),
        };
        match attempt(&mut s, size)? {
            Outcome::Reply => {
                lo = size;
                // A router's claim that held: one size up shows whether it was exact.
                if hinted {
                    next = Some((size + 1, false));
                }
            }
            Outcome::FragNeeded { next_hop_mtu, from } => {
                hi = size;
                s.frag_needed.push(FragNeeded {
                    size,
                    next_hop_mtu,
                    from,
                });
                next = next_hop_mtu.map(|m| (m, true));
            }
            Outcome::Unreachable { code, from } => {
                hi = size;
                s.unreachable.get_or_insert((size, code, from));
            }
            Outcome::LocalTooBig => {
                hi = size;
                s.local_too_big.push(size);
            }
            Outcome::Lost => {
                hi = size;
                s.vanished.push(size);
            }
        }
    }
    s.vanished.sort_unstable();
    s.path_mtu = Some(lo);
    Ok(s)
}

// ---------------------------------------------------------------------------------------
// Sockets
// ---------------------------------------------------------------------------------------

/// `<linux/icmp.h>` ICMP_FILTER (level SOL_RAW): a bitmask of types *not* delivered.
const ICMP_FILTER: libc::c_int = 1;
/// `<linux/icmpv6.h>` ICMPV6_FILTER (level IPPROTO_ICMPV6): 256 bits, set = blocked.
const ICMPV6_FILTER: libc::c_int = 1;
/// Echo waits never go below this once replies have been seen (see [`IcmpProber::wait`]).
const MIN_ADAPTIVE_WAIT: Duration = Duration::from_millis(250);

fn setsockopt<T>(
    sock: &Socket,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `value` points to a live, initialised `T` of the length we pass, and the
    // descriptor is open for the duration of the call.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends echo probes of a given size to one destination and waits for their fate.
struct IcmpProber {
    sock: Socket,
    family: Family,
    dst: IpAddr,
    id: u16,
    seq: u16,
    timeout: Duration,
    slowest: Option<Duration>,
    buf: Vec<MaybeUninit<u8>>,
}

impl IcmpProber {
    fn open(dst: IpAddr, timeout: Duration) -> Result<IcmpProber, ProbeError> {
        let family = Family::of(dst);
        let (domain, protocol) = match family {
            Family::V4 => (Domain::IPV4, Protocol::ICMPV4),
            Family::V6 => (Domain::IPV6, Protocol::ICMPV6),
        };
        let sock =
            Socket::new(domain, Type::RAW, Some(protocol)).map_err(|e| match e.raw_os_error() {
                Some(libc::EPERM | libc::EACCES) => ProbeError::NoRawSocket(e),
                _ => ProbeError::Socket(e),
            })?;
        // PROBE, not DO: DF is set and the kernel checks sizes against the interface MTU
        // only, ignoring a path MTU it learnt earlier, so every size is really tried.
        match family {
            Family::V4 => setsockopt(
                &sock,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                &libc::IP_PMTUDISC_PROBE,
            ),
            Family::V6 => setsockopt(
                &sock,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                &libc::IPV6_PMTUDISC_PROBE,
            ),
        }
        .map_err(ProbeError::Socket)?;
        // A raw socket sees every ICMP message of the namespace; keep only the types that
        // can answer a probe. Only an optimisation: parsing filters anyway.
        let filtered = match family {
            Family::V4 => {
                let pass: u32 = (1 << ICMP_ECHO_REPLY) | (1 << ICMP_DEST_UNREACH);
                setsockopt(&sock, libc::SOL_RAW, ICMP_FILTER, &!pass)
            }
            Family::V6 => {
                let mut blocked = [u32::MAX; 8];
                for t in [ICMP6_DEST_UNREACH, ICMP6_PACKET_TOO_BIG, ICMP6_ECHO_REPLY] {
                    blocked[usize::from(t >> 5)] &= !(1 << (t & 31));
                }
                setsockopt(&sock, libc::IPPROTO_ICMPV6, ICMPV6_FILTER, &blocked)
            }
        };
        if let Err(e) = filtered {
            tracing::debug!(error = %e, "cannot set the ICMP type filter; filtering in user space");
        }
        // Ours among other raw ICMP users of the namespace: pid, mixed with the clock so
        // two probes from one pid (in different namespaces) differ too.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let id = (std::process::id() ^ nanos ^ (nanos >> 16)) as u16;
        Ok(IcmpProber {
            sock,
            family,
            dst,
            id,
            seq: 0,
            timeout,
            slowest: None,
            buf: vec![MaybeUninit::uninit(); MAX_PACKET as usize + 1024],
        })
    }

    /// How long to wait for one probe: `--timeout-ms` until something answered, then ten
    /// times the slowest answer (at least 250 ms, at most the timeout). Vanished probes
    /// are the expensive ones (two full waits each) and a black hole has several, so a
    /// LAN path answering in 0.1 ms should not wait seconds for each of them.
    fn wait(&self) -> Duration {
        match self.slowest {
            None => self.timeout,
            Some(rtt) => (rtt * 10).max(MIN_ADAPTIVE_WAIT).min(self.timeout),
        }
    }

    fn probe(&mut self, size: u32) -> Result<Outcome, ProbeError> {
        self.seq = self.seq.wrapping_add(1);
        let payload = size.saturating_sub(self.family.overhead()) as usize;
        let pkt = build_echo(self.family, self.id, self.seq, payload);
        let to = SockAddr::from(SocketAddr::new(self.dst, 0));
        let sent = Instant::now();
        if let Err(e) = self.sock.send_to(&pkt, &to) {
            if e.raw_os_error() == Some(libc::EMSGSIZE) {
                return Ok(Outcome::LocalTooBig);
            }
            return Err(ProbeError::Send {
                dst: self.dst,
                size,
                source: e,
            });
        }
        let deadline = sent + self.wait();
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(Outcome::Lost);
            }
            // A zero timeout would mean "block forever".
            let left = (deadline - now).max(Duration::from_millis(1));
            self.sock
                .set_read_timeout(Some(left))
                .map_err(ProbeError::Receive)?;
            let (len, from) = match self.sock.recv_from(&mut self.buf) {
                Ok(r) => r,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(Outcome::Lost);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(ProbeError::Receive(e)),
            };
            // SAFETY: recvfrom initialised the first `len` bytes of the buffer.
            let data: &[u8] = unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast(), len) };
            let outcome = match (self.dst, from.as_socket()) {
                (IpAddr::V4(dst), _) => parse_v4(data, dst, self.id, self.seq),
                (IpAddr::V6(dst), Some(SocketAddr::V6(from))) => {
                    parse_v6(data, *from.ip(), dst, self.id, self.seq)
                }
                _ => None,
            };
            if let Some(outcome) = outcome {
                let rtt = sent.elapsed();
                self.slowest = Some(self.slowest.map_or(rtt, |s| s.max(rtt)));
                tracing::debug!(size, ?outcome, ?rtt, "probe answered");
                return Ok(outcome);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Route to the destination (rtnetlink)
// ---------------------------------------------------------------------------------------

/// The interface the kernel would send DST's packets out of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Egress {
    pub interface: String,
    pub mtu: u32,
}

fn nl_request(
    sock: &NlSocket,
    msg: RouteNetlinkMessage,
) -> Result<Vec<RouteNetlinkMessage>, Result<i32, String>> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    header.sequence_number = 1;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
    packet.finalize();
    let mut buf = vec![0; packet.header.length as usize];
    packet.serialize(&mut buf);
    sock.send(&buf, 0).map_err(|e| Err(e.to_string()))?;
    // Not a dump: one datagram holds the answer (or the error).
    let (data, _) = sock.recv_from_full().map_err(|e| Err(e.to_string()))?;
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < data.len() {
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..])
            .map_err(|e| Err(e.to_string()))?;
        let len = msg.header.length as usize;
        match msg.payload {
            NetlinkPayload::InnerMessage(inner) => out.push(inner),
            NetlinkPayload::Error(e) => {
                if let Some(code) = e.code {
                    return Err(Ok(code.get()));
                }
            }
            _ => {}
        }
        if len == 0 {
            break;
        }
        offset += len;
    }
    Ok(out)
}

/// Looks up the route to `dst` (`ip route get`) and the MTU of its output interface.
/// The link's own MTU is what counts: a path MTU the kernel cached for the route is
/// exactly what this probe re-measures.
pub fn egress(dst: IpAddr) -> Result<Egress, ProbeError> {
    let fail = |reason: String| ProbeError::Route { dst, reason };
    let mut sock = NlSocket::new(NETLINK_ROUTE).map_err(|e| fail(e.to_string()))?;
    sock.bind_auto().map_err(|e| fail(e.to_string()))?;
    sock.connect(&NlSocketAddr::new(0, 0))
        .map_err(|e| fail(e.to_string()))?;
    let kernel_error = |code: i32| match -code {
        libc::ENETUNREACH | libc::EHOSTUNREACH | libc::EINVAL => ProbeError::NoRoute(dst),
        errno => fail(io::Error::from_raw_os_error(errno).to_string()),
    };

    let mut route = RouteMessage::default();
    let (family, prefix) = match dst {
        IpAddr::V4(_) => (AddressFamily::Inet, 32),
        IpAddr::V6(_) => (AddressFamily::Inet6, 128),
    };
    route.header.address_family = family;
    route.header.destination_prefix_length = prefix;
    route
        .attributes
        .push(RouteAttribute::Destination(RouteAddress::from(dst)));
    let answer = nl_request(&sock, RouteNetlinkMessage::GetRoute(route)).map_err(|e| match e {
        Ok(code) => kernel_error(code),
        Err(reason) => fail(reason),
    })?;
    let oif = answer
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewRoute(r) => Some(r),
            _ => None,
        })
        .flat_map(|r| &r.attributes)
        .find_map(|a| match a {
            RouteAttribute::Oif(i) => Some(*i),
            _ => None,
        })
        .ok_or(ProbeError::NoRoute(dst))?;

    let mut link = LinkMessage::default();
    link.header.index = oif;
    let answer = nl_request(&sock, RouteNetlinkMessage::GetLink(link)).map_err(|e| match e {
        Ok(code) => fail(io::Error::from_raw_os_error(-code).to_string()),
        Err(reason) => fail(reason),
    })?;
    let (mut interface, mut mtu) = (format!("if{oif}"), None);
    for attr in answer.into_iter().flat_map(|m| match m {
        RouteNetlinkMessage::NewLink(l) => l.attributes,
        _ => Vec::new(),
    }) {
        match attr {
            LinkAttribute::IfName(n) => interface = n,
            LinkAttribute::Mtu(m) => mtu = Some(m),
            _ => {}
        }
    }
    let mtu = mtu.ok_or_else(|| fail(format!("interface {interface} reports no MTU")))?;
    Ok(Egress { interface, mtu })
}

// ---------------------------------------------------------------------------------------
// TCP
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpResult {
    /// The handshake completed.
    Ok,
    /// RST in answer to the SYN: nothing listens (or a firewall rejects with RST).
    Refused,
    /// No answer within the timeout: dropped somewhere.
    TimedOut,
    /// An ICMP error (or a local routing error) failed the connect.
    Unreachable,
    /// Any other error.
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct TcpReport {
    pub port: u16,
    pub result: TcpResult,
    pub errno: Option<i32>,
}

/// Maps a connect error to its class and errno.
pub fn classify_connect(err: &io::Error) -> (TcpResult, Option<i32>) {
    let errno = err.raw_os_error();
    let result = match errno {
        Some(libc::ECONNREFUSED) => TcpResult::Refused,
        Some(libc::ETIMEDOUT) => TcpResult::TimedOut,
        Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::ENETDOWN) => {
            TcpResult::Unreachable
        }
        // std's connect_timeout reports its own deadline without an errno.
        None if err.kind() == ErrorKind::TimedOut => TcpResult::TimedOut,
        _ => TcpResult::Error,
    };
    (result, errno)
}

fn tcp_check(dst: IpAddr, port: u16, timeout: Duration) -> TcpReport {
    let (result, errno) = match TcpStream::connect_timeout(&SocketAddr::new(dst, port), timeout) {
        Ok(_) => (TcpResult::Ok, None),
        Err(e) => classify_connect(&e),
    };
    tracing::debug!(port, ?result, ?errno, "tcp connect");
    TcpReport {
        port,
        result,
        errno,
    }
}

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

/// The largest size the search tries, and what set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ceiling {
    pub size: u32,
    pub why: &'static str,
}

impl Ceiling {
    fn new(local_mtu: u32, max_mtu: Option<u32>, family: Family) -> Ceiling {
        let mut c = Ceiling {
            size: local_mtu,
            why: "local interface MTU",
        };
        if let Some(m) = max_mtu.filter(|m| *m < c.size) {
            c = Ceiling {
                size: m,
                why: "--max-mtu limit",
            };
        }
        // Loopback's 65536 cannot be one packet: the length fields are 16 bits.
        if MAX_PACKET < c.size {
            c = Ceiling {
                size: MAX_PACKET,
                why: "IP length limit",
            };
        }
        c.size = c.size.max(family.min_mtu());
        c
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The whole local MTU crosses the path.
    Ok,
    /// The path is narrower than the local interface, and routers said so (PMTUD works).
    PmtuBelowLocal,
    /// Oversized probes vanished without a frag-needed: PMTUD cannot work on this path.
    Blackhole,
    /// No echo reply even at the smallest size (ICMP filtered, or the host is down).
    NoReply,
}

#[derive(Debug, Clone, Serialize)]
pub struct FragNeededSummary {
    pub count: usize,
    /// The smallest next-hop MTU any router reported.
    pub next_hop_mtu: Option<u32>,
    /// The router that reported it (or the first that sent one).
    pub from: Option<IpAddr>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub dst: IpAddr,
    pub family: &'static str,
    pub interface: String,
    pub local_mtu: u32,
    pub path_mtu: Option<u32>,
    pub max_icmp_payload: Option<u32>,
    pub frag_needed: FragNeededSummary,
    pub vanished_sizes: Vec<u32>,
    pub verdict: Verdict,
    pub summary: String,
    pub probes: u32,
    pub tcp: Option<TcpReport>,
    #[serde(skip)]
    ceiling: Ceiling,
    #[serde(skip)]
    unreachable: Option<(u32, u8, IpAddr)>,
}

impl Report {
    fn new(
        dst: IpAddr,
        egress: Egress,
        ceiling: Ceiling,
        s: Search,
        tcp: Option<TcpReport>,
    ) -> Report {
        let family = Family::of(dst);
        let best = s
            .frag_needed
            .iter()
            .filter(|f| f.next_hop_mtu.is_some())
            .min_by_key(|f| f.next_hop_mtu)
            .or(s.frag_needed.first());
        let frag_needed = FragNeededSummary {
            count: s.frag_needed.len(),
            next_hop_mtu: best.and_then(|f| f.next_hop_mtu),
            from: best.map(|f| f.from),
        };
        let verdict = match s.path_mtu {
            None => Verdict::NoReply,
            Some(_) if !s.vanished.is_empty() => Verdict::Blackhole,
            Some(p) if p < ceiling.size => Verdict::PmtuBelowLocal,
            Some(_) => Verdict::Ok,
        };
        let summary = match verdict {
            Verdict::Ok => format!(
                "{}-byte packets (the {}) cross the path",
                ceiling.size, ceiling.why
            ),
            Verdict::PmtuBelowLocal => {
                "path MTU is below the local interface MTU; routers answer with ICMP frag-needed, so PMTUD works".to_string()
            }
            Verdict::Blackhole => {
                "black hole: oversized probes vanished without ICMP frag-needed".to_string()
            }
            Verdict::NoReply => match s.unreachable {
                Some((_, code, from)) => {
                    format!("no echo reply: ICMP destination unreachable (code {code}) from {from}")
                }
                None => format!(
                    "no echo reply even at {} bytes: ICMP filtered or the host is down",
                    family.min_mtu()
                ),
            },
        };
        Report {
            dst,
            family: match family {
                Family::V4 => "ipv4",
                Family::V6 => "ipv6",
            },
            interface: egress.interface,
            local_mtu: egress.mtu,
            path_mtu: s.path_mtu,
            max_icmp_payload: s.path_mtu.map(|p| p - family.overhead()),
            frag_needed,
            vanished_sizes: s.vanished,
            verdict,
            summary,
            probes: s.probes,
            tcp,
            ceiling,
            unreachable: s.unreachable,
        }
    }

    /// A few readable lines, with the `1500 − 20 − 8 = 1472` arithmetic.
    pub fn text(&self) -> String {
        let family = Family::of(self.dst);
        let (iph, icmph) = (family.ip_header(), ICMP_HEADER);
        let ping = match family {
            Family::V4 => "ping",
            Family::V6 => "ping -6",
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "probe {} ({}) via {}: local MTU {} ({} − {iph} − {icmph} = {} bytes of ICMP payload)",
            self.dst,
            family.name(),
            self.interface,
            self.local_mtu,
            self.local_mtu,
            self.local_mtu.saturating_sub(family.overhead()),
        );
        match self.path_mtu {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "path MTU {p}: {p} − {iph} ({}) − {icmph} (ICMP) = {} bytes of payload, so `{ping} -M do -s {} {}` is the largest that gets through",
                    family.name(),
                    p - family.overhead(),
                    p - family.overhead(),
                    self.dst,
                );
            }
            None => {
                let _ = writeln!(out, "path MTU unknown: no size got an echo reply");
            }
        }
        let _ = writeln!(
            out,
            "verdict: {} — {}",
            verdict_name(self.verdict),
            self.summary
        );
        if self.frag_needed.count == 0 {
            let _ = writeln!(out, "frag-needed: none received");
        } else {
            let _ = writeln!(
                out,
                "frag-needed: {} received, next-hop MTU {} from {}",
                self.frag_needed.count,
                self.frag_needed
                    .next_hop_mtu
                    .map_or("not given".to_string(), |m| m.to_string()),
                self.frag_needed
                    .from
                    .map_or("?".to_string(), |a| a.to_string()),
            );
        }
        if !self.vanished_sizes.is_empty() {
            let sizes: Vec<String> = self.vanished_sizes.iter().map(u32::to_string).collect();
            let _ = writeln!(
                out,
                "vanished (no reply, no ICMP, tried twice): {} bytes",
                sizes.join(", ")
            );
        }
        if let Some((size, code, from)) = self.unreachable.filter(|_| self.path_mtu.is_some()) {
            let _ = writeln!(
                out,
                "note: a {size}-byte probe drew ICMP destination unreachable code {code} from {from}"
            );
        }
        if self.ceiling.size < self.local_mtu {
            let _ = writeln!(
                out,
                "search capped at {} bytes: the {}",
                self.ceiling.size, self.ceiling.why
            );
        }
        if let Some(tcp) = &self.tcp {
            let detail = tcp
                .errno
                .map(|e| format!(" ({})", io::Error::from_raw_os_error(e)))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "tcp {}: {}{detail}",
                SocketAddr::new(self.dst, tcp.port),
                tcp_result_name(tcp.result),
            );
        }
        out
    }
}

fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Ok => "ok",
        Verdict::PmtuBelowLocal => "pmtu_below_local",
        Verdict::Blackhole => "blackhole",
        Verdict::NoReply => "no_reply",
    }
}

fn tcp_result_name(r: TcpResult) -> &'static str {
    match r {
        TcpResult::Ok => "ok",
        TcpResult::Refused => "refused",
        TcpResult::TimedOut => "timed_out",
        TcpResult::Unreachable => "unreachable",
        TcpResult::Error => "error",
    }
}

/// Resolves DST: an address literal, else a name (IPv4 answers first).
fn resolve(dst: &str) -> Result<IpAddr, ProbeError> {
    let bad = || ProbeError::BadDestination(dst.to_string());
    let addr = match dst.parse::<IpAddr>() {
        Ok(a) => a,
        // Something meant as an address literal (a typo like 10.0.0.300, a CIDR) is an
        // error here, not a name to send to DNS.
        Err(_)
            if dst.is_empty()
                || dst.contains(|c: char| c.is_whitespace() || c == '/' || c == ':')
                || dst.chars().all(|c| c.is_ascii_digit() || c == '.') =>
        {
            return Err(bad());
        }
        Err(_) => {
            let addrs: Vec<IpAddr> = (dst, 0)
                .to_socket_addrs()
                .map_err(|_| bad())?
                .map(|a| a.ip())
                .collect();
            addrs
                .iter()
                .find(|a| a.is_ipv4())
                .or(addrs.first())
                .copied()
                .ok_or_else(bad)?
        }
    };
    let unicast = match addr {
        IpAddr::V4(a) => !(a.is_unspecified() || a.is_multicast() || a.is_broadcast()),
        IpAddr::V6(a) => !(a.is_unspecified() || a.is_multicast()),
    };
    if unicast {
        Ok(addr)
    } else {
        Err(ProbeError::NotUnicast(addr))
    }
}

/// Runs the probe: route lookup, path MTU search, then the TCP check if asked.
pub fn run(opts: &ProbeOptions) -> Result<Report, ProbeError> {
    let dst = resolve(&opts.dst)?;
    let family = Family::of(dst);
    let egress = egress(dst)?;
    let ceiling = Ceiling::new(egress.mtu, opts.max_mtu, family);
    tracing::debug!(%dst, interface = %egress.interface, mtu = egress.mtu, ceiling = ceiling.size, "probing");
    let mut prober = IcmpProber::open(dst, opts.timeout)?;
    let found = search(family.min_mtu(), ceiling.size, |size| prober.probe(size))?;
    let tcp = opts.port.map(|p| tcp_check(dst, p, opts.timeout));
    Ok(Report::new(dst, egress, ceiling, found, tcp))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DST4: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 9);
    const ROUTER4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

    /// An IPv4 header (no options) with the given addresses around `payload`.
    fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, IPPROTO_ICMP, 0, 0];
        let total = (20 + payload.len()) as u16;
        p[2..4].copy_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        let sum = checksum(&p);
        p[10..12].copy_from_slice(&sum.to_be_bytes());
        p.extend_from_slice(payload);
        p
    }

    fn echo_reply_v4(id: u16, seq: u16, payload_len: usize) -> Vec<u8> {
        let mut icmp = build_echo(Family::V4, id, seq, payload_len);
        icmp[0] = ICMP_ECHO_REPLY;
        icmp[2..4].fill(0);
        let sum = checksum(&icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        ipv4(DST4, ROUTER4, &icmp)
    }

    fn frag_needed_v4(quoted_dst: Ipv4Addr, id: u16, seq: u16, mtu: u16) -> Vec<u8> {
        let probe = ipv4(
            Ipv4Addr::new(10, 244, 1, 7),
            quoted_dst,
            &build_echo(Family::V4, id, seq, 1472),
        );
        let mut icmp = vec![ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, 0, 0, 0, 0];
        icmp.extend_from_slice(&mtu.to_be_bytes());
        // Routers quote the header and the first 8 bytes (Linux quotes more).
        icmp.extend_from_slice(&probe[..28]);
        let sum = checksum(&icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        ipv4(ROUTER4, Ipv4Addr::new(10, 244, 1, 7), &icmp)
    }

    #[test]
    fn checksum_matches_rfc1071_examples() {
        // RFC 1071 section 3: the one's-complement sum of these words is 0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum(&data), !0xddf2);
        // Odd length: the last byte is padded on the right.
        assert_eq!(checksum(&[0x12]), !0x1200);
        assert_eq!(checksum(&[]), 0xffff);
        // A packet carrying its own checksum sums to zero.
        let pkt = build_echo(Family::V4, 0xbeef, 7, 13);
        assert_eq!(checksum(&pkt), 0);
    }

    #[test]
    fn builds_echo_requests() {
        let pkt = build_echo(Family::V4, 0x1234, 0x0102, 1472);
        assert_eq!(pkt.len(), 1480, "8-byte header + payload");
        assert_eq!(&pkt[..2], &[ICMP_ECHO_REQUEST, 0]);
        assert_eq!(&pkt[4..8], &[0x12, 0x34, 0x01, 0x02]);
        assert_eq!(pkt[8..12], [0, 1, 2, 3]);
        let v6 = build_echo(Family::V6, 1, 2, 0);
        assert_eq!(v6, vec![ICMP6_ECHO_REQUEST, 0, 0, 0, 0, 1, 0, 2]);
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
        request[20] = ICMP_ECHO_REQUEST;
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
        reply[0] = ICMP6_ECHO_REPLY;
        assert_eq!(parse_v6(&reply, dst, dst, 7, 3), Some(Outcome::Reply));
        assert_eq!(parse_v6(&reply, router, dst, 7, 3), None);

        let mut quoted = vec![0x60, 0, 0, 0, 0, 0, IPPROTO_ICMPV6, 64];
        quoted.extend_from_slice(&"fd00::9".parse::<Ipv6Addr>().unwrap().octets());
        quoted.extend_from_slice(&dst.octets());
        quoted.extend_from_slice(&build_echo(Family::V6, 7, 3, 1452));
        let mut ptb = vec![ICMP6_PACKET_TOO_BIG, 0, 0, 0];
        ptb.extend_from_slice(&1400u32.to_be_bytes());
        ptb.extend_from_slice(&quoted);
        assert_eq!(
            parse_v6(&ptb, router, dst, 7, 3),
            Some(Outcome::FragNeeded {
                next_hop_mtu: Some(1400),
                from: IpAddr::V6(router)
            })
        );
        assert_eq!(parse_v6(&ptb, router, dst, 7, 4), None);
        let mut unreach = ptb.clone();
        unreach[0] = ICMP6_DEST_UNREACH;
        unreach[1] = 3;
        assert_eq!(
            parse_v6(&unreach, router, dst, 7, 3),
            Some(Outcome::Unreachable {
                code: 3,
                from: IpAddr::V6(router)
            })
        );
    }

    const ROUTER: IpAddr = IpAddr::V4(ROUTER4);

    /// A path of `pmtu` behind a local interface of `local`; oversized probes draw
    /// frag-needed (with the MTU) unless `blackhole`.
    fn path(local: u32, pmtu: u32, blackhole: bool) -> impl FnMut(u32) -> Result<Outcome, ()> {
        move |size| {
            Ok(if size > local {
                Outcome::LocalTooBig
            } else if size <= pmtu {
                Outcome::Reply
            } else if blackhole {
                Outcome::Lost
            } else {
                Outcome::FragNeeded {
                    next_hop_mtu: Some(pmtu),
                    from: ROUTER,
                }
            })
        }
    }

    #[test]
    fn whole_local_mtu_fits_in_two_probes() {
        let s = search(68, 1500, path(1500, 1500, false)).unwrap();
        assert_eq!(s.path_mtu, Some(1500));
        assert_eq!(s.probes, 2);
        assert!(s.vanished.is_empty() && s.frag_needed.is_empty());
    }

    #[test]
    fn frag_needed_hint_converges_fast() {
        let s = search(68, 1500, path(1500, 1450, false)).unwrap();
        assert_eq!(s.path_mtu, Some(1450));
        // 68, 1500 (frag-needed 1450), 1450 (fits), 1451 (frag-needed).
        assert_eq!(s.probes, 4);
        assert_eq!(s.frag_needed.len(), 2);
        assert_eq!(s.frag_needed[0].next_hop_mtu, Some(1450));
        assert!(s.vanished.is_empty());
    }

    #[test]
    fn blackhole_bisects_and_retries_each_silence_once() {
        let mut sent = Vec::new();
        let mut net = path(1500, 1450, true);
        let s = search(68, 1500, |size| {
            sent.push(size);
            net(size)
        })
        .unwrap();
        assert_eq!(s.path_mtu, Some(1450));
        assert!(s.frag_needed.is_empty());
        assert_eq!(s.vanished.first(), Some(&1451));
        assert_eq!(s.vanished.last(), Some(&1500));
        for v in &s.vanished {
            assert_eq!(
                sent.iter().filter(|x| *x == v).count(),
                2,
                "{v} retried once"
            );
        }
        assert_eq!(s.probes as usize, sent.len());
    }

    #[test]
    fn finds_every_path_mtu() {
        for pmtu in 68..=1500 {
            for blackhole in [false, true] {
                let s = search(68, 1500, path(1500, pmtu, blackhole)).unwrap();
                assert_eq!(s.path_mtu, Some(pmtu), "pmtu {pmtu} blackhole {blackhole}");
                assert_eq!(s.vanished.is_empty(), !blackhole || pmtu == 1500);
            }
        }
    }

    #[test]
    fn one_lost_packet_is_not_a_black_hole() {
        let mut lost_once = false;
        let s = search(68, 1500, |size| {
            Ok::<_, ()>(if size == 1500 && !lost_once {
                lost_once = true;
                Outcome::Lost
            } else {
                Outcome::Reply
            })
        })
        .unwrap();
        assert_eq!(s.path_mtu, Some(1500));
        assert!(s.vanished.is_empty());
        assert_eq!(s.probes, 3);
    }

    #[test]
    fn bogus_hints_and_local_limits_are_survived() {
        // A router claiming an MTU above the probe, or below what already fitted.
        for hint in [Some(9000), Some(100), Some(68), None] {
            let s = search(68, 1500, |size| {
                Ok::<_, ()>(if size <= 1400 {
                    Outcome::Reply
                } else {
                    Outcome::FragNeeded {
                        next_hop_mtu: hint,
                        from: ROUTER,
                    }
                })
            })
            .unwrap();
            assert_eq!(s.path_mtu, Some(1400), "hint {hint:?}");
        }
        // The ceiling above the interface: EMSGSIZE bounds the search.
        let s = search(68, 9000, path(1500, 1500, false)).unwrap();
        assert_eq!(s.path_mtu, Some(1500));
        assert!(!s.local_too_big.is_empty());
    }

    #[test]
    fn silence_at_the_smallest_size_is_no_reply() {
        let s = search(68, 1500, |_| Ok::<_, ()>(Outcome::Lost)).unwrap();
        assert_eq!(s.path_mtu, None);
        assert!(s.vanished.is_empty());
        assert_eq!(s.probes, 2);
        let s = search(68, 1500, |_| {
            Ok::<_, ()>(Outcome::Unreachable {
                code: 1,
                from: ROUTER,
            })
        })
        .unwrap();
        assert_eq!((s.path_mtu, s.unreachable), (None, Some((68, 1, ROUTER))));
        assert_eq!(search(68, 1500, |_| Err::<Outcome, _>("boom")), Err("boom"));
    }

    fn report(s: Search) -> Report {
        let egress = Egress {
            interface: "eth0".into(),
            mtu: 1500,
        };
        let ceiling = Ceiling::new(1500, None, Family::V4);
        Report::new(IpAddr::V4(DST4), egress, ceiling, s, None)
    }

    #[test]
    fn verdicts_and_arithmetic() {
        let ok = report(search(68, 1500, path(1500, 1500, false)).unwrap());
        assert_eq!(ok.verdict, Verdict::Ok);
        assert_eq!(ok.max_icmp_payload, Some(1472));
        assert!(ok.text().contains("1500 − 20 − 8 = 1472"), "{}", ok.text());

        let pmtud = report(search(68, 1500, path(1500, 1450, false)).unwrap());
        assert_eq!(pmtud.verdict, Verdict::PmtuBelowLocal);
        assert_eq!(pmtud.frag_needed.next_hop_mtu, Some(1450));
        assert_eq!(pmtud.frag_needed.from, Some(ROUTER));
        assert!(
            pmtud.text().contains("ping -M do -s 1422"),
            "{}",
            pmtud.text()
        );

        let hole = report(search(68, 1500, path(1500, 1450, true)).unwrap());
        assert_eq!(hole.verdict, Verdict::Blackhole);
        assert!(
            hole.text()
                .contains("oversized probes vanished without ICMP frag-needed")
        );
        let json = serde_json::to_value(&hole).unwrap();
        assert_eq!(json["verdict"], "blackhole");
        assert_eq!(json["path_mtu"], 1450);
        assert_eq!(json["frag_needed"]["count"], 0);
        assert_eq!(json["vanished_sizes"][0], 1451);
        assert!(json["tcp"].is_null());

        let none = report(search(68, 1500, |_| Ok::<_, ()>(Outcome::Lost)).unwrap());
        assert_eq!(none.verdict, Verdict::NoReply);
        assert_eq!(none.max_icmp_payload, None);
    }

    #[test]
    fn ceiling_names_its_cause() {
        let c = |mtu, max, family| Ceiling::new(mtu, max, family);
        assert_eq!(c(1500, None, Family::V4).size, 1500);
        assert_eq!(c(1500, Some(1400), Family::V4).why, "--max-mtu limit");
        assert_eq!(c(1500, Some(9000), Family::V4).why, "local interface MTU");
        let lo = c(65536, None, Family::V6);
        assert_eq!((lo.size, lo.why), (65535, "IP length limit"));
        assert_eq!(c(1500, Some(100), Family::V6).size, 1280, "IPv6 minimum");
    }

    #[test]
    fn classifies_connect_errors() {
        let e = |errno| io::Error::from_raw_os_error(errno);
        assert_eq!(
            classify_connect(&e(libc::ECONNREFUSED)).0,
            TcpResult::Refused
        );
        assert_eq!(classify_connect(&e(libc::ETIMEDOUT)).0, TcpResult::TimedOut);
        assert_eq!(
            classify_connect(&io::Error::new(ErrorKind::TimedOut, "deadline")),
            (TcpResult::TimedOut, None)
        );
        assert_eq!(
            classify_connect(&e(libc::EHOSTUNREACH)),
            (TcpResult::Unreachable, Some(libc::EHOSTUNREACH))
        );
        assert_eq!(classify_connect(&e(libc::EINVAL)).0, TcpResult::Error);
    }

    #[test]
    fn rejects_bad_destinations() {
        assert!(matches!(resolve("10.244.2.9"), Ok(IpAddr::V4(_))));
        assert!(matches!(resolve("::1"), Ok(IpAddr::V6(_))));
        assert!(matches!(
            resolve("10.0.0.1/24"),
            Err(ProbeError::BadDestination(_))
        ));
        assert!(matches!(resolve(""), Err(ProbeError::BadDestination(_))));
        assert!(matches!(
            resolve("10.0.0.300"),
            Err(ProbeError::BadDestination(_))
        ));
        assert!(matches!(
            resolve("fe80::zz"),
            Err(ProbeError::BadDestination(_))
        ));
        assert!(matches!(resolve("0.0.0.0"), Err(ProbeError::NotUnicast(_))));
        assert!(matches!(
            resolve("224.0.0.1"),
            Err(ProbeError::NotUnicast(_))
        ));
    }
}
