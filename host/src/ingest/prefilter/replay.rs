//! Replaying a pipeline's dead letters once its transform (or the data) is
//! fixed: each record `<input_topic>.dead` holds for the pipeline goes back
//! to the input topic with its key, value and own headers, marked
//!
//! - `laurel-origin: PARTITION/OFFSET`, its first position: the pre-filter
//!   reads the record as if it were there, so its events get the ids they
//!   would have had (a record replayed twice counts once);
//! - `laurel-replay-for: PIPELINE`: other pipelines of the same input topic
//!   pass over it;
//! - `laurel-replay-signature`: the mark signed with Laurel's replay key
//!   (HMAC-SHA256, kept in PostgreSQL). A mark without a valid signature is
//!   ignored, so a raw producer cannot give its records another record's
//!   position, and so its events' ids, or hide them from a pipeline.
//!
//! A replay reads the dead-letter topic up to its end when it starts, as
//! the consumer group `<prefix>.prefilter-replay.<pipeline>`, and commits
//! after the broker acknowledged every record it put back: the next replay
//! starts where this one ended. A record whose value was too large to keep
//! in the dead letter cannot be replayed; it is counted and named.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::{dead_topic, header};
use crate::ingest::{Record, kafka};
use crate::store::PipelineRow;

/// The first position of a replayed record: `PARTITION/OFFSET`.
pub const ORIGIN_HEADER: &str = "laurel-origin";
/// The pipeline a replayed record is for.
pub const REPLAY_FOR_HEADER: &str = "laurel-replay-for";
/// The signature of a replayed record's mark (its origin and pipeline).
pub const SIGNATURE_HEADER: &str = "laurel-replay-signature";

/// The key replay marks are signed with (`signing_keys` in PostgreSQL).
#[derive(Clone)]
pub struct ReplayKey(ring::hmac::Key);

impl ReplayKey {
    pub fn new(key: &[u8]) -> ReplayKey {
        ReplayKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key))
    }

    /// The key the migrations made.
    pub async fn load(store: &crate::store::Store) -> anyhow::Result<ReplayKey> {
        Ok(ReplayKey::new(&store.signing_key("replay").await?))
    }

    /// The signature of the mark (`pipeline`, `origin`), in hex.
    fn sign(&self, pipeline: &[u8], origin: &[u8]) -> String {
        hex::encode(ring::hmac::sign(&self.0, &mark(pipeline, origin)))
    }

    /// Whether `signature` (hex) signs the mark (`pipeline`, `origin`).
    pub fn verifies(&self, pipeline: &[u8], origin: &[u8], signature: &[u8]) -> bool {
        hex::decode(signature)
            .is_ok_and(|tag| ring::hmac::verify(&self.0, &mark(pipeline, origin), &tag).is_ok())
    }
}

/// What a mark's signature covers: the pipeline, a newline (no pipeline
/// name holds one), the origin.
fn mark(pipeline: &[u8], origin: &[u8]) -> Vec<u8> {
    [pipeline, b"\n", origin].concat()
}

/// How long a replay waits for the next dead letter it knows is there.
const PATIENCE: Duration = Duration::from_secs(30);

