//! What support reads about one user: their state and processing log.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{QueryContext, Store, StoreError};

/// One processing-log entry as stored.
#[derive(Debug, Clone)]
pub struct LogRecord {
    pub id: i64,
    pub logged_at: DateTime<Utc>,
    pub source: String,
    pub event_id: Option<String>,
    pub award_id: Option<String>,
    pub objective_id: Option<String>,
    /// `applied`, `skipped` or `rejected`.
    pub outcome: String,
    pub reason: Option<String>,
    /// `{award: {objective: {counter: delta}}}` for an applied event.
    pub deltas: Option<Value>,
    /// The function versions that decided, `{award: {objective: [..]}}`.
    pub functions: Option<Value>,
    /// For an applied event whose content item a filter now stops (where
    /// that moved counters): `{award: {objective: filter}}`.
    pub excluded: Option<Value>,
}

impl LogRecord {
    /// The filter that took this event's content item out of an
    /// objective, if one did.
    pub fn excluded_by(&self, award_id: &str, objective_id: &str) -> Option<&str> {
        self.excluded
            .as_ref()?
            .get(award_id)?
            .get(objective_id)?
            .as_str()
    }

    /// Every (award, objective, filter) this event's item was taken out of.
    pub fn exclusions(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.excluded
            .as_ref()
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(award, objectives)| Some((award, objectives.as_object()?)))
            .flat_map(|(award, objectives)| {
                objectives
                    .iter()
                    .filter_map(move |(o, f)| Some((award.as_str(), o.as_str(), f.as_str()?)))
            })
    }
}

/// A content item of a user, as explain reads it.
#[derive(Debug, Clone)]
pub struct ItemRow {
    pub source: String,
    pub content_id: String,
    pub occurred_at: DateTime<Utc>,
    /// The last event applied to the item.
    pub event_id: String,
    /// What it contributes to the objective asked about (empty for an
    /// item that contributes nothing).
    pub counters: super::Counters,
    /// Items with the same key count once between them.
    pub dedup_key: Option<String>,
}

const LOG_COLUMNS: &str = "id, logged_at, source, event_id, award_id, objective_id, outcome, reason, deltas, functions, excluded";

fn log_record(r: &tokio_postgres::Row) -> LogRecord {
    LogRecord {
        id: r.get(0),
        logged_at: r.get(1),
        source: r.get(2),
        event_id: r.get(3),
        award_id: r.get(4),
        objective_id: r.get(5),
        outcome: r.get(6),
        reason: r.get(7),
        deltas: r.get(8),
        functions: r.get(9),
        excluded: r.get(10),
    }
}

fn item_row(r: &tokio_postgres::Row) -> ItemRow {
    let share: Option<Value> = r.get(4);
    ItemRow {
        source: r.get(0),
        content_id: r.get(1),
        occurred_at: r.get(2),
        event_id: r.get(3),
        // A share is stored as `{"c": counters, "k": dedup key}`.
        counters: share
            .as_ref()
            .and_then(|s| s.get("c"))
            .map(super::counters::counters_from)
            .unwrap_or_default(),
        dedup_key: share
            .as_ref()
            .and_then(|s| s.get("k"))
            .and_then(Value::as_str)
            .map(str::to_string),
    }
}

impl Store {
    /// `active` for a user never banned or deleted.
    pub async fn user_state(&self, user_id: &str) -> Result<String, StoreError> {
        let row = self
            .client()
            .query_opt("SELECT state FROM users WHERE user_id = $1", &[&user_id])
            .await
            .context("reading a user's state")?;
        Ok(row.map_or_else(|| "active".to_string(), |r| r.get(0)))
    }

    /// Whether the user's progress may be shown on public badges (the
    /// user did not opt out).
    pub async fn badges_public(&self, user_id: &str) -> Result<bool, StoreError> {
        let row = self
            .client()
            .query_opt(
                "SELECT 1 FROM badge_opt_outs WHERE user_id = $1",
                &[&user_id],
            )
            .await
            .context("reading a user's badge choice")?;
        Ok(row.is_none())
    }

