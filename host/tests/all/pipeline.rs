//! The event pipeline end to end: events on a real Kafka-protocol broker,
//! real components, counters in a real PostgreSQL.

use std::collections::BTreeMap;

use serde_json::json;

use crate::pipeline_support::{Pipeline, dead_letters, event};

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

/// Analytics ids are the producer's: two users' events carrying one id
/// both count, each once. Once ids were pruned, an event from before the
/// pruned horizon is refused and dead-lettered with why (whether it was
/// applied is no longer known), and the next event applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analytics_ids_count_once_per_user_and_not_again_past_the_pruned_horizon() {
    let mut p = Pipeline::start(REVIEWS_AWARD, &["reviews", "bss"]).await;
    let trip = |user: &str, id: &str, occurred_at: &str, metres: i64| {
        json!({"id": id, "source": "bss", "type": "navi.trip_finished", "user_id": user, "authorized": true,
               "occurred_at": occurred_at, "payload": {"distance_m": metres}})
    };
    p.send(&trip("u-2", "trip-1", "2026-12-01T10:00:00Z", 1500))
        .await;
    p.send(&trip("u-3", "trip-1", "2026-12-01T10:00:00Z", 2500))
        .await;
    p.send(&trip("u-2", "trip-1", "2026-12-01T10:00:00Z", 1500))
        .await;
    p.settle("bss", "u-2").await;
    p.settle("bss", "u-3").await;
    assert_eq!(
        p.objective("u-2", "driver", "navi").await,
        counters(&[("metres", 1500)])
    );
    assert_eq!(
        p.objective("u-3", "driver", "navi").await,
        counters(&[("metres", 2500)])
    );

    // Ids applied long ago are pruned: the horizon moves to 2025-01-01
    // (as many days back), so the test's own events stay after it.
    p.db.sql()
        .await
        .batch_execute(
            "INSERT INTO applied_events (source, user_id, event_id, applied_at)
             VALUES ('bss', 'u-2', 'trip-0', '2024-06-01T10:00:00Z')",
        )
        .await
        .unwrap();
    let days = (chrono::Utc::now()
        - "2025-01-01T00:00:00Z"
            .parse::<chrono::DateTime<chrono::Utc>>()
            .unwrap())
    .num_days() as i32;
    assert_eq!(p.db.store().await.prune(30, days, 100).await.unwrap(), 1);
    // trip-0 again (a consumer group reset to the earliest offset).
    p.send(&trip("u-2", "trip-0", "2024-06-01T10:00:00Z", 900))
        .await;
    p.send(&trip("u-2", "trip-2", "2026-12-01T11:00:00Z", 100))
        .await;
    p.settle("bss", "u-2").await;
    assert_eq!(
        p.objective("u-2", "driver", "navi").await,
        counters(&[("metres", 1600)])
    );
    let reasons = dead_letters(p.broker.bootstrap_servers(), "events.bss.dead", 1).await;
    assert!(
        reasons[0].contains(
            "an analytics event of 2024-06-01T10:00:00Z is older than the de-duplication horizon"
        ),
        "{reasons:?}"
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

const VISITS_AWARD: &str = r#"[{
  "id": "regular", "title": "Regular",
  "objectives": [{"id": "visits",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}},
                {"name": "EventTypeFilter", "config": {"types": ["app.opened"]}}],
    "rule": {"name": "CountRule", "config": {"counter": "opened"}},
    "progress_counter": "opened"}],
  "strategy": {"goal": 100, "strategy": [{"objective_id": "visits"}]}
}]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_dead_lettered_with_reasons_and_every_good_one_is_applied() {
    let mut p = Pipeline::start_with(VISITS_AWARD, &["bss"], |s| laurel::ingest::IngestSettings {
        max_event_bytes: 2048,
        ..s
    })
    .await;
    let users: Vec<String> = (0..100).map(|u| format!("u-{u}")).collect();
    let mut sends = Vec::new();
    let mut bad_expected = BTreeMap::new();
    for i in 0..11_000usize {
        let user = &users[i % users.len()];
        let good = json!({"id": format!("ev-{i}"), "source": "bss", "type": "app.opened", "user_id": user, "authorized": true,
                          "occurred_at": "2026-12-01T10:00:00Z", "payload": {}});
        let (key, payload, kind): (String, Vec<u8>, &str) = if i % 11 != 10 {
            (user.clone(), good.to_string().into_bytes(), "good")
        } else {
            match (i / 11) % 5 {
                0 => (user.clone(), b"{not json".to_vec(), "malformed event"),
                1 => {
                    let mut e = good.clone();
                    e.as_object_mut().unwrap().remove("occurred_at");
                    (
                        user.clone(),
                        e.to_string().into_bytes(),
                        "missing field `occurred_at`",
                    )
                }
                2 => {
                    let mut e = good.clone();
                    e["source"] = json!("photos");
                    (
                        user.clone(),
                        e.to_string().into_bytes(),
                        "unknown source `photos`",
                    )
                }
                3 => {
                    let mut e = good.clone();
                    e["payload"] = json!({"text": "x".repeat(3000)});
                    (
                        user.clone(),
                        e.to_string().into_bytes(),
                        "over the limit of 2048 bytes",
                    )
                }
                _ => (
                    "someone-else".to_string(),
                    good.to_string().into_bytes(),
                    "is not the event's user_id",
                ),
            }
        };
        if kind != "good" {
            *bad_expected.entry(kind).or_insert(0) += 1;
        }
        sends.push((key, payload));
    }
    for chunk in sends.chunks(500) {
        let futures = chunk.iter().map(|(key, payload)| {
            laurel::kafka::publish(
                &p.producer,
                "events.bss",
                Some(key.as_bytes()),
                payload,
                &[],
            )
        });
        for result in futures_util::future::join_all(futures).await {
            result.unwrap();
        }
    }
    let sql = p.db.sql().await;
    p.wait_until("10,000 good events applied", || async {
        let row = sql
            .query_one(
                "SELECT coalesce(sum((counters->>'opened')::bigint), 0)::bigint FROM user_objective WHERE award_id = 'regular'",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0) == 10_000
    })
    .await;
    for user in &users {
        assert_eq!(
            p.objective(user, "regular", "visits").await,
            counters(&[("opened", 100)]),
            "{user}"
        );
    }
    let reasons = dead_letters(p.broker.bootstrap_servers(), "events.bss.dead", 1000).await;
    let mut seen = BTreeMap::new();
    for reason in &reasons {
        // Most specific first: a missing field is also a malformed event.
        let kinds = [
            "missing field `occurred_at`",
            "unknown source `photos`",
            "over the limit of 2048 bytes",
            "is not the event's user_id",
            "malformed event",
        ];
        let kind = kinds
            .into_iter()
            .find(|k| reason.contains(k))
            .unwrap_or_else(|| panic!("unexpected reason {reason}"));
        *seen.entry(kind).or_insert(0) += 1;
    }
    assert_eq!(seen, bad_expected);
    p.wait_until("1,000 rejections logged", || async {
        let row = sql
            .query_one(
                "SELECT count(*) FROM processing_log WHERE outcome = 'rejected'",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0) == 1000
    })
    .await;
    p.settle("bss", "u-0").await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_that_makes_a_function_trap_is_held_for_its_objective_and_the_stream_goes_on() {
    let hostile_award = r#"[{
      "id": "hostile", "title": "Hostile",
      "objectives": [{"id": "count",
        "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                    {"name": "EventTypeFilter", "config": {"types": ["photos.changed", "panic"]}}],
        "rule": {"name": "Hostile", "config": {}},
        "progress_counter": "count"}],
      "strategy": {"goal": 5, "strategy": [{"objective_id": "count"}]}
    }]"#;
    // The hostile rule is registered before the award refers to it.
    let mut p = Pipeline::start_with_functions(
        hostile_award,
        &["photos"],
        &[("Hostile", crate::support::guest_bytes("hostile_function"))],
    )
    .await;
    p.send(&event(
        "ok-1",
        "photos",
        "u-5",
        Some(("photo-1", "active")),
        1,
        json!({}),
    ))
    .await;
    let mut panic = event(
        "bad-1",
        "photos",
        "u-5",
        Some(("photo-2", "active")),
        2,
        json!({}),
    );
    panic["type"] = json!("panic");
    p.send(&panic).await;
    p.send(&event(
        "ok-2",
        "photos",
        "u-5",
        Some(("photo-3", "active")),
        3,
        json!({}),
    ))
    .await;
    p.settle("photos", "u-5").await;
    assert_eq!(
        p.objective("u-5", "hostile", "count").await,
        counters(&[("count", 2)])
    );
    // Held for that objective alone, kept for replay, with the reason.
    let held = p.dead_letters().await;
    assert_eq!(held.len(), 1, "{held:?}");
    let (event_id, scope, reason) = &held[0];
    assert_eq!(
        (event_id.as_deref(), scope.as_deref()),
        (Some("bad-1"), Some("hostile/count"))
    );
    assert!(
        reason.starts_with("award hostile, objective count: function Hostile v1 trapped:")
            && reason.contains("hostile rule panics on event bad-1"),
        "{reason}"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_award_applied_while_running_takes_effect_without_restart() {
    let mut p = Pipeline::start(PHOTOS_AWARD, &["photos"]).await;
    p.send(&event(
        "e-1",
        "photos",
        "u-6",
        Some(("photo-1", "active")),
        1,
        json!({}),
    ))
    .await;
    p.settle("photos", "u-6").await;
    let fan = r#"{"id": "photo-fan", "title": "Photo fan",
      "objectives": [{"id": "photos",
        "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
        "rule": {"name": "CountRule", "config": {"counter": "count"}},
        "progress_counter": "count"}],
      "strategy": {"goal": 2, "strategy": [{"objective_id": "photos"}]}}"#;
    let mut store = p.db.store().await;
    laurel::definitions::apply(&mut store, &p.registry, fan)
        .await
        .unwrap();
    // The next events see it (within the catalog's reload).
    p.wait_until("photo-fan counts", || async {
        p.send(&event(
            &format!("probe-{}", rand_id()),
            "photos",
            "u-6",
            Some(("photo-2", "active")),
            2,
            json!({}),
        ))
        .await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        p.objective("u-6", "photo-fan", "photos").await == counters(&[("count", 1)])
    })
    .await;
    p.stop().await;
}

fn rand_id() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_source_waits_and_resumes_where_it_left_off() {
    let mut p = Pipeline::start(PHOTOS_AWARD, &["photos"]).await;
    p.send(&event(
        "e-1",
        "photos",
        "u-7",
        Some(("photo-1", "active")),
        1,
        json!({}),
    ))
    .await;
    p.settle("photos", "u-7").await;
    let store = p.db.store().await;
    assert!(store.set_source_paused("photos", true).await.unwrap());
    // Honoured within a second; give it that.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    p.send(&event(
        "e-2",
        "photos",
        "u-7",
        Some(("photo-2", "active")),
        2,
        json!({}),
    ))
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        p.objective("u-7", "photographer", "photo").await,
        counters(&[("approved", 1)]),
        "nothing while paused"
    );
    assert!(store.set_source_paused("photos", false).await.unwrap());
    p.settle("photos", "u-7").await;
    assert_eq!(
        p.objective("u-7", "photographer", "photo").await,
        counters(&[("approved", 2)])
    );
    p.stop().await;
}
