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

mod kafka;
mod plan;

pub use kafka::{
    EventPublisher, LocalBroker, check_brokers, consumer_lag, producer, publish, recent_messages,
};
pub use plan::{Evaluation, Plan};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::{Headers, Message, OwnedMessage};
use rdkafka::producer::FutureProducer;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::catalog::Catalog;
use crate::event::Envelope;
use crate::metrics;
use crate::registry::Registry;
use crate::store::{self, LogEntry, SourceRow, Store};

/// Ingest settings.
#[derive(Debug, Clone)]
pub struct IngestSettings {
    pub brokers: String,
    /// Consumer groups are `<prefix>.<source>`.
    pub group_prefix: String,
    /// Most events in one batch (one transaction).
    pub batch_size: usize,
    /// Longest wait to fill a batch once its first event arrived.
    pub batch_wait: Duration,
    /// Larger messages are dead-lettered.
    pub max_event_bytes: usize,
    pub session_timeout: Duration,
}

impl IngestSettings {
    pub fn new(brokers: impl Into<String>) -> IngestSettings {
        IngestSettings {
            brokers: brokers.into(),
            group_prefix: "laurel".to_string(),
            batch_size: 10_000,
            batch_wait: Duration::from_millis(50),
            max_event_bytes: 1 << 20,
            session_timeout: Duration::from_secs(10),
        }
    }
}

