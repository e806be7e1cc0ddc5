//! What one objective makes of one event: the typed answer of its filter
//! chain and rule. Ingest turns verdicts into counter effects; explain shows
//! them. Both get them from [`super::Plan`], so they cannot drift apart.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::store::Counters;

/// One objective's answer for one event.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    /// A filter stopped it (the first that did, in chain order).
    Excluded { filter: Arc<str> },
    /// Every filter passed it and the rule counted it.
    Counted {
        rule: Arc<str>,
        counters: Counters,
        /// Content items with the same key count once between them.
        #[serde(skip_serializing_if = "Option::is_none")]
        dedup_key: Option<String>,
        /// Added once (an analytics event), rather than replacing what its
        /// content item contributed before.
        additive: bool,
    },
    /// Every filter passed it; the rule counts nothing for it.
    Nothing { rule: Arc<str> },
    /// The rule says it cannot use the event (its reason).
    Refused { rule: Arc<str>, reason: String },
    /// A function of the chain failed, is quarantined or cannot be bound:
    /// the objective cannot decide, and the event is held for it.
    Held { reason: Arc<str> },
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Excluded { filter } => write!(f, "excluded by filter {filter}"),
            // The item's contribution is now empty (it replaces what it
            // counted before, if anything).
            Verdict::Counted { rule, counters, .. } if counters.is_empty() => {
                write!(f, "rule {rule} counts nothing for this item")
            }
            Verdict::Counted { rule, counters, .. } => {
                write!(f, "rule {rule} counts ")?;
                for (at, (name, value)) in counters.iter().enumerate() {
                    let comma = if at == 0 { "" } else { ", " };
                    write!(f, "{comma}{name} {value}")?;
                }
                Ok(())
            }
            Verdict::Nothing { rule } => write!(f, "rule {rule} counts nothing"),
            Verdict::Refused { rule, reason } => write!(f, "rule {rule} refused it: {reason}"),
            Verdict::Held { reason } => write!(f, "held: {reason}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn verdicts_read_as_sentences_and_serialize_as_data() {
        let counted = Verdict::Counted {
            rule: "ContentStatusRule".into(),
            counters: [("approved".to_string(), 1), ("photos".to_string(), 2)].into(),
            dedup_key: None,
            additive: false,
        };
        assert_eq!(
            counted.to_string(),
            "rule ContentStatusRule counts approved 1, photos 2"
        );
        assert_eq!(
            serde_json::to_value(&counted).unwrap(),
            json!({"kind": "counted", "rule": "ContentStatusRule",
                   "counters": {"approved": 1, "photos": 2}, "additive": false})
        );
        let excluded = Verdict::Excluded {
            filter: "StatusFilter".into(),
        };
        assert_eq!(excluded.to_string(), "excluded by filter StatusFilter");
        assert_eq!(
            serde_json::to_value(&excluded).unwrap(),
            json!({"kind": "excluded", "filter": "StatusFilter"})
        );
        let refused = Verdict::Refused {
            rule: "R".into(),
            reason: "no content_id".into(),
        };
        assert_eq!(refused.to_string(), "rule R refused it: no content_id");
        assert_eq!(
            Verdict::Nothing { rule: "R".into() }.to_string(),
            "rule R counts nothing"
        );
        let emptied = Verdict::Counted {
            rule: "CountRule".into(),
            counters: Counters::default(),
            dedup_key: None,
            additive: false,
        };
        assert_eq!(
            emptied.to_string(),
            "rule CountRule counts nothing for this item"
        );
        assert_eq!(
            Verdict::Held {
                reason: "award a, objective o: trapped".into()
            }
            .to_string(),
            "held: award a, objective o: trapped"
        );
    }
}
