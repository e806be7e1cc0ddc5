//! The pure step of applying a batch: given what the batch's rows hold now
//! (read in its transaction), decide what every outcome changes. No I/O;
//! the rules of exactly-once application live here, with their unit tests.
//!
//! - A content item's events apply in `occurred_at` order: an event before
//!   the last one applied to its item changes nothing, so a redelivery
//!   never brings an older status back. Of two events with the same
//!   `occurred_at`, the later in its partition is the later (Kafka keeps
//!   one key's events in the order they were written; a master system
//!   writes an item's status changes in the order they happened, often
//!   within one millisecond). An event whose place is not known, or is in
//!   another partition, falls back to the larger id (byte order).
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

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{Counters, Effect, LogEntry, Outcome};
use crate::store::json_text::{ObjectWriter, push_counters, push_str};

pub(super) type ContentKey<'a> = (&'a str, &'a str, &'a str, &'a str); // user, award, objective, content
pub(super) type GroupKey<'a> = (&'a str, &'a str, &'a str, &'a str); // user, award, objective, dedup key
pub(super) type ObjectiveKey<'a> = (&'a str, &'a str, &'a str); // user, award, objective

/// Where an event was in its topic; for an event a pipeline made, where
/// its raw record was, and which of the record's events it is (`n`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Place<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub n: u32,
}

impl<'a> Place<'a> {
    /// `TOPIC:PARTITION:OFFSET[:N]` (Kafka topic names have no `:`), as
    /// `content_items.place` and the `laurel-place` header carry it.
    pub fn parse(text: &'a str) -> Option<Place<'a>> {
        let mut parts = text.split(':');
        let topic = parts.next().filter(|t| !t.is_empty())?;
        let partition = parts.next()?.parse().ok()?;
        let offset = parts.next()?.parse().ok()?;
        let n = match parts.next() {
            Some(n) => n.parse().ok()?,
            None => 0,
        };
        parts.next().is_none().then_some(Place {
            topic,
            partition,
            offset,
            n,
        })
    }

    pub fn text(&self) -> String {
        match self.n {
            0 => format!("{}:{}:{}", self.topic, self.partition, self.offset),
            n => format!("{}:{}:{}:{n}", self.topic, self.partition, self.offset),
        }
    }
}

/// An event's order among its item's events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Order<'a> {
    pub occurred_at: DateTime<Utc>,
    pub event_id: &'a str,
    /// None: not known (an item's event applied before places were kept,
    /// or a backfill's).
    pub place: Option<Place<'a>>,
}

/// Most ids kept per item of events processed at its last `occurred_at`
/// before the last one (more in one millisecond than any master system
/// writes for one item).
pub(super) const MAX_TIED: usize = 64;

/// The last event processed for a content item, and the ids of the others
/// processed at the same `occurred_at` before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Last<'a> {
    pub order: Order<'a>,
    pub tied: Vec<&'a str>,
}

