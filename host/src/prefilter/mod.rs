//! The pre-filter role: per pipeline, a consumer of a raw analytics topic
//! that turns records into events with the pipeline's transform (Wasm),
//! checks each event as ingest does, keeps only those some enabled award
//! can use, and produces them to the source's topic keyed by user id.
//!
//! - **Kept, derived:** the objectives that can see the pipeline's source
//!   (their filters' declared sources) run each event through their filters
//!   and rule, as ingest would; an event every objective excludes or
//!   ignores is dropped. Before that, cheaply, an event of a type no
//!   objective can use (as its filters declare their event types) is
//!   dropped without a check or a filter call. The objectives follow award
//!   and function changes without a restart.
//! - **No loss:** a batch's offsets are committed only after its kept
//!   events and its dead letters are acknowledged by the broker; a batch
//!   that fails is read again. The kept events are acknowledged while the
//!   next batch is read (so the pre-filter does not wait idle for them);
//!   if they are not, both batches are read again. A record's events carry
//!   ids derived from its position (or a field the transform config
//!   names), so a record read again makes the same events and ingest adds
//!   them once.
//! - **Malformed records** (no value, too large, a transform's refusal, an
//!   event that fails the envelope's checks) go to `<input_topic>.dead`
//!   with the reason in the `laurel-reason` header; the rest of the batch
//!   goes on.
//! - **A failing transform** (trap, timeout) is tried record by record: the
//!   records it fails on are dead-lettered with why. A quarantined one
//!   holds its own pipeline (nothing committed, retried every few
//!   seconds until a new version is pushed); other pipelines go on.
//! - **Replay** (`crate::replay::raw`): a pipeline's dead letters go back to its
//!   input topic at their first position, once fixed.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{Instrument, debug, error, info, info_span, warn};

mod batch;

use batch::{Letter, RawBatch, Settled};

use crate::catalog::Catalog;
use crate::event::Envelope;
use crate::kafka::{
    self, ConsumerSettings, DeadLetters, FIRST_WAIT, GroupReader, NextBatch, Offsets, Producer,
    ReadBatch, first_offsets,
};
use crate::metrics;
use crate::objectives::{Plan, Verdict};
use crate::registry::{Binding, Registry};
use crate::replay::raw::{DEAD_SIGNATURE_HEADER, Mark, ReplayKey};
use crate::runtime::{Answer, FunctionError, PackedRecords, TransformInstance, Transformed};
use crate::store::{self, PipelineRow, Store};
use crate::supervise::{self, Supervised};

/// What the pre-filter takes from its process's settings.
#[derive(Debug, Clone)]
pub struct PrefilterSettings {
    pub consumer: ConsumerSettings,
    /// Pipelines' consumer groups are `<prefix>.prefilter.<pipeline>`.
    pub group_prefix: String,
    /// Larger records are dead-lettered, not transformed, in bytes.
    pub max_event_bytes: usize,
}

struct Shared {
    settings: PrefilterSettings,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    dead_letters: DeadLetters,
    producer: Producer,
    replay_key: ReplayKey,
}

/// Runs a consumer for every pipeline until `shutdown`; starts, restarts
/// (a new version) and stops them as pipelines change (seen within a
/// second), and follows pause/resume.
pub async fn run(
    settings: PrefilterSettings,
    database_url: &str,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let notifications = store::listen(
        database_url,
        &[store::PIPELINES_CHANNEL, store::SOURCES_CHANNEL],
    )
    .await?;
    let store = Store::connect(database_url).await?;
    let brokers = &settings.consumer.brokers;
    let shared = Arc::new(Shared {
        replay_key: ReplayKey::load(&store).await?,
        dead_letters: DeadLetters::new(brokers, settings.max_event_bytes)?,
        // Each batch waits for its kept events' acknowledgements.
        producer: kafka::producer_lingering(brokers, 0)?,
        settings,
        registry,
        catalog,
    });
    let names = supervise::Names {
        rows: "pipelines",
        task: "pipeline consumer",
    };
    let start = |(pipeline, out_topic): (PipelineRow, String), supervised: Supervised| {
        info!(message = "Running a pipeline.", pipeline = %pipeline.name, input = %pipeline.input_topic, output = %out_topic, transform = %pipeline.transform, version = pipeline.version);
        tokio::spawn(consume_pipeline(
            pipeline,
            out_topic,
            shared.clone(),
            supervised,
        ))
    };
    supervise::run(names, notifications, store, read_pipelines, start, shutdown).await;
    info!(message = "The pre-filter stopped: the batches in hand are finished.");
    Ok(())
}

