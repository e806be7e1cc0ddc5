//! The awards worker: turns changed objective counters into award progress
//! (through each award's strategy function), completes and revokes awards,
//! and queues their notifications, all in one transaction per cycle.
//!
//! Which awards to compute comes from `award_changes` markers, written by
//! the transaction that changed the counters and claimed here with `SKIP
//! LOCKED`: a cycle costs what changed, not the size of the tables, and
//! several workers (tasks or processes) never compute one pair at once.
//! Backfills (a new or changed award) write markers too, a bounded batch at
//! a time while the queue is short, so live changes are not starved.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures_util::FutureExt;
use tracing::{debug, info, warn};

use crate::catalog::Catalog;
use crate::metrics;
use crate::progress::{AwardPlan, decide};
use crate::registry::Registry;
use crate::runtime::ObjectiveState;
use crate::store::{
    AchieveState, AchieveUpdate, ChangedAward, CycleReport, Store, StoreError, TransitionKind,
};

/// The awards worker's settings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Awards worker")]
pub struct AwardsSettings {
    /// Most changed (user, award) pairs an awards worker computes per
    /// cycle (one transaction).
    #[arg(
        id = "awards_batch",
        long = "awards-batch",
        env = "LAUREL_AWARDS_BATCH",
        default_value_t = 2000,
        value_parser = clap::value_parser!(i64).range(1..),
        value_name = "PAIRS"
    )]
    pub batch: i64,
    /// How long an idle worker waits before looking again.
    #[arg(skip = Duration::from_millis(50))]
    pub idle_wait: Duration,
    /// Users marked per backfill step.
    #[arg(skip = 1000i64)]
    pub backfill_batch: i64,
    /// Awards worker tasks per process.
    #[arg(
        id = "awards_workers",
        long = "awards-workers",
        env = "LAUREL_AWARDS_WORKERS",
        default_value = "1",
        value_parser = crate::settings::positive,
        value_name = "TASKS"
    )]
    pub workers: usize,
}

impl Default for AwardsSettings {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

/// What a worker cycle did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CycleOutcome {
    /// Changed pairs claimed.
    pub claimed: usize,
    pub report: CycleReport,
    /// Pairs whose strategy failed (their previous progress is kept).
    pub failed: usize,
}

/// One awards worker: a database connection and the awards' strategies.
pub struct AwardsWorker {
    store: Store,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    settings: AwardsSettings,
    plans: HashMap<String, AwardPlan>,
    planned: (u64, u64),
}

impl AwardsWorker {
    pub async fn new(
        database_url: &str,
        registry: Arc<Registry>,
        catalog: Arc<Catalog>,
        settings: AwardsSettings,
    ) -> Result<AwardsWorker, StoreError> {
        Ok(AwardsWorker {
            store: Store::connect(database_url).await?,
            registry,
            catalog,
            settings,
            plans: HashMap::new(),
            planned: (u64::MAX, u64::MAX),
        })
    }

    /// Plans for the catalog's awards, checked against the stored versions
    /// first: a worker never computes an award from a definition older
    /// than the one a backfill was started for.
    async fn refresh_plans(&mut self) -> Result<(), StoreError> {
        let stored = self.store.award_versions().await?;
        if self.catalog.snapshot().versions != stored {
            self.catalog.reload(&self.store).await?;
        }
        let generation = (self.catalog.generation(), self.registry.generation());
        if generation != self.planned {
            let snapshot = self.catalog.snapshot();
            self.plans = snapshot
                .awards
                .iter()
                .map(|award| {
                    let version = snapshot.versions.get(&award.id).copied().unwrap_or(0);
                    (
                        award.id.clone(),
                        AwardPlan::new(award, version, &self.registry),
                    )
                })
                .collect();
            for (id, plan) in &self.plans {
                if let Err(error) = &plan.strategy {
                    warn!(message = "An award's strategy cannot be bound; its progress is not computed.", award = %id, %error);
                }
            }
            self.planned = generation;
        }
        Ok(())
    }

    /// Claims up to a batch of changed awards, computes them and commits.
    #[tracing::instrument(name = "awards_cycle", skip_all, fields(batch = self.settings.batch))]
    pub async fn cycle(&mut self) -> Result<CycleOutcome, StoreError> {
        self.refresh_plans().await?;
        let claimed = self.store.claim_changes(self.settings.batch).await?;
        if claimed.is_empty() {
            claimed.commit(&[]).await?;
            return Ok(CycleOutcome::default());
        }
        let mut by_award: HashMap<&str, Vec<&ChangedAward>> = HashMap::new();
        for change in &claimed.changes {
            by_award.entry(&change.award_id).or_default().push(change);
        }
        let now = Utc::now();
        let mut updates = Vec::with_capacity(claimed.changes.len());
        let mut failed = 0;
        for (award_id, changes) in by_award {
            // A disabled or deleted award: its markers are consumed; a
            // re-enabled award is backfilled.
            let Some(plan) = self.plans.get_mut(award_id) else {
                continue;
            };
            let users: Vec<Vec<ObjectiveState>> = changes.iter().map(|c| plan.states(c)).collect();
            let answers = plan.evaluate(&users);
            let mut first_error = None;
            for (change, answer) in changes.iter().zip(answers) {
                let version = change
                    .objectives
                    .iter()
                    .map(|o| o.version)
                    .max()
                    .unwrap_or(0);
                let previous = change.current.as_ref();
                let (state, transition) = match answer {
                    Ok(progress) => {
                        let (completed, completed_at, transition) =
                            decide(previous, &progress, plan.revocation, now);
                        let state = AchieveState {
                            award_version: plan.version,
                            progress: progress.progress,
                            goal: progress.goal,
                            started: progress.started,
                            completed,
                            completed_at,
                            version,
                            error: None,
                        };
                        (state, transition)
                    }
                    Err(error) => {
                        failed += 1;
                        first_error.get_or_insert_with(|| error.clone());
                        // Progress stays where it was; the error says why.
                        let state = match previous {
                            Some(previous) => AchieveState {
                                award_version: plan.version,
                                version,
                                error: Some(error),
                                ..previous.clone()
                            },
                            None => AchieveState {
                                award_version: plan.version,
                                progress: 0.0,
                                goal: 0.0,
                                started: false,
                                completed: false,
                                completed_at: None,
                                version,
                                error: Some(error),
                            },
                        };
                        (state, None)
                    }
                };
                updates.push(AchieveUpdate {
                    user_id: change.user_id.clone(),
                    award_id: change.award_id.clone(),
                    state,
                    transition,
                });
            }
            if let Some(error) = first_error {
                warn!(message = "Strategy failed; progress kept as it was.", award = %award_id, %error);
            }
        }
        updates.sort_unstable_by(|a, b| (&a.user_id, &a.award_id).cmp(&(&b.user_id, &b.award_id)));
        let claimed_count = claimed.changes.len();
        let report = claimed.commit(&updates).await?;
        for update in &updates {
            if let Some(transition) = &update.transition {
                let family = match transition.kind {
                    TransitionKind::Completed => metrics::AWARDS_COMPLETED,
                    TransitionKind::Revoked => metrics::AWARDS_REVOKED,
                };
                metrics::add(family, &[("award", update.award_id.as_str())], 1);
            }
        }
        Ok(CycleOutcome {
            claimed: claimed_count,
            report,
            failed,
        })
    }