    /// Records whether the user's progress may be shown on public badges.
    pub async fn set_badges_public(&self, user_id: &str, public: bool) -> Result<(), StoreError> {
        let statement = if public {
            "DELETE FROM badge_opt_outs WHERE user_id = $1"
        } else {
            "INSERT INTO badge_opt_outs (user_id) VALUES ($1) ON CONFLICT DO NOTHING"
        };
        self.client()
            .execute(statement, &[&user_id])
            .await
            .context("recording a user's badge choice")?;
        Ok(())
    }

    /// A user's processing log, newest first: up to `limit` entries older
    /// than the entry `before` (all, without it).
    pub async fn user_log(
        &self,
        user_id: &str,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<LogRecord>, StoreError> {
        self.log_rows(
            "user_id = $1 AND id < coalesce($2, 9223372036854775807) ORDER BY id DESC LIMIT $3",
            &[&user_id, &before, &limit],
        )
        .await
    }

    /// The newest `limit` log entries of a user that concern `award_id`:
    /// its objectives' changes and rejections, and the skips and rejections
    /// of whole events.
    pub async fn user_award_log(
        &self,
        user_id: &str,
        award_id: &str,
        limit: i64,
    ) -> Result<Vec<LogRecord>, StoreError> {
        self.log_rows(
            "user_id = $1
               AND (award_id = $2 OR (award_id IS NULL AND (deltas IS NULL OR deltas ? $2)))
             ORDER BY id DESC LIMIT $3",
            &[&user_id, &award_id, &limit],
        )
        .await
    }

    /// Log entries of a user's events `event_ids`, newest first.
    pub async fn user_event_log(
        &self,
        user_id: &str,
        event_ids: &[&str],
    ) -> Result<Vec<LogRecord>, StoreError> {
        self.log_rows(
            "user_id = $1 AND event_id = ANY($2) ORDER BY id DESC",
            &[&user_id, &event_ids],
        )
        .await
    }

    /// A user's content items that contribute to `share_key`
    /// (`award/objective`), newest first, at most `limit`.
    pub async fn contributing_items(
        &self,
        user_id: &str,
        share_key: &str,
        limit: i64,
    ) -> Result<Vec<ItemRow>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT source, content_id, occurred_at, event_id, shares -> $2 FROM content_items
                 WHERE user_id = $1 AND shares ? $2 ORDER BY occurred_at DESC, content_id LIMIT $3",
                &[&user_id, &share_key, &limit],
            )
            .await
            .context("reading a user's content items")?;
        Ok(rows.iter().map(item_row).collect())
    }

    /// A user's content items in `sources` (any source, without them) that
    /// contribute nothing to `share_key`, newest first, at most `limit`.
    pub async fn idle_items(
        &self,
        user_id: &str,
        share_key: &str,
        sources: Option<&[String]>,
        limit: i64,
    ) -> Result<Vec<ItemRow>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT source, content_id, occurred_at, event_id, NULL::jsonb FROM content_items
                 WHERE user_id = $1 AND NOT shares ? $2 AND ($3::text[] IS NULL OR source = ANY($3))
                 ORDER BY occurred_at DESC, content_id LIMIT $4",
                &[&user_id, &share_key, &sources, &limit],
            )
            .await
            .context("reading a user's content items")?;
        Ok(rows.iter().map(item_row).collect())
    }

    /// Processing-log entries matching `condition` (SQL after WHERE).
    async fn log_rows(
        &self,
        condition: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<LogRecord>, StoreError> {
        let rows = self
            .client()
            .query(
                &format!("SELECT {LOG_COLUMNS} FROM processing_log WHERE {condition}"),
                params,
            )
            .await
            .context("reading a user's processing log")?;
        Ok(rows.iter().map(log_record).collect())
    }

    /// Answers if PostgreSQL does (health checks).
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.client()
            .simple_query("SELECT 1")
            .await
            .context("checking the connection")?;
        Ok(())
    }
}
