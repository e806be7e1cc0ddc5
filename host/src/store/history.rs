//! Backfills from history (`history_backfills`): an award's objectives
//! evaluated over the content items Laurel already stores, each with the
//! last event applied to it. A row per award holds where the walk is (the
//! items' key order), what it did, and a lease: one worker at a time takes
//! its steps, and another takes over when the lease lapses. A step that
//! was applied but not recorded is done again, which changes nothing
//! (contributions are absolute).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{QueryContext, Store, StoreError};

/// A backfill from history, as it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryBackfill {
    pub award_id: String,
    pub award_version: i32,
    pub sources: Vec<String>,
    /// The last item done: (user, source, content).
    pub after: (String, String, String),
    /// Items of its sources when it started.
    pub total: i64,
    pub done: i64,
    pub changed: i64,
    pub unrecoverable: i64,
    pub failed: i64,
    pub last_failure: Option<String>,
    /// The analytics phase: per `<source>/<partition>`, the next offset to
    /// read and the end (what ingest had committed); None until the items
    /// are walked.
    pub positions: Option<BTreeMap<String, (i64, i64)>>,
    pub events_total: i64,
    pub events_done: i64,
    /// Analytics events counted for the first time.
    pub events_applied: i64,
    /// The oldest retained message read (analytics before it are past
    /// Kafka's retention), and whether every partition still held its
    /// first message.
    pub events_from: Option<DateTime<Utc>>,
    pub from_start: bool,
    /// Why no analytics were read, if they were not.
    pub events_note: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The token of the claim that holds its lease, if one was taken:
    /// steps and the release are recorded only with it.
    pub lease_owner: Option<String>,
}

/// A claimed backfill's lease: which run of which award, under which
/// claim's token.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    pub award_id: String,
    pub started_at: DateTime<Utc>,
    pub owner: String,
}

impl HistoryBackfill {
    /// Its lease as its claim took it (one never claimed has no token, and
    /// records nothing).
    pub fn lease(&self) -> Lease {
        Lease {
            award_id: self.award_id.clone(),
            started_at: self.started_at,
            owner: self.lease_owner.clone().unwrap_or_default(),
        }
    }

    /// Percent done: of the items there were at the start, then of the
    /// retained events (items added since are walked too, so it holds at
    /// 99.9 until it ends).
    pub fn percent(&self) -> f64 {
        let total = self.total + self.events_total;
        if self.finished_at.is_some() || total == 0 {
            return 100.0;
        }
        ((self.done.min(self.total) + self.events_done) as f64 * 100.0 / total as f64).min(99.9)
    }
}

/// A stored content item, for a backfill.
#[derive(Debug, Clone)]
pub struct StoredItem {
    pub user_id: String,
    pub source: String,
    pub content_id: String,
    /// The last event applied to it, as it came; None for an item applied
    /// before events were kept.
    pub event: Option<Vec<u8>>,
}

/// A row of (user_id, source, content_id, event) from content_items.
fn stored_item(r: &tokio_postgres::Row) -> StoredItem {
    StoredItem {
        user_id: r.get(0),
        source: r.get(1),
        content_id: r.get(2),
        event: r.get(3),
    }
}

/// What one step did, to add to its backfill's row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryStep {
    pub done: i64,
    pub changed: i64,
    pub unrecoverable: i64,
    pub failed: i64,
    pub last_failure: Option<String>,
}

const COLUMNS: &str = "award_id, award_version, sources, next_user, next_source, next_content,
     total, done, changed, unrecoverable, failed, last_failure, started_at, finished_at,
     positions, events_total, events_done, events_applied, events_from, from_start, events_note,
     lease_owner";

fn backfill_from(row: &tokio_postgres::Row) -> HistoryBackfill {
    HistoryBackfill {
        award_id: row.get(0),
        award_version: row.get(1),
        sources: row.get(2),
        after: (row.get(3), row.get(4), row.get(5)),
        total: row.get(6),
        done: row.get(7),
        changed: row.get(8),
        unrecoverable: row.get(9),
        failed: row.get(10),
        last_failure: row.get(11),
        started_at: row.get(12),
        finished_at: row.get(13),
        positions: row
            .get::<_, Option<Value>>(14)
            .map(|v| serde_json::from_value::<BTreeMap<String, (i64, i64)>>(v).unwrap_or_default()),
        events_total: row.get(15),
        events_done: row.get(16),
        events_applied: row.get(17),
        events_from: row.get(18),
        from_start: row.get(19),
        events_note: row.get(20),
        lease_owner: row.get(21),
    }
}

/// What one step of the analytics phase did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventsStep {
    /// The partition read (`<source>/<partition>`) and its next offset.
    pub position: Option<(String, i64)>,
    /// Messages read (whatever became of them).
    pub done: i64,
    pub applied: i64,
    pub failed: i64,
    pub last_failure: Option<String>,
    /// The oldest message's time among those read.
    pub oldest: Option<DateTime<Utc>>,
}

