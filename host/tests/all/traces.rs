//! Spans as an operator sees them: `laurel serve` with LAUREL_OTLP_ENDPOINT
//! sends its HTTP requests' spans (method, route, status) to an OTLP/HTTP
//! collector, here a plain TCP server that keeps what it is sent.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{KillOnDrop, TestDb};

/// One request the collector got: its request line, headers and body.
struct Received {
    head: String,
    body: Vec<u8>,
}

/// Serves every request on `stream` (keep-alive) with 200, keeping it.
fn collect(stream: TcpStream, received: Arc<Mutex<Vec<Received>>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => head.push_str(&line),
            }
        }
        let length = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        received.lock().unwrap().push(Received { head, body });
        let answer =
            "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_request_spans_reach_an_otlp_collector() {
    let db = TestDb::new().await;
    let collector = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", collector.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Vec::new()));
    {
        let received = received.clone();
        std::thread::spawn(move || {
            for stream in collector.incoming().map_while(Result::ok) {
                let received = received.clone();
                std::thread::spawn(move || collect(stream, received));
            }
        });
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_laurel"))
        .args(["serve", "--roles", "api"])
        .env("LAUREL_DATABASE_URL", &db.url)
        .env("LAUREL_HTTP_ADDR", "127.0.0.1:0")
        .env("LAUREL_OTLP_ENDPOINT", &endpoint)
        .env("LAUREL_LOG", "info")
        .env_remove("LAUREL_KAFKA_BROKERS")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map(KillOnDrop)
        .unwrap();
    let base = child.printed_api_url();
    let _ = rustls::crypto::ring::default_provider().install_default();
    for _ in 0..3 {
        let health = reqwest::get(format!("{base}/healthz")).await.unwrap();
        assert!(health.status().is_success() || health.status() == 503);
    }
    let missing = reqwest::get(format!("{base}/v1/users/u-1/awards"))
        .await
        .unwrap();
    assert_eq!(missing.status(), 401);

    // A stop sends what is still buffered.
    Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    let started = Instant::now();
    while child.0.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "laurel did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let received = std::mem::take(&mut *received.lock().unwrap());
    let traces: Vec<&Received> = received
        .iter()
        .filter(|r| r.head.starts_with("POST /v1/traces "))
        .collect();
    assert!(!traces.is_empty(), "the collector got no spans");
    assert!(
        traces.iter().all(|r| r
            .head
            .to_ascii_lowercase()
            .contains("application/x-protobuf")),
        "{:?}",
        traces.iter().map(|r| &r.head).collect::<Vec<_>>()
    );
    let spans: Vec<u8> = traces.iter().flat_map(|r| r.body.clone()).collect();
    for expected in [
        "laurel",
        "http_request",
        "route",
        "/healthz",
        "/v1/users/{user_id}/awards",
        "status",
    ] {
        assert!(
            contains(&spans, expected),
            "no {expected:?} in the spans sent"
        );
    }
    db.drop_database().await;
}

/// A collector that is not there (nothing listening) or that takes the
/// connection and never answers: requests are served as usual, and a stop
/// still ends the process within its shutdown time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_away_or_silent_holds_nothing_up() {
    let db = TestDb::new().await;
    let closed = crate::proxy::free_port();
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_endpoint = format!("http://{}", silent.local_addr().unwrap());
    // Accepts and holds each connection, reading nothing, answering nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming().map_while(Result::ok) {
            held.push(stream);
        }
    });
    let _ = rustls::crypto::ring::default_provider().install_default();
    for endpoint in [format!("http://127.0.0.1:{closed}"), silent_endpoint] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_laurel"))
            .args(["serve", "--roles", "api", "--shutdown-timeout-ms", "5000"])
            .env("LAUREL_DATABASE_URL", &db.url)
            .env("LAUREL_HTTP_ADDR", "127.0.0.1:0")
            .env("LAUREL_OTLP_ENDPOINT", &endpoint)
            .env_remove("LAUREL_KAFKA_BROKERS")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map(KillOnDrop)
            .unwrap();
        let base = child.printed_api_url();
        for _ in 0..20 {
            let missing = reqwest::get(format!("{base}/v1/users/u-1/awards"))
                .await
                .unwrap();
            assert_eq!(missing.status(), 401, "{endpoint}");
        }
        Command::new("kill")
            .args(["-TERM", &child.0.id().to_string()])
            .status()
            .unwrap();
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "laurel did not stop with its collector at {endpoint}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{endpoint}: {status}");
    }
    db.drop_database().await;
}
