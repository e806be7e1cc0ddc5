//! Proxy pools against the real Redis on loopback (`LAUREL_TEST_REDIS_URL`,
//! default `redis://127.0.0.1:6379`): atomic least-used allocation under
//! concurrency, the empty pool, the restore policy, Redis not there.

use std::collections::BTreeMap;

use laurel::proxy::ProxyPools;

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
    pub fn start(name: &str) -> Tinyproxy {
        let port = free_port();
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
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "tinyproxy did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Tinyproxy {
            child,
            url: format!("http://127.0.0.1:{port}"),
            config,
        }
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
async fn check_server() -> String {
    let app = axum::Router::new().route("/check", axum::routing::get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/check", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eligibility_admits_the_live_forward_proxies_only() {
    use laurel::proxy::Eligibility;
    use std::time::Duration;
    let pools = ProxyPools::connect(&redis_url()).await.unwrap();
    let pool = pool_name("eligibility");
    let check_url = check_server().await;
    let (a, b) = (Tinyproxy::start("tp-a"), Tinyproxy::start("tp-b"));
    let dead = format!("http://127.0.0.1:{}", free_port());
    let list = format!(
        "# candidates\n{}\n{}\nnot a proxy\n{dead}\nsocks5://127.0.0.1:1080\n",
        a.url, b.url
    );
    let rules = Eligibility {
        check_url,
        timeout: Duration::from_secs(2),
        schemes: vec!["http".into()],
        max_latency: Duration::from_secs(2),
        deny: Vec::new(),
    };
    let report = pools.import(&pool, &list, &rules).await.unwrap();
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
    // A deny-list keeps even a live proxy out.
    let denied = Eligibility {
        deny: vec!["127.0.0.1".into()],
        ..rules
    };
    let other = pool_name("denied");
    let report = pools.import(&other, &a.url, &denied).await.unwrap();
    assert!(report.admitted.is_empty());
    assert_eq!(
        report.refused[0].1,
        "host 127.0.0.1 is on the pool's deny-list"
    );
    pools.delete_pool(&pool).await.unwrap();
    pools.delete_pool(&other).await.unwrap();
}
