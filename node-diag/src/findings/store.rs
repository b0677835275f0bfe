//! The findings store: repeats of one finding aggregate into one entry (`count`,
//! `last_seen`) and are printed again at most once per repeat interval; conditions that
//! are re-evaluated as a whole are resolved when they go away. Bounded: the oldest entry
//! makes room.
//!
//! Readers (`/findings`) take a [`Snapshot`]: the entries as shared, immutable
//! [`Held`] values, copied on write by the store. Taking one under the store's lock
//! costs a pointer copy while nothing changed and one pointer per entry after a change;
//! each entry's JSON is encoded at most once per version, by the first reader that
//! needs it, outside the store's lock.

use std::{
    collections::VecDeque,
    hash::{BuildHasher, DefaultHasher, Hash, Hasher, RandomState},
    net::{IpAddr, SocketAddr},
    sync::{Arc, OnceLock},
    time::{Duration, Instant, SystemTime},
};

use hashbrown::HashTable;

use super::{Finding, Kind, Layer, Status, rfc3339};

impl Finding {
    /// The aggregation key: the source port changes with every attempt, so it is left out.
    /// The pods are in it: a pod re-created with the same address (and, the kernel
    /// reusing inode numbers, possibly the same netns inode) makes findings of its own.
    /// Borrowed from the finding: the store keeps no copy of it.
    fn key(&self) -> Key<'_> {
        Key {
            kind: self.kind,
            layer: self.layer,
            src: self.src,
            dst: self.dst,
            dport: self.dport,
            netns: self.netns,
            listener: self.listener,
            interface: self.interface.as_deref(),
            pod: self.pod.as_ref().map(|p| p.uid.as_str()),
            peer_pod: self.peer_pod.as_ref().map(|p| p.uid.as_str()),
        }
    }
}

/// The entry's id: the node and the key, hashed. SipHash with fixed keys: the same
/// for the life of the entry (and of the agent's build), different across nodes. (A
/// borrowed string hashes as the owned one did, so the ids are those of earlier builds.)
fn entry_id(node: &str, key: &Key<'_>) -> String {
    let mut h = DefaultHasher::new();
    node.hash(&mut h);
    key.hash(&mut h);
    format!("{:016x}", h.finish())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key<'a> {
    kind: Kind,
    layer: Layer,
    src: Option<IpAddr>,
    dst: Option<IpAddr>,
    dport: Option<u16>,
    netns: Option<u32>,
    listener: Option<SocketAddr>,
    interface: Option<&'a str>,
    /// Pod uids.
    pod: Option<&'a str>,
    peer_pod: Option<&'a str>,
}

/// One version of a stored finding, shared between the store and the snapshots
/// readers hold, with its JSON once a reader asked for it.
#[derive(Debug)]
pub(crate) struct Held {
    finding: Finding,
    json: OnceLock<Box<str>>,
}

/// A copy starts without JSON: it is about to be changed.
impl Clone for Held {
    fn clone(&self) -> Self {
        Self::new(self.finding.clone())
    }
}

impl Held {
    fn new(finding: Finding) -> Self {
        Self {
            finding,
            json: OnceLock::new(),
        }
    }

    pub(crate) fn finding(&self) -> &Finding {
        &self.finding
    }

    /// The finding as JSON, encoded on the first call.
    pub(crate) fn json(&self) -> &str {
        self.json.get_or_init(|| {
            // Plain fields and string-keyed maps: encoding cannot fail.
            serde_json::to_string(&self.finding)
                .unwrap_or_else(|_| "null".into())
                .into()
        })
    }
}

/// The store's entries as they were when it was taken, in first-seen order.
pub(crate) type Snapshot = Arc<[Arc<Held>]>;

struct Entry {
    held: Arc<Held>,
    printed_at: Instant,
    printed_count: u64,
}

impl Entry {
    fn finding(&self) -> &Finding {
        &self.held.finding
    }

    /// The finding to change: copied first when a snapshot still holds it.
    fn finding_mut(&mut self) -> &mut Finding {
        let held = Arc::make_mut(&mut self.held);
        held.json.take();
        &mut held.finding
    }
}

