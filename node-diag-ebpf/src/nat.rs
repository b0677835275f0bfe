//! The NAT join: a packet a hook sees after this node's NAT (kube-proxy's DNAT of a
//! Service address to a backend, a masquerade) no longer carries the flow its socket
//! knows. Its conntrack entry does: the original-direction tuple is the flow as the
//! connecting socket opened it, the reply tuple's source is where NAT sent it. Evidence is
//! filed under the original flow so the verdicts find it, and the translation goes to
//! [`NAT`] for the agent to name the backend.

use node_diag_common::{FlowKey, NatInfo, ipproto};

use crate::{
    config::{config, now},
    kernel::{kread, kread_into},
    maps::NAT,
};

/// `enum ip_conntrack_info` values from `IP_CT_IS_REPLY` on are the reply direction.
const IP_CT_IS_REPLY: u64 = 3;
/// `skb->_nfct` keeps the ctinfo in its low bits (`NFCT_INFOMASK`).
const NFCT_INFOMASK: u64 = 7;

/// Rewrites `flow` (a TCP packet's flow, connecting side first) to its conntrack entry's
/// original tuple and records the translation when NAT changed the destination.
/// `reply`: the packet travels in the reply direction (a SYN-ACK), so its entry's
/// original direction is still the connecting side's only if conntrack agrees.
/// `None`: no entry (no conntrack, an untracked packet) or a direction mismatch; `flow`
/// is then left as the packet had it.
#[inline(never)]
pub fn nat_join(skb: u64, flow: &mut FlowKey, netns: u32, reply: bool) -> Option<()> {
    let nfct_off = config!(skb_nfct);
    if nfct_off == 0 {
        return None;
    }
    let nfct = kread::<u64>(skb, nfct_off)?;
    let ct = nfct & !NFCT_INFOMASK;
    if ct == 0 || ((nfct & NFCT_INFOMASK) >= IP_CT_IS_REPLY) != reply {
        return None;
    }
    let orig = ct + config!(ct_orig) as u64;
    let family = kread::<u16>(orig, config!(ct_l3num) as u32)?;
    if family != flow.family || kread::<u8>(orig, config!(ct_protonum) as u32)? != ipproto::TCP {
        return None;
    }
    let reply_tuple = ct + config!(ct_reply) as u64;
    let mut nat = NatInfo {
        last_ns: now(),
        family,
        netns,
        ..NatInfo::default()
    };
    kread_into(&mut nat.backend, reply_tuple, config!(ct_src_u3) as u32)?;
    nat.backend_port = u16::from_be(kread::<u16>(reply_tuple, config!(ct_src_port) as u32)?);
    kread_into(&mut flow.saddr, orig, config!(ct_src_u3) as u32)?;
    kread_into(&mut flow.daddr, orig, config!(ct_dst_u3) as u32)?;
    flow.sport = u16::from_be(kread::<u16>(orig, config!(ct_src_port) as u32)?);
    flow.dport = u16::from_be(kread::<u16>(orig, config!(ct_dst_port) as u32)?);
    if nat.backend != flow.daddr || nat.backend_port != flow.dport {
        // An entry that cannot be stored loses only the backend's name, not the evidence.
        let _ = NAT.insert(flow, &nat, 0);
    }
    Some(())
}
