//! The kernel side: everything that talks to eBPF, tracefs and BTF.
//!
//! - [`loader`] loads the embedded object, fills the programs' read-only `Config` from the
//!   running kernel's tracepoint layouts ([`tracefs`]) and struct offsets ([`btf`]), and
//!   attaches the programs of the [`hooks`] table; [`rewrite`] first rewrites the object's
//!   marked calls for this kernel: kernel-function calls, and settings taken as immediates.
//! - [`tc`] attaches the TC ingress classifier to the node's interfaces as they come and go.
//! - [`ring`] drains verdict events from the ring buffer, their kinds decoded once
//!   ([`event`]); [`maps`] reads the aggregate maps
//!   (counts keyed by the kernel's own numbers) and writes the maps the agent owns.
//! - [`hook_programs`] lists the programs other software attached at a device's TC
//!   hook, to name the one behind a TC drop.
//! - [`caps`] says which capabilities the process has; [`ebpf_log`] drains the programs'
//!   own log records (aya-log) into `tracing` when `--ebpf-log` asks for them.
//!
//! Nothing here names things for people or knows about metrics: that is `findings` and
//! `agent`, which consume what this module reads.

pub(crate) mod batch;
pub(crate) mod btf;
pub(crate) mod caps;
pub(crate) mod drop_family;
pub(crate) mod drop_sites;
pub(crate) mod ebpf_log;
pub(crate) mod event;
pub(crate) mod hook_programs;
pub(crate) mod hooks;
pub(crate) mod loader;
pub(crate) mod maps;
pub(crate) mod memlock;
pub(crate) mod rewrite;
pub(crate) mod ring;
pub(crate) mod tc;
pub(crate) mod tracefs;
