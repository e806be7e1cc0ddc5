//! A group consumer whose records are read in batches from a queue of our
//! own, and a view of one record that does not trust its headers.
//!
//! rdkafka hands out one message per poll of the consumer's queue, and
//! each poll reads the clock four times and takes the queue's lock: a
//! quarter of the pre-filter's time went there. librdkafka's batch call
//! (`rd_kafka_consume_batch_queue`) cannot read the consumer's own queue
//! here: rdkafka uses the event API without a rebalance callback, and a
//! rebalance met inside a batch call is answered by unassigning every
//! partition. So each partition's fetch queue is forwarded, before the
//! partition is assigned, to a queue of our own that holds nothing but
//! records, read in batches; rebalances, errors and commits stay on the
//! consumer's queue, which the reader polls too ([`GroupConsumer::poll`]).
//! A seek or a pause leaves the records already forwarded outdated, and
//! librdkafka's batch call drops them as the consumer's queue would.
//!
//! Header names are bytes on the wire; rdkafka's iterators panic on one
//! that is not UTF-8. [`Record::headers`] gives them as bytes.

use std::borrow::Cow;
use std::ffi::{CStr, CString, c_void};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders, OwnedMessage};
use rdkafka::{ClientContext, Timestamp, TopicPartitionList};
use tokio::sync::Notify;
use tracing::warn;

use super::queue_not_empty;

/// Pauses partitions assigned while the consumer is paused, and forwards
/// each partition's fetch queue to ours before it is assigned.
pub(super) struct PauseContext {
    paused: Arc<AtomicBool>,
    fetched: Arc<FetchQueue>,
    topic: Arc<TopicWatch>,
}

impl PauseContext {
    pub(super) fn new(
        paused: Arc<AtomicBool>,
        fetched: Arc<FetchQueue>,
        topic: Arc<TopicWatch>,
    ) -> PauseContext {
        PauseContext {
            paused,
            fetched,
            topic,
        }
    }
}

impl ClientContext for PauseContext {
    /// A subscribed topic that does not exist yet (no producer created it)
    /// is a state the consumer waits in, said once; other global errors
    /// are errors.
    fn error(&self, error: KafkaError, reason: &str) {
        if is_missing_topic(&error) || reason.contains("topic not available") {
            self.topic.missing();
        } else {
            tracing::error!(message = "Kafka client error.", consumer = %self.topic.what, %error, reason);
        }
    }
}

/// Whether `error` says a topic does not exist.
pub(super) fn is_missing_topic(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic)
    )
}

/// Whether a consumer's topic exists, as far as it has seen: a missing
/// one is said once (info), and its coming into being once.
pub(super) struct TopicWatch {
    pub(super) topic: String,
    /// Names the consumer in the log ("source photos").
    pub(super) what: String,
    waiting: AtomicBool,
}

impl TopicWatch {
    pub(super) fn new(topic: &str, what: &str) -> Arc<TopicWatch> {
        Arc::new(TopicWatch {
            topic: topic.to_string(),
            what: what.to_string(),
            waiting: AtomicBool::new(false),
        })
    }

    /// The topic was found missing.
    pub(super) fn missing(&self) {
        if !self.waiting.swap(true, Ordering::AcqRel) {
            tracing::info!(message = %format!("Waiting for topic {}: nothing was produced to it yet.", self.topic), consumer = %self.what);
        }
    }

    /// Records arrived from the topic.
    pub(super) fn present(&self) {
        if self.waiting.load(Ordering::Acquire) && self.waiting.swap(false, Ordering::AcqRel) {
            tracing::info!(message = %format!("Topic {} exists now.", self.topic), consumer = %self.what);
        }
    }
}

