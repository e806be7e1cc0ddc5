//! Fixtures: a function's cases, run through the real runtime with no
//! database, broker or network. `laurel functions test` runs a product
//! team's fixtures with them, and the tests run the built-in library's
//! cases (`host/tests/cases/<Function>/`) the same way: one format.
//!
//! A case is a folder:
//!
//! - `config.json`: the function's config, given to it verbatim (optional
//!   where the runner is given a config for every case);
//! - either `error.txt`: text the refusal of that config must contain,
//! - or `input.jsonl` and `expected.jsonl`, one JSON value per line (blank
//!   lines are skipped), the `n`-th expected line for the `n`-th input:
//!   - filters: events (the contract's envelope) -> `true` or `false`;
//!   - rules: events -> `null` (ignored), `{"counters": {..}, "dedup_key":
//!     .., "additive": ..}`, or `{"error": "text it contains"}`;
//!   - strategies: users (`{"objective": value}`, or a list of
//!     `{"objective_id", "value", "counters"}`) -> `{"progress", "goal",
//!     "started", "completed"}` or `{"error": ..}`;
//!   - transforms: raw records of topic `raw.test` (`{"value", "key",
//!     "partition", "offset", "timestamp_ms", "headers": {name: text}}`,
//!     all but `value` optional; a `value` that is not a string is its
//!     JSON text; `offset` defaults to the line's place, from 0) -> a list
//!     of events (`{"id", "type", "user_id", "authorized", "content_id",
//!     "status", "occurred_at", "payload"}`) or `{"error": ..}`.
//!
//! A fixtures folder is one case or holds cases as subfolders.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::event::Envelope;
use crate::runtime::{
    Contribution, Counter, FilterInstance, Function, FunctionError, FunctionKind, ObjectiveState,
    RawRecord, RuleInstance, StrategyInstance, TransformInstance, Transformed,
};

/// The topic a transform's cases are read from.
pub const TEST_TOPIC: &str = "raw.test";

/// How one case went.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseResult {
    /// The case's folder.
    pub case: PathBuf,
    /// Inputs checked (0 for a config refusal case).
    pub items: usize,
    /// What differed, one line each; empty when the case passed.
    pub failures: Vec<String>,
}

impl CaseResult {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The cases in `dir`: `dir` itself when it is a case, else its subfolders
/// that are cases, in name order.
pub fn cases(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let is_case = |d: &Path| d.join("input.jsonl").is_file() || d.join("error.txt").is_file();
    if is_case(dir) {
        return Ok(vec![dir.to_path_buf()]);
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|d| d.is_dir() && is_case(d))
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(format!(
            "{} holds no case: a case is a folder with input.jsonl and expected.jsonl, or error.txt",
            dir.display()
        ));
    }
    Ok(found)
}

/// Runs every case in `dir` (see [`cases`]) against `function`; a case
/// without `config.json` gets `config`.
pub fn run_all(
    function: &Arc<Function>,
    config: Option<&str>,
    dir: &Path,
) -> Result<Vec<CaseResult>, String> {
    Ok(cases(dir)?
        .into_iter()
        .map(|case| run(function, config, &case))
        .collect())
}

/// Runs one case against `function`.
pub fn run(function: &Arc<Function>, config: Option<&str>, case: &Path) -> CaseResult {
    let (items, failures) = match run_case(function, config, case) {
        Ok((items, failures)) => (items, failures),
        Err(failure) => (0, vec![failure]),
    };
    CaseResult {
        case: case.to_path_buf(),
        items,
        failures,
    }
}

