//! The release agent as a guarded child process inside node A, and what the bench reads
//! about it: `/proc` (CPU time, RSS), its eBPF programs' run statistics and its HTTP
//! endpoints.

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{interrupted, topology};
use crate::cmd;

/// Where the agent listens, inside node A's namespace.
const LISTEN: &str = "127.0.0.1:9464";
/// How much of the agent's stderr is kept for error messages.
const STDERR_KEEP: usize = 16 * 1024;

/// `node-diag run --format json` in node A; killed on drop if still running.
pub struct Agent {
    child: Child,
    netns: String,
    ready_file: PathBuf,
    stdout_lines: Arc<AtomicU64>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

impl Agent {
    /// Starts the agent in `netns` and waits (at most `timeout`) for its ready file.
    pub fn start(binary: &Path, netns: &str, timeout: Duration) -> Result<Self> {
        let ready_file = std::env::temp_dir().join(format!("{netns}.ready"));
        let _ = fs::remove_file(&ready_file);
        let mut command = topology::exec_in(netns, &[]);
        command
            .arg(binary)
            .args([
                "run",
                "--format",
                "json",
                "--listen",
                LISTEN,
                "--ready-file",
            ])
            .arg(&ready_file)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure only calls prctl, which is async-signal-safe. If the bench
        // dies, the kernel kills the agent (`ip netns exec` execs it, keeping the setting).
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let line = cmd::display(&command);
        let mut child = command
            .spawn()
            .with_context(|| format!("failed to spawn `{line}`"))?;
        let stdout = child.stdout.take().context("agent stdout not piped")?;
        let stderr = child.stderr.take().context("agent stderr not piped")?;
        let stdout_lines = Arc::new(AtomicU64::new(0));
        let stderr_text = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            {
                let lines = Arc::clone(&stdout_lines);
                thread::spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        if line.is_err() {
                            break;
                        }
                        lines.fetch_add(1, Ordering::Relaxed);
                    }
                })
            },
            {
                let text = Arc::clone(&stderr_text);
                thread::spawn(move || {
                    for line in BufReader::new(stderr).lines() {
                        let Ok(line) = line else { break };
                        let mut text = text.lock().unwrap_or_else(|e| e.into_inner());
                        text.push_str(&line);
                        text.push('\n');
                        if text.len() > 2 * STDERR_KEEP {
                            let cut = text.len() - STDERR_KEEP;
                            let cut = (cut..text.len())
                                .find(|&i| text.is_char_boundary(i))
                                .unwrap_or(text.len());
                            text.drain(..cut);
                        }
                    }
                })
            },
        ];
        let mut agent = Self {
            child,
            netns: netns.to_owned(),
            ready_file,
            stdout_lines,
            stderr: stderr_text,
            readers,
        };
        agent.wait_ready(timeout)?;
        Ok(agent)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.ready_file.exists() {
            if let Some(status) = self.child.try_wait()? {
                self.join_readers();
                bail!(
                    "the agent exited ({status}) before it was ready; its stderr:\n{}",
                    self.stderr_tail()
                );
            }
            if interrupted() {
                bail!("interrupted");
            }
            if Instant::now() >= deadline {
                bail!(
                    "the agent was not ready within {timeout:?}; its stderr:\n{}",
                    self.stderr_tail()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lines the agent printed on stdout so far (one per finding printed).
    pub fn stdout_lines(&self) -> u64 {
        self.stdout_lines.load(Ordering::Relaxed)
    }

    /// The last lines of the agent's stderr.
    pub fn stderr_tail(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Fails (with its stderr) when the agent has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            self.join_readers();
            bail!(
                "the agent exited ({status}) during the bench; its stderr:\n{}",
                self.stderr_tail()
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

    /// `GET /findings`, parsed.
    pub fn findings(&self) -> Result<Vec<Value>> {
        let body = http_get(&self.netns, "/findings")?;
        serde_json::from_str(&body).context("GET /findings: not a JSON array")
    }

    /// `GET /metrics`: every sample, `name{labels}` to value.
    pub fn metrics(&self) -> Result<BTreeMap<String, f64>> {
        Ok(parse_metrics(&http_get(&self.netns, "/metrics")?))
    }

    /// SIGTERM, then waits up to 10 s (SIGKILL after); fails unless it exited 0.
    pub fn stop(mut self) -> Result<()> {
        // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let status = self.child.wait()?;
                self.join_readers();
                bail!(
                    "the agent did not exit within 10 s of SIGTERM ({status}); its stderr:\n{}",
                    self.stderr_tail()
                );
            }
            thread::sleep(Duration::from_millis(20));
        };
        self.join_readers();
        if !status.success() {
            bail!(
                "the agent exited with {status} on SIGTERM; its stderr:\n{}",
                self.stderr_tail()
            );
        }
        Ok(())
    }

    fn join_readers(&mut self) {
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        self.join_readers();
        let _ = fs::remove_file(&self.ready_file);
    }
}

/// CPU time and memory of a process, from `/proc/PID/stat` and `/proc/PID/status`.
#[derive(Debug, Clone, Copy)]
pub struct ProcSample {
    /// utime + stime, in seconds.
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

/// utime + stime (fields 14 and 15) from a `/proc/PID/stat` line; the command name in
/// parentheses may hold spaces, so fields are counted after its closing parenthesis.
fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts with field 3 (state): utime is the 12th field after it.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
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
    let fd_dir = format!("/proc/{pid}/fd");
    let mut by_id = BTreeMap::new();
    for entry in fs::read_dir(&fd_dir).with_context(|| format!("cannot list {fd_dir}"))? {
        let entry = entry?;
        let Ok(target) = fs::read_link(entry.path()) else {
            continue; // Closed since listed.
        };
        if target != Path::new("anon_inode:bpf-prog") {
            continue;
        }
        let fdinfo = format!("/proc/{pid}/fdinfo/{}", entry.file_name().to_string_lossy());
        let Ok(info) = fs::read_to_string(&fdinfo) else {
            continue;
        };
        let field = |name: &str| {
            info.lines().find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
        };
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

/// `GET path` on the agent from inside its namespace; the body of a 200 response.
fn http_get(netns: &str, path: &str) -> Result<String> {
    const TIMEOUT: Duration = Duration::from_secs(5);
    let addr: SocketAddr = LISTEN.parse().expect("LISTEN is an address");
    let raw = topology::in_netns(netns, || {
        let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {LISTEN}\r\nConnection: close\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        Ok(raw)
    })
    .with_context(|| format!("GET http://{LISTEN}{path} in {netns}"))?;
    parse_http(&raw).with_context(|| format!("GET http://{LISTEN}{path}: bad response"))
}

/// The body of a complete `200` HTTP/1.1 response (Content-Length, chunked, or to EOF).
fn parse_http(raw: &[u8]) -> Result<String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of headers")?;
    let head = std::str::from_utf8(&raw[..end]).context("headers are not UTF-8")?;
    let mut body = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("status line {status:?}");
    }
    let mut decoded = Vec::new();
    let chunked = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("transfer-encoding") && value.contains("chunked")
        })
    });
    if chunked {
        loop {
            let eol = body
                .windows(2)
                .position(|w| w == b"\r\n")
                .context("truncated chunk")?;
            let size = std::str::from_utf8(&body[..eol])?;
            let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
                .context("bad chunk size")?;
            body = &body[eol + 2..];
            if size == 0 {
                break;
            }
            decoded.extend_from_slice(body.get(..size).context("truncated chunk")?);
            body = body.get(size + 2..).context("truncated chunk")?;
        }
    } else {
        decoded.extend_from_slice(body);
    }
    String::from_utf8(decoded).context("body is not UTF-8")
}

