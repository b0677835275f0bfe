//! The workloads: iperf3 bulk transfers, a short-connection load generator (paced, or
//! closed loop) with its echo server, a storm of refused connects, and a flood of UDP
//! datagrams into an nftables drop rule ([`DropRule`]). The in-process ones run on
//! threads that entered the pods' namespaces, so they need no external tool.

use std::{
    io::{self, ErrorKind, Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd as _,
    process::{Child, Output, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;
use socket2::{Domain, Socket, Type};

use node_diag_testbed::{
    cmd::{exec_in, run_in},
    in_netns,
    netns::enter_netns,
    process::die_with_parent,
};

use super::signal::{check_interrupted, interrupted};
use crate::cmd;

/// Bytes each short connection sends and gets echoed back.
const REQUEST: &[u8; 64] = &[b'x'; 64];
/// Bound on every blocking socket step of the load generators.
const IO_TIMEOUT: Duration = Duration::from_secs(1);
/// How often blocked loops look at their stop flag.
const POLL: Duration = Duration::from_millis(50);

/// `iperf3 -s` in a namespace; killed on drop.
pub struct IperfServer {
    child: Child,
}

impl IperfServer {
    /// Starts the server on `port` in `netns` and waits until it listens.
    pub fn start(netns: &str, port: u16) -> Result<Self> {
        let port_arg = port.to_string();
        let mut command = exec_in(netns, &["iperf3", "-s", "-p", &port_arg]);
        command.stdin(Stdio::null()).stdout(Stdio::null());
        die_with_parent(&mut command);
        let line = cmd::display(&command);
        let server = Self {
            child: command
                .spawn()
                .with_context(|| format!("failed to spawn `{line}`"))?,
        };
        let filter = format!("sport = :{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let listening = cmd::output(&mut exec_in(netns, &["ss", "-Hltn", filter.as_str()]))?;
            if !listening.trim().is_empty() {
                return Ok(server);
            }
            if Instant::now() >= deadline {
                bail!("`{line}` does not listen on port {port} after 10 s");
            }
            thread::sleep(POLL);
        }
    }
}

impl Drop for IperfServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `iperf3 -c server -t secs -J` from `netns`: the receiver's throughput in bit/s.
pub fn iperf(netns: &str, server: SocketAddr, duration: Duration) -> Result<f64> {
    let (host, port, secs) = (
        server.ip().to_string(),
        server.port().to_string(),
        duration.as_secs().max(1).to_string(),
    );
    let mut command = exec_in(
        netns,
        &["iperf3", "-c", &host, "-p", &port, "-t", &secs, "-J"],
    );
    let out = output_within(&mut command, duration + Duration::from_secs(20))?;
    let line = cmd::display(&command);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("`{line}` printed no JSON ({})", out.status))?;
    if let Some(error) = report["error"].as_str() {
        bail!("`{line}` failed: {error}");
    }
    if !out.status.success() {
        bail!("`{line}` failed ({})", out.status);
    }
    report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .with_context(|| format!("`{line}`: no end.sum_received.bits_per_second"))
}

/// Runs `command` with its output captured; kills it after `timeout`.
fn output_within(command: &mut std::process::Command, timeout: Duration) -> Result<Output> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    die_with_parent(command);
    let line = cmd::display(command);
    let mut child = command
        .spawn()
        .with_context(|| format!("failed to spawn `{line}`"))?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let read_all = |pipe: Option<Box<dyn io::Read + Send>>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = read_all(stdout.map(|p| Box::new(p) as _));
    let stderr = read_all(stderr.map(|p| Box::new(p) as _));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if interrupted() {
            let _ = child.kill();
            let _ = child.wait();
            bail!("interrupted");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("`{line}` did not finish within {timeout:?}; killed");
        }
        thread::sleep(Duration::from_millis(20));
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// A TCP echo server for [`short_connections`]: each connection gets its request echoed and is
/// closed by the server (so the TIME_WAIT state stays on the server side). Stops on drop.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl EchoServer {
    /// Listens on `addr` in `netns`, served by `threads` accept loops.
    pub fn start(netns: &str, addr: SocketAddr, threads: usize) -> Result<Self> {
        // A socket keeps the namespace it was created in, whichever thread uses it.
        let listener = in_netns(netns, || -> io::Result<TcpListener> {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
            socket.set_reuse_address(true)?;
            socket.bind(&addr.into())?;
            socket.listen(4096)?;
            socket.set_nonblocking(true)?;
            Ok(TcpListener::from(socket))
        })?
        .with_context(|| format!("echo server: cannot listen on {addr} in {netns}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let listener = listener.try_clone()?;
            let stop = Arc::clone(&stop);
            handles.push(
                thread::Builder::new()
                    .name(format!("echo-{i}"))
                    .spawn(move || serve(&listener, &stop))?,
            );
        }
        Ok(Self {
            stop,
            threads: handles,
        })
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn serve(listener: &TcpListener, stop: &AtomicBool) {
    let poll_ms = i32::try_from(POLL.as_millis()).unwrap_or(50);
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1.
        if unsafe { libc::poll(&mut pfd, 1, poll_ms) } <= 0 {
            continue;
        }
        // Another accept loop may have taken the connection: WouldBlock then.
        while let Ok((stream, _)) = listener.accept() {
            let _ = echo_once(stream);
        }
    }
}

/// Reads one request, echoes it, closes.
fn echo_once(mut stream: TcpStream) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut buf = [0u8; REQUEST.len()];
    stream.read_exact(&mut buf)?;
    stream.write_all(&buf)
}

/// What the short-connection load generator saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConnStats {
    /// Connections that completed connect, send, echo and close.
    pub completed: u64,
    pub failed: u64,
    /// Scheduled connections skipped because the generator fell behind by more than
    /// [`MAX_LAG`].
    pub skipped: u64,
    pub elapsed_s: f64,
    /// Completed connections per second.
    pub rate: f64,
    /// Median and 99th percentile of one connection's duration, in microseconds.
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    pub first_error: Option<String>,
}

/// Lag behind the schedule after which the generator skips ahead instead of bursting.
const MAX_LAG: Duration = Duration::from_millis(100);

/// From `netns`, short connections to `server` for `duration` (connect, send 64 bytes,
/// read the echo, read the server's close, close) on `threads` threads: paced to offer
/// `rate` per second in total, or, without a rate, each thread opening its next
/// connection as soon as the previous one is done (closed loop), so the figure is what
/// the machine can complete.
pub fn short_connections(
    netns: &str,
    server: SocketAddr,
    rate: Option<u32>,
    duration: Duration,
    threads: u32,
) -> Result<ConnStats> {
    let interval =
        rate.map(|rate| Duration::from_secs_f64(f64::from(threads) / f64::from(rate.max(1))));
    let start = Instant::now() + Duration::from_millis(100);
    let end = start + duration;
    let workers = (0..threads)
        .map(|i| {
            let netns = netns.to_owned();
            // Paced threads start staggered within one interval.
            let first = start
                + interval.map_or(Duration::ZERO, |interval| {
                    interval.mul_f64(f64::from(i) / f64::from(threads))
                });
            thread::Builder::new()
                .name(format!("conn-{i}"))
                .spawn(move || {
                    enter_netns(&netns)?;
                    Ok(connections(server, first, interval, end))
                })
                .context("cannot spawn a load thread")
        })
        .collect::<Result<Vec<JoinHandle<Result<Worker>>>>>()?;
    let mut total = Worker::default();
    join_all(workers, |worker| {
        total.completed += worker.completed;
        total.failed += worker.failed;
        total.skipped += worker.skipped;
        total.latencies_us.extend(worker.latencies_us);
        total.first_error = total.first_error.take().or(worker.first_error);
    })?;
    check_interrupted()?;
    let elapsed = duration.as_secs_f64();
    total.latencies_us.sort_unstable();
    Ok(ConnStats {
        completed: total.completed,
        failed: total.failed,
        skipped: total.skipped,
        elapsed_s: elapsed,
        rate: total.completed as f64 / elapsed,
        latency_p50_us: percentile(&total.latencies_us, 0.50),
        latency_p99_us: percentile(&total.latencies_us, 0.99),
        first_error: total.first_error,
    })
}

#[derive(Default)]
struct Worker {
    completed: u64,
    failed: u64,
    skipped: u64,
    latencies_us: Vec<u32>,
    first_error: Option<String>,
}

/// One thread's connections from `first` until `end`: one every `interval`, or back to
/// back without one.
fn connections(
    server: SocketAddr,
    first: Instant,
    interval: Option<Duration>,
    end: Instant,
) -> Worker {
    let mut worker = Worker::default();
    let mut next = first;
    while next < end && !interrupted() {
        let now = Instant::now();
        if now < next {
            thread::sleep(next - now);
        } else if let Some(interval) = interval
            && now - next > MAX_LAG
        {
            // Behind schedule: skip the missed slots rather than burst to catch up.
            let missed = ((now - next).as_secs_f64() / interval.as_secs_f64()) as u64;
            worker.skipped += missed;
            next += interval.mul_f64(missed as f64);
        }
        let began = Instant::now();
        match one_connection(server) {
            Ok(()) => {
                worker.completed += 1;
                let micros = began.elapsed().as_micros();
                worker
                    .latencies_us
                    .push(u32::try_from(micros).unwrap_or(u32::MAX));
            }
            Err(err) => {
                worker.failed += 1;
                worker.first_error.get_or_insert_with(|| err.to_string());
            }
        }
        next = match interval {
            Some(interval) => next + interval,
            None => Instant::now(),
        };
    }
    worker
}

fn one_connection(server: SocketAddr) -> io::Result<()> {
    let mut stream = TcpStream::connect_timeout(&server, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    stream.write_all(REQUEST)?;
    let mut echo = [0u8; REQUEST.len()];
    stream.read_exact(&mut echo)?;
    // Wait for the server's close, so this side never holds TIME_WAIT.
    let mut rest = [0u8; 1];
    match stream.read(&mut rest)? {
        0 => Ok(()),
        _ => Err(io::Error::new(
            ErrorKind::InvalidData,
            "echo longer than the request",
        )),
    }
}

fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    f64::from(sorted[idx.min(sorted.len() - 1)])
}

/// What the refused-connect storm saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StormStats {
    pub attempted: u64,
    /// Connects that failed with `ECONNREFUSED`.
    pub refused: u64,
    /// Connects that ended any other way (connected, timed out, other errors).
    pub other: u64,
    pub elapsed_s: f64,
    /// Refused connects per second.
    pub rate: f64,
    pub first_other: Option<String>,
}

