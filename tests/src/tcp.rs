//! TCP traffic made in-process from inside a namespace: a server guard, a
//! connect that classifies how it failed, and a request/response client.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockRef, Socket, Type};

use node_diag_testbed::netns::enter_netns;

use crate::in_netns;

/// How a TCP connect ended.
#[derive(Debug)]
pub enum ConnectOutcome {
    /// The handshake completed.
    Connected,
    /// The peer answered the SYN with a RST (`ECONNREFUSED`).
    Refused,
    /// No answer before the deadline (ours or the kernel's `ETIMEDOUT`).
    TimedOut,
    /// An ICMP error came back; the errno (`EHOSTUNREACH`, `ENETUNREACH`, ...).
    Unreachable(i32),
    /// Anything else.
    Other(io::Error),
}

impl ConnectOutcome {
    /// Whether the connect failed as an ICMP error fails it: with the errno, or with no
    /// errno at all. The latter is std's "no error set after POLLHUP": seen on Debian's
    /// 6.1 under emulation, poll reported the hang-up of a connect an ICMP error ended,
    /// and SO_ERROR read 0. Either way the connect ended early, not at a deadline.
    pub fn is_icmp_failure(&self) -> bool {
        match self {
            ConnectOutcome::Unreachable(_) => true,
            _ => self.hung_up_without_errno(),
        }
    }

    /// Whether the connect was refused as an ICMP port unreachable refuses it:
    /// `ECONNREFUSED`, or no errno at all after the hang-up (see [`Self::is_icmp_failure`]:
    /// the same race on Debian's 6.1 under emulation).
    pub fn is_refused_by_icmp(&self) -> bool {
        match self {
            ConnectOutcome::Refused => true,
            _ => self.hung_up_without_errno(),
        }
    }

    /// std's "no error set after POLLHUP": the connect ended, its errno lost.
    fn hung_up_without_errno(&self) -> bool {
        matches!(self, ConnectOutcome::Other(e) if e.to_string().contains("no error set after POLLHUP"))
    }

    /// Classifies the error a connect returned.
    pub fn from_error(err: io::Error) -> ConnectOutcome {
        match err.raw_os_error() {
            Some(libc::ECONNREFUSED) => ConnectOutcome::Refused,
            Some(libc::ETIMEDOUT) => ConnectOutcome::TimedOut,
            Some(
                errno @ (libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::ENETDOWN),
            ) => ConnectOutcome::Unreachable(errno),
            // std's connect_timeout reports its own deadline without an errno.
            None if err.kind() == ErrorKind::TimedOut => ConnectOutcome::TimedOut,
            _ => ConnectOutcome::Other(err),
        }
    }
}

/// Connects from inside `netns` to `addr`, giving up after `timeout`, and
/// closes the connection at once if it was made.
pub fn tcp_connect(netns: &str, addr: SocketAddr, timeout: Duration) -> ConnectOutcome {
    in_netns(netns, || match TcpStream::connect_timeout(&addr, timeout) {
        Ok(_) => ConnectOutcome::Connected,
        Err(e) => ConnectOutcome::from_error(e),
    })
}

/// From inside `netns`, on CPU 0 only: `n` non-blocking connects to `addr`, each taking
/// its error with SO_ERROR as fast as the thread can ask, the way an event loop reads it
/// once the socket reports writable (Go's runtime does). On another CPU than the one
/// handling the answer, such a client can take the error before the kernel's error
/// report runs. Returns each connect's outcome; a connect still pending after `timeout`
/// is [`ConnectOutcome::TimedOut`].
pub fn connects_taking_error_at_once(
    netns: &str,
    addr: SocketAddr,
    n: usize,
    timeout: Duration,
) -> Vec<ConnectOutcome> {
    in_netns(netns, || {
        pin_to_cpu(0);
        (0..n)
            .map(|_| connect_taking_error(addr, timeout))
            .collect()
    })
}

