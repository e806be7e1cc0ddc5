//! The pre-filter against the broker: raw records in three formats through
//! pipelines (built-in transforms in Wasm), only what some award can use
//! produced to `events.bss`, malformed records dead-lettered with why, and
//! the kept trips counted on the award by ingest.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use laurel::catalog::Catalog;
use laurel::kafka;
use laurel::registry::Registry;
use laurel::runtime::{Event, FilterInstance, FunctionKind};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::api::{AWARDS, Server};
use crate::owned_postgres::OwnedPostgres;
use crate::pipeline_support::{
    Pipeline, dead_letter_messages, dead_letters, produce_with_header_named, settings,
    whole_messages,
};
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
/// to `patience` for them), then any more that arrive within `quiet`:
/// (key, value).
async fn drain(
    brokers: &str,
    topic: &str,
    want: usize,
    patience: Duration,
    quiet: Duration,
) -> Vec<(String, Vec<u8>)> {
    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        // A group of its own each time: a new member of an old group waits
        // for the old one's session to end.
        .set("group.id", format!("test-drain-{topic}-{}", unique()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut found = Vec::new();
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let wait = if found.len() < want {
            deadline.saturating_duration_since(tokio::time::Instant::now())
        } else {
            quiet
        };
        let Ok(message) = tokio::time::timeout(wait, consumer.recv()).await else {
            break;
        };
        let message = match message {
            Ok(message) => message,
            // Not there yet (`laurel dev kafka` makes a topic when it is
            // first produced to).
            Err(rdkafka::error::KafkaError::MessageConsumption(
                rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition,
            )) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(error) => panic!("reading {topic}: {error}"),
        };
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
            kafka::publish(
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

    let prefilter = Prefilter::start(&p).await;

    // Exactly the trips, once each, keyed by user, ids from their position.
    let trips = expected_ids.len();
    let kept = drain(
        &brokers,
        "events.bss",
        trips,
        FIVE_MINUTES,
        Duration::from_secs(3),
    )
    .await;
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
            FIVE_MINUTES,
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
    let expected: Vec<(&str, i64)> = expected_trips
        .iter()
        .map(|(u, m)| (u.as_str(), *m))
        .collect();
    assert_metres(&mut p, &expected).await;

    prefilter.stop().await;
    p.stop().await;
}

/// A pre-filter running beside a test's pipeline, with a registry and a
/// catalog of its own (as a separate process would have).
struct Prefilter {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Prefilter {
    async fn start(p: &Pipeline) -> Prefilter {
        Prefilter::start_on(&p.db.url, p.broker.bootstrap_servers()).await
    }

    /// Topic `raw.kv` made, the key=value pipeline applied, and the
    /// pre-filter running it.
    async fn start_kv(p: &Pipeline) -> Prefilter {
        p.broker.create_topic("raw.kv", 1).unwrap();
        let mut store = p.db.store().await;
        laurel::pipelines::apply(&mut store, &p.registry, KV_PIPELINE)
            .await
            .unwrap();
        Prefilter::start(p).await
    }

    /// On the database at `url` and the broker at `brokers`.
    async fn start_on(url: &str, brokers: &str) -> Prefilter {
        let registry = Registry::start(url, support::runtime()).await.unwrap();
        let catalog = Catalog::start(url).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let url = url.to_string();
        let settings = settings(brokers);
        let task = tokio::spawn(async move {
            laurel::prefilter::run(
                laurel::cli::settings::prefilter_settings(&settings),
                &url,
                registry,
                catalog,
                async {
                    let _ = stopped.await;
                },
            )
            .await
        });
        Prefilter { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

async fn send(p: &Pipeline, topic: &str, values: &[&str]) {
    for value in values {
        kafka::publish(&p.producer, topic, Some(b"k"), value.as_bytes(), &[])
            .await
            .unwrap();
    }
}

fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

const FIVE_MINUTES: Duration = Duration::from_secs(300);

/// Once ingest has taken each user's events so far, the user's metres on
/// the award are as `expected` says.
async fn assert_metres(p: &mut Pipeline, expected: &[(&str, i64)]) {
    for (user, metres) in expected {
        p.settle("bss", user).await;
        let counters = p.objective(user, "content-maker", "navi").await;
        assert_eq!(counters.get("metres"), Some(metres), "{user}");
    }
}

/// The ids and types on `events.bss` once `want` are there (or `patience`
/// has passed).
async fn produced(p: &Pipeline, want: usize, patience: Duration) -> Vec<(String, String)> {
    drain(
        p.broker.bootstrap_servers(),
        "events.bss",
        want,
        patience,
        Duration::from_secs(2),
    )
    .await
    .into_iter()
    .map(|(_, value)| {
        let event: Value = serde_json::from_slice(&value).unwrap();
        (
            event["id"].as_str().unwrap().to_string(),
            event["type"].as_str().unwrap().to_string(),
        )
    })
    .collect()
}

const KV_PIPELINE: &str = r#"{"name": "navi-kv", "input_topic": "raw.kv", "source": "bss",
  "transform": {"name": "KeyValueTransform", "config": {"fields": {
    "user_id": "uid", "type": "event", "authorized": {"const": true}, "occurred_at": "ts",
    "occurred_at_unit": "s", "payload": {"distance_m": "dist"}}}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_award_applied_while_running_widens_what_is_kept() {
    let p = Pipeline::start(AWARDS, &["bss"]).await;
    let prefilter = Prefilter::start_kv(&p).await;
    let mut store = p.db.store().await;
    // No award counts built routes: dropped; a trip is kept.
    send(
        &p,
        "raw.kv",
        &[
            "ts=1764583200 uid=u-1 event=navi.route_built dist=5",
            "ts=1764583201 uid=u-1 event=navi.trip_finished dist=7",
        ],
    )
    .await;
    assert_eq!(
        produced(&p, 1, FIVE_MINUTES).await,
        [("raw.kv/0/1".to_string(), "navi.trip_finished".to_string())]
    );
    let routes = r#"[{"id": "route-planner", "title": "Route planner",
      "objectives": [{"id": "routes",
        "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}},
                    {"name": "EventTypeFilter", "config": {"types": ["navi.route_built"]}}],
        "rule": {"name": "CountRule", "config": {"counter": "routes"}}, "progress_counter": "routes"}],
      "strategy": {"goal": 3, "strategy": [{"objective_id": "routes"}]}}]"#;
    laurel::definitions::apply(&mut store, &p.registry, routes)
        .await
        .unwrap();
    // The pre-filter follows its catalog's notification, without a restart.
    let mut kept = Vec::new();
    for attempt in 0..50 {
        let value = format!("ts=1764583300 uid=u-1 event=navi.route_built dist={attempt}");
        send(&p, "raw.kv", &[&value]).await;
        kept = produced(&p, 2, Duration::from_secs(10)).await;
        if kept.len() >= 2 {
            break;
        }
    }
    assert_eq!(kept[1].1, "navi.route_built", "{kept:?}");
    assert!(
        !kept.iter().any(|(id, _)| id == "raw.kv/0/0"),
        "the route built before the award stays dropped: {kept:?}"
    );
    prefilter.stop().await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_transform_costs_its_records_and_its_pipeline_only() {
    let p = Pipeline::start(AWARDS, &["bss"]).await;
    for topic in ["raw.kv", "raw.hostile"] {
        p.broker.create_topic(topic, 1).unwrap();
    }
    let mut store = p.db.store().await;
    let hostile = support::guest_bytes("hostile_transform");
    laurel::registry::push(
        &mut store,
        &support::runtime(),
        "HostileTransform",
        &hostile,
        None,
    )
    .await
    .unwrap();
    let pipelines = format!(
        r#"[{KV_PIPELINE}, {{"name": "hostile", "input_topic": "raw.hostile", "source": "bss",
            "transform": {{"name": "HostileTransform", "config": {{}}}}}}]"#
    );
    laurel::pipelines::apply(&mut store, &p.registry, &pipelines)
        .await
        .unwrap();
    send(
        &p,
        "raw.hostile",
        &[
            "u-1 navi.trip_finished",
            "panic",
            "u-2 navi.trip_finished",
            "bad-time",
            "flood",
            "u-3 navi.trip_finished",
            "sleep",
        ],
    )
    .await;
    let prefilter = Prefilter::start(&p).await;
    let kept = produced(&p, 3, FIVE_MINUTES).await;
    let ids: BTreeSet<&str> = kept.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        BTreeSet::from(["raw.hostile/0/0", "raw.hostile/0/2", "raw.hostile/0/5"]),
        "{kept:?}"
    );
    let letters = dead_letter_messages(p.broker.bootstrap_servers(), "raw.hostile.dead", 4).await;
    let reasons: Vec<&str> = letters.iter().map(|(_, r, _)| r.as_str()).collect();
    assert!(
        reasons[0].contains("HostileTransform v1 trapped")
            && reasons[0].contains("hostile transform panics on offset 1"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].starts_with("event 0: malformed event:"),
        "{reasons:?}"
    );
    assert!(
        reasons[2].contains("5000 events from one record"),
        "{reasons:?}"
    );
    // A transform that sleeps traps at once: it cannot hold the pipeline.
    assert!(
        reasons[3].contains("HostileTransform v1 trapped")
            && reasons[3].contains("tried to sleep or wait on a clock"),
        "{reasons:?}"
    );

    // Failures in a row quarantine it: its pipeline holds (nothing of it
    // is produced or committed), the other pipeline goes on.
    send(
        &p,
        "raw.hostile",
        &[
            "panic",
            "panic",
            "panic",
            "panic",
            "panic",
            "u-4 navi.trip_finished",
        ],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    send(
        &p,
        "raw.kv",
        &["ts=1764583200 uid=u-5 event=navi.trip_finished dist=9"],
    )
    .await;
    let kept = produced(&p, 4, FIVE_MINUTES).await;
    let ids: BTreeSet<&str> = kept.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        BTreeSet::from([
            "raw.hostile/0/0",
            "raw.hostile/0/2",
            "raw.hostile/0/5",
            "raw.kv/0/0"
        ]),
        "u-4's trip waits behind the quarantine: {kept:?}"
    );
    let quarantined: Option<String> =
        p.db.sql()
            .await
            .query_one(
                "SELECT quarantine_reason FROM functions WHERE name = 'HostileTransform'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
    assert!(
        quarantined
            .as_deref()
            .is_some_and(|r| r.contains("consecutive failures")),
        "{quarantined:?}"
    );
    prefilter.stop().await;
    p.stop().await;
}

/// Pipeline navi-kv's lag in `GET /admin/v1/pipelines/navi-kv` and in
/// `/metrics`, once the first says `want` (or after a minute: what they
/// say then).
async fn lag(server: &Server, want: i64) -> (Value, f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let stored = server.admin("GET", "/pipelines/navi-kv", None).await;
        if stored.body["lag"] == want || std::time::Instant::now() > deadline {
            let metrics = server.text("/metrics").await;
            let gauge = metrics
                .lines()
                .find_map(|line| {
                    let value = line.strip_prefix("laurel_prefilter_lag{pipeline=\"navi-kv\"} ")?;
                    value.parse().ok()
                })
                .unwrap_or_else(|| panic!("no laurel_prefilter_lag for navi-kv in:\n{metrics}"));
            return (stored.body["lag"].clone(), gauge);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_managed_over_http_runs_pauses_and_stops() {
    let p = Pipeline::start(AWARDS, &["bss"]).await;
    p.broker.create_topic("raw.kv", 1).unwrap();
    let prefilter = Prefilter::start(&p).await;
    let server = Server::start(
        &p.db.url,
        p.registry.clone(),
        Some(p.broker.bootstrap_servers()),
    )
    .await;
    let mut definition: Value = serde_json::from_str(KV_PIPELINE).unwrap();
    definition.as_object_mut().unwrap().remove("name");
    for _ in 0..2 {
        let applied = server
            .admin("PUT", "/pipelines/navi-kv", Some(definition.clone()))
            .await;
        assert_eq!(
            (applied.status, applied.body.clone()),
            (200, json!({"name": "navi-kv", "version": 1})),
            "the same definition again keeps its version"
        );
    }
    let stored = server.admin("GET", "/pipelines/navi-kv", None).await;
    assert_eq!(stored.body["state"], "running", "{}", stored.body);
    assert_eq!(stored.body["transform"]["name"], "KeyValueTransform");
    assert_eq!(stored.body["source"], "bss");
    let trip = |n: u32| format!("ts=1764583200 uid=u-1 event=navi.trip_finished dist={n}");
    send(&p, "raw.kv", &[&trip(1)]).await;
    assert_eq!(produced(&p, 1, FIVE_MINUTES).await.len(), 1);

    // Paused: read no further (within a second); resumed: it goes on.
    let paused = server.admin("POST", "/pipelines/navi-kv/pause", None).await;
    assert_eq!(paused.body, json!({"name": "navi-kv", "paused": true}));
    tokio::time::sleep(Duration::from_secs(2)).await;
    send(&p, "raw.kv", &[&trip(2)]).await;
    assert_eq!(
        produced(&p, 2, Duration::from_secs(6)).await.len(),
        1,
        "a paused pipeline produced"
    );
    let listed = server.admin("GET", "/pipelines", None).await;
    assert_eq!(listed.body["pipelines"][0]["state"], "paused");
    // What it has yet to take shows as its lag, over the API and in
    // /metrics (read from the brokers every 200 ms here).
    assert_eq!(lag(&server, 1).await, (json!(1), 1.0));
    server
        .admin("POST", "/pipelines/navi-kv/resume", None)
        .await;
    assert_eq!(produced(&p, 2, FIVE_MINUTES).await.len(), 2);
    assert_eq!(lag(&server, 0).await, (json!(0), 0.0));

    // Refused whole, every problem named; nothing stored.
    let bad = json!({"input_topic": "events.bss", "source": "no spaces",
        "transform": {"name": "CountRule"}});
    let refused = server.admin("PUT", "/pipelines/other", Some(bad)).await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    let reasons: Vec<&str> = refused.body["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(reasons[0].contains("one Laurel writes"), "{reasons:?}");
    assert!(reasons[1].contains("not a source name"), "{reasons:?}");
    assert!(reasons[2].contains("transform CountRule"), "{reasons:?}");
    let renamed = server
        .admin("PUT", "/pipelines/other", Some(json!({"name": "navi-kv"})))
        .await;
    assert_eq!(renamed.status, 422);
    assert!(
        renamed.body["error"]
            .as_str()
            .unwrap()
            .contains("differs from the name in the path"),
        "{}",
        renamed.body
    );
    assert_eq!(
        server.admin("GET", "/pipelines/other", None).await.status,
        404
    );

    // Deleted: its consumer stops; a second delete finds nothing.
    assert_eq!(
        server
            .admin("DELETE", "/pipelines/navi-kv", None)
            .await
            .status,
        204
    );
    assert_eq!(
        server
            .admin("DELETE", "/pipelines/navi-kv", None)
            .await
            .status,
        404
    );
    send(&p, "raw.kv", &[&trip(3)]).await;
    assert_eq!(
        produced(&p, 3, Duration::from_secs(6)).await.len(),
        2,
        "a deleted pipeline produced"
    );
    drop(server);
    prefilter.stop().await;
    p.stop().await;
}

fn spawn_prefilter_and_ingest(
    db: &support::TestDb,
    brokers: &str,
    cache: &std::path::Path,
) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_laurel"))
        .args(["serve", "--roles", "prefilter,ingest"])
        .env("LAUREL_DATABASE_URL", &db.url)
        .env("LAUREL_KAFKA_BROKERS", brokers)
        .env("LAUREL_KAFKA_SESSION_TIMEOUT_MS", "3000")
        .env("LAUREL_CACHE_DIR", cache)
        .env("LAUREL_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("laurel serve starts")
}

/// Each user's metres on content-maker, as the database has them.
async fn metres(db: &support::TestDb) -> BTreeMap<String, i64> {
    db.sql()
        .await
        .query(
            "SELECT user_id, (counters->>'metres')::bigint FROM user_objective
             WHERE award_id = 'content-maker' AND objective_id = 'navi'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_with_sigkill_at_random_moments_every_trip_counts_once() {
    let db = support::TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    laurel::library::register(&mut store, &runtime)
        .await
        .unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    laurel::definitions::apply(&mut store, &registry, AWARDS)
        .await
        .unwrap();
    let json_pipeline = serde_json::from_str::<Value>(PIPELINES).unwrap()[0].to_string();
    laurel::pipelines::apply(&mut store, &registry, &json_pipeline)
        .await
        .unwrap();
    // The broker in its own process: it outlives every kill.
    let broker = crate::processes::Broker::start_on(None);
    let brokers = broker.bootstrap().to_string();
    let producer = kafka::producer(&brokers).unwrap();
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    let records: Vec<String> = (0..30_000)
        .map(|n| {
            let user = format!("u-{}", n % 40);
            let kind = kind(n);
            if kind == Kind::Trip {
                *expected.entry(user.clone()).or_default() += (100 + n % 900) as i64;
            }
            record("json", n, &user, kind)
        })
        .collect();
    for chunk in records.chunks(1000) {
        let sends = chunk
            .iter()
            .map(|value| kafka::publish(&producer, "raw.json", Some(b"k"), value.as_bytes(), &[]));
        for result in futures_util::future::join_all(sends).await {
            result.unwrap();
        }
    }

    let cache = std::env::temp_dir().join(format!("laurel-prefilter-kill-{}", std::process::id()));
    let mut rng = crate::processes::Rng(0x7e1e_c0de);
    let mut kills = 0;
    let mut child = spawn_prefilter_and_ingest(&db, &brokers, &cache);
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(1500 + rng.below(3000))).await;
        if metres(&db).await == expected {
            break;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        child = spawn_prefilter_and_ingest(&db, &brokers, &cache);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    let mut counted = metres(&db).await;
    while counted != expected && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        counted = metres(&db).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        kills >= 2,
        "the test must kill the pre-filter mid-stream (killed {kills} times)"
    );
    assert_eq!(counted, expected, "after {kills} kills");
    drop(broker);
    let _ = std::fs::remove_dir_all(&cache);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_declare_event_types_and_other_types_are_dropped_first() {
    // What a filter declares: EventTypeFilter its types; a filter built
    // against the plain `filter` world (before `filter-scope`) nothing,
    // and it still loads and runs.
    let runtime = support::runtime();
    let builtin = laurel::library::builtin("EventTypeFilter").unwrap();
    let function = runtime
        .load("EventTypeFilter", 1, builtin.bytes, Some(builtin.kind))
        .unwrap();
    let types = FilterInstance::new(function, r#"{"types": ["b.x", "a.y"]}"#).unwrap();
    assert_eq!(
        types.event_types(),
        Some(&["b.x".to_string(), "a.y".to_string()][..])
    );
    let plain = runtime
        .load(
            "PlainFilter",
            1,
            &support::guest_bytes("plain_filter"),
            Some(FunctionKind::Filter),
        )
        .unwrap();
    let mut plain = FilterInstance::new(plain, "{}").unwrap();
    assert_eq!(plain.event_types(), None);
    assert_eq!(plain.sources(), None);
    let event = Event {
        id: "e".into(),
        source: "bss".into(),
        type_: "t".into(),
        user_id: "u".into(),
        content_id: None,
        status: None,
        occurred_at_ms: 0,
        payload: Vec::new(),
    };
    assert_eq!(plain.matches([&event, &event]).unwrap(), [true, true]);

    // The derived rule: the types some objective of the source can use.
    let p = Pipeline::start(AWARDS, &["bss"]).await;
    let awards = || Catalog::start(&p.db.url);
    let catalog = awards().await.unwrap();
    let plan = laurel::objectives::Plan::build("bss", &catalog.awards(), &p.registry);
    assert_eq!(
        plan.event_types(),
        Some(BTreeSet::from([
            "navi.trip_finished".to_string(),
            "test.marker".to_string()
        ]))
    );

    // Dropped before any check: a route with a user id over the limit is
    // no award's business; a trip with one is dead-lettered.
    let prefilter = Prefilter::start_kv(&p).await;
    let mut store = p.db.store().await;
    let long = "u".repeat(600);
    send(
        &p,
        "raw.kv",
        &[
            &format!("ts=1764583200 uid={long} event=navi.route_built dist=1"),
            &format!("ts=1764583200 uid={long} event=navi.trip_finished dist=2"),
            "ts=1764583201 uid=u-1 event=navi.trip_finished dist=3",
        ],
    )
    .await;
    assert_eq!(
        produced(&p, 1, FIVE_MINUTES).await,
        [("raw.kv/0/2".to_string(), "navi.trip_finished".to_string())]
    );
    let dead = dead_letter_messages(p.broker.bootstrap_servers(), "raw.kv.dead", 1).await;
    assert!(dead[0].1.contains("user_id"), "{dead:?}");
    assert_eq!(
        drain(
            p.broker.bootstrap_servers(),
            "raw.kv.dead",
            2,
            Duration::from_secs(5),
            Duration::from_secs(1)
        )
        .await
        .len(),
        1,
        "only the trip is dead-lettered"
    );

    // A filter that declares nothing makes its objective take any type.
    laurel::registry::push(
        &mut store,
        &support::runtime(),
        "PlainFilter",
        &support::guest_bytes("plain_filter"),
        Some(FunctionKind::Filter),
    )
    .await
    .unwrap();
    let any = r#"{"id": "anything", "title": "Anything",
      "objectives": [{"id": "all",
        "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}},
                    {"name": "PlainFilter", "config": {}}],
        "rule": {"name": "CountRule", "config": {"counter": "n"}}, "progress_counter": "n"}],
      "strategy": {"goal": 3, "strategy": [{"objective_id": "all"}]}}"#;
    laurel::definitions::apply(&mut store, &p.registry, any)
        .await
        .unwrap();
    p.registry.sync_now(&store).await.unwrap();
    let catalog = awards().await.unwrap();
    let plan = laurel::objectives::Plan::build("bss", &catalog.awards(), &p.registry);
    assert_eq!(plan.event_types(), None);
    prefilter.stop().await;
    p.stop().await;
}

/// The KV pipeline with a config naming the wrong key for the user (every
/// trip is dead-lettered), its topics made and the pre-filter running.
async fn with_a_wrong_kv_pipeline() -> (Pipeline, laurel::store::Store, Prefilter) {
    let p = Pipeline::start(AWARDS, &["bss"]).await;
    p.broker.create_topic("raw.kv", 1).unwrap();
    p.broker.create_topic("raw.kv.dead", 1).unwrap();
    let mut store = p.db.store().await;
    let wrong = KV_PIPELINE.replace(r#""user_id": "uid""#, r#""user_id": "user""#);
    laurel::pipelines::apply(&mut store, &p.registry, &wrong)
        .await
        .unwrap();
    let prefilter = Prefilter::start(&p).await;
    (p, store, prefilter)
}

/// `laurel pipelines replay NAME`, as an operator runs it.
fn replay_with_the_cli(p: &Pipeline, name: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_laurel"))
        .args(["pipelines", "replay", name])
        .env("LAUREL_DATABASE_URL", &p.db.url)
        .env("LAUREL_KAFKA_BROKERS", p.broker.bootstrap_servers())
        .env("LAUREL_LOG", "warn")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replayed_after_a_fix_count_once_at_their_first_position() {
    let (mut p, mut store, prefilter) = with_a_wrong_kv_pipeline().await;
    send(
        &p,
        "raw.kv",
        &[
            "ts=1764583200 uid=u-1 event=navi.trip_finished dist=7",
            "ts=1764583201 uid=u-1 event=navi.route_built dist=8",
            "ts=1764583202 uid=u-2 event=navi.trip_finished dist=9",
        ],
    )
    .await;
    // The route is no award's business: left out before its fields are
    // read, so only the trips are dead.
    let letters = dead_letter_messages(p.broker.bootstrap_servers(), "raw.kv.dead", 2).await;
    assert!(
        letters
            .iter()
            .all(|(_, reason, _)| reason.contains("user_id")),
        "{letters:?}"
    );

    // Fixed, then replayed with the CLI, as an operator would.
    let applied = laurel::pipelines::apply(&mut store, &p.registry, KV_PIPELINE)
        .await
        .unwrap();
    assert_eq!(applied, [("navi-kv".to_string(), 2)]);
    let first = replay_with_the_cli(&p, "navi-kv");
    let said = String::from_utf8_lossy(&first.stdout);
    assert!(first.status.success(), "{said}");
    assert_eq!(
        said.trim(),
        "replayed 2 dead letters of pipeline navi-kv from raw.kv.dead to raw.kv"
    );
    // Each event has the id of the record's first position.
    let kept = produced(&p, 2, FIVE_MINUTES).await;
    let ids: BTreeSet<&str> = kept.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        BTreeSet::from(["raw.kv/0/0", "raw.kv/0/2"]),
        "{kept:?}"
    );
    assert_metres(&mut p, &[("u-1", 7), ("u-2", 9)]).await;

    // A second replay finds nothing new; a replay of no pipeline is refused.
    let again = replay_with_the_cli(&p, "navi-kv");
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).trim(),
        "replayed 0 dead letters of pipeline navi-kv from raw.kv.dead to raw.kv"
    );
    let none = replay_with_the_cli(&p, "nope");
    assert!(!none.status.success());
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("no pipeline named nope"),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );
    prefilter.stop().await;
    p.stop().await;
}

/// A raw producer that marks its records as replayed dead letters (the
/// headers a replay sets, without the signature Laurel's key makes) cannot
/// give them another record's position, and so its events' ids, which
/// ingest adds once, nor hide them from the pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_mark_without_a_valid_signature_is_ignored() {
    let mut p = Pipeline::start(AWARDS, &["bss"]).await;
    let prefilter = Prefilter::start_kv(&p).await;
    send(
        &p,
        "raw.kv",
        &["ts=1764583200 uid=u-1 event=navi.trip_finished dist=7"],
    )
    .await;
    assert_eq!(produced(&p, 1, FIVE_MINUTES).await.len(), 1);
    let forged: [(&str, &[(&str, &str)]); 3] = [
        // As the trip at 0/0, replayed for this pipeline.
        (
            "ts=1764583201 uid=u-2 event=navi.trip_finished dist=9",
            &[("laurel-origin", "0/0"), ("laurel-replay-for", "navi-kv")],
        ),
        // As another pipeline's: this one would pass over it.
        (
            "ts=1764583202 uid=u-3 event=navi.trip_finished dist=11",
            &[("laurel-origin", "0/1"), ("laurel-replay-for", "another")],
        ),
        // With a signature of something else.
        (
            "ts=1764583203 uid=u-4 event=navi.trip_finished dist=13",
            &[
                ("laurel-origin", "0/0"),
                ("laurel-replay-for", "navi-kv"),
                ("laurel-replay-signature", "00ff"),
            ],
        ),
    ];
    for (value, headers) in forged {
        kafka::publish(&p.producer, "raw.kv", Some(b"k"), value.as_bytes(), headers)
            .await
            .unwrap();
    }
    // Each read at its own position.
    let kept = produced(&p, 4, FIVE_MINUTES).await;
    let ids: BTreeSet<&str> = kept.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        BTreeSet::from(["raw.kv/0/0", "raw.kv/0/1", "raw.kv/0/2", "raw.kv/0/3"]),
        "{kept:?}"
    );
    assert_metres(&mut p, &[("u-1", 7), ("u-2", 9), ("u-3", 11), ("u-4", 13)]).await;
    prefilter.stop().await;
    p.stop().await;
}

/// Replay marks are issued, not found: a replay keeps the first position
/// only of a record the pre-filter itself dead-lettered, whose signature
/// covers the pipeline, that position, the key and the value. A record
/// another producer put on the dead-letter topic, with marks made up or
/// copied from a genuine dead letter, goes back as itself; and a replayed
/// record's marks copied onto other content on the input topic are ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_marks_are_issued_by_laurel_not_found_on_the_dead_letter_topic() {
    let (mut p, mut store, prefilter) = with_a_wrong_kv_pipeline().await;
    send(
        &p,
        "raw.kv",
        &["ts=1764583200 uid=u-1 event=navi.trip_finished dist=7"],
    )
    .await;
    let brokers = p.broker.bootstrap_servers().to_string();
    let genuine = whole_messages(&brokers, "raw.kv.dead", 1).await.remove(0);
    let names: Vec<&str> = genuine.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"laurel-dead-signature"), "{names:?}");

    // Another producer on the dead-letter topic: a mark made up to claim
    // the first record's position, and the genuine letter's headers
    // (signature included) copied onto other content.
    let made_up: &[(&str, &str)] = &[
        ("laurel-pipeline", "navi-kv"),
        ("laurel-partition", "0"),
        ("laurel-offset", "0"),
    ];
    let copied: Vec<(&str, &str)> = genuine
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    for (value, headers) in [
        (
            "ts=1764583201 uid=u-2 event=navi.trip_finished dist=9",
            made_up,
        ),
        (
            "ts=1764583202 uid=u-3 event=navi.trip_finished dist=11",
            &copied[..],
        ),
    ] {
        kafka::publish(
            &p.producer,
            "raw.kv.dead",
            genuine.key.as_deref(),
            value.as_bytes(),
            headers,
        )
        .await
        .unwrap();
    }

    laurel::pipelines::apply(&mut store, &p.registry, KV_PIPELINE)
        .await
        .unwrap();
    let replay = replay_with_the_cli(&p, "navi-kv");
    let said = String::from_utf8_lossy(&replay.stdout);
    assert!(replay.status.success(), "{said}");
    assert_eq!(
        said.trim(),
        "replayed 3 dead letters of pipeline navi-kv from raw.kv.dead to raw.kv\n  \
         2 of them not dead-lettered by Laurel (no valid laurel-dead-signature): put back as new records, \
         read at their new position by every pipeline of raw.kv"
    );
    // The genuine letter at its first position; the others at the
    // positions the replay gave them (raw.kv/0/1 is the genuine replayed).
    let kept = produced(&p, 3, FIVE_MINUTES).await;
    let ids: BTreeSet<&str> = kept.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        BTreeSet::from(["raw.kv/0/0", "raw.kv/0/2", "raw.kv/0/3"]),
        "{kept:?}"
    );
    assert_metres(&mut p, &[("u-1", 7), ("u-2", 9), ("u-3", 11)]).await;

    // The replayed record's marks, copied onto other content: the
    // signature does not hold for it, so it is read at its own position.
    let replayed = whole_messages(&brokers, "raw.kv", 2).await.remove(1);
    let marks: Vec<(&str, &str)> = replayed
        .headers
        .iter()
        .filter(|(n, _)| n.starts_with("laurel-"))
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    assert_eq!(marks.len(), 3, "{marks:?}");
    kafka::publish(
        &p.producer,
        "raw.kv",
        replayed.key.as_deref(),
        b"ts=1764583203 uid=u-4 event=navi.trip_finished dist=13",
        &marks,
    )
    .await
    .unwrap();
    let kept = produced(&p, 4, FIVE_MINUTES).await;
    assert!(kept.iter().any(|(id, _)| id == "raw.kv/0/4"), "{kept:?}");
    assert_metres(&mut p, &[("u-1", 7), ("u-2", 9), ("u-3", 11), ("u-4", 13)]).await;
    prefilter.stop().await;
    p.stop().await;
}

