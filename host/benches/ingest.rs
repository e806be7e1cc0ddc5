//! Benchmark: events/s from Kafka to committed counters at steady state
//! (every consumer joined), 5 sources x 10 awards x 2 objectives, on this machine with the broker (librdkafka's mock
//! cluster, in process) and PostgreSQL on the same box. The baseline,
//! measured in the same run: PostgreSQL's rate of batched UNNEST upserts
//! (500 rows per transaction) of the same shape as the counters.
//!
//! cargo bench -p laurel --bench ingest            (LAUREL_BENCH_EVENTS=300000,
//!                                                  LAUREL_BENCH_ROUNDS=2)
//!
//! Each round measures a clean stream and the same stream with 1% hostile
//! messages (malformed JSON, a NUL in the user id, a content id over the
//! limit, a number outside the safe range: each dead-lettered with its
//! reason, kept in PostgreSQL and published to the dead-letter topic), and
//! reports the hostile rate as a ratio of the clean one; and the clean
//! stream again while 200 clients scrape `/metrics` and `/healthz` of an
//! API server in the same process, each once a second (the issue: every
//! scrape used to make a Kafka client per source), as a ratio of the clean
//! one.
//!
//! 300,000 events make a window of about 10 s: with 100,000 (about 4 s) the
//! start (the first batches, cold caches) and the end (sources finishing
//! their last batches one after another) are a quarter of the time. Every
//! message fits in the mock cluster's retention (about 4 MiB per partition
//! against its 5 MiB).
//!
//! Uses the database `laurel_bench_ingest` on 127.0.0.1 (dropped and made
//! anew each run; LAUREL_BENCH_SERVER_URL to change the server).

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

const SOURCES: [&str; 5] = ["photos", "reviews", "feedback", "checkins", "bss"];

fn awards() -> String {
    let mut awards = Vec::new();
    for a in 0..10 {
        let content_source = SOURCES[a % 5];
        let other_source = SOURCES[(a + 1) % 5];
        awards.push(json!({
            "id": format!("award-{a}"), "title": format!("Award {a}"),
            "objectives": [
                {"id": "content",
                 "filters": [{"name": "SourceFilter", "config": {"sources": [content_source]}},
                             {"name": "StatusFilter", "config": {"statuses": ["active", "moderation", "blocked"]}}],
                 "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved", "moderation": "on_moderation", "blocked": "blocked"}}},
                 "progress_counter": "approved"},
                {"id": "usage",
                 "filters": [{"name": "SourceFilter", "config": {"sources": [other_source]}},
                             {"name": "EventTypeFilter", "config": {"types": ["app.used"]}}],
                 "rule": {"name": "CountRule", "config": {"counter": "uses"}},
                 "progress_counter": "uses"}],
            "strategy": {"goal": 10, "strategy": [{"objective_id": "content"}, {"objective_id": "usage"}]}
        }));
    }
    serde_json::Value::Array(awards).to_string()
}

