//! A pipeline's batch as it is read: the records its transform reads are
//! packed as they arrive, each copied once into the buffer that crosses
//! into the transform; the few it does not read (no value, too large,
//! another pipeline's replayed dead letter) are kept whole with what
//! becomes of them.

use super::origin_in;
use crate::kafka::{OwnedRecord, ReadBatch, Record};
use crate::replay::raw::{Mark, ORIGIN_HEADER, REPLAY_FOR_HEADER, ReplayKey, SIGNATURE_HEADER};
use crate::runtime::{PackedRecords, RawRecord};

/// What became of a message the transform does not read.
pub(super) enum Settled {
    /// Another pipeline's replayed dead letter: nothing to do here.
    NotOurs,
    /// Dead-lettered, with why.
    Dead(String),
}

pub(super) struct RawBatch {
    pipeline: String,
    key: ReplayKey,
    max_bytes: usize,
    /// Messages with a replay mark whose signature did not hold.
    unsigned: usize,
    /// Where each message was read (partition, offset), in order.
    positions: Vec<(i32, i64)>,
    /// What the transform reads.
    packed: PackedRecords,
    /// The place in the batch of each packed record (ascending).
    packed_places: Vec<usize>,
    /// The messages kept whole (by ascending place).
    whole: Vec<Whole>,
}

/// A message the transform does not read.
struct Whole {
    message: OwnedRecord,
    /// What became of it.
    settled: Settled,
    /// Where it first was.
    origin: (i32, i64),
    /// Its place in the batch.
    place: usize,
}

/// A raw record as its dead letter carries it.
pub(super) struct Letter<'a> {
    pub key: Option<&'a [u8]>,
    /// None when it had none, or was too large to carry.
    pub value: Option<&'a [u8]>,
    pub headers: Vec<(&'a str, &'a [u8])>,
    /// Where it first was (a replayed dead letter's origin).
    pub origin: (i32, i64),
    /// Where it was read.
    pub at: (i32, i64),
}

impl RawBatch {
    /// An empty batch of `pipeline`'s `topic`; values over `max_bytes` are
    /// dead-lettered, not transformed.
    /// A replayed dead letter's mark is honoured when `key` signed it.
    pub(super) fn new(pipeline: &str, topic: &str, max_bytes: usize, key: ReplayKey) -> RawBatch {
        RawBatch {
            pipeline: pipeline.to_string(),
            key,
            max_bytes,
            unsigned: 0,
            positions: Vec::new(),
            packed: PackedRecords::new(topic),
            packed_places: Vec::new(),
            whole: Vec::new(),
        }
    }

    /// What the transform reads, in order.
    pub(super) fn packed(&self) -> &PackedRecords {
        &self.packed
    }

    /// Every message's position (partition, offset), in order.
    pub(super) fn positions(&self) -> &[(i32, i64)] {
        &self.positions
    }

    /// How many messages carried a replay mark whose signature did not
    /// hold (read at their own position, by every pipeline).
    pub(super) fn unsigned(&self) -> usize {
        self.unsigned
    }

    /// The place in the batch of the `n`-th record the transform reads.
    pub(super) fn place_of_packed(&self, n: usize) -> usize {
        self.packed_places[n]
    }

    /// The messages the transform does not read, by their place in the
    /// batch, with what became of each.
    pub(super) fn settled(&self) -> impl Iterator<Item = (usize, &Settled)> {
        self.whole.iter().map(|whole| (whole.place, &whole.settled))
    }

    /// Message `index` as its dead letter carries it.
    /// Where message `index` first was (a replayed dead letter's origin).
    pub(super) fn origin(&self, index: usize) -> (i32, i64) {
        match self.packed_places.binary_search(&index) {
            Ok(n) => {
                let record = self.packed.get(n);
                (record.partition, record.offset)
            }
            Err(_) => {
                let n = self
                    .whole
                    .binary_search_by_key(&index, |whole| whole.place)
                    .expect("every message is packed or kept whole");
                self.whole[n].origin
            }
        }
    }

