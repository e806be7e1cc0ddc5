//! Functions in Python and JavaScript, written as a product engineer
//! would: `laurel functions new --lang python|js` in a folder outside this
//! checkout, the language's own tools (componentize-py from PyPI, jco from
//! npm, installed here on first use), `laurel functions test` on the
//! fixture the project comes with, pushed to a running Laurel over its
//! admin API; and run by ingest next to
//! the built-ins, counting exactly; a Python rule that raises and a
//! JavaScript filter that loops hold their own objective only.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use serde_json::json;

use crate::pipeline_support::Pipeline;

use crate::projects::{build, work_dir};

const KINDS: [&str; 4] = ["filter", "rule", "strategy", "transform"];

/// The example's name per kind (the scaffold renames it to the new one).
fn name_of(lang: &str, kind: &str) -> String {
    let base = match kind {
        "filter" => "MinRating",
        "rule" => "LongReviews",
        "strategy" => "WeightedGoal",
        _ => "TripLines",
    };
    format!("{base}{}", if lang == "python" { "Py" } else { "Js" })
}

/// The SDK's example of `kind` in `lang`, built once per test run.
fn example(lang: &str, kind: &str) -> Vec<u8> {
    type Built = HashMap<(String, String), Vec<u8>>;
    static BUILT: OnceLock<Mutex<Built>> = OnceLock::new();
    // Held while building: two tests that want the same example wait for
    // one build (and builds, CPU-bound, do not run two at once).
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    built
        .entry((lang.to_string(), kind.to_string()))
        .or_insert_with(|| build(lang, kind, &name_of(lang, kind), |_| {}))
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_in_python_and_javascript_is_made_built_passes_its_fixture_and_is_pushed_over_the_admin_api()
 {
    // A running Laurel (its API), as a team pushes to it.
    let db = crate::support::TestDb::new().await;
    const ADMIN: &str = "polyglot-admin-token";
    let mut running = std::process::Command::new(env!("CARGO_BIN_EXE_laurel"))
        .args(["serve", "--roles", "api"])
        .env("LAUREL_DATABASE_URL", &db.url)
        .env("LAUREL_HTTP_ADDR", "127.0.0.1:0")
        .env("LAUREL_ADMIN_TOKEN", ADMIN)
        .env("LAUREL_LOG", "warn")
        .env_remove("LAUREL_KAFKA_BROKERS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(crate::support::KillOnDrop)
        .unwrap();
    let api = running.printed_api_url();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    for lang in ["python", "js"] {
        for kind in KINDS {
            let bytes = tokio::task::spawn_blocking(move || example(lang, kind))
                .await
                .unwrap();
            // What a team gives up in size, per language.
            println!("{lang} {kind}: {} bytes", bytes.len());
            let name = name_of(lang, kind);
            let push = |query: &'static str| {
                http.put(format!("{api}/admin/v1/functions/{name}{query}"))
                    .bearer_auth(ADMIN)
                    .header("content-type", "application/wasm")
                    .body(bytes.clone())
                    .send()
            };
            if (lang, kind) == ("python", "filter") {
                // The limits a push asks for are checked: a bad value, and
                // too little memory for the interpreter to start.
                for (query, status, says) in [
                    (
                        "?cpu_ms=fast",
                        400,
                        "query parameter cpu_ms must be a positive whole number, not \"fast\"",
                    ),
                    (
                        "?memory_mib=0",
                        400,
                        "query parameter memory_mib must be a positive whole number, not \"0\"",
                    ),
                    (
                        "?memory_mib=4",
                        422,
                        "cannot start within its limits: function MinRatingPy v0 exceeded its memory limit: tried to grow its memories to",
                    ),
                    (
                        "?cpu_ms=100000",
                        422,
                        "it asks for a CPU budget of 100000 ms, over this server's ceiling of 2000 ms (LAUREL_FUNCTION_MAX_CPU_MS)",
                    ),
                ] {
                    let response = push(query).await.unwrap();
                    assert_eq!(response.status().as_u16(), status, "{query}");
                    let body: serde_json::Value =
                        serde_json::from_str(&response.text().await.unwrap()).unwrap();
                    let error = body["error"].as_str().unwrap_or_default();
                    assert!(error.contains(says), "{query}: {body}");
                }
            }
            // Pushed as the docs say for an interpreted language: a CPU
            // budget for a large batch (docs/functions.md, Limits).
            let response = push("?cpu_ms=1000").await.unwrap();
            let status = response.status().as_u16();
            let pushed: serde_json::Value =
                serde_json::from_str(&response.text().await.unwrap()).unwrap();
            assert_eq!(status, 201, "{name}: {pushed}");
            assert_eq!(
                (&pushed["kind"], &pushed["version"], &pushed["live"]),
                (&json!(kind), &json!(1), &json!(true)),
                "{name}: {pushed}"
            );
            assert_eq!(
                pushed["limits"],
                json!({"cpu_ms": 1000, "memory_mib": 64}),
                "{name}"
            );
        }
    }
    let listed = http
        .get(format!("{api}/admin/v1/functions"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let line = listed["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "MinRatingPy")
        .unwrap();
    assert_eq!(
        (&line["limits"], &line["asked"]),
        (
            &json!({"cpu_ms": 1000, "memory_mib": 64}),
            &json!({"cpu_ms": 1000, "memory_mib": null})
        ),
        "{line}"
    );
    drop(running);
}

const POLYGLOT_AWARDS: &str = r#"[{
  "id": "critic-py", "title": "Critic (Python filter, JavaScript rule)",
  "objectives": [{"id": "long",
    "filters": [{"name": "MinRatingPy", "config": {"field": "/rating", "min": 4}}],
    "rule": {"name": "LongReviewsJs", "config": {"counter": "long", "min_chars": 10}},
    "progress_counter": "long"}],
  "strategy_function": "WeightedGoalPy", "strategy": {"weights": {"long": 1}, "goal": 3}
}, {
  "id": "critic-js", "title": "Critic (JavaScript filter, Python rule)",
  "objectives": [{"id": "long",
    "filters": [{"name": "MinRatingJs", "config": {"field": "/rating", "min": 4}}],
    "rule": {"name": "LongReviewsPy", "config": {"counter": "long", "min_chars": 10}},
    "progress_counter": "long"}],
  "strategy_function": "WeightedGoalJs", "strategy": {"weights": {"long": 1}, "goal": 3}
}, {
  "id": "fragile-py", "title": "A Python rule that raises",
  "objectives": [{"id": "n",
    "filters": [{"name": "EventTypeFilter", "config": {"types": ["review", "boom", "loop"]}}],
    "rule": {"name": "RaisingPy", "config": {}},
    "progress_counter": "n"}],
  "strategy": {"goal": 100, "strategy": [{"objective_id": "n"}]}
}, {
  "id": "fragile-js", "title": "A JavaScript filter that loops",
  "objectives": [{"id": "n",
    "filters": [{"name": "EventTypeFilter", "config": {"types": ["review", "boom", "loop"]}},
                {"name": "LoopingJs", "config": {}}],
    "rule": {"name": "CountRule", "config": {"counter": "n"}},
    "progress_counter": "n"}],
  "strategy": {"goal": 100, "strategy": [{"objective_id": "n"}]}
}, {
  "id": "steady", "title": "Every review",
  "objectives": [{"id": "n",
    "filters": [{"name": "EventTypeFilter", "config": {"types": ["review", "boom", "loop"]}}],
    "rule": {"name": "CountRule", "config": {"counter": "n"}},
    "progress_counter": "n"}],
  "strategy": {"goal": 100, "strategy": [{"objective_id": "n"}]}
}]"#;

const RAISING_PY: &str = r#""""RaisingPy: counts 1 per event, and raises on events of type `boom`."""

import laurel


class RaisingPy:
    def __init__(self, config):
        pass

    def contribute(self, event):
        if event.type == "boom":
            raise RuntimeError(f"RaisingPy cannot take event {event.id}")
        return laurel.absolute({"n": 1})


laurel.export(RaisingPy)
"#;

const LOOPING_JS: &str = r#"// LoopingJs: matches every event, and never returns on events of type `loop`.

import { exportFilter } from "laurel";

class LoopingJs {
  constructor(config) {}

  matches(event) {
    if (event.type === "loop") {
      for (;;) {}
    }
    return true;
  }
}

export const { filters, filterScope } = exportFilter(LoopingJs);
"#;

fn counters(pairs: &[(&str, i64)]) -> std::collections::BTreeMap<String, i64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn review(
    id: &str,
    user: &str,
    item: &str,
    status: &str,
    rating: i64,
    text: &str,
) -> serde_json::Value {
    json!({
        "id": id, "source": "reviews", "type": "review", "user_id": user, "authorized": true,
        "content_id": item, "status": status, "occurred_at": "2026-12-01T10:00:00Z",
        "payload": {"rating": rating, "text": text}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_javascript_functions_count_exactly_and_a_failing_one_holds_only_its_objective()
{
    let mut functions: Vec<(String, Vec<u8>)> = Vec::new();
    for lang in ["python", "js"] {
        for kind in ["filter", "rule", "strategy"] {
            functions.push((name_of(lang, kind), example(lang, kind)));
        }
    }
    functions.push((
        "RaisingPy".into(),
        build("python", "rule", "RaisingPy", |dir| {
            std::fs::write(dir.join("app.py"), RAISING_PY).unwrap();
            // The fixture is the example's: not this rule's.
            std::fs::remove_dir_all(dir.join("fixtures/example")).unwrap();
            write_case(
                dir,
                "{}",
                &[json!({"id": "e-1", "type": "review"})],
                &[json!({"counters": {"n": 1}, "dedup_key": null, "additive": false})],
            );
        }),
    ));
    functions.push((
        "LoopingJs".into(),
        build("js", "filter", "LoopingJs", |dir| {
            std::fs::write(dir.join("function.js"), LOOPING_JS).unwrap();
            std::fs::remove_dir_all(dir.join("fixtures/example")).unwrap();
            write_case(
                dir,
                "{}",
                &[json!({"id": "e-1", "type": "review"})],
                &[json!(true)],
            );
        }),
    ));
    let functions: Vec<(&str, Vec<u8>)> = functions
        .iter()
        .map(|(name, bytes)| (name.as_str(), bytes.clone()))
        .collect();
    let cache = work_dir().join(format!("compiled-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let mut p =
        Pipeline::start_with_functions_cached(POLYGLOT_AWARDS, &["reviews"], &functions, &cache)
            .await;
    p.settle("reviews", "u-0").await;

    // Two long, well-rated reviews, a short one, a badly rated one; then
    // one of the long ones is blocked: 2, then 1, in both awards.
    for event in [
        review("r-1", "u-1", "c-1", "active", 5, "A fine place to stop."),
        review(
            "r-2",
            "u-1",
            "c-2",
            "active",
            4,
            "Good coffee, kind people.",
        ),
        review("r-3", "u-1", "c-3", "active", 5, "Fine."),
        review("r-4", "u-1", "c-4", "active", 2, "Not a fine place at all."),
    ] {
        p.send(&event).await;
    }
    p.settle("reviews", "u-1").await;
    for award in ["critic-py", "critic-js"] {
        assert_eq!(
            p.objective("u-1", award, "long").await,
            counters(&[("long", 2)]),
            "{award}"
        );
    }
    p.send(&review(
        "r-5",
        "u-1",
        "c-2",
        "blocked",
        4,
        "Good coffee, kind people.",
    ))
    .await;
    p.settle("reviews", "u-1").await;
    for award in ["critic-py", "critic-js"] {
        assert_eq!(
            p.objective("u-1", award, "long").await,
            counters(&[("long", 1)]),
            "{award}"
        );
    }
    // The strategies (Python and JavaScript) make the progress.
    p.awards_worker().await.drain().await.unwrap();
    let sql = p.db.sql().await;
    for award in ["critic-py", "critic-js"] {
        let row = sql
            .query_one(
                "SELECT progress, goal, completed FROM user_achieve WHERE user_id = 'u-1' AND award_id = $1",
                &[&award],
            )
            .await
            .unwrap();
        let (progress, goal, completed): (f64, f64, bool) = (row.get(0), row.get(1), row.get(2));
        assert_eq!((progress, goal, completed), (1.0, 3.0, false), "{award}");
    }

    // A Python rule that raises and a JavaScript filter that loops: each
    // holds that event for its own objective, with its reason; the others
    // count it, and the next event is counted by all.
    let mut boom = review("boom-1", "u-2", "c-9", "active", 5, "boom");
    boom["type"] = json!("boom");
    let mut looping = review("loop-1", "u-2", "c-10", "active", 5, "loop");
    looping["type"] = json!("loop");
    p.send(&boom).await;
    p.send(&looping).await;
    p.send(&review(
        "after-1",
        "u-2",
        "c-11",
        "active",
        5,
        "A fine place to stop.",
    ))
    .await;
    p.settle("reviews", "u-2").await;
    let held = p.dead_letters().await;
    let scopes: Vec<(&str, Option<&str>)> = held
        .iter()
        .map(|(id, scope, _)| (id.as_deref().unwrap_or_default(), scope.as_deref()))
        .collect();
    assert_eq!(
        scopes,
        [
            ("boom-1", Some("fragile-py/n")),
            ("loop-1", Some("fragile-js/n"))
        ],
        "{held:#?}"
    );
    assert!(
        held[0].2.contains("RaisingPy v1 trapped")
            && held[0].2.contains("RaisingPy cannot take event boom-1"),
        "the Python traceback's message is kept: {}",
        held[0].2
    );
    assert!(
        held[1].2.contains("LoopingJs v1 exceeded its CPU budget"),
        "{}",
        held[1].2
    );
    // The steady award counted all three; the fragile ones the two they
    // could (the raising rule's objective holds boom-1 only, the looping
    // filter's loop-1 only).
    for (award, n) in [("steady", 3), ("fragile-py", 2), ("fragile-js", 2)] {
        assert_eq!(
            p.objective("u-2", award, "n").await,
            counters(&[("n", n)]),
            "{award}"
        );
    }
    p.stop().await;
    let _ = std::fs::remove_dir_all(&cache);
}

/// Writes the project's one fixture case.
fn write_case(
    dir: &Path,
    config: &str,
    input: &[serde_json::Value],
    expected: &[serde_json::Value],
) {
    let case = dir.join("fixtures/own");
    std::fs::create_dir_all(&case).unwrap();
    std::fs::write(case.join("config.json"), config).unwrap();
    let lines = |values: &[serde_json::Value]| {
        values
            .iter()
            .map(|v| {
                let mut v = v.clone();
                if v.is_object() && v.get("source").is_none() && v.get("counters").is_none() {
                    let object = v.as_object_mut().unwrap();
                    object.insert("source".into(), json!("reviews"));
                    object.insert("user_id".into(), json!("u-1"));
                    object.insert("authorized".into(), json!(true));
                    object.insert("occurred_at".into(), json!("2026-12-01T10:00:00Z"));
                    object.insert("payload".into(), json!({}));
                }
                v.to_string() + "\n"
            })
            .collect::<String>()
    };
    std::fs::write(case.join("input.jsonl"), lines(input)).unwrap();
    std::fs::write(case.join("expected.jsonl"), lines(expected)).unwrap();
}

/// The Python HTTP example's tools (componentize-py and spin-sdk, as its
/// requirements.txt pins them), in a virtual environment of their own.
fn python_http_tools() -> std::path::PathBuf {
    let venv = work_dir().join("python-http-tools");
    let requirements = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../functions/http-python/greeting/requirements.txt");
    let pins = std::fs::read_to_string(&requirements).unwrap();
    let stamp = venv.join("installed.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(pins.as_str()) {
        let _ = std::fs::remove_dir_all(&venv);
        crate::projects::run(
            std::process::Command::new("python3")
                .args(["-m", "venv"])
                .arg(&venv),
            "python3 -m venv",
        );
        crate::projects::run(
            std::process::Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "-r"])
                .arg(&requirements),
            "pip install -r requirements.txt",
        );
        std::fs::write(&stamp, &pins).unwrap();
    }
    venv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_http_function_with_spin_sdk_is_served_from_its_spin_toml() {
    // The example, copied outside the checkout and built as its README says.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../functions/http-python/greeting");
    let dir = work_dir().join(format!("http-python-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("wit")).unwrap();
    for file in ["app.py", "build.sh", "spin.toml", "wit/world.wit"] {
        std::fs::copy(example.join(file), dir.join(file)).unwrap();
    }
    // Its own application name: the key-value store starts empty.
    let app = format!("greeting-{}", std::process::id());
    let manifest = std::fs::read_to_string(dir.join("spin.toml"))
        .unwrap()
        .replace("name = \"greeting\"", &format!("name = \"{app}\""));
    std::fs::write(dir.join("spin.toml"), manifest).unwrap();
    let venv = tokio::task::spawn_blocking(python_http_tools)
        .await
        .unwrap();
    let (dir_, venv_) = (dir.clone(), venv.clone());
    tokio::task::spawn_blocking(move || {
        crate::projects::run(
            std::process::Command::new(dir_.join("build.sh"))
                .current_dir(&dir_)
                .env("VIRTUAL_ENV", &venv_)
                .env(
                    "PATH",
                    format!(
                        "{}:{}",
                        venv_.join("bin").display(),
                        std::env::var("PATH").unwrap_or_default()
                    ),
                ),
            "greeting: ./build.sh",
        )
    })
    .await
    .unwrap();
    let size = std::fs::metadata(dir.join("greeting.wasm")).unwrap().len();
    println!("python http greeting: {size} bytes");

    let db = crate::support::TestDb::new().await;
    let mut running = std::process::Command::new(env!("CARGO_BIN_EXE_laurel"))
        .args(["serve", "--roles", "api"])
        .env("LAUREL_DATABASE_URL", &db.url)
        .env("LAUREL_HTTP_ADDR", "127.0.0.1:0")
        .env("LAUREL_SPIN_MANIFEST", dir.join("spin.toml"))
        .env("LAUREL_LOG", "warn")
        .env_remove("LAUREL_KAFKA_BROKERS")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(crate::support::KillOnDrop)
        .unwrap();
    let api = running.printed_api_url();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    for (body, expected) in [
        ("Ada", "Hello from Python, Ada: visit 1\n"),
        ("", "Hello from Python, you: visit 2\n"),
    ] {
        let response = http
            .post(format!("{api}/greeting"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "text/plain; charset=utf-8"
        );
        assert_eq!(response.text().await.unwrap(), expected);
    }
    let refused = http.delete(format!("{api}/greeting")).send().await.unwrap();
    assert_eq!(refused.status().as_u16(), 405);
    drop(running);
    db.drop_database().await;
    let _ = std::fs::remove_dir_all(&dir);
}
