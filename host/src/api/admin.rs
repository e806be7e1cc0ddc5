//! The admin API (`/admin/v1`): award definitions, functions, users'
//! awards and processing logs, sources, proxy pools and webhooks.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use chrono::SecondsFormat;
use serde::Serialize;
use serde_json::{Value, json};

use super::auth::{Caller, Role};
use super::progress::{Audience, user_awards};
use super::{ApiError, AppState, auth, body, json_body, number};
use crate::definitions::{self, ApplyError, DefinitionError, PushError};
use crate::ingest::Verdict;
use crate::runtime::FunctionKind;
use crate::store::{AuditEntry, LogRecord, PushOutcome, Webhook};

pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    let function_limit = state.max_function_bytes();
    let body_limit = state.settings.max_body_bytes;
    Router::new()
        .route("/awards", get(list_awards))
        .route(
            "/awards/{id}",
            get(get_award).put(put_award).delete(delete_award),
        )
        .route("/functions", get(list_functions))
        .route(
            "/functions/{name}",
            put(put_function).layer(DefaultBodyLimit::max(function_limit)),
        )
        .route("/users/{user_id}/awards", get(get_user_awards))
        .route("/users/{user_id}/log", get(get_user_log))
        .route(
            "/users/{user_id}/awards/{award_id}/explain",
            get(super::explain::explain),
        )
        .route("/sources", get(list_sources))
        .route("/sources/{name}/pause", post(pause_source))
        .route("/sources/{name}/resume", post(resume_source))
        .route("/sources/{name}/dead-letters", get(list_dead_letters))
        .route(
            "/sources/{name}/dead-letters/replay",
            post(replay_dead_letters),
        )
        .route(
            "/proxy-pools/{pool}",
            get(get_pool).put(put_pool).delete(delete_pool),
        )
        .route("/proxy-pools/{pool}/candidates", put(put_candidates))
        .route("/proxy-pools/{pool}/allocate", post(allocate))
        .route("/audit", get(get_audit))
        .route("/webhooks", get(list_webhooks))
        .route(
            "/webhooks/{name}",
            get(get_webhook).put(put_webhook).delete(delete_webhook),
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
    if write && caller.role == Role::Read {
        return ApiError::Forbidden(format!(
            "token {} is read-only; {method} is a write",
            caller.name
        ))
        .into_response();
    }
    // The full path: this router is nested under /admin/v1.
    let path = format!("/admin/v1{}", request.uri().path());
    request.extensions_mut().insert(caller.clone());
    let response = next.run(request).await;
    if write {
        let target = response.extensions().get::<AuditTarget>().cloned();
        let entry = AuditEntry {
            token_name: caller.name,
            method: method.to_string(),
            path,
            status: i32::from(response.status().as_u16()),
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
    response
}

async fn get_audit(
    State(state): State<Arc<AppState>>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = positive(&query, "limit")?
        .unwrap_or(LOG_PAGE)
        .min(LOG_PAGE_MAX);
    let before = positive(&query, "before")?;
    let rows = state.store().await?.audit(limit, before).await?;
    let next = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
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

// --- awards -------------------------------------------------------------

/// An award definition as stored: `GET /awards` lists them, `GET
/// /awards/{id}` adds what its objectives hold.
#[derive(Debug, Serialize)]
struct StoredAward {
    id: String,
    version: i32,
    enabled: bool,
    updated_at: String,
    definition: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    held: Option<Vec<HeldObjective>>,
}

impl StoredAward {
    fn of(row: &crate::store::AwardRow) -> StoredAward {
        StoredAward {
            id: row.id.clone(),
            version: row.version,
            enabled: row.enabled,
            updated_at: time(row.updated_at),
            definition: row.definition.clone(),
            held: None,
        }
    }
}

/// An objective whose events wait for a replay, and why.
#[derive(Debug, Serialize)]
struct HeldObjective {
    objective_id: String,
    held_events: i64,
    last_reason: String,
    last_held_at: String,
}

#[derive(Debug, Serialize)]
struct AwardList {
    awards: Vec<StoredAward>,
}

async fn list_awards(State(state): State<Arc<AppState>>) -> Result<Json<AwardList>, ApiError> {
    let rows = state.store().await?.awards().await?;
    Ok(Json(AwardList {
        awards: rows.iter().map(StoredAward::of).collect(),
    }))
}

async fn get_award(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<StoredAward>, ApiError> {
    let store = state.store().await?;
    let rows = store.awards().await?;
    let row = rows
        .iter()
        .find(|r| r.id == id)
        .ok_or_else(|| ApiError::NotFound(format!("no award named {id}")))?;
    // Objectives whose events are held (a function failing, quarantined or
    // refusing its config): what waits for a replay, and why.
    let held = store
        .held_objectives(&id)
        .await?
        .into_iter()
        .map(|h| HeldObjective {
            objective_id: h.objective_id,
            held_events: h.events,
            last_reason: h.last_reason,
            last_held_at: time(h.last_at),
        })
        .collect();
    Ok(Json(StoredAward {
        held: Some(held),
        ..StoredAward::of(row)
    }))
}

fn problem_json(problem: &DefinitionError) -> Value {
    json!({
        "award": problem.award,
        "objective": problem.objective,
        "function": problem.function,
        "reason": problem.reason,
        "message": problem.to_string(),
    })
}

async fn put_award(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(Extension<AuditTarget>, Json<Value>), ApiError> {
    let mut definition = json_body(raw, state.settings.max_body_bytes)?;
    let Some(object) = definition.as_object_mut() else {
        return Err(ApiError::unprocessable(format!(
            "award {id}: the body must be one award definition (a JSON object)"
        )));
    };
    match object.get("id") {
        None => {
            object.insert("id".into(), Value::String(id.clone()));
        }
        Some(Value::String(body_id)) if *body_id == id => {}
        Some(other) => {
            return Err(ApiError::unprocessable(format!(
                "award {id}: the body's id {other} differs from the id in the path"
            )));
        }
    }
    let before = state.catalog.snapshot().versions.get(&id).copied();
    let mut store = state.store().await?;
    let applied = definitions::apply(&mut store, &state.registry, &definition.to_string())
        .await
        .map_err(|error| match error {
            ApplyError::Invalid(invalid) => ApiError::Unprocessable {
                message: invalid.to_string(),
                problems: invalid.0.iter().map(problem_json).collect(),
            },
            ApplyError::Store(error) => error.into(),
        })?;
    // This process answers with the new definition at once; the others
    // follow the notification.
    state.catalog.reload(&store).await?;
    let version = applied
        .iter()
        .find(|(applied_id, _)| *applied_id == id)
        .map(|(_, v)| *v);
    let audit = AuditTarget {
        target: format!("award {id}"),
        before,
        after: version,
    };
    Ok((
        Extension(audit),
        Json(json!({"id": id, "version": version})),
    ))
}

async fn delete_award(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Extension<AuditTarget>), ApiError> {
    let before = state.catalog.snapshot().versions.get(&id).copied();
    let mut store = state.store().await?;
    if !store.delete_award(&id).await? {
        return Err(ApiError::NotFound(format!("no award named {id}")));
    }
    state.catalog.reload(&store).await?;
    let audit = AuditTarget {
        target: format!("award {id}"),
        before,
        after: None,
    };
    Ok((StatusCode::NO_CONTENT, Extension(audit)))
}

// --- functions ----------------------------------------------------------

async fn list_functions(
    State(state): State<Arc<AppState>>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<FunctionList>, ApiError> {
    let all = flag(&query, "all")?;
    let store = state.store().await?;
    let rows = if all {
        store.all_function_versions().await?
    } else {
        store.current_functions().await?
    };
    let functions = rows
        .into_iter()
        .map(|r| FunctionLine {
            name: r.name,
            kind: r.kind,
            version: r.version,
            sha256: r.sha256,
            size: r.size,
            builtin: r.builtin,
            created_at: time(r.created_at),
            quarantined: r.quarantine_reason,
        })
        .collect();
    Ok(Json(FunctionList { functions }))
}

/// `GET /functions`: current versions (or every version, `?all`).
#[derive(Debug, Serialize)]
struct FunctionList {
    functions: Vec<FunctionLine>,
}

#[derive(Debug, Serialize)]
struct FunctionLine {
    name: String,
    kind: String,
    version: i32,
    sha256: String,
    size: i64,
    builtin: bool,
    created_at: String,
    /// Why the version is quarantined, if it is.
    quarantined: Option<String>,
}

fn flag(query: &HashMap<String, String>, name: &str) -> Result<bool, ApiError> {
    match query.get(name).map(String::as_str) {
        None | Some("false") | Some("0") => Ok(false),
        Some("") | Some("true") | Some("1") => Ok(true),
        Some(other) => Err(ApiError::BadRequest(format!(
            "query parameter {name} must be true or false, not {other:?}"
        ))),
    }
}

async fn put_function(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.split(';').next().map(str::trim) != Some("application/wasm") {
        return Err(ApiError::UnsupportedMediaType(format!(
            "a function is uploaded as Content-Type: application/wasm (got {:?})",
            content_type
        )));
    }
    let bytes = body(raw, state.max_function_bytes())?;
    let kind = match query.get("kind").map(String::as_str) {
        None => None,
        Some("filter") => Some(FunctionKind::Filter),
        Some("rule") => Some(FunctionKind::Rule),
        Some("strategy") => Some(FunctionKind::Strategy),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "query parameter kind must be filter, rule or strategy, not {other:?}"
            )));
        }
    };
    let force = flag(&query, "force")?;
    let mut store = state.store().await?;
    let runtime = state.registry.runtime();
    let (kind, outcome) =
        definitions::push_function(&mut store, runtime, &name, &bytes, kind, force)
            .await
            .map_err(|error| push_error(&name, error))?;
    // This process serves the version from now on: an award applied next
    // (here, or through any process, which syncs before checking) sees it.
    match state.registry.sync_now(&store).await {
        Ok(()) => {}
        Err(crate::registry::RegistryError::Store(error)) => return Err(error.into()),
        Err(error) => {
            tracing::warn!(message = "Failed to load a pushed function at once.", function = %name, %error)
        }
    }
    let (status, version, created) = match outcome {
        PushOutcome::Created { version } => (StatusCode::CREATED, version, true),
        PushOutcome::Unchanged { version } => (StatusCode::OK, version, false),
    };
    let audit = AuditTarget {
        target: format!("function {name}"),
        before: if created {
            Some(version - 1).filter(|v| *v > 0)
        } else {
            Some(version)
        },
        after: Some(version),
    };
    Ok((
        status,
        Extension(audit),
        Json(
            json!({"name": name, "kind": kind.to_string(), "version": version, "created": created}),
        ),
    )
        .into_response())
}

fn push_error(name: &str, error: PushError) -> ApiError {
    use crate::registry::RegistryError;
    match error {
        PushError::BreaksAwards { ref problems, .. } => ApiError::Unprocessable {
            message: error.message("?force=true"),
            problems: problems.iter().map(problem_json).collect(),
        },
        PushError::Registry(RegistryError::Store(error)) => error.into(),
        PushError::Registry(error) => ApiError::unprocessable(format!("function {name}: {error}")),
    }
}

// --- users --------------------------------------------------------------

async fn get_user_awards(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
) -> Result<Json<super::progress::UserAwards>, ApiError> {
    Ok(Json(user_awards(&state, &user_id, Audience::Admin).await?))
}

const LOG_PAGE: i64 = 50;
const LOG_PAGE_MAX: i64 = 1000;

async fn get_user_log(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let limit = positive(&query, "limit")?
        .unwrap_or(LOG_PAGE)
        .min(LOG_PAGE_MAX);
    let before = positive(&query, "before")?;
    let rows = state
        .store()
        .await?
        .user_log(&user_id, before, limit)
        .await?;
    let next = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
    let entries: Vec<Value> = rows.iter().map(log_entry).collect();
    Ok(Json(
        json!({"user_id": user_id, "entries": entries, "next_before": next}),
    ))
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

/// A processing-log entry as the API shows it.
pub(super) fn log_entry(r: &LogRecord) -> Value {
    // An exclusion is stored as data; in words: "award/objective: excluded
    // by filter NAME", one per objective.
    let reason = r.reason.clone().or_else(|| {
        let words: Vec<String> = r
            .exclusions()
            .map(|(award, objective, filter)| {
                let verdict = Verdict::Excluded {
                    filter: filter.into(),
                };
                format!("{award}/{objective}: {verdict}")
            })
            .collect();
        (!words.is_empty()).then(|| words.join("; "))
    });
    json!({
        "id": r.id,
        "logged_at": time(r.logged_at),
        "source": r.source,
        "event_id": r.event_id,
        "award_id": r.award_id,
        "objective_id": r.objective_id,
        "outcome": r.outcome,
        "reason": reason,
        "excluded": r.excluded,
        "deltas": r.deltas,
        "functions": r.functions,
    })
}

// --- sources ------------------------------------------------------------

async fn list_sources(State(state): State<Arc<AppState>>) -> Result<Json<SourceList>, ApiError> {
    let sources = state.store().await?.sources().await?;
    let sources = sources
        .into_iter()
        .map(|source| {
            let lag = state.lag(&source.name);
            SourceLine {
                state: if source.paused { "paused" } else { "running" },
                paused: source.paused,
                name: source.name,
                topic: source.topic,
                lag: lag.as_ref().ok().copied(),
                lag_error: lag.err(),
            }
        })
        .collect();
    Ok(Json(SourceList { sources }))
}

/// `GET /sources`: each source's topic, state and consumer lag.
#[derive(Debug, Serialize)]
struct SourceList {
    sources: Vec<SourceLine>,
}

#[derive(Debug, Serialize)]
struct SourceLine {
    name: String,
    topic: String,
    paused: bool,
    state: &'static str,
    /// Messages the consumer group has not yet consumed (`null`: unknown).
    lag: Option<i64>,
    /// Why the lag is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    lag_error: Option<String>,
}

async fn pause_source(
    state: State<Arc<AppState>>,
    name: Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_paused(state, name, true).await
}

async fn resume_source(
    state: State<Arc<AppState>>,
    name: Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_paused(state, name, false).await
}

async fn set_paused(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    paused: bool,
) -> Result<Json<Value>, ApiError> {
    if !state
        .store()
        .await?
        .set_source_paused(&name, paused)
        .await?
    {
        return Err(ApiError::NotFound(format!("no source named {name}")));
    }
    Ok(Json(json!({"name": name, "paused": paused})))
}

// --- dead letters -------------------------------------------------------

async fn list_dead_letters(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let limit = positive(&query, "limit")?
        .unwrap_or(LOG_PAGE)
        .min(LOG_PAGE_MAX);
    let before = positive(&query, "before")?;
    let all = match query.get("all").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "query parameter all must be true or false, not {other:?}"
            )));
        }
    };
    let store = state.store().await?;
    if !store.sources().await?.iter().any(|s| s.name == name) {
        return Err(ApiError::NotFound(format!("no source named {name}")));
    }
    let rows = store.dead_letters(&name, all, limit, before).await?;
    let next = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
    let letters: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "id": r.id,
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "award_id": r.award_id,
                "objective_id": r.objective_id,
                "event_id": r.event_id,
                "user_id": r.user_id,
                "reason": r.reason,
                "attempts": r.attempts,
                "dead_at": time(r.dead_at),
                "replayed_at": r.replayed_at.map(time),
                "value": r.value_preview,
                "value_bytes": r.value_bytes,
            })
        })
        .collect();
    Ok(Json(
        json!({"source": name, "dead_letters": letters, "next_before": next}),
    ))
}