/// From `netns`, `total` connects to `target` (a port nothing listens on), as fast as
/// `threads` threads make them; gives up after `limit`.
pub fn refused_storm(
    netns: &str,
    target: SocketAddr,
    total: u64,
    threads: u32,
    limit: Duration,
) -> Result<StormStats> {
    let issued = Arc::new(AtomicU64::new(0));
    let began = Instant::now();
    let deadline = began + limit;
    let workers = (0..threads)
        .map(|i| {
            let (netns, issued) = (netns.to_owned(), Arc::clone(&issued));
            thread::Builder::new()
                .name(format!("storm-{i}"))
                .spawn(move || -> Result<StormStats> {
                    enter_netns(&netns)?;
                    let mut stats = StormStats::default();
                    while issued.fetch_add(1, Ordering::Relaxed) < total
                        && Instant::now() < deadline
                        && !interrupted()
                    {
                        stats.attempted += 1;
                        match TcpStream::connect_timeout(&target, IO_TIMEOUT) {
                            Err(err) if err.raw_os_error() == Some(libc::ECONNREFUSED) => {
                                stats.refused += 1;
                            }
                            Err(err) => {
                                stats.other += 1;
                                stats.first_other.get_or_insert_with(|| err.to_string());
                            }
                            Ok(_) => {
                                stats.other += 1;
                                stats
                                    .first_other
                                    .get_or_insert_with(|| format!("{target} accepted"));
                            }
                        }
                    }
                    Ok(stats)
                })
                .context("cannot spawn a storm thread")
        })
        .collect::<Result<Vec<_>>>()?;
    let mut total_stats = StormStats::default();
    join_all(workers, |stats| {
        total_stats.attempted += stats.attempted;
        total_stats.refused += stats.refused;
        total_stats.other += stats.other;
        total_stats.first_other = total_stats.first_other.take().or(stats.first_other);
    })?;
    check_interrupted()?;
    total_stats.elapsed_s = began.elapsed().as_secs_f64();
    total_stats.rate = total_stats.refused as f64 / total_stats.elapsed_s;
    if total_stats.attempted < total {
        bail!(
            "the storm made {} of {total} connects within {limit:?}",
            total_stats.attempted
        );
    }
    Ok(total_stats)
}

