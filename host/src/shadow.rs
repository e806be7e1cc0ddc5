//! What a candidate version of a function would change, before it serves:
//! the recent events of every enabled award that uses the name (read back
//! from Kafka, as explain reads a user's) go through the award's objectives
//! twice, once as they are live and once with the candidate in the name's
//! place; the users whose counters or progress would differ are named.
//!
//! The window ([`Reach`]) is what Kafka still holds, up to `events`
//! messages of each partition of the awards' sources, and the last applied
//! event of up to `items` stored content items (whole users, in key order):
//! a user's counters are taken as stored, moved by the difference the
//! candidate makes on the window (content items by their last event in it,
//! analytics events added). Items that share a de-duplication key are
//! counted as separate here.
//!
//! `laurel awards apply --dry-run` compares the same way: a changed award
//! definition against the one that is live (a new one against no award).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::definitions::AwardDefinition;
use crate::event::Envelope;
use crate::objectives::{Plan, Verdict};
use crate::registry::Registry;
use crate::store::{Counters, Store};
use crate::watch::{Step, Watch};

/// Examples of changed verdicts shown per award.
const EXAMPLES: usize = 10;
/// Users whose progress is computed per award; more are counted as seen.
const USERS_MAX: usize = 5_000;

/// How much of the past a diff reads.
#[derive(Debug, Clone, Copy)]
pub struct Reach {
    /// Messages read back per partition of each source.
    pub events: i64,
    /// Stored content items read with their last applied event (0: none).
    pub items: i64,
}

/// The answer of `laurel functions diff`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Diff {
    pub function: String,
    pub live_version: i32,
    pub candidate_version: i32,
    /// Recent events read from the awards' sources.
    pub events: usize,
    /// Stored content items read (each with its last applied event).
    pub items: usize,
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
/// one, a shadow candidate) against the live version, telling `watch` each
/// source read and each award compared.
pub async fn diff(
    store: &Store,
    registry: &Arc<Registry>,
    brokers: &str,
    name: &str,
    version: Option<i32>,
    reach: Reach,
    watch: Watch<'_>,
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
        runtime.load_with(&found.name, found.version, &found.bytes, kind, found.limits)
    })
    .await
    .map_err(|e| DiffError::NoCandidate(format!("loading the candidate failed: {e}")))??;

    let awards: Vec<AwardDefinition> = store
        .awards()
        .await?
        .into_iter()
        .filter(|row| row.enabled)
        .filter_map(|row| serde_json::from_value::<AwardDefinition>(row.definition).ok())
        .filter(|award| award.uses(name))
        .collect();

    let shadow = registry.with_replaced(&[Arc::clone(&candidate)]);
    let sides = [
        (awards.clone(), Arc::clone(registry)),
        (awards.clone(), Arc::clone(&shadow)),
    ];
    let mut steps = Steps::new(store, awards.len(), watch).await?;
    let past = past_events(store, brokers, &sides, reach, &mut steps).await?;
    let mut diffs = Vec::with_capacity(awards.len());
    for award in &awards {
        let before = Side {
            award,
            registry: Arc::clone(registry),
        };
        let after = Side {
            award,
            registry: Arc::clone(&shadow),
        };
        diffs.push(compare(store, Some(before), after, &past.envelopes).await?);
        steps.ended(&format!("award {} compared", award.id));
    }
    Ok(Diff {
        function: name.to_string(),
        live_version,
        candidate_version: version,
        events: past.events,
        items: past.items,
        awards: diffs,
        note: past.note,
    })
}

/// What `laurel awards apply --dry-run` shows: for each definition, what
/// it would change against the award as it is now (or, for a new award,
/// against no award), on the same window of recent events.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DryRun {
    /// Recent events read from the sources.
    pub events: usize,
    /// Stored content items read (each with its last applied event).
    pub items: usize,
    pub awards: Vec<AwardDiff>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Diffs checked `definitions` against the enabled awards they replace.
pub async fn dry_run(
    store: &Store,
    registry: &Arc<Registry>,
    brokers: &str,
    definitions: &[AwardDefinition],
    reach: Reach,
    watch: Watch<'_>,
) -> Result<DryRun, DiffError> {
    let current: Vec<AwardDefinition> = store
        .awards()
        .await?
        .into_iter()
        .filter(|row| row.enabled)
        .filter_map(|row| serde_json::from_value::<AwardDefinition>(row.definition).ok())
        .collect();
    let sides = [
        (current.clone(), Arc::clone(registry)),
        (definitions.to_vec(), Arc::clone(registry)),
    ];
    let mut steps = Steps::new(store, definitions.len(), watch).await?;
    let past = past_events(store, brokers, &sides, reach, &mut steps).await?;
    let mut awards = Vec::with_capacity(definitions.len());
    for definition in definitions {
        let before = current
            .iter()
            .find(|c| c.id == definition.id)
            .map(|award| Side {
                award,
                registry: Arc::clone(registry),
            });
        let after = Side {
            award: definition,
            registry: Arc::clone(registry),
        };
        awards.push(compare(store, before, after, &past.envelopes).await?);
        steps.ended(&format!("award {} compared", definition.id));
    }
    Ok(DryRun {
        events: past.events,
        items: past.items,
        awards,
        note: past.note,
    })
}

