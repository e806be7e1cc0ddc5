//! What support reads about one user: their state and processing log.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{QueryContext, Store, StoreError};

/// One processing-log entry as stored.
#[derive(Debug, Clone)]
pub struct LogRow {
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

    /// A user's processing log, newest first: up to `limit` entries older
    /// than the entry `before` (all, without it).
    pub async fn user_log(
        &self,
        user_id: &str,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<LogRow>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT id, logged_at, source, event_id, award_id, objective_id, outcome, reason, deltas, functions
                 FROM processing_log WHERE user_id = $1 AND id < coalesce($2, 9223372036854775807)
                 ORDER BY id DESC LIMIT $3",
                &[&user_id, &before, &limit],
            )
            .await
            .context("reading a user's processing log")?;
        Ok(rows
            .iter()
            .map(|r| LogRow {
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
            })
            .collect())
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
