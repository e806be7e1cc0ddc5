//! Webhooks and the notification outbox.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{QueryContext, Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    pub name: String,
    pub url: String,
    pub events: Vec<String>,
    pub proxy_pool: Option<String>,
}

/// A notification claimed for one delivery attempt.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: i64,
    pub webhook: String,
    pub payload: Value,
    /// Including this one.
    pub attempts: i32,
}

/// A notification as recorded.
#[derive(Debug, Clone)]
pub struct NotificationRow {
    pub id: i64,
    pub webhook: String,
    pub payload: Value,
    pub state: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl Store {
    /// Creates or replaces a webhook.
    pub async fn set_webhook(&self, webhook: &Webhook) -> Result<(), StoreError> {
        self.client()
            .execute(
                "INSERT INTO webhooks (name, url, events, proxy_pool) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (name) DO UPDATE SET url = EXCLUDED.url, events = EXCLUDED.events,
                     proxy_pool = EXCLUDED.proxy_pool, updated_at = now()",
                &[
                    &webhook.name,
                    &webhook.url,
                    &webhook.events,
                    &webhook.proxy_pool,
                ],
            )
            .await
            .context("writing a webhook")?;
        Ok(())
    }

    /// False if there was no such webhook. Its pending notifications fail
    /// at their next attempt (and say why).
    pub async fn delete_webhook(&self, name: &str) -> Result<bool, StoreError> {
        let n = self
            .client()
            .execute("DELETE FROM webhooks WHERE name = $1", &[&name])
            .await
            .context("deleting a webhook")?;
        Ok(n > 0)
    }

    pub async fn webhooks(&self) -> Result<Vec<Webhook>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT name, url, events, proxy_pool FROM webhooks ORDER BY name",
                &[],
            )
            .await
            .context("reading webhooks")?;
        Ok(rows
            .iter()
            .map(|r| Webhook {
                name: r.get(0),
                url: r.get(1),
                events: r.get(2),
                proxy_pool: r.get(3),
            })
            .collect())
    }

    /// Claims up to `limit` due notifications for one attempt each: the
    /// attempt is counted and the next one is pushed `lease` ahead, so a
    /// notifier that dies mid-delivery delays a notification, never loses
    /// it (the outcome is written by [`Store::delivery_succeeded`] or
    /// [`Store::delivery_failed`]).
    pub async fn claim_deliveries(
        &self,
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<Delivery>, StoreError> {
        let lease_secs = lease.as_secs_f64();
        let rows = self
            .client()
            .query(
                "WITH due AS (
                     SELECT id FROM notifications WHERE state = 'pending' AND next_attempt_at <= now()
                     ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED
                 )
                 UPDATE notifications n SET attempts = n.attempts + 1,
                     next_attempt_at = now() + make_interval(secs => $2)
                 FROM due WHERE n.id = due.id
                 RETURNING n.id, n.webhook, n.payload, n.attempts",
                &[&limit, &lease_secs],
            )
            .await
            .context("claiming notifications")?;
        Ok(rows
            .iter()
            .map(|r| Delivery {
                id: r.get(0),
                webhook: r.get(1),
                payload: r.get(2),
                attempts: r.get(3),
            })
            .collect())
    }

    pub async fn delivery_succeeded(&self, id: i64) -> Result<(), StoreError> {
        self.client()
            .execute(
                "UPDATE notifications SET state = 'delivered', finished_at = now(), last_error = NULL
                 WHERE id = $1 AND state = 'pending'",
                &[&id],
            )
            .await
            .context("recording a delivery")?;
        Ok(())
    }

    /// Records a failed attempt: retried after `retry_in`, or given up
    /// (`None`).
    pub async fn delivery_failed(
        &self,
        id: i64,
        error: &str,
        retry_in: Option<Duration>,
    ) -> Result<(), StoreError> {
        match retry_in {
            Some(delay) => {
                let delay_secs = delay.as_secs_f64();
                self.client()
                    .execute(
                        "UPDATE notifications SET last_error = $2,
                             next_attempt_at = now() + make_interval(secs => $3)
                         WHERE id = $1 AND state = 'pending'",
                        &[&id, &error, &delay_secs],
                    )
                    .await
            }
            None => {
                self.client()
                    .execute(
                        "UPDATE notifications SET state = 'failed', last_error = $2, finished_at = now()
                         WHERE id = $1 AND state = 'pending'",
                        &[&id, &error],
                    )
                    .await
            }
        }
        .context("recording a failed delivery")?;
        Ok(())
    }

    /// Records that nothing was sent (no proxy could be had): the claim's
    /// attempt is given back, and the notification waits `delay`. An
    /// outage of Redis or an empty pool delays a notification, never
    /// spends its attempts.
    pub async fn delivery_postponed(
        &self,
        id: i64,
        reason: &str,
        delay: Duration,
    ) -> Result<(), StoreError> {
        let delay_secs = delay.as_secs_f64();
        self.client()
            .execute(
                "UPDATE notifications SET attempts = greatest(attempts - 1, 0), last_error = $2,
                     next_attempt_at = now() + make_interval(secs => $3)
                 WHERE id = $1 AND state = 'pending'",
                &[&id, &reason, &delay_secs],
            )
            .await
            .context("postponing a delivery")?;
        Ok(())
    }

    /// Every notification, oldest first (for operators and tests).
    pub async fn notifications(&self) -> Result<Vec<NotificationRow>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT id, webhook, payload, state, attempts, last_error, finished_at
                 FROM notifications ORDER BY id",
                &[],
            )
            .await
            .context("reading notifications")?;
        Ok(rows
            .iter()
            .map(|r| NotificationRow {
                id: r.get(0),
                webhook: r.get(1),
                payload: r.get(2),
                state: r.get(3),
                attempts: r.get(4),
                last_error: r.get(5),
                finished_at: r.get(6),
            })
            .collect())
    }

    /// The earliest time a pending notification is due, if any.
    pub async fn next_delivery_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row = self
            .client()
            .query_one(
                "SELECT min(next_attempt_at) FROM notifications WHERE state = 'pending'",
                &[],
            )
            .await
            .context("reading the next due notification")?;
        Ok(row.get(0))
    }
}
