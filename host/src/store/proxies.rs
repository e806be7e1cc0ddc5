//! Proxy pools' durable side: what each pool admits, and every candidate
//! it was given with the outcome of its last check. (Allocation counts and
//! leases live in Redis, in `proxy`.)

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::Row;

use super::{QueryContext, Store, StoreError};

/// A pool's policy and checks, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyPoolRow {
    pub name: String,
    /// `least-used` or `least-concurrent`.
    pub policy: String,
    pub check_url: String,
    pub timeout: Duration,
    pub schemes: Vec<String>,
    pub max_latency: Duration,
    pub deny: Vec<String>,
    pub recheck_every: Duration,
    pub lease_ttl: Duration,
    pub max_in_flight: Option<i32>,
    /// Admit candidates on loopback, link-local and private addresses.
    pub allow_private: bool,
}

/// A candidate of a pool and its last check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateRow {
    pub pool: String,
    pub proxy: String,
    pub eligible: bool,
    /// Why it is not eligible; `None` while eligible or before its first
    /// check.
    pub reason: Option<String>,
    pub latency_ms: Option<i32>,
    pub checks: i32,
    pub checked_at: Option<DateTime<Utc>>,
}

const POOL_COLUMNS: &str = "name, policy, check_url, timeout_ms, schemes, max_latency_ms, deny, \
     recheck_every_ms, lease_ttl_ms, max_in_flight, allow_private";

fn millis(ms: i32) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

fn as_millis(duration: Duration) -> i32 {
    duration.as_millis().min(i32::MAX as u128) as i32
}

fn pool_row(r: &Row) -> ProxyPoolRow {
    ProxyPoolRow {
        name: r.get(0),
        policy: r.get(1),
        check_url: r.get(2),
        timeout: millis(r.get(3)),
        schemes: r.get(4),
        max_latency: millis(r.get(5)),
        deny: r.get(6),
        recheck_every: millis(r.get(7)),
        lease_ttl: millis(r.get(8)),
        max_in_flight: r.get(9),
        allow_private: r.get(10),
    }
}

fn candidate_row(r: &Row) -> CandidateRow {
    CandidateRow {
        pool: r.get(0),
        proxy: r.get(1),
        eligible: r.get(2),
        reason: r.get(3),
        latency_ms: r.get(4),
        checks: r.get(5),
        checked_at: r.get(6),
    }
}

const CANDIDATE_COLUMNS: &str = "pool, proxy, eligible, reason, latency_ms, checks, checked_at";

