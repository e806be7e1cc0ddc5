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

fn range(bytes: &mut Vec<u8>, data: &[u8]) -> Option<[u32; 2]> {
    let offset = u32::try_from(bytes.len()).ok()?;
    let len = u32::try_from(data.len()).ok()?;
    bytes.extend_from_slice(data);
    // An offset must stay below ABSENT.
    (offset.checked_add(len)? < ABSENT).then_some([offset, len])
}

/// The batch of `records` read from `topic`; `None` when its bytes would
/// be over 4 GiB.
pub(super) fn pack(topic: &str, records: &[RawRecord<'_>]) -> Option<wit::RecordBatch> {
    let size: usize = records
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
    let mut batch = wit::RecordBatch {
        topic: topic.to_string(),
        bytes: Vec::with_capacity(size),
        records: Vec::with_capacity(records.len() * RECORD_WORDS),
        headers: Vec::new(),
    };
    for record in records {
        let first_header = u32::try_from(batch.headers.len() / 4).ok()?;
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
            u32::try_from(record.headers.len()).ok()?,
        ]);
    }
    Some(batch)
}
