//! Exact counts for the inbound SYN drops the kernel aggregates (`INBOUND`): one entry
//! per client address, pod address, port and drop reason, whose first drop sends an
//! event and whose later ones are only counted there.
//!
//! An entry is known by its key and the time it was made (`first_ns`): the kernel makes
//! the key again after the agent deleted it idle. Whichever comes first, the entry's
//! event or a map read, starts its finding with the entry's count; the event of an entry
//! already accounted adds nothing. Each read adds what the count grew by to the finding
//! kept as the template; an entry idle for [`IDLE_NS`] is deleted with its last counts
//! read by the same syscall, and remembered as retired for [`RETIRED_FOR`] so that its
//! event, were it still queued, counts nothing.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use node_diag_common::{InboundAgg, InboundKey};

use crate::findings::{Evidence, Finding};

/// An entry without drops for this long is deleted from the kernel map.
pub(crate) const IDLE_NS: u64 = 5_000_000_000;
/// How long a deleted entry's event is still recognised as accounted.
const RETIRED_FOR: Duration = Duration::from_secs(60);

struct Live {
    first_ns: u64,
    /// How much of the entry's count is in findings already.
    accounted: u64,
    /// The entry's finding (`count` unused), which later counts are added to.
    template: Finding,
}

/// What a read of the inbound map produced.
#[derive(Default)]
pub(crate) struct Read {
    /// Findings carrying the drops counted since the last read (`count` = the growth),
    /// with their entries.
    pub(crate) grown: Vec<(InboundKey, InboundAgg, Finding)>,
    /// Entries no event has announced yet (their event lost, or still queued): to be
    /// judged and started with [`InboundTracker::start`].
    pub(crate) new: Vec<(InboundKey, InboundAgg)>,
    /// Keys idle for [`IDLE_NS`]: to delete from the kernel map, then pass to
    /// [`InboundTracker::taken`] with their last counts.
    pub(crate) idle: Vec<InboundKey>,
}

#[derive(Default)]
pub(crate) struct InboundTracker {
    live: HashMap<InboundKey, Live>,
    retired: HashMap<(InboundKey, u64), Instant>,
}

impl InboundTracker {
    /// Whether the entry `key` made at `first_ns` is accounted already.
    pub(crate) fn seen(&self, key: &InboundKey, first_ns: u64) -> bool {
        self.live.get(key).is_some_and(|l| l.first_ns == first_ns)
            || self.retired.contains_key(&(*key, first_ns))
    }

    /// The finding of an entry accounted already, to follow its rule from.
    pub(crate) fn template(&self, key: &InboundKey) -> Option<&Finding> {
        self.live.get(key).map(|l| &l.template)
    }

    /// Starts accounting the entry `agg` of `key`, whose finding `finding` carries its
    /// count so far.
    pub(crate) fn start(&mut self, key: InboundKey, agg: &InboundAgg, finding: &Finding) {
        let mut template = finding.clone();
        template.count = 0;
        self.live.insert(
            key,
            Live {
                first_ns: agg.first_ns,
                accounted: agg.count,
                template,
            },
        );
    }

    /// Accounts a read of the kernel map taken at kernel time `now_ns`; `stamp` is the
    /// time findings carry as `last_seen`.
    pub(crate) fn read(
        &mut self,
        entries: &[(InboundKey, InboundAgg)],
        now_ns: u64,
        stamp: &str,
    ) -> Read {
        let mut out = Read::default();
        for (key, agg) in entries {
            match self.live.get_mut(key) {
                Some(l) if l.first_ns == agg.first_ns => {
                    if let Some(f) = grow(l, agg.count, stamp) {
                        out.grown.push((*key, *agg, f));
                    }
                }
                _ if self.retired.contains_key(&(*key, agg.first_ns)) => {}
                _ => out.new.push((*key, *agg)),
            }
            if now_ns.saturating_sub(agg.last_ns) >= IDLE_NS {
                out.idle.push(*key);
            }
        }
        let now = Instant::now();
        self.retired
            .retain(|_, at| now.duration_since(*at) < RETIRED_FOR);
        out
    }

