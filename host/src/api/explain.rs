//! "Why is this 7 of 10?": for one user and award, what each content item
//! contributes to each objective, which items contribute nothing (and the
//! filter that stopped them, where the log knows), and the user's recent
//! processing-log entries for the award.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Serialize;

use super::admin::{LogEntry, log_entry, time};
use super::progress::{Audience, AwardProgress, AwardSummary, user_awards};
use super::{ApiError, AppState};
use crate::event::Envelope;
use crate::objectives::{Plan, Verdict};
use crate::store::{Counters, ItemRow, LogRecord};

/// Recent events (and idle items) shown unless `?events=N` says otherwise.
const EVENTS: i64 = 20;
const EVENTS_MAX: i64 = 200;
/// Contributing items listed per objective; more are counted, not listed.
const CONTRIBUTING_MAX: i64 = 1000;

pub async fn explain(
    State(state): State<Arc<AppState>>,
    Path((user_id, award_id)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Explanation>, ApiError> {
    let events = match query.get("events") {
        None => EVENTS,
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "query parameter events must be a positive whole number, not {v:?}"
                ))
            })?
            .min(EVENTS_MAX),
    };
    let _permit = state.heavy("an explain")?;
    let awards = state.catalog.awards();
    let Some(award) = awards.iter().find(|a| a.id == award_id).cloned() else {
        return Err(ApiError::NotFound(format!(
            "award {award_id} not found (or not enabled)"
        )));
    };
    let progress = user_awards(&state, &user_id, Audience::Admin).await?;
    let Some(AwardProgress {
        summary,
        objectives: counters,
    }) = progress
        .awards
        .into_iter()
        .find(|a| a.summary.award_id == award_id)
    else {
        return Err(ApiError::NotFound(format!("award {award_id} not found")));
    };

    // The award's objectives bound as ingest binds them, with the sources
    // each can see (None: any).
    let (registry, planned) = (Arc::clone(&state.registry), award.clone());
    let plan = tokio::task::spawn_blocking(move || Plan::for_award(&planned, &registry))
        .await
        .map_err(|e| {
            ApiError::Unexpected(anyhow::anyhow!("planning the objectives failed: {e}"))
        })?;
    let objective_ids = award.objectives.iter().map(|o| o.id.clone()).collect();
    let sources: Vec<Option<Vec<String>>> = plan
        .sources()
        .map(|s| s.map(|s| s.iter().cloned().collect()))
        .collect();

    // The user's recent events from Kafka, run through each objective's
    // filters and rule again (current versions): which filter stops what.
    let (evaluated, recent_note) =
        recent_events(&state, plan, objective_ids, &sources, &user_id, events).await;

    let store = state.store().await?;
    let mut objectives = Vec::with_capacity(award.objectives.len());
    for (objective, sources) in award.objectives.iter().zip(sources) {
        let key = format!("{}/{}", award.id, objective.id);
        let contributing = store
            .contributing_items(&user_id, &key, CONTRIBUTING_MAX + 1)
            .await?;
        let idle = store
            .idle_items(&user_id, &key, sources.as_deref(), events)
            .await?;
        let event_ids: Vec<&str> = idle.iter().map(|i| i.event_id.as_str()).collect();
        let idle_log = store.user_event_log(&user_id, &event_ids).await?;
        let listed: Vec<Contribution> = contributing
            .iter()
            .take(CONTRIBUTING_MAX as usize)
            .map(contribution)
            .collect();
        let counters = counters
            .iter()
            .find(|c| c.objective_id == objective.id)
            .map(|c| c.counters.clone())
            .unwrap_or_default();
        objectives.push(ExplainedObjective {
            objective_id: objective.id.clone(),
            filters: objective.filters.iter().map(|f| f.name.clone()).collect(),
            rule: objective.rule.name.clone(),
            progress_counter: objective.progress_counter.clone(),
            sources,
            counters,
            contributing: listed,
            contributing_truncated: contributing.len() as i64 > CONTRIBUTING_MAX,
            not_contributing: idle
                .iter()
                .map(|i| idle_item(i, &award.id, &objective.id, &idle_log, &evaluated))
                .collect(),
        });
    }
    let recent = store.user_award_log(&user_id, &award.id, events).await?;
    Ok(Json(Explanation {
        summary,
        user_id,
        objectives,
        recent_events: recent.iter().map(log_entry).collect(),
        recent_events_evaluated: evaluated,
        recent_events_note: recent_note,
    }))
}

