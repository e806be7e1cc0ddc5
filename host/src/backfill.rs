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
//! - **What cannot be recovered is counted, not skipped silently:** items
//!   applied before Laurel kept their events (`unrecoverable`), and items a
//!   failing function held or the database refused (`failed`, with the
//!   last reason; run the backfill again after the fix). Analytics events
//!   add once per event id and are not stored; they are not backfilled.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::definitions::AwardDefinition;
use crate::event::Envelope;
use crate::ingest::{self, Plan};
use crate::registry::Registry;
use crate::store::{Batch, Effect, HistoryBackfill, HistoryStep, Message, Store, StoredItem};

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
#[derive(Debug, Clone, Copy)]
pub struct BackfillSettings {
    /// Items per step (one transaction per source in it).
    pub batch: i64,
    /// The largest event accepted (ingest's limit).
    pub max_event_bytes: usize,
}

/// Starts (or starts over) the backfill from history of `award_id`, over
/// the registered sources that some objective of it can match.
pub async fn request(
    store: &Store,
    registry: &Arc<Registry>,
    award_id: &str,
) -> anyhow::Result<HistoryBackfill> {
    let (award, version, _) = enabled_award(store, award_id).await?;
    let names: Vec<String> = store.sources().await?.into_iter().map(|s| s.name).collect();
    let registry = registry.clone();
    let sources = tokio::task::spawn_blocking(move || {
        let awards = [award];
        names
            .into_iter()
            .filter(|source| Plan::build(source, &awards, &registry).objective_count() > 0)
            .collect::<Vec<_>>()
    })
    .await?;
    let backfill = store
        .request_history_backfill(award_id, version, &sources)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no award named {award_id}"))?;
    info!(message = "Backfill from history requested.", award = %award_id, version, sources = ?sources, items = backfill.total);
    Ok(backfill)
}

/// The enabled definition of `award_id` and its version.
async fn enabled_award(
    store: &Store,
    award_id: &str,
) -> anyhow::Result<(AwardDefinition, i32, chrono::DateTime<chrono::Utc>)> {
    let row = store
        .awards()
        .await?
        .into_iter()
        .find(|r| r.id == award_id)
        .ok_or_else(|| anyhow::anyhow!("no award named {award_id}"))?;
    anyhow::ensure!(
        row.enabled,
        "award {award_id} is disabled: it counts nothing, so there is nothing to backfill"
    );
    let award: AwardDefinition = serde_json::from_value(row.definition)
        .map_err(|e| anyhow::anyhow!("award {award_id} as stored cannot be read: {e}"))?;
    Ok((award, row.version, row.updated_at))
}

/// Takes backfills from history and walks them.
pub struct Backfiller {
    store: Store,
    registry: Arc<Registry>,
    settings: BackfillSettings,
    /// Per source, the award's objectives bound, for (award, version,
    /// registry generation).
    plans: HashMap<String, Plan>,
    planned: Option<(String, i32, u64)>,
}

