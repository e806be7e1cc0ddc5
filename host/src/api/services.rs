//! What Laurel gives its HTTP functions (`laurel:http` and Spin's
//! key-value): publishing events, reading progress, key-value stores.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;

use futures_util::future::BoxFuture;

use super::progress::{Audience, public_badge, user_awards};
use super::{ApiError, AppState};
use crate::event::Envelope;
use crate::kafka::EventPublisher;
use crate::keyvalue::{KeyValueStores, KvFailure};
use crate::proxy::Policy;
use crate::runtime::http::{HttpServices, KvError, ProgressError};

/// Most events one `publish` call takes.
const MAX_PUBLISH: usize = 1000;

pub struct Services {
    /// Weak: the state owns the functions, which own these services.
    state: Weak<AppState>,
    publisher: Option<Arc<EventPublisher>>,
    /// The pool outbound requests go through, if any.
    pool: Option<String>,
    timeout: Duration,
    /// Largest response body passed back to a function.
    max_body_bytes: usize,
}

impl Services {
    pub fn new(
        state: Weak<AppState>,
        brokers: Option<&str>,
        pool: Option<String>,
        timeout: Duration,
        max_body_bytes: usize,
    ) -> anyhow::Result<Services> {
        Ok(Services {
            state,
            publisher: brokers.map(EventPublisher::new).transpose()?.map(Arc::new),
            pool,
            timeout,
            max_body_bytes,
        })
    }

    fn state(&self) -> Result<Arc<AppState>, String> {
        self.state
            .upgrade()
            .ok_or_else(|| "Laurel is shutting down".to_string())
    }

    /// Redis (the proxy module's connection), connected at first use.
    /// The key-value stores, in the connection the proxy pools opened.
    fn stores(&self) -> impl Future<Output = Result<KeyValueStores, KvError>> + Send + 'static {
        let state = self.state();
        async move {
            let state = state.map_err(KvError::Other)?;
            let pools = state.proxies().await;
            pools
                .map(|pools| KeyValueStores::on(pools.redis().clone()))
                .map_err(|e| KvError::Other(e.to_string()))
        }
    }
}

/// One outbound request through a proxy taken from `pool` for it.
async fn through_pool(
    state: &AppState,
    pool: &str,
    request: http::Request<Bytes>,
    timeout: Duration,
    max_body_bytes: usize,
) -> Result<http::Response<Bytes>, String> {
    let policy = match state.store().await {
        Ok(store) => match store.proxy_pool(pool).await {
            Ok(Some(row)) => Policy::of(&row),
            _ => Policy::LeastUsed,
        },
        Err(_) => Policy::LeastUsed,
    };
    let pools = state.proxies().await.map_err(|e| e.to_string())?;
    let taken = pools
        .take(pool, policy)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("proxy pool {pool} has no eligible proxy: not sent"))?;
    let result = send(&taken.proxy, request, timeout, max_body_bytes).await;
    let _ = pools.give_back(&taken).await;
    result.map_err(|e| format!("via proxy {}: {e}", taken.proxy))
}

async fn send(
    proxy: &str,
    request: http::Request<Bytes>,
    timeout: Duration,
    max_body_bytes: usize,
) -> Result<http::Response<Bytes>, String> {
    let client = crate::outbound::client()
        .timeout(timeout)
        .proxy(crate::outbound::Proxy::all(proxy).map_err(|e| e.to_string())?)
        .build()
        .map_err(|e| e.to_string())?;
    let (parts, body) = request.into_parts();
    let mut outgoing = client
        .request(parts.method, parts.uri.to_string())
        .body(body);
    for (name, value) in &parts.headers {
        outgoing = outgoing.header(name, value);
    }
    let response = outgoing
        .send()
        .await
        .map_err(|e| crate::outbound::error_chain(&e))?;
    let mut answer = http::Response::builder().status(response.status());
    for (name, value) in response.headers() {
        answer = answer.header(name, value);
    }
    // One byte over the limit tells the function the answer was too big.
    let body = crate::outbound::read_limited(response, max_body_bytes + 1).await?;
    if body.len() > max_body_bytes {
        return Err(format!(
            "the response body is over the limit of {max_body_bytes} bytes"
        ));
    }
    answer.body(Bytes::from(body)).map_err(|e| e.to_string())
}

impl HttpServices for Services {
    fn proxies_outbound(&self) -> bool {
        self.pool.is_some()
    }

