//! Ingest's per-user mutual exclusion, on the store: batches that touch one
//! user apply one after the other (two sources adding to one objective at
//! once lose nothing), and a batch of any number of users applies (the
//! locks must not fill PostgreSQL's shared lock table).

use std::sync::Arc;

use chrono::Utc;
use laurel::store::{Batch, Effect, Outcome, Store};
use serde_json::json;

use crate::support::TestDb;

/// One event adding 1 to counter `n` of objective `a/o` for `user`.
fn adding_one(
    index: usize,
    event_id: String,
    user: &str,
    functions: &Arc<serde_json::Value>,
) -> Outcome {
    Outcome {
        index,
        event_id,
        user_id: user.to_string(),
        award_id: "a".into(),
        objective_id: "o".into(),
        content_id: None,
        occurred_at: Utc::now(),
        effect: Effect::Additive {
            counters: [("n".to_string(), 1)].into(),
        },
        functions: functions.clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sources_adding_to_one_objective_at_once_lose_nothing() {
    let db = TestDb::new().await;
    const USERS: usize = 200;
    const BATCHES: usize = 40;
    let users: Vec<String> = (0..USERS).map(|u| format!("user-{u:04}")).collect();
    let mut tasks = Vec::new();
    for source in ["photos", "reviews"] {
        let mut store: Store = db.store().await;
        let users = users.clone();
        tasks.push(tokio::spawn(async move {
            let functions = Arc::new(json!({}));
            for batch in 0..BATCHES {
                let outcomes: Vec<Outcome> = users
                    .iter()
                    .enumerate()
                    .map(|(i, u)| adding_one(i, format!("{source}-{batch}-{u}"), u, &functions))
                    .collect();
                store
                    .apply_batch(Batch::of_outcomes(source, &outcomes))
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Every user got 1 per batch from each source: a read-modify-write
    // from a stale read would have lost some.
    let rows = db
        .sql()
        .await
        .query(
            "SELECT user_id, (counters->>'n')::bigint FROM user_objective ORDER BY user_id",
            &[],
        )
        .await
        .unwrap();
    let counts: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let expected: Vec<(String, i64)> = users
        .iter()
        .map(|u| (u.clone(), 2 * BATCHES as i64))
        .collect();
    assert_eq!(counts, expected);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_more_users_than_the_lock_table_holds_applies() {
    let db = TestDb::new().await;
    let sql = db.sql().await;
    // The shared lock table's nominal size (6,400 with PostgreSQL's
    // defaults); an advisory lock per user took one slot each.
    let capacity: i64 = sql
        .query_one(
            "SELECT current_setting('max_locks_per_transaction')::bigint
                    * (current_setting('max_connections')::bigint
                       + current_setting('max_prepared_transactions')::bigint)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let users = 3 * capacity as usize;
    let functions = Arc::new(json!({}));
    let outcomes: Vec<Outcome> = (0..users)
        .map(|u| adding_one(u, format!("e-{u}"), &format!("user-{u:07}"), &functions))
        .collect();
    let mut store = db.store().await;
    let applied = store
        .apply_batch(Batch::of_outcomes("photos", &outcomes))
        .await
        .unwrap();
    assert_eq!(applied.objectives, users);
    let row = sql
        .query_one(
            "SELECT count(*), sum((counters->>'n')::bigint)::bigint FROM user_objective",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (users as i64, users as i64)
    );
    db.drop_database().await;
}
