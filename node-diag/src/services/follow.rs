//! Following kube-proxy's rules by change instead of re-reading them on a timer.
//!
//! - nftables (kube-proxy's nftables mode, and its iptables mode through iptables-nft)
//!   announces every change of the ruleset on netlink (`NETLINK_NETFILTER`, group
//!   `NFNLGRP_NFTABLES`: what `nft monitor` reads). [`Notifications`] subscribes in the
//!   calling thread's network namespace and turns each message into the one ruleset it
//!   touched ([`Kind`]): table `kube-proxy` of family `ip`/`ip6` is the nftables mode's,
//!   the xtables tables (`filter`, `nat`...) the iptables-nft one. Anything else (other
//!   tables, families `inet`, `bridge`...) reads nothing.
//! - iptables-legacy sends nothing. [`legacy_signature`] asks the kernel for each legacy
//!   table's size, entry count and hook offsets (`IPT_SO_GET_INFO`, a hundred bytes per
//!   table, no rule copied), and a change of it asks for a read. A rewrite that keeps
//!   every one of those (an endpoint's address swapped for another of the same length)
//!   is not seen until the slow full read.
//! - [`Parts`] keeps each ruleset's last catalog, so a change reads one dump tool, not
//!   all six, and the merged catalog is rebuilt from the parts.
//!
//! A burst (kube-proxy's restore of thousands of rules sends one message per rule) is
//! read once: the read waits until the feed has been quiet for [`QUIET`], at most
//! [`MAX_DELAY`] after the first message. A feed overrun (`ENOBUFS`) reads every
//! nftables-backed ruleset again.

use std::{
    collections::{HashMap, HashSet},
    io,
    os::fd::AsRawFd as _,
    sync::Arc,
    time::{Duration, Instant},
};

use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};

use tracing::{debug, warn};

use crate::host_network::nlmsg;

use super::{
    CatalogWatcher, ServiceCatalog, ServicesError, Source,
    sources::{Kind, legacy_table_names, read_one},
};

/// nfnetlink's multicast group of nf_tables ruleset changes (`NFNLGRP_NFTABLES`).
const NFNLGRP_NFTABLES: u32 = 7;
/// nfnetlink subsystem of nf_tables (`NFNL_SUBSYS_NFTABLES`), the message type's high byte.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFT_MSG_NEWGEN`: ends each committed batch, names no table.
const NFT_MSG_NEWGEN: u16 = 15;
/// nfgenmsg families (`NFPROTO_IPV4`, `NFPROTO_IPV6`).
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// The tables iptables-nft writes (and `iptables-nft-save` prints).
const XTABLES: [&str; 5] = ["filter", "nat", "mangle", "raw", "security"];

/// After a change, the read waits until the feed has been quiet this long.
pub(crate) const QUIET: Duration = Duration::from_millis(250);
/// ... but no longer than this after the first message of a burst.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(1);

