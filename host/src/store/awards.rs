//! Award definitions and sources.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{QueryContext, Store, StoreError};

/// Announced when award definitions change; the payload is the award id.
pub const AWARDS_CHANNEL: &str = "laurel_awards";
/// Announced when a source is added, paused or resumed.
pub const SOURCES_CHANNEL: &str = "laurel_sources";

#[derive(Debug, Clone)]
pub struct AwardRow {
    pub id: String,
    pub version: i32,
    pub definition: Value,
    pub enabled: bool,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRow {
    pub name: String,
    pub topic: String,
    pub paused: bool,
}

impl Store {
    /// Creates or replaces awards, in one transaction, registering the
    /// sources they name. Returns each award's new version.
    pub async fn apply_awards(
        &mut self,
        awards: &[(String, Value, bool)],
        sources: &[String],
    ) -> Result<Vec<(String, i32)>, StoreError> {
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting to apply awards")?;
        let mut versions = Vec::new();
        for (id, definition, enabled) in awards {
            let row = tx
                .query_one(
                    "INSERT INTO awards (id, version, definition, enabled) VALUES ($1, 1, $2, $3)
                     ON CONFLICT (id) DO UPDATE SET version = awards.version + 1, definition = EXCLUDED.definition,
                         enabled = EXCLUDED.enabled, updated_at = now()
                     RETURNING version",
                    &[id, definition, enabled],
                )
                .await
                .context("writing an award")?;
            let version: i32 = row.get(0);
            tx.execute(
                "INSERT INTO award_history (award_id, version, definition) VALUES ($1, $2, $3)",
                &[id, &version, definition],
            )
            .await
            .context("recording an award's history")?;
            // Every user with counters for it gets it computed again.
            tx.execute(
                "INSERT INTO award_backfills (award_id, award_version) VALUES ($1, $2)
                 ON CONFLICT (award_id) DO UPDATE SET award_version = EXCLUDED.award_version,
                     next_user = '', marked = 0, started_at = now(), finished_at = NULL",
                &[id, &version],
            )
            .await
            .context("requesting an award's backfill")?;
            tx.execute("SELECT pg_notify($1, $2)", &[&AWARDS_CHANNEL, id])
                .await
                .context("announcing an award")?;
            versions.push((id.clone(), version));
        }
        for source in sources {
            let added = tx
                .execute(
                    "INSERT INTO sources (name, topic) VALUES ($1, 'events.' || $1) ON CONFLICT (name) DO NOTHING",
                    &[source],
                )
                .await
                .context("registering a source")?;
            if added > 0 {
                tx.execute("SELECT pg_notify($1, $2)", &[&SOURCES_CHANNEL, source])
                    .await
                    .context("announcing a source")?;
            }
        }
        tx.commit().await.context("committing awards")?;
        Ok(versions)
    }

    /// Deletes an award (its history keeps a tombstone). False if unknown.
    pub async fn delete_award(&mut self, id: &str) -> Result<bool, StoreError> {
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting to delete an award")?;
        let Some(row) = tx
            .query_opt("DELETE FROM awards WHERE id = $1 RETURNING version", &[&id])
            .await
            .context("deleting an award")?
        else {
            return Ok(false);
        };
        let version: i32 = row.get::<_, i32>(0) + 1;
        tx.execute(
            "INSERT INTO award_history (award_id, version, definition) VALUES ($1, $2, NULL)",
            &[&id, &version],
        )
        .await
        .context("recording an award's deletion")?;
        tx.execute("DELETE FROM award_backfills WHERE award_id = $1", &[&id])
            .await
            .context("cancelling an award's backfill")?;
        tx.execute("SELECT pg_notify($1, $2)", &[&AWARDS_CHANNEL, &id])
            .await
            .context("announcing an award")?;
        tx.commit().await.context("committing an award deletion")?;
        Ok(true)
    }

    pub async fn awards(&self) -> Result<Vec<AwardRow>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT id, version, definition, enabled, updated_at FROM awards ORDER BY id",
                &[],
            )
            .await
            .context("listing awards")?;
        Ok(rows
            .iter()
            .map(|r| AwardRow {
                id: r.get(0),
                version: r.get(1),
                definition: r.get(2),
                enabled: r.get(3),
                updated_at: r.get(4),
            })
            .collect())
    }

    pub async fn sources(&self) -> Result<Vec<SourceRow>, StoreError> {
        let rows = self
            .client()
            .query("SELECT name, topic, paused FROM sources ORDER BY name", &[])
            .await
            .context("listing sources")?;
        Ok(rows
            .iter()
            .map(|r| SourceRow {
                name: r.get(0),
                topic: r.get(1),
                paused: r.get(2),
            })
            .collect())
    }

    /// Adds a source (or changes its topic).
    pub async fn add_source(&self, name: &str, topic: Option<&str>) -> Result<(), StoreError> {
        self.client()
            .execute(
                "WITH added AS (
                     INSERT INTO sources (name, topic) VALUES ($1, coalesce($2, 'events.' || $1))
                     ON CONFLICT (name) DO UPDATE SET topic = coalesce($2, sources.topic), updated_at = now()
                     RETURNING name)
                 SELECT pg_notify($3, name) FROM added",
                &[&name, &topic, &SOURCES_CHANNEL],
            )
            .await
            .context("adding a source")?;
        Ok(())
    }

    /// Pauses or resumes a source; false if there is no such source.
    pub async fn set_source_paused(&self, name: &str, paused: bool) -> Result<bool, StoreError> {
        let rows = self
            .client()
            .query(
                "WITH changed AS (
                     UPDATE sources SET paused = $2, updated_at = now() WHERE name = $1 RETURNING name)
                 SELECT pg_notify($3, name) FROM changed",
                &[&name, &paused, &SOURCES_CHANNEL],
            )
            .await
            .context("pausing or resuming a source")?;
        Ok(!rows.is_empty())
    }

    /// Marks a user banned, deleted or active again. A user made active
    /// has every award with counters computed again (the awards worker
    /// skipped them meanwhile).
    pub async fn set_user_state(&mut self, user_id: &str, state: &str) -> Result<(), StoreError> {
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting a user's state change")?;
        tx.execute(
            "INSERT INTO users (user_id, state) VALUES ($1, $2)
             ON CONFLICT (user_id) DO UPDATE SET state = EXCLUDED.state, updated_at = now()",
            &[&user_id, &state],
        )
        .await
        .context("setting a user's state")?;
        if state == "active" {
            tx.execute(
                "INSERT INTO award_changes (user_id, award_id)
                 SELECT DISTINCT user_id, award_id FROM user_objective WHERE user_id = $1
                 ON CONFLICT DO NOTHING",
                &[&user_id],
            )
            .await
            .context("marking a restored user's awards")?;
        }
        tx.commit()
            .await
            .context("committing a user's state change")?;
        Ok(())
    }
}
