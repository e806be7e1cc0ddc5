//! Awards that credit the past: a backfill from history evaluates a new or
//! changed award's objectives over the content items Laurel already stores
//! (each with the last event applied to it), through the same checks,
//! filters, rules and transaction as ingest.
//!
//! - **Exactly once per (objective, item).** An item's contribution is
//!   absolute (what it counts for its current status), and the
//!   transaction moves counters by the difference to the item's stored
//!   share: an item counted by live traffic already, or by an earlier
//!   backfill, changes nothing. So a backfill is started over freely, and a
//!   step done twice (a worker died before recording it) is harmless.
//! - **Live traffic overtakes.** Items are walked in key order in bounded
//!   steps (`LAUREL_BACKFILL_BATCH`), each its own short transaction under
//!   the same per-user locks as ingest; an item that got a newer event
//!   since the step read it is left to that event (the older one changes
//!   nothing).
//! - **One worker at a time**, by a lease on the backfill's row: every
//!   process running ingest takes up backfills in the background, and
//!   `laurel awards backfill` works on its own one in the foreground.
//! - **Analytics events** are not stored: after the items, the backfill
//!   reads the messages its sources' topics retain, up to what ingest had
//!   committed (past that, ingest applies them with the award as it is
//!   now). An award that credits the past keeps the ids of the analytics
//!   events it counted (`award_events`, live and backfilled alike), so each
//!   counts once per award, however often it is read. Messages older than
//!   that record (`LAUREL_LOG_RETENTION_DAYS`, at least 7) are not read.
//! - **What cannot be recovered is counted, not skipped silently:** items
//!   applied before Laurel kept their events (`unrecoverable`); analytics
//!   past Kafka's retention (the oldest message read is shown, and whether
//!   every partition still held its first); items and events a failing
//!   function held or the database refused (`failed`, with the last
//!   reason; run the backfill again after the fix).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::definitions::AwardDefinition;
use crate::event::Envelope;
use crate::kafka;
use crate::objectives::{self, Plan};
use crate::registry::Registry;
use crate::store::{
    Batch, Effect, EventsStep, HistoryBackfill, HistoryStep, Lease, Message, Store, StoredItem,
};

/// How long a worker holds a backfill without recording a step.
pub const LEASE: Duration = Duration::from_secs(30);

/// How long after an award is applied its walk starts: by then every
/// ingest process has planned with it (each follows the change's
/// notification at its next batch), so every item event applied without
/// it is stored before the walk reads the item, and every later one
/// counts for it live. (A process that missed the notification re-reads
/// the awards within 30 s; items it changed in that window may be missed:
/// backfill again.)
pub const SETTLE: Duration = Duration::from_secs(5);

/// Backfill settings.
#[derive(Debug, Clone)]
pub struct BackfillSettings {
    /// Items (or retained messages) per step (one transaction per source
    /// in it).
    pub batch: i64,
    /// The largest event accepted (ingest's limit).
    pub max_event_bytes: usize,
    /// Kafka, for the retained analytics events (None: not read, and said).
    pub brokers: Option<String>,
    /// How long the ids of counted analytics events are kept (at least 7
    /// days, as applied events'): older messages are not read again.
    pub retention_days: i32,
}

/// Takes backfills from history and walks them.
pub struct Backfiller {
    store: Store,
    registry: Arc<Registry>,
    settings: BackfillSettings,
    /// The connections a step's items are applied on, each with the
    /// award's objectives bound (made at the first step).
    writers: Vec<Writer>,
    /// What the writers' plans are for: (award, version, registry
    /// generation).
    planned: Option<(String, i32, u64)>,
    brokers: Option<String>,
    /// Made at the first analytics step.
    reader: Option<kafka::RetainedReader>,
    /// Sources' topics by name, read again when a source is not in it.
    topics: HashMap<String, String>,
    /// A connection of its own that reads the next step's items while
    /// `store` applies this one's (made at the first step).
    reads: Option<Store>,
    /// The lease this worker holds while it walks: one a failed step left
    /// is released at the next [`Backfiller::work`] (if it is still this
    /// worker's), so the walk resumes at once rather than when the lease
    /// lapses.
    held: Option<Lease>,
}

