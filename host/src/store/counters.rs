//! Applying a batch of rule outcomes to per-user objective counters, in one
//! transaction, exactly once.
//!
//! Content items contribute *absolute* counters for their current status;
//! the difference against what the item (or its de-duplication group)
//! contributed before is what moves the objective's counters, so status
//! changes move progress down as well as up, and re-delivered events change
//! nothing. Additive (analytics) events add once, by event id. The
//! transaction locks each of its users' `user_locks` rows (in a fixed
//! order), so two processes that briefly handle the same user (a rebalance),
//! or two sources feeding one objective, apply one after the other, never
//! from the same stale state.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::json_text::{JsonText, ObjectWriter, counters_text, push_counters, push_str};
use super::{QueryContext, Store, StoreError};

pub type Counters = BTreeMap<String, i64>;

/// What an event means for one objective, as decided by its filters and rule.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// The content item now contributes these counters (possibly none).
    Contribution {
        counters: Counters,
        dedup_key: Option<String>,
    },
    /// Add these counters once (an analytics event).
    Additive { counters: Counters },
    /// The content item no longer passes the objective's filters: it
    /// contributes nothing now. `by` names the filter that stopped it.
    Excluded { by: Arc<str> },
}

/// One event's effect on one objective.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub event_id: String,
    pub user_id: String,
    pub award_id: String,
    pub objective_id: String,
    pub content_id: Option<String>,
    pub occurred_at: DateTime<Utc>,
    pub effect: Effect,
    /// The function versions that decided it, e.g. `{"SourceFilter": 1}`.
    /// Shared by every outcome the same objective decided in a batch.
    pub functions: Arc<Value>,
}

/// A processing-log entry decided before the database (skips, rejections).
#[derive(Debug, Clone)]
pub struct LogEntry {
    pub event_id: Option<String>,
    pub user_id: Option<String>,
    pub award_id: Option<String>,
    pub objective_id: Option<String>,
    pub outcome: &'static str,
    pub reason: String,
    pub functions: Option<Arc<Value>>,
}

/// What a batch changed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Applied {
    /// Outcomes that changed counters.
    pub changed: usize,
    /// user_objective rows written.
    pub objectives: usize,
}

type ContentKey<'a> = (&'a str, &'a str, &'a str, &'a str); // user, award, objective, content
type GroupKey<'a> = (&'a str, &'a str, &'a str, &'a str); // user, award, objective, dedup key
type ObjectiveKey<'a> = (&'a str, &'a str, &'a str); // user, award, objective

// Keys borrow from the batch's outcomes and the rows read for it: a batch
// touches thousands of keys, and copying each one was a measurable share
// of ingest's CPU.

// Rows are looked up by key as `unnest(keys) CROSS JOIN LATERAL (SELECT ...
// WHERE key = k OFFSET 0)`: one index probe per key, whatever the planner's
// statistics say. A plain join let it hash or sort the whole table while
// the statistics were stale (a young, growing table), so a batch cost grew
// with the table: in the latency bench, parallel scans of 200,000
// content_items per batch, spilling to disk. OFFSET 0 keeps the subquery
// from being folded back into a join.

#[derive(Debug, Clone)]
struct Stored<'a> {
    counters: Counters,
    dedup_key: Option<&'a str>,
}

/// The last event applied to a content item.
#[derive(Debug, Clone)]
struct LastApplied<'a> {
    occurred_at: DateTime<Utc>,
    event_id: &'a str,
}

