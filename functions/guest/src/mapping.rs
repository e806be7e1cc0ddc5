//! Mapping a record's fields onto an event: the `fields` config the
//! built-in transforms share. Each field of the event comes from a place in
//! the record (a JSON pointer, a key or a column, by transform) or is a
//! constant:
//!
//! ```json
//! {"user_id": "/user/id", "type": "/event", "authorized": {"const": true},
//!  "occurred_at": "/ts", "occurred_at_unit": "ms",
//!  "payload": {"distance_m": "/trip/distance"}}
//! ```
//!
//! - `id` (optional): where the record's own event id is; without it, the
//!   record's position (`topic/partition/offset`), so a record read twice
//!   makes the same event.
//! - `user_id`, `type`, `authorized`: required.
//! - `occurred_at` (optional): RFC 3339 text, or a number of
//!   `occurred_at_unit` (`ms`, the default, or `s`) since the Unix epoch;
//!   without it, the record's timestamp.
//! - `content_id`, `status` (optional): absent or null leaves them out.
//! - `payload`: payload field name -> place; a place the record does not
//!   have is left out. Text found in a key=value line or a CSV column
//!   becomes a number when it is a JSON number, `true`/`false` when it is
//!   one, text otherwise.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value as Json};

use crate::pointer::JsonPointer;
use crate::time::rfc3339_from_millis;
use crate::{Envelope, Record};

/// Where one field of the event comes from.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Place {
    /// A place in the record: a JSON pointer (`/user/id`), a key or a
    /// column name, by transform.
    At(String),
    /// The same value for every event: `{"const": true}`.
    Const {
        /// The value.
        #[serde(rename = "const")]
        value: Json,
    },
}

/// How numeric times count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum TimeUnit {
    /// `"ms"`: milliseconds (the default).
    #[default]
    #[serde(rename = "ms")]
    Milliseconds,
    /// `"s"`: seconds.
    #[serde(rename = "s")]
    Seconds,
}

/// The `fields` of a transform's config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fields {
    /// Where the record's own event id is (default: its position).
    #[serde(default)]
    pub id: Option<Place>,
    /// Where the user id is.
    pub user_id: Place,
    /// Where the event type is.
    #[serde(rename = "type")]
    pub event_type: Place,
    /// Where `authorized` is (often a constant).
    pub authorized: Place,
    /// Where the time is (default: the record's timestamp).
    #[serde(default)]
    pub occurred_at: Option<Place>,
    /// What a numeric `occurred_at` counts.
    #[serde(default)]
    pub occurred_at_unit: TimeUnit,
    /// Where the content item's id is, if events are about items.
    #[serde(default)]
    pub content_id: Option<Place>,
    /// Where the item's status is.
    #[serde(default)]
    pub status: Option<Place>,
    /// Payload field name -> where its value is.
    #[serde(default)]
    pub payload: BTreeMap<String, Place>,
}

