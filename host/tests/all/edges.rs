//! Unauthenticated load costs little and is bounded: a client that sends
//! its headers or its body too slowly is cut off (the connection closed,
//! or 408), and a stop has a deadline even with such a client connected.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::api::{ADMIN, AWARDS, Server, database_with};
use crate::support::KillOnDrop;

/// Reads until the server closes the connection or `limit` passes;
/// returns what it sent and how long it took.
fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, Duration) {
    let started = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while started.elapsed() < limit {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_slow_bodies_are_cut_off() {
    let (db, registry) = database_with("[]").await;
    let server = Server::start_custom(&db.url, registry, None, None, |settings| {
        settings.header_timeout = Duration::from_millis(500);
        settings.body_timeout = Duration::from_millis(500);
    })
    .await
    .unwrap();
    let addr = server.base.trim_start_matches("http://").to_string();
    let (slow_headers, slow_body) = tokio::task::spawn_blocking(move || {
        // Headers a byte at a time, never finished.
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let started = Instant::now();
        let mut closed_after = None;
        while started.elapsed() < Duration::from_secs(5) {
            let _ = stream.write_all(b"a");
            let mut buffer = [0u8; 1024];
            match stream.read(&mut buffer) {
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                // Closed, or answered (and then closed): cut off either way.
                _ => {
                    closed_after = Some(started.elapsed());
                    break;
                }
            }
        }
        // A body that stops halfway.
        let mut stream = TcpStream::connect(&addr).unwrap();
        write!(
            stream,
            "PUT /admin/v1/awards/a HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"id\":"
        )
        .unwrap();
        let body = read_until_closed(&mut stream, Duration::from_secs(5));
        (closed_after, body)
    })
    .await
    .unwrap();
    let closed_after =
        slow_headers.expect("the server closed a connection whose headers never ended");
    assert!(closed_after < Duration::from_secs(3), "{closed_after:?}");
    let (answer, took) = slow_body;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("the request body did not arrive within 500 ms"),
        "{answer}"
    );
    assert!(took < Duration::from_secs(3), "{took:?}");
    // And the server still serves.
    assert_eq!(server.get("/healthz", None).await.status, 200);
    drop(server);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_stalled_request_stops_by_the_deadline() {
    let db = crate::support::TestDb::new().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_laurel"))
        .args(["serve", "--roles", "api"])
        .env("LAUREL_DATABASE_URL", &db.url)
        .env("LAUREL_HTTP_ADDR", "127.0.0.1:0")
        .env("LAUREL_ADMIN_TOKEN", ADMIN)
        .env("LAUREL_HTTP_BODY_TIMEOUT_MS", "600000")
        .env("LAUREL_SHUTDOWN_TIMEOUT_MS", "2000")
        .env("LAUREL_LOG", "warn")
        .env_remove("LAUREL_KAFKA_BROKERS")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map(KillOnDrop)
        .unwrap();
    // The address it took (port 0), as it prints it.
    let url = child.printed_api_url();
    let addr = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).unwrap();
    // A request whose body never finishes: a handler waits on it.
    write!(
        stream,
        "PUT /admin/v1/awards/a HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN}\r\nContent-Length: 100\r\n\r\n{{"
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let stopped = Instant::now();
    Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    let exit = loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "laurel did not stop by its deadline"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = stopped.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "it waited for the request: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(exit.code().is_some(), "exited, not killed: {exit:?}");
    drop(stream);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_wait_for_one_to_end() {
    let (db, registry) = database_with("[]").await;
    let server = Server::start_custom(&db.url, registry, None, None, |settings| {
        settings.max_connections = 2;
    })
    .await
    .unwrap();
    let addr = server.base.trim_start_matches("http://").to_string();
    // Two clients connect and say nothing (within the header timeout).
    let first = TcpStream::connect(&addr).unwrap();
    let second = TcpStream::connect(&addr).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let url = format!("{}/healthz", server.base);
    assert!(
        client.get(&url).send().await.is_err(),
        "a third connection is not served while two are held"
    );
    drop(first);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(response) = client.get(&url).send().await {
            assert_eq!(response.status(), 200);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "served once one connection ended"
        );
    }
    drop(second);
    drop(server);
    db.drop_database().await;
}

/// Authentication comes before bodies: an unauthenticated request that
/// announces a component-sized body is refused at once, before any of it
/// is read (it does not wait out the body timeout); and each route reads
/// only as far as it takes: a function push up to the component limit,
/// every other route up to the small body limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_read_after_authentication_and_only_as_far_as_their_route_takes() {
    let (db, registry) = database_with("[]").await;
    let server = Server::start_custom(&db.url, registry, None, None, |settings| {
        settings.max_body_bytes = 1024;
        settings.body_timeout = Duration::from_secs(30);
    })
    .await
    .unwrap();
    let addr = server.base.trim_start_matches("http://").to_string();
    let (unauthenticated, wrong_token) = tokio::task::spawn_blocking(move || {
        let announce = |authorization: &str| {
            let mut stream = TcpStream::connect(&addr).unwrap();
            write!(
                stream,
                "PUT /admin/v1/functions/Big HTTP/1.1\r\nHost: x\r\n{authorization}Content-Length: 16000000\r\n\r\n"
            )
            .unwrap();
            read_until_closed(&mut stream, Duration::from_secs(10))
        };
        (
            announce(""),
            announce("Authorization: Bearer not-the-admin-token\r\n"),
        )
    })
    .await
    .unwrap();
    for (answer, took) in [unauthenticated, wrong_token] {
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        assert!(took < Duration::from_secs(5), "{took:?}: {answer}");
    }

    // Past the small limit on an award: 413; the same size pushed as a
    // component is read whole (and refused as what it is, not for its size).
    let body = vec![b' '; 2000];
    let award = server
        .call(
            "PUT",
            "/admin/v1/awards/x",
            Some(ADMIN),
            Some(("application/json", body.clone())),
        )
        .await;
    assert_eq!(award.status, 413, "{}", award.body);
    assert!(
        award
            .body
            .to_string()
            .contains("over the limit of 1024 bytes"),
        "{}",
        award.body
    );
    let push = server
        .call(
            "PUT",
            "/admin/v1/functions/Big",
            Some(ADMIN),
            Some(("application/wasm", body)),
        )
        .await;
    assert_eq!(push.status, 422, "{}", push.body);
    drop(server);
    db.drop_database().await;
}

/// Heavy admin requests (diff, explain, replays) run a bounded number at
/// once: past `LAUREL_HTTP_HEAVY_REQUESTS` the answer is 429 with why, at
/// once, and the rest of the API answers as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heavy_admin_requests_past_their_limit_are_answered_429() {
    let (db, registry) = database_with(AWARDS).await;
    // A broker that takes connections and never answers: an explain,
    // which reads the user's recent events, waits on it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let brokers = silent.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let kept: Vec<_> = silent.incoming().collect();
        drop(kept);
    });
    let server = Server::start_custom(&db.url, registry, Some(&brokers), None, |settings| {
        settings.heavy_requests = 1;
    })
    .await
    .unwrap();
    let path = "/admin/v1/users/u-1/awards/content-maker/explain";
    let first = reqwest::Client::new()
        .get(format!("{}{path}", server.base))
        .bearer_auth(ADMIN)
        .send();
    let first = tokio::spawn(first);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !first.is_finished(),
        "the explain waits on the silent broker"
    );
    let second = tokio::time::timeout(Duration::from_secs(5), server.get(path, Some(ADMIN)))
        .await
        .expect("a request past the limit is answered at once");
    assert_eq!(second.status, 429, "{}", second.body);
    let error = second.body["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        error.starts_with("busy: 1 heavy admin requests (diffs, explains, replays) are running")
            && error.contains("LAUREL_HTTP_HEAVY_REQUESTS"),
        "{error}"
    );
    assert_eq!(
        server.get("/admin/v1/awards", Some(ADMIN)).await.status,
        200
    );
    first.abort();
    drop(server);
    db.drop_database().await;
}
