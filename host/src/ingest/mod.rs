//! Ingest: one Kafka consumer group per source, events in batches through
//! the objectives' filters and rules, counters applied in one transaction
//! per batch, offsets committed only after that transaction commits.
//!
//! **Architecture Invariant:** only this module imports `rdkafka`.
//!
//! Exactly-once effects do not come from the broker (a rebalance or a crash
//! redelivers whatever was not committed) but from idempotent application:
//! see `store::counters`. Bad input never stops a source: it goes to
//! `events.<source>.dead` with the reason in headers, and to the processing
//! log.

mod fetch;
mod kafka;
mod plan;
pub mod prefilter;
mod produce;
mod replay;
mod verdict;

pub use kafka::{
    BrokerError, EventPublisher, LocalBroker, RetainedMessage, RetainedReader, check_brokers,
    committed_ranges, consumer_lag, producer, publish, recent_messages, recent_payloads,
};
pub use plan::{Evaluation, Plan, Scope};
pub use produce::{Delivered, Producer};
pub use replay::{ReplayReport, replay};
pub use verdict::Verdict;

use fetch::{FetchQueue, GroupConsumer, Record};
use kafka::DeadLetters;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, MessageStream, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{BorrowedMessage, Headers, Message, OwnedMessage};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::catalog::Catalog;
use crate::event::Envelope;
use crate::metrics;
use crate::registry::Registry;
use crate::store::{
    self, Applied, Batch, BatchPart, DeadEvent, LogEntry, Message as StoredMessage, SourceRow,
    Store, StoreError,
};

/// Consumer groups are `<prefix>.<source>` (ingest's, and where the API
/// reads the lag).
pub const GROUP_PREFIX: &str = "laurel";

/// Ingest settings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Ingest")]
pub struct IngestSettings {
    /// Kafka bootstrap servers (the process's `--kafka-brokers`, or the
    /// local broker `laurel up` started).
    #[arg(skip)]
    pub brokers: String,
    /// Consumer groups are `<prefix>.<source>`.
    #[arg(skip = GROUP_PREFIX.to_string())]
    pub group_prefix: String,
    /// Most events per batch (one database transaction); a batch closes
    /// sooner when LAUREL_BATCH_WAIT_MS passes, so this only matters under
    /// load, where larger transactions go faster.
    #[arg(
        long = "batch-size",
        env = "LAUREL_BATCH_SIZE",
        default_value = "10000",
        value_parser = crate::settings::positive,
        value_name = "EVENTS"
    )]
    pub batch_size: usize,
    /// Most bytes of messages per batch: a batch closes at this size even
    /// below LAUREL_BATCH_SIZE events, so memory is bounded whatever the
    /// events' sizes.
    #[arg(
        long = "batch-max-bytes",
        env = "LAUREL_BATCH_MAX_BYTES",
        default_value = "33554432",
        value_parser = crate::settings::positive,
        value_name = "BYTES"
    )]
    pub batch_max_bytes: usize,
    /// Longest wait to fill a batch once its first event arrived, in
    /// milliseconds.
    #[arg(
        id = "batch_wait_ms",
        long = "batch-wait-ms",
        env = "LAUREL_BATCH_WAIT_MS",
        default_value = "50",
        value_parser = crate::settings::millis,
        value_name = "MS"
    )]
    pub batch_wait: Duration,
    /// Larger Kafka messages are dead-lettered (without their value, which
    /// stays on its topic at the offset the headers name), in bytes.
    #[arg(
        long = "max-event-bytes",
        env = "LAUREL_MAX_EVENT_BYTES",
        default_value_t = MAX_EVENT_BYTES,
        value_name = "BYTES"
    )]
    pub max_event_bytes: usize,
    /// Kafka consumer group session timeout, in milliseconds.
    #[arg(
        id = "kafka_session_timeout_ms",
        long = "kafka-session-timeout-ms",
        env = "LAUREL_KAFKA_SESSION_TIMEOUT_MS",
        default_value = "10000",
        value_parser = crate::settings::positive_millis,
        value_name = "MS"
    )]
    pub session_timeout: Duration,
    /// Content items per step of a backfill from history (one short
    /// transaction per source), so live batches are never queued behind
    /// a long one.
    #[arg(
        long = "backfill-batch",
        env = "LAUREL_BACKFILL_BATCH",
        default_value = "1000",
        value_parser = crate::settings::positive,
        value_name = "ITEMS"
    )]
    pub backfill_batch: usize,
    /// The process's `LAUREL_LOG_RETENTION_DAYS` (how long the ids of
    /// counted analytics events are kept, at least 7 days).
    #[arg(skip = 30)]
    pub log_retention_days: i32,
}

