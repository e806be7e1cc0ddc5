//! Test-only rule that misbehaves when an event's type asks it to, so the
//! host's limits can be tested with a real component:
//!
//! - `loop`: never returns (CPU budget),
//! - `alloc`: allocates 1 GiB (memory limit),
//! - `panic`: panics (a trap),
//! - `huge`: returns a contribution of 100,000 counters (output limit),
//! - anything else: counts 1 in `count`.
//!
//! Config `{"on_create": "panic"}` makes creation itself panic.

use laurel_guest::{Contribution, Event, Rule};

pub struct Hostile;

impl Rule for Hostile {
    fn from_config(config: &str) -> Result<Self, String> {
        if config.contains("\"panic\"") {
            panic!("hostile rule panics on create");
        }
        Ok(Hostile)
    }

    fn contribute(&self, event: &Event<'_>) -> Result<Option<Contribution>, String> {
        match event.type_ {
            "loop" => {
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            "alloc" => {
                let big = vec![1u8; 1 << 30];
                std::hint::black_box(&big);
                Ok(None)
            }
            "panic" => panic!("hostile rule panics on event {}", event.id),
            "huge" => Ok(Some(Contribution::absolute(
                (0..100_000).map(|i| (format!("counter-{i}"), 1)),
            ))),
            _ => Ok(Some(Contribution::absolute([("count".to_string(), 1)]))),
        }
    }
}

laurel_guest::export_rule!(Hostile);