/// Aggregated findings, in first-seen order.
///
/// `entries` holds each entry's position counted from the first entry ever kept, so
/// pushing out the oldest (`base` moves on) changes no other position: a full store
/// takes a storm of new findings (20,000 refused ports) at O(1) each, not a shift of
/// every entry and index. It is hashed by the entry's key, borrowed from its finding
/// in `list` when needed: a map from a copy of each key would cost a full store about
/// 1.3 MB (the table sized for 8,192 keys of 152 bytes), eight bytes per slot here.
pub(crate) struct Store {
    entries: HashTable<u64>,
    hasher: RandomState,
    list: VecDeque<Entry>,
    /// The position of `list[0]`.
    base: u64,
    repeat_interval: Duration,
    max_entries: usize,
    /// Findings pushed out, or not kept, because the store was full.
    evicted: u64,
    /// Stamped on every finding, and part of its id.
    node: String,
    /// The last snapshot taken, until the entries change.
    snapshot: Option<Snapshot>,
}

impl Store {
    pub(crate) fn new(repeat_interval: Duration, max_entries: usize) -> Self {
        Self {
            entries: HashTable::new(),
            hasher: RandomState::new(),
            list: VecDeque::new(),
            base: 0,
            repeat_interval,
            max_entries,
            evicted: 0,
            node: String::new(),
            snapshot: None,
        }
    }

    /// How many findings were pushed out, or not kept, because the store was full.
    pub(crate) fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The store of node `node`, whose name its findings carry.
    pub(crate) fn on_node(mut self, node: String) -> Self {
        self.node = node;
        self
    }

    /// The entries now; cheap while nothing changed since the last call.
    pub(crate) fn snapshot(&mut self) -> Snapshot {
        if let Some(s) = &self.snapshot {
            return s.clone();
        }
        let s: Snapshot = self.list.iter().map(|e| e.held.clone()).collect();
        self.snapshot = Some(s.clone());
        s
    }

    /// Records an occurrence. Returns the aggregated finding when it should be printed:
    /// the first time, and then at most once per repeat interval while it keeps recurring.
    pub(crate) fn record(&mut self, mut finding: Finding, now: Instant) -> Option<Finding> {
        self.snapshot = None;
        if let Some(pos) = self.position(&finding) {
            let idx = self.index(pos);
            let entry = &mut self.list[idx];
            let agg = entry.finding_mut();
            agg.count += finding.count;
            agg.last_seen = finding.last_seen;
            agg.sport = finding.sport.or(agg.sport);
            agg.evidence = finding.evidence;
            agg.summary = finding.summary;
            agg.severity = finding.severity;
            let reopened = agg.status != Status::Active;
            agg.status = Status::Active;
            agg.resolved_at = None;
            let count = agg.count;
            if reopened || now.duration_since(entry.printed_at) >= self.repeat_interval {
                entry.printed_at = now;
                entry.printed_count = count;
                return Some(entry.finding().clone());
            }
            return None;
        }
        finding.count = finding.count.max(1);
        finding.id = entry_id(&self.node, &finding.key());
        finding.node.clone_from(&self.node);
        if self.list.len() >= self.max_entries {
            // Bounded memory: the oldest event finding makes room. An active condition
            // (an MTU mismatch, a black hole) is never pushed out by a storm of events,
            // or its resolution could never be reported; when only active conditions
            // are left, a new event is printed and counted but not kept, and a new
            // condition replaces the oldest one.
            let evictable = |e: &Entry| {
                !(e.finding().kind.is_condition() && e.finding().status == Status::Active)
            };
            let victim = self
                .list
                .iter()
                .position(evictable)
                .or_else(|| finding.kind.is_condition().then_some(0));
            self.evicted += 1;
            let Some(victim) = victim else {
                return Some(finding);
            };
            let hash = self.hasher.hash_one(self.list[victim].finding().key());
            let gone = self.base + victim as u64;
            if let Ok(slot) = self.entries.find_entry(hash, |&pos| pos == gone) {
                slot.remove();
            }
            self.list.remove(victim);
            if victim == 0 {
                self.base += 1;
            } else {
                // Behind active conditions: the rare case, positions after it move.
                let moved = self.base + victim as u64;
                for pos in self.entries.iter_mut() {
                    if *pos > moved {
                        *pos -= 1;
                    }
                }
            }
        }
        let hash = self.hasher.hash_one(finding.key());
        self.list.push_back(Entry {
            held: Arc::new(Held::new(finding.clone())),
            printed_at: now,
            printed_count: finding.count,
        });
        let (list, base, hasher) = (&self.list, self.base, &self.hasher);
        self.entries
            .insert_unique(hash, base + list.len() as u64 - 1, |&pos| {
                hasher.hash_one(list[(pos - base) as usize].finding().key())
            });
        Some(finding)
    }

