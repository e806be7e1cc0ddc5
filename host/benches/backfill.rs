//! Benchmark: a backfill from history against ingest, in the same run.
//!
//! Ingest applies N content events (one per item: 100 users' worth of
//! items each 10) from Kafka to an award on their source, timed from the
//! first produced event to the last item stored. Then a new award on the
//! same source is applied with `"backfill": "history"`, and the backfill
//! worker of that same ingest process walks the N stored items, timed from
//! its first recorded step to its end. Reported: items/s of each and the
//! ratio backfill / ingest (goal >= 1.0: a backfill is ingest without
//! Kafka). The analytics phase that follows (the topic's retained
//! messages read back) is reported apart. Both evaluate the same one-objective award in Wasm and write
//! the same rows; ingest runs one consumer (one source), the backfill one
//! worker.
//!
//! cargo bench -p laurel --bench backfill     (LAUREL_BENCH_ITEMS=1000000,
//!                                             LAUREL_BENCH_ROUNDS=1,
//!                                             LAUREL_BACKFILL_BATCH=1000)
//!
//! The topic has 64 partitions so that a million events fit in the mock
//! cluster's retention (about 5 MiB per partition). Uses the database
//! `laurel_bench_backfill` on 127.0.0.1 (dropped and made anew each round;
//! LAUREL_BENCH_SERVER_URL to change the server).

use std::time::{Duration, Instant};

use laurel::catalog::Catalog;
use laurel::ingest::IngestSettings;
use laurel::kafka::{self, LocalBroker};
use laurel::registry::Registry;
use laurel::runtime::{Limits, Runtime};
use laurel::store::Store;
use serde_json::json;

#[path = "support/row.rs"]
mod row;
use row::{row, spread, thousands};

const PARTITIONS: i32 = 64;

fn award(id: &str, backfill: bool) -> String {
    let mut award = json!({
        "id": id, "title": id,
        "objectives": [{"id": "photos",
            "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                        {"name": "StatusFilter", "config": {"statuses": ["active", "moderation", "blocked"]}}],
            "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved", "moderation": "on_moderation", "blocked": "blocked"}}},
            "progress_counter": "approved"}],
        "strategy": {"goal": 3, "strategy": [{"objective_id": "photos"}]}
    });
    if backfill {
        award["backfill"] = json!("history");
    }
    award.to_string()
}

fn events(count: usize) -> Vec<(String, String)> {
    let statuses = ["active", "active", "moderation", "blocked"];
    (0..count)
        .map(|i| {
            let user = format!("user-{}", i / 10);
            let value = json!({"id": format!("e-{i}"), "source": "photos", "type": "photos.changed", "user_id": user,
                   "authorized": true, "content_id": format!("photo-{}", i % 10), "status": statuses[i % 4],
                   "occurred_at": chrono::DateTime::from_timestamp(1_796_000_000 + i as i64, 0).unwrap().to_rfc3339(),
                   "payload": {"width": 4000, "height": 3000}})
            .to_string();
            (user, value)
        })
        .collect()
}

async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

fn main() {
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("LAUREL_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    let env = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let count = env("LAUREL_BENCH_ITEMS", 1_000_000);
    let rounds = env("LAUREL_BENCH_ROUNDS", 1).max(1);
    let server = std::env::var("LAUREL_BENCH_SERVER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut ratios = Vec::new();
        let (mut ingests, mut backfills) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            let (ingest, backfill) = measure(&server, count).await;
            let ratio = backfill / ingest;
            ratios.push(ratio);
            ingests.push(ingest);
            backfills.push(backfill);
            println!(
                "Round {round}: ingest {ingest:.0} items/s, backfill from history {backfill:.0} items/s: backfill/ingest {ratio:.2}"
            );
        }
        ratios.sort_by(f64::total_cmp);
        println!(
            "Backfill/ingest over {rounds} round(s): lowest {:.2}, median {:.2}, highest {:.2}",
            ratios[0],
            ratios[ratios.len() / 2],
            ratios[ratios.len() - 1]
        );
        row(
            "backfill",
            &format!("backfill from history: {count} stored items -> Wasm filters and rule -> counters (baseline: ingest of the same items from Kafka)"),
            &spread(&backfills, thousands, "items/s"),
            &spread(&ingests, thousands, "items/s"),
            &spread(&ratios, |r| format!("{r:.2}"), ""),
            ">= 1.0",
        );
    });
}

