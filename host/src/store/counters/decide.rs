//! The pure step of applying a batch: given what the batch's rows hold now
//! (read in its transaction), decide what every outcome changes. No I/O;
//! the rules of exactly-once application live here, with their unit tests.
//!
//! - A content item's events apply in their order (`order.rs`): an event
//!   before the last one applied to its item changes nothing, so a
//!   redelivery never brings an older status back.
//! - An event id already processed for the item at its last `occurred_at`
//!   changes nothing, wherever it comes again (a redelivery, a producer's
//!   retry at a later offset); a dead letter replayed keeps the place it
//!   first had, so it never overtakes an event that came after it.
//! - An additive (analytics) event adds once per id.
//! - Counter arithmetic is checked: an event that would take a counter past
//!   the range of a 64-bit integer changes nothing and is refused whole.
//! - An objective that could not decide (`Effect::Held`) changes nothing;
//!   the event is still processed (its item's order advances, its id is
//!   recorded) and is kept for that objective, which later gets it only
//!   through a replay of the hold.
//! - A replay of a hold applies to its objective if the event is still the
//!   latest for its item (or additive); the claimed hold is its token.
//!
//! Each event goes through three steps: does it stand to change anything
//! ([`Decider::skipped`]), every objective's change checked before any is
//! made ([`Decider::plan`]: an event applies whole or not at all), then
//! made ([`Decider::apply`]).

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::contributions::{Contributions, Stored, add_checked, nonzero};
use super::keys::{ItemKey, ObjectiveKey, ShareKey};
use super::log::{Change, LogRow, storable};
use super::order::{Last, Order, Place, Standing};
use super::{Counters, Effect, Outcome};

/// What the batch's rows hold now, read in its transaction.
#[derive(Default)]
pub(super) struct Snapshot<'a> {
    /// The last event applied to each content item.
    pub items: HashMap<ItemKey<'a>, Last<'a>>,
    /// Each event's place in its topic, by batch index (None: not known).
    pub places: Vec<Option<Place<'a>>>,
    pub view: Contributions<'a>,
    /// Additive events of the batch that were applied before, by (user,
    /// event id).
    pub seen_additive: HashSet<(&'a str, &'a str)>,
    /// Ids of additive events applied before this were pruned: an event
    /// from before it is refused, as a redelivery could not be told apart.
    pub additive_horizon: Option<DateTime<Utc>>,
    /// Current counters of the objectives the batch touches.
    pub totals: HashMap<ObjectiveKey<'a>, Counters>,
    /// Events replayed from a hold (by batch index): the claimed hold's
    /// (award, objective). An event replayed whole is processed as from
    /// Kafka.
    pub replaying_holds: HashMap<usize, (&'a str, &'a str)>,
    /// A backfill: each event is its item's stored last event, evaluated
    /// again for objectives that may not have seen it (the batch's outcomes
    /// are theirs alone). At the item's last order it applies (the
    /// contribution is absolute, so once or twice is the same); an older
    /// one (a newer event came since) changes nothing.
    pub backfill: bool,
}

/// An event kept for one objective, to be replayed after a fix.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Hold<'a> {
    pub index: usize,
    pub award_id: &'a str,
    pub objective_id: &'a str,
    pub reason: &'a str,
}

/// How a replayed hold ended.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum HoldReplay {
    /// Applied, or nothing left to apply (a newer event decided the item).
    Resolved,
    /// Still not applicable: the new reason.
    Held(String),
}

/// What a batch changes.
#[derive(Default)]
pub(super) struct Decision<'a> {
    /// Content items whose last applied event moved, with it.
    pub items: BTreeMap<ItemKey<'a>, Last<'a>>,
    /// For each item of `items`, the batch index of that event.
    pub item_events: HashMap<ItemKey<'a>, usize>,
    /// Content items whose shares changed, with their last event's order
    /// (moved or not: a replayed hold or a backfill changes shares at the
    /// item's own order).
    pub reshared: BTreeMap<ItemKey<'a>, Last<'a>>,
    /// Objectives whose counters changed: their new counters.
    pub totals: BTreeMap<ObjectiveKey<'a>, Counters>,
    /// Additive events applied for the first time, by (user, event id),
    /// with when they happened.
    pub newly_applied: BTreeMap<(&'a str, &'a str), DateTime<Utc>>,
    pub log: Vec<LogRow<'a>>,
    pub holds: Vec<Hold<'a>>,
    /// Events refused whole while deciding: (batch index, reason).
    pub refused: Vec<(usize, String)>,
    /// Replayed holds, by batch index.
    pub replayed_holds: BTreeMap<usize, HoldReplay>,
    /// Outcomes that changed counters.
    pub changed: usize,
}

