//! The HTTP surface on a real server (port 0) over a real PostgreSQL,
//! Redis, Kafka (mock cluster) and components: every contract route's
//! success and refusals, progress read back after Kafka events, and
//! malformed requests answered with clear 4xx errors.

use std::sync::Arc;
use std::time::Duration;

use laurel::api::{ApiSettings, AppState, Secret};
use laurel::catalog::Catalog;
use laurel::registry::Registry;
use laurel::runtime::http::HttpLimits;
use laurel::runtime::http::manifest::Manifest;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::pipeline_support::{Pipeline, event};
use crate::support::{self, TestDb};

pub const ADMIN: &str = "admin-token-for-tests";
pub const JWT_SECRET: &str = "jwt-secret-for-tests";

/// A running API on a free port.
pub struct Server {
    pub base: String,
    client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A response: status and JSON body (`Value::Null` if it was not JSON).
pub struct Answer {
    pub status: u16,
    pub body: Value,
    pub content_type: String,
}

impl Server {
    pub async fn start(
        database_url: &str,
        registry: Arc<Registry>,
        brokers: Option<&str>,
    ) -> Server {
        Server::start_with_functions(database_url, registry, brokers, None)
            .await
            .unwrap()
    }

    /// A server that also serves `functions` (a manifest and its limits),
    /// or why it could not load them.
    pub async fn start_with_functions(
        database_url: &str,
        registry: Arc<Registry>,
        brokers: Option<&str>,
        functions: Option<(Manifest, HttpLimits)>,
    ) -> Result<Server, String> {
        Server::start_custom(database_url, registry, brokers, functions, |_| {}).await
    }

    /// As `start_with_functions`, with the settings adjusted by `adjust`.
    pub async fn start_custom(
        database_url: &str,
        registry: Arc<Registry>,
        brokers: Option<&str>,
        functions: Option<(Manifest, HttpLimits)>,
        adjust: impl FnOnce(&mut ApiSettings),
    ) -> Result<Server, String> {
        let catalog = Catalog::start(database_url).await.unwrap();
        let settings = ApiSettings {
            admin_token: Some(Secret::new(ADMIN)),
            tokens: laurel::api::TokenSettings {
                secret: Some(Secret::new(JWT_SECRET)),
                ..Default::default()
            },
            max_body_bytes: 64 << 10,
            redis_url: crate::proxy::redis_url(),
            kafka_brokers: brokers.map(str::to_string),
            kafka_every: Duration::from_millis(200),
            ..ApiSettings::new(database_url)
        };
        let mut settings = settings;
        adjust(&mut settings);
        let state = Arc::new(AppState::new(settings, registry, catalog));
        if let Some((manifest, limits)) = functions {
            state
                .serve_functions(manifest, limits)
                .await
                .map_err(|e| format!("{e:#}"))?;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(laurel::api::run(listener, state, async {
            let _ = stopped.await;
        }));
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(Server {
            base,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            stop: Some(stop),
        })
    }

    /// A request with raw headers and body; the answer's status, headers
    /// and body text.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, reqwest::header::HeaderMap, String) {
        let mut request = self.client.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", self.base),
        );
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.body(body.to_string()).send().await.unwrap();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        (status, headers, response.text().await.unwrap())
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<(&str, Vec<u8>)>,
    ) -> Answer {
        let mut request = self.client.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", self.base),
        );
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some((content_type, bytes)) = body {
            request = request.header("content-type", content_type).body(bytes);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let bytes = response.bytes().await.unwrap();
        Answer {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            content_type,
        }
    }

    pub async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        self.call(
            method,
            &format!("/admin/v1{path}"),
            Some(ADMIN),
            body.map(|b| ("application/json", b.to_string().into_bytes())),
        )
        .await
    }

    /// A plain-text GET (no token), e.g. `/metrics`.
    pub async fn text(&self, path: &str) -> String {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "{content_type}"
        );
        response.text().await.unwrap()
    }

    pub async fn get(&self, path: &str, token: Option<&str>) -> Answer {
        self.call("GET", path, token, None).await
    }
}

/// An HS256 token, as an app's login service would mint it.
pub fn user_token(sub: &str, secret: &str, expires_in: i64) -> String {
    let exp = chrono::Utc::now().timestamp() + expires_in;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({"sub": sub, "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

pub fn error_text(answer: &Answer) -> &str {
    answer.body["error"].as_str().unwrap_or_else(|| {
        panic!(
            "no JSON error in a {} answer: {}",
            answer.status, answer.body
        )
    })
}

/// The contract's content-maker award (the demo's) and a second one
/// nobody starts.
pub const AWARDS: &str = concat!(
    "[",
    include_str!("../../demo/content-maker.json"),
    ", ",
    r#"{
  "id": "three-photos", "title": "Three photos",
  "objectives": [
    {"id": "photos",
     "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
     "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved"}}},
     "progress_counter": "approved"}],
  "strategy": {"goal": 3, "operation": "sum", "strategy": [{"objective_id": "photos"}]}
}, {
  "id": "three-of-either", "title": "Three of either", "description": "Write 3 reviews or upload 3 photos",
  "objectives": [
    {"id": "reviews",
     "filters": [{"name": "SourceFilter", "config": {"sources": ["reviews"]}},
                 {"name": "StatusFilter", "config": {"statuses": ["active"]}}],
     "rule": {"name": "CountRule", "config": {"counter": "count"}},
     "progress_counter": "count"},
    {"id": "photos",
     "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                 {"name": "StatusFilter", "config": {"statuses": ["active"]}}],
     "rule": {"name": "CountRule", "config": {"counter": "count"}},
     "progress_counter": "count"}],
  "strategy": {"goal": 3, "operation": "sum", "strategy": [{"objective_id": "reviews"}, {"objective_id": "photos"}]}
}"#,
    "]"
);

