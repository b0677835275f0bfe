//! TC ingress attachment on this node's interfaces (the namespace the agent runs in, which
//! holds the underlay, the overlay and the pods' node-side veths; the pods' veths are left
//! out by the caller). Interfaces are attached as they appear and forgotten as they go,
//! while the agent watches ICMP (`agent::icmp_watch` decides when: always, or while
//! trouble shows).
//!
//! Two ways to attach, chosen by [`AttachMode`] (`node-diag run --tc-attach`):
//!
//! - **TCX** (Linux 6.6+): every attachment is a link owned by this process, so nothing
//!   outlives the agent, even when it is killed. `auto` uses it wherever the kernel has it.
//! - **netlink** (`cls_bpf` filter under a `clsact` qdisc): kernels before 6.6 (Debian
//!   12's 6.1), or forced with `--tc-attach netlink`. A filter belongs to the interface,
//!   not to the process: a killed agent's filters keep running on every packet.
//!
//! Rules of the netlink path, so that restarts (a crash loop included) never pile up
//! filters and the agent never removes what another tool put there:
//!
//! - Our filter is recognisable: ingress, `bpf` classifier, priority [`PRIORITY`]
//!   (20036, `0x4e44`), handle [`HANDLE`] (`0x4e44`), program name [`PROGRAM`]
//!   (`tc filter show dev X ingress` shows `pref 20036 bpf ... handle 0x4e44
//!   nd_tc_ingress`). It returns `TC_ACT_UNSPEC`, so filters after it still run.
//! - Before attaching to an interface (in either mode), the agent deletes the filters
//!   matching all of that: they were left by a previous agent killed before it could
//!   detach. Nothing else is touched.
//! - The agent adds a `clsact` qdisc only where there is none, and owns the ones it added.
//!   It also takes over a predecessor's: when it has just deleted leftover filters of ours
//!   on an interface and its `clsact` then holds no filter in either direction, that
//!   `clsact` is taken to be the predecessor's (nothing else uses it) and is owned.
//! - On a clean exit, the agent detaches its filters, then deletes each `clsact` it owns
//!   if, and only if, no filter is left in it in either direction: deleting a qdisc
//!   deletes its filters, so one that another tool started using since is kept.
//! - One agent per network namespace: a second agent started in the same namespace would
//!   take the first one's filters for leftovers.

use std::collections::{HashMap, HashSet};

use aya::{
    Ebpf,
    maps::{Array, MapData},
    programs::{
        LinkOrder, ProgramError, SchedClassifier, TcAttachType,
        tc::{self, NlOptions, SchedClassifierLinkId, TcAttachOptions, TcHandle},
    },
};
use node_diag_common::{ETH_HLEN, LINK_MAP_ENTRIES, MAP_LINK_HDR};
use tracing::{debug, info, warn};

use crate::host_network::{
    ARPHRD_ETHER, ARPHRD_LOOPBACK, Link, NetlinkError,
    tc::{ClsactSide, TcFilter, clsact_filters, delete_clsact, delete_filter, has_clsact},
};

pub(crate) const PROGRAM: &str = "nd_tc_ingress";
/// Priority of our netlink filter: fixed, so a restarted agent recognises a killed one's.
/// Lower runs first; the kernel numbers filters added without one from 49152 down.
pub(crate) const PRIORITY: u16 = 0x4e44;
/// Handle of our netlink filter (with [`PRIORITY`] and [`PROGRAM`], what marks it ours).
pub(crate) const HANDLE: u32 = 0x4e44;

/// How the classifier is attached (`node-diag run --tc-attach`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum AttachMode {
    /// TCX where the kernel has it (6.6+), else a netlink filter under `clsact`.
    #[default]
    Auto,
    /// Always a netlink filter under `clsact`: the pre-6.6 path, for testing it and for
    /// kernels whose TCX misbehaves.
    Netlink,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum TcError {
    #[error("eBPF program {PROGRAM} is missing from the object")]
    Missing,
    #[error("loading {PROGRAM}: {0}")]
    Load(#[from] ProgramError),
}

/// How one interface got attached.
#[derive(Debug, Clone, Copy)]
enum Via {
    Tcx,
    Netlink,
}

impl Via {
    fn as_str(self) -> &'static str {
        match self {
            Via::Tcx => "tcx",
            Via::Netlink => "netlink",
        }
    }
}

struct Attached {
    name: String,
    link: SchedClassifierLinkId,
    via: Via,
}

