//! Group consumers as ingest and the pre-filter read them: a member of
//! `<group>` on one topic that commits only what it is told to, starts from
//! the earliest offset, follows a pause flag, and reads its records in
//! batches bounded by count, bytes and wait (see `fetch`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use rdkafka::consumer::{CommitMode, Consumer, MessageStream};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::BorrowedMessage;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;
use tracing::{info, warn};

use super::fetch::{
    FetchQueue, GroupConsumer, OwnedRecord, PauseContext, Record, TopicWatch, is_missing_topic,
};

/// What a group consumer takes from its process's settings.
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// Most records per batch.
    pub batch_size: usize,
    /// Most bytes (values and keys) per batch.
    pub batch_max_bytes: usize,
    /// Longest wait to fill a batch once its first record arrived.
    pub batch_wait: Duration,
    /// The consumer group session timeout.
    pub session_timeout: Duration,
}

/// What [`GroupReader::next_batch`] found.
pub enum NextBatch {
    /// Messages, bounded by count, bytes and wait.
    Batch,
    /// Nothing within the first wait, or a consumer error waited out:
    /// look at pause and stop again.
    Nothing,
    /// `stop` changed.
    Stop,
}

/// A batch as it is read: each message is copied in once, as it arrives
/// (ingest keeps whole messages; the pre-filter packs records as its
/// transform reads them).
pub trait ReadBatch {
    /// Takes `record` in; the bytes it counts toward the batch's bytes
    /// (its value and key).
    fn take(&mut self, record: Record<'_>) -> usize;
    /// How many messages it holds.
    fn count(&self) -> usize;
    /// Empties it, keeping its buffers for the next batch (fresh memory
    /// for every batch cost page faults: a fifth of the pre-filter's time).
    fn clear(&mut self);
}

impl ReadBatch for Vec<OwnedRecord> {
    fn take(&mut self, record: Record<'_>) -> usize {
        self.push(record.detach());
        record.size()
    }

    fn count(&self) -> usize {
        self.len()
    }

    fn clear(&mut self) {
        Vec::clear(self);
    }
}

/// How long a reader waits for a first message before it says there is
/// nothing (so its owner looks at pause and stop a few times a second).
pub const FIRST_WAIT: Duration = Duration::from_millis(250);

/// Where to commit after a batch: on each partition, the offset after the
/// last one read.
pub struct Offsets(TopicPartitionList);

impl Offsets {
    /// What to commit after reading `positions` (partition, offset) of
    /// `topic`.
    pub fn after(
        topic: &str,
        positions: impl IntoIterator<Item = (i32, i64)>,
    ) -> KafkaResult<Offsets> {
        let mut next: Vec<(i32, i64)> = Vec::new();
        for (partition, offset) in positions {
            match next.iter_mut().rev().find(|(p, _)| *p == partition) {
                Some(at) => at.1 = at.1.max(offset + 1),
                None => next.push((partition, offset + 1)),
            }
        }
        let mut offsets = TopicPartitionList::with_capacity(next.len());
        for (partition, offset) in next {
            offsets.add_partition_offset(topic, partition, Offset::Offset(offset))?;
        }
        Ok(Offsets(offsets))
    }
}

/// A member of a consumer group reading one topic in batches.
pub struct GroupReader {
    consumer: GroupConsumer,
    /// Whether its topic exists.
    watch: Arc<TopicWatch>,
    settings: ConsumerSettings,
    topic: String,
    /// Names it in the log ("source photos", "pipeline raw-clicks").
    what: String,
    paused: Arc<AtomicBool>,
    is_paused: bool,
    /// The last consumer error said, so an error that lasts (a topic not
    /// created yet) is said once.
    last_error: Option<String>,
}

impl GroupReader {
    /// A member of `group` subscribed to `topic`, paused while `paused`.
    pub fn subscribe(
        settings: &ConsumerSettings,
        group: &str,
        topic: &str,
        paused: Arc<AtomicBool>,
        what: impl Into<String>,
    ) -> anyhow::Result<GroupReader> {
        let what = what.into();
        let watch = TopicWatch::new(topic, &what);
        let consumer = group_consumer(settings, group, paused.clone(), watch.clone())
            .map_err(|e| anyhow::anyhow!("failed to create the consumer for {what}: {e}"))?;
        consumer
            .subscribe(&[topic])
            .map_err(|e| anyhow::anyhow!("failed to subscribe to {topic}: {e}"))?;
        Ok(GroupReader {
            consumer,
            watch,
            settings: settings.clone(),
            topic: topic.to_string(),
            what,
            paused,
            is_paused: false,
            last_error: None,
        })
    }

    /// The next batch, into `batch` (emptied first), after following the
    /// pause flag: waits up to `first_wait` for a first message, then takes
    /// what is already fetched and what arrives within the batch wait, up
    /// to the batch's count or bytes.
    pub async fn next_batch<B: ReadBatch>(
        &mut self,
        first_wait: Duration,
        stop: &mut watch::Receiver<bool>,
        batch: &mut B,
    ) -> NextBatch {
        self.follow_pause();
        next_batch(
            &self.consumer,
            &self.settings,
            first_wait,
            stop,
            &mut self.last_error,
            &self.watch,
            batch,
        )
        .await
    }