    pub(super) fn letter(&self, index: usize) -> Letter<'_> {
        let at = self.positions[index];
        // Each message is either packed or kept whole.
        match self.packed_places.binary_search(&index) {
            Ok(n) => {
                let record = self.packed.get(n);
                Letter {
                    key: record.key,
                    value: Some(record.value),
                    headers: record.headers,
                    origin: (record.partition, record.offset),
                    at,
                }
            }
            Err(_) => {
                let n = self
                    .whole
                    .binary_search_by_key(&index, |whole| whole.place)
                    .expect("every message is packed or kept whole");
                let message = &self.whole[n].message;
                Letter {
                    key: message.key(),
                    value: message.payload().filter(|v| v.len() <= self.max_bytes),
                    headers: message
                        .headers()
                        .map(|(name, value)| (name, value.unwrap_or_default()))
                        .collect(),
                    origin: self.whole[n].origin,
                    at,
                }
            }
        }
    }

    fn keep_whole(&mut self, record: Record<'_>, settled: Settled, origin: (i32, i64)) {
        self.whole.push(Whole {
            message: record.detach(),
            settled,
            origin,
            place: self.positions.len() - 1,
        });
    }
}

impl ReadBatch for RawBatch {
    fn take(&mut self, record: Record<'_>) -> usize {
        let at = (record.partition(), record.offset());
        self.positions.push(at);
        // Read once: for a record without headers librdkafka builds and
        // frees a parse buffer each time they are asked for (it caches only
        // headers it found). A producer can send any bytes as a name.
        let mut headers: Vec<(&str, &[u8])> = Vec::new();
        for (index, (name, value)) in record.headers().enumerate() {
            match std::str::from_utf8(name) {
                Ok(name) => headers.push((name, value.unwrap_or_default())),
                Err(_) => {
                    let reason = format!("header {index}'s name is not UTF-8");
                    self.keep_whole(record, Settled::Dead(reason), at);
                    return record.size();
                }
            }
        }
        let header = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        // A replayed dead letter's mark (its pipeline, its first position),
        // if it is signed; one that is not is ignored.
        let mark = match (
            header(REPLAY_FOR_HEADER),
            header(ORIGIN_HEADER),
            header(SIGNATURE_HEADER),
        ) {
            (None, None, None) => None,
            (Some(pipeline), Some(origin), Some(signature))
                if record.payload().is_some_and(|value| {
                    let mark = Mark {
                        pipeline,
                        origin,
                        key: record.key(),
                        value,
                    };
                    self.key.verifies(mark, signature)
                }) =>
            {
                Some((pipeline, origin))
            }
            _ => {
                self.unsigned += 1;
                None
            }
        };
        // As the transform sees it: a replayed dead letter at its first
        // position, so its events get the ids they would have had.
        let origin = mark
            .and_then(|(_, origin)| origin_in(Some(origin)))
            .unwrap_or(at);
        if mark.is_some_and(|(pipeline, _)| pipeline != self.pipeline.as_bytes()) {
            self.keep_whole(record, Settled::NotOurs, origin);
            return record.size();
        }
        match record.payload() {
            None => self.keep_whole(
                record,
                Settled::Dead("empty message: no value".into()),
                origin,
            ),
            Some(value) if value.len() > self.max_bytes => {
                let reason = format!(
                    "record of {} bytes is over the limit of {} bytes",
                    value.len(),
                    self.max_bytes
                );
                self.keep_whole(record, Settled::Dead(reason), origin);
            }
            Some(value) => {
                let (partition, offset) = origin;
                let raw = RawRecord {
                    partition,
                    offset,
                    value,
                    key: record.key(),
                    timestamp_ms: record.timestamp_ms(),
                    headers,
                };
                if self.packed.push(&raw) {
                    self.packed_places.push(self.positions.len() - 1);
                } else {
                    let reason =
                        "the pre-filter's batch passed 4 GiB: lower LAUREL_BATCH_MAX_BYTES";
                    self.keep_whole(record, Settled::Dead(reason.into()), origin);
                }
            }
        }
        record.size()
    }

    fn count(&self) -> usize {
        self.positions.len()
    }

    fn clear(&mut self) {
        self.unsigned = 0;
        self.positions.clear();
        self.packed.clear();
        self.packed_places.clear();
        self.whole.clear();
    }
}
