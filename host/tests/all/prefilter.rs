//! The pre-filter against the broker: raw records in three formats through
//! pipelines (built-in transforms in Wasm), only what some award can use
//! produced to `events.bss`, malformed records dead-lettered with why, and
//! the kept trips counted on the award by ingest.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use laurel::catalog::Catalog;
use laurel::ingest;
use laurel::registry::Registry;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::api::AWARDS;
use crate::pipeline_support::{Pipeline, dead_letter_messages, settings};
use crate::support;

/// The three pipelines: one per format, all for source `bss`.
const PIPELINES: &str = r#"[
  {"name": "navi-json", "input_topic": "raw.json", "source": "bss",
   "transform": {"name": "JsonTransform", "config": {"fields": {
     "user_id": "/user", "type": "/event", "authorized": {"const": true}, "occurred_at": "/ts",
     "payload": {"distance_m": "/distance"}}}}},
  {"name": "navi-kv", "input_topic": "raw.kv", "source": "bss",
   "transform": {"name": "KeyValueTransform", "config": {"fields": {
     "user_id": "uid", "type": "event", "authorized": {"const": true}, "occurred_at": "ts",
     "occurred_at_unit": "s", "payload": {"distance_m": "dist"}}}}},
  {"name": "navi-csv", "input_topic": "raw.csv", "source": "bss",
   "transform": {"name": "CsvTransform", "config": {"columns": ["ts", "uid", "event", "dist"],
     "fields": {"user_id": "uid", "type": "event", "authorized": {"const": true}, "occurred_at": "ts",
       "payload": {"distance_m": "dist"}}}}}
]"#;

const FORMATS: [&str; 3] = ["json", "kv", "csv"];

