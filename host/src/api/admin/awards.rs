//! Award definitions: list, read (with what their objectives hold), apply
//! (checked whole first), delete.

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
use crate::definitions::{self, ApplyError};

/// An award definition as stored: `GET /awards` lists them, `GET
/// /awards/{id}` adds what its objectives hold.
#[derive(Debug, Serialize)]
pub(super) struct StoredAward {
    id: String,
    version: i32,
    enabled: bool,
    updated_at: String,
    definition: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    held: Option<Vec<HeldObjective>>,
    /// Its last backfill from history, if it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    backfill: Option<BackfillState>,
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
            backfill: None,
        }
    }
}

/// A backfill from history as the admin API shows it.
#[derive(Debug, Serialize)]
pub(super) struct BackfillState {
    award_version: i32,
    state: &'static str,
    percent: f64,
    sources: Vec<String>,
    items_total: i64,
    items_done: i64,
    changed: i64,
    unrecoverable: i64,
    failed: i64,
    last_failure: Option<String>,
    events_total: i64,
    events_done: i64,
    events_counted: i64,
    events_from: Option<String>,
    events_from_start: bool,
    events_note: Option<String>,
    started_at: String,
    finished_at: Option<String>,
}

impl BackfillState {
    fn of(b: &crate::store::HistoryBackfill) -> BackfillState {
        BackfillState {
            award_version: b.award_version,
            state: if b.finished_at.is_some() {
                "finished"
            } else {
                "running"
            },
            percent: (b.percent() * 10.0).round() / 10.0,
            sources: b.sources.clone(),
            items_total: b.total,
            items_done: b.done,
            changed: b.changed,
            unrecoverable: b.unrecoverable,
            failed: b.failed,
            last_failure: b.last_failure.clone(),
            events_total: b.events_total,
            events_done: b.events_done,
            events_counted: b.events_applied,
            events_from: b.events_from.map(time),
            events_from_start: b.from_start,
            events_note: b.events_note.clone(),
            started_at: time(b.started_at),
            finished_at: b.finished_at.map(time),
        }
    }
}

/// An objective whose events wait for a replay, and why.
#[derive(Debug, Serialize)]
pub(super) struct HeldObjective {
    objective_id: String,
    held_events: i64,
    last_reason: String,
    last_held_at: String,
}

/// `PUT /awards/{id}`: the version now stored.
#[derive(Debug, Serialize)]
pub(super) struct Applied {
    id: String,
    version: i32,
}

#[derive(Debug, Serialize)]
pub(super) struct AwardList {
    awards: Vec<StoredAward>,
}

pub(super) async fn list(State(state): State<Arc<AppState>>) -> Result<Json<AwardList>, ApiError> {
    let store = state.store().await?;
    let rows = store.awards().await?;
    let backfills = store.history_backfills().await?;
    Ok(Json(AwardList {
        awards: rows
            .iter()
            .map(|row| StoredAward {
                backfill: backfills
                    .iter()
                    .find(|b| b.award_id == row.id)
                    .map(BackfillState::of),
                ..StoredAward::of(row)
            })
            .collect(),
    }))
}

/// `POST /awards/{id}/backfill`: starts (or starts over) its backfill from
/// history; a process running ingest does the work.
pub(super) async fn backfill(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Extension<AuditTarget>, Json<BackfillState>), ApiError> {
    let store = state.store().await?;
    if !store.awards().await?.iter().any(|r| r.id == id) {
        return Err(ApiError::NotFound(format!("no award named {id}")));
    }
    let started = crate::definitions::request_backfill(&store, &state.registry, &id)
        .await
        .map_err(|error| ApiError::unprocessable(format!("award {id}: {error:#}")))?;
    let audit = AuditTarget {
        target: format!("award {id} backfill"),
        before: None,
        after: Some(started.award_version),
    };
    Ok((
        StatusCode::ACCEPTED,
        Extension(audit),
        Json(BackfillState::of(&started)),
    ))
}

pub(super) async fn get(
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
    let backfill = store.history_backfill(&id).await?;
    Ok(Json(StoredAward {
        held: Some(held),
        backfill: backfill.as_ref().map(BackfillState::of),
        ..StoredAward::of(row)
    }))
}

pub(super) async fn put(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(Extension<AuditTarget>, Json<Applied>), ApiError> {
    let definition = one_definition(&id, json_body(raw, state.settings.max_body_bytes)?)?;
    let before = state.catalog.snapshot().versions.get(&id).copied();
    let mut store = state.store().await?;
    let applied = definitions::apply(&mut store, &state.registry, &definition.to_string())
        .await
        .map_err(refused)?;
    // This process answers with the new definition at once; the others
    // follow the notification.
    state.catalog.reload(&store).await?;
    let version = applied
        .iter()
        .find(|(applied_id, _)| *applied_id == id)
        .map(|(_, v)| *v)
        .ok_or_else(|| anyhow::anyhow!("award {id} was applied without a version"))?;
    let audit = AuditTarget {
        target: format!("award {id}"),
        before,
        after: Some(version),
    };
    Ok((Extension(audit), Json(Applied { id, version })))
}

/// `POST /awards/{id}/dry-run`: the definition checked as `PUT` checks it
/// (refused the same way), then compared with the award as it is now on
/// its sources' recent events and the stored items; nothing is written.
pub(super) async fn dry_run(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<crate::shadow::DryRun>, ApiError> {
    let definition = one_definition(&id, json_body(raw, state.settings.max_body_bytes)?)?;
    let Some(brokers) = state.settings.kafka_brokers.clone() else {
        return Err(ApiError::Unavailable(
            "this process has no Kafka brokers configured: a dry run reads recent events from Kafka"
                .into(),
        ));
    };
    let _permit = state.heavy("a dry run")?;
    let store = state.store().await?;
    let (checked, _) = definitions::check(&store, &state.registry, &definition.to_string())
        .await
        .map_err(refused)?;
    // As bounded as a function's diff through the API.
    let reach = crate::shadow::Reach {
        events: 10_000,
        items: 100_000,
    };
    let unwatched = &crate::watch::unwatched;
    crate::shadow::dry_run(
        &store,
        &state.registry,
        &brokers,
        &checked,
        reach,
        unwatched,
    )
    .await
    .map(Json)
    .map_err(|error| match error {
        crate::shadow::DiffError::Store(error) => error.into(),
        other => ApiError::unprocessable(format!("award {id}: {other}")),
    })
}

fn refused(error: ApplyError) -> ApiError {
    match error {
        ApplyError::Invalid(invalid) => ApiError::refused(invalid.to_string(), &invalid.0),
        ApplyError::Store(error) => error.into(),
    }
}

/// The body as the one definition of award `id` (its id filled in from
/// the path when it has none).
fn one_definition(id: &str, mut definition: Value) -> Result<Value, ApiError> {
    let Some(object) = definition.as_object_mut() else {
        return Err(ApiError::unprocessable(format!(
            "award {id}: the body must be one award definition (a JSON object)"
        )));
    };
    match object.get("id") {
        None => {
            object.insert("id".into(), Value::String(id.to_string()));
        }
        Some(Value::String(body_id)) if *body_id == id => {}
        Some(other) => {
            return Err(ApiError::unprocessable(format!(
                "award {id}: the body's id {other} differs from the id in the path"
            )));
        }
    }
    Ok(definition)
}

pub(super) async fn delete(
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