/// A diff's steps: each source read, the stored items, each award
/// compared.
struct Steps<'a> {
    done: u64,
    total: u64,
    watch: Watch<'a>,
}

impl<'a> Steps<'a> {
    async fn new(store: &Store, awards: usize, watch: Watch<'a>) -> Result<Steps<'a>, DiffError> {
        let sources = store.sources().await?.len();
        let total = (sources + 1 + awards) as u64;
        watch(Step {
            done: 0,
            total,
            note: "reading recent events",
        });
        Ok(Steps {
            done: 0,
            total,
            watch,
        })
    }

    fn ended(&mut self, note: &str) {
        self.done = (self.done + 1).min(self.total);
        (self.watch)(Step {
            done: self.done,
            total: self.total,
            note,
        });
    }
}

/// What a diff compares: Kafka's recent events and the stored items' last
/// events, oldest first.
struct Past {
    envelopes: Arc<[Envelope]>,
    /// How many came from Kafka, and from the stored items.
    events: usize,
    items: usize,
    /// What could not be read, or was left out.
    note: Option<String>,
}

/// The recent events of every registered source, and the stored items of
/// the sources some award of `sides` (as its registry binds it) can match.
async fn past_events(
    store: &Store,
    brokers: &str,
    sides: &[(Vec<AwardDefinition>, Arc<Registry>)],
    reach: Reach,
    steps: &mut Steps<'_>,
) -> Result<Past, DiffError> {
    let sources = store.sources().await?;
    let mut envelopes = Vec::new();
    let mut problems = Vec::new();
    for source in &sources {
        match crate::kafka::recent_payloads(brokers, &source.topic, reach.events).await {
            Ok(payloads) => {
                envelopes.extend(payloads.iter().filter_map(|p| Envelope::parse(p).ok()))
            }
            Err(error) => problems.push(format!("{}: {error}", source.topic)),
        }
        steps.ended(&format!("{} read", source.topic));
    }
    let events = envelopes.len();
    let names: Vec<String> = sources.into_iter().map(|s| s.name).collect();
    let sides = sides.to_vec();
    let matched = tokio::task::spawn_blocking(move || {
        names
            .into_iter()
            .filter(|source| {
                sides.iter().any(|(awards, registry)| {
                    Plan::build(source, awards, registry).objective_count() > 0
                })
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| DiffError::NoCandidate(format!("planning the sources failed: {e}")))?;
    let (stored, cut) = store.item_events(&matched, reach.items).await?;
    let items = stored.len();
    steps.ended(&format!("{items} stored items read"));
    if cut {
        problems.push(format!(
            "stored items: only the first {items} (whole users, in key order) were compared; --items reads more"
        ));
    }
    // An item's last event may be in Kafka's window too: once.
    let read: BTreeSet<(String, String)> = envelopes
        .iter()
        .map(|e| (e.source.clone(), e.id.clone()))
        .collect();
    // An item's stored last event that is not in the window goes after the
    // window's at its occurred_at (the sort is stable): the window's events
    // of that item at that time were not applied after it (an earlier one
    // again, or one before it in the topic), so it stays the item's last.
    envelopes.extend(
        stored
            .iter()
            .filter_map(|item| item.event.as_deref())
            .filter_map(|event| Envelope::parse(event).ok())
            .filter(|e| !read.contains(&(e.source.clone(), e.id.clone()))),
    );
    envelopes.sort_by_key(|e| e.occurred_at);
    Ok(Past {
        envelopes: envelopes.into(),
        events,
        items,
        note: (!problems.is_empty()).then(|| problems.join("; ")),
    })
}

/// An award as one side of a comparison sees it: its definition and the
/// functions it binds.
struct Side<'a> {
    award: &'a AwardDefinition,
    registry: Arc<Registry>,
}

/// What `after` changes against `before` (none: the award does not exist
/// yet) on `events`.
async fn compare(
    store: &Store,
    before: Option<Side<'_>>,
    after: Side<'_>,
    events: &Arc<[Envelope]>,
) -> Result<AwardDiff, DiffError> {
    let owned_before = before
        .as_ref()
        .map(|b| (b.award.clone(), Arc::clone(&b.registry)));
    let owned_after = (after.award.clone(), Arc::clone(&after.registry));
    // Shared with the blocking thread, not copied per award.
    let events_owned = Arc::clone(events);
    let window = tokio::task::spawn_blocking(move || {
        let before = owned_before.map(|(award, registry)| {
            let verdicts = Plan::for_award(&award, &registry).verdicts(&events_owned);
            (award, verdicts)
        });
        let (award, registry) = owned_after;
        let verdicts = Plan::for_award(&award, &registry).verdicts(&events_owned);
        Window::new(
            &events_owned,
            before.as_ref().map(|(a, v)| (a, v.as_slice())),
            (&award, &verdicts),
        )
    })
    .await
    .map_err(|e| DiffError::NoCandidate(format!("evaluating the events failed: {e}")))?;
    award_diff(store, before, after, window).await
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
        events: &[Envelope],
        before: Option<(&AwardDefinition, &[Vec<Verdict>])>,
        after: (&AwardDefinition, &[Vec<Verdict>]),
    ) -> Window {
        let mut window = Window {
            live: BTreeMap::new(),
            shadow: BTreeMap::new(),
            events_changed: 0,
            examples: Vec::new(),
        };
        let mut changed = BTreeSet::new();
        let (after_award, after_verdicts) = after;
        if let Some((before_award, before_verdicts)) = before {
            for (objective, live) in before_award.objectives.iter().zip(before_verdicts) {
                for (user, counters) in counted(events, live) {
                    window
                        .live
                        .entry(user)
                        .or_default()
                        .insert(objective.id.clone(), counters);
                }
                // The same objective after, if it is still there.
                let Some(shadow) = after_award
                    .objectives
                    .iter()
                    .position(|o| o.id == objective.id)
                    .map(|at| &after_verdicts[at])
                else {
                    continue;
                };
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
            }
        }
        for (objective, shadow) in after_award.objectives.iter().zip(after_verdicts) {
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
    // As ingest decides (`store::counters::decide`): events come oldest
    // first, of one occurred_at in topic order; an id already seen for the
    // item at that time changes nothing when it comes again.
    type Seen<'a> = (chrono::DateTime<chrono::Utc>, HashSet<&'a str>);
    let mut seen: HashMap<(&str, &str, &str), Seen<'_>> = HashMap::new();
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
                let (at, ids) = seen
                    .entry(key)
                    .or_insert_with(|| (event.occurred_at, HashSet::new()));
                if *at != event.occurred_at {
                    *at = event.occurred_at;
                    ids.clear();
                }
                if ids.insert(event.id.as_str()) {
                    items.insert(key, counters);
                }
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
    before: Option<Side<'_>>,
    after: Side<'_>,
    window: Window,
) -> Result<AwardDiff, DiffError> {
    let award = after.award;
    let users: BTreeSet<&String> = window.live.keys().chain(window.shadow.keys()).collect();
    let users_seen = users.len();
    // A strategy (function or config) that differs moves progress without
    // moving counters.
    let same_function = |a: &Registry, b: &Registry, name: &str| match (a.get(name), b.get(name)) {
        (Some(x), Some(y)) => Arc::ptr_eq(&x, &y),
        (x, y) => x.is_none() && y.is_none(),
    };
    let strategy_changes = before.as_ref().is_none_or(|b| {
        b.award.strategy_function != award.strategy_function
            || b.award.strategy != award.strategy
            || !same_function(&b.registry, &after.registry, &award.strategy_function)
    });
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
    let before = before.map(|b| (b.award.clone(), b.registry));
    let after = (award.clone(), after.registry);
    let progress = tokio::task::spawn_blocking(move || {
        let stored: Vec<_> = compared.iter().map(|(_, s, _)| s.clone()).collect();
        let moved: Vec<_> = compared.iter().map(|(_, _, c)| c.clone()).collect();
        let was = match &before {
            Some((award, registry)) => crate::progress::progress_of(award, registry, &stored),
            // No award yet: nothing started.
            None => vec![
                Ok(crate::runtime::Progress {
                    progress: 0.0,
                    goal: 0.0,
                    started: false,
                    completed: false,
                });
                stored.len()
            ],
        };
        let will_be = crate::progress::progress_of(&after.0, &after.1, &moved);
        compared
            .into_iter()
            .map(|(user, _, _)| user)
            .zip(was.into_iter().zip(will_be))
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
            // (A new award's "before" is nothing started.)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn photo(id: &str, status: &str) -> Envelope {
        Envelope::parse(
            serde_json::json!({"id": id, "source": "photos", "type": "photo.changed", "user_id": "u-1",
                "authorized": true, "content_id": "photo-1", "status": status,
                "occurred_at": "2026-12-06T12:00:00.5Z", "payload": {}})
            .to_string()
            .as_bytes(),
        )
        .unwrap()
    }

    fn counting(counter: &str) -> Verdict {
        Verdict::Counted {
            rule: Arc::from("ContentStatusRule"),
            counters: Counters::from([(counter.to_string(), 1)]),
            dedup_key: None,
            additive: false,
        }
    }

    /// The diff decides an item's events at one time as ingest does: the
    /// later in the topic wins, whichever id is larger, and an earlier id
    /// coming again changes nothing.
    #[test]
    fn a_window_counts_an_items_events_at_one_time_in_topic_order() {
        let events = [
            photo("evt-z", "active"),
            photo("evt-a", "blocked"),
            photo("evt-z", "active"),
        ];
        let verdicts = [
            counting("approved"),
            counting("blocked"),
            counting("approved"),
        ];
        assert_eq!(
            counted(&events, &verdicts),
            BTreeMap::from([(
                "u-1".to_string(),
                Counters::from([("blocked".to_string(), 1)])
            )])
        );
    }
}