/// Record `n` of a format: relevant (a finished trip), irrelevant (another
/// navigator event) or malformed; its user and distance.
fn record(format: &str, n: usize, user: &str, kind: Kind) -> String {
    let distance = 100 + n % 900;
    let (event, seconds) = match kind {
        Kind::Trip => ("navi.trip_finished", 1_764_583_200 + n as i64),
        Kind::Other => ("navi.route_built", 1_764_583_200 + n as i64),
        Kind::Malformed => ("", 0),
    };
    match (format, kind) {
        ("json", Kind::Malformed) => "{not json".to_string(),
        ("kv", Kind::Malformed) => format!("uid={user} junk"),
        ("csv", Kind::Malformed) => format!("{seconds},{user}"),
        ("json", _) => {
            json!({"user": user, "event": event, "ts": seconds * 1000, "distance": distance})
                .to_string()
        }
        ("kv", _) => format!("ts={seconds} uid={user} event={event} dist={distance}"),
        (_, _) => format!("{},{user},{event},{distance}", seconds * 1000),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Trip,
    Other,
    Malformed,
}

/// 0.6% trips, 1% malformed, the rest other navigator events.
fn kind(n: usize) -> Kind {
    match n % 1000 {
        0..=5 => Kind::Trip,
        100..=109 => Kind::Malformed,
        _ => Kind::Other,
    }
}

/// The messages on `topic`, from the start: at least `want` (waiting up
/// to five minutes for them), then any more that arrive within `quiet`:
/// (key, value).
async fn drain(brokers: &str, topic: &str, want: usize, quiet: Duration) -> Vec<(String, Vec<u8>)> {
    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "group.id",
            format!("test-drain-{topic}-{}", std::process::id()),
        )
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut found = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        let wait = if found.len() < want {
            deadline.saturating_duration_since(tokio::time::Instant::now())
        } else {
            quiet
        };
        let Ok(message) = tokio::time::timeout(wait, consumer.recv()).await else {
            break;
        };
        let message = message.unwrap();
        let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
        found.push((key, message.payload().unwrap_or_default().to_vec()));
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_records_become_exactly_the_events_some_award_needs() {
    const RECORDS: usize = 100_000;
    let mut p = Pipeline::start(AWARDS, &["bss"]).await;
    let brokers = p.broker.bootstrap_servers().to_string();
    for format in FORMATS {
        p.broker.create_topic(&format!("raw.{format}"), 3).unwrap();
        p.broker
            .create_topic(&format!("raw.{format}.dead"), 1)
            .unwrap();
    }
    let mut store = p.db.store().await;
    let applied = laurel::pipelines::apply(&mut store, &p.registry, PIPELINES)
        .await
        .unwrap();
    assert_eq!(applied.len(), 3);

    // Produce first, then start the pre-filter: it reads from the start.
    let users: Vec<String> = (0..40).map(|u| format!("u-{u}")).collect();
    let mut expected_trips: BTreeMap<String, i64> = BTreeMap::new();
    let mut expected_ids = BTreeSet::new();
    let mut malformed = BTreeMap::new();
    let mut sends = Vec::new();
    for n in 0..RECORDS {
        let format = FORMATS[n % 3];
        let user = &users[n % users.len()];
        let kind = kind(n);
        let value = record(format, n, user, kind);
        match kind {
            Kind::Trip => {
                *expected_trips.entry(user.clone()).or_default() += (100 + n % 900) as i64;
                expected_ids.insert((format, n));
            }
            Kind::Malformed => *malformed.entry(format).or_insert(0) += 1,
            Kind::Other => {}
        }
        sends.push((format!("raw.{format}"), user.clone(), value));
    }
    for chunk in sends.chunks(5000) {
        let futures = chunk.iter().map(|(topic, key, value)| {
            ingest::publish(
                &p.producer,
                topic,
                Some(key.as_bytes()),
                value.as_bytes(),
                &[],
            )
        });
        for result in futures_util::future::join_all(futures).await {
            result.unwrap();
        }
    }

    let registry = Registry::start(&p.db.url, support::runtime())
        .await
        .unwrap();
    let catalog = Catalog::start(&p.db.url).await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let url = p.db.url.clone();
    let prefilter_settings = settings(&brokers);
    let prefilter = tokio::spawn(async move {
        ingest::prefilter::run(prefilter_settings, &url, registry, catalog, async {
            let _ = stopped.await;
        })
        .await
    });

    // Exactly the trips, once each, keyed by user, ids from their position.
    let trips = expected_ids.len();
    let kept = drain(&brokers, "events.bss", trips, Duration::from_secs(3)).await;
    assert_eq!(kept.len(), trips, "kept events on events.bss");
    let mut ids = BTreeSet::new();
    for (key, value) in &kept {
        let event: Value = serde_json::from_slice(value).unwrap();
        assert_eq!(event["type"], "navi.trip_finished", "{event}");
        assert_eq!(event["source"], "bss");
        assert_eq!(key, event["user_id"].as_str().unwrap());
        let id = event["id"].as_str().unwrap().to_string();
        assert!(id.starts_with("raw."), "{id}");
        assert!(ids.insert(id.clone()), "{id} produced twice");
    }

    // Every malformed record dead-lettered with why.
    for (format, count) in &malformed {
        let letters = dead_letter_messages(&brokers, &format!("raw.{format}.dead"), *count).await;
        let want = match *format {
            "json" => "the record is not JSON",
            "kv" => "line 1: \"junk\" is not key=value",
            _ => "row 1: 2 cells, the header has 4",
        };
        for (_, reason, size) in &letters {
            assert!(reason.contains(want), "{format}: {reason}");
            assert!(*size > 0, "the dead letter keeps the record");
        }
    }
    for (format, count) in &malformed {
        let all = drain(
            &brokers,
            &format!("raw.{format}.dead"),
            *count,
            Duration::from_secs(2),
        )
        .await;
        assert_eq!(
            all.len(),
            *count,
            "{format}: nothing but the malformed is dead-lettered"
        );
    }

    // Ingest counted each trip once on the award.
    for (user, metres) in &expected_trips {
        p.settle("bss", user).await;
        let counters = p.objective(user, "content-maker", "navi").await;
        assert_eq!(counters.get("metres"), Some(metres), "{user}");
    }

    let _ = stop.send(());
    prefilter.await.unwrap().unwrap();
    p.stop().await;
}