impl ConsumerContext for PauseContext {
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

/// Records read in one batch call at most: a batch passes
/// LAUREL_BATCH_MAX_BYTES by at most one such read.
const READ_AT_ONCE: usize = 64;

/// Our queue, shared by the consumer's context (which forwards partitions
/// to it) and its reader; None once closed.
pub(super) struct FetchQueue {
    queue: Mutex<Option<NativeQueue>>,
    /// Told when the queue goes from empty to not empty.
    ready: Arc<Notify>,
}

struct NativeQueue(*mut rdsys::rd_kafka_queue_t);

// SAFETY: librdkafka's queues are locked inside; the pointer is only used
// under FetchQueue's mutex and destroyed once, when taken out of it.
unsafe impl Send for NativeQueue {}

impl FetchQueue {
    pub(super) fn new() -> Arc<FetchQueue> {
        Arc::new(FetchQueue {
            queue: Mutex::new(None),
            ready: Arc::new(Notify::new()),
        })
    }

    /// Makes the queue, on `consumer`'s client, before it subscribes.
    fn open(&self, consumer: &StreamConsumer<PauseContext>) {
        let rk = consumer.client().native_ptr();
        // SAFETY: `rk` is a live consumer; the queue is destroyed in
        // `close`, before the consumer is.
        let queue = unsafe { rdsys::rd_kafka_queue_new(rk) };
        let opaque = Arc::as_ptr(&self.ready) as *mut c_void;
        // SAFETY: the Notify lives as long as `self`, which outlives the
        // queue (closed when its GroupConsumer is dropped).
        unsafe { rdsys::rd_kafka_queue_cb_event_enable(queue, Some(queue_not_empty), opaque) };
        *self.lock() = Some(NativeQueue(queue));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<NativeQueue>> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Forwards the fetch queues of `partitions`, about to be assigned, to
    /// ours. A partition that cannot be forwarded stays on the consumer's
    /// queue, which is read too.
    pub(super) fn forward(
        &self,
        consumer: &BaseConsumer<PauseContext>,
        partitions: &TopicPartitionList,
    ) {
        let guard = self.lock();
        let Some(queue) = guard.as_ref() else { return };
        let rk = consumer.client().native_ptr();
        for element in partitions.elements() {
            let Ok(topic) = CString::new(element.topic()) else {
                continue;
            };
            // SAFETY: `rk` is live (we are in its rebalance callback); the
            // partition queue handle is released right after forwarding.
            unsafe {
                let partition =
                    rdsys::rd_kafka_queue_get_partition(rk, topic.as_ptr(), element.partition());
                if partition.is_null() {
                    warn!(
                        message = "A partition could not be read in batches; it is read one record at a time.",
                        topic = element.topic(),
                        partition = element.partition()
                    );
                    continue;
                }
                rdsys::rd_kafka_queue_forward(partition, queue.0);
                rdsys::rd_kafka_queue_destroy(partition);
            }
        }
    }

    /// Waits until the queue holds something (returns at once if it does).
    pub(super) async fn ready(&self) {
        loop {
            let len = match self.lock().as_ref() {
                // SAFETY: the queue is live while in the mutex.
                Some(queue) => unsafe { rdsys::rd_kafka_queue_length(queue.0) },
                None => 0,
            };
            if len > 0 {
                return;
            }
            self.ready.notified().await;
        }
    }

    /// Takes up to `max` records already here, without waiting, giving each
    /// to `each` (a record that is an error as Err); returns how many.
    pub(super) fn read(
        &self,
        max: usize,
        mut each: impl FnMut(Result<Record<'_>, KafkaError>),
    ) -> usize {
        let guard = self.lock();
        let Some(queue) = guard.as_ref() else {
            return 0;
        };
        let mut messages = [std::ptr::null_mut::<rdsys::rd_kafka_message_t>(); READ_AT_ONCE];
        let max = max.min(READ_AT_ONCE);
        // SAFETY: the queue is live; `messages` has room for `max`.
        let n =
            unsafe { rdsys::rd_kafka_consume_batch_queue(queue.0, 0, messages.as_mut_ptr(), max) };
        let n = usize::try_from(n).unwrap_or(0);
        for &message in &messages[..n] {
            // SAFETY: librdkafka gave us the message; it is destroyed once,
            // below, after `each` (which cannot keep the borrow).
            unsafe {
                each(Record::checked(&*message));
                rdsys::rd_kafka_message_destroy(message);
            }
        }
        n
    }

    /// Destroys the queue; records forwarded later are dropped by
    /// librdkafka. Safe to call more than once.
    fn close(&self) {
        if let Some(queue) = self.lock().take() {
            // SAFETY: taken out of the mutex, so used by no one else.
            unsafe {
                rdsys::rd_kafka_queue_cb_event_enable(queue.0, None, std::ptr::null_mut());
                rdsys::rd_kafka_queue_destroy(queue.0);
            }
        }
    }
}

/// A consumer group member whose records come through its [`FetchQueue`].
pub(super) struct GroupConsumer {
    consumer: StreamConsumer<PauseContext>,
    fetched: Arc<FetchQueue>,
}

impl GroupConsumer {
    /// `consumer`, not yet subscribed, whose context forwards to `fetched`.
    pub(super) fn new(
        consumer: StreamConsumer<PauseContext>,
        fetched: Arc<FetchQueue>,
    ) -> GroupConsumer {
        fetched.open(&consumer);
        GroupConsumer { consumer, fetched }
    }

    pub(super) fn fetched(&self) -> &FetchQueue {
        &self.fetched
    }
}

impl Deref for GroupConsumer {
    type Target = StreamConsumer<PauseContext>;

    fn deref(&self) -> &Self::Target {
        &self.consumer
    }
}

impl Drop for GroupConsumer {
    fn drop(&mut self) {
        // Before the consumer: our queue must go before its client.
        self.fetched.close();
    }
}

/// One consumed record, borrowed from librdkafka.
#[derive(Clone, Copy)]
pub struct Record<'a> {
    message: &'a rdsys::rd_kafka_message_t,
}

impl<'a> Record<'a> {
    /// The record, or the error librdkafka delivered in its place.
    fn checked(message: &'a rdsys::rd_kafka_message_t) -> Result<Record<'a>, KafkaError> {
        match message.err {
            rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => Ok(Record { message }),
            rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__PARTITION_EOF => {
                Err(KafkaError::PartitionEOF(message.partition))
            }
            code => Err(KafkaError::MessageConsumption(RDKafkaErrorCode::from(code))),
        }
    }

    /// A record rdkafka read from the consumer's own queue.
    pub(super) fn borrowed(message: &'a BorrowedMessage<'_>) -> Record<'a> {
        // SAFETY: the message lives as long as the borrow.
        Record {
            message: unsafe { &*message.ptr() },
        }
    }

