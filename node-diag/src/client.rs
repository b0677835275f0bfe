//! `node-diag findings`: reads a running agent's `/findings` over plain HTTP/1.1 and
//! prints them, optionally following new and growing findings.

use std::{
    collections::HashMap,
    io::{Read as _, Write as _},
    net::{TcpStream, ToSocketAddrs as _},
    time::Duration,
};

use crate::{OutputFormat, findings::Finding, output::print_finding};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("bad server URL {0:?}: expected http://HOST:PORT")]
    Url(String),
    #[error("cannot reach the agent at {url}: {source} (is `node-diag run` running? see --server)")]
    Connect { url: String, source: std::io::Error },
    #[error("the agent at {url} answered {status}")]
    Status { url: String, status: String },
    #[error("the agent at {url} sent findings node-diag cannot parse: {source}")]
    Parse {
        url: String,
        source: serde_json::Error,
    },
}

/// `host:port` of an `http://` URL (a bare `host:port` is accepted too).
pub fn authority(url: &str) -> Result<String, ClientError> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let auth = rest.split('/').next().unwrap_or("");
    if url.contains("://") && !url.starts_with("http://") || auth.is_empty() || !auth.contains(':')
    {
        return Err(ClientError::Url(url.to_string()));
    }
    Ok(auth.to_string())
}

pub fn get(url: &str, path: &str) -> Result<String, ClientError> {
    let auth = authority(url)?;
    let connect_err = |source| ClientError::Connect {
        url: url.to_string(),
        source,
    };
    let addr = auth
        .to_socket_addrs()
        .map_err(connect_err)?
        .next()
        .ok_or_else(|| ClientError::Url(url.to_string()))?;
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map_err(connect_err)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(connect_err)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {auth}\r\nConnection: close\r\n\r\n"
    )
    .map_err(connect_err)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(connect_err)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or("").to_string();
    if !status.contains(" 200 ") {
        return Err(ClientError::Status {
            url: url.to_string(),
            status,
        });
    }
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.contains("chunked"));
    Ok(if chunked {
        dechunk(body)
    } else {
        body.to_string()
    })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

pub fn fetch(url: &str) -> Result<Vec<Finding>, ClientError> {
    let body = get(url, "/findings")?;
    serde_json::from_str(&body).map_err(|source| ClientError::Parse {
        url: url.to_string(),
        source,
    })
}

/// Prints the agent's findings; with `follow`, keeps polling and prints each finding again
/// whenever its count grows, until interrupted.
pub fn run(
    url: &str,
    follow: bool,
    format: OutputFormat,
    poll: Duration,
) -> Result<(), ClientError> {
    let mut seen: HashMap<String, u64> = HashMap::new();
    loop {
        for f in fetch(url)? {
            let key = format!(
                "{}|{}|{:?}|{:?}|{:?}|{:?}",
                f.kind, f.layer, f.src, f.dst, f.dport, f.netns
            );
            if seen.get(&key) != Some(&f.count) {
                seen.insert(key, f.count);
                print_finding(&f, format);
            }
        }
        let _ = std::io::stdout().flush();
        if !follow {
            return Ok(());
        }
        std::thread::sleep(poll);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_server_urls() {
        assert_eq!(
            authority("http://127.0.0.1:9464").unwrap(),
            "127.0.0.1:9464"
        );
        assert_eq!(authority("http://localhost:1/x").unwrap(), "localhost:1");
        assert_eq!(authority("10.0.0.1:80").unwrap(), "10.0.0.1:80");
        assert!(authority("https://x:1").is_err());
        assert!(authority("http://nohostport").is_err());
    }

    #[test]
    fn dechunks_bodies() {
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
    }
}