/// The stream; with `hostile`, every 100th message is one that must be
/// dead-lettered.
fn events(count: usize, hostile: bool) -> Vec<(String, String, String)> {
    let statuses = ["moderation", "active", "blocked", "deleted"];
    (0..count)
        .map(|i| {
            let source = SOURCES[i % 5];
            let user = format!("user-{}", (i * 7919) % 10_000);
            let value = if hostile && i % 100 == 99 {
                match (i / 100) % 4 {
                    0 => format!("{{\"id\": \"e-{i}\", \"source\": "),
                    1 => json!({"id": format!("e-{i}"), "source": source, "type": "app.used", "user_id": format!("{user}\u{0}"),
                                "authorized": true, "occurred_at": "2026-12-01T10:00:00Z", "payload": {}}).to_string(),
                    2 => json!({"id": format!("e-{i}"), "source": source, "type": "content.changed", "user_id": user,
                                "authorized": true, "content_id": "c".repeat(3000), "status": "active",
                                "occurred_at": "2026-12-01T10:00:00Z", "payload": {}}).to_string(),
                    _ => json!({"id": format!("e-{i}"), "source": source, "type": "app.used", "user_id": user,
                                "authorized": true, "occurred_at": "2026-12-01T10:00:00Z", "payload": {"n": 1e300}}).to_string(),
                }
            } else if i % 10 < 7 {
                json!({"id": format!("e-{i}"), "source": source, "type": "content.changed", "user_id": user,
                       "authorized": true, "content_id": format!("c-{}", (i / 5) % 30_000), "status": statuses[(i / 3) % 4],
                       "occurred_at": chrono::DateTime::from_timestamp(1_796_000_000 + i as i64, 0).unwrap().to_rfc3339(),
                       "payload": {"object_id": format!("o-{}", i % 500)}}).to_string()
            } else {
                json!({"id": format!("e-{i}"), "source": source, "type": "app.used", "user_id": user, "authorized": true,
                       "occurred_at": "2026-12-01T10:00:00Z", "payload": {"screen": "map"}}).to_string()
            };
            (format!("events.{source}"), user, value)
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

/// Rows/s of 500-row UNNEST upserts (jsonb counters, a sequence-drawn
/// version), the shape of Laurel's user_objective writes.
async fn baseline(url: &str, rows: usize) -> f64 {
    let client = sql(url).await;
    client
        .batch_execute(
            "DROP TABLE IF EXISTS baseline_upsert; DROP SEQUENCE IF EXISTS baseline_version;
             CREATE SEQUENCE baseline_version;
             CREATE TABLE baseline_upsert (user_id text, award_id text, objective_id text, counters jsonb, version bigint,
                                           PRIMARY KEY (user_id, award_id, objective_id))",
        )
        .await
        .unwrap();
    let started = Instant::now();
    for chunk in (0..rows).collect::<Vec<_>>().chunks(500) {
        let users: Vec<String> = chunk
            .iter()
            .map(|i| format!("user-{}", i % 10_000))
            .collect();
        let awards: Vec<String> = chunk
            .iter()
            .map(|i| format!("award-{}", (i / 10_000) % 10))
            .collect();
        let objectives: Vec<&str> = chunk.iter().map(|_| "content").collect();
        let counters: Vec<serde_json::Value> =
            chunk.iter().map(|_| json!({"approved": 1})).collect();
        // Keys must be unique within one statement.
        let mut keyed: Vec<_> = users
            .iter()
            .zip(&awards)
            .zip(&objectives)
            .zip(&counters)
            .collect();
        keyed.sort_by(|a, b| (a.0.0.0, a.0.0.1).cmp(&(b.0.0.0, b.0.0.1)));
        keyed.dedup_by(|a, b| (a.0.0.0, a.0.0.1) == (b.0.0.0, b.0.0.1));
        let (u, a, o, c): (
            Vec<&String>,
            Vec<&String>,
            Vec<&&str>,
            Vec<&serde_json::Value>,
        ) = keyed.into_iter().fold(
            (vec![], vec![], vec![], vec![]),
            |(mut u, mut a, mut o, mut c), (((x, y), z), w)| {
                u.push(x);
                a.push(y);
                o.push(z);
                c.push(w);
                (u, a, o, c)
            },
        );
        client
            .execute(
                "INSERT INTO baseline_upsert SELECT u, a, o, c, nextval('baseline_version')
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[]) AS k(u, a, o, c)
                 ON CONFLICT (user_id, award_id, objective_id) DO UPDATE SET
                     counters = EXCLUDED.counters, version = EXCLUDED.version",
                &[&u, &a, &o, &c],
            )
            .await
            .unwrap();
    }
    rows as f64 / started.elapsed().as_secs_f64()
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
    let count = env("LAUREL_BENCH_EVENTS", 300_000);
    let rounds = env("LAUREL_BENCH_ROUNDS", 2).max(1);
    let server = std::env::var("LAUREL_BENCH_SERVER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let url = format!("{server}/laurel_bench_ingest");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut rows_per_s = 0.0;
        let mut ratios = Vec::new();
        let mut scraped = Vec::new();
        let mut clean = Vec::new();
        for round in 1..=rounds {
            let mut rates = [0.0; 3];
            for (k, mode) in [Mode::Clean, Mode::Hostile, Mode::Scraped].into_iter().enumerate() {
                let (rate, baseline) = measure(&server, &url, count, mode, rows_per_s == 0.0).await;
                if let Some(baseline) = baseline {
                    rows_per_s = baseline;
                    println!("Baseline: PostgreSQL UNNEST upserts, 500 rows per transaction: {rows_per_s:>8.0} rows/s");
                }
                rates[k] = rate;
            }
            let ratio = rates[1] / rates[0];
            clean.push(rates[0]);
            ratios.push(ratio);
            scraped.push(rates[2] / rates[0]);
            println!(
                "Round {round}: clean {:.0} events/s (ratio to baseline {:.2}), 1% hostile {:.0} events/s: hostile/clean {ratio:.2}; scraped {:.0} events/s: scraped/clean {:.2}",
                rates[0],
                rates[0] / rows_per_s,
                rates[1],
                rates[2],
                rates[2] / rates[0]
            );
        }
        scraped.sort_by(f64::total_cmp);
        println!(
            "Scraped/clean over {rounds} rounds: lowest {:.2}, median {:.2}, highest {:.2}",
            scraped[0],
            scraped[scraped.len() / 2],
            scraped[scraped.len() - 1]
        );
        ratios.sort_by(f64::total_cmp);
        println!(
            "Hostile/clean over {rounds} rounds: lowest {:.2}, median {:.2}, highest {:.2}",
            ratios[0],
            ratios[ratios.len() / 2],
            ratios[ratios.len() - 1]
        );
        let per_row: Vec<f64> = clean.iter().map(|rate| rate / rows_per_s).collect();
        row(
            "ingest",
            &format!("Kafka -> Wasm filters and rules -> committed counters, {count} events (baseline: UNNEST upserts, 500 rows a transaction; ratio: events per baseline row)"),
            &spread(&clean, thousands, "events/s"),
            &format!("{} rows/s", thousands(rows_per_s)),
            &spread(&per_row, |r| format!("{r:.2}"), ""),
            ">= 30K events/s",
        );
        row(
            "ingest",
            "the same stream with every 100th message hostile, each dead-lettered with its reason (baseline: the clean stream)",
            "",
            "",
            &spread(&ratios, |r| format!("{r:.2}"), ""),
            ">= 0.9",
        );
        row(
            "ingest",
            "the clean stream while 200 clients scrape /metrics and /healthz once a second each (baseline: the clean stream)",
            "",
            "",
            &spread(&scraped, |r| format!("{r:.2}"), ""),
            "",
        );
    });
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Clean,
    /// 1% hostile messages.
    Hostile,
    /// Clean, with 200 clients scraping the API's unauthenticated routes.
    Scraped,
}

/// 200 clients, each scraping `/metrics` and `/healthz` once a second,
/// against an API server in this process; until `stop`.
async fn scrape(
    url: &str,
    brokers: &str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<u64>> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let registry = Registry::start(url, Runtime::new(Limits::default(), None).unwrap())
        .await
        .unwrap();
    let catalog = Catalog::start(url).await.unwrap();
    let state = std::sync::Arc::new(laurel::api::AppState::new(
        laurel::api::ApiSettings {
            kafka_brokers: Some(brokers.to_string()),
            ..laurel::api::ApiSettings::new(url)
        },
        registry,
        catalog,
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let mut server_stop = stop.clone();
    tokio::spawn(laurel::api::run(listener, state, async move {
        let _ = server_stop.changed().await;
    }));
    let client = reqwest::Client::new();
    (0..200)
        .map(|_| {
            let (client, base, mut stop) = (client.clone(), base.clone(), stop.clone());
            tokio::spawn(async move {
                let mut scrapes = 0;
                while !*stop.borrow() {
                    for path in ["/metrics", "/healthz"] {
                        if client.get(format!("{base}{path}")).send().await.is_ok() {
                            scrapes += 1;
                        }
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = stop.changed() => {}
                    }
                }
                scrapes
            })
        })
        .collect()
}

/// One measured stream on a fresh database and broker: events/s, and the
/// baseline if asked for.
async fn measure(
    server: &str,
    url: &str,
    count: usize,
    mode: Mode,
    with_baseline: bool,
) -> (f64, Option<f64>) {
    let hostile = mode == Mode::Hostile;
    let admin = sql(&format!("{server}/postgres")).await;
    admin
        .batch_execute("DROP DATABASE IF EXISTS laurel_bench_ingest WITH (FORCE)")
        .await
        .unwrap();
    let mut store = Store::connect(url).await.unwrap();
    store.migrate().await.unwrap();
    // A/B knob: schema or settings changes to try, e.g.
    // LAUREL_BENCH_SQL="ALTER TABLE user_objective SET (fillfactor = 80)".
    if let Ok(extra) = std::env::var("LAUREL_BENCH_SQL") {
        sql(url).await.batch_execute(&extra).await.unwrap();
        println!("(extra SQL: {extra})");
    }
    let runtime = Runtime::new(Limits::default(), None).unwrap();
    laurel::library::register(&mut store, &runtime)
        .await
        .unwrap();
    let registry = Registry::start(url, runtime).await.unwrap();
    laurel::definitions::apply(&mut store, &registry, &awards())
        .await
        .unwrap();

    let broker = LocalBroker::start(None).await.unwrap();
    for source in SOURCES {
        broker.create_topic(&format!("events.{source}"), 4).unwrap();
        broker
            .create_topic(&format!("events.{source}.dead"), 1)
            .unwrap();
    }
    let producer = kafka::producer(broker.bootstrap_servers()).unwrap();
    let baseline = if with_baseline {
        Some(baseline(url, count).await)
    } else {
        None
    };
    // A/B: what the awards worker's change markers cost ingest.
    if std::env::var_os("LAUREL_BENCH_NO_MARKERS").is_some() {
        sql(url)
            .await
            .batch_execute(
                "ALTER TABLE user_objective DISABLE TRIGGER user_objective_inserted;
                 ALTER TABLE user_objective DISABLE TRIGGER user_objective_updated",
            )
            .await
            .unwrap();
        println!("(change markers off: the awards worker would see nothing)");
    }

    let catalog = Catalog::start(url).await.unwrap();
    let batch_size = std::env::var("LAUREL_BATCH_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(IngestSettings::new("").batch_size);
    let settings = IngestSettings {
        session_timeout: Duration::from_secs(6),
        batch_size,
        ..IngestSettings::new(broker.bootstrap_servers())
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let ingest_url = url.to_string();
    let task = tokio::spawn(async move {
        laurel::cli::ingest_and_backfill(settings, &ingest_url, registry, catalog, async {
            let _ = stopped.await;
        })
        .await
    });
    // Steady state: every source's consumer has joined its group and
    // applied an event (a join takes seconds on the mock broker, and is
    // not throughput) before the measured events are produced.
    for source in SOURCES {
        let warm = json!({"id": format!("warm-{source}"), "source": source, "type": "app.used", "user_id": "warm-up",
                          "authorized": true, "occurred_at": "2026-12-01T10:00:00Z", "payload": {}});
        kafka::publish(
            &producer,
            &format!("events.{source}"),
            Some(b"warm-up"),
            warm.to_string().as_bytes(),
            &[],
        )
        .await
        .unwrap();
    }
    assert!(
        wait_committed(broker.bootstrap_servers(), SOURCES.len()).await,
        "the consumers did not start"
    );

    let (scrapers_stop, scrapers_stopped) = tokio::sync::watch::channel(false);
    let scrapers = if mode == Mode::Scraped {
        scrape(url, broker.bootstrap_servers(), scrapers_stopped).await
    } else {
        Vec::new()
    };
    // Measured: from the first produced event to the last committed
    // offset (producing overlaps consuming).
    let all = events(count, hostile);
    let started = Instant::now();
    for chunk in all.chunks(2000) {
        let sends = chunk
            .iter()
            .map(|(t, k, v)| kafka::publish(&producer, t, Some(k.as_bytes()), v.as_bytes(), &[]));
        for result in futures_util::future::join_all(sends).await {
            result.unwrap();
        }
    }
    let produced = started.elapsed().as_secs_f64();
    let done = wait_committed(broker.bootstrap_servers(), count + SOURCES.len()).await;
    let elapsed = started.elapsed().as_secs_f64();
    let events_per_s = (count as f64) / elapsed;
    let _ = scrapers_stop.send(true);
    let mut scrapes = 0;
    for scraper in scrapers {
        scrapes += scraper.await.unwrap_or(0);
    }
    println!(
        "Laurel, {}: Kafka -> Wasm filters and rules -> committed counters: {events_per_s:>8.0} events/s ({count} events in {elapsed:.2} s, produced in the first {produced:.2} s{})",
        match mode {
            Mode::Clean => "clean".to_string(),
            Mode::Hostile => "1% hostile".to_string(),
            Mode::Scraped => format!("scraped ({scrapes} scrapes)"),
        },
        if done { "" } else { ", NOT all committed" }
    );
    if hostile {
        let dead: i64 = sql(url)
            .await
            .query_one("SELECT count(*) FROM dead_letters", &[])
            .await
            .unwrap()
            .get(0);
        println!("  dead letters kept: {dead} (expected {})", count / 100);
    }
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    (events_per_s, baseline)
}

/// Waits until the consumer groups' committed offsets cover every message.
async fn wait_committed(brokers: &str, count: usize) -> bool {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumers: Vec<(BaseConsumer, rdkafka::TopicPartitionList)> = SOURCES
        .iter()
        .map(|source| {
            let consumer: BaseConsumer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .set("group.id", format!("laurel.{source}"))
                .create()
                .unwrap();
            let mut tpl = rdkafka::TopicPartitionList::new();
            for partition in 0..4 {
                tpl.add_partition(&format!("events.{source}"), partition);
            }
            (consumer, tpl)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let mut committed = 0i64;
        for (consumer, tpl) in &consumers {
            if let Ok(offsets) = consumer.committed_offsets(tpl.clone(), Duration::from_secs(5)) {
                for element in offsets.elements() {
                    if let rdkafka::Offset::Offset(o) = element.offset() {
                        committed += o;
                    }
                }
            }
        }
        if committed as usize >= count {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
