//! The awards worker: strategies from Kafka events to user_achieve, change
//! detection under concurrent writers (including a lower version committing
//! after a higher one), live and sticky revocation, backfills.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use laurel::awards::AwardsSettings;
use laurel::store::AchieveState;
use serde_json::{Value, json};

use crate::pipeline_support::{Pipeline, awards_worker, event};
use crate::support::{self, TestDb};

/// The write-up's examples: "3 reviews or 3 photos", and the contract's
/// "content maker" (5 photos or reviews, and 10 km).
const WRITE_UP_AWARDS: &str = concat!(
    "[",
    r#"{
  "id": "three-of-either", "title": "Three of either",
  "objectives": [
    {"id": "photos",
     "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
     "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved"}}},
     "progress_counter": "approved"},
    {"id": "reviews",
     "filters": [{"name": "SourceFilter", "config": {"sources": ["reviews"]}}],
     "rule": {"name": "ReviewUniqueByObjectRule", "config": {}},
     "progress_counter": "count"}],
  "strategy": {"goal": 3, "operation": "sum", "strategy": [{"objective_id": "reviews"}, {"objective_id": "photos"}]}
}"#,
    ", ",
    include_str!("../../demo/content-maker.json"),
    "]"
);

pub async fn state(db: &TestDb, user: &str, award: &str) -> Option<AchieveState> {
    db.store()
        .await
        .user_achievements(user)
        .await
        .unwrap()
        .into_iter()
        .find(|(a, _)| a == award)
        .map(|(_, s)| s)
}

fn summary(s: &AchieveState) -> (f64, f64, bool, bool) {
    (s.progress, s.goal, s.started, s.completed)
}

fn photo(id: &str, user: &str, content: &str, status: &str, tick: u32) -> Value {
    event(id, "photos", user, Some((content, status)), tick, json!({}))
}

fn review(id: &str, user: &str, content: &str, object: &str, text: &str, tick: u32) -> Value {
    event(
        id,
        "reviews",
        user,
        Some((content, "active")),
        tick,
        json!({"object_id": object, "text": text}),
    )
}