    pub fn partition(&self) -> i32 {
        self.message.partition
    }

    pub fn offset(&self) -> i64 {
        self.message.offset
    }

    pub fn key(&self) -> Option<&'a [u8]> {
        // SAFETY: librdkafka's key pointer and length describe one buffer
        // that lives as long as the message.
        unsafe { bytes(self.message.key, self.message.key_len) }
    }

    pub fn payload(&self) -> Option<&'a [u8]> {
        // SAFETY: as for the key.
        unsafe { bytes(self.message.payload, self.message.len) }
    }

    /// The value's and key's bytes (what counts toward a batch's bytes).
    pub fn size(&self) -> usize {
        self.message.len + self.message.key_len
    }

    pub fn topic(&self) -> Cow<'a, str> {
        if self.message.rkt.is_null() {
            return Cow::Borrowed("");
        }
        // SAFETY: a consumed message's topic handle and name live as long
        // as the message.
        unsafe { CStr::from_ptr(rdsys::rd_kafka_topic_name(self.message.rkt)) }.to_string_lossy()
    }

    fn timestamp(&self) -> Timestamp {
        let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        let ptr = self.message as *const rdsys::rd_kafka_message_t;
        // SAFETY: a live message.
        let at = unsafe { rdsys::rd_kafka_message_timestamp(ptr, &mut kind) };
        match kind {
            _ if at == -1 => Timestamp::NotAvailable,
            rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_CREATE_TIME => {
                Timestamp::CreateTime(at)
            }
            rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME => {
                Timestamp::LogAppendTime(at)
            }
            rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE => {
                Timestamp::NotAvailable
            }
        }
    }

    /// Its headers in order, names as the bytes they are (a producer can
    /// send any); None for a header without a value.
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + use<'a> {
        let mut headers = std::ptr::null_mut();
        let ptr = self.message as *const rdsys::rd_kafka_message_t;
        // SAFETY: a live message; its parsed headers live as long as it.
        let found = unsafe { rdsys::rd_kafka_message_headers(ptr, &mut headers) };
        let count = if found == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            && !headers.is_null()
        {
            // SAFETY: as above.
            unsafe { rdsys::rd_kafka_header_cnt(headers) }
        } else {
            0
        };
        (0..count).filter_map(move |index| {
            let (mut name, mut value, mut size) = (std::ptr::null(), std::ptr::null(), 0);
            // SAFETY: `index` is below the count of headers that live as
            // long as the message ('a); a name is NUL-terminated.
            unsafe {
                let got = rdsys::rd_kafka_header_get_all(
                    headers, index, &mut name, &mut value, &mut size,
                );
                (got == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| {
                    (
                        CStr::from_ptr(name).to_bytes(),
                        bytes(value.cast_mut(), size),
                    )
                })
            }
        })
    }

    /// A copy that outlives the consumer; a header name that is not UTF-8
    /// is kept with U+FFFD in place of what is not.
    pub fn detach(&self) -> OwnedRecord {
        let headers: Vec<_> = self.headers().collect();
        let headers = (!headers.is_empty()).then(|| {
            headers.iter().fold(
                OwnedHeaders::new_with_capacity(headers.len()),
                |all, (name, value)| {
                    all.insert(Header {
                        key: &String::from_utf8_lossy(name),
                        value: *value,
                    })
                },
            )
        });
        OwnedRecord(OwnedMessage::new(
            self.payload().map(<[u8]>::to_vec),
            self.key().map(<[u8]>::to_vec),
            self.topic().into_owned(),
            self.timestamp(),
            self.partition(),
            self.offset(),
            headers,
        ))
    }

    /// Its timestamp in milliseconds, if it has one.
    pub fn timestamp_ms(&self) -> Option<i64> {
        self.timestamp().to_millis()
    }
}

