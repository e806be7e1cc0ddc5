//! Kafka: the one owner of rdkafka. Clients and their settings, the local
//! broker (librdkafka's mock cluster, which speaks the real protocol over
//! TCP), group consumers reading in batches (`consume`, `fetch`),
//! producers that are told each acknowledgement (`produce`), dead-letter
//! publishing, reads of recent and retained messages, a group's unread
//! span (`span`), lag, and the names of groups and topics.
//!
//! **Architecture Invariant:** only this module imports `rdkafka`; roles
//! talk to Kafka through what it exports.

mod consume;
mod fetch;
mod produce;
mod span;

pub use consume::{
    ConsumerSettings, FIRST_WAIT, GroupReader, NextBatch, Offsets, ReadBatch, first_offsets,
    offset_ranges,
};
pub use fetch::{OwnedRecord, Record};
pub use produce::{Delivered, Producer};
pub use span::Span;

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, Producer as _};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

/// Consumer groups are `<prefix>.<source>` (ingest's, and where the API
/// reads the lag).
pub const GROUP_PREFIX: &str = "laurel";

/// Ingest's consumer group of `source`: `<prefix>.<source>`.
pub fn source_group(prefix: &str, source: &str) -> String {
    format!("{prefix}.{source}")
}

/// A pipeline's consumer group: `<prefix>.prefilter.<pipeline>`.
pub fn pipeline_group(prefix: &str, pipeline: &str) -> String {
    format!("{prefix}.prefilter.{pipeline}")
}

/// Where a source's events that cannot be used go: `events.<source>.dead`.
pub fn source_dead_topic(source: &str) -> String {
    format!("events.{source}.dead")
}

/// Where a pipeline's malformed records go: `<input_topic>.dead`.
pub fn dead_topic(input_topic: &str) -> String {
    format!("{input_topic}.dead")
}

/// librdkafka calls this when a queue goes from empty to not empty (from
/// its own threads, under the queue's lock); `opaque` is the queue's
/// [`tokio::sync::Notify`], which must outlive the callback.
unsafe extern "C" fn queue_not_empty(
    _: *mut rdkafka::bindings::rd_kafka_t,
    opaque: *mut std::ffi::c_void,
) {
    // SAFETY: the caller that enabled the callback keeps the Notify alive
    // until it removes it.
    let ready = unsafe { &*(opaque as *const tokio::sync::Notify) };
    ready.notify_one();
}

/// A Kafka-protocol broker in this process, for local use and tests:
/// librdkafka's mock cluster, owned by a client made for it.
pub struct LocalBroker {
    owner: BaseProducer,
    bootstrap: String,
}

