//! Proxy pools in Redis: atomic least-used allocation, and admitting and
//! removing members without letting a (re)joining member draw every
//! allocation.
//!
//! **Architecture Invariant:** only this module imports `redis`.
//!
//! A pool's eligible members are a sorted set (member = the proxy's
//! `scheme://host:port`, score = allocations so far). Allocation is one Lua
//! script (ZRANGE 0 0, then ZINCRBY 1), run with EVALSHA (the script is
//! sent again when Redis answers NOSCRIPT), with the pool's sorted set as
//! its only key. Every key of a pool carries the pool's name as a hash tag
//! (`laurel:pool:{NAME}:...`), so a pool lives in one Redis Cluster slot.
//!
//! - Ties go to the lexicographically first member (ZRANGE's order), not
//!   to a random one.
//! - The score counts allocations, including those whose request failed:
//!   it is not latency, success or work in flight. The only member can be
//!   allocated again and again; allocation reserves nothing.
//! - An empty pool allocates nothing (`None`): the caller does not send
//!   the request.
//! - Restore policy: a member that joins (new) or rejoins (removed, then
//!   restored) starts at the larger of its own past count (kept when it was
//!   removed) and the pool's current lowest score, so it competes from
//!   where the pool is instead of drawing every allocation until it
//!   catches up. The first member of an empty pool starts at its past
//!   count, or 0.

use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

/// The background write-up's allocation, verbatim.
const ALLOCATE: &str = "local chosen = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if not chosen then return nil end
redis.call('ZINCRBY', KEYS[1], 1, chosen)
return chosen";

/// Admits ARGV[1] (if not already eligible) at max(its past count, the
/// lowest score now). KEYS: the eligible set, the past counts.
const ADMIT: &str = "local current = redis.call('ZSCORE', KEYS[1], ARGV[1])
if current then return current end
local start = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local lowest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
if lowest and tonumber(lowest) > start then start = tonumber(lowest) end
redis.call('ZADD', KEYS[1], start, ARGV[1])
return tostring(start)";

/// Removes ARGV[1] from the eligible set, keeping its count. KEYS: as
/// ADMIT.
const REMOVE: &str = "local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return nil end
redis.call('HSET', KEYS[2], ARGV[1], score)
redis.call('ZREM', KEYS[1], ARGV[1])
return score";

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("invalid Redis URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("proxy pool {pool}: Redis at {url} failed: {reason}")]
    Redis {
        pool: String,
        url: String,
        reason: String,
    },
    #[error(
        "invalid proxy pool name {0:?}: letters, digits, `_`, `.`, `-`, at most 128, starting with a letter or digit"
    )]
    InvalidPool(String),
}

/// Proxy pools over one multiplexed Redis connection (reconnecting by
/// itself): clone it freely, calls from many tasks pipeline.
#[derive(Clone)]
pub struct ProxyPools {
    connection: ConnectionManager,
    url: String,
    allocate: Script,
    admit: Script,
    remove: Script,
}

fn eligible_key(pool: &str) -> String {
    format!("laurel:pool:{{{pool}}}:eligible")
}

fn history_key(pool: &str) -> String {
    format!("laurel:pool:{{{pool}}}:history")
}

/// A pool name Laurel accepts (it becomes part of Redis keys).
pub fn check_pool(pool: &str) -> Result<(), ProxyError> {
    let ok = !pool.is_empty()
        && pool.len() <= 128
        && pool
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && pool
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ProxyError::InvalidPool(pool.to_string()))
    }
}