/// (items checked, failures), or why the case could not be run at all.
fn run_case(
    function: &Arc<Function>,
    default_config: Option<&str>,
    case: &Path,
) -> Result<(usize, Vec<String>), String> {
    let config_file = case.join("config.json");
    let config = if config_file.is_file() {
        read(&config_file)?
    } else {
        default_config
            .ok_or("no config.json in the case and no config given")?
            .to_string()
    };
    let created = Instance::new(function, &config);
    let error_file = case.join("error.txt");
    if error_file.is_file() {
        let want = read(&error_file)?.trim().to_string();
        let failure = match created {
            Ok(_) => Some(format!(
                "the config was accepted; expected a refusal containing {want:?}"
            )),
            Err(error @ FunctionError::Config { .. }) => {
                let message = error.to_string();
                (!message.contains(&want))
                    .then(|| format!("refusal {message:?} does not contain {want:?}"))
            }
            Err(other) => Some(format!("expected a refusal of the config, got: {other}")),
        };
        return Ok((0, failure.into_iter().collect()));
    }
    let mut instance = created.map_err(|e| format!("the function cannot be created: {e}"))?;
    let inputs = lines(&case.join("input.jsonl"))?;
    let expected = lines(&case.join("expected.jsonl"))?;
    if inputs.len() != expected.len() {
        return Err(format!(
            "input.jsonl has {} lines, expected.jsonl {}: one answer per input",
            inputs.len(),
            expected.len()
        ));
    }
    let values: Vec<Value> = inputs.iter().map(|(_, v)| v.clone()).collect();
    let actual = instance.answers(&values)?;
    let mut failures = Vec::new();
    for ((line, _), (actual, (_, expected))) in inputs.iter().zip(actual.iter().zip(&expected)) {
        failures.extend(
            differences(actual, expected)
                .into_iter()
                .map(|d| format!("input line {line}: {d}")),
        );
    }
    Ok((inputs.len(), failures))
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// A JSONL file's values with their line numbers (from 1).
fn lines(path: &Path) -> Result<Vec<(usize, Value)>, String> {
    read(path)?
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            serde_json::from_str(line)
                .map(|value| (n + 1, value))
                .map_err(|e| format!("{} line {}: not JSON: {e}", path.display(), n + 1))
        })
        .collect()
}

/// How `actual` differs from `expected`, one line per difference (empty:
/// it does not). `{"error": text}` expects an error containing the text.
pub fn differences(actual: &Value, expected: &Value) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(want) = expected.get("error").and_then(Value::as_str)
        && expected.as_object().is_some_and(|o| o.len() == 1)
    {
        match actual.get("error").and_then(Value::as_str) {
            Some(got) if got.contains(want) => {}
            Some(got) => found.push(format!("error {got:?} does not contain {want:?}")),
            None => found.push(format!(
                "expected an error containing {want:?}, got {actual}"
            )),
        }
        return found;
    }
    differ("", actual, expected, &mut found);
    found
}