fn trip(id: &str, user: &str, metres: i64, tick: u32) -> Value {
    let mut e = event(id, "bss", user, None, tick, json!({"distance_m": metres}));
    e["type"] = "navi.trip_finished".into();
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_up_strategy_examples_from_kafka_events_to_user_achieve() {
    let mut p = Pipeline::start(WRITE_UP_AWARDS, &["photos", "reviews", "bss"]).await;
    let long = "x".repeat(150);
    // 1 review and 2 photos: "3 reviews or 3 photos" is complete.
    p.send(&review("r-1", "u-1", "review-1", "firm-1", &long, 1))
        .await;
    p.send(&photo("p-1", "u-1", "photo-1", "active", 1)).await;
    p.send(&photo("p-2", "u-1", "photo-2", "active", 2)).await;
    // 3 photos, 1 long review, 9.5 km.
    for n in 1..=3 {
        p.send(&photo(
            &format!("q-{n}"),
            "u-2",
            &format!("photo-{n}"),
            "active",
            n,
        ))
        .await;
    }
    p.send(&review("s-1", "u-2", "review-1", "firm-1", &long, 1))
        .await;
    p.send(&review("s-2", "u-2", "review-2", "firm-2", "too short", 2))
        .await;
    p.send(&trip("t-1", "u-2", 4000, 1)).await;
    p.send(&trip("t-2", "u-2", 5500, 2)).await;
    for source in ["photos", "reviews", "bss"] {
        p.settle(source, "u-1").await;
        p.settle(source, "u-2").await;
    }
    let mut worker = p.awards_worker().await;
    worker.drain().await.unwrap();

    let either = state(&p.db, "u-1", "three-of-either").await.unwrap();
    assert_eq!(summary(&either), (3.0, 3.0, true, true));
    assert!(either.completed_at.is_some());
    let maker = state(&p.db, "u-2", "content-maker").await.unwrap();
    assert_eq!(
        summary(&maker),
        (13.5, 15.0, true, false),
        "4 units of content (cap 5) + 9.5 km (cap 10)"
    );
    let sql = p.db.sql().await;
    let remaining: f64 = sql
        .query_one(
            "SELECT remaining FROM user_achieve WHERE user_id = 'u-2' AND award_id = 'content-maker'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(remaining, 1.5);
    // Two more photos (5 units, capped) and 600 m more (10.1 km, capped).
    p.send(&photo("q-4", "u-2", "photo-4", "active", 4)).await;
    p.send(&photo("q-5", "u-2", "photo-5", "active", 5)).await;
    p.send(&trip("t-3", "u-2", 600, 3)).await;
    p.settle("photos", "u-2").await;
    p.settle("bss", "u-2").await;
    worker.drain().await.unwrap();
    let maker = state(&p.db, "u-2", "content-maker").await.unwrap();
    assert_eq!(summary(&maker), (15.0, 15.0, true, true));
    let transitions = p.db.store().await.user_transitions("u-2").await.unwrap();
    let kinds: Vec<(&str, &str)> = transitions
        .iter()
        .map(|t| (t.award_id.as_str(), t.kind.as_str()))
        .collect();
    assert!(kinds.contains(&("content-maker", "completed")), "{kinds:?}");
    p.stop().await;
}

const PHOTO_AWARDS: &str = r#"[{
  "id": "live-photographer", "title": "Photographer (live)", "revocation": "live",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved", "blocked": "blocked"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 2, "strategy": [{"objective_id": "photo"}]}
}, {
  "id": "sticky-photographer", "title": "Photographer (sticky)", "revocation": "sticky",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved", "blocked": "blocked"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 2, "strategy": [{"objective_id": "photo"}]}
}]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_photo_blocked_after_completion_revokes_a_live_award_and_not_a_sticky_one() {
    let mut p = Pipeline::start(PHOTO_AWARDS, &["photos"]).await;
    let events = ["award.completed".to_string(), "award.revoked".to_string()];
    let webhook =
        laurel::webhooks::checked_webhook("audit", "http://127.0.0.1:9/", &events, None).unwrap();
    p.db.store().await.set_webhook(&webhook).await.unwrap();
    let mut worker = p.awards_worker().await;
    p.send(&photo("p-1", "u-1", "photo-1", "active", 1)).await;
    p.send(&photo("p-2", "u-1", "photo-2", "active", 2)).await;
    p.settle("photos", "u-1").await;
    worker.drain().await.unwrap();
    let live = state(&p.db, "u-1", "live-photographer").await.unwrap();
    let sticky = state(&p.db, "u-1", "sticky-photographer").await.unwrap();
    assert!(live.completed && sticky.completed);
    let sticky_since = sticky.completed_at.expect("completed_at is set");

    p.send(&photo("p-3", "u-1", "photo-2", "blocked", 3)).await;
    p.settle("photos", "u-1").await;
    worker.drain().await.unwrap();
    let live = state(&p.db, "u-1", "live-photographer").await.unwrap();
    let sticky = state(&p.db, "u-1", "sticky-photographer").await.unwrap();
    assert_eq!(summary(&live), (1.0, 2.0, true, false));
    assert_eq!(live.completed_at, None);
    assert_eq!(summary(&sticky), (1.0, 2.0, true, true));
    assert_eq!(
        sticky.completed_at,
        Some(sticky_since),
        "completed_at is set once"
    );

    let transitions = p.db.store().await.user_transitions("u-1").await.unwrap();
    let seen: Vec<(&str, &str, Option<&str>)> = transitions
        .iter()
        .map(|t| (t.award_id.as_str(), t.kind.as_str(), t.reason.as_deref()))
        .collect();
    assert_eq!(
        seen.iter()
            .filter(|(a, _, _)| *a == "live-photographer")
            .copied()
            .collect::<Vec<_>>(),
        vec![
            ("live-photographer", "completed", None),
            (
                "live-photographer",
                "revoked",
                Some("progress 1 fell below the goal 2")
            )
        ]
    );
    assert_eq!(
        seen.iter()
            .filter(|(a, _, _)| *a == "sticky-photographer")
            .count(),
        1,
        "sticky: only the completion"
    );

    // Active again: the live award completes again, a new transition.
    p.send(&photo("p-4", "u-1", "photo-2", "active", 4)).await;
    p.settle("photos", "u-1").await;
    worker.drain().await.unwrap();
    assert!(
        state(&p.db, "u-1", "live-photographer")
            .await
            .unwrap()
            .completed
    );
    let transitions = p.db.store().await.user_transitions("u-1").await.unwrap();
    assert_eq!(transitions.len(), 4, "{transitions:?}");
    // Each transition queued one notification for the webhook that wants it.
    let queued: Vec<(String, String)> =
        p.db.store()
            .await
            .notifications()
            .await
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n.payload["award_id"].as_str().unwrap().to_string(),
                    n.payload["type"].as_str().unwrap().to_string(),
                )
            })
            .filter(|(award, _)| award == "live-photographer")
            .collect();
    let kinds: Vec<&str> = queued.iter().map(|(_, kind)| kind.as_str()).collect();
    assert_eq!(
        kinds,
        vec!["award.completed", "award.revoked", "award.completed"]
    );
    p.stop().await;
}

