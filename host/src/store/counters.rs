//! Applying a batch of rule outcomes to per-user objective counters, in one
//! transaction, exactly once: read what the batch touches, decide (pure,
//! `decide.rs`, where the rules and their unit tests are), write.
//!
//! Content items contribute *absolute* counters for their current status;
//! the difference against what the item (or its de-duplication group)
//! contributed before is what moves the objective's counters, so status
//! changes move progress down as well as up, and re-delivered events change
//! nothing. Additive (analytics) events add once, by event id. The
//! transaction locks each of its users' `user_locks` rows (in a fixed
//! order), so two processes that briefly handle the same user (a rebalance),
//! or two sources feeding one objective, apply one after the other, never
//! from the same stale state. Dead letters and holds are written in the
//! same transaction (`dead_letters`), so what is kept for replay and what
//! was applied never disagree.

mod decide;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::json_text::{JsonText, ObjectWriter, counters_text, push_counters, push_str};
use super::{QueryContext, Store, StoreError};
pub(crate) use decide::counters_from;
use decide::{
    ContentKey, Contributions, Decision, GroupKey, HoldReplay, Last, LogRow, MAX_ID_BYTES,
    MAX_REASON_BYTES, ObjectiveKey, Order, Place, Snapshot, storable,
};

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
    /// contributes nothing now. `filter` names the filter that stopped it.
    Excluded { filter: Arc<str> },
    /// The objective could not decide (a function failed, is quarantined
    /// or cannot be bound): nothing changes there now, and the event is
    /// kept for replay for this objective.
    Held { reason: Arc<str> },
}

/// One event's effect on one objective.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The event's position in its batch ([`Batch::messages`]).
    pub index: usize,
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
    /// The event's position in its batch.
    pub index: usize,
    pub event_id: Option<String>,
    pub user_id: Option<String>,
    pub award_id: Option<String>,
    pub objective_id: Option<String>,
    pub outcome: &'static str,
    pub reason: String,
    pub functions: Option<Arc<Value>>,
}

/// A message as it came from Kafka: what a dead letter keeps.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// Where the event first was, if not here: the `laurel-place` header
    /// of an event a pipeline made (its raw record's place,
    /// `TOPIC:PARTITION:OFFSET:N`), kept with a dead letter.
    pub place: Option<&'a str>,
}

/// The header with which a pipeline's events name their raw record's place.
pub const PLACE_HEADER: &str = "laurel-place";

/// The value of [`PLACE_HEADER`] for the `n`-th event of a record.
pub fn place_header(topic: &str, partition: i32, offset: i64, n: u32) -> String {
    Place {
        topic,
        partition,
        offset,
        n,
    }
    .text()
}

/// An event dead-lettered whole, with its reason. Its ids are what could
/// be read from the message (stored made printable).
#[derive(Debug, Clone)]
pub struct DeadEvent {
    pub index: usize,
    pub event_id: Option<String>,
    pub user_id: Option<String>,
    pub reason: String,
}

/// A dead letter being replayed (by batch index).
#[derive(Debug, Clone)]
pub struct Replaying {
    pub index: usize,
    /// Its row in `dead_letters`.
    pub id: i64,
    /// The objective it was held for; `None`: the event was dead-lettered
    /// whole, and is now processed as if it came from Kafka.
    pub objective: Option<(String, String)>,
}

/// A batch to apply: everything keyed by the event's position in
/// `messages`.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// Scopes content items and additive events' ids.
    pub source: &'a str,
    pub messages: &'a [Message<'a>],
    /// In stream order, an event's outcomes together.
    pub outcomes: &'a [Outcome],
    pub log: &'a [LogEntry],
    /// Events dead-lettered whole before the database.
    pub dead: &'a [DeadEvent],
    /// Dead letters being replayed (none from Kafka).
    pub replaying: &'a [Replaying],
    /// A backfill (`crate::backfill`): every event is its content item's
    /// stored last event, and the outcomes are those of the objectives
    /// being backfilled. It applies at the item's own order; what a
    /// failing function holds is counted (`Applied::held`), not kept as a
    /// dead letter: the backfill is run again after the fix. Its analytics
    /// events count once per award (`award_events`), not once per source.
    pub backfill: bool,
    /// Awards that credit the past: the ids of the analytics events they
    /// count are kept (`award_events`), so a backfill reading those events
    /// again from Kafka counts each once.
    pub recorded: &'a [String],
}