    /// Where in `list` the entry at position `pos` is.
    fn index(&self, pos: u64) -> usize {
        (pos - self.base) as usize
    }

    /// The position of the entry `finding` would aggregate into.
    fn position(&self, finding: &Finding) -> Option<u64> {
        let key = finding.key();
        self.entries
            .find(self.hasher.hash_one(key), |&pos| {
                self.list[self.index(pos)].finding().key() == key
            })
            .copied()
    }

    /// Whether the store holds an entry `finding` would aggregate into.
    pub(crate) fn contains(&self, finding: &Finding) -> bool {
        self.position(finding).is_some()
    }

    /// Whether the entry `finding` would aggregate into has been resolved.
    pub(crate) fn is_resolved(&self, finding: &Finding) -> bool {
        self.position(finding)
            .is_some_and(|pos| self.list[self.index(pos)].finding().status == Status::Resolved)
    }

    /// Makes the active findings of `kinds` equal to `current`, for conditions that are
    /// re-evaluated as a whole (the MTU model): new or reappearing ones are recorded,
    /// ones still holding only refresh `last_seen`, and ones gone are resolved. Returns
    /// what should be printed.
    pub(crate) fn sync_conditions(
        &mut self,
        kinds: &[Kind],
        current: Vec<Finding>,
        now_sys: SystemTime,
        now: Instant,
    ) -> Vec<Finding> {
        let mut out = Vec::new();
        // A few conditions (one per interface or namespace): copied for their keys.
        let holding = current.clone();
        for finding in current {
            match self.position(&finding).map(|pos| self.index(pos)) {
                Some(idx) if self.list[idx].finding().status == Status::Active => {
                    self.snapshot = None;
                    let agg = self.list[idx].finding_mut();
                    agg.last_seen = finding.last_seen;
                    agg.summary = finding.summary;
                    agg.evidence = finding.evidence;
                }
                _ => out.extend(self.record(finding, now)),
            }
        }
        out.extend(self.resolve(
            |f| kinds.contains(&f.kind) && !holding.iter().any(|h| h.key() == f.key()),
            now_sys,
        ));
        out
    }

    /// Marks the active findings matching `gone` resolved and returns them.
    pub(crate) fn resolve(
        &mut self,
        gone: impl Fn(&Finding) -> bool,
        now: SystemTime,
    ) -> Vec<Finding> {
        self.end_as(Status::Resolved, gone, now)
    }

    /// Ends the active findings matching `ended` with `status`: resolved (gone), or
    /// superseded (a later verdict on the same attempt replaces them). Returns them.
    pub(crate) fn end_as(
        &mut self,
        status: Status,
        ended: impl Fn(&Finding) -> bool,
        now: SystemTime,
    ) -> Vec<Finding> {
        let stamp = rfc3339(now);
        let out: Vec<Finding> = self
            .list
            .iter_mut()
            .filter(|e| e.finding().status == Status::Active && ended(e.finding()))
            .map(|e| {
                // Dropped first, so an entry no reader holds is changed in place.
                self.snapshot = None;
                let f = e.finding_mut();
                f.status = status;
                f.resolved_at = Some(stamp.clone());
                f.clone()
            })
            .collect();
        out
    }

    /// Changes the active findings matching `pick` in place, as evidence that came after
    /// them (the rule that dropped their flow) completes them.
    pub(crate) fn update(
        &mut self,
        pick: impl Fn(&Finding) -> bool,
        change: impl Fn(&mut Finding),
    ) {
        for e in &mut self.list {
            if e.finding().status == Status::Active && pick(e.finding()) {
                self.snapshot = None;
                change(e.finding_mut());
            }
        }
    }