/// A replay's consumer group: `<prefix>.prefilter-replay.<pipeline>`.
pub fn replay_group(prefix: &str, pipeline: &str) -> String {
    format!("{prefix}.prefilter-replay.{pipeline}")
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RawReplay {
    pub pipeline: String,
    pub dead_topic: String,
    /// Put back on the input topic.
    pub replayed: u64,
    /// Dead letters of other pipelines of the same input topic, left alone.
    pub other_pipelines: u64,
    /// Dead letters without their value (it was over the size limit), by
    /// their first position: they stay on the input topic, not replayable.
    pub without_value: Vec<String>,
}

/// Puts the pipeline's dead letters that no earlier replay took back on its
/// input topic, up to the end of the dead-letter topic as it is now.
pub async fn replay(
    brokers: &str,
    group_prefix: &str,
    pipeline: &PipelineRow,
    key: &ReplayKey,
) -> anyhow::Result<RawReplay> {
    let dead = dead_topic(&pipeline.input_topic);
    let group = replay_group(group_prefix, &pipeline.name);
    let mut report = RawReplay {
        pipeline: pipeline.name.clone(),
        dead_topic: dead.clone(),
        ..RawReplay::default()
    };
    let ranges = {
        let (brokers, group, dead) = (brokers.to_string(), group.clone(), dead.clone());
        tokio::task::spawn_blocking(move || ranges(&brokers, &group, &dead)).await??
    };
    let mut ends: HashMap<i32, i64> = ranges
        .iter()
        .filter(|(_, start, end)| start < end)
        .map(|(partition, _, end)| (*partition, *end))
        .collect();
    if ends.is_empty() {
        return Ok(report);
    }
    let consumer: StreamConsumer = kafka::client_config(brokers)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .map_err(|e| anyhow::anyhow!("failed to create a consumer of {dead}: {e}"))?;
    let mut assignment = TopicPartitionList::new();
    for (partition, start, end) in &ranges {
        if start < end {
            assignment.add_partition_offset(&dead, *partition, Offset::Offset(*start))?;
        }
    }
    consumer.assign(&assignment)?;
    let producer = kafka::producer(brokers)?;
    let mut done = TopicPartitionList::new();
    while !ends.is_empty() {
        let message = tokio::time::timeout(PATIENCE, consumer.recv())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "{dead} sent nothing for {} s before its end; {} records were replayed and are committed only when a replay finishes: run it again",
                    PATIENCE.as_secs(),
                    report.replayed
                )
            })??;
        let partition = message.partition();
        let Some(&end) = ends.get(&partition) else {
            continue;
        };
        if message.offset() >= end {
            continue;
        }
        let header =
            |name: &str| String::from_utf8_lossy(header(&message, name).unwrap_or_default());
        if header("laurel-pipeline") == pipeline.name.as_str() {
            let origin = format!("{}/{}", header("laurel-partition"), header("laurel-offset"));
            match message.payload() {
                None => report.without_value.push(origin),
                Some(value) => {
                    let signature = key.sign(pipeline.name.as_bytes(), origin.as_bytes());
                    let mut headers: Vec<(&str, &[u8])> = vec![
                        (ORIGIN_HEADER, origin.as_bytes()),
                        (REPLAY_FOR_HEADER, pipeline.name.as_bytes()),
                        (SIGNATURE_HEADER, signature.as_bytes()),
                    ];
                    // A name that is not UTF-8 (any producer can write
                    // here) goes on with U+FFFD in place of what is not.
                    let own: Vec<(Cow<'_, str>, &[u8])> = Record::borrowed(&message)
                        .headers()
                        .map(|(name, value)| {
                            (String::from_utf8_lossy(name), value.unwrap_or_default())
                        })
                        .filter(|(name, _)| !name.starts_with("laurel-"))
                        .collect();
                    headers.extend(own.iter().map(|(name, value)| (name.as_ref(), *value)));
                    kafka::publish_bytes(
                        &producer,
                        &pipeline.input_topic,
                        message.key(),
                        value,
                        &headers,
                    )
                    .await?;
                    report.replayed += 1;
                }
            }
        } else {
            report.other_pipelines += 1;
        }
        if message.offset() + 1 >= end {
            ends.remove(&partition);
            done.add_partition_offset(&dead, partition, Offset::Offset(end))?;
        }
    }
    // Everything put back was acknowledged (each publish waits for it).
    consumer.commit(&done, CommitMode::Sync)?;
    Ok(report)
}

/// Per partition of `topic`: where the group's replay starts (its
/// committed offset, or the oldest kept) and the end now.
fn ranges(brokers: &str, group: &str, topic: &str) -> anyhow::Result<Vec<(i32, i64, i64)>> {
    let timeout = Duration::from_secs(10);
    let consumer: BaseConsumer = kafka::client_config(brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .map_err(|e| anyhow::anyhow!("failed to create a consumer of {topic}: {e}"))?;
    let partitions = kafka::partitions(&consumer, topic, timeout)?;
    let mut asked = TopicPartitionList::new();
    for partition in &partitions {
        asked.add_partition(topic, *partition);
    }
    let committed = consumer.committed_offsets(asked, timeout)?;
    let mut ranges = Vec::new();
    for partition in partitions {
        let (low, high) = consumer.fetch_watermarks(topic, partition, timeout)?;
        let start = match committed
            .find_partition(topic, partition)
            .map(|e| e.offset())
        {
            Some(Offset::Offset(offset)) => offset.max(low),
            _ => low,
        };
        ranges.push((partition, start, high));
    }
    Ok(ranges)
}
