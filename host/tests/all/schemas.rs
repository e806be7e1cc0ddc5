//! The JSON Schemas served at `/schemas/*.json` against what Laurel
//! really accepts: for award definitions and event envelopes, a corpus of
//! accepted and refused documents gets the same verdict from the schema as
//! from Laurel's own checks (pipeline definitions likewise); every line of
//! the built-ins' and the SDK examples' fixtures fits the fixture schema of
//! its function's kind; every award, pipeline and event the docs show fits
//! its schema.

use std::path::Path;

use laurel::event::Envelope;
use laurel::registry::Registry;
use laurel::runtime::FunctionKind;
use serde_json::{Value, json};

use crate::support::{self, TestDb};

fn schema(name: &str) -> Value {
    let (_, text) = laurel::api::SCHEMAS
        .iter()
        .find(|(file, _)| *file == name)
        .unwrap_or_else(|| panic!("no schema {name}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"))
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap_or_else(|e| panic!("not a valid schema: {e}"))
}

fn errors(validator: &jsonschema::Validator, value: &Value) -> Vec<String> {
    validator
        .iter_errors(value)
        .map(|e| e.to_string())
        .collect()
}

/// Each document of `corpus` gets the same verdict from `schema` as from
/// `laurel` (named `who` in a disagreement, which fails the test): how
/// many both accept, and both refuse.
fn agreement(
    corpus: &[Value],
    schema: &jsonschema::Validator,
    who: &str,
    laurel: impl Fn(&Value) -> Result<(), String>,
) -> (usize, usize) {
    let mut disagreements = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    for document in corpus {
        let verdict = laurel(document);
        let schema_errors = errors(schema, document);
        match (&verdict, schema_errors.is_empty()) {
            (Ok(()), true) => accepted += 1,
            (Err(_), false) => refused += 1,
            (verdict, _) => disagreements.push(format!(
                "{document}\n  {who}: {verdict:?}\n  schema: {schema_errors:?}"
            )),
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    (accepted, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_award_schema_accepts_what_laurel_accepts_and_refuses_what_it_refuses() {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    laurel::library::register(&mut store, &support::runtime())
        .await
        .unwrap();
    let registry = Registry::start(&db.url, support::runtime()).await.unwrap();
    let award = validator(&schema("award.json"));
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("demo");
    let mut corpus: Vec<Value> = Vec::new();
    for file in ["content-maker.json", "three-of-either.json"] {
        let text = std::fs::read_to_string(demo.join(file)).unwrap();
        match serde_json::from_str::<Value>(&text).unwrap() {
            Value::Array(all) => corpus.extend(all),
            one => corpus.push(one),
        }
    }
    let good = corpus[0].clone();
    let changed = |change: &dyn Fn(&mut Value)| {
        let mut value = good.clone();
        change(&mut value);
        value
    };
    corpus.extend([
        changed(&|v| v["revocation"] = json!("sticky")),
        changed(&|v| v["enabled"] = json!(false)),
        changed(&|v| {
            v.as_object_mut().unwrap().remove("title");
        }),
        changed(&|v| v["title"] = json!("   ")),
        changed(&|v| v["id"] = json!("-starts-with-a-dash")),
        changed(&|v| v["id"] = json!("x".repeat(129))),
        changed(&|v| v["objectives"] = json!([])),
        changed(&|v| v["revocation"] = json!("forever")),
        changed(&|v| v["colour"] = json!("gold")),
        changed(&|v| v["objectives"][0]["progress_counter"] = json!("")),
        changed(&|v| {
            v["objectives"][0].as_object_mut().unwrap().remove("rule");
        }),
        changed(&|v| v["objectives"][0]["rule"]["version"] = json!(2)),
        changed(&|v| v["objectives"][0]["id"] = json!("has space")),
        changed(&|v| v["enabled"] = json!("yes")),
    ]);
    let (accepted, refused) = agreement(&corpus, &award, "laurel", |definition| {
        laurel::definitions::parse(&definition.to_string())
            .map_err(|e| e.to_string())
            .and_then(|parsed| {
                laurel::definitions::validate(&parsed, &registry)
                    .map(drop)
                    .map_err(|e| e.to_string())
            })
    });
    assert!(
        accepted >= 3 && refused >= 10,
        "{accepted} accepted, {refused} refused"
    );
}

#[test]
fn the_event_schema_accepts_what_ingest_accepts_and_refuses_what_it_refuses() {
    let event = validator(&schema("event.json"));
    let good = json!({"id": "e-1", "source": "photos", "type": "photo.created", "user_id": "u-1",
        "authorized": true, "content_id": "p-1", "status": "active",
        "occurred_at": "2026-12-01T10:00:00Z", "payload": {"width": 800, "tags": ["a", {"b": null}]}});
    let changed = |change: &dyn Fn(&mut Value)| {
        let mut value = good.clone();
        change(&mut value);
        value
    };
    let mut corpus = vec![
        good.clone(),
        changed(&|v| {
            v.as_object_mut().unwrap().remove("payload");
        }),
        changed(&|v| v["content_id"] = Value::Null),
        changed(&|v| v["occurred_at"] = json!("2026-12-01T10:00:00.123456+02:00")),
        changed(&|v| v["payload"]["big"] = json!(9_007_199_254_740_992_i64)),
        changed(&|v| {
            v.as_object_mut().unwrap().remove("id");
        }),
        changed(&|v| v["id"] = json!("")),
        changed(&|v| v["user_id"] = json!("u\u{0}1")),
        changed(&|v| v["id"] = json!("i".repeat(513))),
        changed(&|v| v["type"] = json!("t".repeat(257))),
        changed(&|v| v["status"] = json!("s\u{0}")),
        changed(&|v| v["authorized"] = json!("true")),
        changed(&|v| v["occurred_at"] = json!("yesterday")),
        changed(&|v| v["payload"] = json!([1, 2])),
        changed(&|v| v["payload"]["huge"] = json!(18_014_398_509_481_984_i64)),
        changed(&|v| v["payload"]["deep"] = json!({"k\u{0}": 1})),
        changed(&|v| v["payload"]["text"] = json!("nul \u{0} inside")),
    ];
    // Every event of the built-ins' filter and rule cases.
    let cases = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases");
    for builtin in laurel::library::BUILTINS {
        if !matches!(builtin.kind, FunctionKind::Filter | FunctionKind::Rule) {
            continue;
        }
        for case in std::fs::read_dir(cases.join(builtin.name)).unwrap() {
            let input = case.unwrap().path().join("input.jsonl");
            if let Ok(text) = std::fs::read_to_string(&input) {
                corpus.extend(
                    text.lines()
                        .map(|l| serde_json::from_str::<Value>(l).unwrap()),
                );
            }
        }
    }
    let (accepted, refused) = agreement(&corpus, &event, "ingest", |value| {
        Envelope::parse(value.to_string().as_bytes())
            .map(drop)
            .map_err(|e| e.to_string())
    });
    assert!(
        accepted >= 20 && refused >= 12,
        "{accepted} accepted, {refused} refused"
    );
}

#[test]
fn every_line_of_the_builtin_fixtures_fits_the_fixture_schema_of_its_kind() {
    let fixture = schema("fixture.json");
    let of = |definition: &str| {
        let mut wrapper = fixture.clone();
        wrapper["$ref"] = json!(format!("#/$defs/{definition}"));
        validator(&wrapper)
    };
    let host = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Every built-in's cases, and the SDKs' examples' (one per kind, which
    // `laurel functions new` writes into every new project).
    let mut all: Vec<(&str, std::path::PathBuf)> = Vec::new();
    for builtin in laurel::library::BUILTINS {
        for case in std::fs::read_dir(host.join("tests/cases").join(builtin.name)).unwrap() {
            all.push((builtin.kind.as_str(), case.unwrap().path()));
        }
    }
    for kind in ["filter", "rule", "strategy", "transform"] {
        all.push((
            kind,
            host.join("../functions/guest/examples/fixtures").join(kind),
        ));
    }
    let mut lines = 0;
    let mut problems = Vec::new();
    for (kind, case) in all {
        let (input, expected) = (
            of(&format!("{kind}_input")),
            of(&format!("{kind}_expected")),
        );
        {
            for (file, validator) in [("input.jsonl", &input), ("expected.jsonl", &expected)] {
                let Ok(text) = std::fs::read_to_string(case.join(file)) else {
                    continue;
                };
                for (n, line) in text
                    .lines()
                    .enumerate()
                    .filter(|(_, l)| !l.trim().is_empty())
                {
                    lines += 1;
                    let value: Value = serde_json::from_str(line).unwrap();
                    for error in errors(validator, &value) {
                        problems.push(format!("{}/{file}:{}: {error}", case.display(), n + 1));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(lines > 150, "only {lines} lines");
    // And a wrong answer does not fit.
    assert!(
        !of("rule_expected")
            .is_valid(&json!({"counters": {"n": 1.5}, "dedup_key": null, "additive": false}))
    );
    assert!(!of("strategy_expected").is_valid(&json!({"progress": 1})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pipeline_schema_accepts_what_laurel_accepts_and_refuses_what_it_refuses() {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    laurel::library::register(&mut store, &support::runtime())
        .await
        .unwrap();
    let registry = Registry::start(&db.url, support::runtime()).await.unwrap();
    let pipeline = validator(&schema("pipeline.json"));
    let good = json!({
        "name": "navigator", "input_topic": "raw.navigator", "source": "bss",
        "transform": {"name": "KeyValueTransform", "config": {"fields": {
            "user_id": "uid", "type": "event", "authorized": {"const": true},
            "occurred_at": "ts", "occurred_at_unit": "s", "payload": {"distance_m": "dist"}}}}
    });
    let changed = |change: &dyn Fn(&mut Value)| {
        let mut value = good.clone();
        change(&mut value);
        value
    };
    let corpus = [
        good.clone(),
        changed(&|v| v["$schema"] = json!("http://127.0.0.1:8080/schemas/pipeline.json")),
        changed(&|v| v["input_topic"] = json!("raw_2.x-y")),
        changed(&|v| v["$schema"] = json!(7)),
        changed(&|v| v["input_topic"] = json!("events.bss")),
        changed(&|v| v["input_topic"] = json!("raw.navigator.dead")),
        changed(&|v| v["input_topic"] = json!("has space")),
        changed(&|v| v["input_topic"] = json!("")),
        changed(&|v| v["input_topic"] = json!("..")),
        changed(&|v| v["name"] = json!("-dash")),
        changed(&|v| v["source"] = json!("a/b")),
        changed(&|v| v["transform"]["config"] = json!([1])),
        changed(&|v| v["transform"]["version"] = json!(2)),
        changed(&|v| v["colour"] = json!("red")),
        changed(&|v| {
            v.as_object_mut().unwrap().remove("source");
        }),
    ];
    let (accepted, refused) = agreement(&corpus, &pipeline, "laurel", |definition| {
        laurel::pipelines::parse(&definition.to_string())
            .map_err(|e| e.to_string())
            .and_then(|parsed| {
                laurel::pipelines::validate(&parsed, &registry).map_err(|e| e.to_string())
            })
    });
    assert_eq!((accepted, refused), (3, 12));
}

/// Every JSON block of the README and docs/, and every file of the demo,
/// that is an award definition (it has `objectives`), a pipeline
/// definition (`input_topic`) or an event (`occurred_at` and `user_id`)
/// fits its schema, a file of several definitions each of them; so the
/// examples cannot drift from what Laurel takes.
#[test]
fn every_award_pipeline_and_event_the_docs_show_fits_its_schema() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pages = vec![root.join("README.md")];
    pages.extend(crate::support::doc_pages());
    // The demo's definitions are documents too (`laurel up --demo`
    // applies them), each naming its schema for editors.
    let mut documents = Vec::new();
    for entry in std::fs::read_dir(root.join("host/demo")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\"$schema\": \"../src/api/schemas/"),
            "{} names no schema",
            path.display()
        );
        documents.push((path, format!("```json\n{text}\n```")));
    }
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        documents.push((page, text));
    }
    let (award, pipeline, event) = (
        validator(&schema("award.json")),
        validator(&schema("pipeline.json")),
        validator(&schema("event.json")),
    );
    let mut checked = [0; 3];
    let mut problems = Vec::new();
    for (page, text) in documents {
        for block in text.split("```json\n").skip(1) {
            let Some((json_text, _)) = block.split_once("\n```") else {
                continue;
            };
            // Blocks of one value; a fragment (with `...`) is not a document.
            let Ok(value) = serde_json::from_str::<Value>(json_text) else {
                continue;
            };
            let items = match value {
                Value::Array(items) => items,
                one => vec![one],
            };
            for item in items {
                let which = if item.get("objectives").is_some() {
                    0
                } else if item.get("input_topic").is_some() {
                    1
                } else if item.get("occurred_at").is_some() && item.get("user_id").is_some() {
                    2
                } else {
                    continue;
                };
                checked[which] += 1;
                let validator = [&award, &pipeline, &event][which];
                for error in errors(validator, &item) {
                    problems.push(format!("{}: {item}: {error}", page.display()));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        checked[0] >= 2 && checked[1] >= 2,
        "awards, pipelines, events checked: {checked:?}"
    );
}
