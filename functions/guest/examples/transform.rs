//! `TripLines {"type": "navi.trip_finished"}`: each record is a line
//! `USER DISTANCE_M` (e.g. `u-42 5500`); it becomes one event of `type`
//! with `{"distance_m": DISTANCE_M}`, occurred at the record's timestamp.
//! The event's id is the record's place, so a record read twice makes the
//! same event.

use laurel_guest::time::rfc3339_from_millis;
use laurel_guest::{Envelope, Record, Transform, parse_config};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(rename = "type")]
    event_type: String,
}

pub struct TripLines(Config);

impl Transform for TripLines {
    fn from_config(config: &str) -> Result<Self, String> {
        parse_config(config).map(TripLines)
    }

    fn transform(&self, record: &Record<'_>) -> Result<Vec<Envelope>, String> {
        let line = record.text()?.trim();
        let (user, distance) = line
            .split_once(' ')
            .ok_or_else(|| format!("{line:?} is not `USER DISTANCE_M`"))?;
        let distance: u64 = distance
            .parse()
            .map_err(|_| format!("{distance:?} is not a whole number of metres"))?;
        let at = record.timestamp_ms.ok_or("the record has no timestamp")?;
        Ok(vec![Envelope {
            id: record.event_id(0),
            event_type: self.0.event_type.clone(),
            user_id: user.to_string(),
            authorized: true,
            content_id: None,
            status: None,
            occurred_at: rfc3339_from_millis(at),
            payload: serde_json::json!({ "distance_m": distance }).to_string(),
        }])
    }
}

laurel_guest::export_transform!(TripLines);