    /// Runs cycles until nothing is left to claim (tests, benchmarks).
    pub async fn drain(&mut self) -> Result<CycleOutcome, StoreError> {
        let mut total = CycleOutcome::default();
        loop {
            let outcome = self.cycle().await?;
            if outcome.claimed == 0 {
                return Ok(total);
            }
            total.claimed += outcome.claimed;
            total.failed += outcome.failed;
            total.report.updated += outcome.report.updated;
            total.report.transitions += outcome.report.transitions;
            total.report.notifications += outcome.report.notifications;
        }
    }

    /// Marks the next batch of users of a backfill in progress, if the
    /// queue of changes is short enough. True if it marked any.
    pub async fn backfill_step(&mut self) -> Result<bool, StoreError> {
        self.refresh_plans().await?;
        let room = self.settings.batch * 5;
        if self.store.pending_changes(room).await? >= room {
            return Ok(false);
        }
        let known = self.catalog.snapshot().versions.clone();
        match self
            .store
            .backfill_step(&known, self.settings.backfill_batch)
            .await?
        {
            Some(step) if step.finished && step.marked == 0 => {
                debug!(message = "Backfill finished: no users yet.", award = %step.award_id, version = step.award_version);
                Ok(false)
            }
            Some(step) if step.finished => {
                info!(message = "Backfill finished.", award = %step.award_id, version = step.award_version, users = step.marked);
                Ok(true)
            }
            Some(step) => {
                info!(message = "Backfill progress.", award = %step.award_id, version = step.award_version, users_marked = step.marked);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Runs `settings.workers` workers until `shutdown` resolves. A worker
/// finishes the cycle it is in (or its transaction rolls back and the
/// markers stay), so stopping loses nothing.
pub async fn run(
    settings: AwardsSettings,
    database_url: &str,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for n in 0..settings.workers.max(1) {
        let (settings, url, registry, catalog, stop) = (
            settings.clone(),
            database_url.to_string(),
            registry.clone(),
            catalog.clone(),
            stop_rx.clone(),
        );
        tasks.push(tokio::spawn(async move {
            work(n, settings, &url, registry, catalog, stop).await
        }));
    }
    shutdown.await;
    let _ = stop_tx.send(true);
    for task in tasks {
        let _ = task.await;
    }
    Ok(())
}

async fn work(
    n: usize,
    settings: AwardsSettings,
    database_url: &str,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut last_backfill = Instant::now() - Duration::from_secs(1);
    'connect: loop {
        if *stop.borrow() {
            return;
        }
        let mut worker = match AwardsWorker::new(
            database_url,
            registry.clone(),
            catalog.clone(),
            settings.clone(),
        )
        .await
        {
            Ok(worker) => worker,
            Err(error) => {
                warn!(message = "Awards worker cannot reach the database; retrying.", worker = n, %error);
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue 'connect;
            }
        };
        backoff = Duration::from_millis(100);
        loop {
            if *stop.borrow() {
                return;
            }
            let started = Instant::now();
            let mut busy = match worker.cycle().await {
                Ok(outcome) => {
                    if outcome.claimed > 0 {
                        debug!(
                            message = "Awards cycle.",
                            worker = n,
                            claimed = outcome.claimed,
                            ms = started.elapsed().as_millis() as u64
                        );
                    }
                    outcome.claimed as i64 >= settings.batch
                }
                Err(error) => {
                    warn!(message = "Awards cycle failed; its changes stay queued.", worker = n, %error);
                    tokio::time::sleep(backoff).await;
                    continue 'connect;
                }
            };
            if last_backfill.elapsed() >= Duration::from_millis(200) {
                last_backfill = Instant::now();
                match worker.backfill_step().await {
                    Ok(marked) => busy |= marked,
                    Err(error) => {
                        warn!(message = "Backfill step failed.", worker = n, %error);
                    }
                }
            }
            if !busy {
                tokio::select! {
                    _ = tokio::time::sleep(settings.idle_wait) => {}
                    _ = stop.changed() => return,
                }
            } else if stop.changed().now_or_never().is_some() {
                return;
            }
        }
    }
}
