//! The agent's side of path probes: a run's verdict recorded, the verdict it replaces
//! withdrawn, unless this node's kernel showed the black hole itself; the black holes
//! runs found probed again, and resolved once their path carries the large size.

use std::time::SystemTime;

use tracing::debug;

use super::{Agent, path_probe};
use crate::{
    findings::{
        Finding,
        correlate::path::{PathVerdict, reprobed, settled_here, withdrawn_meanwhile, withdraws},
    },
    output::print_finding,
};

impl Agent {
    /// A path probe ended: its verdicts recorded, and the verdicts they replace
    /// withdrawn.
    pub(super) fn on_path_probe(&mut self, done: path_probe::Done) {
        for (original, verdict) in self.path_probes.verdicts(done) {
            self.record_path_verdict(&original, verdict);
        }
    }

    fn record_path_verdict(&mut self, original: &Finding, verdict: PathVerdict) {
        let stored = self.shared.store().all();
        if stored.iter().any(|s| settled_here(original, s)) {
            debug!(dst = ?original.dst, dport = ?original.dport, "path probe dropped: the kernel's black hole stands");
            return;
        }
        if stored.iter().any(|s| withdrawn_meanwhile(original, s)) {
            debug!(dst = ?original.dst, dport = ?original.dport, "path probe dropped: the timeout was withdrawn meanwhile");
            return;
        }
        // The flow moved on while the probe ran (a connect that completed late, a
        // stall that resumed): a verdict on it now would reopen what is over. A healed
        // path black hole is resolved on purpose, by its re-probe.
        if !matches!(verdict, PathVerdict::Healed(_)) && self.shared.store().is_resolved(original) {
            debug!(dst = ?original.dst, dport = ?original.dport, "path probe dropped: its finding resolved meanwhile");
            return;
        }
        match verdict {
            PathVerdict::Replace(f) => {
                self.withdraw_replaced(original);
                self.record(f);
            }
            PathVerdict::Annotate(f) => self.record(f),
            // With the run that showed it healed in its evidence.
            PathVerdict::Healed(f) => {
                self.record(f);
                self.withdraw_replaced(original);
            }
        }
    }

    /// Resolves the stored verdict `original` was (see [`withdraws`]), printing it.
    fn withdraw_replaced(&self, original: &Finding) {
        let resolved = self
            .shared
            .store()
            .resolve(|s| withdraws(original, s), SystemTime::now());
        for r in resolved {
            print_finding(&r, self.opts.format);
        }
    }

    /// Asks for a new run of every open path black hole's path (each admitted once its
    /// peer's window is over).
    pub(super) fn reprobe_path_blackholes(&mut self) {
        let holes = self.shared.store().active(reprobed);
        for hole in holes {
            self.path_probes.reprobe(&hole);
        }
    }
}
