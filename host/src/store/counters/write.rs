//! The write step of a batch, in its transaction: content items and their
//! shares, de-duplication groups, objective counters, the events applied,
//! dead letters and holds, what became of each replay, and the processing
//! log.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use tokio_postgres::Transaction;

use super::contributions::{Contributions, nonzero};
use super::decide::{Decision, HoldReplay};
use super::keys::{ItemKey, ShareKey};
use super::log::{LogRow, MAX_ID_BYTES, MAX_REASON_BYTES, storable};
use super::order::Last;
use super::read::Claim;
use super::{Applied, Batch, Message, Outcome, Replaying};
use crate::store::json_text::{JsonText, ObjectWriter, counters_text, push_counters, push_str};
use crate::store::{QueryContext, StoreError};

/// Writes what `decision` decided for `batch` (its `outcomes` being those
/// left after `claim`); `view` is the contributions after it.
pub(super) async fn batch(
    tx: &Transaction<'_>,
    batch: &Batch<'_>,
    outcomes: &[Outcome],
    claim: &Claim<'_>,
    decision: Decision<'_>,
    view: &Contributions<'_>,
) -> Result<Applied, StoreError> {
    write_items(tx, batch, &decision, view).await?;
    write_totals(tx, &decision).await?;
    write_applied(tx, batch, outcomes, &decision).await?;

    let letters = Letters::of(batch, outcomes, claim, &decision);
    // A backfill's events are not messages: what it holds or refuses is
    // counted by the backfill, which is run again after a fix.
    if !batch.backfill {
        write_letters(tx, batch, &letters.new).await?;
    }
    let (resolved, still_held) = write_replays(tx, claim, &decision, &letters.again).await?;

    let applied = applied(claim, &decision, resolved, still_held);
    // Whole events dead-lettered before the database, then what was
    // decided here, then what was decided before.
    let mut entries: Vec<LogRow<'_>> = batch
        .dead
        .iter()
        .filter(|d| !claim.taken.contains(&d.index))
        .map(|d| LogRow::from_entry_parts(d.event_id.as_deref(), d.user_id.as_deref(), &d.reason))
        .collect();
    entries.extend(decision.log);
    entries.extend(
        batch
            .log
            .iter()
            .filter(|e| !claim.taken.contains(&e.index))
            .map(LogRow::from_entry),
    );
    write_log(tx, batch.source, &entries).await?;
    Ok(applied)
}

/// What a batch changed, as its caller is told.
fn applied(
    claim: &Claim<'_>,
    decision: &Decision<'_>,
    resolved: usize,
    still_held: usize,
) -> Applied {
    let mut held: BTreeMap<(String, String), u64> = BTreeMap::new();
    for hold in &decision.holds {
        *held
            .entry((hold.award_id.to_string(), hold.objective_id.to_string()))
            .or_default() += 1;
    }
    let replay_of: BTreeSet<usize> = claim.replaying.iter().map(|r| r.index).collect();
    Applied {
        changed: decision.changed,
        objectives: decision.totals.len(),
        refused: decision
            .refused
            .iter()
            .filter(|(index, _)| !replay_of.contains(index))
            .cloned()
            .collect(),
        held,
        resolved,
        still_held,
        taken: claim.lost,
    }
}

/// A row of `dead_letters` to write.
struct Letter<'a> {
    index: usize,
    /// (award, objective) of a hold; `None`: the whole event.
    objective: Option<(&'a str, &'a str)>,
    event_id: Option<&'a str>,
    user_id: Option<&'a str>,
    reason: &'a str,
}

