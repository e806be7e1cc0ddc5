//! A shadow candidate diffed against the live version on real events
//! (ingest from the broker into PostgreSQL, then `laurel functions diff`
//! with the built binary): it names exactly the users whose counters and
//! progress would change, computed here from the events alone, and
//! nothing changes live until the candidate is promoted.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::{Value, json};

use crate::pipeline_support::{Pipeline, event};
use crate::support;

/// Reviews rated at least 4 by a gate the candidate makes real: the live
/// `Gate` lets every review through, the candidate (FieldFilter) only those
/// with `min`.
const AWARDS: &str = r#"[{"id": "critic", "title": "Critic",
  "objectives": [{"id": "reviews",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["reviews"]}},
                {"name": "EventTypeFilter", "config": {"types": ["reviews.changed"]}},
                {"name": "Gate", "config": {"field": "/rating", "min": 4}}],
    "rule": {"name": "CountRule", "config": {"counter": "count"}},
    "progress_counter": "count"}],
  "strategy": {"goal": 3, "strategy": [{"objective_id": "reviews"}]}}]"#;

fn laurel(p: &Pipeline) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_laurel"));
    command
        .env("LAUREL_DATABASE_URL", &p.db.url)
        .env("LAUREL_KAFKA_BROKERS", p.broker.bootstrap_servers())
        .env("LAUREL_LOG", "warn");
    command
}

