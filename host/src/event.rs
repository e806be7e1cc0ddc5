//! The event envelope of the contract, its checks, and its form for
//! functions.
//!
//! A tolerant reader: fields the contract does not name are accepted and
//! ignored (producers evolve), while a named field of the wrong type is an
//! error. Everything an event carries that Laurel stores or hands to a
//! function is bounded here, before any function or database sees it, so a
//! bad event is refused with its reason instead of failing a batch.

use chrono::{DateTime, SubsecRound, Utc};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::runtime::{Event, Field, Scalar};

/// Longest `id`, `user_id` and `content_id`, in bytes. PostgreSQL indexes
/// these (a B-tree entry holds at most 2,704 bytes, and the longest key,
/// a de-duplication membership, holds a user id, a content id and a
/// de-duplication key).
pub const MAX_ID_BYTES: usize = 512;
/// Larger messages are dead-lettered, unless a setting
/// (`LAUREL_MAX_EVENT_BYTES`) says otherwise.
pub const MAX_EVENT_BYTES: usize = 1 << 20;
/// Longest `type` and `status`, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Most payload leaves (scalars) an event may have.
pub const MAX_PAYLOAD_FIELDS: usize = 4096;
/// Largest magnitude of a payload number: integers beyond it are not exact
/// as JSON numbers in most producers (2^53).
pub const MAX_SAFE_NUMBER: f64 = 9_007_199_254_740_992.0;
/// The flattened payload (every leaf's JSON pointer and text) may be at
/// most this many times the size of the message, plus [`FLAT_SLACK`]:
/// one long key over a long array would otherwise flatten to gigabytes.
pub const FLAT_FACTOR: usize = 4;
pub const FLAT_SLACK: usize = 64 << 10;

/// One user action, as it arrives on `events.<source>`.
#[derive(Debug, Clone, Deserialize)]
pub struct Envelope {
    pub id: String,
    pub source: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub user_id: String,
    pub authorized: bool,
    #[serde(default)]
    pub content_id: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    pub occurred_at: DateTime<Utc>,
    #[serde(default)]
    pub payload: Map<String, Value>,
}

/// Why a message is not an event of the contract; in words, the reason an
/// operator reads on its dead letter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Not JSON, or a named field missing or of the wrong type.
    #[error("malformed event: {0}")]
    Json(String),
    /// A named field out of bounds (empty, too long, a NUL).
    #[error("malformed event: `{field}` {reason}")]
    Field { field: &'static str, reason: String },
    /// The payload out of bounds (a number, a text, its size).
    #[error("payload: {0}")]
    Payload(String),
}

impl Envelope {
    /// Parses and checks one message's value.
    pub fn parse(bytes: &[u8]) -> Result<Envelope, EnvelopeError> {
        let mut envelope: Envelope =
            serde_json::from_slice(bytes).map_err(|e| EnvelopeError::Json(e.to_string()))?;
        envelope.check(bytes.len())?;
        // As PostgreSQL keeps it: an event compared with the stored last
        // event of its item must compare equal to itself.
        envelope.occurred_at = envelope.occurred_at.trunc_subsecs(6);
        Ok(envelope)
    }

    fn check(&self, message_bytes: usize) -> Result<(), EnvelopeError> {
        id_field("id", &self.id)?;
        id_field("user_id", &self.user_id)?;
        if let Some(content) = &self.content_id {
            id_field("content_id", content)?;
        }
        name_field("source", &self.source)?;
        name_field("type", &self.event_type)?;
        if let Some(status) = &self.status {
            name_field("status", status)?;
        }
        let mut budget = Budget {
            fields: 0,
            bytes: 0,
            max_bytes: message_bytes
                .saturating_mul(FLAT_FACTOR)
                .saturating_add(FLAT_SLACK),
        };
        for (key, value) in &self.payload {
            check_text(key)
                .map_err(|reason| format!("a key {reason}"))
                .and_then(|()| check_value(value, pointer_len(key), &mut budget))
                .map_err(EnvelopeError::Payload)?;
        }
        Ok(())
    }

    /// The event as functions receive it: the payload flattened once into
    /// its scalar leaves, addressed by JSON pointer. Bounded by the checks
    /// of [`Envelope::parse`].
    pub fn to_function_event(&self) -> Event {
        let mut payload = Vec::new();
        let mut path = String::new();
        for (key, value) in &self.payload {
            push_key(&mut path, key);
            flatten(value, &mut path, &mut payload);
            path.clear();
        }
        Event {
            id: self.id.clone(),
            source: self.source.clone(),
            type_: self.event_type.clone(),
            user_id: self.user_id.clone(),
            content_id: self.content_id.clone(),
            status: self.status.clone(),
            occurred_at_ms: self.occurred_at.timestamp_millis(),
            payload,
        }
    }
}

