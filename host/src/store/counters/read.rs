//! The read step of a batch, in its transaction: which replays it may
//! apply, its users locked, and the rows it touches.
//!
//! Rows are looked up by key as `unnest(keys) CROSS JOIN LATERAL (SELECT ...
//! WHERE key = k OFFSET 0)`: one index probe per key, whatever the planner's
//! statistics say. A plain join let it hash or sort the whole table while
//! the statistics were stale (a young, growing table), so a batch cost grew
//! with the table: in the latency bench, parallel scans of 200,000
//! content_items per batch, spilling to disk. OFFSET 0 keeps the subquery
//! from being folded back into a join.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio_postgres::{Row, Transaction};

use super::contributions::{Contributions, counters_from};
use super::keys::{GroupKey, ItemKey, ObjectiveKey};
use super::order::{Last, Order, Place};
use super::{Batch, Counters, Effect, Outcome, Replaying};
use crate::store::{QueryContext, StoreError};

/// The replays of a batch that are its to apply.
pub(super) struct Claim<'b> {
    /// Replays whose dead letters this batch now holds locked.
    pub replaying: Vec<&'b Replaying>,
    /// Batch indexes of the replays another replay took first: left out.
    pub taken: BTreeSet<usize>,
    /// How many replays were taken.
    pub lost: usize,
}

impl<'b> Claim<'b> {
    /// Locks the dead letters the batch replays; one another replay took
    /// (replayed already) is left out.
    pub async fn of(tx: &Transaction<'_>, batch: &Batch<'b>) -> Result<Claim<'b>, StoreError> {
        let mut replaying: Vec<&'b Replaying> = batch.replaying.iter().collect();
        let mut lost = 0;
        if !replaying.is_empty() {
            let ids: Vec<i64> = replaying.iter().map(|r| r.id).collect();
            let claimed: BTreeSet<i64> = tx
                .query(
                    "SELECT id FROM dead_letters WHERE id = ANY($1) AND replayed_at IS NULL
                     ORDER BY id FOR UPDATE",
                    &[&ids],
                )
                .await
                .context("claiming dead letters to replay")?
                .iter()
                .map(|r| r.get(0))
                .collect();
            lost = replaying.len() - claimed.len();
            replaying.retain(|r| claimed.contains(&r.id));
        }
        let taken = batch
            .replaying
            .iter()
            .filter(|r| !replaying.iter().any(|c| c.id == r.id))
            .map(|r| r.index)
            .collect();
        Ok(Claim {
            replaying,
            taken,
            lost,
        })
    }

    /// The batch's outcomes without those of the replays taken.
    pub fn outcomes(&self, batch: &Batch<'b>) -> Cow<'b, [Outcome]> {
        if self.taken.is_empty() {
            return Cow::Borrowed(batch.outcomes);
        }
        Cow::Owned(
            batch
                .outcomes
                .iter()
                .filter(|o| !self.taken.contains(&o.index))
                .cloned()
                .collect(),
        )
    }

    /// The claimed holds: (award, objective), by batch index.
    pub fn holds(&self) -> HashMap<usize, (&'b str, &'b str)> {
        self.replaying
            .iter()
            .filter_map(|r| {
                let (award, objective) = r.objective.as_ref()?;
                Some((r.index, (award.as_str(), objective.as_str())))
            })
            .collect()
    }
}

/// Locks each of the batch's users, in one order: a user's batches apply
/// one at a time. Row locks, which live in the rows rather than in
/// PostgreSQL's shared lock table, so a batch of any number of users fits:
/// a user's row is made once, then locked by each batch.
pub(super) async fn lock_users(
    tx: &Transaction<'_>,
    outcomes: &[Outcome],
) -> Result<(), StoreError> {
    let users: BTreeSet<&str> = outcomes.iter().map(|o| o.user_id.as_str()).collect();
    let users: Vec<&str> = users.into_iter().collect();
    if users.is_empty() {
        return Ok(());
    }
    // A user another batch is making: this waits for its commit.
    tx.execute(
        "INSERT INTO user_locks (user_id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
        &[&users],
    )
    .await
    .context("registering users to lock")?;
    // In the array's order (sorted), one index probe per user.
    tx.execute(
        "SELECT 1 FROM unnest($1::text[]) AS k(u)
         CROSS JOIN LATERAL (SELECT 1 FROM user_locks l WHERE l.user_id = k.u OFFSET 0 FOR UPDATE) l",
        &[&users],
    )
    .await
    .context("locking users")?;
    Ok(())
}

/// The content items of a batch as stored: the last event applied to each,
/// and its shares of every objective.
pub(super) struct Items {
    rows: Vec<Row>,
    shares: Vec<Value>,
}