/// One objective, goal 50: progress = min(approved, 50).
const COUNTER_AWARD: &str = r#"[{
  "id": "counter", "title": "Counter",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 50, "strategy": [{"objective_id": "photo"}]}
}]"#;

pub async fn db_with_counter_award() -> TestDb {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    laurel::library::register(&mut store, &runtime)
        .await
        .unwrap();
    let registry = laurel::registry::Registry::start(&db.url, runtime)
        .await
        .unwrap();
    laurel::definitions::apply(&mut store, &registry, COUNTER_AWARD)
        .await
        .unwrap();
    db
}

/// Adds `n` to a user's `approved` counter, as ingest writes counters: a
/// new version from the shared sequence.
pub const BUMP: &str = "INSERT INTO user_objective (user_id, award_id, objective_id, counters, version)
     VALUES ($1, 'counter', 'photo', jsonb_build_object('approved', $2::bigint), nextval('laurel_version'))
     ON CONFLICT (user_id, award_id, objective_id) DO UPDATE SET
         counters = jsonb_build_object('approved', (user_objective.counters->>'approved')::bigint + $2),
         version = EXCLUDED.version
     RETURNING version";

/// Every user's award state must equal a from-scratch computation from the
/// final counters, and carry the max version of its objective.
pub async fn assert_matches_recomputation(db: &TestDb) {
    let sql = db.sql().await;
    let rows = sql
        .query(
            "SELECT uo.user_id, (uo.counters->>'approved')::bigint, uo.version, ua.progress, ua.completed, ua.version
             FROM user_objective uo LEFT JOIN user_achieve ua USING (user_id, award_id)
             WHERE uo.award_id = 'counter' ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    assert!(!rows.is_empty());
    let mut wrong = Vec::new();
    for row in &rows {
        let user: String = row.get(0);
        let approved: i64 = row.get(1);
        let version: i64 = row.get(2);
        let progress: Option<f64> = row.get(3);
        let completed: Option<bool> = row.get(4);
        let seen: Option<i64> = row.get(5);
        let expected = (approved.min(50) as f64, approved >= 50, version);
        if (progress, completed, seen) != (Some(expected.0), Some(expected.1), Some(expected.2)) {
            wrong.push(format!(
                "{user}: expected {expected:?}, got {:?}",
                (progress, completed, seen)
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} users wrong, e.g. {:?}",
        wrong.len(),
        rows.len(),
        &wrong[..wrong.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_version_committing_after_a_higher_one_is_not_lost() {
    let db = db_with_counter_award().await;
    let mut worker = awards_worker(&db.url, AwardsSettings::default()).await;
    let slow = db.sql().await;
    let fast = db.sql().await;

    // The slow writer draws the lower version and keeps its transaction
    // open while the fast one draws a higher version and commits.
    slow.batch_execute("BEGIN").await.unwrap();
    let low: i64 = slow
        .query_one(BUMP, &[&"slow", &7i64])
        .await
        .unwrap()
        .get(0);
    let high: i64 = fast
        .query_one(BUMP, &[&"fast", &3i64])
        .await
        .unwrap()
        .get(0);
    assert!(low < high);
    let first = worker.drain().await.unwrap();
    assert_eq!(first.claimed, 1, "only the committed change is visible");
    // A watermark at the highest version seen would now skip `slow`:
    let after_watermark: i64 = fast
        .query_one(
            "SELECT count(*) FROM user_objective WHERE version > $1",
            &[&high],
        )
        .await
        .unwrap()
        .get(0);
    slow.batch_execute("COMMIT").await.unwrap();
    let after_commit: i64 = fast
        .query_one(
            "SELECT count(*) FROM user_objective WHERE version > $1",
            &[&high],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        (after_watermark, after_commit),
        (0, 0),
        "the trap: the late commit is invisible to a version watermark"
    );
    let second = worker.drain().await.unwrap();
    assert_eq!(second.claimed, 1, "the late commit is found");
    assert_eq!(
        state(&db, "slow", "counter")
            .await
            .map(|s| (s.progress, s.version)),
        Some((7.0, low))
    );
    assert_matches_recomputation(&db).await;

    // A writer that changes a pair while a worker holds its marker waits
    // for that worker, then marks the pair again.
    fast.query_one(BUMP, &[&"held", &1i64]).await.unwrap();
    let mut store = db.store().await;
    let claimed = store.claim_changes(10).await.unwrap();
    assert_eq!(claimed.changes.len(), 1);
    let writer = {
        let url = db.url.clone();
        tokio::spawn(async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            client.query_one(BUMP, &[&"held", &1i64]).await.unwrap();
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!writer.is_finished(), "the writer waits for the claim");
    // The held cycle commits what it read (approved = 1).
    claimed.commit(&[]).await.unwrap();
    writer.await.unwrap();
    let pending: i64 = fast
        .query_one(
            "SELECT count(*) FROM award_changes WHERE user_id = 'held'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(pending, 1, "the change after the claim is marked again");
    worker.drain().await.unwrap();
    assert_eq!(
        state(&db, "held", "counter").await.map(|s| s.progress),
        Some(2.0)
    );
    assert_matches_recomputation(&db).await;
    db.drop_database().await;
}

/// A tiny deterministic generator, so a failure reproduces.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_writers_and_two_workers_lose_no_update() {
    let db = db_with_counter_award().await;
    let writing = Arc::new(AtomicBool::new(true));
    let mut workers = Vec::new();
    for _ in 0..2 {
        let mut worker = awards_worker(
            &db.url,
            AwardsSettings {
                batch: 50,
                ..AwardsSettings::default()
            },
        )
        .await;
        let writing = writing.clone();
        workers.push(tokio::spawn(async move {
            let mut cycles = 0;
            while writing.load(Ordering::Relaxed) {
                worker.cycle().await.unwrap();
                cycles += 1;
            }
            (worker, cycles)
        }));
    }
    let mut writers = Vec::new();
    for w in 0..8u64 {
        let client = db.sql().await;
        writers.push(tokio::spawn(async move {
            let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (w + 1);
            for _ in 0..150 {
                // Several users per transaction, sometimes held open, so
                // versions commit out of order.
                // Users in sorted order, as ingest locks them (two
                // writers locking rows in opposite orders would deadlock).
                let mut users: Vec<u64> = (0..1 + xorshift(&mut rng) % 3)
                    .map(|_| xorshift(&mut rng) % 40)
                    .collect();
                users.sort_unstable();
                client.batch_execute("BEGIN").await.unwrap();
                for user in users {
                    let n = 1 + (xorshift(&mut rng) % 3) as i64;
                    client
                        .query_one(BUMP, &[&format!("user-{user:02}"), &n])
                        .await
                        .unwrap();
                }
                if xorshift(&mut rng).is_multiple_of(4) {
                    tokio::time::sleep(Duration::from_millis(xorshift(&mut rng) % 5)).await;
                }
                client.batch_execute("COMMIT").await.unwrap();
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    writing.store(false, Ordering::Relaxed);
    let mut total_cycles = 0;
    for worker in workers {
        let (mut worker, cycles) = worker.await.unwrap();
        total_cycles += cycles;
        worker.drain().await.unwrap();
    }
    assert!(total_cycles > 10, "the workers ran while writers wrote");
    assert_matches_recomputation(&db).await;
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_award_is_backfilled_for_every_user_with_counters() {
    let db = db_with_counter_award().await;
    let sql = db.sql().await;
    sql.execute(
        "INSERT INTO user_objective (user_id, award_id, objective_id, counters, version)
         SELECT 'user-' || n, 'counter', 'photo', jsonb_build_object('approved', 30), nextval('laurel_version')
         FROM generate_series(1, 2500) n",
        &[],
    )
    .await
    .unwrap();
    let mut worker = awards_worker(
        &db.url,
        AwardsSettings {
            backfill_batch: 1000,
            ..AwardsSettings::default()
        },
    )
    .await;
    worker.drain().await.unwrap();
    assert_eq!(
        state(&db, "user-7", "counter").await.map(|s| summary(&s)),
        Some((30.0, 50.0, true, false))
    );
    // The goal drops to 25: every user completes, by backfill (nothing
    // changed in their counters).
    let mut store = db.store().await;
    let registry = laurel::registry::Registry::start(&db.url, support::runtime())
        .await
        .unwrap();
    laurel::definitions::apply(
        &mut store,
        &registry,
        &COUNTER_AWARD.replace("\"goal\": 50", "\"goal\": 25"),
    )
    .await
    .unwrap();
    let mut steps = 0;
    while worker.backfill_step().await.unwrap() {
        steps += 1;
        worker.drain().await.unwrap();
    }
    assert_eq!(steps, 3, "2,500 users in batches of 1,000");
    let completed: i64 = sql
        .query_one(
            "SELECT count(*) FROM user_achieve WHERE award_id = 'counter' AND completed AND award_version = 2",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(completed, 2500);
    let backfills = store.backfills().await.unwrap();
    assert!(
        backfills.iter().all(|b| b.finished),
        "{backfills:?} all finished"
    );
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_strategy_is_recorded_per_award_and_the_worker_goes_on() {
    let db = db_with_counter_award().await;
    let sql = db.sql().await;
    sql.query_one(BUMP, &[&"u-1", &2i64]).await.unwrap();
    let mut worker = awards_worker(&db.url, AwardsSettings::default()).await;
    worker.drain().await.unwrap();
    assert_eq!(
        state(&db, "u-1", "counter").await.map(|s| s.progress),
        Some(2.0)
    );
    // The stored definition now names a strategy function that does not
    // exist (as if it had been removed): the award cannot be evaluated.
    sql.execute(
        "UPDATE awards SET definition = jsonb_set(definition, '{strategy_function}', '\"NoSuchStrategy\"'), version = version + 1",
        &[],
    )
    .await
    .unwrap();
    sql.query_one(BUMP, &[&"u-1", &5i64]).await.unwrap();
    let outcome = worker.drain().await.unwrap();
    assert_eq!(outcome.failed, 1);
    let s = state(&db, "u-1", "counter").await.unwrap();
    assert_eq!(s.progress, 2.0, "progress kept as it was");
    let error = s.error.expect("the error is recorded");
    assert!(
        error.contains("NoSuchStrategy"),
        "the error names the function: {error}"
    );
    let per_award = db.store().await.strategy_errors().await.unwrap();
    assert_eq!(per_award.len(), 1);
    assert_eq!((per_award[0].0.as_str(), per_award[0].1), ("counter", 1));
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_banned_user_gets_no_award_from_a_backfill_and_a_restored_one_does() {
    let db = db_with_counter_award().await;
    let sql = db.sql().await;
    sql.execute(
        "INSERT INTO user_objective (user_id, award_id, objective_id, counters, version)
         SELECT u, 'counter', 'photo', jsonb_build_object('approved', 30), nextval('laurel_version')
         FROM unnest(ARRAY['u-ok', 'u-banned', 'u-deleted']) u",
        &[],
    )
    .await
    .unwrap();
    let mut store = db.store().await;
    store.set_user_state("u-banned", "banned").await.unwrap();
    store.set_user_state("u-deleted", "deleted").await.unwrap();
    let mut worker = awards_worker(&db.url, AwardsSettings::default()).await;
    worker.drain().await.unwrap();
    // The goal drops below their counters: a backfill would complete all.
    let registry = laurel::registry::Registry::start(&db.url, support::runtime())
        .await
        .unwrap();
    laurel::definitions::apply(
        &mut store,
        &registry,
        &COUNTER_AWARD.replace("\"goal\": 50", "\"goal\": 25"),
    )
    .await
    .unwrap();
    while worker.backfill_step().await.unwrap() {
        worker.drain().await.unwrap();
    }
    worker.drain().await.unwrap();
    let completed = |user: &'static str| {
        let db = &db;
        async move {
            state(db, user, "counter")
                .await
                .is_some_and(|s| s.completed)
        }
    };
    assert!(completed("u-ok").await);
    assert!(
        !completed("u-banned").await,
        "a banned user completes nothing"
    );
    assert!(
        !completed("u-deleted").await,
        "a deleted user completes nothing"
    );
    let transitions: i64 = sql
        .query_one(
            "SELECT count(*) FROM award_transitions WHERE user_id IN ('u-banned', 'u-deleted')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(transitions, 0, "and nothing is notified for them");
    // Restored: computed again at once, with what they had.
    store.set_user_state("u-banned", "active").await.unwrap();
    worker.drain().await.unwrap();
    assert!(
        completed("u-banned").await,
        "a restored user's awards are recomputed"
    );
    assert!(!completed("u-deleted").await);
    db.drop_database().await;
}