impl IngestSettings {
    /// What a backfill from history takes from ingest's settings.
    pub fn backfill(&self) -> crate::backfill::BackfillSettings {
        crate::backfill::BackfillSettings {
            batch: self.backfill_batch as i64,
            max_event_bytes: self.max_event_bytes,
            brokers: Some(self.brokers.clone()),
            retention_days: self.log_retention_days.max(7),
        }
    }
}

/// Larger messages are dead-lettered, unless a setting says otherwise.
pub const MAX_EVENT_BYTES: usize = 1 << 20;

impl IngestSettings {
    /// The defaults, consuming from `brokers`.
    pub fn new(brokers: impl Into<String>) -> IngestSettings {
        IngestSettings {
            brokers: brokers.into(),
            ..crate::settings::defaults()
        }
    }
}

/// Waits between retries while PostgreSQL or the broker is away: short,
/// so a batch applies within about a second of the database coming back.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_CAP: Duration = Duration::from_secs(1);

/// What every source consumer shares.
struct Shared {
    settings: IngestSettings,
    database_url: String,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    dead_letters: DeadLetters,
}

/// Runs a consumer for every registered source until `shutdown`; starts
/// consumers for sources added meanwhile and follows pause/resume (state in
/// the database, seen within a second).
pub async fn run(
    settings: IngestSettings,
    database_url: &str,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut notifications = store::listen(database_url, &[store::SOURCES_CHANNEL]).await?;
    let mut store = Store::connect(database_url).await?;
    let shared = Arc::new(Shared {
        dead_letters: DeadLetters::new(&settings.brokers, settings.max_event_bytes)?,
        settings,
        database_url: database_url.to_string(),
        registry,
        catalog,
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    // Backfills from history, taken up by whichever ingest process is free.
    let backfills = tokio::spawn(crate::backfill::run(
        database_url.to_string(),
        shared.registry.clone(),
        shared.settings.backfill(),
        stop_rx.clone(),
    ));
    let mut running: HashMap<String, (Arc<AtomicBool>, JoinHandle<()>)> = HashMap::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut failing = false;
    loop {
        let sources = match store.heal().await {
            Ok(_) => store.sources().await,
            Err(error) => Err(error),
        };
        match sources {
            Ok(sources) => {
                if std::mem::take(&mut failing) {
                    info!(message = "Reading sources again.");
                }
                for source in sources {
                    match running.get(&source.name) {
                        Some((paused, _)) => paused.store(source.paused, Ordering::Release),
                        None => {
                            let paused = Arc::new(AtomicBool::new(source.paused));
                            let task = tokio::spawn(consume_source(
                                source.clone(),
                                shared.clone(),
                                paused.clone(),
                                stop_rx.clone(),
                            ));
                            info!(message = "Consuming a source.", source = %source.name, topic = %source.topic, paused = source.paused);
                            running.insert(source.name, (paused, task));
                        }
                    }
                }
            }
            // Said once per outage; the consumers carry on meanwhile.
            Err(error) if !failing => {
                failing = true;
                warn!(message = "Failed to read sources; retrying every second.", %error);
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = notifications.recv() => {}
            _ = tick.tick() => {}
        }
    }
    info!(message = "Stopping ingest: finishing the batches in hand.");
    let _ = stop_tx.send(true);
    if let Err(error) = backfills.await {
        error!(message = "The backfill worker ended abnormally.", %error);
    }
    for (name, (_, task)) in running {
        if let Err(error) = task.await {
            error!(message = "A source consumer ended abnormally.", source = %name, %error);
        }
    }
    Ok(())
}

/// Pauses partitions assigned while the source is paused.
struct SourceContext {
    paused: Arc<AtomicBool>,
    fetched: Arc<FetchQueue>,
}

impl ClientContext for SourceContext {}

impl ConsumerContext for SourceContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            self.fetched.forward(consumer, partitions);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance
            && self.paused.load(Ordering::Acquire)
            && let Err(error) = consumer.pause(partitions)
        {
            warn!(message = "Failed to pause newly assigned partitions.", %error);
        }
    }
}

/// A batch's offsets per partition, for its span: `p0:100-199 p3:7-7`.
/// The `laurel-place` header of an event a pipeline made: where its raw
/// record was (so a replayed record's events keep the place they first had).
fn place_of(message: &OwnedMessage) -> Option<&str> {
    let headers = message.headers()?;
    headers
        .iter()
        .find(|h| h.key == crate::store::PLACE_HEADER)
        .and_then(|h| std::str::from_utf8(h.value?).ok())
}

fn offset_ranges(batch: &[OwnedMessage]) -> String {
    let mut ranges: std::collections::BTreeMap<i32, (i64, i64)> = Default::default();
    for message in batch {
        let (partition, offset) = (message.partition(), message.offset());
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

/// A consumer in `group` that commits only what it is told to, starts
/// from the earliest offset, pauses partitions assigned while `paused`
/// (ingest's per source, the pre-filter's per pipeline), and reads its
/// records in batches (see `fetch`).
fn group_consumer(
    settings: &IngestSettings,
    group: &str,
    paused: Arc<AtomicBool>,
) -> rdkafka::error::KafkaResult<GroupConsumer> {
    let session_ms = settings.session_timeout.as_millis().max(1000);
    let fetched = FetchQueue::new();
    let consumer = kafka::client_config(&settings.brokers)
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
        .create_with_context(SourceContext {
            paused,
            fetched: fetched.clone(),
        })?;
    Ok(GroupConsumer::new(consumer, fetched))
}

/// Pauses or resumes `consumer`'s assignment as `paused` says; returns
/// whether it is paused now. `what` names it in the log ("source photos").
fn follow_pause(
    consumer: &StreamConsumer<SourceContext>,
    paused: &AtomicBool,
    is_paused: bool,
    what: &str,
) -> bool {
    let want = paused.load(Ordering::Acquire);
    if want == is_paused {
        return is_paused;
    }
    let result = consumer.assignment().and_then(|assignment| {
        if want {
            consumer.pause(&assignment)
        } else {
            consumer.resume(&assignment)
        }
    });
    match result {
        Ok(()) => {
            info!(message = if want { "Paused." } else { "Resumed." }, consumer = %what);
            want
        }
        Err(error) => {
            warn!(message = "Failed to pause or resume.", consumer = %what, %error);
            is_paused
        }
    }
}

/// What [`next_batch`] found.
enum NextBatch {
    /// Messages, bounded by count, bytes and wait.
    Batch,
    /// Nothing within a quarter second, or a consumer error waited out:
    /// look at pause and stop again.
    Nothing,
    /// `stop` changed.
    Stop,
}

/// A batch as it is read: each message is copied in once, as it arrives
/// (ingest keeps whole messages; the pre-filter packs records as its
/// transform reads them).
trait ReadBatch {
    /// Takes `record` in; the bytes it counts toward LAUREL_BATCH_MAX_BYTES
    /// (its value and key).
    fn take(&mut self, record: Record<'_>) -> usize;
    /// How many messages it holds.
    fn count(&self) -> usize;
    /// Empties it, keeping its buffers for the next batch (fresh memory
    /// for every batch cost page faults: a fifth of the pre-filter's time).
    fn clear(&mut self);
}

impl ReadBatch for Vec<OwnedMessage> {
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

/// How long [`next_batch`] waits for a first message before it says there
/// is nothing.
const FIRST_WAIT: Duration = Duration::from_millis(250);

/// The next batch of `consumer`: waits up to `first_wait` for a first
/// message, then takes what is already fetched and what arrives within
/// LAUREL_BATCH_WAIT_MS, up to LAUREL_BATCH_SIZE messages or
/// LAUREL_BATCH_MAX_BYTES, into `batch` (emptied first). `what` names the
/// consumer in the log.
///
/// Records come in reads of a few dozen from the consumer's fetch queue
/// (see `fetch`); its own queue (rebalances, errors, the records of a
/// partition that could not be forwarded) is served at least once a batch.
async fn next_batch<B: ReadBatch>(
    consumer: &GroupConsumer,
    settings: &IngestSettings,
    first_wait: Duration,
    stop: &mut watch::Receiver<bool>,
    last_error: &mut Option<String>,
    what: &str,
    batch: &mut B,
) -> NextBatch {
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
            NextBatch::Batch
        }
        // Records dropped as outdated (after a seek) leave nothing.
        None => NextBatch::Nothing,
        Some(error) if batch.count() > 0 => {
            warn!(message = "Kafka error while consuming.", consumer = %what, %error);
            NextBatch::Batch
        }
        Some(error) => {
            // Said once, not every poll: a missing topic (nothing
            // produced yet) can last.
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
    own: &mut MessageStream<'a, SourceContext>,
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

/// Seeks `consumer` back to the first offset of each partition of `topic`
/// among a batch's `positions` (partition, offset), so an unfinished batch
/// is read again.
fn rewind(
    consumer: &StreamConsumer<SourceContext>,
    topic: &str,
    positions: impl IntoIterator<Item = (i32, i64)>,
    what: &str,
) {
    for (partition, offset) in first_offsets(positions) {
        if let Err(error) = consumer.seek(
            topic,
            partition,
            Offset::Offset(offset),
            Duration::from_secs(5),
        ) {
            warn!(message = "Failed to rewind; the uncommitted batch comes back after a restart.", consumer = %what, %error);
        }
    }
}

/// The first offset read on each partition, from positions (partition,
/// offset) in the order read. Positions come in runs of one partition, so
/// the last run's entry is looked at first.
fn first_offsets(positions: impl IntoIterator<Item = (i32, i64)>) -> Vec<(i32, i64)> {
    let mut first: Vec<(i32, i64)> = Vec::new();
    for (partition, offset) in positions {
        match first.iter_mut().rev().find(|(p, _)| *p == partition) {
            Some(at) => at.1 = at.1.min(offset),
            None => first.push((partition, offset)),
        }
    }
    first
}

/// What to commit after reading `positions` (partition, offset) of
/// `topic`: on each partition, the offset after the last one read.
fn next_offsets(
    topic: &str,
    positions: impl IntoIterator<Item = (i32, i64)>,
) -> rdkafka::error::KafkaResult<TopicPartitionList> {
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
    Ok(offsets)
}

async fn consume_source(
    source: SourceRow,
    shared: Arc<Shared>,
    paused: Arc<AtomicBool>,
    stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        match SourceConsumer::new(&source, &shared, paused.clone()).await {
            Ok(mut consumer) => {
                consumer.run(stop.clone()).await;
                return;
            }
            Err(error) => {
                error!(message = "Failed to start a source consumer; retrying.", source = %source.name, error = %format!("{error:#}"));
            }
        }
        if *stop.borrow() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

struct SourceConsumer {
    source: SourceRow,
    shared: Arc<Shared>,
    consumer: GroupConsumer,
    store: Store,
    paused: Arc<AtomicBool>,
    is_paused: bool,
    plan: Option<Plan>,
    plan_generation: (u64, u64),
    /// Awards whose analytics events are recorded by id (`recorded_awards`).
    recorded: Vec<String>,
}

impl SourceConsumer {
    async fn new(
        source: &SourceRow,
        shared: &Arc<Shared>,
        paused: Arc<AtomicBool>,
    ) -> anyhow::Result<SourceConsumer> {
        let settings = &shared.settings;
        let group = format!("{}.{}", settings.group_prefix, source.name);
        let consumer = group_consumer(settings, &group, paused.clone()).map_err(|e| {
            anyhow::anyhow!(
                "failed to create the consumer for source {}: {e}",
                source.name
            )
        })?;
        consumer
            .subscribe(&[&source.topic])
            .map_err(|e| anyhow::anyhow!("failed to subscribe to {}: {e}", source.topic))?;
        let store = Store::connect(&shared.database_url).await?;
        Ok(SourceConsumer {
            source: source.clone(),
            shared: shared.clone(),
            consumer,
            store,
            paused,
            is_paused: false,
            plan: None,
            plan_generation: (u64::MAX, u64::MAX),
            recorded: Vec::new(),
        })
    }

    async fn run(&mut self, mut stop: watch::Receiver<bool>) {
        let mut last_error: Option<String> = None;
        let settings = self.shared.settings.clone();
        let what = format!("source {}", self.source.name);
        let mut batch: Vec<OwnedMessage> = Vec::new();
        loop {
            if *stop.borrow() {
                break;
            }
            self.follow_pause();
            match next_batch(
                &self.consumer,
                &settings,
                FIRST_WAIT,
                &mut stop,
                &mut last_error,
                &what,
                &mut batch,
            )
            .await
            {
                NextBatch::Batch => {}
                NextBatch::Nothing => continue,
                NextBatch::Stop => break,
            }
            // A batch in hand is finished even when asked to stop: nothing
            // is committed before it is applied, so stopping mid-way would
            // only mean doing it again.
            let span = info_span!("batch", source = %self.source.name, size = batch.len(), offsets = %offset_ranges(&batch));
            async {
                if let Err(error) = self.process(&batch, &stop).await {
                    error!(message = "A batch was not applied; it will be consumed again.", source = %self.source.name, error = %format!("{error:#}"));
                    // Go back to the first uncommitted offset of each partition.
                    self.rewind(&batch);
                    tokio::select! {
                        _ = tokio::time::sleep(RETRY_CAP) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
            .instrument(span)
            .await;
        }
        info!(message = "Source consumer stopped.", source = %self.source.name);
    }

    fn follow_pause(&mut self) {
        let what = format!("source {}", self.source.name);
        self.is_paused = follow_pause(&self.consumer, &self.paused, self.is_paused, &what);
    }

    fn rewind(&self, batch: &[OwnedMessage]) {
        let what = format!("source {}", self.source.name);
        let positions = batch.iter().map(|m| (m.partition(), m.offset()));
        rewind(&self.consumer, &self.source.topic, positions, &what);
    }

    fn decode(&self, message: &OwnedMessage) -> Result<Envelope, String> {
        check_message(
            message.key(),
            message.payload(),
            &self.source.name,
            self.shared.settings.max_event_bytes,
        )
    }

    async fn process(
        &mut self,
        batch: &[OwnedMessage],
        stop: &watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let messages: Vec<StoredMessage<'_>> = batch
            .iter()
            .map(|m| StoredMessage {
                topic: m.topic(),
                partition: m.partition(),
                offset: m.offset(),
                key: m.key(),
                value: m.payload(),
                place: place_of(m),
            })
            .collect();
        let mut log: Vec<LogEntry> = Vec::new();
        let mut dead: Vec<DeadEvent> = Vec::new();
        let mut admitted: Vec<(usize, Envelope)> = Vec::new();
        for (index, message) in batch.iter().enumerate() {
            match self.decode(message) {
                Ok(envelope) => admitted.push((index, envelope)),
                Err(reason) => dead.push(DeadEvent {
                    index,
                    event_id: raw_event_id(message.payload(), self.shared.settings.max_event_bytes),
                    user_id: message
                        .key()
                        .map(|k| String::from_utf8_lossy(k).into_owned()),
                    reason,
                }),
            }
        }
        // Who gets no progress.
        let excluded = if admitted.is_empty() {
            HashMap::new()
        } else {
            let users = || admitted.iter().map(|(_, e)| e.user_id.as_str());
            let mut retry = Retry::new(&self.source.name);
            loop {
                let result = match self.store.heal().await {
                    Ok(_) => self.store.excluded_users(users()).await,
                    Err(error) => Err(error),
                };
                match result {
                    Ok(excluded) => {
                        retry.succeeded();
                        break excluded;
                    }
                    Err(error) => retry.wait(error, stop).await?,
                }
            }
        };
        admitted.retain(|(index, envelope)| !skipped(*index, envelope, &excluded, &mut log));

        // The objectives, rebuilt when awards or functions changed.
        let generation = (
            self.shared.catalog.generation(),
            self.shared.registry.generation(),
        );
        if self.plan.is_none() || generation != self.plan_generation {
            let (source, awards, registry) = (
                self.source.name.clone(),
                self.shared.catalog.awards(),
                self.shared.registry.clone(),
            );
            let plan =
                tokio::task::spawn_blocking(move || Plan::build(&source, &awards, &registry))
                    .await?;
            info!(message = "Objectives planned.", source = %self.source.name, objectives = plan.objective_count(), unbound = plan.unbound.len());
            self.plan = Some(plan);
            self.recorded = recorded_awards(&self.shared.catalog);
            self.plan_generation = generation;
        }
        let mut plan = self.plan.take().expect("planned above");
        // Batch positions stay here; the envelopes move to the blocking thread.
        let (indexes, envelopes): (Vec<usize>, Vec<Envelope>) = admitted.into_iter().unzip();
        let evaluating = std::time::Instant::now();
        let (plan, evaluation) = tokio::task::spawn_blocking(move || {
            let evaluation = plan.evaluate(&envelopes, &indexes);
            (plan, evaluation)
        })
        .await?;
        let evaluate_us = evaluating.elapsed().as_micros() as u64;
        self.plan = Some(plan);
        log.extend(evaluation.log);

        // One transaction (split only to find an event PostgreSQL refuses);
        // retried while the database is away.
        let input = Batch {
            source: &self.source.name,
            messages: &messages,
            outcomes: &evaluation.outcomes,
            log: &log,
            dead: &dead,
            replaying: &[],
            backfill: false,
            recorded: &self.recorded,
        };
        let applying = std::time::Instant::now();
        let mut retry = Retry::new(&self.source.name);
        let (applied, refused) = loop {
            let result = match self.store.heal().await {
                Ok(_) => apply_isolating(&mut self.store, &input).await,
                Err(error) => Err(error),
            };
            match result {
                Ok(done) => {
                    retry.succeeded();
                    break done;
                }
                Err(error) => retry.wait(error, stop).await?,
            }
        };

        // Whole events that could not be applied: the dead-letter topic,
        // before the offsets (they are kept in the database already).
        let mut letters: Vec<(usize, &str)> =
            dead.iter().map(|d| (d.index, d.reason.as_str())).collect();
        letters.extend(refused.iter().map(|d| (d.index, d.reason.as_str())));
        letters.extend(
            applied
                .refused
                .iter()
                .map(|(index, reason)| (*index, reason.as_str())),
        );
        letters.sort_by_key(|(index, _)| *index);
        // At once: each waits for its acknowledgement.
        let publishing = letters.iter().map(|(index, reason)| {
            publish_dead_letter(&self.shared, &self.source, &batch[*index], reason, stop)
        });
        for published in futures_util::future::join_all(publishing).await {
            published?;
        }

        let source = [("source", self.source.name.as_str())];
        metrics::add(
            metrics::EVENTS_APPLIED,
            &source,
            (batch.len() - letters.len()) as u64,
        );
        metrics::add(metrics::EVENTS_DEAD_LETTERED, &source, letters.len() as u64);
        for ((award, objective), n) in &applied.held {
            metrics::add(
                metrics::EVENTS_HELD,
                &[
                    ("source", self.source.name.as_str()),
                    ("award", award.as_str()),
                    ("objective", objective.as_str()),
                ],
                *n,
            );
            warn!(message = "Events held for an objective that cannot apply them.", source = %self.source.name, award = %award, objective = %objective, events = n);
        }
        debug!(
            message = "Batch applied.",
            source = %self.source.name,
            events = batch.len(),
            outcomes = evaluation.outcomes.len(),
            changed = applied.changed,
            objectives = applied.objectives,
            evaluate_us,
            apply_us = applying.elapsed().as_micros() as u64,
        );

        // Only now: the offsets.
        let offsets = next_offsets(
            &self.source.topic,
            batch.iter().map(|m| (m.partition(), m.offset())),
        )?;
        // A lost commit only means a re-delivery, which changes nothing.
        if let Err(error) = self.consumer.commit(&offsets, CommitMode::Async) {
            warn!(message = "Committing offsets failed; the batch may be delivered again.", source = %self.source.name, %error);
        }
        Ok(())
    }
}

/// Publishes one dead letter, retrying while the broker is away.
async fn publish_dead_letter(
    shared: &Shared,
    source: &SourceRow,
    message: &OwnedMessage,
    reason: &str,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let topic = format!("events.{}.dead", source.name);
    let reason = crate::event::printable(reason, 4096);
    let (partition, offset) = (
        message.partition().to_string(),
        message.offset().to_string(),
    );
    let mut headers = vec![
        ("laurel-reason", reason.as_str()),
        ("laurel-source", source.name.as_str()),
        ("laurel-topic", source.topic.as_str()),
        ("laurel-partition", partition.as_str()),
        ("laurel-offset", offset.as_str()),
    ];
    let size = message.payload().map_or(0, <[u8]>::len).to_string();
    if message.payload().map_or(0, <[u8]>::len) > shared.settings.max_event_bytes {
        headers.push(("laurel-value-omitted-bytes", size.as_str()));
    }
    let original: Vec<(String, Vec<u8>)> = message
        .headers()
        .map(|h| {
            h.iter()
                .map(|header| {
                    (
                        header.key.to_string(),
                        header.value.unwrap_or_default().to_vec(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mut backoff = RETRY_FIRST;
    let mut failed = false;
    loop {
        match shared
            .dead_letters
            .publish(
                &topic,
                message.key(),
                message.payload(),
                &headers,
                &original,
            )
            .await
        {
            Ok(()) => break,
            Err(error) if *stop.borrow() => return Err(error),
            Err(error) => {
                if !std::mem::replace(&mut failed, true) {
                    warn!(message = "Failed to publish a dead letter; retrying until the broker takes it.", source = %source.name, %error);
                }
                metrics::add(
                    metrics::INGEST_RETRIES,
                    &[("source", source.name.as_str())],
                    1,
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_CAP);
            }
        }
    }
    warn!(message = "Event dead-lettered.", source = %source.name, partition = message.partition(), offset = message.offset(), reason = %reason);
    Ok(())
}

/// Whether `envelope`'s user gets no progress (not authorized, banned or
/// deleted); if so, the skip is logged.
/// The awards that credit the past (`"backfill": "history"`): the analytics
/// events they count are recorded by id, so a backfill counts each once.
pub(crate) fn recorded_awards(catalog: &Catalog) -> Vec<String> {
    catalog
        .awards()
        .iter()
        .filter(|a| a.backfill.is_some())
        .map(|a| a.id.clone())
        .collect()
}

pub(crate) fn skipped(
    index: usize,
    envelope: &Envelope,
    excluded: &HashMap<String, String>,
    log: &mut Vec<LogEntry>,
) -> bool {
    let reason = if !envelope.authorized {
        "user not authorized (authorized: false)".to_string()
    } else if let Some(state) = excluded.get(&envelope.user_id) {
        format!("user is {state}")
    } else {
        return false;
    };
    log.push(LogEntry {
        index,
        event_id: Some(envelope.id.clone()),
        user_id: Some(envelope.user_id.clone()),
        award_id: None,
        objective_id: None,
        outcome: "skipped",
        reason,
        functions: None,
    });
    true
}

/// A message's event, or why it cannot be used: the checks every message
/// passes before any function or database sees it (and again on replay).
pub(crate) fn check_message(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    source: &str,
    max_event_bytes: usize,
) -> Result<Envelope, String> {
    let Some(value) = value else {
        return Err("empty message: no value".to_string());
    };
    if value.len() > max_event_bytes {
        return Err(format!(
            "message of {} bytes is over the limit of {max_event_bytes} bytes",
            value.len()
        ));
    }
    let envelope = Envelope::parse(value).map_err(|e| e.to_string())?;
    if envelope.source != source {
        return Err(format!(
            "unknown source `{}`: this topic carries source `{source}`",
            envelope.source
        ));
    }
    match key {
        Some(key) if key != envelope.user_id.as_bytes() => Err(format!(
            "message key `{}` is not the event's user_id `{}`",
            String::from_utf8_lossy(key),
            envelope.user_id
        )),
        _ => Ok(envelope),
    }
}

/// The `id` of a message that could not be used, if it has one to read.
fn raw_event_id(payload: Option<&[u8]>, limit: usize) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct JustId {
        id: Option<serde_json::Value>,
    }
    let payload = payload.filter(|p| p.len() <= limit)?;
    match serde_json::from_slice::<JustId>(payload).ok()?.id? {
        serde_json::Value::String(id) => Some(id),
        _ => None,
    }
}

/// Retrying a database step while PostgreSQL is away (unreachable,
/// restarting, a lost connection, a serialization failure): with backoff,
/// said once in the log. A fault of the data is not retried (returned),
/// and a stop request ends the wait (the batch is consumed again later).
struct Retry<'a> {
    source: &'a str,
    backoff: Duration,
    since: Option<std::time::Instant>,
}

impl<'a> Retry<'a> {
    fn new(source: &'a str) -> Retry<'a> {
        Retry {
            source,
            backoff: RETRY_FIRST,
            since: None,
        }
    }

    /// After a failed attempt: waits before the next, or says why not.
    async fn wait(
        &mut self,
        error: StoreError,
        stop: &watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        if error.is_data_error() || *stop.borrow() {
            return Err(error.into());
        }
        if self.since.is_none() {
            self.since = Some(std::time::Instant::now());
            warn!(message = "PostgreSQL is unavailable; retrying the batch until it is back.", source = %self.source, %error);
        } else {
            debug!(message = "PostgreSQL still unavailable.", source = %self.source, %error);
        }
        metrics::add(metrics::INGEST_RETRIES, &[("source", self.source)], 1);
        let mut stop = stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(self.backoff) => {}
            _ = stop.changed() => {}
        }
        self.backoff = (self.backoff * 2).min(RETRY_CAP);
        Ok(())
    }

    fn succeeded(&self) {
        if let Some(since) = self.since {
            info!(message = "PostgreSQL is back; the batch went through.", source = %self.source, after_ms = since.elapsed().as_millis() as u64);
        }
    }
}

/// Applies a batch; if PostgreSQL refuses it for its data (a class 22 or
/// 54 error that the checks before it did not foresee), splits it in
/// stream order until the events it refuses are found. Those are kept as
/// dead letters (returned, for the topic); the rest applies once.
/// Environment faults are returned as they are.
pub async fn apply_isolating(
    store: &mut Store,
    batch: &Batch<'_>,
) -> Result<(Applied, Vec<DeadEvent>), StoreError> {
    let error = match store.apply_batch(*batch).await {
        Ok(applied) => return Ok((applied, Vec::new())),
        Err(error) if !error.is_data_error() => return Err(error),
        Err(error) => error,
    };
    warn!(message = "PostgreSQL refused a batch for its data; finding the events it refuses.", source = %batch.source, %error);
    let mut applied = Applied::default();
    let mut refused = Vec::new();
    // Parts in stream order, front first: a refused part is replaced by
    // its two halves.
    let indexes: Vec<usize> = batch.indexes().into_iter().collect();
    let mut parts: std::collections::VecDeque<(Vec<usize>, Option<StoreError>)> =
        std::collections::VecDeque::from([(indexes, Some(error))]);
    while let Some((part, error)) = parts.pop_front() {
        let error = match error {
            Some(error) => error,
            None => {
                let keep: HashSet<usize> = part.iter().copied().collect();
                let input = BatchPart::of(batch, |i| keep.contains(&i));
                match store.apply_batch(input.batch(batch)).await {
                    Ok(done) => {
                        applied.merge(done);
                        continue;
                    }
                    Err(error) if !error.is_data_error() => return Err(error),
                    Err(error) => error,
                }
            }
        };
        if part.len() > 1 {
            let (left, right) = part.split_at(part.len() / 2);
            parts.push_front((right.to_vec(), None));
            parts.push_front((left.to_vec(), None));
            continue;
        }
        // The event PostgreSQL refuses: kept as a dead letter alone.
        let index = part[0];
        let (event_id, user_id) = batch
            .outcomes
            .iter()
            .find(|o| o.index == index)
            .map(|o| (Some(o.event_id.clone()), Some(o.user_id.clone())))
            .or_else(|| {
                batch
                    .log
                    .iter()
                    .find(|l| l.index == index)
                    .map(|l| (l.event_id.clone(), l.user_id.clone()))
            })
            .or_else(|| {
                batch
                    .dead
                    .iter()
                    .find(|d| d.index == index)
                    .map(|d| (d.event_id.clone(), d.user_id.clone()))
            })
            .unwrap_or((None, None));
        let dead = DeadEvent {
            index,
            event_id,
            user_id,
            reason: format!("PostgreSQL refused the event: {error}"),
        };
        let alone = BatchPart {
            dead: vec![dead.clone()],
            ..BatchPart::default()
        };
        match store.apply_batch(alone.batch(batch)).await {
            Ok(_) => {}
            Err(error) if error.is_data_error() => {
                error!(message = "Could not keep a refused event in the database; it goes to the dead-letter topic only.", source = %batch.source, %error);
            }
            Err(error) => return Err(error),
        }
        refused.push(dead);
    }
    Ok((applied, refused))
}

#[cfg(test)]
mod tests {
    use super::{first_offsets, next_offsets};
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
        let offsets = next_offsets("raw", positions).unwrap();
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
        assert_eq!(next_offsets("raw", []).unwrap().count(), 0);
    }
}
