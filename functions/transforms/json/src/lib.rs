//! `JsonTransform {"fields": {..}}`: each record is one JSON object; the
//! event's fields are found by JSON pointer (RFC 6901, e.g. `/user/id`),
//! as [`laurel_guest::mapping`] describes.

use laurel_guest::mapping::{Fields, Found, Place};
use laurel_guest::pointer::JsonPointer;
use laurel_guest::{Envelope, Record, Transform, parse_config};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    fields: Fields,
}

pub struct JsonTransform {
    fields: Fields,
    /// Where the type is, read once: most records are scanned for it only.
    event_type: Option<JsonPointer>,
}

impl Transform for JsonTransform {
    fn from_config(config: &str) -> Result<Self, String> {
        let Config { fields } = parse_config(config)?;
        for (field, at) in fields.places() {
            if !at.starts_with('/') {
                return Err(format!(
                    "`{field}`: {at:?} is not a JSON pointer (one starts with /, e.g. \"/user/id\")"
                ));
            }
        }
        let event_type = match &fields.event_type {
            Place::At(at) => JsonPointer::parse(at),
            Place::Const { .. } => None,
        };
        Ok(JsonTransform { fields, event_type })
    }

    fn transform(&self, record: &Record<'_>) -> Result<Vec<Envelope>, String> {
        self.made(record, &|_| true)
    }

    fn transform_wanted(
        &self,
        record: &Record<'_>,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Envelope>, String> {
        // Most records are of types no award needs: their type is read in
        // a scan that builds nothing, and only the others are parsed (as
        // are those the scan cannot vouch for, which a parse then judges).
        if let Some(pointer) = &self.event_type
            && let Ok(Some(event_type)) = pointer.text_in(record.value)
            && !wanted(&event_type)
        {
            return Ok(Vec::new());
        }
        self.made(record, wanted)
    }
}

impl JsonTransform {
    /// The record's event, parsed whole, if `wanted` accepts its type.
    fn made(
        &self,
        record: &Record<'_>,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Envelope>, String> {
        let value: Value = serde_json::from_slice(record.value)
            .map_err(|e| format!("the record is not JSON: {e}"))?;
        if !value.is_object() {
            return Err("the record is JSON but not an object".into());
        }
        let find = |at: &str| value.pointer(at).map(Found::Json);
        if !self.fields.is_wanted(find, wanted) {
            return Ok(Vec::new());
        }
        let event = self.fields.envelope(record, 0, find)?;
        Ok(vec![event])
    }
}

laurel_guest::export_transform!(JsonTransform);
