//! The `dnat` targets of one nftables table's rules, and the list of tables, dumped
//! straight from nf_tables over netlink (`NFT_MSG_GETRULE` with the table named,
//! `NFT_MSG_GETTABLE`).
//!
//! Why not `nft -j list table`: to print a table, nft first fetches every set's elements,
//! anonymous ones included, one request each, and kube-proxy's nftables mode gives every
//! Service chain an anonymous vmap (`numgen random mod N vmap { ... }`). At 20,000
//! Services that is 20,000 requests, each looking its set up by name among 20,000: about
//! 12 s of kernel time on a 2-CPU VM, where one rule dump of the same table takes 0.3 s.
//! The maps the catalog needs (`service-ips`, `no-endpoint-*`) are few and read with
//! `nft -j list map`, which fetches only their elements.
//!
//! A rule's expressions are decoded just enough for `dnat to ADDR:PORT`: `immediate`
//! loads registers, `nat` (type dnat) names the registers holding the address and port.
//! Everything else is skipped.

use std::{
    collections::HashMap,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::{Duration, Instant},
};

use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};
use rustix::event::{PollFd, PollFlags, Timespec, poll};

use crate::host_network::nlmsg::{
    NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, attrs, message, messages_with_flags,
    put_attr,
};

/// nfnetlink subsystem of nf_tables, the message type's high byte.
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
/// Set on a dump's messages when the ruleset changed while it ran.
const NLM_F_DUMP_INTR: u16 = 0x10;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_NAT_TYPE: u16 = 1;
const NFTA_NAT_FAMILY: u16 = 2;
const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
const NFT_NAT_DNAT: u32 = 1;
const NFPROTO_IPV4: u32 = 2;
const NFPROTO_IPV6: u32 = 10;

/// A dump changed under us is read again, this many times at most.
const ATTEMPTS: usize = 3;

/// The nftables family of a table (nfgenmsg's `nfgen_family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Ip,
    Ip6,
}

impl Family {
    fn nfproto(self) -> u8 {
        match self {
            Family::Ip => 2,
            Family::Ip6 => 10,
        }
    }

    /// nft's name of the family, as [`Table::family`] holds it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        }
    }
}

/// One table: its family as nft names it (`ip`, `inet`...) and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    pub(crate) family: &'static str,
    pub(crate) name: String,
}

/// nft's name of an nfgenmsg family.
fn family_name(nfproto: u8) -> Option<&'static str> {
    Some(match nfproto {
        1 => "inet",
        2 => "ip",
        3 => "arp",
        5 => "netdev",
        7 => "bridge",
        10 => "ip6",
        _ => return None,
    })
}

/// Every nftables table in the calling thread's network namespace. `nft list tables`
/// fetches every set's elements first (seconds beside kube-proxy's nftables mode at
/// scale); this dump reads the table list alone.
///
/// # Errors
///
/// As [`dnat_targets`].
pub(crate) fn tables(deadline: Duration) -> Result<Vec<Table>, DumpError> {
    let get = Request {
        get: NFT_MSG_GETTABLE,
        new: NFT_MSG_NEWTABLE,
        family: 0,
        attrs: Vec::new(),
    };
    dump_consistent(&get, deadline, |body, found| {
        let Some(family) = body.first().copied().and_then(family_name) else {
            return;
        };
        if let Some(name) = body
            .get(4..)
            .and_then(|a| attr(a, NFTA_TABLE_NAME))
            .and_then(cstr)
        {
            found.push(Table {
                family,
                name: name.to_owned(),
            });
        }
    })
}

/// A dump request: its message type, the type of the answers, family and attributes.
struct Request {
    get: u16,
    new: u16,
    family: u8,
    attrs: Vec<u8>,
}

