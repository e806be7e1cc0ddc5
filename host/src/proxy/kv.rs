//! Spin key-value stores for HTTP functions, in the same Redis as the
//! proxy pools (this module owns Redis). A store (an application's label
//! in spin.toml's `key_value_stores`, given here as `<app>/<label>`) is one
//! Redis hash, `{laurel:kv:<app>/<label>}`: its operations touch one key,
//! so a Redis Cluster serves them.

use redis::AsyncCommands;

use super::ProxyPools;

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

impl ProxyPools {
    fn kv_failure(&self, label: &str, error: redis::RedisError) -> KvFailure {
        KvFailure {
            label: label.to_string(),
            url: self.url.clone(),
            reason: error.to_string(),
        }
    }

    pub async fn kv_get(&self, label: &str, key: &str) -> Result<Option<Vec<u8>>, KvFailure> {
        let mut connection = self.connection.clone();
        connection
            .hget(hash(label), key)
            .await
            .map_err(|e| self.kv_failure(label, e))
    }

    pub async fn kv_set(&self, label: &str, key: &str, value: &[u8]) -> Result<(), KvFailure> {
        let mut connection = self.connection.clone();
        connection
            .hset::<_, _, _, ()>(hash(label), key, value)
            .await
            .map_err(|e| self.kv_failure(label, e))
    }

    pub async fn kv_delete(&self, label: &str, key: &str) -> Result<(), KvFailure> {
        let mut connection = self.connection.clone();
        connection
            .hdel::<_, _, ()>(hash(label), key)
            .await
            .map_err(|e| self.kv_failure(label, e))
    }

    pub async fn kv_exists(&self, label: &str, key: &str) -> Result<bool, KvFailure> {
        let mut connection = self.connection.clone();
        connection
            .hexists(hash(label), key)
            .await
            .map_err(|e| self.kv_failure(label, e))
    }

    pub async fn kv_keys(&self, label: &str) -> Result<Vec<String>, KvFailure> {
        let mut connection = self.connection.clone();
        connection
            .hkeys(hash(label))
            .await
            .map_err(|e| self.kv_failure(label, e))
    }
}
