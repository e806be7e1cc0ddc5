//! `LongReviews {"counter": "long_reviews", "min_chars": 100}`: a content
//! item counts 1 in `counter` while it is active and its `payload.text`
//! has at least `min_chars` characters; an event without a content item
//! (analytics) adds 1 when its text does.

use laurel_guest::{Contribution, Event, Rule, content_counts, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    counter: String,
    min_chars: usize,
}

pub struct LongReviews(Config);

impl Rule for LongReviews {
    fn from_config(config: &str) -> Result<Self, String> {
        let config: Config = parse_config(config)?;
        if config.counter.is_empty() {
            return Err("`counter` is empty".into());
        }
        Ok(LongReviews(config))
    }

    fn contribute(&self, event: &Event<'_>) -> Result<Option<Contribution>, String> {
        let Some(text) = event.text("/text") else {
            return Err("the payload has no `text`".into());
        };
        let long = text.chars().count() >= self.0.min_chars;
        let counter = self.0.counter.clone();
        Ok(match content_counts(event, &["active".to_string()]) {
            // A content item: its current state, which replaces the last.
            Some(counts) => Some(Contribution::absolute([(
                counter,
                i64::from(counts && long),
            )])),
            // Analytics: each event adds.
            None if long => Some(Contribution::additive([(counter, 1)])),
            None => None,
        })
    }
}

laurel_guest::export_rule!(LongReviews);
