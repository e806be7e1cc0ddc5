//! Test-only transform that misbehaves when a record's value asks it to,
//! so the pre-filter's containment can be tested with a real component:
//!
//! - `panic`: panics (a trap),
//! - `loop`: never returns (CPU budget),
//! - `sleep`: sleeps for an hour (a blocking host call),
//! - `flood`: 5,000 trips from one record (output limit; of a type awards
//!   use, so a transform told the kept types still makes them all),
//! - `bad-time`: a trip whose `occurred_at` is not a time,
//! - anything else, `USER TYPE`: one event of that user and type
//!   (authorized, occurred at the record's timestamp or the epoch).

use laurel_guest::time::rfc3339_from_millis;
use laurel_guest::{Envelope, Record, Transform};

pub struct HostileTransform;

fn event(record: &Record<'_>, n: usize, user: &str, event_type: &str) -> Envelope {
    Envelope {
        id: record.event_id(n),
        event_type: event_type.to_string(),
        user_id: user.to_string(),
        authorized: true,
        content_id: None,
        status: None,
        occurred_at: rfc3339_from_millis(record.timestamp_ms.unwrap_or(0)),
        payload: "{}".to_string(),
    }
}

impl Transform for HostileTransform {
    fn from_config(_config: &str) -> Result<Self, String> {
        Ok(HostileTransform)
    }

    fn transform(&self, record: &Record<'_>) -> Result<Vec<Envelope>, String> {
        let text = record.text()?;
        match text {
            "panic" => panic!("hostile transform panics on offset {}", record.offset),
            "loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "sleep" => {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                Ok(Vec::new())
            }
            "flood" => Ok((0..5000)
                .map(|n| event(record, n, "u-1", "navi.trip_finished"))
                .collect()),
            "bad-time" => Ok(vec![Envelope {
                occurred_at: "yesterday".into(),
                ..event(record, 0, "u-1", "navi.trip_finished")
            }]),
            other => {
                let (user, event_type) = other
                    .split_once(' ')
                    .ok_or_else(|| format!("{other:?} is not `USER TYPE`"))?;
                Ok(vec![event(record, 0, user, event_type)])
            }
        }
    }
}

laurel_guest::export_transform!(HostileTransform);