impl Backfiller {
    pub fn new(store: Store, registry: Arc<Registry>, settings: BackfillSettings) -> Backfiller {
        Backfiller {
            store,
            registry,
            brokers: settings.brokers.clone().filter(|b| !b.is_empty()),
            settings,
            writers: Vec::new(),
            planned: None,
            reader: None,
            topics: HashMap::new(),
            reads: None,
            held: None,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Takes one unfinished backfill no one holds (`award_id`'s, or the
    /// oldest) and walks it to the end, calling `progress` after each
    /// step. Returns it as it stands when it finished, when `stop` was
    /// set, or when its lease was lost; None if there was none to take.
    pub async fn work(
        &mut self,
        award_id: Option<&str>,
        stop: &watch::Receiver<bool>,
        progress: impl FnMut(&HistoryBackfill),
    ) -> anyhow::Result<Option<HistoryBackfill>> {
        self.store.heal().await?;
        if let Some(lease) = self.held.take() {
            self.store.release_history_backfill(&lease).await?;
        }
        let Some(backfill) = self.store.claim_history_backfill(award_id, LEASE).await? else {
            return Ok(None);
        };
        self.held = Some(backfill.lease());
        let walked = self.walk(backfill, stop, progress).await;
        if walked.is_ok() {
            self.held = None;
        }
        walked
    }

    /// Walks a claimed backfill (see [`Backfiller::work`]).
    async fn walk(
        &mut self,
        mut backfill: HistoryBackfill,
        stop: &watch::Receiver<bool>,
        mut progress: impl FnMut(&HistoryBackfill),
    ) -> anyhow::Result<Option<HistoryBackfill>> {
        info!(message = "Backfilling from history.", award = %backfill.award_id, version = backfill.award_version, done = backfill.done, total = backfill.total);
        let (award, version, updated_at) =
            match crate::definitions::enabled_award(&self.store, &backfill.award_id).await {
                Ok(found) => found,
                Err(error) => {
                    // Deleted or disabled since: nothing more to do.
                    let step = HistoryStep {
                        last_failure: Some(error.to_string()),
                        ..HistoryStep::default()
                    };
                    let after = backfill.after.clone();
                    self.store
                        .record_history_step(&backfill.lease(), &after, &step, true, LEASE)
                        .await?;
                    return Ok(self.store.history_backfill(&backfill.award_id).await?);
                }
            };
        let settled = updated_at + SETTLE;
        if let Ok(wait) = (settled - chrono::Utc::now()).to_std() {
            let mut stop = stop.clone();
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {}
            }
        }
        // The stored items, then the retained analytics events. The next
        // step's items are read while one step applies.
        let mut prefetched: Option<Vec<StoredItem>> = None;
        while backfill.positions.is_none() {
            if *stop.borrow() {
                return self.release(backfill).await;
            }
            let stepping = std::time::Instant::now();
            let items = match prefetched.take() {
                Some(items) => items,
                None => {
                    self.store
                        .history_items(&backfill.sources, &backfill.after, self.settings.batch)
                        .await?
                }
            };
            let walked = (items.len() as i64) < self.settings.batch;
            let after = items
                .last()
                .map(|i| (i.user_id.clone(), i.source.clone(), i.content_id.clone()))
                .unwrap_or_else(|| backfill.after.clone());
            let step = if walked {
                self.step(&award, version, &items).await?
            } else {
                let mut reads = match self.reads.take() {
                    Some(mut reads) => {
                        reads.heal().await?;
                        reads
                    }
                    None => self.store.another().await?,
                };
                let batch = self.settings.batch;
                let (step, next) = tokio::join!(
                    self.step(&award, version, &items),
                    reads.history_items(&backfill.sources, &after, batch)
                );
                self.reads = Some(reads);
                prefetched = Some(next?);
                step?
            };
            let stepped = stepping.elapsed();
            let recorded = self
                .store
                .record_history_step(&backfill.lease(), &after, &step, false, LEASE)
                .await?;
            if !recorded {
                return self.lost(&backfill).await;
            }
            debug!(
                message = "Backfill step recorded.",
                award = %backfill.award_id,
                items = step.done,
                step_ms = stepped.as_secs_f64() * 1000.0,
                record_ms = (stepping.elapsed() - stepped).as_secs_f64() * 1000.0,
            );
            backfill.after = after;
            backfill.done += step.done;
            backfill.changed += step.changed;
            backfill.unrecoverable += step.unrecoverable;
            backfill.failed += step.failed;
            if step.last_failure.is_some() {
                backfill.last_failure = step.last_failure;
            }
            if walked {
                let (positions, from_start, note) = self.retained(&backfill).await?;
                if !self
                    .store
                    .start_history_events(
                        &backfill.lease(),
                        &positions,
                        from_start,
                        note.as_deref(),
                    )
                    .await?
                {
                    return self.lost(&backfill).await;
                }
                backfill.events_total = positions.values().map(|(next, end)| end - next).sum();
                backfill.positions = Some(positions);
                backfill.from_start = from_start;
                backfill.events_note = note;
            }
            progress(&backfill);
        }
        loop {
            if *stop.borrow() {
                return self.release(backfill).await;
            }
            let positions = backfill.positions.as_ref().expect("in the analytics phase");
            let next = positions
                .iter()
                .find(|(_, (next, end))| next < end)
                .map(|(key, (next, end))| (key.clone(), *next, *end));
            let step = match &next {
                Some((key, from, to)) => self.events_step(&award, version, key, *from, *to).await?,
                None => EventsStep::default(),
            };
            let finished = next.is_none();
            if !self
                .store
                .record_events_step(&backfill.lease(), &step, finished, LEASE)
                .await?
            {
                return self.lost(&backfill).await;
            }
            if let (Some((key, next)), Some(positions)) =
                (&step.position, backfill.positions.as_mut())
                && let Some(position) = positions.get_mut(key)
            {
                position.0 = *next;
            }
            backfill.events_done += step.done;
            backfill.events_applied += step.applied;
            backfill.failed += step.failed;
            if step.last_failure.is_some() {
                backfill.last_failure = step.last_failure;
            }
            if let Some(oldest) = step.oldest {
                backfill.events_from = Some(backfill.events_from.map_or(oldest, |f| f.min(oldest)));
            }
            if finished {
                backfill.finished_at = Some(chrono::Utc::now());
                info!(message = "Backfill from history finished.", award = %backfill.award_id, items = backfill.done, changed = backfill.changed, unrecoverable = backfill.unrecoverable, events = backfill.events_done, events_applied = backfill.events_applied, failed = backfill.failed);
            }
            progress(&backfill);
            if finished {
                return Ok(Some(backfill));
            }
        }
    }

    async fn release(
        &mut self,
        backfill: HistoryBackfill,
    ) -> anyhow::Result<Option<HistoryBackfill>> {
        self.store
            .release_history_backfill(&backfill.lease())
            .await?;
        Ok(Some(backfill))
    }

    async fn lost(
        &mut self,
        backfill: &HistoryBackfill,
    ) -> anyhow::Result<Option<HistoryBackfill>> {
        info!(message = "Backfill taken over or started again elsewhere; leaving it.", award = %backfill.award_id);
        Ok(self.store.history_backfill(&backfill.award_id).await?)
    }

    /// What the analytics phase reads: per partition of each source's
    /// topic, the retained messages ingest had committed (past those,
    /// ingest applies with the award as it is now). Whether every
    /// partition still holds its first message; why nothing is read, if so.
    async fn retained(
        &mut self,
        backfill: &HistoryBackfill,
    ) -> anyhow::Result<(BTreeMap<String, (i64, i64)>, bool, Option<String>)> {
        let mut positions = BTreeMap::new();
        let Some(brokers) = self.brokers.clone() else {
            return Ok((
                positions,
                true,
                Some("no Kafka brokers (LAUREL_KAFKA_BROKERS): retained analytics events were not read".into()),
            ));
        };
        self.read_topics().await?;
        let mut from_start = true;
        for source in &backfill.sources {
            let Some(topic) = self.topics.get(source) else {
                continue;
            };
            let group = kafka::source_group(kafka::GROUP_PREFIX, source);
            for (partition, low, end) in kafka::committed_ranges(&brokers, &group, topic).await? {
                from_start &= low == 0;
                positions.insert(format!("{source}/{partition}"), (low, end));
            }
        }
        Ok((positions, from_start, None))
    }

    /// The registered sources' topics, read again.
    async fn read_topics(&mut self) -> anyhow::Result<()> {
        self.topics = self
            .store
            .sources()
            .await?
            .into_iter()
            .map(|s| (s.name, s.topic))
            .collect();
        Ok(())
    }

    /// One step of the analytics phase: up to a batch of one partition's
    /// retained messages; their analytics events through the award's
    /// objectives, once per award and event id.
    async fn events_step(
        &mut self,
        award: &AwardDefinition,
        version: i32,
        key: &str,
        from: i64,
        to: i64,
    ) -> anyhow::Result<EventsStep> {
        let (source, partition) = key
            .rsplit_once('/')
            .and_then(|(s, p)| Some((s.to_string(), p.parse::<i32>().ok()?)))
            .ok_or_else(|| anyhow::anyhow!("a backfill position {key:?} names no partition"))?;
        if !self.topics.contains_key(&source) {
            self.read_topics().await?;
        }
        let topic = self
            .topics
            .get(&source)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("source {source} is no longer registered"))?;
        let brokers = self.brokers.clone().unwrap_or_default();
        let reader = self
            .reader
            .get_or_insert_with(|| kafka::RetainedReader::new(&brokers));
        let (messages, low) = reader
            .read(&topic, partition, from, to, self.settings.batch)
            .await?;
        let next = messages
            .last()
            .map_or(to.min(from.max(low)), |m| m.offset + 1);
        let mut step = EventsStep {
            position: Some((key.to_string(), next.max(from.max(low).min(to)))),
            done: next - from,
            ..EventsStep::default()
        };
        if messages.is_empty() && from.max(low) < to {
            // Nothing came back for offsets that should be there: past
            // them, as there is nothing more to read.
            step.position = Some((key.to_string(), to));
            step.done = to - from;
        }
        // Only what a record of counted events covers: older ids may be
        // pruned, so those events are not read again.
        let oldest_readable =
            chrono::Utc::now() - chrono::Duration::days(i64::from(self.settings.retention_days));
        let stored: Vec<Message<'_>> = messages
            .iter()
            .map(|m| Message {
                topic: &topic,
                partition,
                offset: m.offset,
                key: m.key.as_deref(),
                value: m.value.as_deref(),
                place: None,
            })
            .collect();
        let mut admitted: Vec<(usize, Envelope)> = Vec::new();
        for (index, m) in messages.iter().enumerate() {
            let at = m
                .timestamp_ms
                .and_then(chrono::DateTime::<chrono::Utc>::from_timestamp_millis);
            if at.is_some_and(|at| at < oldest_readable) {
                continue;
            }
            match objectives::check_message(
                m.key.as_deref(),
                m.value.as_deref(),
                &source,
                self.settings.max_event_bytes,
            ) {
                // Content events count through their items (the first phase).
                Ok(envelope) if envelope.content_id.is_some() => {}
                Ok(envelope) => {
                    if let Some(at) = at {
                        step.oldest = Some(step.oldest.map_or(at, |o| o.min(at)));
                    }
                    admitted.push((index, envelope));
                }
                // Dead-lettered when it came: nothing to count.
                Err(_) => {}
            }
        }
        self.prepare_writers(award, version, 1).await?;
        let (applied, failed, last_failure) = Writer::apply(
            &mut self.writers[0],
            &self.registry,
            award,
            &source,
            &stored,
            admitted,
        )
        .await?;
        step.applied = applied;
        step.failed = failed;
        step.last_failure = last_failure;
        Ok(step)
    }

    /// One step: `items` (in key order) through the award's objectives,
    /// split at users' boundaries among the writers, which apply their
    /// parts at once, each on its own connection (a step's users are
    /// disjoint, so their transactions never wait for each other).
    async fn step(
        &mut self,
        award: &AwardDefinition,
        version: i32,
        items: &[StoredItem],
    ) -> anyhow::Result<HistoryStep> {
        self.prepare_writers(award, version, WRITERS).await?;
        let parts = split_by_user(items, self.writers.len());
        let (registry, max_event_bytes) = (&self.registry, self.settings.max_event_bytes);
        let steps = futures_util::future::try_join_all(
            self.writers
                .iter_mut()
                .zip(parts)
                .map(|(writer, part)| writer.step(registry, max_event_bytes, award, part)),
        )
        .await?;
        let mut step = HistoryStep::default();
        for part in steps {
            step.done += part.done;
            step.changed += part.changed;
            step.unrecoverable += part.unrecoverable;
            step.failed += part.failed;
            if part.last_failure.is_some() {
                step.last_failure = part.last_failure;
            }
        }
        Ok(step)
    }

    /// At least `count` writers, connected, with plans for (award,
    /// version) as the registry is now.
    async fn prepare_writers(
        &mut self,
        award: &AwardDefinition,
        version: i32,
        count: usize,
    ) -> anyhow::Result<()> {
        let planned = Some((award.id.clone(), version, self.registry.generation()));
        if self.planned != planned {
            for writer in &mut self.writers {
                writer.plans.clear();
            }
            self.planned = planned;
        }
        for writer in &mut self.writers {
            writer.store.heal().await?;
        }
        while self.writers.len() < count {
            self.writers.push(Writer {
                store: self.store.another().await?,
                plans: HashMap::new(),
            });
        }
        Ok(())
    }
}

/// Writers a step is split among.
const WRITERS: usize = 2;

/// `items` cut into up to `parts` runs of whole users, about even.
fn split_by_user(items: &[StoredItem], parts: usize) -> Vec<&[StoredItem]> {
    let mut runs = Vec::with_capacity(parts);
    let mut rest = items;
    for left in (1..=parts.max(1)).rev() {
        let mut at = rest.len().div_ceil(left);
        while at > 0 && at < rest.len() && rest[at].user_id == rest[at - 1].user_id {
            at += 1;
        }
        let (run, after) = rest.split_at(at.min(rest.len()));
        runs.push(run);
        rest = after;
    }
    runs
}

/// A connection that applies backfill steps, with the award's objectives
/// bound per source for it.
struct Writer {
    store: Store,
    plans: HashMap<String, Plan>,
}

impl Writer {
    /// `items` (in key order) through the award's objectives, applied
    /// per source.
    async fn step(
        &mut self,
        registry: &Arc<Registry>,
        max_event_bytes: usize,
        award: &AwardDefinition,
        items: &[StoredItem],
    ) -> anyhow::Result<HistoryStep> {
        let mut step = HistoryStep {
            done: items.len() as i64,
            ..HistoryStep::default()
        };
        let mut sources: Vec<&str> = items.iter().map(|i| i.source.as_str()).collect();
        sources.sort_unstable();
        sources.dedup();
        for source in sources {
            let part: Vec<&StoredItem> = items.iter().filter(|i| i.source == source).collect();
            let messages: Vec<Message<'_>> = part
                .iter()
                .map(|i| Message {
                    topic: "",
                    partition: -1,
                    offset: -1,
                    key: Some(i.user_id.as_bytes()),
                    value: i.event.as_deref(),
                    place: None,
                })
                .collect();
            let mut admitted: Vec<(usize, Envelope)> = Vec::new();
            for (index, item) in part.iter().enumerate() {
                if item.event.is_none() {
                    step.unrecoverable += 1;
                    continue;
                }
                let m = messages[index];
                match objectives::check_message(m.key, m.value, source, max_event_bytes) {
                    Ok(envelope) if envelope.content_id.is_some() => {
                        admitted.push((index, envelope))
                    }
                    Ok(_) => {}
                    Err(reason) => {
                        step.failed += 1;
                        step.last_failure = Some(format!(
                            "item {}/{}/{}: {reason}",
                            item.user_id, source, item.content_id
                        ));
                    }
                }
            }
            let (changed, failed, last_failure) = self
                .apply(registry, award, source, &messages, admitted)
                .await?;
            step.changed += changed;
            step.failed += failed;
            if last_failure.is_some() {
                step.last_failure = last_failure;
            }
        }
        Ok(step)
    }