/// A header's name is bytes on the wire, and a producer can send some
/// that are not UTF-8 (rdkafka's header iterators panic on them): the raw
/// record is dead-lettered with why, a malformed event so named on a
/// source is dead-lettered as any other, and the records after them count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_that_is_not_utf8_is_dead_lettered_and_stops_nothing() {
    let mut p = Pipeline::start(AWARDS, &["bss"]).await;
    let prefilter = Prefilter::start_kv(&p).await;
    let brokers = p.broker.bootstrap_servers().to_string();
    produce_with_header_named(&brokers, "events.bss", b"{not json", b"bad\xff\xfe");
    let reasons = dead_letters(&brokers, "events.bss.dead", 1).await;
    assert!(reasons[0].starts_with("malformed event"), "{reasons:?}");
    produce_with_header_named(
        &brokers,
        "raw.kv",
        b"ts=1764583200 uid=u-1 event=navi.trip_finished dist=7",
        b"\xc3\x28",
    );
    send(
        &p,
        "raw.kv",
        &["ts=1764583201 uid=u-2 event=navi.trip_finished dist=9"],
    )
    .await;
    let dead = dead_letter_messages(&brokers, "raw.kv.dead", 1).await;
    assert_eq!(dead[0].1, "header 0's name is not UTF-8", "{dead:?}");
    // (events.bss also holds the malformed event: counted, not read back.)
    assert_metres(&mut p, &[("u-2", 9)]).await;
    assert!(p.objective("u-1", "content-maker", "navi").await.is_empty());
    prefilter.stop().await;
    p.stop().await;
}