/// From inside `netns`: one non-blocking connect to `addr` made on CPU 1, whose error is
/// then taken on CPU 0 with SO_ERROR as fast as the thread can ask, while another thread
/// keeps CPU 1 busy. The kernel's timers for the attempt (a SYN's retransmit, a
/// neighbour's discovery) were armed on CPU 1 and, that CPU never idle, fire there: the
/// kernel fails the connect on CPU 1 while the client spins on CPU 0, so the client takes
/// the error between the kernel setting it and the kernel's error report reading it.
/// Needs two CPUs.
pub fn connect_taking_error_on_another_cpu(
    netns: &str,
    addr: SocketAddr,
    timeout: Duration,
) -> ConnectOutcome {
    in_netns(netns, || {
        pin_to_cpu(1);
        let sock = match start_connect(addr) {
            Ok(sock) => sock,
            Err(outcome) => return outcome,
        };
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let busy = {
            let done = done.clone();
            std::thread::spawn(move || {
                pin_to_cpu(1);
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        pin_to_cpu(0);
        let outcome = take_error(&sock, timeout);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        busy.join().expect("busy thread");
        outcome
    })
}

/// A non-blocking connect to `addr` under way, or how it ended at once.
fn start_connect(addr: SocketAddr) -> Result<Socket, ConnectOutcome> {
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .and_then(|s| s.set_nonblocking(true).map(|()| s))
        .map_err(ConnectOutcome::Other)?;
    match sock.connect(&addr.into()) {
        Ok(()) => Err(ConnectOutcome::Connected),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(sock),
        Err(e) => Err(ConnectOutcome::from_error(e)),
    }
}

/// One connect of [`connects_taking_error_at_once`].
fn connect_taking_error(addr: SocketAddr, timeout: Duration) -> ConnectOutcome {
    match start_connect(addr) {
        Ok(sock) => take_error(&sock, timeout),
        Err(outcome) => outcome,
    }
}

/// Spins on SO_ERROR until the connect under way on `sock` ends, or `timeout`.
fn take_error(sock: &Socket, timeout: Duration) -> ConnectOutcome {
    let deadline = Instant::now() + timeout;
    for spin in 0u64.. {
        match sock.take_error() {
            Ok(Some(e)) => return ConnectOutcome::from_error(e),
            Ok(None) => {}
            Err(e) => return ConnectOutcome::Other(e),
        }
        // The rarer checks only now and then: the spin is what matters.
        if spin % 256 == 255 {
            if sock.peer_addr().is_ok() {
                return ConnectOutcome::Connected;
            }
            if Instant::now() >= deadline {
                return ConnectOutcome::TimedOut;
            }
        }
    }
    unreachable!("the spin ends by returning")
}

/// Pins the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside it, and
    // sched_setaffinity (pid 0: this thread) only reads it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity to CPU {cpu}: {}",
        io::Error::last_os_error()
    );
}

/// From inside `netns`: connects to `addr`, sends `payload`, and reads until
/// as many bytes came back (an echo) or the peer closed. Every step is bounded
/// by `timeout`. Errors are returned as they come (`ConnectionReset` when the
/// peer aborts). `timeout` is scaled like the waits on the agent
/// ([`crate::agent::scaled`]): under emulation a transfer takes longer.
pub fn tcp_request(
    netns: &str,
    addr: SocketAddr,
    payload: &[u8],
    timeout: Duration,
) -> io::Result<Vec<u8>> {
    let len = payload.len();
    let timeout = crate::agent::scaled(timeout);
    in_netns(netns, || {
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        // Written from another thread while this one reads: an echo of a payload larger
        // than the socket buffers would otherwise block both ends (on a slow machine,
        // before autotuning grows the buffers).
        let mut writer = stream.try_clone()?;
        let payload = payload.to_vec();
        let sender = std::thread::spawn(move || writer.write_all(&payload));
        let mut reply = vec![0; len];
        let mut got = 0;
        let read = loop {
            if got == reply.len() {
                break Ok(());
            }
            match stream.read(&mut reply[got..]) {
                Ok(0) => break Ok(()),
                Ok(n) => got += n,
                Err(e) => break Err(e),
            }
        };
        let sent = sender
            .join()
            .map_err(|_| io::Error::other("the writer thread panicked"))?;
        sent?;
        read?;
        reply.truncate(got);
        Ok(reply)
    })
}

/// A transfer big enough to fill full-size segments for a while: the tests' bulk.
pub const BULK: usize = 200 * 1024;

/// Sends [`BULK`] bytes of `byte` from pod A to pod B's `port`, where the caller runs an
/// echo server, and returns what came back; see [`tcp_request`].
pub fn bulk_to_pod_b(
    topo: &crate::Topology,
    port: u16,
    byte: u8,
    timeout: Duration,
) -> io::Result<Vec<u8>> {
    tcp_request(
        &topo.pod_a,
        topo.pod_b_addr(port),
        &vec![byte; BULK],
        timeout,
    )
}

/// What a [`TcpServer`] does with each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerMode {
    /// Echoes everything back until the client closes.
    Echo,
    /// Reads one byte, then aborts the connection (`SO_LINGER` 0: the close
    /// sends a RST), so the client sees `ECONNRESET`.
    ResetAfterFirstByte,
}

