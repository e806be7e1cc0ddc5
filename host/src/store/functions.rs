//! The function registry table.

use chrono::{DateTime, Utc};

use super::{FUNCTIONS_CHANNEL, QueryContext, Store, StoreError};
use crate::runtime::FunctionLimits;

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
    /// Whether this version serves (the one the registry loads).
    pub live: bool,
    /// What its push asked for.
    pub limits: FunctionLimits,
}

/// One registered version with its component bytes.
#[derive(Debug, Clone)]
pub struct FunctionVersion {
    pub name: String,
    pub version: i32,
    pub kind: String,
    pub sha256: String,
    pub bytes: Vec<u8>,
    pub limits: FunctionLimits,
}

/// A version to register.
#[derive(Debug, Clone, Copy)]
pub struct Pushing<'a> {
    pub name: &'a str,
    pub kind: &'a str,
    pub sha256: &'a str,
    pub bytes: &'a [u8],
    /// What it asks for in place of the server's defaults.
    pub limits: FunctionLimits,
    /// One of the binary's own (the built-in library).
    pub builtin: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// A new version was registered.
    Created { version: i32 },
    /// These bytes, with these limits, are already the live (or the
    /// newest) version.
    Unchanged { version: i32 },
}

/// A change of which version of a function serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveChange {
    /// The version that served before (none: nothing served).
    pub from: Option<i32>,
    pub to: i32,
}

const ROW_COLUMNS: &str = "f.name, f.version, f.kind, f.sha256, octet_length(f.bytes)::bigint, f.builtin, f.created_at, f.quarantine_reason, l.version IS NOT DISTINCT FROM f.version, f.cpu_ms, f.memory_mib";

/// `functions f` with each name's live version `l`.
const WITH_LIVE: &str = "functions f LEFT JOIN function_live l ON l.name = f.name";

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
        live: r.get(8),
        limits: stored_limits(r.get(9), r.get(10)),
    }
}

fn stored_limits(cpu_ms: Option<i32>, memory_mib: Option<i32>) -> FunctionLimits {
    FunctionLimits {
        cpu_ms: cpu_ms.and_then(|v| u32::try_from(v).ok()),
        memory_mib: memory_mib.and_then(|v| u32::try_from(v).ok()),
    }
}

/// As stored: NULL for the default. (Asked limits are at most the
/// server's ceilings, far below `i32::MAX`: `Limits::effective`.)
fn columns(limits: FunctionLimits) -> (Option<i32>, Option<i32>) {
    let column = |value: Option<u32>| value.map(|v| i32::try_from(v).unwrap_or(i32::MAX));
    (column(limits.cpu_ms), column(limits.memory_mib))
}