/// Why the change feed cannot be followed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FollowError {
    #[error("cannot subscribe to nftables' change notifications: {0}")]
    Subscribe(#[source] io::Error),
    #[error("cannot read nftables' change notifications: {0}")]
    Receive(#[source] io::Error),
}

/// nftables' change feed in the network namespace it was opened in.
pub(crate) struct Notifications {
    socket: Socket,
    buf: Vec<u8>,
}

impl Notifications {
    /// Subscribes in the calling thread's network namespace.
    ///
    /// # Errors
    ///
    /// When the socket cannot be opened or joined to the group (no nf_tables in this
    /// kernel, no `CAP_NET_ADMIN`).
    pub(crate) fn subscribe() -> Result<Self, FollowError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(FollowError::Subscribe)?;
        socket.bind_auto().map_err(FollowError::Subscribe)?;
        // Room for a burst while the reader is busy re-reading; an overrun still only
        // costs a wider read (ENOBUFS below).
        let _ = socket.set_rx_buf_sz(1 << 20);
        socket
            .add_membership(NFNLGRP_NFTABLES)
            .map_err(FollowError::Subscribe)?;
        socket
            .set_non_blocking(true)
            .map_err(FollowError::Subscribe)?;
        Ok(Self {
            socket,
            buf: Vec::with_capacity(1 << 16),
        })
    }

    /// Waits up to `timeout` for messages, and adds the rulesets they touched to
    /// `changed`. Returns whether any message came.
    ///
    /// # Errors
    ///
    /// When the socket fails for another reason than an overrun.
    pub(crate) fn wait(
        &mut self,
        timeout: Duration,
        changed: &mut HashSet<Kind>,
    ) -> Result<bool, FollowError> {
        if !super::nft_netlink::readable_within(&self.socket, timeout)
            .map_err(FollowError::Receive)?
        {
            return Ok(false);
        }
        let mut any = false;
        loop {
            self.buf.clear();
            match self.socket.recv(&mut self.buf, 0) {
                Ok(_) => {
                    any = true;
                    kinds_of(&self.buf, changed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(any),
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    any = true;
                    changed.extend(NOTIFYING);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FollowError::Receive(e)),
            }
        }
    }
}

/// The rulesets nftables notifies changes of.
pub(crate) const NOTIFYING: [Kind; 4] = [
    Kind::IptablesNft4,
    Kind::IptablesNft6,
    Kind::Nft4,
    Kind::Nft6,
];

/// The rulesets that netlink messages in `buf` touched.
fn kinds_of(buf: &[u8], changed: &mut HashSet<Kind>) {
    for (ty, body) in nlmsg::messages(buf) {
        if let Some(kind) = kind_of(ty, body) {
            changed.insert(kind);
        }
    }
}

/// The ruleset one nf_tables message (type `ty`, `body` after the netlink header) is
/// about: its nfgenmsg family and its first attribute, which is the table's name in
/// every table, chain, rule, set, element, object and flowtable message.
fn kind_of(ty: u16, body: &[u8]) -> Option<Kind> {
    if ty >> 8 != NFNL_SUBSYS_NFTABLES || ty & 0xff == NFT_MSG_NEWGEN || body.len() < 4 {
        return None;
    }
    let family = body[0];
    let (1, name) = nlmsg::attrs(&body[4..]).next()? else {
        return None;
    };
    let name = name.split(|&b| b == 0).next().unwrap_or_default();
    let name = std::str::from_utf8(name).ok()?;
    let xtables = XTABLES.contains(&name);
    match (family, name) {
        (NFPROTO_IPV4, "kube-proxy") => Some(Kind::Nft4),
        (NFPROTO_IPV6, "kube-proxy") => Some(Kind::Nft6),
        (NFPROTO_IPV4, _) if xtables => Some(Kind::IptablesNft4),
        (NFPROTO_IPV6, _) if xtables => Some(Kind::IptablesNft6),
        _ => None,
    }
}

/// What identifies the content of a legacy table cheaply: its name, valid hooks, hook
/// entry and underflow offsets, entry count and size (`struct ipt_getinfo` less nothing).
pub(crate) type LegacySignature = Vec<(String, [u32; 13])>;

/// `struct ipt_getinfo` (also `ip6t_getinfo`): the table's name, then 13 `u32`s.
#[repr(C)]
struct GetInfo {
    name: [u8; 32],
    rest: [u32; 13],
}

/// `IPT_SO_GET_INFO` and `IP6T_SO_GET_INFO` (`IPT_BASE_CTL`).
const SO_GET_INFO: libc::c_int = 64;

/// The legacy tables of `kind` ([`Kind::IptablesLegacy4`] or `6`) in the calling
/// thread's namespace, each with what [`IPT_SO_GET_INFO`](SO_GET_INFO) says of it.
/// Empty when none is in use (the kernel lists none: the module is not even asked).
pub(crate) fn legacy_signature(kind: Kind) -> LegacySignature {
    let (names_file, domain, level) = match kind {
        Kind::IptablesLegacy4 => ("ip_tables_names", socket2::Domain::IPV4, libc::SOL_IP),
        Kind::IptablesLegacy6 => ("ip6_tables_names", socket2::Domain::IPV6, libc::SOL_IPV6),
        _ => return Vec::new(),
    };
    let names = legacy_table_names(names_file);
    if names.is_empty() {
        return Vec::new();
    }
    let socket = socket2::Socket::new(
        domain,
        socket2::Type::RAW,
        Some(socket2::Protocol::from(libc::IPPROTO_RAW)),
    );
    let Ok(socket) = socket else {
        // Cannot ask: a signature no read matches, so the table is read each time.
        return vec![(String::from("?"), [0; 13])];
    };
    let mut out = Vec::new();
    for name in names {
        let mut info = GetInfo {
            name: [0; 32],
            rest: [0; 13],
        };
        let bytes = name.as_bytes();
        let n = bytes.len().min(31);
        info.name[..n].copy_from_slice(&bytes[..n]);
        let mut len = std::mem::size_of::<GetInfo>() as libc::socklen_t;
        // SAFETY: `info` is a live, writable `struct ipt_getinfo` of `len` bytes (a
        // 32-byte name then 13 u32s, as the kernel's uapi lays it out, no padding);
        // the kernel writes at most `len` bytes into it, and the descriptor is open for
        // the call's duration.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                level,
                SO_GET_INFO,
                std::ptr::from_mut(&mut info).cast(),
                &raw mut len,
            )
        };
        let rest = if rc == 0 { info.rest } else { [u32::MAX; 13] };
        out.push((name, rest));
    }
    out
}

