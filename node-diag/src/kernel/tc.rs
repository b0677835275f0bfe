//! TC ingress attachment on this node's interfaces (the namespace the agent runs in, which
//! holds the underlay, the overlay and the pods' node-side veths). Interfaces are attached
//! as they appear and forgotten as they go; on kernels with TCX (6.6+) every attachment is
//! a link owned by this process, so nothing outlives the agent.

use std::collections::HashMap;

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData},
    programs::{
        ProgramError, SchedClassifier, TcAttachType,
        tc::{self, SchedClassifierLinkId},
    },
};
use tracing::{debug, info, warn};

use crate::host_network::Link;

pub const PROGRAM: &str = "nd_tc_ingress";
const ARPHRD_ETHER: u16 = 1;
const ARPHRD_LOOPBACK: u16 = 772;

#[derive(Debug, thiserror::Error)]
pub enum TcError {
    #[error("eBPF program {PROGRAM} is missing from the object")]
    Missing,
    #[error("loading {PROGRAM}: {0}")]
    Load(#[from] ProgramError),
}

pub struct TcIngress {
    attached: HashMap<u32, (String, SchedClassifierLinkId)>,
    /// Interfaces that refused the attachment, so the warning is given once.
    failed: HashMap<u32, String>,
}

fn program(ebpf: &mut Ebpf) -> Result<&mut SchedClassifier, TcError> {
    Ok(ebpf
        .program_mut(PROGRAM)
        .ok_or(TcError::Missing)?
        .try_into()?)
}

impl TcIngress {
    /// Loads the classifier; attachments follow with [`TcIngress::sync`].
    pub fn load(ebpf: &mut Ebpf) -> Result<Self, TcError> {
        program(ebpf)?.load()?;
        Ok(Self {
            attached: HashMap::new(),
            failed: HashMap::new(),
        })
    }

    /// Attaches to every interface in `links` not attached yet and detaches from the
    /// ones gone. `l3` gets the network-header offset of interfaces without Ethernet
    /// framing.
    pub fn sync(
        &mut self,
        ebpf: &mut Ebpf,
        links: &[Link],
        l3: &mut BpfHashMap<MapData, u32, u32>,
    ) {
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
            if let Some((name, link)) = self.attached.remove(&index) {
                // The kernel already dropped the attachment with the interface.
                let _ = prog.detach(link);
                let _ = l3.remove(&index);
                debug!(interface = %name, "interface gone; TC ingress detached");
            }
        }
        self.failed.retain(|i, _| present.contains_key(i));
        for (index, link) in present {
            if self.attached.contains_key(&index) || self.failed.contains_key(&index) {
                continue;
            }
            if link.link_type != ARPHRD_ETHER {
                let _ = l3.insert(index, 0, 0);
            }
            match attach(prog, &link.name) {
                Ok(id) => {
                    info!(interface = %link.name, "TC ingress attached");
                    self.attached.insert(index, (link.name.clone(), id));
                }
                Err(e) => {
                    // A vanished or unsupported interface costs that interface only.
                    warn!(interface = %link.name, error = %e, "TC ingress attach failed; frag-needed received there is not seen");
                    self.failed.insert(index, link.name.clone());
                }
            }
        }
    }
}

fn attach(prog: &mut SchedClassifier, name: &str) -> Result<SchedClassifierLinkId, ProgramError> {
    match prog.attach(name, TcAttachType::Ingress) {
        Ok(id) => Ok(id),
        // Kernels before 6.6 have no TCX and attach through a clsact qdisc.
        Err(first) => match tc::qdisc_add_clsact(name) {
            Ok(()) => prog.attach(name, TcAttachType::Ingress),
            Err(_) => Err(first),
        },
    }
}
