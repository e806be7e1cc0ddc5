//! Whole `laurel` processes against a broker in its own process (`laurel
//! dev kafka`): killed with SIGKILL at random moments while consuming, or
//! two of them sharing a consumer group. The final counters must equal a
//! reference computed here, independently of Laurel.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use laurel::kafka;
use laurel::library;
use laurel::registry::Registry;
use serde_json::{Value, json};

use crate::support::{self, TestDb};

pub const AWARDS: &str = r#"[{
  "id": "photographer", "title": "Photographer",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved", "moderation": "on_moderation", "blocked": "blocked"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 5, "strategy": [{"objective_id": "photo"}]}
}, {
  "id": "critic", "title": "Critic",
  "objectives": [{"id": "reviews",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["reviews"]}}],
    "rule": {"name": "ReviewUniqueByObjectRule", "config": {}},
    "progress_counter": "count"}],
  "strategy": {"goal": 3, "strategy": [{"objective_id": "reviews"}]}
}, {
  "id": "regular", "title": "Regular",
  "objectives": [{"id": "visits",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}}],
    "rule": {"name": "CountRule", "config": {"counter": "opened"}},
    "progress_counter": "opened"}],
  "strategy": {"goal": 100, "strategy": [{"objective_id": "visits"}]}
}]"#;

/// A small deterministic generator (xorshift), so a failure reproduces.
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub type Expected = BTreeMap<(String, String, String), BTreeMap<String, i64>>;

/// `count` events over three sources (topic, key, value), and the counters
/// they must lead to, computed from the events alone.
pub fn workload(count: usize, seed: u64) -> (Vec<(String, String, String)>, Expected) {
    let mut rng = Rng(seed);
    let statuses = ["moderation", "active", "blocked", "hidden", "deleted"];
    let mut events = Vec::with_capacity(count);
    // Latest (time, place, status) per photo and per review; analytics
    // ids. Events apply in occurred_at order: of two with the same time,
    // the later in the topic is the later (an item's events are keyed by
    // its user, so they share a partition, in the order sent).
    let mut photos: HashMap<(String, String), (u64, usize, &str)> = HashMap::new();
    let mut reviews: HashMap<(String, String), (u64, usize, &str, String)> = HashMap::new();
    let mut opened: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut clock = 1_000u64;
    for i in 0..count {
        let user = format!("u-{}", rng.below(150));
        clock += 1;
        // Now and then an event carries an older time than the last one of
        // its item (it was delayed upstream): it must change nothing.
        let at = if rng.below(20) == 0 {
            clock - 1 - rng.below(50).min(clock - 1)
        } else {
            clock
        };
        let occurred = chrono::DateTime::from_timestamp(1_796_000_000 + at as i64, 0)
            .unwrap()
            .to_rfc3339();
        let (source, value) = match rng.below(10) {
            0..=4 => {
                let content = format!("photo-{}", rng.below(8));
                let status = statuses[rng.below(5) as usize];
                let key = (user.clone(), content.clone());
                if photos
                    .get(&key)
                    .is_none_or(|(t, last, _)| (at, i) > (*t, *last))
                {
                    photos.insert(key, (at, i, status));
                }
                (
                    "photos",
                    json!({"id": format!("p-{i}"), "source": "photos", "type": "photo.status_changed", "user_id": user,
                    "authorized": true, "content_id": content, "status": status, "occurred_at": occurred, "payload": {}}),
                )
            }
            5..=7 => {
                let content = format!("review-{}", rng.below(6));
                let object = format!("firm-{}", rng.below(4));
                let status = statuses[rng.below(5) as usize];
                let key = (user.clone(), content.clone());
                // A review names its object in every event; keep it stable.
                let object = reviews
                    .get(&key)
                    .map(|(_, _, _, o)| o.clone())
                    .unwrap_or(object);
                if reviews
                    .get(&key)
                    .is_none_or(|(t, last, _, _)| (at, i) > (*t, *last))
                {
                    reviews.insert(key, (at, i, status, object.clone()));
                }
                (
                    "reviews",
                    json!({"id": format!("r-{i}"), "source": "reviews", "type": "review.changed", "user_id": user,
                    "authorized": true, "content_id": content, "status": status, "occurred_at": occurred,
                    "payload": {"object_id": object}}),
                )
            }
            _ => {
                // Some analytics events are sent twice (same id).
                let id = if rng.below(10) == 0 && i > 0 {
                    format!("b-{}", i - 1)
                } else {
                    format!("b-{i}")
                };
                let user = if id == format!("b-{i}") {
                    user
                } else {
                    events
                        .last()
                        .map(|(_, k, _): &(String, String, String)| k.clone())
                        .unwrap_or(user)
                };
                opened.entry(user.clone()).or_default().insert(id.clone());
                (
                    "bss",
                    json!({"id": id, "source": "bss", "type": "app.opened", "user_id": user, "authorized": true,
                    "occurred_at": occurred, "payload": {}}),
                )
            }
        };
        let user = value["user_id"].as_str().unwrap().to_string();
        events.push((format!("events.{source}"), user, value.to_string()));
    }
    // The duplicate analytics trick above must only reuse an id of the same
    // user: recompute `opened` from the events as sent.
    opened.clear();
    for (topic, user, value) in &events {
        if topic == "events.bss" {
            let v: Value = serde_json::from_str(value).unwrap();
            opened
                .entry(user.clone())
                .or_default()
                .insert(v["id"].as_str().unwrap().to_string());
        }
    }
    let mut expected: Expected = BTreeMap::new();
    for ((user, _), (_, _, status)) in &photos {
        let counter = match *status {
            "active" => "approved",
            "moderation" => "on_moderation",
            "blocked" => "blocked",
            _ => continue,
        };
        *expected
            .entry((user.clone(), "photographer".into(), "photo".into()))
            .or_default()
            .entry(counter.into())
            .or_insert(0) += 1;
    }
    let mut counted_objects: BTreeSet<(String, String)> = BTreeSet::new();
    for ((user, _), (_, _, status, object)) in &reviews {
        if *status == "active" {
            counted_objects.insert((user.clone(), object.clone()));
        }
    }
    for (user, _) in counted_objects {
        *expected
            .entry((user, "critic".into(), "reviews".into()))
            .or_default()
            .entry("count".into())
            .or_insert(0) += 1;
    }
    for (user, ids) in opened {
        expected
            .entry((user, "regular".into(), "visits".into()))
            .or_default()
            .insert("opened".into(), ids.len() as i64);
    }
    (events, expected)
}

