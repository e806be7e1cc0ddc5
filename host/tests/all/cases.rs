//! Data-driven cases for the built-in functions, run through real wasmtime:
//! `tests/cases/<FunctionName>/<case>/` holds
//!
//! - `config.json`: the function's config (given to it verbatim),
//! - either `error.txt`: text the config error must contain,
//! - or `input.json` and `expected.json`:
//!   - filters: events (the contract's envelope) -> one `true`/`false` each;
//!   - rules: events -> one `null` (ignored), `{"counters": {..},
//!     "dedup_key": .., "additive": ..}`, or `{"error": "text it contains"}` each;
//!   - strategies: users (`{"objective": value}` or a list of
//!     `{"objective_id", "value", "counters"}`) -> one `{"progress", "goal",
//!     "started", "completed"}` or `{"error": ..}` each;
//!   - transforms: raw records of topic `raw.test` (`{"value", "key",
//!     "partition", "offset", "timestamp_ms", "headers": {name: text}}`, all
//!     but `value` optional; a `value` that is not a string is its JSON
//!     text) -> one list of events (`{"id", "type", "user_id", "authorized",
//!     "content_id", "status", "occurred_at", "payload"}`) or `{"error":
//!     ..}` each.
//!
//! Adding a case is adding a folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use laurel::event::Envelope;
use laurel::runtime::{
    Contribution, Counter, FilterInstance, FunctionError, FunctionKind, ObjectiveState, RawRecord,
    RuleInstance, StrategyInstance, TransformInstance, Transformed,
};
use serde_json::{Value, json};

use crate::support;

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("cases")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("failed to read {}: {e}", path.display()))
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&read(path))
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn contribution_json(c: &Contribution) -> Value {
    let counters: BTreeMap<&str, i64> = c
        .counters
        .iter()
        .map(|Counter { name, value }| (name.as_str(), *value))
        .collect();
    json!({"counters": counters, "dedup_key": c.dedup_key, "additive": c.additive})
}

