//! A user's awards (as the public API shows them) and processing log.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use serde::Serialize;
use serde_json::Value;

use super::{AuditTarget, next_before, page, time};
use crate::api::badges::{self, BadgeChoice};
use crate::api::progress::{Audience, UserAwards, user_awards};
use crate::api::{ApiError, AppState, body};
use crate::objectives::Verdict;
use crate::store::LogRecord;

pub(super) async fn awards(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
) -> Result<Json<UserAwards>, ApiError> {
    Ok(Json(user_awards(&state, &user_id, Audience::Admin).await?))
}

/// `GET /users/{user_id}/badges`: whether the user's progress shows on
/// public badges.
pub(super) async fn badge_choice(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
) -> Result<Json<BadgeChoice>, ApiError> {
    Ok(Json(badges::get(&state, &user_id).await?))
}

/// `PUT /users/{user_id}/badges`: the user's choice, set by support.
pub(super) async fn set_badge_choice(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<BadgeChoice>, ApiError> {
    let bytes = body(raw, state.settings.max_body_bytes)?;
    Ok(Json(badges::set(&state, &user_id, &bytes).await?))
}

/// `GET|PUT /users/{user_id}/state`: `active`, `banned` or `deleted` (a
/// banned or deleted user's events are skipped, logged).
#[derive(Debug, Serialize)]
pub(super) struct UserState {
    user_id: String,
    state: String,
}

/// What a `PUT /users/{user_id}/state` takes.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NewState {
    state: String,
}

pub(super) async fn state(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
) -> Result<Json<UserState>, ApiError> {
    let now = state.store().await?.user_state(&user_id).await?;
    Ok(Json(UserState {
        user_id,
        state: now,
    }))
}

pub(super) async fn set_state(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<(Extension<AuditTarget>, Json<UserState>), ApiError> {
    let bytes = body(raw, state.settings.max_body_bytes)?;
    let NewState { state: wanted } = serde_json::from_slice(&bytes).map_err(|error| {
        ApiError::BadRequest(format!(
            "the request body must be {{\"state\": \"active\"|\"banned\"|\"deleted\"}}: {error}"
        ))
    })?;
    if !matches!(wanted.as_str(), "active" | "banned" | "deleted") {
        return Err(ApiError::BadRequest(format!(
            "a user's state is active, banned or deleted, not {:?}",
            crate::text::printable(&wanted, 64)
        )));
    }
    badges::check_user_id(&user_id)?;
    let mut store = state.store().await?;
    store.set_user_state(&user_id, &wanted).await?;
    let audit = AuditTarget {
        target: format!("user {user_id}"),
        before: None,
        after: None,
    };
    Ok((
        Extension(audit),
        Json(UserState {
            user_id,
            state: wanted,
        }),
    ))
}

/// `GET /users/{user_id}/log`: a page of the processing log, newest first.
#[derive(Debug, Serialize)]
pub(super) struct LogPage {
    user_id: String,
    entries: Vec<LogEntry>,
    next_before: Option<i64>,
}

pub(super) async fn log(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<LogPage>, ApiError> {
    let (limit, before) = page(&query)?;
    let rows = state
        .store()
        .await?
        .user_log(&user_id, before, limit)
        .await?;
    Ok(Json(LogPage {
        next_before: next_before(rows.iter().map(|r| r.id), limit),
        entries: rows.iter().map(log_entry).collect(),
        user_id,
    }))
}

/// A processing-log entry as the API shows it (here and in explain).
#[derive(Debug, Serialize)]
pub struct LogEntry {
    id: i64,
    logged_at: String,
    source: String,
    event_id: Option<String>,
    award_id: Option<String>,
    objective_id: Option<String>,
    /// `applied`, `skipped` or `rejected`.
    outcome: String,
    reason: Option<String>,
    /// `{award: {objective: filter}}`: filters that took the event's
    /// content item out of an objective.
    excluded: Option<Value>,
    /// `{award: {objective: {counter: delta}}}`.
    deltas: Option<Value>,
    /// The function versions that decided, `{award: {objective: [..]}}`.
    functions: Option<Value>,
}

pub fn log_entry(r: &LogRecord) -> LogEntry {
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
    LogEntry {
        id: r.id,
        logged_at: time(r.logged_at),
        source: r.source.clone(),
        event_id: r.event_id.clone(),
        award_id: r.award_id.clone(),
        objective_id: r.objective_id.clone(),
        outcome: r.outcome.clone(),
        reason,
        excluded: r.excluded.clone(),
        deltas: r.deltas.clone(),
        functions: r.functions.clone(),
    }
}
