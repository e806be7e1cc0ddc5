//! `EventTypeFilter {"types": [..]}`: events of one of the listed types.

use laurel_guest::{Event, Filter, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    types: Vec<String>,
}

pub struct EventTypeFilter {
    types: Vec<String>,
}

impl Filter for EventTypeFilter {
    fn from_config(config: &str) -> Result<Self, String> {
        let Config { types } = parse_config(config)?;
        if types.is_empty() {
            return Err("`types` is empty: the filter would match nothing".into());
        }
        Ok(EventTypeFilter { types })
    }

    fn event_types(&self) -> Option<Vec<String>> {
        Some(self.types.clone())
    }

    fn matches(&self, event: &Event<'_>) -> bool {
        self.types.iter().any(|t| t == event.type_)
    }
}

laurel_guest::export_filter!(EventTypeFilter);