impl<'a> Last<'a> {
    pub fn of(order: Order<'a>) -> Last<'a> {
        Last {
            order,
            tied: Vec::new(),
        }
    }

    /// Where `event` stands against this.
    fn standing(&self, event: &Order<'a>) -> Standing {
        let last = &self.order;
        match event.occurred_at.cmp(&last.occurred_at) {
            std::cmp::Ordering::Less => Standing::Older,
            std::cmp::Ordering::Greater => Standing::Newer,
            std::cmp::Ordering::Equal if event.event_id == last.event_id => Standing::Last,
            std::cmp::Ordering::Equal if self.tied.contains(&event.event_id) => Standing::Seen,
            std::cmp::Ordering::Equal => {
                let later = match (event.place, last.place) {
                    (Some(a), Some(b)) if a.topic == b.topic && a.partition == b.partition => {
                        (a.offset, a.n) > (b.offset, b.n)
                    }
                    _ => event.event_id > last.event_id,
                };
                if later {
                    Standing::Newer
                } else {
                    Standing::Older
                }
            }
        }
    }

    /// This, after `event` (newer) was processed.
    fn then(&self, event: Order<'a>) -> Last<'a> {
        if event.occurred_at != self.order.occurred_at {
            return Last::of(event);
        }
        let mut tied = self.tied.clone();
        tied.push(self.order.event_id);
        if tied.len() > MAX_TIED {
            tied.remove(0);
        }
        Last { order: event, tied }
    }
}

/// Where an event stands against its item's last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// Before it: it changes nothing.
    Older,
    /// It.
    Last,
    /// Processed before it, at the same time.
    Seen,
    /// After it.
    Newer,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Stored<'a> {
    pub counters: Counters,
    pub dedup_key: Option<&'a str>,
}

/// A unit of an objective's total: an item on its own, or a group of items
/// sharing a de-duplication key (the group counts each counter's maximum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Unit<'a> {
    Item(&'a str),
    Group(&'a str),
}

fn unit_of<'a>(content: &'a str, dedup_key: Option<&'a str>) -> Unit<'a> {
    match dedup_key {
        Some(key) => Unit::Group(key),
        None => Unit::Item(content),
    }
}

/// `into += sign * from`, or the name of the counter that overflows.
fn add_checked(into: &mut Counters, from: &Counters, sign: i64) -> Result<(), String> {
    for (name, value) in from {
        let term = value.checked_mul(sign).ok_or_else(|| name.clone())?;
        match into.get_mut(name) {
            Some(total) => *total = total.checked_add(term).ok_or_else(|| name.clone())?,
            None => {
                into.insert(name.clone(), term);
            }
        }
    }
    Ok(())
}

pub(super) fn nonzero(counters: Counters) -> Counters {
    counters.into_iter().filter(|(_, v)| *v != 0).collect()
}

pub(crate) fn counters_from(value: &Value) -> Counters {
    value
        .as_object()
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| v.as_i64().map(|v| (k.clone(), v)))
                .collect()
        })
        .unwrap_or_default()
}

/// What the content items a batch touches contribute, per objective.
#[derive(Default)]
pub(super) struct Contributions<'a> {
    pub items: HashMap<ContentKey<'a>, Stored<'a>>,
    /// Members of each group touched (content ids).
    groups: HashMap<GroupKey<'a>, BTreeSet<&'a str>>,
    /// De-duplication keys that changed: (item, old key, new key).
    pub rekeyed: Vec<(ContentKey<'a>, Option<&'a str>, Option<&'a str>)>,
}

impl<'a> Contributions<'a> {
    /// Loads one stored share of an item: `share` is `{"c": counters, "k": key}`.
    /// Returns the item's group, if it has one.
    pub fn load(&mut self, key: ContentKey<'a>, share: &'a Value) -> Option<GroupKey<'a>> {
        let dedup_key = share.get("k").and_then(Value::as_str);
        let group = dedup_key.map(|dedup| (key.0, key.1, key.2, dedup));
        if let Some(group) = group {
            self.groups.entry(group).or_default().insert(key.3);
        }
        let counters = share.get("c").map(counters_from).unwrap_or_default();
        self.items.entry(key).or_insert(Stored {
            counters,
            dedup_key,
        });
        group
    }

    /// A unit's value, with `item`'s contribution taken as `next` (None:
    /// as stored).
    fn unit_value(
        &self,
        (user, award, objective): ObjectiveKey<'a>,
        unit: Unit<'a>,
        next: Option<(&'a str, &Stored<'a>)>,
    ) -> Counters {
        let stored = |content: &'a str| -> Option<&Stored<'a>> {
            match next {
                Some((item, next)) if item == content => Some(next),
                _ => self.items.get(&(user, award, objective, content)),
            }
        };
        match unit {
            Unit::Item(content) => match stored(content) {
                Some(s) if s.dedup_key.is_none() => s.counters.clone(),
                _ => Counters::new(),
            },
            Unit::Group(dedup) => {
                let mut members: BTreeSet<&'a str> = self
                    .groups
                    .get(&(user, award, objective, dedup))
                    .cloned()
                    .unwrap_or_default();
                if let Some((item, next)) = next {
                    if next.dedup_key == Some(dedup) {
                        members.insert(item);
                    } else {
                        members.remove(item);
                    }
                }
                let mut max = Counters::new();
                for content in members {
                    if let Some(s) = stored(content) {
                        for (name, value) in &s.counters {
                            let entry = max.entry(name.clone()).or_insert(*value);
                            *entry = (*entry).max(*value);
                        }
                    }
                }
                max
            }
        }
    }

    /// The change of the objective's counters if `key`'s contribution
    /// became `next`, without changing anything; `Err` names a counter that
    /// would overflow.
    fn preview(&self, key: ContentKey<'a>, next: &Stored<'a>) -> Result<Counters, String> {
        let (user, award, objective, content) = key;
        let objective_key = (user, award, objective);
        let previous = self.items.get(&key).map(|s| unit_of(content, s.dedup_key));
        let mut units: Vec<Unit<'a>> = previous
            .into_iter()
            .chain([unit_of(content, next.dedup_key)])
            .collect();
        units.sort();
        units.dedup();
        let mut delta = Counters::new();
        for unit in units {
            add_checked(&mut delta, &self.unit_value(objective_key, unit, None), -1)?;
            add_checked(
                &mut delta,
                &self.unit_value(objective_key, unit, Some((content, next))),
                1,
            )?;
        }
        Ok(nonzero(delta))
    }

    /// Makes `next` the contribution of `key`.
    fn replace(&mut self, key: ContentKey<'a>, next: Stored<'a>) {
        let (user, award, objective, content) = key;
        let old_key = self.items.get(&key).and_then(|s| s.dedup_key);
        if let Some(old) = old_key
            && let Some(members) = self.groups.get_mut(&(user, award, objective, old))
        {
            members.remove(content);
        }
        if let Some(new) = next.dedup_key {
            self.groups
                .entry((user, award, objective, new))
                .or_default()
                .insert(content);
        }
        if old_key != next.dedup_key {
            self.rekeyed.push((key, old_key, next.dedup_key));
        }
        self.items.insert(key, next);
    }
}