/// A rule's `dnat to ADDR:PORT`, and the chain it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dnat {
    pub(crate) chain: String,
    pub(crate) to: SocketAddr,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum DumpError {
    #[error("cannot open a netfilter netlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("nf_tables refused the dump: {0}")]
    Refused(#[source] io::Error),
    #[error("reading the dump failed: {0}")]
    Receive(#[source] io::Error),
    #[error("the dump took longer than {0:?}")]
    Timeout(Duration),
    #[error("the ruleset kept changing during the dump ({ATTEMPTS} attempts)")]
    Interrupted,
}

/// Every `dnat to ADDR:PORT` in the rules of table `table` of `family`, in the calling
/// thread's network namespace, whose chain `keep` accepts. A table that does not exist
/// has no rules: nothing is returned.
///
/// # Errors
///
/// When the socket cannot be opened (no `CAP_NET_ADMIN`), the kernel refuses the dump,
/// it outlasts `deadline`, or the ruleset changed under every attempt.
pub(crate) fn dnat_targets(
    family: Family,
    table: &str,
    keep: impl Fn(&str) -> bool,
    deadline: Duration,
) -> Result<Vec<Dnat>, DumpError> {
    let mut attrs = Vec::new();
    put_attr(
        &mut attrs,
        NFTA_RULE_TABLE,
        &[table.as_bytes(), &[0]].concat(),
    );
    let get = Request {
        get: NFT_MSG_GETRULE,
        new: NFT_MSG_NEWRULE,
        family: family.nfproto(),
        attrs,
    };
    dump_consistent(&get, deadline, |body, found| {
        if let Some((chain, exprs)) = rule_of(body)
            && keep(chain)
        {
            found.extend(dnats_of(exprs).map(|to| Dnat {
                chain: chain.to_owned(),
                to,
            }));
        }
    })
}

/// Dumps `req` and collects what `each` takes from each answer, again from scratch when
/// the ruleset changed during the dump (`NLM_F_DUMP_INTR`), [`ATTEMPTS`] times at most,
/// all within `deadline`.
fn dump_consistent<T>(
    req: &Request,
    deadline: Duration,
    mut each: impl FnMut(&[u8], &mut Vec<T>),
) -> Result<Vec<T>, DumpError> {
    let until = Instant::now() + deadline;
    for _ in 0..ATTEMPTS {
        let mut found = Vec::new();
        let mut interrupted = false;
        dump(req, until, deadline, |flags, body| {
            interrupted |= flags & NLM_F_DUMP_INTR != 0;
            each(body, &mut found);
        })?;
        if !interrupted {
            return Ok(found);
        }
    }
    Err(DumpError::Interrupted)
}

/// Sends the dump request and hands each answer's flags and body to `each`.
fn dump(
    req: &Request,
    until: Instant,
    deadline: Duration,
    mut each: impl FnMut(u16, &[u8]),
) -> Result<(), DumpError> {
    let mut socket = Socket::new(NETLINK_NETFILTER).map_err(DumpError::Socket)?;
    socket.bind_auto().map_err(DumpError::Socket)?;
    socket.set_non_blocking(true).map_err(DumpError::Socket)?;
    let request = message(
        (NFNL_SUBSYS_NFTABLES << 8) | req.get,
        NLM_F_REQUEST | NLM_F_DUMP,
        // nfgenmsg: family, version (NFNETLINK_V0), resource id (unused).
        [req.family, 0, 0, 0],
        &req.attrs,
    );
    socket.send(&request, 0).map_err(DumpError::Refused)?;
    // A dump message is at most 32 KiB; room for one more keeps it from truncating.
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
    loop {
        buf.clear();
        match socket.recv(&mut buf, 0) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(DumpError::Timeout(deadline));
                }
                readable_within(&socket, left).map_err(DumpError::Receive)?;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(DumpError::Receive(e)),
        }
        for (ty, flags, body) in messages_with_flags(&buf) {
            match ty {
                NLMSG_DONE => return Ok(()),
                NLMSG_ERROR => {
                    let errno = body
                        .get(..4)
                        .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                    if errno != 0 {
                        return Err(DumpError::Refused(io::Error::from_raw_os_error(-errno)));
                    }
                }
                ty if ty == (NFNL_SUBSYS_NFTABLES << 8) | req.new => each(flags, body),
                _ => {}
            }
        }
    }
}