/// From `netns`, one connect to each of `ports` on `dst` (closed ports: each refused),
/// by `threads` threads: one `tcp_refused` finding per port. Returns how many were
/// refused.
pub fn refuse_each_port(
    netns: &str,
    dst: Ipv4Addr,
    ports: std::ops::Range<u16>,
    threads: u32,
) -> Result<u64> {
    let next = Arc::new(AtomicU64::new(u64::from(ports.start)));
    let end = u64::from(ports.end);
    let workers = (0..threads)
        .map(|i| {
            let (netns, next) = (netns.to_owned(), Arc::clone(&next));
            thread::Builder::new()
                .name(format!("fill-{i}"))
                .spawn(move || -> Result<u64> {
                    enter_netns(&netns)?;
                    let mut refused = 0;
                    loop {
                        let port = next.fetch_add(1, Ordering::Relaxed);
                        if port >= end || interrupted() {
                            return Ok(refused);
                        }
                        let target = SocketAddr::from((dst, port as u16));
                        if let Err(err) = TcpStream::connect_timeout(&target, IO_TIMEOUT)
                            && err.raw_os_error() == Some(libc::ECONNREFUSED)
                        {
                            refused += 1;
                        }
                    }
                })
                .context("cannot spawn a fill thread")
        })
        .collect::<Result<Vec<_>>>()?;
    let mut refused = 0;
    join_all(workers, |n| refused += n)?;
    check_interrupted()?;
    Ok(refused)
}

