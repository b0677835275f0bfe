//! Correlation: turns one kernel verdict event plus the evidence it carries (the SYN
//! drop this kernel recorded for the flow, the ICMP error it generated) into a [`Finding`]
//! naming the failing layer. Pure: fed synthetic events in the unit tests.
//!
//! One room per verdict family, each with its tests:
//! - [`connect`]: refused, timed out, unreachable, reset;
//! - [`stall`]: stalls, PMTUD black holes and oversize drops (the MTU family);
//! - [`nat`]: the Service and NAT behind a flow's destination;
//! - [`path`]: what probing a flow's path makes of a stall or a timeout;
//! - [`conntrack`]: whether conntrack, not a rule, dropped a flow's packet;
//! - [`inbound`]: a client elsewhere's SYNs to a pod of this node, dropped here.

mod connect;
mod conntrack;
pub(crate) mod inbound;
mod nat;
pub(crate) mod path;
mod stall;
#[cfg(test)]
mod testkit;

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    ops::RangeInclusive,
    time::SystemTime,
};

use node_diag_common::{AF_INET, Event, FlowKey, errno, event_flag};

pub(crate) use self::nat::Translation;
pub(crate) use self::stall::{ShrunkBy, shrunk_by};
use super::{Finding, Kind, conntrack::Window, names::Names};
use crate::{host_network::drop_site::DropSite, kernel::event::EventKind};

/// The address as the user knows it: an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
/// what a dual-stack socket connecting to IPv4 holds) is the IPv4 address it maps.
pub(crate) fn addr(flow: &FlowKey, bytes: &[u8; 16]) -> IpAddr {
    if flow.family == AF_INET {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(*bytes)).to_canonical()
    }
}

/// The socket error's name for evidence and summaries.
fn errno_name(e: u32) -> &'static str {
    errno::name(e)
}

/// Context the correlator needs beyond the event.
pub(crate) struct Context<'a> {
    pub(crate) names: &'a Names,
    pub(crate) now: SystemTime,
    /// The node's ephemeral port range: a connection whose local port is outside it and
    /// whose peer port is inside it was accepted by a listener.
    pub(crate) ephemeral_ports: RangeInclusive<u16>,
    /// The Service and NAT behind the event's destination, as the agent found them.
    pub(crate) translation: Translation,
    /// The conntrack counters of the namespace where the event's flow packet was
    /// dropped, around that drop (see [`super::conntrack`]); `None` when the drop was
    /// not a `NETFILTER_DROP` or the namespace has no readings.
    pub(crate) conntrack: Option<Window>,
    /// Whether ICMP errors arriving from the network (the TC classifier) were watched
    /// throughout the event's evidence window. When not, an event without a received
    /// ICMP error says nothing about whether one came: "unknown", not "none".
    pub(crate) icmp_watched: bool,
    /// Where the namespace that dropped the event's flow packet discards packets for its
    /// destination, when the drop's reason needed it (see [`crate::kernel::drop_family`]).
    pub(crate) drop_site: Option<DropSite>,
}

/// The finding an event of `kind` makes, if any.
pub(crate) fn correlate(kind: EventKind, ev: &Event, ctx: &Context<'_>) -> Option<Finding> {
    let mut f = match kind {
        EventKind::DfOversize => Some(stall::df_oversize(ev, ctx)),
        EventKind::PmtudStall => Some(stall::pmtud_stall(ev, ctx)),
        EventKind::TcpStall => Some(stall::tcp_stall(ev, ctx)),
        EventKind::MssShrunk => Some(stall::mss_shrunk(ev, ctx)),
        EventKind::ConnectRefused
        | EventKind::ConnectTimeout
        | EventKind::ConnectAbandoned
        | EventKind::ConnectUnreachable
        | EventKind::EstablishedReset => connect::verdict(kind, ev, ctx),
        // Judged from the inbound map's entry (`inbound`), not from the event alone.
        EventKind::ConnectGaveUp | EventKind::ConnectLate | EventKind::InboundSynDropped => None,
    }?;
    ctx.translation.apply(&mut f);
    Some(f)
}

/// Which findings a connect that was reported as timing out withdraws when it got
/// through after all (resolved), or when its attempt ended otherwise (superseded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Withdrawal {
    pub(crate) kind: Kind,
    pub(crate) netns: Option<u32>,
    pub(crate) dst: IpAddr,
    pub(crate) dport: u16,
}

impl Withdrawal {
    /// The timeouts reported for `ev`'s destination from its namespace.
    fn timeout(ev: &Event) -> Self {
        Self {
            kind: Kind::TcpTimeout,
            netns: (ev.netns != 0).then_some(ev.netns),
            dst: addr(&ev.flow, &ev.flow.daddr),
            dport: ev.flow.dport,
        }
    }

    pub(crate) fn covers(&self, f: &Finding) -> bool {
        f.kind == self.kind
            && f.netns == self.netns
            && f.dst == Some(self.dst)
            && f.dport == Some(self.dport)
    }
}

/// For a connect reported as timing out that was established after all: which findings
/// it withdraws.
pub(crate) fn withdrawn(kind: EventKind, ev: &Event) -> Option<Withdrawal> {
    (kind == EventKind::ConnectLate).then(|| Withdrawal::timeout(ev))
}

/// For the last word of a connect reported as timing out (refused, unreachable: the
/// kernel flags it): the timeout it supersedes. That attempt was counted as the timeout.
pub(crate) fn superseded(kind: EventKind, ev: &Event) -> Option<Withdrawal> {
    let last_word = matches!(
        kind,
        EventKind::ConnectRefused | EventKind::ConnectUnreachable
    );
    (last_word && ev.flags & event_flag::AFTER_TIMEOUT != 0).then(|| Withdrawal::timeout(ev))
}

/// The finding's flow fields from the event.
fn with_flow(mut f: Finding, ev: &Event) -> Finding {
    let flow = &ev.flow;
    f.src = Some(addr(flow, &flow.saddr));
    f.dst = Some(addr(flow, &flow.daddr));
    f.dport = Some(flow.dport);
    f.sport = (flow.sport != 0).then_some(flow.sport);
    f.netns = (ev.netns != 0).then_some(ev.netns);
    f
}

#[cfg(test)]
mod tests {
    use node_diag_common::{event_flag, event_kind};

    use super::{testkit::*, *};
    use crate::findings::fixtures::event;

    #[test]
    fn last_word_after_a_timeout_supersedes_it() {
        let mut refused = refused_with_rst();
        assert_eq!(superseded(kind_of(&refused), &refused), None);
        refused.flags |= event_flag::AFTER_TIMEOUT;
        let w = superseded(kind_of(&refused), &refused).expect("supersedes the timeout");
        assert_eq!(w, Withdrawal::timeout(&refused));
        assert_eq!(w.kind, Kind::TcpTimeout);
        assert!(run(&refused).is_some(), "the last word stands");
        let mut unreachable = event(event_kind::CONNECT_UNREACHABLE, 113);
        unreachable.flags = event_flag::AFTER_TIMEOUT;
        assert!(superseded(kind_of(&unreachable), &unreachable).is_some());
        // The kernel's ETIMEDOUT confirms the timeout; it supersedes nothing.
        let mut gave_up = event(event_kind::CONNECT_GAVE_UP, 110);
        gave_up.flags = event_flag::AFTER_TIMEOUT;
        assert_eq!(superseded(kind_of(&gave_up), &gave_up), None);
    }
}
