//! The notifier: delivers the outbox (`notifications`, written by the
//! awards worker in the transaction of each transition) to webhooks.
//!
//! At least once: a notification is claimed for one attempt with a lease,
//! POSTed, and only then marked delivered; a notifier that dies mid-way
//! leaves it to be claimed again when the lease runs out. Failures are
//! retried with exponential backoff (capped) and given up after
//! `max_attempts`, recorded with the last error. Every attempt of a
//! notification carries the same body, hence the same `idempotency_key`
//! (also sent as the `Idempotency-Key` header).

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;
use tracing::{Instrument, info, warn};

use crate::metrics;
use crate::outbound;
use crate::proxy::{Policy, ProxyPools, Taken};
use crate::store::{self, Delivery, Store, StoreError, Webhook};

/// The notifier's settings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Notifications")]
pub struct NotifySettings {
    /// Attempts before a webhook notification is given up.
    #[arg(
        id = "webhook_max_attempts",
        long = "webhook-max-attempts",
        env = "LAUREL_WEBHOOK_MAX_ATTEMPTS",
        default_value_t = 12,
        value_parser = clap::value_parser!(i32).range(1..),
        value_name = "ATTEMPTS"
    )]
    pub max_attempts: i32,
    /// Wait after the first failed delivery, in milliseconds; doubles after
    /// each.
    #[arg(
        id = "webhook_backoff_ms",
        long = "webhook-backoff-ms",
        env = "LAUREL_WEBHOOK_BACKOFF_MS",
        default_value = "1000",
        value_parser = crate::settings::millis,
        value_name = "MS"
    )]
    pub backoff: Duration,
    /// Longest wait between delivery attempts, in milliseconds (at least
    /// the first wait).
    #[arg(
        id = "webhook_backoff_cap_ms",
        long = "webhook-backoff-cap-ms",
        env = "LAUREL_WEBHOOK_BACKOFF_CAP_MS",
        default_value = "600000",
        value_parser = crate::settings::millis,
        value_name = "MS"
    )]
    pub backoff_cap: Duration,
    /// One webhook request's time limit, in milliseconds.
    #[arg(
        id = "webhook_timeout_ms",
        long = "webhook-timeout-ms",
        env = "LAUREL_WEBHOOK_TIMEOUT_MS",
        default_value = "10000",
        value_parser = crate::settings::positive_millis,
        value_name = "MS"
    )]
    pub timeout: Duration,
    /// Deliveries in flight at once.
    #[arg(skip = 16usize)]
    pub concurrency: usize,
    /// Redis, for webhooks that send through a proxy pool (the process's
    /// `--redis-url`).
    #[arg(skip)]
    pub redis_url: Option<String>,
}

impl Default for NotifySettings {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

/// The wait after failed attempt number `attempt` (1-based).
pub fn backoff(attempt: i32, base: Duration, cap: Duration) -> Duration {
    let doublings = attempt.saturating_sub(1).clamp(0, 30) as u32;
    // A cap below the first wait is the first wait.
    base.saturating_mul(1 << doublings).min(cap.max(base))
}

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("webhook {0} no longer exists")]
    NoWebhook(String),
    /// The pool has no eligible proxy: nothing was sent.
    #[error("proxy pool {pool} has no eligible proxy: not sent")]
    NoProxy { pool: String },
    #[error("no proxy from pool {pool}: {reason}")]
    ProxyUnavailable { pool: String, reason: String },
    #[error("POST {url}{via} failed: {error}")]
    Request {
        url: String,
        via: String,
        error: String,
    },
    #[error("POST {url} answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
}

impl DeliveryError {
    /// Some failures will not get better by retrying.
    fn is_final(&self) -> bool {
        matches!(self, DeliveryError::NoWebhook(_))
    }

    /// Nothing went out (no proxy could be had): not an attempt.
    fn not_sent(&self) -> bool {
        matches!(
            self,
            DeliveryError::NoProxy { .. } | DeliveryError::ProxyUnavailable { .. }
        )
    }
}

/// The HTTP side of delivery.
#[derive(Clone)]
pub struct Sender {
    client: outbound::Client,
    timeout: Duration,
    /// Redis, for webhooks that send through a proxy pool; connected at
    /// the first such delivery, so Redis being away never holds up the
    /// others.
    redis_url: Option<String>,
    pools: std::sync::Arc<tokio::sync::OnceCell<ProxyPools>>,
}

impl Sender {
    pub fn new(timeout: Duration, redis_url: Option<String>) -> anyhow::Result<Sender> {
        let client = outbound::client()
            .timeout(timeout)
            .user_agent(concat!("laurel/", env!("CARGO_PKG_VERSION")))
            .no_proxy()
            .build()?;
        Ok(Sender {
            client,
            timeout,
            redis_url,
            pools: Default::default(),
        })
    }

