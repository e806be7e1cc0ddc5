//! What a candidate version of a function would change, before it serves:
//! the recent events of every enabled award that uses the name (read back
//! from Kafka, as explain reads a user's) go through the award's objectives
//! twice, once as they are live and once with the candidate in the name's
//! place; the users whose counters or progress would differ are named.
//!
//! The window is what Kafka still holds, up to `per_partition` messages of
//! each partition of the awards' sources: a user's counters are taken as
//! stored, moved by the difference the candidate makes on the window
//! (content items by their last event in it, analytics events added).
//! Items that share a de-duplication key are counted as separate here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::definitions::AwardDefinition;
use crate::event::Envelope;
use crate::ingest::{Plan, Verdict};
use crate::registry::Registry;
use crate::runtime::Function;
use crate::store::{Counters, Store};

/// Examples of changed verdicts shown per award.
const EXAMPLES: usize = 10;
/// Users whose progress is computed per award; more are counted as seen.
const USERS_MAX: usize = 5_000;

/// The answer of `laurel functions diff`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Diff {
    pub function: String,
    pub live_version: i32,
    pub candidate_version: i32,
    /// Recent events read from the awards' sources.
    pub events: usize,
    pub awards: Vec<AwardDiff>,
    /// What could not be read (a source's topic away, ...), if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What the candidate would change for one award.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct AwardDiff {
    pub award_id: String,
    /// Events whose verdict differs for some objective.
    pub events_changed: usize,
    /// Users with an event in the window.
    pub users_seen: usize,
    /// Users whose counters would differ.
    pub counters_changed: Vec<String>,
    /// Users whose progress would differ.
    pub progress_changed: Vec<String>,
    /// Users who would complete the award with the candidate.
    pub would_complete: Vec<String>,
    /// Users who would lose a completion with the candidate.
    pub would_lose_completion: Vec<String>,
    pub examples: Vec<Example>,
}