    /// `admitted` events of `source` (positions in `messages`) through the
    /// award's objectives, applied as a backfill. An event a function could
    /// not decide for one objective is not applied to the award at all
    /// (counted as failed: a backfill after the fix applies it whole).
    /// Returns (contributions changed, events failed, the last reason).
    async fn apply(
        &mut self,
        registry: &Arc<Registry>,
        award: &AwardDefinition,
        source: &str,
        messages: &[Message<'_>],
        mut admitted: Vec<(usize, Envelope)>,
    ) -> anyhow::Result<(i64, i64, Option<String>)> {
        // Users who get no progress, as in ingest (their events were
        // logged as skipped when they came).
        let started = std::time::Instant::now();
        let excluded = self
            .store
            .excluded_users(admitted.iter().map(|(_, e)| e.user_id.as_str()))
            .await?;
        let read = started.elapsed();
        let mut unused = Vec::new();
        admitted.retain(|(index, envelope)| {
            !objectives::skipped(*index, envelope, &excluded, &mut unused)
        });
        if admitted.is_empty() {
            return Ok((0, 0, None));
        }

        let plan = match self.plans.remove(source) {
            Some(plan) => plan,
            None => {
                let (name, awards, registry) =
                    (source.to_string(), [award.clone()], registry.clone());
                tokio::task::spawn_blocking(move || Plan::build(&name, &awards, &registry)).await?
            }
        };
        let (indexes, envelopes): (Vec<usize>, Vec<Envelope>) = admitted.into_iter().unzip();
        let indexes_len = indexes.len();
        let (plan, mut evaluation) = tokio::task::spawn_blocking(move || {
            let mut plan = plan;
            let evaluation = plan.evaluate(&envelopes, &indexes);
            (plan, evaluation)
        })
        .await?;
        self.plans.insert(source.to_string(), plan);
        let evaluated = started.elapsed();
        let mut last_failure = None;
        let held: HashSet<usize> = evaluation
            .outcomes
            .iter()
            .filter_map(|o| match &o.effect {
                Effect::Held { reason } => {
                    last_failure = Some(format!(
                        "event {} (user {}): award {}, objective {}: {reason}",
                        o.event_id, o.user_id, o.award_id, o.objective_id
                    ));
                    Some(o.index)
                }
                _ => None,
            })
            .collect();
        evaluation.outcomes.retain(|o| !held.contains(&o.index));
        let batch = Batch {
            source,
            messages,
            outcomes: &evaluation.outcomes,
            log: &evaluation.log,
            dead: &[],
            replaying: &[],
            backfill: true,
            recorded: &[],
        };
        let (applied, refused) = self.store.apply_isolating(&batch).await?;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        debug!(
            message = "Backfill step applied.",
            award = %award.id,
            %source,
            events = indexes_len,
            users_ms = ms(read),
            evaluate_ms = ms(evaluated - read),
            write_ms = ms(started.elapsed() - evaluated),
        );
        let failed = held.len() + applied.refused.len() + refused.len();
        if let Some((_, reason)) = applied.refused.first() {
            last_failure = Some(reason.clone());
        }
        if let Some(dead) = refused.first() {
            last_failure = Some(dead.reason.clone());
        }
        Ok((applied.changed as i64, failed as i64, last_failure))
    }
}

/// The background worker of every process running ingest: takes up
/// backfills as they are requested (also by other processes) until `stop`.
pub async fn run(
    database_url: String,
    registry: Arc<Registry>,
    settings: BackfillSettings,
    mut stop: watch::Receiver<bool>,
) {
    let mut backfiller: Option<Backfiller> = None;
    loop {
        if *stop.borrow() {
            return;
        }
        let pause = match backfiller.as_mut() {
            None => match Store::connect(&database_url).await {
                Ok(store) => {
                    backfiller = Some(Backfiller::new(store, registry.clone(), settings.clone()));
                    Duration::ZERO
                }
                Err(error) => {
                    warn!(message = "Backfills: cannot reach PostgreSQL; trying again.", %error);
                    Duration::from_secs(5)
                }
            },
            Some(backfiller) => match backfiller.work(None, &stop, |_| {}).await {
                Ok(Some(_)) => Duration::ZERO,
                Ok(None) => Duration::from_secs(1),
                Err(error) => {
                    warn!(message = "A backfill step failed; it is taken up again after its lease.", error = %format!("{error:#}"));
                    Duration::from_secs(5)
                }
            },
        };
        if !pause.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(user: &str, content: &str) -> StoredItem {
        StoredItem {
            user_id: user.into(),
            source: "photos".into(),
            content_id: content.into(),
            event: None,
        }
    }

    fn users(run: &[StoredItem]) -> Vec<&str> {
        run.iter().map(|i| i.user_id.as_str()).collect()
    }

    #[test]
    fn a_step_splits_at_users_boundaries_into_whole_users() {
        let items: Vec<StoredItem> = [("a", 3), ("b", 1), ("c", 2), ("d", 2)]
            .iter()
            .flat_map(|(u, n)| (0..*n).map(move |k| item(u, &k.to_string())))
            .collect();
        let runs = split_by_user(&items, 2);
        assert_eq!(runs.len(), 2);
        // Half is 4 items: a, a, a, b; c and d go to the other.
        assert_eq!(users(runs[0]), ["a", "a", "a", "b"]);
        assert_eq!(users(runs[1]), ["c", "c", "d", "d"]);
        // A cut inside a user moves past it.
        let runs = split_by_user(&items[..5], 2);
        assert_eq!(users(runs[0]), ["a", "a", "a"]);
        assert_eq!(users(runs[1]), ["b", "c"]);
        // One user: one run, the other empty; nothing: empty runs.
        let runs = split_by_user(&items[..3], 2);
        assert_eq!((runs[0].len(), runs[1].len()), (3, 0));
        assert!(split_by_user(&[], 2).iter().all(|r| r.is_empty()));
        assert_eq!(split_by_user(&items, 1)[0].len(), items.len());
    }
}
