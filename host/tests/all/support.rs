//! Shared test helpers.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use laurel::event::Envelope;
use laurel::library;
use laurel::runtime::{Event, Function, Limits, Runtime};
use laurel::store::Store;
use std::sync::Arc;

/// The production limits, but for a CPU budget a loaded test machine does
/// not run past: the budget counts wall time, so a test process starved of
/// the CPU for 100 ms would see a healthy call time out (the budget's own
/// tests set a short one).
pub fn runtime() -> Runtime {
    runtime_cached(None)
}

/// As [`runtime`], keeping compiled components in `cache` when given.
pub fn runtime_cached(cache: Option<std::path::PathBuf>) -> Runtime {
    Runtime::new(
        Limits {
            cpu_budget: Duration::from_secs(10),
            ..Limits::default()
        },
        cache,
    )
    .expect("runtime")
}

pub fn runtime_with(limits: Limits) -> Runtime {
    // No on-disk cache here: tests check compilation, and must not depend
    // on what an earlier run left behind. The cache has its own test.
    Runtime::new(limits, None).expect("runtime")
}

/// A built-in function loaded straight from its bytes.
pub fn builtin(runtime: &Runtime, name: &str) -> Arc<Function> {
    let builtin = library::builtin(name).unwrap_or_else(|| panic!("no built-in named {name}"));
    runtime
        .load(name, 1, builtin.bytes, Some(builtin.kind))
        .expect("built-in loads")
}

/// A component from the guest build output, e.g. `hostile_function`.
pub fn guest_bytes(file: &str) -> Vec<u8> {
    let path = library::guest_dir().join(format!("{file}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("failed to read {}: {e}", path.display()))
}

pub fn event(json: &str) -> Event {
    Envelope::parse(json.as_bytes())
        .expect("valid envelope")
        .to_function_event()
}

/// An event of `type` with the contract's other fields filled in.
pub fn event_of_type(id: &str, event_type: &str) -> Event {
    event(&format!(
        r#"{{"id":"{id}","source":"photos","type":"{event_type}","user_id":"u-1","authorized":true,
            "content_id":"c-{id}","status":"active","occurred_at":"2026-12-01T10:00:00Z","payload":{{}}}}"#
    ))
}

fn server_url() -> String {
    std::env::var("LAUREL_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// A database of its own for one test; dropped by [`TestDb::drop_database`].
/// A database of the test's own, dropped when the test ends (passed or
/// failed).
pub struct TestDb {
    pub url: String,
    name: String,
    server: String,
    dropped: bool,
}

impl TestDb {
    pub async fn new() -> TestDb {
        TestDb::on(&server_url()).await
    }

    /// A database on the server at `server` (a URL without a database).
    pub async fn on(server: &str) -> TestDb {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "laurel_test_{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        let url = format!("{server}/{name}");
        // Store::connect creates the database.
        let mut store = Store::connect(&url).await.expect("test database");
        store.migrate().await.expect("migrations apply");
        TestDb {
            url,
            name,
            server: server.to_string(),
            dropped: false,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn store(&self) -> Store {
        Store::connect(&self.url).await.expect("connect")
    }

    /// A plain client, to check what was persisted independently of the
    /// code under test.
    pub async fn sql(&self) -> tokio_postgres::Client {
        connect(&self.url).await
    }

    pub async fn drop_database(mut self) {
        self.dropped = true;
        drop_database(&self.server, &self.name)
            .await
            .expect("drop test database");
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // Drop cannot wait on the test's runtime: a thread of its own, with
        // a runtime of its own. A server that is gone (a test that owns
        // its cluster) has nothing left to drop.
        let (server, name) = (self.server.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime
                .block_on(async {
                    tokio::time::timeout(Duration::from_secs(10), drop_database(&server, &name))
                        .await
                })
                .ok()
        })
        .join();
    }
}

async fn drop_database(server: &str, name: &str) -> Result<(), tokio_postgres::Error> {
    let (admin, connection) =
        tokio_postgres::connect(&format!("{server}/postgres"), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
        .await
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

/// The pages of docs/ (its Markdown files; images live beside them).
pub fn doc_pages() -> Vec<std::path::PathBuf> {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let mut pages: Vec<_> = std::fs::read_dir(docs)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    pages
}

/// Makes sure Debian's `packages` are on the machine: when `present` says
/// they are not, the test installs them with apt-get (and says so), so the
/// README's test command needs no step by hand.
pub fn debian_packages(packages: &[&str], present: impl Fn() -> bool) {
    if present() {
        return;
    }
    let list = packages.join(" ");
    eprintln!("{list} missing: installing Debian's packages (apt-get install -y {list})");
    let apt = |args: &[&str]| {
        std::process::Command::new("apt-get")
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let install: Vec<&str> = ["install", "-y"].iter().chain(packages).copied().collect();
    if !apt(&install) {
        apt(&["update"]);
        apt(&install);
    }
    assert!(
        present(),
        "{list} missing and could not be installed: run `apt-get install -y {list}`"
    );
}

/// A child process killed when the test ends, even by a failed assertion
/// (a `laurel` left running would hold ports and CPU for the rest).
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    /// The API's base URL (`http://ADDR`) as a `laurel` process prints it
    /// (it was given port 0). Its stdout is read on to the end, so a
    /// closed pipe never fails a later print.
    pub fn printed_api_url(&mut self) -> String {
        let stdout = self.0.stdout.take().expect("stdout is piped");
        let (found, url) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
            for line in lines.map_while(Result::ok) {
                if let Some(url) = line
                    .strip_prefix("HTTP API at ")
                    .and_then(|rest| rest.split_whitespace().next())
                {
                    let _ = found.send(url.to_string());
                }
            }
        });
        url.recv_timeout(std::time::Duration::from_secs(60))
            .expect("laurel prints its API's address")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[tokio::test]
async fn a_test_database_is_dropped_even_when_its_test_fails() {
    let name = Arc::new(std::sync::Mutex::new(String::new()));
    let seen = Arc::clone(&name);
    let failed = tokio::spawn(async move {
        let db = TestDb::new().await;
        *seen.lock().unwrap() = db.name().to_string();
        panic!("a failing test");
    })
    .await;
    assert!(failed.unwrap_err().is_panic());
    let name = name.lock().unwrap().clone();
    assert!(name.starts_with("laurel_test_"), "{name}");
    let admin = connect(&format!("{}/postgres", server_url())).await;
    let left = admin
        .query(
            "SELECT datname FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap();
    assert!(left.is_empty(), "{name} was left behind");
}

/// Reads a request's head (up to the blank line, or the end) from a test
/// server's connection. Answering after one read is a race: a client (or
/// a proxy) that writes its head in pieces finds the connection reset by
/// the answer's close, with its last pieces unread.
pub async fn read_head(socket: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 << 10 {
        match socket.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buffer[..n]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}