/// The pipelines as the supervisor runs them: a consumer per pipeline
/// whose source is registered (its output topic), restarted when its
/// version or output topic changes.
async fn read_pipelines(
    mut store: Store,
) -> (
    Store,
    Result<Vec<supervise::Wanted<(PipelineRow, String)>>, store::StoreError>,
) {
    let read = async {
        let pipelines = store.healed().await?.pipelines().await?;
        let sources = store.sources().await?;
        Ok::<_, store::StoreError>((pipelines, sources))
    };
    let wanted = read.await.map(|(pipelines, sources)| {
        let topics: HashMap<String, String> =
            sources.into_iter().map(|s| (s.name, s.topic)).collect();
        pipelines
            .into_iter()
            .filter_map(|pipeline| {
                let out_topic = topics.get(&pipeline.source)?.clone();
                Some(supervise::Wanted {
                    name: pipeline.name.clone(),
                    version: format!("{} {out_topic}", pipeline.version),
                    paused: pipeline.paused,
                    row: (pipeline, out_topic),
                })
            })
            .collect()
    });
    (store, wanted)
}

async fn consume_pipeline(
    pipeline: PipelineRow,
    out_topic: String,
    shared: Arc<Shared>,
    supervised: Supervised,
) {
    let Supervised { paused, mut stop } = supervised;
    let started = supervise::retrying("pipeline consumer", &pipeline.name, &mut stop, || {
        std::future::ready(PipelineConsumer::new(
            &pipeline,
            &out_topic,
            &shared,
            paused.clone(),
        ))
    })
    .await;
    if let Some(mut consumer) = started {
        consumer.run(stop).await;
    }
}

/// Why a batch was not finished (it is read again).
#[derive(Debug, thiserror::Error)]
enum BatchError {
    /// The transform cannot run (missing, refusing its config, or
    /// quarantined): the pipeline holds until it can.
    #[error("{0}")]
    Transform(String),
    #[error("{0:#}")]
    Kafka(anyhow::Error),
}

/// A batch's kept events as the producer acknowledges them.
type Acks = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>;

/// A batch whose kept events are sent, committed once they are
/// acknowledged.
struct Sent {
    acks: Acks,
    /// The first position read on each partition: where to read again if
    /// the events are not acknowledged.
    first: Vec<(i32, i64)>,
    /// What to commit: the next offset on each partition.
    offsets: Offsets,
    log: BatchLog,
}

/// A sent batch whose events were not acknowledged, or whose offsets were
/// not committed.
struct Unsettled {
    first: Vec<(i32, i64)>,
    error: anyhow::Error,
}

/// What a batch's line in the log and its counts say.
struct BatchLog {
    records: usize,
    kept: usize,
    dropped: usize,
    dead: u64,
    wait: Duration,
    transform: Duration,
    check: Duration,
    /// When its events were handed to the producer.
    sent: std::time::Instant,
}

/// What became of one record.
enum Fate {
    /// Its events, checked, as envelope JSON (key = user id).
    Events(Vec<(Envelope, String)>),
    Dead(String),
}

struct PipelineConsumer {
    pipeline: PipelineRow,
    out_topic: String,
    shared: Arc<Shared>,
    reader: GroupReader,
    transform: Option<Binding<TransformInstance>>,
    plan: Option<Plan>,
    plan_generation: (u64, u64),
}

impl PipelineConsumer {
    fn new(
        pipeline: &PipelineRow,
        out_topic: &str,
        shared: &Arc<Shared>,
        paused: Arc<AtomicBool>,
    ) -> anyhow::Result<PipelineConsumer> {
        let settings = &shared.settings;
        let reader = GroupReader::subscribe(
            &settings.consumer,
            &kafka::pipeline_group(&settings.group_prefix, &pipeline.name),
            &pipeline.input_topic,
            paused,
            format!("pipeline {}", pipeline.name),
        )?;
        Ok(PipelineConsumer {
            pipeline: pipeline.clone(),
            out_topic: out_topic.to_string(),
            shared: shared.clone(),
            reader,
            transform: None,
            plan: None,
            plan_generation: (u64::MAX, u64::MAX),
        })
    }

