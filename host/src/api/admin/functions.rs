//! Functions: list the registered versions, push a new one (live or as a
//! shadow candidate), promote or roll back which one serves, download one.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;

use super::{AuditTarget, flag, positive, time};
use crate::api::{ApiError, AppState, body};
use crate::definitions::{self, PushError};
use crate::runtime::{FunctionKind, FunctionLimits};
use crate::store::PushOutcome;

pub(super) async fn list(
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
            limits: LimitsLine::of(state.registry.runtime(), r.limits),
            asked: r.limits.into(),
            name: r.name,
            kind: r.kind,
            version: r.version,
            sha256: r.sha256,
            size: r.size,
            builtin: r.builtin,
            created_at: time(r.created_at),
            quarantined: r.quarantine_reason,
            live: r.live,
        })
        .collect();
    Ok(Json(FunctionList { functions }))
}

/// `GET /functions`: current versions (or every version, `?all`).
#[derive(Debug, Serialize)]
pub(super) struct FunctionList {
    functions: Vec<FunctionLine>,
}

#[derive(Debug, Serialize)]
pub(super) struct FunctionLine {
    name: String,
    kind: String,
    version: i32,
    sha256: String,
    size: i64,
    builtin: bool,
    created_at: String,
    /// Why the version is quarantined, if it is.
    quarantined: Option<String>,
    /// Whether this version serves (a newer one that does not is a shadow).
    live: bool,
    /// What it runs under here (its push's, else this server's defaults).
    limits: LimitsLine,
    /// What its push asked for (null: the server's default).
    asked: AskedLine,
}

#[derive(Debug, Serialize)]
pub(super) struct LimitsLine {
    cpu_ms: u128,
    memory_mib: usize,
}

impl LimitsLine {
    fn of(runtime: &crate::runtime::Runtime, asked: FunctionLimits) -> LimitsLine {
        let effective = runtime.limits().resolve(asked);
        LimitsLine {
            cpu_ms: effective.cpu_budget.as_millis(),
            memory_mib: effective.memory_bytes >> 20,
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct AskedLine {
    cpu_ms: Option<u32>,
    memory_mib: Option<u32>,
}

impl From<FunctionLimits> for AskedLine {
    fn from(asked: FunctionLimits) -> AskedLine {
        AskedLine {
            cpu_ms: asked.cpu_ms,
            memory_mib: asked.memory_mib,
        }
    }
}

/// `?cpu_ms=` and `?memory_mib=` of a push.
fn asked_limits(query: &HashMap<String, String>) -> Result<FunctionLimits, ApiError> {
    let limit = |name: &str| -> Result<Option<u32>, ApiError> {
        positive(query, name)?
            .map(|n| {
                u32::try_from(n).map_err(|_| {
                    ApiError::BadRequest(format!(
                        "query parameter {name} is {n}, over any limit this server can set"
                    ))
                })
            })
            .transpose()
    };
    Ok(FunctionLimits {
        cpu_ms: limit("cpu_ms")?,
        memory_mib: limit("memory_mib")?,
    })
}

pub(super) async fn push(
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
        Some("transform") => Some(FunctionKind::Transform),
        Some("http") => Some(FunctionKind::Http),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "query parameter kind must be filter, rule, strategy, transform or http, not {other:?}"
            )));
        }
    };
    let force = flag(&query, "force")?;
    let shadow = flag(&query, "shadow")?;
    let limits = asked_limits(&query)?;
    let mut store = state.store().await?;
    let runtime = state.registry.runtime();
    let pushed = definitions::Pushed {
        bytes: &bytes,
        expected: kind,
        limits,
    };
    let pushed = if shadow {
        definitions::push_shadow(&mut store, runtime, &name, pushed).await
    } else {
        definitions::push_function(&mut store, runtime, &name, pushed, force).await
    };
    let (kind, outcome) = pushed.map_err(|error| push_error(&name, error))?;
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
    let pushed = Pushed {
        limits: LimitsLine::of(runtime, limits),
        name,
        kind: kind.to_string(),
        version,
        created,
        live: !shadow || !created,
    };
    Ok((status, Extension(audit), Json(pushed)).into_response())
}

/// `PUT /functions/{name}`: the version the bytes are (201 when new).
#[derive(Debug, Serialize)]
pub(super) struct Pushed {
    name: String,
    kind: String,
    version: i32,
    /// `false`: these bytes were already the current version.
    created: bool,
    /// `false`: a shadow candidate, serving nothing until promoted.
    live: bool,
    /// What it runs under here.
    limits: LimitsLine,
}

/// `POST /functions/{name}/promote`: which version to make live.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Promote {
    version: i32,
}

/// `POST /functions/{name}/promote` and `/rollback`: what serves now.
#[derive(Debug, Serialize)]
pub(super) struct LiveChanged {
    name: String,
    /// The version that served before (null: none did).
    from: Option<i32>,
    /// The version that serves now.
    to: i32,
}

