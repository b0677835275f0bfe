//! `GET /findings`: the findings a query asks for (`crate::findings::query`), as a JSON
//! array oldest first, with `X-Node-Diag-Total` (matches before the limit) and
//! `X-Node-Diag-Truncated: true` when the limit left some out. A bad parameter is a
//! `400` with one line naming what is valid.
//!
//! The store's lock, which the event loop takes for every verdict, is held only to take
//! a [`Snapshot`] (a pointer copy while nothing changed); filtering and encoding run
//! on the blocking pool, outside it. Each entry's JSON is encoded once per version
//! and shared by every request (see `crate::findings::store::Held`), so a poll of a
//! full store costs a copy of its bytes, not their encoding; and the copy is made
//! [`CHUNK`] bytes at a time as the connection takes them, so eight clients polling
//! a store of megabytes do not each hold a copy of it.

use std::{convert::Infallible, sync::Arc, time::SystemTime};

use axum::{
    body::{Body, Bytes},
    extract::Query as RawParams,
    http::{HeaderName, HeaderValue, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};

use super::state::Shared;
use crate::findings::{
    query::{Query, QueryError},
    store::{Held, Snapshot},
};

/// Bytes of the body handed to the connection at a time.
const CHUNK: usize = 64 * 1024;

pub(crate) const TOTAL: HeaderName = HeaderName::from_static("x-node-diag-total");
pub(crate) const TRUNCATED: HeaderName = HeaderName::from_static("x-node-diag-truncated");

/// Answers `GET /findings?…` (`uri` carries the query).
pub(crate) async fn answer(shared: Arc<Shared>, uri: Uri) -> Response {
    let query = match parse(&uri) {
        Ok(q) => q,
        Err(e) => return bad_request(&e.to_string()),
    };
    let snapshot = shared.store().snapshot();
    match tokio::task::spawn_blocking(move || encode(&snapshot, &query)).await {
        Ok(answer) => answer.into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the findings: {e}\n"),
        )
            .into_response(),
    }
}

fn parse(uri: &Uri) -> Result<Query, String> {
    let RawParams(params) = RawParams::<Vec<(String, String)>>::try_from_uri(uri)
        .map_err(|e| format!("bad query string: {}", e.body_text()))?;
    Query::parse(&params, SystemTime::now()).map_err(|e: QueryError| e.to_string())
}

fn bad_request(message: &str) -> Response {
    // One line, whatever the message quoted from the request.
    let line = message.replace(['\r', '\n'], " ");
    (
        StatusCode::BAD_REQUEST,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{line}\n"),
    )
        .into_response()
}

/// The selected findings, their JSON encoded, and the headers.
struct Answer {
    body: Chunks,
    total: usize,
    truncated: bool,
}

fn encode(snapshot: &Snapshot, query: &Query) -> Answer {
    let selection = query.select(&snapshot[..], |held| held.finding());
    for held in &selection.picked {
        // Here, on the blocking pool, rather than as the body is sent.
        held.json();
    }
    let (total, truncated) = (selection.total, selection.truncated());
    Answer {
        body: Chunks {
            picked: selection.picked.into_iter().cloned().collect(),
            next: 0,
            opened: false,
            closed: false,
        },
        total,
        truncated,
    }
}

/// The JSON array of `picked`, [`CHUNK`] bytes (or one finding) at a time.
struct Chunks {
    picked: Vec<Arc<Held>>,
    next: usize,
    opened: bool,
    closed: bool,
}