impl Items {
    pub async fn read(
        tx: &Transaction<'_>,
        source: &str,
        outcomes: &[Outcome],
    ) -> Result<Items, StoreError> {
        let keys: BTreeSet<ItemKey<'_>> = outcomes.iter().filter_map(ItemKey::of).collect();
        if keys.is_empty() {
            return Ok(Items {
                rows: Vec::new(),
                shares: Vec::new(),
            });
        }
        let (u, c): (Vec<&str>, Vec<&str>) = keys.iter().map(|k| (k.user, k.content)).unzip();
        let rows = tx
            .query(
                "SELECT i.user_id, i.content_id, i.occurred_at, i.event_id, i.shares, i.place, i.tied
                 FROM unnest($2::text[], $3::text[]) AS k(u, c)
                 CROSS JOIN LATERAL (SELECT * FROM content_items i
                     WHERE i.user_id = k.u AND i.source = $1 AND i.content_id = k.c OFFSET 0) i",
                &[&source, &u, &c],
            )
            .await
            .context("reading content items")?;
        let shares = rows.iter().map(|r| r.get(4)).collect();
        Ok(Items { rows, shares })
    }

    /// Each item's last event.
    pub fn lasts(&self) -> HashMap<ItemKey<'_>, Last<'_>> {
        self.rows
            .iter()
            .map(|r| {
                let key = ItemKey {
                    user: r.get(0),
                    content: r.get(1),
                };
                let order = Order {
                    occurred_at: r.get(2),
                    event_id: r.get(3),
                    place: r.get::<_, Option<&str>>(5).and_then(Place::parse),
                };
                (
                    key,
                    Last {
                        order,
                        tied: r.get(6),
                    },
                )
            })
            .collect()
    }

    /// What the items contribute, as stored.
    pub fn contributions(&self) -> Contributions<'_> {
        let mut view = Contributions::default();
        for (row, shares) in self.rows.iter().zip(&self.shares) {
            let (user, content): (&str, &str) = (row.get(0), row.get(1));
            let Value::Object(shares) = shares else {
                continue;
            };
            for (name, share) in shares {
                if let Some((award, objective)) = name.split_once('/') {
                    let objective = ObjectiveKey {
                        user,
                        award,
                        objective,
                    };
                    view.load(objective.share(content), share);
                }
            }
        }
        view
    }
}

/// The de-duplication groups the batch touches: those its outcomes name
/// and those its items are in.
pub(super) fn groups<'a>(
    outcomes: &'a [Outcome],
    view: &Contributions<'a>,
) -> BTreeSet<GroupKey<'a>> {
    let named = outcomes.iter().filter_map(|o| match &o.effect {
        Effect::Contribution {
            dedup_key: Some(dedup),
            ..
        } => Some(ObjectiveKey::of(o).group(dedup)),
        _ => None,
    });
    named.chain(view.groups()).collect()
}

/// Every member of some de-duplication groups, with its share.
pub(super) struct Members {
    rows: Vec<Row>,
    shares: Vec<Value>,
}

impl Members {
    pub async fn read(
        tx: &Transaction<'_>,
        groups: &BTreeSet<GroupKey<'_>>,
    ) -> Result<Members, StoreError> {
        if groups.is_empty() {
            return Ok(Members {
                rows: Vec::new(),
                shares: Vec::new(),
            });
        }
        let (mut u, mut a, mut o, mut d) = (vec![], vec![], vec![], vec![]);
        for group in groups {
            u.push(group.objective.user);
            a.push(group.objective.award);
            o.push(group.objective.objective);
            d.push(group.dedup);
        }
        let rows = tx
            .query(
                "SELECT m.user_id, m.award_id, m.objective_id, m.content_id,
                        coalesce(i.shares -> (m.award_id || '/' || m.objective_id), '{}'::jsonb)
                 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS k(u, a, o, d)
                 CROSS JOIN LATERAL (SELECT * FROM dedup_members m
                     WHERE m.user_id = k.u AND m.award_id = k.a AND m.objective_id = k.o AND m.dedup_key = k.d
                     OFFSET 0) m
                 CROSS JOIN LATERAL (SELECT i.shares FROM content_items i
                     WHERE i.user_id = m.user_id AND i.source = m.source AND i.content_id = m.content_id
                     OFFSET 0) i",
                &[&u, &a, &o, &d],
            )
            .await
            .context("reading de-duplication groups")?;
        let shares = rows.iter().map(|r| r.get(4)).collect();
        Ok(Members { rows, shares })
    }

    /// Adds the members' shares to `view` (an item loaded already keeps
    /// what it has).
    pub fn load_into<'a>(&'a self, view: &mut Contributions<'a>) {
        for (row, share) in self.rows.iter().zip(&self.shares) {
            let objective = ObjectiveKey {
                user: row.get(0),
                award: row.get(1),
                objective: row.get(2),
            };
            view.load(objective.share(row.get(3)), share);
        }
    }
}

/// Where each event was in its topic, by batch index (a dead letter
/// replayed: where it first was; a backfill's stored events: not known).
pub(super) fn places<'a>(batch: &Batch<'a>) -> Vec<Option<Place<'a>>> {
    batch
        .messages
        .iter()
        .map(|m| match m.place {
            Some(place) => Place::parse(place),
            None => (m.offset >= 0).then_some(Place {
                topic: m.topic,
                partition: m.partition,
                offset: m.offset,
                n: 0,
            }),
        })
        .collect()
}

