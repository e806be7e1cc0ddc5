//! The pre-filter's pipelines: list, read, apply (checked whole first),
//! delete, pause and resume, and the replay of their dead letters. The
//! pre-filter role in every process follows each change within a second.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Serialize;
use serde_json::Value;

use super::{AuditTarget, time};
use crate::api::{ApiError, AppState, json_body};
use crate::pipelines::{self, PipelineApplyError};
use crate::store::PipelineRow;

/// A pipeline as stored.
#[derive(Debug, Serialize)]
pub(super) struct StoredPipeline {
    name: String,
    input_topic: String,
    source: String,
    transform: TransformUse,
    paused: bool,
    state: &'static str,
    version: i32,
    updated_at: String,
    /// Raw records its consumer group has not yet taken from the input
    /// topic, as last read (`null`: unknown).
    lag: Option<i64>,
    /// Why the lag is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    lag_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct TransformUse {
    name: String,
    config: Value,
}

impl StoredPipeline {
    fn of(state: &AppState, row: PipelineRow) -> StoredPipeline {
        let lag = state.pipeline_lag(&row.name);
        StoredPipeline {
            lag: lag.as_ref().ok().copied(),
            lag_error: lag.err(),
            state: if row.paused { "paused" } else { "running" },
            name: row.name,
            input_topic: row.input_topic,
            source: row.source,
            transform: TransformUse {
                name: row.transform,
                config: row.transform_config,
            },
            paused: row.paused,
            version: row.version,
            updated_at: time(row.updated_at),
        }
    }
}

/// `GET /pipelines`.
#[derive(Debug, Serialize)]
pub(super) struct PipelineList {
    pipelines: Vec<StoredPipeline>,
}

/// `PUT /pipelines/{name}`: the version now stored (unchanged when the
/// definition is).
#[derive(Debug, Serialize)]
pub(super) struct Applied {
    name: String,
    version: i32,
}

/// `POST /pipelines/{name}/pause|resume`: the state now stored.
#[derive(Debug, Serialize)]
pub(super) struct PipelineState {
    name: String,
    paused: bool,
}

pub(super) async fn list(
    State(state): State<Arc<AppState>>,
) -> Result<Json<PipelineList>, ApiError> {
    let rows = state.store().await?.pipelines().await?;
    Ok(Json(PipelineList {
        pipelines: rows
            .into_iter()
            .map(|row| StoredPipeline::of(&state, row))
            .collect(),
    }))
}

async fn stored(state: &AppState, name: &str) -> Result<Option<PipelineRow>, ApiError> {
    let rows = state.store().await?.pipelines().await?;
    Ok(rows.into_iter().find(|r| r.name == name))
}

pub(super) async fn get(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Json<StoredPipeline>, ApiError> {
    stored(&state, &name)
        .await?
        .map(|row| Json(StoredPipeline::of(&state, row)))
        .ok_or_else(|| ApiError::NotFound(format!("no pipeline named {name}")))
}

pub(super) async fn put(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(Extension<AuditTarget>, Json<Applied>), ApiError> {
    let mut definition = json_body(raw, state.settings.max_body_bytes)?;
    let Some(object) = definition.as_object_mut() else {
        return Err(ApiError::unprocessable(format!(
            "pipeline {name}: the body must be one pipeline definition (a JSON object)"
        )));
    };
    match object.get("name") {
        None => {
            object.insert("name".into(), Value::String(name.clone()));
        }
        Some(Value::String(body_name)) if *body_name == name => {}
        Some(other) => {
            return Err(ApiError::unprocessable(format!(
                "pipeline {name}: the body's name {other} differs from the name in the path"
            )));
        }
    }
    let before = stored(&state, &name).await?.map(|row| row.version);
    let mut store = state.store().await?;
    let applied = pipelines::apply(&mut store, &state.registry, &definition.to_string())
        .await
        .map_err(|error| match error {
            PipelineApplyError::Invalid(invalid) => {
                ApiError::refused_pipeline(invalid.to_string(), &invalid.0)
            }
            PipelineApplyError::Store(error) => error.into(),
        })?;
    let version = applied
        .iter()
        .find(|(applied, _)| *applied == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| anyhow::anyhow!("pipeline {name} was applied without a version"))?;
    let audit = AuditTarget {
        target: format!("pipeline {name}"),
        before,
        after: Some(version),
    };
    Ok((Extension(audit), Json(Applied { name, version })))
}

pub(super) async fn delete(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<(StatusCode, Extension<AuditTarget>), ApiError> {
    let before = stored(&state, &name).await?.map(|row| row.version);
    if !state.store().await?.delete_pipeline(&name).await? {
        return Err(ApiError::NotFound(format!("no pipeline named {name}")));
    }
    let audit = AuditTarget {
        target: format!("pipeline {name}"),
        before,
        after: None,
    };
    Ok((StatusCode::NO_CONTENT, Extension(audit)))
}

pub(super) async fn pause(
    state: State<Arc<AppState>>,
    name: Path<String>,
) -> Result<Json<PipelineState>, ApiError> {
    set_paused(state, name, true).await
}

pub(super) async fn resume(
    state: State<Arc<AppState>>,
    name: Path<String>,
) -> Result<Json<PipelineState>, ApiError> {
    set_paused(state, name, false).await
}

async fn set_paused(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    paused: bool,
) -> Result<Json<PipelineState>, ApiError> {
    if !state
        .store()
        .await?
        .set_pipeline_paused(&name, paused)
        .await?
    {
        return Err(ApiError::NotFound(format!("no pipeline named {name}")));
    }
    Ok(Json(PipelineState { name, paused }))
}

/// `POST /pipelines/{name}/dead-letters/replay`: the pipeline's dead
/// letters back on its input topic, at their first position.
pub(super) async fn replay(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<(Extension<AuditTarget>, Json<crate::replay::raw::RawReplay>), ApiError> {
    let Some(brokers) = state.settings.kafka_brokers.clone() else {
        return Err(ApiError::Unavailable(
            "this process has no Kafka brokers (LAUREL_KAFKA_BROKERS) to replay from".into(),
        ));
    };
    let _permit = state.heavy("a replay")?;
    let pipeline = stored(&state, &name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no pipeline named {name}")))?;
    let key = crate::replay::raw::ReplayKey::load(&*state.store().await?)
        .await
        .map_err(|error| ApiError::Unavailable(format!("{error:#}")))?;
    let report =
        crate::replay::raw::replay(&brokers, &state.settings.group_prefix, &pipeline, &key)
            .await
            .map_err(|error| ApiError::Unavailable(format!("{error:#}")))?;
    let audit = AuditTarget {
        target: format!("pipeline {name}"),
        before: Some(pipeline.version),
        after: Some(pipeline.version),
    };
    Ok((Extension(audit), Json(report)))
}