/// What the batch's rows hold now, read in its transaction.
#[derive(Default)]
pub(super) struct Snapshot<'a> {
    /// The last event applied to each content item: (user, content).
    pub items: HashMap<(&'a str, &'a str), Last<'a>>,
    /// Each event's place in its topic, by batch index (None: not known).
    pub places: Vec<Option<Place<'a>>>,
    pub view: Contributions<'a>,
    /// Additive events of the batch that were applied before.
    pub seen_additive: HashSet<&'a str>,
    /// Current counters of the objectives the batch touches.
    pub totals: HashMap<ObjectiveKey<'a>, Counters>,
    /// Events replayed from a hold (by batch index): the claimed hold's
    /// objective. An event replayed whole is processed as from Kafka.
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

/// A processing-log row. An applied event has one row, its `deltas` and
/// `functions` keyed by award, then objective.
#[derive(Debug)]
pub(super) struct LogRow<'a> {
    pub event_id: Option<Cow<'a, str>>,
    pub user_id: Option<Cow<'a, str>>,
    pub award_id: Option<&'a str>,
    pub objective_id: Option<&'a str>,
    pub outcome: &'static str,
    pub reason: Option<Cow<'a, str>>,
    /// JSON text.
    pub deltas: Option<String>,
    /// JSON text.
    pub functions: Option<Cow<'a, str>>,
    /// JSON text: the filter that now stops the event's content item, for
    /// each objective where that moved counters, keyed by award, then
    /// objective.
    pub excluded: Option<String>,
}

/// Text from an event or a guest, safe to store: PostgreSQL refuses NUL.
pub(super) fn storable(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max && !text.chars().any(char::is_control) {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(crate::text::printable(text, max))
    }
}

/// Longest reason stored, in bytes.
pub(super) const MAX_REASON_BYTES: usize = 4096;
/// Longest id stored from a message that could not be used.
pub(super) const MAX_ID_BYTES: usize = crate::event::MAX_ID_BYTES;

