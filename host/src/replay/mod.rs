//! Replaying dead letters after a fix (a new function version, a lifted
//! quarantine, a corrected award): the kept messages go through the same
//! checks, objectives and transaction as ingest, exactly once per
//! objective.
//!
//! - An event dead-lettered whole is processed as if it came from Kafka
//!   now: an objective that already applied it (none did) would skip it,
//!   and an event older than its item's last applied event changes
//!   nothing.
//! - An event held for one objective is evaluated for that objective
//!   alone, and applied there unless a newer event decided its item since.
//!   The claimed row is the token: a second replay finds it replayed.
//!
//! A dead letter that fails again stays, with its new reason.

pub mod raw;

use std::sync::Arc;

use tracing::info;

use crate::catalog::Catalog;
use crate::event::Envelope;
use crate::objectives::{self, Plan, Scope};
use crate::registry::Registry;
use crate::store::{Applied, Batch, LetterFilter, Message, Replaying, Store, StoredLetter};
use crate::watch::{Step, Watch};

/// How many dead letters one transaction replays.
const CHUNK: i64 = 500;

/// What a replay did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ReplayReport {
    /// Dead letters resolved: applied, or with nothing left to apply.
    pub replayed: usize,
    /// Dead letters that still fail (they stay, with their new reason).
    pub still_failing: usize,
    /// Dead letters another replay took first.
    pub taken: usize,
    /// Counters changed by the replay (objective outcomes that moved).
    pub changed: usize,
    /// A few reasons of those still failing, newest last.
    pub failures: Vec<(i64, String)>,
}

/// Replays the open dead letters of `source` that `filter` selects.
pub async fn replay(
    store: &mut Store,
    registry: &Arc<Registry>,
    catalog: &Catalog,
    source: &str,
    filter: &LetterFilter,
    max_event_bytes: usize,
) -> anyhow::Result<ReplayReport> {
    let unwatched = &crate::watch::unwatched;
    replay_watched(
        store,
        registry,
        catalog,
        source,
        filter,
        max_event_bytes,
        unwatched,
    )
    .await
}

/// [`replay`], telling `watch` how many of the letters it found at the
/// start were replayed so far.
pub async fn replay_watched(
    store: &mut Store,
    registry: &Arc<Registry>,
    catalog: &Catalog,
    source: &str,
    filter: &LetterFilter,
    max_event_bytes: usize,
    watch: Watch<'_>,
) -> anyhow::Result<ReplayReport> {
    let sources = store.sources().await?;
    anyhow::ensure!(
        sources.iter().any(|s| s.name == source),
        "no source named {source}"
    );
    let (name, awards, registry) = (source.to_string(), catalog.awards(), registry.clone());
    let mut plan =
        tokio::task::spawn_blocking(move || Plan::build(&name, &awards, &registry)).await?;
    let recorded = objectives::recorded_awards(&catalog.awards());
    let mut report = ReplayReport::default();
    let mut after = 0;
    let total = store.count_letters_to_replay(source, filter).await?;
    let mut done = 0;
    let step = |done: u64| Step {
        done: done.min(total),
        total,
        note: "",
    };
    watch(step(0));
    loop {
        let letters = store
            .letters_to_replay(source, filter, after, CHUNK)
            .await?;
        let Some(last) = letters.last() else {
            break;
        };
        after = last.id;
        let (returned, applied, failed) =
            replay_chunk(store, plan, source, &letters, max_event_bytes, &recorded).await?;
        plan = returned;
        report.replayed += applied.resolved;
        report.still_failing += applied.still_held + failed.len();
        report.taken += applied.taken;
        report.changed += applied.changed;
        for (id, reason) in failed {
            store.dead_letter_failed_again(id, &reason).await?;
            report.failures.push((id, reason));
        }
        done += letters.len() as u64;
        watch(step(done));
    }
    report.failures.truncate(20);
    info!(message = "Dead letters replayed.", source = %source, replayed = report.replayed, still_failing = report.still_failing, taken = report.taken);
    Ok(report)
}

/// One transaction's worth. Returns the plan (it moved to a blocking
/// thread), what was applied, and the letters that cannot even be read
/// as events (id, reason).
async fn replay_chunk(
    store: &mut Store,
    mut plan: Plan,
    source: &str,
    letters: &[StoredLetter],
    max_event_bytes: usize,
    recorded: &[String],
) -> anyhow::Result<(Plan, Applied, Vec<(i64, String)>)> {
    let messages: Vec<Message<'_>> = letters
        .iter()
        .map(|l| Message {
            topic: &l.topic,
            partition: l.partition,
            offset: l.offset,
            key: l.key.as_deref(),
            value: l.value.as_deref(),
            place: l.place.as_deref(),
        })
        .collect();
    let mut failed = Vec::new();
    let mut replaying = Vec::new();
    let mut admitted: Vec<(usize, Envelope, Scope)> = Vec::new();
    for (index, letter) in letters.iter().enumerate() {
        match objectives::check_message(
            letter.key.as_deref(),
            letter.value.as_deref(),
            source,
            max_event_bytes,
        ) {
            Ok(envelope) => {
                let objective = letter.award_id.clone().zip(letter.objective_id.clone());
                let scope = match &objective {
                    Some((award_id, objective_id)) => Scope::Objective {
                        award_id: award_id.clone(),
                        objective_id: objective_id.clone(),
                    },
                    None => Scope::All,
                };
                replaying.push(Replaying {
                    index,
                    id: letter.id,
                    objective,
                });
                admitted.push((index, envelope, scope));
            }
            Err(reason) => failed.push((letter.id, reason)),
        }
    }
    // Who gets no progress, as in ingest: logged, and the letter resolved.
    let excluded = store
        .excluded_users(admitted.iter().map(|(_, e, _)| e.user_id.as_str()))
        .await?;
    let mut log = Vec::new();
    admitted
        .retain(|(index, envelope, _)| !objectives::skipped(*index, envelope, &excluded, &mut log));
    let mut indexes = Vec::with_capacity(admitted.len());
    let mut envelopes = Vec::with_capacity(admitted.len());
    let mut scopes = Vec::with_capacity(admitted.len());
    for (index, envelope, scope) in admitted {
        indexes.push(index);
        envelopes.push(envelope);
        scopes.push(scope);
    }
    let (plan, evaluation) = tokio::task::spawn_blocking(move || {
        let evaluation = plan.evaluate_scoped(&envelopes, &indexes, Some(&scopes));
        (plan, evaluation)
    })
    .await?;
    log.extend(evaluation.log);
    let batch = Batch {
        source,
        messages: &messages,
        outcomes: &evaluation.outcomes,
        log: &log,
        dead: &[],
        replaying: &replaying,
        backfill: false,
        recorded,
    };
    let (applied, refused) = store.apply_isolating(&batch).await?;
    // An event PostgreSQL refuses now is kept as it was, with that reason.
    for dead in refused {
        if let Some(r) = replaying.iter().find(|r| r.index == dead.index) {
            failed.push((r.id, dead.reason));
        }
    }
    Ok((plan, applied, failed))
}
