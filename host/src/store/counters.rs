//! Applying a batch of rule outcomes to per-user objective counters, in one
//! transaction, exactly once: read what the batch touches (`read.rs`),
//! decide (pure, `decide.rs`, where the rules and their unit tests are),
//! write (`write.rs`).
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

mod contributions;
mod decide;
mod keys;
mod log;
mod order;
mod read;
mod write;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{QueryContext, Store, StoreError};
pub(crate) use contributions::counters_from;
use decide::Snapshot;
use log::{FunctionTexts, MAX_REASON_BYTES, storable};
use order::Place;

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

impl Store {
    /// Applies a batch in one transaction: its outcomes, log entries,
    /// dead letters and holds; for a replay, marks the dead letters it
    /// resolved. Read, decide (pure), write.
    pub async fn apply_batch(&mut self, batch: Batch<'_>) -> Result<Applied, StoreError> {
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting a batch")?;

        // Replays first: a dead letter another replay took is left out.
        let claim = read::Claim::of(&tx, &batch).await?;
        let outcomes = claim.outcomes(&batch);
        read::lock_users(&tx, &outcomes).await?;
        let items = read::Items::read(&tx, batch.source, &outcomes).await?;
        let mut view = items.contributions();
        // ... and every member of the de-duplication groups involved.
        let members = read::Members::read(&tx, &read::groups(&outcomes, &view)).await?;
        members.load_into(&mut view);
        let seen = read::seen_additive(&tx, &batch, &outcomes).await?;
        let totals = read::totals(&tx, &outcomes).await?;
        let snapshot = Snapshot {
            items: items.lasts(),
            places: read::places(&batch),
            view,
            seen_additive: seen.keys(),
            additive_horizon: seen.horizon,
            totals: read::totals_of(&totals),
            replaying_holds: claim.holds(),
            backfill: batch.backfill,
        };

        let texts = FunctionTexts::of(&outcomes);
        let (decision, view) = decide::decide(snapshot, &outcomes, &|o| texts.get(o));

        let applied = write::batch(&tx, &batch, &outcomes, &claim, decision, &view).await?;
        tx.commit().await.context("committing a batch")?;
        Ok(applied)
    }
}

/// A reason as stored: printable, bounded.
pub(super) fn storable_reason(text: &str) -> std::borrow::Cow<'_, str> {
    storable(text, MAX_REASON_BYTES)
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

    /// Prunes a record of applied analytics ids (`applied_events`,
    /// `award_events`) of rows older than `days`. If there are any, its
    /// horizon is raised to that age first (waiting for the batches that
    /// read the old one, which hold it locked), then the rows under it go:
    /// a batch either read the old horizon and finished before, or reads
    /// the new one and refuses the events whose ids may have gone. Where
    /// nothing was ever pruned, nothing is refused.
    async fn prune_ids(
        &self,
        table: &str,
        key: &str,
        days: i32,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let raised = self
            .client()
            .query_opt(
                &format!(
                    "UPDATE prune_horizons SET horizon = greatest(horizon, now() - make_interval(days => $1))
                     WHERE name = $2
                       AND EXISTS (SELECT 1 FROM {table} WHERE applied_at < now() - make_interval(days => $1))
                     RETURNING horizon"
                ),
                &[&days, &table],
            )
            .await
            .context("raising the horizon of applied analytics ids")?;
        let Some(raised) = raised else {
            return Ok(0);
        };
        let horizon: DateTime<Utc> = raised.get(0);
        let pruned = self
            .client()
            .execute(
                &format!(
                    "DELETE FROM {table} WHERE ({key}) IN (
                         SELECT {key} FROM {table} WHERE applied_at < $1 LIMIT $2)"
                ),
                &[&horizon, &limit],
            )
            .await
            .context("pruning applied analytics ids")?;
        Ok(pruned)
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
            .prune_ids(
                "applied_events",
                "source, event_id, user_id",
                applied_days,
                limit,
            )
            .await?;
        // Kept as long: a backfill reads no analytics older than that.
        let counted = self
            .prune_ids(
                "award_events",
                "award_id, source, event_id, user_id",
                applied_days,
                limit,
            )
            .await?;
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