impl<'a> LogRow<'a> {
    fn of(
        o: &'a Outcome,
        outcome: &'static str,
        reason: Option<Cow<'a, str>>,
        functions: &'a str,
    ) -> LogRow<'a> {
        LogRow {
            event_id: Some(Cow::Borrowed(&o.event_id)),
            user_id: Some(Cow::Borrowed(&o.user_id)),
            award_id: Some(&o.award_id),
            objective_id: Some(&o.objective_id),
            outcome,
            reason,
            deltas: None,
            functions: Some(Cow::Borrowed(functions)),
            excluded: None,
        }
    }

    /// A row about a whole event (every objective it reached).
    fn event(
        o: &'a Outcome,
        outcome: &'static str,
        reason: Option<Cow<'a, str>>,
        deltas: Option<String>,
        functions: Option<String>,
    ) -> LogRow<'a> {
        LogRow {
            event_id: Some(Cow::Borrowed(&o.event_id)),
            user_id: Some(Cow::Borrowed(&o.user_id)),
            award_id: None,
            objective_id: None,
            outcome,
            reason,
            deltas,
            functions: functions.map(Cow::Owned),
            excluded: None,
        }
    }

    /// A whole event dead-lettered before the database.
    pub fn from_entry_parts(
        event_id: Option<&'a str>,
        user_id: Option<&'a str>,
        reason: &'a str,
    ) -> LogRow<'a> {
        LogRow {
            event_id: event_id.map(|t| storable(t, MAX_ID_BYTES)),
            user_id: user_id.map(|t| storable(t, MAX_ID_BYTES)),
            award_id: None,
            objective_id: None,
            outcome: "rejected",
            reason: Some(storable(reason, MAX_REASON_BYTES)),
            deltas: None,
            functions: None,
            excluded: None,
        }
    }

    pub fn from_entry(e: &'a LogEntry) -> LogRow<'a> {
        LogRow {
            event_id: e.event_id.as_deref().map(|t| storable(t, MAX_ID_BYTES)),
            user_id: e.user_id.as_deref().map(|t| storable(t, MAX_ID_BYTES)),
            award_id: e.award_id.as_deref(),
            objective_id: e.objective_id.as_deref(),
            outcome: e.outcome,
            reason: Some(storable(&e.reason, MAX_REASON_BYTES)),
            deltas: None,
            functions: e.functions.as_deref().map(|f| Cow::Owned(f.to_string())),
            excluded: None,
        }
    }
}

