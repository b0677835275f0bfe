//! The release agent as a guarded child process inside node A, and what the bench reads
//! about it: `/proc` (CPU time, RSS), its eBPF programs' run statistics, the memory of
//! its eBPF maps and its HTTP endpoints.

use std::{collections::BTreeMap, fs, path::Path, time::Duration};

use anyhow::{Context as _, Result, bail};
use node_diag_testbed::{Topology, metrics};
use serde::Serialize;
use serde_json::Value;

use super::signal::interrupted;
use crate::cmd;

/// Where the agent listens, inside node A's namespace.
const LISTEN: &str = "127.0.0.1:9464";
/// Where it serves `/findings`: its findings listener, fixed here (the testbed would pick
/// a free port) so the poll's URL is known before the agent starts.
pub(super) const FINDINGS_ADDR: &str = "127.0.0.1:9465";
/// How much of the agent's stderr goes into an error message.
const STDERR_KEEP: usize = 16 * 1024;

/// The testbed's `node-diag run --format json` in node A, with what the bench reads
/// about it; killed on drop if still running.
pub struct Agent<'t> {
    inner: node_diag_testbed::Agent<'t>,
}

impl<'t> Agent<'t> {
    /// Starts the agent in node A with `extra` arguments and waits (at most `timeout`)
    /// for its ready file.
    pub fn start(
        binary: &Path,
        topo: &'t Topology,
        timeout: Duration,
        extra: &[&str],
    ) -> Result<Self> {
        let args: Vec<&str> = ["--findings-listen", FINDINGS_ADDR]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let mut inner = node_diag_testbed::Agent::start(topo, binary, Some(LISTEN), &args)?;
        if let Err(err) = inner.wait_ready_or(timeout, interrupted) {
            let what = if interrupted() {
                "interrupted"
            } else {
                "the agent did not become ready"
            };
            bail!(
                "{what}; its stderr:\n{}\n({})",
                stderr_tail(&inner),
                first_line(&err)
            );
        }
        Ok(Self { inner })
    }

    pub fn pid(&self) -> u32 {
        self.inner.pid()
    }

    /// Lines the agent printed on stdout so far (one per finding printed).
    pub fn stdout_lines(&self) -> u64 {
        self.inner.stdout_lines()
    }

    /// Fails (with its stderr) when the agent has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.inner.exit_status() {
            bail!(
                "the agent exited ({status}) during the bench; its stderr:\n{}",
                stderr_tail(&self.inner)
            );
        }
        Ok(())
    }

    /// A snapshot of the process: CPU time, RSS, peak RSS.
    pub fn sample(&self) -> Result<ProcSample> {
        ProcSample::read(self.pid())
    }

    /// Resets the process's peak RSS (VmHWM) to its current RSS (`clear_refs` 5).
    pub fn reset_peak_rss(&self) -> Result<()> {
        let path = format!("/proc/{}/clear_refs", self.pid());
        fs::write(&path, "5").with_context(|| format!("cannot write {path}"))
    }

    /// The run statistics of the agent's `nd_*` programs, by name.
    pub fn prog_stats(
        &self,
        names: &BTreeMap<u32, ProgName>,
    ) -> Result<BTreeMap<String, RunStats>> {
        prog_stats(self.pid(), names)
    }

    /// The tracepoint each of the agent's programs is attached to, by program name, from
    /// its raw tracepoint links (`tp_name` in their fdinfo); a program attached otherwise
    /// (the TC classifier, a perf-event tracepoint) is left out.
    pub fn prog_tracepoints(
        &self,
        names: &BTreeMap<u32, ProgName>,
    ) -> Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for (_, info) in bpf_fdinfos(self.pid(), "anon_inode:bpf_link")? {
            let Some(prog) = fdinfo_field(&info, "prog_id")
                .and_then(|id| u32::try_from(id).ok())
                .and_then(|id| names.get(&id))
            else {
                continue;
            };
            if let Some(tracepoint) = fdinfo_text(&info, "tp_name") {
                out.insert(prog.name.clone(), tracepoint.to_owned());
            }
        }
        Ok(out)
    }

    /// The eBPF maps the agent holds, with their memory here and at [`TARGET_CPUS`].
    pub fn maps(&self) -> Result<Vec<MapMemory>> {
        maps(self.pid())
    }

    /// `GET /findings`, parsed.
    pub fn findings(&self) -> Result<Vec<Value>> {
        self.inner
            .findings_endpoint()
            .map_err(|e| anyhow::anyhow!("{}", first_line(&e)))
    }

    /// The value of `series` in `GET /metrics`, if exposed.
    pub fn metric(&self, series: &str) -> Result<Option<f64>> {
        let text = self
            .inner
            .metrics_text()
            .map_err(|e| anyhow::anyhow!("{}", first_line(&e)))?;
        Ok(metrics::find_value(&text, series)?)
    }

    /// SIGTERM, then waits up to 10 s (SIGKILL after); fails unless it exited 0.
    pub fn stop(mut self) -> Result<()> {
        let end = self.inner.terminate()?;
        if end.killed {
            bail!(
                "the agent did not exit within 10 s of SIGTERM ({}); its stderr:\n{}",
                end.status,
                stderr_tail(&self.inner)
            );
        }
        if !end.status.success() {
            bail!(
                "the agent exited with {} on SIGTERM; its stderr:\n{}",
                end.status,
                stderr_tail(&self.inner)
            );
        }
        Ok(())
    }
}