impl Store {
    /// Starts (or starts over) the backfill of `award_id` at `version`
    /// over the items of `sources`. None if there is no such award.
    pub async fn request_history_backfill(
        &self,
        award_id: &str,
        version: i32,
        sources: &[String],
    ) -> Result<Option<HistoryBackfill>, StoreError> {
        let row = self
            .client()
            .query_opt(
                &format!(
                    "INSERT INTO history_backfills (award_id, award_version, sources, total)
                     SELECT id, $2, $3, (SELECT count(*) FROM content_items WHERE source = ANY($3))
                     FROM awards WHERE id = $1
                     ON CONFLICT (award_id) DO UPDATE SET award_version = EXCLUDED.award_version,
                         sources = EXCLUDED.sources, total = EXCLUDED.total,
                         next_user = '', next_source = '', next_content = '',
                         done = 0, changed = 0, unrecoverable = 0, failed = 0, last_failure = NULL,
                         positions = NULL, events_total = 0, events_done = 0, events_applied = 0,
                         events_from = NULL, from_start = true, events_note = NULL,
                         lease_until = NULL, lease_owner = NULL, started_at = now(), finished_at = NULL
                     RETURNING {COLUMNS}"
                ),
                &[&award_id, &version, &sources],
            )
            .await
            .context("requesting a backfill from history")?;
        Ok(row.as_ref().map(backfill_from))
    }

    /// Takes the lease of an unfinished backfill (`award_id`'s, or the
    /// oldest) that no one holds, for `lease`, under a new token
    /// ([`HistoryBackfill::lease_owner`]).
    pub async fn claim_history_backfill(
        &self,
        award_id: Option<&str>,
        lease: Duration,
    ) -> Result<Option<HistoryBackfill>, StoreError> {
        let seconds = lease.as_secs_f64();
        let row = self
            .client()
            .query_opt(
                &format!(
                    "UPDATE history_backfills SET lease_until = now() + make_interval(secs => $2),
                         lease_owner = gen_random_uuid()::text
                     WHERE award_id = (
                         SELECT award_id FROM history_backfills
                         WHERE finished_at IS NULL AND ($1::text IS NULL OR award_id = $1)
                           AND (lease_until IS NULL OR lease_until < now())
                         ORDER BY started_at LIMIT 1 FOR UPDATE SKIP LOCKED)
                     RETURNING {COLUMNS}"
                ),
                &[&award_id, &seconds],
            )
            .await
            .context("claiming a backfill from history")?;
        Ok(row.as_ref().map(backfill_from))
    }

    /// The next `limit` items of `sources` after `after`, in key order.
    pub async fn history_items(
        &mut self,
        sources: &[String],
        after: &(String, String, String),
        limit: i64,
    ) -> Result<Vec<StoredItem>, StoreError> {
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting to read stored items")?;
        // Down the primary key in its order, whatever the statistics say:
        // with stale ones (a young, growing table) the planner chose a
        // bitmap scan of every item past `after` and a sort, 0.5-1.7 s a
        // step over a million items.
        tx.batch_execute("SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off")
            .await
            .context("reading stored items")?;
        let rows = tx
            .query(
                "SELECT user_id, source, content_id, event FROM content_items
                 WHERE (user_id, source, content_id) > ($2, $3, $4) AND source = ANY($1)
                 ORDER BY user_id, source, content_id LIMIT $5",
                &[&sources, &after.0, &after.1, &after.2, &limit],
            )
            .await
            .context("reading stored content items")?;
        tx.commit().await.context("reading stored items")?;
        Ok(rows.iter().map(stored_item).collect())
    }

    /// Up to `limit` stored items of `sources` that keep their last event,
    /// in key order: what a diff compares besides Kafka's window. When the
    /// limit cuts, the last user's items are left out, so that every user
    /// read is whole (unless there is only one). True with them when the
    /// limit cut.
    pub async fn item_events(
        &self,
        sources: &[String],
        limit: i64,
    ) -> Result<(Vec<StoredItem>, bool), StoreError> {
        if limit <= 0 || sources.is_empty() {
            return Ok((Vec::new(), false));
        }
        let rows = self
            .client()
            .query(
                "SELECT user_id, source, content_id, event FROM content_items
                 WHERE source = ANY($1) AND event IS NOT NULL
                 ORDER BY user_id, source, content_id LIMIT $2",
                &[&sources, &limit],
            )
            .await
            .context("reading stored content items")?;
        let mut items: Vec<StoredItem> = rows.iter().map(stored_item).collect();
        let cut = items.len() as i64 == limit;
        if cut
            && let Some(last) = items.last().map(|i| i.user_id.clone())
            && items.iter().any(|i| i.user_id != last)
        {
            items.retain(|i| i.user_id != last);
        }
        Ok((items, cut))
    }

