//! The raw-socket prober: sends one echo request of a given size to the destination
//! with DF set and waits for its fate, which [`packets`](super::packets) classifies.
//! [`IcmpProber::probe`] is the probe function the search runs over.

use std::{
    io::{self, ErrorKind},
    mem::MaybeUninit,
    net::{IpAddr, SocketAddr},
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

use pnet_packet::{
    icmp::IcmpTypes,
    icmpv6::{Icmpv6Type, Icmpv6Types},
};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::{
    ProbeError,
    packets::{Family, MAX_PACKET, Outcome, build_echo, parse_v4, parse_v6},
};

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
pub(crate) struct IcmpProber {
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
    pub(crate) fn open(dst: IpAddr, timeout: Duration) -> Result<IcmpProber, ProbeError> {
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
                let pass: u32 =
                    (1 << IcmpTypes::EchoReply.0) | (1 << IcmpTypes::DestinationUnreachable.0);
                setsockopt(&sock, libc::SOL_RAW, ICMP_FILTER, &!pass)
            }
            Family::V6 => {
                let mut blocked = [u32::MAX; 8];
                for Icmpv6Type(t) in [
                    Icmpv6Types::DestinationUnreachable,
                    Icmpv6Types::PacketTooBig,
                    Icmpv6Types::EchoReply,
                ] {
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

    pub(crate) fn probe(&mut self, size: u32) -> Result<Outcome, ProbeError> {
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
