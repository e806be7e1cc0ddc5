//! Functions: list the registered versions, push a new one.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Serialize;

use super::{AuditTarget, flag, time};
use crate::api::{ApiError, AppState, body};
use crate::definitions::{self, PushError};
use crate::runtime::FunctionKind;
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
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "query parameter kind must be filter, rule, strategy or transform, not {other:?}"
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
    let pushed = Pushed {
        name,
        kind: kind.to_string(),
        version,
        created,
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
}

fn push_error(name: &str, error: PushError) -> ApiError {
    use crate::registry::RegistryError;
    match error {
        PushError::BreaksAwards { ref problems, .. } => {
            ApiError::refused(error.message("?force=true"), problems)
        }
        PushError::Registry(RegistryError::Store(error)) => error.into(),
        PushError::Registry(error) => ApiError::unprocessable(format!("function {name}: {error}")),
    }
}