/// A unit of an objective's total: an item on its own, or a group of items
/// sharing a de-duplication key (the group counts each counter's maximum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Unit<'a> {
    Item(&'a str),
    Group(&'a str),
}

fn add(into: &mut Counters, from: &Counters, sign: i64) {
    for (name, value) in from {
        match into.get_mut(name) {
            Some(total) => *total += sign * value,
            None => {
                into.insert(name.clone(), sign * value);
            }
        }
    }
}

fn nonzero(counters: Counters) -> Counters {
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

/// The in-memory view of the contributions a batch touches.
#[derive(Default)]
struct Contributions<'a> {
    items: HashMap<ContentKey<'a>, Stored<'a>>,
    /// Members of each group touched (content ids).
    groups: HashMap<GroupKey<'a>, BTreeSet<&'a str>>,
    /// De-duplication keys that changed: (item, old key, new key).
    rekeyed: Vec<(ContentKey<'a>, Option<&'a str>, Option<&'a str>)>,
}

impl<'a> Contributions<'a> {
    fn unit_value(&self, (user, award, objective): ObjectiveKey<'a>, unit: Unit<'a>) -> Counters {
        match unit {
            Unit::Item(content) => self
                .items
                .get(&(user, award, objective, content))
                .map(|s| s.counters.clone())
                .unwrap_or_default(),
            Unit::Group(dedup) => {
                let mut max = Counters::new();
                for content in self
                    .groups
                    .get(&(user, award, objective, dedup))
                    .into_iter()
                    .flatten()
                {
                    if let Some(stored) = self.items.get(&(user, award, objective, *content)) {
                        for (name, value) in &stored.counters {
                            let entry = max.entry(name.clone()).or_insert(*value);
                            *entry = (*entry).max(*value);
                        }
                    }
                }
                max
            }
        }
    }

    fn unit_of(content: &'a str, dedup_key: Option<&'a str>) -> Unit<'a> {
        match dedup_key {
            Some(key) => Unit::Group(key),
            None => Unit::Item(content),
        }
    }

    /// Loads one stored share of an item: `share` is `{"c": counters, "k": key}`.
    fn load(
        &mut self,
        key: ContentKey<'a>,
        share: &'a Value,
        group_keys: &mut BTreeSet<GroupKey<'a>>,
    ) {
        let dedup_key = share.get("k").and_then(Value::as_str);
        if let Some(dedup) = dedup_key {
            group_keys.insert((key.0, key.1, key.2, dedup));
            self.groups
                .entry((key.0, key.1, key.2, dedup))
                .or_default()
                .insert(key.3);
        }
        let counters = share.get("c").map(counters_from).unwrap_or_default();
        self.items.entry(key).or_insert(Stored {
            counters,
            dedup_key,
        });
    }

    /// Replaces an item's contribution; returns the change of the
    /// objective's counters.
    fn replace(&mut self, key: ContentKey<'a>, next: Stored<'a>) -> Counters {
        let (user, award, objective, content) = key;
        let objective_key = (user, award, objective);
        let previous = self
            .items
            .get(&key)
            .map(|s| Self::unit_of(content, s.dedup_key));
        let next_unit = Self::unit_of(content, next.dedup_key);
        let mut units: Vec<Unit<'a>> = previous.into_iter().chain([next_unit]).collect();
        units.sort();
        units.dedup();
        let mut delta = Counters::new();
        for unit in &units {
            add(&mut delta, &self.unit_value(objective_key, *unit), -1);
        }
        if let Some(Unit::Group(old_key)) = previous
            && let Some(members) = self.groups.get_mut(&(user, award, objective, old_key))
        {
            members.remove(content);
        }
        if let Some(new_key) = next.dedup_key {
            self.groups
                .entry((user, award, objective, new_key))
                .or_default()
                .insert(content);
        }
        let old_key = match previous {
            Some(Unit::Group(old)) => Some(old),
            _ => None,
        };
        if old_key != next.dedup_key {
            self.rekeyed.push((key, old_key, next.dedup_key));
        }
        self.items.insert(key, next);
        for unit in &units {
            add(&mut delta, &self.unit_value(objective_key, *unit), 1);
        }
        nonzero(delta)
    }
}

impl Store {
    /// Applies a batch (outcomes in stream order, an event's outcomes
    /// together) and its log entries in one transaction. `source` scopes
    /// content items and additive events' ids.
    pub async fn apply_batch(
        &mut self,
        source: &str,
        outcomes: &[Outcome],
        log: &[LogEntry],
    ) -> Result<Applied, StoreError> {
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting a batch")?;

        // Per-user locks, in one order: a user's batches apply one at a
        // time. Row locks, which live in the rows rather than in
        // PostgreSQL's shared lock table, so a batch of any number of users
        // fits: a user's row is made once, then locked by each batch.
        let users: BTreeSet<&str> = outcomes.iter().map(|o| o.user_id.as_str()).collect();
        let users: Vec<&str> = users.into_iter().collect();
        if !users.is_empty() {
            // A user another batch is making: this waits for its commit.
            tx.execute(
                "INSERT INTO user_locks (user_id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
                &[&users],
            )
            .await
            .context("registering users to lock")?;
            // In the array's order (sorted), one index probe per user.
            tx.execute(
                "SELECT 1 FROM unnest($1::text[]) AS k(u)
                 CROSS JOIN LATERAL (SELECT 1 FROM user_locks l WHERE l.user_id = k.u OFFSET 0 FOR UPDATE) l",
                &[&users],
            )
            .await
            .context("locking users")?;
        }

        // Each content item of the batch: the last event applied to it, and
        // its shares of every objective.
        let item_keys: BTreeSet<(&str, &str)> = outcomes
            .iter()
            .filter_map(|o| o.content_id.as_deref().map(|c| (o.user_id.as_str(), c)))
            .collect();
        let (iu, ic): (Vec<&str>, Vec<&str>) = item_keys.iter().copied().unzip();
        let item_rows = tx
            .query(
                "SELECT i.user_id, i.content_id, i.occurred_at, i.event_id, i.shares
                 FROM unnest($2::text[], $3::text[]) AS k(u, c)
                 CROSS JOIN LATERAL (SELECT * FROM content_items i
                     WHERE i.user_id = k.u AND i.source = $1 AND i.content_id = k.c OFFSET 0) i",
                &[&source, &iu, &ic],
            )
            .await
            .context("reading content items")?;
        let item_shares: Vec<Value> = item_rows.iter().map(|r| r.get(4)).collect();
        let mut items: HashMap<(&str, &str), LastApplied<'_>> = item_rows
            .iter()
            .map(|r| {
                (
                    (r.get(0), r.get(1)),
                    LastApplied {
                        occurred_at: r.get(2),
                        event_id: r.get(3),
                    },
                )
            })
            .collect();
        let mut dirty_items: BTreeSet<(&str, &str)> = BTreeSet::new();

        let mut group_keys: BTreeSet<GroupKey<'_>> = BTreeSet::new();
        for o in outcomes {
            if let Effect::Contribution {
                dedup_key: Some(dedup),
                ..
            } = &o.effect
            {
                group_keys.insert((&o.user_id, &o.award_id, &o.objective_id, dedup));
            }
        }
        let mut view = Contributions::default();
        for (row, shares) in item_rows.iter().zip(&item_shares) {
            let (user, content): (&str, &str) = (row.get(0), row.get(1));
            if let Value::Object(shares) = shares {
                for (name, share) in shares {
                    if let Some((award, objective)) = name.split_once('/') {
                        view.load((user, award, objective, content), share, &mut group_keys);
                    }
                }
            }
        }
        // ... and every member of the de-duplication groups involved.
        let member_rows = if group_keys.is_empty() {
            Vec::new()
        } else {
            let (gu, ga, go, gk) = unzip4(group_keys.iter().copied());
            tx.query(
                "SELECT m.user_id, m.award_id, m.objective_id, m.content_id,
                        coalesce(i.shares -> (m.award_id || '/' || m.objective_id), '{}'::jsonb)
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS k(u, a, o, d)
                 CROSS JOIN LATERAL (SELECT * FROM dedup_members m
                     WHERE m.user_id = k.u AND m.award_id = k.a AND m.objective_id = k.o AND m.dedup_key = k.d
                     OFFSET 0) m
                 CROSS JOIN LATERAL (SELECT i.shares FROM content_items i
                     WHERE i.user_id = m.user_id AND i.source = m.source AND i.content_id = m.content_id
                     OFFSET 0) i",
                &[&gu, &ga, &go, &gk],
            )
            .await
            .context("reading de-duplication groups")?
        };
        let member_shares: Vec<Value> = member_rows.iter().map(|r| r.get(4)).collect();
        let mut unused = BTreeSet::new();
        for (row, share) in member_rows.iter().zip(&member_shares) {
            view.load(
                (row.get(0), row.get(1), row.get(2), row.get(3)),
                share,
                &mut unused,
            );
        }

        // Additive events already applied (re-delivery adds nothing). Each
        // id once (an event has an outcome per objective), in key order.
        let additive_ids: Vec<&str> = outcomes
            .iter()
            .filter(|o| matches!(o.effect, Effect::Additive { .. }))
            .map(|o| o.event_id.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let seen_rows = if additive_ids.is_empty() {
            Vec::new()
        } else {
            tx.query(
                "SELECT a.event_id FROM unnest($2::text[]) AS k(e)
                 CROSS JOIN LATERAL (SELECT event_id FROM applied_events a
                     WHERE a.source = $1 AND a.event_id = k.e OFFSET 0) a",
                &[&source, &additive_ids],
            )
            .await
            .context("reading applied events")?
        };
        let seen_additive: HashSet<&str> = seen_rows.iter().map(|r| r.get(0)).collect();
        // A set: a batch holds thousands of additive events.
        let mut newly_applied: BTreeSet<&str> = BTreeSet::new();
        let mut added_here: HashSet<(&str, &str, &str)> = HashSet::new();

        // Each objective's function versions as JSON text, written once per
        // batch: the outcomes of one objective share them. Keyed by the
        // shared value's address; log rows borrow the text.
        let mut function_texts: HashMap<usize, String> = HashMap::new();
        for o in outcomes {
            function_texts
                .entry(Arc::as_ptr(&o.functions) as usize)
                .or_insert_with(|| o.functions.to_string());
        }
        let functions_text =
            |o: &Outcome| -> &str { &function_texts[&(Arc::as_ptr(&o.functions) as usize)] };

        // Events in stream order; an event's outcomes are adjacent.
        let mut deltas: BTreeMap<ObjectiveKey<'_>, Counters> = BTreeMap::new();
        let mut entries: Vec<LogRow<'_>> = Vec::new();
        let mut applied = Applied::default();
        let mut index = 0;
        while index < outcomes.len() {
            let first = &outcomes[index];
            let end = index
                + outcomes[index..]
                    .iter()
                    .take_while(|o| o.event_id == first.event_id && o.user_id == first.user_id)
                    .count();
            let event = &outcomes[index..end];
            index = end;

            // A content item's events apply in time order, each once.
            if let Some(content) = first.content_id.as_deref() {
                let item = (first.user_id.as_str(), content);
                if let Some(last) = items.get(&item) {
                    if first.occurred_at < last.occurred_at {
                        entries.push(LogRow::skip(
                            first,
                            "older than the last applied event for this content item",
                            functions_text(first),
                        ));
                        continue;
                    }
                    if first.occurred_at == last.occurred_at && first.event_id == last.event_id {
                        continue;
                    }
                }
                items.insert(
                    item,
                    LastApplied {
                        occurred_at: first.occurred_at,
                        event_id: &first.event_id,
                    },
                );
                dirty_items.insert(item);
            }

            // One log row per event: what it changed, objective by objective.
            // (award, objective, delta, function versions) of what changed.
            let mut changes: Vec<(&str, &str, Counters, &str)> = Vec::new();
            let mut duplicate = false;
            // Which objectives' filters now stop this item, where that
            // moved counters.
            let mut excluded: Vec<String> = Vec::new();
            for o in event {
                let objective: ObjectiveKey<'_> = (&o.user_id, &o.award_id, &o.objective_id);
                let delta = match (&o.effect, o.content_id.as_deref()) {
                    (Effect::Additive { counters }, _) => {
                        // One event adds to every objective it reaches: its
                        // id is recorded once for the batch.
                        if seen_additive.contains(o.event_id.as_str())
                            || !added_here.insert((&o.event_id, &o.award_id, &o.objective_id))
                        {
                            duplicate = true;
                            continue;
                        }
                        newly_applied.insert(&o.event_id);
                        nonzero(counters.clone())
                    }
                    (effect, Some(content)) => {
                        let key: ContentKey<'_> =
                            (&o.user_id, &o.award_id, &o.objective_id, content);
                        let (counters, dedup_key) = match effect {
                            Effect::Contribution {
                                counters,
                                dedup_key,
                            } => (nonzero(counters.clone()), dedup_key.as_deref()),
                            _ => (Counters::new(), None),
                        };
                        // An item that never contributed and still doesn't
                        // needs no row.
                        if counters.is_empty()
                            && dedup_key.is_none()
                            && !view.items.contains_key(&key)
                        {
                            continue;
                        }
                        view.replace(
                            key,
                            Stored {
                                counters,
                                dedup_key,
                            },
                        )
                    }
                    (Effect::Contribution { .. } | Effect::Excluded { .. }, None) => {
                        // Ingest never builds these: a contribution needs an item.
                        entries.push(LogRow::reject(
                            o,
                            "a content contribution without a content_id",
                            functions_text(o),
                        ));
                        continue;
                    }
                };
                if delta.is_empty() {
                    continue;
                }
                if let Effect::Excluded { by } = &o.effect {
                    excluded.push(format!(
                        "{}/{}: excluded by {by}",
                        o.award_id, o.objective_id
                    ));
                }
                applied.changed += 1;
                add(deltas.entry(objective).or_default(), &delta, 1);
                changes.push((&o.award_id, &o.objective_id, delta, functions_text(o)));
            }
            if !changes.is_empty() {
                let reason = (!excluded.is_empty()).then(|| Cow::Owned(excluded.join("; ")));
                let (deltas, versions) = nested(&mut changes);
                entries.push(LogRow::event(
                    first,
                    "applied",
                    reason,
                    Some(deltas),
                    Some(versions),
                ));
            } else if duplicate {
                entries.push(LogRow::event(
                    first,
                    "skipped",
                    Some("event already applied".into()),
                    None,
                    None,
                ));
            }
        }

        // Write back: items (with their shares), group memberships, counters
        // (new versions), applied ids, log.
        if !dirty_items.is_empty() {
            // shares = {"<award>/<objective>": {"c": counters, "k": dedup key}}
            let mut shares: BTreeMap<(&str, &str), ObjectWriter> = dirty_items
                .iter()
                .map(|k| (*k, ObjectWriter::new()))
                .collect();
            for ((user, award, objective, content), stored) in &view.items {
                if stored.counters.is_empty() && stored.dedup_key.is_none() {
                    continue;
                }
                if let Some(object) = shares.get_mut(&(*user, *content)) {
                    let out = object.key(&format!("{award}/{objective}"));
                    out.push_str("{\"c\":");
                    push_counters(out, &stored.counters);
                    if let Some(key) = stored.dedup_key {
                        out.push_str(",\"k\":");
                        push_str(out, key);
                    }
                    out.push('}');
                }
            }
            let (u, c): (Vec<&str>, Vec<&str>) = dirty_items.iter().copied().unzip();
            let at: Vec<DateTime<Utc>> = dirty_items.iter().map(|k| items[k].occurred_at).collect();
            let event: Vec<&str> = dirty_items.iter().map(|k| items[k].event_id).collect();
            let shares: Vec<String> = shares.into_values().map(ObjectWriter::finish).collect();
            let shares: Vec<JsonText<'_>> = shares.iter().map(|s| JsonText(s)).collect();
            tx.execute(
                "INSERT INTO content_items (user_id, source, content_id, occurred_at, event_id, shares)
                 SELECT u, $1, c, t, e, s
                 FROM unnest($2::text[], $3::text[], $4::timestamptz[], $5::text[], $6::jsonb[]) AS k(u, c, t, e, s)
                 ON CONFLICT (user_id, source, content_id) DO UPDATE SET
                     occurred_at = EXCLUDED.occurred_at, event_id = EXCLUDED.event_id, shares = EXCLUDED.shares",
                &[&source, &u, &c, &at, &event, &shares],
            )
            .await
            .context("writing content items")?;
        }
        if !view.rekeyed.is_empty() {
            // An item may change key more than once in a batch: what counts
            // is its key before the batch and after it.
            let mut net: BTreeMap<ContentKey<'_>, (Option<&str>, Option<&str>)> = BTreeMap::new();
            for (key, old, new) in &view.rekeyed {
                net.entry(*key)
                    .and_modify(|(_, last)| *last = *new)
                    .or_insert((*old, *new));
            }
            let left: Vec<(ContentKey<'_>, &str)> = net
                .iter()
                .filter(|(_, (before, after))| before != after)
                .filter_map(|(k, (before, _))| before.map(|b| (*k, b)))
                .collect();
            let joined: Vec<(ContentKey<'_>, &str)> = net
                .iter()
                .filter(|(_, (before, after))| before != after)
                .filter_map(|(k, (_, after))| after.map(|a| (*k, a)))
                .collect();
            for (rows, sql, context) in [
                (
                    &left,
                    "DELETE FROM dedup_members WHERE ctid = ANY (ARRAY(
                         SELECT m.ctid FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS k(u, a, o, d, c)
                         CROSS JOIN LATERAL (SELECT ctid FROM dedup_members m
                             WHERE m.user_id = k.u AND m.award_id = k.a AND m.objective_id = k.o AND m.dedup_key = k.d
                               AND m.source = $1 AND m.content_id = k.c OFFSET 0) m))",
                    "leaving de-duplication groups",
                ),
                (
                    &joined,
                    "INSERT INTO dedup_members (user_id, award_id, objective_id, dedup_key, source, content_id)
                     SELECT u, a, o, d, $1, c FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS k(u, a, o, d, c)
                     ON CONFLICT DO NOTHING",
                    "joining de-duplication groups",
                ),
            ] {
                if rows.is_empty() {
                    continue;
                }
                let u: Vec<&str> = rows.iter().map(|(k, _)| k.0).collect();
                let a: Vec<&str> = rows.iter().map(|(k, _)| k.1).collect();
                let o: Vec<&str> = rows.iter().map(|(k, _)| k.2).collect();
                let d: Vec<&str> = rows.iter().map(|(_, d)| *d).collect();
                let c: Vec<&str> = rows.iter().map(|(k, _)| k.3).collect();
                tx.execute(sql, &[&source, &u, &a, &o, &d, &c]).await.context(context)?;
            }
        }
        let deltas: Vec<(ObjectiveKey<'_>, Counters)> = deltas
            .into_iter()
            .map(|(k, d)| (k, nonzero(d)))
            .filter(|(_, d)| !d.is_empty())
            .collect();
        if !deltas.is_empty() {
            // Current counters, plus the deltas, written back whole: the
            // per-user locks make this read-modify-write safe.
            let (mut u, mut a, mut o) = (Vec::new(), Vec::new(), Vec::new());
            for ((user, award, objective), _) in &deltas {
                u.push(*user);
                a.push(*award);
                o.push(*objective);
            }
            let current_rows = tx
                .query(
                    "SELECT uo.user_id, uo.award_id, uo.objective_id, uo.counters
                     FROM unnest($1::text[], $2::text[], $3::text[]) AS k(u, a, o)
                     CROSS JOIN LATERAL (SELECT * FROM user_objective uo
                         WHERE uo.user_id = k.u AND uo.award_id = k.a AND uo.objective_id = k.o OFFSET 0) uo",
                    &[&u, &a, &o],
                )
                .await
                .context("reading objective counters")?;
            let current: HashMap<ObjectiveKey<'_>, Counters> = current_rows
                .iter()
                .map(|r| {
                    (
                        (r.get(0), r.get(1), r.get(2)),
                        counters_from(&r.get::<_, Value>(3)),
                    )
                })
                .collect();
            let totals: Vec<String> = deltas
                .iter()
                .map(|(k, d)| {
                    let mut total = current.get(k).cloned().unwrap_or_default();
                    add(&mut total, d, 1);
                    counters_text(&total)
                })
                .collect();
            let totals: Vec<JsonText<'_>> = totals.iter().map(|t| JsonText(t)).collect();
            tx.execute(
                "INSERT INTO user_objective (user_id, award_id, objective_id, counters, version)
                 SELECT u, a, o, c, nextval('laurel_version')
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[]) AS k(u, a, o, c)
                 ON CONFLICT (user_id, award_id, objective_id) DO UPDATE SET
                     counters = EXCLUDED.counters, version = EXCLUDED.version, updated_at = now()",
                &[&u, &a, &o, &totals],
            )
            .await
            .context("updating objective counters")?;
            applied.objectives = deltas.len();
        }
        if !newly_applied.is_empty() {
            let newly_applied: Vec<&str> = newly_applied.into_iter().collect();
            tx.execute(
                "INSERT INTO applied_events (source, event_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING",
                &[&source, &newly_applied],
            )
            .await
            .context("recording applied events")?;
        }
        entries.extend(log.iter().map(LogRow::from_entry));
        write_log(&tx, source, &entries).await?;
        tx.commit().await.context("committing a batch")?;
        Ok(applied)
    }

    /// Log entries on their own (a batch in which nothing reached the
    /// counters).
    pub async fn write_log(&mut self, source: &str, log: &[LogEntry]) -> Result<(), StoreError> {
        let entries: Vec<LogRow<'_>> = log.iter().map(LogRow::from_entry).collect();
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting a log write")?;
        write_log(&tx, source, &entries).await?;
        tx.commit().await.context("committing a log write")
    }

    /// Which of `user_ids` are banned or deleted, with their state.
    pub async fn excluded_users(
        &self,
        user_ids: &[&str],
    ) -> Result<HashMap<String, String>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT u.user_id, u.state FROM unnest($1::text[]) AS k(u)
                 CROSS JOIN LATERAL (SELECT user_id, state FROM users u
                     WHERE u.user_id = k.u AND u.state <> 'active' OFFSET 0) u",
                &[&user_ids],
            )
            .await
            .context("reading user states")?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// A user's objective counters: (award, objective) -> counters.
    pub async fn user_counters(
        &self,
        user_id: &str,
    ) -> Result<BTreeMap<(String, String), Counters>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT award_id, objective_id, counters FROM user_objective WHERE user_id = $1",
                &[&user_id],
            )
            .await
            .context("reading a user's counters")?;
        Ok(rows
            .iter()
            .map(|r| ((r.get(0), r.get(1)), counters_from(&r.get::<_, Value>(2))))
            .collect())
    }

    /// Deletes processing-log rows, applied-event ids and finished
    /// notifications older than their retention, a bounded number per call; returns how many went.
    pub async fn prune(
        &self,
        log_days: i32,
        applied_days: i32,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let log = self
            .client()
            .execute(
                "DELETE FROM processing_log WHERE id IN (
                     SELECT id FROM processing_log WHERE logged_at < now() - make_interval(days => $1) LIMIT $2)",
                &[&log_days, &limit],
            )
            .await
            .context("pruning the processing log")?;
        let applied = self
            .client()
            .execute(
                "DELETE FROM applied_events WHERE (source, event_id) IN (
                     SELECT source, event_id FROM applied_events
                     WHERE applied_at < now() - make_interval(days => $1) LIMIT $2)",
                &[&applied_days, &limit],
            )
            .await
            .context("pruning applied events")?;
        // Finished deliveries; the transitions they announced stay.
        let notifications = self
            .client()
            .execute(
                "DELETE FROM notifications WHERE id IN (
                     SELECT id FROM notifications
                     WHERE state <> 'pending' AND finished_at < now() - make_interval(days => $1) LIMIT $2)",
                &[&log_days, &limit],
            )
            .await
            .context("pruning finished notifications")?;
        Ok(log + applied + notifications)
    }
}

