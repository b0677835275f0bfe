//! The agent's side of path probes: a run's verdict carried out as the ledger decides
//! (`findings::ledger::path_verdict`: recorded, the verdict it replaces resolved, unless
//! this node's kernel showed the black hole itself); the black holes runs found probed
//! again, and resolved once their path carries the large size.

use tracing::debug;

use super::{Agent, path_probe};
use crate::findings::{
    Finding,
    correlate::path::{PathVerdict, reprobed},
    ledger,
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
        let (held, resolved) = {
            let store = self.shared.store();
            (store.all(), store.is_resolved(original))
        };
        match ledger::path_verdict(original, verdict, &held, resolved) {
            Ok(effects) => self.apply(effects),
            Err(why) => {
                debug!(dst = ?original.dst, dport = ?original.dport, why, "path probe dropped")
            }
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
