//! Award definitions: refused with messages naming award, objective,
//! function and reason; nothing half-applied.

use laurel::definitions;
use laurel::library;
use laurel::registry::Registry;

use crate::support::{self, TestDb};

const GOOD: &str = r#"{"id": "photographer", "title": "Photographer",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 5, "strategy": [{"objective_id": "photo"}]}}"#;

async fn setup() -> (TestDb, laurel::store::Store, std::sync::Arc<Registry>) {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    library::register(&mut store, &runtime).await.unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    (db, store, registry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_with_one_bad_award_is_refused_whole_with_every_problem_named() {
    let (db, mut store, registry) = setup().await;
    let bad = r#"{"id": "broken", "title": "Broken",
      "objectives": [
        {"id": "photo",
         "filters": [{"name": "SourceFiltr", "config": {"sources": ["photos"]}}],
         "rule": {"name": "ContentStatusRule", "config": {"counters": {}}},
         "progress_counter": "approved"},
        {"id": "reviews",
         "filters": [{"name": "ReviewsLengthFilter", "config": {"allowed_length": "long"}}],
         "rule": {"name": "SourceFilter", "config": {"sources": ["reviews"]}},
         "progress_counter": "count"}],
      "strategy": {"goal": 5, "strategy": [{"objective_id": "photo"}, {"objective_id": "navi"}]}}"#;
    let file = format!("[{GOOD}, {bad}]");
    let error = definitions::apply(&mut store, &registry, &file)
        .await
        .unwrap_err();
    let message = error.to_string();
    for expected in [
        "award broken, objective photo, function SourceFiltr: no function named SourceFiltr is registered",
        "award broken, objective photo, function ContentStatusRule: function ContentStatusRule v1 rejected its config: `counters` is empty",
        "award broken, objective reviews, function ReviewsLengthFilter: function ReviewsLengthFilter v1 rejected its config: invalid config: invalid type: string \"long\"",
        "award broken, objective reviews, function SourceFilter: function SourceFilter is a filter, not a rule",
        "award broken, function TreeStrategy: the strategy refers to objective `navi`, which the award does not define",
        "award broken, objective reviews, function TreeStrategy: the strategy does not use this objective",
    ] {
        assert!(
            message.contains(expected),
            "missing {expected:?} in:\n{message}"
        );
    }
    assert!(
        !message.contains("photographer"),
        "the good award has no problem: {message}"
    );
    let sql = db.sql().await;
    let awards: i64 = sql
        .query_one("SELECT count(*) FROM awards", &[])
        .await
        .unwrap()
        .get(0);
    let sources: i64 = sql
        .query_one("SELECT count(*) FROM sources", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!((awards, sources), (0, 0), "nothing half-applied");
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_twice_makes_a_new_version_and_registers_sources() {
    let (db, mut store, registry) = setup().await;
    assert_eq!(
        definitions::apply(&mut store, &registry, GOOD)
            .await
            .unwrap(),
        vec![("photographer".to_string(), 1)]
    );
    assert_eq!(
        definitions::apply(&mut store, &registry, GOOD)
            .await
            .unwrap(),
        vec![("photographer".to_string(), 2)]
    );
    let sources = store.sources().await.unwrap();
    assert_eq!(sources.len(), 1);
    assert_eq!(
        (
            sources[0].name.as_str(),
            sources[0].topic.as_str(),
            sources[0].paused
        ),
        ("photos", "events.photos", false)
    );
    let sql = db.sql().await;
    let history: i64 = sql
        .query_one(
            "SELECT count(*) FROM award_history WHERE award_id = 'photographer'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(history, 2);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_and_bad_json_are_named() {
    let (db, mut store, registry) = setup().await;
    let typo = GOOD.replace("\"progress_counter\"", "\"progress_countr\"");
    let message = definitions::apply(&mut store, &registry, &typo)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message
            .starts_with("award photographer: invalid definition: unknown field `progress_countr`"),
        "{message}"
    );
    let message = definitions::apply(&mut store, &registry, "{oops")
        .await
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("award ?: not valid JSON:"), "{message}");
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_log_entries_and_applied_ids_are_pruned_in_bounded_steps() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let sql = db.sql().await;
    sql.batch_execute(
        "INSERT INTO processing_log (logged_at, source, event_id, outcome, reason)
             SELECT now() - interval '40 days', 'photos', 'old-' || g, 'skipped', 'test' FROM generate_series(1, 25) g;
         INSERT INTO processing_log (source, event_id, outcome, reason) VALUES ('photos', 'new-1', 'skipped', 'test');
         INSERT INTO applied_events (source, user_id, event_id, applied_at)
             SELECT 'bss', 'u-1', 'old-' || g, now() - interval '10 days' FROM generate_series(1, 5) g;
         INSERT INTO applied_events (source, user_id, event_id) VALUES ('bss', 'u-1', 'new-1');",
    )
    .await
    .unwrap();
    let horizon = |name: &'static str| {
        let sql = &sql;
        async move {
            sql.query_one(
                "SELECT extract(epoch FROM now() - horizon)::float8 / 86400 FROM prune_horizons WHERE name = $1",
                &[&name],
            )
            .await
            .unwrap()
            .get::<_, Option<f64>>(0)
        }
    };
    assert_eq!(horizon("applied_events").await, None, "nothing pruned yet");
    // At most 10 of each per step.
    assert_eq!(store.prune(30, 7, 10).await.unwrap(), 15);
    assert_eq!(store.prune(30, 7, 10).await.unwrap(), 10);
    assert_eq!(store.prune(30, 7, 10).await.unwrap(), 5);
    assert_eq!(store.prune(30, 7, 10).await.unwrap(), 0);
    let log: Vec<String> = sql
        .query("SELECT event_id FROM processing_log", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let applied: Vec<String> = sql
        .query("SELECT event_id FROM applied_events", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        (log, applied),
        (vec!["new-1".to_string()], vec!["new-1".to_string()])
    );
    // The record of applied ids is complete from 7 days ago on; nothing
    // was pruned of the ids awards counted, so theirs did not move.
    let days = horizon("applied_events").await.expect("a horizon");
    assert!((7.0..7.01).contains(&days), "{days}");
    assert_eq!(horizon("award_events").await, None);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_that_would_break_an_award_is_refused_unless_forced() {
    let (db, mut store, registry) = setup().await;
    definitions::apply(&mut store, &registry, GOOD)
        .await
        .unwrap();
    let runtime = registry.runtime().clone();
    // EventTypeFilter's component as a new "SourceFilter": it wants `types`.
    let event_type = library::builtin("EventTypeFilter").unwrap().bytes;
    let error = definitions::push_function(
        &mut store,
        &runtime,
        "SourceFilter",
        definitions::Pushed::of(event_type),
        false,
    )
    .await
    .unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with(
            "refusing to push SourceFilter: the new version would break an award that uses it (push with --force to do it anyway): \
             award photographer, objective photo, function SourceFilter: the new version rejects its config: invalid config: unknown field `sources`"
        ),
        "{message}"
    );
    // A rule under a filter's name is refused for its kind.
    let rule = library::builtin("CountRule").unwrap().bytes;
    let message = definitions::push_function(
        &mut store,
        &runtime,
        "SourceFilter",
        definitions::Pushed::of(rule),
        false,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        message.contains("it is used as a filter, and the new version is a rule"),
        "{message}"
    );
    let sql = db.sql().await;
    let versions: i64 = sql
        .query_one(
            "SELECT count(*) FROM functions WHERE name = 'SourceFilter'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(versions, 1, "nothing was pushed");
    // Forced, it goes in.
    let (_, outcome) = definitions::push_function(
        &mut store,
        &runtime,
        "SourceFilter",
        definitions::Pushed::of(event_type),
        true,
    )
    .await
    .unwrap();
    assert_eq!(outcome, laurel::store::PushOutcome::Created { version: 2 });
    // A compatible new version needs no force.
    let accept = crate::support::guest_bytes("accept_all_filter");
    let (_, outcome) = definitions::push_function(
        &mut store,
        &runtime,
        "SourceFilter",
        definitions::Pushed::of(&accept),
        false,
    )
    .await
    .unwrap();
    assert_eq!(outcome, laurel::store::PushOutcome::Created { version: 3 });
    db.drop_database().await;
}