/// `GET /admin/v1/users/{user_id}/awards/{id}/explain`: the award's
/// progress, and for each objective what counts and what does not, why.
#[derive(Debug, Serialize)]
pub struct Explanation {
    #[serde(flatten)]
    summary: AwardSummary,
    user_id: String,
    objectives: Vec<ExplainedObjective>,
    /// The processing log's entries for this award, newest first.
    recent_events: Vec<LogEntry>,
    /// The user's recent events run through the objectives again.
    recent_events_evaluated: Vec<EvaluatedEvent>,
    /// Why `recent_events_evaluated` is empty or short (Kafka away, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    recent_events_note: Option<String>,
}

#[derive(Debug, Serialize)]
struct ExplainedObjective {
    objective_id: String,
    filters: Vec<String>,
    rule: String,
    progress_counter: String,
    /// The sources its filters can match (`null`: any).
    sources: Option<Vec<String>>,
    counters: Counters,
    contributing: Vec<Contribution>,
    contributing_truncated: bool,
    not_contributing: Vec<IdleItem>,
}

/// A content item and what it contributes to the objective.
#[derive(Debug, Serialize)]
struct Contribution {
    source: String,
    content_id: String,
    counters: Counters,
    /// Items with the same key count once between them.
    dedup_key: Option<String>,
    event_id: String,
    occurred_at: String,
}

fn contribution(item: &ItemRow) -> Contribution {
    Contribution {
        source: item.source.clone(),
        content_id: item.content_id.clone(),
        counters: item.counters.clone(),
        dedup_key: item.dedup_key.clone(),
        event_id: item.event_id.clone(),
        occurred_at: time(item.occurred_at),
    }
}

/// A content item that contributes nothing to the objective, and why.
#[derive(Debug, Serialize)]
struct IdleItem {
    source: String,
    content_id: String,
    event_id: String,
    occurred_at: String,
    why: String,
}

/// An item that contributes nothing, with the log's word on why when the
/// log has one: a filter that took it out, or why the objective could not
/// use it; else its last event's verdict now, if that was just evaluated.
fn idle_item(
    item: &ItemRow,
    award_id: &str,
    objective_id: &str,
    log: &[LogRecord],
    evaluated: &[EvaluatedEvent],
) -> IdleItem {
    let logged = log
        .iter()
        .filter(|r| r.event_id.as_deref() == Some(item.event_id.as_str()))
        .find_map(|r| {
            if r.award_id.as_deref() == Some(award_id)
                && r.objective_id.as_deref() == Some(objective_id)
            {
                return r.reason.clone();
            }
            let filter = r.excluded_by(award_id, objective_id)?;
            Some(
                Verdict::Excluded {
                    filter: filter.into(),
                }
                .to_string(),
            )
        });
    let now = || {
        evaluated
            .iter()
            .find(|e| e.event_id == item.event_id)?
            .objectives
            .iter()
            .find(|o| o.objective_id == objective_id)
            .map(|o| o.outcome.clone())
    };
    let why = logged.or_else(now).unwrap_or_else(|| {
        "its last event did not pass this objective's filters, or its rule counted nothing"
            .to_string()
    });
    IdleItem {
        source: item.source.clone(),
        content_id: item.content_id.clone(),
        event_id: item.event_id.clone(),
        occurred_at: time(item.occurred_at),
        why,
    }
}

