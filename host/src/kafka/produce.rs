//! A producer whose acknowledgements are read by a task of ours, woken by
//! librdkafka when one arrives, instead of by a thread of its own.
//!
//! rdkafka's `FutureProducer` keeps a thread that polls for
//! acknowledgements in 100 ms rounds, and each round ends in a busy wait:
//! once less than a millisecond is left, it asks librdkafka for 0 ms until
//! the round is over. That was 6.5% of the pre-filter's core, and the
//! largest CPU user of an idle process (three such threads). Here the
//! producer's event queue calls us when it goes from empty to not empty;
//! a tokio task then takes everything on it, and sleeps until told again.

use std::ffi::c_void;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::bindings as rdsys;
use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer as _, ProducerContext};
use tokio::sync::{Notify, oneshot};

use super::queue_not_empty;

/// How long a send waits for room in the producer's queue
/// (`queue.buffering.max.messages`) before it fails.
const ROOM_PATIENCE: Duration = Duration::from_secs(30);

/// Events taken in one go before the task lets others run.
const EVENTS_AT_ONCE: usize = 1024;

/// Where the broker wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: i32,
    pub offset: i64,
}

type Acknowledgement = oneshot::Sender<Result<Delivered, KafkaError>>;

/// Hands each acknowledgement to the send that waits for it.
struct Acknowledgements;

impl ClientContext for Acknowledgements {}

impl ProducerContext for Acknowledgements {
    type DeliveryOpaque = Box<Acknowledgement>;

    fn delivery(&self, result: &DeliveryResult<'_>, waiting: Self::DeliveryOpaque) {
        let outcome = match result {
            Ok(message) => Ok(Delivered {
                partition: message.partition(),
                offset: message.offset(),
            }),
            Err((error, _)) => Err(error.clone()),
        };
        // The send may have been given up on; then no one is waiting.
        let _ = waiting.send(outcome);
    }
}

/// A producer that waits for acknowledgements without a thread of its
/// own. Cloning is cheap and shares the producer.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<Inner>,
}

struct Inner {
    producer: BaseProducer<Acknowledgements>,
    /// The producer's event queue (acknowledgements, errors, logs).
    events: *mut rdsys::rd_kafka_queue_t,
    /// Told when `events` goes from empty to not empty.
    ready: Arc<Notify>,
}

// SAFETY: librdkafka's queues are locked inside; `events` is released
// once, when Inner is dropped.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

impl Producer {
    /// Creates the producer, and the task that reads its acknowledgements
    /// on the current tokio runtime.
    pub fn create(config: &ClientConfig) -> Result<Producer, KafkaError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            KafkaError::ClientCreation("a producer needs a tokio runtime to run on".into())
        })?;
        let producer: BaseProducer<Acknowledgements> =
            config.create_with_context(Acknowledgements)?;
        let ready = Arc::new(Notify::new());
        // SAFETY: the client is live; the handle is released in Drop, after
        // the callback is removed, and before the client is destroyed.
        let events = unsafe {
            let events = rdsys::rd_kafka_queue_get_main(producer.client().native_ptr());
            let opaque = Arc::as_ptr(&ready) as *mut c_void;
            rdsys::rd_kafka_queue_cb_event_enable(events, Some(queue_not_empty), opaque);
            events
        };
        let inner = Arc::new(Inner {
            producer,
            events,
            ready: ready.clone(),
        });
        runtime.spawn(read_acknowledgements(Arc::downgrade(&inner), ready));
        Ok(Producer { inner })
    }

    /// Sends one message and waits until the broker acknowledged it (or
    /// librdkafka gave up on it: `message.timeout.ms`).
    pub async fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: Option<&[u8]>,
        headers: Option<OwnedHeaders>,
    ) -> Result<Delivered, KafkaError> {
        let (waiting, acknowledged) = oneshot::channel();
        let mut record: BaseRecord<'_, [u8], [u8], Box<Acknowledgement>> =
            BaseRecord::with_opaque_to(topic, Box::new(waiting));
        record.key = key;
        record.payload = payload;
        record.headers = headers;
        let since = Instant::now();
        loop {
            match self.inner.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if since.elapsed() < ROOM_PATIENCE =>
                {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((error, _)) => return Err(error),
            }
        }
        acknowledged.await.unwrap_or(Err(KafkaError::Canceled))
    }

    /// The error that made the producer unusable, if one did (e.g. an
    /// idempotent producer whose broker lost its state).
    pub fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.inner.producer.client().fatal_error()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the handle is live until here. Removing the callback
        // takes the queue's lock, so none is running once this returns.
        unsafe {
            rdsys::rd_kafka_queue_cb_event_enable(self.events, None, std::ptr::null_mut());
            rdsys::rd_kafka_queue_destroy(self.events);
        }
        // The reader finds the producer gone and ends. The producer itself
        // is dropped next: what is still queued is purged, and its sends
        // are told so.
        self.ready.notify_one();
    }
}

