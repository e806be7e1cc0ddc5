//! Proxy pools: settings, members and their eligibility, candidate
//! imports, allocation.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Serialize;

use super::{flag, time};
use crate::api::{ApiError, AppState, body, json_body, whole_number};
use crate::proxy::candidates::JunkLine;
use crate::store::ProxyPoolRow;

/// A pool's settings: `laurel proxies pool set`'s flags in snake_case,
/// with the same defaults.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PoolBody {
    check_url: String,
    #[serde(default = "least_used")]
    policy: String,
    #[serde(default = "five_seconds")]
    timeout_ms: u64,
    #[serde(default = "two_seconds")]
    max_latency_ms: u64,
    #[serde(default = "http_only")]
    schemes: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default = "five_minutes")]
    recheck_ms: u64,
    #[serde(default = "one_minute")]
    lease_ttl_ms: u64,
    #[serde(default)]
    max_in_flight: Option<i32>,
    #[serde(default)]
    allow_private: bool,
}

fn least_used() -> String {
    "least-used".into()
}
fn five_seconds() -> u64 {
    5_000
}
fn two_seconds() -> u64 {
    2_000
}
fn http_only() -> Vec<String> {
    vec!["http".into()]
}
fn five_minutes() -> u64 {
    300_000
}
fn one_minute() -> u64 {
    60_000
}

/// `PUT /proxy-pools/{pool}`: the settings now stored.
#[derive(Debug, Serialize)]
pub(super) struct PoolSaved {
    pool: String,
    policy: String,
    check_url: String,
}

