//! `node-diag probe DST`: the path MTU to DST and whether PMTUD works on the way, found
//! the way `ping -M do -s N` would, plus an optional TCP connect check.
//!
//! - The outgoing interface and its MTU come from the kernel's route to DST (rtnetlink
//!   `RTM_GETROUTE`, then the link: [`egress`]), so the search starts at the largest
//!   packet this node could send at all.
//! - Probes are ICMP echo requests on a raw socket with `IP_PMTUDISC_PROBE`
//!   (`IPV6_PMTUDISC_PROBE`): DF set, and the kernel's cached path MTU ignored, so every
//!   size really goes out and a local `EMSGSIZE` only means "bigger than the interface"
//!   ([`icmp`]).
//! - Each size is classified ([`packets::Outcome`]): an echo reply means it fits; an ICMP
//!   frag-needed (IPv6 packet too big) quoting our probe means a router refused it and
//!   said which MTU it has; silence, twice, means it vanished, which is what a PMTUD black
//!   hole looks like from the sender. [`search::search`] binary-searches the largest size
//!   that fits over an abstract probe function, so it is tested without sockets.
//! - `--port` classifies a TCP connect to DST:P as ok, refused, timed out or unreachable
//!   ([`tcp`]).
//! - [`path`] is the agent's bounded probe of one flow's path (a packet budget, a pace),
//!   whose result the path verdicts read.
//! - [`report`] turns the search into a verdict, the text or JSON `run` returns, and
//!   the exit status ([`Exit`]) a script tests.
//! - [`progress`] says on stderr what the search is doing while it waits.
//!
//! Sizes are IP packet sizes throughout (ICMP payload + 28 for IPv4, + 48 for IPv6), the
//! unit MTUs are given in. Every wait is bounded by `--timeout-ms`.

mod egress;
mod icmp;
mod packets;
pub(crate) mod path;
mod progress;
mod report;
mod search;
mod tcp;

use std::{
    io,
    net::{IpAddr, ToSocketAddrs},
    time::Duration,
};

use crate::host_network::NetlinkError;

pub(crate) use self::report::{EXIT_HELP, Exit};
use self::{
    egress::egress,
    icmp::IcmpProber,
    packets::Family,
    progress::{Mode, Progress},
    report::{Ceiling, Report},
    search::search,
    tcp::tcp_check,
};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error("invalid destination {0:?}: expected an IPv4 or IPv6 address or a resolvable name")]
    BadDestination(String),
    #[error("cannot probe {0}: the destination must be a unicast address")]
    NotUnicast(IpAddr),
    #[error("no route to {0} from this network namespace")]
    NoRoute(IpAddr),
    #[error("route lookup for {dst}")]
    Route {
        dst: IpAddr,
        #[source]
        source: NetlinkError,
    },
    /// The kernel refused the lookup for a reason other than "no route".
    #[error("route lookup for {dst}")]
    RouteRefused {
        dst: IpAddr,
        #[source]
        source: io::Error,
    },
    #[error("route lookup for {dst}: output interface {oif} not found")]
    NoInterface { dst: IpAddr, oif: u32 },
    #[error("route lookup for {dst}: interface {interface} reports no MTU")]
    NoMtu { dst: IpAddr, interface: String },
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

/// What `node-diag probe` was asked to do, as the command line gives it.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ProbeOptions {
    /// Destination address (IPv4 or IPv6) or name.
    #[arg(value_name = "DST")]
    pub(crate) dst: String,
    /// Also classify a TCP connect to DST:PORT (ok, refused, timed_out, unreachable).
    #[arg(long, value_name = "PORT")]
    pub(crate) port: Option<u16>,
    /// Bound on each wait: the TCP connect, and each echo until one is answered (later
    /// echoes wait ten times the slowest answer, at least 250 ms, at most this).
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(1..=600_000), value_name = "N")]
    pub(crate) timeout_ms: u64,
    /// Largest IP packet size to try (default: the outgoing interface's MTU).
    #[arg(long, value_parser = clap::value_parser!(u32).range(68..=65_535), value_name = "N")]
    pub(crate) max_mtu: Option<u32>,
    /// Print each probe and its fate on stderr as it goes (on a terminal, one line
    /// is rewritten in place without it).
    #[arg(short, long)]
    pub(crate) verbose: bool,
}

impl ProbeOptions {
    /// Bound on every wait: each echo, and the TCP connect.
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
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
pub(crate) fn run(opts: &ProbeOptions) -> Result<Report, ProbeError> {
    let dst = resolve(&opts.dst)?;
    let family = Family::of(dst);
    let egress = egress(dst)?;
    let ceiling = Ceiling::new(egress.mtu, opts.max_mtu, family);
    tracing::debug!(%dst, interface = %egress.interface, mtu = egress.mtu, ceiling = ceiling.size, "probing");
    let mut prober = IcmpProber::open(dst, opts.timeout())?;
    let stderr = io::stderr();
    let mode = Mode::new(opts.verbose, io::IsTerminal::is_terminal(&stderr));
    let mut progress = Progress::new(mode, stderr, dst);
    let found = search(family.min_mtu(), ceiling.size, |size| {
        let outcome = prober.probe(size);
        if let Ok(o) = &outcome {
            progress.probed(size, o);
        }
        outcome
    });
    let tcp = found.as_ref().ok().and(opts.port).map(|p| {
        progress.connecting(p);
        tcp_check(dst, p, opts.timeout())
    });
    progress.finish();
    Ok(Report::new(dst, egress, ceiling, found?, tcp))
}

#[cfg(test)]
mod tests {
    use super::*;

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