    /// Starts the analytics phase: the offsets to read per partition (or
    /// why none are read), whether every partition still holds its first
    /// message. False when the lease was lost.
    pub async fn start_history_events(
        &self,
        lease: &Lease,
        positions: &BTreeMap<String, (i64, i64)>,
        from_start: bool,
        note: Option<&str>,
    ) -> Result<bool, StoreError> {
        let total: i64 = positions.values().map(|(next, end)| end - next).sum();
        let json = serde_json::to_value(positions).unwrap_or_default();
        let n = self
            .client()
            .execute(
                "UPDATE history_backfills SET positions = $3, events_total = $4, from_start = $5, events_note = $6
                 WHERE award_id = $1 AND started_at = $2 AND finished_at IS NULL AND lease_owner = $7",
                &[
                    &lease.award_id,
                    &lease.started_at,
                    &json,
                    &total,
                    &from_start,
                    &note,
                    &lease.owner,
                ],
            )
            .await
            .context("starting a backfill's analytics phase")?;
        Ok(n == 1)
    }

    /// Records a step of the analytics phase (as [`Store::record_history_step`]
    /// does for items).
    pub async fn record_events_step(
        &self,
        lease: &Lease,
        step: &EventsStep,
        finished: bool,
        renew_for: Duration,
    ) -> Result<bool, StoreError> {
        let seconds = renew_for.as_secs_f64();
        let (key, next) = step.position.clone().unwrap_or_default();
        let n = self
            .client()
            .execute(
                "UPDATE history_backfills SET
                     positions = CASE WHEN $3 = '' THEN positions
                                 ELSE jsonb_set(positions, ARRAY[$3], jsonb_build_array($4::bigint, positions -> $3 -> 1)) END,
                     events_done = events_done + $5, events_applied = events_applied + $6,
                     failed = failed + $7, last_failure = coalesce($8, last_failure),
                     events_from = least(events_from, $9),
                     lease_until = CASE WHEN $10 THEN NULL ELSE now() + make_interval(secs => $11) END,
                     finished_at = CASE WHEN $10 THEN now() END
                 WHERE award_id = $1 AND started_at = $2 AND finished_at IS NULL AND lease_owner = $12",
                &[
                    &lease.award_id,
                    &lease.started_at,
                    &key,
                    &next,
                    &step.done,
                    &step.applied,
                    &step.failed,
                    &step.last_failure,
                    &step.oldest,
                    &finished,
                    &seconds,
                    &lease.owner,
                ],
            )
            .await
            .context("recording a backfill's analytics step")?;
        Ok(n == 1)
    }

    /// Records a step: the walk moves to `after`, the counts grow, the
    /// lease is renewed (or the backfill finished). False when the lease
    /// was lost (another worker took over, or the backfill was started
    /// over): the caller stops.
    pub async fn record_history_step(
        &self,
        lease: &Lease,
        after: &(String, String, String),
        step: &HistoryStep,
        finished: bool,
        renew_for: Duration,
    ) -> Result<bool, StoreError> {
        let seconds = renew_for.as_secs_f64();
        let n = self
            .client()
            .execute(
                "UPDATE history_backfills SET next_user = $3, next_source = $4, next_content = $5,
                     done = done + $6, changed = changed + $7, unrecoverable = unrecoverable + $8,
                     failed = failed + $9, last_failure = coalesce($10, last_failure),
                     lease_until = CASE WHEN $11 THEN NULL ELSE now() + make_interval(secs => $12) END,
                     finished_at = CASE WHEN $11 THEN now() END
                 WHERE award_id = $1 AND started_at = $2 AND finished_at IS NULL AND lease_owner = $13",
                &[
                    &lease.award_id,
                    &lease.started_at,
                    &after.0,
                    &after.1,
                    &after.2,
                    &step.done,
                    &step.changed,
                    &step.unrecoverable,
                    &step.failed,
                    &step.last_failure,
                    &finished,
                    &seconds,
                    &lease.owner,
                ],
            )
            .await
            .context("recording a backfill step")?;
        Ok(n == 1)
    }

    /// Gives the lease back (a worker stopping mid-way), if it still holds
    /// it: one taken over since stays with its new holder.
    pub async fn release_history_backfill(&self, lease: &Lease) -> Result<(), StoreError> {
        self.client()
            .execute(
                "UPDATE history_backfills SET lease_until = NULL, lease_owner = NULL
                 WHERE award_id = $1 AND started_at = $2 AND lease_owner = $3",
                &[&lease.award_id, &lease.started_at, &lease.owner],
            )
            .await
            .context("releasing a backfill")?;
        Ok(())
    }

    /// One award's backfill from history, if it ever had one.
    pub async fn history_backfill(
        &self,
        award_id: &str,
    ) -> Result<Option<HistoryBackfill>, StoreError> {
        let row = self
            .client()
            .query_opt(
                &format!("SELECT {COLUMNS} FROM history_backfills WHERE award_id = $1"),
                &[&award_id],
            )
            .await
            .context("reading a backfill from history")?;
        Ok(row.as_ref().map(backfill_from))
    }

    /// Every backfill from history, newest first.
    pub async fn history_backfills(&self) -> Result<Vec<HistoryBackfill>, StoreError> {
        let rows = self
            .client()
            .query(
                &format!("SELECT {COLUMNS} FROM history_backfills ORDER BY started_at DESC"),
                &[],
            )
            .await
            .context("reading backfills from history")?;
        Ok(rows.iter().map(backfill_from).collect())
    }
}
