//! Raw record batches: how the pre-filter's records cross into a transform
//! (see `record-batch` in `wit/award.wit`: one byte buffer, and words that
//! point into it) and how a transform reads them (borrowed views).

use crate::transform::exports::laurel::award::transforms::RecordBatch;

/// Words per record and per header in a batch.
pub const RECORD_WORDS: usize = 11;
pub const HEADER_WORDS: usize = 4;
/// The offset of an absent key.
pub const ABSENT: u32 = u32::MAX;
/// The timestamp of a record that has none.
const NO_TIMESTAMP: i64 = i64::MIN;

/// One raw record of a batch, borrowed from it.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// The topic it was read from.
    pub topic: &'a str,
    /// Its partition (of the record's first position, for a replayed
    /// dead letter).
    pub partition: i32,
    /// Its offset (likewise): with the topic and partition, what makes its
    /// events' ids stable ([`Record::event_id`]).
    pub offset: i64,
    /// The record's value.
    pub value: &'a [u8],
    /// The record's Kafka key, if it has one.
    pub key: Option<&'a [u8]>,
    /// Milliseconds since the Unix epoch, when the record has a timestamp.
    pub timestamp_ms: Option<i64>,
    bytes: &'a [u8],
    headers: &'a [u32],
}

fn range(bytes: &[u8], offset: u32, len: u32) -> &[u8] {
    let start = offset as usize;
    bytes
        .get(start..start.saturating_add(len as usize))
        .unwrap_or_default()
}

impl<'a> Record<'a> {
    /// The record's headers: (name, value), in order.
    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + '_ {
        self.headers.chunks_exact(HEADER_WORDS).map(|w| {
            let name = std::str::from_utf8(range(self.bytes, w[0], w[1])).unwrap_or_default();
            (name, range(self.bytes, w[2], w[3]))
        })
    }

    /// The value of the first header called `name`.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers()
            .find(|(header, _)| *header == name)
            .map(|(_, value)| value)
    }

    /// The value as UTF-8 text, or why it is not.
    pub fn text(&self) -> Result<&'a str, String> {
        std::str::from_utf8(self.value).map_err(|e| format!("the record is not UTF-8 text: {e}"))
    }

    /// A stable id for the `n`-th event made from this record (from 0):
    /// `topic/partition/offset`, then `topic/partition/offset/n`. A record
    /// read again (after a restart) gives its events the same ids, so
    /// ingest counts each once.
    pub fn event_id(&self, n: usize) -> String {
        if n == 0 {
            format!("{}/{}/{}", self.topic, self.partition, self.offset)
        } else {
            format!("{}/{}/{}/{n}", self.topic, self.partition, self.offset)
        }
    }
}

fn word_pair(low: u32, high: u32) -> i64 {
    (u64::from(low) | (u64::from(high) << 32)) as i64
}

/// The records of a batch, in order.
pub fn records(batch: &RecordBatch) -> impl Iterator<Item = Record<'_>> {
    let topic = batch.topic.as_str();
    let bytes = batch.bytes.as_slice();
    let headers = batch.headers.as_slice();
    batch.records.chunks_exact(RECORD_WORDS).map(move |w| {
        let first = (w[9] as usize)
            .saturating_mul(HEADER_WORDS)
            .min(headers.len());
        let end = first
            .saturating_add((w[10] as usize).saturating_mul(HEADER_WORDS))
            .min(headers.len());
        let timestamp = word_pair(w[7], w[8]);
        Record {
            topic,
            partition: w[4] as i32,
            offset: word_pair(w[5], w[6]),
            value: range(bytes, w[0], w[1]),
            key: (w[2] != ABSENT).then(|| range(bytes, w[2], w[3])),
            timestamp_ms: (timestamp != NO_TIMESTAMP).then_some(timestamp),
            bytes,
            headers: &headers[first..end],
        }
    })
}

/// Builds a record batch outside a component (tests, benchmarks, native
/// use), the way the host does.
pub struct RecordBatchBuilder {
    batch: RecordBatch,
}

impl RecordBatchBuilder {
    /// An empty batch of records read from `topic`.
    pub fn new(topic: &str) -> RecordBatchBuilder {
        RecordBatchBuilder {
            batch: RecordBatch {
                topic: topic.to_string(),
                bytes: Vec::new(),
                records: Vec::new(),
                headers: Vec::new(),
            },
        }
    }

    fn range(&mut self, bytes: &[u8]) -> [u32; 2] {
        let offset = self.batch.bytes.len() as u32;
        self.batch.bytes.extend_from_slice(bytes);
        [offset, bytes.len() as u32]
    }

    /// Adds a record.
    pub fn push(
        &mut self,
        partition: i32,
        offset: i64,
        value: &[u8],
        key: Option<&[u8]>,
        timestamp_ms: Option<i64>,
        headers: &[(&str, &[u8])],
    ) -> &mut Self {
        let first_header = (self.batch.headers.len() / HEADER_WORDS) as u32;
        for (name, value) in headers {
            let name = self.range(name.as_bytes());
            let value = self.range(value);
            self.batch.headers.extend(name.into_iter().chain(value));
        }
        let value = self.range(value);
        let key = key.map_or([ABSENT, 0], |k| self.range(k));
        let offset = offset as u64;
        let at = timestamp_ms.unwrap_or(NO_TIMESTAMP) as u64;
        self.batch.records.extend(value);
        self.batch.records.extend(key);
        self.batch.records.extend([
            partition as u32,
            offset as u32,
            (offset >> 32) as u32,
            at as u32,
            (at >> 32) as u32,
            first_header,
            headers.len() as u32,
        ]);
        self
    }

    /// The batch, as the host hands it to a transform.
    pub fn finish(self) -> RecordBatch {
        self.batch
    }
}