/// Takes every event off the producer's queue whenever it has some, until
/// the producer is dropped.
async fn read_acknowledgements(producer: Weak<Inner>, ready: Arc<Notify>) {
    loop {
        let Some(inner) = producer.upgrade() else {
            return;
        };
        let mut taken = 0;
        // SAFETY: the handle is live while `inner` is.
        while taken < EVENTS_AT_ONCE && unsafe { rdsys::rd_kafka_queue_length(inner.events) } > 0 {
            // One event, without waiting: an acknowledgement's senders are
            // told here, on this task.
            inner.producer.poll(Duration::ZERO);
            taken += 1;
        }
        drop(inner);
        if taken == EVENTS_AT_ONCE {
            // Others get the worker between long runs.
            tokio::task::yield_now().await;
        } else {
            // An event that arrives after the length above was read finds
            // the queue empty and calls us, so this returns at once.
            ready.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rdkafka::ClientConfig;
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};

    use super::Producer;
    use crate::kafka::{LocalBroker, producer_lingering};

    #[tokio::test]
    async fn every_send_is_told_its_own_acknowledgement() {
        let broker = LocalBroker::start(None).await.unwrap();
        broker.create_topic("acks", 1).unwrap();
        let producer = producer_lingering(broker.bootstrap_servers(), 0).unwrap();
        let sends = (0..2000).map(|n: i32| {
            let producer = producer.clone();
            async move {
                let value = n.to_string();
                producer
                    .send("acks", Some(b"k"), Some(value.as_bytes()), None)
                    .await
            }
        });
        let offsets: BTreeSet<i64> = futures_util::future::join_all(sends)
            .await
            .into_iter()
            .map(|delivered| delivered.unwrap().offset)
            .collect();
        assert_eq!(offsets, (0..2000).collect::<BTreeSet<i64>>());
    }

    #[tokio::test]
    async fn a_message_no_broker_takes_fails_with_why() {
        let producer = Producer::create(
            ClientConfig::new()
                .set("bootstrap.servers", "127.0.0.1:9")
                .set("message.timeout.ms", "300")
                .set("log_level", "0"),
        )
        .unwrap();
        let error = producer
            .send("nowhere", None, Some(b"x"), None)
            .await
            .unwrap_err();
        assert_eq!(
            error,
            KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut)
        );
    }

    #[tokio::test]
    async fn its_reader_ends_with_the_producer() {
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        let producer = Producer::create(ClientConfig::new().set("log_level", "0")).unwrap();
        let copy = producer.clone();
        assert_eq!(metrics.num_alive_tasks(), before + 1);
        drop(producer);
        tokio::task::yield_now().await;
        assert_eq!(
            metrics.num_alive_tasks(),
            before + 1,
            "a copy still uses it"
        );
        drop(copy);
        for _ in 0..100 {
            if metrics.num_alive_tasks() == before {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the reader of a dropped producer is still alive");
    }

    #[test]
    fn it_needs_a_runtime_and_says_so() {
        let error = Producer::create(&ClientConfig::new()).err().unwrap();
        assert!(
            error.to_string().contains("needs a tokio runtime"),
            "{error}"
        );
    }
}