fn unzip4<'a>(
    items: impl Iterator<Item = (&'a str, &'a str, &'a str, &'a str)>,
) -> (Vec<&'a str>, Vec<&'a str>, Vec<&'a str>, Vec<&'a str>) {
    let (mut a, mut b, mut c, mut d) = (vec![], vec![], vec![], vec![]);
    for (w, x, y, z) in items {
        a.push(w);
        b.push(x);
        c.push(y);
        d.push(z);
    }
    (a, b, c, d)
}

/// An event's changes as two JSON objects keyed by award, then objective:
/// the deltas, and the function versions that decided them.
fn nested(changes: &mut [(&str, &str, Counters, &str)]) -> (String, String) {
    changes.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let (mut deltas, mut versions) = (ObjectWriter::new(), ObjectWriter::new());
    for per_award in changes.chunk_by(|a, b| a.0 == b.0) {
        let (mut award_deltas, mut award_versions) = (ObjectWriter::new(), ObjectWriter::new());
        for (_, objective, delta, functions) in per_award {
            push_counters(award_deltas.key(objective), delta);
            award_versions.key(objective).push_str(functions);
        }
        deltas.key(per_award[0].0).push_str(&award_deltas.finish());
        versions
            .key(per_award[0].0)
            .push_str(&award_versions.finish());
    }
    (deltas.finish(), versions.finish())
}

