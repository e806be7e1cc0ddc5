//! `SumFieldRule {"field": "distance_m", "counter": "metres", "scale": 1}`:
//! adds a numeric payload field (times `scale`, rounded to a whole unit) to
//! the counter. Events without a content item (analytics) add; for a content
//! item, its latest value counts while its status is in `statuses` (default
//! `["active"]`).

use laurel_guest::{
    Contribution, Event, Rule, Value, content_counts, default_counted_statuses, parse_config,
};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    field: String,
    counter: String,
    #[serde(default = "one")]
    scale: f64,
    #[serde(default = "default_counted_statuses")]
    statuses: Vec<String>,
}

fn one() -> f64 {
    1.0
}

pub struct SumFieldRule {
    pointer: String,
    config: Config,
}

impl Rule for SumFieldRule {
    fn from_config(config: &str) -> Result<Self, String> {
        let config: Config = parse_config(config)?;
        if config.field.is_empty() || config.field == "/" {
            return Err("`field` is empty".into());
        }
        if config.counter.is_empty() {
            return Err("`counter` is empty".into());
        }
        if !config.scale.is_finite() || config.scale <= 0.0 {
            return Err(format!(
                "`scale` must be a positive number, got {}",
                config.scale
            ));
        }
        let pointer = if config.field.starts_with('/') {
            config.field.clone()
        } else {
            format!("/{}", config.field)
        };
        Ok(SumFieldRule { pointer, config })
    }

    fn contribute(&self, event: &Event<'_>) -> Result<Option<Contribution>, String> {
        let value = match event.field(&self.pointer) {
            Some(Value::Number(n)) => n * self.config.scale,
            Some(_) => return Err(format!("payload field {} is not a number", self.pointer)),
            None => return Err(format!("payload field {} is missing", self.pointer)),
        };
        // `as` saturates; a value that large is bad input, not a counter.
        if !value.is_finite() || value.abs() >= 9.0e15 {
            return Err(format!(
                "payload field {} is out of range: {value}",
                self.pointer
            ));
        }
        let amount = value.round() as i64;
        let counter = self.config.counter.clone();
        Ok(Some(match content_counts(event, &self.config.statuses) {
            Some(true) => Contribution::absolute([(counter, amount)]),
            Some(false) => Contribution::absolute([]),
            None => Contribution::additive([(counter, amount)]),
        }))
    }
}

laurel_guest::export_rule!(SumFieldRule);
