//! `ReviewUniqueByObjectRule {}`: counts the user's reviews, one per reviewed
//! object (`payload.object_id` is the de-duplication key), in the `count`
//! counter. A review counts while its status is in `statuses` (default
//! `["active"]`).

use laurel_guest::{
    Contribution, Event, Rule, Value, content_counts, default_counted_statuses, parse_config,
};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_counted_statuses")]
    statuses: Vec<String>,
}

pub struct ReviewUniqueByObjectRule {
    statuses: Vec<String>,
}

impl Rule for ReviewUniqueByObjectRule {
    fn from_config(config: &str) -> Result<Self, String> {
        let Config { statuses } = parse_config(config)?;
        Ok(ReviewUniqueByObjectRule { statuses })
    }

    fn contribute(&self, event: &Event<'_>) -> Result<Option<Contribution>, String> {
        let Some(counts) = content_counts(event, &self.statuses) else {
            return Err("event has no content_id: a review is a content item".into());
        };
        let object_id = match event.field("/object_id") {
            Some(Value::Text(id)) if !id.is_empty() => id.to_string(),
            Some(Value::Number(n)) => n.to_string(),
            _ => return Err("payload.object_id is missing: the reviewed object is needed".into()),
        };
        let counters = counts.then(|| ("count".to_string(), 1));
        Ok(Some(
            Contribution::absolute(counters).with_dedup_key(object_id),
        ))
    }
}

laurel_guest::export_rule!(ReviewUniqueByObjectRule);