/// What every source consumer shares.
struct Shared {
    settings: IngestSettings,
    database_url: String,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    dead_letters: FutureProducer,
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
    let store = Store::connect(database_url).await?;
    let shared = Arc::new(Shared {
        dead_letters: kafka::producer(&settings.brokers)?,
        settings,
        database_url: database_url.to_string(),
        registry,
        catalog,
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut running: HashMap<String, (Arc<AtomicBool>, JoinHandle<()>)> = HashMap::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        match store.sources().await {
            Ok(sources) => {
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
            Err(error) => warn!(message = "Failed to read sources.", %error),
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = notifications.recv() => {}
            _ = tick.tick() => {}
        }
    }
    info!(message = "Stopping ingest: finishing the batches in hand.");
    let _ = stop_tx.send(true);
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
}

impl ClientContext for SourceContext {}

impl ConsumerContext for SourceContext {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance
            && self.paused.load(Ordering::Acquire)
            && let Err(error) = consumer.pause(partitions)
        {
            warn!(message = "Failed to pause newly assigned partitions.", %error);
        }
    }
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
    consumer: StreamConsumer<SourceContext>,
    store: Store,
    paused: Arc<AtomicBool>,
    is_paused: bool,
    plan: Option<Plan>,
    plan_generation: (u64, u64),
}

/// A decoded message, or why it cannot be used.
enum Decoded {
    Event(Envelope),
    Bad(String),
}

impl SourceConsumer {
    async fn new(
        source: &SourceRow,
        shared: &Arc<Shared>,
        paused: Arc<AtomicBool>,
    ) -> anyhow::Result<SourceConsumer> {
        let settings = &shared.settings;
        let session_ms = settings.session_timeout.as_millis().max(1000);
        let consumer: StreamConsumer<SourceContext> = kafka::client_config(&settings.brokers)
            .set(
                "group.id",
                format!("{}.{}", settings.group_prefix, source.name),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", session_ms.to_string())
            .set("heartbeat.interval.ms", (session_ms / 4).to_string())
            .set("allow.auto.create.topics", "true")
            .set("fetch.wait.max.ms", "20")
            // A topic that appears after the consumer starts is seen soon.
            .set("topic.metadata.refresh.interval.ms", "2000")
            .create_with_context(SourceContext {
                paused: paused.clone(),
            })
            .map_err(|e| {
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
        })
    }

    async fn run(&mut self, mut stop: watch::Receiver<bool>) {
        let mut last_error: Option<String> = None;
        loop {
            if *stop.borrow() {
                break;
            }
            self.follow_pause();
            let first = tokio::select! {
                message = self.consumer.recv() => message,
                _ = stop.changed() => break,
                _ = tokio::time::sleep(Duration::from_millis(250)) => continue,
            };
            let first = match first {
                Ok(message) => {
                    last_error = None;
                    message.detach()
                }
                Err(error) => {
                    // Said once, not every poll: a missing topic (nothing
                    // produced yet) can last.
                    let text = error.to_string();
                    if last_error.as_ref() != Some(&text) {
                        warn!(message = "Kafka error while consuming; retrying.", source = %self.source.name, error = %text);
                        last_error = Some(text);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let mut batch = vec![first];
            let deadline = tokio::time::Instant::now() + self.shared.settings.batch_wait;
            while batch.len() < self.shared.settings.batch_size {
                match tokio::time::timeout_at(deadline, self.consumer.recv()).await {
                    Ok(Ok(message)) => batch.push(message.detach()),
                    Ok(Err(error)) => {
                        warn!(message = "Kafka error while consuming.", source = %self.source.name, %error);
                        break;
                    }
                    Err(_) => break,
                }
            }
            // A batch in hand is finished even when asked to stop: nothing
            // is committed before it is applied, so stopping mid-way would
            // only mean doing it again.
            if let Err(error) = self.process(&batch, &stop).await {
                error!(message = "A batch was not applied; it will be consumed again.", source = %self.source.name, error = %format!("{error:#}"));
                // Go back to the first uncommitted offset of each partition.
                self.rewind(&batch);
            }
        }
        info!(message = "Source consumer stopped.", source = %self.source.name);
    }

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
                self.is_paused = want;
                info!(message = if want { "Source paused." } else { "Source resumed." }, source = %self.source.name);
            }
            Err(error) => {
                warn!(message = "Failed to pause or resume.", source = %self.source.name, %error)
            }
        }
    }

    fn rewind(&self, batch: &[OwnedMessage]) {
        let mut first: HashMap<i32, i64> = HashMap::new();
        for message in batch {
            first
                .entry(message.partition())
                .and_modify(|o| *o = (*o).min(message.offset()))
                .or_insert(message.offset());
        }
        for (partition, offset) in first {
            if let Err(error) = self.consumer.seek(
                &self.source.topic,
                partition,
                Offset::Offset(offset),
                Duration::from_secs(5),
            ) {
                warn!(message = "Failed to rewind; the uncommitted batch comes back after a restart.", source = %self.source.name, %error);
            }
        }
    }

    fn decode(&self, message: &OwnedMessage) -> Decoded {
        let Some(payload) = message.payload() else {
            return Decoded::Bad("empty message: no value".to_string());
        };
        let limit = self.shared.settings.max_event_bytes;
        if payload.len() > limit {
            return Decoded::Bad(format!(
                "message of {} bytes is over the limit of {limit} bytes",
                payload.len()
            ));
        }
        let envelope = match Envelope::parse(payload) {
            Ok(envelope) => envelope,
            Err(error) => return Decoded::Bad(format!("malformed event: {error}")),
        };
        if envelope.source != self.source.name {
            return Decoded::Bad(format!(
                "unknown source `{}`: this topic carries source `{}`",
                envelope.source, self.source.name
            ));
        }
        if envelope.id.is_empty() || envelope.user_id.is_empty() {
            return Decoded::Bad(
                "malformed event: `id` and `user_id` must not be empty".to_string(),
            );
        }
        if let Some(key) = message.key()
            && key != envelope.user_id.as_bytes()
        {
            return Decoded::Bad(format!(
                "message key `{}` is not the event's user_id `{}`",
                String::from_utf8_lossy(key),
                envelope.user_id
            ));
        }
        Decoded::Event(envelope)
    }

    async fn process(
        &mut self,
        batch: &[OwnedMessage],
        stop: &watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let mut log: Vec<LogEntry> = Vec::new();
        let mut dead: Vec<(usize, String)> = Vec::new();
        let mut admitted: Vec<(usize, Envelope)> = Vec::new();
        for (index, message) in batch.iter().enumerate() {
            match self.decode(message) {
                Decoded::Event(envelope) => admitted.push((index, envelope)),
                Decoded::Bad(reason) => dead.push((index, reason)),
            }
        }
        // Who gets no progress.
        let users: Vec<&str> = admitted
            .iter()
            .map(|(_, e)| e.user_id.as_str())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let excluded = self.store.excluded_users(&users).await?;
        admitted.retain(|(_, envelope)| {
            let reason = if !envelope.authorized {
                Some("user not authorized (authorized: false)".to_string())
            } else {
                excluded
                    .get(&envelope.user_id)
                    .map(|state| format!("user is {state}"))
            };
            match reason {
                Some(reason) => {
                    log.push(LogEntry {
                        event_id: Some(envelope.id.clone()),
                        user_id: Some(envelope.user_id.clone()),
                        award_id: None,
                        objective_id: None,
                        outcome: "skipped",
                        reason,
                        functions: None,
                    });
                    false
                }
                None => true,
            }
        });

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
            self.plan_generation = generation;
        }
        let mut plan = self.plan.take().expect("planned above");
        // Batch positions stay here; the envelopes move to the blocking thread.
        let (admitted, envelopes): (Vec<usize>, Vec<Envelope>) = admitted.into_iter().unzip();
        let evaluating = std::time::Instant::now();
        let (plan, evaluation) = tokio::task::spawn_blocking(move || {
            let evaluation = plan.evaluate(&envelopes);
            (plan, evaluation)
        })
        .await?;
        let evaluate_us = evaluating.elapsed().as_micros() as u64;
        self.plan = Some(plan);
        for rejected in &evaluation.rejected {
            dead.push((admitted[rejected.index], rejected.reason.clone()));
        }
        for (index, reason) in &dead {
            let message = &batch[*index];
            if !evaluation
                .rejected
                .iter()
                .any(|r| admitted[r.index] == *index)
            {
                let event_id = message
                    .payload()
                    .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                    .and_then(|v| v.get("id").and_then(|id| id.as_str()).map(str::to_string));
                log.push(LogEntry {
                    event_id,
                    user_id: message
                        .key()
                        .map(|k| String::from_utf8_lossy(k).into_owned()),
                    award_id: None,
                    objective_id: None,
                    outcome: "rejected",
                    reason: reason.clone(),
                    functions: None,
                });
            }
        }
        log.extend(evaluation.log);

        // Dead letters first: once offsets are committed they are the only
        // copy of a bad message.
        let dead_topic = format!("events.{}.dead", self.source.name);
        for (index, reason) in &dead {
            let message = &batch[*index];
            let (partition, offset) = (
                message.partition().to_string(),
                message.offset().to_string(),
            );
            let mut headers = vec![
                ("laurel-reason", reason.as_str()),
                ("laurel-source", self.source.name.as_str()),
                ("laurel-topic", self.source.topic.as_str()),
                ("laurel-partition", partition.as_str()),
                ("laurel-offset", offset.as_str()),
            ];
            let original: Vec<(String, String)> = message
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|header| {
                            (
                                header.key.to_string(),
                                String::from_utf8_lossy(header.value.unwrap_or_default())
                                    .into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            headers.extend(original.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            kafka::publish(
                &self.shared.dead_letters,
                &dead_topic,
                message.key(),
                message.payload().unwrap_or_default(),
                &headers,
            )
            .await?;
            warn!(message = "Event dead-lettered.", source = %self.source.name, partition = message.partition(), offset = message.offset(), reason = %reason);
        }

        // One transaction; retried while the database is unreachable.
        let mut backoff = Duration::from_millis(100);
        let applying = std::time::Instant::now();
        loop {
            match self
                .store
                .apply_batch(&self.source.name, &evaluation.outcomes, &log)
                .await
            {
                Ok(applied) => {
                    let source = [("source", self.source.name.as_str())];
                    metrics::add(
                        metrics::EVENTS_APPLIED,
                        &source,
                        (batch.len() - dead.len()) as u64,
                    );
                    metrics::add(metrics::EVENTS_DEAD_LETTERED, &source, dead.len() as u64);
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
                    break;
                }
                Err(error) if *stop.borrow() => return Err(error.into()),
                Err(error) => {
                    warn!(message = "Applying a batch failed; retrying.", source = %self.source.name, %error);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    if let Ok(store) = Store::connect(&self.shared.database_url).await {
                        self.store = store;
                    }
                }
            }
        }

        // Only now: the offsets.
        let mut offsets = TopicPartitionList::new();
        let mut next: HashMap<i32, i64> = HashMap::new();
        for message in batch {
            let entry = next.entry(message.partition()).or_insert(0);
            *entry = (*entry).max(message.offset() + 1);
        }
        for (partition, offset) in next {
            offsets.add_partition_offset(&self.source.topic, partition, Offset::Offset(offset))?;
        }
        // A lost commit only means a re-delivery, which changes nothing.
        if let Err(error) = self.consumer.commit(&offsets, CommitMode::Async) {
            warn!(message = "Committing offsets failed; the batch may be delivered again.", source = %self.source.name, %error);
        }
        Ok(())
    }
}
