//! `MinRating {"field": "/rating", "min": 4}`: matches events whose payload
//! has a number at `field` (a JSON pointer) of at least `min`.

use laurel_guest::{Event, Filter, Value, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    field: String,
    min: f64,
}

pub struct MinRating(Config);

impl Filter for MinRating {
    fn from_config(config: &str) -> Result<Self, String> {
        let config: Config = parse_config(config)?;
        if !config.field.starts_with('/') {
            return Err(format!(
                "`field` {:?} is not a JSON pointer (e.g. \"/rating\")",
                config.field
            ));
        }
        Ok(MinRating(config))
    }

    fn matches(&self, event: &Event<'_>) -> bool {
        matches!(event.field(&self.0.field), Some(Value::Number(n)) if n >= self.0.min)
    }
}

laurel_guest::export_filter!(MinRating);
