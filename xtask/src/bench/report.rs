//! The bench's results: medians and spreads of the pair ratios, a markdown table judged
//! against the targets (with the per-program cost per workload and the eBPF maps below
//! it), a JSON file.

mod document;
mod machine;
mod programs;
mod row;
mod stats;
mod targets;

pub(super) use self::{
    document::{Report, progress_line},
    machine::Machine,
};
