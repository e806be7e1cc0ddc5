//! The function registry table.

use chrono::{DateTime, Utc};

use super::{FUNCTIONS_CHANNEL, QueryContext, Store, StoreError};

/// One registered version, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionRow {
    pub name: String,
    pub version: i32,
    pub kind: String,
    pub sha256: String,
    pub size: i64,
    pub builtin: bool,
    pub created_at: DateTime<Utc>,
    pub quarantine_reason: Option<String>,
}

/// One registered version with its component bytes.
#[derive(Debug, Clone)]
pub struct FunctionVersion {
    pub name: String,
    pub version: i32,
    pub kind: String,
    pub sha256: String,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// A new version was registered.
    Created { version: i32 },
    /// These bytes are already the current version.
    Unchanged { version: i32 },
}

const ROW_COLUMNS: &str = "name, version, kind, sha256, octet_length(bytes)::bigint, builtin, created_at, quarantine_reason";

fn row(r: &tokio_postgres::Row) -> FunctionRow {
    FunctionRow {
        name: r.get(0),
        version: r.get(1),
        kind: r.get(2),
        sha256: r.get(3),
        size: r.get(4),
        builtin: r.get(5),
        created_at: r.get(6),
        quarantine_reason: r.get(7),
    }
}

impl Store {
    /// Registers `bytes` as the next version of `name`, unless they already
    /// are its current version; announces a new version on
    /// [`FUNCTIONS_CHANNEL`] when the transaction commits.
    pub async fn push_function(
        &mut self,
        name: &str,
        kind: &str,
        sha256: &str,
        bytes: &[u8],
        builtin: bool,
    ) -> Result<PushOutcome, StoreError> {
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting a function push")?;
        // One pusher per name at a time: versions are dense and ordered.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('laurel.functions.' || $1))",
            &[&name],
        )
        .await
        .context("locking a function name")?;
        let current = tx
            .query_opt(
                "SELECT version, sha256 FROM functions WHERE name = $1 ORDER BY version DESC LIMIT 1",
                &[&name],
            )
            .await
            .context("reading a function's current version")?;
        if let Some(current) = &current {
            let (version, current_sha): (i32, String) = (current.get(0), current.get(1));
            if current_sha == sha256 {
                return Ok(PushOutcome::Unchanged { version });
            }
        }
        let version = current.map_or(1, |r| r.get::<_, i32>(0) + 1);
        tx.execute(
            "INSERT INTO functions (name, version, kind, sha256, bytes, builtin) VALUES ($1, $2, $3, $4, $5, $6)",
            &[&name, &version, &kind, &sha256, &bytes, &builtin],
        )
        .await
        .context("inserting a function version")?;
        tx.execute("SELECT pg_notify($1, $2)", &[&FUNCTIONS_CHANNEL, &name])
            .await
            .context("announcing a function version")?;
        tx.commit().await.context("committing a function push")?;
        Ok(PushOutcome::Created { version })
    }

    /// Whether `name` has ever been registered with these bytes.
    pub async fn function_has_sha(&self, name: &str, sha256: &str) -> Result<bool, StoreError> {
        let row = self
            .client()
            .query_opt(
                "SELECT 1 FROM functions WHERE name = $1 AND sha256 = $2 LIMIT 1",
                &[&name, &sha256],
            )
            .await
            .context("looking up a function's bytes")?;
        Ok(row.is_some())
    }

    /// The current (highest) version of every function.
    pub async fn current_functions(&self) -> Result<Vec<FunctionRow>, StoreError> {
        let sql = format!(
            "SELECT DISTINCT ON (name) {ROW_COLUMNS} FROM functions ORDER BY name, version DESC"
        );
        let rows = self
            .client()
            .query(&sql, &[])
            .await
            .context("listing functions")?;
        Ok(rows.iter().map(row).collect())
    }

    /// Every version of every function, newest first per name.
    pub async fn all_function_versions(&self) -> Result<Vec<FunctionRow>, StoreError> {
        let sql = format!("SELECT {ROW_COLUMNS} FROM functions ORDER BY name, version DESC");
        let rows = self
            .client()
            .query(&sql, &[])
            .await
            .context("listing function versions")?;
        Ok(rows.iter().map(row).collect())
    }

    pub async fn function_version(
        &self,
        name: &str,
        version: i32,
    ) -> Result<Option<FunctionVersion>, StoreError> {
        let row = self
            .client()
            .query_opt(
                "SELECT name, version, kind, sha256, bytes FROM functions WHERE name = $1 AND version = $2",
                &[&name, &version],
            )
            .await
            .context("reading a function version")?;
        Ok(row.map(|r| FunctionVersion {
            name: r.get(0),
            version: r.get(1),
            kind: r.get(2),
            sha256: r.get(3),
            bytes: r.get(4),
        }))
    }

    /// Records that a version was quarantined (kept for `functions list` and
    /// the admin API; a newer version starts clean).
    pub async fn quarantine_function(
        &self,
        name: &str,
        version: i32,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.client()
            .execute(
                "UPDATE functions SET quarantined_at = now(), quarantine_reason = $3
                 WHERE name = $1 AND version = $2 AND quarantined_at IS NULL",
                &[&name, &version, &reason],
            )
            .await
            .context("recording a quarantine")?;
        Ok(())
    }
}