/// `{"since": RFC 3339, "reason": text}`, both optional.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    since: Option<chrono::DateTime<chrono::Utc>>,
    reason: Option<String>,
}

async fn replay_dead_letters(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let bytes = body(raw, state.settings.max_body_bytes)?;
    let request: ReplayRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        ReplayRequest::default()
    } else {
        serde_json::from_slice(&bytes).map_err(|error| {
            ApiError::BadRequest(format!("the replay request is not valid: {error}"))
        })?
    };
    let mut store = state.store().await?;
    if !store.sources().await?.iter().any(|s| s.name == name) {
        return Err(ApiError::NotFound(format!("no source named {name}")));
    }
    let filter = crate::store::LetterFilter {
        since: request.since,
        reason: request.reason,
    };
    let report = crate::ingest::replay(
        &mut store,
        &state.registry,
        &state.catalog,
        &name,
        &filter,
        state.settings.max_event_bytes,
    )
    .await?;
    let failures: Vec<Value> = report
        .failures
        .iter()
        .map(|(id, reason)| json!({"id": id, "reason": reason}))
        .collect();
    Ok(Json(json!({
        "source": name,
        "replayed": report.replayed,
        "still_failing": report.still_failing,
        "taken_by_another_replay": report.taken,
        "counters_changed": report.changed,
        "failures": failures,
    })))
}