async fn write_letters(
    tx: &Transaction<'_>,
    batch: &Batch<'_>,
    letters: &[Letter<'_>],
) -> Result<(), StoreError> {
    if letters.is_empty() {
        return Ok(());
    }
    let mut topic = Vec::with_capacity(letters.len());
    let mut partition: Vec<i32> = Vec::with_capacity(letters.len());
    let mut offset: Vec<i64> = Vec::with_capacity(letters.len());
    let mut key: Vec<Option<&[u8]>> = Vec::with_capacity(letters.len());
    let mut value: Vec<Option<&[u8]>> = Vec::with_capacity(letters.len());
    let mut award: Vec<Option<&str>> = Vec::with_capacity(letters.len());
    let mut objective: Vec<Option<&str>> = Vec::with_capacity(letters.len());
    let mut event_id: Vec<Option<String>> = Vec::with_capacity(letters.len());
    let mut user_id: Vec<Option<String>> = Vec::with_capacity(letters.len());
    let mut reason: Vec<String> = Vec::with_capacity(letters.len());
    let mut place: Vec<Option<&str>> = Vec::with_capacity(letters.len());
    for letter in letters {
        let message = batch
            .messages
            .get(letter.index)
            .copied()
            .unwrap_or(Message {
                topic: "",
                partition: -1,
                offset: -1,
                key: None,
                value: None,
                place: None,
            });
        topic.push(message.topic);
        place.push(message.place);
        partition.push(message.partition);
        offset.push(message.offset);
        key.push(message.key);
        value.push(message.value);
        award.push(letter.objective.map(|o| o.0));
        objective.push(letter.objective.map(|o| o.1));
        event_id.push(
            letter
                .event_id
                .map(|t| storable(t, MAX_ID_BYTES).into_owned()),
        );
        user_id.push(
            letter
                .user_id
                .map(|t| storable(t, MAX_ID_BYTES).into_owned()),
        );
        reason.push(storable(letter.reason, MAX_REASON_BYTES).into_owned());
    }
    tx.execute(
        "INSERT INTO dead_letters (source, topic, partition, \"offset\", key, value, award_id, objective_id, event_id, user_id, reason, place)
         SELECT $1, * FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bytea[], $6::bytea[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[])
         ON CONFLICT DO NOTHING",
        &[&batch.source, &topic, &partition, &offset, &key, &value, &award, &objective, &event_id, &user_id, &reason, &place],
    )
    .await
    .context("keeping dead letters")?;
    Ok(())
}

/// An item's last event and, where it moved, the event's bytes.
type ItemWrite<'a, 'b> = (&'b Last<'a>, Option<&'a [u8]>);

async fn write_items(
    tx: &Transaction<'_>,
    batch: &Batch<'_>,
    decision: &Decision<'_>,
    view: &Contributions<'_>,
) -> Result<(), StoreError> {
    let source = batch.source;
    if decision.items.is_empty() && decision.reshared.is_empty() && view.rekeyed.is_empty() {
        return Ok(());
    }
    if !decision.items.is_empty() || !decision.reshared.is_empty() {
        // Each item written: its last event's order and, where it moved, the
        // event as it came (what a backfill evaluates again).
        let mut rows: BTreeMap<ItemKey<'_>, ItemWrite<'_, '_>> = decision
            .reshared
            .iter()
            .map(|(k, last)| (*k, (last, None)))
            .collect();
        for (k, last) in &decision.items {
            let body = decision
                .item_events
                .get(k)
                .and_then(|i| batch.messages.get(*i))
                .and_then(|m| m.value);
            rows.insert(*k, (last, body));
        }
        // shares = {"<award>/<objective>": {"c": counters, "k": dedup key}}
        let mut shares: BTreeMap<ItemKey<'_>, ObjectWriter> =
            rows.keys().map(|k| (*k, ObjectWriter::new())).collect();
        for (key, stored) in &view.items {
            if stored.counters.is_empty() && stored.dedup_key.is_none() {
                continue;
            }
            if let Some(object) = shares.get_mut(&key.item()) {
                let out = object.key(&format!(
                    "{}/{}",
                    key.objective.award, key.objective.objective
                ));
                out.push_str("{\"c\":");
                push_counters(out, &stored.counters);
                if let Some(key) = stored.dedup_key {
                    out.push_str(",\"k\":");
                    push_str(out, key);
                }
                out.push('}');
            }
        }
        let (u, c): (Vec<&str>, Vec<&str>) = rows.keys().map(|k| (k.user, k.content)).unzip();
        let at: Vec<DateTime<Utc>> = rows.values().map(|(l, _)| l.order.occurred_at).collect();
        let event: Vec<&str> = rows.values().map(|(l, _)| l.order.event_id).collect();
        let place: Vec<Option<String>> = rows
            .values()
            .map(|(l, _)| l.order.place.map(|p| p.text()))
            .collect();
        // A text[][] cannot be ragged: each item's ids as one JSON array.
        let tied: Vec<String> = rows
            .values()
            .map(|(l, _)| serde_json::to_string(&l.tied).unwrap_or_else(|_| "[]".into()))
            .collect();
        let tied: Vec<JsonText<'_>> = tied.iter().map(|t| JsonText(t)).collect();
        let body: Vec<Option<&[u8]>> = rows.values().map(|(_, b)| *b).collect();
        let shares: Vec<String> = shares.into_values().map(ObjectWriter::finish).collect();
        let shares: Vec<JsonText<'_>> = shares.iter().map(|s| JsonText(s)).collect();
        // An item whose order did not move keeps the event it has.
        tx.execute(
            "INSERT INTO content_items (user_id, source, content_id, occurred_at, event_id, shares, event, place, tied)
             SELECT u, $1, c, t, e, s, b, p,
                    ARRAY(SELECT jsonb_array_elements_text(d))
             FROM unnest($2::text[], $3::text[], $4::timestamptz[], $5::text[], $6::jsonb[], $7::bytea[], $8::text[], $9::jsonb[])
                 AS k(u, c, t, e, s, b, p, d)
             ON CONFLICT (user_id, source, content_id) DO UPDATE SET
                 shares = EXCLUDED.shares,
                 event = CASE WHEN (content_items.occurred_at, content_items.event_id) = (EXCLUDED.occurred_at, EXCLUDED.event_id)
                              THEN content_items.event ELSE EXCLUDED.event END,
                 occurred_at = EXCLUDED.occurred_at, event_id = EXCLUDED.event_id,
                 place = EXCLUDED.place, tied = EXCLUDED.tied",
            &[&source, &u, &c, &at, &event, &shares, &body, &place, &tied],
        )
        .await
        .context("writing content items")?;
    }
    if !view.rekeyed.is_empty() {
        // An item may change key more than once in a batch: what counts
        // is its key before the batch and after it.
        let mut net: BTreeMap<ShareKey<'_>, (Option<&str>, Option<&str>)> = BTreeMap::new();
        for (key, old, new) in &view.rekeyed {
            net.entry(*key)
                .and_modify(|(_, last)| *last = *new)
                .or_insert((*old, *new));
        }
        let left: Vec<(ShareKey<'_>, &str)> = net
            .iter()
            .filter(|(_, (before, after))| before != after)
            .filter_map(|(k, (before, _))| before.map(|b| (*k, b)))
            .collect();
        let joined: Vec<(ShareKey<'_>, &str)> = net
            .iter()
            .filter(|(_, (before, after))| before != after)
            .filter_map(|(k, (_, after))| after.map(|a| (*k, a)))
            .collect();
        for (rows, sql, context) in [
            (
                &left,
                "DELETE FROM dedup_members WHERE ctid = ANY (ARRAY(
                     SELECT m.ctid FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS k(u, a, o, d, c)
                     CROSS JOIN LATERAL (SELECT ctid FROM dedup_members m
                         WHERE m.user_id = k.u AND m.award_id = k.a AND m.objective_id = k.o AND m.dedup_key = k.d
                           AND m.source = $1 AND m.content_id = k.c OFFSET 0) m))",
                "leaving de-duplication groups",
            ),
            (
                &joined,
                "INSERT INTO dedup_members (user_id, award_id, objective_id, dedup_key, source, content_id)
                 SELECT u, a, o, d, $1, c FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS k(u, a, o, d, c)
                 ON CONFLICT DO NOTHING",
                "joining de-duplication groups",
            ),
        ] {
            if rows.is_empty() {
                continue;
            }
            let u: Vec<&str> = rows.iter().map(|(k, _)| k.objective.user).collect();
            let a: Vec<&str> = rows.iter().map(|(k, _)| k.objective.award).collect();
            let o: Vec<&str> = rows.iter().map(|(k, _)| k.objective.objective).collect();
            let d: Vec<&str> = rows.iter().map(|(_, d)| *d).collect();
            let c: Vec<&str> = rows.iter().map(|(k, _)| k.content).collect();
            tx.execute(sql, &[&source, &u, &a, &o, &d, &c])
                .await
                .context(context)?;
        }
    }
    Ok(())
}

/// Each changed objective's new counters, written whole: the per-user
/// locks make the read-modify-write safe.
async fn write_totals(tx: &Transaction<'_>, decision: &Decision<'_>) -> Result<(), StoreError> {
    if decision.totals.is_empty() {
        return Ok(());
    }
    let (mut u, mut a, mut o) = (Vec::new(), Vec::new(), Vec::new());
    for key in decision.totals.keys() {
        u.push(key.user);
        a.push(key.award);
        o.push(key.objective);
    }
    // A counter back at zero is left out: the same as absent, and the
    // same whatever the batches were.
    let totals: Vec<String> = decision
        .totals
        .values()
        .map(|total| counters_text(&nonzero(total.clone())))
        .collect();
    let totals: Vec<JsonText<'_>> = totals.iter().map(|t| JsonText(t)).collect();
    tx.execute(
        "INSERT INTO user_objective (user_id, award_id, objective_id, counters, version)
         SELECT u, a, o, c, nextval('laurel_version')
         FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[]) AS k(u, a, o, c)
         ON CONFLICT (user_id, award_id, objective_id) DO UPDATE SET
             counters = EXCLUDED.counters, version = EXCLUDED.version, updated_at = now()",
        &[&u, &a, &o, &totals],
    )
    .await
    .context("updating objective counters")?;
    Ok(())
}

/// The events `decision` applied for the first time, and those awards
/// that credit the past counted.
async fn write_applied(
    tx: &Transaction<'_>,
    batch: &Batch<'_>,
    outcomes: &[Outcome],
    decision: &Decision<'_>,
) -> Result<(), StoreError> {
    // A backfill's events were applied by ingest before (or will be,
    // past what it had committed): only the award's own record moves.
    // Kept from when they were applied or happened, whichever is later:
    // an id is pruned only once its event is older than the horizon that
    // pruning sets, so its redelivery is refused, not counted again.
    if !decision.newly_applied.is_empty() && !batch.backfill {
        let mut users = Vec::new();
        let mut ids = Vec::new();
        let mut times = Vec::new();
        for ((user, id), occurred_at) in &decision.newly_applied {
            users.push(*user);
            ids.push(*id);
            times.push(*occurred_at);
        }
        tx.execute(
            "INSERT INTO applied_events (source, user_id, event_id, applied_at)
             SELECT $1, u, e, greatest(now(), t) FROM unnest($2::text[], $3::text[], $4::timestamptz[]) AS k(u, e, t)
             ON CONFLICT DO NOTHING",
            &[&batch.source, &users, &ids, &times],
        )
        .await
        .context("recording applied events")?;
    }
    let counted: BTreeMap<(&str, &str, &str), DateTime<Utc>> = outcomes
        .iter()
        .filter(|o| o.content_id.is_none())
        .filter(|o| batch.backfill || batch.recorded.contains(&o.award_id))
        .filter_map(|o| {
            let occurred_at = decision
                .newly_applied
                .get(&(o.user_id.as_str(), o.event_id.as_str()))?;
            Some((
                (o.award_id.as_str(), o.user_id.as_str(), o.event_id.as_str()),
                *occurred_at,
            ))
        })
        .collect();
    if !counted.is_empty() {
        let mut awards = Vec::new();
        let mut users = Vec::new();
        let mut ids = Vec::new();
        let mut times = Vec::new();
        for ((award, user, id), occurred_at) in counted {
            awards.push(award);
            users.push(user);
            ids.push(id);
            times.push(occurred_at);
        }
        tx.execute(
            "INSERT INTO award_events (award_id, source, user_id, event_id, applied_at)
             SELECT a, $1, u, e, greatest(now(), t)
             FROM unnest($2::text[], $3::text[], $4::text[], $5::timestamptz[]) AS k(a, u, e, t)
             ON CONFLICT DO NOTHING",
            &[&batch.source, &awards, &users, &ids, &times],
        )
        .await
        .context("recording the events awards counted")?;
    }
    Ok(())
}

/// The dead letters of a batch: whole events (from before the database,
/// and those refused here) and holds.
struct Letters<'a> {
    /// Rows to add, in stream order (so ids follow the stream).
    new: Vec<Letter<'a>>,
    /// Whole events replayed and refused again: their own rows, updated.
    again: Vec<Letter<'a>>,
}

