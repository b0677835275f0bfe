//! Effective Linux capabilities of this process, read from `/proc/self/status`.

pub(crate) const CAP_NET_ADMIN: u32 = 12;
/// Raw sockets: the agent's path probes send ICMP echo requests on one.
pub(crate) const CAP_NET_RAW: u32 = 13;
pub(crate) const CAP_SYS_ADMIN: u32 = 21;
pub(crate) const CAP_SYS_RESOURCE: u32 = 24;
pub(crate) const CAP_PERFMON: u32 = 38;
pub(crate) const CAP_BPF: u32 = 39;

pub(crate) fn name(cap: u32) -> &'static str {
    match cap {
        CAP_NET_ADMIN => "CAP_NET_ADMIN",
        CAP_NET_RAW => "CAP_NET_RAW",
        CAP_SYS_ADMIN => "CAP_SYS_ADMIN",
        CAP_SYS_RESOURCE => "CAP_SYS_RESOURCE",
        CAP_PERFMON => "CAP_PERFMON",
        CAP_BPF => "CAP_BPF",
        _ => "CAP_?",
    }
}

/// The effective capability mask, 0 when it cannot be read.
pub(crate) fn effective() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_cap_eff(&s))
        .unwrap_or(0)
}

pub(crate) fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

pub(crate) fn has(mask: u64, cap: u32) -> bool {
    mask & (1u64 << cap) != 0
}

/// Capabilities the agent needs to load and attach tracepoint programs and read tracefs.
/// CAP_SYS_ADMIN covers BPF and PERFMON on every kernel.
pub(crate) fn missing_for_agent(mask: u64) -> Vec<&'static str> {
    if has(mask, CAP_SYS_ADMIN) {
        return Vec::new();
    }
    [CAP_BPF, CAP_PERFMON]
        .into_iter()
        .filter(|c| !has(mask, *c))
        .map(name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_reports_missing() {
        let root = parse_cap_eff("Name:\tx\nCapEff:\t000001ffffffffff\n").unwrap();
        assert!(missing_for_agent(root).is_empty());
        assert_eq!(missing_for_agent(0), vec!["CAP_BPF", "CAP_PERFMON"]);
        assert_eq!(missing_for_agent(1 << CAP_BPF), vec!["CAP_PERFMON"]);
    }
}
