//! The schema: `migrations/*.sql`, embedded at build time, applied in name
//! order, each once, each in its own transaction. Applied migrations are
//! recorded with their sha256; an edited one is refused.

use sha2::{Digest, Sha256};

use super::{QueryContext, Store, StoreError};

/// `(name, sql)` for every file in `migrations/`, in order.
pub const MIGRATIONS: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// Serialises concurrent `laurel` processes migrating the same database.
const MIGRATION_LOCK: i64 = 0x6c61_7572_656c; // "laurel"

pub(super) async fn apply(store: &mut Store) -> Result<Vec<&'static str>, StoreError> {
    let client = store.client_mut();
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                 name       text PRIMARY KEY,
                 sha256     text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .context("creating schema_migrations")?;
    let mut applied = Vec::new();
    for (name, sql) in MIGRATIONS {
        let sha = hex::encode(Sha256::digest(sql.as_bytes()));
        let tx = client.transaction().await.context("starting a migration")?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .context("taking the migration lock")?;
        let existing = tx
            .query_opt(
                "SELECT sha256 FROM schema_migrations WHERE name = $1",
                &[name],
            )
            .await
            .context("reading schema_migrations")?;
        match existing {
            Some(row) => {
                let recorded: String = row.get(0);
                if recorded != sha {
                    return Err(StoreError::MigrationEdited {
                        name: name.to_string(),
                        applied: recorded,
                        file: sha,
                    });
                }
            }
            None => {
                tx.batch_execute(sql)
                    .await
                    .map_err(|source| StoreError::Migration {
                        name: name.to_string(),
                        source,
                    })?;
                tx.execute(
                    "INSERT INTO schema_migrations (name, sha256) VALUES ($1, $2)",
                    &[name, &sha],
                )
                .await
                .context("recording a migration")?;
                applied.push(*name);
            }
        }
        tx.commit().await.context("committing a migration")?;
    }
    Ok(applied)
}