/// Waits up to `timeout` for `socket` to be readable: whether it is (`false` also when a
/// signal cut the wait short).
pub(super) fn readable_within(socket: &Socket, timeout: Duration) -> io::Result<bool> {
    // Longer than i64 seconds: forever, for all a poll can tell.
    let ts = Timespec::try_from(timeout).unwrap_or(Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    });
    let mut fds = [PollFd::new(socket, PollFlags::IN)];
    match poll(&mut fds, Some(&ts)) {
        Ok(n) => Ok(n > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn attr(buf: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(buf).find_map(|(t, p)| (t == ty).then_some(p))
}

fn be32(p: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(p.get(..4)?.try_into().ok()?))
}

fn cstr(p: &[u8]) -> Option<&str> {
    std::str::from_utf8(p.split(|&b| b == 0).next()?).ok()
}

/// A rule message's chain and expression list.
fn rule_of(body: &[u8]) -> Option<(&str, &[u8])> {
    let attrs_buf = body.get(4..)?; // after nfgenmsg
    let chain = cstr(attr(attrs_buf, NFTA_RULE_CHAIN)?)?;
    let exprs = attr(attrs_buf, NFTA_RULE_EXPRESSIONS)?;
    Some((chain, exprs))
}

/// Register numbers as 32-bit registers: nft may load `NFT_REG_1`..`NFT_REG_4` (16 bytes
/// each) or `NFT_REG32_00`.. (8 and up), and the two name the same storage.
fn reg32(reg: u32) -> u32 {
    match reg {
        1..=4 => 8 + (reg - 1) * 4,
        r => r,
    }
}

/// The `dnat to ADDR:PORT` targets of one rule's expressions.
fn dnats_of(exprs: &[u8]) -> impl Iterator<Item = SocketAddr> {
    let mut regs: HashMap<u32, &[u8]> = HashMap::new();
    let mut out = Vec::new();
    for (ty, elem) in attrs(exprs) {
        if ty != NFTA_LIST_ELEM {
            continue;
        }
        let (Some(name), Some(data)) = (
            attr(elem, NFTA_EXPR_NAME).and_then(cstr),
            attr(elem, NFTA_EXPR_DATA),
        ) else {
            continue;
        };
        match name {
            "immediate" => {
                let dreg = attr(data, NFTA_IMMEDIATE_DREG).and_then(be32);
                let value = attr(data, NFTA_IMMEDIATE_DATA).and_then(|d| attr(d, NFTA_DATA_VALUE));
                if let (Some(dreg), Some(value)) = (dreg, value) {
                    regs.insert(reg32(dreg), value);
                }
            }
            "nat" => {
                if let Some(to) = dnat_target(data, &regs) {
                    out.push(to);
                }
            }
            _ => {}
        }
    }
    out.into_iter()
}

fn dnat_target(nat: &[u8], regs: &HashMap<u32, &[u8]>) -> Option<SocketAddr> {
    if attr(nat, NFTA_NAT_TYPE).and_then(be32)? != NFT_NAT_DNAT {
        return None;
    }
    let reg = |ty| {
        attr(nat, ty)
            .and_then(be32)
            .and_then(|r| regs.get(&reg32(r)).copied())
    };
    let addr = reg(NFTA_NAT_REG_ADDR_MIN)?;
    let ip = match attr(nat, NFTA_NAT_FAMILY).and_then(be32)? {
        NFPROTO_IPV4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(addr.get(..4)?).ok()?)),
        NFPROTO_IPV6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(addr.get(..16)?).ok()?)),
        _ => return None,
    };
    let port = reg(NFTA_NAT_REG_PROTO_MIN)?;
    let port = u16::from_be_bytes(port.get(..2)?.try_into().ok()?);
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(ty: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        put_attr(&mut out, ty | 0x8000, &parts.concat());
        out
    }

    fn plain(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_attr(&mut out, ty, payload);
        out
    }

    fn name(s: &str) -> Vec<u8> {
        plain(NFTA_EXPR_NAME, &[s.as_bytes(), &[0]].concat())
    }

    fn immediate(reg: u32, value: &[u8]) -> Vec<u8> {
        nested(
            NFTA_LIST_ELEM,
            &[
                name("immediate"),
                nested(
                    NFTA_EXPR_DATA,
                    &[
                        plain(NFTA_IMMEDIATE_DREG, &reg.to_be_bytes()),
                        nested(NFTA_IMMEDIATE_DATA, &[plain(NFTA_DATA_VALUE, value)]),
                    ],
                ),
            ],
        )
    }

    fn nat(ty: u32, family: u32, addr_reg: u32, port_reg: u32) -> Vec<u8> {
        nested(
            NFTA_LIST_ELEM,
            &[
                name("nat"),
                nested(
                    NFTA_EXPR_DATA,
                    &[
                        plain(NFTA_NAT_TYPE, &ty.to_be_bytes()),
                        plain(NFTA_NAT_FAMILY, &family.to_be_bytes()),
                        plain(NFTA_NAT_REG_ADDR_MIN, &addr_reg.to_be_bytes()),
                        plain(NFTA_NAT_REG_PROTO_MIN, &port_reg.to_be_bytes()),
                    ],
                ),
            ],
        )
    }

    fn rule(chain: &str, exprs: &[Vec<u8>]) -> Vec<u8> {
        let mut body = vec![2, 0, 0, 0];
        body.extend(plain(NFTA_RULE_TABLE, b"kube-proxy\0"));
        body.extend(plain(NFTA_RULE_CHAIN, &[chain.as_bytes(), &[0]].concat()));
        body.extend(nested(NFTA_RULE_EXPRESSIONS, exprs));
        body
    }

    #[test]
    fn ipv4_dnat_in_16_byte_registers() {
        // `meta l4proto tcp dnat to 10.180.0.1:80`, as nft 1.0 compiles it.
        let meta = nested(NFTA_LIST_ELEM, &[name("meta")]);
        let body = rule(
            "endpoint-X-ns/svc/tcp/p80__10.180.0.1/80",
            &[
                meta,
                immediate(1, &[10, 180, 0, 1]),
                immediate(2, &80u16.to_be_bytes()),
                nat(NFT_NAT_DNAT, NFPROTO_IPV4, 1, 2),
            ],
        );
        let (chain, exprs) = rule_of(&body).unwrap();
        assert_eq!(chain, "endpoint-X-ns/svc/tcp/p80__10.180.0.1/80");
        assert_eq!(
            dnats_of(exprs).collect::<Vec<_>>(),
            ["10.180.0.1:80".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn ipv6_dnat_in_32_bit_registers() {
        let ip: Ipv6Addr = "fd00::5".parse().unwrap();
        let body = rule(
            "endpoint-Y",
            &[
                immediate(8, &ip.octets()),
                immediate(12, &8443u16.to_be_bytes()),
                // NFT_REG_1 and NFT_REG32_00 are the same storage.
                nat(NFT_NAT_DNAT, NFPROTO_IPV6, 1, 12),
            ],
        );
        let (_, exprs) = rule_of(&body).unwrap();
        assert_eq!(
            dnats_of(exprs).collect::<Vec<_>>(),
            ["[fd00::5]:8443".parse::<SocketAddr>().unwrap()]
        );
    }

    #[test]
    fn snat_and_unloaded_registers_are_not_dnat_targets() {
        let body = rule(
            "endpoint-Z",
            &[
                immediate(1, &[10, 0, 0, 1]),
                nat(0, NFPROTO_IPV4, 1, 2),            // snat
                nat(NFT_NAT_DNAT, NFPROTO_IPV4, 1, 3), // port register never loaded
            ],
        );
        let (_, exprs) = rule_of(&body).unwrap();
        assert_eq!(dnats_of(exprs).count(), 0);
    }

    #[test]
    fn a_dump_message_keeps_its_interrupted_flag() {
        let mut buf = Vec::new();
        for (ty, body) in [
            (NFT_MSG_NEWRULE | (10 << 8), vec![1u8; 5]),
            (NLMSG_DONE, vec![]),
        ] {
            let len = 16 + body.len();
            buf.extend_from_slice(&u32::try_from(len).unwrap().to_ne_bytes());
            buf.extend_from_slice(&ty.to_ne_bytes());
            buf.extend_from_slice(&NLM_F_DUMP_INTR.to_ne_bytes());
            buf.extend_from_slice(&[0; 8]);
            buf.extend_from_slice(&body);
            buf.resize((buf.len() + 3) & !3, 0);
        }
        let got: Vec<_> = messages_with_flags(&buf)
            .map(|(t, f, b)| (t, f, b.len()))
            .collect();
        assert_eq!(
            got,
            [
                (NFT_MSG_NEWRULE | (10 << 8), NLM_F_DUMP_INTR, 5),
                (NLMSG_DONE, NLM_F_DUMP_INTR, 0)
            ]
        );
        assert_eq!(messages_with_flags(&buf[..20]).count(), 0);
    }
}
