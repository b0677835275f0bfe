//! [`FlowKey`] address handling shared by the socket reads (`kernel`), the packet parsers
//! (`packet`) and the TC classifier: below all of them, so that none depends on another
//! for it.

use node_diag_common::FlowKey;

/// Stores an IPv4 address in the first four bytes of a [`FlowKey`] address.
#[inline(always)]
pub fn set_v4(dst: &mut [u8; 16], v4: [u8; 4]) {
    dst[0] = v4[0];
    dst[1] = v4[1];
    dst[2] = v4[2];
    dst[3] = v4[3];
}

/// Turns `flow` around in place: the flow seen from its other end.
#[inline(always)]
pub fn reverse(flow: &mut FlowKey) {
    core::mem::swap(&mut flow.saddr, &mut flow.daddr);
    core::mem::swap(&mut flow.sport, &mut flow.dport);
}