/// A consumed record that outlives its consumer.
pub struct OwnedRecord(OwnedMessage);

impl OwnedRecord {
    pub fn topic(&self) -> &str {
        self.0.topic()
    }

    pub fn partition(&self) -> i32 {
        self.0.partition()
    }

    pub fn offset(&self) -> i64 {
        self.0.offset()
    }

    pub fn key(&self) -> Option<&[u8]> {
        self.0.key()
    }

    pub fn payload(&self) -> Option<&[u8]> {
        self.0.payload()
    }

    /// Its headers in order; None for a header without a value.
    pub fn headers(&self) -> impl Iterator<Item = (&str, Option<&[u8]>)> {
        self.0
            .headers()
            .into_iter()
            .flat_map(|headers| headers.iter().map(|h| (h.key, h.value)))
    }

    /// The value of its first header named `name`, if it has one.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v)
    }
}

/// The bytes at `at`, or None for a null pointer.
///
/// # Safety
/// `at` must be null or point to `len` readable bytes living for `'a`.
unsafe fn bytes<'a>(at: *mut c_void, len: usize) -> Option<&'a [u8]> {
    if at.is_null() {
        None
    } else {
        // SAFETY: the caller's.
        Some(unsafe { std::slice::from_raw_parts(at as *const u8, len) })
    }
}
