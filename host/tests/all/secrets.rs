//! Secrets never leave the process: the built `laurel` with a Redis that
//! asks for a password, a database URL with a password and a webhook URL
//! with credentials; Redis goes away and the webhook's host refuses. No
//! response body and no log line carries any of the secrets.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::proxy::PrivateRedis;
use crate::support::TestDb;

const REDIS_PASSWORD: &str = "redis-pw-0f8e7d6c";
const DB_PASSWORD: &str = "db-pw-5a4b3c2d";
const HOOK_PASSWORD: &str = "hook-pw-9e8d7c6b";
const ADMIN: &str = "admin-token-secrets-test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_reach_a_response_or_a_log_line() {
    let redis = PrivateRedis::start_free(Some(REDIS_PASSWORD));
    let redis_port = redis.port;
    let db = TestDb::new().await;
    let db_url = db.url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{DB_PASSWORD}@"),
        1,
    );
    assert_ne!(
        db_url, db.url,
        "the test database URL has no password to add"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_laurel"))
        .args(["serve", "--roles", "api,notify,proxies"])
        .env("LAUREL_DATABASE_URL", &db_url)
        .env(
            "LAUREL_REDIS_URL",
            format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{redis_port}"),
        )
        .env("LAUREL_HTTP_ADDR", "127.0.0.1:0")
        .env("LAUREL_ADMIN_TOKEN", ADMIN)
        .env("LAUREL_WEBHOOK_BACKOFF_MS", "100")
        .env(
            "LAUREL_LOG",
            "debug,tokio_postgres=info,hyper=info,h2=info,rustls=info",
        )
        .env_remove("LAUREL_KAFKA_BROKERS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(crate::support::KillOnDrop)
        .expect("laurel serve starts");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let readers: Vec<_> = [
        Box::new(child.0.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.0.stderr.take().unwrap()),
    ]
    .into_iter()
    .map(|stream| {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        })
    })
    .collect();

    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    // The address it took (port 0: a free one), as it prints it.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let base = loop {
        let found = lines.lock().unwrap().iter().find_map(|l| {
            l.strip_prefix("HTTP API at ")
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string)
        });
        if let Some(base) = found {
            break base;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "laurel serve printed no address"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut bodies: Vec<(String, u16, String)> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while client
        .get(format!("{base}/healthz"))
        .send()
        .await
        .map(|r| r.status() != 200)
        .unwrap_or(true)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "laurel serve did not come up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let call = |method: &'static str, path: String, body: Option<serde_json::Value>| {
        let client = client.clone();
        let base = base.clone();
        async move {
            let mut request = client
                .request(
                    reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                    format!("{base}{path}"),
                )
                .bearer_auth(ADMIN);
            if let Some(body) = body {
                request = request
                    .header("content-type", "application/json")
                    .body(body.to_string());
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (
                format!("{method} {path}"),
                status,
                response.text().await.unwrap(),
            )
        }
    };
    bodies.push(
        call(
            "PUT",
            "/admin/v1/proxy-pools/p".into(),
            Some(json!({"check_url": "http://127.0.0.1:1/check"})),
        )
        .await,
    );
    // A webhook whose URL carries credentials, to a port that refuses.
    let hook = format!("http://alice:{HOOK_PASSWORD}@127.0.0.1:1/hook?token={HOOK_PASSWORD}");
    let put = call(
        "PUT",
        "/admin/v1/webhooks/h".into(),
        Some(json!({"url": hook, "events": ["award.completed"]})),
    )
    .await;
    assert_eq!(put.1, 200, "{put:?}");
    // (The PUT's own answer echoes the configured URL back to the admin who
    // sent it; not counted as a leak.)
    let sql = db.sql().await;
    sql.batch_execute(
        "INSERT INTO award_transitions (user_id, award_id, kind, progress, goal) VALUES ('u-1', 'a', 'completed', 1, 1);
         INSERT INTO notifications (transition_id, webhook, payload)
             SELECT id, 'h', '{\"type\": \"award.completed\"}' FROM award_transitions;
         NOTIFY laurel_outbox;",
    )
    .await
    .unwrap();
    // Redis goes away.
    drop(redis);
    for (method, path) in [
        ("GET", "/healthz"),
        ("GET", "/metrics"),
        ("GET", "/admin/v1/proxy-pools/p"),
        ("POST", "/admin/v1/proxy-pools/p/allocate"),
        ("GET", "/admin/v1/awards"),
    ] {
        bodies.push(call(method, path.to_string(), None).await);
    }
    let health = &bodies[1];
    assert_eq!(health.1, 503, "{health:?}");
    assert!(health.2.contains("redis://:***@127.0.0.1"), "{health:?}");
    // The delivery fails at least twice (logged, recorded).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let row = sql
            .query_one("SELECT attempts, last_error FROM notifications", &[])
            .await
            .unwrap();
        let (attempts, error): (i32, Option<String>) = (row.get(0), row.get(1));
        if attempts >= 2 {
            let error = error.unwrap();
            assert!(!error.contains(HOOK_PASSWORD), "{error}");
            assert!(error.contains("alice:***@127.0.0.1:1"), "{error}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no delivery attempts");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status();
    let _ = child.0.wait();
    for reader in readers {
        let _ = reader.join();
    }
    let lines = std::mem::take(&mut *lines.lock().unwrap());
    assert!(lines.len() > 10, "the log says something: {lines:?}");
    for secret in [REDIS_PASSWORD, DB_PASSWORD, HOOK_PASSWORD] {
        for (what, status, body) in &bodies {
            assert!(
                !body.contains(secret),
                "{what} ({status}) shows a secret: {body}"
            );
        }
        for line in lines.iter() {
            assert!(!line.contains(secret), "a log line shows a secret: {line}");
        }
    }
    db.drop_database().await;
}

/// A secret too short to be one is refused at start, naming the setting
/// and the minimum: an admin token under 16 characters, an HS256 secret
/// under 32 bytes (RFC 7518, 3.2).
#[test]
fn short_secrets_are_refused_at_start() {
    for (name, value, says) in [
        (
            "LAUREL_ADMIN_TOKEN",
            "short-token",
            "at least 16 characters (a secret, not a password)",
        ),
        (
            "LAUREL_JWT_SECRET",
            "only-twenty-bytes-xx",
            "at least 32 bytes for HS256 (RFC 7518, 3.2), not 20",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_laurel"))
            .args(["serve", "--roles", "api"])
            .env(
                "LAUREL_DATABASE_URL",
                "postgres://postgres@127.0.0.1:1/none",
            )
            .env(name, value)
            .env_remove("LAUREL_KAFKA_BROKERS")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{name}: {stderr}");
        assert!(
            stderr.contains(name) && stderr.contains(says),
            "{name}: {stderr}"
        );
        assert!(
            !stderr.contains(value),
            "{name}: the value is not echoed: {stderr}"
        );
    }
}
