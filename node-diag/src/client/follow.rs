//! What changed between two polls of `/findings`, so `--follow` prints each finding once
//! as it appears and again as it grows or changes status (resolved, superseded,
//! reopened).
//!
//! A finding is known by its store entry: the agent's `id` where it sends one, else
//! every field the store aggregates on (`Finding::key` in `findings::store`: kind,
//! layer, src, dst, dport, netns, listener, interface, the pods' uids), plus the node.
//! The status is not part of it: it is what changes.

use std::collections::HashMap;

use super::Fetched;
use crate::findings::{Finding, Status};

/// What a poll shows about one finding, compared with the poll before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    New,
    /// Seen again: `count` or `last_seen` moved.
    Grew,
    Resolved,
    Superseded,
    /// Active again after it had ended.
    Reopened,
}

/// The identity of a finding's store entry, as text.
pub(crate) fn identity(f: &Fetched) -> String {
    let node = f.node.as_deref().unwrap_or("");
    match &f.id {
        Some(id) => format!("{node}|id={id}"),
        None => format!("{node}|{}", key(&f.finding)),
    }
}

/// The store's aggregation key of `f`, for an agent that sends no `id`.
fn key(f: &Finding) -> String {
    let uid = |p: &Option<crate::pods::PodRef>| p.as_ref().map(|p| p.uid.clone());
    format!(
        "{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
        f.kind,
        f.layer,
        f.src,
        f.dst,
        f.dport,
        f.netns,
        f.listener,
        f.interface,
        uid(&f.pod),
        uid(&f.peer_pod),
    )
}