impl<'a> Letters<'a> {
    fn of(
        batch: &Batch<'a>,
        outcomes: &'a [Outcome],
        claim: &Claim<'_>,
        decision: &'a Decision<'_>,
    ) -> Letters<'a> {
        let mut letters: Vec<Letter<'a>> = Vec::new();
        for dead in batch
            .dead
            .iter()
            .filter(|d| !claim.taken.contains(&d.index))
        {
            letters.push(Letter {
                index: dead.index,
                objective: None,
                event_id: dead.event_id.as_deref(),
                user_id: dead.user_id.as_deref(),
                reason: &dead.reason,
            });
        }
        let ids: HashMap<usize, (&str, &str)> = outcomes
            .iter()
            .map(|o| (o.index, (o.event_id.as_str(), o.user_id.as_str())))
            .collect();
        for (index, reason) in &decision.refused {
            let (event_id, user_id) = ids[index];
            letters.push(Letter {
                index: *index,
                objective: None,
                event_id: Some(event_id),
                user_id: Some(user_id),
                reason,
            });
        }
        for hold in &decision.holds {
            let (event_id, user_id) = ids[&hold.index];
            letters.push(Letter {
                index: hold.index,
                objective: Some((hold.award_id, hold.objective_id)),
                event_id: Some(event_id),
                user_id: Some(user_id),
                reason: hold.reason,
            });
        }
        let replayed: BTreeSet<usize> = claim.replaying.iter().map(|r| r.index).collect();
        let (again, mut new): (Vec<Letter<'a>>, Vec<Letter<'a>>) = letters
            .into_iter()
            .partition(|l| l.objective.is_none() && replayed.contains(&l.index));
        new.sort_by_key(|l| l.index);
        Letters { new, again }
    }
}