fn id_field(field: &'static str, value: &str) -> Result<(), EnvelopeError> {
    if value.is_empty() {
        return Err(EnvelopeError::Field {
            field,
            reason: "must not be empty".into(),
        });
    }
    bounded(field, value, MAX_ID_BYTES)
}

fn name_field(field: &'static str, value: &str) -> Result<(), EnvelopeError> {
    bounded(field, value, MAX_NAME_BYTES)
}

fn bounded(field: &'static str, value: &str, max: usize) -> Result<(), EnvelopeError> {
    let reason = if value.len() > max {
        format!("is {} bytes, over the limit of {max}", value.len())
    } else {
        match check_text(value) {
            Ok(()) => return Ok(()),
            Err(reason) => reason,
        }
    };
    Err(EnvelopeError::Field { field, reason })
}

/// PostgreSQL stores no NUL in text or JSON, and functions may pass a
/// payload text on as a key.
fn check_text(text: &str) -> Result<(), String> {
    if text.contains('\0') {
        return Err("contains a NUL character (\\u0000)".to_string());
    }
    Ok(())
}

struct Budget {
    fields: usize,
    bytes: usize,
    max_bytes: usize,
}

/// The length of `/key` in a JSON pointer.
fn pointer_len(key: &str) -> usize {
    1 + key.len() + key.matches(['~', '/']).count()
}

fn check_value(value: &Value, path_len: usize, budget: &mut Budget) -> Result<(), String> {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                check_text(key).map_err(|reason| format!("a key {reason}"))?;
                check_value(child, path_len + pointer_len(key), budget)?;
            }
            return Ok(());
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                check_value(child, path_len + 1 + decimal_len(index), budget)?;
            }
            return Ok(());
        }
        Value::Number(n) => {
            let safe = match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => i.unsigned_abs() <= MAX_SAFE_NUMBER as u64,
                (_, Some(u), _) => u <= MAX_SAFE_NUMBER as u64,
                (_, _, Some(f)) => f.is_finite() && f.abs() <= MAX_SAFE_NUMBER,
                _ => false,
            };
            if !safe {
                return Err(format!(
                    "the number {n} is outside the safe range (magnitude at most 2^53)"
                ));
            }
        }
        Value::String(text) => {
            check_text(text).map_err(|reason| format!("a text {reason}"))?;
            budget.bytes = budget.bytes.saturating_add(text.len());
        }
        Value::Null | Value::Bool(_) => {}
    }
    budget.fields += 1;
    budget.bytes = budget.bytes.saturating_add(path_len);
    if budget.fields > MAX_PAYLOAD_FIELDS {
        return Err(format!(
            "more than {MAX_PAYLOAD_FIELDS} fields (scalars, counted through arrays and objects)"
        ));
    }
    if budget.bytes > budget.max_bytes {
        return Err(format!(
            "its flattened form (JSON pointer and text of every field) is over {} bytes, \
             {FLAT_FACTOR} times the message plus {FLAT_SLACK}",
            budget.max_bytes
        ));
    }
    Ok(())
}

fn decimal_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// RFC 6901: `~` is written `~0` and `/` is written `~1`.
fn push_key(path: &mut String, key: &str) {
    path.push('/');
    if key.contains(['~', '/']) {
        path.push_str(&key.replace('~', "~0").replace('/', "~1"));
    } else {
        path.push_str(key);
    }
}

