//! The event pipeline end to end: events on a real Kafka-protocol broker,
//! real components, counters in a real PostgreSQL.

use std::collections::BTreeMap;

use serde_json::json;

use crate::pipeline_support::{Pipeline, event};

const PHOTOS_AWARD: &str = r#"[{
  "id": "photographer", "title": "Photographer",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved", "moderation": "on_moderation", "blocked": "blocked"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 5, "strategy": [{"objective_id": "photo"}]}
}]"#;

const REVIEWS_AWARD: &str = r#"[{
  "id": "critic", "title": "Critic",
  "objectives": [{"id": "reviews",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["reviews"]}}],
    "rule": {"name": "ReviewUniqueByObjectRule", "config": {}},
    "progress_counter": "count"}],
  "strategy": {"goal": 3, "strategy": [{"objective_id": "reviews"}]}
}, {
  "id": "driver", "title": "Driver",
  "objectives": [{"id": "navi",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}},
                {"name": "EventTypeFilter", "config": {"types": ["navi.trip_finished"]}}],
    "rule": {"name": "SumFieldRule", "config": {"field": "distance_m", "counter": "metres"}},
    "progress_counter": "metres"}],
  "strategy": {"goal": 10, "strategy": [{"objective_id": "navi", "normalization_factor": 0.001}]}
}]"#;

fn counters(pairs: &[(&str, i64)]) -> BTreeMap<String, i64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn photo_moves_through_moderation_block_and_deletion_with_exact_counters() {
    let mut p = Pipeline::start(PHOTOS_AWARD, &["photos"]).await;
    let steps = [
        ("moderation", counters(&[("on_moderation", 1)])),
        ("active", counters(&[("approved", 1)])),
        ("blocked", counters(&[("blocked", 1)])),
        ("active", counters(&[("approved", 1)])),
        ("deleted", counters(&[])),
    ];
    for (tick, (status, expected)) in steps.into_iter().enumerate() {
        p.send(&event(
            &format!("e-{tick}"),
            "photos",
            "u-1",
            Some(("photo-9", status)),
            tick as u32,
            json!({}),
        ))
        .await;
        p.settle("photos", "u-1").await;
        assert_eq!(
            p.objective("u-1", "photographer", "photo").await,
            expected,
            "after {status}"
        );
    }
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivered_and_out_of_order_events_change_nothing() {
    let mut p = Pipeline::start(REVIEWS_AWARD, &["photos", "reviews", "bss"]).await;
    // A photo award is not loaded here; use reviews for content items.
    let active = event(
        "r-1-active",
        "reviews",
        "u-2",
        Some(("review-1", "active")),
        10,
        json!({"object_id": "firm-1"}),
    );
    p.send(&active).await;
    p.send(&active).await;
    p.settle("reviews", "u-2").await;
    assert_eq!(
        p.objective("u-2", "critic", "reviews").await,
        counters(&[("count", 1)])
    );

    // An older event of the same item arrives late: nothing changes.
    let older = event(
        "r-1-deleted-earlier",
        "reviews",
        "u-2",
        Some(("review-1", "deleted")),
        5,
        json!({"object_id": "firm-1"}),
    );
    p.send(&older).await;
    p.settle("reviews", "u-2").await;
    assert_eq!(
        p.objective("u-2", "critic", "reviews").await,
        counters(&[("count", 1)])
    );
    let log = p.log("u-2").await;
    assert!(
        log.iter().any(
            |(id, outcome, reason)| id.as_deref() == Some("r-1-deleted-earlier")
                && outcome == "skipped"
                && reason.as_deref()
                    == Some("older than the last applied event for this content item")
        ),
        "{log:?}"
    );

    // An analytics event delivered twice adds once.
    let trip = json!({"id": "trip-1", "source": "bss", "type": "navi.trip_finished", "user_id": "u-2", "authorized": true,
                      "occurred_at": "2026-12-01T10:00:00Z", "payload": {"distance_m": 1500}});
    p.send(&trip).await;
    p.send(&trip).await;
    p.settle("bss", "u-2").await;
    assert_eq!(
        p.objective("u-2", "driver", "navi").await,
        counters(&[("metres", 1500)])
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reviews_of_one_object_count_once_until_both_are_gone() {
    let mut p = Pipeline::start(REVIEWS_AWARD, &["reviews"]).await;
    let review = |id: &str, content: &str, status: &str, tick: u32| {
        event(
            id,
            "reviews",
            "u-3",
            Some((content, status)),
            tick,
            json!({"object_id": "firm-17", "text": "fine"}),
        )
    };
    p.send(&review("a-1", "review-a", "active", 1)).await;
    p.send(&review("b-1", "review-b", "active", 2)).await;
    p.settle("reviews", "u-3").await;
    assert_eq!(
        p.objective("u-3", "critic", "reviews").await,
        counters(&[("count", 1)]),
        "two reviews of firm-17"
    );
    p.send(&review("a-2", "review-a", "deleted", 3)).await;
    p.settle("reviews", "u-3").await;
    assert_eq!(
        p.objective("u-3", "critic", "reviews").await,
        counters(&[("count", 1)]),
        "one left"
    );
    p.send(&review("b-2", "review-b", "deleted", 4)).await;
    p.settle("reviews", "u-3").await;
    assert_eq!(
        p.objective("u-3", "critic", "reviews").await,
        counters(&[]),
        "both deleted"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_and_banned_users_get_no_progress_and_the_log_says_why() {
    let mut p = Pipeline::start(PHOTOS_AWARD, &["photos"]).await;
    p.db.store()
        .await
        .set_user_state("u-banned", "banned")
        .await
        .unwrap();
    let mut anonymous = event(
        "anon-1",
        "photos",
        "u-anon",
        Some(("photo-1", "active")),
        1,
        json!({}),
    );
    anonymous["authorized"] = json!(false);
    p.send(&anonymous).await;
    p.send(&event(
        "banned-1",
        "photos",
        "u-banned",
        Some(("photo-2", "active")),
        1,
        json!({}),
    ))
    .await;
    // Markers from these users are skipped too: settle on another user of
    // the same partitions instead, then check.
    p.send(&event(
        "ok-1",
        "photos",
        "u-ok",
        Some(("photo-3", "active")),
        1,
        json!({}),
    ))
    .await;
    p.settle("photos", "u-ok").await;
    p.wait_until("both skips logged", || async {
        p.log("u-anon").await.len() == 1 && p.log("u-banned").await.len() == 1
    })
    .await;
    assert_eq!(
        p.objective("u-anon", "photographer", "photo").await,
        counters(&[])
    );
    assert_eq!(
        p.objective("u-banned", "photographer", "photo").await,
        counters(&[])
    );
    assert_eq!(
        p.objective("u-ok", "photographer", "photo").await,
        counters(&[("approved", 1)])
    );
    assert_eq!(
        p.log("u-anon").await,
        vec![(
            Some("anon-1".into()),
            "skipped".into(),
            Some("user not authorized (authorized: false)".into())
        )]
    );
    assert_eq!(
        p.log("u-banned").await,
        vec![(
            Some("banned-1".into()),
            "skipped".into(),
            Some("user is banned".into())
        )]
    );
    p.stop().await;
}
