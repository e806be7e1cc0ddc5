//! A running pipeline for tests: a fresh database, the built-in library,
//! awards, a real Kafka-protocol broker (librdkafka's mock cluster, in this
//! process), and ingest running as in `laurel up`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use laurel::awards::{AwardsSettings, AwardsWorker};
use laurel::catalog::Catalog;
use laurel::ingest::IngestSettings;
use laurel::kafka::{self, LocalBroker};
use laurel::library;
use laurel::registry::Registry;
use laurel::store::Counters;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::{self, TestDb};

/// Counts marker events (type `test.marker`) per user on every source, so a
/// test can wait until everything sent before a marker was processed.
pub const MARKER_AWARD: &str = r#"{
  "id": "test-markers", "title": "Markers",
  "objectives": [{"id": "markers",
    "filters": [{"name": "EventTypeFilter", "config": {"types": ["test.marker"]}}],
    "rule": {"name": "CountRule", "config": {"counter": "markers"}},
    "progress_counter": "markers"}],
  "strategy": {"goal": 1000000, "strategy": [{"objective_id": "markers"}]}
}"#;

pub struct Pipeline {
    pub db: TestDb,
    pub broker: LocalBroker,
    pub producer: kafka::Producer,
    pub registry: Arc<Registry>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    markers: BTreeMap<String, i64>,
    sequence: u64,
    cache: Option<std::path::PathBuf>,
}

pub fn settings(brokers: &str) -> IngestSettings {
    IngestSettings {
        batch_wait: Duration::from_millis(20),
        session_timeout: Duration::from_secs(6),
        ..IngestSettings::new(brokers)
    }
}

impl Pipeline {
    /// Starts with `awards` (JSON array text) plus the marker award, and the
    /// given sources registered.
    pub async fn start(awards: &str, sources: &[&str]) -> Pipeline {
        Self::start_with(awards, sources, |s| s).await
    }

    pub async fn start_with(
        awards: &str,
        sources: &[&str],
        adjust: impl FnOnce(IngestSettings) -> IngestSettings,
    ) -> Pipeline {
        Self::start_full(awards, sources, &[], None, adjust).await
    }

    /// With extra functions pushed before the awards are applied.
    pub async fn start_with_functions(
        awards: &str,
        sources: &[&str],
        functions: &[(&str, Vec<u8>)],
    ) -> Pipeline {
        Self::start_full(awards, sources, functions, None, |s| s).await
    }

    /// As `start_with_functions`, where every runtime of the pipeline keeps
    /// compiled components in `cache` (a new folder of the test's): large
    /// components (Python's) are compiled once, not by each.
    pub async fn start_with_functions_cached(
        awards: &str,
        sources: &[&str],
        functions: &[(&str, Vec<u8>)],
        cache: &std::path::Path,
    ) -> Pipeline {
        Self::start_full(awards, sources, functions, Some(cache.to_path_buf()), |s| s).await
    }

    async fn start_full(
        awards: &str,
        sources: &[&str],
        functions: &[(&str, Vec<u8>)],
        cache: Option<std::path::PathBuf>,
        adjust: impl FnOnce(IngestSettings) -> IngestSettings,
    ) -> Pipeline {
        let db = TestDb::new().await;
        let mut store = db.store().await;
        let runtime = support::runtime_cached(cache.clone());
        library::register(&mut store, &runtime).await.unwrap();
        for (name, bytes) in functions {
            laurel::registry::push(&mut store, &runtime, name, bytes, None)
                .await
                .unwrap();
        }
        let registry = Registry::start(&db.url, runtime).await.unwrap();
        let mut all: Vec<Value> = serde_json::from_str(awards).unwrap();
        all.push(serde_json::from_str(MARKER_AWARD).unwrap());
        laurel::definitions::apply(&mut store, &registry, &Value::Array(all).to_string())
            .await
            .unwrap();
        for source in sources {
            store.add_source(source, None).await.unwrap();
        }
        let broker = LocalBroker::start(None).await.unwrap();
        for source in sources {
            broker.create_topic(&format!("events.{source}"), 4).unwrap();
            broker
                .create_topic(&format!("events.{source}.dead"), 1)
                .unwrap();
        }
        let producer = kafka::producer(broker.bootstrap_servers()).unwrap();
        let catalog = Catalog::start(&db.url).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let url = db.url.clone();
        let ingest_cache = cache.clone();
        let ingest_settings = adjust(settings(broker.bootstrap_servers()));
        let task = tokio::spawn(async move {
            laurel::cli::ingest_and_backfill(
                ingest_settings,
                &url,
                own_registry(&url, ingest_cache).await,
                catalog,
                async {
                    let _ = stopped.await;
                },
            )
            .await
        });
        Pipeline {
            db,
            broker,
            producer,
            registry,
            stop: Some(stop),
            task: Some(task),
            markers: BTreeMap::new(),
            sequence: 0,
            cache,
        }
    }