/// Decides a batch: `outcomes` in stream order, an event's outcomes
/// together (the same batch index); `functions_text` gives each outcome's
/// function versions as JSON text. Returns the decision and the
/// contributions after it (what the write step stores for `items`).
pub(super) fn decide<'a>(
    snapshot: Snapshot<'a>,
    outcomes: &'a [Outcome],
    functions_text: &dyn Fn(&Outcome) -> &'a str,
) -> (Decision<'a>, Contributions<'a>) {
    let mut decider = Decider {
        snapshot,
        functions_text,
        decision: Decision::default(),
        totals: HashMap::new(),
        net: HashMap::new(),
        additive_here: HashSet::new(),
    };
    for event in outcomes.chunk_by(|a, b| a.index == b.index) {
        decider.event(event);
    }
    decider.finish()
}

/// What an additive event is applied once per: its user and its id.
fn additive_key(outcome: &Outcome) -> (&str, &str) {
    (&outcome.user_id, &outcome.event_id)
}

/// A batch being decided, event by event.
struct Decider<'a, 'f> {
    /// As read, then as decided so far (`items`, `view`).
    snapshot: Snapshot<'a>,
    functions_text: &'f dyn Fn(&Outcome) -> &'a str,
    decision: Decision<'a>,
    /// Running totals of the objectives changed so far.
    totals: HashMap<ObjectiveKey<'a>, Counters>,
    /// What changed in them.
    net: HashMap<ObjectiveKey<'a>, Counters>,
    /// Additive events applied earlier in this batch, by (user, event id).
    additive_here: HashSet<(&'a str, &'a str)>,
}

/// One event of the batch, and where it stands.
struct Event<'a> {
    first: &'a Outcome,
    /// The (award, objective) of the hold this replays, if it replays one.
    replaying: Option<(&'a str, &'a str)>,
    /// The outcomes it concerns (a replayed hold: its own objective's).
    relevant: Vec<&'a Outcome>,
    /// Its content item and order; None: additive.
    order: Option<(ItemKey<'a>, Order<'a>)>,
    /// The last event applied to its item.
    last: Option<Last<'a>>,
    standing: Option<Standing>,
}

/// One objective's change within an event, checked, not yet made: the
/// outcome, the change of its counters, and the item's new contribution.
type Planned<'a> = (&'a Outcome, Counters, Option<(ShareKey<'a>, Stored<'a>)>);

/// Every objective's change of one event, checked.
struct Plan<'a> {
    planned: Vec<Planned<'a>>,
    /// Objectives that could not decide, with why.
    held: Vec<(&'a Outcome, &'a str)>,
    /// The running totals after the event.
    totals: HashMap<ObjectiveKey<'a>, Counters>,
}

