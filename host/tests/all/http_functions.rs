//! HTTP functions from a Spin manifest, on a real server: spin-sdk 7
//! (WASIp3) and spin-sdk 5 (WASIp2) components built from functions/http,
//! Spin variables and key-value (in Redis), the ingest adapter's events
//! arriving through Kafka into counters, the badge reading progress back,
//! refused imports, refused outbound hosts, and per-request limits.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use laurel::runtime::http::HttpLimits;
use laurel::runtime::http::manifest::{self, Manifest};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::api::Server;
use crate::pipeline_support::Pipeline;

const CHECKINS: &str = r#"[{
  "id": "regular", "title": "Regular", "public_badge": true,
  "objectives": [{"id": "checkins",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["checkins"]}}],
    "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "checkins"}}},
    "progress_counter": "checkins"}],
  "strategy": {"goal": 3, "operation": "sum", "strategy": [{"objective_id": "checkins"}]}
}]"#;

/// A manifest over the built components; `extra` is appended as is.
fn manifest(app: &str, allowed_port: u16, extra: &str) -> Result<Manifest, String> {
    let text = format!(
        r#"
spin_manifest_version = 2
[application]
name = "{app}"
[variables]
token = {{ default = "let-me-in" }}
greeting = {{ default = "hello" }}

[[trigger.http]]
route = "/badges/:user_id/:award_id"
component = "badge"
[[trigger.http]]
route = "/ingest/checkins"
component = "adapter"
[[trigger.http]]
route = "/probe/..."
component = "probe"
[[trigger.http]]
route = "/p2"
component = "p2"

[component.badge]
source = "progress_badge.wasm"
key_value_stores = ["default"]
[component.badge.variables]
label = "Tests"

[component.adapter]
source = "ingest_adapter.wasm"
[component.adapter.variables]
webhook_token = "{{{{ token }}}}"
source = "checkins"

[component.probe]
source = "http_probe.wasm"
key_value_stores = ["default"]
allowed_outbound_hosts = ["http://127.0.0.1:{allowed_port}"]
[component.probe.variables]
greeting = "{{{{ greeting }}}}, probe"

[component.p2]
source = "http_p2_hello.wasm"
key_value_stores = ["default"]
[component.p2.variables]
greeting = "{{{{ greeting }}}}"
{extra}
"#
    );
    manifest::parse(&text, laurel::library::guest_dir().to_path_buf(), &|_| None)
}

/// An application name of its own per test run: key-value stores are per
/// application, so runs and tests don't meet.
fn app(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{test}-{}-{nanos}", std::process::id())
}

/// A plain HTTP server on loopback that answers 200 and counts requests.
async fn counting_server() -> (u16, Arc<AtomicUsize>) {
    let (port, hits, _) = recording_server().await;
    (port, hits)
}

