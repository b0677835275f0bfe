//! Conntrack evidence for one drop: whether a `NETFILTER_DROP` of a flow's SYN (or
//! SYN-ACK) was conntrack's doing rather than a rule's.
//!
//! # What the kernel tells us (Linux 6.1, 6.12 and 6.18 alike)
//!
//! A new connection in a namespace whose table is full: `__nf_conntrack_alloc` finds
//! the namespace's count above the global `nf_conntrack_max`, `early_drop` finds no
//! unassured entry to evict, it logs `nf_conntrack: table full, dropping packet` and
//! returns `-ENOMEM`; `init_conntrack` and `resolve_normal_ct` pass the error up and
//! `nf_conntrack_in` bumps the namespace's `drop` statistic and returns `NF_DROP`.
//! `nf_hook_slow` then frees the packet with `SKB_DROP_REASON_NETFILTER_DROP`, exactly
//! as it does for a rule's `drop` verdict: `include/net/dropreason-core.h` has no
//! conntrack reason on any of these kernels, and the `location` is `nf_hook_slow` in
//! both cases. What tells them apart is not in `skb:kfree_skb` at all, but in the
//! namespace's conntrack statistics (`/proc/net/stat/nf_conntrack`, per namespace):
//! only conntrack's own drops bump `drop`, and only a full table leaves the count at
//! the limit.
//!
//! An INVALID packet (no tracked connection matches it, e.g. a SYN-ACK whose SYN
//! conntrack never saw) is not dropped by conntrack: `nf_conntrack_in` bumps `invalid`,
//! leaves the packet without an entry and accepts it; a rule matching
//! `ct state invalid` (kube-proxy's `-A KUBE-FORWARD -m conntrack --ctstate INVALID
//! -j DROP`, or `ct state invalid drop` with nftables) drops it, with `NETFILTER_DROP`.
//!
//! # The design: user space, no kernel cost
//!
//! The agent reads every namespace of its scope's conntrack counters
//! (`host_network::conntrack_stats`) every 2 s into a [`History`], and again when a connect
//! verdict with a `NETFILTER_DROP` arrives. A verdict's [`Window`] runs from the last
//! reading taken before the flow's last drop to that fresh reading. The drop program
//! in the kernel is unchanged (reading `skb->_nfct` there would tell "no entry" but
//! not why, and costs every drop; the counters cost nothing until a verdict needs
//! them). A verdict is `conntrack` only on evidence for this drop (see
//! `correlate::conntrack_cause`):
//!
//! - **table full**: the flow's packet was dropped with `NETFILTER_DROP` in the
//!   namespace, conntrack's own `drop` counter rose in the window, and the table was at
//!   its limit in the window. Each SYN retransmit hits the full table again, so the last
//!   drop of the flow falls inside the window. A rule's drop while the table has room
//!   stays `firewall`, whatever the counters did.
//! - **INVALID**: only a SYN-ACK dropped on the return path, with the `invalid` counter
//!   risen in the window by at least the flow's drops. Conntrack never calls a SYN that
//!   opens a connection INVALID (it makes a new entry for it), while a SYN-ACK whose SYN
//!   it did not see is INVALID by its state table: so a dropped SYN with INVALID packets
//!   counted around it is left `firewall` (those packets were other flows'), and an
//!   INVALID verdict needs the packet that conntrack would call INVALID.
//!
//! Limits: the counters are per namespace, not per flow. Another flow's conntrack drops
//! in the same 2-second window, while the table is full, make a rule's drop of this
//! SYN look like conntrack's; but with the table full conntrack runs before the filter
//! rules and drops a new connection's SYN first. A SYN-ACK dropped by a rule in a
//! namespace where other flows' INVALID packets are counted in the same window (an
//! INVALID-drop rule and a SYN-ACK drop rule together) is called INVALID.

use std::collections::{HashMap, VecDeque};

use crate::host_network::conntrack_stats::ConntrackStats;

/// How long readings are kept: longer than any connect attempt's SYN retransmits take
/// to become a verdict at the default `--syn-retries`.
const KEEP_NS: u64 = 60_000_000_000;
/// A baseline older than this before the drop it explains is not the same window
/// (readings failed in between).
const MAX_BASELINE_AGE_NS: u64 = 20_000_000_000;

/// Readings of each namespace's conntrack counters, oldest first, with their
/// CLOCK_MONOTONIC time (the clock of the kernel's drop timestamps).
#[derive(Debug, Default)]
pub(crate) struct History {
    readings: HashMap<u32, VecDeque<(u64, ConntrackStats)>>,
}

impl History {
    pub(crate) fn record(&mut self, netns: u32, at_ns: u64, stats: ConntrackStats) {
        let q = self.readings.entry(netns).or_default();
        if q.back().is_some_and(|(t, _)| *t > at_ns) {
            return;
        }
        q.push_back((at_ns, stats));
        while q
            .front()
            .is_some_and(|(t, _)| at_ns.saturating_sub(*t) > KEEP_NS)
        {
            q.pop_front();
        }
    }