    /// Findings whose count grew since they were last printed (flushed on shutdown).
    pub(crate) fn unprinted(&mut self) -> Vec<Finding> {
        self.list
            .iter_mut()
            .filter(|e| e.finding().count > e.printed_count)
            .map(|e| {
                e.printed_count = e.finding().count;
                e.finding().clone()
            })
            .collect()
    }

    /// The active findings matching `which`.
    pub(crate) fn active(&self, which: impl Fn(&Finding) -> bool) -> Vec<Finding> {
        self.list
            .iter()
            .filter(|e| e.finding().status == Status::Active && which(e.finding()))
            .map(|e| e.finding().clone())
            .collect()
    }

    pub(crate) fn all(&self) -> Vec<Finding> {
        self.list.iter().map(|e| e.finding().clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::findings::{Layer, Severity, fixtures};

    fn refused(sport: u16) -> Finding {
        let mut f = fixtures::refused(sport);
        f.first_seen = "t0".into();
        f.last_seen = "t0".into();
        f
    }

    #[test]
    fn another_pod_behind_the_same_flow_is_another_finding() {
        let mut store = Store::new(Duration::from_secs(10), 16);
        let now = Instant::now();
        let pod = |name: &str| crate::pods::PodRef {
            namespace: "shop".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        };
        let mut old = refused(4000);
        old.pod = Some(pod("old"));
        let mut new = refused(4001);
        new.pod = Some(pod("new"));
        assert!(store.record(old.clone(), now).is_some());
        assert!(store.record(old, now).is_none(), "a repeat aggregates");
        assert!(
            store.record(new, now).is_some(),
            "the new pod's own finding"
        );
        let names: Vec<_> = store
            .all()
            .iter()
            .map(|f| (f.pod.as_ref().unwrap().name.clone(), f.count))
            .collect();
        assert_eq!(names, [("old".to_string(), 2), ("new".to_string(), 1)]);
    }

    #[test]
    fn an_entry_keeps_its_id_and_node_and_ids_differ_by_key_and_node() {
        let mut store = Store::new(Duration::from_secs(10), 16).on_node("node-a".into());
        let now = Instant::now();
        let first = store.record(refused(1), now).unwrap();
        assert_eq!(first.node, "node-a");
        assert_eq!(first.id.len(), 16);
        assert!(first.id.bytes().all(|b| b.is_ascii_hexdigit()));
        store.record(refused(2), now);
        store.resolve(|_| true, SystemTime::UNIX_EPOCH);
        let again = store.record(refused(3), now).unwrap();
        assert_eq!(
            (again.count, &again.id),
            (3, &first.id),
            "same entry, same id"
        );
        let mut other = refused(1);
        other.dport = Some(81);
        let other = store.record(other, now).unwrap();
        assert_ne!(other.id, first.id);
        let mut elsewhere = Store::new(Duration::from_secs(10), 16).on_node("node-b".into());
        let there = elsewhere.record(refused(1), now).unwrap();
        assert_ne!(there.id, first.id, "the same finding on another node");
        // The id is the store's: what the finding arrived with does not count.
        let mut stamped = refused(1);
        stamped.id = "forged".into();
        stamped.node = "elsewhere".into();
        let mut fresh = Store::new(Duration::from_secs(10), 16).on_node("node-a".into());
        let kept = fresh.record(stamped, now).unwrap();
        assert_eq!(
            (kept.id.as_str(), kept.node.as_str()),
            (first.id.as_str(), "node-a")
        );
    }

    #[test]
    fn a_snapshot_is_shared_until_a_change_and_never_changes() {
        let mut store = Store::new(Duration::from_secs(10), 16);
        let now = Instant::now();
        store.record(refused(1), now);
        let mut other = refused(1);
        other.dport = Some(81);
        store.record(other, now);
        let a = store.snapshot();
        let b = store.snapshot();
        assert!(Arc::ptr_eq(&a, &b), "no change, the same snapshot");
        let json = a[0].json().to_owned();
        assert!(json.contains("\"count\":1"));
        store.record(refused(2), now);
        let c = store.snapshot();
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(a[0].finding().count, 1, "the old snapshot is untouched");
        assert_eq!(a[0].json(), json);
        assert_eq!(c[0].finding().count, 2);
        assert!(c[0].json().contains("\"count\":2"));
        assert!(Arc::ptr_eq(&a[1], &c[1]), "the unchanged entry is shared");
        // Nothing ended, nothing changed: still the same snapshot.
        assert!(store.resolve(|_| false, SystemTime::UNIX_EPOCH).is_empty());
        assert!(Arc::ptr_eq(&c, &store.snapshot()));
        store.resolve(|_| true, SystemTime::UNIX_EPOCH);
        let d = store.snapshot();
        assert!(d.iter().all(|h| h.finding().status == Status::Resolved));
        assert!(c.iter().all(|h| h.finding().status == Status::Active));
        store.update(|_| true, |f| f.summary = "changed".into());
        assert!(
            Arc::ptr_eq(&d, &store.snapshot()),
            "update touches active ones only"
        );
    }

    #[test]
    fn a_resolved_entry_is_known_as_such() {
        let mut store = Store::new(Duration::from_secs(10), 16);
        let f = refused(1000);
        assert!(!store.is_resolved(&f), "unknown");
        store.record(f.clone(), Instant::now());
        assert!(!store.is_resolved(&f), "active");
        store.resolve(|_| true, SystemTime::now());
        assert!(store.is_resolved(&f));
    }

    #[test]
    fn repeats_aggregate_and_are_rate_limited() {
        let mut store = Store::new(Duration::from_secs(10), 100);
        let t0 = Instant::now();
        assert!(store.record(refused(1000), t0).is_some());
        let mut again = refused(1001);
        again.last_seen = "t1".into();
        assert!(store.record(again, t0 + Duration::from_secs(1)).is_none());
        let all = store.all();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].count, 2);
        assert_eq!(all[0].first_seen, "t0");
        assert_eq!(all[0].last_seen, "t1");
        let printed = store
            .record(refused(1002), t0 + Duration::from_secs(11))
            .expect("printed again after the interval");
        assert_eq!(printed.count, 3);
        assert!(store.unprinted().is_empty());
    }

