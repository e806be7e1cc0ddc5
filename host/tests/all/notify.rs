//! Notifications: the outbox delivered to a real HTTP receiver on loopback,
//! retried with backoff under one idempotency key, given up and recorded.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use laurel::awards::AwardsSettings;
use laurel::notify::{self, NotifySettings};
use laurel::store::Webhook;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::awards::{BUMP, db_with_counter_award, state};
use crate::pipeline_support::awards_worker;
use crate::support::TestDb;

/// What the receiver saw: (status it answered, Idempotency-Key header, body).
type Seen = Arc<Mutex<Vec<(u16, String, Value)>>>;

/// A webhook receiver that fails the first `failures` requests with 500.
async fn receiver(failures: usize) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route(
            "/hook",
            post(
                move |State(seen): State<Seen>, headers: HeaderMap, body: String| async move {
                    let mut seen = seen.lock().unwrap();
                    let status = if seen.len() < failures {
                        StatusCode::INTERNAL_SERVER_ERROR
                    } else {
                        StatusCode::OK
                    };
                    let key = headers
                        .get("idempotency-key")
                        .and_then(|k| k.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    seen.push((
                        status.as_u16(),
                        key,
                        serde_json::from_str(&body).unwrap_or(Value::Null),
                    ));
                    (status, "receiver says so")
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

fn fast_retries(max_attempts: i32) -> NotifySettings {
    NotifySettings {
        max_attempts,
        backoff: Duration::from_millis(50),
        backoff_cap: Duration::from_millis(200),
        timeout: Duration::from_secs(2),
        ..NotifySettings::default()
    }
}

/// A user completes the counter award (goal 50) with a webhook set.
async fn completion_with_webhook(url: &str) -> TestDb {
    completion_with_webhook_via(url, None).await
}

async fn completion_with_webhook_via(url: &str, proxy_pool: Option<&str>) -> TestDb {
    let db = db_with_counter_award().await;
    let store = db.store().await;
    let webhook = laurel::webhooks::checked_webhook(
        "hook",
        url,
        &["award.completed".to_string()],
        proxy_pool,
    )
    .unwrap();
    store.set_webhook(&webhook).await.unwrap();
    db.sql()
        .await
        .query_one(BUMP, &[&"u-1", &50i64])
        .await
        .unwrap();
    let mut worker = awards_worker(&db.url, AwardsSettings::default()).await;
    let outcome = worker.drain().await.unwrap();
    assert_eq!(
        (outcome.report.transitions, outcome.report.notifications),
        (1, 1)
    );
    db
}

/// Runs the notifier until `done` holds (or 30 s pass), then stops it.
async fn notify_until(db: &TestDb, settings: NotifySettings, done: impl Fn() -> bool) {
    let (stop, stopped) = oneshot::channel::<()>();
    let url = db.url.clone();
    let task = tokio::spawn(async move {
        notify::run(settings, &url, async {
            let _ = stopped.await;
        })
        .await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the notifier record the last outcome before stopping it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_failing_three_times_sees_one_completion_by_idempotency_key() {
    let (url, seen) = receiver(3).await;
    let db = completion_with_webhook(&url).await;
    let watched = seen.clone();
    notify_until(&db, fast_retries(10), move || {
        watched
            .lock()
            .unwrap()
            .iter()
            .any(|(status, _, _)| *status == 200)
    })
    .await;

    let seen = seen.lock().unwrap().clone();
    let statuses: Vec<u16> = seen.iter().map(|(s, _, _)| *s).collect();
    assert_eq!(statuses, vec![500, 500, 500, 200]);
    let keys: BTreeSet<&str> = seen
        .iter()
        .flat_map(|(_, header, body)| [header.as_str(), body["idempotency_key"].as_str().unwrap()])
        .collect();
    assert_eq!(keys.len(), 1, "one completion, one key: {keys:?}");
    let body = &seen[3].2;
    assert_eq!(body["type"], "award.completed");
    assert_eq!(body["user_id"], "u-1");
    assert_eq!(body["award_id"], "counter");
    let completed_at = state(&db, "u-1", "counter")
        .await
        .unwrap()
        .completed_at
        .unwrap();
    let sent: chrono::DateTime<chrono::Utc> =
        body["completed_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        sent, completed_at,
        "the payload's completed_at is the award's"
    );

    let rows = db.store().await.notifications().await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].state.as_str(), rows[0].attempts), ("delivered", 4));
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_that_keeps_failing_is_given_up_and_recorded() {
    let (url, seen) = receiver(usize::MAX).await;
    let db = completion_with_webhook(&url).await;
    let watched = seen.clone();
    notify_until(&db, fast_retries(3), move || {
        watched.lock().unwrap().len() >= 3
    })
    .await;
    // No attempt after the last one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(seen.lock().unwrap().len(), 3);
    let rows = db.store().await.notifications().await.unwrap();
    assert_eq!((rows[0].state.as_str(), rows[0].attempts), ("failed", 3));
    let error = rows[0].last_error.as_deref().unwrap();
    assert!(
        error.contains("answered 500") && error.contains("receiver says so"),
        "{error}"
    );
    db.drop_database().await;
}

#[test]
fn webhooks_are_checked_before_they_are_stored() {
    let events = |e: &[&str]| e.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for (name, url, kinds, problem) in [
        (
            "hook",
            "ftp://example.com/x",
            events(&["award.completed"]),
            "expected http:// or https://",
        ),
        (
            "hook",
            "not a url",
            events(&["award.completed"]),
            "invalid webhook URL",
        ),
        (
            "bad name!",
            "http://127.0.0.1/x",
            events(&["award.completed"]),
            "invalid webhook name",
        ),
        (
            "hook",
            "http://127.0.0.1/x",
            events(&["award.won"]),
            "unknown event type \"award.won\"",
        ),
        (
            "hook",
            "http://127.0.0.1/x",
            events(&[]),
            "at least one event type",
        ),
    ] {
        let error = laurel::webhooks::checked_webhook(name, url, &kinds, None).unwrap_err();
        assert!(error.contains(problem), "{name} {url} {kinds:?}: {error}");
    }
    let ok: Webhook = laurel::webhooks::checked_webhook(
        "hook",
        "https://example.com/x",
        &events(&["award.completed", "award.revoked"]),
        None,
    )
    .unwrap();
    assert_eq!(ok.events.len(), 2);
}

/// A receiver that records each request's `Via` header (added by the
/// forward proxy it came through).
async fn via_receiver() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let app = axum::Router::new()
        .route(
            "/hook",
            post(
                |State(seen): State<Arc<Mutex<Vec<String>>>>, headers: HeaderMap| async move {
                    let via = headers
                        .get("via")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("(direct)")
                        .to_string();
                    seen.lock().unwrap().push(via);
                    StatusCode::OK
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_with_a_proxy_pool_is_delivered_through_the_allocated_proxy() {
    use crate::proxy::{Tinyproxy, pool_name, redis_url};
    let proxy = Tinyproxy::start("tp-hook");
    let pools = laurel::proxy::ProxyPools::connect(&redis_url())
        .await
        .unwrap();
    let pool = pool_name("webhook");
    pools.admit(&pool, &proxy.url).await.unwrap();
    let (url, seen) = via_receiver().await;
    let db = completion_with_webhook_via(&url, Some(&pool)).await;
    let watched = seen.clone();
    let settings = NotifySettings {
        redis_url: Some(redis_url()),
        ..fast_retries(5)
    };
    notify_until(&db, settings, move || !watched.lock().unwrap().is_empty()).await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].contains("tp-hook"), "arrived via {}", seen[0]);
    assert_eq!(
        pools.members(&pool).await.unwrap()[0].1,
        1.0,
        "one allocation"
    );
    let rows = db.store().await.notifications().await.unwrap();
    assert_eq!(rows[0].state, "delivered");
    pools.delete_pool(&pool).await.unwrap();
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_proxy_pool_delays_a_notification_and_never_spends_its_attempts() {
    use crate::proxy::{Tinyproxy, check_server, pool_config, pool_name, redis_url};
    let pool = pool_name("empty-webhook");
    let (url, seen) = via_receiver().await;
    let db = completion_with_webhook_via(&url, Some(&pool)).await;
    let settings = NotifySettings {
        redis_url: Some(redis_url()),
        ..fast_retries(2)
    };
    let store = db.store().await;
    // Empty for many times the attempt budget (2 attempts, 50 ms apart).
    let started = std::time::Instant::now();
    notify_until(&db, settings.clone(), move || {
        started.elapsed() > Duration::from_millis(1500)
    })
    .await;
    assert!(seen.lock().unwrap().is_empty(), "no request sent");
    let rows = store.notifications().await.unwrap();
    assert_eq!(
        (rows[0].state.as_str(), rows[0].attempts),
        ("pending", 0),
        "delayed, not given up"
    );
    assert_eq!(
        rows[0].last_error.as_deref(),
        Some(format!("proxy pool {pool} has no eligible proxy: not sent").as_str())
    );
    // A proxy joins the pool: the notification goes out.
    let proxy = Tinyproxy::start("tp-late");
    store
        .set_proxy_pool(&pool_config(&pool, &check_server().await))
        .await
        .unwrap();
    let pools = laurel::proxy::ProxyPools::connect(&redis_url())
        .await
        .unwrap();
    laurel::proxy::candidates::import(&store, &pools, &pool, &proxy.url, false)
        .await
        .unwrap();
    let watched = seen.clone();
    notify_until(&db, settings, move || !watched.lock().unwrap().is_empty()).await;
    assert_eq!(seen.lock().unwrap().len(), 1);
    let rows = store.notifications().await.unwrap();
    assert_eq!((rows[0].state.as_str(), rows[0].attempts), ("delivered", 1));
    pools.delete_pool(&pool).await.unwrap();
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_through_a_pool_wait_out_a_redis_outage_and_resume() {
    use crate::proxy::{
        PrivateRedis, Rechecker, Tinyproxy, check_server, pool_config, pool_name, wait_for,
    };
    use laurel::proxy::{ProxyPools, candidates};
    let redis = PrivateRedis::start_free(None);
    let port = redis.port;
    let redis_url = redis.url();
    let proxy = Tinyproxy::start("tp-outage");
    let (url, seen) = via_receiver().await;
    let pool = pool_name("outage");
    let db = completion_with_webhook_via(&url, Some(&pool)).await;
    let store = db.store().await;
    store
        .set_proxy_pool(&laurel::store::ProxyPoolRow {
            recheck_every: Duration::from_millis(200),
            ..pool_config(&pool, &check_server().await)
        })
        .await
        .unwrap();
    let pools = ProxyPools::connect(&redis_url).await.unwrap();
    candidates::import(&store, &pools, &pool, &proxy.url, false)
        .await
        .unwrap();
    let _rechecker = Rechecker::start(&db.url, &redis_url);

    // Redis goes away (and, without persistence, forgets the pool).
    drop(redis);
    let error = pools.allocate(&pool).await.unwrap_err().to_string();
    assert!(
        error.contains(&format!("proxy pool {pool}: Redis at {redis_url} failed")),
        "{error}"
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let settings = NotifySettings {
        redis_url: Some(redis_url.clone()),
        ..fast_retries(1000)
    };
    let notifier_db = db.url.clone();
    let notifier = tokio::spawn(async move {
        notify::run(settings, &notifier_db, async {
            let _ = stopped.await;
        })
        .await
    });
    wait_for("a failed attempt names Redis", || {
        let store = &store;
        async move {
            store.notifications().await.unwrap()[0]
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("Redis at"))
        }
    })
    .await;
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing sent without a proxy"
    );
    let error = store.notifications().await.unwrap()[0].last_error.clone();
    assert!(
        error
            .as_deref()
            .unwrap()
            .starts_with(&format!("no proxy from pool {pool}: ")),
        "{error:?}"
    );

    // Back (empty): the re-checker re-admits the proxy from PostgreSQL,
    // and the delivery goes through it.
    let _redis = PrivateRedis::start_on(port);
    wait_for("the delivery arrives", || {
        let seen = seen.clone();
        async move { !seen.lock().unwrap().is_empty() }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = stop.send(());
    notifier.await.unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].contains("tp-outage"), "arrived via {}", seen[0]);
    let rows = store.notifications().await.unwrap();
    assert_eq!(rows[0].state, "delivered");
    // The connection that saw Redis go works again too.
    wait_for("the old connection reconnects", || {
        let (pools, pool) = (pools.clone(), pool.clone());
        async move { pools.allocate(&pool).await.is_ok() }
    })
    .await;
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_concurrent_pool_leases_the_proxy_for_the_delivery_and_releases_it() {
    use crate::proxy::{Tinyproxy, check_server, pool_config, pool_name, redis_url};
    let proxy = Tinyproxy::start("tp-lease");
    let pools = laurel::proxy::ProxyPools::connect(&redis_url())
        .await
        .unwrap();
    let pool = pool_name("lease-webhook");
    let (url, seen) = via_receiver().await;
    let db = completion_with_webhook_via(&url, Some(&pool)).await;
    let store = db.store().await;
    store
        .set_proxy_pool(&laurel::store::ProxyPoolRow {
            policy: "least-concurrent".into(),
            max_in_flight: Some(1),
            ..pool_config(&pool, &check_server().await)
        })
        .await
        .unwrap();
    laurel::proxy::candidates::import(&store, &pools, &pool, &proxy.url, false)
        .await
        .unwrap();
    let watched = seen.clone();
    let settings = NotifySettings {
        redis_url: Some(redis_url()),
        ..fast_retries(5)
    };
    notify_until(&db, settings, move || !watched.lock().unwrap().is_empty()).await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].contains("tp-lease"), "arrived via {}", seen[0]);
    assert_eq!(pools.members(&pool).await.unwrap()[0].1, 1.0);
    assert!(
        pools.in_flight(&pool).await.unwrap().is_empty(),
        "the lease was released after the request"
    );
    pools.delete_pool(&pool).await.unwrap();
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_redirects_is_not_followed() {
    let (target, seen) = receiver(0).await;
    // The webhook's host answers every POST with a redirect elsewhere.
    let app = axum::Router::new().route(
        "/hook",
        post(move || {
            let target = target.clone();
            async move { (StatusCode::TEMPORARY_REDIRECT, [("location", target)], "") }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let db = completion_with_webhook(&url).await;
    let store = db.store().await;
    notify_until(&db, fast_retries(2), || false).await;
    assert!(
        seen.lock().unwrap().is_empty(),
        "the redirect's target got nothing"
    );
    let rows = store.notifications().await.unwrap();
    assert_eq!(rows[0].state, "failed");
    assert_eq!(
        rows[0].last_error.as_deref(),
        Some(format!("POST {url} answered 307: redirects are not followed").as_str())
    );
    db.drop_database().await;
}
