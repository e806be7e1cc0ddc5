//! The one Redis connection of a process: opened failing fast when Redis
//! is away (the connection reconnects by itself at the next call), shared
//! by clone, with its URL as shown (credentials redacted).
//!
//! **Architecture Invariant:** Redis is reached through this connection
//! only. Two modules keep keys in it, each under its own prefix: `proxy`
//! (`laurel:pool:{NAME}:*`, the pools' allocation state) and `keyvalue`
//! (`{laurel:kv:APP/LABEL}`, the Spin key-value stores of HTTP functions).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// How long a Redis operation may take before it counts as failed; Redis
/// being away must cost a delivery attempt, not hang it.
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(2);

/// A multiplexed Redis connection: clone it freely, calls from many tasks
/// pipeline.
#[derive(Clone)]
pub struct RedisConnection {
    connection: ConnectionManager,
    /// The URL without its credentials.
    url: String,
}

/// Why Redis could not be connected to.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("invalid Redis URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("Redis at {url} failed: {reason}")]
    Unreachable { url: String, reason: String },
}

impl RedisConnection {
    /// Connects to Redis at `url`; fails clearly if it is not there.
    pub async fn connect(url: &str) -> Result<RedisConnection, ConnectError> {
        // Only the redacted form is ever shown (errors, logs, /healthz).
        let shown = crate::secrets::redact_url(url);
        let client = redis::Client::open(url).map_err(|e| ConnectError::InvalidUrl {
            url: shown.clone(),
            reason: crate::secrets::redact_url_in(&e.to_string(), url),
        })?;
        // Fail fast when Redis is away (the default retries for ~10 s);
        // the manager reconnects by itself at the next call.
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500))
            .set_connection_timeout(Some(REDIS_TIMEOUT))
            .set_response_timeout(Some(REDIS_TIMEOUT));
        let connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| ConnectError::Unreachable {
                url: shown.clone(),
                reason: crate::secrets::redact_url_in(&e.to_string(), url),
            })?;
        Ok(RedisConnection {
            connection,
            url: shown,
        })
    }

    /// A handle for one call (cheap: the connection is multiplexed).
    pub fn handle(&self) -> ConnectionManager {
        self.connection.clone()
    }

    /// The URL as shown: without its credentials.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Answers if Redis does (health checks).
    pub async fn ping(&self) -> Result<(), redis::RedisError> {
        let mut connection = self.handle();
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
            .map(|_| ())
    }
}
