//! Test-only filter that misbehaves when an event's type asks it to, so the
//! sandbox can be tested with a real filter:
//!
//! - `sleep`: sleeps for an hour (`std::thread::sleep`: a blocking host call),
//! - `loop`: never returns (CPU budget),
//! - anything else: matches.
//!
//! Its config may ask it to declare odd sources: `"sources": N` declares N
//! of them (`s-0`, `s-1`, ...), `"bad_source": true` one with a NUL in it.

use std::time::Duration;

use laurel_guest::{Event, Filter};

pub struct HostileFilter {
    sources: Option<Vec<String>>,
}

impl Filter for HostileFilter {
    fn from_config(config: &str) -> Result<Self, String> {
        let config: serde_json::Value = serde_json::from_str(config).map_err(|e| e.to_string())?;
        let mut sources = config["sources"]
            .as_u64()
            .map(|n| (0..n).map(|i| format!("s-{i}")).collect::<Vec<_>>());
        if config["bad_source"].as_bool() == Some(true) {
            sources = Some(vec!["bad\0name".to_string()]);
        }
        Ok(HostileFilter { sources })
    }

    fn sources(&self) -> Option<Vec<String>> {
        self.sources.clone()
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