impl<'a> Batch<'a> {
    /// Outcomes alone, of events that need no dead letter.
    pub fn of_outcomes(source: &'a str, outcomes: &'a [Outcome]) -> Batch<'a> {
        Batch {
            source,
            messages: &[],
            outcomes,
            log: &[],
            dead: &[],
            replaying: &[],
            backfill: false,
            recorded: &[],
        }
    }

    /// Every batch index the batch mentions, in order.
    pub fn indexes(&self) -> BTreeSet<usize> {
        self.outcomes
            .iter()
            .map(|o| o.index)
            .chain(self.log.iter().map(|l| l.index))
            .chain(self.dead.iter().map(|d| d.index))
            .chain(self.replaying.iter().map(|r| r.index))
            .collect()
    }
}

/// The parts of a batch that concern some of its events (the batch is
/// split to find the event PostgreSQL refuses).
#[derive(Debug, Clone, Default)]
pub struct BatchPart {
    pub outcomes: Vec<Outcome>,
    pub log: Vec<LogEntry>,
    pub dead: Vec<DeadEvent>,
    pub replaying: Vec<Replaying>,
}

impl BatchPart {
    pub fn of(batch: &Batch<'_>, keep: impl Fn(usize) -> bool) -> BatchPart {
        BatchPart {
            outcomes: batch
                .outcomes
                .iter()
                .filter(|o| keep(o.index))
                .cloned()
                .collect(),
            log: batch
                .log
                .iter()
                .filter(|l| keep(l.index))
                .cloned()
                .collect(),
            dead: batch
                .dead
                .iter()
                .filter(|d| keep(d.index))
                .cloned()
                .collect(),
            replaying: batch
                .replaying
                .iter()
                .filter(|r| keep(r.index))
                .cloned()
                .collect(),
        }
    }

    pub fn batch<'a>(&'a self, whole: &Batch<'a>) -> Batch<'a> {
        Batch {
            source: whole.source,
            messages: whole.messages,
            outcomes: &self.outcomes,
            log: &self.log,
            dead: &self.dead,
            replaying: &self.replaying,
            backfill: whole.backfill,
            recorded: whole.recorded,
        }
    }
}

/// What a batch changed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Applied {
    /// Outcomes that changed counters.
    pub changed: usize,
    /// user_objective rows written.
    pub objectives: usize,
    /// Events refused whole while applying (a counter would overflow):
    /// kept as dead letters; the caller publishes them.
    pub refused: Vec<(usize, String)>,
    /// Events held for replay, by (award, objective).
    pub held: BTreeMap<(String, String), u64>,
    /// Replayed dead letters resolved (applied, or nothing left to apply).
    pub resolved: usize,
    /// Replayed dead letters still not applicable.
    pub still_held: usize,
    /// Replayed dead letters another replay took first.
    pub taken: usize,
}

impl Applied {
    pub fn merge(&mut self, other: Applied) {
        self.changed += other.changed;
        self.objectives += other.objectives;
        self.refused.extend(other.refused);
        for (objective, n) in other.held {
            *self.held.entry(objective).or_default() += n;
        }
        self.resolved += other.resolved;
        self.still_held += other.still_held;
        self.taken += other.taken;
    }
}

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