/// Marks each claimed dead letter resolved, or records why it still
/// fails; returns how many of each.
async fn write_replays(
    tx: &Transaction<'_>,
    claim: &Claim<'_>,
    decision: &Decision<'_>,
    again: &[Letter<'_>],
) -> Result<(usize, usize), StoreError> {
    let mut resolved: Vec<i64> = Vec::new();
    let mut still: Vec<(i64, String)> = Vec::new();
    for r in &claim.replaying {
        match still_failing(r, decision, again) {
            Some(reason) => still.push((r.id, reason)),
            None => resolved.push(r.id),
        }
    }
    let counts = (resolved.len(), still.len());
    if !resolved.is_empty() {
        tx.execute(
            "UPDATE dead_letters SET replayed_at = now(), attempts = attempts + 1 WHERE id = ANY($1)",
            &[&resolved],
        )
        .await
        .context("marking dead letters replayed")?;
    }
    if !still.is_empty() {
        let (ids, reasons): (Vec<i64>, Vec<String>) = still
            .into_iter()
            .map(|(id, reason)| (id, storable(&reason, MAX_REASON_BYTES).into_owned()))
            .unzip();
        tx.execute(
            "UPDATE dead_letters d SET reason = k.r, attempts = d.attempts + 1
             FROM unnest($1::bigint[], $2::text[]) AS k(id, r) WHERE d.id = k.id",
            &[&ids, &reasons],
        )
        .await
        .context("recording why dead letters still fail")?;
    }
    Ok(counts)
}

/// Why a replayed dead letter still fails; None: it is resolved.
fn still_failing(r: &Replaying, decision: &Decision<'_>, again: &[Letter<'_>]) -> Option<String> {
    match (&r.objective, decision.replayed_holds.get(&r.index)) {
        (Some(_), Some(HoldReplay::Held(reason))) => Some(reason.clone()),
        (Some(_), _) => None,
        (None, _) => again
            .iter()
            .find(|l| l.index == r.index)
            .map(|letter| letter.reason.to_string()),
    }
}

