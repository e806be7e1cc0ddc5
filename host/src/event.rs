//! The event envelope of the contract, and its form for functions.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::runtime::{Event, Field, Scalar};

/// One user action, as it arrives on `events.<source>`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
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

impl Envelope {
    pub fn parse(bytes: &[u8]) -> Result<Envelope, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The event as functions receive it: the payload flattened once into
    /// its scalar leaves, addressed by JSON pointer.
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
}