/// The batch's additive events applied before (re-delivery adds nothing),
/// by (user, event id): ids are the producer's, and two users' events may
/// share one. A backfill's count once per award: what matters is whether
/// that award counted them (live, or in an earlier pass).
///
/// With them, the horizon of that record: ids applied before it were
/// pruned, so an event from before it cannot be told from a first
/// delivery. The horizon's row is locked for share until the batch
/// commits: pruning raises it first (waiting for such batches), then
/// deletes, so a batch never misses a pruned id without seeing the horizon
/// that covers it.
pub(super) struct Seen {
    rows: Vec<Row>,
    pub horizon: Option<DateTime<Utc>>,
}

pub(super) async fn seen_additive(
    tx: &Transaction<'_>,
    batch: &Batch<'_>,
    outcomes: &[Outcome],
) -> Result<Seen, StoreError> {
    // Each key once (an event has an outcome per objective), in key order.
    let keys: BTreeSet<(&str, &str)> = outcomes
        .iter()
        .filter(|o| o.content_id.is_none())
        .map(|o| (o.user_id.as_str(), o.event_id.as_str()))
        .collect();
    if keys.is_empty() {
        return Ok(Seen {
            rows: Vec::new(),
            horizon: None,
        });
    }
    let (users, ids): (Vec<&str>, Vec<&str>) = keys.into_iter().unzip();
    let record = if batch.backfill {
        "award_events"
    } else {
        "applied_events"
    };
    let horizon = async {
        let row = tx
            .query_opt(
                "SELECT horizon FROM prune_horizons WHERE name = $1 FOR SHARE",
                &[&record],
            )
            .await
            .context("reading the de-duplication horizon")?;
        Ok::<_, StoreError>(row.and_then(|row| row.get::<_, Option<DateTime<Utc>>>(0)))
    };
    // A row of user '' was applied before ids were kept per user: it
    // stands for every user, as it did then.
    let rows = async {
        if batch.backfill {
            let award = outcomes.first().map(|o| o.award_id.as_str());
            tx.query(
                "SELECT k.u, a.event_id FROM unnest($3::text[], $4::text[]) AS k(u, e)
                 CROSS JOIN LATERAL (SELECT event_id FROM award_events a
                     WHERE a.award_id = $1 AND a.source = $2 AND a.event_id = k.e
                       AND a.user_id IN (k.u, '') LIMIT 1) a",
                &[&award, &batch.source, &users, &ids],
            )
            .await
            .context("reading the award's counted events")
        } else {
            tx.query(
                "SELECT k.u, a.event_id FROM unnest($2::text[], $3::text[]) AS k(u, e)
                 CROSS JOIN LATERAL (SELECT event_id FROM applied_events a
                     WHERE a.source = $1 AND a.event_id = k.e
                       AND a.user_id IN (k.u, '') LIMIT 1) a",
                &[&batch.source, &users, &ids],
            )
            .await
            .context("reading applied events")
        }
    };
    // Polled together, the two are pipelined on the connection (one round
    // trip), and run in the order sent: the horizon is locked first.
    let (horizon, rows) = tokio::try_join!(horizon, rows)?;
    Ok(Seen { rows, horizon })
}

impl Seen {
    /// The (user, event id) of every additive event applied before.
    pub(super) fn keys(&self) -> HashSet<(&str, &str)> {
        self.rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    }
}

/// Current counters of every objective that may change, so that each
/// event's arithmetic is checked against the real totals.
pub(super) async fn totals(
    tx: &Transaction<'_>,
    outcomes: &[Outcome],
) -> Result<Vec<Row>, StoreError> {
    let keys: BTreeSet<ObjectiveKey<'_>> = outcomes
        .iter()
        .filter(|o| !matches!(o.effect, Effect::Held { .. }))
        .map(ObjectiveKey::of)
        .collect();
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let (mut u, mut a, mut o) = (Vec::new(), Vec::new(), Vec::new());
    for key in &keys {
        u.push(key.user);
        a.push(key.award);
        o.push(key.objective);
    }
    tx.query(
        "SELECT uo.user_id, uo.award_id, uo.objective_id, uo.counters
         FROM unnest($1::text[], $2::text[], $3::text[]) AS k(u, a, o)
         CROSS JOIN LATERAL (SELECT * FROM user_objective uo
             WHERE uo.user_id = k.u AND uo.award_id = k.a AND uo.objective_id = k.o OFFSET 0) uo",
        &[&u, &a, &o],
    )
    .await
    .context("reading objective counters")
}

/// The counters of [`totals`]' rows, by objective.
pub(super) fn totals_of(rows: &[Row]) -> HashMap<ObjectiveKey<'_>, Counters> {
    rows.iter()
        .map(|r| {
            let key = ObjectiveKey {
                user: r.get(0),
                award: r.get(1),
                objective: r.get(2),
            };
            (key, counters_from(&r.get::<_, Value>(3)))
        })
        .collect()
}
