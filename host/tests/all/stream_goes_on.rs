//! The stream goes on, nothing is lost: hostile input is dead-lettered
//! with its reason and the next good event applies; a failing function
//! holds its own objective's events only, and a replay after the fix
//! brings them there once; redelivery never brings an older state back; a
//! function that sleeps cannot hold its source.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::pipeline_support::{Pipeline, dead_letter_messages};

const AWARDS: &str = r#"[{
  "id": "photographer", "title": "Photographer",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved", "moderation": "on_moderation", "blocked": "blocked"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 5, "strategy": [{"objective_id": "photo"}]}
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

fn trip(id: &str, user: &str, metres: f64) -> Value {
    json!({"id": id, "source": "bss", "type": "navi.trip_finished", "user_id": user, "authorized": true,
           "occurred_at": "2026-12-01T10:00:00Z", "payload": {"distance_m": metres}})
}

fn photo(id: &str, user: &str, content: &str) -> Value {
    json!({"id": id, "source": "photos", "type": "photo.changed", "user_id": user, "authorized": true,
           "content_id": content, "status": "active", "occurred_at": "2026-12-01T10:00:00Z", "payload": {}})
}

/// One hostile message: where it goes, its key and value, and the reason it
/// must be dead-lettered with (a part of it).
struct Hostile {
    source: &'static str,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    reason: &'static str,
}

fn hostile(source: &'static str, event: &Value, reason: &'static str) -> Hostile {
    Hostile {
        source,
        key: event["user_id"].as_str().map(|u| u.as_bytes().to_vec()),
        value: Some(event.to_string().into_bytes()),
        reason,
    }
}

fn with(mut event: Value, field: &str, value: Value) -> Value {
    event[field] = value;
    event
}