impl LocalBroker {
    /// Starts a one-broker cluster on an ephemeral loopback port. With
    /// `port`, the broker is reached and advertised at 127.0.0.1:`port`
    /// instead (every connection forwarded to it), so a broker started
    /// again on the same port is the same address to every client.
    pub async fn start(port: Option<u16>) -> anyhow::Result<LocalBroker> {
        let owner: BaseProducer = ClientConfig::new()
            .set("test.mock.num.brokers", "1")
            .set("log_level", "4")
            .create()
            .map_err(|e| anyhow::anyhow!("failed to start the local Kafka broker: {e}"))?;
        let internal = owner
            .client()
            .mock_cluster()
            .ok_or_else(|| anyhow::anyhow!("the local Kafka broker did not start"))?
            .bootstrap_servers();
        let mut bootstrap = internal.clone();
        if let Some(port) = port {
            let listener = TcpListener::bind(("127.0.0.1", port))
                .await
                .map_err(|e| anyhow::anyhow!("failed to listen on 127.0.0.1:{port}: {e}"))?;
            tokio::spawn(forward(listener, internal));
            // Safety: the mock cluster lives as long as `owner`, which is
            // alive here; the host string is copied by librdkafka.
            unsafe {
                let cluster =
                    rdkafka::bindings::rd_kafka_handle_mock_cluster(owner.client().native_ptr());
                anyhow::ensure!(!cluster.is_null(), "the local Kafka broker did not start");
                rdkafka::bindings::rd_kafka_mock_broker_set_host_port(
                    cluster,
                    1,
                    c"127.0.0.1".as_ptr(),
                    i32::from(port),
                );
            }
            bootstrap = format!("127.0.0.1:{port}");
        }
        Ok(LocalBroker { owner, bootstrap })
    }

    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }

    /// Delays every response of the broker by `delay` (zero: at once): a
    /// slow broker, not a dead one.
    pub fn set_round_trip_time(&self, delay: Duration) -> anyhow::Result<()> {
        self.owner
            .client()
            .mock_cluster()
            .ok_or_else(|| anyhow::anyhow!("the local Kafka broker is not running"))?
            .broker_round_trip_time(1, delay)
            .map_err(|e| anyhow::anyhow!("failed to slow the local Kafka broker: {e}"))
    }

    /// Creates a topic with `partitions` partitions (the mock broker also
    /// creates topics on first use, with 4).
    /// One that exists already is left as it is.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> anyhow::Result<()> {
        let cluster = self
            .owner
            .client()
            .mock_cluster()
            .ok_or_else(|| anyhow::anyhow!("the local Kafka broker is gone"))?;
        match cluster.create_topic(topic, partitions, 1) {
            Ok(()) => Ok(()),
            Err(e)
                if e.rdkafka_error_code()
                    == Some(rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists) =>
            {
                Ok(())
            }
            Err(e) => Err(anyhow::anyhow!("failed to create topic {topic}: {e}")),
        }
    }
}

/// Bootstrap connections on a fixed port go to the broker; the metadata the
/// broker returns names its own address, where clients then connect.
async fn forward(listener: TcpListener, target: String) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let target = target.clone();
        tokio::spawn(async move {
            match TcpStream::connect(&target).await {
                Ok(mut outbound) => {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
                Err(error) => warn!(message = "Broker forward failed.", %error, %target),
            }
        });
    }
}

/// Settings common to every client.
pub fn client_config(brokers: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("client.id", format!("laurel-{}", std::process::id()))
        .set("log_level", "4");
    config
}

/// A producer that waits for every acknowledgement.
pub fn producer(brokers: &str) -> anyhow::Result<Producer> {
    producer_lingering(brokers, 5)
}

/// As [`producer`], sending what is queued after `linger_ms` (0: at once,
/// for a caller that waits for a batch's acknowledgements before it goes
/// on: waiting to fill a request only delays it; messages queued while a
/// request is under way still go together).
pub fn producer_lingering(brokers: &str, linger_ms: u32) -> anyhow::Result<Producer> {
    Producer::create(
        client_config(brokers)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", linger_ms.to_string())
            .set("message.timeout.ms", "30000"),
    )
    .map_err(|e| anyhow::anyhow!("failed to create a Kafka producer for {brokers}: {e}"))
}

/// Headroom over the largest event for a dead letter's headers.
const DEAD_LETTER_HEADERS_BYTES: usize = 64 << 10;

/// The producer of `events.<source>.dead`. It accepts every message that
/// ingest reads up to its size limit, with Laurel's headers and the
/// original ones (up to [`DEAD_LETTER_HEADERS_BYTES`]). If the producer
/// fails fatally (an idempotent producer after its broker lost its state,
/// e.g. a restarted broker), the next publish makes a new one.
pub struct DeadLetters {
    brokers: String,
    max_event_bytes: usize,
    producer: std::sync::Mutex<Producer>,
}

impl DeadLetters {
    pub fn new(brokers: &str, max_event_bytes: usize) -> anyhow::Result<DeadLetters> {
        Ok(DeadLetters {
            brokers: brokers.to_string(),
            max_event_bytes,
            producer: std::sync::Mutex::new(Self::create(brokers, max_event_bytes)?),
        })
    }