/// What the findings poll saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PollStats {
    /// Findings the agent held when the polls began.
    pub findings: u64,
    /// Answers `200` with a JSON array.
    pub polls: u64,
    pub failed: u64,
    /// Mean bytes of one answer.
    pub bytes_per_poll: f64,
    /// Answers per second, all clients.
    pub rate: f64,
    /// Median and 99th percentile of one poll (connect to last byte), in milliseconds.
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    /// Refused connects made meanwhile to ports already in the store, so its entries
    /// keep changing as a node's do.
    pub trickle: u64,
    pub elapsed_s: f64,
    pub first_error: Option<String>,
}

/// From `netns`, `clients` clients each `GET url` every `interval` (a poll that runs
/// late starts the next at once) for `duration`; meanwhile one refused connect every
/// `interval` from `trickle.0` to a port of `trickle.1` cycling over `trickle.2`.
pub fn poll_findings(
    netns: &str,
    url: &str,
    clients: u32,
    interval: Duration,
    duration: Duration,
    trickle: (&str, Ipv4Addr, std::ops::Range<u16>),
) -> Result<PollStats> {
    let start = Instant::now() + Duration::from_millis(100);
    let end = start + duration;
    let pollers = (0..clients)
        .map(|i| {
            let (netns, url) = (netns.to_owned(), url.to_owned());
            // Staggered within one interval, as independent clients are.
            let first = start + interval.mul_f64(f64::from(i) / f64::from(clients));
            thread::Builder::new()
                .name(format!("poll-{i}"))
                .spawn(move || -> Result<(PollStats, Vec<u32>)> {
                    enter_netns(&netns)?;
                    Ok(poll(&url, first, interval, end))
                })
                .context("cannot spawn a poll thread")
        })
        .collect::<Result<Vec<_>>>()?;
    let (trickle_ns, dst, ports) = (trickle.0.to_owned(), trickle.1, trickle.2);
    let trickler = thread::Builder::new()
        .name("trickle".into())
        .spawn(move || -> Result<PollStats> {
            enter_netns(&trickle_ns)?;
            let mut stats = PollStats::default();
            let mut next = start;
            for port in ports.cycle() {
                let now = Instant::now();
                if now >= end || interrupted() {
                    break;
                }
                if now < next {
                    thread::sleep(next - now);
                }
                next += interval;
                let _ = TcpStream::connect_timeout(&SocketAddr::from((dst, port)), IO_TIMEOUT);
                stats.trickle += 1;
            }
            Ok(stats)
        })
        .context("cannot spawn the trickle thread")?;
    let mut total = PollStats::default();
    let mut latencies = Vec::new();
    let mut bytes = 0.0;
    join_all(pollers, |(stats, lat)| {
        total.polls += stats.polls;
        total.failed += stats.failed;
        bytes += stats.bytes_per_poll;
        latencies.extend(lat);
        total.first_error = total.first_error.take().or(stats.first_error);
    })?;
    join_all(vec![trickler], |stats| total.trickle = stats.trickle)?;
    check_interrupted()?;
    latencies.sort_unstable();
    total.latency_p50_ms = percentile(&latencies, 0.50) / 1e3;
    total.latency_p99_ms = percentile(&latencies, 0.99) / 1e3;
    total.elapsed_s = duration.as_secs_f64();
    total.rate = total.polls as f64 / total.elapsed_s;
    total.bytes_per_poll = if total.polls > 0 {
        bytes / total.polls as f64
    } else {
        0.0
    };
    if total.polls == 0 {
        bail!(
            "no poll of {url} succeeded ({} failed{})",
            total.failed,
            total
                .first_error
                .as_deref()
                .map_or_else(String::new, |err| format!(", first error: {err}"))
        );
    }
    Ok(total)
}

