//! Processing-log rows: what became of each event, built beside the
//! decision from what it decided (`decide.rs` says what happened; this
//! says how the log shows it), and the text limits of what is stored.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::{Counters, LogEntry, Outcome};
use crate::store::json_text::{ObjectWriter, push_counters, push_str};

/// A processing-log row. An applied event has one row, its `deltas` and
/// `functions` keyed by award, then objective.
#[derive(Debug)]
pub(super) struct LogRow<'a> {
    pub event_id: Option<Cow<'a, str>>,
    pub user_id: Option<Cow<'a, str>>,
    pub award_id: Option<&'a str>,
    pub objective_id: Option<&'a str>,
    pub outcome: &'static str,
    pub reason: Option<Cow<'a, str>>,
    /// JSON text.
    pub deltas: Option<String>,
    /// JSON text.
    pub functions: Option<Cow<'a, str>>,
    /// JSON text: the filter that now stops the event's content item, for
    /// each objective where that moved counters, keyed by award, then
    /// objective.
    pub excluded: Option<String>,
}

/// Text from an event or a guest, safe to store: PostgreSQL refuses NUL.
pub(super) fn storable(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max && !text.chars().any(char::is_control) {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(crate::text::printable(text, max))
    }
}

/// Longest reason stored, in bytes.
pub(super) const MAX_REASON_BYTES: usize = 4096;
/// Longest id stored from a message that could not be used.
pub(super) const MAX_ID_BYTES: usize = crate::event::MAX_ID_BYTES;

impl<'a> LogRow<'a> {
    fn of(
        o: &'a Outcome,
        outcome: &'static str,
        reason: Option<Cow<'a, str>>,
        functions: &'a str,
    ) -> LogRow<'a> {
        LogRow {
            event_id: Some(Cow::Borrowed(&o.event_id)),
            user_id: Some(Cow::Borrowed(&o.user_id)),
            award_id: Some(&o.award_id),
            objective_id: Some(&o.objective_id),
            outcome,
            reason,
            deltas: None,
            functions: Some(Cow::Borrowed(functions)),
            excluded: None,
        }
    }

    /// A row about a whole event (every objective it reached).
    fn event(
        o: &'a Outcome,
        outcome: &'static str,
        reason: Option<Cow<'a, str>>,
        deltas: Option<String>,
        functions: Option<String>,
    ) -> LogRow<'a> {
        LogRow {
            event_id: Some(Cow::Borrowed(&o.event_id)),
            user_id: Some(Cow::Borrowed(&o.user_id)),
            award_id: None,
            objective_id: None,
            outcome,
            reason,
            deltas,
            functions: functions.map(Cow::Owned),
            excluded: None,
        }
    }

    /// A whole event dead-lettered before the database.
    pub fn from_entry_parts(
        event_id: Option<&'a str>,
        user_id: Option<&'a str>,
        reason: &'a str,
    ) -> LogRow<'a> {
        LogRow {
            event_id: event_id.map(|t| storable(t, MAX_ID_BYTES)),
            user_id: user_id.map(|t| storable(t, MAX_ID_BYTES)),
            award_id: None,
            objective_id: None,
            outcome: "rejected",
            reason: Some(storable(reason, MAX_REASON_BYTES)),
            deltas: None,
            functions: None,
            excluded: None,
        }
    }

    pub fn from_entry(e: &'a LogEntry) -> LogRow<'a> {
        LogRow {
            event_id: e.event_id.as_deref().map(|t| storable(t, MAX_ID_BYTES)),
            user_id: e.user_id.as_deref().map(|t| storable(t, MAX_ID_BYTES)),
            award_id: e.award_id.as_deref(),
            objective_id: e.objective_id.as_deref(),
            outcome: e.outcome,
            reason: Some(storable(&e.reason, MAX_REASON_BYTES)),
            deltas: None,
            functions: e.functions.as_deref().map(|f| Cow::Owned(f.to_string())),
            excluded: None,
        }
    }
}

