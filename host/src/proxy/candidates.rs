//! Candidates: free proxy lists read, each candidate checked through
//! itself against its pool's rules, the outcome kept in PostgreSQL and the
//! eligible ones admitted to the pool in Redis; and the re-checker, which
//! checks every candidate again on its pool's interval, so a member that
//! fails leaves the eligible set (its count kept) and one that recovers
//! comes back (under the restore policy).

use std::time::Duration;

use futures_util::StreamExt;
use tracing::info;

use super::{Policy, ProxyError, ProxyPools, check_pool};
use crate::store::{ProxyPoolRow, Store, StoreError};

/// A line of a candidate list that is not a proxy address.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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
        let url = match crate::outbound::Url::parse(line) {
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
    pub timeout: Duration,
    /// Schemes a member may have (e.g. `http`).
    pub schemes: Vec<String>,
    /// Slower answers are refused.
    pub max_latency: Duration,
    /// Hosts never admitted.
    pub deny: Vec<String>,
    /// Admit loopback, link-local and private addresses.
    pub allow_private: bool,
}

impl Eligibility {
    pub fn of(pool: &ProxyPoolRow) -> Eligibility {
        Eligibility {
            check_url: pool.check_url.clone(),
            timeout: pool.timeout,
            schemes: pool.schemes.clone(),
            max_latency: pool.max_latency,
            deny: pool.deny.clone(),
            allow_private: pool.allow_private,
        }
    }
}

/// A pool's settings that cannot be stored, with every problem.
#[derive(Debug, Clone, thiserror::Error)]
#[error("proxy pool {pool}: {}", problems.join("; "))]
pub struct InvalidPool {
    pub pool: String,
    pub problems: Vec<String>,
}

/// Checks a pool's settings before they are stored: every problem at once.
pub fn checked_pool(pool: &ProxyPoolRow) -> Result<(), InvalidPool> {
    let mut problems = Vec::new();
    if let Err(error) = check_pool(&pool.name) {
        problems.push(error.to_string());
    }
    if !Policy::NAMES.contains(&pool.policy.as_str()) {
        problems.push(format!(
            "unknown policy {:?} (expected {})",
            pool.policy,
            Policy::NAMES.join(" or ")
        ));
    }
    match crate::outbound::Url::parse(&pool.check_url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {}
        _ => problems.push(format!(
            "check URL {:?} is not an http(s) URL with a host",
            pool.check_url
        )),
    }
    if pool.schemes.is_empty() {
        problems.push("at least one scheme must be allowed".into());
    }
    for scheme in &pool.schemes {
        if !["http", "https", "socks5", "socks5h"].contains(&scheme.as_str()) {
            problems.push(format!(
                "scheme {scheme:?} is not a proxy scheme (http, https, socks5, socks5h)"
            ));
        }
    }
    for (what, value) in [
        ("timeout", pool.timeout),
        ("latency ceiling", pool.max_latency),
        ("re-check interval", pool.recheck_every),
        ("lease time to live", pool.lease_ttl),
    ] {
        if value.is_zero() || value > Duration::from_secs(86_400 * 20) {
            problems.push(format!("{what} must be between 1 ms and 20 days"));
        }
    }
    if pool.max_in_flight.is_some_and(|n| n < 1) {
        problems.push("max in flight must be at least 1".into());
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(InvalidPool {
            pool: pool.name.clone(),
            problems,
        })
    }
}

/// A candidate's check: its latency if eligible, else why not.
pub type CheckOutcome = Result<Duration, String>;