pub struct Broker {
    child: Child,
    bootstrap: String,
}

impl Broker {
    fn start() -> Broker {
        Broker::start_on(None)
    }

    /// `laurel dev kafka`, also on 127.0.0.1:`port` if given.
    pub fn start_on(port: Option<u16>) -> Broker {
        Broker::try_start_on(port).expect("laurel dev kafka prints its address")
    }

    /// Its bootstrap address.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// None if it stopped without serving (its port was taken).
    pub fn try_start_on(port: Option<u16>) -> Option<Broker> {
        let mut args = vec!["dev".to_string(), "kafka".to_string()];
        if let Some(port) = port {
            args.extend(["--port".to_string(), port.to_string()]);
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_laurel"))
            .args(&args)
            .env("LAUREL_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("laurel dev kafka starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let bootstrap = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            };
            if let Some(address) = line.strip_prefix("LAUREL_KAFKA_BROKERS=") {
                break address.to_string();
            }
        };
        // Keep draining its output.
        std::thread::spawn(move || for _ in lines {});
        Some(Broker { child, bootstrap })
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_laurel(db: &TestDb, brokers: &str, cache: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_laurel"))
        .args(["serve", "--roles", "ingest"])
        .env("LAUREL_DATABASE_URL", &db.url)
        .env("LAUREL_KAFKA_BROKERS", brokers)
        .env("LAUREL_KAFKA_SESSION_TIMEOUT_MS", "3000")
        .env("LAUREL_CACHE_DIR", cache)
        .env("LAUREL_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("laurel serve starts")
}

async fn prepare(events: usize, seed: u64) -> (TestDb, Broker, Expected) {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    library::register(&mut store, &runtime).await.unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    laurel::definitions::apply(&mut store, &registry, AWARDS)
        .await
        .unwrap();
    let broker = Broker::start();
    let (events, expected) = workload(events, seed);
    publish_all(&broker.bootstrap, &events).await;
    (db, broker, expected)
}

pub async fn actual(db: &TestDb) -> Expected {
    let sql = db.sql().await;
    let rows = sql
        .query(
            "SELECT user_id, award_id, objective_id, counters FROM user_objective",
            &[],
        )
        .await
        .unwrap();
    let mut actual = Expected::new();
    for row in rows {
        let counters: Value = row.get(3);
        let counters: BTreeMap<String, i64> = counters
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_i64().unwrap()))
            .filter(|(_, v)| *v != 0)
            .collect();
        if !counters.is_empty() {
            actual.insert((row.get(0), row.get(1), row.get(2)), counters);
        }
    }
    actual
}

/// Waits until the counters equal `expected` (or a minute passes), then
/// returns them.
pub async fn settle(db: &TestDb, expected: &Expected) -> Expected {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let now = actual(db).await;
        if &now == expected || tokio::time::Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

pub fn diff(expected: &Expected, actual: &Expected) -> String {
    let mut lines = Vec::new();
    for key in expected
        .keys()
        .chain(actual.keys())
        .collect::<BTreeSet<_>>()
    {
        if expected.get(key) != actual.get(key) {
            lines.push(format!(
                "{key:?}: expected {:?}, got {:?}",
                expected.get(key),
                actual.get(key)
            ));
        }
    }
    format!(
        "{} differences, e.g.:\n{}",
        lines.len(),
        lines
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_with_sigkill_at_random_moments_nothing_is_lost_or_doubled() {
    let (db, broker, expected) = prepare(50_000, 0x5eed_cafe).await;
    let cache = std::env::temp_dir().join(format!("laurel-crash-cache-{}", std::process::id()));
    let mut rng = Rng(0xdead_beef);
    let mut kills = 0;
    let mut child = spawn_laurel(&db, &broker.bootstrap, &cache);
    // Kill it while it consumes, at random moments, then let it finish.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(1500 + rng.below(3000))).await;
        if actual(&db).await == expected {
            break;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        child = spawn_laurel(&db, &broker.bootstrap, &cache);
    }
    let result = settle(&db, &expected).await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        kills >= 2,
        "the test must kill the consumer mid-stream (killed {kills} times)"
    );
    assert!(
        result == expected,
        "after {kills} kills: {}",
        diff(&expected, &result)
    );
    drop(broker);
    let _ = std::fs::remove_dir_all(&cache);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_a_group_and_one_stops_midway() {
    let (db, broker, expected) = prepare(20_000, 0x0bad_f00d).await;
    let cache = std::env::temp_dir().join(format!("laurel-pair-cache-{}", std::process::id()));
    let mut first = spawn_laurel(&db, &broker.bootstrap, &cache);
    let mut second = spawn_laurel(&db, &broker.bootstrap, &cache);
    tokio::time::sleep(Duration::from_secs(6)).await;
    // A clean stop (SIGTERM): it finishes its batch and leaves the group.
    let status = Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = second.wait().unwrap();
    assert!(exit.success(), "a clean stop exits 0, got {exit:?}");
    let result = settle(&db, &expected).await;
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(result == expected, "{}", diff(&expected, &result));
    drop(broker);
    let _ = std::fs::remove_dir_all(&cache);
    db.drop_database().await;
}

/// Publishes `(topic, key, value)` in order, a thousand at a time.
async fn publish_all(brokers: &str, events: &[(String, String, String)]) {
    let producer = kafka::producer(brokers).unwrap();
    for chunk in events.chunks(1000) {
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
}

/// A photo's status event, at one fixed time.
fn photo_status(id: &str, user: &str, content: &str, status: &str) -> (String, String, String) {
    let value = json!({"id": id, "source": "photos", "type": "photo.status_changed", "user_id": user,
        "authorized": true, "content_id": content, "status": status,
        "occurred_at": "2026-12-06T12:00:00.123456Z", "payload": {}});
    ("events.photos".into(), user.into(), value.to_string())
}

/// A master system uploads and blocks each photo within one microsecond,
/// with random ids: each ends blocked, whichever id is larger, and the
/// upload events sent again (a producer's retry) change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_at_one_time_apply_in_the_order_the_topic_holds_them() {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    library::register(&mut store, &runtime).await.unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    laurel::definitions::apply(&mut store, &registry, AWARDS)
        .await
        .unwrap();
    let broker = Broker::start();
    let mut rng = Rng(0x0e9a_17e5);
    let mut random_id = || format!("{:016x}-{:016x}", rng.next(), rng.next());
    let user = |item: usize| format!("u-{}", item % 20);
    let mut uploads = Vec::new();
    let mut events = Vec::new();
    let mut larger_upload_ids = 0;
    for item in 0..200 {
        let (active, blocked) = (random_id(), random_id());
        larger_upload_ids += usize::from(active > blocked);
        let content = format!("photo-{item}");
        uploads.push(photo_status(&active, &user(item), &content, "active"));
        events.push(uploads[item].clone());
        events.push(photo_status(&blocked, &user(item), &content, "blocked"));
    }
    assert!(
        (50..150).contains(&larger_upload_ids),
        "about half the uploads drew the larger id: {larger_upload_ids}"
    );
    publish_all(&broker.bootstrap, &events).await;
    let mut expected = Expected::new();
    for u in 0..20 {
        expected.insert(
            (format!("u-{u}"), "photographer".into(), "photo".into()),
            BTreeMap::from([("blocked".to_string(), 10)]),
        );
    }
    let cache = std::env::temp_dir().join(format!("laurel-order-cache-{}", std::process::id()));
    let mut child = spawn_laurel(&db, &broker.bootstrap, &cache);
    let result = settle(&db, &expected).await;
    assert!(result == expected, "{}", diff(&expected, &result));

    // The uploads again, then one new photo per user: once those count,
    // the uploads before them (same users, same partitions) were read.
    let mut again = uploads.clone();
    for u in 0..20 {
        let (id, user) = (random_id(), format!("u-{u}"));
        again.push(photo_status(&id, &user, "photo-new", "active"));
        expected
            .get_mut(&(user, "photographer".into(), "photo".into()))
            .unwrap()
            .insert("approved".into(), 1);
    }
    publish_all(&broker.bootstrap, &again).await;
    let result = settle(&db, &expected).await;
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        result == expected,
        "after the uploads came again: {}",
        diff(&expected, &result)
    );
    drop(broker);
    let _ = std::fs::remove_dir_all(&cache);
    db.drop_database().await;
}

fn spawn_awards_worker(db: &TestDb, cache: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_laurel"))
        .args(["serve", "--roles", "awards"])
        .env("LAUREL_DATABASE_URL", &db.url)
        .env("LAUREL_AWARDS_BATCH", "500")
        .env("LAUREL_CACHE_DIR", cache)
        .env("LAUREL_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("laurel serve starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awards_workers_killed_with_sigkill_mid_cycle_lose_nothing() {
    let db = crate::awards::db_with_counter_award().await;
    let sql = db.sql().await;
    // 50,000 users changed at once (approved 0..59), and more changes
    // while two worker processes run and get killed.
    sql.execute(
        "INSERT INTO user_objective (user_id, award_id, objective_id, counters, version)
         SELECT 'user-' || n, 'counter', 'photo', jsonb_build_object('approved', n % 60), nextval('laurel_version')
         FROM generate_series(1, 50000) n",
        &[],
    )
    .await
    .unwrap();
    let writer = {
        let client = db.sql().await;
        tokio::spawn(async move {
            let mut rng = Rng(0x0dd_ba11);
            for _ in 0..3000 {
                let user = format!("user-{}", 1 + rng.below(50_000));
                client
                    .query_one(crate::awards::BUMP, &[&user, &1i64])
                    .await
                    .unwrap();
            }
        })
    };
    let pending = || async {
        sql.query_one("SELECT count(*) FROM award_changes", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let cache = std::env::temp_dir().join(format!("laurel-awards-cache-{}", std::process::id()));
    let mut children = [
        spawn_awards_worker(&db, &cache),
        spawn_awards_worker(&db, &cache),
    ];
    let mut rng = Rng(0xfee1_900d);
    let mut kills = 0;
    for round in 0..8 {
        tokio::time::sleep(Duration::from_millis(700 + rng.below(800))).await;
        if pending().await == 0 {
            break;
        }
        let child = &mut children[round % 2];
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        *child = spawn_awards_worker(&db, &cache);
    }
    writer.await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while pending().await > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for child in &mut children {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert!(
        kills >= 2,
        "the test must kill workers mid-stream (killed {kills} times)"
    );
    crate::awards::assert_matches_recomputation(&db).await;
    // Counters only went up: every user who reached the goal completed
    // exactly once, whichever worker computed it.
    let twice: i64 = sql
        .query_one(
            "SELECT count(*) FROM (SELECT user_id FROM award_transitions GROUP BY user_id HAVING count(*) > 1) t",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let (completed, transitions): (i64, i64) = {
        let row = sql
            .query_one(
                "SELECT (SELECT count(*) FROM user_achieve WHERE completed), (SELECT count(*) FROM award_transitions)",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((twice, transitions), (0, completed));
    let _ = std::fs::remove_dir_all(&cache);
    db.drop_database().await;
}
