//! The agent's own process metrics under Prometheus's standard names
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds`), read from `/proc/self` at each scrape, as the Go and
//! Python clients' process collectors do. A file that cannot be read leaves its metrics
//! out of that scrape rather than failing it.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

/// Reads `/proc/self` on every scrape.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

/// What `/proc/self/stat` says, in the kernel's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// utime + stime, in clock ticks.
    cpu_ticks: u64,
    /// Since boot, in clock ticks.
    start_ticks: u64,
    vsize_bytes: u64,
}

/// Fields of `/proc/<pid>/stat` after the command (which may hold spaces and parens,
/// hence the last `)`): field 3 (`state`) is index 0.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: field(14)? + field(15)?,
        start_ticks: field(22)?,
        vsize_bytes: field(23)?,
    })
}

/// `VmRSS` of `/proc/self/status`, in bytes (the file says kB).
fn parse_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The soft limit on open files from `/proc/self/limits` (`None` when unlimited).
fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `btime` of `/proc/stat`: the boot time, in seconds since the epoch.
fn parse_btime(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

fn clock_ticks() -> Option<u64> {
    // SAFETY: sysconf takes a plain integer and touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0)
}

fn open_fds() -> Option<u64> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    // The listing includes the descriptor reading it.
    Some((entries.count() as u64).saturating_sub(1))
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), std::fmt::Error> {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stat = read("/proc/self/stat").and_then(|s| parse_stat(&s));
        let ticks = clock_ticks();
        if let (Some(stat), Some(ticks)) = (stat, ticks) {
            counter(
                &mut encoder,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                stat.cpu_ticks as f64 / ticks as f64,
            )?;
            if let Some(btime) = read("/proc/stat").and_then(|s| parse_btime(&s)) {
                gauge(
                    &mut encoder,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds",
                    btime as f64 + stat.start_ticks as f64 / ticks as f64,
                )?;
            }
        }
        if let Some(stat) = stat {
            gauge(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stat.vsize_bytes as f64,
            )?;
        }
        if let Some(rss) = read("/proc/self/status").and_then(|s| parse_rss(&s)) {
            gauge(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                rss as f64,
            )?;
        }
        if let Some(fds) = open_fds() {
            gauge(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors",
                fds as f64,
            )?;
        }
        if let Some(max) = read("/proc/self/limits").and_then(|s| parse_max_fds(&s)) {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit)",
                max as f64,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_after_the_command() {
        // A command with a space and a paren, as `comm` may hold.
        let line = "4242 (node (diag) x) S 1 4242 4242 0 -1 4194560 1200 0 0 0 150 37 0 0 20 0 9 0 81234 2147483648 3300 18446744073709551615 1 1 0 0 0 0 0 4096 1260 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                cpu_ticks: 187,
                start_ticks: 81234,
                vsize_bytes: 2_147_483_648,
            })
        );
        assert_eq!(parse_stat("4242 (x) S 1"), None);
    }

    #[test]
    fn rss_limits_and_boot_time() {
        assert_eq!(
            parse_rss("Name:\tnode-diag\nVmRSS:\t   13312 kB\nVmData: 1 kB\n"),
            Some(13312 * 1024)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax open files            1024                 524288               files     \n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(
            parse_max_fds(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
        assert_eq!(
            parse_btime("cpu 1 2 3\nbtime 1764900000\nprocesses 9\n"),
            Some(1_764_900_000)
        );
    }

    #[test]
    fn this_process_is_measured() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let value = |name: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in {text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert!(value("process_open_fds") >= 3.0, "{text}");
        assert!(value("process_max_fds") >= value("process_open_fds"));
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        assert!(value("process_cpu_seconds_total") >= 0.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(
            start <= now + 1.0 && start > now - 3600.0,
            "{start} vs {now}"
        );
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
    }
}