/// One client's polls from `first` until `end`, one every `interval`, and each
/// answer's latency in microseconds. `bytes_per_poll` is the sum, for the caller.
fn poll(url: &str, first: Instant, interval: Duration, end: Instant) -> (PollStats, Vec<u32>) {
    let mut stats = PollStats::default();
    let mut latencies = Vec::new();
    let mut next = first;
    while next < end && !interrupted() {
        let now = Instant::now();
        if now < next {
            thread::sleep(next - now);
        }
        let began = Instant::now();
        match node_diag_testbed::http::get_here(url, Some("application/json")) {
            Ok(r) if r.status == 200 && r.body.starts_with('[') => {
                stats.polls += 1;
                stats.bytes_per_poll += r.body.len() as f64;
                latencies.push(u32::try_from(began.elapsed().as_micros()).unwrap_or(u32::MAX));
            }
            Ok(r) => {
                stats.failed += 1;
                stats
                    .first_error
                    .get_or_insert_with(|| format!("status {}: {:.200}", r.status, r.body));
            }
            Err(err) => {
                stats.failed += 1;
                stats.first_error.get_or_insert_with(|| err.to_string());
            }
        }
        // Late (a slow answer): the next poll starts at once, without a burst after.
        next = (next + interval).max(Instant::now());
    }
    (stats, latencies)
}

/// The nftables table of the drop flood's rule (family `inet`).
const DROP_TABLE: &str = "ndbench";
/// Bytes of each flood datagram: small, so the figure is packets, not bytes.
const FLOOD_PAYLOAD: usize = 16;
/// Sends between two looks at the clock and the stop flag.
const FLOOD_BATCH: u32 = 64;