    #[test]
    fn different_ports_are_different_findings_and_memory_is_bounded() {
        let mut store = Store::new(Duration::from_secs(10), 2);
        let now = Instant::now();
        for port in [1, 2, 3] {
            let mut f = refused(5);
            f.dport = Some(port);
            store.record(f, now);
        }
        let ports: Vec<_> = store.all().iter().map(|f| f.dport.unwrap()).collect();
        assert_eq!(ports, vec![2, 3]);
        assert_eq!(store.evicted(), 1, "port 1 pushed out");
        let mut f = refused(5);
        f.dport = Some(2);
        store.record(f, now);
        assert_eq!(store.all()[0].count, 2);
        assert_eq!(store.evicted(), 1, "a repeat evicts nothing");
    }

    fn mismatch(iface: &str) -> Finding {
        let mut f = Finding::new(
            Kind::OverlayMtuMismatch,
            Layer::OverlayMtu,
            Severity::Warning,
            format!("{iface} too big"),
            "r".into(),
            SystemTime::UNIX_EPOCH,
        );
        f.interface = Some(iface.into());
        f
    }

    #[test]
    fn conditions_appear_hold_resolve_and_reopen() {
        let mut store = Store::new(Duration::from_secs(10), 100);
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(60);
        let now = Instant::now();
        let kinds = [Kind::OverlayMtuMismatch];
        let printed = store.sync_conditions(&kinds, vec![mismatch("eth0")], t, now);
        assert_eq!(printed.len(), 1);
        // Still true: nothing printed, nothing counted.
        assert!(
            store
                .sync_conditions(&kinds, vec![mismatch("eth0")], t, now)
                .is_empty()
        );
        assert_eq!(store.all()[0].count, 1);
        // Gone: resolved once.
        let printed = store.sync_conditions(&kinds, vec![], t, now);
        assert_eq!(printed.len(), 1);
        assert_eq!(printed[0].status, Status::Resolved);
        assert_eq!(
            printed[0].resolved_at.as_deref(),
            Some("1970-01-01T00:01:00.000Z")
        );
        assert!(store.sync_conditions(&kinds, vec![], t, now).is_empty());
        // Back again: active, printed at once, counted.
        let printed = store.sync_conditions(&kinds, vec![mismatch("eth0")], t, now);
        assert_eq!(printed.len(), 1);
        assert_eq!(printed[0].status, Status::Active);
        assert_eq!(printed[0].count, 2);
        // Other kinds are left alone.
        store.record(refused(1), now);
        assert!(
            store
                .sync_conditions(&kinds, vec![mismatch("eth0")], t, now)
                .is_empty()
        );
        assert_eq!(store.all().len(), 2);
    }