    fn create(brokers: &str, max_event_bytes: usize) -> anyhow::Result<Producer> {
        let max = max_event_bytes + 2 * DEAD_LETTER_HEADERS_BYTES + 1024;
        Producer::create(
            client_config(brokers)
                .set("acks", "all")
                .set("enable.idempotence", "true")
                // Its callers wait for each acknowledgement.
                .set("linger.ms", "0")
                .set("message.timeout.ms", "30000")
                .set("message.max.bytes", max.to_string()),
        )
        .map_err(|e| anyhow::anyhow!("failed to create a Kafka producer for {brokers}: {e}"))
    }

    /// Publishes one dead letter and waits for its acknowledgement. A
    /// value over the event limit is left out (the reason says why, and
    /// the original stays on its topic at `laurel-offset`).
    pub async fn publish(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        laurel_headers: &[(&str, &str)],
        original_headers: &[(String, Vec<u8>)],
    ) -> anyhow::Result<()> {
        let producer = {
            let mut current = self.producer.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(fatal) = current.fatal_error() {
                warn!(message = "The dead-letter producer failed; making a new one.", error = ?fatal);
                *current = Self::create(&self.brokers, self.max_event_bytes)?;
            }
            current.clone()
        };
        let mut owned = OwnedHeaders::new();
        let mut size = 0;
        for (name, value) in laurel_headers {
            size += name.len() + value.len();
            owned = owned.insert(Header {
                key: name,
                value: Some(*value),
            });
        }
        let mut dropped = 0;
        for (name, value) in original_headers {
            if size + name.len() + value.len() > DEAD_LETTER_HEADERS_BYTES {
                dropped += 1;
                continue;
            }
            size += name.len() + value.len();
            owned = owned.insert(Header {
                key: name,
                value: Some(value.as_slice()),
            });
        }
        let dropped_text = dropped.to_string();
        if dropped > 0 {
            owned = owned.insert(Header {
                key: "laurel-headers-dropped",
                value: Some(&dropped_text),
            });
        }
        let value = value.filter(|v| v.len() <= self.max_event_bytes);
        match producer.send(topic, key, value, Some(owned)).await {
            Ok(_) => Ok(()),
            Err(error) => Err(anyhow::anyhow!("failed to publish to {topic}: {error}")),
        }
    }
}

/// Puts events on topics for code outside ingest (HTTP functions), so
/// rdkafka stays here.
pub struct EventPublisher {
    producer: Producer,
}

impl EventPublisher {
    pub fn new(brokers: &str) -> anyhow::Result<EventPublisher> {
        Ok(EventPublisher {
            producer: producer(brokers)?,
        })
    }

    /// Publishes `(key, payload)` messages to `topic`, waiting until the
    /// broker acknowledged every one.
    pub async fn publish_all(
        &self,
        topic: &str,
        messages: &[(String, String)],
    ) -> anyhow::Result<()> {
        let sends = messages.iter().map(|(key, payload)| {
            publish(
                &self.producer,
                topic,
                Some(key.as_bytes()),
                payload.as_bytes(),
                &[],
            )
        });
        for result in futures_util::future::join_all(sends).await {
            result?;
        }
        Ok(())
    }
}

/// Publishes one message and waits for the broker to acknowledge it.
pub async fn publish(
    producer: &Producer,
    topic: &str,
    key: Option<&[u8]>,
    payload: &[u8],
    headers: &[(&str, &str)],
) -> anyhow::Result<()> {
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    publish_bytes(producer, topic, key, payload, &headers).await
}

/// As [`publish`], with header values of any bytes.
pub async fn publish_bytes(
    producer: &Producer,
    topic: &str,
    key: Option<&[u8]>,
    payload: &[u8],
    headers: &[(&str, &[u8])],
) -> anyhow::Result<()> {
    let owned = (!headers.is_empty()).then(|| {
        headers
            .iter()
            .fold(OwnedHeaders::new(), |owned, (name, value)| {
                owned.insert(Header {
                    key: name,
                    value: Some(*value),
                })
            })
    });
    match producer.send(topic, key, Some(payload), owned).await {
        Ok(delivery) => {
            debug!(
                message = "Published.",
                topic,
                partition = delivery.partition,
                offset = delivery.offset
            );
            Ok(())
        }
        Err(error) => Err(anyhow::anyhow!("failed to publish to {topic}: {error}")),
    }
}

