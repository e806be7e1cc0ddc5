//! Ingest: one Kafka consumer group per source, events in batches through
//! the objectives' filters and rules, counters applied in one transaction
//! per batch, offsets committed only after that transaction commits.
//!
//! Exactly-once effects do not come from the broker (a rebalance or a crash
//! redelivers whatever was not committed) but from idempotent application:
//! see `store::counters`. Bad input never stops a source: it goes to
//! `events.<source>.dead` with the reason in headers, and to the processing
//! log.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::catalog::Catalog;
use crate::event::{Envelope, MAX_EVENT_BYTES};
use crate::kafka::{
    self, ConsumerSettings, DeadLetters, FIRST_WAIT, GroupReader, NextBatch, Offsets, OwnedRecord,
};
use crate::metrics;
use crate::objectives::{Evaluation, Plan, check_message, raw_event_id, recorded_awards, skipped};
use crate::registry::Registry;
use crate::store::{
    self, Applied, Batch, DeadEvent, LogEntry, Message as StoredMessage, SourceRow, Store,
    StoreError,
};
use crate::supervise::{self, Supervised};

/// Ingest settings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Ingest")]
pub struct IngestSettings {
    /// Kafka bootstrap servers (the process's `--kafka-brokers`, or the
    /// local broker `laurel up` started).
    #[arg(skip)]
    pub brokers: String,
    /// Consumer groups are `<prefix>.<source>`.
    #[arg(skip = kafka::GROUP_PREFIX.to_string())]
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
    /// The defaults, consuming from `brokers`.
    pub fn new(brokers: impl Into<String>) -> IngestSettings {
        IngestSettings {
            brokers: brokers.into(),
            ..crate::settings::defaults()
        }
    }

    /// What its group consumers take from it.
    pub fn consumer(&self) -> ConsumerSettings {
        ConsumerSettings {
            brokers: self.brokers.clone(),
            batch_size: self.batch_size,
            batch_max_bytes: self.batch_max_bytes,
            batch_wait: self.batch_wait,
            session_timeout: self.session_timeout,
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
    let notifications = store::listen(database_url, &[store::SOURCES_CHANNEL]).await?;
    let store = Store::connect(database_url).await?;
    let shared = Arc::new(Shared {
        dead_letters: DeadLetters::new(&settings.brokers, settings.max_event_bytes)?,
        settings,
        database_url: database_url.to_string(),
        registry,
        catalog,
    });
    let names = supervise::Names {
        rows: "sources",
        task: "source consumer",
    };
    let start = |source: SourceRow, supervised: Supervised| {
        info!(message = "Consuming a source.", source = %source.name, topic = %source.topic, paused = source.paused);
        tokio::spawn(consume_source(source, shared.clone(), supervised))
    };
    supervise::run(names, notifications, store, read_sources, start, shutdown).await;
    info!(message = "Ingest stopped: the batches in hand are finished.");
    Ok(())
}

/// The sources as the supervisor runs them: a consumer per source,
/// restarted when its topic changes.
async fn read_sources(
    mut store: Store,
) -> (Store, Result<Vec<supervise::Wanted<SourceRow>>, StoreError>) {
    let read = async { store.healed().await?.sources().await }.await;
    let wanted = read.map(|sources| {
        sources
            .into_iter()
            .map(|source| supervise::Wanted {
                name: source.name.clone(),
                version: source.topic.clone(),
                paused: source.paused,
                row: source,
            })
            .collect()
    });
    (store, wanted)
}

async fn consume_source(source: SourceRow, shared: Arc<Shared>, supervised: Supervised) {
    let Supervised { paused, mut stop } = supervised;
    let started = supervise::retrying("source consumer", &source.name, &mut stop, || {
        SourceConsumer::new(&source, &shared, paused.clone())
    })
    .await;
    if let Some(mut consumer) = started {
        consumer.run(stop).await;
    }
}

/// Where each record of a batch was read (partition, offset).
fn positions(batch: &[OwnedRecord]) -> impl Iterator<Item = (i32, i64)> + '_ {
    batch.iter().map(|m| (m.partition(), m.offset()))
}

struct SourceConsumer {
    source: SourceRow,
    shared: Arc<Shared>,
    reader: GroupReader,
    store: Store,
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
        let reader = GroupReader::subscribe(
            &settings.consumer(),
            &kafka::source_group(&settings.group_prefix, &source.name),
            &source.topic,
            paused,
            format!("source {}", source.name),
        )?;
        let store = Store::connect(&shared.database_url).await?;
        Ok(SourceConsumer {
            source: source.clone(),
            shared: shared.clone(),
            reader,
            store,
            plan: None,
            plan_generation: (u64::MAX, u64::MAX),
            recorded: Vec::new(),
        })
    }