    /// A client for this one request through a proxy taken from `pool`,
    /// and what was taken (to give back after the request).
    async fn through_pool(
        &self,
        pool: &str,
        policy: Policy,
    ) -> Result<(outbound::Client, Taken, &ProxyPools), DeliveryError> {
        let unavailable = |reason: String| DeliveryError::ProxyUnavailable {
            pool: pool.to_string(),
            reason,
        };
        let url = self
            .redis_url
            .as_deref()
            .ok_or_else(|| unavailable("no Redis configured".into()))?;
        let pools = self
            .pools
            .get_or_try_init(|| ProxyPools::connect(url))
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let taken = pools
            .take(pool, policy)
            .await
            .map_err(|e| unavailable(e.to_string()))?
            .ok_or_else(|| DeliveryError::NoProxy {
                pool: pool.to_string(),
            })?;
        let client = outbound::Proxy::all(&taken.proxy)
            .and_then(|proxy| {
                outbound::client()
                    .timeout(self.timeout)
                    .user_agent(concat!("laurel/", env!("CARGO_PKG_VERSION")))
                    .proxy(proxy)
                    .build()
            })
            .map_err(|e| unavailable(e.to_string()));
        match client {
            Ok(client) => Ok((client, taken, pools)),
            Err(error) => {
                let _ = pools.give_back(&taken).await;
                Err(error)
            }
        }
    }

    /// Sends one delivery, through a proxy of the webhook's pool (under
    /// `policy`; least-used for a pool not configured in the database).
    pub async fn send(
        &self,
        webhook: &Webhook,
        policy: Option<Policy>,
        payload: &serde_json::Value,
    ) -> Result<(), DeliveryError> {
        match &webhook.proxy_pool {
            Some(pool) => {
                let policy = policy.unwrap_or(Policy::LeastUsed);
                let (client, taken, pools) = self.through_pool(pool, policy).await?;
                let via = format!(" via proxy {}", taken.proxy);
                let result = self.post(&client, webhook, &via, payload).await;
                if let Err(error) = pools.give_back(&taken).await {
                    // The lease expires by itself.
                    warn!(message = "Could not release a proxy lease.", %error);
                }
                result
            }
            None => self.post(&self.client, webhook, "", payload).await,
        }
    }

