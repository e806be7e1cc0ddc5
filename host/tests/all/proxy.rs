//! Proxy pools against the real Redis on loopback (`LAUREL_TEST_REDIS_URL`,
//! default `redis://127.0.0.1:6379`) and real forward proxies (tinyproxy):
//! atomic least-used allocation under concurrency, the empty pool, the
//! restore policy, Redis not there, eligibility and re-checks, leases.

use std::collections::BTreeMap;
use std::time::Duration;

use laurel::proxy::{ProxyPools, candidates};
use laurel::store::ProxyPoolRow;

use crate::support::TestDb;

pub fn redis_url() -> String {
    std::env::var("LAUREL_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A pool name of its own per test run, so runs and tests don't meet.
pub fn pool_name(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("test-{test}-{}-{nanos}", std::process::id())
}

async fn pool_with(pools: &ProxyPools, pool: &str, members: usize) {
    for n in 0..members {
        pools
            .admit(pool, &format!("http://127.0.0.1:{}", 20000 + n))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_workers_allocate_16000_times_and_the_spread_stays_within_one() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let pool = pool_name("spread");
    pool_with(&pools, &pool, 10).await;
    let mut workers = Vec::new();
    for _ in 0..16 {
        let (pools, pool) = (pools.clone(), pool.clone());
        workers.push(tokio::spawn(async move {
            let mut got = BTreeMap::<String, u32>::new();
            for _ in 0..1000 {
                let proxy = pools.allocate(&pool).await.unwrap().expect("a proxy");
                *got.entry(proxy).or_default() += 1;
            }
            got
        }));
    }
    let mut seen = BTreeMap::<String, u32>::new();
    for worker in workers {
        for (proxy, n) in worker.await.unwrap() {
            *seen.entry(proxy).or_default() += n;
        }
    }
    let members = pools.members(&pool).await.unwrap();
    let scores: Vec<f64> = members.iter().map(|(_, s)| *s).collect();
    assert_eq!(scores.iter().sum::<f64>(), 16_000.0);
    let (min, max) = (
        scores.iter().cloned().fold(f64::MAX, f64::min),
        scores.iter().cloned().fold(f64::MIN, f64::max),
    );
    assert!(max - min <= 1.0, "spread {min}..{max}: {members:?}");
    // What the workers were handed is what Redis counted.
    let counted: BTreeMap<String, u32> = members
        .iter()
        .map(|(m, s)| (m.clone(), *s as u32))
        .collect();
    assert_eq!(seen, counted);
    pools.delete_pool(&pool).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pool_allocates_nothing() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let pool = pool_name("empty");
    assert_eq!(pools.allocate(&pool).await.unwrap(), None);
    // A pool whose only member was removed is empty too.
    pools.admit(&pool, "http://127.0.0.1:20000").await.unwrap();
    pools.remove(&pool, "http://127.0.0.1:20000").await.unwrap();
    assert_eq!(pools.allocate(&pool).await.unwrap(), None);
    assert!(pools.members(&pool).await.unwrap().is_empty());
    pools.delete_pool(&pool).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ties_go_to_the_first_member_by_name_and_the_only_member_is_allocated_again() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let pool = pool_name("ties");
    pools.admit(&pool, "http://b.example:1").await.unwrap();
    pools.admit(&pool, "http://a.example:1").await.unwrap();
    let first = pools.allocate(&pool).await.unwrap();
    assert_eq!(first.as_deref(), Some("http://a.example:1"));
    pools.remove(&pool, "http://b.example:1").await.unwrap();
    for _ in 0..3 {
        assert_eq!(
            pools.allocate(&pool).await.unwrap().as_deref(),
            Some("http://a.example:1"),
            "allocation reserves nothing"
        );
    }
    pools.delete_pool(&pool).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_member_does_not_take_the_next_allocations_in_a_row() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let pool = pool_name("restore");
    pool_with(&pools, &pool, 3).await;
    for _ in 0..300 {
        pools.allocate(&pool).await.unwrap();
    }
    let removed = "http://127.0.0.1:20001";
    assert_eq!(pools.remove(&pool, removed).await.unwrap(), Some(100.0));
    for _ in 0..300 {
        pools.allocate(&pool).await.unwrap();
    }
    // The others are at 250 now; restored, it starts there, not at 100.
    assert_eq!(pools.admit(&pool, removed).await.unwrap(), 250.0);
    let mut next = Vec::new();
    for _ in 0..9 {
        next.push(pools.allocate(&pool).await.unwrap().unwrap());
    }
    let restored = next.iter().filter(|p| p.as_str() == removed).count();
    assert_eq!(restored, 3, "a fair third of the next 9: {next:?}");
    // A new member starts at the current minimum, not 0.
    let start = pools.admit(&pool, "http://127.0.0.1:29999").await.unwrap();
    assert_eq!(start, 253.0);
    pools.delete_pool(&pool).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_not_there_is_a_clear_error() {
    // Nothing listens on port 1.
    let error = match ProxyPools::connect("redis://127.0.0.1:1").await {
        Ok(_) => panic!("connected to nothing"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("Redis at redis://127.0.0.1:1 failed"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocation_survives_redis_forgetting_the_script() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let pool = pool_name("noscript");
    pool_with(&pools, &pool, 2).await;
    pools.allocate(&pool).await.unwrap();
    // As after a restart or failover: the script cache is empty.
    let client = redis::Client::open(redis_url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut connection)
        .await
        .unwrap();
    assert_eq!(
        pools.allocate(&pool).await.unwrap().as_deref(),
        Some("http://127.0.0.1:20001")
    );
    let total: f64 = pools
        .members(&pool)
        .await
        .unwrap()
        .iter()
        .map(|(_, s)| s)
        .sum();
    assert_eq!(total, 2.0, "counted once each");
    pools.delete_pool(&pool).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_laurel_processes_share_a_pool_exactly() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let pool = pool_name("processes");
    pool_with(&pools, &pool, 10).await;
    let spawn = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_laurel"))
            .args(["proxies", "allocate", &pool, "--count", "1000"])
            .env("LAUREL_REDIS_URL", redis_url())
            .env("LAUREL_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("laurel starts")
    };
    let (first, second) = (spawn(), spawn());
    let mut handed = BTreeMap::<String, u32>::new();
    for child in [first, second] {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success());
        for line in String::from_utf8(output.stdout).unwrap().lines() {
            *handed.entry(line.to_string()).or_default() += 1;
        }
    }
    let members = pools.members(&pool).await.unwrap();
    let counted: BTreeMap<String, u32> = members
        .iter()
        .map(|(m, s)| (m.clone(), *s as u32))
        .collect();
    assert_eq!(
        handed, counted,
        "what the processes were handed is what Redis counted"
    );
    assert_eq!(counted.values().sum::<u32>(), 2000);
    let (min, max) = (
        counted.values().min().unwrap(),
        counted.values().max().unwrap(),
    );
    assert!(max - min <= 1, "spread {min}..{max}");
    pools.delete_pool(&pool).await.unwrap();
}

/// Makes sure tinyproxy is on the machine (installed once if missing).
fn installed() {
    static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        crate::support::debian_packages(&["tinyproxy"], || {
            std::process::Command::new("tinyproxy")
                .arg("-v")
                .output()
                .is_ok_and(|o| o.status.success())
        })
    });
}

/// A real forward proxy (Debian's tinyproxy) on a loopback port of its own.
pub struct Tinyproxy {
    child: std::process::Child,
    pub url: String,
    config: std::path::PathBuf,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Tinyproxy {
    /// On a free port. The port is free when picked, not when tinyproxy
    /// binds it: another test's server may take it first (then tinyproxy
    /// exits, and the port answers as something else). So: try again on
    /// another port until tinyproxy itself holds one.
    pub fn start(name: &str) -> Tinyproxy {
        for _ in 0..20 {
            let mut proxy = Tinyproxy::start_on(name, free_port());
            std::thread::sleep(Duration::from_millis(150));
            if let Ok(None) = proxy.child.try_wait() {
                return proxy;
            }
        }
        panic!("tinyproxy never kept a port")
    }

    /// On a given port (e.g. again where one was stopped).
    pub fn start_on(name: &str, port: u16) -> Tinyproxy {
        installed();
        let config = std::env::temp_dir().join(format!("laurel-{name}-{port}.conf"));
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 10\nAllow 127.0.0.1\nLogLevel Critical\nMaxClients 50\nViaProxyName \"{name}\"\n"
            ),
        )
        .unwrap();
        let child = std::process::Command::new("tinyproxy")
            .args(["-d", "-c"])
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tinyproxy runs (Debian package tinyproxy)");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "tinyproxy did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Tinyproxy {
            child,
            url: format!("http://127.0.0.1:{port}"),
            config,
        }
    }

    pub fn port(&self) -> u16 {
        self.url.rsplit(':').next().unwrap().parse().unwrap()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.config);
    }
}

/// A check URL on loopback that answers 200.
/// A check URL that echoes its query, as a proxy check needs (Laurel puts
/// a token there that must come back).
pub async fn check_server() -> String {
    let app = axum::Router::new().route(
        "/check",
        axum::routing::get(|uri: axum::http::Uri| async move {
            format!("ok {}", uri.query().unwrap_or_default())
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/check", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// A pool's settings as `laurel proxies pool set` would store them.
pub fn pool_config(name: &str, check_url: &str) -> ProxyPoolRow {
    ProxyPoolRow {
        name: name.to_string(),
        policy: "least-used".into(),
        check_url: check_url.to_string(),
        timeout: Duration::from_secs(2),
        schemes: vec!["http".into()],
        max_latency: Duration::from_secs(2),
        deny: Vec::new(),
        recheck_every: Duration::from_secs(300),
        lease_ttl: Duration::from_secs(60),
        max_in_flight: None,
        // The tests' proxies are on loopback.
        allow_private: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eligibility_admits_the_live_forward_proxies_only() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let db = TestDb::new().await;
    let store = db.store().await;
    let pool = pool_name("eligibility");
    let check_url = check_server().await;
    let (a, b) = (Tinyproxy::start("tp-a"), Tinyproxy::start("tp-b"));
    let dead = format!("http://127.0.0.1:{}", free_port());
    let list = format!(
        "# candidates\n{}\n{}\nnot a proxy\n{dead}\nsocks5://127.0.0.1:1080\n",
        a.url, b.url
    );
    // An unconfigured pool has no checks to run: refused, nothing kept.
    let error = candidates::import(&store, &pools, &pool, &list, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&format!("proxy pool {pool} is not configured")),
        "{error}"
    );
    store
        .set_proxy_pool(&pool_config(&pool, &check_url))
        .await
        .unwrap();
    let report = candidates::import(&store, &pools, &pool, &list, false)
        .await
        .unwrap();
    let admitted: Vec<&str> = report.admitted.iter().map(|(p, _, _)| p.as_str()).collect();
    let mut live = vec![a.url.as_str(), b.url.as_str()];
    live.sort();
    assert_eq!(admitted, live);
    let refused: BTreeMap<&str, &str> = report
        .refused
        .iter()
        .map(|(p, r)| (p.as_str(), r.as_str()))
        .collect();
    assert!(
        refused[dead.as_str()].contains("the check request through it failed"),
        "{refused:?}"
    );
    assert_eq!(
        refused["socks5://127.0.0.1:1080"],
        "scheme socks5 is not allowed (allowed: http)"
    );
    assert_eq!(
        report.junk.iter().map(|j| j.line).collect::<Vec<_>>(),
        vec![4]
    );
    for _ in 0..10 {
        let proxy = pools.allocate(&pool).await.unwrap().unwrap();
        assert!(live.contains(&proxy.as_str()), "{proxy}");
    }
    // What was decided is kept in PostgreSQL, with why (read directly).
    let rows = db
        .sql()
        .await
        .query(
            "SELECT proxy, eligible, coalesce(reason, '') FROM proxy_candidates WHERE pool = $1 ORDER BY proxy",
            &[&pool],
        )
        .await
        .unwrap();
    let kept: BTreeMap<String, (bool, String)> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    assert_eq!(kept.len(), 4);
    assert_eq!(kept[&a.url], (true, String::new()));
    assert!(!kept[&dead].0 && kept[&dead].1.contains("through it failed"));
    // The operator's view: eligibility, why, allocations.
    let status = laurel::proxy::pool_status(&store, &pools, &pool)
        .await
        .unwrap();
    let allocations: f64 = status.members.iter().map(|m| m.allocations).sum();
    assert_eq!(allocations, 10.0);
    assert_eq!(status.members.iter().filter(|m| m.eligible).count(), 2);
    // Replacing the list drops what it leaves out.
    let report = candidates::import(&store, &pools, &pool, &a.url, true)
        .await
        .unwrap();
    assert_eq!(report.dropped.len(), 3, "{:?}", report.dropped);
    let members: Vec<String> = pools
        .members(&pool)
        .await
        .unwrap()
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    assert_eq!(members, vec![a.url.clone()]);
    // A deny-list keeps even a live proxy out.
    let other = pool_name("denied");
    store
        .set_proxy_pool(&ProxyPoolRow {
            deny: vec!["127.0.0.1".into()],
            ..pool_config(&other, &check_url)
        })
        .await
        .unwrap();
    let report = candidates::import(&store, &pools, &other, &a.url, false)
        .await
        .unwrap();
    assert!(report.admitted.is_empty());
    assert_eq!(
        report.refused[0].1,
        "host 127.0.0.1 is on the pool's deny-list"
    );
    pools.delete_pool(&pool).await.unwrap();
    pools.delete_pool(&other).await.unwrap();
    db.drop_database().await;
}

#[test]
fn pool_settings_are_checked_before_they_are_stored() {
    let bad = ProxyPoolRow {
        policy: "round-robin".into(),
        schemes: vec!["ftp".into()],
        recheck_every: Duration::ZERO,
        ..pool_config("p", "file:///etc/passwd")
    };
    let error = laurel::proxy::checked_pool(&bad).unwrap_err().to_string();
    for problem in [
        "proxy pool p: ",
        "unknown policy \"round-robin\" (expected least-used or least-concurrent)",
        "check URL \"file:///etc/passwd\" is not an http(s) URL with a host",
        "scheme \"ftp\" is not a proxy scheme",
        "re-check interval must be between 1 ms and 20 days",
    ] {
        assert!(error.contains(problem), "{problem}: {error}");
    }
    assert!(laurel::proxy::checked_pool(&pool_config("p", "http://127.0.0.1/check")).is_ok());
}

/// Runs the re-checker role until dropped.
pub struct Rechecker(tokio::task::JoinHandle<anyhow::Result<()>>);

impl Rechecker {
    pub fn start(database_url: &str, redis_url: &str) -> Rechecker {
        let (database_url, redis_url) = (database_url.to_string(), redis_url.to_string());
        Rechecker(tokio::spawn(async move {
            laurel::proxy::recheck::run(&database_url, &redis_url, std::future::pending()).await
        }))
    }
}

impl Drop for Rechecker {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub async fn wait_for<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_member_leaves_the_pool_and_comes_back_when_it_recovers() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let db = TestDb::new().await;
    let store = db.store().await;
    let pool = pool_name("recheck");
    let check_url = check_server().await;
    store
        .set_proxy_pool(&ProxyPoolRow {
            recheck_every: Duration::from_millis(200),
            ..pool_config(&pool, &check_url)
        })
        .await
        .unwrap();
    let (a, b) = (Tinyproxy::start("tp-a"), Tinyproxy::start("tp-b"));
    let (a_url, a_port) = (a.url.clone(), a.port());
    candidates::import(&store, &pools, &pool, &format!("{a_url}\n{}", b.url), false)
        .await
        .unwrap();
    let _rechecker = Rechecker::start(&db.url, &redis_url());
    for _ in 0..100 {
        pools.allocate(&pool).await.unwrap();
    }
    let eligible = |pools: ProxyPools, pool: String, member: String| async move {
        pools
            .members(&pool)
            .await
            .unwrap()
            .iter()
            .any(|(m, _)| *m == member)
    };
    drop(a);
    wait_for("the dead member leaves", || {
        let (pools, pool, a_url) = (pools.clone(), pool.clone(), a_url.clone());
        async move { !eligible(pools, pool, a_url).await }
    })
    .await;
    for _ in 0..40 {
        assert_eq!(
            pools.allocate(&pool).await.unwrap().as_deref(),
            Some(b.url.as_str()),
            "only the live member is handed out"
        );
    }
    let status = laurel::proxy::pool_status(&store, &pools, &pool)
        .await
        .unwrap();
    let gone = status.members.iter().find(|m| m.proxy == a_url).unwrap();
    assert!(!gone.eligible);
    assert_eq!(gone.allocations, 50.0, "its count is kept");
    assert!(
        gone.reason
            .as_deref()
            .unwrap()
            .contains("the check request through it failed"),
        "{gone:?}"
    );
    // Back on the same port: restored at the pool's lowest count (b's 90),
    // not at its own 50.
    let _a = Tinyproxy::start_on("tp-a", a_port);
    wait_for("the recovered member returns", || {
        let (pools, pool, a_url) = (pools.clone(), pool.clone(), a_url.clone());
        async move { eligible(pools, pool, a_url).await }
    })
    .await;
    let counts: BTreeMap<String, f64> = pools.members(&pool).await.unwrap().into_iter().collect();
    assert!(counts[&a_url] >= 90.0, "{counts:?}");
    // Redis losing the set (a restart without persistence) is repaired
    // from PostgreSQL at the next checks.
    let client = redis::Client::open(redis_url()).unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("DEL")
        .arg(ProxyPools::eligible_key(&pool))
        .query_async(&mut connection)
        .await
        .unwrap();
    wait_for("both members are back after Redis forgot them", || {
        let (pools, pool) = (pools.clone(), pool.clone());
        async move { pools.members(&pool).await.unwrap().len() == 2 }
    })
    .await;
    pools.delete_pool(&pool).await.unwrap();
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_lease_expires_and_its_proxy_is_available_again() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let pool = pool_name("leases");
    let ttl = Duration::from_millis(300);
    pools.admit(&pool, "http://a.example:1").await.unwrap();
    // One lease at a time per member.
    let (proxy, abandoned) = pools.acquire(&pool, ttl, Some(1)).await.unwrap().unwrap();
    assert_eq!(proxy, "http://a.example:1");
    assert_eq!(
        pools.acquire(&pool, ttl, Some(1)).await.unwrap(),
        None,
        "its only member is busy"
    );
    assert_eq!(
        pools.in_flight(&pool).await.unwrap(),
        vec![("http://a.example:1".to_string(), 1)]
    );
    // Its holder died: nobody releases it. After the lease's time it
    // expires and the proxy is handed out again.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let (proxy, lease) = pools.acquire(&pool, ttl, Some(1)).await.unwrap().unwrap();
    assert_eq!(proxy, "http://a.example:1");
    assert!(
        !pools.release(&pool, &abandoned).await.unwrap(),
        "an expired lease cannot be released (it ended)"
    );
    assert!(pools.release(&pool, &lease).await.unwrap());
    assert!(!pools.release(&pool, &lease).await.unwrap(), "only once");
    assert!(pools.in_flight(&pool).await.unwrap().is_empty());
    // Allocation counts are apart from work in flight: two leases, two
    // allocations, none in flight now.
    assert_eq!(pools.members(&pool).await.unwrap()[0].1, 2.0);
    pools.delete_pool(&pool).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_go_to_the_least_concurrent_member_then_the_least_used() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let pool = pool_name("concurrent");
    let ttl = Duration::from_secs(30);
    let (a, b, c) = (
        "http://a.example:1",
        "http://b.example:1",
        "http://c.example:1",
    );
    for member in [a, b, c] {
        pools.admit(&pool, member).await.unwrap();
    }
    let mut order = Vec::new();
    for _ in 0..6 {
        let (proxy, lease) = pools.acquire(&pool, ttl, None).await.unwrap().unwrap();
        assert!(pools.release(&pool, &lease).await.unwrap());
        order.push(proxy);
    }
    assert_eq!(
        order,
        vec![a, b, c, a, b, c],
        "nothing in flight: ties go to the least used, then by name"
    );
    // a is held (a slow request): the others are handed out, even past
    // a's count.
    let (proxy, slow) = pools.acquire(&pool, ttl, None).await.unwrap().unwrap();
    assert_eq!(proxy, a);
    for _ in 0..6 {
        let (proxy, lease) = pools.acquire(&pool, ttl, None).await.unwrap().unwrap();
        assert_ne!(proxy, a, "a has work in flight");
        pools.release(&pool, &lease).await.unwrap();
    }
    let counts: BTreeMap<String, f64> = pools.members(&pool).await.unwrap().into_iter().collect();
    assert_eq!((counts[a], counts[b], counts[c]), (3.0, 5.0, 5.0));
    // The least-used allocation reads counts, never leases: a it is.
    assert_eq!(pools.allocate(&pool).await.unwrap().as_deref(), Some(a));
    assert_eq!(
        pools.in_flight(&pool).await.unwrap(),
        vec![(a.to_string(), 1)]
    );
    pools.release(&pool, &slow).await.unwrap();
    let (proxy, _) = pools.acquire(&pool, ttl, None).await.unwrap().unwrap();
    assert_eq!(proxy, a, "free again and the least used");
    pools.delete_pool(&pool).await.unwrap();
}

/// A Redis server of its own on a loopback port, for tests that stop it.
pub struct PrivateRedis {
    child: std::process::Child,
    pub port: u16,
}

impl PrivateRedis {
    pub fn start_on(port: u16) -> PrivateRedis {
        PrivateRedis::start_with(port, None)
    }

    /// A Redis that asks for `password` (`requirepass`), if given.
    pub fn start_with(port: u16, password: Option<&str>) -> PrivateRedis {
        let mut command = std::process::Command::new("redis-server");
        if let Some(password) = password {
            command.args(["--requirepass", password]);
        }
        let child = command
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--port", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server runs");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        PrivateRedis { child, port }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// On a free port, tried again elsewhere if another test's server took
    /// the port between its pick and redis-server's bind (see
    /// `Tinyproxy::start`).
    pub fn start_free(password: Option<&str>) -> PrivateRedis {
        for _ in 0..20 {
            let mut redis = PrivateRedis::start_with(free_port(), password);
            std::thread::sleep(Duration::from_millis(150));
            if let Ok(None) = redis.child.try_wait() {
                return redis;
            }
        }
        panic!("redis-server never kept a port")
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A "proxy" that answers every request itself with 200, forwarding
/// nothing (free lists are full of these).
async fn answers_by_itself() -> String {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                crate::support::read_head(&mut socket).await;
                let _ = socket
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_must_forward_and_internal_addresses_need_the_pool_s_consent() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let db = TestDb::new().await;
    let store = db.store().await;
    let check_url = check_server().await;
    // A candidate that answers 200 to everything is not a proxy.
    let pool = pool_name("forwarding");
    store
        .set_proxy_pool(&pool_config(&pool, &check_url))
        .await
        .unwrap();
    let liar = answers_by_itself().await;
    let real = Tinyproxy::start("tp-forwards");
    let report = candidates::import(
        &store,
        &pools,
        &pool,
        &format!("{liar}\n{}\n", real.url),
        false,
    )
    .await
    .unwrap();
    assert_eq!(report.admitted.len(), 1, "{report:?}");
    assert_eq!(report.admitted[0].0, real.url);
    assert_eq!(report.refused.len(), 1, "{report:?}");
    assert_eq!(
        report.refused[0].1,
        "the answer through it does not carry the check token (it answers by itself instead of forwarding)"
    );
    // Loopback candidates in a pool that does not allow internal addresses.
    let strict = pool_name("strict");
    store
        .set_proxy_pool(&ProxyPoolRow {
            allow_private: false,
            ..pool_config(&strict, &check_url)
        })
        .await
        .unwrap();
    let report = candidates::import(&store, &pools, &strict, &real.url, false)
        .await
        .unwrap();
    assert!(report.admitted.is_empty(), "{report:?}");
    assert_eq!(
        report.refused[0].1,
        "127.0.0.1 is a loopback address (127.0.0.1): refused unless the pool allows private addresses"
    );
    use laurel::proxy::candidates::internal;
    for (address, kind) in [
        ("10.1.2.3", Some("a private")),
        ("192.168.0.10", Some("a private")),
        ("172.20.0.1", Some("a private")),
        ("100.64.0.1", Some("a private")),
        ("169.254.169.254", Some("a link-local")),
        ("::1", Some("a loopback")),
        ("fe80::1", Some("a link-local")),
        ("fd00::1", Some("a private")),
        ("::ffff:127.0.0.1", Some("a loopback")),
        ("0.0.0.0", Some("an unspecified")),
        ("93.184.216.34", None),
        ("2606:4700::1111", None),
    ] {
        assert_eq!(internal(address.parse().unwrap()), kind, "{address}");
    }
    pools.delete_pool(&pool).await.unwrap();
    pools.delete_pool(&strict).await.unwrap();
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_from_the_command_line_shows_its_checks_progress_and_why_each_was_refused() {
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let db = TestDb::new().await;
    let store = db.store().await;
    let pool = pool_name("cli-import");
    let check_url = check_server().await;
    store
        .set_proxy_pool(&pool_config(&pool, &check_url))
        .await
        .unwrap();
    let live = Tinyproxy::start("tp-cli");
    let dead = format!("http://127.0.0.1:{}", free_port());
    let dir = std::env::temp_dir().join(format!("laurel-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let list = dir.join("proxies.txt");
    std::fs::write(&list, format!("{}\n{dead}\n", live.url)).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_laurel"))
        .args(["proxies", "import", &pool, list.to_str().unwrap()])
        .env("LAUREL_DATABASE_URL", &db.url)
        .env("LAUREL_REDIS_URL", redis_url())
        .env("LAUREL_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    // Not a terminal: plain lines, the last one with every check done.
    assert_eq!(
        stderr.lines().last(),
        Some("100.0% 2 of 2 proxies checked (1 refused)"),
        "{stderr}"
    );
    assert!(stdout.contains(&live.url), "{stdout}");
    assert!(
        stdout.contains(&dead) && stdout.contains("the check request through it failed"),
        "{stdout}"
    );
    assert_eq!(
        pools.allocate(&pool).await.unwrap().as_deref(),
        Some(live.url.as_str())
    );
    let _ = std::fs::remove_dir_all(&dir);
    pools.delete_pool(&pool).await.unwrap();
    db.drop_database().await;
}