/// A slow broker, not a dead one: every response 2 s late while trips are
/// read, kept and acknowledged. The pre-filter waits for its
/// acknowledgements; once the broker is fast again, every trip is on
/// `events.bss` and counts once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_broker_under_the_prefilter_loses_and_doubles_nothing() {
    let mut p = Pipeline::start(AWARDS, &["bss"]).await;
    let prefilter = Prefilter::start_kv(&p).await;
    let trip = |n: usize| {
        format!(
            "ts={} uid=u-{} event=navi.trip_finished dist={}",
            1764583200 + n,
            n % 5,
            10 + n
        )
    };
    let send_all = |from: usize| {
        let sends: Vec<_> = (from..from + 50)
            .map(|n| {
                let value = trip(n);
                let producer = p.producer.clone();
                async move {
                    kafka::publish(&producer, "raw.kv", Some(b"k"), value.as_bytes(), &[]).await
                }
            })
            .collect();
        futures_util::future::join_all(sends)
    };
    for sent in send_all(0).await {
        sent.unwrap();
    }
    assert_eq!(produced(&p, 50, FIVE_MINUTES).await.len(), 50);
    p.broker
        .set_round_trip_time(Duration::from_secs(2))
        .unwrap();
    for sent in send_all(50).await {
        sent.unwrap();
    }
    // Read, kept and acknowledged while every response is late.
    tokio::time::sleep(Duration::from_secs(6)).await;
    p.broker.set_round_trip_time(Duration::ZERO).unwrap();
    let kept = produced(&p, 100, FIVE_MINUTES).await;
    let ids: BTreeSet<&str> = kept.iter().map(|(id, _)| id.as_str()).collect();
    let want: Vec<String> = (0..100).map(|n| format!("raw.kv/0/{n}")).collect();
    assert_eq!(
        ids,
        want.iter().map(String::as_str).collect::<BTreeSet<_>>(),
        "{kept:?}"
    );
    let users: Vec<String> = (0..5).map(|u| format!("u-{u}")).collect();
    let expected: Vec<(&str, i64)> = (0..5)
        .map(|u| {
            (
                users[u].as_str(),
                (0..100).filter(|n| n % 5 == u).map(|n| 10 + n as i64).sum(),
            )
        })
        .collect();
    assert_metres(&mut p, &expected).await;
    prefilter.stop().await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transforms_told_the_kept_types_skip_the_rest_and_older_ones_still_run() {
    let runtime = support::runtime();
    let kept = BTreeSet::from(["navi.trip_finished".to_string()]);
    let values = ["u-1 navi.route_built", "u-1 navi.trip_finished"];
    let records: Vec<laurel::runtime::RawRecord<'_>> = values
        .iter()
        .enumerate()
        .map(|(n, value)| laurel::runtime::RawRecord {
            offset: n as i64,
            value: value.as_bytes(),
            ..Default::default()
        })
        .collect();
    let types =
        |answers: Vec<Result<Vec<laurel::runtime::Transformed>, String>>| -> Vec<Vec<String>> {
            answers
                .into_iter()
                .map(|a| a.unwrap().into_iter().map(|e| e.event_type).collect())
                .collect()
        };
    // Built with the SDK (transform-scope): told the kept types, it makes
    // only those; not told, all.
    let hostile = runtime
        .load(
            "HostileTransform",
            1,
            &support::guest_bytes("hostile_transform"),
            Some(FunctionKind::Transform),
        )
        .unwrap();
    let mut scoped = laurel::runtime::TransformInstance::new(hostile, "{}").unwrap();
    assert_eq!(
        types(
            scoped
                .apply_for_types("raw", &records, Some(&kept))
                .unwrap()
        ),
        [vec![], vec!["navi.trip_finished".to_string()]]
    );
    assert_eq!(
        types(scoped.apply("raw", &records).unwrap()),
        [
            vec!["navi.route_built".to_string()],
            vec!["navi.trip_finished".to_string()]
        ]
    );
    // Built before transform-scope: it makes everything, told or not.
    let plain = runtime
        .load(
            "PlainTransform",
            1,
            &support::guest_bytes("plain_transform"),
            Some(FunctionKind::Transform),
        )
        .unwrap();
    let mut plain = laurel::runtime::TransformInstance::new(plain, "{}").unwrap();
    assert_eq!(
        types(plain.apply_for_types("raw", &records, Some(&kept)).unwrap()),
        [
            vec!["navi.route_built".to_string()],
            vec!["navi.trip_finished".to_string()]
        ]
    );

    // In a pipeline, the pre-filter drops what the older one made.
    let p = Pipeline::start(AWARDS, &["bss"]).await;
    p.broker.create_topic("raw.plain", 1).unwrap();
    let mut store = p.db.store().await;
    laurel::registry::push(
        &mut store,
        &support::runtime(),
        "PlainTransform",
        &support::guest_bytes("plain_transform"),
        None,
    )
    .await
    .unwrap();
    let pipeline = r#"{"name": "plain", "input_topic": "raw.plain", "source": "bss",
        "transform": {"name": "PlainTransform"}}"#;
    laurel::pipelines::apply(&mut store, &p.registry, pipeline)
        .await
        .unwrap();
    let prefilter = Prefilter::start(&p).await;
    send(&p, "raw.plain", &values).await;
    assert_eq!(
        produced(&p, 1, FIVE_MINUTES).await,
        [("plain-1".to_string(), "navi.trip_finished".to_string())]
    );
    prefilter.stop().await;
    p.stop().await;
}

