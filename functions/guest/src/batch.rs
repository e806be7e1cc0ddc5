//! Event batches: how events cross into a component (see `event-batch` in
//! `wit/award.wit`: one text buffer, and words that point into it) and how
//! a function reads them (borrowed views).

use serde_json::Value as Json;

use crate::wit::EventBatch;

/// Words per event and per payload field in a batch.
pub const EVENT_WORDS: usize = 16;
pub const FIELD_WORDS: usize = 5;
/// The offset of an absent optional string.
pub const ABSENT: u32 = u32::MAX;

const NULL: u32 = 0;
const FALSE: u32 = 1;
const TRUE: u32 = 2;
const NUMBER: u32 = 3;
const TEXT: u32 = 4;

/// A payload scalar, borrowed from its batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    /// JSON `null`.
    Null,
    /// JSON `true` or `false`.
    Boolean(bool),
    /// A JSON number (the host admits none beyond 2^53 in size).
    Number(f64),
    /// A JSON string.
    Text(&'a str),
}

/// One event of a batch, borrowed from it.
#[derive(Clone, Copy, Debug)]
pub struct Event<'a> {
    /// The event's id (unique per event).
    pub id: &'a str,
    /// The source it came from (`events.<source>`).
    pub source: &'a str,
    /// Its type, e.g. `photo.created`.
    pub type_: &'a str,
    /// The user it is about.
    pub user_id: &'a str,
    /// The content item it is about, if any (a photo, a review).
    pub content_id: Option<&'a str>,
    /// The item's status now (`active`, `blocked`, ...), if it has one.
    pub status: Option<&'a str>,
    /// Milliseconds since the Unix epoch.
    pub occurred_at_ms: i64,
    text: &'a str,
    fields: &'a [u32],
}

fn string(text: &str, offset: u32, len: u32) -> &str {
    let start = offset as usize;
    text.get(start..start.saturating_add(len as usize))
        .unwrap_or("")
}

fn optional(text: &str, offset: u32, len: u32) -> Option<&str> {
    (offset != ABSENT).then(|| string(text, offset, len))
}

impl<'a> Event<'a> {
    fn leaf(&self, words: &[u32]) -> (&'a str, Value<'a>) {
        let path = string(self.text, words[0], words[1]);
        let value = match words[2] {
            FALSE => Value::Boolean(false),
            TRUE => Value::Boolean(true),
            NUMBER => Value::Number(f64::from_bits(
                u64::from(words[3]) | (u64::from(words[4]) << 32),
            )),
            TEXT => Value::Text(string(self.text, words[3], words[4])),
            _ => Value::Null,
        };
        (path, value)
    }

    /// Every payload leaf: (JSON pointer, value).
    pub fn fields(&self) -> impl Iterator<Item = (&'a str, Value<'a>)> + '_ {
        self.fields
            .chunks_exact(FIELD_WORDS)
            .map(|words| self.leaf(words))
    }

    /// The payload scalar at a JSON pointer (`/object_id`), if present.
    pub fn field(&self, pointer: &str) -> Option<Value<'a>> {
        self.fields
            .chunks_exact(FIELD_WORDS)
            .find(|words| string(self.text, words[0], words[1]) == pointer)
            .map(|words| self.leaf(words).1)
    }

    /// The payload text at a JSON pointer, if present and a string.
    pub fn text(&self, pointer: &str) -> Option<&'a str> {
        match self.field(pointer)? {
            Value::Text(text) => Some(text),
            _ => None,
        }
    }
}

/// The events of a batch, in order.
pub fn events(batch: &EventBatch) -> impl Iterator<Item = Event<'_>> {
    let text = batch.text.as_str();
    let fields = batch.fields.as_slice();
    batch.events.chunks_exact(EVENT_WORDS).map(move |w| {
        let first = (w[14] as usize)
            .saturating_mul(FIELD_WORDS)
            .min(fields.len());
        let end = first
            .saturating_add((w[15] as usize).saturating_mul(FIELD_WORDS))
            .min(fields.len());
        Event {
            id: string(text, w[0], w[1]),
            source: string(text, w[2], w[3]),
            type_: string(text, w[4], w[5]),
            user_id: string(text, w[6], w[7]),
            content_id: optional(text, w[8], w[9]),
            status: optional(text, w[10], w[11]),
            occurred_at_ms: (u64::from(w[12]) | (u64::from(w[13]) << 32)) as i64,
            text,
            fields: &fields[first..end],
        }
    })
}

/// Builds a batch outside a component (tests, benchmarks, native use), the
/// way the host does.
pub struct BatchBuilder {
    batch: EventBatch,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        BatchBuilder {
            batch: EventBatch {
                text: String::new(),
                events: Vec::new(),
                fields: Vec::new(),
            },
        }
    }
}

impl BatchBuilder {
    /// An empty batch.
    pub fn new() -> BatchBuilder {
        BatchBuilder::default()
    }

    fn string(&mut self, text: &str) -> [u32; 2] {
        let offset = self.batch.text.len() as u32;
        self.batch.text.push_str(text);
        [offset, text.len() as u32]
    }

    fn optional(&mut self, text: Option<&str>) -> [u32; 2] {
        text.map_or([ABSENT, 0], |t| self.string(t))
    }

    /// Adds an event; `payload` is its JSON payload object.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        id: &str,
        source: &str,
        event_type: &str,
        user_id: &str,
        content_id: Option<&str>,
        status: Option<&str>,
        occurred_at_ms: i64,
        payload: &Json,
    ) -> &mut Self {
        let first_field = (self.batch.fields.len() / FIELD_WORDS) as u32;
        let mut path = String::new();
        self.flatten(payload, &mut path);
        let field_count = (self.batch.fields.len() / FIELD_WORDS) as u32 - first_field;
        let mut words = Vec::with_capacity(EVENT_WORDS);
        for pair in [
            self.string(id),
            self.string(source),
            self.string(event_type),
            self.string(user_id),
        ] {
            words.extend(pair);
        }
        words.extend(self.optional(content_id));
        words.extend(self.optional(status));
        let at = occurred_at_ms as u64;
        words.extend([at as u32, (at >> 32) as u32, first_field, field_count]);
        self.batch.events.extend(words);
        self
    }

    fn flatten(&mut self, value: &Json, path: &mut String) {
        let (kind, a, b) = match value {
            Json::Object(map) => {
                for (key, child) in map {
                    let len = path.len();
                    path.push('/');
                    // RFC 6901 escaping: `~` -> `~0`, `/` -> `~1`.
                    path.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    self.flatten(child, path);
                    path.truncate(len);
                }
                return;
            }
            Json::Array(items) => {
                for (index, child) in items.iter().enumerate() {
                    let len = path.len();
                    path.push('/');
                    path.push_str(&index.to_string());
                    self.flatten(child, path);
                    path.truncate(len);
                }
                return;
            }
            Json::Null => (NULL, 0, 0),
            Json::Bool(false) => (FALSE, 0, 0),
            Json::Bool(true) => (TRUE, 0, 0),
            Json::Number(n) => {
                let bits = n.as_f64().unwrap_or(f64::NAN).to_bits();
                (NUMBER, bits as u32, (bits >> 32) as u32)
            }
            Json::String(s) => {
                let [offset, len] = self.string(s);
                (TEXT, offset, len)
            }
        };
        let [offset, len] = self.string(path);
        self.batch.fields.extend([offset, len, kind, a, b]);
    }

    /// The batch, as the host hands it to a function.
    pub fn finish(self) -> EventBatch {
        self.batch
    }
}
