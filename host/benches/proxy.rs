//! Benchmark: proxy allocations/s from one process (many tasks over one
//! multiplexed connection, which pipelines) against `redis-benchmark`
//! running the same EVALSHA with 16 clients, both in this run, on a
//! 10-member pool in the Redis on 127.0.0.1:6379 (LAUREL_REDIS_URL).
//!
//! cargo bench -p laurel --bench proxy       (LAUREL_BENCH_ALLOCATIONS=200000,
//!                                           LAUREL_BENCH_ROUNDS=3)

use std::time::Instant;

use laurel::proxy::ProxyPools;

#[path = "support/row.rs"]
mod row;
use row::{row, spread, thousands};

fn main() {
    let count: usize = std::env::var("LAUREL_BENCH_ALLOCATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let url = std::env::var("LAUREL_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pools = ProxyPools::connect(&url).await.unwrap();
        let pool = "bench-allocate";
        pools.delete_pool(pool).await.unwrap();
        for n in 0..10 {
            pools
                .admit(pool, &format!("http://127.0.0.1:{}", 30000 + n))
                .await
                .unwrap();
        }
        // Loads the script, so redis-benchmark's EVALSHA finds it.
        pools.allocate(pool).await.unwrap();

        // Rounds alternate the baseline and Laurel, so a change in the
        // machine's state (Redis, the client and redis-benchmark share the
        // 2 cores) shows in the spread instead of in one side.
        let rounds: usize = std::env::var("LAUREL_BENCH_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3);
        let key = ProxyPools::eligible_key(pool);
        let mut ratios: Vec<(usize, f64)> = Vec::new();
        let (mut baselines, mut rates) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            // Baseline: redis-benchmark, 16 clients, the same EVALSHA.
            let output = std::process::Command::new("redis-benchmark")
                .args(["-h", "127.0.0.1", "-p", "6379", "-c", "16", "-n", &count.to_string(), "--csv"])
                .args(["EVALSHA", pools.allocate_sha(), "1", &key])
                .output()
                .expect("redis-benchmark runs (Debian package redis-tools)");
            let csv = String::from_utf8_lossy(&output.stdout);
            let baseline: f64 = csv
                .lines()
                .filter_map(|line| line.split(',').nth(1))
                .filter_map(|field| field.trim_matches('"').parse().ok())
                .next()
                .unwrap_or_else(|| panic!("no rate in redis-benchmark's output: {csv}"));
            println!("Round {round}: baseline, redis-benchmark EVALSHA, 16 clients: {baseline:>8.0} allocations/s");
            baselines.push(baseline);
            for tasks in [16usize, 64] {
                let started = Instant::now();
                let mut handles = Vec::new();
                for t in 0..tasks {
                    let pools = pools.clone();
                    let share = count / tasks + usize::from(t < count % tasks);
                    handles.push(tokio::spawn(async move {
                        for _ in 0..share {
                            pools.allocate(pool).await.unwrap().expect("a proxy");
                        }
                    }));
                }
                for handle in handles {
                    handle.await.unwrap();
                }
                let rate = count as f64 / started.elapsed().as_secs_f64();
                println!(
                    "Round {round}: Laurel, one process, {tasks:>2} tasks, one connection: {rate:>8.0} allocations/s (ratio {:.2})",
                    rate / baseline
                );
                ratios.push((tasks, rate / baseline));
                rates.push((tasks, rate));
            }
        }
        for tasks in [16usize, 64] {
            let mut these: Vec<f64> = ratios.iter().filter(|(t, _)| *t == tasks).map(|(_, r)| *r).collect();
            these.sort_by(|a, b| a.total_cmp(b));
            println!(
                "Ratio, {tasks:>2} tasks: lowest {:.2}, median {:.2}, highest {:.2} over {rounds} rounds",
                these[0],
                these[these.len() / 2],
                these[these.len() - 1]
            );
            let laurel: Vec<f64> = rates.iter().filter(|(t, _)| *t == tasks).map(|(_, r)| *r).collect();
            row(
                "proxy",
                &format!("proxy allocations from one process, {tasks} tasks on one connection (baseline: redis-benchmark, 16 clients, the same EVALSHA)"),
                &spread(&laurel, thousands, "allocations/s"),
                &spread(&baselines, thousands, "allocations/s"),
                &spread(&these, |r| format!("{r:.2}"), ""),
                if tasks == 64 { ">= 1.0" } else { "" },
            );
        }
        let members = pools.members(pool).await.unwrap();
        let scores: Vec<f64> = members.iter().map(|(_, s)| *s).collect();
        let widest = scores.iter().cloned().fold(f64::MIN, f64::max)
            - scores.iter().cloned().fold(f64::MAX, f64::min);
        println!("Spread after {} allocations on 10 members: {widest}", scores.iter().sum::<f64>());
        pools.delete_pool(pool).await.unwrap();
    });
}
