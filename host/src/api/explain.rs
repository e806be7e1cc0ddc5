//! "Why is this 7 of 10?": for one user and award, what each content item
//! contributes to each objective, which items contribute nothing (and the
//! filter that stopped them, where the log knows), and the user's recent
//! processing-log entries for the award.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde_json::{Value, json};

use super::admin::{log_entry, time};
use super::progress::{Audience, user_awards};
use super::{ApiError, AppState};
use crate::definitions;
use crate::store::{ItemRow, LogRow};

/// Recent events (and idle items) shown unless `?events=N` says otherwise.
const EVENTS: i64 = 20;
const EVENTS_MAX: i64 = 200;
/// Contributing items listed per objective; more are counted, not listed.
const CONTRIBUTING_MAX: i64 = 1000;

pub async fn explain(
    State(state): State<Arc<AppState>>,
    Path((user_id, award_id)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
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
    let awards = state.catalog.awards();
    let Some(award) = awards.iter().find(|a| a.id == award_id).cloned() else {
        return Err(ApiError::NotFound(format!(
            "award {award_id} not found (or not enabled)"
        )));
    };
    let mut progress = user_awards(&state, &user_id, Audience::Admin).await?;
    let mut summary = progress["awards"]
        .as_array_mut()
        .and_then(|awards| {
            let at = awards.iter().position(|a| a["award_id"] == award_id)?;
            Some(awards.swap_remove(at))
        })
        .ok_or_else(|| ApiError::NotFound(format!("award {award_id} not found")))?;
    let counters = summary["objectives"].take();

    // The sources each objective's filters admit (None: any), as ingest
    // plans them.
    let registry = Arc::clone(&state.registry);
    let planned = award.clone();
    let sources: Vec<Option<Vec<String>>> = tokio::task::spawn_blocking(move || {
        planned
            .objectives
            .iter()
            .map(|o| {
                let mut filters: Vec<_> = o
                    .filters
                    .iter()
                    .filter_map(|f| registry.bind_filter(&f.name, &f.config_text()).ok())
                    .collect();
                definitions::sources_of(&mut filters).map(|s| s.into_iter().collect())
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::Unexpected(anyhow::anyhow!("planning the objectives failed: {e}")))?;

    // The user's recent events from Kafka, run through each objective's
    // filters and rule again (current versions): which filter stops what.
    let (evaluated, recent_note) = recent_events(&state, &award, &sources, &user_id, events).await;

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
        let listed: Vec<Value> = contributing
            .iter()
            .take(CONTRIBUTING_MAX as usize)
            .map(contribution)
            .collect();
        let counters = counters
            .as_array()
            .and_then(|all| {
                all.iter()
                    .find(|c| c["objective_id"] == objective.id.as_str())
            })
            .map_or_else(|| json!({}), |c| c["counters"].clone());
        objectives.push(json!({
            "objective_id": objective.id,
            "filters": objective.filters.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            "rule": objective.rule.name,
            "progress_counter": objective.progress_counter,
            "sources": sources,
            "counters": counters,
            "contributing": listed,
            "contributing_truncated": contributing.len() as i64 > CONTRIBUTING_MAX,
            "not_contributing": idle
                .iter()
                .map(|i| idle_item(i, &key, &idle_log, &objective.id, &evaluated))
                .collect::<Vec<_>>(),
        }));
    }
    let recent = store.user_award_log(&user_id, &award.id, events).await?;
    summary["objectives"] = Value::Array(objectives);
    summary["user_id"] = Value::String(user_id);
    summary["recent_events"] = recent.iter().map(log_entry).collect();
    summary["recent_events_evaluated"] = Value::Array(evaluated);
    if let Some(note) = recent_note {
        summary["recent_events_note"] = Value::String(note);
    }
    Ok(Json(summary))
}

fn contribution(item: &ItemRow) -> Value {
    let share = item.share.as_ref();
    json!({
        "source": item.source,
        "content_id": item.content_id,
        "counters": share.and_then(|s| s.get("c")).cloned().unwrap_or_else(|| json!({})),
        // Items with the same key count once between them.
        "dedup_key": share.and_then(|s| s.get("k")).cloned(),
        "event_id": item.event_id,
        "occurred_at": time(item.occurred_at),
    })
}

/// An item that contributes nothing, with the log's word on why when the
/// log has one: a filter that stopped it, or a rule that could not use it.
fn idle_item(
    item: &ItemRow,
    key: &str,
    log: &[LogRow],
    objective_id: &str,
    evaluated: &[Value],
) -> Value {
    // Its last event among those just evaluated: the answer, now.
    let now = evaluated
        .iter()
        .find(|e| e["event_id"] == item.event_id.as_str())
        .and_then(|e| {
            e["objectives"]
                .as_array()?
                .iter()
                .find(|o| o["objective_id"] == objective_id)
                .and_then(|o| o["outcome"].as_str().map(str::to_string))
        });
    let (award, objective) = key.split_once('/').unwrap_or((key, ""));
    let prefix = format!("{key}: ");
    let why = log
        .iter()
        .filter(|r| r.event_id.as_deref() == Some(item.event_id.as_str()))
        .find_map(|r| {
            let reason = r.reason.as_deref()?;
            if r.award_id.as_deref() == Some(award) && r.objective_id.as_deref() == Some(objective)
            {
                return Some(reason.to_string());
            }
            reason
                .split("; ")
                .find_map(|part| part.strip_prefix(&prefix))
                .map(str::to_string)
        })
        .or(now)
        .unwrap_or_else(|| {
            "its last event did not pass this objective's filters, or its rule counted nothing"
                .to_string()
        });
    json!({
        "source": item.source,
        "content_id": item.content_id,
        "event_id": item.event_id,
        "occurred_at": time(item.occurred_at),
        "why": why,
    })
}

/// Messages read back per partition and source to find a user's recent
/// events.
const SCAN_PER_PARTITION: i64 = 10_000;

/// The user's newest `limit` events on the award's sources (from Kafka),
/// each with what every objective's filters and rule make of it now; and a
/// note when they could not be read.
async fn recent_events(
    state: &Arc<AppState>,
    award: &definitions::AwardDefinition,
    sources: &[Option<Vec<String>>],
    user_id: &str,
    limit: i64,
) -> (Vec<Value>, Option<String>) {
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
        match crate::ingest::recent_messages(&brokers, &source.topic, user_id, SCAN_PER_PARTITION)
            .await
        {
            Ok(payloads) => envelopes.extend(
                payloads
                    .iter()
                    .filter_map(|p| crate::event::Envelope::parse(p).ok()),
            ),
            Err(error) => problems.push(error),
        }
    }
    envelopes.sort_by_key(|e| std::cmp::Reverse(e.occurred_at));
    envelopes.truncate(limit.max(0) as usize);
    let (award, registry) = (award.clone(), Arc::clone(&state.registry));
    let evaluated = tokio::task::spawn_blocking(move || evaluate(&award, &registry, &envelopes))
        .await
        .unwrap_or_default();
    let note = (!problems.is_empty()).then(|| problems.join("; "));
    (evaluated, note)
}

/// What each objective's filters and rule (current versions) make of
/// What each objective's filters and rule (current versions) make of
/// each event: each function bound once and called with the whole batch,
/// filter by filter on what the previous ones passed, as ingest does.
fn evaluate(
    award: &definitions::AwardDefinition,
    registry: &Arc<crate::registry::Registry>,
    envelopes: &[crate::event::Envelope],
) -> Vec<Value> {
    let events: Vec<crate::runtime::Event> =
        envelopes.iter().map(|e| e.to_function_event()).collect();
    let outcomes: Vec<Vec<String>> = award
        .objectives
        .iter()
        .map(|objective| outcomes(objective, registry, &events))
        .collect();
    envelopes
        .iter()
        .enumerate()
        .map(|(index, envelope)| {
            let objectives: Vec<Value> = award
                .objectives
                .iter()
                .zip(&outcomes)
                .map(|(objective, outcomes)| {
                    json!({"objective_id": objective.id, "outcome": outcomes[index]})
                })
                .collect();
            json!({
                "event_id": envelope.id,
                "source": envelope.source,
                "type": envelope.event_type,
                "content_id": envelope.content_id,
                "status": envelope.status,
                "occurred_at": time(envelope.occurred_at),
                "objectives": objectives,
            })
        })
        .collect()
}

/// One objective's outcome for each of `events`.
fn outcomes(
    objective: &definitions::ObjectiveDefinition,
    registry: &Arc<crate::registry::Registry>,
    events: &[crate::runtime::Event],
) -> Vec<String> {
    let mut outcomes: Vec<Option<String>> = vec![None; events.len()];
    let mut passing: Vec<usize> = (0..events.len()).collect();
    for filter in &objective.filters {
        if passing.is_empty() {
            break;
        }
        let answers = registry
            .bind_filter(&filter.name, &filter.config_text())
            .map_err(|e| e.to_string())
            .and_then(|mut b| {
                b.instance()
                    .matches(passing.iter().map(|&i| &events[i]))
                    .map_err(|e| e.to_string())
            });
        match answers {
            Ok(answers) => {
                passing = passing
                    .into_iter()
                    .zip(answers)
                    .filter_map(|(i, ok)| {
                        if !ok {
                            outcomes[i] = Some(format!("excluded by filter {}", filter.name));
                        }
                        ok.then_some(i)
                    })
                    .collect();
            }
            Err(error) => {
                for &i in &passing {
                    outcomes[i] = Some(format!("filter {} failed: {error}", filter.name));
                }
                passing.clear();
            }
        }
    }
    if !passing.is_empty() {
        let rule = &objective.rule;
        let answers = registry
            .bind_rule(&rule.name, &rule.config_text())
            .map_err(|e| e.to_string())
            .and_then(|mut b| {
                b.instance()
                    .contribute(passing.iter().map(|&i| &events[i]))
                    .map_err(|e| e.to_string())
            });
        match answers {
            Ok(answers) => {
                for (&i, answer) in passing.iter().zip(answers) {
                    outcomes[i] = Some(match answer {
                        Ok(Some(contribution)) => {
                            let counters: Vec<String> = contribution
                                .counters
                                .iter()
                                .map(|c| format!("{} {}", c.name, c.value))
                                .collect();
                            format!("rule {} counts {}", rule.name, counters.join(", "))
                        }
                        Ok(None) => format!("rule {} counts nothing", rule.name),
                        Err(reason) => format!("rule {} refused it: {reason}", rule.name),
                    });
                }
            }
            Err(error) => {
                for &i in &passing {
                    outcomes[i] = Some(format!("rule {} failed: {error}", rule.name));
                }
            }
        }
    }
    outcomes
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect()
}