/// The identities of one poll's findings, in order. Two entries of one answer are two
/// findings even when their fields agree (a store entry evicted and made again, or the
/// merged answers of several agents), so a repeat is numbered rather than merged.
pub(crate) fn identities(batch: &[Fetched]) -> Vec<String> {
    let mut times: HashMap<String, usize> = HashMap::new();
    batch
        .iter()
        .map(|f| {
            let id = identity(f);
            let n = times.entry(id.clone()).or_default();
            *n += 1;
            if *n == 1 { id } else { format!("{id}#{n}") }
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    count: u64,
    last_seen: String,
    status: Status,
}

/// The findings of the last poll, by identity.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    seen: HashMap<String, Seen>,
}

impl Tracker {
    /// Compares `batch` with the previous poll: the position and change of each finding
    /// to print, in the batch's order. Findings gone from the answer are forgotten.
    pub(crate) fn update(&mut self, batch: &[Fetched]) -> Vec<(usize, Change)> {
        let mut next = HashMap::with_capacity(batch.len());
        let mut changes = Vec::new();
        for (i, (f, id)) in batch.iter().zip(identities(batch)).enumerate() {
            let now = Seen {
                count: f.finding.count,
                last_seen: f.finding.last_seen.clone(),
                status: f.finding.status,
            };
            let change = match self.seen.get(&id) {
                None => Some(Change::New),
                Some(before) if before.status != now.status => Some(match now.status {
                    Status::Active => Change::Reopened,
                    Status::Resolved => Change::Resolved,
                    Status::Superseded => Change::Superseded,
                }),
                Some(before) if *before != now => Some(Change::Grew),
                Some(_) => None,
            };
            if let Some(change) = change {
                changes.push((i, change));
            }
            next.insert(id, now);
        }
        self.seen = next;
        changes
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::findings::{Kind, Layer, Store, fixtures::refused};

    fn fetched(f: Finding) -> Fetched {
        Fetched::from_finding(f)
    }

    /// Findings that differ only in the fields named, each from the refused fixture.
    fn variants() -> Vec<Finding> {
        let base = refused(4000);
        let mut listener = base.clone();
        listener.listener = Some("10.0.0.2:443".parse().unwrap());
        let mut iface = base.clone();
        iface.interface = Some("eth1".into());
        let mut pod = base.clone();
        pod.pod = Some(crate::pods::PodRef {
            namespace: "shop".into(),
            name: "cart".into(),
            uid: "u1".into(),
        });
        let mut peer = base.clone();
        peer.peer_pod = pod.pod.clone();
        let mut netns = base.clone();
        netns.netns = Some(2);
        let mut dport = base.clone();
        dport.dport = Some(81);
        let mut layer = base.clone();
        layer.layer = Layer::Firewall;
        let mut kind = base.clone();
        kind.kind = Kind::TcpTimeout;
        vec![base, listener, iface, pod, peer, netns, dport, layer, kind]
    }

    #[test]
    fn identity_is_the_stores_key() {
        // Each variant is its own store entry, and its own identity here.
        let mut store = Store::new(Duration::from_secs(10), 64);
        let now = Instant::now();
        for f in variants() {
            store.record(f, now);
        }
        let all: Vec<Fetched> = store.all().into_iter().map(fetched).collect();
        assert_eq!(all.len(), variants().len());
        let ids = identities(&all);
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), all.len(), "{ids:#?}");
        assert!(ids.iter().all(|id| !id.contains('#')), "{ids:#?}");

        // What the store aggregates (another source port, another count, a status)
        // keeps the identity.
        let mut again = refused(5000);
        again.count = 7;
        again.status = Status::Resolved;
        assert_eq!(identity(&fetched(again)), identity(&fetched(refused(4000))));

        // The agent's id wins; the node tells two agents' equal ids apart.
        let mut a = fetched(refused(4000));
        a.id = Some("17".into());
        let mut b = a.clone();
        b.finding.dport = Some(9);
        assert_eq!(identity(&a), identity(&b));
        b.node = Some("node-b".into());
        assert_ne!(identity(&a), identity(&b));
    }

    #[test]
    fn equal_entries_of_one_answer_are_two_findings() {
        let mut resolved = refused(4000);
        resolved.status = Status::Resolved;
        let batch = vec![fetched(refused(4000)), fetched(resolved)];
        let mut t = Tracker::default();
        let changes = t.update(&batch);
        assert_eq!(changes, [(0, Change::New), (1, Change::New)]);
        assert!(t.update(&batch).is_empty(), "nothing changed");
    }

    /// Two polls as the agent serves them, JSON in, the changes out.
    #[test]
    fn status_changes_between_two_polls() {
        let poll = |json: &str| -> Vec<Fetched> { super::super::parse_findings(json).unwrap() };
        let mk = |id: &str, count: u64, status: &str, last: &str| {
            let mut f = refused(4000);
            f.count = count;
            f.last_seen = last.into();
            let mut v = serde_json::to_value(&f).unwrap();
            v["status"] = status.into();
            v["id"] = id.into();
            v
        };
        let first = serde_json::json!([
            mk("1", 1, "active", "t0"),
            mk("2", 1, "active", "t0"),
            mk("3", 1, "active", "t0"),
            mk("4", 1, "resolved", "t0"),
            mk("5", 1, "active", "t0"),
        ])
        .to_string();
        let second = serde_json::json!([
            mk("1", 1, "active", "t0"),
            mk("2", 3, "active", "t1"),
            mk("3", 1, "resolved", "t0"),
            mk("4", 2, "active", "t1"),
            mk("5", 1, "superseded", "t0"),
            mk("6", 1, "active", "t1"),
        ])
        .to_string();
        let mut t = Tracker::default();
        assert_eq!(t.update(&poll(&first)).len(), 5);
        assert_eq!(
            t.update(&poll(&second)),
            [
                (1, Change::Grew),
                (2, Change::Resolved),
                (3, Change::Reopened),
                (4, Change::Superseded),
                (5, Change::New),
            ]
        );
        // Without ids (today's agent), the same through the store's key.
        let strip = |json: &str| {
            let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
            for (i, f) in v.as_array_mut().unwrap().iter_mut().enumerate() {
                f.as_object_mut().unwrap().remove("id");
                f["dport"] = (1000 + i as u64).into();
            }
            v.to_string()
        };
        let mut t = Tracker::default();
        t.update(&poll(&strip(&first)));
        let changes: Vec<Change> = t
            .update(&poll(&strip(&second)))
            .into_iter()
            .map(|c| c.1)
            .collect();
        assert_eq!(
            changes,
            [
                Change::Grew,
                Change::Resolved,
                Change::Reopened,
                Change::Superseded,
                Change::New
            ]
        );
    }
}
