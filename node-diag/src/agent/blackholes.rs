//! Which reported PMTUD black holes are still open. A black-holed flow retransmits on a
//! timer that backs off (to two minutes between retransmits), so silence says nothing:
//! a flow is open while its last retransmit is recent, and after that while its socket
//! says it is stuck (`host_network::sock_diag`: an RTO count above 0 with data
//! unacknowledged). It closes when the socket moved on (an ACK reset its RTO count),
//! closed, or is gone; an agent that cannot ask keeps a quiet flow open for as long as
//! the kernel's longest retransmission timeout, then lets it go.
//!
//! [`ShrinkConfirm`]: a stalled segment sent again smaller (`MSS_SHRUNK`) is a black
//! hole that MTU probing masked only once the smaller segment got through. The kernel's
//! black-hole detection shrinks the MSS of any flow stuck long enough, a dead peer's
//! too; so the flow's socket is asked until it shows an ACK moved the flow (its RTO count
//! back to 0) or its side closed in order, and a flow still waiting on its timeout a few
//! seconds later stays the stall it was.
//!
//! [`StallRecheck`]: a stall the programs judged on a full-size segment without MTU
//! evidence is judged again a moment later, from the evidence maps. The programs judge
//! at the retransmit, and a forwarded segment's oversize drop or frag-needed comes
//! after it; an agent started during a black hole has seen no earlier transmission.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::{Duration, Instant},
};

use node_diag_common::{AF_INET, DropInfo, Event, FlowKey, WINDOW_ALL, event_kind, stall};
use tracing::debug;

use crate::{
    findings::correlate::{self, ShrunkBy, addr},
    host_network::{
        conntrack_stats::{own_netns, scope_files},
        in_netns, sender_path,
        sock_diag::{TcpProgress, tcp_progress},
    },
    kernel::maps::{KernelMaps, ReportedBlackhole},
};

/// Retransmits this recent keep a flow open without asking its socket.
const RECENT: Duration = Duration::from_secs(10);
/// How long a socket's answer stands before it is asked again.
const RECHECK: Duration = Duration::from_secs(2);
/// Without an answer, a quiet flow stays open this long: `TCP_RTO_MAX` (120 s) and a
/// margin, the longest a stuck flow waits between two retransmits.
const UNANSWERED: Duration = Duration::from_secs(130);
/// Sockets asked per round: a flood of black holes costs a bounded number of lookups,
/// the rest keep their last answer a round longer.
const MAX_ASKED: usize = 64;

/// What a socket said of its flow, and when.
#[derive(Debug, Clone, Copy)]
struct Answer {
    at: Instant,
    /// `None`: the socket is gone.
    progress: Option<TcpProgress>,
}

/// The open black holes, from the kernel's reports and their sockets' answers.
#[derive(Default)]
pub(super) struct BlackholeWatch {
    answers: HashMap<FlowKey, Answer>,
}

/// How long after a stall its evidence is looked for again.
const RECHECK_AFTER: Duration = Duration::from_secs(1);
/// Stalls waiting to be judged again; beyond, the oldest are not.
const MAX_PENDING: usize = 256;

/// Full-size stalls waiting to be judged again.
#[derive(Default)]
pub(super) struct StallRecheck {
    pending: Vec<(Instant, Event)>,
}

impl StallRecheck {
    pub(super) fn push(&mut self, ev: Event, now: Instant) {
        if self.pending.len() >= MAX_PENDING {
            self.pending.remove(0);
        }
        self.pending.push((now + RECHECK_AFTER, ev));
    }

    /// The stalls due for their second look.
    pub(super) fn due(&mut self, now: Instant) -> Vec<Event> {
        let (due, later) = self.pending.drain(..).partition(|(at, _)| *at <= now);
        self.pending = later;
        due.into_iter().map(|(_, ev)| ev).collect()
    }
}

/// How long a segment sent smaller has to show it got through: its ACK comes a round
/// trip after it, and the next timeout of a flow still stuck seconds later.
const SHRINK_CONFIRM: Duration = Duration::from_secs(3);
/// Shrinks waiting to be confirmed; beyond, the oldest are given up (no finding).
const MAX_SHRINKS: usize = 256;

/// Segments sent smaller after a stall, waiting for their sockets to show they got
/// through.
#[derive(Default)]
pub(super) struct ShrinkConfirm {
    pending: Vec<(Instant, Event)>,
}

