//! Following the node's interfaces with the TC ingress classifier: attached where ICMP
//! errors from the network arrive (never the pods' veths) while the ICMP watch holds it
//! ([`icmp_watch`](super::icmp_watch) decides when), and the interfaces that come and
//! go picked up.

use std::time::Instant;

use tracing::{info, warn};

use super::{
    Agent,
    failing::Failing,
    icmp_watch::{self, IcmpWatch},
};
use crate::{
    host_network::LocalNode,
    kernel::{maps::monotonic_ns, tc::TcIngress},
};

impl Agent {
    /// The classifier at start: attached now with `--icmp-watch always`; otherwise
    /// only the filters a previous agent left are removed.
    pub(super) fn start_tc(&mut self, node: Option<&LocalNode>, loaded_ns: u64) {
        let Some(tc) = self.tc.as_mut() else {
            return;
        };
        match self.watch.mode() {
            icmp_watch::Mode::Always => {
                follow_interfaces(tc, &mut self.loaded.ebpf, node, &mut self.watch, loaded_ns);
            }
            icmp_watch::Mode::OnTrouble => {
                match node {
                    Some(node) => tc.remove_leftovers(&node.links),
                    None => match crate::host_network::links() {
                        Ok(links) => tc.remove_leftovers(&links),
                        Err(e) => {
                            warn!(error = %e, "cannot list interfaces; TC filters a previous agent left stay")
                        }
                    },
                }
                info!(
                    hold_secs = self.watch.hold().as_secs(),
                    "ICMP from the network is watched only once trouble shows (--icmp-watch on-trouble)"
                );
            }
        }
    }

    /// Brings the classifier in line with the interfaces while the watch keeps it
    /// attached; `node`: a look at the node just taken, to reuse.
    pub(super) fn follow_kept(&mut self, node: Option<&LocalNode>) {
        if let Some(tc) = self.tc.as_mut().filter(|_| self.watch.keeps_attached()) {
            follow_interfaces(
                tc,
                &mut self.loaded.ebpf,
                node,
                &mut self.watch,
                monotonic_ns(),
            );
        }
    }

    /// Attaches the classifier now that trouble shows (`why`), and notes since when
    /// ICMP is watched. Without it (unavailable), nothing is watched and findings say so.
    pub(super) fn start_icmp_watch(&mut self, why: &str) {
        let Some(tc) = self.tc.as_mut() else {
            self.watch.attach_failed(Instant::now());
            return;
        };
        if follow_interfaces(
            tc,
            &mut self.loaded.ebpf,
            None,
            &mut self.watch,
            monotonic_ns(),
        ) {
            info!(
                trigger = why,
                "ICMP watch on: trouble shows; TC ingress attached"
            );
        } else {
            self.watch.attach_failed(Instant::now());
            warn!(
                trigger = why,
                "trouble shows but TC ingress attached to no interface: ICMP from the network stays unwatched"
            );
        }
    }
}

/// Brings the classifier's attachments in line with the node's interfaces
/// ([`sync_tc_from`]) and, when some interface holds it, notes that ICMP from the network
/// is watched from `now_ns` on. Returns whether any interface holds it.
fn follow_interfaces(
    tc: &mut TcIngress,
    ebpf: &mut aya::Ebpf,
    node: Option<&LocalNode>,
    watch: &mut IcmpWatch,
    now_ns: u64,
) -> bool {
    sync_tc_from(tc, ebpf, node);
    let any = tc.attached_any();
    if any {
        watch.attached(now_ns);
    }
    any
}

/// Attaches TC ingress to the agent's namespace's interfaces as they come and go, except
/// the pods' veths, where it would run on every packet a pod sends: ICMP errors from
/// outside the node arrive on the underlay and the overlay, and the IPv4 ones a pod's
/// namespace generates are seen where they are generated (`icmp_send`; an ICMPv6 error
/// between two pods of this node goes unseen).
fn sync_tc(tc: &mut TcIngress, ebpf: &mut aya::Ebpf) {
    match crate::host_network::links() {
        Ok(links) => {
            LIST_INTERFACES.worked();
            let pods = crate::host_network::pod_veths(&links).unwrap_or_else(|e| {
                warn!(error = %e, "cannot tell the pods' veths; TC ingress on them too");
                Default::default()
            });
            tc.sync(ebpf, &links, &pods);
        }
        Err(e) => LIST_INTERFACES.failed(&e),
    }
}

static LIST_INTERFACES: Failing = Failing::new(
    "list this node's interfaces for TC ingress",
    "TC attachments stay as they are",
);

/// [`sync_tc`] from a look at the node just taken for the scope, rather than a second
/// scan of every namespace; `None` (none was taken, or it failed): its own look.
fn sync_tc_from(tc: &mut TcIngress, ebpf: &mut aya::Ebpf, node: Option<&LocalNode>) {
    match node {
        Some(node) => tc.sync(ebpf, &node.links, &node.pod_veths),
        None => sync_tc(tc, ebpf),
    }
}