    async fn run(&mut self, mut stop: watch::Receiver<bool>) {
        let settings = self.shared.settings.clone();
        let mut batch = RawBatch::new(
            &self.pipeline.name,
            &self.pipeline.input_topic,
            settings.max_event_bytes,
            self.shared.replay_key.clone(),
        );
        let mut in_flight: Option<Sent> = None;
        loop {
            if *stop.borrow() {
                break;
            }
            let waited = std::time::Instant::now();
            // The batch before this one is acknowledged while this one is
            // read, and committed once it is: at once when nothing more
            // has been fetched.
            let first_wait = if in_flight.is_some() {
                Duration::ZERO
            } else {
                FIRST_WAIT
            };
            let read = self
                .reader
                .next_batch(first_wait, &mut stop, &mut batch)
                .await;
            if let Some(sent) = in_flight.take()
                && let Err(unsettled) = self.settle(sent).await
            {
                error!(message = "A pre-filter batch was not acknowledged; it will be read again.", pipeline = %self.pipeline.name, error = %unsettled.error);
                let mut again = unsettled.first;
                if matches!(read, NextBatch::Batch) {
                    // This batch too, on partitions it alone has.
                    again.extend_from_slice(batch.positions());
                }
                self.rewind(again);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            match read {
                NextBatch::Batch => {}
                NextBatch::Nothing => continue,
                NextBatch::Stop => break,
            }
            let waited = waited.elapsed();
            let span =
                info_span!("prefilter_batch", pipeline = %self.pipeline.name, size = batch.count());
            async {
                match self.process(&batch, waited).await {
                    Ok(sent) => in_flight = Some(sent),
                    Err(error) => {
                        error!(message = "A pre-filter batch was not finished; it will be read again.", pipeline = %self.pipeline.name, %error);
                        self.rewind(batch.positions().to_vec());
                        let wait = match error {
                            BatchError::Transform(_) => Duration::from_secs(3),
                            BatchError::Kafka(_) => Duration::from_secs(1),
                        };
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = stop.changed() => {}
                        }
                    }
                }
            }
            .instrument(span)
            .await;
        }
        if let Some(sent) = in_flight.take()
            && let Err(unsettled) = self.settle(sent).await
        {
            error!(message = "The last pre-filter batch was not acknowledged; it will be read again after a restart.", pipeline = %self.pipeline.name, error = %unsettled.error);
        }
        info!(message = "Pipeline consumer stopped.", pipeline = %self.pipeline.name);
    }

    /// Seeks back to the first of `positions` on each partition.
    fn rewind(&self, positions: Vec<(i32, i64)>) {
        self.reader.rewind(positions);
    }

    /// The transform, bound now if it was not (it follows new versions).
    fn transform(&mut self) -> Result<&mut TransformInstance, BatchError> {
        if self.transform.is_none() {
            let binding = self
                .shared
                .registry
                .bind_transform(
                    &self.pipeline.transform,
                    &self.pipeline.transform_config.to_string(),
                )
                .map_err(|e| {
                    BatchError::Transform(format!("transform {}: {e}", self.pipeline.transform))
                })?;
            self.transform = Some(binding);
        }
        Ok(self.transform.as_mut().expect("bound above").instance())
    }

    /// The objectives that can see this pipeline's source, rebuilt when
    /// awards or functions changed.
    fn plan(&mut self) -> &mut Plan {
        let generation = (
            self.shared.catalog.generation(),
            self.shared.registry.generation(),
        );
        if self.plan.is_none() || generation != self.plan_generation {
            let awards = self.shared.catalog.awards();
            let plan = Plan::build(&self.pipeline.source, &awards, &self.shared.registry);
            info!(message = "Pre-filter objectives planned.", pipeline = %self.pipeline.name, source = %self.pipeline.source, objectives = plan.objective_count());
            self.plan = Some(plan);
            self.plan_generation = generation;
        }
        self.plan.as_mut().expect("planned above")
    }