impl Store {
    /// Creates or replaces a pool's policy and checks (its candidates
    /// stay).
    pub async fn set_proxy_pool(&self, pool: &ProxyPoolRow) -> Result<(), StoreError> {
        self.client()
            .execute(
                "INSERT INTO proxy_pools (name, policy, check_url, timeout_ms, schemes, max_latency_ms,
                     deny, recheck_every_ms, lease_ttl_ms, max_in_flight, allow_private)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                 ON CONFLICT (name) DO UPDATE SET policy = EXCLUDED.policy,
                     check_url = EXCLUDED.check_url, timeout_ms = EXCLUDED.timeout_ms,
                     schemes = EXCLUDED.schemes, max_latency_ms = EXCLUDED.max_latency_ms,
                     deny = EXCLUDED.deny, recheck_every_ms = EXCLUDED.recheck_every_ms,
                     lease_ttl_ms = EXCLUDED.lease_ttl_ms, max_in_flight = EXCLUDED.max_in_flight,
                     allow_private = EXCLUDED.allow_private, updated_at = now()",
                &[
                    &pool.name,
                    &pool.policy,
                    &pool.check_url,
                    &as_millis(pool.timeout),
                    &pool.schemes,
                    &as_millis(pool.max_latency),
                    &pool.deny,
                    &as_millis(pool.recheck_every),
                    &as_millis(pool.lease_ttl),
                    &pool.max_in_flight,
                    &pool.allow_private,
                ],
            )
            .await
            .context("writing a proxy pool")?;
        Ok(())
    }

    pub async fn proxy_pool(&self, name: &str) -> Result<Option<ProxyPoolRow>, StoreError> {
        let row = self
            .client()
            .query_opt(
                &format!("SELECT {POOL_COLUMNS} FROM proxy_pools WHERE name = $1"),
                &[&name],
            )
            .await
            .context("reading a proxy pool")?;
        Ok(row.as_ref().map(pool_row))
    }

    pub async fn proxy_pools(&self) -> Result<Vec<ProxyPoolRow>, StoreError> {
        let rows = self
            .client()
            .query(
                &format!("SELECT {POOL_COLUMNS} FROM proxy_pools ORDER BY name"),
                &[],
            )
            .await
            .context("reading proxy pools")?;
        Ok(rows.iter().map(pool_row).collect())
    }

    /// Deletes a pool and its candidates; false if there was none.
    pub async fn delete_proxy_pool(&self, name: &str) -> Result<bool, StoreError> {
        let n = self
            .client()
            .execute("DELETE FROM proxy_pools WHERE name = $1", &[&name])
            .await
            .context("deleting a proxy pool")?;
        Ok(n > 0)
    }

    /// Adds candidates to a pool (known ones stay as they are), each due
    /// for a check now.
    pub async fn add_proxy_candidates(
        &self,
        pool: &str,
        proxies: &[String],
    ) -> Result<(), StoreError> {
        self.client()
            .execute(
                "INSERT INTO proxy_candidates (pool, proxy)
                 SELECT $1, p FROM unnest($2::text[]) AS p
                 ON CONFLICT (pool, proxy) DO UPDATE SET next_check_at = now()",
                &[&pool, &proxies],
            )
            .await
            .context("adding proxy candidates")?;
        Ok(())
    }

    /// Drops the candidates of `pool` not in `keep`; returns them.
    pub async fn drop_proxy_candidates_except(
        &self,
        pool: &str,
        keep: &[String],
    ) -> Result<Vec<String>, StoreError> {
        let rows = self
            .client()
            .query(
                "DELETE FROM proxy_candidates WHERE pool = $1 AND NOT (proxy = ANY($2::text[]))
                 RETURNING proxy",
                &[&pool, &keep],
            )
            .await
            .context("dropping proxy candidates")?;
        let mut dropped: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        dropped.sort();
        Ok(dropped)
    }

    /// Records a check: eligible with its latency, or not and why; the
    /// next check is due after the pool's re-check interval.
    pub async fn record_proxy_check(
        &self,
        pool: &str,
        proxy: &str,
        outcome: &Result<Duration, String>,
    ) -> Result<(), StoreError> {
        let (eligible, reason, latency) = match outcome {
            Ok(latency) => (true, None, Some(as_millis(*latency))),
            Err(reason) => (false, Some(reason.as_str()), None),
        };
        self.client()
            .execute(
                "UPDATE proxy_candidates c SET eligible = $3, reason = $4, latency_ms = $5,
                     checks = c.checks + 1, checked_at = now(),
                     next_check_at = now() + make_interval(secs => p.recheck_every_ms / 1000.0)
                 FROM proxy_pools p
                 WHERE c.pool = $1 AND c.proxy = $2 AND p.name = c.pool",
                &[&pool, &proxy, &eligible, &reason, &latency],
            )
            .await
            .context("recording a proxy check")?;
        Ok(())
    }

    /// A pool's candidates, by address.
    pub async fn proxy_candidates(&self, pool: &str) -> Result<Vec<CandidateRow>, StoreError> {
        let rows = self
            .client()
            .query(
                &format!(
                    "SELECT {CANDIDATE_COLUMNS} FROM proxy_candidates WHERE pool = $1 ORDER BY proxy"
                ),
                &[&pool],
            )
            .await
            .context("reading proxy candidates")?;
        Ok(rows.iter().map(candidate_row).collect())
    }

    /// Claims up to `limit` candidates due for a re-check (of any pool),
    /// pushing their next check `lease` ahead so that several processes
    /// never check one candidate at once and a checker that dies only
    /// delays it.
    pub async fn claim_proxy_checks(
        &self,
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<(ProxyPoolRow, String)>, StoreError> {
        let lease_secs = lease.as_secs_f64();
        let rows = self
            .client()
            .query(
                &format!(
                    "WITH due AS (
                         SELECT pool, proxy FROM proxy_candidates WHERE next_check_at <= now()
                         ORDER BY next_check_at LIMIT $1 FOR UPDATE SKIP LOCKED
                     ), claimed AS (
                         UPDATE proxy_candidates c SET next_check_at = now() + make_interval(secs => $2)
                         FROM due WHERE c.pool = due.pool AND c.proxy = due.proxy
                         RETURNING c.pool, c.proxy
                     )
                     SELECT {POOL_COLUMNS}, claimed.proxy
                     FROM claimed JOIN proxy_pools p ON p.name = claimed.pool
                     ORDER BY name, claimed.proxy"
                ),
                &[&limit, &lease_secs],
            )
            .await
            .context("claiming proxy checks")?;
        Ok(rows.iter().map(|r| (pool_row(r), r.get(11))).collect())
    }

    /// When the next candidate is due for a check, if any.
    pub async fn next_proxy_check_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row = self
            .client()
            .query_one("SELECT min(next_check_at) FROM proxy_candidates", &[])
            .await
            .context("reading the next proxy check")?;
        Ok(row.get(0))
    }
}