/// Checks one candidate; its latency if eligible, else why not.
pub async fn check(candidate: &str, rules: &Eligibility) -> CheckOutcome {
    let url = crate::outbound::Url::parse(candidate).map_err(|e| format!("not an address: {e}"))?;
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
    if !rules.allow_private {
        let port = url.port_or_known_default().unwrap_or(0);
        let addresses = tokio::time::timeout(rules.timeout, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| {
                format!(
                    "resolving {host} took over {} ms",
                    rules.timeout.as_millis()
                )
            })?
            .map_err(|e| format!("cannot resolve {host}: {e}"))?;
        for address in addresses {
            if let Some(kind) = internal(address.ip()) {
                return Err(format!(
                    "{host} is {kind} address ({}): refused unless the pool allows private addresses",
                    address.ip()
                ));
            }
        }
    }
    let proxy =
        crate::outbound::Proxy::all(candidate).map_err(|e| format!("unusable as a proxy: {e}"))?;
    let client = crate::outbound::client()
        .proxy(proxy)
        .timeout(rules.timeout)
        .build()
        .map_err(|e| format!("unusable as a proxy: {e}"))?;
    // A token chosen for this check, in the check URL: the answer must
    // carry it back, so a candidate that answers everything itself (and
    // would swallow webhooks) is not taken for one that forwards.
    let token = crate::secrets::random_token();
    let mut check_url = crate::outbound::Url::parse(&rules.check_url)
        .map_err(|e| format!("the pool's check URL is invalid: {e}"))?;
    check_url
        .query_pairs_mut()
        .append_pair("laurel-check", &token);
    let started = std::time::Instant::now();
    let response = client.get(check_url).send().await.map_err(|e| {
        format!(
            "the check request through it failed: {}",
            crate::outbound::error_chain(&e.without_url())
        )
    })?;
    let latency = started.elapsed();
    if !response.status().is_success() {
        return Err(format!(
            "the check URL answered {} through it",
            response.status()
        ));
    }
    let body = crate::outbound::read_limited(response, CHECK_BODY_BYTES)
        .await
        .map_err(|e| format!("reading the check answer through it failed: {e}"))?;
    if !String::from_utf8_lossy(&body).contains(&token) {
        return Err(
            "the answer through it does not carry the check token (it answers by itself instead of forwarding)"
                .to_string(),
        );
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

/// Most of a check answer read.
const CHECK_BODY_BYTES: usize = 64 << 10;

/// What kind of internal address `ip` is, if it is one: loopback,
/// link-local, private (RFC 1918, unique local, shared/CGNAT) or
/// unspecified.
pub fn internal(ip: std::net::IpAddr) -> Option<&'static str> {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_loopback() {
                Some("a loopback")
            } else if v4.is_link_local() {
                Some("a link-local")
            } else if v4.is_private() || (a == 100 && (64..128).contains(&b)) {
                Some("a private")
            } else if v4.is_unspecified() || v4.is_broadcast() {
                Some("an unspecified")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return internal(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("a loopback")
            } else if first & 0xffc0 == 0xfe80 {
                Some("a link-local")
            } else if first & 0xfe00 == 0xfc00 {
                Some("a private")
            } else if v6.is_unspecified() {
                Some("an unspecified")
            } else {
                None
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyPoolError {
    #[error(
        "proxy pool {0} is not configured: set its check URL first (laurel proxies pool set {0} --check-url URL)"
    )]
    Unknown(String),
    #[error(transparent)]
    Redis(#[from] ProxyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What importing a candidate list (or checking a pool) did.
#[derive(Debug, Default, Clone)]
pub struct ImportReport {
    /// Eligible, with the check's latency and the count it starts at.
    pub admitted: Vec<(String, Duration, f64)>,
    /// Candidates that failed a check, with why.
    pub refused: Vec<(String, String)>,
    /// Candidates dropped because a replacing list left them out.
    pub dropped: Vec<String>,
    pub junk: Vec<JunkLine>,
}

/// Checks candidates of one pool concurrently, records each outcome and
/// admits or removes each in Redis.
/// How far the checks of an import are, as each ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checking {
    pub checked: usize,
    pub total: usize,
    pub refused: usize,
}

/// Follows an import's checks (a command's progress bar).
pub type Watch<'a> = &'a (dyn Fn(Checking) + Sync);

async fn check_and_apply(
    store: &Store,
    pools: &ProxyPools,
    pool: &ProxyPoolRow,
    candidates: Vec<String>,
    report: &mut ImportReport,
    watch: Watch<'_>,
) -> Result<(), ProxyPoolError> {
    let rules = Eligibility::of(pool);
    let mut seen = Checking {
        checked: 0,
        total: candidates.len(),
        refused: 0,
    };
    watch(seen);
    let checked: Vec<(String, CheckOutcome)> =
        futures_util::stream::iter(candidates.into_iter().map(|candidate| {
            let rules = &rules;
            async move {
                let outcome = check(&candidate, rules).await;
                (candidate, outcome)
            }
        }))
        .buffer_unordered(16)
        .inspect(|(_, outcome)| {
            seen.checked += 1;
            seen.refused += usize::from(outcome.is_err());
            watch(seen);
        })
        .collect()
        .await;
    for (candidate, outcome) in checked {
        // Redis first: a candidate recorded eligible is in the set.
        match &outcome {
            Ok(latency) => {
                let start = pools.admit(&pool.name, &candidate).await?;
                report.admitted.push((candidate.clone(), *latency, start));
            }
            Err(reason) => {
                pools.remove(&pool.name, &candidate).await?;
                report.refused.push((candidate.clone(), reason.clone()));
            }
        }
        store
            .record_proxy_check(&pool.name, &candidate, &outcome)
            .await?;
    }
    report.admitted.sort_by(|a, b| a.0.cmp(&b.0));
    report.refused.sort();
    Ok(())
}

async fn configured(store: &Store, pool: &str) -> Result<ProxyPoolRow, ProxyPoolError> {
    check_pool(pool)?;
    store
        .proxy_pool(pool)
        .await?
        .ok_or_else(|| ProxyPoolError::Unknown(pool.to_string()))
}

/// Reads a candidate list into a configured pool: every candidate is
/// recorded and checked now, the eligible admitted. With `replace`, the
/// pool's candidates not in the list are dropped (and leave the eligible
/// set, their counts kept).
pub async fn import(
    store: &Store,
    pools: &ProxyPools,
    pool: &str,
    list: &str,
    replace: bool,
) -> Result<ImportReport, ProxyPoolError> {
    import_watched(store, pools, pool, list, replace, &|_| {}).await
}

/// [`import`], telling `watch` how far the checks are.
pub async fn import_watched(
    store: &Store,
    pools: &ProxyPools,
    pool: &str,
    list: &str,
    replace: bool,
    watch: Watch<'_>,
) -> Result<ImportReport, ProxyPoolError> {
    let config = configured(store, pool).await?;
    let (candidates, junk) = parse_candidates(list);
    let mut report = ImportReport {
        junk,
        ..ImportReport::default()
    };
    if replace {
        report.dropped = store
            .drop_proxy_candidates_except(pool, &candidates)
            .await?;
        for proxy in &report.dropped {
            pools.remove(pool, proxy).await?;
        }
    }
    store.add_proxy_candidates(pool, &candidates).await?;
    check_and_apply(store, pools, &config, candidates, &mut report, watch).await?;
    Ok(report)
}

/// Checks every candidate of a pool now (as the re-checker would).
pub async fn check_pool_now(
    store: &Store,
    pools: &ProxyPools,
    pool: &str,
) -> Result<ImportReport, ProxyPoolError> {
    check_pool_watched(store, pools, pool, &|_| {}).await
}

/// [`check_pool_now`], telling `watch` how far the checks are.
pub async fn check_pool_watched(
    store: &Store,
    pools: &ProxyPools,
    pool: &str,
    watch: Watch<'_>,
) -> Result<ImportReport, ProxyPoolError> {
    let config = configured(store, pool).await?;
    let candidates = store
        .proxy_candidates(pool)
        .await?
        .into_iter()
        .map(|c| c.proxy)
        .collect();
    let mut report = ImportReport::default();
    check_and_apply(store, pools, &config, candidates, &mut report, watch).await?;
    Ok(report)
}

/// Re-checks up to `limit` candidates that are due (any pool); returns
/// how many it checked.
pub async fn recheck_due(
    store: &Store,
    pools: &ProxyPools,
    limit: i64,
) -> Result<usize, ProxyPoolError> {
    // The claim outlives any check: the slowest check of a batch takes at
    // most its pool's timeout (checks run concurrently).
    let due = store
        .claim_proxy_checks(limit, Duration::from_secs(120))
        .await?;
    let checked = due.len();
    let mut by_pool: Vec<(ProxyPoolRow, Vec<String>)> = Vec::new();
    for (pool, proxy) in due {
        match by_pool.last_mut() {
            Some((last, proxies)) if last.name == pool.name => proxies.push(proxy),
            _ => by_pool.push((pool, vec![proxy])),
        }
    }
    for (pool, proxies) in by_pool {
        let mut report = ImportReport::default();
        check_and_apply(store, pools, &pool, proxies, &mut report, &|_| {}).await?;
        for (proxy, reason) in &report.refused {
            info!(message = "Proxy is not eligible.", pool = %pool.name, %proxy, %reason);
        }
    }
    Ok(checked)
}

/// The largest candidate list read from a URL.
pub const MAX_LIST_BYTES: usize = 8 << 20;

/// Why a proxy list could not be fetched (the URL shown without its
/// credentials).
#[derive(Debug, thiserror::Error)]
pub enum ListFetchError {
    #[error("an HTTP client: {0}")]
    Client(String),
    #[error("GET {url} failed: {reason}")]
    Failed { url: String, reason: String },
    #[error("GET {url} answered {status}")]
    Status {
        url: String,
        status: crate::outbound::StatusCode,
    },
    #[error("GET {url}: the list is over {} MiB", MAX_LIST_BYTES >> 20)]
    TooLarge { url: String },
    #[error("GET {url}: the list is not UTF-8 text")]
    NotText { url: String },
}

/// Fetches a free proxy list from an http(s) URL (directly, not through a
/// pool), refusing more than [`MAX_LIST_BYTES`].
pub async fn fetch_list(url: &str) -> Result<String, ListFetchError> {
    let shown = || crate::secrets::redact_url(url);
    let failed = |e: crate::outbound::Error| ListFetchError::Failed {
        url: shown(),
        reason: crate::outbound::error_chain(&e.without_url()),
    };
    let client = crate::outbound::client()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| ListFetchError::Client(e.to_string()))?;
    let mut response = client.get(url).send().await.map_err(failed)?;
    if !response.status().is_success() {
        return Err(ListFetchError::Status {
            url: shown(),
            status: response.status(),
        });
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_LIST_BYTES {
            return Err(ListFetchError::TooLarge { url: shown() });
        }
    }
    String::from_utf8(body).map_err(|_| ListFetchError::NotText { url: shown() })
}

/// One proxy of a pool as an operator sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MemberStatus {
    pub proxy: String,
    pub eligible: bool,
    /// Why it is not eligible.
    pub reason: Option<String>,
    /// Allocations so far (kept while it is out of the eligible set).
    pub allocations: f64,
    /// Unexpired leases (least-concurrent pools).
    pub in_flight: u32,
    pub latency_ms: Option<i32>,
    pub checked_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A pool: its settings (if configured) and every proxy it knows.
#[derive(Debug, Clone)]
pub struct PoolStatus {
    pub config: Option<ProxyPoolRow>,
    pub members: Vec<MemberStatus>,
}

/// A pool's candidates with their eligibility and why, allocation counts
/// and leases in flight; members admitted straight into Redis (without a
/// stored candidate) are listed as eligible.
pub async fn pool_status(
    store: &Store,
    pools: &ProxyPools,
    pool: &str,
) -> Result<PoolStatus, ProxyPoolError> {
    check_pool(pool)?;
    let config = store.proxy_pool(pool).await?;
    let candidates = store.proxy_candidates(pool).await?;
    let counts: std::collections::HashMap<String, f64> =
        pools.counts(pool).await?.into_iter().collect();
    let eligible: std::collections::HashSet<String> = pools
        .members(pool)
        .await?
        .into_iter()
        .map(|(proxy, _)| proxy)
        .collect();
    let in_flight: std::collections::HashMap<String, u32> =
        pools.in_flight(pool).await?.into_iter().collect();
    let mut members: Vec<MemberStatus> = candidates
        .into_iter()
        .map(|c| MemberStatus {
            allocations: counts.get(&c.proxy).copied().unwrap_or(0.0),
            in_flight: in_flight.get(&c.proxy).copied().unwrap_or(0),
            eligible: eligible.contains(&c.proxy),
            reason: match (eligible.contains(&c.proxy), c.reason) {
                (true, _) => None,
                (false, Some(reason)) => Some(reason),
                (false, None) if c.checks == 0 => Some("not checked yet".into()),
                (false, None) => {
                    Some("not in the eligible set in Redis (re-admitted at its next check)".into())
                }
            },
            latency_ms: c.latency_ms,
            checked_at: c.checked_at,
            proxy: c.proxy,
        })
        .collect();
    for proxy in &eligible {
        if !members.iter().any(|m| &m.proxy == proxy) {
            members.push(MemberStatus {
                proxy: proxy.clone(),
                eligible: true,
                reason: None,
                allocations: counts.get(proxy).copied().unwrap_or(0.0),
                in_flight: in_flight.get(proxy).copied().unwrap_or(0),
                latency_ms: None,
                checked_at: None,
            });
        }
    }
    members.sort_by(|a, b| a.proxy.cmp(&b.proxy));
    Ok(PoolStatus { config, members })
}
