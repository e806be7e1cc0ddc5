//! Test-only rule that misbehaves when an event's type asks it to, so the
//! host's limits can be tested with a real component:
//!
//! - `loop`: never returns (CPU budget),
//! - `alloc`: allocates 1 GiB (memory limit),
//! - `panic`: panics (a trap),
//! - `huge`: returns a contribution of 100,000 counters (output limit),
//! - `alias`: returns 64 counters whose names are all the same 1 MiB of
//!   its memory (what the host reads is bounded, not what the guest has),
//! - `sleep`: sleeps for an hour (`std::thread::sleep`: a blocking host call),
//! - `clock`: counts what the clocks and the random generator say
//!   (`wall`: seconds since the Unix epoch, `monotonic`: nanoseconds since
//!   the instance's first call, `random`: 31 random bits),
//! - anything else: counts 1 in `count`.
//!
//! Config `{"on_create": "panic"}` makes creation itself panic.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use laurel_guest::{Contribution, Event, Rule};

pub struct Hostile;

/// When the instance first read the monotonic clock.
static FIRST: OnceLock<Instant> = OnceLock::new();

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
            "alias" => Ok(Some(Contribution::absolute(aliased(64, 1 << 20)))),
            "sleep" => {
                std::thread::sleep(Duration::from_secs(3600));
                Ok(None)
            }
            "clock" => {
                let wall = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(-1, |d| d.as_secs() as i64);
                let monotonic = FIRST.get_or_init(Instant::now).elapsed().as_nanos() as i64;
                let random = getrandom::u32().map_err(|e| e.to_string())? >> 1;
                Ok(Some(Contribution::absolute([
                    ("wall".to_string(), wall),
                    ("monotonic".to_string(), monotonic),
                    ("random".to_string(), i64::from(random)),
                ])))
            }
            _ => Ok(Some(Contribution::absolute([("count".to_string(), 1)]))),
        }
    }
}

/// `count` counters whose names all point at one leaked buffer of `bytes`
/// bytes: little memory in the guest, `count * bytes` for whoever copies
/// the answer out.
fn aliased(count: usize, bytes: usize) -> Vec<(String, i64)> {
    let name: &'static mut str = Box::leak("n".repeat(bytes).into_boxed_str());
    let ptr = name.as_mut_ptr();
    (0..count)
        .map(|_| {
            // SAFETY: not safe, on purpose: every String owns the same
            // leaked buffer. The host refuses the answer before any is
            // freed (a freed one would be a double free, which traps).
            let alias = unsafe { String::from_raw_parts(ptr, bytes, bytes) };
            (alias, 1)
        })
        .collect()
}

laurel_guest::export_rule!(Hostile);