impl<'a> Decider<'a, '_> {
    fn event(&mut self, outcomes: &'a [Outcome]) {
        let event = self.read(outcomes);
        if self.skipped(&event) {
            return;
        }
        if let Some(reason) = self.past_horizon(&event) {
            return self.refuse(&event, reason);
        }
        match self.plan(&event) {
            Ok(plan) => self.apply(&event, plan),
            Err(reason) => self.refuse(&event, reason),
        }
    }

    fn read(&self, outcomes: &'a [Outcome]) -> Event<'a> {
        let first = &outcomes[0];
        let replaying = self.snapshot.replaying_holds.get(&first.index).copied();
        let relevant = match replaying {
            Some((award, objective)) => outcomes
                .iter()
                .filter(|o| o.award_id == award && o.objective_id == objective)
                .collect(),
            None => outcomes.iter().collect(),
        };
        let order = ItemKey::of(first).map(|item| {
            (
                item,
                Order {
                    occurred_at: first.occurred_at,
                    event_id: &first.event_id,
                    place: self.snapshot.places.get(first.index).copied().flatten(),
                },
            )
        });
        let last = order.and_then(|(item, _)| self.snapshot.items.get(&item).cloned());
        let standing = match (&order, &last) {
            (Some((_, order)), Some(last)) => Some(last.standing(order)),
            _ => None,
        };
        Event {
            first,
            replaying,
            relevant,
            order,
            last,
            standing,
        }
    }

    /// Whether the event changes nothing (logged why): older than its
    /// item's last, or applied before.
    fn skipped(&mut self, event: &Event<'a>) -> bool {
        let first = event.first;
        // A replayed hold and a backfill are processed again on purpose:
        // the event was processed; these objectives did not get it.
        let rerun = event.replaying.is_some() || self.snapshot.backfill;
        let row = match (event.order, event.standing) {
            // Older; or, for a rerun, processed before at this time and
            // superseded since.
            (Some(_), Some(standing))
                if standing == Standing::Older || (rerun && standing == Standing::Seen) =>
            {
                if event.replaying.is_some() {
                    self.decision
                        .replayed_holds
                        .insert(first.index, HoldReplay::Resolved);
                }
                LogRow::skip(
                    first,
                    "older than the last applied event for this content item",
                    (self.functions_text)(first),
                )
            }
            (Some(_), Some(Standing::Last | Standing::Seen)) if !rerun => {
                LogRow::already_applied(first)
            }
            (None, _)
                if event.replaying.is_none()
                    && (self.snapshot.seen_additive.contains(&additive_key(first))
                        || self.additive_here.contains(&additive_key(first))) =>
            {
                LogRow::already_applied(first)
            }
            _ => return false,
        };
        self.decision.log.push(row);
        true
    }

    /// Why an additive event is refused: it happened before the horizon
    /// of the applied ids, so whether it was applied is no longer known.
    fn past_horizon(&self, event: &Event<'a>) -> Option<String> {
        let first = event.first;
        let horizon = self.snapshot.additive_horizon?;
        (event.order.is_none() && event.replaying.is_none() && first.occurred_at < horizon).then(|| {
            format!(
                "an analytics event of {} is older than the de-duplication horizon ({}): the ids of analytics events applied before it were pruned (LAUREL_LOG_RETENTION_DAYS), so a redelivery could not be told from a first delivery",
                first.occurred_at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
                horizon.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
            )
        })
    }

    /// Every objective's change, checked before any is made; `Err`: why
    /// the event is refused whole (a counter would overflow).
    fn plan(&mut self, event: &Event<'a>) -> Result<Plan<'a>, String> {
        let mut plan = Plan {
            planned: Vec::new(),
            held: Vec::new(),
            totals: HashMap::new(),
        };
        for &o in &event.relevant {
            let objective = ObjectiveKey::of(o);
            let (delta, replacement) = match (&o.effect, o.content_id.as_deref()) {
                (Effect::Held { reason }, _) => {
                    plan.held.push((o, reason));
                    continue;
                }
                (Effect::Additive { counters }, _) => (nonzero(counters.clone()), None),
                (effect, Some(content)) => {
                    let key = objective.share(content);
                    let next = match effect {
                        Effect::Contribution {
                            counters,
                            dedup_key,
                        } => Stored {
                            counters: nonzero(counters.clone()),
                            dedup_key: dedup_key.as_deref(),
                        },
                        _ => Stored {
                            counters: Counters::new(),
                            dedup_key: None,
                        },
                    };
                    // An item that never contributed and still doesn't
                    // needs no row.
                    let view = &self.snapshot.view;
                    if next.counters.is_empty()
                        && next.dedup_key.is_none()
                        && !view.items.contains_key(&key)
                    {
                        continue;
                    }
                    let delta = view
                        .preview(key, &next)
                        .map_err(|counter| overflow_reason(o, &counter))?;
                    (delta, Some((key, next)))
                }
                (Effect::Contribution { .. } | Effect::Excluded { .. }, None) => {
                    // Ingest never builds these: a contribution needs an item.
                    self.decision.log.push(LogRow::rejected(
                        o,
                        "a content contribution without a content_id",
                        (self.functions_text)(o),
                    ));
                    continue;
                }
            };
            if !delta.is_empty() {
                let total = plan.totals.entry(objective).or_insert_with(|| {
                    self.totals
                        .get(&objective)
                        .or_else(|| self.snapshot.totals.get(&objective))
                        .cloned()
                        .unwrap_or_default()
                });
                add_checked(total, &delta, 1).map_err(|counter| overflow_reason(o, &counter))?;
            }
            plan.planned.push((o, delta, replacement));
        }
        Ok(plan)
    }

    /// The event changes nothing and is kept whole (or, a replayed hold,
    /// stays held).
    fn refuse(&mut self, event: &Event<'a>, reason: String) {
        let index = event.first.index;
        self.decision
            .log
            .push(LogRow::refused(event.first, reason.clone()));
        match event.replaying {
            Some(_) => {
                self.decision
                    .replayed_holds
                    .insert(index, HoldReplay::Held(reason));
            }
            None => self.decision.refused.push((index, reason)),
        }
    }

    /// The event is processed: its item's order moves, its id is kept, its
    /// changes are made, its holds kept.
    fn apply(&mut self, event: &Event<'a>, plan: Plan<'a>) {
        let first = event.first;
        if let Some((item, order)) = event.order
            && matches!(event.standing, None | Some(Standing::Newer))
        {
            let next = match &event.last {
                Some(last) => last.then(order),
                None => Last::of(order),
            };
            self.snapshot.items.insert(item, next.clone());
            self.decision.items.insert(item, next);
            self.decision.item_events.insert(item, first.index);
        }
        if first.content_id.is_none() && event.replaying.is_none() {
            self.additive_here.insert(additive_key(first));
            self.decision
                .newly_applied
                .insert(additive_key(first), first.occurred_at);
        }
        self.totals.extend(plan.totals);

        let mut changes: Vec<Change<'_>> = Vec::new();
        for (o, delta, replacement) in plan.planned {
            if let Some((key, next)) = replacement {
                if let Some(last) = self.snapshot.items.get(&key.item()) {
                    self.decision.reshared.insert(key.item(), last.clone());
                }
                self.snapshot.view.replace(key, next);
            }
            if delta.is_empty() {
                continue;
            }
            self.decision.changed += 1;
            // Cannot overflow: each running total was checked, and the net
            // change is the difference of two of them.
            let _ = add_checked(self.net.entry(ObjectiveKey::of(o)).or_default(), &delta, 1);
            changes.push(Change {
                award_id: &o.award_id,
                objective_id: &o.objective_id,
                delta,
                functions: (self.functions_text)(o),
                excluded_by: match &o.effect {
                    Effect::Excluded { filter } => Some(filter),
                    _ => None,
                },
            });
        }
        if !changes.is_empty() {
            self.decision.log.push(LogRow::applied(first, &mut changes));
        }

        for (o, reason) in plan.held {
            self.decision
                .log
                .push(LogRow::held(o, reason, (self.functions_text)(o)));
            match event.replaying {
                Some(_) => {
                    self.decision
                        .replayed_holds
                        .insert(first.index, HoldReplay::Held(reason.to_string()));
                }
                None => self.decision.holds.push(Hold {
                    index: o.index,
                    award_id: &o.award_id,
                    objective_id: &o.objective_id,
                    reason,
                }),
            }
        }
        if event.replaying.is_some() {
            self.decision
                .replayed_holds
                .entry(first.index)
                .or_insert(HoldReplay::Resolved);
        }
    }

    fn finish(mut self) -> (Decision<'a>, Contributions<'a>) {
        // A replayed hold whose objective had nothing to say is resolved too.
        for index in self.snapshot.replaying_holds.keys() {
            self.decision
                .replayed_holds
                .entry(*index)
                .or_insert(HoldReplay::Resolved);
        }
        for (objective, delta) in self.net {
            if nonzero(delta).is_empty() {
                continue;
            }
            let total = self.totals.remove(&objective).unwrap_or_default();
            self.decision.totals.insert(objective, total);
        }
        (self.decision, self.snapshot.view)
    }
}

fn overflow_reason(o: &Outcome, counter: &str) -> String {
    format!(
        "award {}, objective {}: counter `{}` would overflow (past a 64-bit integer); nothing of this event was applied",
        o.award_id,
        o.objective_id,
        storable(counter, 128)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use serde_json::{Value, json};
    use std::sync::Arc;

    const PHOTO: ItemKey<'static> = ItemKey {
        user: "u",
        content: "photo-1",
    };

    fn objective(objective: &'static str) -> ObjectiveKey<'static> {
        ObjectiveKey {
            user: "u",
            award: "a",
            objective,
        }
    }

    fn at(second: u32) -> DateTime<Utc> {
        format!("2026-12-01T10:00:{second:02}Z").parse().unwrap()
    }

    fn counters(pairs: &[(&str, i64)]) -> Counters {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn status(
        index: usize,
        event: &str,
        second: u32,
        objective: &str,
        c: &[(&str, i64)],
    ) -> Outcome {
        Outcome {
            index,
            event_id: event.into(),
            user_id: "u".into(),
            award_id: "a".into(),
            objective_id: objective.into(),
            content_id: Some("photo-1".into()),
            occurred_at: at(second),
            effect: Effect::Contribution {
                counters: counters(c),
                dedup_key: None,
            },
            functions: Arc::new(json!({"Rule": 1})),
        }
    }

    fn adding(index: usize, event: &str, objective: &str, n: i64) -> Outcome {
        Outcome {
            content_id: None,
            effect: Effect::Additive {
                counters: counters(&[("n", n)]),
            },
            ..status(index, event, 0, objective, &[])
        }
    }

    fn held(mut o: Outcome, reason: &str) -> Outcome {
        o.effect = Effect::Held {
            reason: reason.into(),
        };
        o
    }

    fn run<'a>(snapshot: Snapshot<'a>, outcomes: &'a [Outcome]) -> Decision<'a> {
        decide(snapshot, outcomes, &|_| "{\"Rule\":1}").0
    }

    fn totals(decision: &Decision<'_>) -> Vec<(String, Counters)> {
        decision
            .totals
            .iter()
            .map(|(k, c)| (k.objective.to_string(), c.clone()))
            .collect()
    }

    fn outcomes_of(decision: &Decision<'_>) -> Vec<(String, &'static str, String)> {
        decision
            .log
            .iter()
            .map(|r| {
                (
                    r.event_id.as_deref().unwrap_or("").to_string(),
                    r.outcome,
                    r.reason.as_deref().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn status_change_moves_counters_down_as_well_as_up() {
        let batch = [
            status(0, "e1", 1, "photo", &[("approved", 1)]),
            status(1, "e2", 2, "photo", &[("blocked", 1)]),
        ];
        let decision = run(Snapshot::default(), &batch);
        assert_eq!(
            totals(&decision),
            vec![("photo".into(), counters(&[("approved", 0), ("blocked", 1)]))]
        );
        assert_eq!(decision.items.values().next().unwrap().order.event_id, "e2");
        assert_eq!(decision.changed, 2);
    }

    /// The snapshot of a batch whose events are at these offsets of
    /// partition 0 of `events.photos`, by batch index.
    fn at_offsets(offsets: &[i64]) -> Snapshot<'static> {
        Snapshot {
            places: offsets
                .iter()
                .map(|&offset| {
                    Some(Place {
                        topic: "events.photos",
                        partition: 0,
                        offset,
                        n: 0,
                    })
                })
                .collect(),
            ..Snapshot::default()
        }
    }

    fn photo_counters(decision: &Decision<'_>) -> Counters {
        nonzero(decision.totals.values().next().cloned().unwrap_or_default())
    }

    /// Equal `occurred_at`: the later in the partition wins, whichever id
    /// is larger, in one batch and across two.
    #[test]
    fn equal_timestamps_apply_in_topic_order_whatever_the_ids() {
        for (first_id, second_id) in [("evt-1", "evt-2"), ("evt-2", "evt-1")] {
            // `active` then `blocked` in the topic: blocked.
            let batch = [
                status(0, first_id, 5, "photo", &[("approved", 1)]),
                status(1, second_id, 5, "photo", &[("blocked", 1)]),
            ];
            let decision = run(at_offsets(&[10, 11]), &batch);
            assert_eq!(
                photo_counters(&decision),
                counters(&[("blocked", 1)]),
                "{first_id} then {second_id}"
            );
            let last = decision.items.values().next().unwrap();
            assert_eq!(
                (last.order.event_id, last.tied.clone()),
                (second_id, vec![first_id])
            );

            // `blocked` then `active` in the topic: active, the later.
            let batch = [
                status(0, first_id, 5, "photo", &[("blocked", 1)]),
                status(1, second_id, 5, "photo", &[("approved", 1)]),
            ];
            let decision = run(at_offsets(&[10, 11]), &batch);
            assert_eq!(
                photo_counters(&decision),
                counters(&[("approved", 1)]),
                "{first_id} then {second_id}"
            );

            // The same across two batches: the stored last event is at
            // offset 10, the new one at 11.
            let mut snapshot = at_offsets(&[11]);
            snapshot.items.insert(
                PHOTO,
                Last::of(Order {
                    occurred_at: at(5),
                    event_id: first_id,
                    place: Some(Place {
                        topic: "events.photos",
                        partition: 0,
                        offset: 10,
                        n: 0,
                    }),
                }),
            );
            let share: &'static Value = Box::leak(Box::new(json!({"c": {"approved": 1}})));
            snapshot
                .view
                .load(objective("photo").share("photo-1"), share);
            snapshot
                .totals
                .insert(objective("photo"), counters(&[("approved", 1)]));
            let batch = [status(0, second_id, 5, "photo", &[("blocked", 1)])];
            let decision = run(snapshot, &batch);
            assert_eq!(
                photo_counters(&decision),
                counters(&[("blocked", 1)]),
                "stored {first_id}, then {second_id}"
            );
        }
    }

    /// The earlier event again, at a later offset (a redelivery, a
    /// producer's retry), after the later one: nothing changes.
    #[test]
    fn an_earlier_event_again_after_a_later_one_at_the_same_time_changes_nothing() {
        for (first_id, second_id) in [("evt-1", "evt-2"), ("evt-2", "evt-1")] {
            let batch = [
                status(0, first_id, 5, "photo", &[("approved", 1)]),
                status(1, second_id, 5, "photo", &[("blocked", 1)]),
                status(2, first_id, 5, "photo", &[("approved", 1)]),
            ];
            let decision = run(at_offsets(&[10, 11, 12]), &batch);
            assert_eq!(photo_counters(&decision), counters(&[("blocked", 1)]));
            assert_eq!(
                outcomes_of(&decision).last().unwrap(),
                &(
                    first_id.to_string(),
                    "skipped",
                    "event already applied".into()
                )
            );
            // And in a later batch, from what the item keeps.
            let mut snapshot = at_offsets(&[12]);
            snapshot
                .items
                .insert(PHOTO, decision.items.values().next().unwrap().clone());
            let batch = [status(0, first_id, 5, "photo", &[("approved", 1)])];
            let decision = run(snapshot, &batch);
            assert!(decision.totals.is_empty());
            assert!(decision.items.is_empty());
        }
    }

    /// A hold replayed after a later event at the same time: the later
    /// event's state stays (the replay keeps its first place).
    #[test]
    fn a_replayed_hold_never_overtakes_a_later_event_at_the_same_time() {
        for (held_id, later_id) in [("evt-1", "evt-2"), ("evt-2", "evt-1")] {
            let mut snapshot = at_offsets(&[10]);
            snapshot.items.insert(
                PHOTO,
                Last {
                    order: Order {
                        occurred_at: at(5),
                        event_id: later_id,
                        place: Some(Place {
                            topic: "events.photos",
                            partition: 0,
                            offset: 11,
                            n: 0,
                        }),
                    },
                    tied: vec![held_id],
                },
            );
            snapshot.replaying_holds.insert(0, ("a", "photo"));
            let batch = [status(0, held_id, 5, "photo", &[("approved", 1)])];
            let decision = run(snapshot, &batch);
            assert!(decision.totals.is_empty(), "{held_id}");
            assert_eq!(
                decision.replayed_holds,
                BTreeMap::from([(0, HoldReplay::Resolved)])
            );
        }
    }

    /// Events a pipeline made from one raw record share its place: their
    /// number among the record's events orders them.
    #[test]
    fn one_records_events_apply_in_the_order_it_made_them() {
        let place = |n| {
            Some(Place {
                topic: "raw.x",
                partition: 0,
                offset: 7,
                n,
            })
        };
        let snapshot = Snapshot {
            places: vec![place(0), place(1)],
            ..Snapshot::default()
        };
        let batch = [
            status(0, "evt-z", 5, "photo", &[("approved", 1)]),
            status(1, "evt-a", 5, "photo", &[("blocked", 1)]),
        ];
        let decision = run(snapshot, &batch);
        assert_eq!(photo_counters(&decision), counters(&[("blocked", 1)]));
    }

    #[test]
    fn places_read_back_as_written() {
        let place = Place {
            topic: "events.photos",
            partition: 3,
            offset: 1_234_567,
            n: 0,
        };
        assert_eq!(place.text(), "events.photos:3:1234567");
        assert_eq!(Place::parse("events.photos:3:1234567"), Some(place));
        let second = Place { n: 2, ..place };
        assert_eq!(second.text(), "events.photos:3:1234567:2");
        assert_eq!(Place::parse("events.photos:3:1234567:2"), Some(second));
        for bad in ["nonsense", ":1:2", "t:1", "t:x:2", "t:1:2:3:4", "t:1:2:-1"] {
            assert_eq!(Place::parse(bad), None, "{bad}");
        }
    }

    /// Events with no place (stored before places were kept, or a
    /// backfill's): the larger id is the later, in either arrival order.
    #[test]
    fn equal_timestamps_without_places_are_ordered_by_id_in_either_arrival_order() {
        let approved = status(0, "evt-1", 5, "photo", &[("approved", 1)]);
        let blocked = status(1, "evt-2", 5, "photo", &[("blocked", 1)]);
        for batch in [
            vec![approved.clone(), blocked.clone()],
            vec![
                Outcome {
                    index: 0,
                    ..blocked.clone()
                },
                Outcome {
                    index: 1,
                    ..approved.clone()
                },
            ],
        ] {
            let decision = run(Snapshot::default(), &batch);
            let photo = &decision.totals.values().next().unwrap();
            assert_eq!(photo.get("blocked"), Some(&1), "{batch:?}");
            assert_eq!(photo.get("approved").copied().unwrap_or(0), 0, "{batch:?}");
        }
    }

    #[test]
    fn redelivery_after_a_newer_event_with_the_same_time_changes_nothing() {
        let mut snapshot = Snapshot::default();
        snapshot.items.insert(
            PHOTO,
            Last::of(Order {
                occurred_at: at(5),
                event_id: "evt-2",
                place: None,
            }),
        );
        let batch = [status(0, "evt-1", 5, "photo", &[("approved", 1)])];
        let decision = run(snapshot, &batch);
        assert!(decision.totals.is_empty());
        assert_eq!(
            outcomes_of(&decision),
            vec![(
                "evt-1".into(),
                "skipped",
                "older than the last applied event for this content item".into()
            )]
        );
    }

    /// Once per user and id: ids are the producer's, and another user's
    /// event may carry the same one.
    #[test]
    fn additive_events_add_once_per_user_and_id() {
        let mut snapshot = Snapshot::default();
        snapshot.seen_additive.insert(("u", "old"));
        let other_user = |o: Outcome| Outcome {
            user_id: "v".into(),
            ..o
        };
        let batch = [
            adding(0, "old", "navi", 5),
            adding(1, "new", "navi", 7),
            adding(2, "new", "navi", 7),
            other_user(adding(3, "old", "navi", 11)),
            other_user(adding(4, "new", "navi", 13)),
        ];
        let decision = run(snapshot, &batch);
        assert_eq!(
            totals(&decision),
            vec![
                ("navi".into(), counters(&[("n", 7)])),
                ("navi".into(), counters(&[("n", 24)]))
            ]
        );
        assert_eq!(
            decision.newly_applied.keys().copied().collect::<Vec<_>>(),
            vec![("u", "new"), ("v", "new"), ("v", "old")]
        );
    }

    /// An additive event from before the horizon of the applied ids is
    /// refused with why; one at or after it applies, and content events
    /// (ordered by their item, not by ids kept) are not concerned.
    #[test]
    fn an_additive_event_past_the_de_duplication_horizon_is_refused() {
        let snapshot = Snapshot {
            additive_horizon: Some(at(10)),
            ..Snapshot::default()
        };
        let old = Outcome {
            occurred_at: at(9),
            ..adding(0, "e1", "navi", 5)
        };
        let due = Outcome {
            occurred_at: at(10),
            ..adding(1, "e2", "navi", 7)
        };
        let content = status(2, "e3", 1, "photo", &[("approved", 1)]);
        let batch = [old, due, content];
        let decision = run(snapshot, &batch);
        assert_eq!(decision.refused.len(), 1, "{:?}", decision.refused);
        let (index, reason) = &decision.refused[0];
        assert_eq!(*index, 0);
        assert!(
            reason.starts_with("an analytics event of ")
                && reason.contains("is older than the de-duplication horizon")
                && reason.contains("LAUREL_LOG_RETENTION_DAYS"),
            "{reason}"
        );
        assert_eq!(
            decision.newly_applied.keys().copied().collect::<Vec<_>>(),
            vec![("u", "e2")]
        );
        assert_eq!(
            totals(&decision),
            vec![
                ("navi".into(), counters(&[("n", 7)])),
                ("photo".into(), counters(&[("approved", 1)]))
            ]
        );
    }

    #[test]
    fn overflow_refuses_the_whole_event_and_the_next_applies() {
        let mut snapshot = Snapshot::default();
        snapshot
            .totals
            .insert(objective("navi"), counters(&[("n", i64::MAX - 10)]));
        let batch = [
            adding(0, "e1", "navi", 5),
            // Two objectives: one would overflow, so neither applies.
            adding(1, "e2", "navi", 6),
            adding(1, "e2", "other", 6),
            adding(2, "e3", "navi", 5),
        ];
        let decision = run(snapshot, &batch);
        assert_eq!(
            decision.refused,
            vec![(
                1,
                "award a, objective navi: counter `n` would overflow (past a 64-bit integer); nothing of this event was applied"
                    .to_string()
            )]
        );
        assert_eq!(
            totals(&decision),
            vec![("navi".into(), counters(&[("n", i64::MAX)]))]
        );
        assert!(!decision.newly_applied.contains_key(&("u", "e2")));
    }

    #[test]
    fn contribution_arithmetic_is_checked_too() {
        let batch = [
            status(0, "e1", 1, "photo", &[("x", i64::MIN)]),
            status(1, "e2", 2, "photo", &[("x", i64::MAX)]),
        ];
        let decision = run(Snapshot::default(), &batch);
        // MIN applies; going from MIN to MAX is a change past 64 bits.
        assert_eq!(decision.refused.len(), 1);
        assert_eq!(decision.refused[0].0, 1);
        assert_eq!(
            totals(&decision),
            vec![("photo".into(), counters(&[("x", i64::MIN)]))]
        );
    }

    #[test]
    fn a_held_objective_changes_nothing_and_the_others_apply() {
        let batch = [
            status(0, "e1", 1, "photo", &[("approved", 1)]),
            held(
                status(0, "e1", 1, "broken", &[]),
                "award a, objective broken: quarantined",
            ),
        ];
        let decision = run(Snapshot::default(), &batch);
        assert_eq!(
            totals(&decision),
            vec![("photo".into(), counters(&[("approved", 1)]))]
        );
        assert_eq!(
            decision.holds,
            vec![Hold {
                index: 0,
                award_id: "a",
                objective_id: "broken",
                reason: "award a, objective broken: quarantined"
            }]
        );
        // Processed: the item's order moved.
        assert_eq!(decision.items.len(), 1);
    }

    #[test]
    fn an_event_held_everywhere_is_still_processed() {
        let batch = [held(adding(0, "e1", "navi", 5), "down")];
        let decision = run(Snapshot::default(), &batch);
        assert!(decision.totals.is_empty());
        assert!(decision.newly_applied.contains_key(&("u", "e1")));
        assert_eq!(decision.holds.len(), 1);
    }

    #[test]
    fn a_replayed_hold_applies_to_its_objective_only() {
        let mut snapshot = Snapshot::default();
        // The event was processed: another objective applied it.
        snapshot.items.insert(
            PHOTO,
            Last::of(Order {
                occurred_at: at(1),
                event_id: "e1",
                place: None,
            }),
        );
        snapshot.seen_additive.insert(("u", "e2"));
        snapshot.replaying_holds.insert(0, ("a", "broken"));
        snapshot.replaying_holds.insert(1, ("a", "navi"));
        let batch = [
            status(0, "e1", 1, "broken", &[("approved", 1)]),
            status(0, "e1", 1, "photo", &[("approved", 1)]),
            adding(1, "e2", "navi", 4),
        ];
        let decision = run(snapshot, &batch);
        assert_eq!(
            totals(&decision),
            vec![
                ("broken".into(), counters(&[("approved", 1)])),
                ("navi".into(), counters(&[("n", 4)])),
            ]
        );
        assert_eq!(
            decision.replayed_holds,
            BTreeMap::from([(0, HoldReplay::Resolved), (1, HoldReplay::Resolved)])
        );
        assert!(decision.items.is_empty());
        assert!(decision.newly_applied.is_empty());
    }

    #[test]
    fn a_replayed_hold_superseded_by_a_newer_event_is_resolved_without_change() {
        let mut snapshot = Snapshot::default();
        snapshot.items.insert(
            PHOTO,
            Last::of(Order {
                occurred_at: at(9),
                event_id: "e9",
                place: None,
            }),
        );
        snapshot.replaying_holds.insert(0, ("a", "broken"));
        let batch = [status(0, "e1", 1, "broken", &[("approved", 1)])];
        let decision = run(snapshot, &batch);
        assert!(decision.totals.is_empty());
        assert_eq!(
            decision.replayed_holds,
            BTreeMap::from([(0, HoldReplay::Resolved)])
        );
    }

    #[test]
    fn a_replayed_hold_at_the_items_order_rewrites_its_shares() {
        let mut snapshot = Snapshot::default();
        snapshot.items.insert(
            PHOTO,
            Last::of(Order {
                occurred_at: at(1),
                event_id: "e1",
                place: None,
            }),
        );
        snapshot.replaying_holds.insert(0, ("a", "broken"));
        let batch = [status(0, "e1", 1, "broken", &[("approved", 1)])];
        let decision = run(snapshot, &batch);
        // The order stays; the item's shares must still be written, or its
        // next event would take the difference from the old ones.
        assert!(decision.items.is_empty());
        assert_eq!(decision.reshared.keys().collect::<Vec<_>>(), [&PHOTO]);
    }

    #[test]
    fn a_backfill_applies_an_items_last_event_to_new_objectives_once() {
        let last = || {
            let mut snapshot = Snapshot {
                backfill: true,
                ..Snapshot::default()
            };
            snapshot.items.insert(
                PHOTO,
                Last::of(Order {
                    occurred_at: at(1),
                    event_id: "e1",
                    place: None,
                }),
            );
            snapshot
        };
        let batch = [status(0, "e1", 1, "new", &[("approved", 1)])];
        let decision = run(last(), &batch);
        assert_eq!(
            totals(&decision),
            vec![("new".into(), counters(&[("approved", 1)]))]
        );
        assert!(decision.items.is_empty());
        assert_eq!(decision.reshared.keys().collect::<Vec<_>>(), [&PHOTO]);
        assert!(decision.holds.is_empty());

        // Twice: the share is there, so nothing moves.
        let mut again = last();
        let share: &'static Value = Box::leak(Box::new(json!({"c": {"approved": 1}})));
        again.view.load(objective("new").share("photo-1"), share);
        let decision = run(again, &batch);
        assert!(decision.totals.is_empty());

        // An older event than the item's last: a newer one decided it.
        let mut newer = last();
        newer.items.insert(
            PHOTO,
            Last::of(Order {
                occurred_at: at(5),
                event_id: "e5",
                place: None,
            }),
        );
        let decision = run(newer, &batch);
        assert!(decision.totals.is_empty());
        assert!(decision.reshared.is_empty());
    }

    #[test]
    fn a_replayed_hold_that_fails_again_stays_held() {
        let mut snapshot = Snapshot::default();
        snapshot.replaying_holds.insert(0, ("a", "broken"));
        let batch = [held(adding(0, "e1", "broken", 1), "still broken")];
        let decision = run(snapshot, &batch);
        assert_eq!(
            decision.replayed_holds,
            BTreeMap::from([(0, HoldReplay::Held("still broken".into()))])
        );
        assert!(decision.holds.is_empty());
    }

    #[test]
    fn duplicates_in_a_group_count_once() {
        let review = |index: usize, event: &str, content: &str, second: u32| Outcome {
            content_id: Some(content.into()),
            effect: Effect::Contribution {
                counters: counters(&[("count", 1)]),
                dedup_key: Some("firm-17".into()),
            },
            ..status(index, event, second, "reviews", &[])
        };
        let batch = [review(0, "e1", "r1", 1), review(1, "e2", "r2", 2)];
        let (decision, view) = decide(Snapshot::default(), &batch, &|_| "{}");
        assert_eq!(
            decision.totals.values().next().unwrap(),
            &counters(&[("count", 1)])
        );
        assert_eq!(view.rekeyed.len(), 2);
    }
}