/// The last [`STDERR_KEEP`] bytes of the agent's stderr.
fn stderr_tail(agent: &node_diag_testbed::Agent<'_>) -> String {
    let text = agent.stderr();
    let cut = text.len().saturating_sub(STDERR_KEEP);
    let cut = (cut..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    text[cut..].to_owned()
}

/// The first line of an error: the testbed appends the agent's whole output, which the
/// bench shows as a stderr tail instead.
fn first_line(err: &node_diag_testbed::Error) -> String {
    err.to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// CPU time and memory of a process, from `/proc/PID/stat` and `/proc/PID/status`.
#[derive(Debug, Clone, Copy)]
pub struct ProcSample {
    /// utime + stime + cutime + cstime (its waited-for children's), in seconds.
    pub cpu_secs: f64,
    pub rss_kib: u64,
    pub hwm_kib: u64,
}

impl ProcSample {
    pub fn read(pid: u32) -> Result<Self> {
        let stat_path = format!("/proc/{pid}/stat");
        let stat =
            fs::read_to_string(&stat_path).with_context(|| format!("cannot read {stat_path}"))?;
        let cpu_ticks = parse_stat_cpu_ticks(&stat).with_context(|| format!("bad {stat_path}"))?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let hz = if hz > 0 { hz as f64 } else { 100.0 };
        let status_path = format!("/proc/{pid}/status");
        let status = fs::read_to_string(&status_path)
            .with_context(|| format!("cannot read {status_path}"))?;
        let field = |name: &str| {
            status_kib(&status, name).with_context(|| format!("no {name} in {status_path}"))
        };
        Ok(Self {
            cpu_secs: cpu_ticks as f64 / hz,
            rss_kib: field("VmRSS")?,
            hwm_kib: field("VmHWM")?,
        })
    }
}

/// utime + stime + cutime + cstime (fields 14 to 17) from a `/proc/PID/stat` line: the
/// process's own CPU time and that of the children it waited for, which are the agent's
/// work too (the `iptables-save` and `nft` it runs every 10 s for Service names). The
/// command name in parentheses may hold spaces, so fields are counted after its closing
/// parenthesis.
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts with field 3 (state): utime is the 12th field after it.
    let fields = rest.split_whitespace().skip(11).take(4);
    let mut ticks = 0;
    let mut count = 0;
    for field in fields {
        ticks += field.parse::<u64>().ok()?;
        count += 1;
    }
    (count == 4).then_some(ticks)
}

/// A `Name:   123 kB` line of `/proc/PID/status`, in KiB.
fn status_kib(status: &str, name: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(':')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// An eBPF program's name and type, as bpftool reports them.
#[derive(Debug, Clone)]
pub struct ProgName {
    pub name: String,
    pub kind: String,
}

/// Cumulative run statistics of one program (`kernel.bpf_stats_enabled`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    pub run_time_ns: u64,
    pub run_cnt: u64,
}

impl RunStats {
    pub fn since(self, earlier: Self) -> Self {
        Self {
            run_time_ns: self.run_time_ns.saturating_sub(earlier.run_time_ns),
            run_cnt: self.run_cnt.saturating_sub(earlier.run_cnt),
        }
    }
}

/// Names and types of every loaded program, by id: `bpftool prog show -j`.
pub fn prog_names() -> Result<BTreeMap<u32, ProgName>> {
    let json = cmd::output(cmd::command("bpftool").args(["prog", "show", "-j"]))?;
    let progs: Vec<Value> =
        serde_json::from_str(&json).context("`bpftool prog show -j`: not a JSON array")?;
    Ok(progs
        .iter()
        .filter_map(|prog| {
            let id = u32::try_from(prog["id"].as_u64()?).ok()?;
            let name = prog["name"].as_str()?.to_owned();
            let kind = prog["type"].as_str().unwrap_or("?").to_owned();
            Some((id, ProgName { name, kind }))
        })
        .collect())
}

/// How many `nd_*` programs are loaded on this kernel by other processes than `pid` (all
/// of them for none): another node-diag agent, whose tracepoints fire on the bench's
/// traffic too.
pub fn foreign_programs(pid: Option<u32>) -> Result<usize> {
    let own = match pid {
        Some(pid) => held_programs(pid)?,
        None => BTreeMap::new(),
    };
    Ok(prog_names()?
        .iter()
        .filter(|(id, prog)| prog.name.starts_with("nd_") && !own.contains_key(&u64::from(**id)))
        .count())
}

/// The `nd_*` programs `pid` holds, from `/proc/PID/fdinfo` of its bpf-prog descriptors:
/// only this agent's programs count, not those of another agent on the same kernel.
fn prog_stats(pid: u32, names: &BTreeMap<u32, ProgName>) -> Result<BTreeMap<String, RunStats>> {
    Ok(held_programs(pid)?
        .into_iter()
        .filter_map(|(id, stats)| {
            let name = &names.get(&u32::try_from(id).ok()?)?.name;
            name.starts_with("nd_").then(|| (name.clone(), stats))
        })
        .collect())
}

/// Every eBPF program `pid` holds a descriptor of, by id, with its run statistics.
fn held_programs(pid: u32) -> Result<BTreeMap<u64, RunStats>> {
    let mut by_id = BTreeMap::new();
    for (fdinfo, info) in bpf_fdinfos(pid, "anon_inode:bpf-prog")? {
        let field = |name: &str| fdinfo_field(&info, name);
        let (Some(id), Some(run_time_ns), Some(run_cnt)) =
            (field("prog_id"), field("run_time_ns"), field("run_cnt"))
        else {
            bail!("{fdinfo} lacks prog_id/run_time_ns/run_cnt:\n{info}");
        };
        by_id.insert(
            id,
            RunStats {
                run_time_ns,
                run_cnt,
            },
        );
    }
    Ok(by_id)
}

/// `(fdinfo path, its text)` of each descriptor of `pid` whose link target is `target`
/// (`anon_inode:bpf-prog`, `anon_inode:bpf-map`).
fn bpf_fdinfos(pid: u32, target: &str) -> Result<Vec<(String, String)>> {
    let fd_dir = format!("/proc/{pid}/fd");
    let mut out = Vec::new();
    for entry in fs::read_dir(&fd_dir).with_context(|| format!("cannot list {fd_dir}"))? {
        let entry = entry?;
        let Ok(link) = fs::read_link(entry.path()) else {
            continue; // Closed since listed.
        };
        if link != Path::new(target) {
            continue;
        }
        let fdinfo = format!("/proc/{pid}/fdinfo/{}", entry.file_name().to_string_lossy());
        let Ok(info) = fs::read_to_string(&fdinfo) else {
            continue;
        };
        out.push((fdinfo, info));
    }
    Ok(out)
}

/// A `name:\tvalue` line of an fdinfo file, as a number.
pub(super) fn fdinfo_field(info: &str, name: &str) -> Option<u64> {
    fdinfo_text(info, name)?.parse().ok()
}

/// A `name:\tvalue` line of an fdinfo file, as text.
fn fdinfo_text<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(':')?.trim();
        (!value.is_empty()).then_some(value)
    })
}