/// One event an objective decides differently.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Example {
    pub user_id: String,
    pub event_id: String,
    pub objective_id: String,
    pub live: String,
    pub candidate: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("{0}")]
    NoCandidate(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Load(#[from] crate::runtime::LoadError),
}

/// Diffs `version` of `name` (default: its newest version above the live
/// one, a shadow candidate) against the live version.
pub async fn diff(
    store: &Store,
    registry: &Arc<Registry>,
    brokers: &str,
    name: &str,
    version: Option<i32>,
    per_partition: i64,
) -> Result<Diff, DiffError> {
    let (live_version, _) = store
        .live_function(name)
        .await?
        .ok_or_else(|| DiffError::NoCandidate(format!("no function named {name} is registered")))?;
    let version = match version {
        Some(version) => version,
        None => store
            .all_function_versions()
            .await?
            .iter()
            .filter(|r| r.name == name && r.version > live_version)
            .map(|r| r.version)
            .max()
            .ok_or_else(|| {
                DiffError::NoCandidate(format!(
                    "{name} has no version newer than the live v{live_version}: push one with --shadow"
                ))
            })?,
    };
    let found = store
        .function_version(name, version)
        .await?
        .ok_or_else(|| DiffError::NoCandidate(format!("{name} has no version {version}")))?;
    let runtime = registry.runtime().clone();
    let candidate = tokio::task::spawn_blocking(move || {
        let kind = crate::runtime::FunctionKind::parse(&found.kind);
        runtime.load(&found.name, found.version, &found.bytes, kind)
    })
    .await
    .map_err(|e| DiffError::NoCandidate(format!("loading the candidate failed: {e}")))??;

    let awards: Vec<AwardDefinition> = store
        .awards()
        .await?
        .into_iter()
        .filter(|row| row.enabled)
        .filter_map(|row| serde_json::from_value::<AwardDefinition>(row.definition).ok())
        .filter(|award| uses(award, name))
        .collect();

    // The recent events of every source these awards can see.
    let sources = store.sources().await?;
    let mut envelopes = Vec::new();
    let mut problems = Vec::new();
    for source in &sources {
        match crate::ingest::recent_payloads(brokers, &source.topic, per_partition).await {
            Ok(payloads) => {
                envelopes.extend(payloads.iter().filter_map(|p| Envelope::parse(p).ok()))
            }
            Err(error) => problems.push(format!("{}: {error}", source.topic)),
        }
    }
    envelopes.sort_by_key(|e| e.occurred_at);

    let mut diffs = Vec::with_capacity(awards.len());
    for award in awards {
        let live = Arc::clone(registry);
        let shadow = registry.with_replaced(&[Arc::clone(&candidate)]);
        let (events, definition) = (envelopes.clone(), award.clone());
        let window = tokio::task::spawn_blocking(move || {
            let live_verdicts = Plan::for_award(&definition, &live).verdicts(&events);
            let shadow_verdicts = Plan::for_award(&definition, &shadow).verdicts(&events);
            Window::new(&definition, &events, &live_verdicts, &shadow_verdicts)
        })
        .await
        .map_err(|e| DiffError::NoCandidate(format!("evaluating the events failed: {e}")))?;
        diffs.push(award_diff(store, registry, &candidate, &award, window).await?);
    }
    Ok(Diff {
        function: name.to_string(),
        live_version,
        candidate_version: version,
        events: envelopes.len(),
        awards: diffs,
        note: (!problems.is_empty()).then(|| problems.join("; ")),
    })
}

/// Whether `award` names `function` as a filter, rule or strategy.
fn uses(award: &AwardDefinition, function: &str) -> bool {
    award.strategy_function == function
        || award
            .objectives
            .iter()
            .any(|o| o.rule.name == function || o.filters.iter().any(|f| f.name == function))
}

/// What the window of events makes of an award, live and with the
/// candidate: per user, per objective, counters.
struct Window {
    live: BTreeMap<String, BTreeMap<String, Counters>>,
    shadow: BTreeMap<String, BTreeMap<String, Counters>>,
    events_changed: usize,
    examples: Vec<Example>,
}

impl Window {
    fn new(
        award: &AwardDefinition,
        events: &[Envelope],
        live: &[Vec<Verdict>],
        shadow: &[Vec<Verdict>],
    ) -> Window {
        let mut window = Window {
            live: BTreeMap::new(),
            shadow: BTreeMap::new(),
            events_changed: 0,
            examples: Vec::new(),
        };
        let mut changed = BTreeSet::new();
        for (objective, (live, shadow)) in award.objectives.iter().zip(live.iter().zip(shadow)) {
            for (at, (l, s)) in live.iter().zip(shadow).enumerate() {
                if l != s {
                    changed.insert(at);
                    if window.examples.len() < EXAMPLES {
                        window.examples.push(Example {
                            user_id: events[at].user_id.clone(),
                            event_id: events[at].id.clone(),
                            objective_id: objective.id.clone(),
                            live: l.to_string(),
                            candidate: s.to_string(),
                        });
                    }
                }
            }
            for (user, counters) in counted(events, live) {
                window
                    .live
                    .entry(user)
                    .or_default()
                    .insert(objective.id.clone(), counters);
            }
            for (user, counters) in counted(events, shadow) {
                window
                    .shadow
                    .entry(user)
                    .or_default()
                    .insert(objective.id.clone(), counters);
            }
        }
        window.events_changed = changed.len();
        window
    }
}

/// Per user, what the events (in time order) count for one objective:
/// each content item its last event's counters, analytics events added.
/// Users with an event that reached the objective are listed, even at 0.
fn counted(events: &[Envelope], verdicts: &[Verdict]) -> BTreeMap<String, Counters> {
    let mut items: BTreeMap<(&str, &str, &str), Counters> = BTreeMap::new();
    let mut users: BTreeMap<String, Counters> = BTreeMap::new();
    for (event, verdict) in events.iter().zip(verdicts) {
        let counters = match verdict {
            Verdict::Counted { counters, .. } => counters.clone(),
            _ => Counters::new(),
        };
        let additive = matches!(verdict, Verdict::Counted { additive: true, .. });
        let total = users.entry(event.user_id.clone()).or_default();
        match &event.content_id {
            Some(item) if !additive => {
                let key = (event.user_id.as_str(), event.source.as_str(), item.as_str());
                items.insert(key, counters);
            }
            _ => add(total, &counters, 1),
        }
    }
    for ((user, _, _), counters) in items {
        add(users.entry(user.to_string()).or_default(), &counters, 1);
    }
    users
}

fn add(to: &mut Counters, counters: &Counters, sign: i64) {
    for (name, value) in counters {
        *to.entry(name.clone()).or_insert(0) += sign * value;
    }
}

/// Counters without zeros, to compare.
fn nonzero(counters: &Counters) -> Counters {
    counters
        .iter()
        .filter(|(_, v)| **v != 0)
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

async fn award_diff(
    store: &Store,
    registry: &Arc<Registry>,
    candidate: &Arc<Function>,
    award: &AwardDefinition,
    window: Window,
) -> Result<AwardDiff, DiffError> {
    let users: BTreeSet<&String> = window.live.keys().chain(window.shadow.keys()).collect();
    let users_seen = users.len();
    let strategy_changes = award.strategy_function == candidate.name;
    let empty = BTreeMap::new();
    // (user, stored counters, with the candidate's difference)
    let mut compared = Vec::new();
    let mut counters_changed = Vec::new();
    for user in users.into_iter().take(USERS_MAX) {
        let live = window.live.get(user).unwrap_or(&empty);
        let shadow = window.shadow.get(user).unwrap_or(&empty);
        let objectives: BTreeSet<&String> = live.keys().chain(shadow.keys()).collect();
        let moved = objectives.iter().any(|o| {
            let zero = Counters::new();
            nonzero(live.get(*o).unwrap_or(&zero)) != nonzero(shadow.get(*o).unwrap_or(&zero))
        });
        if moved {
            counters_changed.push(user.clone());
        }
        if !moved && !strategy_changes {
            continue;
        }
        let stored: BTreeMap<String, Counters> = store
            .user_counters(user)
            .await?
            .into_iter()
            .filter(|((a, _), _)| *a == award.id)
            .map(|((_, objective), counters)| (objective, counters))
            .collect();
        let mut with_candidate = stored.clone();
        for objective in objectives {
            let zero = Counters::new();
            let counters = with_candidate.entry(objective.clone()).or_default();
            add(counters, shadow.get(objective).unwrap_or(&zero), 1);
            add(counters, live.get(objective).unwrap_or(&zero), -1);
        }
        compared.push((user.clone(), stored, with_candidate));
    }
    let (live_registry, shadow_registry) = (
        Arc::clone(registry),
        registry.with_replaced(&[Arc::clone(candidate)]),
    );
    let definition = award.clone();
    let progress = tokio::task::spawn_blocking(move || {
        let before: Vec<_> = compared.iter().map(|(_, s, _)| s.clone()).collect();
        let after: Vec<_> = compared.iter().map(|(_, _, c)| c.clone()).collect();
        let before = crate::awards::progress_of(&definition, &live_registry, &before);
        let after = crate::awards::progress_of(&definition, &shadow_registry, &after);
        compared
            .into_iter()
            .map(|(user, _, _)| user)
            .zip(before.into_iter().zip(after))
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| DiffError::NoCandidate(format!("computing progress failed: {e}")))?;
    let mut diff = AwardDiff {
        award_id: award.id.clone(),
        events_changed: window.events_changed,
        users_seen,
        counters_changed,
        examples: window.examples,
        ..AwardDiff::default()
    };
    for (user, (before, after)) in progress {
        let (before, after) = match (before, after) {
            (Ok(before), Ok(after)) => (before, after),
            (before, after) => {
                if before.is_ok() != after.is_ok() {
                    diff.progress_changed.push(user);
                }
                continue;
            }
        };
        if before.progress != after.progress || before.completed != after.completed {
            diff.progress_changed.push(user.clone());
        }
        match (before.completed, after.completed) {
            (false, true) => diff.would_complete.push(user),
            (true, false) => diff.would_lose_completion.push(user),
            _ => {}
        }
    }
    Ok(diff)
}
