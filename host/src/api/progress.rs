//! A user's awards as apps and support see them: every enabled award,
//! started or not, with progress, goal, completion and objective counters.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::SecondsFormat;
use serde::Serialize;

use super::error::ApiError;
use super::{AppState, whole_number};
use crate::definitions::AwardDefinition;
use crate::store::Counters;

/// `GET /v1/users/{user_id}/awards` (and the admin API's copy).
#[derive(Debug, Serialize)]
pub struct UserAwards {
    pub user_id: String,
    pub awards: Vec<AwardProgress>,
}

/// One award as a user stands on it.
#[derive(Debug, Serialize)]
pub struct AwardProgress {
    #[serde(flatten)]
    pub summary: AwardSummary,
    /// Each objective's counters, in definition order.
    pub objectives: Vec<ObjectiveEntry>,
}

/// An award's progress, without its objectives (explain shows its own).
#[derive(Debug, Serialize)]
pub struct AwardSummary {
    pub award_id: String,
    pub title: String,
    pub description: String,
    #[serde(serialize_with = "whole_number")]
    pub progress: f64,
    #[serde(serialize_with = "whole_number")]
    pub goal: f64,
    #[serde(serialize_with = "whole_number")]
    pub remaining: f64,
    pub started: bool,
    pub completed: bool,
    /// RFC 3339, milliseconds, UTC.
    pub completed_at: Option<String>,
    /// Why the strategy could not compute it (admin API only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One objective's counters, as the API shows them.
#[derive(Debug, Serialize)]
pub struct ObjectiveEntry {
    pub objective_id: String,
    pub counters: Counters,
}

/// Which API is asking: the public one says less about missing users.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    User,
    Admin,
}

pub async fn user_awards(
    state: &AppState,
    user_id: &str,
    audience: Audience,
) -> Result<UserAwards, ApiError> {
    let store = state.store().await?;
    // Polled together, the three queries are pipelined on the connection:
    // one round trip instead of three.
    let (user_state, achieved, counters) = tokio::try_join!(
        store.user_state(user_id),
        store.user_achievements(user_id),
        store.user_counters(user_id)
    )?;
    drop(store);
    if user_state != "active" {
        return Err(ApiError::NotFound(match audience {
            Audience::User => format!("user {user_id} not found"),
            Audience::Admin => format!("user {user_id} is {user_state}"),
        }));
    }
    let achieved: HashMap<String, crate::store::AchieveState> = achieved.into_iter().collect();
    let snapshot = state.catalog.snapshot();
    let mut awards = Vec::with_capacity(snapshot.awards.len());
    for award in snapshot.awards.iter() {
        let version = snapshot.versions.get(&award.id).copied().unwrap_or(0);
        let objectives = award
            .objectives
            .iter()
            .map(|o| ObjectiveEntry {
                objective_id: o.id.clone(),
                counters: counters
                    .get(&(award.id.clone(), o.id.clone()))
                    .cloned()
                    .unwrap_or_default(),
            })
            .collect();
        let summary = state
            .summary(award, version, achieved.get(&award.id), audience)
            .await;
        awards.push(AwardProgress {
            summary,
            objectives,
        });
    }
    Ok(UserAwards {
        user_id: user_id.to_string(),
        awards,
    })
}

/// One award's progress for a public badge: only an award whose definition
/// says `"public_badge": true` has one (else NotFound). A user who opted
/// out, is banned or deleted, or is unknown gets the award at no progress:
/// the same answer as a user who has none, so a badge tells nobody which
/// users exist.
pub async fn public_badge(
    state: &AppState,
    user_id: &str,
    award_id: &str,
) -> Result<AwardSummary, ApiError> {
    let snapshot = state.catalog.snapshot();
    let Some(award) = snapshot
        .awards
        .iter()
        .find(|a| a.id == award_id && a.public_badge)
    else {
        return Err(ApiError::NotFound(format!(
            "award {award_id} has no public badge"
        )));
    };
    let version = snapshot.versions.get(&award.id).copied().unwrap_or(0);
    let store = state.store().await?;
    let (user_state, public, achieved) = tokio::try_join!(
        store.user_state(user_id),
        store.badges_public(user_id),
        store.user_achievements(user_id)
    )?;
    drop(store);
    let shown = (user_state == "active" && public)
        .then(|| achieved.into_iter().find(|(id, _)| *id == award.id))
        .flatten();
    Ok(state
        .summary(
            award,
            version,
            shown.as_ref().map(|(_, a)| a),
            Audience::User,
        )
        .await)
}

impl AppState {
    /// An award's progress from the user's row, or at zero without one.
    async fn summary(
        &self,
        award: &AwardDefinition,
        version: i32,
        achieved: Option<&crate::store::AchieveState>,
        audience: Audience,
    ) -> AwardSummary {
        let (progress, goal, started, completed, completed_at, error) = match achieved {
            Some(a) => (
                a.progress,
                a.goal,
                a.started,
                a.completed,
                a.completed_at,
                a.error.clone(),
            ),
            None => {
                let (progress, goal, error) = match self.zero_progress(award, version).await {
                    Ok((progress, goal)) => (progress, goal, None),
                    Err(error) => (0.0, 0.0, Some(error)),
                };
                (progress, goal, false, false, None, error)
            }
        };
        AwardSummary {
            award_id: award.id.clone(),
            title: award.title.clone(),
            description: award.description.clone(),
            progress,
            goal,
            remaining: (goal - progress).max(0.0),
            started,
            completed,
            completed_at: completed_at.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true)),
            error: error.filter(|_| audience == Audience::Admin),
        }
    }
}

type ZeroKey = (String, i32, u64);

/// Progress and goal of an award nobody has started, per award version.
#[derive(Default)]
pub struct ZeroProgress {
    /// (progress, goal) by (award id, award version, registry generation).
    cache: std::sync::Mutex<HashMap<ZeroKey, (f64, f64)>>,
}

impl AppState {
    async fn zero_progress(
        &self,
        award: &AwardDefinition,
        version: i32,
    ) -> Result<(f64, f64), String> {
        // The strategy function may change under the same award version.
        let key = (award.id.clone(), version, self.registry.generation());
        if let Some(known) = self
            .zero
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(*known);
        }
        let (award, registry) = (award.clone(), Arc::clone(&self.registry));
        let computed = tokio::task::spawn_blocking(move || {
            crate::progress::progress_at_zero(&award, &registry)
        })
        .await
        .map_err(|e| format!("the strategy could not run: {e}"))
        .and_then(|r| r)
        .map(|p| (p.progress, p.goal));
        // A failure is not cached: the function may be fixed by a push.
        if let Ok(known) = computed {
            let mut cache = self.zero.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() > 10_000 {
                cache.clear();
            }
            cache.insert(key, known);
        }
        computed
    }
}