impl ProxyPools {
    /// Connects to Redis at `url`; fails clearly if it is not there.
    pub async fn connect(url: &str) -> Result<ProxyPools, ProxyError> {
        let client = redis::Client::open(url).map_err(|e| ProxyError::InvalidUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
        let connection = ConnectionManager::new(client)
            .await
            .map_err(|e| ProxyError::Redis {
                pool: "*".into(),
                url: url.to_string(),
                reason: e.to_string(),
            })?;
        Ok(ProxyPools {
            connection,
            url: url.to_string(),
            allocate: Script::new(ALLOCATE),
            admit: Script::new(ADMIT),
            remove: Script::new(REMOVE),
        })
    }

    fn failed(&self, pool: &str, error: redis::RedisError) -> ProxyError {
        ProxyError::Redis {
            pool: pool.to_string(),
            url: self.url.clone(),
            reason: error.to_string(),
        }
    }

    /// The eligible member with the fewest allocations (ties: the first by
    /// name), counted; `None` when the pool has no eligible member.
    pub async fn allocate(&self, pool: &str) -> Result<Option<String>, ProxyError> {
        check_pool(pool)?;
        let mut connection = self.connection.clone();
        self.allocate
            .key(eligible_key(pool))
            .invoke_async(&mut connection)
            .await
            .map_err(|e| self.failed(pool, e))
    }

    /// The allocation script's SHA-1 (what EVALSHA names), e.g. for
    /// `redis-benchmark`.
    pub fn allocate_sha(&self) -> &str {
        self.allocate.get_hash()
    }

    /// The Redis key of a pool's eligible set.
    pub fn eligible_key(pool: &str) -> String {
        eligible_key(pool)
    }

    /// Makes `member` eligible (see the restore policy in the module
    /// docs); returns the count it starts at.
    pub async fn admit(&self, pool: &str, member: &str) -> Result<f64, ProxyError> {
        check_pool(pool)?;
        let mut connection = self.connection.clone();
        let start: String = self
            .admit
            .key(eligible_key(pool))
            .key(history_key(pool))
            .arg(member)
            .invoke_async(&mut connection)
            .await
            .map_err(|e| self.failed(pool, e))?;
        Ok(start.parse().unwrap_or(0.0))
    }

    /// Takes `member` out of the eligible set, keeping its count for a
    /// later restore; returns that count, or `None` if it was not eligible.
    pub async fn remove(&self, pool: &str, member: &str) -> Result<Option<f64>, ProxyError> {
        check_pool(pool)?;
        let mut connection = self.connection.clone();
        let score: Option<String> = self
            .remove
            .key(eligible_key(pool))
            .key(history_key(pool))
            .arg(member)
            .invoke_async(&mut connection)
            .await
            .map_err(|e| self.failed(pool, e))?;
        Ok(score.and_then(|s| s.parse().ok()))
    }

    /// The eligible members and their allocation counts, lowest first.
    pub async fn members(&self, pool: &str) -> Result<Vec<(String, f64)>, ProxyError> {
        check_pool(pool)?;
        let mut connection = self.connection.clone();
        connection
            .zrange_withscores(eligible_key(pool), 0, -1)
            .await
            .map_err(|e| self.failed(pool, e))
    }

    /// Deletes a pool's keys (its members and their past counts).
    pub async fn delete_pool(&self, pool: &str) -> Result<(), ProxyError> {
        check_pool(pool)?;
        let mut connection = self.connection.clone();
        connection
            .del::<_, ()>(&[eligible_key(pool), history_key(pool)])
            .await
            .map_err(|e| self.failed(pool, e))
    }
}

/// A line of a candidate list that is not a proxy address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JunkLine {
    /// 1-based.
    pub line: usize,
    pub text: String,
    pub reason: String,
}

/// Reads a free proxy list: one `scheme://host:port` a line (blank lines
/// and `#` comments skipped). Returns the candidates (normalised, each
/// once, in order) and the lines that are not addresses, with why.
pub fn parse_candidates(text: &str) -> (Vec<String>, Vec<JunkLine>) {
    let mut candidates: Vec<String> = Vec::new();
    let mut junk = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let reject = |reason: &str| JunkLine {
            line: n + 1,
            text: line.chars().take(200).collect(),
            reason: reason.to_string(),
        };
        if !line.contains("://") {
            junk.push(reject("expected scheme://host:port"));
            continue;
        }
        let url = match reqwest::Url::parse(line) {
            Ok(url) => url,
            Err(error) => {
                junk.push(reject(&format!("not an address: {error}")));
                continue;
            }
        };
        if !url.username().is_empty() || url.password().is_some() {
            junk.push(reject(
                "credentials in a candidate address are not accepted",
            ));
            continue;
        }
        if !(url.path().is_empty() || url.path() == "/") || url.query().is_some() {
            junk.push(reject(
                "expected scheme://host:port, nothing after the port",
            ));
            continue;
        }
        // The scheme's default port counts (http://host is host:80).
        let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
            junk.push(reject("expected scheme://host:port, with the port"));
            continue;
        };
        let candidate = format!("{}://{host}:{port}", url.scheme());
        if !candidates.contains(&candidate) {
            candidates.push(candidate);
        }
    }
    (candidates, junk)
}

/// A pool's checks for a candidate (or a member, re-checked).
#[derive(Debug, Clone)]
pub struct Eligibility {
    /// Requested through the candidate; must answer 2xx.
    pub check_url: String,
    /// The check request's time limit.
    pub timeout: std::time::Duration,
    /// Schemes a member may have (e.g. `http`).
    pub schemes: Vec<String>,
    /// Slower answers are refused.
    pub max_latency: std::time::Duration,
    /// Hosts never admitted.
    pub deny: Vec<String>,
}

