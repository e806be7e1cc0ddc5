//! Benchmark: event-to-completed latency under a steady event rate. Each
//! event is a new user's first active photo, which completes a one-photo
//! award, so every event makes one completion: the time from producing the
//! event to the awards worker completing the award (`completed_at`, decided
//! just before its transaction commits) is the latency a user sees, through
//! Kafka, ingest (Wasm filters and rule, counters) and the awards worker
//! (Wasm strategy), all in this process with PostgreSQL on the same box.
//!
//! cargo bench -p laurel --bench latency      (LAUREL_BENCH_RATE=10000,
//!                                             LAUREL_BENCH_SECONDS=20)
//!
//! Uses the database `laurel_bench_latency` (dropped and made anew).

use std::time::{Duration, Instant};

use laurel::awards::{self, AwardsSettings};
use laurel::catalog::Catalog;
use laurel::ingest::IngestSettings;
use laurel::kafka::{self, LocalBroker};
use laurel::registry::Registry;
use laurel::runtime::{Limits, Runtime};
use laurel::store::Store;
use serde_json::json;

#[path = "support/row.rs"]
mod row;
use row::row;

const AWARD: &str = r#"{
  "id": "first-photo", "title": "First photo",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 1, "strategy": [{"objective_id": "photo"}]}
}"#;

async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("LAUREL_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rate = env("LAUREL_BENCH_RATE", 10_000);
    let seconds = env("LAUREL_BENCH_SECONDS", 20);
    let server = std::env::var("LAUREL_BENCH_SERVER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let url = format!("{server}/laurel_bench_latency");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let admin = sql(&format!("{server}/postgres")).await;
        admin
            .batch_execute("DROP DATABASE IF EXISTS laurel_bench_latency WITH (FORCE)")
            .await
            .unwrap();
        let mut store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        laurel::library::register(&mut store, &runtime).await.unwrap();
        let registry = Registry::start(&url, runtime).await.unwrap();
        laurel::definitions::apply(&mut store, &registry, AWARD).await.unwrap();
        let broker = LocalBroker::start(None).await.unwrap();
        broker.create_topic("events.photos", 4).unwrap();
        let producer = kafka::producer(broker.bootstrap_servers()).unwrap();
        let catalog = Catalog::start(&url).await.unwrap();

        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let settings = IngestSettings {
            session_timeout: Duration::from_secs(6),
            ..IngestSettings::new(broker.bootstrap_servers())
        };
        let ingest_task = {
            let (url, registry, catalog, stopped) = (url.clone(), registry.clone(), catalog.clone(), until(stopped.clone()));
            tokio::spawn(async move { laurel::cli::ingest_and_backfill(settings, &url, registry, catalog, stopped).await })
        };
        let awards_task = {
            let (url, registry, catalog, stopped) = (url.clone(), registry.clone(), catalog.clone(), until(stopped.clone()));
            tokio::spawn(async move {
                awards::run(AwardsSettings::default(), &url, registry, catalog, stopped).await
            })
        };
        let event = |user: &str, at: chrono::DateTime<chrono::Utc>| {
            json!({"id": format!("e-{user}"), "source": "photos", "type": "photo.status_changed", "user_id": user,
                   "authorized": true, "content_id": format!("p-{user}"), "status": "active",
                   "occurred_at": at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true), "payload": {}})
            .to_string()
        };
        // Warm-up: the consumer joins its group and one award completes.
        kafka::publish(&producer, "events.photos", Some(b"warm-up"), event("warm-up", chrono::Utc::now()).as_bytes(), &[])
            .await
            .unwrap();
        let client = sql(&url).await;
        let completed = || async {
            client
                .query_one("SELECT count(*) FROM user_achieve WHERE completed", &[])
                .await
                .unwrap()
                .get::<_, i64>(0)
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while completed().await < 1 {
            assert!(Instant::now() < deadline, "the warm-up event did not complete");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        // Steady rate: a slice of events every 10 ms.
        let total = rate * seconds;
        let per_tick = (rate / 100).max(1);
        let started = Instant::now();
        let mut sent = 0u64;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while sent < total {
            tick.tick().await;
            let due = ((started.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
            let now = chrono::Utc::now();
            let batch: Vec<(String, String)> = (sent..due.max(sent + per_tick).min(total))
                .map(|n| {
                    let user = format!("user-{n}");
                    let value = event(&user, now);
                    (user, value)
                })
                .collect();
            sent += batch.len() as u64;
            // Acknowledgements are awaited off the pacing loop.
            let producer = producer.clone();
            tokio::spawn(async move {
                let sends = batch.iter().map(|(user, value)| {
                    kafka::publish(&producer, "events.photos", Some(user.as_bytes()), value.as_bytes(), &[])
                });
                for result in futures_util::future::join_all(sends).await {
                    result.unwrap();
                }
            });
        }
        let produced_in = started.elapsed().as_secs_f64();
        let deadline = Instant::now() + Duration::from_secs(120);
        while completed().await < total as i64 + 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let rows = client
            .query(
                "SELECT extract(epoch FROM ua.completed_at - ci.occurred_at)::float8 FROM user_achieve ua
                 JOIN content_items ci ON ci.user_id = ua.user_id WHERE ua.completed AND ua.user_id <> 'warm-up'",
                &[],
            )
            .await
            .unwrap();
        let mut latencies: Vec<f64> = rows.iter().map(|r| r.get::<_, f64>(0)).collect();
        latencies.sort_by(|a, b| a.total_cmp(b));
        let _ = stop.send(true);
        ingest_task.await.unwrap().unwrap();
        awards_task.await.unwrap().unwrap();
        println!(
            "Event -> award completed, {} events at {rate}/s (produced in {produced_in:.1} s), {} completed:",
            total,
            latencies.len()
        );
        if latencies.is_empty() {
            println!("  nothing completed");
            return;
        }
        println!(
            "  p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            percentile(&latencies, 0.50) * 1000.0,
            percentile(&latencies, 0.90) * 1000.0,
            percentile(&latencies, 0.99) * 1000.0,
            latencies[latencies.len() - 1] * 1000.0
        );
        row(
            "latency",
            &format!("event produced -> award completed, {rate} events/s for {seconds} s, each a completion"),
            &format!(
                "p50 {:.0} ms, p99 {:.0} ms",
                percentile(&latencies, 0.50) * 1000.0,
                percentile(&latencies, 0.99) * 1000.0
            ),
            "",
            "",
            "p99 < 1 s",
        );
    });
}
