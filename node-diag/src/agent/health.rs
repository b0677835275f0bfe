//! The agent's health as metrics, synced on every refresh: which programs are attached
//! (the tracepoint programs as the loader left them: their links are the agent's own
//! file descriptors, which the kernel offers no way to detach from outside; the TC
//! classifier's attachments checked against the kernel each time, since `bpftool link
//! detach` or `tc filter del` remove them behind the agent's back), whether the container
//! runtime answered its last read, and how many findings the full store pushed out.

use super::Agent;
use crate::kernel::{
    hooks::{HOOKS, companions},
    tc,
};

impl Agent {
    pub(super) fn check_health(&mut self) {
        if let Some(tc) = self.tc.as_mut() {
            tc.verify(&mut self.loaded.ebpf);
        }
        let mut programs: Vec<(&str, Option<&str>, bool)> = HOOKS
            .iter()
            // An fentry hook adds evidence where the kernel allows fentry at all (not on
            // arm64 before 6.0, nor where lockdown refuses it): not attached, it is
            // absent from the metric, as an alert on it would fire on every such node.
            .filter(|h| !h.fentry || self.loaded.attached.contains(&h.program))
            .map(|h| {
                // A hook whose fallback runs here is that program.
                let program = h
                    .fallback
                    .filter(|f| self.loaded.attached.contains(&f.program))
                    .map_or(h.program, |f| f.program);
                (program, None, self.loaded.attached.contains(&program))
            })
            .collect();
        // A fallback's fexit companions, like fentry hooks, only where they run.
        programs.extend(
            companions()
                .filter(|c| self.loaded.attached.contains(&c.program))
                .map(|c| (c.program, None, true)),
        );
        // The classifier: loaded (attached on demand, see `icmp_watch`), then each
        // interface it is attached to, failed on or lost.
        programs.push((tc::PROGRAM, None, self.tc.is_some()));
        if let Some(tc) = &self.tc {
            programs.extend(
                tc.attachments()
                    .into_iter()
                    .map(|(interface, attached)| (tc::PROGRAM, Some(interface), attached)),
            );
        }
        let evicted = self.shared.store().evicted();
        let mut metrics = self.shared.metrics();
        metrics.set_programs(&programs);
        let runtime = self.pods.runtime();
        metrics.set_runtime(
            runtime
                .as_ref()
                .map(|r| (r.socket.to_str().unwrap_or_default(), r.up)),
        );
        metrics.set_findings_evicted(evicted);
    }
}
