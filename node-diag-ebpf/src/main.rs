//! node-diag's kernel programs: tracepoints and fentry/fexit (no kprobes), one module per
//! hook family.
//!
//! - `sock`: `sock:inet_sock_set_state` tracks connecting sockets in [`maps::CONNECTS`];
//!   the raw tracepoint `inet_sk_error_report` turns a socket error into a verdict event.
//! - `tcp`: `tcp:tcp_retransmit_skb` counts SYN retransmits per flow and reports a timeout
//!   at the configured threshold; `tcp:tcp_receive_reset`/`tcp:tcp_send_reset` count resets.
//! - `skb`: `skb:kfree_skb` aggregates every drop by reason/netns/device and remembers
//!   which flow's SYN was dropped, so a timeout verdict carries its kernel evidence.
//! - `icmp`: `icmp:icmp_send` remembers the ICMP errors this kernel generated per flow.
//! - `shot` (kernels without drop reasons only): fexit on `tcf_classify` and
//!   `__cgroup_bpf_run_filter_skb` marks the packet another eBPF program condemned, so
//!   `skb` names its drop `TC_INGRESS`/`TC_EGRESS`/`BPF_CGROUP_EGRESS` as newer kernels do.
//! - `tc`: a TC ingress classifier on the node's interfaces remembers ICMP frag-needed /
//!   packet-too-big received per flow. The agent attaches it only while trouble shows
//!   (by default), as any TC ingress program costs every packet the ingress step; each
//!   event's `window_ms` lets it tell "none received" from "not watched".
//!
//! `skb` also records DF packets dropped as too big (`PKT_TOO_BIG`) per flow and egress
//! device, and frag-needed dropped by netfilter; `tcp` counts full-size retransmits per
//! socket. Together they make the PMTUD black-hole verdict.
//!
//! `nat` files the evidence `skb` and `icmp` see on a packet this node translated (a
//! Service address DNATed to a backend) under the flow its conntrack entry started as,
//! the one the socket knows, and records the translation in [`maps::NAT`].
//!
//! What the hooks share: `maps` (every map), `config` (the read-only global `CONFIG`,
//! the clock, the namespace scope check), `kernel` (tracepoint fields and kernel struct
//! reads), `packet` (IP/TCP/ICMP parsing of an skb), `flow` (flow key addresses, below
//! both) and `emit` (verdict events, counters,
//! the per-flow evidence update, and the programs' only log calls). Where the kernel has
//! the `bpf_rdonly_cast` kfunc (6.2+), `kernel` and `packet` read sockets and packet
//! headers with plain loads; before that, with probe reads. The agent picks one at load
//! time (`CONFIG`'s `cast_*` ids) and rewrites the kfunc's marker calls to match.
//!
//! Events reach user space only for verdicts ([`node_diag_common::Event`]); everything
//! else is aggregated in maps. Field offsets and kernel struct offsets come from the
//! read-only global `CONFIG`, filled by the agent from tracefs and BTF.
#![no_std]
#![no_main]
// `atomic_xadd`: the BPF target has no atomic read-modify-write methods in `core`.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod config;
mod emit;
mod flow;
mod icmp;
mod kernel;
mod maps;
mod nat;
mod packet;
mod shot;
mod skb;
mod sock;
mod tc;
mod tcp;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// GPL-compatible: bpf_probe_read_kernel is a GPL-only helper.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