    /// One batch, read in `waited`: transformed, checked, its kept events
    /// sent and its dead letters acknowledged.
    async fn process(&mut self, batch: &RawBatch, waited: Duration) -> Result<Sent, BatchError> {
        let started = std::time::Instant::now();
        if batch.unsigned() > 0 {
            warn!(message = "Records carried a replay mark without a valid signature; each was read at its own position, as any record is.", pipeline = %self.pipeline.name, records = batch.unsigned());
        }
        // First, cheaply: types no objective's filters can match (as the
        // filters declare them) are not made (a transform with
        // `transform-scope` skips them) or dropped before any check.
        let types = self.plan().event_types();
        let answers = self.transform_all(batch.packed(), types.as_ref())?;
        let transformed = std::time::Instant::now();
        // What became of the records that made events or are dead, by
        // their place in the batch. Every other record made nothing (a
        // transform told the kept types leaves the others out: each is
        // one record dropped) or is another pipeline's.
        let mut dropped = batch.packed().len() - answers.len();
        let mut fates: Vec<(usize, Fate)> = batch
            .settled()
            .filter_map(|(place, settled)| match settled {
                Settled::NotOurs => None,
                Settled::Dead(reason) => Some((place, Fate::Dead(reason.clone()))),
            })
            .collect();
        for Answer { index, events } in answers {
            let fate = match events {
                Ok(mut events) => {
                    if let Some(types) = &types {
                        let before = events.len();
                        events.retain(|event| types.contains(&event.event_type));
                        dropped += before - events.len();
                    }
                    self.checked(events)
                }
                Err(reason) => Fate::Dead(reason),
            };
            fates.push((batch.place_of_packed(index as usize), fate));
        }
        // In the batch's order, so events go on as their records came.
        fates.sort_by_key(|(place, _)| *place);

        // Keep what some objective can use. Each event names its record's
        // place (and its number among the record's events): where it
        // stands among its item's events, a replayed record included.
        let input_topic = self.pipeline.input_topic.as_str();
        let (envelopes, jsons): (Vec<Envelope>, Vec<(String, String)>) = fates
            .iter_mut()
            .filter_map(|(place, fate)| match fate {
                Fate::Events(events) => {
                    let (partition, offset) = batch.origin(*place);
                    Some(
                        events
                            .drain(..)
                            .enumerate()
                            .map(move |(n, (envelope, json))| {
                                let at = crate::store::place_header(
                                    input_topic,
                                    partition,
                                    offset,
                                    n as u32,
                                );
                                (envelope, (json, at))
                            }),
                    )
                }
                Fate::Dead(_) => None,
            })
            .flatten()
            .unzip();
        let keep = if envelopes.is_empty() {
            Vec::new()
        } else {
            let plan = self.plan();
            if plan.objective_count() == 0 {
                vec![false; envelopes.len()]
            } else {
                let verdicts = plan.verdicts(&envelopes);
                (0..envelopes.len())
                    .map(|i| {
                        verdicts
                            .iter()
                            .any(|per_objective| usable(&per_objective[i]))
                    })
                    .collect()
            }
        };
        let candidates = envelopes.len();
        let kept: Vec<(Envelope, (String, String))> = envelopes
            .into_iter()
            .zip(jsons)
            .zip(&keep)
            .filter_map(|(event, keep)| keep.then_some(event))
            .collect();
        let kept_count = kept.len();
        dropped += candidates - kept_count;
        let planned = std::time::Instant::now();

        // Everything acknowledged before anything is committed. The kept
        // events are handed to the producer now and acknowledged while the
        // next batch is read ([`PipelineConsumer::settle`]); dead letters
        // (few) are waited for here.
        let sends: Vec<_> = kept
            .into_iter()
            .map(|(envelope, (json, place))| {
                let producer = self.shared.producer.clone();
                let topic = self.out_topic.clone();
                let key = envelope.user_id;
                async move {
                    kafka::publish(
                        &producer,
                        &topic,
                        Some(key.as_bytes()),
                        json.as_bytes(),
                        &[(crate::store::PLACE_HEADER, place.as_str())],
                    )
                    .await
                }
            })
            .collect();
        let sends = futures_util::future::try_join_all(sends);
        let mut acks: Acks = Box::pin(async move { sends.await.map(drop) });
        // Polled once, so every event is on its way.
        if let std::task::Poll::Ready(result) = futures_util::poll!(&mut acks) {
            acks = Box::pin(std::future::ready(result));
        }
        let dead_letters = fates.iter().filter_map(|(place, fate)| match fate {
            Fate::Dead(reason) => Some(dead_letter(
                &self.shared,
                &self.pipeline,
                batch.letter(*place),
                reason,
            )),
            Fate::Events(_) => None,
        });
        let dead = futures_util::future::try_join_all(dead_letters)
            .await?
            .len() as u64;
        let planned_ms = planned.duration_since(started);
        Ok(Sent {
            acks,
            first: first_offsets(batch.positions().iter().copied()),
            offsets: Offsets::after(
                &self.pipeline.input_topic,
                batch.positions().iter().copied(),
            )
            .map_err(|e| BatchError::Kafka(e.into()))?,
            log: BatchLog {
                records: batch.count(),
                kept: kept_count,
                dropped,
                dead,
                wait: waited,
                transform: transformed - started,
                check: planned_ms - (transformed - started),
                sent: std::time::Instant::now(),
            },
        })
    }