/// An nftables rule in `netns`'s forward hook that counts and drops packets (table
/// `inet ndbench`, chain `flood`): all UDP to one port ([`DropRule::udp_port`]) or a
/// random share of the TCP to one port ([`DropRule::tcp_loss`]). Every packet it drops
/// is freed through `kfree_skb` with reason `NETFILTER_DROP`. Dropping the guard deletes
/// the table: the other workloads must not pay for a forward hook, and a failed bench
/// must not leave the rule behind.
pub struct DropRule {
    netns: String,
}

impl DropRule {
    /// Drops every UDP datagram to `port`.
    pub fn udp_port(netns: &str, port: u16) -> Result<Self> {
        Self::install(netns, &format!("udp dport {port}"))
    }

    /// Drops `per_mille` ‰ of the TCP segments (GSO packets: a forwarded one may carry
    /// several) to `port`, chosen at random: the sender retransmits them.
    pub fn tcp_loss(netns: &str, port: u16, per_mille: u32) -> Result<Self> {
        Self::install(
            netns,
            &format!("tcp dport {port} numgen random mod 1000 < {per_mille}"),
        )
    }

    fn install(netns: &str, matches: &str) -> Result<Self> {
        run_in(netns, &["nft", &format!("add table inet {DROP_TABLE}")])?;
        // The guard exists from here on, so a failure below still deletes the table.
        let rule = Self {
            netns: netns.to_owned(),
        };
        run_in(
            netns,
            &[
                "nft",
                &format!(
                    "add chain inet {DROP_TABLE} flood \
                     {{ type filter hook forward priority 0; policy accept; }}"
                ),
            ],
        )?;
        run_in(
            netns,
            &[
                "nft",
                &format!("add rule inet {DROP_TABLE} flood {matches} counter drop"),
            ],
        )?;
        Ok(rule)
    }

    /// Packets the rule has dropped so far (its counter).
    pub fn dropped(&self) -> Result<u64> {
        let json = run_in(
            &self.netns,
            &["nft", "-j", "list", "table", "inet", DROP_TABLE],
        )?;
        rule_counter_packets(&json)
            .with_context(|| format!("`nft -j list table inet {DROP_TABLE}` in {}", self.netns))
    }
}

impl Drop for DropRule {
    fn drop(&mut self) {
        let delete = format!("delete table inet {DROP_TABLE}");
        if let Err(err) = run_in(&self.netns, &["nft", &delete]) {
            // Never panic in drop: it may run while unwinding from a failure. The table
            // goes with the namespace at the latest.
            eprintln!(
                "[bench] warning: cannot delete nftables table inet {DROP_TABLE} in {}: {err}",
                self.netns
            );
        }
    }
}

/// The sum of the `counter` packets of every rule in `nft -j list table` output.
fn rule_counter_packets(json: &str) -> Result<u64> {
    let doc: serde_json::Value = serde_json::from_str(json).context("not JSON")?;
    let items = doc["nftables"].as_array().context("no `nftables` array")?;
    let counters: Vec<u64> = items
        .iter()
        .filter_map(|item| item["rule"]["expr"].as_array())
        .flatten()
        .filter_map(|expr| expr["counter"]["packets"].as_u64())
        .collect();
    if counters.is_empty() {
        bail!("no rule with a counter");
    }
    Ok(counters.iter().sum())
}

/// What the drop flood saw.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FloodStats {
    /// Datagrams the senders' `send` accepted.
    pub sent: u64,
    /// Sends that failed.
    pub failed: u64,
    /// Packets the drop rule counted during the flood: what reached the drop, which is
    /// less than `sent` when the kernel dropped some earlier (a full backlog).
    pub dropped: u64,
    pub elapsed_s: f64,
    /// `sent` per second.
    pub sent_rate: f64,
    /// `dropped` per second: the workload's figure.
    pub drop_rate: f64,
    pub first_error: Option<String>,
}