/// A transform answers only for the records that made events or are
/// malformed, by their place in the batch: an answer past the batch, or
/// out of the batch's order, or twice for a record, is refused with what is
/// wrong (and the pre-filter then tries the batch record by record).
#[tokio::test(flavor = "multi_thread")]
async fn answers_past_the_batch_or_out_of_its_order_are_refused_with_what_is_wrong() {
    let runtime = support::runtime();
    let bytes = support::guest_bytes("disorderly_transform");
    let kept = BTreeSet::from(["navi.trip_finished".to_string()]);
    let records: Vec<laurel::runtime::RawRecord<'_>> = (0..3)
        .map(|n| laurel::runtime::RawRecord {
            offset: n,
            value: b"record",
            ..Default::default()
        })
        .collect();
    // Loaded anew each time: its failures are not counted together
    // towards a quarantine.
    let apply = |named: &str| {
        let disorderly = runtime
            .load(
                "DisorderlyTransform",
                1,
                &bytes,
                Some(FunctionKind::Transform),
            )
            .unwrap();
        laurel::runtime::TransformInstance::new(disorderly, named)
            .unwrap()
            .apply_for_types("raw", &records, Some(&kept))
            .map(|answers| {
                answers
                    .into_iter()
                    .map(|a| a.map(|events| events.len()))
                    .collect::<Vec<_>>()
            })
            .map_err(|e| e.to_string())
    };
    // The records not named made no event.
    assert_eq!(
        apply("0,2"),
        Ok(vec![
            Err("named".to_string()),
            Ok(0),
            Err("named".to_string())
        ])
    );
    // A record named with no event made none, as one not named: the
    // pre-filter counts it once, as dropped, not as an answer.
    let packed = laurel::runtime::PackedRecords::of("raw", &records).unwrap();
    let answered = runtime
        .load(
            "DisorderlyTransform",
            1,
            &bytes,
            Some(FunctionKind::Transform),
        )
        .map(|f| laurel::runtime::TransformInstance::new(f, "0:none,1,2:none").unwrap())
        .unwrap()
        .apply_packed(&packed, Some(&kept))
        .unwrap();
    assert_eq!(
        answered
            .iter()
            .map(|a| (
                a.index,
                a.events.as_ref().map(Vec::len).map_err(String::clone)
            ))
            .collect::<Vec<_>>(),
        vec![(1, Err("named".to_string()))]
    );
    let refused = "function DisorderlyTransform v1 returned an invalid result: ";
    for (named, why) in [
        ("3", "an answer for record 3 of a batch of 3"),
        (
            "4294967295",
            "an answer for record 4294967295 of a batch of 3",
        ),
        (
            "2,1",
            "an answer for record 1 after one for record 2: one answer a record at most, in the batch's order",
        ),
        (
            "1,1",
            "an answer for record 1 after one for record 1: one answer a record at most, in the batch's order",
        ),
    ] {
        assert_eq!(apply(named), Err(format!("{refused}{why}")), "{named}");
    }
}

