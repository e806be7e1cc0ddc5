//! Award state per user (`user_achieve`), the change markers that say which
//! awards to compute again, transitions, backfills and the delivery outbox.
//!
//! A worker cycle is one transaction: claim markers (deleting them, skipping
//! markers another worker holds), read the objectives of the claimed
//! (user, award) pairs, and write their new state with any transition and
//! its notifications. Why no change is lost between a writer and a worker is
//! in ARCHITECTURE.md ("Finding what changed").

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::Transaction;

use super::{Counters, QueryContext, Store, StoreError};

/// Announced when notifications are queued.
pub const OUTBOX_CHANNEL: &str = "laurel_outbox";

/// A user's state of one award, as last computed.
#[derive(Debug, Clone, PartialEq)]
pub struct AchieveState {
    pub award_version: i32,
    pub progress: f64,
    pub goal: f64,
    pub started: bool,
    pub completed: bool,
    pub completed_at: Option<DateTime<Utc>>,
    pub version: i64,
    pub error: Option<String>,
}

/// One objective's counters for one user.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectiveCounters {
    pub objective_id: String,
    pub counters: Counters,
    pub version: i64,
}

/// A claimed (user, award) pair with what computing it needs.
#[derive(Debug, Clone)]
pub struct ChangedAward {
    pub user_id: String,
    pub award_id: String,
    pub marked_at: DateTime<Utc>,
    pub objectives: Vec<ObjectiveCounters>,
    pub current: Option<AchieveState>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionKind {
    Completed,
    Revoked,
}

impl TransitionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TransitionKind::Completed => "completed",
            TransitionKind::Revoked => "revoked",
        }
    }
}

/// A completion or revocation, written once with the state that caused it.
#[derive(Debug, Clone)]
pub struct Transition {
    pub kind: TransitionKind,
    pub reason: Option<String>,
}

/// The new state of a claimed pair.
#[derive(Debug, Clone)]
pub struct AchieveUpdate {
    pub user_id: String,
    pub award_id: String,
    pub state: AchieveState,
    pub transition: Option<Transition>,
}

/// A transition as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct TransitionRow {
    pub id: i64,
    pub user_id: String,
    pub award_id: String,
    pub kind: String,
    pub progress: f64,
    pub goal: f64,
    pub reason: Option<String>,
    pub at: DateTime<Utc>,
}

/// What a committed cycle wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CycleReport {
    pub updated: usize,
    pub transitions: usize,
    pub notifications: usize,
}

/// A worker cycle's open transaction: the markers it claimed stay claimed
/// (locked, deleted) until [`ClaimedChanges::commit`]; dropping it without
/// committing puts them back.
pub struct ClaimedChanges<'a> {
    tx: Transaction<'a>,
    pub changes: Vec<ChangedAward>,
}