pub(crate) struct TcIngress {
    mode: AttachMode,
    attached: HashMap<u32, Attached>,
    /// Interfaces that refused the attachment, so the warning is given once.
    failed: HashMap<u32, String>,
    /// `clsact` qdiscs this agent added, or took over from a killed predecessor, by
    /// ifindex: deleted on exit when empty.
    owned_clsact: HashMap<u32, String>,
    /// The classifier's link-layer header lengths by ifindex (`MAP_LINK_HDR`); `None`
    /// when the object has no such map (the classifier then reads every packet through
    /// its helper).
    link_hdr: Option<Array<MapData, u32>>,
}

/// The link-layer header the classifier may expect on a link of ARPHRD type
/// `link_type`: an Ethernet header on Ethernet devices (veth, vxlan, geneve, bridges,
/// NICs), none assumed elsewhere (WireGuard and IPIP have none; the classifier reads those
/// packets relative to their network header, which holds everywhere).
fn link_header_len(link_type: u16) -> u32 {
    if link_type == ARPHRD_ETHER {
        ETH_HLEN
    } else {
        0
    }
}

fn program(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, TcError> {
    Ok(ebpf
        .program_mut(PROGRAM)
        .ok_or(TcError::Missing)?
        .try_into()?)
}

impl TcIngress {
    /// Loads the classifier; attachments follow with [`TcIngress::sync`].
    pub(crate) fn load(ebpf: &mut Ebpf, mode: AttachMode) -> Result<Self, TcError> {
        program(ebpf)?.load()?;
        let link_hdr = ebpf
            .take_map(MAP_LINK_HDR)
            .and_then(|map| Array::try_from(map).ok());
        Ok(Self {
            mode,
            attached: HashMap::new(),
            failed: HashMap::new(),
            owned_clsact: HashMap::new(),
            link_hdr,
        })
    }

    /// Tells the classifier the link-layer header of interface `index` (0: none
    /// assumed). Set before attaching, and cleared when the interface goes, since its
    /// ifindex may come back on a link of another type.
    fn set_link_header(&mut self, index: u32, len: u32) {
        let Some(map) = self.link_hdr.as_mut() else {
            return;
        };
        if index >= LINK_MAP_ENTRIES {
            return;
        }
        if let Err(e) = map.set(index, len, 0) {
            // The helper path reads the packet correctly whatever this holds.
            debug!(index, error = %e, "cannot set the classifier's link header length");
        }
    }

    /// Attaches to every interface in `links` not attached yet, except those in `skip`
    /// (the pods' veths), and detaches from the ones gone. An interface attached before it
    /// was known to be skipped (a pod's veth whose namespace showed up later) stays
    /// attached: detaching would leave its clsact behind.
    pub(crate) fn sync(&mut self, ebpf: &mut Ebpf, links: &[Link], skip: &HashSet<u32>) {
        let Ok(prog) = program(ebpf) else { return };
        let present: HashMap<u32, &Link> = links
            .iter()
            .filter(|l| l.link_type != ARPHRD_LOOPBACK && !l.name.is_empty())
            .map(|l| (l.index, l))
            .collect();
        let gone: Vec<u32> = self
            .attached
            .keys()
            .filter(|i| !present.contains_key(i))
            .copied()
            .collect();
        for index in gone {
            self.set_link_header(index, 0);
            if let Some(gone) = self.attached.remove(&index) {
                // The kernel already dropped the attachment with the interface.
                let _ = prog.detach(gone.link);
                debug!(interface = %gone.name, "interface gone; TC ingress detached");
            }
        }
        self.failed.retain(|i, _| present.contains_key(i));
        self.owned_clsact.retain(|i, _| present.contains_key(i));
        for (index, link) in present {
            if self.attached.contains_key(&index)
                || self.failed.contains_key(&index)
                || skip.contains(&index)
            {
                continue;
            }
            if remove_leftovers(index, &link.name) {
                self.owned_clsact.insert(index, link.name.clone());
            }
            self.set_link_header(index, link_header_len(link.link_type));
            match attach(prog, self.mode, index, &link.name) {
                Ok((id, via, created_clsact)) => {
                    info!(interface = %link.name, via = via.as_str(), "TC ingress attached");
                    if created_clsact {
                        self.owned_clsact.insert(index, link.name.clone());
                    }
                    self.attached.insert(
                        index,
                        Attached {
                            name: link.name.clone(),
                            link: id,
                            via,
                        },
                    );
                }
                Err(e) => {
                    // A vanished or unsupported interface costs that interface only.
                    warn!(interface = %link.name, error = %e, "TC ingress attach failed; frag-needed received there is not seen");
                    self.failed.insert(index, link.name.clone());
                }
            }
        }
    }

    /// Whether the classifier is attached to some interface.
    pub(crate) fn attached_any(&self) -> bool {
        !self.attached.is_empty()
    }

    /// Checks that each attachment the agent holds is still in the kernel: TCX's
    /// program list of the interface (`bpftool link detach` or another tool's
    /// `BPF_LINK_DETACH` empties the link), or our netlink filter among the interface's
    /// (`tc filter del`, a deleted `clsact`). One that is gone is moved to the failed
    /// interfaces, so it reads 0 and is not attached again behind the back of whoever
    /// removed it (an agent restart attaches it again). Returns the interfaces lost.
    /// An interface that cannot be asked (gone meanwhile) is left to the next sync.
    pub(crate) fn verify(&mut self, ebpf: &mut Ebpf) -> Vec<String> {
        let Ok(prog) = program(ebpf) else {
            return Vec::new();
        };
        let ours = prog.info().map(|i| i.id()).ok();
        let mut lost = Vec::new();
        for (&index, attached) in &self.attached {
            let present = match attached.via {
                Via::Tcx => SchedClassifier::query_tcx(&attached.name, TcAttachType::Ingress)
                    .map(|(_, programs)| {
                        ours.is_none_or(|id| programs.iter().any(|p| p.id() == id))
                    })
                    .map_err(|e| e.to_string()),
                Via::Netlink => clsact_filters(index, ClsactSide::Ingress)
                    .map(|filters| filters.iter().any(is_ours))
                    .map_err(|e| e.to_string()),
            };
            match present {
                Ok(true) => {}
                Ok(false) => lost.push(index),
                Err(e) => {
                    debug!(interface = %attached.name, error = %e, "cannot check the TC attachment")
                }
            }
        }
        let mut names = Vec::new();
        for index in lost {
            let Some(gone) = self.attached.remove(&index) else {
                continue;
            };
            // Forgets aya's record of it; the kernel has nothing left to detach.
            let _ = prog.detach(gone.link);
            warn!(interface = %gone.name, via = gone.via.as_str(), "TC ingress attachment removed from outside the agent; frag-needed received there is not seen until the agent restarts");
            self.failed.insert(index, gone.name.clone());
            names.push(gone.name);
        }
        names
    }

    /// Each interface the classifier is attached to (`true`) or failed to attach to or
    /// lost (`false`), by name.
    pub(crate) fn attachments(&self) -> Vec<(&str, bool)> {
        let mut all: Vec<(&str, bool)> = self
            .attached
            .values()
            .map(|a| (a.name.as_str(), true))
            .chain(self.failed.values().map(|name| (name.as_str(), false)))
            .collect();
        all.sort_unstable();
        all
    }

    /// Deletes the filters of ours a killed agent left on `links` (and the `clsact` it
    /// added, when that leaves it empty), without attaching: for an agent that attaches
    /// only later, so that a predecessor's filters do not run on every packet meanwhile.
    pub(crate) fn remove_leftovers(&mut self, links: &[Link]) {
        for link in links
            .iter()
            .filter(|l| l.link_type != ARPHRD_LOOPBACK && !l.name.is_empty())
        {
            if remove_leftovers(link.index, &link.name) {
                remove_clsact_if_empty(link.index, &link.name);
            }
        }
    }

    /// Detaches from every interface, then deletes the `clsact` qdiscs this agent owns
    /// that hold no filter any more. Called on a clean exit, before the programs unload.
    pub(crate) fn detach_all(&mut self, ebpf: &mut Ebpf) {
        if let Ok(prog) = program(ebpf) {
            for (_, attached) in self.attached.drain() {
                if let Err(e) = prog.detach(attached.link) {
                    // Usually the interface went away in the meantime.
                    debug!(interface = %attached.name, error = %e, "TC ingress detach failed");
                }
            }
        }
        for (index, name) in self.owned_clsact.drain() {
            remove_clsact_if_empty(index, &name);
        }
    }
}

/// Attaches `prog` to interface `name` (ifindex `index`): TCX first in `Auto` mode, else
/// (or when TCX fails) a netlink filter under `clsact`, added when missing. Returns the
/// link, how it was made, and whether this call added the `clsact`.
fn attach(
    prog: &mut SchedClassifier,
    mode: AttachMode,
    index: u32,
    name: &str,
) -> Result<(SchedClassifierLinkId, Via, bool), ProgramError> {
    if mode == AttachMode::Auto {
        // Tried rather than decided by kernel version, so backports count.
        match prog.attach_with_options(
            name,
            TcAttachType::Ingress,
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        ) {
            Ok(id) => return Ok((id, Via::Tcx, false)),
            Err(e) => debug!(interface = %name, error = %e, "no TCX; attaching through clsact"),
        }
    }
    // Fails when a clsact is already there (another tool's, or ours taken over).
    let created = tc::qdisc_add_clsact(name).is_ok();
    let options = NlOptions {
        priority: PRIORITY,
        handle: TcHandle::from(HANDLE),
        ..NlOptions::default()
    };
    match prog.attach_with_options(
        name,
        TcAttachType::Ingress,
        TcAttachOptions::Netlink(options),
    ) {
        Ok(id) => Ok((id, Via::Netlink, created)),
        Err(e) => {
            if created {
                // Nothing of ours is in it: leave the interface as it was.
                if let Err(e) = delete_clsact(index) {
                    warn!(interface = %name, error = %e, "cannot delete the clsact qdisc just added");
                }
            }
            Err(e)
        }
    }
}

/// Whether a dumped filter is one this agent attaches (see the module rules).
fn is_ours(filter: &TcFilter) -> bool {
    filter.kind == "bpf"
        && filter.priority() == PRIORITY
        && filter.handle() == HANDLE
        && filter.bpf_name.as_deref() == Some(PROGRAM)
}

/// Deletes the filters of ours a killed agent left on interface `index`. Returns whether
/// its `clsact` is to be owned: some were deleted and it holds no other filter.
fn remove_leftovers(index: u32, name: &str) -> bool {
    let filters = match clsact_filters(index, ClsactSide::Ingress) {
        Ok(filters) => filters,
        Err(e) => {
            warn!(interface = %name, error = %e, "cannot list TC filters; filters a previous agent left there stay");
            return false;
        }
    };
    let mut removed = 0;
    for filter in filters.iter().filter(|f| is_ours(f)) {
        match delete_filter(filter) {
            Ok(()) => removed += 1,
            Err(e) => {
                warn!(interface = %name, error = %e, "cannot delete a TC filter a previous agent left")
            }
        }
    }
    if removed == 0 {
        return false;
    }
    info!(interface = %name, removed, "deleted TC filters a previous agent left");
    match clsact_empty(index) {
        Ok(empty) => empty,
        Err(e) => {
            warn!(interface = %name, error = %e, "cannot list TC filters; the clsact qdisc will be kept");
            false
        }
    }
}

/// Whether interface `index`'s `clsact` holds no filter in either direction.
fn clsact_empty(index: u32) -> Result<bool, NetlinkError> {
    for side in ClsactSide::BOTH {
        if !clsact_filters(index, side)?.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}

fn remove_clsact_if_empty(index: u32, name: &str) {
    let result = (|| {
        if !has_clsact(index)? {
            return Ok(false);
        }
        if !clsact_empty(index)? {
            info!(interface = %name, "clsact qdisc kept: it holds other filters");
            return Ok(false);
        }
        delete_clsact(index)?;
        Ok::<_, NetlinkError>(true)
    })();
    match result {
        Ok(true) => info!(interface = %name, "clsact qdisc deleted"),
        Ok(false) => {}
        Err(e) => warn!(interface = %name, error = %e, "cannot delete the clsact qdisc"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_priority_handle_and_name_together_are_ours() {
        let ours = |kind, prio, handle, name| is_ours(&TcFilter::fixture(kind, prio, handle, name));
        assert!(ours("bpf", PRIORITY, HANDLE, Some(PROGRAM)));
        // Another tool's program, or ours loaded by hand at another place, is not.
        assert!(!ours("bpf", PRIORITY, HANDLE, Some("cil_from_netdev")));
        assert!(!ours("bpf", PRIORITY, HANDLE, None));
        assert!(!ours("bpf", 49152, HANDLE, Some(PROGRAM)));
        assert!(!ours("bpf", PRIORITY, 1, Some(PROGRAM)));
        assert!(!ours("u32", PRIORITY, HANDLE, None));
        // The kernel's per-priority entry (handle 0) is not a filter to delete.
        assert!(!ours("bpf", PRIORITY, 0, None));
    }

    #[test]
    fn only_ethernet_links_are_read_past_an_ethernet_header() {
        assert_eq!(link_header_len(ARPHRD_ETHER), 14);
        // ARPHRD_NONE (WireGuard, TUN), ARPHRD_TUNNEL (IPIP), ARPHRD_IPGRE: no header to
        // skip, so the classifier's helper reads relative to the network header.
        for l3 in [65534, 768, 778] {
            assert_eq!(link_header_len(l3), 0);
        }
    }
}
