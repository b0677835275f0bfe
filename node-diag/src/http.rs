//! The agent's HTTP endpoints: `/metrics` (OpenMetrics), `/findings` (JSON array),
//! `/healthz` (process alive) and `/readyz` (programs attached, serving).

use std::sync::{Arc, atomic::Ordering};

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};

use crate::{agent::Shared, findings::Finding};

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/findings", get(findings))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(shared)
}

async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    let body = s.metrics.lock().unwrap_or_else(|e| e.into_inner()).encode();
    match body {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn findings(State(s): State<Arc<Shared>>) -> Json<Vec<Finding>> {
    Json(s.store.lock().unwrap_or_else(|e| e.into_inner()).all())
}

async fn readyz(State(s): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}