/// A backfill in progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Backfill {
    pub award_id: String,
    pub award_version: i32,
    pub marked: i64,
    pub finished: bool,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl Store {
    /// Claims up to `limit` changed (user, award) pairs, skipping those
    /// another worker holds, and reads their objectives and current state.
    pub async fn claim_changes(&mut self, limit: i64) -> Result<ClaimedChanges<'_>, StoreError> {
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting an awards cycle")?;
        // Deleting is the claim: the rows stay locked until commit, so
        // writers that want to mark them again wait for this cycle. By the
        // locked rows' ctids: a join back to the queue could be planned as
        // a scan of all of it.
        let claimed = tx
            .query(
                "DELETE FROM award_changes WHERE ctid = ANY (ARRAY(
                     SELECT ctid FROM award_changes LIMIT $1 FOR UPDATE SKIP LOCKED))
                 RETURNING user_id, award_id, marked_at",
                &[&limit],
            )
            .await
            .context("claiming changed awards")?;
        if claimed.is_empty() {
            return Ok(ClaimedChanges {
                tx,
                changes: Vec::new(),
            });
        }
        // In key order: the lookups below then walk the primary keys'
        // indexes in order instead of jumping around them.
        let mut keys: Vec<(&str, &str)> = claimed.iter().map(|r| (r.get(0), r.get(1))).collect();
        keys.sort_unstable();
        let (users, awards): (Vec<&str>, Vec<&str>) = keys.into_iter().unzip();
        // A later statement, so a later snapshot: every change committed
        // before it is read here; any other will mark the pair again. One
        // index probe per key (LATERAL ... OFFSET 0), as in counters.rs.
        let objective_rows = tx
            .query(
                "SELECT uo.user_id, uo.award_id, uo.objective_id, uo.counters, uo.version
                 FROM unnest($1::text[], $2::text[]) AS k(u, a)
                 CROSS JOIN LATERAL (SELECT * FROM user_objective uo
                     WHERE uo.user_id = k.u AND uo.award_id = k.a OFFSET 0) uo",
                &[&users, &awards],
            )
            .await
            .context("reading the objectives of changed awards")?;
        let state_rows = tx
            .query(
                "SELECT ua.user_id, ua.award_id, ua.award_version, ua.progress, ua.goal, ua.started,
                        ua.completed, ua.completed_at, ua.version, ua.error
                 FROM unnest($1::text[], $2::text[]) AS k(u, a)
                 CROSS JOIN LATERAL (SELECT * FROM user_achieve ua
                     WHERE ua.user_id = k.u AND ua.award_id = k.a OFFSET 0) ua",
                &[&users, &awards],
            )
            .await
            .context("reading the state of changed awards")?;
        // Banned and deleted users get no awards from the worker either
        // (backfills, changed definitions): their markers are consumed and
        // nothing is computed; restoring a user marks their awards again.
        let mut distinct: Vec<&str> = users.clone();
        distinct.dedup();
        let excluded: std::collections::HashSet<String> = tx
            .query(
                "SELECT u.user_id FROM unnest($1::text[]) AS k(u)
                 CROSS JOIN LATERAL (SELECT user_id FROM users u
                     WHERE u.user_id = k.u AND u.state <> 'active' OFFSET 0) u",
                &[&distinct],
            )
            .await
            .context("reading the states of changed awards' users")?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut objectives: HashMap<(&str, &str), Vec<ObjectiveCounters>> = HashMap::new();
        for row in &objective_rows {
            objectives
                .entry((row.get(0), row.get(1)))
                .or_default()
                .push(ObjectiveCounters {
                    objective_id: row.get(2),
                    counters: super::counters::counters_from(&row.get::<_, Value>(3)),
                    version: row.get(4),
                });
        }
        let mut states: HashMap<(&str, &str), AchieveState> = state_rows
            .iter()
            .map(|row| ((row.get(0), row.get(1)), achieve_state(row, 2)))
            .collect();
        let mut changes: Vec<ChangedAward> = claimed
            .iter()
            .filter(|row| !excluded.contains(row.get::<_, &str>(0)))
            .map(|row| {
                let key: (&str, &str) = (row.get(0), row.get(1));
                ChangedAward {
                    user_id: key.0.to_string(),
                    award_id: key.1.to_string(),
                    marked_at: row.get(2),
                    objectives: objectives.remove(&key).unwrap_or_default(),
                    current: states.remove(&key),
                }
            })
            .collect();
        // Written back in key order too (and two workers' upserts can't
        // wait on each other in opposite orders).
        changes.sort_unstable_by(|a, b| (&a.user_id, &a.award_id).cmp(&(&b.user_id, &b.award_id)));
        Ok(ClaimedChanges { tx, changes })
    }

    /// The award versions as stored now (a worker checks its catalog
    /// against them every cycle).
    pub async fn award_versions(&self) -> Result<HashMap<String, i32>, StoreError> {
        let rows = self
            .client()
            .query("SELECT id, version FROM awards", &[])
            .await
            .context("reading award versions")?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// A user's award states.
    pub async fn user_achievements(
        &self,
        user_id: &str,
    ) -> Result<Vec<(String, AchieveState)>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT award_id, award_version, progress, goal, started, completed, completed_at, version, error
                 FROM user_achieve WHERE user_id = $1 ORDER BY award_id",
                &[&user_id],
            )
            .await
            .context("reading a user's awards")?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), achieve_state(r, 1)))
            .collect())
    }

    /// A user's transitions, oldest first.
    pub async fn user_transitions(&self, user_id: &str) -> Result<Vec<TransitionRow>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT id, user_id, award_id, kind, progress, goal, reason, at FROM award_transitions
                 WHERE user_id = $1 ORDER BY id",
                &[&user_id],
            )
            .await
            .context("reading a user's award transitions")?;
        Ok(rows
            .iter()
            .map(|r| TransitionRow {
                id: r.get(0),
                user_id: r.get(1),
                award_id: r.get(2),
                kind: r.get(3),
                progress: r.get(4),
                goal: r.get(5),
                reason: r.get(6),
                at: r.get(7),
            })
            .collect())
    }

    /// Per award: how many users' progress is stale because the strategy
    /// failed for them, and one of the errors.
    pub async fn strategy_errors(&self) -> Result<Vec<(String, i64, String)>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT award_id, count(*), min(error) FROM user_achieve WHERE error IS NOT NULL
                 GROUP BY award_id ORDER BY award_id",
                &[],
            )
            .await
            .context("reading strategy errors")?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }

    /// How many changes wait for a worker (counting at most `up_to`).
    pub async fn pending_changes(&self, up_to: i64) -> Result<i64, StoreError> {
        let row = self
            .client()
            .query_one(
                "SELECT count(*) FROM (SELECT 1 FROM award_changes LIMIT $1) pending",
                &[&up_to],
            )
            .await
            .context("counting pending award changes")?;
        Ok(row.get(0))
    }

    /// Asks for an award to be computed again for every user with counters
    /// for it (e.g. after a strategy function was fixed).
    pub async fn request_backfill(&self, award_id: &str) -> Result<bool, StoreError> {
        let n = self
            .client()
            .execute(
                "INSERT INTO award_backfills (award_id, award_version)
                 SELECT id, version FROM awards WHERE id = $1
                 ON CONFLICT (award_id) DO UPDATE SET award_version = EXCLUDED.award_version,
                     next_user = '', marked = 0, started_at = now(), finished_at = NULL",
                &[&award_id],
            )
            .await
            .context("requesting a backfill")?;
        Ok(n > 0)
    }

    /// Marks the next `limit` users of one unfinished backfill whose award
    /// version is one of `known` (the caller's catalog), unless another
    /// worker is doing that backfill's step. Returns the backfill as it
    /// stands after the step, or None when there was nothing to do.
    pub async fn backfill_step(
        &mut self,
        known: &HashMap<String, i32>,
        limit: i64,
    ) -> Result<Option<Backfill>, StoreError> {
        let tx = self
            .client_mut()
            .transaction()
            .await
            .context("starting a backfill step")?;
        let ids: Vec<&str> = known.keys().map(String::as_str).collect();
        let versions: Vec<i32> = ids.iter().map(|id| known[*id]).collect();
        let Some(row) = tx
            .query_opt(
                "SELECT b.award_id, b.award_version, b.next_user, b.marked FROM award_backfills b
                 JOIN unnest($1::text[], $2::int[]) AS k(a, v) ON b.award_id = k.a AND b.award_version = k.v
                 WHERE b.finished_at IS NULL
                 ORDER BY b.started_at LIMIT 1 FOR UPDATE OF b SKIP LOCKED",
                &[&ids, &versions],
            )
            .await
            .context("claiming a backfill")?
        else {
            return Ok(None);
        };
        let award_id: String = row.get(0);
        let award_version: i32 = row.get(1);
        let next_user: String = row.get(2);
        let marked: i64 = row.get(3);
        // A pair a worker holds right now is being computed from
        // counters at least as new: DO NOTHING is enough here.
        let step = tx
            .query_one(
                "WITH users AS (
                     SELECT DISTINCT user_id FROM user_objective
                     WHERE award_id = $1 AND user_id > $2 ORDER BY user_id LIMIT $3
                 ), marked AS (
                     INSERT INTO award_changes (user_id, award_id) SELECT user_id, $1 FROM users
                     ON CONFLICT DO NOTHING
                 )
                 SELECT count(*), max(user_id) FROM users",
                &[&award_id, &next_user, &limit],
            )
            .await
            .context("marking a backfill's users")?;
        let count: i64 = step.get(0);
        let last: Option<String> = step.get(1);
        let finished = count < limit;
        let row = tx
            .query_one(
                "UPDATE award_backfills SET next_user = coalesce($2, next_user), marked = marked + $3,
                     finished_at = CASE WHEN $4 THEN now() END
                 WHERE award_id = $1 RETURNING started_at, finished_at",
                &[&award_id, &last, &count, &finished],
            )
            .await
            .context("recording a backfill's progress")?;
        tx.commit().await.context("committing a backfill step")?;
        Ok(Some(Backfill {
            award_id,
            award_version,
            marked: marked + count,
            finished,
            started_at: row.get(0),
            finished_at: row.get(1),
        }))
    }

    /// Every backfill, newest first.
    pub async fn backfills(&self) -> Result<Vec<Backfill>, StoreError> {
        let rows = self
            .client()
            .query(
                "SELECT award_id, award_version, marked, started_at, finished_at FROM award_backfills
                 ORDER BY started_at DESC",
                &[],
            )
            .await
            .context("reading backfills")?;
        Ok(rows
            .iter()
            .map(|r| Backfill {
                award_id: r.get(0),
                award_version: r.get(1),
                marked: r.get(2),
                finished: r.get::<_, Option<DateTime<Utc>>>(4).is_some(),
                started_at: r.get(3),
                finished_at: r.get(4),
            })
            .collect())
    }
}