impl Store {
    /// Applies a batch in one transaction: its outcomes, log entries,
    /// dead letters and holds; for a replay, marks the dead letters it
    /// resolved.
    pub async fn apply_batch(&mut self, batch: Batch<'_>) -> Result<Applied, StoreError> {
        let source = batch.source;
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting a batch")?;

        // --- read -----------------------------------------------------
        // Replays first: a dead letter another replay took is left out.
        let mut replaying: Vec<&Replaying> = batch.replaying.iter().collect();
        let mut applied = Applied::default();
        if !replaying.is_empty() {
            let ids: Vec<i64> = replaying.iter().map(|r| r.id).collect();
            let claimed: BTreeSet<i64> = tx
                .query(
                    "SELECT id FROM dead_letters WHERE id = ANY($1) AND replayed_at IS NULL
                     ORDER BY id FOR UPDATE",
                    &[&ids],
                )
                .await
                .context("claiming dead letters to replay")?
                .iter()
                .map(|r| r.get(0))
                .collect();
            applied.taken = replaying.len() - claimed.len();
            replaying.retain(|r| claimed.contains(&r.id));
        }
        let taken: BTreeSet<usize> = batch
            .replaying
            .iter()
            .filter(|r| !replaying.iter().any(|c| c.id == r.id))
            .map(|r| r.index)
            .collect();
        let kept_outcomes: Vec<Outcome>;
        let outcomes: &[Outcome] = if taken.is_empty() {
            batch.outcomes
        } else {
            kept_outcomes = batch
                .outcomes
                .iter()
                .filter(|o| !taken.contains(&o.index))
                .cloned()
                .collect();
            &kept_outcomes
        };

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
        let item_rows = if iu.is_empty() {
            Vec::new()
        } else {
            tx.query(
                "SELECT i.user_id, i.content_id, i.occurred_at, i.event_id, i.shares, i.place, i.tied
                 FROM unnest($2::text[], $3::text[]) AS k(u, c)
                 CROSS JOIN LATERAL (SELECT * FROM content_items i
                     WHERE i.user_id = k.u AND i.source = $1 AND i.content_id = k.c OFFSET 0) i",
                &[&source, &iu, &ic],
            )
            .await
            .context("reading content items")?
        };
        let item_shares: Vec<Value> = item_rows.iter().map(|r| r.get(4)).collect();
        let items = item_rows
            .iter()
            .map(|r| {
                (
                    (r.get(0), r.get(1)),
                    Last {
                        order: Order {
                            occurred_at: r.get(2),
                            event_id: r.get(3),
                            place: r.get::<_, Option<&str>>(5).and_then(Place::parse),
                        },
                        tied: r.get(6),
                    },
                )
            })
            .collect();
        // Where each event was in its topic (a dead letter replayed: where
        // it first was; a backfill's stored events: not known).
        let places = batch
            .messages
            .iter()
            .map(|m| match m.place {
                Some(place) => Place::parse(place),
                None => (m.offset >= 0).then_some(Place {
                    topic: m.topic,
                    partition: m.partition,
                    offset: m.offset,
                    n: 0,
                }),
            })
            .collect();

        let mut snapshot = Snapshot {
            items,
            places,
            backfill: batch.backfill,
            ..Snapshot::default()
        };
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
                    if let Some((award, objective)) = name.split_once('/')
                        && let Some(group) = view.load((user, award, objective, content), share)
                    {
                        group_keys.insert(group);
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
        for (row, share) in member_rows.iter().zip(&member_shares) {
            view.load((row.get(0), row.get(1), row.get(2), row.get(3)), share);
        }
        snapshot.view = view;

        // Additive events already applied (re-delivery adds nothing). Each
        // id once (an event has an outcome per objective), in key order.
        let additive_ids: Vec<&str> = outcomes
            .iter()
            .filter(|o| o.content_id.is_none())
            .map(|o| o.event_id.as_str())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        // A backfill's analytics events count once per award: what matters
        // is whether that award counted them (live, or in an earlier pass).
        let backfill_award = outcomes.first().map(|o| o.award_id.as_str());
        let seen_rows = if additive_ids.is_empty() {
            Vec::new()
        } else if batch.backfill {
            tx.query(
                "SELECT a.event_id FROM unnest($3::text[]) AS k(e)
                 CROSS JOIN LATERAL (SELECT event_id FROM award_events a
                     WHERE a.award_id = $1 AND a.source = $2 AND a.event_id = k.e OFFSET 0) a",
                &[&backfill_award, &source, &additive_ids],
            )
            .await
            .context("reading the award's counted events")?
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
        snapshot.seen_additive = seen_rows.iter().map(|r| r.get(0)).collect();

        // Current counters of every objective that may change, so that
        // each event's arithmetic is checked against the real totals.
        let objective_keys: BTreeSet<ObjectiveKey<'_>> = outcomes
            .iter()
            .filter(|o| !matches!(o.effect, Effect::Held { .. }))
            .map(|o| {
                (
                    o.user_id.as_str(),
                    o.award_id.as_str(),
                    o.objective_id.as_str(),
                )
            })
            .collect();
        let current_rows = if objective_keys.is_empty() {
            Vec::new()
        } else {
            let (mut u, mut a, mut o) = (Vec::new(), Vec::new(), Vec::new());
            for (user, award, objective) in &objective_keys {
                u.push(*user);
                a.push(*award);
                o.push(*objective);
            }
            tx.query(
                "SELECT uo.user_id, uo.award_id, uo.objective_id, uo.counters
                 FROM unnest($1::text[], $2::text[], $3::text[]) AS k(u, a, o)
                 CROSS JOIN LATERAL (SELECT * FROM user_objective uo
                     WHERE uo.user_id = k.u AND uo.award_id = k.a AND uo.objective_id = k.o OFFSET 0) uo",
                &[&u, &a, &o],
            )
            .await
            .context("reading objective counters")?
        };
        snapshot.totals = current_rows
            .iter()
            .map(|r| {
                (
                    (r.get(0), r.get(1), r.get(2)),
                    counters_from(&r.get::<_, Value>(3)),
                )
            })
            .collect();
        for r in &replaying {
            if let Some((award, objective)) = &r.objective {
                snapshot
                    .replaying_holds
                    .insert(r.index, (award.as_str(), objective.as_str()));
            }
        }

        // --- decide ---------------------------------------------------
        let function_texts = decide::function_texts(outcomes);
        let functions_text =
            |o: &Outcome| -> &str { &function_texts[&(Arc::as_ptr(&o.functions) as usize)] };
        let (decision, view) = decide::decide(snapshot, outcomes, &functions_text);

        // --- write ----------------------------------------------------
        applied.changed = decision.changed;
        applied.objectives = decision.totals.len();
        write_items(&tx, &batch, &decision, &view).await?;
        write_totals(&tx, &decision).await?;
        // A backfill's events were applied by ingest before (or will be,
        // past what it had committed): only the award's own record moves.
        if !decision.newly_applied.is_empty() && !batch.backfill {
            let newly_applied: Vec<&str> = decision.newly_applied.iter().copied().collect();
            tx.execute(
                "INSERT INTO applied_events (source, event_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING",
                &[&source, &newly_applied],
            )
            .await
            .context("recording applied events")?;
        }
        let counted: BTreeSet<(&str, &str)> = outcomes
            .iter()
            .filter(|o| o.content_id.is_none())
            .filter(|o| batch.backfill || batch.recorded.contains(&o.award_id))
            .filter(|o| decision.newly_applied.contains(o.event_id.as_str()))
            .map(|o| (o.award_id.as_str(), o.event_id.as_str()))
            .collect();
        if !counted.is_empty() {
            let (a, e): (Vec<&str>, Vec<&str>) = counted.into_iter().unzip();
            tx.execute(
                "INSERT INTO award_events (award_id, source, event_id)
                 SELECT a, $1, e FROM unnest($2::text[], $3::text[]) AS k(a, e) ON CONFLICT DO NOTHING",
                &[&source, &a, &e],
            )
            .await
            .context("recording the events awards counted")?;
        }

        // Dead letters: whole events (from before the database, and those
        // refused here) and holds; for a replay, what became of each.
        let mut letters: Vec<Letter<'_>> = Vec::new();
        let event_ids: HashMap<usize, (&str, &str)> = outcomes
            .iter()
            .map(|o| (o.index, (o.event_id.as_str(), o.user_id.as_str())))
            .collect();
        let mut entries: Vec<LogRow<'_>> = Vec::new();
        for dead in batch.dead.iter().filter(|d| !taken.contains(&d.index)) {
            letters.push(Letter {
                index: dead.index,
                objective: None,
                event_id: dead.event_id.as_deref(),
                user_id: dead.user_id.as_deref(),
                reason: &dead.reason,
            });
            entries.push(LogRow::from_entry_parts(
                dead.event_id.as_deref(),
                dead.user_id.as_deref(),
                &dead.reason,
            ));
        }
        let replay_of: HashMap<usize, &Replaying> =
            replaying.iter().map(|r| (r.index, *r)).collect();
        for (index, reason) in &decision.refused {
            let (event_id, user_id) = event_ids[index];
            letters.push(Letter {
                index: *index,
                objective: None,
                event_id: Some(event_id),
                user_id: Some(user_id),
                reason,
            });
        }
        for hold in &decision.holds {
            let (event_id, user_id) = event_ids[&hold.index];
            letters.push(Letter {
                index: hold.index,
                objective: Some((hold.award_id, hold.objective_id)),
                event_id: Some(event_id),
                user_id: Some(user_id),
                reason: hold.reason,
            });
        }
        // A whole event replayed: its new holds and refusal are rows of
        // their own (or the same row again, if refused again).
        let (refused_again, letters): (Vec<Letter<'_>>, Vec<Letter<'_>>) = letters
            .into_iter()
            .partition(|l| l.objective.is_none() && replay_of.contains_key(&l.index));
        for hold in &decision.holds {
            *applied
                .held
                .entry((hold.award_id.to_string(), hold.objective_id.to_string()))
                .or_default() += 1;
        }
        applied.refused = decision
            .refused
            .iter()
            .filter(|(index, _)| !replay_of.contains_key(index))
            .cloned()
            .collect();
        // In stream order, so ids follow the stream.
        let mut letters = letters;
        letters.sort_by_key(|l| l.index);
        // A backfill's events are not messages: what it holds or refuses is
        // counted by the backfill, which is run again after a fix.
        if !batch.backfill {
            write_letters(&tx, &batch, source, &letters).await?;
        }

        let mut resolved: Vec<i64> = Vec::new();
        let mut still: Vec<(i64, String)> = Vec::new();
        for r in &replaying {
            match (&r.objective, decision.replayed_holds.get(&r.index)) {
                (Some(_), Some(HoldReplay::Held(reason))) => still.push((r.id, reason.clone())),
                (Some(_), _) => resolved.push(r.id),
                (None, _) => match refused_again.iter().find(|l| l.index == r.index) {
                    Some(letter) => still.push((r.id, letter.reason.to_string())),
                    None => resolved.push(r.id),
                },
            }
        }
        applied.resolved = resolved.len();
        applied.still_held = still.len();
        if !resolved.is_empty() {
            tx.execute(
                "UPDATE dead_letters SET replayed_at = now(), attempts = attempts + 1 WHERE id = ANY($1)",
                &[&resolved],
            )
            .await
            .context("marking dead letters replayed")?;
        }
        if !still.is_empty() {
            let (ids, reasons): (Vec<i64>, Vec<String>) = still
                .into_iter()
                .map(|(id, reason)| (id, storable(&reason, MAX_REASON_BYTES).into_owned()))
                .unzip();
            tx.execute(
                "UPDATE dead_letters d SET reason = k.r, attempts = d.attempts + 1
                 FROM unnest($1::bigint[], $2::text[]) AS k(id, r) WHERE d.id = k.id",
                &[&ids, &reasons],
            )
            .await
            .context("recording why dead letters still fail")?;
        }

        entries.extend(decision.log);
        entries.extend(
            batch
                .log
                .iter()
                .filter(|e| !taken.contains(&e.index))
                .map(LogRow::from_entry),
        );
        write_log(&tx, source, &entries).await?;
        tx.commit().await.context("committing a batch")?;
        Ok(applied)
    }
}

/// A reason as stored: printable, bounded.
pub(super) fn storable_reason(text: &str) -> std::borrow::Cow<'_, str> {
    storable(text, MAX_REASON_BYTES)
}

/// A row of `dead_letters` to write.
struct Letter<'a> {
    index: usize,
    /// (award, objective) of a hold; `None`: the whole event.
    objective: Option<(&'a str, &'a str)>,
    event_id: Option<&'a str>,
    user_id: Option<&'a str>,
    reason: &'a str,
}

