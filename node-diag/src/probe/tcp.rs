//! `--port`: one TCP connect to DST:P, classified as ok, refused, timed out or
//! unreachable from the error the kernel gives it.

use std::{
    io::{self, ErrorKind},
    net::{IpAddr, SocketAddr, TcpStream},
    time::Duration,
};

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TcpResult {
    /// The handshake completed.
    Ok,
    /// RST in answer to the SYN: nothing listens (or a firewall rejects with RST).
    Refused,
    /// No answer within the timeout: dropped somewhere.
    TimedOut,
    /// An ICMP error (or a local routing error) failed the connect.
    Unreachable,
    /// Any other error.
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct TcpReport {
    pub(crate) port: u16,
    pub(crate) result: TcpResult,
    pub(crate) errno: Option<i32>,
}

/// Maps a connect error to its class and errno.
pub(crate) fn classify_connect(err: &io::Error) -> (TcpResult, Option<i32>) {
    let errno = err.raw_os_error();
    let result = match errno {
        Some(libc::ECONNREFUSED) => TcpResult::Refused,
        Some(libc::ETIMEDOUT) => TcpResult::TimedOut,
        Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::ENETDOWN) => {
            TcpResult::Unreachable
        }
        // std's connect_timeout reports its own deadline without an errno.
        None if err.kind() == ErrorKind::TimedOut => TcpResult::TimedOut,
        _ => TcpResult::Error,
    };
    (result, errno)
}

pub(crate) fn tcp_check(dst: IpAddr, port: u16, timeout: Duration) -> TcpReport {
    let (result, errno) = match TcpStream::connect_timeout(&SocketAddr::new(dst, port), timeout) {
        Ok(_) => (TcpResult::Ok, None),
        Err(e) => classify_connect(&e),
    };
    tracing::debug!(port, ?result, ?errno, "tcp connect");
    TcpReport {
        port,
        result,
        errno,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_connect_errors() {
        let e = |errno| io::Error::from_raw_os_error(errno);
        assert_eq!(
            classify_connect(&e(libc::ECONNREFUSED)).0,
            TcpResult::Refused
        );
        assert_eq!(classify_connect(&e(libc::ETIMEDOUT)).0, TcpResult::TimedOut);
        assert_eq!(
            classify_connect(&io::Error::new(ErrorKind::TimedOut, "deadline")),
            (TcpResult::TimedOut, None)
        );
        assert_eq!(
            classify_connect(&e(libc::EHOSTUNREACH)),
            (TcpResult::Unreachable, Some(libc::EHOSTUNREACH))
        );
        assert_eq!(classify_connect(&e(libc::EINVAL)).0, TcpResult::Error);
    }
}
