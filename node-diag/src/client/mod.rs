//! `node-diag findings`: reads a running agent's `/findings` over plain HTTP/1.1 (ureq,
//! no TLS) and prints them, optionally following new and growing findings.

use std::{collections::HashMap, io::Write as _, time::Duration};

use crate::{
    findings::{Finding, Status},
    output::{OutputFormat, print_finding},
};

/// Bound on connecting to the agent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on the whole request, connect to last body byte.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Largest `/findings` answer read.
const MAX_BODY: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("bad server URL {0:?}: expected http://HOST:PORT")]
    Url(String),
    #[error("cannot reach the agent at {url}: {source} (is `node-diag run` running? see --server)")]
    Connect {
        url: String,
        source: Box<ureq::Error>,
    },
    #[error("the agent at {url} answered {status}")]
    Status { url: String, status: u16 },
    #[error("the agent at {url} sent findings node-diag cannot parse: {source}")]
    Parse {
        url: String,
        source: serde_json::Error,
    },
}

/// `host:port` of an `http://` URL (a bare `host:port` is accepted too).
pub(crate) fn authority(url: &str) -> Result<String, ClientError> {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let auth = rest.split('/').next().unwrap_or("");
    if url.contains("://") && !url.starts_with("http://") || auth.is_empty() || !auth.contains(':')
    {
        return Err(ClientError::Url(url.to_string()));
    }
    Ok(auth.to_string())
}

/// `GET path` on the agent at `url`: the body of a `200` answer, decoded (chunked or not)
/// as bytes before it is read as UTF-8 text.
pub(crate) fn get(url: &str, path: &str) -> Result<String, ClientError> {
    let target = format!("http://{}{path}", authority(url)?);
    let connect_err = |source| ClientError::Connect {
        url: url.to_string(),
        source: Box::new(source),
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_global(Some(TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent.get(&target).call().map_err(connect_err)?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(ClientError::Status {
            url: url.to_string(),
            status,
        });
    }
    response
        .body_mut()
        .with_config()
        .limit(MAX_BODY)
        .read_to_string()
        .map_err(connect_err)
}

pub(crate) fn fetch(url: &str) -> Result<Vec<Finding>, ClientError> {
    let body = get(url, "/findings")?;
    serde_json::from_str(&body).map_err(|source| ClientError::Parse {
        url: url.to_string(),
        source,
    })
}

/// Prints the agent's findings; with `follow`, keeps polling and prints each finding again
/// whenever its count grows or its status changes (resolved, superseded), until
/// interrupted.
pub(crate) fn run(
    url: &str,
    follow: bool,
    format: OutputFormat,
    poll: Duration,
) -> Result<(), ClientError> {
    let mut seen: HashMap<String, (u64, Status)> = HashMap::new();
    loop {
        for f in fetch(url)? {
            let key = format!(
                "{}|{}|{:?}|{:?}|{:?}|{:?}",
                f.kind, f.layer, f.src, f.dst, f.dport, f.netns
            );
            let now = (f.count, f.status);
            if seen.get(&key) != Some(&now) {
                seen.insert(key, now);
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

    /// Serves `response` (raw bytes) to one connection on 127.0.0.1; returns the URL.
    fn serve_once(response: &'static [u8]) -> String {
        use std::io::{Read as _, Write as _};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let n = conn.read(&mut buf).unwrap();
                if n == 0 {
                    return;
                }
                request.extend_from_slice(&buf[..n]);
            }
            conn.write_all(response).unwrap();
        });
        url
    }

    #[test]
    fn chunk_boundary_inside_a_utf8_character() {
        // "é" is C3 A9: the first chunk ends after C3, the second starts with A9.
        let url = serve_once(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
              3\r\n[\"\xc3\r\n3\r\n\xa9\"]\r\n0\r\n\r\n",
        );
        assert_eq!(get(&url, "/findings").unwrap(), "[\"\u{e9}\"]");
    }

    #[test]
    fn status_is_checked_as_a_number() {
        let url = serve_once(b"HTTP/1.1 404 Not 200 Found\r\nContent-Length: 0\r\n\r\n");
        match get(&url, "/findings") {
            Err(ClientError::Status { status, .. }) => assert_eq!(status, 404),
            other => panic!("expected a status error, got {other:?}"),
        }
    }
}