/// Each ruleset's last read, merged into one catalog.
#[derive(Default)]
pub(crate) struct Parts {
    /// Shared with the merged catalog when it is the only one with Services.
    parts: HashMap<Kind, (Arc<ServiceCatalog>, Source)>,
}

impl Parts {
    /// Reads the rulesets in `kinds` again (every one on the first call) and returns
    /// the catalog of all of them, with what became of each source.
    ///
    /// # Errors
    ///
    /// [`ServicesError::NothingReadable`] when no source at all could be read.
    pub(crate) fn read(
        &mut self,
        kinds: &HashSet<Kind>,
    ) -> Result<(Arc<ServiceCatalog>, Vec<Source>), ServicesError> {
        for kind in Kind::ALL {
            if kinds.contains(&kind) || !self.parts.contains_key(&kind) {
                let (catalog, source) = read_one(kind);
                match self.parts.get_mut(&kind) {
                    // A ruleset that was read and now is not (its dump timed out on a
                    // large ruleset, or failed once): its last catalog is kept, as the
                    // whole catalog is when nothing is readable; the source says why.
                    Some((_, last)) if !source.is_read() && last.is_read() => *last = source,
                    _ => {
                        self.parts.insert(kind, (Arc::new(catalog), source));
                    }
                }
            }
        }
        let mut parts = Vec::new();
        let mut sources = Vec::new();
        for kind in Kind::ALL {
            if let Some((part, source)) = self.parts.get(&kind) {
                parts.push(part);
                sources.push(source.clone());
            }
        }
        let catalog = ServiceCatalog::merged(&parts);
        if sources.iter().any(Source::is_read) {
            Ok((catalog, sources))
        } else {
            Err(ServicesError::NothingReadable(sources))
        }
    }
}

/// Every ruleset is read again this often, whatever the feed said: the safety net for
/// a lost message, a legacy rewrite that kept the table's size, and a plain
/// `iptables-save` that turned out to be legacy.
pub(crate) const FULL_READ: Duration = Duration::from_secs(300);
/// How often the legacy tables' signatures are compared (a few syscalls each).
pub(crate) const LEGACY_CHECK: Duration = Duration::from_secs(1);
/// Without the feed (no nf_tables, no permission), the nftables-backed rulesets are
/// read this often, as before the feed existed.
pub(crate) const POLL_WITHOUT_FEED: Duration = Duration::from_secs(10);
/// After a read that found nothing readable, everything is read again this soon (not
/// only on the next change): each such read counts in
/// `node_diag_service_rules_read_failures_total`, which keeps rising while the rules
/// stay unreadable, as it did when they were read every 10 s.
pub(crate) const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// A catalog followed by change: the feed, the legacy signatures, the parts.
pub(crate) struct Follower {
    watcher: CatalogWatcher,
    parts: Parts,
    feed: Option<Notifications>,
    legacy: HashMap<Kind, LegacySignature>,
    last_full: Instant,
    /// Set while the last read failed: when to read everything again.
    retry_at: Option<Instant>,
}

impl Follower {
    /// Subscribes to the feed (before reading, so no change falls between the two) and
    /// reads every ruleset once, in the calling thread's namespace.
    ///
    /// # Errors
    ///
    /// When nothing could be read ([`ServicesError::NothingReadable`]): the follower is
    /// returned all the same, it reads again on the next change or full read.
    pub(crate) fn start() -> (Self, Result<bool, ServicesError>) {
        let feed = match Notifications::subscribe() {
            Ok(feed) => Some(feed),
            Err(e) => {
                warn!(
                    error = %e,
                    every = ?POLL_WITHOUT_FEED,
                    "Service rules read on a timer instead of followed by change"
                );
                None
            }
        };
        let mut me = Self {
            watcher: CatalogWatcher::new(),
            parts: Parts::default(),
            feed,
            legacy: HashMap::new(),
            last_full: Instant::now(),
            retry_at: None,
        };
        for kind in [Kind::IptablesLegacy4, Kind::IptablesLegacy6] {
            me.legacy.insert(kind, legacy_signature(kind));
        }
        let first = me.read(&Kind::ALL.into_iter().collect());
        (me, first)
    }

    /// The catalog as last read.
    pub(crate) fn catalog(&self) -> &Arc<ServiceCatalog> {
        self.watcher.catalog()
    }

    /// What became of each source at the last read.
    pub(crate) fn sources(&self) -> &[Source] {
        self.watcher.sources()
    }

