//! The admin API's audit log (`admin_audit`): every write, by whom.

use chrono::{DateTime, Utc};

use super::{QueryContext, Store, StoreError};

/// One admin write.
#[derive(Debug, Clone, Default)]
pub struct AuditEntry {
    pub id: i64,
    pub at: Option<DateTime<Utc>>,
    pub token_name: String,
    pub method: String,
    pub path: String,
    pub status: i32,
    /// `award ID` or `function NAME`, when the write changed one.
    pub target: Option<String>,
    pub version_before: Option<i32>,
    pub version_after: Option<i32>,
}

impl Store {
    pub async fn record_audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        self.client()
            .execute(
                "INSERT INTO admin_audit (token_name, method, path, status, target, version_before, version_after)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &entry.token_name,
                    &entry.method,
                    &entry.path,
                    &entry.status,
                    &entry.target,
                    &entry.version_before,
                    &entry.version_after,
                ],
            )
            .await
            .context("recording an admin write")?;
        Ok(())
    }

    /// Newest first; at most `limit`, older than `before` (an id) if given.
    pub async fn audit(
        &self,
        limit: i64,
        before: Option<i64>,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT id, at, token_name, method, path, status, target, version_before, version_after
                 FROM admin_audit WHERE id < coalesce($2, 9223372036854775807)
                 ORDER BY id DESC LIMIT $1",
                &[&limit, &before],
            )
            .await
            .context("reading the audit log")?;
        Ok(rows
            .iter()
            .map(|r| AuditEntry {
                id: r.get(0),
                at: Some(r.get(1)),
                token_name: r.get(2),
                method: r.get(3),
                path: r.get(4),
                status: r.get(5),
                target: r.get(6),
                version_before: r.get(7),
                version_after: r.get(8),
            })
            .collect())
    }
}
