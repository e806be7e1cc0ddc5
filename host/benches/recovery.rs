//! Benchmark: how soon ingest applies events again after PostgreSQL comes
//! back. A cluster of the benchmark's own (initdb + pg_ctl on a free port)
//! is stopped (immediate: a crash) while events stream at a steady rate,
//! kept down a few seconds, and started again; measured from `pg_ctl start`
//! returning (the server accepts connections) to the first batch applied
//! after it. Ingest runs with its default settings. The baseline, in the
//! same run: how long a new client takes to connect and run a query after
//! the same restart.
//!
//! cargo bench -p laurel --bench recovery     (LAUREL_BENCH_OUTAGES=5,
//!                                             LAUREL_BENCH_DOWN_MS=3000)

#[path = "../tests/all/owned_postgres.rs"]
mod owned_postgres;

use std::time::{Duration, Instant};

use laurel::catalog::Catalog;
use laurel::ingest::IngestSettings;
use laurel::kafka::{self, LocalBroker};
use laurel::registry::Registry;
use laurel::runtime::{Limits, Runtime};
use laurel::store::Store;
use serde_json::json;

use owned_postgres::OwnedPostgres;

#[path = "support/row.rs"]
mod row;
use row::{row, spread};

const AWARD: &str = r#"{
  "id": "regular", "title": "Regular",
  "objectives": [{"id": "visits",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}}],
    "rule": {"name": "CountRule", "config": {"counter": "opened"}},
    "progress_counter": "opened"}],
  "strategy": {"goal": 100, "strategy": [{"objective_id": "visits"}]}
}"#;

async fn applied(url: &str) -> Option<i64> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .ok()?;
    tokio::spawn(connection);
    client
        .query_one("SELECT count(*) FROM applied_events", &[])
        .await
        .ok()
        .map(|r| r.get(0))
}

fn summary(mut values: Vec<f64>) -> String {
    values.sort_by(f64::total_cmp);
    format!(
        "lowest {:.0} ms, median {:.0} ms, highest {:.0} ms",
        values[0],
        values[values.len() / 2],
        values[values.len() - 1]
    )
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
    let outages = env("LAUREL_BENCH_OUTAGES", 5);
    let down = Duration::from_millis(env("LAUREL_BENCH_DOWN_MS", 3_000));
    let postgres = OwnedPostgres::start();
    let url = format!("{}/laurel_bench_recovery", postgres.server_url());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        laurel::library::register(&mut store, &runtime).await.unwrap();
        let registry = Registry::start(&url, runtime).await.unwrap();
        laurel::definitions::apply(&mut store, &registry, AWARD)
            .await
            .unwrap();
        drop(store);
        let broker = LocalBroker::start(None).await.unwrap();
        broker.create_topic("events.bss", 4).unwrap();
        let catalog = Catalog::start(&url).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let settings = IngestSettings::new(broker.bootstrap_servers());
        let ingest_url = url.clone();
        let ingest = tokio::spawn(async move {
            laurel::cli::ingest_and_backfill(settings, &ingest_url, registry, catalog, async {
                let _ = stopped.await;
            })
            .await
        });
        // A steady stream: 1,000 events/s, each a new id.
        let producer = kafka::producer(broker.bootstrap_servers()).unwrap();
        let streaming = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            for i in 0u64.. {
                tick.tick().await;
                for j in 0..10 {
                    let user = format!("u-{}", (i * 10 + j) % 1000);
                    let event = json!({"id": format!("e-{i}-{j}"), "source": "bss", "type": "app.opened",
                        "user_id": user, "authorized": true, "occurred_at": "2026-12-01T10:00:00Z", "payload": {}});
                    let _ = kafka::publish(&producer, "events.bss", Some(user.as_bytes()), event.to_string().as_bytes(), &[]).await;
                }
            }
        });
        // Steady state first.
        while applied(&url).await.unwrap_or(0) < 2_000 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (mut laurel, mut client) = (Vec::new(), Vec::new());
        for _ in 0..outages {
            let before = applied(&url).await.unwrap();
            postgres.stop(true);
            tokio::time::sleep(down).await;
            postgres.start_again();
            let up = Instant::now();
            // The baseline: a new client's connection and first query.
            let first = applied(&url).await;
            client.push(up.elapsed().as_secs_f64() * 1000.0);
            assert!(first.is_some(), "PostgreSQL is back");
            loop {
                if applied(&url).await.is_some_and(|now| now > before) {
                    break;
                }
                assert!(up.elapsed() < Duration::from_secs(60), "ingest never came back");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            laurel.push(up.elapsed().as_secs_f64() * 1000.0);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let median = |values: &[f64]| {
            let mut sorted = values.to_vec();
            sorted.sort_by(f64::total_cmp);
            sorted[sorted.len() / 2]
        };
        row(
            "recovery",
            &format!("first batch applied after PostgreSQL is back ({outages} crashes, down {} ms each; baseline: a new client connects and queries)", down.as_millis()),
            &spread(&laurel, |ms| format!("{ms:.0}"), "ms"),
            &spread(&client, |ms| format!("{ms:.0}"), "ms"),
            &format!("{:.0}x (medians)", median(&laurel) / median(&client)),
            "< 5 s",
        );
        println!(
            "Baseline: a new client connected and queried, after PostgreSQL came back: {}",
            summary(client)
        );
        println!(
            "Laurel:   first batch applied after PostgreSQL came back ({outages} crashes, down {} ms each): {}",
            down.as_millis(),
            summary(laurel)
        );
        streaming.abort();
        let _ = stop.send(());
        ingest.await.unwrap().unwrap();
    });
}
