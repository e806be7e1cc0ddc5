//! docs/first-function.md, run as a product engineer runs it: against a
//! running `laurel up --demo`, in a folder outside the checkout, each
//! language's steps and the shared ones, exactly as the page writes them
//! (the function renamed per language, so that all three run against one
//! Laurel).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::TestDb;

/// The page's `sh` block that follows `<!-- MARKER -->`.
fn block(page: &str, marker: &str) -> String {
    let at = page
        .find(&format!("<!-- {marker} -->"))
        .unwrap_or_else(|| panic!("docs/first-function.md has no step {marker:?}"));
    let rest = &page[at..];
    let start = rest.find("```sh\n").unwrap() + "```sh\n".len();
    let end = rest[start..].find("\n```").unwrap();
    rest[start..start + end].to_string()
}

/// The page's commands for `lang`, steps 1 to 4, with the function, its
/// folder, file and award renamed by `suffix`.
fn script(page: &str, lang: &str, suffix: &str) -> String {
    let steps = [
        block(page, &format!("step 1: {lang}")),
        block(page, "step 2"),
        block(page, &format!("step 3: {lang}")),
        block(page, "step 4"),
    ];
    let lower = suffix.to_lowercase();
    steps
        .join("\n")
        .replace("GoodRating", &format!("GoodRating{suffix}"))
        .replace("good-rating", &format!("good-rating-{lower}"))
        .replace("good_rating", &format!("good_rating_{lower}"))
        .replace("\"id\": \"critic\"", &format!("\"id\": \"critic-{lower}\""))
        .replace("u-7", &format!("u-7-{lower}"))
}

fn ensure_kcat() {
    crate::support::debian_packages(&["kcat"], || {
        Command::new("kcat").arg("-V").output().is_ok()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_function_page_runs_as_written_in_rust_python_and_javascript() {
    ensure_kcat();
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/first-function.md"
    ))
    .unwrap();
    assert_eq!(block(&page, "step 0").trim(), "laurel up --demo");

    // Step 0, in its own terminal.
    let db = TestDb::new().await;
    let mut up = Command::new(env!("CARGO_BIN_EXE_laurel"))
        .args(["up", "--demo"])
        .env("LAUREL_DATABASE_URL", &db.url)
        .env("LAUREL_HTTP_ADDR", "127.0.0.1:0")
        .env("LAUREL_LOG", "warn")
        .env_remove("LAUREL_KAFKA_BROKERS")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map(crate::support::KillOnDrop)
        .unwrap();
    let stdout = up.0.stdout.take().unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let mut broker = None;
    loop {
        let line = lines
            .recv_timeout(Duration::from_secs(240))
            .expect("laurel up --demo prints its broker and its demo");
        if let Some(address) =
            line.strip_prefix("Kafka broker (in process, librdkafka mock cluster): ")
        {
            broker = Some(address.trim().to_string());
        }
        if line.starts_with("  three-of-either  progress") {
            break;
        }
    }
    let broker = broker.expect("the broker's address is printed");

    let bin = Path::new(env!("CARGO_BIN_EXE_laurel")).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let rust_target = crate::projects::work_dir().join("walkthrough-rust-target");
    for (lang, suffix) in [("python", "Py"), ("js", "Js"), ("rust", "Rs")] {
        let lower = suffix.to_lowercase();
        let work =
            crate::projects::work_dir().join(format!("walkthrough-{lang}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).unwrap();
        let mut commands = script(&page, lang, suffix);
        if lang == "rust" {
            // Not on the page: the crate's target folder is kept between
            // runs of this test, so its dependencies are built once.
            std::fs::create_dir_all(&rust_target).unwrap();
            commands = commands.replacen(
                &format!("cd good-rating-{lower}\n"),
                &format!(
                    "cd good-rating-{lower}\nln -s {} target\n",
                    rust_target.display()
                ),
                1,
            );
        }
        let output = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &commands])
            .current_dir(&work)
            .env("PATH", &path)
            .env("LAUREL_DATABASE_URL", &db.url)
            .env("LAUREL_KAFKA_BROKERS", &broker)
            .env("LAUREL_LOG", "warn")
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET")
            .env_remove("VIRTUAL_ENV")
            .output()
            .unwrap();
        let printed = format!(
            "{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        println!("--- {lang}\n{printed}");
        assert!(
            output.status.success(),
            "{lang}: the page's commands failed:\n{printed}"
        );
        let name = format!("GoodRating{suffix}");
        let wasm = format!("good_rating_{lower}");
        for expected in [
            format!("{wasm} (filter): 1 cases, 1 passed, 0 failed"),
            format!("pushed {name} v1 (filter)"),
            format!(
                "pushed {name} v2 (filter) as a shadow candidate: it serves nothing until `laurel functions promote {name} 2`"
            ),
            format!("{name} v1 (live) -> v2 (candidate): "),
            format!("  would lose a completion: u-7-{lower}"),
            format!(
                "  u-7-{lower}-review-2 (u-7-{lower}, objective good): rule CountRule counts good 1 -> excluded by filter {name}"
            ),
            format!("{name} v2 serves now (it was v1)"),
            format!("{name} v1 serves now (it was v2)"),
        ] {
            assert!(
                printed.contains(&expected),
                "{lang}: no {expected:?} in:\n{printed}"
            );
        }
        let _ = std::fs::remove_dir_all(&work);

        // What the page says u-7 has: three good reviews, with version 1
        // serving again.
        let sql = db.sql().await;
        let award = format!("critic-{lower}");
        let user = format!("u-7-{lower}");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let row = sql
                .query_opt(
                    "SELECT counters::text FROM user_objective WHERE user_id = $1 AND award_id = $2",
                    &[&user, &award],
                )
                .await
                .unwrap();
            let counters = row.map(|r| r.get::<_, String>(0));
            if counters.as_deref() == Some(r#"{"good": 3}"#) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{lang}: {user}'s counters for {award}: {counters:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    drop(up);
}
