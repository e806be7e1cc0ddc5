//! Answers every request with 204 and does nothing else: what serving an
//! HTTP function costs (instantiate + handle), for the benchmark.

use spin_sdk::http::{IntoResponse, Request, StatusCode};
use spin_sdk::http_service;

#[http_service]
async fn noop(_request: Request) -> impl IntoResponse {
    StatusCode::NO_CONTENT
}