/// `db` with the built-in functions, the test awards, source `bss` and the
/// key=value pipeline; the registry they were applied with.
/// With the brokers unreachable, a pipeline's lag is unknown and says why;
/// the admin API and /metrics answer all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_brokers_away_a_pipelines_lag_is_unknown_and_says_why() {
    let db = support::TestDb::new().await;
    let registry = kv_pipeline_on(&db).await;
    // Nothing listens on the discard port.
    let server = Server::start(&db.url, registry, Some("127.0.0.1:9")).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let stored = loop {
        let stored = server.admin("GET", "/pipelines/navi-kv", None).await;
        assert_eq!(stored.status, 200, "{}", stored.body);
        let unread = stored.body["lag_error"] == "not read yet (every 10 s)";
        if !unread || std::time::Instant::now() > deadline {
            break stored;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(stored.body["lag"], Value::Null, "{}", stored.body);
    let why = stored.body["lag_error"].as_str().unwrap_or_default();
    assert!(why.contains("127.0.0.1:9"), "{}", stored.body);
    let listed = server.admin("GET", "/pipelines", None).await;
    assert_eq!(listed.body["pipelines"][0]["lag_error"], why);
    let metrics = server.text("/metrics").await;
    assert!(
        !metrics.contains("laurel_prefilter_lag{pipeline=\"navi-kv\"}"),
        "{metrics}"
    );
    drop(server);
    db.drop_database().await;
}

async fn kv_pipeline_on(db: &support::TestDb) -> std::sync::Arc<Registry> {
    let mut store = db.store().await;
    let runtime = support::runtime();
    laurel::library::register(&mut store, &runtime)
        .await
        .unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    laurel::definitions::apply(&mut store, &registry, AWARDS)
        .await
        .unwrap();
    store.add_source("bss", None).await.unwrap();
    laurel::pipelines::apply(&mut store, &registry, KV_PIPELINE)
        .await
        .unwrap();
    registry
}

/// PostgreSQL crashed, restarted cleanly and its backends terminated while
/// raw records stream through a pipeline: the pre-filter's path from a raw
/// record to a kept event needs no database, so every trip is produced
/// exactly once and nothing else is; once the database is back, it follows
/// what changes there (an award applied after the faults widens what is
/// kept, without a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_under_the_prefilter_loses_nothing_and_changes_are_followed_after() {
    const ROUNDS: usize = 9;
    const PER_ROUND: usize = 200;
    let postgres = OwnedPostgres::start();
    let db = support::TestDb::on(&postgres.server_url()).await;
    let registry = kv_pipeline_on(&db).await;
    let broker = kafka::LocalBroker::start(None).await.unwrap();
    broker.create_topic("raw.kv", 2).unwrap();
    broker.create_topic("events.bss", 1).unwrap();
    let prefilter = Prefilter::start_on(&db.url, broker.bootstrap_servers()).await;

    let producer = kafka::producer(broker.bootstrap_servers()).unwrap();
    let mut trips = 0;
    let mut faults = Vec::new();
    let mut rng = crate::processes::Rng(0x9f17);
    for round in 0..ROUNDS {
        for n in 0..PER_ROUND {
            let event = if n % 10 == 0 {
                trips += 1;
                "navi.trip_finished"
            } else {
                "navi.route_built"
            };
            let value = format!("ts=1764583200 uid=u-{n} event={event} dist={round}");
            kafka::publish(&producer, "raw.kv", Some(b"k"), value.as_bytes(), &[])
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100 + rng.below(300))).await;
        faults.push(match round % 3 {
            0 => {
                postgres.stop(true);
                tokio::time::sleep(Duration::from_millis(500 + rng.below(1_000))).await;
                postgres.start_again();
                "crash and restart"
            }
            1 => {
                postgres.stop(false);
                tokio::time::sleep(Duration::from_millis(500 + rng.below(1_000))).await;
                postgres.start_again();
                "clean restart"
            }
            _ => {
                crate::faults::terminate_backends(&postgres.server_url(), db.name()).await;
                "terminate backends"
            }
        });
    }
    let kept = drain(
        broker.bootstrap_servers(),
        "events.bss",
        trips,
        FIVE_MINUTES,
        Duration::from_secs(3),
    )
    .await;
    let mut ids = BTreeSet::new();
    for (_, value) in &kept {
        let event: Value = serde_json::from_slice(value).unwrap();
        assert_eq!(event["type"], "navi.trip_finished", "{event}");
        let id = event["id"].as_str().unwrap().to_string();
        assert!(
            ids.insert(id.clone()),
            "{id} produced twice, after {faults:?}"
        );
    }
    assert_eq!(ids.len(), trips, "trips kept after {faults:?}");

    // The database is back: an award applied now widens what is kept.
    let routes = r#"[{"id": "route-planner", "title": "Route planner",
      "objectives": [{"id": "routes",
        "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}},
                    {"name": "EventTypeFilter", "config": {"types": ["navi.route_built"]}}],
        "rule": {"name": "CountRule", "config": {"counter": "routes"}}, "progress_counter": "routes"}],
      "strategy": {"goal": 3, "strategy": [{"objective_id": "routes"}]}}]"#;
    let mut store = db.store().await;
    laurel::definitions::apply(&mut store, &registry, routes)
        .await
        .unwrap();
    let mut widened = false;
    for attempt in 0..60 {
        let value = format!("ts=1764583300 uid=u-after event=navi.route_built dist={attempt}");
        kafka::publish(&producer, "raw.kv", Some(b"k"), value.as_bytes(), &[])
            .await
            .unwrap();
        let all = drain(
            broker.bootstrap_servers(),
            "events.bss",
            trips + 1,
            Duration::from_secs(5),
            Duration::from_secs(1),
        )
        .await;
        if all.len() > trips {
            let event: Value = serde_json::from_slice(&all[all.len() - 1].1).unwrap();
            assert_eq!(event["type"], "navi.route_built", "{event}");
            widened = true;
            break;
        }
    }
    assert!(
        widened,
        "the award applied after {faults:?} was not followed"
    );
    prefilter.stop().await;
}