fn award<'a>(awards: &'a Value, id: &str) -> &'a Value {
    awards["awards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["award_id"] == id)
        .unwrap_or_else(|| panic!("award {id} missing from {awards}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_from_kafka_events_is_read_back_through_the_public_api() {
    let mut p = Pipeline::start(AWARDS, &["photos", "reviews", "bss"]).await;
    let long = "x".repeat(150);
    for n in 1..=3 {
        let photo = event(
            &format!("p-{n}"),
            "photos",
            "u-42",
            Some((&format!("photo-{n}"), "active")),
            n,
            json!({}),
        );
        p.send(&photo).await;
    }
    p.send(&event(
        "p-4",
        "photos",
        "u-42",
        Some(("photo-4", "blocked")),
        4,
        json!({}),
    ))
    .await;
    p.send(&event(
        "r-1",
        "reviews",
        "u-42",
        Some(("review-1", "active")),
        1,
        json!({"object_id": "firm-17", "text": long}),
    ))
    .await;
    let mut trip = event("t-1", "bss", "u-42", None, 1, json!({"distance_m": 5500}));
    trip["type"] = "navi.trip_finished".into();
    p.send(&trip).await;
    // The write-up's other example: 1 review + 2 photos make "3 reviews or
    // 3 photos" complete.
    for n in 1..=2 {
        let photo = event(
            &format!("p43-{n}"),
            "photos",
            "u-43",
            Some((&format!("photo43-{n}"), "active")),
            n,
            json!({}),
        );
        p.send(&photo).await;
    }
    p.send(&event(
        "r43-1",
        "reviews",
        "u-43",
        Some(("review43-1", "active")),
        1,
        json!({"object_id": "firm-9", "text": "short"}),
    ))
    .await;
    for source in ["photos", "reviews", "bss"] {
        p.settle(source, "u-42").await;
    }
    p.settle("photos", "u-43").await;
    p.settle("reviews", "u-43").await;
    p.awards_worker().await.drain().await.unwrap();
    let server = Server::start(
        &p.db.url,
        p.registry.clone(),
        Some(p.broker.bootstrap_servers()),
    )
    .await;

    let token = user_token("u-42", JWT_SECRET, 600);
    let answer = server.get("/v1/users/u-42/awards", Some(&token)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.content_type.starts_with("application/json"));
    assert_eq!(answer.body["user_id"], "u-42");
    let maker = award(&answer.body, "content-maker");
    // 4 units of content (3 photos + 1 long review, cap 5) + 5.5 km (cap 10).
    assert_eq!(maker["title"], "Content maker");
    assert_eq!(maker["progress"], json!(9.5));
    assert_eq!(maker["goal"], json!(15));
    assert_eq!(maker["remaining"], json!(5.5));
    assert_eq!(maker["started"], true);
    assert_eq!(maker["completed"], false);
    assert_eq!(maker["completed_at"], Value::Null);
    let photo = maker["objectives"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["objective_id"] == "photo")
        .unwrap();
    assert_eq!(photo["counters"]["approved"], 3);
    assert_eq!(photo["counters"]["blocked"], 1);
    // Every enabled award appears, started or not; the marker award too.
    let three = award(&answer.body, "three-photos");
    assert_eq!(three["progress"], json!(3));
    assert_eq!(three["completed"], true);
    assert!(three["completed_at"].as_str().unwrap().ends_with('Z'));

    let either = award(&answer.body, "three-of-either");
    assert_eq!(
        (
            either["progress"].clone(),
            either["goal"].clone(),
            either["completed"].clone()
        ),
        (json!(3), json!(3), json!(true)),
        "4 units, capped at the goal: {either}"
    );
    let token = user_token("u-43", JWT_SECRET, 600);
    let other = server.get("/v1/users/u-43/awards", Some(&token)).await;
    assert_eq!(other.status, 200, "{}", other.body);
    let either = award(&other.body, "three-of-either");
    assert_eq!(
        (
            either["progress"].clone(),
            either["remaining"].clone(),
            either["completed"].clone()
        ),
        (json!(3), json!(0), json!(true)),
        "{either}"
    );
    assert_eq!(
        either["objectives"],
        json!([{"objective_id": "reviews", "counters": {"count": 1}},
               {"objective_id": "photos", "counters": {"count": 2}}])
    );

    // A user with nothing yet: every award at zero, its goal from the strategy.
    let token = user_token("u-new", JWT_SECRET, 600);
    let fresh = server.get("/v1/users/u-new/awards", Some(&token)).await;
    assert_eq!(fresh.status, 200);
    let maker = award(&fresh.body, "content-maker");
    assert_eq!(
        (
            maker["progress"].clone(),
            maker["goal"].clone(),
            maker["remaining"].clone()
        ),
        (json!(0), json!(15), json!(15))
    );
    assert_eq!(maker["started"], false);
    assert_eq!(maker["objectives"][0]["counters"], json!({}));

    // The admin API shows the same without a user token.
    let admin = server.admin("GET", "/users/u-42/awards", None).await;
    assert_eq!(admin.status, 200);
    assert_eq!(award(&admin.body, "content-maker")["progress"], json!(9.5));

    // The processing log, newest first, paged.
    let log = server.admin("GET", "/users/u-42/log?limit=100", None).await;
    assert_eq!(log.status, 200, "{}", log.body);
    let entries = log.body["entries"].as_array().unwrap();
    let ids: Vec<i64> = entries.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    let trip = entries
        .iter()
        .find(|e| e["event_id"] == "t-1")
        .expect("the trip is logged");
    assert_eq!(trip["outcome"], "applied");
    assert_eq!(
        trip["deltas"]["content-maker"]["navi"]["metres"], 5500,
        "{trip}"
    );
    assert!(
        trip["functions"].to_string().contains("SumFieldRule"),
        "{trip}"
    );
    let page = server.admin("GET", "/users/u-42/log?limit=2", None).await;
    assert_eq!(page.body["entries"].as_array().unwrap().len(), 2);
    let next = page.body["next_before"].as_i64().unwrap();
    let rest = server
        .admin(
            "GET",
            &format!("/users/u-42/log?limit=2&before={next}"),
            None,
        )
        .await;
    assert!(
        rest.body["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["id"].as_i64().unwrap() < next)
    );
    assert_eq!(
        server
            .admin("GET", "/users/u-42/log?limit=-1", None)
            .await
            .status,
        400
    );

    // Sources: state and consumer lag (everything consumed: 0, once the
    // watcher has read it again).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let photos = loop {
        let sources = server.admin("GET", "/sources", None).await;
        assert_eq!(sources.status, 200, "{}", sources.body);
        let photos = sources.body["sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "photos")
            .unwrap()
            .clone();
        if photos["lag"] == 0 || std::time::Instant::now() > deadline {
            break photos;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(photos["paused"], false);
    assert_eq!(photos["topic"], "events.photos");
    assert_eq!(photos["lag"], 0, "{photos}");
    let paused = server.admin("POST", "/sources/photos/pause", None).await;
    assert_eq!(
        (paused.status, paused.body.clone()),
        (200, json!({"name": "photos", "paused": true}))
    );
    let sources = server.admin("GET", "/sources", None).await;
    assert!(
        sources.body["sources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == "photos" && s["paused"] == true)
    );
    assert_eq!(
        server
            .admin("POST", "/sources/photos/resume", None)
            .await
            .body["paused"],
        false
    );
    let unknown = server.admin("POST", "/sources/nope/pause", None).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(error_text(&unknown), "no source named nope");

    // Metrics (this process's, shared by the tests running in it: at least
    // this test's share), and the lag read from the brokers.
    let metrics = server.text("/metrics").await;
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{series} missing from:\n{metrics}"))
    };
    assert!(value("laurel_events_applied_total{source=\"photos\"}") >= 4.0);
    assert!(value("laurel_function_calls_total{function=\"SumFieldRule\",kind=\"rule\"}") >= 1.0);
    assert!(
        value("laurel_function_call_seconds_count{function=\"ContentStatusRule\",kind=\"rule\"}")
            >= 1.0
    );
    assert!(value("laurel_awards_completed_total{award=\"three-photos\"}") >= 1.0);
    assert_eq!(value("laurel_consumer_lag{source=\"photos\"}"), 0.0);
    assert!(metrics.contains("# TYPE laurel_events_applied_total counter"));

    // Health: PostgreSQL, Redis and Kafka all answer.
    let health = server.get("/healthz", None).await;
    assert_eq!(health.status, 200, "{}", health.body);
    assert_eq!(health.body["checks"]["kafka"]["ok"], true);
    drop(server);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_reads_only_their_own_awards_with_a_valid_token() {
    let (db, registry) = database_with(AWARDS).await;
    let server = Server::start(&db.url, registry, None).await;
    let path = "/v1/users/u-1/awards";

    let none = server.get(path, None).await;
    assert_eq!(none.status, 401);
    assert_eq!(error_text(&none), "missing Authorization: Bearer <token>");
    let garbage = server.get(path, Some("not-a-jwt")).await;
    assert_eq!(garbage.status, 401);
    assert!(
        error_text(&garbage).starts_with("invalid token"),
        "{}",
        garbage.body
    );
    let forged = server
        .get(path, Some(&user_token("u-1", "another-secret", 600)))
        .await;
    assert_eq!(forged.status, 401);
    assert!(
        error_text(&forged).contains("InvalidSignature"),
        "{}",
        forged.body
    );
    let expired = server
        .get(path, Some(&user_token("u-1", JWT_SECRET, -3600)))
        .await;
    assert_eq!(expired.status, 401);
    assert!(
        error_text(&expired).contains("it has expired"),
        "{}",
        expired.body
    );
    // An unsigned token ("alg": "none") is never accepted.
    let unsigned = format!(
        "{}.{}.",
        base64url(br#"{"alg":"none","typ":"JWT"}"#),
        base64url(br#"{"sub":"u-1"}"#)
    );
    assert_eq!(server.get(path, Some(&unsigned)).await.status, 401);

    let other = server
        .get(path, Some(&user_token("u-2", JWT_SECRET, 600)))
        .await;
    assert_eq!(other.status, 403);
    assert!(
        error_text(&other).contains("another user"),
        "{}",
        other.body
    );
    // The admin token is not a user token.
    assert_eq!(server.get(path, Some(ADMIN)).await.status, 401);

    let own = server
        .get(path, Some(&user_token("u-1", JWT_SECRET, 600)))
        .await;
    assert_eq!(own.status, 200);
    assert_eq!(own.body["awards"].as_array().unwrap().len(), 3);

    // Banned or deleted: 404.
    let mut store = db.store().await;
    store.set_user_state("u-1", "banned").await.unwrap();
    let banned = server
        .get(path, Some(&user_token("u-1", JWT_SECRET, 600)))
        .await;
    assert_eq!(banned.status, 404);
    assert_eq!(error_text(&banned), "user u-1 not found");
    let admin = server.admin("GET", "/users/u-1/awards", None).await;
    assert_eq!(
        (admin.status, error_text(&admin)),
        (404, "user u-1 is banned")
    );
    store.set_user_state("u-1", "deleted").await.unwrap();
    assert_eq!(
        server
            .get(path, Some(&user_token("u-1", JWT_SECRET, 600)))
            .await
            .status,
        404
    );
    drop(server);
    db.drop_database().await;
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A fresh database with the built-in library, `awards` applied, and a
/// registry.
pub async fn database_with(awards: &str) -> (TestDb, Arc<Registry>) {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    laurel::library::register(&mut store, &runtime)
        .await
        .unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    laurel::definitions::apply(&mut store, &registry, awards)
        .await
        .unwrap();
    (db, registry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_manages_awards_all_or_nothing() {
    let (db, registry) = database_with("[]").await;
    let server = Server::start(&db.url, registry, None).await;

    // The admin token guards every path, routes or not.
    assert_eq!(server.get("/admin/v1/awards", None).await.status, 401);
    let wrong = server.get("/admin/v1/awards", Some("guess")).await;
    assert_eq!(
        (wrong.status, error_text(&wrong)),
        (401, "invalid admin token")
    );
    assert_eq!(
        server.get("/admin/v1/no-such-thing", None).await.status,
        401
    );

    let definitions: Vec<Value> = serde_json::from_str(AWARDS).unwrap();
    let mut maker = definitions[0].clone();
    let put = server
        .admin("PUT", "/awards/content-maker", Some(maker.clone()))
        .await;
    assert_eq!(
        (put.status, put.body.clone()),
        (200, json!({"id": "content-maker", "version": 1}))
    );
    let got = server.admin("GET", "/awards/content-maker", None).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body["version"], 1);
    assert_eq!(
        got.body["definition"]["objectives"][2]["rule"]["name"],
        "SumFieldRule"
    );
    // The new award shows at once in users' awards.
    let fresh = server.admin("GET", "/users/u-9/awards", None).await;
    assert_eq!(award(&fresh.body, "content-maker")["goal"], json!(15));

    // An unknown function and a config its function refuses: 422 naming
    // objective, function and reason; nothing changes.
    maker["title"] = "Changed".into();
    maker["objectives"][0]["rule"]["name"] = "NoSuchRule".into();
    maker["objectives"][1]["filters"][1]["config"] = json!({"allowed_length": "long"});
    let refused = server
        .admin("PUT", "/awards/content-maker", Some(maker.clone()))
        .await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    let problems = refused.body["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 2, "{}", refused.body);
    assert_eq!(problems[0]["objective"], "photo");
    assert_eq!(problems[0]["function"], "NoSuchRule");
    assert!(
        problems[0]["reason"]
            .as_str()
            .unwrap()
            .contains("no function named NoSuchRule"),
        "{}",
        refused.body
    );
    assert_eq!(problems[1]["objective"], "reviews");
    assert_eq!(problems[1]["function"], "ReviewsLengthFilter");
    assert!(
        error_text(&refused).contains("objective reviews"),
        "{}",
        refused.body
    );
    let unchanged = server.admin("GET", "/awards/content-maker", None).await;
    assert_eq!(
        (
            unchanged.body["version"].clone(),
            unchanged.body["definition"]["title"].clone()
        ),
        (json!(1), json!("Content maker"))
    );

    // The body's id must be the path's; a body without id takes the path's.
    let mismatch = server
        .admin("PUT", "/awards/other", Some(definitions[1].clone()))
        .await;
    assert_eq!(mismatch.status, 422);
    assert!(
        error_text(&mismatch).contains("differs from the id in the path"),
        "{}",
        mismatch.body
    );
    let mut anonymous = definitions[1].clone();
    anonymous.as_object_mut().unwrap().remove("id");
    let put = server
        .admin("PUT", "/awards/photo-trio", Some(anonymous))
        .await;
    assert_eq!(put.status, 200, "{}", put.body);
    let list = server.admin("GET", "/awards", None).await;
    let ids: Vec<&str> = list.body["awards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["content-maker", "photo-trio"]);

    // Malformed bodies: clear 4xx, nothing written.
    let broken = server
        .call(
            "PUT",
            "/admin/v1/awards/x",
            Some(ADMIN),
            Some(("application/json", b"{\"id\": ".to_vec())),
        )
        .await;
    assert_eq!(broken.status, 400);
    assert!(
        error_text(&broken).starts_with("the request body is not valid JSON"),
        "{}",
        broken.body
    );
    let array = server.admin("PUT", "/awards/x", Some(json!([1, 2]))).await;
    assert_eq!(array.status, 422);
    let huge = server
        .call(
            "PUT",
            "/admin/v1/awards/x",
            Some(ADMIN),
            Some(("application/json", vec![b' '; 100 << 10])),
        )
        .await;
    assert_eq!(huge.status, 413);
    assert!(
        error_text(&huge).contains("over the limit"),
        "{}",
        huge.body
    );
    assert_eq!(server.admin("GET", "/awards/x", None).await.status, 404);

    let deleted = server.admin("DELETE", "/awards/photo-trio", None).await;
    assert_eq!(deleted.status, 204);
    assert_eq!(
        server
            .admin("DELETE", "/awards/photo-trio", None)
            .await
            .status,
        404
    );
    let users = server.admin("GET", "/users/u-9/awards", None).await;
    assert_eq!(users.body["awards"].as_array().unwrap().len(), 1);
    drop(server);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_uploads_and_lists_functions() {
    let (db, registry) = database_with("[]").await;
    let server = Server::start(&db.url, registry, None).await;
    let wasm = support::guest_bytes("accept_all_filter");
    let upload = |content_type: &'static str, bytes: Vec<u8>, query: &'static str| {
        let server = &server;
        async move {
            server
                .call(
                    "PUT",
                    &format!("/admin/v1/functions/AcceptAll{query}"),
                    Some(ADMIN),
                    Some((content_type, bytes)),
                )
                .await
        }
    };
    let wrong_type = upload("application/octet-stream", wasm.clone(), "").await;
    assert_eq!(wrong_type.status, 415);
    assert!(error_text(&wrong_type).contains("application/wasm"));
    let not_wasm = upload("application/wasm", b"hello".to_vec(), "").await;
    assert_eq!(not_wasm.status, 422);
    assert!(
        error_text(&not_wasm).contains("not a valid Wasm component"),
        "{}",
        not_wasm.body
    );
    let wrong_kind = upload("application/wasm", wasm.clone(), "?kind=rule").await;
    assert_eq!(wrong_kind.status, 422);
    assert!(
        error_text(&wrong_kind).contains("is a filter"),
        "{}",
        wrong_kind.body
    );

    let created = upload("application/wasm", wasm.clone(), "?kind=filter").await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(
        created.body,
        json!({"name": "AcceptAll", "kind": "filter", "version": 1, "created": true, "live": true,
               "limits": {"cpu_ms": 10000, "memory_mib": 64}})
    );
    let again = upload("application/wasm", wasm.clone(), "").await;
    assert_eq!(
        (again.status, again.body["created"].clone()),
        (200, json!(false))
    );

    let list = server.admin("GET", "/functions", None).await;
    let accept = list.body["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "AcceptAll")
        .unwrap()
        .clone();
    assert_eq!(accept["kind"], "filter");
    assert_eq!(accept["size"], wasm.len());
    assert_eq!(accept["builtin"], false);
    assert!(
        list.body["functions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == "TreeStrategy" && f["builtin"] == true)
    );
    drop(server);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_are_checked_as_themselves_and_awards_see_them_at_once() {
    // A long-running server with a compile cache, as in production.
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let cache = std::env::temp_dir().join(format!("laurel-api-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let runtime =
        laurel::runtime::Runtime::new(laurel::runtime::Limits::default(), Some(cache.clone()))
            .unwrap();
    laurel::library::register(&mut store, &runtime)
        .await
        .unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    let server = Server::start(&db.url, registry, None).await;
    let push = |name: String, bytes: &'static [u8]| {
        let server = &server;
        async move {
            server
                .call(
                    "PUT",
                    &format!("/admin/v1/functions/{name}"),
                    Some(ADMIN),
                    Some(("application/wasm", bytes.to_vec())),
                )
                .await
        }
    };
    let builtin = |name: &str| laurel::library::builtin(name).unwrap().bytes;
    // Two teams' components one after the other: each checked as itself.
    let filter = push("TeamFilter".into(), builtin("EventTypeFilter")).await;
    assert_eq!(
        (filter.status, filter.body["kind"].clone()),
        (201, json!("filter")),
        "{}",
        filter.body
    );
    let rule = push("TeamRule".into(), builtin("CountRule")).await;
    assert_eq!(
        (rule.status, rule.body["kind"].clone()),
        (201, json!("rule")),
        "{}",
        rule.body
    );
    // Push, then at once an award naming it: 100 times, no sleep.
    for i in 0..100 {
        let pushed = push(format!("Counter{i}"), builtin("CountRule")).await;
        assert_eq!(pushed.status, 201, "{}", pushed.body);
        let award = json!({"id": format!("award-{i}"), "title": "Counted",
            "objectives": [{"id": "o", "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}}],
                            "rule": {"name": format!("Counter{i}"), "config": {"counter": "n"}},
                            "progress_counter": "n"}],
            "strategy": {"goal": 1, "strategy": [{"objective_id": "o"}]}});
        let applied = server
            .admin("PUT", &format!("/awards/award-{i}"), Some(award))
            .await;
        assert!(
            applied.status == 200 || applied.status == 201,
            "round {i}: {} {}",
            applied.status,
            applied.body
        );
    }
    // A new version that refuses an award's config is refused, naming it,
    // though a filter (TeamFilter) was compiled last under no other name.
    let breaking = push("Counter7".into(), builtin("SumFieldRule")).await;
    assert_eq!(breaking.status, 422, "{}", breaking.body);
    // Checked as SumFieldRule, which wants a `field` (not as whatever the
    // cache held under a fixed name).
    let reason = error_text(&breaking);
    assert!(
        reason.contains("award-7") && reason.contains("field") && !reason.contains("filter"),
        "{}",
        breaking.body
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&cache);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_is_refused_every_write_and_every_write_is_audited() {
    const DEPLOYER: &str = "deployer-token-0123456789";
    const SUPPORT: &str = "support-token-0123456789";
    let (db, registry) = database_with("[]").await;
    let server = Server::start_custom(&db.url, registry, None, None, |settings| {
        settings.admin_tokens = laurel::api::AdminToken::parse_list(&format!(
            "deployer:admin:{DEPLOYER}, support:read:{SUPPORT}"
        ))
        .unwrap();
    })
    .await
    .unwrap();
    // Every documented write, walked from the OpenAPI document.
    let document = server.get("/openapi.json", None).await.body;
    let mut writes = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        if !path.starts_with("/admin/v1") {
            continue;
        }
        for method in item.as_object().unwrap().keys() {
            if method == "get" || method == "parameters" {
                continue;
            }
            let concrete = path
                .replace("{user_id}", "u-1")
                .replace("{award_id}", "a-1")
                .replace("{id}", "a-1")
                .replace("{name}", "n-1")
                .replace("{pool}", "p-1");
            let answer = server
                .call(
                    &method.to_uppercase(),
                    &concrete,
                    Some(SUPPORT),
                    Some(("application/json", b"{}".to_vec())),
                )
                .await;
            assert_eq!(answer.status, 403, "{method} {path}: {}", answer.body);
            assert_eq!(
                error_text(&answer),
                format!(
                    "token support is read-only; {} is a write",
                    method.to_uppercase()
                )
            );
            writes += 1;
        }
    }
    assert!(writes >= 10, "{writes} writes documented");
    // It reads.
    assert_eq!(
        server
            .call("GET", "/admin/v1/awards", Some(SUPPORT), None)
            .await
            .status,
        200
    );

    // The deployer writes: each recorded with its name and versions.
    let as_deployer = |method: &'static str, path: &'static str, body: Option<Value>| {
        let server = &server;
        async move {
            server
                .call(
                    method,
                    &format!("/admin/v1{path}"),
                    Some(DEPLOYER),
                    body.map(|b| ("application/json", b.to_string().into_bytes())),
                )
                .await
        }
    };
    let award = json!({"id": "a", "title": "A",
        "objectives": [{"id": "o", "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}}],
                        "rule": {"name": "CountRule", "config": {"counter": "n"}}, "progress_counter": "n"}],
        "strategy": {"goal": 1, "strategy": [{"objective_id": "o"}]}});
    assert_eq!(
        as_deployer("PUT", "/awards/a", Some(award.clone()))
            .await
            .status,
        200
    );
    let mut changed = award.clone();
    changed["title"] = json!("A, again");
    assert_eq!(
        as_deployer("PUT", "/awards/a", Some(changed)).await.status,
        200
    );
    assert_eq!(as_deployer("DELETE", "/awards/a", None).await.status, 204);
    let refused = as_deployer("PUT", "/awards/b?force=true", Some(json!({"id": "b"}))).await;
    assert_eq!(refused.status, 422);
    let hook = as_deployer(
        "PUT",
        "/webhooks/h",
        Some(json!({"url": "https://bot:s3cr3t-hook@hooks.example/in"})),
    )
    .await;
    assert_eq!(hook.status, 200);
    // A read token sees the webhook without its credentials.
    let seen = server
        .call("GET", "/admin/v1/webhooks/h", Some(SUPPORT), None)
        .await;
    assert_eq!(seen.body["url"], "https://bot:***@hooks.example/in");

    let audit = server
        .call("GET", "/admin/v1/audit?limit=500", Some(SUPPORT), None)
        .await;
    assert_eq!(audit.status, 200, "{}", audit.body);
    let entries: Vec<(String, String, String, i64, Value, Value, Value)> = audit.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["token"] == "deployer")
        .map(|e| {
            (
                e["token"].as_str().unwrap().to_string(),
                e["method"].as_str().unwrap().to_string(),
                e["path"].as_str().unwrap().to_string(),
                e["status"].as_i64().unwrap(),
                e["target"].clone(),
                e["version_before"].clone(),
                e["version_after"].clone(),
            )
        })
        .collect();
    let d = |m: &str, p: &str, s: i64, t: Value, b: Value, a: Value| {
        (
            "deployer".to_string(),
            m.to_string(),
            p.to_string(),
            s,
            t,
            b,
            a,
        )
    };
    assert_eq!(
        entries,
        vec![
            d(
                "PUT",
                "/admin/v1/webhooks/h",
                200,
                Value::Null,
                Value::Null,
                Value::Null
            ),
            d(
                "PUT",
                "/admin/v1/awards/b?force=true",
                422,
                Value::Null,
                Value::Null,
                Value::Null
            ),
            d(
                "DELETE",
                "/admin/v1/awards/a",
                204,
                json!("award a"),
                json!(2),
                Value::Null
            ),
            d(
                "PUT",
                "/admin/v1/awards/a",
                200,
                json!("award a"),
                json!(1),
                json!(2)
            ),
            d(
                "PUT",
                "/admin/v1/awards/a",
                200,
                json!("award a"),
                Value::Null,
                json!(1)
            ),
        ]
    );
    // The read token's refused writes never ran, and each is recorded as
    // refused: who tried what.
    let refused: Vec<&Value> = audit.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["token"] == "support")
        .collect();
    assert_eq!(refused.len(), writes, "{}", audit.body);
    assert!(refused.iter().all(|e| e["status"] == 403), "{refused:?}");
    drop(server);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_pool_is_set_up_and_deleted_over_http_alone() {
    let (db, registry) = database_with("[]").await;
    let server = Server::start(&db.url, registry, None).await;
    let pool = crate::proxy::pool_name("over-http");
    let bad = server
        .admin(
            "PUT",
            &format!("/proxy-pools/{pool}"),
            Some(json!({"check_url": "file:///etc/passwd", "policy": "round-robin", "timeout_ms": 0})),
        )
        .await;
    assert_eq!(bad.status, 422, "{}", bad.body);
    let text = error_text(&bad);
    for problem in [
        "unknown policy \"round-robin\"",
        "check URL",
        "timeout must be between",
    ] {
        assert!(text.contains(problem), "{text}");
    }
    let typo = server
        .admin(
            "PUT",
            &format!("/proxy-pools/{pool}"),
            Some(json!({"check_url": "http://x/c", "polcy": "x"})),
        )
        .await;
    assert_eq!(typo.status, 422);
    assert!(
        error_text(&typo).contains("unknown field `polcy`"),
        "{}",
        typo.body
    );
    let set = server
        .admin(
            "PUT",
            &format!("/proxy-pools/{pool}"),
            Some(json!({"check_url": "https://check.example/echo", "policy": "least-concurrent", "max_in_flight": 2})),
        )
        .await;
    assert_eq!(set.status, 200, "{}", set.body);
    let got = server
        .admin("GET", &format!("/proxy-pools/{pool}"), None)
        .await;
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(got.body["config"]["policy"], "least-concurrent");
    assert_eq!(got.body["config"]["timeout_ms"], 5000);
    assert_eq!(got.body["config"]["allow_private"], false);
    assert_eq!(
        server
            .admin("DELETE", &format!("/proxy-pools/{pool}"), None)
            .await
            .status,
        204
    );
    assert_eq!(
        server
            .admin("DELETE", &format!("/proxy-pools/{pool}"), None)
            .await
            .status,
        404
    );
    drop(server);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_manages_webhooks() {
    let (db, registry) = database_with("[]").await;
    let server = Server::start(&db.url, registry, None).await;
    let put = server.admin("PUT", "/webhooks/crm", Some(json!({"url": "http://127.0.0.1:9/hook", "events": ["award.completed"], "proxy_pool": null}))).await;
    assert_eq!(put.status, 200, "{}", put.body);
    assert_eq!(
        put.body,
        json!({"name": "crm", "url": "http://127.0.0.1:9/hook", "events": ["award.completed"], "proxy_pool": null})
    );
    assert_eq!(
        server.admin("GET", "/webhooks/crm", None).await.body,
        put.body
    );
    // Stored where the notifier reads it.
    let hooks = db.store().await.webhooks().await.unwrap();
    assert_eq!(hooks.len(), 1);
    assert_eq!(hooks[0].url, "http://127.0.0.1:9/hook");

    let bad_url = server
        .admin("PUT", "/webhooks/crm", Some(json!({"url": "ftp://x"})))
        .await;
    assert_eq!(bad_url.status, 422);
    assert!(
        error_text(&bad_url).starts_with("webhook crm: invalid webhook URL"),
        "{}",
        bad_url.body
    );
    let bad_event = server
        .admin(
            "PUT",
            "/webhooks/crm",
            Some(json!({"url": "http://x/", "events": ["award.nope"]})),
        )
        .await;
    assert_eq!(bad_event.status, 422);
    let typo = server
        .admin(
            "PUT",
            "/webhooks/crm",
            Some(json!({"url": "http://x/", "evnts": []})),
        )
        .await;
    assert_eq!(typo.status, 422);
    assert!(
        error_text(&typo).contains("unknown field `evnts`"),
        "{}",
        typo.body
    );
    assert_eq!(
        server.admin("GET", "/webhooks/crm", None).await.body["url"],
        "http://127.0.0.1:9/hook"
    );

    let defaulted = server
        .admin(
            "PUT",
            "/webhooks/ops",
            Some(json!({"url": "https://example.com/h", "proxy_pool": "egress"})),
        )
        .await;
    assert_eq!(defaulted.body["events"], json!(["award.completed"]));
    let list = server.admin("GET", "/webhooks", None).await;
    assert_eq!(list.body["webhooks"].as_array().unwrap().len(), 2);
    assert_eq!(
        server.admin("DELETE", "/webhooks/crm", None).await.status,
        204
    );
    let gone = server.admin("GET", "/webhooks/crm", None).await;
    assert_eq!(
        (gone.status, error_text(&gone)),
        (404, "no webhook named crm")
    );
    drop(server);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_imports_inspects_and_allocates_proxy_pools() {
    let (db, registry) = database_with("[]").await;
    let server = Server::start(&db.url, registry, None).await;
    let pool = crate::proxy::pool_name("api");
    let live = crate::proxy::Tinyproxy::start("api-live");
    let dead = crate::proxy::free_port();
    let list = format!(
        "# a free proxy list\nhttp://127.0.0.1:{}\nhttp://127.0.0.1:{dead}\nnot a proxy\n",
        live.port()
    );
    let path = format!("/admin/v1/proxy-pools/{pool}/candidates");
    let unknown = server
        .call(
            "PUT",
            &path,
            Some(ADMIN),
            Some(("text/plain", list.clone().into_bytes())),
        )
        .await;
    assert_eq!(unknown.status, 404);
    assert!(
        error_text(&unknown).contains("is not configured"),
        "{}",
        unknown.body
    );

    let check_url = crate::proxy::check_server().await;
    db.store()
        .await
        .set_proxy_pool(&crate::proxy::pool_config(&pool, &check_url))
        .await
        .unwrap();
    let empty = server
        .admin("POST", &format!("/proxy-pools/{pool}/allocate"), None)
        .await;
    assert_eq!(empty.status, 409);
    assert_eq!(
        error_text(&empty),
        format!("proxy pool {pool} has no eligible member")
    );

    let imported = server
        .call(
            "PUT",
            &path,
            Some(ADMIN),
            Some(("text/plain", list.into_bytes())),
        )
        .await;
    assert_eq!(imported.status, 200, "{}", imported.body);
    let live_proxy = format!("http://127.0.0.1:{}", live.port());
    assert_eq!(imported.body["admitted"][0]["proxy"], live_proxy.as_str());
    assert_eq!(
        imported.body["refused"][0]["proxy"],
        format!("http://127.0.0.1:{dead}")
    );
    assert_eq!(
        imported.body["junk"],
        json!([{"line": 4, "text": "not a proxy", "reason": imported.body["junk"][0]["reason"]}])
    );

    let status = server
        .admin("GET", &format!("/proxy-pools/{pool}"), None)
        .await;
    assert_eq!(status.status, 200, "{}", status.body);
    assert_eq!(status.body["eligible"], 1);
    let members = status.body["members"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    let dead_member = members.iter().find(|m| m["eligible"] == false).unwrap();
    assert!(
        dead_member["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{dead_member}"
    );

    for n in 1..=3 {
        let allocated = server
            .admin("POST", &format!("/proxy-pools/{pool}/allocate"), None)
            .await;
        assert_eq!(
            (allocated.status, allocated.body.clone()),
            (200, json!({"proxy": live_proxy}))
        );
        let status = server
            .admin("GET", &format!("/proxy-pools/{pool}"), None)
            .await;
        let member = status.body["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["proxy"] == live_proxy.as_str())
            .unwrap()
            .clone();
        assert_eq!(member["allocations"], json!(n));
    }
    let invalid = server.admin("GET", "/proxy-pools/bad%20name", None).await;
    assert_eq!(invalid.status, 400);
    assert_eq!(
        server
            .admin("GET", "/proxy-pools/never-configured", None)
            .await
            .status,
        404
    );
    drop(server);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_clear_json_errors() {
    let (db, registry) = database_with("[]").await;
    let server = Server::start(&db.url, registry, None).await;
    let unknown = server.get("/v2/nothing", None).await;
    assert_eq!(unknown.status, 404);
    assert!(error_text(&unknown).starts_with("no route for GET /v2/nothing"));
    let method = server
        .call("DELETE", "/v1/users/u-1/awards", None, None)
        .await;
    assert_eq!(method.status, 405);
    assert_eq!(
        error_text(&method),
        "DELETE is not allowed on /v1/users/u-1/awards"
    );
    let scheme = server
        .client
        .get(format!("{}/v1/users/u-1/awards", server.base))
        .header("authorization", "Basic dTpw")
        .send()
        .await
        .unwrap();
    assert_eq!(scheme.status().as_u16(), 401);
    assert_eq!(scheme.headers()["www-authenticate"], "Bearer");
    let not_json = server
        .call(
            "PUT",
            "/admin/v1/webhooks/x",
            Some(ADMIN),
            Some(("application/json", vec![0xff, 0xfe])),
        )
        .await;
    assert_eq!(not_json.status, 400);
    let bad_flag = server.admin("GET", "/functions?all=maybe", None).await;
    assert_eq!(bad_flag.status, 400);
    assert!(error_text(&bad_flag).contains("all must be true or false"));
    drop(server);
    db.drop_database().await;
}

/// Every operation of the OpenAPI document is routed (not a 404 "no
/// route" or 405), and every route in the code is in the document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_document_matches_the_routes() {
    let (db, registry) = database_with("[]").await;
    let server = Server::start(&db.url, registry, None).await;
    let served = server.get("/openapi.json", None).await;
    assert_eq!(served.status, 200);
    assert_eq!(served.body["openapi"], "3.1.0");
    let paths = served.body["paths"].as_object().unwrap();
    let mut documented = Vec::new();
    for (path, item) in paths {
        for (method, _) in item
            .as_object()
            .unwrap()
            .iter()
            .filter(|(m, _)| *m != "parameters")
        {
            documented.push(format!("{} {path}", method.to_uppercase()));
            let concrete = path
                .replace("{user_id}", "u-1")
                .replace("{id}", "a-1")
                .replace("{name}", "n-1")
                .replace("{pool}", "p-1");
            // With the token: the admin guard answers 401 for any path.
            let token = concrete.starts_with("/admin/").then_some(ADMIN);
            let answer = server
                .call(&method.to_uppercase(), &concrete, token, None)
                .await;
            let error = answer.body["error"].as_str().unwrap_or_default();
            assert!(
                answer.status != 405 && !error.starts_with("no route"),
                "{method} {path} is documented but not routed: {} {}",
                answer.status,
                answer.body
            );
        }
    }
    // The routes as the code declares them.
    let sources = [
        include_str!("../../src/api/mod.rs"),
        include_str!("../../src/api/public.rs"),
        include_str!("../../src/api/admin/mod.rs"),
    ];
    let mut declared = 0;
    for (index, source) in sources.iter().enumerate() {
        let prefix = if index == 2 { "/admin/v1" } else { "" };
        for piece in source.split(".route(").skip(1) {
            let path = piece.trim_start().trim_start_matches('"');
            let path = &path[..path.find('"').unwrap()];
            // Up to the parenthesis that closes `.route(`.
            let mut depth = 1;
            let end = piece
                .char_indices()
                .find(|(_, c)| {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(piece.len(), |(at, _)| at);
            let methods = &piece[..end];
            for method in ["get", "put", "post", "delete"] {
                if methods.contains(&format!("{method}(")) {
                    declared += 1;
                    let operation = format!("{} {prefix}{path}", method.to_uppercase());
                    assert!(
                        documented.contains(&operation),
                        "{operation} is routed but not in openapi.json"
                    );
                }
            }
        }
    }
    assert_eq!(declared, documented.len(), "documented: {documented:?}");
    drop(server);
    db.drop_database().await;
}

/// Photos that count while active; reviews that count once per object.
const EXPLAINED: &str = r#"[{
  "id": "active-photos", "title": "Active photos",
  "objectives": [
    {"id": "photos",
     "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}},
                 {"name": "StatusFilter", "config": {"statuses": ["active"]}}],
     "rule": {"name": "ContentStatusRule", "config": {"counters": {"active": "approved"}}},
     "progress_counter": "approved"},
    {"id": "reviews",
     "filters": [{"name": "SourceFilter", "config": {"sources": ["reviews"]}}],
     "rule": {"name": "ReviewUniqueByObjectRule", "config": {}},
     "progress_counter": "count"}],
  "strategy": {"goal": 10, "operation": "sum", "strategy": [{"objective_id": "photos"}, {"objective_id": "reviews"}]}
}]"#;

/// Newest first, and of one occurred_at the later in the topic first: as
/// ingest decides which is an item's last event, whichever id is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_lists_an_items_events_at_one_time_later_in_the_topic_first() {
    let mut p = Pipeline::start(EXPLAINED, &["photos", "reviews"]).await;
    for (id, status) in [("evt-z", "active"), ("evt-a", "blocked")] {
        p.send(&event(
            id,
            "photos",
            "u-7",
            Some(("photo-1", status)),
            1,
            json!({}),
        ))
        .await;
    }
    p.settle("photos", "u-7").await;
    assert_eq!(
        p.objective("u-7", "active-photos", "photos").await,
        std::collections::BTreeMap::new(),
        "blocked, the later"
    );
    let server = Server::start(
        &p.db.url,
        p.registry.clone(),
        Some(p.broker.bootstrap_servers()),
    )
    .await;
    let answer = server
        .admin("GET", "/users/u-7/awards/active-photos/explain", None)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let ids: Vec<&str> = answer.body["recent_events_evaluated"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["event_id"].as_str())
        .filter(|id| id.starts_with("evt-"))
        .collect();
    assert_eq!(ids, ["evt-a", "evt-z"]);
    drop(server);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_says_which_items_count_and_which_filter_stopped_the_others() {
    let mut p = Pipeline::start(EXPLAINED, &["photos", "reviews"]).await;
    let photo = |id: &str, content: &str, status: &str, tick: u32| {
        event(
            id,
            "photos",
            "u-7",
            Some((content, status)),
            tick,
            json!({}),
        )
    };
    p.send(&photo("e-1", "photo-1", "active", 1)).await;
    p.send(&photo("e-2", "photo-2", "active", 2)).await;
    p.send(&photo("e-3", "photo-3", "active", 3)).await;
    // Counted, then blocked: the status filter takes it out.
    p.send(&photo("e-4", "photo-3", "blocked", 4)).await;
    // Never counted: still on moderation.
    p.send(&photo("e-5", "photo-4", "moderation", 5)).await;
    for (id, review, tick) in [("e-6", "review-1", 6), ("e-7", "review-2", 7)] {
        p.send(&event(
            id,
            "reviews",
            "u-7",
            Some((review, "active")),
            tick,
            json!({"object_id": "cafe-9", "text": "fine"}),
        ))
        .await;
    }
    p.settle("photos", "u-7").await;
    p.settle("reviews", "u-7").await;
    p.awards_worker().await.drain().await.unwrap();
    let server = Server::start(
        &p.db.url,
        p.registry.clone(),
        Some(p.broker.bootstrap_servers()),
    )
    .await;

    let answer = server
        .admin("GET", "/users/u-7/awards/active-photos/explain", None)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let body = &answer.body;
    // 2 active photos + 1 for the two reviews of one object.
    assert_eq!(
        (
            body["award_id"].clone(),
            body["progress"].clone(),
            body["goal"].clone()
        ),
        (json!("active-photos"), json!(3), json!(10))
    );
    let photos = &body["objectives"][0];
    assert_eq!(photos["objective_id"], "photos");
    assert_eq!(photos["filters"], json!(["SourceFilter", "StatusFilter"]));
    assert_eq!(photos["rule"], "ContentStatusRule");
    assert_eq!(photos["sources"], json!(["photos"]));
    assert_eq!(photos["counters"], json!({"approved": 2}));
    let counted: Vec<(&str, &Value)> = photos["contributing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["content_id"].as_str().unwrap(), &i["counters"]))
        .collect();
    assert_eq!(
        counted,
        vec![
            ("photo-2", &json!({"approved": 1})),
            ("photo-1", &json!({"approved": 1}))
        ]
    );
    let idle = photos["not_contributing"].as_array().unwrap();
    let why: Vec<(&str, &str)> = idle
        .iter()
        .map(|i| {
            (
                i["content_id"].as_str().unwrap(),
                i["why"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(why.len(), 2, "{idle:?}");
    // Never counted, so not in the log: its last event, read back from
    // Kafka and run through the filters again, says which one stops it.
    assert_eq!(why[0], ("photo-4", "excluded by filter StatusFilter"));
    assert_eq!(why[1], ("photo-3", "excluded by filter StatusFilter"));
    assert_eq!(idle[1]["event_id"], "e-4");

    let reviews = &body["objectives"][1];
    assert_eq!(reviews["counters"], json!({"count": 1}));
    let keys: Vec<&Value> = reviews["contributing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["dedup_key"])
        .collect();
    assert_eq!(keys.len(), 2);
    assert!(
        keys.iter().all(|k| *k == keys[0] && !k.is_null()),
        "{keys:?}"
    );
    // Reviews never show under photos, nor photos under reviews.
    assert!(
        reviews["not_contributing"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["source"] == "reviews")
    );

    // The award's recent log, newest first; the block names the filter.
    // (The test's marker events reach the review rule, which refuses them
    // for want of a content item; e-7 changed nothing: same object as e-6.)
    // The two sources are consumed side by side: order holds per source.
    let recent = body["recent_events"].as_array().unwrap();
    let marker = recent
        .iter()
        .find(|e| e["event_id"].as_str().unwrap().starts_with("marker-"))
        .expect("the review marker is logged");
    assert_eq!(
        (marker["outcome"].as_str(), marker["reason"].as_str()),
        (
            Some("rejected"),
            Some(
                "rule ReviewUniqueByObjectRule: event has no content_id: a review is a content item"
            )
        )
    );
    let ids: Vec<i64> = recent.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    let of = |source: &str| -> Vec<&str> {
        recent
            .iter()
            .filter(|e| e["source"] == source)
            .filter_map(|e| e["event_id"].as_str())
            .filter(|id| id.starts_with("e-"))
            .collect()
    };
    assert_eq!(of("photos"), ["e-4", "e-3", "e-2", "e-1"]);
    assert_eq!(of("reviews"), ["e-6"]);
    let blocked = recent.iter().find(|e| e["event_id"] == "e-4").unwrap();
    assert_eq!(blocked["deltas"]["active-photos"]["photos"]["approved"], -1);
    assert_eq!(
        blocked["reason"],
        "active-photos/photos: excluded by filter StatusFilter"
    );
    // Stored as data, not as words: explain reads the filter from it.
    assert_eq!(
        blocked["excluded"],
        json!({"active-photos": {"photos": "StatusFilter"}})
    );
    let stored: (Option<String>, Value) = {
        let row =
            p.db.sql()
                .await
                .query_one(
                    "SELECT reason, excluded FROM processing_log WHERE event_id = 'e-4'",
                    &[],
                )
                .await
                .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(
        stored,
        (None, json!({"active-photos": {"photos": "StatusFilter"}}))
    );
    // The user's recent events, each as every objective sees it now.
    let evaluated = body["recent_events_evaluated"].as_array().unwrap();
    let seen = |id: &str| -> Vec<String> {
        let event = evaluated
            .iter()
            .find(|e| e["event_id"] == id)
            .unwrap_or_else(|| panic!("{id} missing from {evaluated:#?}"));
        event["objectives"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["outcome"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        seen("e-5"),
        [
            "excluded by filter StatusFilter",
            "excluded by filter SourceFilter"
        ]
    );
    assert_eq!(
        seen("e-2"),
        [
            "rule ContentStatusRule counts approved 1",
            "excluded by filter SourceFilter"
        ]
    );
    // Each outcome is the words of a typed verdict, shown beside them.
    let e2 = evaluated.iter().find(|e| e["event_id"] == "e-2").unwrap();
    assert_eq!(
        e2["objectives"][0]["verdict"],
        json!({"kind": "counted", "rule": "ContentStatusRule",
               "counters": {"approved": 1}, "additive": false})
    );
    assert_eq!(
        e2["objectives"][1]["verdict"],
        json!({"kind": "excluded", "filter": "SourceFilter"})
    );
    assert_eq!(
        seen("e-7"),
        [
            "excluded by filter SourceFilter",
            "rule ReviewUniqueByObjectRule counts count 1"
        ]
    );
    assert!(body.get("recent_events_note").is_none(), "{body}");
    let few = server
        .admin(
            "GET",
            "/users/u-7/awards/active-photos/explain?events=1",
            None,
        )
        .await;
    assert_eq!(few.body["recent_events"].as_array().unwrap().len(), 1);
    assert_eq!(
        few.body["recent_events_evaluated"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        few.body["objectives"][0]["not_contributing"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let missing = server
        .admin("GET", "/users/u-7/awards/nope/explain", None)
        .await;
    assert_eq!(
        (missing.status, error_text(&missing)),
        (404, "award nope not found (or not enabled)")
    );
    let bad = server
        .admin(
            "GET",
            "/users/u-7/awards/active-photos/explain?events=0",
            None,
        )
        .await;
    assert_eq!(bad.status, 400);
    let anonymous = server
        .get("/admin/v1/users/u-7/awards/active-photos/explain", None)
        .await;
    assert_eq!(anonymous.status, 401);
    drop(server);
    p.stop().await;
}
