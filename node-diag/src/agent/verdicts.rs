//! Exact accounting of the verdicts the kernel aggregates (`VERDICT_AGG`): a storm of
//! identical connect verdicts arrives as one event per key per window, carrying the key's
//! count so far, while the kernel only counts the verdicts in between. This tracker turns
//! both into finding counts, so that every verdict is counted once: in a finding's
//! `count`, or (when its event was lost) in `node_diag_events_lost_total`.
//!
//! Per key it remembers how much of the kernel's count is already in the findings
//! (`accounted`) and the last finding the key's events made (the template the counts read
//! from the map are added to). An event adds its count minus `accounted`; a map read adds
//! the map's count minus `accounted` to the template. Whichever comes first accounts a
//! verdict; the other finds nothing left to add.

use std::collections::{HashMap, HashSet};

use node_diag_common::{Event, VerdictAgg, VerdictKey};

use crate::findings::Finding;

/// A fully accounted key without verdicts for this long is deleted from the kernel map.
pub(crate) const IDLE_NS: u64 = 5_000_000_000;
/// A key whose events the agent never saw (lost to a full ring buffer after the key's
/// entry existed, or undecodable) is given up after this long, its counts as lost.
pub(crate) const STALE_NS: u64 = 30_000_000_000;
/// How far the ring's order may stray from the events' timestamps (CPUs stamp, then
/// reserve): an event stamped this much before the newest one handled has been handled.
pub(crate) const ORDER_SLACK_NS: u64 = 1_000_000_000;

#[derive(Default)]
struct Tracked {
    /// How much of the kernel's count for the key is already accounted.
    accounted: u64,
    /// The finding the key's last event made (none: user space reports nothing for it).
    template: Option<Finding>,
}

/// What a read of the aggregation map produced.
#[derive(Default)]
pub(crate) struct Read {
    /// Findings carrying the counts added since the last read (`count` = the delta).
    pub(crate) findings: Vec<Finding>,
    /// Keys idle for [`IDLE_NS`], or never seen for [`STALE_NS`]: to delete from the
    /// kernel map, then pass to [`VerdictTracker::forgotten`] with their last counts.
    pub(crate) forget: Vec<VerdictKey>,
    /// Verdicts counted for keys whose events never reached the agent.
    pub(crate) lost: u64,
}

#[derive(Default)]
pub(crate) struct VerdictTracker {
    keys: HashMap<VerdictKey, Tracked>,
    /// The newest kernel stamp of an event handled so far.
    handled_ns: u64,
}

impl VerdictTracker {
    /// Accounts an event: `finding` (what `correlate` made of it, `count` 1) gets the
    /// verdicts the event stands for that no map read accounted yet; 0 when a map read
    /// was faster. Events of kinds the kernel does not aggregate pass unchanged.
    pub(crate) fn event(&mut self, ev: &Event, finding: Option<Finding>) -> Option<Finding> {
        self.handled_ns = self.handled_ns.max(ev.ts_ns);
        if ev.count == 0 {
            return finding;
        }
        let t = self.keys.entry(VerdictKey::of_event(ev)).or_default();
        let delta = ev.count.saturating_sub(t.accounted);
        t.accounted = t.accounted.max(ev.count);
        let mut f = finding?;
        f.count = delta;
        let mut template = f.clone();
        template.count = 0;
        t.template = Some(template);
        Some(f)
    }

    /// Accounts the last counts of a key deleted from the kernel map (`last`: what the
    /// deletion read, `None` when it read nothing) and stops tracking it. Returns the
    /// finding for the verdicts counted since the last read, if any.
    pub(crate) fn forgotten(
        &mut self,
        key: &VerdictKey,
        last: Option<VerdictAgg>,
        stamp: &str,
    ) -> Option<Finding> {
        let t = self.keys.remove(key)?;
        let delta = last?.count.saturating_sub(t.accounted);
        let mut f = t.template.filter(|_| delta > 0)?;
        f.count = delta;
        f.last_seen = stamp.to_string();
        Some(f)
    }