    /// Accounts the last counts of a key deleted from the kernel map (`last`: what the
    /// deletion read) and stops following it. Returns the finding for the drops counted
    /// since the last read, if any.
    pub(crate) fn taken(
        &mut self,
        key: &InboundKey,
        last: Option<InboundAgg>,
        stamp: &str,
    ) -> Option<Finding> {
        let mut l = self.live.remove(key)?;
        self.retired.insert((*key, l.first_ns), Instant::now());
        let last = last.filter(|a| a.first_ns == l.first_ns)?;
        grow(&mut l, last.count, stamp)
    }

    /// Changes every template `pick` selects (a rule named for their flow).
    pub(crate) fn update(
        &mut self,
        pick: impl Fn(&Finding) -> bool,
        change: impl Fn(&mut Finding),
    ) {
        for l in self.live.values_mut() {
            if pick(&l.template) {
                change(&mut l.template);
            }
        }
    }
}

/// The finding for an entry's count grown to `count`, if it grew.
fn grow(l: &mut Live, count: u64, stamp: &str) -> Option<Finding> {
    let delta = count.saturating_sub(l.accounted);
    if delta == 0 {
        return None;
    }
    l.accounted = count;
    if let Evidence::Inbound(e) = &mut l.template.evidence {
        e.drop.syn_drops = u32::try_from(count).unwrap_or(u32::MAX);
    }
    let mut f = l.template.clone();
    f.count = delta;
    f.last_seen = stamp.to_string();
    Some(f)
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::findings::{Kind, Layer, Severity};

    fn key(dport: u16) -> InboundKey {
        InboundKey {
            dport,
            ..InboundKey::default()
        }
    }

    fn agg(first_ns: u64, last_ns: u64, count: u64) -> InboundAgg {
        InboundAgg {
            first_ns,
            last_ns,
            count,
            ..InboundAgg::default()
        }
    }

    fn finding(count: u64) -> Finding {
        let mut f = Finding::new(
            Kind::TcpSynDropped,
            Layer::Firewall,
            Severity::Warning,
            String::new(),
            String::new(),
            SystemTime::now(),
        );
        f.count = count;
        f
    }

    #[test]
    fn every_drop_is_counted_once_whichever_comes_first() {
        let mut t = InboundTracker::default();
        // The event first: its entry's count, then what the map adds.
        t.start(key(80), &agg(10, 10, 1), &finding(1));
        assert!(t.seen(&key(80), 10));
        let read = t.read(&[(key(80), agg(10, 20, 4))], 30, "now");
        assert_eq!(read.grown.iter().map(|(_, _, f)| f.count).sum::<u64>(), 3);
        assert!(read.new.is_empty() && read.idle.is_empty());
        // Nothing new: nothing added.
        let read = t.read(&[(key(80), agg(10, 20, 4))], 40, "now");
        assert!(read.grown.is_empty());

        // The map first: the entry is new to the tracker, then its event is seen.
        let read = t.read(&[(key(443), agg(50, 55, 2))], 60, "now");
        assert_eq!(read.new, vec![(key(443), agg(50, 55, 2))]);
        t.start(key(443), &agg(50, 55, 2), &finding(2));
        assert!(t.seen(&key(443), 50), "its event adds nothing");
    }

    #[test]
    fn an_idle_entry_is_taken_with_its_last_counts_and_its_successor_is_new() {
        let mut t = InboundTracker::default();
        t.start(key(80), &agg(10, 10, 1), &finding(1));
        let read = t.read(&[(key(80), agg(10, 10, 1))], 10 + IDLE_NS, "now");
        assert_eq!(read.idle, vec![key(80)]);
        // One drop came between the read and the deletion.
        let last = t.taken(&key(80), Some(agg(10, 11, 2)), "now");
        assert_eq!(last.map(|f| f.count), Some(1));
        assert!(
            t.seen(&key(80), 10),
            "a late event of the deleted entry counts nothing"
        );
        // The kernel makes the key again: a new entry.
        assert!(!t.seen(&key(80), 99));
        let read = t.read(&[(key(80), agg(99, 99, 1))], 100, "now");
        assert_eq!(read.new.len(), 1);
    }
}
