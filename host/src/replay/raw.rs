//! Replaying a pipeline's dead letters once its transform (or the data) is
//! fixed: each record `<input_topic>.dead` holds for the pipeline goes back
//! to the input topic with its key, value and own headers.
//!
//! Marks are issued, never found. When the pre-filter dead-letters a
//! record it signs (pipeline, first position, key, value) with Laurel's
//! replay key (HMAC-SHA256, kept in PostgreSQL) in `laurel-dead-signature`.
//! A replay puts such a record back marked
//!
//! - `laurel-origin: PARTITION/OFFSET`, its first position: the pre-filter
//!   reads the record as if it were there, so its events get the ids they
//!   would have had (a record replayed twice counts once);
//! - `laurel-replay-for: PIPELINE`: other pipelines of the same input topic
//!   pass over it;
//! - `laurel-replay-signature`: the mark and the record's key and value,
//!   signed again. The pre-filter honours a mark only with its signature,
//!   so a mark copied onto other content, or made up, is ignored.
//!
//! A record on the dead-letter topic that Laurel did not sign (any
//! producer that may write the topic can put one there) is put back as
//! itself: its `laurel-` headers dropped, read at its new position by every
//! pipeline of the topic, with no id of another record.
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
/// The signature of a replayed record's mark (its pipeline, origin, key
/// and value).
pub const SIGNATURE_HEADER: &str = "laurel-replay-signature";
/// The signature Laurel gives a record it dead-letters (its pipeline,
/// first position, key and value).
pub const DEAD_SIGNATURE_HEADER: &str = "laurel-dead-signature";

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

    /// The signature of a record's mark: `pipeline`, `origin` (its first
    /// position, `PARTITION/OFFSET`), its key and value; in hex.
    pub fn sign(&self, mark: Mark<'_>) -> String {
        hex::encode(ring::hmac::sign(&self.0, &mark.bytes()))
    }

    /// Whether `signature` (hex) signs `mark`.
    pub fn verifies(&self, mark: Mark<'_>, signature: &[u8]) -> bool {
        hex::decode(signature)
            .is_ok_and(|tag| ring::hmac::verify(&self.0, &mark.bytes(), &tag).is_ok())
    }
}

/// What a signature covers: the pipeline a record is for, where it first
/// was, and its content, so that a signature holds for that one record.
#[derive(Clone, Copy)]
pub struct Mark<'a> {
    pub pipeline: &'a [u8],
    pub origin: &'a [u8],
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
}

impl Mark<'_> {
    /// Each part with its length before it (a key's absence told from an
    /// empty key), so no two marks give the same bytes.
    fn bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(64 + self.value.len());
        let mut part = |part: Option<&[u8]>| match part {
            None => bytes.extend_from_slice(&u64::MAX.to_be_bytes()),
            Some(part) => {
                bytes.extend_from_slice(&(part.len() as u64).to_be_bytes());
                bytes.extend_from_slice(part);
            }
        };
        part(Some(self.pipeline));
        part(Some(self.origin));
        part(self.key);
        part(Some(self.value));
        bytes
    }
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
    /// Records Laurel did not dead-letter (no valid `laurel-dead-signature`),
    /// put back as themselves: read at their new position by every
    /// pipeline of the input topic.
    pub unsigned: u64,
}

/// Puts the pipeline's dead letters that no earlier replay took back on its
/// input topic, up to the end of the dead-letter topic as it is now.
pub async fn replay(
    brokers: &str,
    group_prefix: &str,
    pipeline: &PipelineRow,
    key: &ReplayKey,
) -> anyhow::Result<RawReplay> {
    let unwatched = &crate::watch::unwatched;
    replay_watched(brokers, group_prefix, pipeline, key, unwatched).await
}

/// [`replay`], telling `watch` how many of the dead topic's records it has
/// read of those there were when it started.
pub async fn replay_watched(
    brokers: &str,
    group_prefix: &str,
    pipeline: &PipelineRow,
    key: &ReplayKey,
    watch: crate::watch::Watch<'_>,
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
    let total = span.total();
    let mut read = 0;
    loop {
        watch(crate::watch::Step {
            done: read.min(total),
            total,
            note: "",
        });
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
        read += 1;
        let header = |name: &str| message.header(name).unwrap_or_default();
        let origin = [header("laurel-partition"), b"/", header("laurel-offset")].concat();
        // The record's own headers, without any mark (a name that is not
        // UTF-8 goes on with U+FFFD in place of what is not).
        let own = message
            .headers()
            .map(|(name, value)| (name, value.unwrap_or_default()))
            .filter(|(name, _)| !name.starts_with("laurel-"));
        let value = message.payload();
        let issued = value.is_some_and(|value| {
            let mark = Mark {
                pipeline: header("laurel-pipeline"),
                origin: &origin,
                key: message.key(),
                value,
            };
            key.verifies(mark, header(DEAD_SIGNATURE_HEADER))
        });
        match value {
            _ if header("laurel-pipeline") != pipeline.name.as_bytes() => {
                report.other_pipelines += 1;
            }
            None => report
                .without_value
                .push(String::from_utf8_lossy(&origin).into_owned()),
            Some(value) => {
                let signature = issued.then(|| {
                    key.sign(Mark {
                        pipeline: pipeline.name.as_bytes(),
                        origin: &origin,
                        key: message.key(),
                        value,
                    })
                });
                // A record Laurel dead-lettered goes back at its first
                // position; any other as itself.
                let mut headers: Vec<(&str, &[u8])> = match &signature {
                    Some(signature) => vec![
                        (ORIGIN_HEADER, origin.as_slice()),
                        (REPLAY_FOR_HEADER, pipeline.name.as_bytes()),
                        (SIGNATURE_HEADER, signature.as_bytes()),
                    ],
                    None => Vec::new(),
                };
                headers.extend(own);
                kafka::publish_bytes(
                    &producer,
                    &pipeline.input_topic,
                    message.key(),
                    value,
                    &headers,
                )
                .await?;
                report.replayed += 1;
                if !issued {
                    report.unsigned += 1;
                }
            }
        }
    }
    // Everything put back was acknowledged (each publish waits for it).
    span.commit()?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signature holds for its one record: any other pipeline, position,
    /// key or value, a missing key for an empty one, or parts shifted
    /// between neighbours, and it does not.
    #[test]
    fn a_signature_covers_the_pipeline_position_key_and_value() {
        let key = ReplayKey::new(b"a key of the test's own");
        let mark = |pipeline: &'static str,
                    origin: &'static str,
                    key: Option<&'static [u8]>,
                    value: &'static str| Mark {
            pipeline: pipeline.as_bytes(),
            origin: origin.as_bytes(),
            key,
            value: value.as_bytes(),
        };
        let signed = mark("navi", "0/7", Some(b"u-1"), "dist=7");
        let signature = key.sign(signed);
        assert!(key.verifies(signed, signature.as_bytes()));
        for other in [
            mark("navi2", "0/7", Some(b"u-1"), "dist=7"),
            mark("navi", "0/8", Some(b"u-1"), "dist=7"),
            mark("navi", "0/7", Some(b"u-2"), "dist=7"),
            mark("navi", "0/7", Some(b"u-1"), "dist=9"),
            mark("navi", "0/7", None, "dist=7"),
            mark("nav", "i0/7", Some(b"u-1"), "dist=7"),
        ] {
            assert!(!key.verifies(other, signature.as_bytes()));
        }
        let empty = key.sign(mark("navi", "0/7", Some(b""), ""));
        assert_ne!(empty, key.sign(mark("navi", "0/7", None, "")));
        assert!(!key.verifies(signed, b"not hex"));
    }
}