/// A value found at a place in a record.
#[derive(Debug, Clone, Copy)]
pub enum Found<'a> {
    /// From a JSON document.
    Json(&'a Json),
    /// Text (a key=value line, a CSV column).
    Text(&'a str),
}

impl Fields {
    /// Every place the fields name, with the field it is for (to check
    /// them against what the transform can read).
    pub fn places(&self) -> Vec<(String, &str)> {
        let named = [
            ("id", self.id.as_ref()),
            ("user_id", Some(&self.user_id)),
            ("type", Some(&self.event_type)),
            ("authorized", Some(&self.authorized)),
            ("occurred_at", self.occurred_at.as_ref()),
            ("content_id", self.content_id.as_ref()),
            ("status", self.status.as_ref()),
        ];
        let payload = self
            .payload
            .iter()
            .map(|(name, place)| (format!("payload.{name}"), Some(place)));
        named
            .into_iter()
            .map(|(field, place)| (field.to_string(), place))
            .chain(payload)
            .filter_map(|(field, place)| match place {
                Some(Place::At(at)) => Some((field, at.as_str())),
                _ => None,
            })
            .collect()
    }

    /// Whether the event these fields make of an item is of a type
    /// `wanted` accepts, found as [`Fields::envelope`] finds it; true when
    /// the type is not text (`envelope` says what is wrong with it).
    pub fn is_wanted<'a>(
        &'a self,
        find: impl Fn(&str) -> Option<Found<'a>>,
        wanted: &dyn Fn(&str) -> bool,
    ) -> bool {
        let found = match &self.event_type {
            Place::At(at) => find(at),
            Place::Const { value } => Some(Found::Json(value)),
        };
        match found {
            Some(Found::Text(text)) => wanted(text),
            Some(Found::Json(Json::String(text))) => wanted(text),
            _ => true,
        }
    }

    /// The event made of the `n`-th item of `record` (from 0), each field
    /// looked up by `find` (`None`: the record has nothing there).
    pub fn envelope<'a>(
        &'a self,
        record: &Record<'_>,
        n: usize,
        find: impl Fn(&str) -> Option<Found<'a>>,
    ) -> Result<Envelope, String> {
        let get = |place: &'a Place| -> Option<Found<'a>> {
            match place {
                Place::At(at) => find(at).filter(|found| !is_null(found)),
                Place::Const { value } => Some(Found::Json(value)),
            }
        };
        let required = |field: &str, place: &'a Place| -> Result<String, String> {
            let found = get(place).ok_or_else(|| missing(field, place))?;
            text(field, found)
        };
        let optional = |field: &str, place: &'a Option<Place>| -> Result<Option<String>, String> {
            place
                .as_ref()
                .and_then(&get)
                .map(|found| text(field, found))
                .transpose()
        };
        let id = match &self.id {
            Some(place) => required("id", place)?,
            None => record.event_id(n),
        };
        let authorized = get(&self.authorized)
            .ok_or_else(|| missing("authorized", &self.authorized))
            .and_then(|found| boolean("authorized", found))?;
        let occurred_at = match &self.occurred_at {
            Some(place) => {
                let found = get(place).ok_or_else(|| missing("occurred_at", place))?;
                time(found, self.occurred_at_unit)?
            }
            None => rfc3339_from_millis(
                record
                    .timestamp_ms
                    .ok_or("the record has no timestamp and the config names no `occurred_at`")?,
            ),
        };
        let mut payload = Map::new();
        for (name, place) in &self.payload {
            if let Some(found) = get(place) {
                payload.insert(name.clone(), value(found));
            }
        }
        Ok(Envelope {
            id,
            event_type: required("type", &self.event_type)?,
            user_id: required("user_id", &self.user_id)?,
            authorized,
            content_id: optional("content_id", &self.content_id)?,
            status: optional("status", &self.status)?,
            occurred_at,
            payload: Json::Object(payload).to_string(),
        })
    }
}

fn is_null(found: &Found<'_>) -> bool {
    matches!(found, Found::Json(Json::Null))
}

fn missing(field: &str, place: &Place) -> String {
    match place {
        Place::At(at) => format!("`{field}`: the record has nothing at {at:?}"),
        Place::Const { .. } => format!("`{field}`: its constant is null"),
    }
}

fn text(field: &str, found: Found<'_>) -> Result<String, String> {
    match found {
        Found::Text(text) => Ok(text.to_string()),
        Found::Json(Json::String(text)) => Ok(text.clone()),
        Found::Json(Json::Number(n)) => Ok(n.to_string()),
        Found::Json(other) => Err(format!("`{field}` must be text or a number, not {other}")),
    }
}

fn boolean(field: &str, found: Found<'_>) -> Result<bool, String> {
    truthy(found).ok_or_else(|| format!("`{field}` must be true or false, not {}", shown(found)))
}

/// `true`/`false` (and `1`/`0`) as text.
fn truthy(found: Found<'_>) -> Option<bool> {
    let text = match found {
        Found::Text(text) => text,
        Found::Json(Json::String(text)) => text.as_str(),
        Found::Json(Json::Bool(b)) => return Some(*b),
        Found::Json(_) => return None,
    };
    match text {
        "true" | "1" => Some(true),
        "false" | "0" => Some(false),
        _ => None,
    }
}

fn shown(found: Found<'_>) -> String {
    match found {
        Found::Text(text) => format!("{text:?}"),
        Found::Json(json) => json.to_string(),
    }
}

/// RFC 3339 text passes (the host checks it); a number counts `unit`s
/// since the Unix epoch.
fn time(found: Found<'_>, unit: TimeUnit) -> Result<String, String> {
    let number = match found {
        Found::Json(Json::Number(n)) => n.as_f64(),
        Found::Json(Json::String(text)) if is_number(text) => text.parse().ok(),
        Found::Text(text) if is_number(text) => text.parse().ok(),
        Found::Json(Json::String(text)) => return Ok(text.clone()),
        Found::Text(text) => return Ok(text.to_string()),
        Found::Json(other) => {
            return Err(format!(
                "`occurred_at` must be RFC 3339 text or a number, not {other}"
            ));
        }
    };
    let number = number
        .filter(|n| n.is_finite())
        .ok_or_else(|| format!("`occurred_at` {} is not a time", shown(found)))?;
    let ms = match unit {
        TimeUnit::Milliseconds => number,
        TimeUnit::Seconds => number * 1000.0,
    };
    // Years 0 to 9999: what RFC 3339 can write.
    if !(-62_167_219_200_000.0..=253_402_300_799_999.0).contains(&ms) {
        return Err(format!(
            "`occurred_at` {} is outside the years 0 to 9999",
            shown(found)
        ));
    }
    Ok(rfc3339_from_millis(ms.round() as i64))
}

