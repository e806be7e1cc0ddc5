//! Proxy pools in Redis: atomic least-used allocation, and admitting and
//! removing members without letting a (re)joining member draw every
//! allocation.
//!
//! Its keys live in the process's one Redis connection
//! ([`crate::redis_connection`]), under `laurel:pool:`.
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
//!
//! A pool with the `least-concurrent` policy also hands out **leases**:
//! [`ProxyPools::acquire`] picks the member with the fewest unexpired
//! leases (ties: the fewest allocations, then by name), counts the
//! allocation as above, and records a lease that [`ProxyPools::release`]
//! ends or that expires by itself (work abandoned by a dead process). The
//! in-flight count is kept apart from the allocation count: the score never
//! says what is in flight. Expiry uses Redis's own clock, so processes on
//! machines with different clocks agree.
//!
//! What a pool admits and its candidates are kept in PostgreSQL
//! ([`candidates`]); Redis holds only what allocation needs, and the
//! re-checker puts eligible members back if Redis lost them.

pub mod candidates;
pub mod recheck;

use std::time::Duration;

use redis::{AsyncCommands, Script};

use crate::redis_connection::{ConnectError, RedisConnection};

pub use candidates::{
    CheckOutcome, Eligibility, ImportReport, InvalidPool, JunkLine, ListFetchError, MemberStatus,
    PoolStatus, ProxyPoolError, check, checked_pool, parse_candidates, pool_status,
};

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

/// Expires the pool's overdue leases. KEYS: eligible, in-flight, leases,
/// lease owners, lease sequence. Sets `now` (ms, Redis's clock).
const REAP: &str = "local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function ended(id)
  local proxy = redis.call('HGET', KEYS[4], id)
  redis.call('HDEL', KEYS[4], id)
  if proxy then
    if tonumber(redis.call('HINCRBY', KEYS[2], proxy, -1)) <= 0 then redis.call('HDEL', KEYS[2], proxy) end
  end
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 1000)) do
  redis.call('ZREM', KEYS[3], id)
  ended(id)
end
";

/// Takes a lease: the eligible member with the fewest leases in flight
/// (below ARGV[2] unless it is 0), ties to the fewest allocations then by
/// name (the eligible set's order); counts the allocation. ARGV[1]: the
/// lease's time to live in ms. Returns {proxy, lease id, expiry ms}.
const ACQUIRE: &str = "local chosen, least = nil, nil
local cap = tonumber(ARGV[2])
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local n = tonumber(redis.call('HGET', KEYS[2], member) or '0')
  if (cap == 0 or n < cap) and (least == nil or n < least) then chosen, least = member, n end
  if least == 0 then break end
end
if not chosen then return nil end
redis.call('ZINCRBY', KEYS[1], 1, chosen)
redis.call('HINCRBY', KEYS[2], chosen, 1)
local id = tostring(redis.call('INCR', KEYS[5]))
local expires = now + tonumber(ARGV[1])
redis.call('ZADD', KEYS[3], expires, id)
redis.call('HSET', KEYS[4], id, chosen)
return {chosen, id, tostring(expires)}";

/// Ends lease ARGV[1]; 0 if it had already ended (expired or released).
const RELEASE: &str = "if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then return 0 end
ended(ARGV[1])
return 1";

/// Leases in flight per member, after expiring the overdue.
const IN_FLIGHT: &str = "return redis.call('HGETALL', KEYS[2])";

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

/// How a pool hands out its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The member with the fewest allocations; nothing is held.
    LeastUsed,
    /// The member with the fewest leases in flight, under a lease that is
    /// released after the request or expires after `ttl`; a member holds
    /// at most `max_in_flight` leases when set.
    LeastConcurrent {
        ttl: Duration,
        max_in_flight: Option<u32>,
    },
}

impl Policy {
    pub const NAMES: &[&str] = &["least-used", "least-concurrent"];

    /// The policy of a stored pool.
    pub fn of(pool: &crate::store::ProxyPoolRow) -> Policy {
        match pool.policy.as_str() {
            "least-concurrent" => Policy::LeastConcurrent {
                ttl: pool.lease_ttl,
                max_in_flight: pool.max_in_flight.map(|n| n.max(1) as u32),
            },
            _ => Policy::LeastUsed,
        }
    }
}