/// The node size the map memory is also computed for.
pub const TARGET_CPUS: u32 = 128;

/// One eBPF map the agent holds: `/proc/PID/fdinfo` of its descriptor, named by
/// `bpftool map show -j`.
#[derive(Debug, Clone, Serialize)]
pub struct MapMemory {
    pub id: u64,
    pub name: String,
    /// bpftool's name of the map type (`percpu_hash`...).
    #[serde(rename = "type")]
    pub kind: String,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    /// What the kernel charges for the map on this machine (fdinfo `memlock`).
    pub memlock_bytes: u64,
    /// The same on a node with [`TARGET_CPUS`] CPUs (see [`memlock_at_cpus`]).
    pub memlock_at_target_cpus_bytes: u64,
}

/// The fields of a bpf-map descriptor's fdinfo the bench uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MapFdinfo {
    id: u64,
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    memlock: u64,
}

fn parse_map_fdinfo(info: &str) -> Option<MapFdinfo> {
    let small = |name: &str| u32::try_from(fdinfo_field(info, name)?).ok();
    Some(MapFdinfo {
        id: fdinfo_field(info, "map_id")?,
        map_type: small("map_type")?,
        key_size: small("key_size")?,
        value_size: small("value_size")?,
        max_entries: small("max_entries")?,
        memlock: fdinfo_field(info, "memlock")?,
    })
}