impl<'a> LogRow<'a> {
    /// Skipped for one objective.
    pub fn skip(o: &'a Outcome, reason: &'static str, functions: &'a str) -> LogRow<'a> {
        LogRow::of(o, "skipped", Some(reason.into()), functions)
    }

    /// Refused for one objective.
    pub fn rejected(o: &'a Outcome, reason: &'static str, functions: &'a str) -> LogRow<'a> {
        LogRow::of(o, "rejected", Some(reason.into()), functions)
    }

    /// A whole event skipped: it was applied before.
    pub fn already_applied(o: &'a Outcome) -> LogRow<'a> {
        LogRow::event(
            o,
            "skipped",
            Some("event already applied".into()),
            None,
            None,
        )
    }

    /// A whole event refused.
    pub fn refused(o: &'a Outcome, reason: String) -> LogRow<'a> {
        LogRow::event(o, "rejected", Some(Cow::Owned(reason)), None, None)
    }

    /// One objective that could not decide.
    pub fn held(o: &'a Outcome, reason: &'a str, functions: &'a str) -> LogRow<'a> {
        LogRow::of(
            o,
            "rejected",
            Some(storable(reason, MAX_REASON_BYTES)),
            functions,
        )
    }

    /// An event applied: what it changed, objective by objective.
    pub fn applied(o: &'a Outcome, changes: &mut [Change<'_>]) -> LogRow<'a> {
        let (deltas, versions, excluded) = nested(changes);
        let mut row = LogRow::event(o, "applied", None, Some(deltas), Some(versions));
        row.excluded = excluded;
        row
    }
}

/// What an applied event changed in one objective.
pub(super) struct Change<'a> {
    pub award_id: &'a str,
    pub objective_id: &'a str,
    pub delta: Counters,
    /// The objective's function versions, JSON text.
    pub functions: &'a str,
    /// The filter that now stops the event's content item there.
    pub excluded_by: Option<&'a Arc<str>>,
}

/// An event's changes as JSON objects keyed by award, then objective: the
/// deltas, the function versions that decided them, and (where a filter
/// took an item out) the filter.
fn nested(changes: &mut [Change<'_>]) -> (String, String, Option<String>) {
    changes.sort_by(|a, b| (a.award_id, a.objective_id).cmp(&(b.award_id, b.objective_id)));
    let (mut deltas, mut versions) = (ObjectWriter::new(), ObjectWriter::new());
    let mut excluded: Option<ObjectWriter> = None;
    for per_award in changes.chunk_by(|a, b| a.award_id == b.award_id) {
        let (mut award_deltas, mut award_versions) = (ObjectWriter::new(), ObjectWriter::new());
        let mut award_excluded: Option<ObjectWriter> = None;
        for change in per_award {
            push_counters(award_deltas.key(change.objective_id), &change.delta);
            award_versions
                .key(change.objective_id)
                .push_str(change.functions);
            if let Some(filter) = change.excluded_by {
                let writer = award_excluded.get_or_insert_with(ObjectWriter::new);
                push_str(writer.key(change.objective_id), filter);
            }
        }
        let award = per_award[0].award_id;
        deltas.key(award).push_str(&award_deltas.finish());
        versions.key(award).push_str(&award_versions.finish());
        if let Some(award_excluded) = award_excluded {
            let writer = excluded.get_or_insert_with(ObjectWriter::new);
            writer.key(award).push_str(&award_excluded.finish());
        }
    }
    (
        deltas.finish(),
        versions.finish(),
        excluded.map(ObjectWriter::finish),
    )
}

/// Each objective's function versions as JSON text, once per batch: the
/// outcomes of one objective share them (keyed by the shared value's
/// address).
pub(super) struct FunctionTexts(HashMap<usize, String>);

impl FunctionTexts {
    pub fn of(outcomes: &[Outcome]) -> FunctionTexts {
        let mut texts = HashMap::new();
        for o in outcomes {
            texts
                .entry(Arc::as_ptr(&o.functions) as usize)
                .or_insert_with(|| o.functions.to_string());
        }
        FunctionTexts(texts)
    }

    /// The text of `o`'s function versions (`o` is one of the outcomes
    /// this was made of).
    pub fn get(&self, o: &Outcome) -> &str {
        &self.0[&(Arc::as_ptr(&o.functions) as usize)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storable_text_has_no_nul() {
        assert_eq!(storable("ok", 10), Cow::Borrowed("ok"));
        assert_eq!(storable("a\u{0}", 10).as_ref(), "a\\u{0}");
    }
}
