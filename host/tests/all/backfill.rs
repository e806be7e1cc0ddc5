//! Awards that credit the past: an award applied with `"backfill":
//! "history"` is evaluated over the photos Laurel already stores. It
//! completes for users whose photos were approved before it existed,
//! counts each photo once while new photo events arrive during the walk,
//! says what it could not recover, and a second backfill (the built
//! binary's `laurel awards backfill`) changes nothing.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::pipeline_support::Pipeline;

/// An award that already uses the photos source, so its items are stored.
const EXISTING: &str = r#"[{"id": "photographer", "title": "Photographer",
  "objectives": [{"id": "photos",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
    "rule": {"name": "CountRule", "config": {"counter": "approved", "statuses": ["approved"]}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 1000, "strategy": [{"objective_id": "photos"}]}}]"#;

const USERS: usize = 120;
const PHOTOS: usize = 5;

fn user(n: usize) -> String {
    format!("u-{n:03}")
}

/// A photo's event at `second` past midnight.
fn photo(user_n: usize, photo: usize, second: i64, status: &str) -> Value {
    let at = chrono::DateTime::parse_from_rfc3339("2026-12-01T00:00:00Z").unwrap()
        + chrono::Duration::seconds(second);
    json!({"id": format!("e-{user_n}-{photo}-{second}"), "source": "photos", "type": "photos.changed",
           "user_id": user(user_n), "authorized": true,
           "content_id": format!("{}-p-{photo}", user(user_n)), "status": status,
           "occurred_at": at.to_rfc3339(), "payload": {}})
}

/// Spread over the statuses, the same every run.
fn status(user_n: usize, photo: usize, round: usize) -> &'static str {
    match (user_n * 7 + photo * 3 + round * 5) % 5 {
        0..=2 => "approved",
        3 => "pending",
        _ => "blocked",
    }
}

/// Per user, how many of its photos `last` says are approved now.
fn approved(last: &BTreeMap<(usize, usize), &'static str>) -> BTreeMap<String, i64> {
    let mut counts: BTreeMap<String, i64> = (0..USERS).map(|u| (user(u), 0)).collect();
    for ((u, _), status) in last {
        if *status == "approved" {
            *counts.get_mut(&user(*u)).unwrap() += 1;
        }
    }
    counts
}

/// `laurel awards backfill AWARD` with the built binary, on this pipeline's
/// database (and broker, with `kafka`).
fn backfill(p: &Pipeline, award: &str, kafka: bool) -> std::process::Output {
    backfill_command(p, award, kafka).output().unwrap()
}

fn backfill_command(p: &Pipeline, award: &str, kafka: bool) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_laurel"));
    command
        .env("LAUREL_DATABASE_URL", &p.db.url)
        .env("LAUREL_LOG", "warn")
        .env_remove("LAUREL_KAFKA_BROKERS")
        .args(["awards", "backfill", award]);
    if kafka {
        command.env("LAUREL_KAFKA_BROKERS", p.broker.bootstrap_servers());
    }
    command
}