/// The partitions of `topic` (none if it does not exist).
/// Why the brokers could not be asked something (support reads: health,
/// lag, a user's recent events).
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    /// A request failed or was not answered in time.
    #[error("{asking}: {source}")]
    Request {
        /// What was asked, e.g. `watermarks of events.photos/0`.
        asking: String,
        source: KafkaError,
    },
    #[error("topic {0} does not exist")]
    NoTopic(String),
    /// The blocking task that asked panicked or was cancelled.
    #[error("{asking} failed: {reason}")]
    Task {
        asking: &'static str,
        reason: String,
    },
}

/// Names a failed request for its [`BrokerError`].
fn asking(what: impl Into<String>) -> impl FnOnce(KafkaError) -> BrokerError {
    let asking = what.into();
    move |source| BrokerError::Request { asking, source }
}

fn task(asking: &'static str) -> impl FnOnce(tokio::task::JoinError) -> BrokerError {
    move |error| BrokerError::Task {
        asking,
        reason: error.to_string(),
    }
}

pub(super) fn partitions(
    consumer: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<i32>, BrokerError> {
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(asking(format!("metadata of {topic}")))?;
    Ok(metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect())
}

/// The payloads of the messages keyed `key` among the last `scan`
/// messages of each partition of `topic`, oldest first per partition (for
/// support tools: what a user's recent events were).
pub async fn recent_messages(
    brokers: &str,
    topic: &str,
    key: &str,
    scan: i64,
) -> Result<Vec<Vec<u8>>, BrokerError> {
    recent(brokers, topic, Some(key), scan).await
}

/// The payloads of the last `scan` messages of each partition of `topic`,
/// oldest first per partition (what a candidate function is tried on).
pub async fn recent_payloads(
    brokers: &str,
    topic: &str,
    scan: i64,
) -> Result<Vec<Vec<u8>>, BrokerError> {
    recent(brokers, topic, None, scan).await
}

async fn recent(
    brokers: &str,
    topic: &str,
    key: Option<&str>,
    scan: i64,
) -> Result<Vec<Vec<u8>>, BrokerError> {
    const TIMEOUT: Duration = Duration::from_secs(3);
    let (brokers, topic, key) = (
        brokers.to_string(),
        topic.to_string(),
        key.map(str::to_string),
    );
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client_config(&brokers)
            .set("group.id", "laurel-explain")
            .set("enable.auto.commit", "false")
            .create()
            .map_err(asking(format!("Kafka client for {brokers}")))?;
        let partitions = partitions(&consumer, &topic, TIMEOUT)?;
        // Declared after the consumer, so dropped before it (a list
        // outliving its consumer makes the consumer's drop hang).
        let mut assignment = TopicPartitionList::new();
        let mut ends: HashMap<i32, i64> = HashMap::new();
        for partition in partitions {
            let (low, high) = consumer
                .fetch_watermarks(&topic, partition, TIMEOUT)
                .map_err(asking(format!("watermarks of {topic}/{partition}")))?;
            if high > low {
                assignment
                    .add_partition_offset(&topic, partition, Offset::Offset((high - scan).max(low)))
                    .map_err(asking(format!("offsets of {topic}/{partition}")))?;
                ends.insert(partition, high);
            }
        }
        let mut found = Vec::new();
        if ends.is_empty() {
            return Ok(found);
        }
        consumer
            .assign(&assignment)
            .map_err(asking(format!("reading {topic}")))?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !ends.is_empty() && std::time::Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(message)) => {
                    if key
                        .as_ref()
                        .is_none_or(|key| message.key() == Some(key.as_bytes()))
                    {
                        found.push(message.payload().unwrap_or_default().to_vec());
                    }
                    if ends
                        .get(&message.partition())
                        .is_some_and(|end| message.offset() + 1 >= *end)
                    {
                        ends.remove(&message.partition());
                    }
                }
                Some(Err(error)) => return Err(asking(format!("reading {topic}"))(error)),
                None => {}
            }
        }
        Ok(found)
    })
    .await
    .map_err(task("reading recent events"))?
}