fn users(value: &Value) -> BTreeSet<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_filter_diff_names_exactly_the_users_it_would_change_and_nothing_moves_until_promoted()
 {
    let accept = support::guest_bytes("accept_all_filter");
    let mut p = Pipeline::start_with_functions(AWARDS, &["reviews"], &[("Gate", accept)]).await;
    let ratings: [(&str, &[i64]); 6] = [
        ("u-1", &[5, 5, 5]),
        ("u-2", &[5, 2, 5]),
        ("u-3", &[1]),
        ("u-4", &[4, 4]),
        ("u-5", &[3, 3, 3, 5]),
        ("u-6", &[2, 1]),
    ];
    let mut tick = 0;
    for (user, list) in ratings {
        for (n, rating) in list.iter().enumerate() {
            tick += 1;
            let content = format!("{user}-review-{n}");
            p.send(&event(
                &format!("e-{user}-{n}"),
                "reviews",
                user,
                Some((&content, "active")),
                tick,
                json!({"rating": rating}),
            ))
            .await;
        }
        p.settle("reviews", user).await;
    }
    for (user, list) in ratings {
        let counters = p.objective(user, "critic", "reviews").await;
        assert_eq!(
            counters.get("count").copied(),
            Some(list.len() as i64),
            "{user}"
        );
    }

    // The same change as an award definition, dry run: the gate becomes
    // FieldFilter in the award itself; and a new award, "fan", that two
    // reviews of any rating complete. Nothing is written.
    let dir = std::env::temp_dir().join(format!("laurel-dry-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("awards.json");
    let changed = AWARDS.replace(r#""name": "Gate""#, r#""name": "FieldFilter""#);
    let mut definitions: Vec<Value> = serde_json::from_str(&changed).unwrap();
    definitions.push(json!({"id": "fan", "title": "Fan",
        "objectives": [{"id": "reviews",
          "filters": [{"name": "SourceFilter", "config": {"sources": ["reviews"]}},
                      {"name": "EventTypeFilter", "config": {"types": ["reviews.changed"]}}],
          "rule": {"name": "CountRule", "config": {"counter": "count"}},
          "progress_counter": "count"}],
        "strategy": {"goal": 2, "strategy": [{"objective_id": "reviews"}]}}));
    std::fs::write(&file, Value::Array(definitions).to_string()).unwrap();
    let output = laurel(&p)
        .args(["awards", "apply", "--dry-run", "--json"])
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let dry: Value = serde_json::from_str(&stdout).unwrap();
    let critic = &dry["awards"][0];
    assert_eq!(critic["award_id"], "critic", "{dry}");
    let fan = &dry["awards"][1];
    assert_eq!(fan["award_id"], "fan", "{dry}");
    let two_or_more: BTreeSet<String> = ratings
        .iter()
        .filter(|(_, l)| l.len() >= 2)
        .map(|(u, _)| u.to_string())
        .collect();
    assert_eq!(users(&fan["would_complete"]), two_or_more, "{dry}");
    let awards = p.db.store().await.awards().await.unwrap();
    assert_eq!(
        awards
            .iter()
            .map(|a| (a.id.as_str(), a.version))
            .filter(|(id, _)| *id != "test-markers")
            .collect::<Vec<_>>(),
        vec![("critic", 1)],
        "a dry run writes nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);

    // The candidate: the built-in FieldFilter, pushed as Gate's shadow.
    let mut store = p.db.store().await;
    let field_filter = laurel::library::builtin("FieldFilter").unwrap().bytes;
    laurel::definitions::push_shadow(
        &mut store,
        &support::runtime(),
        "Gate",
        laurel::definitions::Pushed::of(field_filter),
    )
    .await
    .unwrap();

    // What the events alone say: counted live all, with the candidate only
    // ratings of 4 or more; the goal is 3.
    let mut counters_change = BTreeSet::new();
    let mut progress_change = BTreeSet::new();
    let mut lose = BTreeSet::new();
    for (user, list) in ratings {
        let live = list.len() as i64;
        let candidate = list.iter().filter(|r| **r >= 4).count() as i64;
        if live != candidate {
            counters_change.insert(user.to_string());
        }
        if live.min(3) != candidate.min(3) {
            progress_change.insert(user.to_string());
        }
        if live >= 3 && candidate < 3 {
            lose.insert(user.to_string());
        }
    }
    assert_eq!(lose.len(), 2, "the case covers losing a completion");
    assert_eq!(users(&critic["counters_changed"]), counters_change, "{dry}");
    assert_eq!(users(&critic["progress_changed"]), progress_change, "{dry}");
    assert_eq!(users(&critic["would_lose_completion"]), lose, "{dry}");

    let output = laurel(&p)
        .args(["functions", "diff", "Gate", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let diff: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (&diff["live_version"], &diff["candidate_version"]),
        (&json!(1), &json!(2))
    );
    let critic = &diff["awards"][0];
    assert_eq!(critic["award_id"], "critic", "{diff}");
    assert_eq!(diff["awards"].as_array().unwrap().len(), 1, "{diff}");
    assert_eq!(
        users(&critic["counters_changed"]),
        counters_change,
        "{diff}"
    );
    assert_eq!(
        users(&critic["progress_changed"]),
        progress_change,
        "{diff}"
    );
    assert_eq!(users(&critic["would_lose_completion"]), lose, "{diff}");
    assert_eq!(users(&critic["would_complete"]), BTreeSet::new(), "{diff}");
    let low_ratings: usize = ratings
        .iter()
        .map(|(_, l)| l.iter().filter(|r| **r < 4).count())
        .sum();
    assert_eq!(critic["events_changed"], json!(low_ratings), "{diff}");
    let example = &critic["examples"][0];
    assert_eq!(example["live"], "rule CountRule counts count 1", "{diff}");
    assert_eq!(example["candidate"], "excluded by filter Gate", "{diff}");

    // The table says the same.
    let output = laurel(&p)
        .args(["functions", "diff", "Gate"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        table.contains("Gate v1 (live) -> v2 (candidate)"),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "would lose a completion: {}",
            lose.iter().cloned().collect::<Vec<_>>().join(", ")
        )),
        "{table}"
    );

    // With one message per partition from Kafka, the stored items (each
    // review's last event) still name every user: u-2's low rating is
    // never the last message of its partition (its next review follows).
    let narrow = |items: &str| {
        let output = laurel(&p)
            .args(["functions", "diff", "Gate", "--json", "--events", "1"])
            .args(["--items", items])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let stored = narrow("100000");
    let reviews: usize = ratings.iter().map(|(_, l)| l.len()).sum();
    assert_eq!(stored["items"], json!(reviews), "{stored}");
    assert!(stored["events"].as_u64().unwrap() <= 4, "{stored}");
    let critic = &stored["awards"][0];
    assert_eq!(
        users(&critic["counters_changed"]),
        counters_change,
        "{stored}"
    );
    assert_eq!(users(&critic["would_lose_completion"]), lose, "{stored}");
    assert_eq!(critic["events_changed"], json!(low_ratings), "{stored}");
    // Kafka's window alone misses u-2.
    let window = narrow("0");
    assert_eq!(window["items"], json!(0), "{window}");
    assert!(
        !users(&window["awards"][0]["counters_changed"]).contains("u-2"),
        "{window}"
    );
    // A limit that cuts leaves whole users out, and says so.
    let cut = narrow("4");
    assert_eq!(cut["items"], json!(3), "u-1's three reviews only: {cut}");
    assert!(
        cut["note"].as_str().unwrap().contains("only the first 3"),
        "{cut}"
    );

    // Nothing moved live: a new low rating still counts.
    p.send(&event(
        "e-u-7-0",
        "reviews",
        "u-7",
        Some(("u-7-review-0", "active")),
        100,
        json!({"rating": 1}),
    ))
    .await;
    p.settle("reviews", "u-7").await;
    assert_eq!(
        p.objective("u-7", "critic", "reviews").await.get("count"),
        Some(&1)
    );

    // Promoted: the next low rating does not.
    let output = laurel(&p)
        .args(["functions", "promote", "Gate", "2"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Every process follows the promotion (LISTEN/NOTIFY): a low rating
    // sent after it stops counting, once ingest's registry has it.
    let mut stopped_counting = false;
    for n in 0..40 {
        let user = format!("u-probe-{n}");
        p.send(&event(
            &format!("e-{user}"),
            "reviews",
            &user,
            Some((&format!("{user}-review"), "active")),
            101,
            json!({"rating": 1}),
        ))
        .await;
        p.settle("reviews", &user).await;
        let count = p
            .objective(&user, "critic", "reviews")
            .await
            .get("count")
            .copied();
        if count.unwrap_or(0) == 0 {
            stopped_counting = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(stopped_counting, "the promoted candidate never served");

    // With nothing above the live version, there is nothing to diff.
    let output = laurel(&p)
        .args(["functions", "diff", "Gate"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("Gate has no version newer than the live v2: push one with --shadow"),
        "{stderr}"
    );
    p.stop().await;
}
