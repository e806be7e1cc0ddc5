//! `StatusFilter {"statuses": [..]}`: events whose content status is listed.
//! Events without a status (analytics) never match.

use laurel_guest::{Event, Filter, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    statuses: Vec<String>,
}

pub struct StatusFilter {
    statuses: Vec<String>,
}

impl Filter for StatusFilter {
    fn from_config(config: &str) -> Result<Self, String> {
        let Config { statuses } = parse_config(config)?;
        if statuses.is_empty() {
            return Err("`statuses` is empty: the filter would match nothing".into());
        }
        Ok(StatusFilter { statuses })
    }

    fn matches(&self, event: &Event<'_>) -> bool {
        event
            .status
            .is_some_and(|status| self.statuses.iter().any(|s| s == status))
    }
}

laurel_guest::export_filter!(StatusFilter);