/// Answers if the brokers do: fetches the cluster's metadata within
/// `timeout`; returns how many brokers it lists.
pub async fn check_brokers(brokers: &str, timeout: Duration) -> Result<usize, BrokerError> {
    let brokers = brokers.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client_config(&brokers)
            .create()
            .map_err(asking(format!("Kafka client for {brokers}")))?;
        let metadata = consumer
            .fetch_metadata(None, timeout)
            .map_err(asking(format!("Kafka at {brokers}")))?;
        Ok(metadata.brokers().len())
    })
    .await
    .map_err(task("Kafka check"))?
}

/// How far a consumer group is behind on `topic`: the sum over its
/// partitions of the high watermark minus the group's committed offset
/// (the low watermark where the group has committed nothing).
pub async fn consumer_lag(brokers: &str, group: &str, topic: &str) -> Result<i64, BrokerError> {
    let partitions = group_positions(brokers, group, topic, Duration::from_secs(3)).await?;
    if partitions.is_empty() {
        return Err(BrokerError::NoTopic(topic.to_string()));
    }
    Ok(partitions
        .iter()
        .map(|p| (p.high - p.committed.unwrap_or(p.low)).max(0))
        .sum())
}

/// Per partition of `topic`: (partition, low watermark, what `group` has
/// committed). What a backfill may read again: retained, and applied by
/// ingest already (what is past the committed offset, ingest applies with
/// the awards as they are now).
pub async fn committed_ranges(
    brokers: &str,
    group: &str,
    topic: &str,
) -> Result<Vec<(i32, i64, i64)>, BrokerError> {
    let partitions = group_positions(brokers, group, topic, Duration::from_secs(5)).await?;
    Ok(partitions
        .iter()
        .map(|p| (p.partition, p.low, p.committed.unwrap_or(p.low).max(p.low)))
        .collect())
}

/// A partition's watermarks and what a group has committed there.
struct GroupPosition {
    partition: i32,
    low: i64,
    high: i64,
    committed: Option<i64>,
}

async fn group_positions(
    brokers: &str,
    group: &str,
    topic: &str,
    timeout: Duration,
) -> Result<Vec<GroupPosition>, BrokerError> {
    let (brokers, group, topic) = (brokers.to_string(), group.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client_config(&brokers)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(asking(format!("Kafka client for {brokers}")))?;
        let partitions = partitions(&consumer, &topic, timeout)?;
        let mut wanted = TopicPartitionList::new();
        for partition in &partitions {
            wanted.add_partition(&topic, *partition);
        }
        let mut positions = Vec::with_capacity(partitions.len());
        {
            // Dropped before the consumer: a list from `committed_offsets`
            // outliving it makes the consumer's drop hang.
            let committed = consumer
                .committed_offsets(wanted, timeout)
                .map_err(asking(format!("committed offsets of group {group}")))?;
            for partition in partitions {
                let (low, high) = consumer
                    .fetch_watermarks(&topic, partition, timeout)
                    .map_err(asking(format!("watermarks of {topic}/{partition}")))?;
                let committed = match committed
                    .find_partition(&topic, partition)
                    .map(|p| p.offset())
                {
                    Some(Offset::Offset(offset)) => Some(offset),
                    _ => None,
                };
                positions.push(GroupPosition {
                    partition,
                    low,
                    high,
                    committed,
                });
            }
        }
        Ok(positions)
    })
    .await
    .map_err(task("reading a group's offsets"))?
}

/// A message read back from a topic.
#[derive(Debug, Clone)]
pub struct RetainedMessage {
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// The message's time, in milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
}

/// Reads retained messages back, one range of one partition at a time,
/// with one client for all of them.
pub struct RetainedReader {
    brokers: String,
    consumer: Option<BaseConsumer>,
    /// Where the client's assignment stands: (topic, partition, the next
    /// offset it delivers). A read that goes on from there polls on,
    /// without assigning again (which restarts fetching, about half a
    /// second each time).
    at: Option<(String, i32, i64)>,
}

impl RetainedReader {
    pub fn new(brokers: &str) -> RetainedReader {
        RetainedReader {
            brokers: brokers.to_string(),
            consumer: None,
            at: None,
        }
    }