pub(super) async fn put(
    State(state): State<Arc<AppState>>,
    Path(pool): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<PoolSaved>, ApiError> {
    let value = json_body(raw, state.settings.max_body_bytes)?;
    let body: PoolBody = serde_json::from_value(value)
        .map_err(|error| ApiError::unprocessable(format!("proxy pool {pool}: {error}")))?;
    let ms = Duration::from_millis;
    let row = ProxyPoolRow {
        name: pool.clone(),
        policy: body.policy,
        check_url: body.check_url,
        timeout: ms(body.timeout_ms),
        schemes: body.schemes,
        max_latency: ms(body.max_latency_ms),
        deny: body.deny,
        recheck_every: ms(body.recheck_ms),
        lease_ttl: ms(body.lease_ttl_ms),
        max_in_flight: body.max_in_flight,
        allow_private: body.allow_private,
    };
    crate::proxy::checked_pool(&row).map_err(|error| ApiError::unprocessable(error.to_string()))?;
    state.store().await?.set_proxy_pool(&row).await?;
    Ok(Json(PoolSaved {
        pool,
        policy: row.policy,
        check_url: row.check_url,
    }))
}

pub(super) async fn delete(
    State(state): State<Arc<AppState>>,
    Path(pool): Path<String>,
) -> Result<StatusCode, ApiError> {
    crate::proxy::check_pool(&pool).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let existed = state.store().await?.delete_proxy_pool(&pool).await?;
    state.proxies().await?.delete_pool(&pool).await?;
    if !existed {
        return Err(ApiError::NotFound(format!("no proxy pool named {pool}")));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /proxy-pools/{pool}`: its settings and every member, eligible or
/// not (and why).
#[derive(Debug, Serialize)]
pub(super) struct PoolView {
    pool: String,
    configured: bool,
    config: Option<PoolSettings>,
    eligible: usize,
    members: Vec<PoolMember>,
}

#[derive(Debug, Serialize)]
pub(super) struct PoolSettings {
    policy: String,
    check_url: String,
    timeout_ms: u64,
    schemes: Vec<String>,
    max_latency_ms: u64,
    deny: Vec<String>,
    recheck_every_s: u64,
    lease_ttl_ms: u64,
    max_in_flight: Option<i32>,
    allow_private: bool,
}

impl PoolSettings {
    fn of(c: &ProxyPoolRow) -> PoolSettings {
        PoolSettings {
            policy: c.policy.clone(),
            check_url: c.check_url.clone(),
            timeout_ms: millis(c.timeout),
            schemes: c.schemes.clone(),
            max_latency_ms: millis(c.max_latency),
            deny: c.deny.clone(),
            recheck_every_s: c.recheck_every.as_secs(),
            lease_ttl_ms: millis(c.lease_ttl),
            max_in_flight: c.max_in_flight,
            allow_private: c.allow_private,
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct PoolMember {
    proxy: String,
    eligible: bool,
    /// Why it is not eligible.
    reason: Option<String>,
    #[serde(serialize_with = "whole_number")]
    allocations: f64,
    in_flight: u32,
    latency_ms: Option<i32>,
    checked_at: Option<String>,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `GET /proxy-pools`: every configured pool's settings (members: `GET
/// /proxy-pools/{pool}`).
#[derive(Debug, Serialize)]
pub(super) struct PoolList {
    pools: Vec<PoolLine>,
}

#[derive(Debug, Serialize)]
pub(super) struct PoolLine {
    pool: String,
    config: PoolSettings,
}

pub(super) async fn list(State(state): State<Arc<AppState>>) -> Result<Json<PoolList>, ApiError> {
    let pools = state
        .store()
        .await?
        .proxy_pools()
        .await?
        .iter()
        .map(|row| PoolLine {
            pool: row.name.clone(),
            config: PoolSettings::of(row),
        })
        .collect();
    Ok(Json(PoolList { pools }))
}

pub(super) async fn get(
    State(state): State<Arc<AppState>>,
    Path(pool): Path<String>,
) -> Result<Json<PoolView>, ApiError> {
    let store = state.store().await?;
    let status =
        crate::proxy::candidates::pool_status(&store, state.proxies().await?, &pool).await?;
    if status.config.is_none() && status.members.is_empty() {
        return Err(ApiError::NotFound(format!(
            "no proxy pool named {pool} (configure it with laurel proxies pool set {pool} --check-url URL)"
        )));
    }
    let members: Vec<PoolMember> = status
        .members
        .into_iter()
        .map(|m| PoolMember {
            proxy: m.proxy,
            eligible: m.eligible,
            reason: m.reason,
            allocations: m.allocations,
            in_flight: m.in_flight,
            latency_ms: m.latency_ms,
            checked_at: m.checked_at.map(time),
        })
        .collect();
    Ok(Json(PoolView {
        pool,
        configured: status.config.is_some(),
        config: status.config.as_ref().map(PoolSettings::of),
        eligible: members.iter().filter(|m| m.eligible).count(),
        members,
    }))
}

/// `PUT /proxy-pools/{pool}/candidates`: what was admitted, refused (why),
/// dropped, and the lines that are not addresses.
#[derive(Debug, Serialize)]
pub(super) struct Imported {
    pool: String,
    admitted: Vec<Admitted>,
    refused: Vec<Refused>,
    dropped: Vec<String>,
    junk: Vec<JunkLine>,
}

#[derive(Debug, Serialize)]
pub(super) struct Admitted {
    proxy: String,
    latency_ms: u64,
    /// The allocation count it starts at (the pool's least, so it is not
    /// flooded).
    #[serde(serialize_with = "whole_number")]
    allocations: f64,
}

#[derive(Debug, Serialize)]
pub(super) struct Refused {
    proxy: String,
    reason: String,
}

pub(super) async fn candidates(
    State(state): State<Arc<AppState>>,
    Path(pool): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Imported>, ApiError> {
    let bytes = body(raw, state.settings.max_body_bytes)?;
    let list = std::str::from_utf8(&bytes).map_err(|_| {
        ApiError::BadRequest(
            "the candidate list must be UTF-8 text, one scheme://host:port a line".into(),
        )
    })?;
    let replace = flag(&query, "replace")?;
    let store = state.store().await?;
    let report =
        crate::proxy::candidates::import(&store, state.proxies().await?, &pool, list, replace)
            .await?;
    Ok(Json(Imported {
        pool,
        admitted: report
            .admitted
            .into_iter()
            .map(|(proxy, latency, allocations)| Admitted {
                proxy,
                latency_ms: millis(latency),
                allocations,
            })
            .collect(),
        refused: report
            .refused
            .into_iter()
            .map(|(proxy, reason)| Refused { proxy, reason })
            .collect(),
        dropped: report.dropped,
        junk: report.junk,
    }))
}

/// `POST /proxy-pools/{pool}/allocate`: the member allocated.
#[derive(Debug, Serialize)]
pub(super) struct Allocated {
    proxy: String,
}

pub(super) async fn allocate(
    State(state): State<Arc<AppState>>,
    Path(pool): Path<String>,
) -> Result<Json<Allocated>, ApiError> {
    match state.proxies().await?.allocate(&pool).await? {
        Some(proxy) => Ok(Json(Allocated { proxy })),
        None => Err(ApiError::Conflict(format!(
            "proxy pool {pool} has no eligible member"
        ))),
    }
}