// --- proxy pools --------------------------------------------------------

/// A pool's settings: `laurel proxies pool set`'s flags in snake_case,
/// with the same defaults.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolBody {
    check_url: String,
    #[serde(default = "least_used")]
    policy: String,
    #[serde(default = "five_seconds")]
    timeout_ms: u64,
    #[serde(default = "two_seconds")]
    max_latency_ms: u64,
    #[serde(default = "http_only")]
    schemes: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default = "five_minutes")]
    recheck_ms: u64,
    #[serde(default = "one_minute")]
    lease_ttl_ms: u64,
    #[serde(default)]
    max_in_flight: Option<i32>,
    #[serde(default)]
    allow_private: bool,
}

fn least_used() -> String {
    "least-used".into()
}
fn five_seconds() -> u64 {
    5_000
}
fn two_seconds() -> u64 {
    2_000
}
fn http_only() -> Vec<String> {
    vec!["http".into()]
}
fn five_minutes() -> u64 {
    300_000
}
fn one_minute() -> u64 {
    60_000
}

async fn put_pool(
    State(state): State<Arc<AppState>>,
    Path(pool): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let value = json_body(raw, state.settings.max_body_bytes)?;
    let body: PoolBody = serde_json::from_value(value)
        .map_err(|error| ApiError::unprocessable(format!("proxy pool {pool}: {error}")))?;
    let ms = std::time::Duration::from_millis;
    let row = crate::store::ProxyPoolRow {
        name: pool.clone(),
        policy: body.policy,
        check_url: body.check_url,
        timeout: ms(body.timeout_ms),
        schemes: body.schemes,
        max_latency: ms(body.max_latency_ms),
        deny: body.deny,
        recheck_every: ms(body.recheck_ms),
        lease_ttl: ms(body.lease_ttl_ms),
        max_in_flight: body.max_in_flight,
        allow_private: body.allow_private,
    };
    crate::proxy::checked_pool(&row).map_err(ApiError::unprocessable)?;
    state.store().await?.set_proxy_pool(&row).await?;
    Ok(Json(
        json!({"pool": pool, "policy": row.policy, "check_url": row.check_url}),
    ))
}