    /// Publishes one event (key = its user id) to `events.<source>`.
    pub async fn send(&self, event: &Value) {
        let source = event["source"].as_str().unwrap();
        let user = event["user_id"].as_str().unwrap_or_default();
        self.send_raw(source, Some(user.as_bytes()), event.to_string().as_bytes())
            .await;
    }

    pub async fn send_raw(&self, source: &str, key: Option<&[u8]>, payload: &[u8]) {
        kafka::publish(
            &self.producer,
            &format!("events.{source}"),
            key,
            payload,
            &[],
        )
        .await
        .unwrap();
    }

    /// Sends a marker for `user` on `source` and waits until it is counted:
    /// everything sent before it for that user on that source is processed.
    pub async fn settle(&mut self, source: &str, user: &str) {
        self.sequence += 1;
        let marker = json!({
            "id": format!("marker-{}-{}", self.sequence, user), "source": source, "type": "test.marker",
            "user_id": user, "authorized": true, "occurred_at": "2026-12-01T00:00:00Z", "payload": {}
        });
        self.send(&marker).await;
        let expected = self.markers.entry(user.to_string()).or_insert(0);
        *expected += 1;
        let expected = *expected;
        let this: &Pipeline = self;
        this.wait_until(&format!("marker {expected} of {user}"), || async move {
            let counters = this.counters(user).await;
            counters
                .get(&("test-markers".to_string(), "markers".to_string()))
                .and_then(|c| c.get("markers"))
                .copied()
                == Some(expected)
        })
        .await;
    }

