//! Sources: their state and consumer lag, pause and resume, dead letters
//! and their replay.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use serde::Serialize;

use super::{flag, next_before, page, time};
use crate::api::{ApiError, AppState, body};
use crate::store::{DeadLetterRow, LetterFilter, Store};

pub(super) async fn list(State(state): State<Arc<AppState>>) -> Result<Json<SourceList>, ApiError> {
    let sources = state.store().await?.sources().await?;
    let sources = sources
        .into_iter()
        .map(|source| {
            let lag = state.lag(&source.name);
            SourceLine {
                state: if source.paused {
                    "paused"
                } else if state.waiting_for_topic(&source.name) {
                    "waiting"
                } else {
                    "running"
                },
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
pub(super) struct SourceList {
    sources: Vec<SourceLine>,
}

#[derive(Debug, Serialize)]
pub(super) struct SourceLine {
    name: String,
    topic: String,
    paused: bool,
    /// `running`, `paused`, or `waiting`: its topic does not exist yet
    /// (nothing was produced to it), and its consumers wait for it.
    state: &'static str,
    /// Messages the consumer group has not yet consumed (`null`: unknown).
    lag: Option<i64>,
    /// Why the lag is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    lag_error: Option<String>,
}

pub(super) async fn pause(
    state: State<Arc<AppState>>,
    name: Path<String>,
) -> Result<Json<SourceState>, ApiError> {
    set_paused(state, name, true).await
}

pub(super) async fn resume(
    state: State<Arc<AppState>>,
    name: Path<String>,
) -> Result<Json<SourceState>, ApiError> {
    set_paused(state, name, false).await
}

/// `POST /sources/{name}/pause|resume`: the state now stored.
#[derive(Debug, Serialize)]
pub(super) struct SourceState {
    name: String,
    paused: bool,
}

async fn set_paused(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    paused: bool,
) -> Result<Json<SourceState>, ApiError> {
    if !state
        .store()
        .await?
        .set_source_paused(&name, paused)
        .await?
    {
        return Err(ApiError::NotFound(format!("no source named {name}")));
    }
    Ok(Json(SourceState { name, paused }))
}

// --- dead letters -------------------------------------------------------

/// `GET /sources/{name}/dead-letters`: a page, newest first.
#[derive(Debug, Serialize)]
pub(super) struct DeadLetterPage {
    source: String,
    dead_letters: Vec<DeadLetter>,
    next_before: Option<i64>,
}

/// An event dead-lettered whole (`award_id` null) or held for one
/// objective, with why.
#[derive(Debug, Serialize)]
pub(super) struct DeadLetter {
    id: i64,
    topic: String,
    partition: i32,
    offset: i64,
    award_id: Option<String>,
    objective_id: Option<String>,
    event_id: Option<String>,
    user_id: Option<String>,
    reason: String,
    attempts: i32,
    dead_at: String,
    replayed_at: Option<String>,
    /// The message's value (as text where it is UTF-8), up to a preview.
    value: Option<String>,
    value_bytes: Option<i32>,
}

impl DeadLetter {
    fn of(r: DeadLetterRow) -> DeadLetter {
        DeadLetter {
            id: r.id,
            topic: r.topic,
            partition: r.partition,
            offset: r.offset,
            award_id: r.award_id,
            objective_id: r.objective_id,
            event_id: r.event_id,
            user_id: r.user_id,
            reason: r.reason,
            attempts: r.attempts,
            dead_at: time(r.dead_at),
            replayed_at: r.replayed_at.map(time),
            value: r.value_preview,
            value_bytes: r.value_bytes,
        }
    }
}

pub(super) async fn dead_letters(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<DeadLetterPage>, ApiError> {
    let (limit, before) = page(&query)?;
    let all = flag(&query, "all")?;
    let store = state.store().await?;
    known(&store, &name).await?;
    let rows = store.dead_letters(&name, all, limit, before).await?;
    Ok(Json(DeadLetterPage {
        next_before: next_before(rows.iter().map(|r| r.id), limit),
        dead_letters: rows.into_iter().map(DeadLetter::of).collect(),
        source: name,
    }))
}

/// 404 unless `name` is a source.
async fn known(store: &Store, name: &str) -> Result<(), ApiError> {
    if store.sources().await?.iter().any(|s| s.name == name) {
        Ok(())
    } else {
        Err(ApiError::NotFound(format!("no source named {name}")))
    }
}

/// `{"since": RFC 3339, "reason": text}`, both optional.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplayRequest {
    since: Option<chrono::DateTime<chrono::Utc>>,
    reason: Option<String>,
}

/// `POST /sources/{name}/dead-letters/replay`: what the replay did.
#[derive(Debug, Serialize)]
pub(super) struct Replayed {
    source: String,
    replayed: usize,
    still_failing: usize,
    taken_by_another_replay: usize,
    counters_changed: usize,
    /// A few of those still failing, with their new reason.
    failures: Vec<ReplayFailure>,
}

#[derive(Debug, Serialize)]
pub(super) struct ReplayFailure {
    id: i64,
    reason: String,
}

pub(super) async fn replay(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Replayed>, ApiError> {
    let bytes = body(raw, state.settings.max_body_bytes)?;
    let request: ReplayRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        ReplayRequest::default()
    } else {
        serde_json::from_slice(&bytes).map_err(|error| {
            ApiError::BadRequest(format!("the replay request is not valid: {error}"))
        })?
    };
    let _permit = state.heavy("a replay")?;
    let mut store = state.store().await?;
    known(&store, &name).await?;
    let filter = LetterFilter {
        since: request.since,
        reason: request.reason,
    };
    let report = crate::replay::replay(
        &mut store,
        &state.registry,
        &state.catalog,
        &name,
        &filter,
        state.settings.max_event_bytes,
    )
    .await?;
    Ok(Json(Replayed {
        source: name,
        replayed: report.replayed,
        still_failing: report.still_failing,
        taken_by_another_replay: report.taken,
        counters_changed: report.changed,
        failures: report
            .failures
            .into_iter()
            .map(|(id, reason)| ReplayFailure { id, reason })
            .collect(),
    }))
}
