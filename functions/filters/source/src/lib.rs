//! `SourceFilter {"sources": [..]}`: events from one of the listed sources.

use laurel_guest::{Event, Filter, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    sources: Vec<String>,
}

pub struct SourceFilter {
    sources: Vec<String>,
}

impl Filter for SourceFilter {
    fn from_config(config: &str) -> Result<Self, String> {
        let Config { sources } = parse_config(config)?;
        if sources.is_empty() {
            return Err("`sources` is empty: the filter would match nothing".into());
        }
        Ok(SourceFilter { sources })
    }

    fn sources(&self) -> Option<Vec<String>> {
        Some(self.sources.clone())
    }

    fn matches(&self, event: &Event<'_>) -> bool {
        self.sources.iter().any(|s| s == event.source)
    }
}

laurel_guest::export_filter!(SourceFilter);