    /// Seeks back to the first offset of each partition among `positions`
    /// (partition, offset), so an unfinished batch is read again.
    pub fn rewind(&self, positions: impl IntoIterator<Item = (i32, i64)>) {
        for (partition, offset) in first_offsets(positions) {
            if let Err(error) = self.consumer.seek(
                &self.topic,
                partition,
                Offset::Offset(offset),
                Duration::from_secs(5),
            ) {
                warn!(message = "Failed to rewind; the uncommitted batch comes back after a restart.", consumer = %self.what, %error);
            }
        }
    }

    /// Commits `offsets` without waiting for the broker's answer.
    pub fn commit_async(&self, offsets: &Offsets) -> KafkaResult<()> {
        self.consumer.commit(&offsets.0, CommitMode::Async)
    }

    /// Commits `offsets`, waiting for the broker's answer.
    pub fn commit(&self, offsets: &Offsets) -> KafkaResult<()> {
        self.consumer.commit(&offsets.0, CommitMode::Sync)
    }

    /// Pauses or resumes the assignment as the flag says.
    fn follow_pause(&mut self) {
        let want = self.paused.load(Ordering::Acquire);
        if want == self.is_paused {
            return;
        }
        let result = self.consumer.assignment().and_then(|assignment| {
            if want {
                self.consumer.pause(&assignment)
            } else {
                self.consumer.resume(&assignment)
            }
        });
        match result {
            Ok(()) => {
                info!(message = if want { "Paused." } else { "Resumed." }, consumer = %self.what);
                self.is_paused = want;
            }
            Err(error) => {
                warn!(message = "Failed to pause or resume.", consumer = %self.what, %error);
            }
        }
    }
}

/// A batch's offsets per partition, for its span: `p0:100-199 p3:7-7`.
pub fn offset_ranges(positions: impl IntoIterator<Item = (i32, i64)>) -> String {
    let mut ranges: std::collections::BTreeMap<i32, (i64, i64)> = Default::default();
    for (partition, offset) in positions {
        let range = ranges.entry(partition).or_insert((offset, offset));
        range.0 = range.0.min(offset);
        range.1 = range.1.max(offset);
    }
    ranges
        .iter()
        .map(|(p, (first, last))| format!("p{p}:{first}-{last}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first offset read on each partition, from positions (partition,
/// offset) in the order read. Positions come in runs of one partition, so
/// the last run's entry is looked at first.
pub fn first_offsets(positions: impl IntoIterator<Item = (i32, i64)>) -> Vec<(i32, i64)> {
    let mut first: Vec<(i32, i64)> = Vec::new();
    for (partition, offset) in positions {
        match first.iter_mut().rev().find(|(p, _)| *p == partition) {
            Some(at) => at.1 = at.1.min(offset),
            None => first.push((partition, offset)),
        }
    }
    first
}

/// A consumer in `group` that commits only what it is told to, starts
/// from the earliest offset, pauses partitions assigned while `paused`,
/// and reads its records in batches (see `fetch`).
fn group_consumer(
    settings: &ConsumerSettings,
    group: &str,
    paused: Arc<AtomicBool>,
    topic: Arc<TopicWatch>,
) -> KafkaResult<GroupConsumer> {
    let session_ms = settings.session_timeout.as_millis().max(1000);
    let fetched = FetchQueue::new();
    let consumer = super::client_config(&settings.brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("session.timeout.ms", session_ms.to_string())
        .set("heartbeat.interval.ms", (session_ms / 4).to_string())
        .set("allow.auto.create.topics", "true")
        .set("fetch.wait.max.ms", "20")
        // Past queued.min.messages (100,000) fetched and not yet consumed,
        // librdkafka waits this long before fetching again (default 1 s):
        // a consumer faster than 100,000 a second then sat idle for the
        // rest of each second (the pre-filter ran in bursts).
        .set("fetch.queue.backoff.ms", "10")
        // A topic that appears after the consumer starts is seen soon.
        .set("topic.metadata.refresh.interval.ms", "2000")
        .create_with_context(PauseContext::new(paused, fetched.clone(), topic))?;
    Ok(GroupConsumer::new(consumer, fetched))
}

/// The next batch of `consumer` (see [`GroupReader::next_batch`]).
///
/// Records come in reads of a few dozen from the consumer's fetch queue
/// (see `fetch`); its own queue (rebalances, errors, the records of a
/// partition that could not be forwarded) is served at least once a batch.
async fn next_batch<B: ReadBatch>(
    consumer: &GroupConsumer,
    settings: &ConsumerSettings,
    first_wait: Duration,
    stop: &mut watch::Receiver<bool>,
    last_error: &mut Option<String>,
    watch: &TopicWatch,
    batch: &mut B,
) -> NextBatch {
    let what = watch.what.as_str();
    batch.clear();
    let fetched = consumer.fetched();
    // One stream for the whole batch: `recv` makes (and registers) one per
    // message.
    let mut own = consumer.stream();
    let mut bytes = 0;
    let mut failed: Option<KafkaError> = None;
    // The consumer's own queue first: its rebalances and errors are served
    // at least once a batch, even while ours is never empty.
    let first = match own.next().now_or_never() {
        Some(first) => Some(first.expect("kafka streams never end")),
        None => tokio::select! {
            // What is already fetched is taken even when `first_wait` is 0.
            biased;
            first = either(fetched, &mut own) => first,
            _ = stop.changed() => return NextBatch::Stop,
            _ = tokio::time::sleep(first_wait) => return NextBatch::Nothing,
        },
    };
    if let Some(first) = &first {
        take(batch, own_record(first), &mut bytes, &mut failed);
    }
    // Bounded by count and by bytes, whatever the messages' sizes: a read
    // takes no more records than the largest so far fits in the bytes left.
    let deadline = tokio::time::Instant::now() + settings.batch_wait;
    let mut largest = 1;
    while failed.is_none()
        && batch.count() < settings.batch_size
        && bytes < settings.batch_max_bytes
    {
        let room = settings.batch_size - batch.count();
        let fits = ((settings.batch_max_bytes - bytes) / largest).max(1);
        let read = fetched.read(room.min(fits), |record| {
            if let Ok(record) = &record {
                largest = largest.max(record.size());
            }
            take(batch, record, &mut bytes, &mut failed)
        });
        if read > 0 {
            continue;
        }
        // What is already fetched is taken without arming a timer.
        let next = match own.next().now_or_never() {
            Some(next) => next.expect("kafka streams never end"),
            None => match tokio::time::timeout_at(deadline, either(fetched, &mut own)).await {
                Ok(Some(next)) => next,
                Ok(None) => continue,
                Err(_) => break,
            },
        };
        take(batch, own_record(&next), &mut bytes, &mut failed);
    }
    match failed {
        None if batch.count() > 0 => {
            *last_error = None;
            watch.present();
            NextBatch::Batch
        }
        // Records dropped as outdated (after a seek) leave nothing.
        None => NextBatch::Nothing,
        Some(error) if batch.count() > 0 => {
            warn!(message = "Kafka error while consuming.", consumer = %what, %error);
            NextBatch::Batch
        }
        // A topic not created yet: a state, said once.
        Some(error) if is_missing_topic(&error) => {
            watch.missing();
            tokio::time::sleep(Duration::from_millis(200)).await;
            NextBatch::Nothing
        }
        Some(error) => {
            // Said once, not every poll: an error can last.
            let text = error.to_string();
            if last_error.as_ref() != Some(&text) {
                warn!(message = "Kafka error while consuming; retrying.", consumer = %what, error = %text);
                *last_error = Some(text);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            NextBatch::Nothing
        }
    }
}

/// Waits for either of a consumer's queues: records fetched into its own
/// fetch queue (None: read them from there), or the next of the consumer's
/// queue.
async fn either<'a>(
    fetched: &FetchQueue,
    own: &mut MessageStream<'a, PauseContext>,
) -> Option<KafkaResult<BorrowedMessage<'a>>> {
    tokio::select! {
        biased;
        _ = fetched.ready() => None,
        next = own.next() => Some(next.expect("kafka streams never end")),
    }
}

/// A message of the consumer's own queue as [`take`] takes it.
fn own_record<'m>(message: &'m KafkaResult<BorrowedMessage<'_>>) -> KafkaResult<Record<'m>> {
    message.as_ref().map(Record::borrowed).map_err(Clone::clone)
}

/// Takes `record` into `batch`, counting its bytes, or keeps the first
/// error.
fn take<B: ReadBatch>(
    batch: &mut B,
    record: KafkaResult<Record<'_>>,
    bytes: &mut usize,
    failed: &mut Option<KafkaError>,
) {
    match record {
        Ok(record) => *bytes += batch.take(record),
        Err(error) => {
            failed.get_or_insert(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Offsets, first_offsets};
    use rdkafka::Offset;

    #[test]
    fn a_batch_is_committed_after_its_last_record_and_read_again_from_its_first() {
        // Runs of partitions as fetched, one partition coming back, and a
        // rewound partition read again from lower offsets.
        let positions = [
            (3, 10),
            (3, 11),
            (0, 5),
            (0, 6),
            (3, 12),
            (7, 1),
            (3, 4),
            (3, 5),
        ];
        assert_eq!(first_offsets(positions), vec![(3, 4), (0, 5), (7, 1)]);
        let Offsets(offsets) = Offsets::after("raw", positions).unwrap();
        let mut next: Vec<(i32, Offset)> = offsets
            .elements()
            .iter()
            .map(|e| (e.partition(), e.offset()))
            .collect();
        next.sort_by_key(|(p, _)| *p);
        assert_eq!(
            next,
            vec![
                (0, Offset::Offset(7)),
                (3, Offset::Offset(13)),
                (7, Offset::Offset(2))
            ]
        );
        assert_eq!(first_offsets([]), vec![]);
        assert_eq!(Offsets::after("raw", []).unwrap().0.count(), 0);
    }
}
