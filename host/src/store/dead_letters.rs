//! Dead letters kept for replay (`dead_letters`): listing them, reading
//! them back for a replay, and what an award's objectives hold. Written by
//! ingest in each batch's transaction (`counters.rs`).

use chrono::{DateTime, Utc};

use super::{QueryContext, Store, StoreError};

/// A dead letter as an operator lists it.
#[derive(Debug, Clone)]
pub struct DeadLetterRow {
    pub id: i64,
    pub source: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The objective an event is held for (`award/objective`); `None`: the
    /// whole event was dead-lettered.
    pub award_id: Option<String>,
    pub objective_id: Option<String>,
    pub event_id: Option<String>,
    pub user_id: Option<String>,
    pub reason: String,
    pub attempts: i32,
    pub dead_at: DateTime<Utc>,
    pub replayed_at: Option<DateTime<Utc>>,
    /// The message's value (as text where it is UTF-8), up to a preview.
    pub value_preview: Option<String>,
    pub value_bytes: Option<i32>,
}

/// A dead letter with its message, for a replay.
#[derive(Debug, Clone)]
pub struct StoredLetter {
    pub id: i64,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub award_id: Option<String>,
    pub objective_id: Option<String>,
    pub reason: String,
    /// Where the event first was, if not at its topic, partition and
    /// offset (`Message::place`).
    pub place: Option<String>,
}

/// Which dead letters a replay takes.
#[derive(Debug, Clone, Default)]
pub struct LetterFilter {
    /// Only those dead-lettered at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only those whose reason contains this text.
    pub reason: Option<String>,
}

/// What an objective of an award holds for replay.
#[derive(Debug, Clone)]
pub struct HeldObjective {
    pub objective_id: String,
    pub events: i64,
    pub last_reason: String,
    pub last_at: DateTime<Utc>,
}

const PREVIEW_BYTES: i32 = 1024;

impl Store {
    /// A source's dead letters, newest first: open ones only unless
    /// `all`; at most `limit`, older than `before` (an id) if given.
    pub async fn dead_letters(
        &self,
        source: &str,
        all: bool,
        limit: i64,
        before: Option<i64>,
    ) -> Result<Vec<DeadLetterRow>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT id, source, topic, partition, \"offset\", award_id, objective_id, event_id, user_id,
                        reason, attempts, dead_at, replayed_at,
                        substring(value FROM 1 FOR $4), octet_length(value)
                 FROM dead_letters
                 WHERE source = $1 AND ($2 OR replayed_at IS NULL) AND id < coalesce($5, 9223372036854775807)
                 ORDER BY id DESC LIMIT $3",
                &[&source, &all, &limit, &PREVIEW_BYTES, &before],
            )
            .await
            .context("listing dead letters")?;
        Ok(rows
            .iter()
            .map(|r| DeadLetterRow {
                id: r.get(0),
                source: r.get(1),
                topic: r.get(2),
                partition: r.get(3),
                offset: r.get(4),
                award_id: r.get(5),
                objective_id: r.get(6),
                event_id: r.get(7),
                user_id: r.get(8),
                reason: r.get(9),
                attempts: r.get(10),
                dead_at: r.get(11),
                replayed_at: r.get(12),
                value_preview: r
                    .get::<_, Option<Vec<u8>>>(13)
                    .map(|v| String::from_utf8_lossy(&v).into_owned()),
                value_bytes: r.get(14),
            })
            .collect())
    }

    /// Open dead letters of a source after `after` (an id), oldest first,
    /// with their messages.
    /// How many open dead letters of `source` a replay with `filter` takes.
    pub async fn count_letters_to_replay(
        &self,
        source: &str,
        filter: &LetterFilter,
    ) -> Result<u64, StoreError> {
        let row = self
            .client()
            .query_one(
                "SELECT count(*) FROM dead_letters
                 WHERE source = $1 AND replayed_at IS NULL
                   AND ($2::timestamptz IS NULL OR dead_at >= $2)
                   AND ($3::text IS NULL OR strpos(reason, $3) > 0)",
                &[&source, &filter.since, &filter.reason],
            )
            .await
            .context("counting dead letters to replay")?;
        Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
    }

    pub async fn letters_to_replay(
        &self,
        source: &str,
        filter: &LetterFilter,
        after: i64,
        limit: i64,
    ) -> Result<Vec<StoredLetter>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT id, topic, partition, \"offset\", key, value, award_id, objective_id, reason, place
                 FROM dead_letters
                 WHERE source = $1 AND replayed_at IS NULL AND id > $2
                   AND ($3::timestamptz IS NULL OR dead_at >= $3)
                   AND ($4::text IS NULL OR strpos(reason, $4) > 0)
                 ORDER BY id LIMIT $5",
                &[&source, &after, &filter.since, &filter.reason, &limit],
            )
            .await
            .context("reading dead letters to replay")?;
        Ok(rows
            .iter()
            .map(|r| StoredLetter {
                id: r.get(0),
                topic: r.get(1),
                partition: r.get(2),
                offset: r.get(3),
                key: r.get(4),
                value: r.get(5),
                award_id: r.get(6),
                objective_id: r.get(7),
                reason: r.get(8),
                place: r.get(9),
            })
            .collect())
    }

    /// A replayed dead letter that still cannot be used: why, now.
    pub async fn dead_letter_failed_again(&self, id: i64, reason: &str) -> Result<(), StoreError> {
        let reason = super::counters::storable_reason(reason);
        self.client()
            .execute(
                "UPDATE dead_letters SET reason = $2, attempts = attempts + 1 WHERE id = $1",
                &[&id, &reason.as_ref()],
            )
            .await
            .context("recording why a dead letter still fails")?;
        Ok(())
    }

    /// What each objective of an award holds for replay.
    pub async fn held_objectives(&self, award_id: &str) -> Result<Vec<HeldObjective>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT objective_id, count(*),
                        (array_agg(reason ORDER BY id DESC))[1], max(dead_at)
                 FROM dead_letters WHERE award_id = $1 AND replayed_at IS NULL
                 GROUP BY objective_id ORDER BY objective_id",
                &[&award_id],
            )
            .await
            .context("reading an award's held events")?;
        Ok(rows
            .iter()
            .map(|r| HeldObjective {
                objective_id: r.get(0),
                events: r.get(1),
                last_reason: r.get(2),
                last_at: r.get(3),
            })
            .collect())
    }
}