pub(super) async fn promote(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body(raw, state.settings.max_body_bytes)?;
    let Promote { version } = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::BadRequest(format!("a promotion is {{\"version\": N}}: {e}")))?;
    let force = flag(&query, "force")?;
    let mut store = state.store().await?;
    let runtime = state.registry.runtime();
    let change = definitions::promote(&mut store, runtime, &name, version, force)
        .await
        .map_err(|error| push_error(&name, error))?;
    live_changed(&state, &store, name, change).await
}

pub(super) async fn rollback(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let force = flag(&query, "force")?;
    let mut store = state.store().await?;
    let runtime = state.registry.runtime();
    let change = definitions::rollback(&mut store, runtime, &name, force)
        .await
        .map_err(|error| push_error(&name, error))?;
    live_changed(&state, &store, name, change).await
}

/// The answer to a change of what serves, once this process serves it.
async fn live_changed(
    state: &AppState,
    store: &crate::store::Store,
    name: String,
    change: crate::store::LiveChange,
) -> Result<Response, ApiError> {
    if let Err(error) = state.registry.sync_now(store).await {
        tracing::warn!(message = "Failed to load a promoted function at once.", function = %name, %error);
    }
    let audit = AuditTarget {
        target: format!("function {name}"),
        before: change.from,
        after: Some(change.to),
    };
    let answer = LiveChanged {
        name,
        from: change.from,
        to: change.to,
    };
    Ok((StatusCode::OK, Extension(audit), Json(answer)).into_response())
}

/// Most events a diff asked through the API reads per partition.
const DIFF_EVENTS_MAX: i64 = 100_000;
/// Most stored items a diff asked through the API evaluates.
const DIFF_ITEMS_MAX: i64 = 1_000_000;

/// `GET /functions/{name}/diff[?version=V][&events=N]`: what a candidate
/// would change (see `crate::shadow`).
pub(super) async fn diff(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<crate::shadow::Diff>, ApiError> {
    let at_most = |key: &str, max: i64| -> Result<Option<i64>, ApiError> {
        match positive(&query, key)? {
            Some(n) if n > max => Err(ApiError::BadRequest(format!(
                "query parameter {key} must be a whole number from 1 to {max}, not {n}"
            ))),
            n => Ok(n),
        }
    };
    let version = at_most("version", i64::from(i32::MAX))?.map(|v| v as i32);
    // Bounded so that one request's work stays small beside the public
    // API's (the CLI's `functions diff` reaches further).
    let events = at_most("events", DIFF_EVENTS_MAX)?.unwrap_or(10_000);
    let items = match query.get("items").map(String::as_str) {
        None => 100_000,
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| (0..=DIFF_ITEMS_MAX).contains(n))
            .ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "query parameter items must be a whole number from 0 to {DIFF_ITEMS_MAX}, not {v:?}"
                ))
            })?,
    };
    let reach = crate::shadow::Reach { events, items };
    let Some(brokers) = state.settings.kafka_brokers.clone() else {
        return Err(ApiError::Unavailable(
            "this process has no Kafka brokers configured: a diff reads recent events from Kafka"
                .into(),
        ));
    };
    let _permit = state.heavy("a diff")?;
    let store = state.store().await?;
    let unwatched = &crate::watch::unwatched;
    crate::shadow::diff(
        &store,
        &state.registry,
        &brokers,
        &name,
        version,
        reach,
        unwatched,
    )
    .await
    .map(Json)
    .map_err(|error| match error {
        crate::shadow::DiffError::NoCandidate(message) => ApiError::NotFound(message),
        crate::shadow::DiffError::Store(error) => error.into(),
        crate::shadow::DiffError::Load(error) => {
            ApiError::unprocessable(format!("function {name}: {error}"))
        }
    })
}

/// `GET /functions/{name}/versions/{version}`: the component as pushed.
pub(super) async fn download(
    State(state): State<Arc<AppState>>,
    Path((name, version)): Path<(String, i32)>,
) -> Result<Response, ApiError> {
    let store = state.store().await?;
    let found = store
        .function_version(&name, version)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("{name} has no version {version}")))?;
    let disposition = format!("attachment; filename=\"{name}-v{version}.wasm\"");
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/wasm".to_string()),
            (header::CONTENT_DISPOSITION, disposition),
            (
                header::HeaderName::from_static("x-laurel-sha256"),
                found.sha256,
            ),
        ],
        found.bytes,
    )
        .into_response())
}

fn push_error(name: &str, error: PushError) -> ApiError {
    use crate::registry::RegistryError;
    match error {
        PushError::BreaksAwards { ref problems, .. } => {
            ApiError::refused(error.message("?force=true"), problems)
        }
        PushError::Registry(RegistryError::Store(error)) => error.into(),
        PushError::Registry(error) => ApiError::unprocessable(format!("function {name}: {error}")),
        PushError::NoVersion(message) => ApiError::NotFound(message),
    }
}
