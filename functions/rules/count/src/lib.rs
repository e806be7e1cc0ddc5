//! `CountRule {"counter": "<name>", "statuses": [..]}`: counts content items
//! (1 while the item's status is in `statuses`, default `["active"]`), or,
//! for events without a content item (analytics), adds 1 per event.

use laurel_guest::{
    Contribution, Event, Rule, content_counts, default_counted_statuses, parse_config,
};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    counter: String,
    #[serde(default = "default_counted_statuses")]
    statuses: Vec<String>,
}

pub struct CountRule {
    config: Config,
}

impl Rule for CountRule {
    fn from_config(config: &str) -> Result<Self, String> {
        let config: Config = parse_config(config)?;
        if config.counter.is_empty() {
            return Err("`counter` is empty".into());
        }
        Ok(CountRule { config })
    }

    fn contribute(&self, event: &Event<'_>) -> Result<Option<Contribution>, String> {
        let counter = self.config.counter.clone();
        Ok(Some(match content_counts(event, &self.config.statuses) {
            Some(true) => Contribution::absolute([(counter, 1)]),
            Some(false) => Contribution::absolute([]),
            None => Contribution::additive([(counter, 1)]),
        }))
    }
}

laurel_guest::export_rule!(CountRule);