/// Map types whose values the kernel allocates once per possible CPU:
/// `BPF_MAP_TYPE_PERCPU_HASH`, `PERCPU_ARRAY`, `LRU_PERCPU_HASH`, `PERCPU_CGROUP_STORAGE`.
fn is_per_cpu(map_type: u32) -> bool {
    matches!(map_type, 5 | 6 | 10 | 15)
}

/// A map's memlock on a machine of `target` CPUs, from its memlock on this one of `cpus`:
/// a per-CPU map holds one value (rounded up to 8 bytes) per entry per CPU more or less;
/// the other maps do not depend on the CPU count (their small per-CPU bookkeeping aside).
fn memlock_at_cpus(map: &MapFdinfo, cpus: u32, target: u32) -> u64 {
    if !is_per_cpu(map.map_type) {
        return map.memlock;
    }
    let per_cpu = u64::from(map.max_entries) * u64::from(map.value_size).next_multiple_of(8);
    if target >= cpus {
        map.memlock + per_cpu * u64::from(target - cpus)
    } else {
        map.memlock
            .saturating_sub(per_cpu * u64::from(cpus - target))
    }
}

/// CPUs the kernel sizes per-CPU maps for: the possible CPUs
/// (`/sys/devices/system/cpu/possible`), else the CPUs this process may use.
pub fn possible_cpus() -> u32 {
    fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|list| count_cpu_list(&list))
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        })
}

/// How many CPUs a kernel CPU list (`0-3,8-11`, `0`) names.
fn count_cpu_list(list: &str) -> Option<u32> {
    let mut count = 0;
    for part in list.trim().split(',') {
        count += match part.split_once('-') {
            Some((first, last)) => {
                let (first, last): (u32, u32) = (first.parse().ok()?, last.parse().ok()?);
                last.checked_sub(first)? + 1
            }
            None => {
                part.parse::<u32>().ok()?;
                1
            }
        };
    }
    Some(count)
}

