//! Events as the host hands them to functions, and their packing into the
//! WIT `event-batch` (one shared text buffer, spans into it): a batch
//! crosses into a component in a few copies instead of one per string.

use super::bindings::types as wit;

/// A user action, with its payload flattened to JSON-pointer leaves.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: String,
    pub source: String,
    pub type_: String,
    pub user_id: String,
    pub content_id: Option<String>,
    pub status: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub occurred_at_ms: i64,
    pub payload: Vec<Field>,
}

/// One scalar leaf of a payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// JSON pointer (RFC 6901), e.g. `/object_id`.
    pub path: String,
    pub value: Scalar,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Null,
    Boolean(bool),
    Number(f64),
    Text(String),
}

/// Words per event and per field, and the offset of an absent string: the
/// layout of `event-batch` in `wit/award.wit`.
const EVENT_WORDS: usize = 16;
const FIELD_WORDS: usize = 5;
const ABSENT: u32 = u32::MAX;

/// Packs events into one batch; `None` if its text would pass 4 GiB (the
/// offsets are 32-bit), which the caller reports as a batch too large.
pub(super) fn pack<'a>(
    events: impl IntoIterator<Item = &'a Event>,
) -> Option<(wit::EventBatch, usize)> {
    let events = events.into_iter();
    let mut batch = wit::EventBatch {
        text: String::new(),
        events: Vec::with_capacity(events.size_hint().0 * EVENT_WORDS),
        fields: Vec::new(),
    };
    let mut count = 0;
    for event in events {
        count += 1;
        let first_field = u32::try_from(batch.fields.len() / FIELD_WORDS).ok()?;
        for field in &event.payload {
            let [offset, len] = string(&mut batch.text, &field.path)?;
            let (kind, a, b) = match &field.value {
                Scalar::Null => (0, 0, 0),
                Scalar::Boolean(false) => (1, 0, 0),
                Scalar::Boolean(true) => (2, 0, 0),
                Scalar::Number(n) => (3, n.to_bits() as u32, (n.to_bits() >> 32) as u32),
                Scalar::Text(text) => {
                    let [offset, len] = string(&mut batch.text, text)?;
                    (4, offset, len)
                }
            };
            batch.fields.extend([offset, len, kind, a, b]);
        }
        let field_count = u32::try_from(event.payload.len()).ok()?;
        for text in [&event.id, &event.source, &event.type_, &event.user_id] {
            batch.events.extend(string(&mut batch.text, text)?);
        }
        for text in [&event.content_id, &event.status] {
            match text {
                Some(text) => batch.events.extend(string(&mut batch.text, text)?),
                None => batch.events.extend([ABSENT, 0]),
            }
        }
        let at = event.occurred_at_ms as u64;
        batch
            .events
            .extend([at as u32, (at >> 32) as u32, first_field, field_count]);
    }
    Some((batch, count))
}

fn string(text: &mut String, value: &str) -> Option<[u32; 2]> {
    let offset = u32::try_from(text.len()).ok()?;
    let len = u32::try_from(value.len()).ok()?;
    // The end must fit too, and ABSENT is never a real offset.
    offset.checked_add(len).filter(|end| *end < ABSENT)?;
    text.push_str(value);
    Some([offset, len])
}