    /// Waits for `sent`'s events to be acknowledged, then commits its
    /// offsets; counts its records.
    async fn settle(&mut self, sent: Sent) -> Result<(), Unsettled> {
        let Sent {
            acks,
            first,
            offsets,
            log,
        } = sent;
        let unsettled = |error: anyhow::Error| Unsettled {
            first: first.clone(),
            error,
        };
        acks.await.map_err(unsettled)?;
        let acknowledged = std::time::Instant::now();
        self.reader
            .commit(&offsets)
            .map_err(|e| unsettled(e.into()))?;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        debug!(
            message = "Pre-filter batch done.",
            pipeline = %self.pipeline.name,
            records = log.records,
            kept = log.kept,
            wait_ms = ms(log.wait),
            transform_ms = ms(log.transform),
            check_ms = ms(log.check),
            // From the events' sending to their acknowledgement, while
            // the next batch was read.
            produce_ms = ms(acknowledged - log.sent),
            commit_ms = ms(acknowledged.elapsed()),
        );
        let labels = |outcome| {
            [
                ("pipeline", self.pipeline.name.as_str()),
                ("outcome", outcome),
            ]
        };
        metrics::add(metrics::PREFILTER_EVENTS, &labels("kept"), log.kept as u64);
        metrics::add(
            metrics::PREFILTER_EVENTS,
            &labels("dropped"),
            log.dropped as u64,
        );
        metrics::add(metrics::PREFILTER_EVENTS, &labels("dead"), log.dead);
        Ok(())
    }

    /// The transform's answer for each record; a failing call is tried
    /// record by record, and the records it fails on get the failure as
    /// their reason. A transform that cannot run at all holds the batch.
    fn transform_all(
        &mut self,
        records: &PackedRecords,
        types: Option<&BTreeSet<String>>,
    ) -> Result<Vec<Answer>, BatchError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        match self.transform()?.apply_packed(records, types) {
            Ok(answers) => return Ok(answers),
            Err(error) if holds(&error) => return Err(BatchError::Transform(error.to_string())),
            Err(_) => {}
        }
        let mut answers = Vec::new();
        for index in 0..records.len() {
            let events = match self.transform()?.apply_packed(&records.one(index), types) {
                Ok(mut one) => match one.pop() {
                    Some(answer) => answer.events,
                    None => continue,
                },
                Err(error) if holds(&error) => {
                    return Err(BatchError::Transform(error.to_string()));
                }
                Err(error) => Err(error.to_string()),
            };
            let index = u32::try_from(index).expect("a batch's records are counted in u32");
            answers.push(Answer { index, events });
        }
        Ok(answers)
    }

    /// A record's events with the pipeline's source, each checked as ingest
    /// checks a message; one that fails makes the record dead (none of its
    /// events go on, so a fixed record is replayed whole).
    fn checked(&self, events: Vec<Transformed>) -> Fate {
        let max_bytes = self.shared.settings.max_event_bytes;
        let mut checked = Vec::with_capacity(events.len());
        for (n, event) in events.into_iter().enumerate() {
            let json = match envelope_json(&event, &self.pipeline.source) {
                Ok(json) => json,
                Err(reason) => return Fate::Dead(format!("event {n}: {reason}")),
            };
            if json.len() > max_bytes {
                return Fate::Dead(format!(
                    "event {n}: {} bytes, over the limit of {max_bytes} bytes",
                    json.len()
                ));
            }
            match Envelope::parse(json.as_bytes()) {
                Ok(envelope) => checked.push((envelope, json)),
                Err(reason) => return Fate::Dead(format!("event {n}: {reason}")),
            }
        }
        Fate::Events(checked)
    }
}

