//! Spin key-value stores for HTTP functions, in the process's one Redis
//! connection (shared with the proxy pools). A store (an application's
//! label in spin.toml's `key_value_stores`, given here as `<app>/<label>`)
//! is one Redis hash, `{laurel:kv:<app>/<label>}`: its operations touch
//! one key, so a Redis Cluster serves them.

use redis::AsyncCommands;

use crate::redis_connection::RedisConnection;

/// A key-value operation that Redis could not do.
#[derive(Debug, thiserror::Error)]
#[error("key-value store {label}: Redis at {url} failed: {reason}")]
pub struct KvFailure {
    pub label: String,
    pub url: String,
    pub reason: String,
}

fn hash(label: &str) -> String {
    format!("{{laurel:kv:{label}}}")
}

/// The key-value stores in one Redis connection.
#[derive(Clone)]
pub struct KeyValueStores {
    redis: RedisConnection,
}

impl KeyValueStores {
    pub fn on(redis: RedisConnection) -> KeyValueStores {
        KeyValueStores { redis }
    }

    fn failure(&self, label: &str, error: redis::RedisError) -> KvFailure {
        KvFailure {
            label: label.to_string(),
            url: self.redis.url().to_string(),
            reason: error.to_string(),
        }
    }

    pub async fn get(&self, label: &str, key: &str) -> Result<Option<Vec<u8>>, KvFailure> {
        let mut connection = self.redis.handle();
        connection
            .hget(hash(label), key)
            .await
            .map_err(|e| self.failure(label, e))
    }

    pub async fn set(&self, label: &str, key: &str, value: &[u8]) -> Result<(), KvFailure> {
        let mut connection = self.redis.handle();
        connection
            .hset::<_, _, _, ()>(hash(label), key, value)
            .await
            .map_err(|e| self.failure(label, e))
    }

    pub async fn delete(&self, label: &str, key: &str) -> Result<(), KvFailure> {
        let mut connection = self.redis.handle();
        connection
            .hdel::<_, _, ()>(hash(label), key)
            .await
            .map_err(|e| self.failure(label, e))
    }

    pub async fn exists(&self, label: &str, key: &str) -> Result<bool, KvFailure> {
        let mut connection = self.redis.handle();
        connection
            .hexists(hash(label), key)
            .await
            .map_err(|e| self.failure(label, e))
    }

    pub async fn keys(&self, label: &str) -> Result<Vec<String>, KvFailure> {
        let mut connection = self.redis.handle();
        connection
            .hkeys(hash(label))
            .await
            .map_err(|e| self.failure(label, e))
    }
}