    #[test]
    fn a_superseded_finding_is_ended_once_and_reopened_by_a_new_occurrence() {
        let mut store = Store::new(Duration::from_secs(10), 16);
        let now = Instant::now();
        let t = SystemTime::UNIX_EPOCH;
        store.record(refused(1), now);
        let ended = store.end_as(Status::Superseded, |f| f.kind == Kind::TcpRefused, t);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].status, Status::Superseded);
        assert!(ended[0].resolved_at.is_some());
        assert!(
            store.end_as(Status::Superseded, |_| true, t).is_empty(),
            "ended once"
        );
        assert!(store.resolve(|_| true, t).is_empty(), "not resolved after");
        let again = store.record(refused(2), now).expect("printed at once");
        assert_eq!(again.status, Status::Active);
        assert_eq!(again.count, 2);
    }

    #[test]
    fn events_never_evict_active_conditions() {
        let mut store = Store::new(Duration::from_secs(10), 3);
        let now = Instant::now();
        let t = SystemTime::UNIX_EPOCH;
        let kinds = [Kind::OverlayMtuMismatch];
        store.sync_conditions(&kinds, vec![mismatch("eth0")], t, now);
        for port in 1..=10 {
            let mut f = refused(5);
            f.dport = Some(port);
            assert!(store.record(f, now).is_some(), "events are still printed");
        }
        let all = store.all();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].kind, Kind::OverlayMtuMismatch);
        let ports: Vec<_> = all[1..].iter().map(|f| f.dport.unwrap()).collect();
        assert_eq!(ports, [9, 10], "the newest events stay");
        // Pushed out from behind the condition, the rest still aggregate in place.
        for port in [10, 9, 10] {
            let mut f = refused(5);
            f.dport = Some(port);
            store.record(f, now);
        }
        let counts: Vec<_> = store.all()[1..].iter().map(|f| f.count).collect();
        assert_eq!(counts, [2, 3]);
        assert!(store.contains(&mismatch("eth0")));
        // Its resolution can still be reported.
        let printed = store.sync_conditions(&kinds, vec![], t, now);
        assert_eq!(printed.len(), 1);
        assert_eq!(printed[0].status, Status::Resolved);
        // Resolved, it is an ordinary entry again and makes room like any other.
        let mut f = refused(5);
        f.dport = Some(11);
        store.record(f, now);
        assert!(store.all().iter().all(|f| f.kind == Kind::TcpRefused));
    }

    #[test]
    fn a_store_full_of_active_conditions_keeps_them_against_events() {
        let mut store = Store::new(Duration::from_secs(10), 2);
        let now = Instant::now();
        let t = SystemTime::UNIX_EPOCH;
        let kinds = [Kind::OverlayMtuMismatch];
        store.sync_conditions(&kinds, vec![mismatch("a"), mismatch("b")], t, now);
        assert!(store.record(refused(1), now).is_some(), "printed");
        let names: Vec<_> = store
            .all()
            .into_iter()
            .filter_map(|f| f.interface)
            .collect();
        assert_eq!(names, ["a", "b"], "the event is not kept");
        assert_eq!(store.evicted(), 1, "not kept counts as evicted");
        // A new condition takes the oldest condition's place.
        store.record(mismatch("c"), now);
        let names: Vec<_> = store
            .all()
            .into_iter()
            .filter_map(|f| f.interface)
            .collect();
        assert_eq!(names, ["b", "c"]);
    }
}
