//! The agent's HTTP endpoints: `/metrics` (OpenMetrics, or the classic text format for
//! clients that do not ask for OpenMetrics), `/findings` (JSON array),
//! `/healthz` (process alive) and `/readyz` (programs attached, serving).
//!
//! Two routers, one per listener (served by `serve`): the scrape listener's
//! ([`scrape_router`]: `/metrics`, `/healthz`, `/readyz`, and `/findings` only where
//! clients are authenticated by certificate) and the findings listener's
//! ([`findings_router`]: `/findings`, `/healthz`, `/readyz`).

use std::sync::Arc;

use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::IntoResponse,
    routing::get,
};

use super::state::Shared;

pub(crate) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub(crate) const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The scrape listener's routes. With `findings` false, `/findings` answers 404 with
/// where it is served instead.
pub(crate) fn scrape_router(shared: Arc<Shared>, findings: bool) -> Router {
    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    let router = if findings {
        router.route("/findings", get(self::findings))
    } else {
        router.route("/findings", get(findings_elsewhere))
    };
    router.with_state(shared)
}

/// The findings listener's routes; the probes too, as on loopback nothing off the node
/// can exhaust its connections.
pub(crate) fn findings_router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/findings", get(findings))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(shared)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn findings_elsewhere() -> (StatusCode, &'static str) {
    (
        StatusCode::NOT_FOUND,
        "/findings is served on the findings listener (--findings-listen, 127.0.0.1:9465 by default), or here over TLS with client certificates required (client_auth_type: RequireAndVerifyClientCert)\n",
    )
}

/// OpenMetrics when the client accepts it (Prometheus does), else the classic text format.
async fn metrics(State(s): State<Arc<Shared>>, headers: HeaderMap) -> impl IntoResponse {
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let metrics = s.metrics();
    let (body, content_type) = if openmetrics {
        (metrics.encode(), OPENMETRICS)
    } else {
        (metrics.encode_text(), PROMETHEUS_TEXT)
    };
    drop(metrics);
    match body {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, content_type)], body).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Filtered by the query parameters, from a snapshot: see [`super::findings_api`].
async fn findings(State(s): State<Arc<Shared>>, uri: axum::http::Uri) -> axum::response::Response {
    super::findings_api::answer(s, uri).await
}

async fn readyz(State(s): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    if s.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}