    /// When `netns`'s last reading was taken, if it equals the one before it: nothing
    /// moved in its table between them.
    pub(crate) fn unchanged_since(&self, netns: u32) -> Option<u64> {
        let q = self.readings.get(&netns)?;
        let mut last = q.iter().rev();
        match (last.next(), last.next()) {
            (Some((at, a)), Some((_, b))) if a == b => Some(*at),
            _ => None,
        }
    }

    /// Forgets namespaces that left the scope.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u32) -> bool) {
        self.readings.retain(|ns, _| keep(*ns));
    }

    /// The window of a drop in `netns` at `drop_ns`: from the last reading before it to
    /// `now` (a reading taken after the verdict arrived). `None` without a reading
    /// before the drop (the namespace is new, or conntrack was not loaded then).
    pub(crate) fn window(&self, netns: u32, drop_ns: u64, now: ConntrackStats) -> Option<Window> {
        let q = self.readings.get(&netns)?;
        let start = q.iter().rposition(|(t, _)| *t < drop_ns)?;
        let (at, before) = q[start];
        if drop_ns - at > MAX_BASELINE_AGE_NS {
            return None;
        }
        let full = q.iter().skip(start).any(|(_, s)| s.is_full()) || now.is_full();
        Some(Window {
            netns,
            before,
            now,
            full,
        })
    }
}

/// A namespace's conntrack counters around one drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) netns: u32,
    /// The last reading before the drop.
    pub(crate) before: ConntrackStats,
    /// The reading taken when the verdict arrived.
    pub(crate) now: ConntrackStats,
    /// The table was at its limit in some reading of the window.
    pub(crate) full: bool,
}

impl Window {
    /// Packets conntrack dropped itself during the window.
    pub(crate) fn drops(&self) -> u64 {
        self.now.drop.saturating_sub(self.before.drop)
    }

    /// Packets conntrack found INVALID during the window.
    pub(crate) fn invalid(&self) -> u64 {
        self.now.invalid.saturating_sub(self.before.invalid)
    }

    /// Entries evicted to make room during the window.
    pub(crate) fn early_drops(&self) -> u64 {
        self.now.early_drop.saturating_sub(self.before.early_drop)
    }

    /// Entries that failed to insert during the window.
    pub(crate) fn insert_failed(&self) -> u64 {
        self.now
            .insert_failed
            .saturating_sub(self.before.insert_failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(count: u64, max: u64, drop: u64, invalid: u64) -> ConntrackStats {
        ConntrackStats {
            count,
            max,
            drop,
            invalid,
            ..Default::default()
        }
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_table_is_unchanged_once_two_readings_in_a_row_are_equal() {
        let mut h = History::default();
        assert_eq!(h.unchanged_since(7), None);
        h.record(7, 10 * S, stats(0, 100, 0, 0));
        assert_eq!(h.unchanged_since(7), None, "one reading says nothing");
        h.record(7, 12 * S, stats(0, 100, 0, 0));
        assert_eq!(h.unchanged_since(7), Some(12 * S));
        h.record(7, 22 * S, stats(0, 100, 0, 0));
        assert_eq!(h.unchanged_since(7), Some(22 * S));
        h.record(7, 24 * S, stats(1, 100, 0, 0));
        assert_eq!(h.unchanged_since(7), None, "the count moved");
    }

    #[test]
    fn the_window_starts_at_the_last_reading_before_the_drop() {
        let mut h = History::default();
        h.record(7, 10 * S, stats(5, 100, 1, 0));
        h.record(7, 12 * S, stats(100, 100, 1, 0));
        h.record(7, 14 * S, stats(100, 100, 4, 0));
        let w = h.window(7, 13 * S, stats(100, 100, 6, 2)).unwrap();
        assert_eq!(w.before.count, 100);
        assert_eq!((w.drops(), w.invalid()), (5, 2));
        assert!(w.full);
        assert_eq!(w.netns, 7);
    }

    #[test]
    fn no_window_without_a_reading_before_the_drop() {
        let mut h = History::default();
        h.record(7, 10 * S, stats(5, 100, 0, 0));
        assert!(h.window(7, 9 * S, stats(5, 100, 0, 0)).is_none());
        assert!(h.window(8, 11 * S, stats(5, 100, 0, 0)).is_none());
        // A baseline from long before the drop is not evidence about it.
        assert!(h.window(7, 40 * S, stats(5, 100, 0, 0)).is_none());
    }

    #[test]
    fn full_is_any_reading_of_the_window_at_the_limit() {
        let mut h = History::default();
        h.record(7, 10 * S, stats(50, 100, 0, 0));
        let w = h.window(7, 11 * S, stats(60, 100, 3, 0)).unwrap();
        assert!(!w.full, "room all along");
        let w = h.window(7, 11 * S, stats(100, 100, 3, 0)).unwrap();
        assert!(w.full);
    }

    #[test]
    fn old_readings_and_namespaces_go() {
        let mut h = History::default();
        h.record(7, S, stats(1, 100, 0, 0));
        h.record(7, 100 * S, stats(1, 100, 0, 0));
        assert_eq!(h.readings[&7].len(), 1);
        h.record(8, 100 * S, stats(1, 100, 0, 0));
        h.retain(|ns| ns == 8);
        assert!(!h.readings.contains_key(&7));
    }
}
