//! Proxy pools against the real Redis on loopback (`LAUREL_TEST_REDIS_URL`,
//! default `redis://127.0.0.1:6379`): atomic least-used allocation under
//! concurrency, the empty pool, the restore policy, Redis not there.

use std::collections::BTreeMap;

use laurel::proxy::ProxyPools;

fn redis_url() -> String {
    std::env::var("LAUREL_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A pool name of its own per test run, so runs and tests don't meet.
fn pool_name(test: &str) -> String {
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