/// The eBPF maps `pid` holds, by id, with names and types from `bpftool map show -j`.
fn maps(pid: u32) -> Result<Vec<MapMemory>> {
    let json = cmd::output(cmd::command("bpftool").args(["map", "show", "-j"]))?;
    let listed: Vec<Value> =
        serde_json::from_str(&json).context("`bpftool map show -j`: not a JSON array")?;
    let names: BTreeMap<u64, (String, String)> = listed
        .iter()
        .filter_map(|map| {
            let id = map["id"].as_u64()?;
            let name = map["name"].as_str().unwrap_or("?").to_owned();
            let kind = map["type"].as_str().unwrap_or("?").to_owned();
            Some((id, (name, kind)))
        })
        .collect();
    let cpus = possible_cpus();
    let mut by_id = BTreeMap::new();
    for (fdinfo, info) in bpf_fdinfos(pid, "anon_inode:bpf-map")? {
        let map = parse_map_fdinfo(&info).with_context(|| {
            format!(
                "{fdinfo} lacks map_id/map_type/key_size/value_size/max_entries/memlock:\n{info}"
            )
        })?;
        // Several descriptors of one map count once.
        by_id.entry(map.id).or_insert_with(|| {
            let (name, kind) = names
                .get(&map.id)
                .cloned()
                .unwrap_or_else(|| ("?".to_owned(), map.map_type.to_string()));
            MapMemory {
                id: map.id,
                name,
                kind,
                map_type: map.map_type,
                key_size: map.key_size,
                value_size: map.value_size,
                max_entries: map.max_entries,
                memlock_bytes: map.memlock,
                memlock_at_target_cpus_bytes: memlock_at_cpus(&map, cpus, TARGET_CPUS),
            }
        });
    }
    Ok(by_id.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_ticks_skip_the_command_name() {
        let stat = "4242 (node diag) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 5 3 1 20 0 9 0";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(26));
        assert_eq!(
            parse_stat_cpu_ticks("4242 (x) S 1 4242 4242 0 -1 0 0 0 0 0 17 5"),
            None
        );
    }

    #[test]
    fn status_fields_in_kib() {
        let status = "Name:\tnode-diag\nVmHWM:\t   20480 kB\nVmRSS:\t   18000 kB\n";
        assert_eq!(status_kib(status, "VmHWM"), Some(20_480));
        assert_eq!(status_kib(status, "VmRSS"), Some(18_000));
        assert_eq!(status_kib(status, "VmSwap"), None);
    }

    const PERCPU_HASH_FDINFO: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1057\n\
        map_type:\t5\nkey_size:\t12\nvalue_size:\t8\nmax_entries:\t4096\n\
        map_flags:\t0x0\nmap_extra:\t0x0\nmemlock:\t361088\nmap_id:\t42\nfrozen:\t0\n";

    #[test]
    fn map_fdinfo_fields() {
        assert_eq!(
            parse_map_fdinfo(PERCPU_HASH_FDINFO),
            Some(MapFdinfo {
                id: 42,
                map_type: 5,
                key_size: 12,
                value_size: 8,
                max_entries: 4096,
                memlock: 361_088,
            })
        );
        // A program's fdinfo is not a map's.
        assert_eq!(parse_map_fdinfo("prog_type:\t3\nprog_id:\t7\n"), None);
    }

    #[test]
    fn per_cpu_maps_grow_with_the_cpus() {
        let Some(percpu) = parse_map_fdinfo(PERCPU_HASH_FDINFO) else {
            panic!("fdinfo not parsed");
        };
        // 4096 entries × 8 bytes × (128 − 2) more CPUs.
        assert_eq!(memlock_at_cpus(&percpu, 2, 128), 361_088 + 4096 * 8 * 126);
        // Values round up to 8 bytes per CPU.
        let odd = MapFdinfo {
            value_size: 12,
            max_entries: 10,
            map_type: 6,
            ..percpu
        };
        assert_eq!(memlock_at_cpus(&odd, 2, 128), 361_088 + 10 * 16 * 126);
        // Fewer CPUs than here: smaller, never below zero.
        assert_eq!(memlock_at_cpus(&odd, 130, 128), 361_088 - 10 * 16 * 2);
        // Shared maps do not grow.
        let lru = MapFdinfo {
            map_type: 9,
            ..percpu
        };
        assert_eq!(memlock_at_cpus(&lru, 2, 128), 361_088);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpu_list("0-1\n"), Some(2));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3,8-11"), Some(8));
        assert_eq!(count_cpu_list("0,2,4-5"), Some(4));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list(""), None);
    }
}