fn corpus() -> Vec<Hostile> {
    let pseudo_random: String = (0..3000u32)
        .map(|i| char::from(b'a' + ((i.wrapping_mul(2_654_435_761) >> 7) % 26) as u8))
        .collect();
    let mut deep = json!(1);
    for _ in 0..200 {
        deep = json!([deep]);
    }
    let many: serde_json::Map<String, Value> =
        (0..10_000).map(|i| (format!("f{i}"), json!(i))).collect();
    // About 1 MB: one long key over a long array.
    let long_key = "k".repeat(900_000);
    let mut long_key_array = trip("big-1", "mallory", 1.0);
    long_key_array["payload"] = json!({ long_key: vec![0; 40_000] });
    let mut invalid_utf8 = photo("bad-utf8", "mallory", "p-x").to_string().into_bytes();
    let at = invalid_utf8.windows(3).position(|w| w == b"p-x").unwrap();
    invalid_utf8[at + 1] = 0xff;
    vec![
        hostile(
            "photos",
            &photo("nul-user", "u\u{0}x", "p-1"),
            "`user_id` contains a NUL character",
        ),
        hostile(
            "photos",
            &photo("long-content", "mallory", &pseudo_random),
            "`content_id` is 3000 bytes, over the limit of 512",
        ),
        hostile(
            "bss",
            &long_key_array,
            "payload: its flattened form (JSON pointer and text of every field) is over",
        ),
        hostile(
            "photos",
            &with(
                photo("wrong-type", "mallory", "p-2"),
                "authorized",
                json!("yes"),
            ),
            "malformed event: invalid type: string \"yes\", expected a boolean",
        ),
        hostile(
            "bss",
            &trip("huge-number", "mallory", 1e300),
            "outside the safe range",
        ),
        hostile(
            "bss",
            &with(
                trip("deep", "mallory", 1.0),
                "payload",
                json!({ "d": deep }),
            ),
            "recursion limit exceeded",
        ),
        hostile(
            "bss",
            &with(
                trip("many-fields", "mallory", 1.0),
                "payload",
                Value::Object(many),
            ),
            "more than 4096 fields",
        ),
        Hostile {
            source: "photos",
            key: Some(vec![0xff, 0xfe]),
            value: Some(photo("bad-key", "mallory", "p-3").to_string().into_bytes()),
            reason: "is not the event's user_id `mallory`",
        },
        Hostile {
            source: "photos",
            key: Some(b"mallory".to_vec()),
            value: Some(invalid_utf8),
            reason: "malformed event: invalid unicode code point",
        },
        hostile(
            "photos",
            &with(photo("x", "mallory", "p-4"), "id", json!("")),
            "`id` must not be empty",
        ),
        hostile(
            "bss",
            &with(
                trip("nul-text", "mallory", 1.0),
                "payload",
                json!({"t": "a\u{0}b"}),
            ),
            "payload: a text contains a NUL character",
        ),
        hostile(
            "photos",
            &photo("wrong-source", "mallory", "p-5")
                .to_string()
                .replace("\"photos\"", "\"bss\"")
                .parse()
                .unwrap(),
            "unknown source `bss`: this topic carries source `photos`",
        ),
        Hostile {
            source: "bss",
            key: Some(b"mallory".to_vec()),
            value: Some(b"hello".to_vec()),
            reason: "malformed event: expected value",
        },
        Hostile {
            source: "bss",
            key: Some(b"mallory".to_vec()),
            value: Some(b"[1, 2]".to_vec()),
            reason: "malformed event: invalid type: integer `1`, expected a string",
        },
        Hostile {
            source: "photos",
            key: Some(b"mallory".to_vec()),
            value: None,
            reason: "empty message: no value",
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_corpus_is_dead_lettered_with_reasons_and_every_good_event_applies() {
    let mut p = Pipeline::start(AWARDS, &["photos", "bss"]).await;
    let corpus = corpus();
    let (mut good_photos, mut good_trips) = (0, 0);
    let mut expected: BTreeMap<&str, Vec<&'static str>> = BTreeMap::new();
    for (i, bad) in corpus.iter().enumerate() {
        let topic = format!("events.{}", bad.source);
        match &bad.value {
            Some(value) => p.send_raw(bad.source, bad.key.as_deref(), value).await,
            None => {
                // A tombstone: a key and no value at all.
                p.producer
                    .send(&topic, bad.key.as_deref(), None, None)
                    .await
                    .unwrap();
            }
        }
        expected.entry(bad.source).or_default().push(bad.reason);
        // The next good event of the same source applies.
        if bad.source == "photos" {
            p.send(&photo(&format!("good-{i}"), "good", &format!("g-{i}")))
                .await;
            good_photos += 1;
        } else {
            p.send(&trip(&format!("good-{i}"), "good", 1.0)).await;
            good_trips += 1;
        }
    }
    // A producer that adds a field is read, not refused.
    let mut evolved = trip("evolved-1", "good", 1.0);
    evolved["trace_id"] = json!("4bf92f3577b34da6a3ce929d0e0e4736");
    p.send(&evolved).await;
    good_trips += 1;
    // 1,100 trips of 8.9e15 m: 1,036 fit in a 64-bit counter; the others
    // would overflow it and are dead-lettered, each with the reason.
    for i in 0..1_100 {
        p.send(&trip(&format!("far-{i}"), "rich", 8.9e15)).await;
    }
    for _ in 0..64 {
        expected.entry("bss").or_default().push(
            "award driver, objective navi: counter `metres` would overflow (past a 64-bit integer)",
        );
    }
    p.send(&trip("after-far", "good", 1.0)).await;
    good_trips += 1;
    p.settle("photos", "good").await;
    p.settle("bss", "good").await;
    p.settle("bss", "rich").await;

    assert_eq!(
        p.objective("good", "photographer", "photo").await,
        counters(&[("approved", good_photos)])
    );
    assert_eq!(
        p.objective("good", "driver", "navi").await,
        counters(&[("metres", good_trips)])
    );
    assert_eq!(
        p.objective("rich", "driver", "navi").await,
        counters(&[("metres", 1_036 * 8_900_000_000_000_000)])
    );
    for (source, reasons) in &expected {
        let topic = format!("events.{source}.dead");
        let found = dead_letter_messages(p.broker.bootstrap_servers(), &topic, reasons.len()).await;
        let mut unmatched: Vec<String> = found.iter().map(|(_, r, _)| r.clone()).collect();
        for reason in reasons {
            let at = unmatched
                .iter()
                .position(|found| found.contains(reason))
                .unwrap_or_else(|| {
                    panic!("no dead letter on {topic} says {reason:?}; left: {unmatched:#?}")
                });
            unmatched.remove(at);
        }
        // The 1 MB message is kept whole on the dead-letter topic.
        if *source == "bss" {
            assert!(
                found.iter().any(|(_, _, size)| *size > 900_000),
                "{found:?}"
            );
        }
    }
    // And in the database, for replay, with the message as it came.
    let stored = p.dead_letters().await;
    assert_eq!(
        stored.len(),
        expected.values().map(Vec::len).sum::<usize>(),
        "{stored:#?}"
    );
    assert!(stored.iter().all(|(_, scope, _)| scope.is_none()));
    let sql = p.db.sql().await;
    let nul_reason: String = sql
        .query_one(
            "SELECT reason FROM dead_letters WHERE reason LIKE '%NUL%' AND reason LIKE '%user_id%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        nul_reason,
        "malformed event: `user_id` contains a NUL character (\\u0000)"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_with_equal_timestamps_never_brings_an_older_state_back() {
    let mut p = Pipeline::start(AWARDS, &["photos"]).await;
    let status = |id: &str, content: &str, status: &str| {
        let mut e = photo(id, "u-1", content);
        e["status"] = json!(status);
        e
    };
    // In order, then the older one again.
    p.send(&status("evt-1", "a", "active")).await;
    p.send(&status("evt-2", "a", "blocked")).await;
    p.send(&status("evt-1", "a", "active")).await;
    // The other order: the later in the topic decides, whatever the ids.
    p.send(&status("evt-4", "b", "blocked")).await;
    p.send(&status("evt-3", "b", "active")).await;
    p.settle("photos", "u-1").await;
    assert_eq!(
        p.objective("u-1", "photographer", "photo").await,
        counters(&[("approved", 1), ("blocked", 1)])
    );
    let log = p.log("u-1").await;
    let skipped: Vec<(&str, &str)> = log
        .iter()
        .filter(|(_, outcome, _)| outcome == "skipped")
        .map(|(id, _, reason)| (id.as_deref().unwrap(), reason.as_deref().unwrap()))
        .collect();
    assert_eq!(
        skipped,
        vec![("evt-1", "event already applied")],
        "the earlier event again, at a later offset: already applied"
    );
    p.stop().await;
}

const FRAGILE_AWARDS: &str = r#"[{
  "id": "fragile", "title": "Fragile",
  "objectives": [{"id": "count",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                {"name": "EventTypeFilter", "config": {"types": ["photo.changed", "panic"]}}],
    "rule": {"name": "Hostile", "config": {"counter": "count"}},
    "progress_counter": "count"}],
  "strategy": {"goal": 100, "strategy": [{"objective_id": "count"}]}
}, {
  "id": "steady", "title": "Steady",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                {"name": "EventTypeFilter", "config": {"types": ["photo.changed", "panic"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 100, "strategy": [{"objective_id": "photo"}]}
}, {
  "id": "tally", "title": "Tally",
  "objectives": [{"id": "all",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                {"name": "EventTypeFilter", "config": {"types": ["photo.changed", "panic"]}}],
    "rule": {"name": "CountRule", "config": {"counter": "n"}},
    "progress_counter": "n"}],
  "strategy": {"goal": 100, "strategy": [{"objective_id": "all"}]}
}]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_rule_holds_its_own_events_and_replay_brings_them_once() {
    let mut p = Pipeline::start_with_functions(
        FRAGILE_AWARDS,
        &["photos"],
        &[("Hostile", crate::support::guest_bytes("hostile_function"))],
    )
    .await;
    // Five events that make the rule panic quarantine it (v1).
    for i in 0..5 {
        let mut e = photo(&format!("panic-{i}"), "u-1", &format!("bad-{i}"));
        e["type"] = json!("panic");
        p.send(&e).await;
        p.settle("photos", "u-1").await;
    }
    // Then ordinary photos, which the quarantined version cannot count.
    for i in 0..10 {
        p.send(&photo(&format!("ok-{i}"), "u-1", &format!("ok-{i}")))
            .await;
    }
    p.settle("photos", "u-1").await;
    p.wait_until("Hostile v1 quarantined in the database", || async {
        let sql = p.db.sql().await;
        let quarantine: Option<String> = sql
            .query_one(
                "SELECT quarantine_reason FROM functions WHERE name = 'Hostile' AND version = 1",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        quarantine.is_some()
    })
    .await;
    // The other awards counted everything; the fragile one nothing.
    assert_eq!(
        p.objective("u-1", "steady", "photo").await,
        counters(&[("approved", 15)])
    );
    assert_eq!(
        p.objective("u-1", "tally", "all").await,
        counters(&[("n", 15)])
    );
    assert_eq!(p.objective("u-1", "fragile", "count").await, counters(&[]));
    let held = p.dead_letters().await;
    assert_eq!(held.len(), 15, "{held:#?}");
    assert!(
        held.iter()
            .all(|(_, scope, _)| scope.as_deref() == Some("fragile/count"))
    );
    assert!(held[9].2.contains("is quarantined"), "{}", held[9].2);
    let store = p.db.store().await;
    let objectives = store.held_objectives("fragile").await.unwrap();
    assert_eq!(
        (objectives.len(), objectives[0].events),
        (1, 15),
        "shown on the award"
    );

    // The fix: a version that counts every photo (CountRule's component
    // under the same name), then a replay.
    let mut store = p.db.store().await;
    laurel::registry::push(
        &mut store,
        &crate::support::runtime(),
        "Hostile",
        laurel::library::builtin("CountRule").unwrap().bytes,
        None,
    )
    .await
    .unwrap();
    let catalog = laurel::catalog::Catalog::start(&p.db.url).await.unwrap();
    let registry = laurel::registry::Registry::start(&p.db.url, crate::support::runtime())
        .await
        .unwrap();
    let report = laurel::replay::replay(
        &mut store,
        &registry,
        &catalog,
        "photos",
        &Default::default(),
        1 << 20,
    )
    .await
    .unwrap();
    assert_eq!(
        (report.replayed, report.still_failing, report.taken),
        (15, 0, 0),
        "{report:?}"
    );
    assert_eq!(
        p.objective("u-1", "fragile", "count").await,
        counters(&[("count", 15)])
    );
    // Nowhere else twice.
    assert_eq!(
        p.objective("u-1", "steady", "photo").await,
        counters(&[("approved", 15)])
    );
    assert_eq!(
        p.objective("u-1", "tally", "all").await,
        counters(&[("n", 15)])
    );
    assert!(p.dead_letters().await.is_empty());
    // A second replay finds nothing to do.
    let again = laurel::replay::replay(
        &mut store,
        &registry,
        &catalog,
        "photos",
        &Default::default(),
        1 << 20,
    )
    .await
    .unwrap();
    assert_eq!(again.replayed, 0);
    assert_eq!(
        p.objective("u-1", "fragile", "count").await,
        counters(&[("count", 15)])
    );
    // And the stream goes on for the fixed objective.
    p.send(&photo("later", "u-1", "later")).await;
    p.settle("photos", "u-1").await;
    assert_eq!(
        p.objective("u-1", "fragile", "count").await,
        counters(&[("count", 16)])
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_objective_that_cannot_be_bound_holds_its_events_until_the_fix_is_replayed() {
    let mut p = Pipeline::start(AWARDS, &["bss"]).await;
    p.send(&trip("t-1", "u-1", 100.0)).await;
    p.settle("bss", "u-1").await;
    // A new version of the rule that refuses the award's config, pushed
    // past the check (--force).
    let mut store = p.db.store().await;
    let runtime = crate::support::runtime();
    laurel::registry::push(
        &mut store,
        &runtime,
        "SumFieldRule",
        laurel::library::builtin("CountRule").unwrap().bytes,
        None,
    )
    .await
    .unwrap();
    // Ingest takes the version at its next batch once its registry has
    // it: probe until an event is held.
    let registry = laurel::registry::Registry::start(&p.db.url, runtime)
        .await
        .unwrap();
    let mut probes = 0;
    while p.dead_letters().await.is_empty() {
        probes += 1;
        assert!(probes < 200, "the new version never took over");
        p.send(&trip(&format!("probe-{probes}"), "u-1", 1.0)).await;
        p.settle("bss", "u-1").await;
    }
    let probes_held = p.dead_letters().await.len();
    p.send(&trip("t-2", "u-1", 200.0)).await;
    p.send(&trip("t-3", "u-1", 300.0)).await;
    p.settle("bss", "u-1").await;
    let held = p.dead_letters().await;
    assert_eq!(
        held[probes_held..]
            .iter()
            .map(|(id, scope, _)| (id.clone().unwrap(), scope.clone().unwrap()))
            .collect::<Vec<_>>(),
        vec![
            ("t-2".to_string(), "driver/navi".to_string()),
            ("t-3".to_string(), "driver/navi".to_string())
        ]
    );
    assert!(
        held[0].2.starts_with("award driver, objective navi: ")
            && held[0].2.contains("SumFieldRule"),
        "{}",
        held[0].2
    );
    let applied_probes = (probes - probes_held) as i64;
    assert_eq!(
        p.objective("u-1", "driver", "navi").await,
        counters(&[("metres", 100 + applied_probes)])
    );
    // The fix: the real SumFieldRule again, as a new version; then replay.
    let sum_field = laurel::library::builtin("SumFieldRule")
        .unwrap()
        .bytes
        .to_vec();
    let mut fixed = sum_field.clone();
    // The same component with a custom section: a new version.
    fixed.extend_from_slice(&[0, 5, 3, b'f', b'i', b'x', 1]);
    laurel::registry::push(
        &mut store,
        &crate::support::runtime(),
        "SumFieldRule",
        &fixed,
        None,
    )
    .await
    .unwrap();
    let catalog = laurel::catalog::Catalog::start(&p.db.url).await.unwrap();
    let wait = std::time::Instant::now();
    while registry.get("SumFieldRule").map(|f| f.version) != Some(3) {
        assert!(wait.elapsed() < std::time::Duration::from_secs(30));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let report = laurel::replay::replay(
        &mut store,
        &registry,
        &catalog,
        "bss",
        &Default::default(),
        1 << 20,
    )
    .await
    .unwrap();
    assert_eq!(
        (report.replayed, report.still_failing),
        (probes_held + 2, 0),
        "{report:?}"
    );
    assert_eq!(
        p.objective("u-1", "driver", "navi").await,
        counters(&[("metres", 600 + probes as i64)])
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_postgres_refuses_for_one_event_applies_the_rest_and_keeps_that_event() {
    use laurel::store::{Batch, Effect, Message, Outcome};
    let db = crate::support::TestDb::new().await;
    let mut store = db.store().await;
    let functions = std::sync::Arc::new(json!({"CountRule": 1}));
    // Event 37's user id holds a NUL: the checks before the database refuse
    // it; this is the net under them, for whatever they do not foresee.
    let users: Vec<String> = (0..100)
        .map(|i| {
            if i == 37 {
                "u\u{0}x".to_string()
            } else {
                format!("u-{i}")
            }
        })
        .collect();
    let outcomes: Vec<Outcome> = (0..100)
        .map(|i| Outcome {
            index: i,
            event_id: format!("e-{i}"),
            user_id: users[i].clone(),
            award_id: "a".into(),
            objective_id: "o".into(),
            content_id: None,
            occurred_at: chrono::Utc::now(),
            effect: Effect::Additive {
                counters: [("n".to_string(), 1)].into(),
            },
            functions: functions.clone(),
        })
        .collect();
    let values: Vec<Vec<u8>> = users
        .iter()
        .map(|u| json!({"user_id": u}).to_string().into_bytes())
        .collect();
    let messages: Vec<Message<'_>> = (0..100)
        .map(|i| Message {
            topic: "events.bss",
            partition: 0,
            offset: i as i64,
            key: Some(users[i].as_bytes()),
            value: Some(&values[i]),
            place: None,
        })
        .collect();
    let batch = Batch {
        messages: &messages,
        ..Batch::of_outcomes("bss", &outcomes)
    };
    let (applied, refused) = store.apply_isolating(&batch).await.unwrap();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].index, 37);
    assert!(
        refused[0]
            .reason
            .starts_with("PostgreSQL refused the event: database error while ")
            && refused[0].reason.contains("(22021)"),
        "{}",
        refused[0].reason
    );
    assert_eq!(applied.objectives, 99);
    let sql = db.sql().await;
    let counted: i64 = sql
        .query_one("SELECT count(*) FROM user_objective", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(counted, 99);
    // Kept for replay, with the message as it came and a printable id.
    let row = sql
        .query_one("SELECT user_id, \"offset\", value FROM dead_letters", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "u\\u{0}x");
    assert_eq!(row.get::<_, i64>(1), 37);
    assert_eq!(row.get::<_, Vec<u8>>(2), values[37]);
    // Applying the same batch again changes nothing (every id is applied).
    let (again, _) = store.apply_isolating(&batch).await.unwrap();
    assert_eq!(again.objectives, 0);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_shown_and_replayed_through_the_admin_api() {
    let mut p = Pipeline::start_with_functions(
        FRAGILE_AWARDS,
        &["photos"],
        &[("Hostile", crate::support::guest_bytes("hostile_function"))],
    )
    .await;
    let server = crate::api::Server::start(
        &p.db.url,
        p.registry.clone(),
        Some(p.broker.bootstrap_servers()),
    )
    .await;
    for i in 0..3 {
        let mut e = photo(&format!("panic-{i}"), "u-1", &format!("bad-{i}"));
        e["type"] = json!("panic");
        p.send(&e).await;
    }
    p.send_raw("photos", Some(b"u-1"), b"{broken").await;
    p.settle("photos", "u-1").await;

    let award = server.admin("GET", "/awards/fragile", None).await;
    assert_eq!(award.status, 200);
    let held = &award.body["held"][0];
    assert_eq!(held["objective_id"], "count");
    assert_eq!(held["held_events"], 3);
    assert!(
        held["last_reason"]
            .as_str()
            .unwrap()
            .contains("hostile rule panics on event panic-2"),
        "{held}"
    );
    let listed = server
        .admin("GET", "/sources/photos/dead-letters?limit=10", None)
        .await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let letters = listed.body["dead_letters"].as_array().unwrap();
    assert_eq!(letters.len(), 4);
    // Newest first: the malformed message, whole.
    assert_eq!(letters[0]["award_id"], Value::Null);
    assert_eq!(letters[0]["value"], "{broken");
    assert!(
        letters[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("malformed event: ")
    );
    assert_eq!(letters[1]["event_id"], "panic-2");
    assert_eq!(letters[1]["objective_id"], "count");
    let metrics = server.text("/metrics").await;
    assert!(
        metrics.contains(
            "laurel_events_held_total{source=\"photos\",award=\"fragile\",objective=\"count\"}"
        ),
        "{metrics}"
    );

    // The fix, pushed through the API; replayed through the API.
    let fixed = laurel::library::builtin("CountRule")
        .unwrap()
        .bytes
        .to_vec();
    let pushed = server
        .call(
            "PUT",
            "/admin/v1/functions/Hostile",
            Some(crate::api::ADMIN),
            Some(("application/wasm", fixed)),
        )
        .await;
    assert_eq!(pushed.status, 201, "{}", pushed.body);
    p.wait_until("the server's registry has Hostile v2", || async {
        p.registry.get("Hostile").map(|f| f.version) == Some(2)
    })
    .await;
    let bad = server
        .admin(
            "POST",
            "/sources/photos/dead-letters/replay",
            Some(json!({"since": "yesterday"})),
        )
        .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    let unknown = server
        .admin("POST", "/sources/nowhere/dead-letters/replay", None)
        .await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let report = server
        .admin(
            "POST",
            "/sources/photos/dead-letters/replay",
            Some(json!({"reason": "hostile rule panics"})),
        )
        .await;
    assert_eq!(report.status, 200, "{}", report.body);
    assert_eq!(report.body["replayed"], 3, "{}", report.body);
    assert_eq!(report.body["still_failing"], 0, "{}", report.body);
    assert_eq!(
        p.objective("u-1", "fragile", "count").await,
        counters(&[("count", 3)])
    );
    // The malformed message was not selected, and is still there.
    let everything = server
        .admin("POST", "/sources/photos/dead-letters/replay", None)
        .await;
    assert_eq!(
        (
            everything.body["replayed"].clone(),
            everything.body["still_failing"].clone()
        ),
        (json!(0), json!(1)),
        "{}",
        everything.body
    );
    let award = server.admin("GET", "/awards/fragile", None).await;
    assert_eq!(award.body["held"], json!([]));
    drop(server);
    p.stop().await;
}

const SLEEPY_AWARDS: &str = r#"[{
  "id": "sleepy-filter", "title": "Sleepy filter",
  "objectives": [{"id": "count",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                {"name": "EventTypeFilter", "config": {"types": ["photo.changed", "sleep"]}},
                {"name": "HostileFilter", "config": {}}],
    "rule": {"name": "CountRule", "config": {"counter": "n"}},
    "progress_counter": "n"}],
  "strategy": {"goal": 100, "strategy": [{"objective_id": "count"}]}
}, {
  "id": "sleepy-rule", "title": "Sleepy rule",
  "objectives": [{"id": "count",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                {"name": "EventTypeFilter", "config": {"types": ["photo.changed", "sleep"]}}],
    "rule": {"name": "Hostile", "config": {}},
    "progress_counter": "count"}],
  "strategy": {"goal": 100, "strategy": [{"objective_id": "count"}]}
}, {
  "id": "sleepy-strategy", "title": "Sleepy strategy",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                {"name": "EventTypeFilter", "config": {"types": ["photo.changed", "sleep"]}}],
    "rule": {"name": "CountRule", "config": {"counter": "n"}},
    "progress_counter": "n"}],
  "strategy_function": "HostileStrategy",
  "strategy": {"objective": "photo", "goal": 5, "sleep": true}
}, {
  "id": "steady", "title": "Steady",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 5, "strategy": [{"objective_id": "photo"}]}
}]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_that_sleeps_traps_and_the_other_awards_on_its_source_keep_counting() {
    let mut p = Pipeline::start_with_functions(
        SLEEPY_AWARDS,
        &["photos"],
        &[
            ("Hostile", crate::support::guest_bytes("hostile_function")),
            (
                "HostileFilter",
                crate::support::guest_bytes("hostile_filter"),
            ),
            (
                "HostileStrategy",
                crate::support::guest_bytes("hostile_strategy"),
            ),
        ],
    )
    .await;
    // The consumer is live before the clock starts.
    p.settle("photos", "u-0").await;

    // A filter and a rule that sleep for an hour on this event, then a
    // good photo of another user on the same source.
    let mut sleeper = photo("sleep-1", "u-1", "c-sleep");
    sleeper["type"] = json!("sleep");
    let started = std::time::Instant::now();
    p.send(&sleeper).await;
    p.send(&photo("good-1", "u-2", "c-good")).await;
    p.wait_until("u-2's photo counted by the steady award", || async {
        p.objective("u-2", "steady", "photo").await == counters(&[("approved", 1)])
    })
    .await;
    let elapsed = started.elapsed();
    println!("the good photo counted {elapsed:?} after the sleeping event was sent");
    // A bound, not a benchmark: the sleepers asked for an hour each.
    assert!(
        elapsed < std::time::Duration::from_secs(1),
        "the good photo waited {elapsed:?}"
    );
    p.settle("photos", "u-1").await;
    p.settle("photos", "u-2").await;
    // Each sleeper trapped with its reason and holds its own objective's
    // event; every other objective counted both photos.
    let held = p.dead_letters().await;
    let scopes: Vec<(&str, Option<&str>)> = held
        .iter()
        .map(|(id, scope, _)| (id.as_deref().unwrap_or_default(), scope.as_deref()))
        .collect();
    assert_eq!(
        scopes,
        [
            ("sleep-1", Some("sleepy-filter/count")),
            ("sleep-1", Some("sleepy-rule/count"))
        ],
        "{held:#?}"
    );
    for (_, _, reason) in &held {
        assert!(
            reason.contains("trapped: it tried to sleep or wait on a clock"),
            "{reason}"
        );
    }
    assert_eq!(
        p.objective("u-1", "steady", "photo").await,
        counters(&[("approved", 1)])
    );
    assert_eq!(
        p.objective("u-2", "sleepy-filter", "count").await,
        counters(&[("n", 1)])
    );
    assert_eq!(
        p.objective("u-2", "sleepy-rule", "count").await,
        counters(&[("count", 1)])
    );
    assert_eq!(
        p.objective("u-2", "sleepy-strategy", "photo").await,
        counters(&[("n", 1)])
    );

    // The sleeping strategy: its award is not computed and says why; the
    // steady award's progress is.
    let mut worker = p.awards_worker().await;
    worker.drain().await.unwrap();
    let store = p.db.store().await;
    let achievements = store.user_achievements("u-2").await.unwrap();
    let of = |award: &str| {
        achievements
            .iter()
            .find(|(a, _)| a == award)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| panic!("no {award} for u-2: {achievements:?}"))
    };
    let sleepy = of("sleepy-strategy");
    assert!(
        sleepy
            .error
            .as_deref()
            .is_some_and(|e| e.contains("HostileStrategy v1 trapped: it tried to sleep")),
        "{sleepy:?}"
    );
    let steady = of("steady");
    assert_eq!((steady.progress, steady.goal), (1.0, 5.0), "{steady:?}");
    p.stop().await;
}

const STATUS_AWARDS: &str = r#"[{
  "id": "fragile", "title": "Fragile",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                {"name": "EventTypeFilter", "config": {"types": ["photo.changed", "panic"]}}],
    "rule": {"name": "Hostile", "config": {"counters": {"active": "approved", "blocked": "blocked"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 5, "strategy": [{"objective_id": "photo"}]}
}, {
  "id": "steady", "title": "Steady",
  "objectives": [{"id": "photo",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                {"name": "EventTypeFilter", "config": {"types": ["photo.changed", "panic"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved", "blocked": "blocked"}}},
    "progress_counter": "approved"}],
  "strategy": {"goal": 5, "strategy": [{"objective_id": "photo"}]}
}]"#;

/// A photo approved and then blocked at one `occurred_at`; the approval is
/// held for one objective (its rule panics) and replayed after the fix,
/// after the block: the block stays, though the approval's id is the
/// larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_event_never_overtakes_a_later_one_at_the_same_time() {
    let mut p = Pipeline::start_with_functions(
        STATUS_AWARDS,
        &["photos"],
        &[("Hostile", crate::support::guest_bytes("hostile_function"))],
    )
    .await;
    let mut approved = photo("evt-zzz", "u-1", "photo-1");
    approved["type"] = json!("panic");
    let mut blocked = photo("evt-aaa", "u-1", "photo-1");
    blocked["status"] = json!("blocked");
    p.send(&approved).await;
    p.send(&blocked).await;
    p.settle("photos", "u-1").await;
    // In topic order, whatever the ids: blocked.
    assert_eq!(
        p.objective("u-1", "steady", "photo").await,
        counters(&[("blocked", 1)])
    );
    assert_eq!(
        p.objective("u-1", "fragile", "photo").await,
        counters(&[("count", 1)]),
        "the hostile rule counted the block"
    );
    let held = p.dead_letters().await;
    assert_eq!(
        held.iter()
            .map(|(id, scope, _)| (id.as_deref(), scope.as_deref()))
            .collect::<Vec<_>>(),
        [(Some("evt-zzz"), Some("fragile/photo"))]
    );

    // The fix: ContentStatusRule's component under the rule's name.
    let mut store = p.db.store().await;
    laurel::registry::push(
        &mut store,
        &crate::support::runtime(),
        "Hostile",
        laurel::library::builtin("ContentStatusRule").unwrap().bytes,
        None,
    )
    .await
    .unwrap();
    let catalog = laurel::catalog::Catalog::start(&p.db.url).await.unwrap();
    let registry = laurel::registry::Registry::start(&p.db.url, crate::support::runtime())
        .await
        .unwrap();
    let report = laurel::replay::replay(
        &mut store,
        &registry,
        &catalog,
        "photos",
        &Default::default(),
        1 << 20,
    )
    .await
    .unwrap();
    assert_eq!(
        (report.replayed, report.still_failing, report.changed),
        (1, 0, 0),
        "{report:?}"
    );
    assert_eq!(
        p.objective("u-1", "fragile", "photo").await,
        counters(&[("count", 1)]),
        "the replayed approval came before the block: it changes nothing"
    );
    assert_eq!(
        p.objective("u-1", "steady", "photo").await,
        counters(&[("blocked", 1)])
    );
    assert!(p.dead_letters().await.is_empty());
    p.stop().await;
}