/// One of the user's recent events, as every objective sees it now.
#[derive(Debug, Serialize)]
struct EvaluatedEvent {
    event_id: String,
    source: String,
    #[serde(rename = "type")]
    event_type: String,
    content_id: Option<String>,
    status: Option<String>,
    occurred_at: String,
    objectives: Vec<ObjectiveVerdict>,
}

#[derive(Debug, Serialize)]
struct ObjectiveVerdict {
    objective_id: String,
    /// The verdict in words.
    outcome: String,
    verdict: Verdict,
}

/// Messages read back per partition and source to find a user's recent
/// events.
const SCAN_PER_PARTITION: i64 = 10_000;

/// The user's newest `limit` events on the award's sources (from Kafka),
/// each with what every objective's filters and rule make of it now; and a
/// note when they could not be read.
async fn recent_events(
    state: &Arc<AppState>,
    mut plan: Plan,
    objective_ids: Vec<String>,
    sources: &[Option<Vec<String>>],
    user_id: &str,
    limit: i64,
) -> (Vec<EvaluatedEvent>, Option<String>) {
    let Some(brokers) = state.settings.kafka_brokers.clone() else {
        return (
            Vec::new(),
            Some("this process has no Kafka brokers configured".into()),
        );
    };
    let registered = match state.store().await {
        Ok(store) => store.sources().await.unwrap_or_default(),
        Err(error) => return (Vec::new(), Some(error.to_string())),
    };
    let wanted: Vec<_> = registered
        .iter()
        .filter(|s| {
            sources
                .iter()
                .any(|o| o.as_ref().is_none_or(|list| list.contains(&s.name)))
        })
        .collect();
    let mut envelopes = Vec::new();
    let mut problems = Vec::new();
    for source in wanted {
        match crate::kafka::recent_messages(&brokers, &source.topic, user_id, SCAN_PER_PARTITION)
            .await
        {
            Ok(payloads) => {
                envelopes.extend(payloads.iter().filter_map(|p| Envelope::parse(p).ok()))
            }
            Err(error) => problems.push(error.to_string()),
        }
    }
    // Newest first; of one occurred_at, the later in the topic first (the
    // sort is stable, and each partition was read in order), as ingest
    // decides which is an item's last.
    envelopes.reverse();
    envelopes.sort_by_key(|e| std::cmp::Reverse(e.occurred_at));
    envelopes.truncate(limit.max(0) as usize);
    let evaluated = tokio::task::spawn_blocking(move || {
        let verdicts = plan.verdicts(&envelopes);
        evaluated(&envelopes, &objective_ids, verdicts)
    })
    .await
    .unwrap_or_default();
    let note = (!problems.is_empty()).then(|| problems.join("; "));
    (evaluated, note)
}

/// Each event with each objective's verdict on it (`verdicts` is
/// `[objective][event]`).
fn evaluated(
    envelopes: &[Envelope],
    objective_ids: &[String],
    verdicts: Vec<Vec<Verdict>>,
) -> Vec<EvaluatedEvent> {
    let mut per_objective: Vec<_> = verdicts.into_iter().map(Vec::into_iter).collect();
    envelopes
        .iter()
        .map(|envelope| EvaluatedEvent {
            event_id: envelope.id.clone(),
            source: envelope.source.clone(),
            event_type: envelope.event_type.clone(),
            content_id: envelope.content_id.clone(),
            status: envelope.status.clone(),
            occurred_at: time(envelope.occurred_at),
            objectives: objective_ids
                .iter()
                .zip(&mut per_objective)
                .filter_map(|(objective_id, verdicts)| {
                    let verdict = verdicts.next()?;
                    Some(ObjectiveVerdict {
                        objective_id: objective_id.clone(),
                        outcome: verdict.to_string(),
                        verdict,
                    })
                })
                .collect(),
        })
        .collect()
}
