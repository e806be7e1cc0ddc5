//! A user's awards as apps and support see them: every enabled award,
//! started or not, with progress, goal, completion and objective counters.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::SecondsFormat;
use serde_json::{Value, json};

use super::error::ApiError;
use super::{AppState, number};
use crate::definitions::AwardDefinition;

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
) -> Result<Value, ApiError> {
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
        let objectives: Vec<Value> = award
            .objectives
            .iter()
            .map(|o| {
                let counters = counters
                    .get(&(award.id.clone(), o.id.clone()))
                    .cloned()
                    .unwrap_or_default();
                json!({"objective_id": o.id, "counters": counters})
            })
            .collect();
        let (progress, goal, started, completed, completed_at, error) =
            match achieved.get(&award.id) {
                Some(a) => (
                    a.progress,
                    a.goal,
                    a.started,
                    a.completed,
                    a.completed_at,
                    a.error.clone(),
                ),
                None => {
                    let (progress, goal, error) = match state.zero_progress(award, version).await {
                        Ok((progress, goal)) => (progress, goal, None),
                        Err(error) => (0.0, 0.0, Some(error)),
                    };
                    (progress, goal, false, false, None, error)
                }
            };
        let mut entry = json!({
            "award_id": award.id,
            "title": award.title,
            "description": award.description,
            "progress": number(progress),
            "goal": number(goal),
            "remaining": number((goal - progress).max(0.0)),
            "started": started,
            "completed": completed,
            "completed_at": completed_at.map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true)),
            "objectives": objectives,
        });
        if audience == Audience::Admin
            && let Some(error) = error
        {
            entry["error"] = Value::String(error);
        }
        awards.push(entry);
    }
    Ok(json!({"user_id": user_id, "awards": awards}))
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
        let computed =
            tokio::task::spawn_blocking(move || crate::awards::progress_at_zero(&award, &registry))
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