fn flatten(value: &Value, path: &mut String, out: &mut Vec<Field>) {
    let scalar = match value {
        Value::Object(map) => {
            for (key, child) in map {
                let len = path.len();
                push_key(path, key);
                flatten(child, path, out);
                path.truncate(len);
            }
            return;
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                let len = path.len();
                push_key(path, &index.to_string());
                flatten(child, path, out);
                path.truncate(len);
            }
            return;
        }
        Value::Null => Scalar::Null,
        Value::Bool(b) => Scalar::Boolean(*b),
        Value::Number(n) => Scalar::Number(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => Scalar::Text(s.clone()),
    };
    out.push(Field {
        path: path.clone(),
        value: scalar,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn envelope(overrides: Value) -> Vec<u8> {
        let mut event = json!({"id":"e1","source":"reviews","type":"review.created","user_id":"u1",
            "authorized":true,"content_id":"r1","status":"active","occurred_at":"2026-12-01T10:00:00Z",
            "payload":{"object_id":"firm-17"}});
        for (key, value) in overrides.as_object().unwrap() {
            event[key] = value.clone();
        }
        serde_json::to_vec(&event).unwrap()
    }

    fn refusal(overrides: Value) -> String {
        Envelope::parse(&envelope(overrides))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn payload_is_flattened_to_json_pointers() {
        let envelope = Envelope::parse(
            br#"{"id":"e1","source":"reviews","type":"review.created","user_id":"u1","authorized":true,
                 "content_id":"r1","status":"active","occurred_at":"2026-12-01T10:00:00Z",
                 "payload":{"object_id":"firm-17","a/b":{"c~d":[1,true,null]}}}"#,
        )
        .unwrap();
        let event = envelope.to_function_event();
        let fields: Vec<(String, Scalar)> = event
            .payload
            .into_iter()
            .map(|f| (f.path, f.value))
            .collect();
        assert_eq!(
            fields,
            vec![
                ("/a~1b/c~0d/0".to_string(), Scalar::Number(1.0)),
                ("/a~1b/c~0d/1".to_string(), Scalar::Boolean(true)),
                ("/a~1b/c~0d/2".to_string(), Scalar::Null),
                ("/object_id".to_string(), Scalar::Text("firm-17".into())),
            ]
        );
        assert_eq!(event.occurred_at_ms, 1_796_119_200_000);
    }

    #[test]
    fn unknown_fields_are_ignored_known_ones_are_typed() {
        let mut bytes = envelope(json!({"trace_id": "abc", "extra": {"deep": [1, 2]}}));
        assert_eq!(Envelope::parse(&bytes).unwrap().id, "e1");
        bytes = envelope(json!({"authorized": "yes"}));
        let error = Envelope::parse(&bytes).unwrap_err().to_string();
        assert!(
            error.starts_with("malformed event: invalid type: string \"yes\", expected a boolean"),
            "{error}"
        );
    }

    #[test]
    fn ids_with_nul_or_over_the_limit_are_refused() {
        assert_eq!(
            refusal(json!({"user_id": "u\u{0}1"})),
            "malformed event: `user_id` contains a NUL character (\\u0000)"
        );
        assert_eq!(
            refusal(json!({"content_id": "x".repeat(3000)})),
            "malformed event: `content_id` is 3000 bytes, over the limit of 512"
        );
        assert_eq!(
            refusal(json!({"id": ""})),
            "malformed event: `id` must not be empty"
        );
        assert_eq!(
            refusal(json!({"status": "a".repeat(300)})),
            "malformed event: `status` is 300 bytes, over the limit of 256"
        );
        assert!(Envelope::parse(&envelope(json!({"user_id": "é".repeat(256)}))).is_ok());
    }

    #[test]
    fn unsafe_numbers_are_refused() {
        assert_eq!(
            refusal(json!({"payload": {"distance_m": 1e300}})),
            "payload: the number 1e+300 is outside the safe range (magnitude at most 2^53)"
        );
        assert!(refusal(json!({"payload": {"n": [u64::MAX]}})).contains("outside the safe range"));
        assert!(refusal(json!({"payload": {"n": i64::MIN}})).contains("outside the safe range"));
        assert!(Envelope::parse(&envelope(json!({"payload": {"n": 8.9e15, "m": -3}}))).is_ok());
        // Beyond f64 altogether: the parser refuses it.
        let bytes = String::from_utf8(envelope(json!({})))
            .unwrap()
            .replace("\"object_id\":\"firm-17\"", "\"object_id\":1e400");
        assert!(
            Envelope::parse(bytes.as_bytes())
                .unwrap_err()
                .to_string()
                .starts_with("malformed event: number out of range"),
        );
    }

    #[test]
    fn flattened_size_is_bounded_by_the_message() {
        // One long key over a long array: each element repeats the key.
        let key = "k".repeat(100_000);
        let bytes = envelope(json!({"payload": {key: vec![0; 5_000]}}));
        let error = Envelope::parse(&bytes).unwrap_err().to_string();
        assert!(
            error.starts_with(
                "payload: its flattened form (JSON pointer and text of every field) is over"
            ),
            "{error}"
        );
        let error = refusal(json!({"payload": {"many": vec![1; 10_000]}}));
        assert_eq!(
            error,
            "payload: more than 4096 fields (scalars, counted through arrays and objects)"
        );
        assert_eq!(
            refusal(json!({"payload": {"t": "a\u{0}b"}})),
            "payload: a text contains a NUL character (\\u0000)"
        );
        assert_eq!(
            refusal(json!({"payload": {"o": {"a\u{0}": 1}}})),
            "payload: a key contains a NUL character (\\u0000)"
        );
    }

    #[test]
    fn occurred_at_is_kept_to_the_microsecond() {
        let bytes = envelope(json!({"occurred_at": "2026-12-01T10:00:00.123456789Z"}));
        assert_eq!(
            Envelope::parse(&bytes).unwrap().occurred_at.to_rfc3339(),
            "2026-12-01T10:00:00.123456+00:00"
        );
    }

    #[test]
    fn deep_nesting_is_a_parse_error() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let bytes = String::from_utf8(envelope(json!({})))
            .unwrap()
            .replace("\"firm-17\"", &deep);
        assert!(
            Envelope::parse(bytes.as_bytes())
                .unwrap_err()
                .to_string()
                .starts_with("malformed event: recursion limit exceeded"),
        );
    }
}
