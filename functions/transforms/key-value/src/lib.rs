//! `KeyValueTransform {"fields": {..}}`: each line of a record is one
//! event written as `key=value` pairs separated by spaces (a value with
//! spaces is quoted: `msg="trip done"`, `\"` and `\\` inside quotes). The
//! event's fields are found by key, as [`laurel_guest::mapping`] describes.
//! Blank lines are skipped; a line that is not pairs makes the record
//! malformed.

use std::borrow::Cow;

use laurel_guest::mapping::{Fields, Found};
use laurel_guest::{Envelope, Record, Transform, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    fields: Fields,
}

pub struct KeyValueTransform {
    fields: Fields,
}

impl Transform for KeyValueTransform {
    fn from_config(config: &str) -> Result<Self, String> {
        let Config { fields } = parse_config(config)?;
        for (field, key) in fields.places() {
            if key.is_empty() || key.contains(['=', ' ', '"']) {
                return Err(format!(
                    "`{field}`: {key:?} is not a key (no spaces, `=` or quotes)"
                ));
            }
        }
        Ok(KeyValueTransform { fields })
    }

    fn transform(&self, record: &Record<'_>) -> Result<Vec<Envelope>, String> {
        self.transform_wanted(record, &|_| true)
    }

    fn transform_wanted(
        &self,
        record: &Record<'_>,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Envelope>, String> {
        let text = record.text()?;
        let mut events = Vec::new();
        // Each line's event keeps its number (and so its id) whichever
        // others are left out.
        let mut n = 0;
        for (number, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let pairs = pairs(line).map_err(|e| format!("line {}: {e}", number + 1))?;
            let find = |key: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| Found::Text(v.as_ref()))
            };
            if self.fields.is_wanted(find, wanted) {
                let event = self
                    .fields
                    .envelope(record, n, find)
                    .map_err(|e| format!("line {}: {e}", number + 1))?;
                events.push(event);
            }
            n += 1;
        }
        Ok(events)
    }
}

/// The `key=value` pairs of a line, in order.
pub fn pairs(line: &str) -> Result<Vec<(&str, Cow<'_, str>)>, String> {
    let mut pairs = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        let end = rest.find(['=', ' ', '\t']).unwrap_or(rest.len());
        let key = &rest[..end];
        if key.is_empty() || !rest[end..].starts_with('=') {
            let token = rest.split([' ', '\t']).next().unwrap_or(rest);
            return Err(format!("{token:?} is not key=value"));
        }
        rest = &rest[end + 1..];
        let value = if let Some(quoted) = rest.strip_prefix('"') {
            let (value, after) = unquote(quoted)
                .ok_or_else(|| format!("the value of {key} has no closing quote"))?;
            if !(after.is_empty() || after.starts_with([' ', '\t'])) {
                return Err(format!(
                    "the value of {key} goes on after its closing quote"
                ));
            }
            rest = after;
            value
        } else {
            let end = rest.find([' ', '\t']).unwrap_or(rest.len());
            let value = &rest[..end];
            rest = &rest[end..];
            Cow::Borrowed(value)
        };
        pairs.push((key, value));
        rest = rest.trim_start();
    }
    Ok(pairs)
}

/// A quoted value (after its opening quote) and what follows its closing
/// quote; `None` without one.
fn unquote(text: &str) -> Option<(Cow<'_, str>, &str)> {
    let mut owned: Option<String> = None;
    let mut chars = text.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => {
                let value = owned.map_or(Cow::Borrowed(&text[..at]), Cow::Owned);
                return Some((value, &text[at + 1..]));
            }
            '\\' => {
                let so_far = owned.get_or_insert_with(|| text[..at].to_string());
                let (_, escaped) = chars.next()?;
                so_far.push(escaped);
            }
            c => {
                if let Some(so_far) = owned.as_mut() {
                    so_far.push(c);
                }
            }
        }
    }
    None
}

laurel_guest::export_transform!(KeyValueTransform);

#[cfg(test)]
mod tests {
    use super::pairs;

    #[test]
    fn pairs_are_read_with_quotes_and_escapes() {
        let line = r#"ts=1764583200 uid=u-7 msg="trip \"done\" ok" km=5.5"#;
        let read: Vec<(&str, String)> = pairs(line)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k, v.into_owned()))
            .collect();
        assert_eq!(
            read,
            [
                ("ts", "1764583200".to_string()),
                ("uid", "u-7".to_string()),
                ("msg", "trip \"done\" ok".to_string()),
                ("km", "5.5".to_string()),
            ]
        );
        assert_eq!(pairs("a=1 junk").unwrap_err(), "\"junk\" is not key=value");
        assert_eq!(pairs("=1").unwrap_err(), "\"=1\" is not key=value");
        assert!(pairs("a=\"open").unwrap_err().contains("no closing quote"));
        assert_eq!(pairs("a= b=2").unwrap()[0].1, "");
    }

    #[test]
    fn events_left_out_by_type_keep_the_others_ids() {
        use laurel_guest::{RecordBatchBuilder, Transform, records};
        let transform = super::KeyValueTransform::from_config(
            r#"{"fields": {"user_id": "uid", "type": "event", "authorized": {"const": true},
                "occurred_at": "ts", "occurred_at_unit": "s"}}"#,
        )
        .unwrap();
        let lines = "ts=1 uid=u event=a\nts=2 uid=u event=b\n\nts=3 uid=u event=a\n";
        let mut batch = RecordBatchBuilder::new("raw");
        batch.push(0, 5, lines.as_bytes(), None, None, &[]);
        let batch = batch.finish();
        let record = records(&batch).next().unwrap();
        let ids = |events: Vec<laurel_guest::Envelope>| -> Vec<(String, String)> {
            events.into_iter().map(|e| (e.id, e.event_type)).collect()
        };
        let all = ids(transform.transform(&record).unwrap());
        assert_eq!(
            all,
            [
                ("raw/0/5".to_string(), "a".to_string()),
                ("raw/0/5/1".to_string(), "b".to_string()),
                ("raw/0/5/2".to_string(), "a".to_string()),
            ]
        );
        let only_a = ids(transform.transform_wanted(&record, &|t| t == "a").unwrap());
        assert_eq!(only_a, [all[0].clone(), all[2].clone()]);
    }
}
