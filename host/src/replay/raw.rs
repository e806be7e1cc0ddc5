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

use std::time::Duration;

use serde::Serialize;

use crate::kafka::{self, Span, dead_topic};
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
    let Some(mut span) = Span::open(brokers, &group, &dead).await? else {
        return Ok(report);
    };
    let producer = kafka::producer(brokers)?;
    loop {
        let message = tokio::time::timeout(PATIENCE, span.next())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "{dead} sent nothing for {} s before its end; {} records were replayed and are committed only when a replay finishes: run it again",
                    PATIENCE.as_secs(),
                    report.replayed
                )
            })??;
        let Some(message) = message else {
            break;
        };
        let header = |name: &str| String::from_utf8_lossy(message.header(name).unwrap_or_default());
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
                    headers.extend(
                        message
                            .headers()
                            .map(|(name, value)| (name, value.unwrap_or_default()))
                            .filter(|(name, _)| !name.starts_with("laurel-")),
                    );
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
    }
    // Everything put back was acknowledged (each publish waits for it).
    span.commit()?;
    Ok(report)
}
