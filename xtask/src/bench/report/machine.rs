//! The machine a bench ran on, as the report records it: the ratios mean little
//! without its CPUs, memory, kernel and load.

use std::fs;

use serde::Serialize;

/// The machine the bench ran on.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Machine {
    pub nproc: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub cpu_model: String,
    /// `/proc/loadavg` when the bench started.
    pub loadavg_start: String,
    /// `/proc/loadavg` when it ended.
    pub loadavg_end: String,
}

impl Machine {
    pub(crate) fn describe() -> Self {
        let read = |path: &str| fs::read_to_string(path).unwrap_or_default();
        let meminfo = read("/proc/meminfo");
        let mem_kib: f64 = meminfo
            .lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let cpu_model = read("/proc/cpuinfo")
            .lines()
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == "model name").then(|| value.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        Self {
            nproc: std::thread::available_parallelism().map_or(0, usize::from),
            memory_gib: mem_kib / (1024.0 * 1024.0),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
            cpu_model,
            loadavg_start: loadavg(),
            loadavg_end: String::new(),
        }
    }
}

pub(super) fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