/// Checks one candidate; its latency if eligible, else why not.
pub async fn check(candidate: &str, rules: &Eligibility) -> Result<std::time::Duration, String> {
    let url = reqwest::Url::parse(candidate).map_err(|e| format!("not an address: {e}"))?;
    if !rules.schemes.iter().any(|s| s == url.scheme()) {
        return Err(format!(
            "scheme {} is not allowed (allowed: {})",
            url.scheme(),
            rules.schemes.join(", ")
        ));
    }
    let host = url.host_str().unwrap_or_default();
    if rules.deny.iter().any(|d| d.eq_ignore_ascii_case(host)) {
        return Err(format!("host {host} is on the pool's deny-list"));
    }
    let proxy = reqwest::Proxy::all(candidate).map_err(|e| format!("unusable as a proxy: {e}"))?;
    let client = crate::notify::http_client()
        .proxy(proxy)
        .timeout(rules.timeout)
        .build()
        .map_err(|e| format!("unusable as a proxy: {e}"))?;
    let started = std::time::Instant::now();
    let response = client.get(&rules.check_url).send().await.map_err(|e| {
        format!(
            "the check request through it failed: {}",
            crate::notify::error_chain(&e)
        )
    })?;
    let latency = started.elapsed();
    if !response.status().is_success() {
        return Err(format!(
            "the check URL answered {} through it",
            response.status()
        ));
    }
    if latency > rules.max_latency {
        return Err(format!(
            "too slow: {} ms (ceiling {} ms)",
            latency.as_millis(),
            rules.max_latency.as_millis()
        ));
    }
    Ok(latency)
}

/// What importing a candidate list did.
#[derive(Debug, Default, Clone)]
pub struct ImportReport {
    /// Admitted, with the check's latency and the count it starts at.
    pub admitted: Vec<(String, std::time::Duration, f64)>,
    /// Candidates that failed a check, with why.
    pub refused: Vec<(String, String)>,
    pub junk: Vec<JunkLine>,
}

impl ProxyPools {
    /// Checks every candidate of a list (concurrently) and admits the
    /// eligible ones to `pool`.
    pub async fn import(
        &self,
        pool: &str,
        list: &str,
        rules: &Eligibility,
    ) -> Result<ImportReport, ProxyError> {
        use futures_util::StreamExt;
        check_pool(pool)?;
        let (candidates, junk) = parse_candidates(list);
        let checked: Vec<(String, Result<std::time::Duration, String>)> =
            futures_util::stream::iter(candidates.into_iter().map(|candidate| async move {
                let result = check(&candidate, rules).await;
                (candidate, result)
            }))
            .buffer_unordered(16)
            .collect()
            .await;
        let mut report = ImportReport {
            junk,
            ..ImportReport::default()
        };
        for (candidate, result) in checked {
            match result {
                Ok(latency) => {
                    let start = self.admit(pool, &candidate).await?;
                    report.admitted.push((candidate, latency, start));
                }
                Err(reason) => report.refused.push((candidate, reason)),
            }
        }
        report.admitted.sort_by(|a, b| a.0.cmp(&b.0));
        report.refused.sort();
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_lists_are_read_and_junk_is_reported_by_line() {
        let list = "# free proxies\nhttp://10.0.0.1:8080\n\n10.0.0.2:3128\nhttp://10.0.0.1:8080/\nsocks5://10.0.0.3:1080\nsocks5://10.0.0.4\nhttp://u:p@10.0.0.5:80\nhttp://10.0.0.6:80/x\n:::\nhttp://10.0.0.7\n";
        let (candidates, junk) = parse_candidates(list);
        assert_eq!(
            candidates,
            vec![
                "http://10.0.0.1:8080",
                "socks5://10.0.0.3:1080",
                "http://10.0.0.7:80"
            ]
        );
        let lines: Vec<(usize, &str)> = junk.iter().map(|j| (j.line, j.reason.as_str())).collect();
        assert_eq!(
            lines,
            vec![
                (4, "expected scheme://host:port"),
                (7, "expected scheme://host:port, with the port"),
                (8, "credentials in a candidate address are not accepted"),
                (9, "expected scheme://host:port, nothing after the port"),
                (10, "expected scheme://host:port"),
            ]
        );
    }

    #[test]
    fn a_pool_s_keys_share_one_hash_tag() {
        assert_eq!(eligible_key("public"), "laurel:pool:{public}:eligible");
        assert_eq!(history_key("public"), "laurel:pool:{public}:history");
    }

    #[test]
    fn pool_names_are_checked() {
        assert!(check_pool("public-1").is_ok());
        for bad in ["", "-x", "a b", "a}b", &"x".repeat(129)] {
            assert!(check_pool(bad).is_err(), "{bad:?}");
        }
    }
}
