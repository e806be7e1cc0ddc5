//! JSON written as text and sent as `jsonb` without a `serde_json::Value`
//! in between. Ingest writes a few JSON documents per event (an item's
//! shares, counters, a log row's deltas and function versions); building,
//! serialising and dropping a `Value` tree for each was a fifth of its
//! CPU (perf, `cargo bench --bench ingest`).

use std::error::Error;
use std::fmt::Write as _;

use bytes::{BufMut, BytesMut};
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::counters::Counters;

/// Finished JSON text, bound as a `json` or `jsonb` parameter.
#[derive(Debug)]
pub(super) struct JsonText<'a>(pub &'a str);

impl ToSql for JsonText<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        if *ty == Type::JSONB {
            // The jsonb binary format: a version byte, then the text.
            out.put_u8(1);
        }
        out.put_slice(self.0.as_bytes());
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB || *ty == Type::JSON
    }

    to_sql_checked!();
}

/// Appends `value` as a JSON string.
pub(super) fn push_str(out: &mut String, value: &str) {
    // Ids and counter names rarely need escaping: copy those as they are.
    if value
        .bytes()
        .all(|b| b >= 0x20 && b != b'"' && b != b'\\' && b < 0x7f)
    {
        out.push('"');
        out.push_str(value);
        out.push('"');
    } else {
        out.push_str(&serde_json::Value::from(value).to_string());
    }
}

/// Appends counters as a JSON object: `{"approved":1}`.
pub(super) fn push_counters(out: &mut String, counters: &Counters) {
    out.push('{');
    for (i, (name, value)) in counters.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_str(out, name);
        let _ = write!(out, ":{value}");
    }
    out.push('}');
}

/// The text of counters as a JSON object.
pub(super) fn counters_text(counters: &Counters) -> String {
    let mut out = String::with_capacity(16 + 16 * counters.len());
    push_counters(&mut out, counters);
    out
}

/// Writes a JSON object member by member.
pub(super) struct ObjectWriter {
    text: String,
    members: usize,
}

impl ObjectWriter {
    pub(super) fn new() -> ObjectWriter {
        ObjectWriter {
            text: String::from("{"),
            members: 0,
        }
    }

    /// Starts a member: appends the key; the caller appends the value.
    pub(super) fn key(&mut self, key: &str) -> &mut String {
        if self.members > 0 {
            self.text.push(',');
        }
        self.members += 1;
        push_str(&mut self.text, key);
        self.text.push(':');
        &mut self.text
    }

    pub(super) fn finish(mut self) -> String {
        self.text.push('}');
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_strings_are_valid_json() {
        let counters: Counters = [("approved".to_string(), 3), ("a \"b\"\n".to_string(), -1)]
            .into_iter()
            .collect();
        let text = counters_text(&counters);
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed, serde_json::json!({"approved": 3, "a \"b\"\n": -1}));
        let mut object = ObjectWriter::new();
        push_str(object.key("award-0"), "ünïcode\u{1}");
        object.key("n").push_str("{}");
        let parsed: serde_json::Value = serde_json::from_str(&object.finish()).unwrap();
        assert_eq!(
            parsed,
            serde_json::json!({"award-0": "ünïcode\u{1}", "n": {}})
        );
        assert_eq!(counters_text(&Counters::new()), "{}");
    }
}