/// What became of a segment sent smaller.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Shrink {
    /// An ACK moved the flow, or it closed its side in order: the smaller segment
    /// crossed where the larger ones did not.
    Through(Event),
    /// Still waiting on its timeout when the time was up, or gone without saying: not
    /// shown to be a black hole (a peer that went silent shrinks the same way).
    NotShown(Event, &'static str),
}

impl ShrinkConfirm {
    pub(super) fn push(&mut self, ev: Event, now: Instant) {
        if self.pending.len() >= MAX_SHRINKS {
            self.pending.remove(0);
        }
        self.pending.push((now, ev));
    }

    /// Asks the sockets of the pending shrinks (off the loop, in their namespaces) and
    /// returns those settled.
    pub(super) async fn check(&mut self) -> Vec<Shrink> {
        if self.pending.is_empty() {
            return Vec::new();
        }
        let mut by_netns: BTreeMap<u32, Vec<FlowKey>> = BTreeMap::new();
        for (_, ev) in &self.pending {
            by_netns.entry(ev.netns).or_default().push(ev.flow);
        }
        let answers: HashMap<FlowKey, Option<TcpProgress>> =
            match tokio::task::spawn_blocking(move || ask_sockets(by_netns)).await {
                Ok(answers) => answers.into_iter().collect(),
                Err(_) => HashMap::new(),
            };
        let now = Instant::now();
        let mut settled = Vec::new();
        self.pending.retain(|(since, ev)| {
            match settle(
                *ev,
                answers.get(&ev.flow).copied(),
                now.duration_since(*since),
            ) {
                Some(s) => {
                    settled.push(s);
                    false
                }
                None => true,
            }
        });
        settled
    }
}

/// The fate of the shrink `ev`, `waited` after it, from its socket's answer (`None`: not
/// asked or not answered; `Some(None)`: the socket is gone); `None` while undecided.
fn settle(ev: Event, answer: Option<Option<TcpProgress>>, waited: Duration) -> Option<Shrink> {
    match answer {
        Some(Some(p)) if p.moved() => Some(Shrink::Through(ev)),
        Some(None) => Some(Shrink::NotShown(ev, "the socket closed before it showed")),
        _ if waited >= SHRINK_CONFIRM => Some(Shrink::NotShown(
            ev,
            "the smaller segment got no answer either",
        )),
        _ => None,
    }
}

/// The stall `ev` as the black hole its flow's MTU evidence now shows, judged by the
/// programs' own rule (evidence whose MTU the segment still exceeds); `None` without.
pub(super) fn as_blackhole(ev: &Event, maps: &KernelMaps) -> Option<Event> {
    let since = if ev.window_ms == WINDOW_ALL {
        0
    } else {
        ev.ts_ns.saturating_sub(u64::from(ev.window_ms) * 1_000_000)
    };
    let found = maps.flow_evidence(&ev.flow, since);
    let packet = stall::smallest_packet(ev.flow.family, ev.len);
    let oversize = if found.oversize.count > 0 && stall::exceeds(packet, found.oversize.mtu) {
        found.oversize
    } else {
        DropInfo::default()
    };
    let sent = found.icmp_sent;
    let frag_sent = sent.count > 0
        && sent.icmp_type == node_diag_common::icmp::DEST_UNREACH
        && sent.icmp_code == node_diag_common::icmp::FRAG_NEEDED
        && stall::exceeds(packet, sent.mtu);
    let rcvd = found.icmp_rcvd.count > 0 && stall::exceeds(packet, found.icmp_rcvd.mtu);
    if oversize.count == 0 && !frag_sent && !rcvd && found.frag_dropped.count == 0 {
        return None;
    }
    Some(Event {
        kind: event_kind::PMTUD_STALL,
        drop: oversize,
        icmp: found.icmp_sent,
        icmp_rcvd: found.icmp_rcvd,
        frag_dropped: found.frag_dropped,
        ..*ev
    })
}

