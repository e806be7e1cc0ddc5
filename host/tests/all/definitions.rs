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