impl Store {
    /// Registers `bytes`, to run under `limits`, as the next version of
    /// `name` and makes it live, unless they already are its live or
    /// newest version (bytes and limits alike); announces a new
    /// version on [`FUNCTIONS_CHANNEL`] when the transaction commits. With
    /// `shadow`, the new version is a candidate: it serves nothing until
    /// [`Store::set_live_function`] promotes it.
    pub async fn push_function(
        &mut self,
        pushed: Pushing<'_>,
        shadow: bool,
    ) -> Result<PushOutcome, StoreError> {
        let Pushing {
            name,
            kind,
            sha256,
            bytes,
            limits,
            builtin,
        } = pushed;
        let (cpu_ms, memory_mib) = columns(limits);
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting a function push")?;
        // One pusher per name at a time: versions are dense and ordered.
        lock_name(&tx, name).await?;
        let newest = tx
            .query_opt(
                "SELECT version, sha256, cpu_ms, memory_mib FROM functions WHERE name = $1 ORDER BY version DESC LIMIT 1",
                &[&name],
            )
            .await
            .context("reading a function's newest version")?
            .map(|r| (r.get::<_, i32>(0), r.get::<_, String>(1), stored_limits(r.get(2), r.get(3))));
        let live = tx
            .query_opt(
                "SELECT f.version, f.sha256, f.cpu_ms, f.memory_mib FROM function_live l
                 JOIN functions f ON f.name = l.name AND f.version = l.version WHERE l.name = $1",
                &[&name],
            )
            .await
            .context("reading a function's live version")?
            .map(|r| {
                (
                    r.get::<_, i32>(0),
                    r.get::<_, String>(1),
                    stored_limits(r.get(2), r.get(3)),
                )
            });
        // A push of the live bytes, or a shadow push of the newest bytes,
        // changes nothing.
        let same = [live.as_ref(), newest.as_ref().filter(|_| shadow)]
            .into_iter()
            .flatten()
            .find(|(_, sha, asked)| sha == sha256 && *asked == limits);
        if let Some((version, _, _)) = same {
            return Ok(PushOutcome::Unchanged { version: *version });
        }
        let version = newest.map_or(1, |(version, _, _)| version + 1);
        tx.execute(
            "INSERT INTO functions (name, version, kind, sha256, bytes, builtin, cpu_ms, memory_mib)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[&name, &version, &kind, &sha256, &bytes, &builtin, &cpu_ms, &memory_mib],
        )
        .await
        .context("inserting a function version")?;
        if !shadow {
            make_live(&tx, name, version).await?;
        }
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

    /// The live version of every function (what serves).
    pub async fn current_functions(&self) -> Result<Vec<FunctionRow>, StoreError> {
        let sql = format!(
            "SELECT {ROW_COLUMNS} FROM {WITH_LIVE} WHERE l.version = f.version ORDER BY f.name"
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
        let sql = format!("SELECT {ROW_COLUMNS} FROM {WITH_LIVE} ORDER BY f.name, f.version DESC");
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
                "SELECT name, version, kind, sha256, bytes, cpu_ms, memory_mib FROM functions WHERE name = $1 AND version = $2",
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
            limits: stored_limits(r.get(5), r.get(6)),
        }))
    }

    /// Makes `version` of `name` the one that serves (promote), and
    /// announces it; `None` if there is no such version.
    pub async fn set_live_function(
        &mut self,
        name: &str,
        version: i32,
    ) -> Result<Option<LiveChange>, StoreError> {
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting a change of the live version")?;
        lock_name(&tx, name).await?;
        let exists = tx
            .query_opt(
                "SELECT 1 FROM functions WHERE name = $1 AND version = $2",
                &[&name, &version],
            )
            .await
            .context("looking up a function version")?
            .is_some();
        if !exists {
            return Ok(None);
        }
        let from: Option<i32> = tx
            .query_opt(
                "SELECT version FROM function_live WHERE name = $1",
                &[&name],
            )
            .await
            .context("reading a function's live version")?
            .map(|r| r.get(0));
        if from != Some(version) {
            make_live(&tx, name, version).await?;
            tx.execute("SELECT pg_notify($1, $2)", &[&FUNCTIONS_CHANNEL, &name])
                .await
                .context("announcing a live version")?;
        }
        tx.commit()
            .await
            .context("committing a change of the live version")?;
        Ok(Some(LiveChange { from, to: version }))
    }

    /// The live version of `name` and the one live before it (what a
    /// rollback returns to), if it has one.
    pub async fn live_function(
        &self,
        name: &str,
    ) -> Result<Option<(i32, Option<i32>)>, StoreError> {
        let row = self
            .client()
            .query_opt(
                "SELECT version, previous FROM function_live WHERE name = $1",
                &[&name],
            )
            .await
            .context("reading a function's live version")?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
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

/// Holds `name` for the rest of the transaction: one change of a name's
/// versions at a time.
async fn lock_name(tx: &tokio_postgres::Transaction<'_>, name: &str) -> Result<(), StoreError> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('laurel.functions.' || $1))",
        &[&name],
    )
    .await
    .context("locking a function name")?;
    Ok(())
}

/// Makes `version` of `name` live, remembering the one it replaces.
async fn make_live(
    tx: &tokio_postgres::Transaction<'_>,
    name: &str,
    version: i32,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO function_live (name, version) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE
         SET previous = function_live.version, version = EXCLUDED.version, changed_at = now()",
        &[&name, &version],
    )
    .await
    .context("making a function version live")?;
    Ok(())
}