    async fn run(&mut self, mut stop: watch::Receiver<bool>) {
        let mut batch: Vec<OwnedRecord> = Vec::new();
        loop {
            if *stop.borrow() {
                break;
            }
            match self
                .reader
                .next_batch(FIRST_WAIT, &mut stop, &mut batch)
                .await
            {
                NextBatch::Batch => {}
                NextBatch::Nothing => continue,
                NextBatch::Stop => break,
            }
            // A batch in hand is finished even when asked to stop: nothing
            // is committed before it is applied, so stopping mid-way would
            // only mean doing it again.
            let span = info_span!("batch", source = %self.source.name, size = batch.len(), offsets = %kafka::offset_ranges(positions(&batch)));
            async {
                if let Err(error) = self.process(&batch, &stop).await {
                    error!(message = "A batch was not applied; it will be consumed again.", source = %self.source.name, error = %format!("{error:#}"));
                    // Go back to the first uncommitted offset of each partition.
                    self.reader.rewind(positions(&batch));
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

    fn decode(&self, message: &OwnedRecord) -> Result<Envelope, String> {
        check_message(
            message.key(),
            message.payload(),
            &self.source.name,
            self.shared.settings.max_event_bytes,
        )
    }

    /// A batch: decoded, its banned and deleted users' events skipped,
    /// evaluated, applied in one transaction, its dead letters published,
    /// and only then its offsets committed.
    async fn process(
        &mut self,
        batch: &[OwnedRecord],
        stop: &watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let messages = stored_messages(batch);
        let (mut admitted, dead) = self.decode_all(batch);
        let mut log: Vec<LogEntry> = Vec::new();
        let excluded = self.excluded_users(&admitted, stop).await?;
        admitted.retain(|(index, envelope)| !skipped(*index, envelope, &excluded, &mut log));

        self.plan_again_if_changed().await?;
        let evaluating = std::time::Instant::now();
        let evaluation = self.evaluate(admitted).await?;
        let evaluate_us = evaluating.elapsed().as_micros() as u64;
        log.extend(evaluation.log);

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
        let (applied, refused) = apply(&mut self.store, &input, stop).await?;
        let dead_lettered = publish_dead_letters(
            &self.shared,
            &self.source,
            batch,
            &dead,
            &refused,
            &applied,
            stop,
        )
        .await?;

        self.count(batch.len(), dead_lettered, &applied);
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
        let offsets = Offsets::after(&self.source.topic, positions(batch))?;
        // A lost commit only means a re-delivery, which changes nothing.
        if let Err(error) = self.reader.commit_async(&offsets) {
            warn!(message = "Committing offsets failed; the batch may be delivered again.", source = %self.source.name, %error);
        }
        Ok(())
    }

    /// The batch's events, by batch index; the messages that are none,
    /// with why.
    fn decode_all(&self, batch: &[OwnedRecord]) -> (Vec<(usize, Envelope)>, Vec<DeadEvent>) {
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
        (admitted, dead)
    }

    /// Who of the events' users gets no progress (banned, deleted), read
    /// again while PostgreSQL is away.
    async fn excluded_users(
        &mut self,
        admitted: &[(usize, Envelope)],
        stop: &watch::Receiver<bool>,
    ) -> anyhow::Result<HashMap<String, String>> {
        if admitted.is_empty() {
            return Ok(HashMap::new());
        }
        let users = || admitted.iter().map(|(_, e)| e.user_id.as_str());
        let mut retry = Retry::new(&self.source.name);
        loop {
            let result = async { self.store.healed().await?.excluded_users(users()).await }.await;
            match result {
                Ok(excluded) => {
                    retry.succeeded();
                    return Ok(excluded);
                }
                Err(error) => retry.wait(error, stop).await?,
            }
        }
    }

    /// The objectives, built again when awards or functions changed.
    async fn plan_again_if_changed(&mut self) -> anyhow::Result<()> {
        let generation = (
            self.shared.catalog.generation(),
            self.shared.registry.generation(),
        );
        if self.plan.is_some() && generation == self.plan_generation {
            return Ok(());
        }
        let (source, awards, registry) = (
            self.source.name.clone(),
            self.shared.catalog.awards(),
            self.shared.registry.clone(),
        );
        let plan =
            tokio::task::spawn_blocking(move || Plan::build(&source, &awards, &registry)).await?;
        info!(message = "Objectives planned.", source = %self.source.name, objectives = plan.objective_count(), unbound = plan.unbound.len());
        self.plan = Some(plan);
        self.recorded = recorded_awards(&self.shared.catalog.awards());
        self.plan_generation = generation;
        Ok(())
    }

    /// The events through every objective's filters and rule, on a
    /// blocking thread (guests run there).
    async fn evaluate(&mut self, admitted: Vec<(usize, Envelope)>) -> anyhow::Result<Evaluation> {
        let mut plan = self.plan.take().expect("planned before evaluating");
        // Batch positions stay here; the envelopes move to the blocking thread.
        let (indexes, envelopes): (Vec<usize>, Vec<Envelope>) = admitted.into_iter().unzip();
        let (plan, evaluation) = tokio::task::spawn_blocking(move || {
            let evaluation = plan.evaluate(&envelopes, &indexes);
            (plan, evaluation)
        })
        .await?;
        self.plan = Some(plan);
        Ok(evaluation)
    }

    /// The batch in the metrics; held events also said in the log.
    fn count(&self, events: usize, dead_lettered: usize, applied: &Applied) {
        let source = [("source", self.source.name.as_str())];
        metrics::add(
            metrics::EVENTS_APPLIED,
            &source,
            (events - dead_lettered) as u64,
        );
        metrics::add(metrics::EVENTS_DEAD_LETTERED, &source, dead_lettered as u64);
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
    }
}

/// Whole events that could not be applied, to the dead-letter topic
/// (before the offsets; they are kept in the database already).
/// Returns how many.
async fn publish_dead_letters(
    shared: &Shared,
    source: &SourceRow,
    batch: &[OwnedRecord],
    dead: &[DeadEvent],
    refused: &[DeadEvent],
    applied: &Applied,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<usize> {
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
    let publishing = letters
        .iter()
        .map(|(index, reason)| publish_dead_letter(shared, source, &batch[*index], reason, stop));
    for published in futures_util::future::join_all(publishing).await {
        published?;
    }
    Ok(letters.len())
}

/// One transaction (split only to find an event PostgreSQL refuses),
/// retried while the database is away.
async fn apply(
    store: &mut Store,
    input: &Batch<'_>,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<(Applied, Vec<DeadEvent>)> {
    let mut retry = Retry::new(input.source);
    loop {
        let result = async { store.healed().await?.apply_isolating(input).await }.await;
        match result {
            Ok(done) => {
                retry.succeeded();
                return Ok(done);
            }
            Err(error) => retry.wait(error, stop).await?,
        }
    }
}

/// The batch's messages as a dead letter keeps them.
fn stored_messages(batch: &[OwnedRecord]) -> Vec<StoredMessage<'_>> {
    batch
        .iter()
        .map(|m| StoredMessage {
            topic: m.topic(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key(),
            value: m.payload(),
            place: m
                .header(store::PLACE_HEADER)
                .and_then(|place| std::str::from_utf8(place).ok()),
        })
        .collect()
}

/// Publishes one dead letter, retrying while the broker is away.
async fn publish_dead_letter(
    shared: &Shared,
    source: &SourceRow,
    message: &OwnedRecord,
    reason: &str,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let topic = kafka::source_dead_topic(&source.name);
    let reason = crate::text::printable(reason, 4096);
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
        .map(|(name, value)| (name.to_string(), value.unwrap_or_default().to_vec()))
        .collect();
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