    /// Accounts a read of the kernel map taken at kernel time `now_ns`. `queued`: events
    /// wait to be handled. A key whose last event is younger than the events handled
    /// may have it queued behind a backlog (thousands of distinct keys on a slow node),
    /// so it is not given up as lost: the event would later count its verdicts again.
    pub(crate) fn read(
        &mut self,
        entries: &[(VerdictKey, VerdictAgg)],
        now_ns: u64,
        queued: bool,
        stamp: &str,
    ) -> Read {
        // Every event stamped before this has been handled (or lost on its way).
        let handled_ns =
            if queued { self.handled_ns } else { now_ns }.saturating_sub(ORDER_SLACK_NS);
        let mut out = Read::default();
        for (key, agg) in entries {
            let idle = now_ns.saturating_sub(agg.last_ns);
            match self.keys.get_mut(key) {
                Some(t) => {
                    let delta = agg.count.saturating_sub(t.accounted);
                    if delta > 0 {
                        t.accounted = agg.count;
                        if let Some(template) = &t.template {
                            let mut f = template.clone();
                            f.count = delta;
                            f.last_seen = stamp.to_string();
                            out.findings.push(f);
                        }
                    }
                    if idle >= IDLE_NS {
                        out.forget.push(*key);
                    }
                }
                // The key's event is still on its way, or never came: its verdicts were
                // not reported. (Deleting it races a verdict counted in between: that one
                // is not counted anywhere, on a key quiet for STALE_NS.)
                None if idle >= STALE_NS && agg.last_emit_ns <= handled_ns => {
                    out.lost += agg.count;
                    out.forget.push(*key);
                }
                None => {}
            }
        }
        // Keys the kernel map no longer holds (deleted above, or by a restart of the
        // programs) have nothing more to account.
        if self.keys.len() > entries.len() {
            let held: HashSet<&VerdictKey> = entries.iter().map(|(key, _)| key).collect();
            self.keys.retain(|k, _| held.contains(k));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use node_diag_common::event_kind;

    use super::*;
    use crate::findings::fixtures;

    fn event(count: u64) -> Event {
        let mut ev = fixtures::event(event_kind::CONNECT_REFUSED, 111);
        ev.count = count;
        ev
    }

    fn agg(count: u64, last_ns: u64) -> VerdictAgg {
        VerdictAgg {
            count,
            last_ns,
            ..VerdictAgg::default()
        }
    }

    #[test]
    fn events_and_reads_account_each_verdict_once() {
        let mut t = VerdictTracker::default();
        let ev = event(1);
        let key = VerdictKey::of_event(&ev);
        let f = t.event(&ev, Some(fixtures::refused(1))).unwrap();
        assert_eq!(f.count, 1);
        // 9 more counted in the kernel, read before the next event.
        let r = t.read(&[(key, agg(10, 100))], 200, false, "t1");
        assert_eq!(r.findings.len(), 1);
        assert_eq!(r.findings[0].count, 9);
        assert_eq!(r.findings[0].last_seen, "t1");
        // The next window's event says 12: 2 not read yet.
        let f = t.event(&event(12), Some(fixtures::refused(2))).unwrap();
        assert_eq!(f.count, 2);
        // A read that got ahead of an event: the event adds nothing.
        let r = t.read(&[(key, agg(15, 300))], 400, false, "t2");
        assert_eq!(r.findings[0].count, 3);
        let f = t.event(&event(14), Some(fixtures::refused(3))).unwrap();
        assert_eq!(f.count, 0);
        // Nothing new: nothing added; idle: to forget.
        let r = t.read(&[(key, agg(15, 300))], 300 + IDLE_NS, false, "t3");
        assert!(r.findings.is_empty());
        assert_eq!(r.forget, vec![key]);
        assert_eq!(r.lost, 0);
        // One more verdict counted between the read and the deletion is not lost.
        let f = t.forgotten(&key, Some(agg(16, 400)), "t4").unwrap();
        assert_eq!(f.count, 1);
        assert!(t.forgotten(&key, Some(agg(16, 400)), "t4").is_none());
        // The key comes back from 1 in the kernel: a fresh start.
        assert_eq!(
            t.event(&event(1), Some(fixtures::refused(4)))
                .unwrap()
                .count,
            1
        );
    }

    #[test]
    fn unaggregated_events_pass_and_unseen_keys_are_lost_when_stale() {
        let mut t = VerdictTracker::default();
        let f = t.event(&event(0), Some(fixtures::refused(1))).unwrap();
        assert_eq!(f.count, 1);
        let key = VerdictKey::of_event(&event(1));
        let r = t.read(&[(key, agg(4, 0))], 1, false, "t");
        assert!(r.findings.is_empty() && r.forget.is_empty());
        let r = t.read(&[(key, agg(4, 0))], STALE_NS, false, "t");
        assert_eq!(r.lost, 4);
        assert_eq!(r.forget, vec![key]);
    }

    #[test]
    fn a_stale_key_whose_event_may_still_be_queued_is_not_lost() {
        let mut t = VerdictTracker::default();
        let ev = event(1);
        let key = VerdictKey::of_event(&ev);
        let sent = VerdictAgg {
            last_emit_ns: 10,
            ..agg(1, 10)
        };
        // Stale by the clock, but events are queued and those handled so far are older
        // than its event: it waits in the backlog, and is neither lost nor forgotten.
        let mut older = event(0);
        older.ts_ns = 5;
        t.event(&older, None);
        let r = t.read(&[(key, sent)], 10 + STALE_NS, true, "t");
        assert_eq!(r.lost, 0);
        assert!(r.forget.is_empty());
        // Its event arrives: counted once, as a finding.
        assert_eq!(t.event(&ev, Some(fixtures::refused(1))).unwrap().count, 1);
        let r = t.read(&[(key, sent)], 20 + STALE_NS, false, "t");
        assert_eq!(r.lost, 0);
        assert!(r.findings.is_empty());
    }

    #[test]
    fn a_storm_counted_on_two_cpus_is_accounted_per_cpu() {
        // Each CPU counts in its own entry from 1, and sends its own first event.
        let mut t = VerdictTracker::default();
        let on = |cpu, count| {
            let mut ev = event(count);
            ev.cpu = cpu;
            ev
        };
        let (k0, k1) = (
            VerdictKey::of_event(&on(0, 1)),
            VerdictKey::of_event(&on(1, 1)),
        );
        assert_ne!(k0, k1);
        assert_eq!(
            t.event(&on(0, 1), Some(fixtures::refused(1)))
                .unwrap()
                .count,
            1
        );
        assert_eq!(
            t.event(&on(1, 1), Some(fixtures::refused(1)))
                .unwrap()
                .count,
            1
        );
        // CPU 0 counted 7 in all, CPU 1 5: 6 + 4 more, neither CPU's count taken as the
        // other's progress.
        let r = t.read(&[(k0, agg(7, 100)), (k1, agg(5, 100))], 200, false, "t");
        let counts: Vec<u64> = r.findings.iter().map(|f| f.count).collect();
        assert_eq!(counts, vec![6, 4]);
        // CPU 1's next event says 6: one more, not 6 - 7.
        assert_eq!(
            t.event(&on(1, 6), Some(fixtures::refused(2)))
                .unwrap()
                .count,
            1
        );
    }

    #[test]
    fn icmp_codes_that_decide_the_layer_make_different_keys() {
        let mut prohibited = event(1);
        prohibited.icmp_key = node_diag_common::icmp_key(0, 0, 3, 13);
        let mut unreachable = prohibited;
        unreachable.icmp_key = node_diag_common::icmp_key(0, 0, 3, 1);
        assert_ne!(
            VerdictKey::of_event(&prohibited),
            VerdictKey::of_event(&unreachable)
        );
        let mut t = VerdictTracker::default();
        assert_eq!(
            t.event(&prohibited, Some(fixtures::refused(1)))
                .unwrap()
                .count,
            1
        );
        assert_eq!(
            t.event(&unreachable, Some(fixtures::refused(2)))
                .unwrap()
                .count,
            1
        );
    }
}
