//! The function authoring loop as a product engineer runs it, with the
//! built `laurel` binary: `laurel functions new` writes a crate outside this
//! checkout, cargo builds it, `laurel functions test` runs its fixtures
//! with no database or broker, `laurel functions push` (or a running
//! Laurel's admin API) makes it live.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use crate::support::TestDb;

fn laurel() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_laurel"));
    command
        .env("LAUREL_LOG", "warn")
        .env_remove("LAUREL_KAFKA_BROKERS");
    command
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A new empty folder under the system's temp folder.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "laurel-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn functions_test_passes_right_expectations_and_fails_a_wrong_one_with_its_difference() {
    let wasm = laurel::library::guest_dir().join("json_transform.wasm");
    let fixtures = scratch("fixtures");
    copy_dir(&repo().join("host/tests/cases/JsonTransform"), &fixtures);
    let cases = std::fs::read_dir(&fixtures).unwrap().count();

    let output = laurel()
        .args(["functions", "test"])
        .arg(&wasm)
        .arg("--fixtures")
        .arg(&fixtures)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "json_transform (transform): {cases} cases, {cases} passed, 0 failed"
        )),
        "{stdout}"
    );
    assert!(!stdout.contains("FAILED"), "{stdout}");

    // One wrong expectation: the case fails, naming the line, the place and
    // both values; the exit status says so.
    let case = fixtures.join("maps-fields-by-pointer");
    let expected = std::fs::read_to_string(case.join("expected.jsonl")).unwrap();
    let wrong = expected.replacen(r#""user_id": "u-7""#, r#""user_id": "u-8""#, 1);
    assert_ne!(wrong, expected);
    std::fs::write(case.join("expected.jsonl"), wrong).unwrap();
    let output = laurel()
        .args(["functions", "test"])
        .arg(&wasm)
        .arg("--fixtures")
        .arg(&fixtures)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(r#"input line 1: /0/user_id: expected "u-8", got "u-7""#),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{} passed, 1 failed", cases - 1)),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("1 of {cases} cases failed")),
        "{stderr}"
    );

    // A case without its own config gets --config; one answer short is
    // named, not a panic.
    std::fs::write(case.join("expected.jsonl"), expected).unwrap();
    let config = std::fs::read_to_string(case.join("config.json")).unwrap();
    std::fs::remove_file(case.join("config.json")).unwrap();
    let run = |config: Option<&str>| {
        let mut command = laurel();
        command
            .args(["functions", "test"])
            .arg(&wasm)
            .arg("--fixtures")
            .arg(&case);
        if let Some(config) = config {
            command.args(["--config", config]);
        }
        let output = command.output().unwrap();
        let (stdout, stderr) = text(&output);
        (output.status.code(), stdout, stderr)
    };
    let (code, stdout, _) = run(Some(&config));
    assert_eq!(code, Some(0), "{stdout}");
    let (code, stdout, _) = run(None);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("no config.json in the case and no config given"),
        "{stdout}"
    );
    let all = std::fs::read_to_string(case.join("expected.jsonl")).unwrap();
    let short: Vec<&str> = all.lines().skip(1).collect();
    std::fs::write(case.join("expected.jsonl"), short.join("\n")).unwrap();
    let (code, stdout, _) = run(Some(&config));
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("input.jsonl has 8 lines, expected.jsonl 7: one answer per input"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&fixtures);
}

