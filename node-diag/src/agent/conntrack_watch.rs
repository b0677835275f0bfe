//! Each scoped namespace's conntrack counters, read every refresh into a
//! [`History`], and read again for a verdict whose flow packet got a `NETFILTER_DROP`:
//! the [`Window`] the correlator judges (see `findings::conntrack` for the design).

use std::collections::{BTreeSet, HashMap};

use node_diag_common::Event;

use crate::{
    findings::{
        conntrack::{History, Window},
        names::Names,
    },
    host_network::conntrack_stats::{NetnsFile, read_netns, scope_files},
    kernel::maps::monotonic_ns,
};

#[derive(Default)]
pub(crate) struct ConntrackWatch {
    history: History,
    /// The file pinning each scoped namespace, by inode, from the last refresh.
    files: HashMap<u32, NetnsFile>,
}

impl ConntrackWatch {
    /// Reads every namespace of `scope` (all of them when `None`). Namespaces without
    /// conntrack loaded have nothing to read and are skipped.
    pub(crate) fn refresh(&mut self, scope: Option<&BTreeSet<u32>>) {
        self.files = scope_files(scope)
            .into_iter()
            .map(|f| (f.inode, f))
            .collect();
        for (&netns, file) in &self.files {
            if let Some(stats) = read_netns(file) {
                self.history.record(netns, monotonic_ns(), stats);
            }
        }
        self.history.retain(|ns| self.files.contains_key(&ns));
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