fn differ(at: &str, actual: &Value, expected: &Value, found: &mut Vec<String>) {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(e.keys()).collect();
            for key in keys {
                let place = format!("{at}/{key}");
                match (a.get(key), e.get(key)) {
                    (Some(a), Some(e)) => differ(&place, a, e, found),
                    (Some(a), None) => found.push(format!("{place}: not expected, got {a}")),
                    (None, Some(e)) => found.push(format!("{place}: expected {e}, got nothing")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(a), Value::Array(e)) if a.len() == e.len() => {
            for (n, (a, e)) in a.iter().zip(e).enumerate() {
                differ(&format!("{at}/{n}"), a, e, found);
            }
        }
        (a, e) if a != e => {
            let place = if at.is_empty() { "answer" } else { at };
            found.push(format!("{place}: expected {e}, got {a}"));
        }
        _ => {}
    }
}

enum Instance {
    Filter(FilterInstance),
    Rule(RuleInstance),
    Strategy(StrategyInstance),
    Transform(TransformInstance),
}

impl Instance {
    fn new(function: &Arc<Function>, config: &str) -> Result<Instance, FunctionError> {
        let function = Arc::clone(function);
        Ok(match function.kind {
            FunctionKind::Filter => Instance::Filter(FilterInstance::new(function, config)?),
            FunctionKind::Rule => Instance::Rule(RuleInstance::new(function, config)?),
            FunctionKind::Strategy => Instance::Strategy(StrategyInstance::new(function, config)?),
            FunctionKind::Transform => {
                Instance::Transform(TransformInstance::new(function, config)?)
            }
            FunctionKind::Http => {
                return Err(FunctionError::Config {
                    name: function.name.clone(),
                    version: function.version,
                    reason: "an HTTP function is tested by requests to it, not by fixtures".into(),
                });
            }
        })
    }

    /// The function's answer for each input, as the fixture format writes
    /// it.
    fn answers(&mut self, inputs: &[Value]) -> Result<Vec<Value>, String> {
        let failed = |e: FunctionError| format!("the call failed: {e}");
        Ok(match self {
            Instance::Filter(filter) => filter
                .matches(&events(inputs)?)
                .map_err(failed)?
                .into_iter()
                .map(Value::Bool)
                .collect(),
            Instance::Rule(rule) => rule
                .contribute(&events(inputs)?)
                .map_err(failed)?
                .into_iter()
                .map(|answer| match answer {
                    Ok(Some(c)) => contribution_json(&c),
                    Ok(None) => Value::Null,
                    Err(error) => json!({"error": error}),
                })
                .collect(),
            Instance::Strategy(strategy) => {
                let users = inputs
                    .iter()
                    .enumerate()
                    .map(|(n, user)| objective_states(user).map_err(|e| format!("input {n}: {e}")))
                    .collect::<Result<Vec<_>, _>>()?;
                strategy
                    .evaluate(&users)
                    .map_err(failed)?
                    .into_iter()
                    .map(|answer| match answer {
                        Ok(p) => json!({"progress": p.progress, "goal": p.goal,
                                        "started": p.started, "completed": p.completed}),
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
                    .apply(TEST_TOPIC, &records)
                    .map_err(failed)?
                    .into_iter()
                    .map(|answer| match answer {
                        Ok(events) => Value::Array(events.iter().map(event_json).collect()),
                        Err(error) => json!({"error": error}),
                    })
                    .collect()
            }
        })
    }
}

/// Inputs as events, each checked as ingest checks one.
fn events(inputs: &[Value]) -> Result<Vec<crate::runtime::Event>, String> {
    inputs
        .iter()
        .enumerate()
        .map(|(n, e)| {
            Envelope::parse(e.to_string().as_bytes())
                .map(|envelope| envelope.to_function_event())
                .map_err(|error| format!("input {}: not an event: {error}", n + 1))
        })
        .collect()
}

fn contribution_json(c: &Contribution) -> Value {
    let counters: BTreeMap<&str, i64> = c
        .counters
        .iter()
        .map(|Counter { name, value }| (name.as_str(), *value))
        .collect();
    json!({"counters": counters, "dedup_key": c.dedup_key, "additive": c.additive})
}

/// A strategy's input: `{"objective": value}` or a list of
/// `{"objective_id", "value", "counters"}`.
fn objective_states(user: &Value) -> Result<Vec<ObjectiveState>, String> {
    match user {
        Value::Object(map) => map
            .iter()
            .map(|(id, value)| {
                Ok(ObjectiveState {
                    objective_id: id.clone(),
                    value: value
                        .as_f64()
                        .ok_or_else(|| format!("objective {id:?}: {value} is not a number"))?,
                    counters: Vec::new(),
                })
            })
            .collect(),
        Value::Array(states) => states
            .iter()
            .map(|s| {
                let counters = match &s["counters"] {
                    Value::Null => Vec::new(),
                    Value::Object(m) => m
                        .iter()
                        .map(|(k, v)| {
                            Ok(Counter {
                                name: k.clone(),
                                value: v.as_i64().ok_or_else(|| {
                                    format!("counter {k:?}: {v} is not an integer")
                                })?,
                            })
                        })
                        .collect::<Result<_, String>>()?,
                    other => return Err(format!("`counters` is an object, not {other}")),
                };
                Ok(ObjectiveState {
                    objective_id: s["objective_id"]
                        .as_str()
                        .ok_or("each state needs `objective_id` text")?
                        .to_string(),
                    value: s["value"]
                        .as_f64()
                        .ok_or("each state needs a numeric `value`")?,
                    counters,
                })
            })
            .collect(),
        other => Err(format!(
            "a user is an object or a list of states, not {other}"
        )),
    }
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
