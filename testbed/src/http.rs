//! `GET` on an HTTP endpoint from inside a network namespace, with ureq.
//!
//! ureq opens its socket on the calling thread, so the request runs inside [`in_netns`]
//! and the connection belongs to that namespace. Each request gets its own ureq agent:
//! a pooled connection to `127.0.0.1:PORT` of one namespace must never serve a request
//! meant for another namespace's `127.0.0.1:PORT`.

use std::time::Duration;

use crate::{Error, Result, netns::in_netns};

/// Bound on the whole request, connect to last body byte.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest body read (a `/metrics` or `/findings` answer is far smaller).
const MAX_BODY: u64 = 64 * 1024 * 1024;

/// An HTTP response: what the testbed's callers look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// The `Content-Type` header, `""` when absent.
    pub content_type: String,
    pub body: String,
}

/// `GET path` on `addr` (e.g. `"127.0.0.1:9090"`) from inside `netns`, with an `Accept`
/// header when given and `Connection: close`. Any status is a response; failing to
/// connect, a timeout or a malformed answer is an error.
pub fn get(netns: &str, addr: &str, path: &str, accept: Option<&str>) -> Result<Response> {
    let url = format!("http://{addr}{path}");
    in_netns(netns, || get_here(&url, accept))?
}

/// `GET url` from the calling thread's namespace; see [`get`].
pub fn get_here(url: &str, accept: Option<&str>) -> Result<Response> {
    let http_err = |source| Error::Http {
        url: url.to_owned(),
        source: Box::new(source),
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .http_status_as_error(false)
        .max_idle_connections(0)
        .build()
        .into();
    let mut request = agent
        .get(url)
        .header_raw("Accept", accept.unwrap_or("*/*").as_bytes())
        .header_raw("Connection", b"close");
    // ureq only sets a User-Agent of its own when none is given; keep requests minimal.
    request = request.header("User-Agent", "node-diag-testbed");
    let mut response = request.call().map_err(http_err)?;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response
        .body_mut()
        .with_config()
        .limit(MAX_BODY)
        .read_to_string()
        .map_err(http_err)?;
    Ok(Response {
        status,
        content_type,
        body,
    })
}

/// Like [`get`], the body of a `200` answer; any other status is an error.
pub fn get_ok(netns: &str, addr: &str, path: &str) -> Result<String> {
    let response = get(netns, addr, path, None)?;
    if response.status != 200 {
        return Err(Error::HttpStatus {
            url: format!("http://{addr}{path}"),
            status: response.status,
            body: response.body,
        });
    }
    Ok(response.body)
}
