//! Test-only filter that misbehaves when an event's type asks it to, so the
//! sandbox can be tested with a real filter:
//!
//! - `sleep`: sleeps for an hour (`std::thread::sleep`: a blocking host call),
//! - `loop`: never returns (CPU budget),
//! - anything else: matches.

use std::time::Duration;

use laurel_guest::{Event, Filter};

pub struct HostileFilter;

impl Filter for HostileFilter {
    fn from_config(_config: &str) -> Result<Self, String> {
        Ok(HostileFilter)
    }

    fn matches(&self, event: &Event<'_>) -> bool {
        match event.type_ {
            "sleep" => {
                std::thread::sleep(Duration::from_secs(3600));
                false
            }
            "loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            _ => true,
        }
    }
}

laurel_guest::export_filter!(HostileFilter);
