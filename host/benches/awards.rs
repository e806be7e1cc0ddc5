//! Benchmark: the awards worker's cost for the same 10,000 changed
//! user_objective rows when the tables hold N rows and then 10 x N (the
//! original design scanned, so its cost grew with the table; change markers
//! should keep it flat), and the changes/s one worker sustains.
//!
//! Each timed round changes 10,000 random rows of the first N rows; round
//! i changes the same rows at N and at 10 x N, so the two sizes differ only
//! in the rows that did not change. A third measure, at 10 x N, spreads
//! the changes over all the rows: more distinct pages per round, so it also
//! shows what a larger working set costs (PostgreSQL's buffers, the OS page
//! cache), which no change detection can avoid.
//!
//! cargo bench -p laurel --bench awards        (LAUREL_BENCH_ROWS=1000000)
//!
//! Uses the database `laurel_bench_awards` on 127.0.0.1 (dropped and made
//! anew each run; LAUREL_BENCH_SERVER_URL to change the server). Filling
//! 10 M rows takes a few minutes here.

use std::time::Instant;

use laurel::awards::{AwardsSettings, AwardsWorker};
use laurel::catalog::Catalog;
use laurel::registry::Registry;
use laurel::runtime::{Limits, Runtime};
use laurel::store::Store;
use serde_json::json;

#[path = "support/row.rs"]
mod row;
use row::row;

const AWARDS: i64 = 10;
const CHANGES: usize = 10_000;
const ROUNDS: usize = 5;

fn awards() -> String {
    let awards: Vec<_> = (0..AWARDS)
        .map(|a| {
            json!({
                "id": format!("award-{a}"), "title": format!("Award {a}"),
                "objectives": [{"id": "photo",
                    "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
                    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved"}}},
                    "progress_counter": "approved"}],
                "strategy": {"goal": 50, "strategy": [{"objective_id": "photo"}]}
            })
        })
        .collect();
    serde_json::Value::Array(awards).to_string()
}

async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// Users `from..to` get a counter row per award, and the award state
/// computed from it (as if the worker had run), without change markers.
async fn fill(client: &tokio_postgres::Client, from: i64, to: i64) {
    let started = Instant::now();
    client
        .batch_execute("SET session_replication_role = replica")
        .await
        .unwrap();
    for chunk in (from..to).step_by(100_000) {
        let end = (chunk + 100_000).min(to);
        client
            .execute(
                "INSERT INTO user_objective (user_id, award_id, objective_id, counters, version)
                 SELECT 'user-' || lpad(u::text, 9, '0'), 'award-' || a, 'photo',
                        jsonb_build_object('approved', (u * 7 + a) % 40), nextval('laurel_version')
                 FROM generate_series($1::bigint, $2::bigint - 1) u, generate_series(0, $3::bigint - 1) a",
                &[&chunk, &end, &AWARDS],
            )
            .await
            .unwrap();
    }
    client
        .execute(
            "INSERT INTO user_achieve (user_id, award_id, award_version, progress, goal, remaining, started,
                                       completed, version)
             SELECT user_id, award_id, 1, (counters->>'approved')::float8, 50, 50 - (counters->>'approved')::float8,
                    (counters->>'approved')::int > 0, false, version
             FROM user_objective WHERE user_id >= 'user-' || lpad(($1::bigint)::text, 9, '0')",
            &[&from],
        )
        .await
        .unwrap();
    // One statement per call: a multi-statement string is one transaction,
    // and VACUUM refuses to run in one.
    for statement in [
        "SET session_replication_role = origin",
        "VACUUM ANALYZE user_objective",
        "VACUUM ANALYZE user_achieve",
    ] {
        client.batch_execute(statement).await.unwrap();
    }
    eprintln!(
        "filled users {from}..{to} ({} rows) in {:.0} s",
        (to - from) * AWARDS,
        started.elapsed().as_secs_f64()
    );
}

