//! The agent's side of path probes: a run's verdict recorded, the verdict it replaces
//! withdrawn, unless this node's kernel showed the black hole itself.

use std::time::SystemTime;

use tracing::debug;

use super::{Agent, path_probe};
use crate::{
    findings::correlate::path::{PathVerdict, settled_here, withdraws},
    output::print_finding,
};

impl Agent {
    /// A path probe ended: its verdict recorded, and a verdict it replaces withdrawn.
    pub(super) fn on_path_probe(&mut self, done: path_probe::Done) {
        let Some((original, verdict)) = self.path_probes.verdict(done) else {
            return;
        };
        if self
            .shared
            .store()
            .all()
            .iter()
            .any(|s| settled_here(&original, s))
        {
            debug!(dst = ?original.dst, dport = ?original.dport, "path probe dropped: the kernel's black hole stands");
            return;
        }
        let f = match verdict {
            PathVerdict::Replace(f) => {
                let resolved = self
                    .shared
                    .store()
                    .resolve(|s| withdraws(&original, s), SystemTime::now());
                for r in resolved {
                    print_finding(&r, self.opts.format);
                }
                f
            }
            PathVerdict::Annotate(f) => f,
        };
        self.record(f);
    }
}