    fn send_outbound(
        &self,
        request: http::Request<Bytes>,
    ) -> BoxFuture<'static, Result<http::Response<Bytes>, String>> {
        let (state, pool, timeout, limit) = (
            self.state(),
            self.pool.clone(),
            self.timeout,
            self.max_body_bytes,
        );
        Box::pin(async move {
            let state = state?;
            let pool = pool.ok_or_else(|| "no proxy pool is configured".to_string())?;
            through_pool(&state, &pool, request, timeout, limit).await
        })
    }

    fn publish(
        &self,
        source: String,
        events: Vec<String>,
    ) -> BoxFuture<'static, Result<u32, String>> {
        let (state, publisher) = (self.state(), self.publisher.clone());
        Box::pin(async move {
            let state = state?;
            let Some(publisher) = publisher else {
                return Err("this process has no Kafka brokers configured".to_string());
            };
            if events.is_empty() || events.len() > MAX_PUBLISH {
                return Err(format!(
                    "publish 1 to {MAX_PUBLISH} events, not {}",
                    events.len()
                ));
            }
            let mut messages = Vec::with_capacity(events.len());
            let max_bytes = state.settings.max_event_bytes;
            for (index, text) in events.into_iter().enumerate() {
                // Ingest would dead-letter it: refused here, with why.
                if text.len() > max_bytes {
                    return Err(format!(
                        "event {index} is {} bytes, over the event limit of {max_bytes} bytes (LAUREL_MAX_EVENT_BYTES)",
                        text.len()
                    ));
                }
                let envelope = Envelope::parse(text.as_bytes())
                    .map_err(|e| format!("event {index} is not a valid event: {e}"))?;
                if envelope.source != source {
                    return Err(format!(
                        "event {index} has source `{}`, not `{source}`",
                        envelope.source
                    ));
                }
                messages.push((envelope.user_id, text));
            }
            let store = state.store().await.map_err(|e| e.to_string())?;
            let sources = store.sources().await.map_err(|e| e.to_string())?;
            drop(store);
            let Some(row) = sources.iter().find(|s| s.name == source) else {
                return Err(format!(
                    "source `{source}` is not registered: apply an award that reads it, or `laurel sources add {source}`"
                ));
            };
            publisher
                .publish_all(&row.topic, &messages)
                .await
                .map_err(|e| format!("publishing to {} failed: {e:#}", row.topic))?;
            Ok(messages.len() as u32)
        })
    }

    fn user_awards(&self, user_id: String) -> BoxFuture<'static, Result<String, ProgressError>> {
        let state = self.state();
        Box::pin(async move {
            let state = state.map_err(ProgressError::Unavailable)?;
            match user_awards(&state, &user_id, Audience::User).await {
                Ok(awards) => serde_json::to_string(&awards)
                    .map_err(|e| ProgressError::Unavailable(e.to_string())),
                Err(ApiError::NotFound(message)) => Err(ProgressError::NotFound(message)),
                Err(error) => Err(ProgressError::Unavailable(error.to_string())),
            }
        })
    }

    fn public_badge(
        &self,
        user_id: String,
        award_id: String,
    ) -> BoxFuture<'static, Result<String, ProgressError>> {
        let state = self.state();
        Box::pin(async move {
            let state = state.map_err(ProgressError::Unavailable)?;
            match public_badge(&state, &user_id, &award_id).await {
                Ok(award) => serde_json::to_string(&award)
                    .map_err(|e| ProgressError::Unavailable(e.to_string())),
                Err(ApiError::NotFound(message)) => Err(ProgressError::NotFound(message)),
                Err(error) => Err(ProgressError::Unavailable(error.to_string())),
            }
        })
    }

    fn kv_get(
        &self,
        label: String,
        key: String,
    ) -> BoxFuture<'static, Result<Option<Vec<u8>>, KvError>> {
        let stores = self.stores();
        Box::pin(async move { kv(stores.await?.get(&label, &key).await) })
    }

    fn kv_set(
        &self,
        label: String,
        key: String,
        value: Vec<u8>,
    ) -> BoxFuture<'static, Result<(), KvError>> {
        let stores = self.stores();
        Box::pin(async move { kv(stores.await?.set(&label, &key, &value).await) })
    }

    fn kv_delete(&self, label: String, key: String) -> BoxFuture<'static, Result<(), KvError>> {
        let stores = self.stores();
        Box::pin(async move { kv(stores.await?.delete(&label, &key).await) })
    }

    fn kv_exists(&self, label: String, key: String) -> BoxFuture<'static, Result<bool, KvError>> {
        let stores = self.stores();
        Box::pin(async move { kv(stores.await?.exists(&label, &key).await) })
    }

    fn kv_keys(&self, label: String) -> BoxFuture<'static, Result<Vec<String>, KvError>> {
        let stores = self.stores();
        Box::pin(async move { kv(stores.await?.keys(&label).await) })
    }
}

/// A key-value answer from Redis, as the guest hears it.
fn kv<T>(answer: Result<T, KvFailure>) -> Result<T, KvError> {
    answer.map_err(|e| KvError::Other(e.to_string()))
}
