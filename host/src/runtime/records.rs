//! Raw records as they cross into a transform: packed into one byte buffer
//! and words that point into it (`record-batch` in `wit/award.wit`; the
//! guest SDK reads them back as borrowed views).

use super::bindings::transform::exports::laurel::award::transforms as wit;

const RECORD_WORDS: usize = 11;
const ABSENT: u32 = u32::MAX;
const NO_TIMESTAMP: i64 = i64::MIN;

/// One record of a raw topic, borrowed from the message it was read as.
#[derive(Debug, Clone, Default)]
pub struct RawRecord<'a> {
    pub partition: i32,
    pub offset: i64,
    pub value: &'a [u8],
    pub key: Option<&'a [u8]>,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: Option<i64>,
    pub headers: Vec<(&'a str, &'a [u8])>,
}

/// Raw records packed as a transform reads them, one at a time as they are
/// read from Kafka: each record's bytes are copied once, into the buffer
/// that crosses into the transform.
#[derive(Debug, Clone)]
pub struct PackedRecords {
    batch: wit::RecordBatch,
}

const HEADER_WORDS: usize = 4;

impl PackedRecords {
    /// No records yet, of `topic`.
    pub fn new(topic: &str) -> PackedRecords {
        PackedRecords {
            batch: wit::RecordBatch {
                topic: topic.to_string(),
                bytes: Vec::new(),
                records: Vec::new(),
                headers: Vec::new(),
            },
        }
    }

    /// Packs `records` read from `topic`; `None` when their bytes would be
    /// over 4 GiB.
    pub fn of(topic: &str, records: &[RawRecord<'_>]) -> Option<PackedRecords> {
        let mut packed = PackedRecords::new(topic);
        let size = records
            .iter()
            .map(|r| {
                r.value.len()
                    + r.key.map_or(0, <[u8]>::len)
                    + r.headers
                        .iter()
                        .map(|(n, v)| n.len() + v.len())
                        .sum::<usize>()
            })
            .sum();
        packed.batch.bytes.reserve(size);
        packed.batch.records.reserve(records.len() * RECORD_WORDS);
        records
            .iter()
            .all(|record| packed.push(record))
            .then_some(packed)
    }

    /// Adds `record`; false, with nothing added, when the bytes would pass
    /// 4 GiB.
    pub fn push(&mut self, record: &RawRecord<'_>) -> bool {
        let (bytes, headers) = (self.batch.bytes.len(), self.batch.headers.len());
        if self.try_push(record).is_none() {
            self.batch.bytes.truncate(bytes);
            self.batch.headers.truncate(headers);
            return false;
        }
        true
    }

    fn try_push(&mut self, record: &RawRecord<'_>) -> Option<()> {
        let batch = &mut self.batch;
        let first_header = u32::try_from(batch.headers.len() / HEADER_WORDS).ok()?;
        for (name, value) in &record.headers {
            let name = range(&mut batch.bytes, name.as_bytes())?;
            let value = range(&mut batch.bytes, value)?;
            batch.headers.extend(name.into_iter().chain(value));
        }
        let value = range(&mut batch.bytes, record.value)?;
        let key = match record.key {
            Some(key) => range(&mut batch.bytes, key)?,
            None => [ABSENT, 0],
        };
        let header_count = u32::try_from(record.headers.len()).ok()?;
        let offset = record.offset as u64;
        let at = record.timestamp_ms.unwrap_or(NO_TIMESTAMP) as u64;
        batch.records.extend(value);
        batch.records.extend(key);
        batch.records.extend([
            record.partition as u32,
            offset as u32,
            (offset >> 32) as u32,
            at as u32,
            (at >> 32) as u32,
            first_header,
            header_count,
        ]);
        Some(())
    }

    /// Empties it, keeping its buffers.
    pub fn clear(&mut self) {
        self.batch.bytes.clear();
        self.batch.records.clear();
        self.batch.headers.clear();
    }

    /// How many records it holds.
    pub fn len(&self) -> usize {
        self.batch.records.len() / RECORD_WORDS
    }

    pub fn is_empty(&self) -> bool {
        self.batch.records.is_empty()
    }

    /// Record `index` as it was pushed.
    pub fn get(&self, index: usize) -> RawRecord<'_> {
        let w = &self.batch.records[index * RECORD_WORDS..(index + 1) * RECORD_WORDS];
        let bytes = &self.batch.bytes;
        let at = |offset: u32, len: u32| &bytes[offset as usize..(offset + len) as usize];
        let pair = |low: u32, high: u32| (u64::from(low) | (u64::from(high) << 32)) as i64;
        let timestamp = pair(w[7], w[8]);
        let first = w[9] as usize * HEADER_WORDS;
        let headers = self.batch.headers[first..first + w[10] as usize * HEADER_WORDS]
            .chunks_exact(HEADER_WORDS)
            .map(|h| {
                // Pushed as text.
                let name = std::str::from_utf8(at(h[0], h[1])).unwrap_or_default();
                (name, at(h[2], h[3]))
            })
            .collect();
        RawRecord {
            partition: w[4] as i32,
            offset: pair(w[5], w[6]),
            value: at(w[0], w[1]),
            key: (w[2] != ABSENT).then(|| at(w[2], w[3])),
            timestamp_ms: (timestamp != NO_TIMESTAMP).then_some(timestamp),
            headers,
        }
    }

    /// Record `index` alone.
    pub fn one(&self, index: usize) -> PackedRecords {
        let mut one = PackedRecords::new(&self.batch.topic);
        one.push(&self.get(index));
        one
    }

    /// The topic its records were read from.
    pub fn topic(&self) -> &str {
        &self.batch.topic
    }

    pub(super) fn batch(&self) -> &wit::RecordBatch {
        &self.batch
    }
}

fn range(bytes: &mut Vec<u8>, data: &[u8]) -> Option<[u32; 2]> {
    let offset = u32::try_from(bytes.len()).ok()?;
    let len = u32::try_from(data.len()).ok()?;
    bytes.extend_from_slice(data);
    // An offset must stay below ABSENT.
    (offset.checked_add(len)? < ABSENT).then_some([offset, len])
}