    fn read(&mut self, kinds: &HashSet<Kind>) -> Result<bool, ServicesError> {
        let started = Instant::now();
        let read = self.parts.read(kinds);
        debug!(?kinds, took = ?started.elapsed(), "read kube-proxy's rules again");
        self.retry_at = read.is_err().then(|| Instant::now() + RETRY_AFTER_FAILURE);
        self.watcher.apply(read)
    }

    /// Follows changes for ever: `publish` gets the catalog after every read that
    /// succeeded, `failed` is called for every read that did not.
    pub(crate) fn run(
        mut self,
        mut publish: impl FnMut(&Arc<ServiceCatalog>),
        mut failed: impl FnMut(),
    ) -> ! {
        let mut last_legacy = Instant::now();
        let mut last_poll = Instant::now();
        loop {
            let mut changed = HashSet::new();
            let now = Instant::now();
            let wait = LEGACY_CHECK.saturating_sub(now.duration_since(last_legacy));
            match &mut self.feed {
                Some(feed) => match feed.wait(wait, &mut changed) {
                    Ok(true) => {
                        // Let the burst end, so thousands of rule messages read once.
                        let first = Instant::now();
                        while first.elapsed() < MAX_DELAY {
                            match feed.wait(QUIET, &mut changed) {
                                Ok(true) => {}
                                Ok(false) | Err(_) => break,
                            }
                        }
                    }
                    Ok(false) => {}
                    Err(e) => {
                        warn!(
                            error = %e,
                            every = ?POLL_WITHOUT_FEED,
                            "Service rules read on a timer from now on"
                        );
                        self.feed = None;
                    }
                },
                None => {
                    std::thread::sleep(wait);
                    if last_poll.elapsed() >= POLL_WITHOUT_FEED {
                        last_poll = Instant::now();
                        changed.extend(NOTIFYING);
                    }
                }
            }
            if last_legacy.elapsed() >= LEGACY_CHECK {
                last_legacy = Instant::now();
                for (kind, signature) in &mut self.legacy {
                    let now = legacy_signature(*kind);
                    if now != *signature {
                        *signature = now;
                        changed.insert(*kind);
                    }
                }
            }
            if self.retry_at.is_some_and(|at| Instant::now() >= at) {
                changed.extend(Kind::ALL);
            }
            if self.last_full.elapsed() >= FULL_READ {
                self.last_full = Instant::now();
                changed.extend(Kind::ALL);
            }
            if changed.is_empty() {
                continue;
            }
            if self.read(&changed).is_ok() {
                publish(self.watcher.catalog());
            } else {
                failed();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One nf_tables notification as the kernel sends it: header, nfgenmsg, then
    /// the table name attribute.
    fn message(msg: u16, family: u8, table: &str) -> Vec<u8> {
        let mut attr = Vec::new();
        let name_len = table.len() + 1;
        attr.extend_from_slice(&u16::try_from(4 + name_len).unwrap().to_ne_bytes());
        attr.extend_from_slice(&1u16.to_ne_bytes());
        attr.extend_from_slice(table.as_bytes());
        attr.push(0);
        while attr.len() % 4 != 0 {
            attr.push(0);
        }
        let len = 16 + 4 + attr.len();
        let mut m = Vec::new();
        m.extend_from_slice(&u32::try_from(len).unwrap().to_ne_bytes());
        m.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | msg).to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&[family, 0, 0, 0]);
        m.extend_from_slice(&attr);
        m
    }

    #[test]
    fn messages_name_their_ruleset() {
        let mut buf = message(6, NFPROTO_IPV4, "nat"); // NEWRULE
        buf.extend(message(3, NFPROTO_IPV6, "kube-proxy")); // NEWCHAIN
        buf.extend(message(12, 1, "kube-proxy")); // inet: not kube-proxy's
        buf.extend(message(6, NFPROTO_IPV4, "mine")); // not an xtables table
        buf.extend(message(NFT_MSG_NEWGEN, 0, "x"));
        let mut changed = HashSet::new();
        kinds_of(&buf, &mut changed);
        assert_eq!(
            changed,
            HashSet::from([Kind::IptablesNft4, Kind::Nft6]),
            "{changed:?}"
        );
    }

    #[test]
    fn truncated_messages_are_skipped() {
        let full = message(6, NFPROTO_IPV4, "kube-proxy");
        for cut in [0, 10, 17, 21, full.len() - 1] {
            let mut changed = HashSet::new();
            kinds_of(&full[..cut], &mut changed);
            assert!(changed.is_empty(), "cut at {cut}: {changed:?}");
        }
    }

    #[test]
    fn no_legacy_signature_for_nft_kinds() {
        assert!(legacy_signature(Kind::Nft4).is_empty());
    }
}