    pub async fn wait_until<F, Fut>(&self, what: &str, mut condition: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !condition().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// A user's counters by (award, objective), zeros left out.
    pub async fn counters(&self, user: &str) -> BTreeMap<(String, String), Counters> {
        let sql = self.db.sql().await;
        let rows = sql
            .query(
                "SELECT award_id, objective_id, counters FROM user_objective WHERE user_id = $1",
                &[&user],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| {
                let counters: Value = r.get(2);
                let counters: Counters = counters
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_i64().unwrap()))
                    .filter(|(_, v)| *v != 0)
                    .collect();
                ((r.get(0), r.get(1)), counters)
            })
            .collect()
    }

    /// One objective's counters (zeros left out).
    pub async fn objective(&self, user: &str, award: &str, objective: &str) -> Counters {
        self.counters(user)
            .await
            .remove(&(award.to_string(), objective.to_string()))
            .unwrap_or_default()
    }

    /// Processing-log rows for a user: (event_id, outcome, reason).
    pub async fn log(&self, user: &str) -> Vec<(Option<String>, String, Option<String>)> {
        let sql = self.db.sql().await;
        sql.query(
            "SELECT event_id, outcome, reason FROM processing_log WHERE user_id = $1 AND coalesce(award_id, '') <> 'test-markers' ORDER BY id",
            &[&user],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
    }

    /// Open dead letters, oldest first: (event id, `award/objective` for a
    /// hold or None for a whole event, reason).
    pub async fn dead_letters(&self) -> Vec<(Option<String>, Option<String>, String)> {
        let sql = self.db.sql().await;
        sql.query(
            "SELECT event_id, award_id || '/' || objective_id, reason FROM dead_letters
             WHERE replayed_at IS NULL ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
    }

    /// An awards worker on this pipeline's database, with a registry and a
    /// catalog of its own (as a separate process would have).
    pub async fn awards_worker(&self) -> AwardsWorker {
        awards_worker_cached(&self.db.url, AwardsSettings::default(), self.cache.clone()).await
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
        self.db.drop_database().await;
    }
}

pub async fn awards_worker(url: &str, settings: AwardsSettings) -> AwardsWorker {
    awards_worker_cached(url, settings, None).await
}

async fn awards_worker_cached(
    url: &str,
    settings: AwardsSettings,
    cache: Option<std::path::PathBuf>,
) -> AwardsWorker {
    let catalog = Catalog::start(url).await.unwrap();
    AwardsWorker::new(url, own_registry(url, cache).await, catalog, settings)
        .await
        .unwrap()
}

/// Ingest gets a registry of its own, as a separate process would (with
/// the pipeline's compile cache, if it has one).
async fn own_registry(url: &str, cache: Option<std::path::PathBuf>) -> Arc<Registry> {
    Registry::start(url, support::runtime_cached(cache))
        .await
        .unwrap()
}

/// An event of the contract's shape.
pub fn event(
    id: &str,
    source: &str,
    user: &str,
    content: Option<(&str, &str)>,
    tick: u32,
    payload: Value,
) -> Value {
    let mut e = json!({
        "id": id, "source": source, "type": format!("{source}.changed"), "user_id": user, "authorized": true,
        "occurred_at": format!("2026-12-01T10:{:02}:{:02}Z", tick / 60, tick % 60), "payload": payload
    });
    if let Some((content_id, status)) = content {
        e["content_id"] = content_id.into();
        e["status"] = status.into();
    }
    e
}

/// Reads `count` messages from a topic (all partitions, from the start) and
/// returns each one's `laurel-reason` header.
pub async fn dead_letters(brokers: &str, topic: &str, count: usize) -> Vec<String> {
    dead_letter_messages(brokers, topic, count)
        .await
        .into_iter()
        .map(|(_, reason, _)| reason)
        .collect()
}

/// Reads `count` messages from a topic (all partitions, from the start):
/// each one's key, `laurel-reason` header and value size.
pub async fn dead_letter_messages(
    brokers: &str,
    topic: &str,
    count: usize,
) -> Vec<(Option<Vec<u8>>, String, usize)> {
    messages_with_header(brokers, topic, "laurel-reason", count).await
}

/// The first `count` messages of `topic`: (key, header `name`'s value,
/// value length).
pub async fn messages_with_header(
    brokers: &str,
    topic: &str,
    name: &str,
    count: usize,
) -> Vec<(Option<Vec<u8>>, String, usize)> {
    whole_messages(brokers, topic, count)
        .await
        .into_iter()
        .map(|message| {
            let value = message
                .headers
                .iter()
                .find(|(header, _)| header == name)
                .map(|(_, value)| value.clone())
                .unwrap_or_default();
            (message.key, value, message.value_len)
        })
        .collect()
}

/// A message as a test reads it whole: its key, every header, the size of
/// its value.
pub struct WholeMessage {
    pub key: Option<Vec<u8>>,
    pub headers: Vec<(String, String)>,
    pub value_len: usize,
}

/// The first `count` messages of `topic` (all partitions, from the start),
/// whole.
pub async fn whole_messages(brokers: &str, topic: &str, count: usize) -> Vec<WholeMessage> {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::{Headers, Message};
    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("test-reader-{topic}-{}", rand_suffix()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut found: Vec<WholeMessage> = Vec::new();
    while found.len() < count {
        let message = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .unwrap_or_else(|_| {
                let reasons: Vec<&str> = found
                    .iter()
                    .flat_map(|m| &m.headers)
                    .filter(|(name, _)| name == "laurel-reason")
                    .map(|(_, reason)| reason.as_str())
                    .collect();
                panic!(
                    "only {} of {count} messages arrived on {topic} in 60 s: {reasons:?}",
                    found.len()
                )
            })
            .unwrap();
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        let value = String::from_utf8_lossy(h.value.unwrap_or_default());
                        (h.key.to_string(), value.into_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        found.push(WholeMessage {
            key: message.key().map(<[u8]>::to_vec),
            headers,
            value_len: message.payload().map_or(0, <[u8]>::len),
        });
    }
    found
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Produces `value` to `topic` with one header whose name is `name`'s
/// bytes, as any producer can send them: rdkafka's API names headers with
/// a `&str`, so a name that is not UTF-8 is made through librdkafka's own.
pub fn produce_with_header_named(brokers: &str, topic: &str, value: &[u8], name: &[u8]) {
    use rdkafka::bindings as rdsys;
    use rdkafka::producer::{BaseProducer, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let topic = std::ffi::CString::new(topic).unwrap();
    let vu = |vtype, u| rdsys::rd_kafka_vu_t { vtype, u };
    // SAFETY: the headers are given to librdkafka, which owns them once
    // the call succeeds; the value and name are copied (MSG_F_COPY).
    unsafe {
        let headers = rdsys::rd_kafka_headers_new(1);
        rdsys::rd_kafka_header_add(
            headers,
            name.as_ptr().cast(),
            name.len() as isize,
            b"v".as_ptr().cast(),
            1,
        );
        let fields = [
            vu(
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_TOPIC,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    cstr: topic.as_ptr(),
                },
            ),
            vu(
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    mem: rdsys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                        ptr: value.as_ptr() as *mut _,
                        size: value.len(),
                    },
                },
            ),
            vu(
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_MSGFLAGS,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 {
                    i: rdsys::RD_KAFKA_MSG_F_COPY,
                },
            ),
            vu(
                rdsys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADERS,
                rdsys::rd_kafka_vu_s__bindgen_ty_1 { headers },
            ),
        ];
        let error = rdsys::rd_kafka_produceva(
            producer.client().native_ptr(),
            fields.as_ptr(),
            fields.len(),
        );
        assert!(error.is_null(), "producing to {topic:?} failed");
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}
