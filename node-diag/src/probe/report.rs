//! What the search found, judged and told: the [`Ceiling`] the search ran under, the
//! [`Verdict`] (ok, path MTU below the local one, black hole, no reply) and the
//! [`Report`] that `node-diag probe` prints as text (with the `1500 − 20 − 8 = 1472`
//! arithmetic) or serializes as JSON.

use std::{
    fmt::Write as _,
    io,
    net::{IpAddr, SocketAddr},
};

use serde::Serialize;

use super::{
    egress::Egress,
    packets::{Family, ICMP_HEADER, MAX_PACKET},
    search::Search,
    tcp::{TcpReport, TcpResult},
};

/// The largest size the search tries, and what set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ceiling {
    pub(crate) size: u32,
    pub(crate) why: &'static str,
}

impl Ceiling {
    pub(crate) fn new(local_mtu: u32, max_mtu: Option<u32>, family: Family) -> Ceiling {
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
pub(crate) enum Verdict {
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
pub(crate) struct FragNeededSummary {
    pub(crate) count: usize,
    /// The smallest next-hop MTU any router reported.
    pub(crate) next_hop_mtu: Option<u32>,
    /// The router that reported it (or the first that sent one).
    pub(crate) from: Option<IpAddr>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) dst: IpAddr,
    pub(crate) family: &'static str,
    pub(crate) interface: String,
    pub(crate) local_mtu: u32,
    pub(crate) path_mtu: Option<u32>,
    pub(crate) max_icmp_payload: Option<u32>,
    pub(crate) frag_needed: FragNeededSummary,
    pub(crate) vanished_sizes: Vec<u32>,
    pub(crate) verdict: Verdict,
    pub(crate) summary: String,
    pub(crate) probes: u32,
    pub(crate) tcp: Option<TcpReport>,
    #[serde(skip)]
    ceiling: Ceiling,
    #[serde(skip)]
    unreachable: Option<(u32, u8, IpAddr)>,
}

impl Report {
    pub(crate) fn new(
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
    pub(crate) fn text(&self) -> String {
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

/// `node-diag probe`'s exit status: 0 only for a working path and, with `--port`, an
/// open port. A failed TCP check decides it first (it is what `--port` asked), then the
/// path's verdict. A path narrower than the interface whose routers say so
/// (`pmtu_below_local`) works: PMTUD finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    Ok = 0,
    /// Bad input, or the probe could not run (no route, no raw socket).
    Error = 1,
    /// The TCP connect was refused.
    Refused = 2,
    /// The TCP connect timed out, or no echo size was answered.
    NoAnswer = 3,
    /// A PMTUD black hole: oversized probes vanished without frag-needed.
    Blackhole = 4,
    /// An ICMP destination unreachable (or a local routing error) answered.
    Unreachable = 5,
    /// The TCP connect failed with another error (its errno is in the report).
    ConnectFailed = 6,
}

/// The exit statuses, for `--help` and docs/cli.md.
pub(crate) const EXIT_HELP: &str = "Exit status:\n  \
    0  the path works (whole MTU, or PMTUD works) and, with --port, the port is open\n  \
    1  bad input, or the probe could not run (no route, no CAP_NET_RAW)\n  \
    2  the TCP connect was refused\n  \
    3  no answer: the TCP connect timed out, or no echo was answered at any size\n  \
    4  PMTUD black hole: oversized probes vanished without ICMP frag-needed\n  \
    5  unreachable: an ICMP destination unreachable (or no route on the way)\n  \
    6  the TCP connect failed otherwise (errno in the report)";

impl Report {
    pub(crate) fn exit(&self) -> Exit {
        let tcp = self.tcp.as_ref().map(|t| t.result);
        match (tcp, self.verdict) {
            (Some(TcpResult::Refused), _) => Exit::Refused,
            (Some(TcpResult::TimedOut), _) => Exit::NoAnswer,
            (Some(TcpResult::Unreachable), _) => Exit::Unreachable,
            (Some(TcpResult::Error), _) => Exit::ConnectFailed,
            (_, Verdict::Ok | Verdict::PmtuBelowLocal) => Exit::Ok,
            (_, Verdict::Blackhole) => Exit::Blackhole,
            (_, Verdict::NoReply) if self.unreachable.is_some() => Exit::Unreachable,
            (_, Verdict::NoReply) => Exit::NoAnswer,
        }
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

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::probe::{
        packets::Outcome,
        search::{
            search,
            tests::{ROUTER, path},
        },
    };

    const DST4: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 9);

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
    fn exit_codes() {
        let with_tcp = |s: Search, result: Option<TcpResult>| {
            let mut r = report(s);
            r.tcp = result.map(|result| TcpReport {
                port: 80,
                result,
                errno: None,
            });
            r.exit()
        };
        let ok = || search(68, 1500, path(1500, 1500, false)).unwrap();
        let pmtud = || search(68, 1500, path(1500, 1450, false)).unwrap();
        let hole = || search(68, 1500, path(1500, 1450, true)).unwrap();
        let silent = || search(68, 1500, |_| Ok::<_, ()>(Outcome::Lost)).unwrap();
        let unreachable = || {
            search(68, 1500, |_| {
                Ok::<_, ()>(Outcome::Unreachable {
                    code: 1,
                    from: ROUTER,
                })
            })
            .unwrap()
        };
        assert_eq!(with_tcp(ok(), None), Exit::Ok);
        assert_eq!(with_tcp(ok(), Some(TcpResult::Ok)), Exit::Ok);
        assert_eq!(with_tcp(pmtud(), None), Exit::Ok, "PMTUD works");
        assert_eq!(with_tcp(hole(), None), Exit::Blackhole);
        assert_eq!(with_tcp(hole(), Some(TcpResult::Ok)), Exit::Blackhole);
        assert_eq!(with_tcp(silent(), None), Exit::NoAnswer);
        assert_eq!(with_tcp(silent(), Some(TcpResult::Ok)), Exit::NoAnswer);
        assert_eq!(with_tcp(unreachable(), None), Exit::Unreachable);
        assert_eq!(with_tcp(ok(), Some(TcpResult::Refused)), Exit::Refused);
        assert_eq!(with_tcp(hole(), Some(TcpResult::Refused)), Exit::Refused);
        assert_eq!(with_tcp(ok(), Some(TcpResult::TimedOut)), Exit::NoAnswer);
        assert_eq!(
            with_tcp(silent(), Some(TcpResult::Unreachable)),
            Exit::Unreachable
        );
        assert_eq!(with_tcp(ok(), Some(TcpResult::Error)), Exit::ConnectFailed);
        let codes = [
            Exit::Ok,
            Exit::Error,
            Exit::Refused,
            Exit::NoAnswer,
            Exit::Blackhole,
            Exit::Unreachable,
            Exit::ConnectFailed,
        ];
        for (n, e) in codes.into_iter().enumerate() {
            assert_eq!(e as usize, n);
            assert!(EXIT_HELP.contains(&format!("\n  {n}  ")), "{n} documented");
        }
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
}