/// The broker (`laurel dev kafka`, its own process) killed under a running
/// pre-filter and started again on the same address, empty: the pipeline's
/// consumer finds its position out of range on the new log and starts it
/// from the beginning, its producers reach the new broker, and the records
/// sent afterwards are kept or dead-lettered as before, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_and_started_again_the_prefilter_carries_on() {
    const PER_HALF: usize = 500;
    let (port, broker) = (0..20)
        .find_map(|_| {
            let port = crate::owned_postgres::free_port();
            crate::processes::Broker::try_start_on(Some(port)).map(|b| (port, b))
        })
        .expect("laurel dev kafka never kept a port");
    let brokers = format!("127.0.0.1:{port}");
    let db = support::TestDb::new().await;
    kv_pipeline_on(&db).await;
    let prefilter = Prefilter::start_on(&db.url, &brokers).await;
    // Record `n` of a half: every tenth a trip, every hundredth (after the
    // restart) not key=value at all.
    let record = |half: usize, n: usize| {
        if half == 1 && n % 100 == 50 {
            format!("junk {n}")
        } else {
            let event = if n.is_multiple_of(10) {
                "navi.trip_finished"
            } else {
                "navi.route_built"
            };
            format!("ts=1764583200 uid=u-{half}-{n} event={event} dist={n}")
        }
    };
    let publish = async |values: Vec<String>| {
        let producer = kafka::producer(&brokers).unwrap();
        let sends = values
            .iter()
            .map(|value| kafka::publish(&producer, "raw.kv", Some(b"k"), value.as_bytes(), &[]));
        for result in futures_util::future::join_all(sends).await {
            result.unwrap();
        }
    };
    publish((0..PER_HALF).map(|n| record(0, n)).collect()).await;
    let kept = drain(
        &brokers,
        "events.bss",
        PER_HALF / 10,
        FIVE_MINUTES,
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(kept.len(), PER_HALF / 10, "trips kept before the restart");

    // The broker goes away, its log with it, and comes back empty.
    drop(broker);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _broker = crate::processes::Broker::start_on(Some(port));
    // One trip at a time until the pipeline keeps one: its consumer has
    // started the new log from the beginning. (A reader's group takes a few
    // seconds to join: each look waits up to 20 s.)
    let mut probes = 0;
    loop {
        assert!(probes < 6, "the pipeline never came back after the restart");
        probes += 1;
        let value = format!("ts=1764583200 uid=probe event=navi.trip_finished dist={probes}");
        publish(vec![value]).await;
        let kept = drain(
            &brokers,
            "events.bss",
            1,
            Duration::from_secs(20),
            Duration::from_millis(200),
        )
        .await;
        if !kept.is_empty() {
            break;
        }
    }
    publish((0..PER_HALF).map(|n| record(1, n)).collect()).await;
    // Every tenth record a trip, but for the malformed ones.
    let is_trip = |n: &usize| n.is_multiple_of(10) && n % 100 != 50;
    let trips = (0..PER_HALF).filter(is_trip).count();
    let kept = drain(
        &brokers,
        "events.bss",
        probes + trips,
        FIVE_MINUTES,
        Duration::from_secs(3),
    )
    .await;
    let mut ids = BTreeSet::new();
    let mut users = BTreeSet::new();
    for (key, value) in &kept {
        let event: Value = serde_json::from_slice(value).unwrap();
        assert_eq!(event["type"], "navi.trip_finished", "{event}");
        assert!(
            ids.insert(event["id"].to_string()),
            "{event} produced twice"
        );
        if key != "probe" {
            users.insert(key.clone());
        }
    }
    let want: BTreeSet<String> = (0..PER_HALF)
        .filter(is_trip)
        .map(|n| format!("u-1-{n}"))
        .collect();
    assert_eq!(users, want, "every trip after the restart kept, once");
    let letters = dead_letter_messages(&brokers, "raw.kv.dead", PER_HALF / 100).await;
    assert_eq!(letters.len(), PER_HALF / 100);
    for (_, reason, _) in &letters {
        assert!(reason.contains("is not key=value"), "{reason}");
    }
    prefilter.stop().await;
}

/// Each event a pipeline makes names its raw record's place (and its
/// number among the record's events), so ingest orders an item's events at
/// one occurred_at by where their records were, a replayed one included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelines_events_carry_their_records_place() {
    let p = Pipeline::start(AWARDS, &["bss"]).await;
    let prefilter = Prefilter::start_kv(&p).await;
    send(
        &p,
        "raw.kv",
        &[
            "ts=1764583200 uid=u-1 event=navi.trip_finished dist=7",
            "ts=1764583201 uid=u-1 event=navi.trip_finished dist=8",
        ],
    )
    .await;
    let events = crate::pipeline_support::messages_with_header(
        p.broker.bootstrap_servers(),
        "events.bss",
        laurel::store::PLACE_HEADER,
        2,
    )
    .await;
    let places: Vec<&str> = events.iter().map(|(_, place, _)| place.as_str()).collect();
    assert_eq!(places, ["raw.kv:0:0", "raw.kv:0:1"]);
    prefilter.stop().await;
    p.stop().await;
}