    async fn post(
        &self,
        client: &outbound::Client,
        webhook: &Webhook,
        via: &str,
        payload: &serde_json::Value,
    ) -> Result<(), DeliveryError> {
        let key = payload
            .get("idempotency_key")
            .and_then(|k| k.as_str())
            .unwrap_or_default();
        let response = client
            .post(&webhook.url)
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(payload.to_string())
            .send()
            .await
            .map_err(|error| DeliveryError::Request {
                url: crate::secrets::redact_url(&webhook.url),
                via: via.to_string(),
                // reqwest quotes the URL (without its user info, with its
                // query): the message names it redacted instead.
                error: outbound::error_chain(&error.without_url()),
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        // Enough to say why; a receiver cannot make Laurel read more.
        let body = outbound::read_limited(response, 64 << 10)
            .await
            .unwrap_or_default();
        let body = String::from_utf8_lossy(&body);
        Err(DeliveryError::Status {
            url: crate::secrets::redact_url(&webhook.url),
            status: status.as_u16(),
            body: if status.is_redirection() {
                "redirects are not followed".to_string()
            } else {
                body.chars().take(200).collect()
            },
        })
    }
}

/// A lease longer than any attempt can take: the request's timeout plus
/// room for the database.
fn lease(settings: &NotifySettings) -> Duration {
    settings.timeout * 2 + Duration::from_secs(5)
}

/// Claims due notifications and delivers them; returns how many it tried.
pub async fn deliver_due(
    store: &Store,
    sender: &Sender,
    settings: &NotifySettings,
) -> Result<usize, StoreError> {
    // No more than can start at once: a claimed row's lease runs from
    // its claim, so one waiting its turn here could expire and go twice.
    let due = store
        .claim_deliveries(settings.concurrency.max(1) as i64, lease(settings))
        .await?;
    if due.is_empty() {
        return Ok(0);
    }
    let webhooks: HashMap<String, Webhook> = store
        .webhooks()
        .await?
        .into_iter()
        .map(|w| (w.name.clone(), w))
        .collect();
    let policies: HashMap<String, Policy> = if webhooks.values().any(|w| w.proxy_pool.is_some()) {
        store
            .proxy_pools()
            .await?
            .iter()
            .map(|p| (p.name.clone(), Policy::of(p)))
            .collect()
    } else {
        HashMap::new()
    };
    let results: Vec<(Delivery, Result<(), DeliveryError>)> =
        futures_util::stream::iter(due.into_iter().map(|delivery| {
            let webhook = webhooks.get(&delivery.webhook);
            let policy = webhook
                .and_then(|w| w.proxy_pool.as_ref())
                .and_then(|pool| policies.get(pool).copied());
            let span = tracing::info_span!(
                "delivery",
                id = delivery.id,
                webhook = %delivery.webhook,
                attempt = delivery.attempts
            );
            async move {
                let result = match webhook {
                    Some(webhook) => sender.send(webhook, policy, &delivery.payload).await,
                    None => Err(DeliveryError::NoWebhook(delivery.webhook.clone())),
                };
                (delivery, result)
            }
            .instrument(span)
        }))
        .buffer_unordered(settings.concurrency.max(1))
        .collect()
        .await;
    let tried = results.len();
    for (delivery, result) in results {
        match result {
            Ok(()) => {
                store.delivery_succeeded(delivery.id).await?;
                metrics::add(
                    metrics::NOTIFICATIONS_SENT,
                    &[("webhook", delivery.webhook.as_str())],
                    1,
                );
            }
            Err(error) if error.not_sent() => {
                // An empty pool or Redis away: try again soon, for as long
                // as it lasts; the attempt budget is for real attempts.
                let wait = settings
                    .backoff
                    .clamp(Duration::from_millis(100), Duration::from_secs(10));
                let text = error.to_string();
                info!(message = "Notification not sent (no proxy); will try again.", id = delivery.id, webhook = %delivery.webhook, retry_in_ms = wait.as_millis() as u64, error = %text);
                store.delivery_postponed(delivery.id, &text, wait).await?;
            }
            Err(error) => {
                let give_up = error.is_final() || delivery.attempts >= settings.max_attempts;
                metrics::add(
                    metrics::NOTIFICATIONS_FAILED,
                    &[
                        ("webhook", delivery.webhook.as_str()),
                        ("final", if give_up { "true" } else { "false" }),
                    ],
                    1,
                );
                let text = error.to_string();
                if give_up {
                    warn!(message = "Gave up delivering a notification.", id = delivery.id, webhook = %delivery.webhook, attempts = delivery.attempts, error = %text);
                    store.delivery_failed(delivery.id, &text, None).await?;
                } else {
                    let wait = backoff(delivery.attempts, settings.backoff, settings.backoff_cap);
                    info!(message = "Notification delivery failed; will retry.", id = delivery.id, webhook = %delivery.webhook, attempt = delivery.attempts, retry_in_ms = wait.as_millis() as u64, error = %text);
                    store
                        .delivery_failed(delivery.id, &text, Some(wait))
                        .await?;
                }
            }
        }
    }
    Ok(tried)
}

/// Delivers notifications until `shutdown` resolves: woken by NOTIFY when
/// the worker queues some, and by the clock when a retry is due.
pub async fn run(
    settings: NotifySettings,
    database_url: &str,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let sender = Sender::new(settings.timeout, settings.redis_url.clone())?;
    let mut queued = store::listen(database_url, &[store::OUTBOX_CHANNEL]).await?;
    tokio::pin!(shutdown);
    let mut backoff_db = Duration::from_millis(100);
    'connect: loop {
        let store = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            store = Store::connect(database_url) => store,
        };
        let store = match store {
            Ok(store) => store,
            Err(error) => {
                warn!(message = "Notifier cannot reach the database; retrying.", %error);
                tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    _ = tokio::time::sleep(backoff_db) => {}
                }
                backoff_db = (backoff_db * 2).min(Duration::from_secs(5));
                continue 'connect;
            }
        };
        backoff_db = Duration::from_millis(100);
        loop {
            // Deliveries in flight finish before shutdown is looked at.
            let tried = match deliver_due(&store, &sender, &settings).await {
                Ok(tried) => tried,
                Err(error) => {
                    warn!(message = "Notifier lost the database; reconnecting.", %error);
                    continue 'connect;
                }
            };
            if tried > 0 {
                continue;
            }
            let wait = match store.next_delivery_due().await {
                Ok(Some(due)) => (due - chrono::Utc::now())
                    .to_std()
                    .unwrap_or_default()
                    .clamp(Duration::from_millis(10), Duration::from_secs(1)),
                Ok(None) => Duration::from_secs(1),
                Err(_) => continue 'connect,
            };
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = queued.recv() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_secs(1);
        let waits: Vec<u128> = (1..=6).map(|n| backoff(n, base, cap).as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff(i32::MAX, base, cap), cap);
    }
}
