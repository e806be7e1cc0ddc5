//! The admin API (`/admin/v1`): award definitions, functions, users'
//! awards and processing logs, sources, pre-filter pipelines, proxy pools
//! and webhooks. Each
//! concern's routes live in their own file and answer typed bodies, each
//! documented in `openapi.json` (a test holds them to it both ways).

mod awards;
mod functions;
mod pipelines;
mod proxies;
mod sources;
mod users;
mod webhooks;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use chrono::SecondsFormat;
use serde::Serialize;

use super::auth::Role;
use super::{ApiError, AppState, auth};
use crate::store::AuditEntry;

pub(super) use users::{LogEntry, log_entry};

pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    let function_limit = state.max_function_bytes();
    let body_limit = state.settings.max_body_bytes;
    Router::new()
        .route("/awards", get(awards::list))
        .route(
            "/awards/{id}",
            get(awards::get).put(awards::put).delete(awards::delete),
        )
        .route("/awards/{id}/backfill", post(awards::backfill))
        .route("/awards/{id}/dry-run", post(awards::dry_run))
        .route("/functions", get(functions::list))
        .route(
            "/functions/{name}",
            put(functions::push).layer(DefaultBodyLimit::max(function_limit)),
        )
        .route("/functions/{name}/promote", post(functions::promote))
        .route("/functions/{name}/rollback", post(functions::rollback))
        .route("/functions/{name}/diff", get(functions::diff))
        .route(
            "/functions/{name}/versions/{version}",
            get(functions::download),
        )
        .route("/users/{user_id}/awards", get(users::awards))
        .route("/users/{user_id}/log", get(users::log))
        .route(
            "/users/{user_id}/state",
            get(users::state).put(users::set_state),
        )
        .route(
            "/users/{user_id}/badges",
            get(users::badge_choice).put(users::set_badge_choice),
        )
        .route(
            "/users/{user_id}/awards/{award_id}/explain",
            get(super::explain::explain),
        )
        .route("/sources", get(sources::list))
        .route("/sources/{name}/pause", post(sources::pause))
        .route("/sources/{name}/resume", post(sources::resume))
        .route("/sources/{name}/dead-letters", get(sources::dead_letters))
        .route("/sources/{name}/dead-letters/replay", post(sources::replay))
        .route("/proxy-pools", get(proxies::list))
        .route(
            "/proxy-pools/{pool}",
            get(proxies::get).put(proxies::put).delete(proxies::delete),
        )
        .route("/proxy-pools/{pool}/candidates", put(proxies::candidates))
        .route("/proxy-pools/{pool}/allocate", post(proxies::allocate))
        .route("/pipelines", get(pipelines::list))
        .route(
            "/pipelines/{name}",
            get(pipelines::get)
                .put(pipelines::put)
                .delete(pipelines::delete),
        )
        .route("/pipelines/{name}/pause", post(pipelines::pause))
        .route("/pipelines/{name}/resume", post(pipelines::resume))
        .route(
            "/pipelines/{name}/dead-letters/replay",
            post(pipelines::replay),
        )
        .route("/audit", get(audit))
        .route("/whoami", get(whoami))
        .route("/webhooks", get(webhooks::list))
        .route(
            "/webhooks/{name}",
            get(webhooks::get)
                .put(webhooks::put)
                .delete(webhooks::delete),
        )
        .fallback(super::no_route)
        .layer(DefaultBodyLimit::max(body_limit))
        // Everything under /admin/v1, routes or not, needs the token.
        .layer(middleware::from_fn_with_state(state, admin_only))
}

/// What a write changed, for the audit log: set by the handler on its
/// response.
#[derive(Debug, Clone)]
struct AuditTarget {
    target: String,
    before: Option<i32>,
    after: Option<i32>,
}

/// The admin token for every path (401 without a valid one); a read
/// token's write is refused (403); every write is recorded in the audit log
/// with the token's name, whatever its outcome.
async fn admin_only(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = match auth::admin(&headers, &state.admin_tokens) {
        Ok(caller) => caller,
        Err(error) => return error.into_response(),
    };
    let method = request.method().clone();
    let write = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
    // The full path with its query (`?force=true` matters): this router is
    // nested under /admin/v1.
    let path = request
        .uri()
        .path_and_query()
        .map_or_else(|| request.uri().path(), |p| p.as_str());
    let path = crate::text::printable(&format!("/admin/v1{path}"), 2048);
    if write && caller.role == Role::Read {
        let response = ApiError::Forbidden(format!(
            "token {} is read-only; {method} is a write",
            caller.name
        ))
        .into_response();
        // A write refused is recorded too: who tried what.
        record(&state, &caller, &method, path, Written::of(&response)).await;
        return response;
    }
    request.extensions_mut().insert(caller.clone());
    let response = next.run(request).await;
    if write {
        record(&state, &caller, &method, path, Written::of(&response)).await;
    }
    response
}