/// What sent the segment of `ev` (an `MSS_SHRUNK` event) again smaller, asked of the
/// flow's namespace off the loop. A namespace that cannot be asked (gone already) leaves
/// the kernel's rule to stand: MTU probing.
pub(super) async fn shrunk_by(ev: &Event) -> ShrunkBy {
    let (netns, dst) = (ev.netns, addr(&ev.flow, &ev.flow.daddr));
    let sender = tokio::task::spawn_blocking(move || sender_path(netns, dst)).await;
    match sender {
        Ok(Ok(sender)) => correlate::shrunk_by(ev, &sender),
        Ok(Err(e)) => {
            debug!(netns, error = %e, "cannot look at the sender's path MTU");
            ShrunkBy::MtuProbing
        }
        Err(e) => {
            debug!(netns, error = %e, "sender path lookup failed");
            ShrunkBy::MtuProbing
        }
    }
}

/// A flow's local and remote ends as its socket holds them (an IPv6 socket's
/// IPv4-mapped addresses stay mapped: sock_diag looks the socket up by its own family).
fn ends(flow: &FlowKey) -> (u8, SocketAddr, SocketAddr) {
    let ip = |b: &[u8; 16]| {
        if flow.family == AF_INET {
            IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
        } else {
            IpAddr::V6(Ipv6Addr::from(*b))
        }
    };
    (
        flow.family as u8,
        SocketAddr::new(ip(&flow.saddr), flow.sport),
        SocketAddr::new(ip(&flow.daddr), flow.dport),
    )
}

impl BlackholeWatch {
    /// The flows of `reported` still open now.
    pub(super) fn open(&self, reported: &[ReportedBlackhole], now: Instant) -> HashSet<FlowKey> {
        reported
            .iter()
            .filter(|r| self.is_open(r, now))
            .map(|r| r.flow)
            .collect()
    }

    fn is_open(&self, r: &ReportedBlackhole, now: Instant) -> bool {
        let quiet = Duration::from_nanos(r.quiet_ns);
        if quiet < RECENT {
            return true;
        }
        match self.answers.get(&r.flow) {
            Some(a) if now.duration_since(a.at) < UNANSWERED => {
                a.progress.is_some_and(|p| p.stuck())
            }
            _ => quiet < UNANSWERED,
        }
    }

    /// Asks the sockets of the quiet flows among `reported` how they are doing (in
    /// their namespaces, off the event loop), at most [`MAX_ASKED`] of them, each at
    /// most every [`RECHECK`]; forgets flows no longer reported.
    pub(super) async fn ask(&mut self, reported: &[ReportedBlackhole]) {
        let now = Instant::now();
        let wanted: HashSet<FlowKey> = reported.iter().map(|r| r.flow).collect();
        self.answers.retain(|flow, _| wanted.contains(flow));
        let mut by_netns: BTreeMap<u32, Vec<FlowKey>> = BTreeMap::new();
        reported
            .iter()
            .filter(|r| Duration::from_nanos(r.quiet_ns) >= RECENT)
            .filter(|r| {
                self.answers
                    .get(&r.flow)
                    .is_none_or(|a| now.duration_since(a.at) >= RECHECK)
            })
            .take(MAX_ASKED)
            .for_each(|r| by_netns.entry(r.netns).or_default().push(r.flow));
        if by_netns.is_empty() {
            return;
        }
        let asked = tokio::task::spawn_blocking(move || ask_sockets(by_netns)).await;
        let Ok(answers) = asked else {
            return;
        };
        let at = Instant::now();
        for (flow, progress) in answers {
            self.answers.insert(flow, Answer { at, progress });
        }
    }
}