/// What a batch changes.
#[derive(Default)]
pub(super) struct Decision<'a> {
    /// Content items whose last applied event moved, with it.
    pub items: BTreeMap<(&'a str, &'a str), Last<'a>>,
    /// For each item of `items`, the batch index of that event.
    pub item_events: HashMap<(&'a str, &'a str), usize>,
    /// Content items whose shares changed, with their last event's order
    /// (moved or not: a replayed hold or a backfill changes shares at the
    /// item's own order).
    pub reshared: BTreeMap<(&'a str, &'a str), Last<'a>>,
    /// Objectives whose counters changed: their new counters.
    pub totals: BTreeMap<ObjectiveKey<'a>, Counters>,
    /// Additive events applied for the first time.
    pub newly_applied: BTreeSet<&'a str>,
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
    let Snapshot {
        mut items,
        places,
        mut view,
        seen_additive,
        totals: current,
        replaying_holds,
        backfill,
    } = snapshot;
    let mut decision = Decision::default();
    // Running totals of the objectives changed so far, and what changed.
    let mut totals: HashMap<ObjectiveKey<'a>, Counters> = HashMap::new();
    let mut net: HashMap<ObjectiveKey<'a>, Counters> = HashMap::new();
    let mut additive_here: HashSet<&'a str> = HashSet::new();

    for event in outcomes.chunk_by(|a, b| a.index == b.index) {
        let first = &event[0];
        let replaying = replaying_holds.get(&first.index).copied();
        let relevant: Vec<&'a Outcome> = match replaying {
            // A replayed hold concerns its own objective only.
            Some((award, objective)) => event
                .iter()
                .filter(|o| o.award_id == award && o.objective_id == objective)
                .collect(),
            None => event.iter().collect(),
        };

        // Is the event new to its item (or, additive, new at all)?
        let order = first.content_id.as_deref().map(|content| {
            (
                (first.user_id.as_str(), content),
                Order {
                    occurred_at: first.occurred_at,
                    event_id: &first.event_id,
                    place: places.get(first.index).copied().flatten(),
                },
            )
        });
        let last = order.and_then(|(item, _)| items.get(&item).cloned());
        let standing = match (&order, &last) {
            (Some((_, order)), Some(last)) => Some(last.standing(order)),
            _ => None,
        };
        let rerun = replaying.is_some() || backfill;
        match (order, standing) {
            // Older; or, for a replayed hold or a backfill, processed
            // before at this time and superseded since.
            (Some(_), Some(standing))
                if standing == Standing::Older || (rerun && standing == Standing::Seen) =>
            {
                decision.log.push(LogRow::skip(
                    first,
                    "older than the last applied event for this content item",
                    functions_text(first),
                ));
                if replaying.is_some() {
                    decision
                        .replayed_holds
                        .insert(first.index, HoldReplay::Resolved);
                }
                continue;
            }
            // The same event again: a replayed hold and a backfill are the
            // exceptions (the event was processed; these objectives did not
            // get it).
            (Some(_), Some(Standing::Last | Standing::Seen)) if !rerun => {
                decision.log.push(LogRow::event(
                    first,
                    "skipped",
                    Some("event already applied".into()),
                    None,
                    None,
                ));
                continue;
            }
            (None, _)
                if replaying.is_none()
                    && (seen_additive.contains(first.event_id.as_str())
                        || additive_here.contains(first.event_id.as_str())) =>
            {
                decision.log.push(LogRow::event(
                    first,
                    "skipped",
                    Some("event already applied".into()),
                    None,
                    None,
                ));
                continue;
            }
            _ => {}
        }

        // Every objective's change, checked before any is made: an event
        // applies whole or not at all.
        let mut planned: Vec<Planned<'a>> = Vec::new();
        let mut held: Vec<(&'a Outcome, &'a str)> = Vec::new();
        let mut overflow: Option<String> = None;
        let mut event_totals: HashMap<ObjectiveKey<'a>, Counters> = HashMap::new();
        for o in relevant {
            let objective: ObjectiveKey<'a> = (&o.user_id, &o.award_id, &o.objective_id);
            let (delta, replacement) = match (&o.effect, o.content_id.as_deref()) {
                (Effect::Held { reason }, _) => {
                    held.push((o, reason));
                    continue;
                }
                (Effect::Additive { counters }, _) => (nonzero(counters.clone()), None),
                (effect, Some(content)) => {
                    let key: ContentKey<'a> = (&o.user_id, &o.award_id, &o.objective_id, content);
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
                    if next.counters.is_empty()
                        && next.dedup_key.is_none()
                        && !view.items.contains_key(&key)
                    {
                        continue;
                    }
                    match view.preview(key, &next) {
                        Ok(delta) => (delta, Some((key, next))),
                        Err(counter) => {
                            overflow = Some(overflow_reason(o, &counter));
                            break;
                        }
                    }
                }
                (Effect::Contribution { .. } | Effect::Excluded { .. }, None) => {
                    // Ingest never builds these: a contribution needs an item.
                    decision.log.push(LogRow::of(
                        o,
                        "rejected",
                        Some("a content contribution without a content_id".into()),
                        functions_text(o),
                    ));
                    continue;
                }
            };
            if !delta.is_empty() {
                let total = event_totals.entry(objective).or_insert_with(|| {
                    totals
                        .get(&objective)
                        .or_else(|| current.get(&objective))
                        .cloned()
                        .unwrap_or_default()
                });
                if let Err(counter) = add_checked(total, &delta, 1) {
                    overflow = Some(overflow_reason(o, &counter));
                    break;
                }
            }
            planned.push((o, delta, replacement));
        }
        if let Some(reason) = overflow {
            decision.log.push(LogRow::event(
                first,
                "rejected",
                Some(Cow::Owned(reason.clone())),
                None,
                None,
            ));
            match replaying {
                Some(_) => {
                    decision
                        .replayed_holds
                        .insert(first.index, HoldReplay::Held(reason));
                }
                None => decision.refused.push((first.index, reason)),
            }
            continue;
        }

        // The event is processed: its item's order moves, its id is kept.
        if let Some((item, order)) = order
            && matches!(standing, None | Some(Standing::Newer))
        {
            let next = match &last {
                Some(last) => last.then(order),
                None => Last::of(order),
            };
            items.insert(item, next.clone());
            decision.items.insert(item, next);
            decision.item_events.insert(item, first.index);
        }
        if first.content_id.is_none() && replaying.is_none() {
            additive_here.insert(&first.event_id);
            decision.newly_applied.insert(&first.event_id);
        }
        for (objective, total) in event_totals {
            totals.insert(objective, total);
        }

        // One log row per event: what it changed, objective by objective.
        let mut changes: Vec<Change<'_>> = Vec::new();
        for (o, delta, replacement) in planned {
            if let Some((key, next)) = replacement {
                if let Some(last) = items.get(&(key.0, key.3)) {
                    decision.reshared.insert((key.0, key.3), last.clone());
                }
                view.replace(key, next);
            }
            if delta.is_empty() {
                continue;
            }
            decision.changed += 1;
            let objective: ObjectiveKey<'a> = (&o.user_id, &o.award_id, &o.objective_id);
            // Cannot overflow: each running total was checked, and the net
            // change is the difference of two of them.
            let _ = add_checked(net.entry(objective).or_default(), &delta, 1);
            changes.push(Change {
                award_id: &o.award_id,
                objective_id: &o.objective_id,
                delta,
                functions: functions_text(o),
                excluded_by: match &o.effect {
                    Effect::Excluded { filter } => Some(filter),
                    _ => None,
                },
            });
        }
        if !changes.is_empty() {
            let (deltas, versions, excluded) = nested(&mut changes);
            let mut row = LogRow::event(first, "applied", None, Some(deltas), Some(versions));
            row.excluded = excluded;
            decision.log.push(row);
        }
        for (o, reason) in held {
            decision.log.push(LogRow::of(
                o,
                "rejected",
                Some(storable(reason, MAX_REASON_BYTES)),
                functions_text(o),
            ));
            match replaying {
                Some(_) => {
                    decision
                        .replayed_holds
                        .insert(first.index, HoldReplay::Held(reason.to_string()));
                }
                None => decision.holds.push(Hold {
                    index: o.index,
                    award_id: &o.award_id,
                    objective_id: &o.objective_id,
                    reason,
                }),
            }
        }
        if replaying.is_some() {
            decision
                .replayed_holds
                .entry(first.index)
                .or_insert(HoldReplay::Resolved);
        }
    }
    // A replayed hold whose objective had nothing to say is resolved too.
    for index in replaying_holds.keys() {
        decision
            .replayed_holds
            .entry(*index)
            .or_insert(HoldReplay::Resolved);
    }
    for (objective, delta) in net {
        if nonzero(delta).is_empty() {
            continue;
        }
        let total = totals.remove(&objective).unwrap_or_default();
        decision.totals.insert(objective, total);
    }
    (decision, view)
}