/// A proxy handed out for one request; give it back with
/// [`ProxyPools::give_back`] when the request is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub pool: String,
    pub proxy: String,
    /// Under the least-concurrent policy.
    pub lease: Option<Lease>,
}

/// A lease on a member of a least-concurrent pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub id: String,
    /// Milliseconds since the epoch, by Redis's clock.
    pub expires_at_ms: i64,
}

/// Proxy pools over one multiplexed Redis connection (reconnecting by
/// itself): clone it freely, calls from many tasks pipeline.
#[derive(Clone)]
pub struct ProxyPools {
    redis: RedisConnection,
    allocate: Script,
    admit: Script,
    remove: Script,
    acquire: Script,
    release: Script,
    in_flight: Script,
}

fn key(pool: &str, part: &str) -> String {
    format!("laurel:pool:{{{pool}}}:{part}")
}

fn eligible_key(pool: &str) -> String {
    key(pool, "eligible")
}

fn history_key(pool: &str) -> String {
    key(pool, "history")
}

/// Every key of a pool, in the order the lease scripts take them.
fn lease_keys(pool: &str) -> [String; 5] {
    [
        eligible_key(pool),
        key(pool, "in-flight"),
        key(pool, "leases"),
        key(pool, "lease-owners"),
        key(pool, "lease-seq"),
    ]
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
        let redis = RedisConnection::connect(url)
            .await
            .map_err(|error| match error {
                ConnectError::InvalidUrl { url, reason } => ProxyError::InvalidUrl { url, reason },
                ConnectError::Unreachable { url, reason } => ProxyError::Redis {
                    pool: "*".into(),
                    url,
                    reason,
                },
            })?;
        Ok(ProxyPools::on(redis))
    }

    /// Proxy pools in an open connection.
    pub fn on(redis: RedisConnection) -> ProxyPools {
        ProxyPools {
            redis,
            allocate: Script::new(ALLOCATE),
            admit: Script::new(ADMIT),
            remove: Script::new(REMOVE),
            acquire: Script::new(&format!("{REAP}{ACQUIRE}")),
            release: Script::new(&format!("{REAP}{RELEASE}")),
            in_flight: Script::new(&format!("{REAP}{IN_FLIGHT}")),
        }
    }

    /// The connection the pools live in (shared with the key-value stores).
    pub fn redis(&self) -> &RedisConnection {
        &self.redis
    }

    fn failed(&self, pool: &str, error: redis::RedisError) -> ProxyError {
        ProxyError::Redis {
            pool: pool.to_string(),
            url: self.redis.url().to_string(),
            reason: error.to_string(),
        }
    }

    /// The eligible member with the fewest allocations (ties: the first by
    /// name), counted; `None` when the pool has no eligible member.
    pub async fn allocate(&self, pool: &str) -> Result<Option<String>, ProxyError> {
        check_pool(pool)?;
        let mut connection = self.redis.handle();
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
        let mut connection = self.redis.handle();
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
        let mut connection = self.redis.handle();
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
        let mut connection = self.redis.handle();
        connection
            .zrange_withscores(eligible_key(pool), 0, -1)
            .await
            .map_err(|e| self.failed(pool, e))
    }

    /// Answers if Redis does (health checks).
    pub async fn ping(&self) -> Result<(), ProxyError> {
        self.redis.ping().await.map_err(|e| self.failed("*", e))
    }

    /// Every allocation count the pool has: its eligible members' and the
    /// kept counts of those out of the set.
    pub async fn counts(&self, pool: &str) -> Result<Vec<(String, f64)>, ProxyError> {
        check_pool(pool)?;
        let mut connection = self.redis.handle();
        type Counts = Vec<(String, f64)>;
        let (kept, eligible): (Counts, Counts) = redis::pipe()
            .hgetall(history_key(pool))
            .zrange_withscores(eligible_key(pool), 0, -1)
            .query_async(&mut connection)
            .await
            .map_err(|e| self.failed(pool, e))?;
        let mut counts: std::collections::BTreeMap<String, f64> = kept.into_iter().collect();
        counts.extend(eligible);
        Ok(counts.into_iter().collect())
    }

    /// Deletes a pool's keys (its members, their past counts, leases).
    pub async fn delete_pool(&self, pool: &str) -> Result<(), ProxyError> {
        check_pool(pool)?;
        let mut connection = self.redis.handle();
        let mut keys = lease_keys(pool).to_vec();
        keys.push(history_key(pool));
        connection
            .del::<_, ()>(&keys)
            .await
            .map_err(|e| self.failed(pool, e))
    }

    /// Runs one of the lease scripts on `pool`'s keys with `args`.
    async fn lease_script<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        pool: &str,
        args: &[String],
    ) -> Result<T, ProxyError> {
        check_pool(pool)?;
        let mut connection = self.redis.handle();
        let mut invocation = script.prepare_invoke();
        for key in lease_keys(pool) {
            invocation.key(key);
        }
        for arg in args {
            invocation.arg(arg);
        }
        invocation
            .invoke_async(&mut connection)
            .await
            .map_err(|e| self.failed(pool, e))
    }

    /// Takes a lease on the least-concurrent member (see the module
    /// docs); `None` when no eligible member is below `max_in_flight`.
    pub async fn acquire(
        &self,
        pool: &str,
        ttl: Duration,
        max_in_flight: Option<u32>,
    ) -> Result<Option<(String, Lease)>, ProxyError> {
        let args = [
            ttl.as_millis().max(1).to_string(),
            max_in_flight.unwrap_or(0).to_string(),
        ];
        let taken: Option<(String, String, String)> =
            self.lease_script(&self.acquire, pool, &args).await?;
        Ok(taken.map(|(proxy, id, expires)| {
            (
                proxy,
                Lease {
                    id,
                    expires_at_ms: expires.parse().unwrap_or_default(),
                },
            )
        }))
    }

    /// Ends a lease; false if it had already ended (expired, or released
    /// before).
    pub async fn release(&self, pool: &str, lease: &Lease) -> Result<bool, ProxyError> {
        let ended: i64 = self
            .lease_script(&self.release, pool, std::slice::from_ref(&lease.id))
            .await?;
        Ok(ended == 1)
    }

    /// Unexpired leases per member (members without any are left out).
    pub async fn in_flight(&self, pool: &str) -> Result<Vec<(String, u32)>, ProxyError> {
        let mut counts: Vec<(String, u32)> = self.lease_script(&self.in_flight, pool, &[]).await?;
        counts.sort();
        Ok(counts)
    }

    /// A proxy for one request under `policy`; `None` when the pool has
    /// none to give (the request is not to be sent).
    pub async fn take(&self, pool: &str, policy: Policy) -> Result<Option<Taken>, ProxyError> {
        Ok(match policy {
            Policy::LeastUsed => self.allocate(pool).await?.map(|proxy| Taken {
                pool: pool.to_string(),
                proxy,
                lease: None,
            }),
            Policy::LeastConcurrent { ttl, max_in_flight } => self
                .acquire(pool, ttl, max_in_flight)
                .await?
                .map(|(proxy, lease)| Taken {
                    pool: pool.to_string(),
                    proxy,
                    lease: Some(lease),
                }),
        })
    }

    /// Ends what [`ProxyPools::take`] handed out (a lease, if any).
    pub async fn give_back(&self, taken: &Taken) -> Result<(), ProxyError> {
        if let Some(lease) = &taken.lease {
            self.release(&taken.pool, lease).await?;
        }
        Ok(())
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
        for key in lease_keys("public") {
            assert!(key.starts_with("laurel:pool:{public}:"), "{key}");
        }
    }

    #[test]
    fn pool_names_are_checked() {
        assert!(check_pool("public-1").is_ok());
        for bad in ["", "-x", "a b", "a}b", &"x".repeat(129)] {
            assert!(check_pool(bad).is_err(), "{bad:?}");
        }
    }
}