fn objective_states(user: &Value) -> Vec<ObjectiveState> {
    match user {
        Value::Object(map) => map
            .iter()
            .map(|(id, value)| ObjectiveState {
                objective_id: id.clone(),
                value: value.as_f64().expect("objective value is a number"),
                counters: Vec::new(),
            })
            .collect(),
        Value::Array(states) => states
            .iter()
            .map(|s| ObjectiveState {
                objective_id: s["objective_id"]
                    .as_str()
                    .expect("objective_id")
                    .to_string(),
                value: s["value"].as_f64().expect("value"),
                counters: s["counters"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| Counter {
                                name: k.clone(),
                                value: v.as_i64().unwrap(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect(),
        other => panic!("a user is an object or a list, got {other}"),
    }
}

/// Compares actual to expected; for `{"error": text}` the actual error must
/// contain the text.
fn check(case: &Path, index: usize, actual: &Value, expected: &Value) {
    if let (Some(want), Some(got)) = (
        expected.get("error").and_then(Value::as_str),
        actual.get("error"),
    ) {
        let got = got.as_str().unwrap_or_default();
        assert!(
            got.contains(want),
            "{} [{index}]: error {got:?} does not contain {want:?}",
            case.display()
        );
        return;
    }
    assert_eq!(actual, expected, "{} [{index}]", case.display());
}

fn run_case(
    runtime: &laurel::runtime::Runtime,
    function_name: &str,
    case: &Path,
) -> Result<(), String> {
    let function = support::builtin(runtime, function_name);
    let config = read(&case.join("config.json"));
    let error_file = case.join("error.txt");
    let created = match function.kind {
        FunctionKind::Filter => {
            FilterInstance::new(function.clone(), &config).map(Instance::Filter)
        }
        FunctionKind::Rule => RuleInstance::new(function.clone(), &config).map(Instance::Rule),
        FunctionKind::Strategy => {
            StrategyInstance::new(function.clone(), &config).map(Instance::Strategy)
        }
        FunctionKind::Transform => {
            TransformInstance::new(function.clone(), &config).map(Instance::Transform)
        }
    };
    if error_file.exists() {
        let want = read(&error_file).trim().to_string();
        return match created {
            Ok(_) => Err(format!(
                "{}: config was accepted, expected an error containing {want:?}",
                case.display()
            )),
            Err(error @ FunctionError::Config { .. }) => {
                let message = error.to_string();
                if !message.contains(&want) {
                    return Err(format!(
                        "{}: error {message:?} does not contain {want:?}",
                        case.display()
                    ));
                }
                if !message.contains(function_name) {
                    return Err(format!(
                        "{}: error {message:?} does not name the function",
                        case.display()
                    ));
                }
                Ok(())
            }
            Err(other) => Err(format!(
                "{}: expected a config error, got {other}",
                case.display()
            )),
        };
    }
    let mut instance = created.map_err(|e| format!("{}: {e}", case.display()))?;
    let input = json(&case.join("input.json"));
    let expected = json(&case.join("expected.json"));
    let inputs = input.as_array().expect("input.json is a list");
    let expected = expected.as_array().expect("expected.json is a list");
    assert_eq!(
        inputs.len(),
        expected.len(),
        "{}: input and expected differ in length",
        case.display()
    );
    let actual: Vec<Value> = match &mut instance {
        Instance::Filter(filter) => {
            let events: Vec<_> = inputs
                .iter()
                .map(|e| {
                    Envelope::parse(e.to_string().as_bytes())
                        .expect("valid event")
                        .to_function_event()
                })
                .collect();
            filter
                .matches(&events)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(Value::Bool)
                .collect()
        }
        Instance::Rule(rule) => {
            let events: Vec<_> = inputs
                .iter()
                .map(|e| {
                    Envelope::parse(e.to_string().as_bytes())
                        .expect("valid event")
                        .to_function_event()
                })
                .collect();
            rule.contribute(&events)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|answer| match answer {
                    Ok(Some(c)) => contribution_json(&c),
                    Ok(None) => Value::Null,
                    Err(error) => json!({"error": error}),
                })
                .collect()
        }
        Instance::Strategy(strategy) => {
            let users: Vec<_> = inputs.iter().map(objective_states).collect();
            strategy
                .evaluate(&users)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|answer| match answer {
                    Ok(p) => json!({"progress": p.progress, "goal": p.goal, "started": p.started, "completed": p.completed}),
                    Err(error) => json!({"error": error}),
                })
                .collect()
        }
        Instance::Transform(transform) => {
            let values: Vec<Vec<u8>> = inputs
                .iter()
                .map(|r| match &r["value"] {
                    Value::String(text) => text.clone().into_bytes(),
                    other => other.to_string().into_bytes(),
                })
                .collect();
            let records: Vec<RawRecord<'_>> = inputs
                .iter()
                .zip(&values)
                .enumerate()
                .map(|(n, (r, value))| raw_record(r, value, n))
                .collect();
            transform
                .apply("raw.test", &records)
                .map_err(|e| e.to_string())?
                .into_iter()
                .map(|answer| match answer {
                    Ok(events) => Value::Array(events.iter().map(event_json).collect()),
                    Err(error) => json!({"error": error}),
                })
                .collect()
        }
    };
    for (index, (actual, expected)) in actual.iter().zip(expected).enumerate() {
        check(case, index, actual, expected);
    }
    Ok(())
}

enum Instance {
    Filter(FilterInstance),
    Rule(RuleInstance),
    Strategy(StrategyInstance),
    Transform(TransformInstance),
}

/// A case's raw record; `n`: its place in the case (its default offset).
fn raw_record<'a>(record: &'a Value, value: &'a [u8], n: usize) -> RawRecord<'a> {
    RawRecord {
        partition: record["partition"].as_i64().unwrap_or(0) as i32,
        offset: record["offset"].as_i64().unwrap_or(n as i64),
        value,
        key: record["key"].as_str().map(str::as_bytes),
        timestamp_ms: record["timestamp_ms"].as_i64(),
        headers: record["headers"]
            .as_object()
            .map(|h| {
                h.iter()
                    .map(|(name, v)| (name.as_str(), v.as_str().unwrap_or_default().as_bytes()))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn event_json(event: &Transformed) -> Value {
    json!({
        "id": event.id,
        "type": event.event_type,
        "user_id": event.user_id,
        "authorized": event.authorized,
        "content_id": event.content_id,
        "status": event.status,
        "occurred_at": event.occurred_at,
        "payload": serde_json::from_str::<Value>(&event.payload)
            .unwrap_or_else(|_| Value::String(event.payload.clone())),
    })
}

#[test]
fn every_builtin_function_passes_its_cases() {
    let runtime = support::runtime();
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut functions_with_cases = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(cases_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    for function_dir in dirs {
        let function_name = function_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        functions_with_cases.push(function_name.clone());
        let mut cases: Vec<_> = std::fs::read_dir(&function_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        cases.sort();
        for case in cases {
            ran += 1;
            if let Err(failure) = run_case(&runtime, &function_name, &case) {
                failures.push(failure);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ran} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    for builtin in laurel::library::BUILTINS {
        assert!(
            functions_with_cases.iter().any(|f| f == builtin.name),
            "built-in {} has no cases",
            builtin.name
        );
    }
}
