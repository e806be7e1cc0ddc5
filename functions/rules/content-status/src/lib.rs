//! `ContentStatusRule {"counters": {"<status>": "<counter>"}}`: a content item
//! contributes 1 to the counter of its current status; a status not listed
//! (e.g. `deleted`) contributes nothing, so a status change moves one counter
//! down and another up.

use std::collections::BTreeMap;

use laurel_guest::{Contribution, Event, Rule, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    counters: BTreeMap<String, String>,
}

pub struct ContentStatusRule {
    counters: BTreeMap<String, String>,
}

impl Rule for ContentStatusRule {
    fn from_config(config: &str) -> Result<Self, String> {
        let Config { counters } = parse_config(config)?;
        if counters.is_empty() {
            return Err("`counters` is empty: map at least one status to a counter".into());
        }
        if let Some((status, _)) = counters.iter().find(|(_, counter)| counter.is_empty()) {
            return Err(format!("status `{status}` maps to an empty counter name"));
        }
        Ok(ContentStatusRule { counters })
    }

    fn contribute(&self, event: &Event<'_>) -> Result<Option<Contribution>, String> {
        if event.content_id.is_none() {
            return Err("event has no content_id: ContentStatusRule needs a content item".into());
        }
        let Some(status) = event.status else {
            return Err("event has no status: ContentStatusRule needs the content status".into());
        };
        let counter = self
            .counters
            .get(status)
            .map(|counter| (counter.clone(), 1));
        Ok(Some(Contribution::absolute(counter)))
    }
}

laurel_guest::export_rule!(ContentStatusRule);