/// What a write's response says for the audit log (taken before any
/// await: a response is not `Sync`).
struct Written {
    status: i32,
    target: Option<AuditTarget>,
}

impl Written {
    fn of(response: &Response) -> Written {
        Written {
            status: i32::from(response.status().as_u16()),
            target: response.extensions().get::<AuditTarget>().cloned(),
        }
    }
}

/// Records a write (done or refused) in the audit log.
async fn record(
    state: &AppState,
    caller: &auth::Caller,
    method: &Method,
    path: String,
    written: Written,
) {
    let target = written.target;
    let entry = AuditEntry {
        token_name: caller.name.clone(),
        method: method.to_string(),
        path,
        status: written.status,
        target: target.as_ref().map(|t| t.target.clone()),
        version_before: target.as_ref().and_then(|t| t.before),
        version_after: target.as_ref().and_then(|t| t.after),
        ..AuditEntry::default()
    };
    let recorded = match state.store().await {
        Ok(store) => store.record_audit(&entry).await.map_err(|e| e.to_string()),
        Err(error) => Err(error.to_string()),
    };
    if let Err(error) = recorded {
        tracing::error!(message = "Failed to record an admin write in the audit log.", token = %entry.token_name, method = %entry.method, path = %entry.path, %error);
    }
}

/// `GET /whoami`: the caller's token name and role (the console greys out
/// writes for a read token).
#[derive(Debug, Serialize)]
struct WhoAmI {
    name: String,
    role: &'static str,
}

async fn whoami(axum::Extension(caller): axum::Extension<auth::Caller>) -> Json<WhoAmI> {
    Json(WhoAmI {
        name: caller.name,
        role: caller.role.as_str(),
    })
}

async fn audit(
    State(state): State<Arc<AppState>>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<AuditPage>, ApiError> {
    let (limit, before) = page(&query)?;
    let rows = state.store().await?.audit(limit, before).await?;
    let next = next_before(rows.iter().map(|r| r.id), limit);
    let entries = rows
        .into_iter()
        .map(|r| AuditLine {
            id: r.id,
            at: r.at.map(time),
            token: r.token_name,
            method: r.method,
            path: r.path,
            status: r.status,
            target: r.target,
            version_before: r.version_before,
            version_after: r.version_after,
        })
        .collect();
    Ok(Json(AuditPage {
        entries,
        next_before: next,
    }))
}

/// `GET /audit`: admin writes, newest first, a page at a time.
#[derive(Debug, Serialize)]
struct AuditPage {
    entries: Vec<AuditLine>,
    /// Pass as `before` for the next page (`null`: the last page).
    next_before: Option<i64>,
}

#[derive(Debug, Serialize)]
struct AuditLine {
    id: i64,
    at: Option<String>,
    /// The admin token's name.
    token: String,
    method: String,
    path: String,
    status: i32,
    target: Option<String>,
    version_before: Option<i32>,
    version_after: Option<i32>,
}

pub(super) fn time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

// --- shared by the routes ------------------------------------------------

/// A page of a log, newest first: this many entries unless asked.
const PAGE: i64 = 50;
const PAGE_MAX: i64 = 1000;

/// `?limit=` (within `PAGE_MAX`) and `?before=` of a paged read.
fn page(query: &HashMap<String, String>) -> Result<(i64, Option<i64>), ApiError> {
    let limit = positive(query, "limit")?.unwrap_or(PAGE).min(PAGE_MAX);
    Ok((limit, positive(query, "before")?))
}

/// The id to pass as `before` for the next page: the last row's, if the
/// page is full (`None`: this is the last page).
fn next_before(
    ids: impl DoubleEndedIterator<Item = i64> + ExactSizeIterator,
    limit: i64,
) -> Option<i64> {
    (ids.len() as i64 == limit).then(|| ids.last()).flatten()
}

/// A positive whole-number query parameter, if given.
fn positive(query: &HashMap<String, String>, name: &str) -> Result<Option<i64>, ApiError> {
    query
        .get(name)
        .map(|v| {
            v.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "query parameter {name} must be a positive whole number, not {v:?}"
                ))
            })
        })
        .transpose()
}

/// A true/false query parameter (`?force` alone is true).
fn flag(query: &HashMap<String, String>, name: &str) -> Result<bool, ApiError> {
    match query.get(name).map(String::as_str) {
        None | Some("false") | Some("0") => Ok(false),
        Some("") | Some("true") | Some("1") => Ok(true),
        Some(other) => Err(ApiError::BadRequest(format!(
            "query parameter {name} must be true or false, not {other:?}"
        ))),
    }
}
