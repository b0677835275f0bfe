//! Builders for the correlator's unit tests: events, the kernel's drop and ICMP
//! records, windows of conntrack counters, and the contexts the agent would pass.

use std::time::SystemTime;

use node_diag_common::{DropInfo, Event, IcmpInfo, event_flag, event_kind};

pub(super) use super::super::fixtures::event;
use super::{Context, Translation, correlate};
use crate::{
    findings::{Finding, conntrack::Window, names::Names},
    host_network::{conntrack_stats::ConntrackStats, drop_site::DropSite},
    kernel::{
        event::EventKind,
        tracefs::{DropReasons, Format},
    },
};

/// The kind of a test event, decoded as the ring buffer's reader does.
pub(super) fn kind_of(ev: &Event) -> EventKind {
    EventKind::try_from(ev.kind).expect("a test event of a kernel kind")
}

/// A drop of a flow packet with `reason` (by this test kernel's numbers: 12
/// `NETFILTER_DROP`, 58 `NEIGH_FAILED`, 88 `IP_INNOROUTES`, 2 `NOT_SPECIFIED`, 90
/// `NO_TX_TARGET`, 91 `TCP_LISTEN_OVERFLOW`), `count` times, in `netns`
/// on `ifindex` (3 is `vpod0`).
pub(super) fn dropped(reason: u32, count: u32, netns: u32, ifindex: u32) -> DropInfo {
    DropInfo {
        last_ns: 9,
        reason,
        count,
        netns,
        ifindex,
        ..Default::default()
    }
}

/// `count` frag-needed this node generated, announcing `mtu` (0: none).
pub(super) fn frag_needed_sent(count: u32, mtu: u32) -> IcmpInfo {
    IcmpInfo {
        last_ns: 5,
        icmp_type: 3,
        icmp_code: 4,
        mtu,
        count,
        ..Default::default()
    }
}

pub(super) fn reasons() -> DropReasons {
    DropReasons::from_format(&Format::parse(
        "skb:kfree_skb",
        r#"print fmt: "reason: %s", __print_symbolic(REC->reason, { 2, "NOT_SPECIFIED" }, { 12, "NETFILTER_DROP" }, { 88, "IP_INNOROUTES" }, { 58, "NEIGH_FAILED" }, { 90, "NO_TX_TARGET" }, { 91, "TCP_LISTEN_OVERFLOW" })"#,
    ))
}

/// A destination-unreachable of `code` that this node's stack sent (netns 1, ifindex 2).
pub(super) fn icmp_sent_here(code: u32) -> IcmpInfo {
    IcmpInfo {
        last_ns: 5,
        icmp_type: 3,
        icmp_code: code,
        netns: 1,
        ifindex: 2,
        ..Default::default()
    }
}

/// One destination-unreachable of `code` received from the IPv4 address `from`.
pub(super) fn icmp_received(code: u32, from: [u8; 4]) -> IcmpInfo {
    let mut icmp = IcmpInfo {
        last_ns: 5,
        icmp_type: 3,
        icmp_code: code,
        count: 1,
        ..Default::default()
    };
    icmp.from[..4].copy_from_slice(&from);
    icmp
}

pub(super) fn run(ev: &Event) -> Option<Finding> {
    run_with(ev, None)
}

pub(super) fn run_with(ev: &Event, conntrack: Option<Window>) -> Option<Finding> {
    run_ctx(ev, conntrack, true)
}

/// As the agent correlates an event whose window ICMP from the network was not
/// watched in (the classifier not attached yet, or unavailable).
pub(super) fn run_unwatched(ev: &Event) -> Option<Finding> {
    run_ctx(ev, None, false)
}

pub(super) fn run_ctx(
    ev: &Event,
    conntrack: Option<Window>,
    icmp_watched: bool,
) -> Option<Finding> {
    correlate_in(ev, Translation::default(), conntrack, icmp_watched, None)
}

pub(super) fn run_translated(ev: &Event, translation: Translation) -> Option<Finding> {
    correlate_in(ev, translation, None, true, None)
}

/// As the agent correlates `ev` whose drop's namespace discards its destination as
/// `site` says.
pub(super) fn run_at_site(ev: &Event, site: DropSite) -> Option<Finding> {
    correlate_in(ev, Translation::default(), None, true, Some(site))
}

/// As the agent correlates `ev`, at the epoch, with ifindex 3 named `vpod0`.
fn correlate_in(
    ev: &Event,
    translation: Translation,
    conntrack: Option<Window>,
    icmp_watched: bool,
    drop_site: Option<DropSite>,
) -> Option<Finding> {
    let names = Names::new(reasons(), |_, i| (i == 3).then(|| "vpod0".to_string()));
    correlate(
        kind_of(ev),
        ev,
        &Context {
            names: &names,
            now: SystemTime::UNIX_EPOCH,
            ephemeral_ports: 32768..=60999,
            translation,
            conntrack,
            icmp_watched,
            drop_site,
        },
    )
}

pub(super) fn rejected_here() -> Event {
    let mut ev = event(event_kind::CONNECT_REFUSED, 111);
    ev.icmp = IcmpInfo {
        last_ns: 5,
        icmp_type: 3,
        icmp_code: 3,
        netns: 1,
        ..Default::default()
    };
    ev
}

/// A timeout whose SYNs (or SYN-ACKs) got `NETFILTER_DROP` in netns 77.
pub(super) fn netfilter_timeout(drops: u32, flags: u32) -> Event {
    let mut ev = event(event_kind::CONNECT_TIMEOUT, 0);
    ev.retrans = 2;
    ev.drop = DropInfo {
        flags,
        ..dropped(12, drops, 77, 3)
    };
    ev
}

/// Netns 77's conntrack counters: `count`/`max` now, `drop` and `invalid` risen by
/// the given amounts.
pub(super) fn window(count: u64, max: u64, drop: u64, invalid: u64) -> Window {
    let before = ConntrackStats {
        count,
        max,
        drop: 40,
        invalid: 7,
        ..Default::default()
    };
    Window {
        netns: 77,
        before,
        now: ConntrackStats {
            drop: 40 + drop,
            invalid: 7 + invalid,
            ..before
        },
        full: count >= max,
    }
}

pub(super) fn refused_with_rst() -> Event {
    let mut ev = event(event_kind::CONNECT_REFUSED, 111);
    ev.flags = event_flag::RST_RECEIVED;
    ev
}