impl Iterator for Chunks {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        if self.closed {
            return None;
        }
        let mut buf = Vec::with_capacity(CHUNK + 1024);
        if !self.opened {
            buf.push(b'[');
            self.opened = true;
        }
        while self.next < self.picked.len() && buf.len() < CHUNK {
            if self.next > 0 {
                buf.push(b',');
            }
            buf.extend_from_slice(self.picked[self.next].json().as_bytes());
            self.next += 1;
        }
        if self.next == self.picked.len() {
            buf.push(b']');
            self.closed = true;
        }
        Some(Bytes::from(buf))
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let body = Body::from_stream(futures_util::stream::iter(
            self.body.map(Ok::<_, Infallible>),
        ));
        let mut response = (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        let headers = response.headers_mut();
        headers.insert(TOTAL, HeaderValue::from(self.total));
        if self.truncated {
            headers.insert(TRUNCATED, HeaderValue::from_static("true"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{
        agent::metrics::Metrics,
        findings::{Finding, Kind, Store, fixtures},
    };

    fn shared(findings: impl IntoIterator<Item = Finding>) -> Arc<Shared> {
        let mut store = Store::new(Duration::from_secs(10), 100).on_node("node-a".into());
        for f in findings {
            store.record(f, Instant::now());
        }
        Arc::new(Shared::new(Metrics::new(), store))
    }

    fn refused(port: u16, seen: &str) -> Finding {
        let mut f = fixtures::refused(1000);
        f.dport = Some(port);
        f.last_seen = seen.into();
        f
    }

    async fn get(shared: &Arc<Shared>, uri: &str) -> (StatusCode, Vec<(String, String)>, String) {
        let response = answer(shared.clone(), uri.parse().unwrap()).await;
        let status = response.status();
        let headers = response
            .headers()
            .iter()
            .filter(|(k, _)| k.as_str().starts_with("x-node-diag"))
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn answers_the_selection_as_json_with_its_total() {
        let s = shared([
            refused(1, "2026-01-01T10:00:02.000Z"),
            refused(2, "2026-01-01T10:00:01.000Z"),
            refused(3, "2026-01-01T10:00:03.000Z"),
        ]);
        let (status, headers, body) = get(&s, "/findings").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers, [("x-node-diag-total".into(), "3".into())]);
        let got: Vec<Finding> = serde_json::from_str(&body).unwrap();
        let ports: Vec<_> = got.iter().map(|f| f.dport.unwrap()).collect();
        assert_eq!(ports, [2, 1, 3], "oldest first");
        assert!(got.iter().all(|f| f.node == "node-a" && f.id.len() == 16));

        let (_, headers, body) = get(&s, "/findings?limit=2&kind=tcp_refused").await;
        assert_eq!(
            headers,
            [
                ("x-node-diag-total".into(), "3".into()),
                ("x-node-diag-truncated".into(), "true".into())
            ]
        );
        let got: Vec<Finding> = serde_json::from_str(&body).unwrap();
        let ports: Vec<_> = got.iter().map(|f| f.dport.unwrap()).collect();
        assert_eq!(ports, [1, 3], "the most recent");

        let (_, headers, body) = get(&s, "/findings?kind=tcp_reset").await;
        assert_eq!(headers, [("x-node-diag-total".into(), "0".into())]);
        assert_eq!(body, "[]");
    }

    #[test]
    fn the_body_is_one_array_in_chunks() {
        let many: Vec<Finding> = (1..=400)
            .map(|p| refused(p, "2026-01-01T10:00:00.000Z"))
            .collect();
        let mut store = Store::new(Duration::from_secs(10), 1000);
        for f in many {
            store.record(f, Instant::now());
        }
        let snapshot = store.snapshot();
        let answer = encode(&snapshot, &Query::default());
        assert_eq!(answer.total, 400);
        let chunks: Vec<Bytes> = answer.body.collect();
        assert!(chunks.len() > 1, "a store this size takes several chunks");
        assert!(chunks.iter().all(|c| c.len() <= CHUNK + 2048));
        let body: Vec<u8> = chunks.concat();
        let back: Vec<Finding> = serde_json::from_slice(&body).unwrap();
        assert_eq!(back.len(), 400);
        let empty: Vec<Bytes> = encode(&snapshot, &parse_query("kind=tcp_reset"))
            .body
            .collect();
        assert_eq!(empty.concat(), b"[]");
    }

    fn parse_query(q: &str) -> Query {
        parse(&format!("/findings?{q}").parse().unwrap()).unwrap()
    }

    #[tokio::test]
    async fn a_bad_parameter_is_a_one_line_400() {
        let s = shared([refused(1, "2026-01-01T10:00:00.000Z")]);
        let (status, _, body) = get(&s, "/findings?kind=nope").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.starts_with("unknown kind \"nope\": valid kinds are tcp_refused,"));
        assert_eq!(body.lines().count(), 1);
        let (status, _, body) = get(&s, "/findings?limit=10001").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.contains("0 to 10000"), "{body}");
        let (status, _, body) = get(&s, "/findings?kind=%0Anope%0A").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body.lines().count(), 1, "{body:?}");
    }

    #[tokio::test]
    async fn answers_follow_the_store_and_an_answer_taken_stays_as_it_was() {
        let s = shared([refused(1, "2026-01-01T10:00:00.000Z")]);
        let before = s.store().snapshot();
        let (_, _, body) = get(&s, "/findings").await;
        assert!(body.contains("\"count\":1"));
        s.store()
            .record(refused(1, "2026-01-01T10:00:05.000Z"), Instant::now());
        let (_, _, body) = get(&s, "/findings").await;
        assert!(body.contains("\"count\":2"), "{body}");
        assert!(body.contains("10:00:05"), "{body}");
        assert_eq!(before[0].finding().count, 1, "a snapshot is not changed");
        assert!(before[0].json().contains("\"count\":1"));
        s.store()
            .resolve(|f| f.kind == Kind::TcpRefused, SystemTime::now());
        let (_, _, body) = get(&s, "/findings?status=resolved").await;
        assert!(body.contains("\"status\":\"resolved\""), "{body}");
    }
}