/// Per user, the award's `approved` counter (0 where it has none).
async fn counted(p: &Pipeline, award: &str) -> BTreeMap<String, i64> {
    let sql = p.db.sql().await;
    let mut counts: BTreeMap<String, i64> = (0..USERS).map(|u| (user(u), 0)).collect();
    for row in sql
        .query(
            "SELECT user_id, coalesce((counters->>'approved')::bigint, 0) FROM user_objective WHERE award_id = $1",
            &[&award],
        )
        .await
        .unwrap()
    {
        counts.insert(row.get(0), row.get(1));
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfilled_award_credits_past_photos_once_while_new_ones_arrive_and_again_changes_nothing()
 {
    // Small steps, so live events arrive while the walk is under way.
    let p = Pipeline::start_with(EXISTING, &["photos"], |s| laurel::ingest::IngestSettings {
        backfill_batch: 5,
        ..s
    })
    .await;

    // Before the award exists: every user's photos, some changing status.
    let mut last: BTreeMap<(usize, usize), &'static str> = BTreeMap::new();
    for u in 0..USERS {
        for n in 0..PHOTOS {
            p.send(&photo(u, n, 10, status(u, n, 0))).await;
            last.insert((u, n), status(u, n, 0));
            if (u + n) % 4 == 0 {
                p.send(&photo(u, n, 20, status(u, n, 1))).await;
                last.insert((u, n), status(u, n, 1));
            }
        }
    }
    let before = approved(&last);
    p.wait_until("the photos applied", || async {
        counted(&p, "photographer").await == before
    })
    .await;

    // One approved photo of u-000 as if applied before Laurel kept events.
    let lost = (0..PHOTOS)
        .find(|n| last[&(0, *n)] == "approved")
        .expect("u-000 has an approved photo");
    let sql = p.db.sql().await;
    sql.execute(
        "UPDATE content_items SET event = NULL WHERE user_id = 'u-000' AND content_id = $1",
        &[&format!("u-000-p-{lost}")],
    )
    .await
    .unwrap();

    // The new award, "three photos", asks to credit the past.
    let three = json!({"id": "three-photos", "title": "Three photos", "backfill": "history",
        "objectives": [{"id": "photos",
          "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
          "rule": {"name": "CountRule", "config": {"counter": "approved", "statuses": ["approved"]}},
          "progress_counter": "approved"}],
        "strategy": {"goal": 3, "strategy": [{"objective_id": "photos"}]}});
    let mut store = p.db.store().await;
    laurel::definitions::apply(&mut store, &p.registry, &three.to_string())
        .await
        .unwrap();
    let started = store
        .history_backfill("three-photos")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(started.sources, ["photos"]);
    assert_eq!(started.total, (USERS * PHOTOS) as i64);

    // Once the walk is under way: new photos and status changes, live.
    p.wait_until("the walk started", || async {
        let b = store
            .history_backfill("three-photos")
            .await
            .unwrap()
            .unwrap();
        b.done > 0
    })
    .await;
    for u in (1..USERS).step_by(3) {
        p.send(&photo(u, PHOTOS, 30, "approved")).await;
        last.insert((u, PHOTOS), "approved");
        let n = u % PHOTOS;
        p.send(&photo(u, n, 40, status(u, n, 2))).await;
        last.insert((u, n), status(u, n, 2));
    }
    let during = store
        .history_backfill("three-photos")
        .await
        .unwrap()
        .unwrap();
    assert!(
        during.finished_at.is_none(),
        "the live events should arrive during the walk: {during:?}"
    );

    p.wait_until("the backfill finished", || async {
        let b = store
            .history_backfill("three-photos")
            .await
            .unwrap()
            .unwrap();
        b.finished_at.is_some()
    })
    .await;
    let after = approved(&last);
    p.wait_until("the live events applied", || async {
        counted(&p, "photographer").await == after
    })
    .await;

    // Each photo once: the live counts, but for the photo whose event was
    // not kept.
    let mut expected = after.clone();
    *expected.get_mut("u-000").unwrap() -= 1;
    assert_eq!(counted(&p, "three-photos").await, expected);
    let done = store
        .history_backfill("three-photos")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.unrecoverable, 1, "{done:?}");
    assert_eq!(done.failed, 0, "{done:?}");
    assert!(done.done >= (USERS * PHOTOS) as i64, "{done:?}");

    // Completed for everyone with three approved photos, most of them
    // approved before the award existed.
    let mut worker = p.awards_worker().await;
    worker.drain().await.unwrap();
    let completed: BTreeMap<String, bool> = sql
        .query(
            "SELECT user_id, completed FROM user_achieve WHERE award_id = 'three-photos'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (u, n) in &expected {
        assert_eq!(
            completed.get(u).copied().unwrap_or(false),
            *n >= 3,
            "{u} has {n} approved photos"
        );
    }
    let credited_from_the_past = before
        .iter()
        .filter(|(u, n)| **n >= 3 && *u != "u-000")
        .count();
    assert!(credited_from_the_past > 10, "{before:?}");

    // Again, with the built binary: nothing changes, and it says what it
    // could not recover.
    let output = backfill(&p, "three-photos", false);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("0 changed a counter, 1 unrecoverable;") && stdout.contains("; 0 failed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 item(s) were applied before Laurel kept their events"),
        "{stdout}"
    );
    // Without a broker, it says it read no analytics.
    assert!(
        stdout.contains(
            "no Kafka brokers (LAUREL_KAFKA_BROKERS): retained analytics events were not read"
        ),
        "{stdout}"
    );
    assert_eq!(counted(&p, "three-photos").await, expected);

    // PostgreSQL cuts the binary's connections in the middle of a walk: it
    // says so, goes on from where its last step ended, and again changes
    // nothing.
    let cut_from: chrono::DateTime<chrono::Utc> =
        sql.query_one("SELECT now()", &[]).await.unwrap().get(0);
    let mut command = backfill_command(&p, "three-photos", false);
    command.args(["--batch", "1"]);
    let walker = std::thread::spawn(move || command.output().unwrap());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let b = store
            .history_backfill("three-photos")
            .await
            .unwrap()
            .unwrap();
        if b.started_at > cut_from && b.done > 0 {
            assert!(b.finished_at.is_none(), "walked before the cut: {b:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the walk never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cut: i64 = sql
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_start >= $1",
            &[&cut_from],
        )
        .await
        .unwrap()
        .get(0);
    assert!(cut > 0, "the binary's connections were cut");
    let output = walker.join().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("a step failed ("), "{stderr}");
    assert!(
        stdout.contains("0 changed a counter") && stdout.contains("; 0 failed"),
        "{stdout}"
    );
    assert_eq!(counted(&p, "three-photos").await, expected);

    // A later status change moves the backfilled counts as any other: the
    // item's share was written by the backfill.
    let (u, n) = last
        .iter()
        .find(|((u, _), s)| **s == "approved" && *u != 0)
        .map(|(k, _)| *k)
        .unwrap();
    p.send(&photo(u, n, 50, "blocked")).await;
    *expected.get_mut(&user(u)).unwrap() -= 1;
    p.wait_until("the block applied", || async {
        counted(&p, "three-photos").await == expected
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(counted(&p, "three-photos").await, expected);

    // Refused: no such award.
    let output = backfill(&p, "no-such-award", false);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no award named no-such-award"), "{stderr}");

    p.stop().await;
}

/// An award that already counts trips on the bss source, so it is consumed.
const DRIVER: &str = r#"[{"id": "driver", "title": "Driver",
  "objectives": [{"id": "navi",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}},
                {"name": "EventTypeFilter", "config": {"types": ["navi.trip_finished"]}}],
    "rule": {"name": "SumFieldRule", "config": {"field": "distance_m", "counter": "metres"}},
    "progress_counter": "metres"}],
  "strategy": {"goal": 1000000000, "strategy": [{"objective_id": "navi"}]}}]"#;

