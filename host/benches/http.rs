//! Benchmark: requests/s and latency percentiles of the HTTP server, from
//! a load generator on loopback (keep-alive connections, each sending its
//! next request when the previous answer arrived), for
//!
//! - the baseline: a path no route takes (the server's floor: routing and
//!   a small JSON answer, no database), measured in the same run;
//! - the public API, `GET /v1/users/{id}/awards` (JWT check, three
//!   PostgreSQL reads, every award's progress);
//! - a no-op HTTP function (spin-sdk 7, a fresh instance per request).
//!
//! cargo bench -p laurel --bench http   (LAUREL_BENCH_SECONDS=5, LAUREL_BENCH_CONNECTIONS=32)

use std::sync::Arc;
use std::time::{Duration, Instant};

use laurel::api::{ApiSettings, AppState, Secret};
use laurel::catalog::Catalog;
use laurel::registry::Registry;
use laurel::runtime::http::HttpLimits;
use laurel::runtime::http::manifest;
use laurel::runtime::{Limits, Runtime};
use laurel::store::Store;

#[path = "support/row.rs"]
mod row;
use row::{row, thousands};

const SECRET: &str = "bench-secret";

fn main() {
    let seconds: u64 = env("LAUREL_BENCH_SECONDS", 5);
    let connections: usize = env("LAUREL_BENCH_CONNECTIONS", 32);
    let database = std::env::var("LAUREL_BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/laurel_bench_http".into());
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut store = Store::connect(&database).await.unwrap();
        store.migrate().await.unwrap();
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        laurel::library::register(&mut store, &runtime).await.unwrap();
        let registry = Registry::start(&database, runtime).await.unwrap();
        laurel::definitions::apply(&mut store, &registry, laurel::demo::AWARDS)
            .await
            .unwrap();
        let catalog = Catalog::start(&database).await.unwrap();
        let settings = ApiSettings {
            tokens: laurel::api::TokenSettings {
                secret: Some(Secret::new(SECRET)),
                ..Default::default()
            },
            ..ApiSettings::new(&database)
        };
        let state = Arc::new(AppState::new(settings, registry, catalog));
        let text = r#"
spin_manifest_version = 2
[application]
name = "bench"
[[trigger.http]]
route = "/noop"
component = "noop"
[component.noop]
source = "http_noop.wasm"
"#;
        let manifest =
            manifest::parse(text, laurel::library::guest_dir().to_path_buf(), &|_| None).unwrap();
        state
            .serve_functions(manifest, HttpLimits::default())
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(laurel::api::run(listener, state, std::future::pending()));
        let token = laurel::api::mint_user_token(
            &Secret::new(SECRET),
            "u-42",
            Duration::from_secs(3600),
        );

        let duration = Duration::from_secs(seconds);
        println!(
            "{connections} connections, {seconds} s each, loopback; 2 cores shared by server and load generator"
        );
        let baseline = load(&format!("{base}/no-such-path"), None, 404, connections, duration).await;
        report("baseline: a path no route takes (404 JSON)", &baseline, None);
        let public = load(
            &format!("{base}/v1/users/u-42/awards"),
            Some(&token),
            200,
            connections,
            duration,
        )
        .await;
        report("public API: GET /v1/users/u-42/awards", &public, Some(&baseline));
        let noop = load(&format!("{base}/noop"), None, 204, connections, duration).await;
        report("HTTP function: no-op (spin-sdk 7)", &noop, Some(&baseline));
    });
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Measured {
    requests: usize,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile(&self, p: f64) -> Duration {
        let index = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[index]
    }
}

/// `connections` clients, each on its own keep-alive connection, sending
/// requests back to back for `duration`; every answer must have `status`.
async fn load(
    url: &str,
    token: Option<&str>,
    status: u16,
    connections: usize,
    duration: Duration,
) -> Measured {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .build()
            .unwrap();
        let (url, token) = (url.to_string(), token.map(str::to_string));
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while started.elapsed() < duration {
                let sent = Instant::now();
                let mut request = client.get(&url);
                if let Some(token) = &token {
                    request = request.bearer_auth(token);
                }
                let response = request.send().await.unwrap();
                assert_eq!(response.status().as_u16(), status, "{url}");
                response.bytes().await.unwrap();
                latencies.push(sent.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Measured {
        requests: latencies.len(),
        elapsed,
        latencies,
    }
}

fn report(what: &str, m: &Measured, baseline: Option<&Measured>) {
    let ratio = baseline
        .map(|b| format!("  ({:.2}x the baseline's rate)", m.rate() / b.rate()))
        .unwrap_or_default();
    println!(
        "{what:<46} {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms{ratio}",
        m.rate(),
        m.percentile(0.50).as_secs_f64() * 1000.0,
        m.percentile(0.99).as_secs_f64() * 1000.0,
    );
    if let Some(baseline) = baseline {
        let shown = |m: &Measured| {
            format!(
                "{} req/s, p99 {:.1} ms",
                thousands(m.rate()),
                m.percentile(0.99).as_secs_f64() * 1000.0
            )
        };
        row(
            "http",
            &format!(
                "{what}, {} connections (baseline: a path no route takes)",
                env("LAUREL_BENCH_CONNECTIONS", 32)
            ),
            &shown(m),
            &shown(baseline),
            &format!("{:.2}x", m.rate() / baseline.rate()),
            "",
        );
    }
}