/// Joins the load threads in order, handing each one's figures to `add`; a thread's
/// panic resumes here, and the first thread's error ends the join.
fn join_all<T>(workers: Vec<JoinHandle<Result<T>>>, mut add: impl FnMut(T)) -> Result<()> {
    for worker in workers {
        add(worker
            .join()
            .unwrap_or_else(|payload| std::panic::resume_unwind(payload))?);
    }
    Ok(())
}

/// From `netns`, `threads` threads send small UDP datagrams to `target` back to back for
/// `duration`; `rule` drops them on the way and counts what reached it.
pub fn drop_flood(
    netns: &str,
    target: SocketAddr,
    duration: Duration,
    threads: u32,
    rule: &DropRule,
) -> Result<FloodStats> {
    let dropped_before = rule.dropped()?;
    let start = Instant::now() + Duration::from_millis(100);
    let end = start + duration;
    let workers = (0..threads)
        .map(|i| {
            let netns = netns.to_owned();
            thread::Builder::new()
                .name(format!("flood-{i}"))
                .spawn(move || -> Result<FloodStats> {
                    enter_netns(&netns)?;
                    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
                    socket.connect(target)?;
                    socket.set_write_timeout(Some(IO_TIMEOUT))?;
                    Ok(flood(&socket, start, end))
                })
                .context("cannot spawn a flood thread")
        })
        .collect::<Result<Vec<_>>>()?;
    let mut total = FloodStats::default();
    join_all(workers, |stats| {
        total.sent += stats.sent;
        total.failed += stats.failed;
        total.first_error = total.first_error.take().or(stats.first_error);
    })
    .with_context(|| format!("flood sender in {netns}"))?;
    check_interrupted()?;
    total.dropped = rule.dropped()?.saturating_sub(dropped_before);
    total.elapsed_s = duration.as_secs_f64();
    total.sent_rate = total.sent as f64 / total.elapsed_s;
    total.drop_rate = total.dropped as f64 / total.elapsed_s;
    if total.dropped == 0 {
        bail!(
            "no datagram to {target} reached the drop rule ({} sent, {} failed{})",
            total.sent,
            total.failed,
            total
                .first_error
                .as_deref()
                .map_or_else(String::new, |err| format!(", first error: {err}"))
        );
    }
    Ok(total)
}

/// One sender: datagrams back to back from `start` until `end`.
fn flood(socket: &UdpSocket, start: Instant, end: Instant) -> FloodStats {
    let payload = [0u8; FLOOD_PAYLOAD];
    let mut stats = FloodStats::default();
    let now = Instant::now();
    if now < start {
        thread::sleep(start - now);
    }
    while Instant::now() < end && !interrupted() {
        for _ in 0..FLOOD_BATCH {
            match socket.send(&payload) {
                Ok(_) => stats.sent += 1,
                Err(err) => {
                    stats.failed += 1;
                    stats.first_error.get_or_insert_with(|| err.to_string());
                }
            }
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_sorted_samples() {
        let samples: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&samples, 0.5), 51.0);
        assert_eq!(percentile(&samples, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn drop_rule_counters_from_nft_json() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
            {"table": {"family": "inet", "name": "ndbench", "handle": 1}},
            {"chain": {"family": "inet", "table": "ndbench", "name": "flood", "handle": 1,
                       "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}},
            {"rule": {"family": "inet", "table": "ndbench", "chain": "flood", "handle": 2,
                      "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "udp",
                               "field": "dport"}}, "right": 7998}},
                               {"counter": {"packets": 123456, "bytes": 5432064}},
                               {"drop": null}]}}]}"#;
        assert_eq!(rule_counter_packets(json).unwrap(), 123_456);
        let no_counter = r#"{"nftables": [{"table": {"family": "inet", "name": "ndbench"}}]}"#;
        assert!(rule_counter_packets(no_counter).is_err());
        assert!(rule_counter_packets("table inet ndbench {}").is_err());
    }
}