/// OpenMetrics text: `name{labels} value` lines (comments skipped), keyed by everything
/// before the value.
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            Some((key.trim().to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_ticks_skip_the_command_name() {
        let stat = "4242 (node diag) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 9 0";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(22));
    }

    #[test]
    fn status_fields_in_kib() {
        let status = "Name:\tnode-diag\nVmHWM:\t   20480 kB\nVmRSS:\t   18000 kB\n";
        assert_eq!(status_kib(status, "VmHWM"), Some(20_480));
        assert_eq!(status_kib(status, "VmRSS"), Some(18_000));
        assert_eq!(status_kib(status, "VmSwap"), None);
    }

    #[test]
    fn http_bodies() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]";
        assert_eq!(parse_http(plain).unwrap(), "[]");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n";
        assert_eq!(parse_http(chunked).unwrap(), "[]");
        assert!(parse_http(b"HTTP/1.1 404 Not Found\r\n\r\n").is_err());
    }

    #[test]
    fn metrics_lines() {
        let text = "# TYPE node_diag_events_lost counter\nnode_diag_events_lost_total 3\n\
                    node_diag_findings_total{kind=\"tcp_refused\",layer=\"listener\"} 2\n# EOF\n";
        let metrics = parse_metrics(text);
        assert_eq!(metrics["node_diag_events_lost_total"], 3.0);
        assert_eq!(
            metrics["node_diag_findings_total{kind=\"tcp_refused\",layer=\"listener\"}"],
            2.0
        );
    }
}