/// Publishes a raw record to its pipeline's dead-letter topic, with why.
async fn dead_letter(
    shared: &Shared,
    pipeline: &PipelineRow,
    letter: Letter<'_>,
    reason: &str,
) -> Result<(), BatchError> {
    let topic = kafka::dead_topic(&pipeline.input_topic);
    let reason = crate::text::printable(reason, 4096);
    let (partition, offset) = (letter.origin.0.to_string(), letter.origin.1.to_string());
    // Issued here, where the record is Laurel's to dead-letter: a replay
    // honours the origin only of a record this signature covers.
    let signature = letter.value.map(|value| {
        let origin = format!("{partition}/{offset}");
        shared.replay_key.sign(Mark {
            pipeline: pipeline.name.as_bytes(),
            origin: origin.as_bytes(),
            key: letter.key,
            value,
        })
    });
    let mut headers = vec![
        ("laurel-reason", reason.as_str()),
        ("laurel-pipeline", pipeline.name.as_str()),
        ("laurel-topic", pipeline.input_topic.as_str()),
        ("laurel-partition", partition.as_str()),
        ("laurel-offset", offset.as_str()),
    ];
    if let Some(signature) = &signature {
        headers.push((DEAD_SIGNATURE_HEADER, signature.as_str()));
    }
    let original: Vec<(String, Vec<u8>)> = letter
        .headers
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_vec()))
        .collect();
    shared
        .dead_letters
        .publish(&topic, letter.key, letter.value, &headers, &original)
        .await
        .map_err(BatchError::Kafka)?;
    warn!(message = "Raw record dead-lettered.", pipeline = %pipeline.name, partition = letter.at.0, offset = letter.at.1, reason = %reason);
    Ok(())
}

/// Whether a transform's failure holds the whole pipeline (it cannot run
/// for any record) rather than failing one record.
fn holds(error: &FunctionError) -> bool {
    matches!(
        error,
        FunctionError::Quarantined { .. }
            | FunctionError::Config { .. }
            | FunctionError::Instantiate { .. }
            | FunctionError::Input { .. }
    )
}

/// Whether an objective's verdict makes an event worth producing:
/// anything but "a filter excludes it" or "its rule ignores it" (a held
/// or refused event goes on, for ingest to hold or log).
fn usable(verdict: &Verdict) -> bool {
    !matches!(verdict, Verdict::Excluded { .. } | Verdict::Nothing { .. })
}

/// The position a `laurel-origin` header's value names (`partition/offset`).
fn origin_in(value: Option<&[u8]>) -> Option<(i32, i64)> {
    let (partition, offset) = std::str::from_utf8(value?).ok()?.split_once('/')?;
    Some((partition.parse().ok()?, offset.parse().ok()?))
}

/// The contract's JSON envelope of a transformed event, with `source`.
fn envelope_json(event: &Transformed, source: &str) -> Result<String, String> {
    let payload: serde_json::Value = serde_json::from_str(&event.payload)
        .map_err(|e| format!("its payload is not JSON: {e}"))?;
    if !payload.is_object() {
        return Err("its payload is not a JSON object".into());
    }
    let mut envelope = serde_json::json!({
        "id": event.id,
        "source": source,
        "type": event.event_type,
        "user_id": event.user_id,
        "authorized": event.authorized,
        "occurred_at": event.occurred_at,
        "payload": payload,
    });
    if let Some(content_id) = &event.content_id {
        envelope["content_id"] = content_id.as_str().into();
    }
    if let Some(status) = &event.status {
        envelope["status"] = status.as_str().into();
    }
    Ok(envelope.to_string())
}
