//! The pre-filter's pipelines.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{QueryContext, Store, StoreError};

/// Announced when a pipeline is applied, deleted, paused or resumed; the
/// payload is its name.
pub const PIPELINES_CHANNEL: &str = "laurel_pipelines";

#[derive(Debug, Clone, PartialEq)]
pub struct PipelineRow {
    pub name: String,
    pub input_topic: String,
    /// Its events go to this source's topic.
    pub source: String,
    pub transform: String,
    pub transform_config: Value,
    pub paused: bool,
    pub version: i32,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str =
    "name, input_topic, source, transform, transform_config, paused, version, updated_at";

fn row(r: &tokio_postgres::Row) -> PipelineRow {
    PipelineRow {
        name: r.get(0),
        input_topic: r.get(1),
        source: r.get(2),
        transform: r.get(3),
        transform_config: r.get(4),
        paused: r.get(5),
        version: r.get(6),
        updated_at: r.get(7),
    }
}

impl Store {
    /// Creates or replaces pipelines (name, input topic, source, transform,
    /// config), in one transaction, registering their sources. Returns each
    /// pipeline's new version.
    pub async fn apply_pipelines(
        &mut self,
        pipelines: &[(String, String, String, String, Value)],
    ) -> Result<Vec<(String, i32)>, StoreError> {
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting to apply pipelines")?;
        let mut versions = Vec::new();
        for (name, input_topic, source, transform, config) in pipelines {
            tx.execute(
                "INSERT INTO sources (name, topic) VALUES ($1, 'events.' || $1) ON CONFLICT (name) DO NOTHING",
                &[source],
            )
            .await
            .context("registering a pipeline's source")?;
            // The same definition again keeps its version (its consumer
            // runs on undisturbed).
            let changed = tx
                .query_opt(
                    "INSERT INTO pipelines (name, input_topic, source, transform, transform_config)
                     VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (name) DO UPDATE SET input_topic = EXCLUDED.input_topic,
                         source = EXCLUDED.source, transform = EXCLUDED.transform,
                         transform_config = EXCLUDED.transform_config,
                         version = pipelines.version + 1, updated_at = now()
                     WHERE (pipelines.input_topic, pipelines.source, pipelines.transform, pipelines.transform_config)
                         IS DISTINCT FROM (EXCLUDED.input_topic, EXCLUDED.source, EXCLUDED.transform, EXCLUDED.transform_config)
                     RETURNING version",
                    &[name, input_topic, source, transform, config],
                )
                .await
                .context("writing a pipeline")?;
            let version: i32 = match changed {
                Some(row) => {
                    tx.execute("SELECT pg_notify($1, $2)", &[&PIPELINES_CHANNEL, name])
                        .await
                        .context("announcing a pipeline")?;
                    row.get(0)
                }
                None => tx
                    .query_one("SELECT version FROM pipelines WHERE name = $1", &[name])
                    .await
                    .context("reading a pipeline's version")?
                    .get(0),
            };
            versions.push((name.clone(), version));
        }
        tx.commit().await.context("committing pipelines")?;
        Ok(versions)
    }

    /// The key Laurel signs `name`'s marks with (made by the migrations).
    pub async fn signing_key(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        let row = self
            .client()
            .query_one("SELECT key FROM signing_keys WHERE name = $1", &[&name])
            .await
            .context("reading a signing key")?;
        Ok(row.get(0))
    }

    pub async fn pipelines(&self) -> Result<Vec<PipelineRow>, StoreError> {
        let rows = self
            .client()
            .query(
                &format!("SELECT {COLUMNS} FROM pipelines ORDER BY name"),
                &[],
            )
            .await
            .context("listing pipelines")?;
        Ok(rows.iter().map(row).collect())
    }

    /// Deletes a pipeline; false if there is no such pipeline.
    pub async fn delete_pipeline(&self, name: &str) -> Result<bool, StoreError> {
        let rows = self
            .client()
            .query(
                "WITH gone AS (DELETE FROM pipelines WHERE name = $1 RETURNING name)
                 SELECT pg_notify($2, name) FROM gone",
                &[&name, &PIPELINES_CHANNEL],
            )
            .await
            .context("deleting a pipeline")?;
        Ok(!rows.is_empty())
    }

    /// Pauses or resumes a pipeline; false if there is no such pipeline.
    pub async fn set_pipeline_paused(&self, name: &str, paused: bool) -> Result<bool, StoreError> {
        let rows = self
            .client()
            .query(
                "WITH changed AS (
                     UPDATE pipelines SET paused = $2, updated_at = now() WHERE name = $1 RETURNING name)
                 SELECT pg_notify($3, name) FROM changed",
                &[&name, &paused, &PIPELINES_CHANNEL],
            )
            .await
            .context("pausing or resuming a pipeline")?;
        Ok(!rows.is_empty())
    }
}