/// As `counting_server`, also keeping the last request's head.
async fn recording_server() -> (u16, Arc<AtomicUsize>, Arc<std::sync::Mutex<String>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(std::sync::Mutex::new(String::new()));
    let (counted, kept) = (hits.clone(), last.clone());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let kept = kept.clone();
            tokio::spawn(async move {
                let head = crate::support::read_head(&mut socket).await;
                *kept.lock().unwrap() = head.to_lowercase();
                let _ = socket
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    (port, hits, last)
}

fn limits() -> HttpLimits {
    HttpLimits {
        timeout: Duration::from_secs(2),
        memory_bytes: 64 << 20,
        max_body_bytes: 1 << 20,
    }
}

fn checkin(id: &str, user: &str, kind: &str, minute: u32) -> Value {
    json!({"event": kind, "occurred_at": format!("2026-12-01T10:{minute:02}:00Z"),
           "checkin": {"id": id, "user_id": user, "venue": {"id": "v-9", "category": "cafe"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkins_become_progress_and_the_badge_shows_it() {
    let mut p = Pipeline::start(CHECKINS, &["checkins"]).await;
    let (allowed, _) = counting_server().await;
    let server = Server::start_with_functions(
        &p.db.url,
        p.registry.clone(),
        Some(p.broker.bootstrap_servers()),
        Some((manifest(&app("checkins"), allowed, "").unwrap(), limits())),
    )
    .await
    .unwrap();
    let auth = [("authorization", "Bearer let-me-in")];

    // Refused: no token, a wrong one, bad JSON, a bad webhook (nothing of
    // the batch is published).
    let (status, _, body) = server.raw("POST", "/ingest/checkins", &[], "{}").await;
    assert_eq!(
        (status, body.as_str()),
        (401, r#"{"error":"missing or wrong bearer token"}"#)
    );
    let wrong = [("authorization", "Bearer guess")];
    assert_eq!(
        server.raw("POST", "/ingest/checkins", &wrong, "{}").await.0,
        401
    );
    let (status, _, body) = server
        .raw("POST", "/ingest/checkins", &auth, "{not json")
        .await;
    assert_eq!(status, 400);
    assert!(body.contains("the body is not JSON"), "{body}");
    let batch = json!([checkin("c-1", "u-1", "checkin.created", 1),
                       {"event": "checkin.liked", "checkin": {"id": "c-2"}}]);
    let (status, _, body) = server
        .raw("POST", "/ingest/checkins", &auth, &batch.to_string())
        .await;
    assert_eq!(status, 400, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"], "nothing was published");
    assert_eq!(
        body["problems"],
        json!(["webhook 1: event `checkin.liked` is not checkin.created or checkin.deleted"])
    );

    // Three check-ins, one deleted again: 2 count.
    let batch = json!([
        checkin("c-1", "u-1", "checkin.created", 1),
        checkin("c-2", "u-1", "checkin.created", 2),
        checkin("c-3", "u-1", "checkin.created", 3)
    ]);
    let (status, _, body) = server
        .raw("POST", "/ingest/checkins", &auth, &batch.to_string())
        .await;
    assert_eq!((status, body.as_str()), (202, r#"{"published":3}"#));
    let deleted = checkin("c-2", "u-1", "checkin.deleted", 4);
    let (status, _, _) = server
        .raw("POST", "/ingest/checkins", &auth, &deleted.to_string())
        .await;
    assert_eq!(status, 202);
    p.settle("checkins", "u-1").await;
    assert_eq!(
        p.objective("u-1", "regular", "checkins")
            .await
            .get("checkins"),
        Some(&2)
    );
    p.awards_worker().await.drain().await.unwrap();

    // The badge reads the progress back, counting its views in Redis.
    let (status, headers, svg) = server.raw("GET", "/badges/u-1/regular.svg", &[], "").await;
    assert_eq!(status, 200, "{svg}");
    assert_eq!(headers["content-type"], "image/svg+xml");
    assert_eq!(headers["x-badge-views"], "1");
    assert!(
        svg.contains("<title>Tests: Regular, 2 / 3</title>"),
        "{svg}"
    );
    assert!(svg.contains(r#"data-progress="0.6667""#), "{svg}");
    let (_, headers, _) = server.raw("GET", "/badges/u-1/regular", &[], "").await;
    assert_eq!(headers["x-badge-views"], "2");
    let (status, _, body) = server.raw("GET", "/badges/u-1/nope", &[], "").await;
    assert_eq!(
        (status, body.as_str()),
        (404, "award nope has no public badge\n")
    );
    // A made-up user id gets a badge at 0, and writes nothing: many of
    // them cannot fill the store.
    let mut unknown = String::new();
    for i in 0..20 {
        let (status, headers, svg) = server
            .raw("GET", &format!("/badges/crawler-{i}/regular"), &[], "")
            .await;
        assert_eq!(status, 200);
        assert!(headers.get("x-badge-views").is_none());
        unknown = svg;
    }
    assert!(
        unknown.contains("<title>Tests: Regular, 0 / 3</title>"),
        "{unknown}"
    );
    let (_, headers, _) = server.raw("GET", "/badges/u-1/regular", &[], "").await;
    assert_eq!(headers["x-badge-views"], "3");

    // u-1 opts out with the user's own token: the badge is the one of a
    // user nobody knows, the same bytes, and counts no view.
    let token = crate::api::user_token("u-1", crate::api::JWT_SECRET, 3600);
    let bearer = format!("Bearer {token}");
    let as_u1 = [("authorization", bearer.as_str())];
    let (status, _, body) = server
        .raw(
            "PUT",
            "/v1/users/u-1/badges",
            &as_u1,
            r#"{"public": false}"#,
        )
        .await;
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"user_id":"u-1","public":false}"#)
    );
    // Another user's choice is not u-1's to make.
    let (status, _, _) = server
        .raw(
            "PUT",
            "/v1/users/u-2/badges",
            &as_u1,
            r#"{"public": false}"#,
        )
        .await;
    assert_eq!(status, 403);
    let (status, headers, svg) = server.raw("GET", "/badges/u-1/regular", &[], "").await;
    assert_eq!(status, 200);
    assert!(headers.get("x-badge-views").is_none());
    assert_eq!(svg, unknown);
    let (status, _, body) = server.raw("GET", "/v1/users/u-1/badges", &as_u1, "").await;
    assert_eq!(
        (status, body.as_str()),
        (200, r#"{"user_id":"u-1","public":false}"#)
    );
    let (status, _, _) = server
        .raw("PUT", "/v1/users/u-1/badges", &as_u1, r#"{"public": true}"#)
        .await;
    assert_eq!(status, 200);
    let (_, headers, svg) = server.raw("GET", "/badges/u-1/regular", &[], "").await;
    assert_eq!(headers["x-badge-views"], "4");
    assert!(
        svg.contains("<title>Tests: Regular, 2 / 3</title>"),
        "{svg}"
    );

    // Laurel's own routes still answer as before; unknown paths get JSON.
    let (status, _, body) = server.raw("GET", "/nowhere", &[], "").await;
    assert_eq!(status, 404);
    assert!(body.contains("no route for GET /nowhere"), "{body}");

    // Metrics count the events the adapter published.
    let metrics = server.text("/metrics").await;
    assert!(
        metrics.contains("laurel_events_applied_total{source=\"checkins\"}"),
        "{metrics}"
    );
    drop(server);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spin_interfaces_outbound_hosts_and_limits_hold() {
    let (db, registry) = crate::api::database_with("[]").await;
    let (allowed, allowed_hits) = counting_server().await;
    let (denied, denied_hits) = counting_server().await;
    let server = Server::start_with_functions(
        &db.url,
        registry,
        None,
        Some((manifest(&app("checkins"), allowed, "").unwrap(), limits())),
    )
    .await
    .unwrap();

    // Variables (declared, templated, undefined) and the key-value store;
    // a store the component may not open is refused.
    let (status, _, body) = server.raw("GET", "/probe/spin", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let parts: Vec<&str> = body.split(" | ").collect();
    assert_eq!(parts[0], "hello, probe");
    assert!(parts[1].contains("nope"), "{body}");
    assert_eq!(parts[2], "count 1, exists true, keys 1");
    assert!(parts[3].to_lowercase().contains("access"), "{body}");
    let (_, _, body) = server.raw("GET", "/probe/spin", &[], "").await;
    assert!(body.contains("count 2, exists true, keys 1"), "{body}");

    // A WASIp2 component (spin-sdk 5): fermyon:spin variables and key-value.
    let (status, _, body) = server.raw("GET", "/p2", &[], "").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "p2 says hello; count 1; keys 2\n")
    );

    // Outbound: the allowed host is reached, any other is refused before a
    // connection is made.
    let url = format!("/probe/fetch?url=http://127.0.0.1:{allowed}/x");
    let (status, _, body) = server.raw("GET", &url, &[], "").await;
    assert_eq!((status, body.as_str()), (200, "fetched 200"));
    assert_eq!(allowed_hits.load(Ordering::SeqCst), 1);
    let url = format!("/probe/fetch?url=http://127.0.0.1:{denied}/x");
    let (status, _, body) = server.raw("GET", &url, &[], "").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.starts_with("refused:"), "{body}");
    assert!(body.to_lowercase().contains("denied"), "{body}");
    assert_eq!(denied_hits.load(Ordering::SeqCst), 0);

    // A loop is stopped at the deadline, a panic is reported, an oversized
    // answer is not passed on; the server goes on serving.
    let (status, _, body) = server.raw("GET", "/probe/loop", &[], "").await;
    assert_eq!(status, 504, "{body}");
    assert!(
        body.contains("component probe did not answer within 2s"),
        "{body}"
    );
    // Busy components yield: with more of them looping than the server has
    // worker threads, another request is still answered while they run.
    let server = Arc::new(server);
    let loops: Vec<_> = (0..3)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move { server.raw("GET", "/probe/loop", &[], "").await.0 })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, _, _) = server.raw("GET", "/p2", &[], "").await;
    assert_eq!(status, 200);
    assert!(
        loops.iter().all(|l| !l.is_finished()),
        "the loops were still running when /p2 answered"
    );
    for l in loops {
        assert_eq!(l.await.unwrap(), 504);
    }
    let server = Arc::try_unwrap(server).ok().expect("one server");
    let (status, _, body) = server.raw("GET", "/probe/panic", &[], "").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("the probe was asked to panic"), "{body}");
    let (status, _, body) = server.raw("GET", "/probe/big", &[], "").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("over the limit of 1048576 bytes"), "{body}");
    let (status, _, _) = server.raw("GET", "/probe/spin", &[], "").await;
    assert_eq!(status, 200);
    let metrics = server.text("/metrics").await;
    for series in [
        "laurel_http_function_requests_total{component=\"probe\",outcome=\"timeout\"}",
        "laurel_http_function_requests_total{component=\"probe\",outcome=\"failed\"}",
        "laurel_http_function_requests_total{component=\"probe\",outcome=\"too_large\"}",
        "laurel_http_function_requests_total{component=\"p2\",outcome=\"200\"} 2",
        "laurel_http_function_seconds_count{component=\"probe\"}",
    ] {
        assert!(
            metrics.contains(series),
            "{series} missing from:\n{metrics}"
        );
    }
    drop(server);
    db.drop_database().await;
}

/// The sleepers' own components (the metrics are the process's: other
/// tests count requests to `probe` and `p2`).
const SLEEPERS: &str = r#"
[[trigger.http]]
route = "/sleepy/..."
component = "sleepy-probe"
[[trigger.http]]
route = "/sleepy-p2"
component = "sleepy-p2"
[component.sleepy-probe]
source = "http_probe.wasm"
key_value_stores = ["default"]
[component.sleepy-probe.variables]
greeting = "hello"
[component.sleepy-p2]
source = "http_p2_hello.wasm"
key_value_stores = ["default"]
[component.sleepy-p2.variables]
greeting = "hello"
"#;

/// A handler asleep in a blocking WASI call is stopped at the deadline
/// like a loop, and its instance is dropped there: a wasi:http 0.2 handler
/// (which runs in a task of its own) never wakes to write its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_handler_is_stopped_at_its_deadline_and_its_instance_dropped() {
    let (db, registry) = crate::api::database_with("[]").await;
    let (allowed, _) = counting_server().await;
    let server = Server::start_with_functions(
        &db.url,
        registry,
        None,
        Some((
            manifest(&app("sleepers"), allowed, SLEEPERS).unwrap(),
            limits(),
        )),
    )
    .await
    .unwrap();
    let (status, _, body) = server.raw("GET", "/sleepy-p2", &[], "").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.ends_with("count 1; keys 1\n"), "{body}");

    for path in ["/sleepy/sleep", "/sleepy-p2?sleep=4000"] {
        let started = std::time::Instant::now();
        let (status, _, body) = server.raw("GET", path, &[], "").await;
        assert_eq!(status, 504, "{path}: {body}");
        assert!(body.contains("did not answer within 2s"), "{path}: {body}");
        // A bound, not a benchmark: the time limit plus slack.
        assert!(started.elapsed() < Duration::from_secs(4), "{path}");
        // Other requests are served meanwhile and after.
        let (status, _, _) = server.raw("GET", "/sleepy/spin", &[], "").await;
        assert_eq!(status, 200, "after {path}");
    }
    // Past the moment the p2 sleeper would have woken: it never wrote.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, _, body) = server.raw("GET", "/sleepy-p2", &[], "").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.ends_with("count 2; keys 2\n"),
        "p2-count and probe-count only, no p2-after-sleep: {body}"
    );
    drop(server);
    db.drop_database().await;
}

/// Why a server would not serve `manifest`.
async fn refused(
    db: &crate::support::TestDb,
    registry: &Arc<laurel::registry::Registry>,
    manifest: Manifest,
) -> String {
    Server::start_with_functions(&db.url, registry.clone(), None, Some((manifest, limits())))
        .await
        .err()
        .expect("refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_with_an_import_laurel_lacks_is_refused_at_load() {
    let (db, registry) = crate::api::database_with("[]").await;
    let extra = r#"
[[trigger.http]]
route = "/sql"
component = "forbidden"
[component.forbidden]
source = "http_forbidden.wasm"
"#;
    let error = refused(&db, &registry, manifest(&app("refused"), 1, extra).unwrap()).await;
    assert!(
        error
            .starts_with("component `forbidden` cannot be served: it imports `spin:sqlite/sqlite@"),
        "{error}"
    );

    // A route over Laurel's own API is refused too, naming both.
    let extra = r#"
[[trigger.http]]
route = "/admin/..."
component = "p2"
"#;
    let error = refused(&db, &registry, manifest(&app("refused"), 1, extra).unwrap()).await;
    assert_eq!(
        error,
        "spin.toml route `/admin/...` (component `p2`) overlaps Laurel's own /admin"
    );

    // A source file that is not there, and not a built-in, is named.
    let missing = manifest(&app("refused"), 1, "").unwrap();
    let mut missing = missing;
    missing.components.get_mut("probe").unwrap().source = PathBuf::from("nowhere.wasm");
    let error = refused(&db, &registry, missing).await;
    assert!(
        error.starts_with("component `probe`: cannot read ") && error.contains("nowhere.wasm"),
        "{error}"
    );
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_repository_spin_toml_is_served_from_the_built_in_components() {
    let (db, registry) = crate::api::database_with(crate::api::AWARDS).await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../spin.toml");
    let manifest = manifest::load(&path, &|_| None).unwrap();
    let routes: Vec<(&str, &str)> = manifest
        .routes
        .iter()
        .map(|r| (r.pattern.as_str(), r.component.as_str()))
        .collect();
    assert_eq!(
        routes,
        [
            ("/badges/:user_id/:award_id", "progress-badge"),
            ("/ingest/checkins", "ingest-adapter")
        ]
    );
    let server = Server::start_with_functions(&db.url, registry, None, Some((manifest, limits())))
        .await
        .unwrap();
    // Nobody has started it: 0 of its goal.
    let (status, _, svg) = server
        .raw("GET", "/badges/u-9/content-maker", &[], "")
        .await;
    assert_eq!(status, 200, "{svg}");
    assert!(
        svg.contains("<title>Laurel: Content maker, 0 / 15</title>"),
        "{svg}"
    );
    // An award that does not opt in to public badges has none.
    let (status, _, body) = server.raw("GET", "/badges/u-9/three-photos", &[], "").await;
    assert_eq!(
        (status, body.as_str()),
        (404, "award three-photos has no public badge\n")
    );
    // Without SPIN_VARIABLE_CHECKINS_TOKEN the adapter takes nothing.
    let (status, _, body) = server.raw("POST", "/ingest/checkins", &[], "{}").await;
    assert_eq!(
        (status, body.as_str()),
        (503, r#"{"error":"webhook_token is not configured"}"#)
    );
    drop(server);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_requests_go_through_the_proxy_pool_when_one_is_set() {
    let (db, registry) = crate::api::database_with("[]").await;
    let pool = crate::proxy::pool_name("http-functions");
    let proxy = crate::proxy::Tinyproxy::start("laurel-http-fn-proxy");
    let check_url = crate::proxy::check_server().await;
    db.store()
        .await
        .set_proxy_pool(&crate::proxy::pool_config(&pool, &check_url))
        .await
        .unwrap();
    let pools = laurel::proxy::ProxyPools::connect(&crate::proxy::redis_url())
        .await
        .unwrap();
    pools.admit(&pool, &proxy.url).await.unwrap();
    let (allowed, hits, last) = recording_server().await;
    let chosen = pool.clone();
    let server = Server::start_custom(
        &db.url,
        registry,
        None,
        Some((manifest(&app("proxied"), allowed, "").unwrap(), limits())),
        move |settings| settings.http_function_proxy_pool = Some(chosen),
    )
    .await
    .unwrap();

    let url = format!("/probe/fetch?url=http://127.0.0.1:{allowed}/x");
    let (status, _, body) = server.raw("GET", &url, &[], "").await;
    assert_eq!((status, body.as_str()), (200, "fetched 200"));
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let head = last.lock().unwrap().clone();
    assert!(head.contains("via: 1.1 laurel-http-fn-proxy"), "{head}");
    let members = pools.members(&pool).await.unwrap();
    assert_eq!(members, vec![(proxy.url.clone(), 1.0)]);

    // A host not allowed is refused before any proxy is taken.
    let (denied, denied_hits) = counting_server().await;
    let url = format!("/probe/fetch?url=http://127.0.0.1:{denied}/x");
    assert_eq!(server.raw("GET", &url, &[], "").await.0, 502);
    assert_eq!(denied_hits.load(Ordering::SeqCst), 0);
    assert_eq!(pools.members(&pool).await.unwrap()[0].1, 1.0);

    // An empty pool: nothing is sent, and the function hears why.
    pools.delete_pool(&pool).await.unwrap();
    let url = format!("/probe/fetch?url=http://127.0.0.1:{allowed}/x");
    let (status, _, body) = server.raw("GET", &url, &[], "").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("has no eligible proxy: not sent"), "{body}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    drop(server);
    db.drop_database().await;
}

/// A server that answers every request with a redirect to `location`.
async fn redirecting_server(location: String) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let location = location.clone();
            tokio::spawn(async move {
                crate::support::read_head(&mut socket).await;
                let answer = format!(
                    "HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_host_that_redirects_is_not_followed_elsewhere() {
    let (db, registry) = crate::api::database_with("[]").await;
    let (elsewhere, elsewhere_hits) = counting_server().await;
    let allowed = redirecting_server(format!("http://127.0.0.1:{elsewhere}/x")).await;
    // Straight out, and through a proxy pool.
    let pool = crate::proxy::pool_name("redirects");
    let proxy = crate::proxy::Tinyproxy::start("laurel-redirect-proxy");
    db.store()
        .await
        .set_proxy_pool(&crate::proxy::pool_config(
            &pool,
            &crate::proxy::check_server().await,
        ))
        .await
        .unwrap();
    let pools = laurel::proxy::ProxyPools::connect(&crate::proxy::redis_url())
        .await
        .unwrap();
    pools.admit(&pool, &proxy.url).await.unwrap();
    for via_pool in [false, true] {
        let chosen = pool.clone();
        let server = Server::start_custom(
            &db.url,
            registry.clone(),
            None,
            Some((manifest(&app("redirects"), allowed, "").unwrap(), limits())),
            move |settings| {
                if via_pool {
                    settings.http_function_proxy_pool = Some(chosen);
                }
            },
        )
        .await
        .unwrap();
        let url = format!("/probe/fetch?url=http://127.0.0.1:{allowed}/x");
        let (status, _, body) = server.raw("GET", &url, &[], "").await;
        assert_eq!(
            (status, body.as_str()),
            (200, "fetched 302"),
            "via pool: {via_pool}"
        );
        drop(server);
    }
    assert_eq!(
        elsewhere_hits.load(Ordering::SeqCst),
        0,
        "the redirect's target (not an allowed host) was never reached"
    );
    pools.delete_pool(&pool).await.unwrap();
    db.drop_database().await;
}

/// `laurel ARGS` (the built binary) against `database_url`: (success,
/// stdout, stderr).
fn laurel_cli(database_url: &str, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_laurel"))
        .env("LAUREL_DATABASE_URL", database_url)
        .env("LAUREL_LOG", "warn")
        .args(args)
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// GET `path` until its status is `status` (the swap follows the push's
/// notification), at most 20 s.
async fn until_status(server: &Server, path: &str, status: u16) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (got, _, body) = server.raw("GET", path, &[], "").await;
        if got == status {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} still answers {got} ({body}), not {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A component of its own for the push test (the request metrics of `p2`
/// are counted exactly by another test in this process).
const SWAP: &str = r#"
[[trigger.http]]
route = "/swap"
component = "swap"
[component.swap]
source = "http_p2_hello.wasm"
key_value_stores = ["default"]
[component.swap.variables]
greeting = "{{ greeting }}"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_function_pushed_under_its_component_id_serves_without_a_restart_and_rolls_back() {
    let (db, registry) = crate::api::database_with("[]").await;
    let server = Server::start_with_functions(
        &db.url,
        registry.clone(),
        None,
        Some((manifest(&app("pushed"), 1, SWAP).unwrap(), limits())),
    )
    .await
    .unwrap();
    // The manifest's file serves first.
    let body = until_status(&server, "/swap", 200).await;
    assert!(body.starts_with("p2 says hello; count 1"), "{body}");

    let dir = laurel::library::guest_dir();
    let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
    // Another process pushes (the binary, as a team would): v1, noop.
    let (ok, stdout, stderr) = laurel_cli(
        &db.url,
        &[
            "functions",
            "push",
            "swap",
            &file("http_noop.wasm"),
            "--kind",
            "http",
        ],
    );
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("swap v1"), "{stdout}");
    until_status(&server, "/swap", 204).await;
    // The kind is read from the component when not given: v2.
    let (ok, stdout, stderr) = laurel_cli(
        &db.url,
        &["functions", "push", "swap", &file("http_p2_hello.wasm")],
    );
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("swap v2"), "{stdout}");
    let body = until_status(&server, "/swap", 200).await;
    // The manifest's variables and key-value store still hold for it (the
    // count goes on from the file's requests).
    let count: u64 = body
        .strip_prefix("p2 says hello; count ")
        .and_then(|rest| rest.split(';').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{body}"));
    assert!(count >= 2, "{body}");
    // One step back, without a restart: noop again.
    let (ok, stdout, stderr) = laurel_cli(&db.url, &["functions", "rollback", "swap"]);
    assert!(ok, "{stdout}{stderr}");
    until_status(&server, "/swap", 204).await;
    // Listed with its kind.
    let (ok, stdout, _) = laurel_cli(&db.url, &["functions", "list"]);
    assert!(ok);
    let line = stdout.lines().find(|l| l.starts_with("swap ")).unwrap();
    assert!(line.split_whitespace().nth(1) == Some("http"), "{line}");

    // Refused, naming why, and nothing registered: a filter as http, an
    // HTTP function as a filter, one importing what Laurel lacks.
    let filter = file("accept_all_filter.wasm");
    let (ok, _, stderr) = laurel_cli(
        &db.url,
        &["functions", "push", "swap", &filter, "--kind", "http"],
    );
    assert!(!ok);
    assert!(
        stderr
            .contains("exports neither wasi:http/handler@0.3.0 nor wasi:http/incoming-handler@0.2"),
        "{stderr}"
    );
    let (ok, _, stderr) = laurel_cli(
        &db.url,
        &[
            "functions",
            "push",
            "swap",
            &file("http_p2_hello.wasm"),
            "--kind",
            "filter",
        ],
    );
    assert!(!ok);
    assert!(
        stderr.contains("is a http, but it is registered as a filter"),
        "{stderr}"
    );
    let (ok, _, stderr) = laurel_cli(
        &db.url,
        &[
            "functions",
            "push",
            "swap",
            &file("http_noop.wasm"),
            "--memory-mib",
            "8",
        ],
    );
    assert!(!ok);
    assert!(
        stderr.contains("an HTTP function runs under the server's limits"),
        "{stderr}"
    );
    let (ok, _, stderr) = laurel_cli(
        &db.url,
        &["functions", "push", "swap", &file("http_forbidden.wasm")],
    );
    assert!(!ok);
    assert!(
        stderr.contains("it imports `spin:sqlite/sqlite@"),
        "{stderr}"
    );
    let versions = db.store().await.all_function_versions().await.unwrap();
    assert_eq!(versions.iter().filter(|r| r.name == "swap").count(), 2);

    // An award cannot use it as a filter.
    let award = r#"{"id": "web", "title": "Web", "objectives": [{"id": "o",
        "filters": [{"name": "swap", "config": {}}],
        "rule": {"name": "CountRule", "config": {"counter": "n"}}, "progress_counter": "n"}],
        "strategy": {"goal": 1, "strategy": [{"objective_id": "o"}]}}"#;
    let mut store = db.store().await;
    let error = laurel::definitions::apply(&mut store, &registry, award)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("function swap is a http, not a filter"),
        "{error}"
    );
    drop(server);
    db.drop_database().await;
}

/// An HTTP function cannot publish what ingest would dead-letter for its
/// size: an event past LAUREL_MAX_EVENT_BYTES is refused with why, and
/// nothing of the batch is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_event_past_the_event_limit_is_refused_with_why() {
    let mut p = Pipeline::start(CHECKINS, &["checkins"]).await;
    let (allowed, _) = counting_server().await;
    let server = Server::start_custom(
        &p.db.url,
        p.registry.clone(),
        Some(p.broker.bootstrap_servers()),
        Some((manifest(&app("big"), allowed, "").unwrap(), limits())),
        |settings| settings.max_event_bytes = 2048,
    )
    .await
    .unwrap();
    let auth = [("authorization", "Bearer let-me-in")];
    let mut big = checkin("c-9", "u-1", "checkin.created", 1);
    big["checkin"]["venue"]["category"] = json!("x".repeat(3000));
    let batch = json!([checkin("c-8", "u-1", "checkin.created", 1), big]);
    let (status, _, body) = server
        .raw("POST", "/ingest/checkins", &auth, &batch.to_string())
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("event 1 is ")
            && body.contains("bytes, over the event limit of 2048 bytes (LAUREL_MAX_EVENT_BYTES)"),
        "{body}"
    );
    p.settle("checkins", "u-1").await;
    assert!(p.objective("u-1", "regular", "checkins").await.is_empty());
    drop(server);
    p.stop().await;
}
