//! TCP traffic made in-process from inside a namespace: a server guard, a
//! connect that classifies how it failed, a request/response client, and a
//! minimal HTTP/1.1 GET for the agent's endpoints.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use socket2::SockRef;

use crate::netns::{enter_netns, in_netns};

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

/// From inside `netns`: connects to `addr`, sends `payload`, and reads until
/// as many bytes came back (an echo) or the peer closed. Every step is bounded
/// by `timeout`. Errors are returned as they come (`ConnectionReset` when the
/// peer aborts).
pub fn tcp_request(
    netns: &str,
    addr: SocketAddr,
    payload: &[u8],
    timeout: Duration,
) -> io::Result<Vec<u8>> {
    in_netns(netns, || {
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.write_all(payload)?;
        let mut reply = vec![0; payload.len()];
        let mut got = 0;
        while got < reply.len() {
            match stream.read(&mut reply[got..])? {
                0 => break,
                n => got += n,
            }
        }
        reply.truncate(got);
        Ok(reply)
    })
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
                    enter_netns(&ns);
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

/// An HTTP response: status code and body.
pub type HttpResponse = (u16, String);

/// `GET path` on `addr` (e.g. `"127.0.0.1:9090"`) from inside `netns`, over a
/// plain HTTP/1.1 connection with `Connection: close`. Panics on any failure.
pub fn http_get(netns: &str, addr: &str, path: &str) -> HttpResponse {
    try_http_get(netns, addr, path)
        .unwrap_or_else(|e| panic!("GET http://{addr}{path} in {netns} failed: {e}"))
}

/// Like [`http_get`], returning errors instead of panicking.
pub fn try_http_get(netns: &str, addr: &str, path: &str) -> io::Result<HttpResponse> {
    const TIMEOUT: Duration = Duration::from_secs(5);
    in_netns(netns, || {
        let sockaddr = addr.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(ErrorKind::InvalidInput, "address resolves to nothing")
        })?;
        let mut stream = TcpStream::connect_timeout(&sockaddr, TIMEOUT)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        parse_http_response(&raw)
    })
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, msg.into())
}

/// Parses a complete HTTP/1.1 response (status line, headers, then a body
/// delimited by `Content-Length`, chunked encoding, or the end of the stream).
pub fn parse_http_response(raw: &[u8]) -> io::Result<HttpResponse> {
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| bad("headers not UTF-8"))?;
    let body = &raw[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad(format!("bad status line {status_line:?}")))?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| bad("bad Content-Length"))?,
            );
        }
    }
    let body = if chunked {
        decode_chunked(body)?
    } else if let Some(n) = length {
        body.get(..n)
            .ok_or_else(|| bad("body shorter than Content-Length"))?
            .to_vec()
    } else {
        body.to_vec()
    };
    let body = String::from_utf8(body).map_err(|_| bad("body not UTF-8"))?;
    Ok((status, body))
}

fn decode_chunked(mut rest: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("truncated chunk size"))?;
        let size_field = std::str::from_utf8(&rest[..eol]).map_err(|_| bad("bad chunk size"))?;
        let size_hex = size_field.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| bad("bad chunk size"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest.get(..size).ok_or_else(|| bad("truncated chunk"))?;
        out.extend_from_slice(chunk);
        rest = rest.get(size + 2..).ok_or_else(|| bad("truncated chunk"))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length_body() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
        let (status, body) = parse_http_response(raw).unwrap();
        assert_eq!((status, body.as_str()), (200, "hello"));
    }

    #[test]
    fn parses_chunked_body() {
        let raw = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let (status, body) = parse_http_response(raw).unwrap();
        assert_eq!((status, body.as_str()), (404, "abcde"));
    }

    #[test]
    fn body_until_close_without_length() {
        let raw = b"HTTP/1.0 200 OK\r\n\r\nall of it";
        assert_eq!(parse_http_response(raw).unwrap().1, "all of it");
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_http_response(b"nonsense").is_err());
        assert!(parse_http_response(b"HTTP/1.1 abc\r\n\r\n").is_err());
    }

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