/// A small deterministic generator.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Per round: changes `CHANGES` random rows of users `0..users` (one
/// transaction, as ingest would), then times the worker computing them.
/// The same seed changes the same rows. Returns the median seconds per
/// round and the mean WAL the worker wrote per round (bytes).
async fn measure(
    client: &tokio_postgres::Client,
    worker: &mut AwardsWorker,
    users: i64,
    seed: u64,
) -> (f64, f64) {
    // Each measure starts from a checkpoint: the first change to a page
    // after one writes the whole page to the WAL, and when the fill's last
    // checkpoint happened would otherwise decide how many of those a
    // measure pays for.
    client.batch_execute("CHECKPOINT").await.unwrap();
    let mut rng = seed;
    let mut times = Vec::new();
    let mut wal = 0.0;
    for _ in 0..ROUNDS {
        let mut keys = std::collections::BTreeSet::new();
        while keys.len() < CHANGES {
            let user = xorshift(&mut rng) % users as u64;
            let award = xorshift(&mut rng) % AWARDS as u64;
            keys.insert((format!("user-{user:09}"), format!("award-{award}")));
        }
        let (u, a): (Vec<String>, Vec<String>) = keys.into_iter().unzip();
        client
            .execute(
                "UPDATE user_objective uo SET counters = jsonb_build_object('approved', (uo.counters->>'approved')::int + 1),
                     version = nextval('laurel_version')
                 FROM unnest($1::text[], $2::text[]) AS k(u, a)
                 WHERE uo.user_id = k.u AND uo.award_id = k.a AND uo.objective_id = 'photo'",
                &[&u, &a],
            )
            .await
            .unwrap();
        let before = wal_position(client).await;
        let started = Instant::now();
        let outcome = worker.drain().await.unwrap();
        times.push(started.elapsed().as_secs_f64());
        wal += (wal_position(client).await - before) / ROUNDS as f64;
        assert_eq!(outcome.claimed, CHANGES, "every change found, once");
    }
    let rounds: Vec<String> = times.iter().map(|t| format!("{t:.3}")).collect();
    eprintln!("rounds (s): {}", rounds.join(" "));
    (median(times), wal)
}

/// Where the server's write-ahead log ends, in bytes (nothing else writes
/// during a timed drain, so the difference is the worker's).
async fn wal_position(client: &tokio_postgres::Client) -> f64 {
    let row = client
        .query_one("SELECT (pg_current_wal_insert_lsn() - '0/0')::float8", &[])
        .await
        .unwrap();
    row.get(0)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn main() {
    let rows: i64 = std::env::var("LAUREL_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let server = std::env::var("LAUREL_BENCH_SERVER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let url = format!("{server}/laurel_bench_awards");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let admin = sql(&format!("{server}/postgres")).await;
        admin
            .batch_execute("DROP DATABASE IF EXISTS laurel_bench_awards WITH (FORCE)")
            .await
            .unwrap();
        let mut store = Store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        // A/B knob: schema or settings changes to try, e.g.
        // LAUREL_BENCH_SQL="ALTER TABLE user_achieve SET (fillfactor = 85)".
        if let Ok(extra) = std::env::var("LAUREL_BENCH_SQL") {
            sql(&url).await.batch_execute(&extra).await.unwrap();
            println!("(extra SQL: {extra})");
        }
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        laurel::library::register(&mut store, &runtime)
            .await
            .unwrap();
        let registry = Registry::start(&url, runtime).await.unwrap();
        laurel::definitions::apply(&mut store, &registry, &awards())
            .await
            .unwrap();
        let client = sql(&url).await;
        // No backfills in the measurement: the states are filled in.
        client
            .batch_execute("UPDATE award_backfills SET finished_at = now()")
            .await
            .unwrap();
        let catalog = Catalog::start(&url).await.unwrap();
        let mut worker = AwardsWorker::new(&url, registry, catalog, AwardsSettings::default())
            .await
            .unwrap();
        let small_users = rows / AWARDS;
        fill(&client, 0, small_users).await;
        worker.drain().await.unwrap();
        let (small, small_wal) = measure(&client, &mut worker, small_users, 0x5eed).await;
        fill(&client, small_users, small_users * 10).await;
        let (large, large_wal) = measure(&client, &mut worker, small_users, 0x5eed).await;
        let (spread, spread_wal) = measure(&client, &mut worker, small_users * 10, 0xfeed).await;
        println!(
            "Awards worker, {CHANGES} changed rows, median of {ROUNDS} (batch {}):",
            AwardsSettings::default().batch
        );
        let line = |label: &str, rows: i64, seconds: f64, wal: f64| {
            println!(
                "  {:>10} user_objective rows, {label}: {seconds:.3} s per {CHANGES} changes ({:.0} changes/s, {:.1} MB of WAL)",
                rows,
                CHANGES as f64 / seconds,
                wal / 1e6
            )
        };
        line("changes in the first N", rows, small, small_wal);
        line("the same changes", rows * 10, large, large_wal);
        line("changes spread over all", rows * 10, spread, spread_wal);
        println!(
            "Ratio (10x rows / 1x rows, the same changes): {:.2}",
            large / small
        );
        println!(
            "Ratio (10x rows, changes spread over all / 1x rows): {:.2}",
            spread / small
        );
        let seconds = |s: f64| format!("{s:.3} s per {CHANGES} changes");
        row(
            "awards",
            &format!("awards worker over {} user_objective rows, the same changes (baseline: over {rows} rows)", rows * 10),
            &seconds(large),
            &seconds(small),
            &format!("{:.2}", large / small),
            "<= 1.2",
        );
        row(
            "awards",
            &format!("the same over {} rows, the changes spread over all of them (baseline: over {rows} rows)", rows * 10),
            &seconds(spread),
            &seconds(small),
            &format!("{:.2}", spread / small),
            "",
        );
    });
}