/// One objective's change within an event, checked, not yet made: the
/// outcome, the change of its counters, and the item's new contribution.
type Planned<'a> = (&'a Outcome, Counters, Option<(ContentKey<'a>, Stored<'a>)>);

fn overflow_reason(o: &Outcome, counter: &str) -> String {
    format!(
        "award {}, objective {}: counter `{}` would overflow (past a 64-bit integer); nothing of this event was applied",
        o.award_id,
        o.objective_id,
        storable(counter, 128)
    )
}

impl<'a> LogRow<'a> {
    fn skip(o: &'a Outcome, reason: &'static str, functions: &'a str) -> LogRow<'a> {
        LogRow::of(o, "skipped", Some(reason.into()), functions)
    }
}

/// What an applied event changed in one objective.
struct Change<'a> {
    award_id: &'a str,
    objective_id: &'a str,
    delta: Counters,
    /// The objective's function versions, JSON text.
    functions: &'a str,
    /// The filter that now stops the event's content item there.
    excluded_by: Option<&'a Arc<str>>,
}

/// An event's changes as JSON objects keyed by award, then objective: the
/// deltas, the function versions that decided them, and (where a filter
/// took an item out) the filter.
fn nested(changes: &mut [Change<'_>]) -> (String, String, Option<String>) {
    changes.sort_by(|a, b| (a.award_id, a.objective_id).cmp(&(b.award_id, b.objective_id)));
    let (mut deltas, mut versions) = (ObjectWriter::new(), ObjectWriter::new());
    let mut excluded: Option<ObjectWriter> = None;
    for per_award in changes.chunk_by(|a, b| a.award_id == b.award_id) {
        let (mut award_deltas, mut award_versions) = (ObjectWriter::new(), ObjectWriter::new());
        let mut award_excluded: Option<ObjectWriter> = None;
        for change in per_award {
            push_counters(award_deltas.key(change.objective_id), &change.delta);
            award_versions
                .key(change.objective_id)
                .push_str(change.functions);
            if let Some(filter) = change.excluded_by {
                let writer = award_excluded.get_or_insert_with(ObjectWriter::new);
                push_str(writer.key(change.objective_id), filter);
            }
        }
        let award = per_award[0].award_id;
        deltas.key(award).push_str(&award_deltas.finish());
        versions.key(award).push_str(&award_versions.finish());
        if let Some(award_excluded) = award_excluded {
            let writer = excluded.get_or_insert_with(ObjectWriter::new);
            writer.key(award).push_str(&award_excluded.finish());
        }
    }
    (
        deltas.finish(),
        versions.finish(),
        excluded.map(ObjectWriter::finish),
    )
}

/// Each objective's function versions as JSON text, once per batch: the
/// outcomes of one objective share them (keyed by the shared value's
/// address).
pub(super) fn function_texts(outcomes: &[Outcome]) -> HashMap<usize, String> {
    let mut texts = HashMap::new();
    for o in outcomes {
        texts
            .entry(Arc::as_ptr(&o.functions) as usize)
            .or_insert_with(|| o.functions.to_string());
    }
    texts
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            .map(|((_, _, o), c)| (o.to_string(), c.clone()))
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
                ("u", "photo-1"),
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
            snapshot.view.load(("u", "a", "photo", "photo-1"), share);
            snapshot
                .totals
                .insert(("u", "a", "photo"), counters(&[("approved", 1)]));
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
            snapshot.items.insert(
                ("u", "photo-1"),
                decision.items.values().next().unwrap().clone(),
            );
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
                ("u", "photo-1"),
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
            ("u", "photo-1"),
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

    #[test]
    fn additive_events_add_once_per_id() {
        let mut snapshot = Snapshot::default();
        snapshot.seen_additive.insert("old");
        let batch = [
            adding(0, "old", "navi", 5),
            adding(1, "new", "navi", 7),
            adding(2, "new", "navi", 7),
        ];
        let decision = run(snapshot, &batch);
        assert_eq!(
            totals(&decision),
            vec![("navi".into(), counters(&[("n", 7)]))]
        );
        assert_eq!(
            decision.newly_applied.iter().copied().collect::<Vec<_>>(),
            vec!["new"]
        );
    }

    #[test]
    fn overflow_refuses_the_whole_event_and_the_next_applies() {
        let mut snapshot = Snapshot::default();
        snapshot
            .totals
            .insert(("u", "a", "navi"), counters(&[("n", i64::MAX - 10)]));
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
        assert!(!decision.newly_applied.contains("e2"));
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
        assert!(decision.newly_applied.contains("e1"));
        assert_eq!(decision.holds.len(), 1);
    }

    #[test]
    fn a_replayed_hold_applies_to_its_objective_only() {
        let mut snapshot = Snapshot::default();
        // The event was processed: another objective applied it.
        snapshot.items.insert(
            ("u", "photo-1"),
            Last::of(Order {
                occurred_at: at(1),
                event_id: "e1",
                place: None,
            }),
        );
        snapshot.seen_additive.insert("e2");
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
            ("u", "photo-1"),
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
            ("u", "photo-1"),
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
        assert_eq!(
            decision.reshared.keys().collect::<Vec<_>>(),
            [&("u", "photo-1")]
        );
    }

    #[test]
    fn a_backfill_applies_an_items_last_event_to_new_objectives_once() {
        let last = || {
            let mut snapshot = Snapshot {
                backfill: true,
                ..Snapshot::default()
            };
            snapshot.items.insert(
                ("u", "photo-1"),
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
        assert_eq!(
            decision.reshared.keys().collect::<Vec<_>>(),
            [&("u", "photo-1")]
        );
        assert!(decision.holds.is_empty());

        // Twice: the share is there, so nothing moves.
        let mut again = last();
        let share: &'static Value = Box::leak(Box::new(json!({"c": {"approved": 1}})));
        again.view.load(("u", "a", "new", "photo-1"), share);
        let decision = run(again, &batch);
        assert!(decision.totals.is_empty());

        // An older event than the item's last: a newer one decided it.
        let mut newer = last();
        newer.items.insert(
            ("u", "photo-1"),
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

    #[test]
    fn storable_text_has_no_nul() {
        assert_eq!(storable("ok", 10), Cow::Borrowed("ok"));
        assert_eq!(storable("a\u{0}", 10).as_ref(), "a\\u{0}");
    }
}
