//! `ReviewsLengthFilter {"allowed_length": N}`: reviews whose `payload.text`
//! is longer than N characters (Unicode scalar values, not bytes). An event
//! without a text does not match.

use laurel_guest::{Event, Filter, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    allowed_length: u64,
}

pub struct ReviewsLengthFilter {
    allowed_length: usize,
}

impl Filter for ReviewsLengthFilter {
    fn from_config(config: &str) -> Result<Self, String> {
        let Config { allowed_length } = parse_config(config)?;
        let allowed_length = usize::try_from(allowed_length)
            .map_err(|_| format!("`allowed_length` {allowed_length} is too large"))?;
        Ok(ReviewsLengthFilter { allowed_length })
    }

    fn matches(&self, event: &Event<'_>) -> bool {
        let Some(text) = event.text("/text") else {
            return false;
        };
        // Bytes bound characters from above: a short text can't be long enough.
        text.len() > self.allowed_length && text.chars().nth(self.allowed_length).is_some()
    }
}

laurel_guest::export_filter!(ReviewsLengthFilter);