fn achieve_state(row: &tokio_postgres::Row, at: usize) -> AchieveState {
    AchieveState {
        award_version: row.get(at),
        progress: row.get(at + 1),
        goal: row.get(at + 2),
        started: row.get(at + 3),
        completed: row.get(at + 4),
        completed_at: row.get(at + 5),
        version: row.get(at + 6),
        error: row.get(at + 7),
    }
}

impl ClaimedChanges<'_> {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Writes the new states, their transitions and the notifications of
    /// every webhook that wants them, and releases the claimed markers.
    pub async fn commit(self, updates: &[AchieveUpdate]) -> Result<CycleReport, StoreError> {
        let tx = self.tx;
        let mut report = CycleReport::default();
        if !updates.is_empty() {
            let mut u: Vec<&str> = Vec::with_capacity(updates.len());
            let mut a: Vec<&str> = Vec::with_capacity(updates.len());
            let mut av: Vec<i32> = Vec::with_capacity(updates.len());
            let mut progress: Vec<f64> = Vec::with_capacity(updates.len());
            let mut goal: Vec<f64> = Vec::with_capacity(updates.len());
            let mut started: Vec<bool> = Vec::with_capacity(updates.len());
            let mut completed: Vec<bool> = Vec::with_capacity(updates.len());
            let mut completed_at: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(updates.len());
            let mut version: Vec<i64> = Vec::with_capacity(updates.len());
            let mut error: Vec<Option<&str>> = Vec::with_capacity(updates.len());
            for update in updates {
                let s = &update.state;
                u.push(&update.user_id);
                a.push(&update.award_id);
                av.push(s.award_version);
                progress.push(s.progress);
                goal.push(s.goal);
                started.push(s.started);
                completed.push(s.completed);
                completed_at.push(s.completed_at);
                version.push(s.version);
                error.push(s.error.as_deref());
            }
            tx.execute(
                "INSERT INTO user_achieve (user_id, award_id, award_version, progress, goal, remaining,
                                           started, completed, completed_at, version, error)
                 SELECT u, a, av, p, g, greatest(g - p, 0), s, c, ca, v, e
                 FROM unnest($1::text[], $2::text[], $3::int[], $4::float8[], $5::float8[], $6::bool[],
                             $7::bool[], $8::timestamptz[], $9::bigint[], $10::text[])
                      AS k(u, a, av, p, g, s, c, ca, v, e)
                 ON CONFLICT (user_id, award_id) DO UPDATE SET
                     award_version = EXCLUDED.award_version, progress = EXCLUDED.progress,
                     goal = EXCLUDED.goal, remaining = EXCLUDED.remaining, started = EXCLUDED.started,
                     completed = EXCLUDED.completed, completed_at = EXCLUDED.completed_at,
                     version = EXCLUDED.version, error = EXCLUDED.error, updated_at = now()",
                &[
                    &u,
                    &a,
                    &av,
                    &progress,
                    &goal,
                    &started,
                    &completed,
                    &completed_at,
                    &version,
                    &error,
                ],
            )
            .await
            .context("writing award states")?;
            report.updated = updates.len();

            let transitions: Vec<&AchieveUpdate> =
                updates.iter().filter(|u| u.transition.is_some()).collect();
            if !transitions.is_empty() {
                let u: Vec<&str> = transitions.iter().map(|t| t.user_id.as_str()).collect();
                let a: Vec<&str> = transitions.iter().map(|t| t.award_id.as_str()).collect();
                let kind: Vec<&str> = transitions
                    .iter()
                    .filter_map(|t| t.transition.as_ref().map(|t| t.kind.as_str()))
                    .collect();
                let reason: Vec<Option<&str>> = transitions
                    .iter()
                    .map(|t| t.transition.as_ref().and_then(|t| t.reason.as_deref()))
                    .collect();
                let progress: Vec<f64> = transitions.iter().map(|t| t.state.progress).collect();
                let goal: Vec<f64> = transitions.iter().map(|t| t.state.goal).collect();
                // A completion happens at its completed_at; a revocation now.
                let at: Vec<DateTime<Utc>> = transitions
                    .iter()
                    .map(|t| t.state.completed_at.unwrap_or_else(Utc::now))
                    .collect();
                // The idempotency key is derived from the transition's id:
                // every retry of one delivery carries the same key, and
                // every webhook sees the same key for one completion.
                let row = tx
                    .query_one(
                        "WITH t AS (
                             INSERT INTO award_transitions (user_id, award_id, kind, progress, goal, reason, at)
                             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[], $5::float8[],
                                                  $6::text[], $7::timestamptz[])
                             RETURNING *
                         ), n AS (
                             INSERT INTO notifications (transition_id, webhook, payload)
                             SELECT t.id, w.name, jsonb_strip_nulls(jsonb_build_object(
                                 'type', 'award.' || t.kind,
                                 'user_id', t.user_id,
                                 'award_id', t.award_id,
                                 'completed_at', CASE WHEN t.kind = 'completed'
                                     THEN to_char(t.at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') END,
                                 'revoked_at', CASE WHEN t.kind = 'revoked'
                                     THEN to_char(t.at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') END,
                                 'reason', t.reason,
                                 'progress', t.progress,
                                 'goal', t.goal,
                                 'idempotency_key', md5('laurel/' || t.kind || '/' || t.award_id || '/' || t.user_id || '/' || t.id)::uuid::text))
                             FROM t JOIN webhooks w ON 'award.' || t.kind = ANY (w.events)
                             RETURNING 1
                         )
                         SELECT (SELECT count(*) FROM t), (SELECT count(*) FROM n)",
                        &[&u, &a, &kind, &progress, &goal, &reason, &at],
                    )
                    .await
                    .context("recording award transitions")?;
                report.transitions = row.get::<_, i64>(0) as usize;
                report.notifications = row.get::<_, i64>(1) as usize;
                if report.notifications > 0 {
                    tx.execute("SELECT pg_notify($1, '')", &[&OUTBOX_CHANNEL])
                        .await
                        .context("announcing notifications")?;
                }
            }
        }
        tx.commit().await.context("committing an awards cycle")?;
        Ok(report)
    }
}