    /// Up to `max` messages of `topic`/`partition` from offset `from` to
    /// `to` (exclusive), in order; and the partition's low watermark now
    /// (messages below it are past retention: reading starts there).
    pub async fn read(
        &mut self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
        max: i64,
    ) -> Result<(Vec<RetainedMessage>, i64), BrokerError> {
        const TIMEOUT: Duration = Duration::from_secs(5);
        let consumer = match self.consumer.take() {
            Some(consumer) => consumer,
            // Fetches answer at once: a long-polling fetch at a partition's
            // end would hold the next range's first fetch for up to its
            // wait (500 ms by default).
            None => client_config(&self.brokers)
                .set("group.id", "laurel-backfill")
                .set("enable.auto.commit", "false")
                .set("enable.partition.eof", "true")
                .set("fetch.wait.max.ms", "10")
                .create()
                .map_err(asking(format!("Kafka client for {}", self.brokers)))?,
        };
        let topic = topic.to_string();
        let assigned = match &self.at {
            Some((t, p, next)) if *t == topic && *p == partition => Some(*next),
            _ => None,
        };
        let (result, consumer, topic) = tokio::task::spawn_blocking(move || {
            let result = read_range(
                &consumer,
                &topic,
                partition,
                (from, to, max),
                assigned,
                TIMEOUT,
            );
            (result, consumer, topic)
        })
        .await
        .map_err(task("reading retained messages"))?;
        // A client that failed is made anew next time.
        match result {
            Ok((found, low, next)) => {
                self.consumer = Some(consumer);
                self.at = next.map(|next| (topic, partition, next));
                Ok((found, low))
            }
            Err(error) => {
                self.at = None;
                Err(error)
            }
        }
    }
}

/// Reads `[from, to)` (at most `max`) of one partition. `assigned`: the
/// next offset the client delivers, if it is assigned to this partition.
/// Returns the messages, the low watermark, and where the client stands
/// after (None: it must be assigned again).
fn read_range(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    (from, to, max): (i64, i64, i64),
    assigned: Option<i64>,
    timeout: Duration,
) -> Result<(Vec<RetainedMessage>, i64, Option<i64>), BrokerError> {
    let (low, _) = consumer
        .fetch_watermarks(topic, partition, timeout)
        .map_err(asking(format!("watermarks of {topic}/{partition}")))?;
    let start = from.max(low);
    let end = to.min(start + max);
    let mut found = Vec::new();
    if start >= end {
        return Ok((found, low, assigned));
    }
    if assigned != Some(start) {
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(topic, partition, Offset::Offset(start))
            .map_err(asking(format!("offsets of {topic}/{partition}")))?;
        consumer
            .assign(&assignment)
            .map_err(asking(format!("reading {topic}/{partition}")))?;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut next = start;
    // The client delivers on from `next` unless a message was passed over.
    let mut continues = true;
    while next < end {
        if std::time::Instant::now() > deadline {
            return Err(BrokerError::Task {
                asking: "reading retained messages",
                reason: format!(
                    "{topic}/{partition}: offsets {next}..{end} did not arrive within 30 s"
                ),
            });
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                // Left from an earlier range, or before this one.
                if message.topic() != topic
                    || message.partition() != partition
                    || message.offset() < next
                {
                    continue;
                }
                if message.offset() >= end {
                    continues = false;
                    break;
                }
                next = message.offset() + 1;
                found.push(RetainedMessage {
                    offset: message.offset(),
                    key: message.key().map(<[u8]>::to_vec),
                    value: message.payload().map(<[u8]>::to_vec),
                    timestamp_ms: message.timestamp().to_millis(),
                });
            }
            // The end of what the partition holds (offsets past the last
            // message are markers, not messages).
            Some(Err(KafkaError::PartitionEOF(p))) if p == partition => {
                continues = false;
                break;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(error)) => {
                return Err(asking(format!("reading {topic}/{partition}"))(error));
            }
            None => {}
        }
    }
    Ok((found, low, continues.then_some(next)))
}