/// A processing-log row. An applied event has one row, its `deltas` and
/// `functions` keyed by award, then objective.
struct LogRow<'a> {
    event_id: Option<&'a str>,
    user_id: Option<&'a str>,
    award_id: Option<&'a str>,
    objective_id: Option<&'a str>,
    outcome: &'static str,
    reason: Option<Cow<'a, str>>,
    /// JSON text.
    deltas: Option<String>,
    /// JSON text.
    functions: Option<Cow<'a, str>>,
}

impl<'a> LogRow<'a> {
    fn of(
        o: &'a Outcome,
        outcome: &'static str,
        reason: Option<Cow<'a, str>>,
        functions: &'a str,
    ) -> LogRow<'a> {
        LogRow {
            event_id: Some(&o.event_id),
            user_id: Some(&o.user_id),
            award_id: Some(&o.award_id),
            objective_id: Some(&o.objective_id),
            outcome,
            reason,
            deltas: None,
            functions: Some(Cow::Borrowed(functions)),
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
            event_id: Some(&o.event_id),
            user_id: Some(&o.user_id),
            award_id: None,
            objective_id: None,
            outcome,
            reason,
            deltas,
            functions: functions.map(Cow::Owned),
        }
    }

    fn skip(o: &'a Outcome, reason: &'static str, functions: &'a str) -> LogRow<'a> {
        LogRow::of(o, "skipped", Some(reason.into()), functions)
    }

    fn reject(o: &'a Outcome, reason: &'static str, functions: &'a str) -> LogRow<'a> {
        LogRow::of(o, "rejected", Some(reason.into()), functions)
    }

    fn from_entry(e: &'a LogEntry) -> LogRow<'a> {
        LogRow {
            event_id: e.event_id.as_deref(),
            user_id: e.user_id.as_deref(),
            award_id: e.award_id.as_deref(),
            objective_id: e.objective_id.as_deref(),
            outcome: e.outcome,
            reason: Some(Cow::Borrowed(&e.reason)),
            deltas: None,
            functions: e.functions.as_deref().map(|f| Cow::Owned(f.to_string())),
        }
    }
}
async fn write_log(
    tx: &tokio_postgres::Transaction<'_>,
    source: &str,
    rows: &[LogRow<'_>],
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let event: Vec<Option<&str>> = rows.iter().map(|r| r.event_id).collect();
    let user: Vec<Option<&str>> = rows.iter().map(|r| r.user_id).collect();
    let award: Vec<Option<&str>> = rows.iter().map(|r| r.award_id).collect();
    let objective: Vec<Option<&str>> = rows.iter().map(|r| r.objective_id).collect();
    let outcome: Vec<&str> = rows.iter().map(|r| r.outcome).collect();
    let reason: Vec<Option<&str>> = rows.iter().map(|r| r.reason.as_deref()).collect();
    let deltas: Vec<Option<JsonText<'_>>> = rows
        .iter()
        .map(|r| r.deltas.as_deref().map(JsonText))
        .collect();
    let functions: Vec<Option<JsonText<'_>>> = rows
        .iter()
        .map(|r| r.functions.as_deref().map(JsonText))
        .collect();
    tx.execute(
        "INSERT INTO processing_log (source, event_id, user_id, award_id, objective_id, outcome, reason, deltas, functions)
         SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::jsonb[], $9::jsonb[])",
        &[&source, &event, &user, &award, &objective, &outcome, &reason, &deltas, &functions],
    )
    .await
    .context("writing the processing log")?;
    Ok(())
}
