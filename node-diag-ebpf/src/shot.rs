//! Drops by other eBPF programs on kernels without drop reasons (before 5.17). Newer
//! kernels free a packet a tc classifier shot with `TC_INGRESS`/`TC_EGRESS` and one a
//! `cgroup_skb` egress program denied with `BPF_CGROUP_EGRESS`; older ones free it in
//! `__netif_receive_skb_core`, `__dev_queue_xmit` or `ip_finish_output`, which drop for
//! other causes too. So fexit programs on the functions that run those programs record,
//! per CPU, the packet just condemned ([`SHOT`]); `skb`'s `nd_kfree_site` gives such a
//! site its reason only when the freed packet is that one (see [`site_needs`]).
//!
//! The agent loads these only beside `nd_kfree_site`, and picks the `tcf_classify`
//! program whose argument count matches the kernel's prototype (5.10 has four, 5.14+
//! five: the return value follows them); before 5.14 clsact ingress runs
//! `tcf_classify_ingress` instead, which has its own program.

use aya_ebpf::{macros::fexit, programs::FExitContext};
use node_diag_common::{Shot, site_needs};

use crate::{config::now, maps::SHOT};

/// `TC_ACT_SHOT`: drop the packet.
const TC_ACT_SHOT: i32 = 2;
/// `BPF_CGROUP_INET_EGRESS` (`enum bpf_attach_type` before 5.15, `enum
/// cgroup_bpf_attach_type`'s `CGROUP_INET_EGRESS` after: both 1).
const CGROUP_INET_EGRESS: u32 = 1;
/// `NET_XMIT_CN`: congestion notified, the packet still sent.
const NET_XMIT_CN: i32 = 2;

/// `tcf_classify(skb, tp, res, compat_mode)` (5.10–5.13: clsact egress).
#[fexit(function = "tcf_classify")]
pub fn nd_tc_shot4(ctx: FExitContext) -> i32 {
    classified(ctx.arg(0), ctx.arg::<u64>(4) as i32);
    0
}

/// `tcf_classify(skb, block, tp, res, compat_mode)` (5.14+: clsact ingress and egress).
#[fexit(function = "tcf_classify")]
pub fn nd_tc_shot5(ctx: FExitContext) -> i32 {
    classified(ctx.arg(0), ctx.arg::<u64>(5) as i32);
    0
}

/// `tcf_classify_ingress(skb, ingress_block, tp, res, compat_mode)` (5.7–5.13: clsact
/// ingress; 5.14 folded it into `tcf_classify`).
#[fexit(function = "tcf_classify_ingress")]
pub fn nd_tc_shot_ingress(ctx: FExitContext) -> i32 {
    classified(ctx.arg(0), ctx.arg::<u64>(5) as i32);
    0
}

#[inline(always)]
fn classified(skb: u64, verdict: i32) {
    if verdict == TC_ACT_SHOT {
        mark(skb, site_needs::TC_SHOT);
    }
}

/// `__cgroup_bpf_run_filter_skb(sk, skb, type)`: egress programs' verdict is 0 (pass),
/// `NET_XMIT_CN` (pass, congestion), `NET_XMIT_DROP` or `-EPERM` (drop).
#[fexit(function = "__cgroup_bpf_run_filter_skb")]
pub fn nd_cgroup_shot(ctx: FExitContext) -> i32 {
    let kind = ctx.arg::<u64>(2) as u32;
    let ret = ctx.arg::<u64>(3) as i32;
    if kind == CGROUP_INET_EGRESS && ret != 0 && ret != NET_XMIT_CN {
        mark(ctx.arg(1), site_needs::CGROUP_EGRESS_DENIED);
    }
    0
}

#[inline(always)]
fn mark(skb: u64, hook: u32) {
    if let Some(slot) = SHOT.get_ptr_mut(0) {
        // SAFETY: this CPU's slot, from the map; nothing else on this CPU runs between
        // the hooks (softirq or bottom halves disabled).
        unsafe {
            *slot = Shot {
                skb,
                at_ns: now(),
                hook,
                _pad: 0,
            }
        };
    }
}

/// Whether `skb` is the packet last condemned on this CPU by a program of a `needs` kind;
/// the mark is consumed either way once it names `skb`.
#[inline(always)]
pub fn condemned(skb: u64, needs: u32) -> bool {
    let Some(slot) = SHOT.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's slot, from the map.
    let shot = unsafe { &mut *slot };
    if shot.skb != skb {
        return false;
    }
    shot.skb = 0;
    shot.hook & needs != 0 && now().wrapping_sub(shot.at_ns) < node_diag_common::SHOT_MAX_AGE_NS
}