/// A TCP server listening inside a namespace; stops (and closes its
/// connections) on drop.
#[derive(Debug)]
pub struct TcpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl TcpServer {
    /// Binds `addr` inside `netns` and serves in the background. Returns once
    /// the socket listens; panics when it cannot bind.
    pub fn start(netns: &str, addr: SocketAddr, mode: ServerMode) -> TcpServer {
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (bound_tx, bound_rx) = mpsc::channel();
        let ns = netns.to_owned();
        let thread = {
            let (stop, accepted) = (Arc::clone(&stop), Arc::clone(&accepted));
            thread::Builder::new()
                .name(format!("srv-{addr}"))
                .spawn(move || {
                    if let Err(e) = enter_netns(&ns) {
                        let _ = bound_tx.send(Err(io::Error::other(e.to_string())));
                        return;
                    }
                    let listener = match TcpListener::bind(addr) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = bound_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = bound_tx.send(Ok(()));
                    serve(&listener, mode, &stop, &accepted);
                })
                .expect("cannot spawn server thread")
        };
        let server = TcpServer {
            addr,
            stop,
            accepted,
            thread: Some(thread),
        };
        match bound_rx.recv() {
            Ok(Ok(())) => server,
            Ok(Err(e)) => panic!("server in {netns} cannot bind {addr}: {e}"),
            Err(_) => panic!("server thread in {netns} for {addr} died before binding"),
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many connections it has accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Waits up to `timeout` for at least `n` accepted connections (the kernel completes
    /// a handshake before the server thread's `accept` returns); the count reached.
    pub fn wait_accepted(&self, n: usize, timeout: std::time::Duration) -> usize {
        let deadline = std::time::Instant::now() + timeout;
        while self.accepted() < n && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        self.accepted()
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How often the accept loop and connection workers look at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

fn serve(listener: &TcpListener, mode: ServerMode, stop: &Arc<AtomicBool>, accepted: &AtomicUsize) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let poll_ms = i32::try_from(STOP_POLL.as_millis()).unwrap_or(i32::MAX);
    while !stop.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1.
        let ready = unsafe { libc::poll(&mut pfd, 1, poll_ms) };
        if ready <= 0 {
            continue;
        }
        let Ok((stream, _peer)) = listener.accept() else {
            continue;
        };
        accepted.fetch_add(1, Ordering::SeqCst);
        let stop = Arc::clone(stop);
        workers.push(thread::spawn(move || handle_conn(stream, mode, &stop)));
    }
    for worker in workers {
        let _ = worker.join();
    }
}

/// Reads into `buf`, waking every [`STOP_POLL`] to honour `stop`. `None` at
/// end of stream, on error, or when stopped.
fn read_some(stream: &mut TcpStream, buf: &mut [u8], stop: &AtomicBool) -> Option<usize> {
    loop {
        match stream.read(buf) {
            Ok(0) => return None,
            Ok(n) => return Some(n),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if stop.load(Ordering::SeqCst) {
                    return None;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

fn handle_conn(mut stream: TcpStream, mode: ServerMode, stop: &AtomicBool) {
    if stream.set_read_timeout(Some(STOP_POLL)).is_err() {
        return;
    }
    match mode {
        ServerMode::Echo => {
            let mut buf = [0u8; 4096];
            while let Some(n) = read_some(&mut stream, &mut buf, stop) {
                if stream.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
        ServerMode::ResetAfterFirstByte => {
            let mut byte = [0u8; 1];
            if read_some(&mut stream, &mut byte, stop).is_some() {
                // Linger 0: dropping the socket discards it with a RST.
                let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_connect_errors() {
        let e = |errno| io::Error::from_raw_os_error(errno);
        assert!(matches!(
            ConnectOutcome::from_error(e(libc::ECONNREFUSED)),
            ConnectOutcome::Refused
        ));
        assert!(matches!(
            ConnectOutcome::from_error(e(libc::ETIMEDOUT)),
            ConnectOutcome::TimedOut
        ));
        assert!(matches!(
            ConnectOutcome::from_error(io::Error::new(ErrorKind::TimedOut, "deadline")),
            ConnectOutcome::TimedOut
        ));
        assert!(matches!(
            ConnectOutcome::from_error(e(libc::EHOSTUNREACH)),
            ConnectOutcome::Unreachable(libc::EHOSTUNREACH)
        ));
        assert!(matches!(
            ConnectOutcome::from_error(e(libc::EINVAL)),
            ConnectOutcome::Other(_)
        ));
    }
}