/// One round on a fresh database and broker: (ingest items/s, backfill
/// items/s).
async fn measure(server: &str, count: usize) -> (f64, f64) {
    let url = format!("{server}/laurel_bench_backfill");
    sql(&format!("{server}/postgres"))
        .await
        .batch_execute("DROP DATABASE IF EXISTS laurel_bench_backfill WITH (FORCE)")
        .await
        .unwrap();
    let mut store = Store::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let runtime = Runtime::new(Limits::default(), None).unwrap();
    laurel::library::register(&mut store, &runtime)
        .await
        .unwrap();
    let registry = Registry::start(&url, runtime).await.unwrap();
    laurel::definitions::apply(&mut store, &registry, &award("live", false))
        .await
        .unwrap();
    store.add_source("photos", None).await.unwrap();

    let broker = LocalBroker::start(None).await.unwrap();
    broker.create_topic("events.photos", PARTITIONS).unwrap();
    broker.create_topic("events.photos.dead", 1).unwrap();
    let producer = kafka::producer(broker.bootstrap_servers()).unwrap();
    let catalog = Catalog::start(&url).await.unwrap();
    let defaults = IngestSettings::new(broker.bootstrap_servers());
    let settings = IngestSettings {
        session_timeout: Duration::from_secs(6),
        backfill_batch: std::env::var("LAUREL_BACKFILL_BATCH")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(defaults.backfill_batch),
        ..defaults
    };
    println!(
        "({count} items, backfill steps of {})",
        settings.backfill_batch
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let ingest_url = url.clone();
    let ingest_registry = registry.clone();
    let task = tokio::spawn(async move {
        laurel::cli::ingest_and_backfill(settings, &ingest_url, ingest_registry, catalog, async {
            let _ = stopped.await;
        })
        .await
    });
    let client = sql(&url).await;
    let items = || async {
        let row = client
            .query_one("SELECT count(*) FROM content_items", &[])
            .await
            .unwrap();
        row.get::<_, i64>(0) as usize
    };
    // Steady state: the consumer has joined and applied an item.
    let warm = json!({"id": "warm", "source": "photos", "type": "photos.changed", "user_id": "warm-up",
                      "authorized": true, "content_id": "warm", "status": "active",
                      "occurred_at": "2026-12-01T10:00:00Z", "payload": {}});
    kafka::publish(
        &producer,
        "events.photos",
        Some(b"warm-up"),
        warm.to_string().as_bytes(),
        &[],
    )
    .await
    .unwrap();
    wait_for(|| async { items().await >= 1 }, "the consumer to start").await;

    let all = events(count);
    let started = Instant::now();
    for chunk in all.chunks(2000) {
        let sends = chunk.iter().map(|(k, v)| {
            kafka::publish(
                &producer,
                "events.photos",
                Some(k.as_bytes()),
                v.as_bytes(),
                &[],
            )
        });
        for result in futures_util::future::join_all(sends).await {
            result.unwrap();
        }
    }
    drop(all);
    let produced = started.elapsed().as_secs_f64();
    wait_for(
        || async { items().await > count },
        "ingest to store every item",
    )
    .await;
    let ingest_s = started.elapsed().as_secs_f64();
    let ingest_rate = count as f64 / ingest_s;
    println!(
        "Ingest: Kafka -> Wasm filters and rule -> stored items and counters: {ingest_rate:>8.0} items/s ({count} in {ingest_s:.2} s, produced in the first {produced:.2} s)"
    );

    // The new award credits the past: the same process's backfill worker
    // walks the stored items.
    laurel::definitions::apply(&mut store, &registry, &award("new", true))
        .await
        .unwrap();
    // The items phase (what the goal is about): from the first recorded
    // step to the items walked; then the analytics phase reads the topic's
    // retained messages back (content events, skipped there).
    let mut first: Option<(Instant, i64)> = None;
    let mut walked_at: Option<(Instant, i64)> = None;
    let finished = loop {
        let b = store.history_backfill("new").await.unwrap().unwrap();
        if first.is_none() && b.done > 0 {
            first = Some((Instant::now(), b.done));
        }
        if walked_at.is_none() && b.positions.is_some() {
            walked_at = Some((Instant::now(), b.done));
        }
        if b.finished_at.is_some() {
            break b;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let finished_at = Instant::now();
    let (since, before) = first.expect("a step was recorded");
    let (walked_at, done) = walked_at.expect("the items were walked");
    let backfill_s = walked_at.duration_since(since).as_secs_f64();
    let walked = done - before;
    let backfill_rate = walked as f64 / backfill_s;
    let events_s = finished_at.duration_since(walked_at).as_secs_f64();
    println!(
        "Backfill from history, items: stored items -> Wasm filters and rule -> counters: {backfill_rate:>8.0} items/s ({walked} in {backfill_s:.2} s after the first step; {} changed, {} unrecoverable, {} failed)",
        finished.changed, finished.unrecoverable, finished.failed
    );
    println!(
        "Backfill from history, retained messages read back from Kafka (all content events here, so skipped): {:>8.0} messages/s ({} in {events_s:.2} s)",
        finished.events_done as f64 / events_s,
        finished.events_done
    );
    assert_eq!(finished.failed, 0, "{finished:?}");
    assert_eq!(finished.unrecoverable, 0, "{finished:?}");
    // Each item counted once: the two awards' counters agree.
    let disagree: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT user_id, objective_id, counters FROM user_objective WHERE award_id = 'live') l
             FULL JOIN (SELECT user_id, objective_id, counters FROM user_objective WHERE award_id = 'new') n
             USING (user_id, objective_id) WHERE l.counters IS DISTINCT FROM n.counters",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        disagree, 0,
        "the backfilled counters differ from the live ones"
    );

    let _ = stop.send(());
    task.await.unwrap().unwrap();
    (ingest_rate, backfill_rate)
}

async fn wait_for<F, Fut>(mut condition: F, what: &str)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(1800);
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
