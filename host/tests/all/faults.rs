//! Faults of the environment while events stream: a PostgreSQL cluster the
//! test owns (initdb + pg_ctl on a free port) restarted and its backends
//! terminated at random moments; the Kafka broker in its own process
//! (`laurel dev kafka`) killed and started again. Afterwards every counter
//! equals what the events imply, computed here, independently of Laurel.

use std::time::Duration;

use laurel::catalog::Catalog;
use laurel::ingest::IngestSettings;
use laurel::kafka;
use laurel::library;
use laurel::registry::Registry;

use crate::owned_postgres::{OwnedPostgres, free_port};
use crate::processes::{self, AWARDS};
use crate::support::{self, TestDb};

/// Terminates every backend of `database` but the caller's.
pub(crate) async fn terminate_backends(server_url: &str, database: &str) -> u64 {
    let Ok((client, connection)) =
        tokio_postgres::connect(&format!("{server_url}/postgres"), tokio_postgres::NoTls).await
    else {
        return 0;
    };
    tokio::spawn(connection);
    client
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&database],
        )
        .await
        .map(|rows| rows.len() as u64)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_and_backends_terminated_while_streaming_lose_nothing() {
    const EVENTS: usize = 50_000;
    let postgres = OwnedPostgres::start();
    let db = TestDb::on(&postgres.server_url()).await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    library::register(&mut store, &runtime).await.unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    laurel::definitions::apply(&mut store, &registry, AWARDS)
        .await
        .unwrap();
    drop(store);
    let broker = kafka::LocalBroker::start(None).await.unwrap();
    for source in ["photos", "reviews", "bss"] {
        broker.create_topic(&format!("events.{source}"), 4).unwrap();
    }
    let catalog = Catalog::start(&db.url).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let settings = IngestSettings {
        batch_size: 500,
        batch_wait: Duration::from_millis(20),
        session_timeout: Duration::from_secs(6),
        ..IngestSettings::new(broker.bootstrap_servers())
    };
    let url = db.url.clone();
    let ingest_registry = Registry::start(&db.url, support::runtime()).await.unwrap();
    let task = tokio::spawn(async move {
        laurel::cli::ingest_and_backfill(settings, &url, ingest_registry, catalog, async {
            let _ = stopped.await;
        })
        .await
    });

    let (events, expected) = processes::workload(EVENTS, 0x5eed_f00d);
    let producer = kafka::producer(broker.bootstrap_servers()).unwrap();
    let database = db.name().to_string();
    let server = postgres.server_url();
    let mut rng = processes::Rng(0xfa17);
    let mut faults = Vec::new();
    for (n, chunk) in events.chunks(1_000).enumerate() {
        let sends = chunk.iter().map(|(topic, key, value)| {
            kafka::publish(
                &producer,
                topic,
                Some(key.as_bytes()),
                value.as_bytes(),
                &[],
            )
        });
        for result in futures_util::future::join_all(sends).await {
            result.unwrap();
        }
        // Let ingest work a while, then break something.
        tokio::time::sleep(Duration::from_millis(100 + rng.below(300))).await;
        if n % 5 == 4 {
            let fault = match rng.below(3) {
                0 => {
                    postgres.stop(true);
                    tokio::time::sleep(Duration::from_millis(rng.below(1_500))).await;
                    postgres.start_again();
                    "crash and restart"
                }
                1 => {
                    postgres.stop(false);
                    tokio::time::sleep(Duration::from_millis(rng.below(1_500))).await;
                    postgres.start_again();
                    "clean restart"
                }
                _ => {
                    terminate_backends(&server, &database).await;
                    "terminate backends"
                }
            };
            faults.push(fault);
        }
    }
    assert!(faults.len() >= 9, "{faults:?}");
    let actual = processes::settle(&db, &expected).await;
    assert!(
        actual == expected,
        "after {faults:?}: {}",
        processes::diff(&expected, &actual)
    );
    // And ingest goes on after the last fault.
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    drop(registry);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_and_started_again_ingest_carries_on() {
    const EVENTS: usize = 20_000;
    // A port free when picked may be taken before the broker binds it.
    let (port, broker) = (0..20)
        .find_map(|_| {
            let port = free_port();
            processes::Broker::try_start_on(Some(port)).map(|b| (port, b))
        })
        .expect("laurel dev kafka never kept a port");
    let brokers = format!("127.0.0.1:{port}");
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    library::register(&mut store, &runtime).await.unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    laurel::definitions::apply(&mut store, &registry, AWARDS)
        .await
        .unwrap();
    let catalog = Catalog::start(&db.url).await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let settings = IngestSettings {
        batch_wait: Duration::from_millis(20),
        session_timeout: Duration::from_secs(6),
        ..IngestSettings::new(&brokers)
    };
    let url = db.url.clone();
    let ingest_registry = Registry::start(&db.url, support::runtime()).await.unwrap();
    let task = tokio::spawn(async move {
        laurel::cli::ingest_and_backfill(settings, &url, ingest_registry, catalog, async {
            let _ = stopped.await;
        })
        .await
    });
    let (events, expected) = processes::workload(EVENTS, 0xb20c);
    let (_, expected_first) = processes::workload(EVENTS / 2, 0xb20c);
    let publish = async |events: &[(String, String, String)]| {
        let producer = kafka::producer(&brokers).unwrap();
        for chunk in events.chunks(1_000) {
            let sends = chunk.iter().map(|(topic, key, value)| {
                kafka::publish(
                    &producer,
                    topic,
                    Some(key.as_bytes()),
                    value.as_bytes(),
                    &[],
                )
            });
            for result in futures_util::future::join_all(sends).await {
                result.unwrap();
            }
        }
    };
    publish(&events[..EVENTS / 2]).await;
    let actual = processes::settle(&db, &expected_first).await;
    assert!(
        actual == expected_first,
        "{}",
        processes::diff(&expected_first, &actual)
    );

    // The broker goes away (its log with it: the local broker keeps
    // nothing on disk) and comes back on the same address.
    drop(broker);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let broker = processes::Broker::start_on(Some(port));
    // The new broker has none of the old one's log or offsets. A consumer
    // finds its old position out of range and starts again from the
    // beginning, once it fetches: one probe per source, each applied before
    // the rest is sent (a probe cannot be skipped: the log stays shorter
    // than the old positions until the consumer has started again).
    let probe_producer = kafka::producer(&brokers).unwrap();
    let sql = db.sql().await;
    for (i, (topic, award)) in [
        ("events.photos", "photographer"),
        ("events.reviews", "critic"),
        ("events.bss", "regular"),
    ]
    .into_iter()
    .enumerate()
    {
        let source = topic.trim_start_matches("events.");
        let probe = serde_json::json!({"id": format!("probe-{i}"), "source": source, "type": "probe",
            "user_id": "probe", "authorized": true, "content_id": format!("probe-{i}"), "status": "active",
            "occurred_at": "2026-12-01T10:00:00Z", "payload": {"object_id": "probe"}});
        let probe = if source == "bss" {
            serde_json::json!({"id": "probe-bss", "source": "bss", "type": "probe", "user_id": "probe",
                "authorized": true, "occurred_at": "2026-12-01T10:00:00Z", "payload": {}})
        } else {
            probe
        };
        kafka::publish(
            &probe_producer,
            topic,
            Some(b"probe"),
            probe.to_string().as_bytes(),
            &[],
        )
        .await
        .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while sql
            .query_opt(
                "SELECT 1 FROM user_objective WHERE user_id = 'probe' AND award_id = $1",
                &[&award],
            )
            .await
            .unwrap()
            .is_none()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{source}'s consumer never came back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Malformed messages among the rest: dead letters after the restart.
    let mut rest = events[EVENTS / 2..].to_vec();
    for i in 0..5 {
        rest.insert(
            i * 1_000,
            (
                "events.photos".to_string(),
                "mallory".to_string(),
                format!("not json {i}"),
            ),
        );
    }
    publish(&rest).await;
    let mut expected = expected;
    for award in [
        ("photographer", "photo"),
        ("critic", "reviews"),
        ("regular", "visits"),
    ] {
        let counters = if award.0 == "regular" {
            "opened"
        } else if award.0 == "critic" {
            "count"
        } else {
            "approved"
        };
        expected.insert(
            (
                "probe".to_string(),
                award.0.to_string(),
                award.1.to_string(),
            ),
            [(counters.to_string(), 1)].into(),
        );
    }
    let actual = processes::settle(&db, &expected).await;
    assert!(
        actual == expected,
        "{}",
        processes::diff(&expected, &actual)
    );
    let sql = db.sql().await;
    let dead: i64 = sql
        .query_one(
            "SELECT count(*) FROM dead_letters WHERE reason LIKE 'malformed event:%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dead, 5);
    let reasons = crate::pipeline_support::dead_letters(&brokers, "events.photos.dead", 5).await;
    assert!(
        reasons.iter().all(|r| r.starts_with("malformed event:")),
        "{reasons:?}"
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    drop(broker);
    db.drop_database().await;
}