async fn write_log(
    tx: &Transaction<'_>,
    source: &str,
    rows: &[LogRow<'_>],
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let event: Vec<Option<&str>> = rows.iter().map(|r| r.event_id.as_deref()).collect();
    let user: Vec<Option<&str>> = rows.iter().map(|r| r.user_id.as_deref()).collect();
    let award: Vec<Option<&str>> = rows.iter().map(|r| r.award_id).collect();
    let objective: Vec<Option<&str>> = rows.iter().map(|r| r.objective_id).collect();
    let outcome: Vec<&str> = rows.iter().map(|r| r.outcome).collect();
    let reason: Vec<Option<&str>> = rows.iter().map(|r| r.reason.as_deref()).collect();
    let deltas: Vec<Option<JsonText<'_>>> = rows
        .iter()
        .map(|r| r.deltas.as_deref().map(JsonText))
        .collect();
    let functions: Vec<Option<JsonText<'_>>> = rows
        .iter()
        .map(|r| r.functions.as_deref().map(JsonText))
        .collect();
    let excluded: Vec<Option<JsonText<'_>>> = rows
        .iter()
        .map(|r| r.excluded.as_deref().map(JsonText))
        .collect();
    tx.execute(
        "INSERT INTO processing_log (source, event_id, user_id, award_id, objective_id, outcome, reason, deltas, functions, excluded)
         SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::jsonb[], $9::jsonb[], $10::jsonb[])",
        &[&source, &event, &user, &award, &objective, &outcome, &reason, &deltas, &functions, &excluded],
    )
    .await
    .context("writing the processing log")?;
    Ok(())
}
