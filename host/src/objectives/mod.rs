//! Objectives: what a source's events mean for the awards that can see
//! them, shared by every role that decides events (ingest, the
//! pre-filter, backfill, replay, explain and the shadow diff).
//!
//! - [`Plan`]: the filter chains and rules of a source's objectives, run
//!   through Wasm in batches, each event answered with a [`Verdict`].
//! - The checks every message passes before any function or database sees
//!   it ([`check_message`]), and who gets no progress ([`skipped`]).

mod plan;
mod verdict;

pub use plan::{Evaluation, Plan, Scope};
pub use verdict::Verdict;

use std::collections::HashMap;

use crate::definitions::AwardDefinition;
use crate::event::Envelope;
use crate::store::LogEntry;

/// The awards that credit the past (`"backfill": "history"`): the analytics
/// events they count are recorded by id, so a backfill counts each once.
pub fn recorded_awards(awards: &[AwardDefinition]) -> Vec<String> {
    awards
        .iter()
        .filter(|a| a.backfill.is_some())
        .map(|a| a.id.clone())
        .collect()
}

/// Whether `envelope`'s user gets no progress (not authorized, banned or
/// deleted); if so, the skip is logged.
pub fn skipped(
    index: usize,
    envelope: &Envelope,
    excluded: &HashMap<String, String>,
    log: &mut Vec<LogEntry>,
) -> bool {
    let reason = if !envelope.authorized {
        "user not authorized (authorized: false)".to_string()
    } else if let Some(state) = excluded.get(&envelope.user_id) {
        format!("user is {state}")
    } else {
        return false;
    };
    log.push(LogEntry {
        index,
        event_id: Some(envelope.id.clone()),
        user_id: Some(envelope.user_id.clone()),
        award_id: None,
        objective_id: None,
        outcome: "skipped",
        reason,
        functions: None,
    });
    true
}

/// A message's event, or why it cannot be used: the checks every message
/// passes before any function or database sees it (and again on replay).
pub fn check_message(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    source: &str,
    max_event_bytes: usize,
) -> Result<Envelope, String> {
    let Some(value) = value else {
        return Err("empty message: no value".to_string());
    };
    if value.len() > max_event_bytes {
        return Err(format!(
            "message of {} bytes is over the limit of {max_event_bytes} bytes",
            value.len()
        ));
    }
    let envelope = Envelope::parse(value).map_err(|e| e.to_string())?;
    if envelope.source != source {
        return Err(format!(
            "unknown source `{}`: this topic carries source `{source}`",
            envelope.source
        ));
    }
    match key {
        Some(key) if key != envelope.user_id.as_bytes() => Err(format!(
            "message key `{}` is not the event's user_id `{}`",
            String::from_utf8_lossy(key),
            envelope.user_id
        )),
        _ => Ok(envelope),
    }
}

/// The `id` of a message that could not be used, if it has one to read.
pub fn raw_event_id(payload: Option<&[u8]>, limit: usize) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct JustId {
        id: Option<serde_json::Value>,
    }
    let payload = payload.filter(|p| p.len() <= limit)?;
    match serde_json::from_slice::<JustId>(payload).ok()?.id? {
        serde_json::Value::String(id) => Some(id),
        _ => None,
    }
}