/// Text that is a JSON number (not `NaN`, `inf` or `1_000`).
fn is_number(text: &str) -> bool {
    !text.is_empty() && serde_json::from_str::<serde_json::Number>(text).is_ok()
}

/// A payload value: JSON as it is; text as a number or a boolean when it
/// is one.
fn value(found: Found<'_>) -> Json {
    match found {
        Found::Json(json) => json.clone(),
        Found::Text(text) if is_number(text) => serde_json::from_str(text).unwrap_or(Json::Null),
        Found::Text("true") => Json::Bool(true),
        Found::Text("false") => Json::Bool(false),
        Found::Text(text) => Json::String(text.to_string()),
    }
}

/// The value at a JSON pointer (RFC 6901, as [`serde_json::Value::pointer`]
/// reads it) in the text of a JSON object, found by a
/// [`JsonPointer`] scan that builds nothing but that value. A transform
/// that reads a place many times reads the pointer once
/// ([`JsonPointer::parse`]) and scans with it.
///
/// Fails as a full parse does: `the record is not JSON: ..` (the whole text
/// is checked) or `the record is JSON but not an object`.
pub fn json_at(document: &[u8], pointer: &str) -> Result<Option<Json>, String> {
    let Some(pointer) = JsonPointer::parse(pointer) else {
        return Ok(None);
    };
    pointer.json_in(document)
}

#[cfg(test)]
mod tests {
    use super::json_at;
    use serde_json::Value;

    /// `json_at` finds what a full parse and `Value::pointer` find.
    #[test]
    fn json_at_agrees_with_a_full_parse() {
        let documents = [
            r#"{"user":"u-1","event":"navi.trip_finished","ts":1,"distance":5}"#,
            r#"{"a":{"b":[10,{"c":"deep"},null]},"a~b":1,"a/b":2,"":3,"e\u0076ent":"escaped"}"#,
            r#"{"event":"first","event":"last"}"#,
            r#"{"list":[[1,2],[3,[4,5]]],"n":null,"t":true,"f":1.5e3}"#,
            r#" { "spaced" : { "x" : [ ] } } "#,
        ];
        let pointers = [
            "",
            "/user",
            "/event",
            "/ts",
            "/missing",
            "/a",
            "/a/b",
            "/a/b/0",
            "/a/b/1/c",
            "/a/b/2",
            "/a/b/3",
            "/a/b/01",
            "/a/b/+1",
            "/a/b/-",
            "/a~0b",
            "/a~1b",
            "/",
            "/list/1/1/0",
            "/list/0/5",
            "/n",
            "/t",
            "/f",
            "/t/x",
            "/spaced/x",
            "/spaced/x/0",
            "no-slash",
        ];
        for document in documents {
            let full: Value = serde_json::from_str(document).unwrap();
            for pointer in pointers {
                assert_eq!(
                    json_at(document.as_bytes(), pointer).unwrap().as_ref(),
                    full.pointer(pointer),
                    "{pointer} in {document}"
                );
            }
        }
    }

    /// A record that is not JSON, or not an object, fails as a full parse
    /// does, whatever the pointer.
    #[test]
    fn json_at_refuses_what_a_full_parse_refuses() {
        for (document, error) in [
            (r#"{"event":"x""#, "the record is not JSON: EOF"),
            (
                r#"{"event":"x"} trailing"#,
                "the record is not JSON: trailing characters",
            ),
            (
                r#"{"event":"x","other":[1,}"#,
                "the record is not JSON: expected value",
            ),
            (
                r#"{"event":"x","other":"\u0000 ok", "bad": tru}"#,
                "the record is not JSON: expected ident",
            ),
            ("[1,2]", "the record is JSON but not an object"),
            (r#""text""#, "the record is JSON but not an object"),
            ("42", "the record is JSON but not an object"),
            ("", "the record is not JSON: EOF"),
        ] {
            let found = json_at(document.as_bytes(), "/event").unwrap_err();
            assert!(found.starts_with(error), "{document}: {found}");
        }
    }
}