fn trip(user_n: usize, n: usize, metres: i64) -> Value {
    json!({"id": format!("trip-{user_n}-{n}"), "source": "bss", "type": "navi.trip_finished",
           "user_id": user(user_n), "authorized": true, "occurred_at": "2026-12-01T08:00:00Z",
           "payload": {"distance_m": metres}})
}

/// Per user, the award's `metres` counter.
async fn metres(p: &Pipeline, award: &str) -> BTreeMap<String, i64> {
    let sql = p.db.sql().await;
    sql.query(
        "SELECT user_id, coalesce((counters->>'metres')::bigint, 0) FROM user_objective WHERE award_id = $1",
        &[&award],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_counts_the_retained_analytics_events_once_each() {
    let p = Pipeline::start_with(DRIVER, &["bss"], |s| laurel::ingest::IngestSettings {
        backfill_batch: 20,
        ..s
    })
    .await;
    const DRIVERS: usize = 40;
    // Before the award: five trips each; one of them delivered twice.
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for u in 0..DRIVERS {
        for n in 0..5 {
            let m = ((u * 37 + n * 11) % 50) as i64 * 100 + 100;
            p.send(&trip(u, n, m)).await;
            *expected.entry(user(u)).or_default() += m;
        }
    }
    p.send(&trip(3, 0, ((3 * 37) % 50) as i64 * 100 + 100))
        .await;
    let before = expected.clone();
    p.wait_until("the trips applied", || async {
        metres(&p, "driver").await == before
    })
    .await;

    let ten_km = json!({"id": "ten-km", "title": "Ten km", "backfill": "history",
        "objectives": [{"id": "navi",
          "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}},
                      {"name": "EventTypeFilter", "config": {"types": ["navi.trip_finished"]}}],
          "rule": {"name": "SumFieldRule", "config": {"field": "distance_m", "counter": "metres"}},
          "progress_counter": "metres"}],
        "strategy": {"goal": 10000, "strategy": [{"objective_id": "navi"}]}});
    let mut store = p.db.store().await;
    laurel::definitions::apply(&mut store, &p.registry, &ten_km.to_string())
        .await
        .unwrap();
    // While it waits and walks: new trips, and an old one delivered again.
    for u in (0..DRIVERS).step_by(4) {
        p.send(&trip(u, 9, 1000)).await;
        *expected.get_mut(&user(u)).unwrap() += 1000;
    }
    p.send(&trip(5, 1, ((5 * 37 + 11) % 50) as i64 * 100 + 100))
        .await;
    p.wait_until("the backfill finished", || async {
        let b = store.history_backfill("ten-km").await.unwrap().unwrap();
        b.finished_at.is_some()
    })
    .await;
    p.wait_until("the live trips applied", || async {
        metres(&p, "driver").await == expected
    })
    .await;
    // Every trip once, whether the backfill read it or ingest applied it.
    assert_eq!(metres(&p, "ten-km").await, expected);
    let done = store.history_backfill("ten-km").await.unwrap().unwrap();
    assert_eq!(done.failed, 0, "{done:?}");
    assert!(done.events_done >= (DRIVERS * 5 + 1) as i64, "{done:?}");
    assert!(done.events_applied >= (DRIVERS * 5) as i64 - 10, "{done:?}");
    assert!(done.from_start, "{done:?}");

    // Again, with the built binary and the broker: nothing more counted.
    let output = backfill(&p, "ten-km", true);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(" 0 analytics event(s) counted; 0 failed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("every partition still holds its first message"),
        "{stdout}"
    );
    assert_eq!(metres(&p, "ten-km").await, expected);
    p.stop().await;
}

/// Two workers, one backfill: the worker whose lease lapsed (a step that
/// stalled) and was taken over records nothing more, and cannot give back
/// the lease it lost; its holder's steps go on.
#[tokio::test]
async fn a_worker_whose_lease_was_taken_over_records_nothing_and_releases_nothing() {
    use laurel::backfill::LEASE;
    use laurel::store::HistoryStep;

    let p = Pipeline::start(EXISTING, &["photos"]).await;
    let store = p.db.store().await;
    store
        .request_history_backfill("photographer", 1, &["photos".to_string()])
        .await
        .unwrap()
        .expect("the award exists");
    let first = store
        .claim_history_backfill(None, Duration::from_millis(300))
        .await
        .unwrap()
        .expect("claimed");
    // Whether another worker could claim it now.
    let claimable = async || {
        store
            .claim_history_backfill(None, LEASE)
            .await
            .unwrap()
            .is_some()
    };
    assert!(!claimable().await, "a held lease is not claimed again");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let second = store
        .claim_history_backfill(None, LEASE)
        .await
        .unwrap()
        .expect("taken over once the lease lapsed");
    assert_ne!(first.lease_owner, second.lease_owner);

    let after = (
        "u-001".to_string(),
        "photos".to_string(),
        "u-001-p-1".to_string(),
    );
    let step = |done| HistoryStep {
        done,
        ..HistoryStep::default()
    };
    // The stalled worker's step, and its analytics phase: not recorded.
    assert!(
        !store
            .record_history_step(&first.lease(), &after, &step(5), false, LEASE)
            .await
            .unwrap()
    );
    assert!(
        !store
            .start_history_events(&first.lease(), &BTreeMap::new(), true, None)
            .await
            .unwrap()
    );
    // Its release leaves the lease with the worker that took over.
    store
        .release_history_backfill(&first.lease())
        .await
        .unwrap();
    assert!(!claimable().await, "still the second worker's");
    assert!(
        store
            .record_history_step(&second.lease(), &after, &step(3), false, LEASE)
            .await
            .unwrap()
    );
    let now = store
        .history_backfill("photographer")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((now.done, now.after.clone()), (3, after));
    assert_eq!(now.lease_owner, second.lease_owner);

    // Given back by its holder, it is claimed again at once.
    store
        .release_history_backfill(&second.lease())
        .await
        .unwrap();
    assert!(claimable().await);
    p.stop().await;
}