/// Where scaffolded crates build: a target folder of their own (the outer
/// cargo holds the lock on its own), kept between runs like it.
fn scaffold_target() -> PathBuf {
    // LAUREL_GUEST_DIR = <target>/guest/wasm32-wasip2/guest
    laurel::library::guest_dir()
        .ancestors()
        .nth(3)
        .unwrap()
        .join("scaffold")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaffolded_function_builds_outside_the_checkout_passes_its_fixtures_and_goes_live() {
    let db = TestDb::new().await;
    let work = scratch("authoring");
    // A running Laurel (its API) that takes one of them over HTTP.
    const ADMIN: &str = "authoring-admin-token";
    let mut running = laurel()
        .args(["serve", "--roles", "api"])
        .env("LAUREL_DATABASE_URL", &db.url)
        .env("LAUREL_HTTP_ADDR", "127.0.0.1:0")
        .env("LAUREL_ADMIN_TOKEN", ADMIN)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(crate::support::KillOnDrop)
        .unwrap();
    let api = running.printed_api_url();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    for (name, kind) in [
        ("GoodRating", "filter"),
        ("LongReviews", "rule"),
        ("WeightedSum", "strategy"),
        ("TripLines", "transform"),
    ] {
        let started = Instant::now();
        let dir = work.join(kind);
        let output = laurel()
            .args(["functions", "new", name, "--kind", kind])
            .arg("--dir")
            .arg(&dir)
            .output()
            .unwrap();
        let (stdout, stderr) = text(&output);
        assert!(output.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("cargo build --release"), "{stdout}");
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        // The SDK comes from the binary, not from this checkout or a
        // registry: the crate builds anywhere cargo does.
        assert!(
            manifest
                .contains(r#"laurel-guest = { path = "vendor/laurel-guest", version = "0.1.0" }"#)
                && !manifest.contains(&repo().display().to_string())
                && !manifest.contains("workspace = true"),
            "{manifest}"
        );
        assert!(
            dir.join("vendor/laurel-guest/wit/award.wit").is_file(),
            "the SDK's WIT is written with it"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("README.md"))
                .unwrap()
                .lines()
                .count(),
            5
        );

        let build = Command::new(env!("CARGO"))
            .args(["build", "--release", "--quiet"])
            .current_dir(&dir)
            .env("CARGO_TARGET_DIR", scaffold_target())
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET")
            .output()
            .unwrap();
        let (_, stderr) = text(&build);
        assert!(
            build.status.success(),
            "{kind}: cargo build failed:\n{stderr}"
        );
        let crate_file = laurel::scaffold::crate_name(name).replace('-', "_");
        let wasm = scaffold_target().join(format!("wasm32-wasip2/release/{crate_file}.wasm"));

        let output = laurel()
            .args(["functions", "test"])
            .arg(&wasm)
            .current_dir(&dir)
            .output()
            .unwrap();
        let (stdout, stderr) = text(&output);
        assert!(output.status.success(), "{kind}: {stdout}\n{stderr}");
        assert!(
            stdout.contains(&format!("({kind}): 1 cases, 1 passed, 0 failed")),
            "{stdout}"
        );

        if kind == "filter" {
            // Through the running Laurel's admin API.
            let response = http
                .put(format!("{api}/admin/v1/functions/{name}"))
                .bearer_auth(ADMIN)
                .header("content-type", "application/wasm")
                .body(std::fs::read(&wasm).unwrap())
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let pushed: serde_json::Value =
                serde_json::from_str(&response.text().await.unwrap()).unwrap();
            assert_eq!(status, 201, "{pushed}");
            assert_eq!(
                (&pushed["kind"], &pushed["version"], &pushed["live"]),
                (
                    &serde_json::json!(kind),
                    &serde_json::json!(1),
                    &serde_json::json!(true)
                ),
                "{pushed}"
            );
        } else {
            let output = laurel()
                .args(["functions", "push", name])
                .arg(&wasm)
                .env("LAUREL_DATABASE_URL", &db.url)
                .output()
                .unwrap();
            let (stdout, stderr) = text(&output);
            assert!(output.status.success(), "{stdout}\n{stderr}");
            assert_eq!(stdout.trim(), format!("pushed {name} v1 ({kind})"));
        }
        println!(
            "{kind} {name}: new -> built -> tested -> pushed in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }

    // The running Laurel serves all four, whichever way they came.
    let listed: serde_json::Value = serde_json::from_str(
        &http
            .get(format!("{api}/admin/v1/functions"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    for (name, kind) in [
        ("GoodRating", "filter"),
        ("LongReviews", "rule"),
        ("WeightedSum", "strategy"),
        ("TripLines", "transform"),
    ] {
        let line = listed["functions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {listed}"));
        assert_eq!(
            (&line["kind"], &line["version"]),
            (&serde_json::json!(kind), &serde_json::json!(1))
        );
    }

    // An award names what was pushed, and its config is checked by it.
    let award = work.join("award.json");
    let definition = |min: &str| {
        format!(
            r#"{{"id": "critic", "title": "Critic",
            "objectives": [{{"id": "good", "filters": [{{"name": "GoodRating", "config": {{"field": "/rating", "min": {min}}}}}],
              "rule": {{"name": "LongReviews", "config": {{"counter": "long", "min_chars": 20}}}},
              "progress_counter": "long"}}],
            "strategy_function": "WeightedSum", "strategy": {{"weights": {{"good": 1}}, "goal": 3}}}}"#
        )
    };
    std::fs::write(&award, definition("\"four\"")).unwrap();
    let output = laurel()
        .args(["awards", "apply"])
        .arg(&award)
        .env("LAUREL_DATABASE_URL", &db.url)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(!output.status.success(), "{stdout}");
    assert!(stderr.contains("GoodRating"), "{stderr}");
    std::fs::write(&award, definition("4")).unwrap();
    let output = laurel()
        .args(["awards", "apply"])
        .arg(&award)
        .env("LAUREL_DATABASE_URL", &db.url)
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stdout}\n{stderr}");

    // A folder in use is not written over.
    let output = laurel()
        .args(["functions", "new", "Other", "--kind", "rule"])
        .arg("--dir")
        .arg(work.join("filter"))
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("exists and is not empty"), "{stderr}");
    drop(running);
    // An HTTP function is a spin-sdk crate, not one of these.
    let output = laurel()
        .args(["functions", "new", "Badge", "--kind", "http"])
        .arg("--dir")
        .arg(work.join("http"))
        .output()
        .unwrap();
    let (_, stderr) = text(&output);
    assert!(!output.status.success());
    assert!(
        stderr.contains("not http: an HTTP function is a spin-sdk crate"),
        "{stderr}"
    );
    assert!(!work.join("http").exists());
    let _ = std::fs::remove_dir_all(&work);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_promote_rollback_and_get_from_the_command_line() {
    let db = TestDb::new().await;
    let work = scratch("versions");
    let guests = laurel::library::guest_dir();
    let run = |args: &[&str]| {
        let output = laurel()
            .args(args)
            .env("LAUREL_DATABASE_URL", &db.url)
            .output()
            .unwrap();
        let (stdout, stderr) = text(&output);
        (output.status.success(), stdout.trim().to_string(), stderr)
    };
    let accept = guests.join("accept_all_filter.wasm");
    let reject = guests.join("reject_all_filter.wasm");
    let (ok, stdout, _) = run(&["functions", "push", "Gate", accept.to_str().unwrap()]);
    assert!(ok);
    assert_eq!(stdout, "pushed Gate v1 (filter)");
    let (ok, stdout, _) = run(&[
        "functions",
        "push",
        "Gate",
        reject.to_str().unwrap(),
        "--shadow",
    ]);
    assert!(ok);
    assert_eq!(
        stdout,
        "pushed Gate v2 (filter) as a shadow candidate: it serves nothing until `laurel functions promote Gate 2`"
    );
    let (_, list, _) = run(&["functions", "list"]);
    let gate: Vec<&str> = list.lines().filter(|l| l.starts_with("Gate ")).collect();
    assert_eq!(gate.len(), 1, "{list}");
    assert!(gate[0].split_whitespace().nth(2) == Some("1"), "{list}");
    let (_, list, _) = run(&["functions", "list", "--all"]);
    let gate: Vec<&str> = list.lines().filter(|l| l.starts_with("Gate ")).collect();
    assert_eq!(gate.len(), 2, "{list}");
    assert!(
        !gate[0].ends_with("live") && gate[1].ends_with("live"),
        "{list}"
    );

    let (ok, stdout, _) = run(&["functions", "promote", "Gate", "2"]);
    assert!(ok);
    assert_eq!(stdout, "Gate v2 serves now (it was v1)");
    let (ok, stdout, _) = run(&["functions", "rollback", "Gate"]);
    assert!(ok);
    assert_eq!(stdout, "Gate v1 serves now (it was v2)");

    // Its own limits: the same bytes with them are a new version, listed
    // with them; a limit that cannot be is refused before anything runs.
    let (ok, stdout, stderr) = run(&[
        "functions",
        "push",
        "Gate",
        accept.to_str().unwrap(),
        "--cpu-ms",
        "250",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(stdout, "pushed Gate v3 (filter) with limits CPU 250 ms");
    let (_, list, _) = run(&["functions", "list"]);
    let gate = list.lines().find(|l| l.starts_with("Gate ")).unwrap();
    assert!(gate.ends_with("limits: CPU 250 ms"), "{list}");
    let (ok, _, stderr) = run(&[
        "functions",
        "push",
        "Gate",
        accept.to_str().unwrap(),
        "--memory-mib",
        "0",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("invalid value '0' for '--memory-mib <MIB>'"),
        "{stderr}"
    );
    let (ok, _, stderr) = run(&[
        "functions",
        "push",
        "Gate",
        accept.to_str().unwrap(),
        "--memory-mib",
        "100000",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains(
            "component Gate is refused: it asks for 100000 MiB of memory, over this server's ceiling of 512 MiB"
        ),
        "{stderr}"
    );

    // Any version comes back as it was pushed; the live one by default.
    let file = work.join("gate.wasm");
    let (ok, stdout, _) = run(&[
        "functions",
        "get",
        "Gate",
        "--version",
        "2",
        "-o",
        file.to_str().unwrap(),
    ]);
    assert!(ok, "{stdout}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        std::fs::read(&reject).unwrap()
    );
    let (ok, _, _) = run(&["functions", "get", "Gate", "-o", file.to_str().unwrap()]);
    assert!(ok);
    assert_eq!(
        std::fs::read(&file).unwrap(),
        std::fs::read(&accept).unwrap()
    );

    let (ok, _, stderr) = run(&["functions", "promote", "Gate", "7"]);
    assert!(!ok);
    assert!(stderr.contains("Gate has no version 7"), "{stderr}");
    let (ok, _, stderr) = run(&["functions", "get", "Nobody"]);
    assert!(!ok);
    assert!(
        stderr.contains("no function named Nobody is registered"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&work);
}