async fn write_letters(
    tx: &tokio_postgres::Transaction<'_>,
    batch: &Batch<'_>,
    source: &str,
    letters: &[Letter<'_>],
) -> Result<(), StoreError> {
    if letters.is_empty() {
        return Ok(());
    }
    let mut topic = Vec::with_capacity(letters.len());
    let mut partition: Vec<i32> = Vec::with_capacity(letters.len());
    let mut offset: Vec<i64> = Vec::with_capacity(letters.len());
    let mut key: Vec<Option<&[u8]>> = Vec::with_capacity(letters.len());
    let mut value: Vec<Option<&[u8]>> = Vec::with_capacity(letters.len());
    let mut award: Vec<Option<&str>> = Vec::with_capacity(letters.len());
    let mut objective: Vec<Option<&str>> = Vec::with_capacity(letters.len());
    let mut event_id: Vec<Option<String>> = Vec::with_capacity(letters.len());
    let mut user_id: Vec<Option<String>> = Vec::with_capacity(letters.len());
    let mut reason: Vec<String> = Vec::with_capacity(letters.len());
    let mut place: Vec<Option<&str>> = Vec::with_capacity(letters.len());
    for letter in letters {
        let message = batch
            .messages
            .get(letter.index)
            .copied()
            .unwrap_or(Message {
                topic: "",
                partition: -1,
                offset: -1,
                key: None,
                value: None,
                place: None,
            });
        topic.push(message.topic);
        place.push(message.place);
        partition.push(message.partition);
        offset.push(message.offset);
        key.push(message.key);
        value.push(message.value);
        award.push(letter.objective.map(|o| o.0));
        objective.push(letter.objective.map(|o| o.1));
        event_id.push(
            letter
                .event_id
                .map(|t| storable(t, MAX_ID_BYTES).into_owned()),
        );
        user_id.push(
            letter
                .user_id
                .map(|t| storable(t, MAX_ID_BYTES).into_owned()),
        );
        reason.push(storable(letter.reason, MAX_REASON_BYTES).into_owned());
    }
    tx.execute(
        "INSERT INTO dead_letters (source, topic, partition, \"offset\", key, value, award_id, objective_id, event_id, user_id, reason, place)
         SELECT $1, * FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bytea[], $6::bytea[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[])
         ON CONFLICT DO NOTHING",
        &[&source, &topic, &partition, &offset, &key, &value, &award, &objective, &event_id, &user_id, &reason, &place],
    )
    .await
    .context("keeping dead letters")?;
    Ok(())
}

/// An item's last event and, where it moved, the event's bytes.
type ItemWrite<'a, 'b> = (&'b Last<'a>, Option<&'a [u8]>);

async fn write_items(
    tx: &tokio_postgres::Transaction<'_>,
    batch: &Batch<'_>,
    decision: &Decision<'_>,
    view: &Contributions<'_>,
) -> Result<(), StoreError> {
    let source = batch.source;
    if decision.items.is_empty() && decision.reshared.is_empty() && view.rekeyed.is_empty() {
        return Ok(());
    }
    if !decision.items.is_empty() || !decision.reshared.is_empty() {
        // Each item written: its last event's order and, where it moved, the
        // event as it came (what a backfill evaluates again).
        let mut rows: BTreeMap<(&str, &str), ItemWrite<'_, '_>> = decision
            .reshared
            .iter()
            .map(|(k, last)| (*k, (last, None)))
            .collect();
        for (k, last) in &decision.items {
            let body = decision
                .item_events
                .get(k)
                .and_then(|i| batch.messages.get(*i))
                .and_then(|m| m.value);
            rows.insert(*k, (last, body));
        }
        // shares = {"<award>/<objective>": {"c": counters, "k": dedup key}}
        let mut shares: BTreeMap<(&str, &str), ObjectWriter> =
            rows.keys().map(|k| (*k, ObjectWriter::new())).collect();
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
        let (u, c): (Vec<&str>, Vec<&str>) = rows.keys().copied().unzip();
        let at: Vec<DateTime<Utc>> = rows.values().map(|(l, _)| l.order.occurred_at).collect();
        let event: Vec<&str> = rows.values().map(|(l, _)| l.order.event_id).collect();
        let place: Vec<Option<String>> = rows
            .values()
            .map(|(l, _)| l.order.place.map(|p| p.text()))
            .collect();
        // A text[][] cannot be ragged: each item's ids as one JSON array.
        let tied: Vec<String> = rows
            .values()
            .map(|(l, _)| serde_json::to_string(&l.tied).unwrap_or_else(|_| "[]".into()))
            .collect();
        let tied: Vec<JsonText<'_>> = tied.iter().map(|t| JsonText(t)).collect();
        let body: Vec<Option<&[u8]>> = rows.values().map(|(_, b)| *b).collect();
        let shares: Vec<String> = shares.into_values().map(ObjectWriter::finish).collect();
        let shares: Vec<JsonText<'_>> = shares.iter().map(|s| JsonText(s)).collect();
        // An item whose order did not move keeps the event it has.
        tx.execute(
            "INSERT INTO content_items (user_id, source, content_id, occurred_at, event_id, shares, event, place, tied)
             SELECT u, $1, c, t, e, s, b, p,
                    ARRAY(SELECT jsonb_array_elements_text(d))
             FROM unnest($2::text[], $3::text[], $4::timestamptz[], $5::text[], $6::jsonb[], $7::bytea[], $8::text[], $9::jsonb[])
                 AS k(u, c, t, e, s, b, p, d)
             ON CONFLICT (user_id, source, content_id) DO UPDATE SET
                 shares = EXCLUDED.shares,
                 event = CASE WHEN (content_items.occurred_at, content_items.event_id) = (EXCLUDED.occurred_at, EXCLUDED.event_id)
                              THEN content_items.event ELSE EXCLUDED.event END,
                 occurred_at = EXCLUDED.occurred_at, event_id = EXCLUDED.event_id,
                 place = EXCLUDED.place, tied = EXCLUDED.tied",
            &[&source, &u, &c, &at, &event, &shares, &body, &place, &tied],
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
            tx.execute(sql, &[&source, &u, &a, &o, &d, &c])
                .await
                .context(context)?;
        }
    }
    Ok(())
}

/// Each changed objective's new counters, written whole: the per-user
/// locks make the read-modify-write safe.
async fn write_totals(
    tx: &tokio_postgres::Transaction<'_>,
    decision: &Decision<'_>,
) -> Result<(), StoreError> {
    if decision.totals.is_empty() {
        return Ok(());
    }
    let (mut u, mut a, mut o) = (Vec::new(), Vec::new(), Vec::new());
    for (user, award, objective) in decision.totals.keys() {
        u.push(*user);
        a.push(*award);
        o.push(*objective);
    }
    // A counter back at zero is left out: the same as absent, and the
    // same whatever the batches were.
    let totals: Vec<String> = decision
        .totals
        .values()
        .map(|total| counters_text(&decide::nonzero(total.clone())))
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
    Ok(())
}

async fn write_log(
    tx: &tokio_postgres::Transaction<'_>,
    source: &str,
    rows: &[LogRow<'_>],
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let event: Vec<Option<&str>> = rows.iter().map(|r| r.event_id.as_deref()).collect();
    let user: Vec<Option<&str>> = rows.iter().map(|r| r.user_id.as_deref()).collect();
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
    let excluded: Vec<Option<JsonText<'_>>> = rows
        .iter()
        .map(|r| r.excluded.as_deref().map(JsonText))
        .collect();
    tx.execute(
        "INSERT INTO processing_log (source, event_id, user_id, award_id, objective_id, outcome, reason, deltas, functions, excluded)
         SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::jsonb[], $9::jsonb[], $10::jsonb[])",
        &[&source, &event, &user, &award, &objective, &outcome, &reason, &deltas, &functions, &excluded],
    )
    .await
    .context("writing the processing log")?;
    Ok(())
}

impl Store {
    /// Which of `user_ids` (repeats allowed) are banned or deleted, with
    /// their state: the users who get no progress.
    pub async fn excluded_users<'a>(
        &self,
        user_ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<HashMap<String, String>, StoreError> {
        let user_ids: Vec<&str> = user_ids
            .into_iter()
            .collect::<std::collections::HashSet<_>>()
            .into_iter()
            .collect();
        if user_ids.is_empty() {
            return Ok(HashMap::new());
        }
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
        // Kept as long: a backfill reads no analytics older than that.
        let counted = self
            .client()
            .execute(
                "DELETE FROM award_events WHERE (award_id, source, event_id) IN (
                     SELECT award_id, source, event_id FROM award_events
                     WHERE applied_at < now() - make_interval(days => $1) LIMIT $2)",
                &[&applied_days, &limit],
            )
            .await
            .context("pruning the events awards counted")?;
        // Dead letters, replayed or not: the dead-letter topic's retention
        // is the longer record.
        let letters = self
            .client()
            .execute(
                "DELETE FROM dead_letters WHERE id IN (
                     SELECT id FROM dead_letters WHERE dead_at < now() - make_interval(days => $1) LIMIT $2)",
                &[&log_days, &limit],
            )
            .await
            .context("pruning dead letters")?;
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
        Ok(log + applied + counted + letters + notifications)
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