impl Backfiller {
    pub fn new(store: Store, registry: Arc<Registry>, settings: BackfillSettings) -> Backfiller {
        Backfiller {
            store,
            registry,
            settings,
            plans: HashMap::new(),
            planned: None,
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
        mut progress: impl FnMut(&HistoryBackfill),
    ) -> anyhow::Result<Option<HistoryBackfill>> {
        self.store.heal().await?;
        let Some(mut backfill) = self.store.claim_history_backfill(award_id, LEASE).await? else {
            return Ok(None);
        };
        info!(message = "Backfilling from history.", award = %backfill.award_id, version = backfill.award_version, done = backfill.done, total = backfill.total);
        let (award, version, updated_at) =
            match enabled_award(&self.store, &backfill.award_id).await {
                Ok(found) => found,
                Err(error) => {
                    // Deleted or disabled since: nothing more to do.
                    let step = HistoryStep {
                        last_failure: Some(error.to_string()),
                        ..HistoryStep::default()
                    };
                    let after = backfill.after.clone();
                    self.store
                        .record_history_step(
                            &backfill.award_id,
                            backfill.started_at,
                            &after,
                            &step,
                            true,
                            LEASE,
                        )
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
        loop {
            if *stop.borrow() {
                self.store
                    .release_history_backfill(&backfill.award_id, backfill.started_at)
                    .await?;
                return Ok(Some(backfill));
            }
            let items = self
                .store
                .history_items(&backfill.sources, &backfill.after, self.settings.batch)
                .await?;
            let finished = (items.len() as i64) < self.settings.batch;
            let step = self.step(&award, version, &items).await?;
            let after = items
                .last()
                .map(|i| (i.user_id.clone(), i.source.clone(), i.content_id.clone()))
                .unwrap_or_else(|| backfill.after.clone());
            let recorded = self
                .store
                .record_history_step(
                    &backfill.award_id,
                    backfill.started_at,
                    &after,
                    &step,
                    finished,
                    LEASE,
                )
                .await?;
            if !recorded {
                info!(message = "Backfill taken over or started again elsewhere; leaving it.", award = %backfill.award_id);
                return Ok(self.store.history_backfill(&backfill.award_id).await?);
            }
            backfill.after = after;
            backfill.done += step.done;
            backfill.changed += step.changed;
            backfill.unrecoverable += step.unrecoverable;
            backfill.failed += step.failed;
            if step.last_failure.is_some() {
                backfill.last_failure = step.last_failure;
            }
            if finished {
                backfill.finished_at = Some(chrono::Utc::now());
                info!(message = "Backfill from history finished.", award = %backfill.award_id, items = backfill.done, changed = backfill.changed, unrecoverable = backfill.unrecoverable, failed = backfill.failed);
            }
            progress(&backfill);
            if finished {
                return Ok(Some(backfill));
            }
        }
    }

    /// One step: `items` (in key order) through the award's objectives,
    /// applied per source.
    async fn step(
        &mut self,
        award: &AwardDefinition,
        version: i32,
        items: &[StoredItem],
    ) -> anyhow::Result<HistoryStep> {
        let mut step = HistoryStep {
            done: items.len() as i64,
            ..HistoryStep::default()
        };
        let planned = Some((award.id.clone(), version, self.registry.generation()));
        if self.planned != planned {
            self.plans.clear();
            self.planned = planned;
        }
        let mut sources: Vec<&str> = items.iter().map(|i| i.source.as_str()).collect();
        sources.sort_unstable();
        sources.dedup();
        for source in sources {
            let part: Vec<&StoredItem> = items.iter().filter(|i| i.source == source).collect();
            self.apply_source(award, source, &part, &mut step).await?;
        }
        Ok(step)
    }

    async fn apply_source(
        &mut self,
        award: &AwardDefinition,
        source: &str,
        items: &[&StoredItem],
        step: &mut HistoryStep,
    ) -> anyhow::Result<()> {
        let messages: Vec<Message<'_>> = items
            .iter()
            .map(|i| Message {
                topic: "",
                partition: -1,
                offset: -1,
                key: Some(i.user_id.as_bytes()),
                value: i.event.as_deref(),
            })
            .collect();
        let mut admitted: Vec<(usize, Envelope)> = Vec::new();
        for (index, item) in items.iter().enumerate() {
            if item.event.is_none() {
                step.unrecoverable += 1;
                continue;
            }
            let m = messages[index];
            match ingest::check_message(m.key, m.value, source, self.settings.max_event_bytes) {
                Ok(envelope) if envelope.content_id.is_some() => admitted.push((index, envelope)),
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
        // Users who get no progress, as in ingest (their events were
        // logged as skipped when they came).
        let users: Vec<&str> = admitted
            .iter()
            .map(|(_, e)| e.user_id.as_str())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let excluded = if users.is_empty() {
            HashMap::new()
        } else {
            self.store.excluded_users(&users).await?
        };
        let mut unused = Vec::new();
        admitted
            .retain(|(index, envelope)| !ingest::skipped(*index, envelope, &excluded, &mut unused));
        if admitted.is_empty() {
            return Ok(());
        }

        let plan = match self.plans.remove(source) {
            Some(plan) => plan,
            None => {
                let (name, awards, registry) =
                    (source.to_string(), [award.clone()], self.registry.clone());
                tokio::task::spawn_blocking(move || Plan::build(&name, &awards, &registry)).await?
            }
        };
        let (indexes, envelopes): (Vec<usize>, Vec<Envelope>) = admitted.into_iter().unzip();
        let (plan, evaluation) = tokio::task::spawn_blocking(move || {
            let mut plan = plan;
            let evaluation = plan.evaluate(&envelopes, &indexes);
            (plan, evaluation)
        })
        .await?;
        self.plans.insert(source.to_string(), plan);
        let held_reason = evaluation.outcomes.iter().find_map(|o| match &o.effect {
            Effect::Held { reason } => Some(format!(
                "award {}, objective {}: {reason}",
                o.award_id, o.objective_id
            )),
            _ => None,
        });
        let batch = Batch {
            source,
            messages: &messages,
            outcomes: &evaluation.outcomes,
            log: &evaluation.log,
            dead: &[],
            replaying: &[],
            backfill: true,
        };
        let (applied, refused) = ingest::apply_isolating(&mut self.store, &batch).await?;
        step.changed += applied.changed as i64;
        let held: u64 = applied.held.values().sum();
        step.failed += held as i64 + applied.refused.len() as i64 + refused.len() as i64;
        if let Some(reason) = held_reason {
            step.last_failure = Some(reason);
        }
        if let Some((_, reason)) = applied.refused.first() {
            step.last_failure = Some(reason.clone());
        }
        if let Some(dead) = refused.first() {
            step.last_failure = Some(dead.reason.clone());
        }
        Ok(())
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
                    backfiller = Some(Backfiller::new(store, registry.clone(), settings));
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