/// Each flow's socket, asked in its namespace; flows whose namespace or socket could
/// not be asked are left out (their last answer, or the quiet rule, stands).
fn ask_sockets(by_netns: BTreeMap<u32, Vec<FlowKey>>) -> Vec<(FlowKey, Option<TcpProgress>)> {
    let ask = |flows: &[FlowKey]| -> Vec<(FlowKey, Option<TcpProgress>)> {
        flows
            .iter()
            .filter_map(|flow| {
                let (family, src, dst) = ends(flow);
                match tcp_progress(family, src, dst) {
                    Ok(p) => Some((*flow, p)),
                    Err(e) => {
                        debug!(error = %e, %src, %dst, "sock_diag lookup failed");
                        None
                    }
                }
            })
            .collect()
    };
    let own = own_netns();
    let inodes = by_netns.keys().copied().collect();
    let files = scope_files(Some(&inodes));
    let mut out = Vec::new();
    for (netns, flows) in &by_netns {
        if *netns == own || *netns == 0 {
            out.extend(ask(flows));
            continue;
        }
        let Some(file) = files.iter().find(|f| f.inode == *netns) else {
            continue;
        };
        match in_netns(file, || ask(flows)) {
            Ok(answers) => out.extend(answers),
            Err(e) => debug!(error = %e, netns, "cannot enter namespace for sock_diag"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported(quiet_secs: u64) -> ReportedBlackhole {
        let mut flow = FlowKey {
            sport: 40000,
            dport: 9003,
            family: AF_INET,
            ..Default::default()
        };
        flow.saddr[..4].copy_from_slice(&[10, 244, 1, 7]);
        flow.daddr[..4].copy_from_slice(&[10, 244, 2, 9]);
        ReportedBlackhole {
            flow,
            netns: 1,
            quiet_ns: quiet_secs * 1_000_000_000,
        }
    }

    fn progress(rto_count: u8, unacked: u32) -> Option<TcpProgress> {
        Some(TcpProgress {
            state: 1,
            rto_count,
            unacked,
            cgroup_id: None,
        })
    }

    #[test]
    fn a_recent_retransmit_keeps_a_flow_open_without_asking() {
        let w = BlackholeWatch::default();
        let r = reported(3);
        assert!(w.open(&[r], Instant::now()).contains(&r.flow));
    }

    #[test]
    fn a_quiet_flow_is_open_while_its_socket_is_stuck() {
        let now = Instant::now();
        let r = reported(45);
        let mut w = BlackholeWatch::default();
        for (answer, open) in [
            (progress(7, 1), true),
            (progress(0, 1), false),
            (progress(3, 0), false),
            (None, false),
        ] {
            w.answers.insert(
                r.flow,
                Answer {
                    at: now,
                    progress: answer,
                },
            );
            assert_eq!(w.open(&[r], now).contains(&r.flow), open, "{answer:?}");
        }
    }

    #[test]
    fn unanswered_quiet_flows_stay_open_for_the_longest_rto_only() {
        let w = BlackholeWatch::default();
        let now = Instant::now();
        assert!(w.open(&[reported(100)], now).len() == 1);
        assert!(w.open(&[reported(200)], now).is_empty());
    }

    #[test]
    fn a_shrink_is_a_masked_black_hole_only_once_the_smaller_segment_got_through() {
        let ev = Event {
            kind: event_kind::MSS_SHRUNK,
            flow: reported(0).flow,
            len: 1398,
            mtu: 1024,
            ..Event::default()
        };
        let ms = Duration::from_millis;
        let with = |state: u8, rto_count: u8, unacked: u32| {
            Some(Some(TcpProgress {
                state,
                rto_count,
                unacked,
                cgroup_id: None,
            }))
        };
        // An ACK moved it (RTO count reset), or it closed in order (FIN_WAIT2, TIME_WAIT).
        for answer in [with(1, 0, 12), with(1, 0, 0), with(5, 0, 0), with(6, 0, 0)] {
            assert_eq!(
                settle(ev, answer, ms(500)),
                Some(Shrink::Through(ev)),
                "{answer:?}"
            );
        }
        // Still on its timeout: waits, then is not shown (a dead peer shrinks alike).
        assert_eq!(settle(ev, with(1, 5, 1), ms(500)), None);
        assert_eq!(settle(ev, None, ms(500)), None, "not answered yet");
        for answer in [with(1, 5, 1), with(4, 5, 1), None] {
            assert!(
                matches!(
                    settle(ev, answer, SHRINK_CONFIRM),
                    Some(Shrink::NotShown(..))
                ),
                "{answer:?}"
            );
        }
        // Gone without a word (an abort): not shown either.
        assert!(matches!(
            settle(ev, Some(None), ms(500)),
            Some(Shrink::NotShown(..))
        ));
    }

    #[test]
    fn a_mapped_flow_is_asked_for_by_its_sockets_own_family() {
        let mut flow = reported(0).flow;
        flow.family = node_diag_common::AF_INET6;
        flow.saddr = "::ffff:10.244.1.7".parse::<Ipv6Addr>().unwrap().octets();
        let (family, src, _) = ends(&flow);
        assert_eq!(family, node_diag_common::AF_INET6 as u8);
        assert_eq!(src, "[::ffff:10.244.1.7]:40000".parse().unwrap());
    }
}
