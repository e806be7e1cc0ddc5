//! The README's first command, as a new user runs it: the built `laurel up
//! --demo` prints what the README shows, serves its API, takes events from
//! the printed broker address, and keeps what it cannot use for replay
//! (`laurel dead-letters list|replay`); SIGTERM stops it cleanly, with no
//! error logged from start to exit.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::TestDb;

fn laurel(db: &TestDb) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_laurel"));
    command
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("LAUREL_DATABASE_URL", &db.url)
        .env("LAUREL_HTTP_ADDR", "127.0.0.1:0")
        .env("LAUREL_LOG", "warn")
        .env_remove("LAUREL_KAFKA_BROKERS")
        .env_remove("LAUREL_ADMIN_TOKEN")
        .env_remove("LAUREL_JWT_SECRET");
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn laurel_up_demo_prints_what_the_readme_shows_and_keeps_running() {
    let db = TestDb::new().await;
    let mut child = laurel(&db)
        .args(["up", "--demo"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(crate::support::KillOnDrop)
        .expect("laurel up --demo starts");
    // Its log, read to the end as it is written (LAUREL_LOG=warn).
    let stderr = child.0.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let stdout = child.0.stdout.take().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut printed = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    while !printed
        .last()
        .is_some_and(|l: &String| l.starts_with("  three-of-either  progress"))
    {
        match tokio::time::timeout_at(deadline, lines.recv()).await {
            Ok(Some(line)) => printed.push(line),
            _ => panic!(
                "laurel up --demo stopped printing; so far:\n{}",
                printed.join("\n")
            ),
        }
    }
    let text = printed.join("\n");
    // The README's quickstart block, line for line where it is exact.
    for expected in [
        "Laurel is up. Functions loaded:",
        "Demo award content-maker v1 applied.",
        "Demo pipeline navigator v1 applied: raw.navigator -> events.bss, only what an award needs.",
        "Demo: published 9 events for u-42 (photos, reviews, bss) and 4 navigator log lines to raw.navigator.",
        "Demo: pipeline navigator kept 1 of its events for awards, dropped 2 no award needs, dead-lettered 1 record to raw.navigator.dead.",
        "Demo: u-42's objective counters:\n  content-maker    navi     {\"metres\":5500}\n  content-maker    photo    {\"approved\":2,\"blocked\":1}\n  content-maker    reviews  {\"count\":1}\n  three-of-either  photos   {\"count\":2}\n  three-of-either  reviews  {\"count\":3}",
        "Demo: u-42's awards:\n  content-maker    progress 8.5 of 15\n  three-of-either  progress 3 of 3 (completed)",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let broker = printed
        .iter()
        .find_map(|l| l.strip_prefix("Kafka broker (in process, librdkafka mock cluster): "))
        .expect("the broker's address is printed")
        .to_string();
    let api = printed
        .iter()
        .find_map(|l| l.strip_prefix("HTTP API at "))
        .and_then(|l| l.split_whitespace().next())
        .expect("the API's address is printed")
        .to_string();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let health = reqwest::get(format!("{api}/healthz")).await.unwrap();
    assert_eq!(health.status(), 200);

    // A producer at the printed address: a malformed event, then a good one.
    let producer = laurel::kafka::producer(&broker).unwrap();
    laurel::kafka::publish(&producer, "events.photos", Some(b"u-42"), b"{not json", &[])
        .await
        .unwrap();
    let good = serde_json::json!({"id": "qs-1", "source": "photos", "type": "photo.status_changed",
        "user_id": "u-42", "authorized": true, "content_id": "photo-qs", "status": "active",
        "occurred_at": "2026-12-02T10:00:00Z", "payload": {}});
    laurel::kafka::publish(
        &producer,
        "events.photos",
        Some(b"u-42"),
        good.to_string().as_bytes(),
        &[],
    )
    .await
    .unwrap();
    let sql = db.sql().await;
    let wait = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let approved: Option<i64> = sql
            .query_opt(
                "SELECT (counters->>'approved')::bigint FROM user_objective
                 WHERE user_id = 'u-42' AND award_id = 'content-maker' AND objective_id = 'photo'",
                &[],
            )
            .await
            .unwrap()
            .and_then(|r| r.get(0));
        if approved == Some(3) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < wait,
            "the good event was not applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let list = laurel(&db)
        .args(["dead-letters", "list", "photos"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "{listed}");
    assert!(
        listed.contains("malformed event: key must be a string at line 1 column 2"),
        "{listed}"
    );
    // A source whose topic nothing has produced to yet: its consumer
    // waits, says so once (info, not an error per poll), and the admin
    // API shows it waiting; the first event creates the topic and counts.
    let admin = printed
        .iter()
        .filter(|l| l.contains("/admin/v1/"))
        .find_map(|l| l.strip_prefix("  curl -H 'Authorization: Bearer "))
        .and_then(|l| l.split('\'').next())
        .expect("the demo's admin token is printed")
        .to_string();
    let added = laurel(&db)
        .args(["sources", "add", "clicks"])
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    let client = reqwest::Client::new();
    let source_state = |name: &'static str| {
        let (client, api, admin) = (client.clone(), api.clone(), admin.clone());
        async move {
            let body = client
                .get(format!("{api}/admin/v1/sources"))
                .bearer_auth(&admin)
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            let listed: serde_json::Value = serde_json::from_slice(&body).unwrap();
            listed["sources"]
                .as_array()
                .unwrap_or_else(|| panic!("GET /admin/v1/sources answered {listed}"))
                .iter()
                .find(|s| s["name"] == name)
                .map(|s| s["state"].as_str().unwrap().to_string())
        }
    };
    let wait = tokio::time::Instant::now() + Duration::from_secs(60);
    while source_state("clicks").await.as_deref() != Some("waiting") {
        assert!(
            tokio::time::Instant::now() < wait,
            "source clicks is not shown waiting for its topic: {:?}",
            source_state("clicks").await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(source_state("photos").await.as_deref(), Some("running"));
    // Long enough for several polls and metadata refreshes of its consumer.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let click = serde_json::json!({"id": "qs-click-1", "source": "clicks", "type": "click",
        "user_id": "u-42", "authorized": true, "occurred_at": "2026-12-02T10:00:00Z", "payload": {}});
    laurel::kafka::publish(
        &producer,
        "events.clicks",
        Some(b"u-42"),
        click.to_string().as_bytes(),
        &[],
    )
    .await
    .unwrap();
    let wait = tokio::time::Instant::now() + Duration::from_secs(60);
    while source_state("clicks").await.as_deref() != Some("running") {
        assert!(
            tokio::time::Instant::now() < wait,
            "source clicks still waits after its topic was made"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let replay = laurel(&db)
        .args(["dead-letters", "replay", "photos"])
        .output()
        .unwrap();
    let replayed = String::from_utf8_lossy(&replay.stdout);
    assert!(replay.status.success(), "{replayed}");
    assert!(
        replayed.starts_with("replayed 0 dead letters of photos; 1 still fail"),
        "{replayed}"
    );
    // Its progress on stderr: plain lines, as it is no terminal.
    let progress = String::from_utf8_lossy(&replay.stderr);
    assert!(
        progress.contains("100.0% 1 of 1 dead letters replayed"),
        "{progress}"
    );

    // No thread of the process polls a producer in rounds: rdkafka's
    // FutureProducer thread busy-waits the end of each, and was the
    // largest CPU user of an idle process.
    let pid = child.0.id();
    let threads: Vec<String> = tasks(pid).into_iter().map(|(name, _)| name).collect();
    assert!(threads.len() > 1, "{threads:?}");
    assert!(
        !threads
            .iter()
            .any(|name| name.starts_with("producer pollin")),
        "{threads:?}"
    );

    // The Wasm epoch tickers sleep while no guest runs: ticking every 2 ms
    // (5 ms for HTTP functions) they woke 500 (200) times a second.
    let wakeups = || -> Vec<(String, u64)> {
        tasks(pid)
            .into_iter()
            .filter(|(name, _)| name.ends_with("-epo"))
            .filter_map(|(name, path)| {
                let status = std::fs::read_to_string(path.join("status")).ok()?;
                let switches = status
                    .lines()
                    .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))?
                    .trim()
                    .parse()
                    .ok()?;
                Some((name, switches))
            })
            .collect()
    };
    let before = wakeups();
    let mut tickers: Vec<&str> = before.iter().map(|(name, _)| name.as_str()).collect();
    tickers.sort();
    assert_eq!(
        tickers,
        ["laurel-http-epo", "laurel-wasm-epo"],
        "{threads:?}"
    );
    std::thread::sleep(Duration::from_secs(2));
    for ((name, was), (_, now)) in before.iter().zip(wakeups()) {
        assert!(
            now - was < 100,
            "{name} woke {} times in 2 s with no guest running",
            now - was
        );
    }

    // Transparent huge pages are off: each first touch of mimalloc's
    // arenas would zero 2 MiB (`without_huge_pages` in lib.rs).
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.0.id())).unwrap();
    assert!(
        status
            .lines()
            .any(|line| line.split_whitespace().eq(["THP_enabled:", "0"])),
        "{status}"
    );

    // SIGTERM: a clean stop.
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let exit = loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "laurel up did not stop"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(exit.success(), "{exit:?}");
    // Nothing went wrong on the way, nor at the stop: the in-process
    // broker outlives its clients (it went first, and each logged
    // "AllBrokersDown").
    let log = log.join().unwrap();
    let errors: Vec<&String> = log.iter().filter(|l| l.contains(" ERROR ")).collect();
    assert!(errors.is_empty(), "errors logged:\n{}", log.join("\n"));
    let missing: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("events.clicks") && l.contains("WARN"))
        .collect();
    assert!(
        missing.is_empty(),
        "a missing topic warned:\n{}",
        log.join("\n")
    );
    db.drop_database().await;
}

/// The threads of process `pid`: each one's name and /proc directory.
fn tasks(pid: u32) -> Vec<(String, std::path::PathBuf)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| {
            let path = task.ok()?.path();
            let name = std::fs::read_to_string(path.join("comm")).ok()?;
            Some((name.trim_end().to_string(), path))
        })
        .collect()
}
