//! Each scoped namespace's conntrack counters, read every 2 s into a
//! [`History`], and read again for a verdict whose flow packet got a `NETFILTER_DROP`:
//! the [`Window`] the correlator judges (see `findings::conntrack` for the design).

use std::collections::HashMap;

use node_diag_common::Event;

use crate::{
    findings::{
        conntrack::{History, Window},
        names::Names,
    },
    host_network::{
        LocalNode,
        conntrack_stats::{NetnsFile, read_each, read_netns, scope_files},
    },
    kernel::maps::monotonic_ns,
};

/// How often a namespace whose table did not move is read (a little under 10 s: the
/// refresh runs every 2 s, so it is read every fifth).
const QUIET_EVERY_NS: u64 = 9_500_000_000;

#[derive(Default)]
pub(crate) struct ConntrackWatch {
    history: History,
    /// The file pinning each scoped namespace, by inode, from the last refresh.
    files: HashMap<u32, NetnsFile>,
}

impl ConntrackWatch {
    /// Finds every namespace anew and reads each (every namespace watched: no scope to
    /// follow).
    pub(crate) fn refresh_all(&mut self) {
        self.follow_files(scope_files(None));
        self.read();
    }

    /// Follows the namespaces of `node`'s scope: the agent's own and its pods', whose
    /// files the scope refresh found (no scan of its own).
    pub(crate) fn follow(&mut self, node: &LocalNode) {
        let mut files = node.pod_files.clone();
        files.push(NetnsFile {
            inode: node.own,
            path: "/proc/self/ns/net".into(),
            name: "self".into(),
        });
        self.follow_files(files);
    }

    fn follow_files(&mut self, files: Vec<NetnsFile>) {
        self.files = files.into_iter().map(|f| (f.inode, f)).collect();
        self.history.retain(|ns| self.files.contains_key(&ns));
    }

    /// Reads the counters of every namespace followed, but those whose table did not
    /// move between their last two readings, which are read every [`QUIET_EVERY_NS`]:
    /// a node's hundred pods mostly track nothing, and a drop's window reads its
    /// namespace anew anyway, its baseline then at most that old. Namespaces without
    /// conntrack loaded have nothing to read and are skipped.
    pub(crate) fn read(&mut self) {
        let now = monotonic_ns();
        let files: Vec<NetnsFile> = self
            .files
            .values()
            .filter(|f| {
                self.history
                    .unchanged_since(f.inode)
                    .is_none_or(|at| now.saturating_sub(at) >= QUIET_EVERY_NS)
            })
            .cloned()
            .collect();
        for (file, stats) in files.iter().zip(read_each(&files)) {
            if let Some(stats) = stats {
                self.history.record(file.inode, monotonic_ns(), stats);
            }
        }
    }

    /// The conntrack window around the event's flow drop, when it was a
    /// `NETFILTER_DROP` in a namespace with readings from before it.
    pub(crate) fn window(&mut self, ev: &Event, names: &Names) -> Option<Window> {
        if ev.drop.count == 0 || names.drop_reason(ev.drop.reason) != "NETFILTER_DROP" {
            return None;
        }
        let file = self.files.get(&ev.drop.netns)?;
        let now = read_netns(file)?;
        self.history.record(ev.drop.netns, monotonic_ns(), now);
        self.history.window(ev.drop.netns, ev.drop.last_ns, now)
    }
}