async fn delete_pool(
    State(state): State<Arc<AppState>>,
    Path(pool): Path<String>,
) -> Result<StatusCode, ApiError> {
    crate::proxy::check_pool(&pool).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let existed = state.store().await?.delete_proxy_pool(&pool).await?;
    state.proxies().await?.delete_pool(&pool).await?;
    if !existed {
        return Err(ApiError::NotFound(format!("no proxy pool named {pool}")));
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn get_pool(
    State(state): State<Arc<AppState>>,
    Path(pool): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let store = state.store().await?;
    let status =
        crate::proxy::candidates::pool_status(&store, state.proxies().await?, &pool).await?;
    if status.config.is_none() && status.members.is_empty() {
        return Err(ApiError::NotFound(format!(
            "no proxy pool named {pool} (configure it with laurel proxies pool set {pool} --check-url URL)"
        )));
    }
    let members: Vec<Value> = status
        .members
        .iter()
        .map(|m| {
            json!({
                "proxy": m.proxy,
                "eligible": m.eligible,
                "reason": m.reason,
                "allocations": number(m.allocations),
                "in_flight": m.in_flight,
                "latency_ms": m.latency_ms,
                "checked_at": m.checked_at.map(time),
            })
        })
        .collect();
    let config = status.config.as_ref().map(|c| {
        json!({
            "policy": c.policy,
            "check_url": c.check_url,
            "timeout_ms": c.timeout.as_millis() as u64,
            "schemes": c.schemes,
            "max_latency_ms": c.max_latency.as_millis() as u64,
            "deny": c.deny,
            "recheck_every_s": c.recheck_every.as_secs(),
            "lease_ttl_ms": c.lease_ttl.as_millis() as u64,
            "max_in_flight": c.max_in_flight,
            "allow_private": c.allow_private,
        })
    });
    Ok(Json(json!({
        "pool": pool,
        "configured": config.is_some(),
        "config": config,
        "eligible": status.members.iter().filter(|m| m.eligible).count(),
        "members": members,
    })))
}

async fn put_candidates(
    State(state): State<Arc<AppState>>,
    Path(pool): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let bytes = body(raw, state.settings.max_body_bytes)?;
    let list = std::str::from_utf8(&bytes).map_err(|_| {
        ApiError::BadRequest(
            "the candidate list must be UTF-8 text, one scheme://host:port a line".into(),
        )
    })?;
    let replace = flag(&query, "replace")?;
    let store = state.store().await?;
    let report =
        crate::proxy::candidates::import(&store, state.proxies().await?, &pool, list, replace)
            .await?;
    Ok(Json(json!({
        "pool": pool,
        "admitted": report.admitted.iter().map(|(proxy, latency, start)| json!({
            "proxy": proxy, "latency_ms": latency.as_millis() as u64, "allocations": number(*start)
        })).collect::<Vec<_>>(),
        "refused": report.refused.iter().map(|(proxy, reason)| json!({"proxy": proxy, "reason": reason})).collect::<Vec<_>>(),
        "dropped": report.dropped,
        "junk": report.junk.iter().map(|j| json!({"line": j.line, "text": j.text, "reason": j.reason})).collect::<Vec<_>>(),
    })))
}

async fn allocate(
    State(state): State<Arc<AppState>>,
    Path(pool): Path<String>,
) -> Result<Json<Value>, ApiError> {
    match state.proxies().await?.allocate(&pool).await? {
        Some(proxy) => Ok(Json(json!({"proxy": proxy}))),
        None => Err(ApiError::Conflict(format!(
            "proxy pool {pool} has no eligible member"
        ))),
    }
}

// --- webhooks -----------------------------------------------------------

/// A webhook; a read token sees its URL without credentials.
/// A webhook as the caller may see it: a read token sees its URL with
/// credentials redacted.
#[derive(Debug, Serialize)]
struct WebhookLine {
    name: String,
    url: String,
    events: Vec<String>,
    proxy_pool: Option<String>,
}

impl WebhookLine {
    fn of(w: &Webhook, caller: &Caller) -> WebhookLine {
        let url = match caller.role {
            Role::Admin => w.url.clone(),
            Role::Read => crate::secrets::redact_url(&w.url),
        };
        WebhookLine {
            name: w.name.clone(),
            url,
            events: w.events.clone(),
            proxy_pool: w.proxy_pool.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
struct WebhookList {
    webhooks: Vec<WebhookLine>,
}

async fn list_webhooks(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<WebhookList>, ApiError> {
    let hooks = state.store().await?.webhooks().await?;
    Ok(Json(WebhookList {
        webhooks: hooks.iter().map(|w| WebhookLine::of(w, &caller)).collect(),
    }))
}

async fn get_webhook(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<WebhookLine>, ApiError> {
    let hooks = state.store().await?.webhooks().await?;
    hooks
        .iter()
        .find(|w| w.name == name)
        .map(|w| Json(WebhookLine::of(w, &caller)))
        .ok_or_else(|| ApiError::NotFound(format!("no webhook named {name}")))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookBody {
    url: String,
    #[serde(default)]
    events: Option<Vec<String>>,
    #[serde(default)]
    proxy_pool: Option<String>,
}

async fn put_webhook(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<WebhookLine>, ApiError> {
    let value = json_body(raw, state.settings.max_body_bytes)?;
    let hook: WebhookBody = serde_json::from_value(value)
        .map_err(|error| ApiError::unprocessable(format!("webhook {name}: {error}")))?;
    let events = hook
        .events
        .unwrap_or_else(|| vec!["award.completed".to_string()]);
    let webhook =
        crate::notify::checked_webhook(&name, &hook.url, &events, hook.proxy_pool.as_deref())
            .map_err(|reason| ApiError::unprocessable(format!("webhook {name}: {reason}")))?;
    state.store().await?.set_webhook(&webhook).await?;
    Ok(Json(WebhookLine::of(
        &webhook,
        &Caller {
            name: String::new(),
            role: Role::Admin,
        },
    )))
}

async fn delete_webhook(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    if !state.store().await?.delete_webhook(&name).await? {
        return Err(ApiError::NotFound(format!("no webhook named {name}")));
    }
    Ok(StatusCode::NO_CONTENT)
}
