//! The WASI that filters, rules, strategies and transforms see: every
//! import a wasm32-wasip2 build carries is linked (refusing them would
//! refuse every component), but none can block or tell one call from
//! another.
//!
//! - Sleeping or waiting on a clock (`wasi:clocks/monotonic-clock`'s
//!   `subscribe-duration` and `subscribe-instant`, behind
//!   `std::thread::sleep`) traps with [`SLEEP_REFUSED`]: the epoch deadline
//!   is only checked while Wasm code runs, so a guest blocked in the host
//!   would hold the host thread (and its source's consumer) for as long as
//!   it asked.
//! - The clocks answer a fixed value: the wall clock the Unix epoch, the
//!   monotonic clock 0. A function's answer depends on its input alone, so
//!   a redelivery, a backfill and a shadow diff give the answer the first
//!   call gave. Time comes from the event (`occurred_at`).
//! - Random bytes come from a generator seeded at the start of every call
//!   with the same seed (taken from the component's sha256): the same call
//!   draws the same bytes.
//!
//! Files, environment, arguments and the network are not given (the
//! `WasiCtx` default: no preopens, no addresses allowed); stdin is empty.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx};

use super::guest_output::GuestOutput;

/// The reason a sleeping guest traps with.
pub(crate) const SLEEP_REFUSED: &str = "it tried to sleep or wait on a clock \
    (wasi:clocks/monotonic-clock); a filter, rule, strategy or transform \
    runs to its answer without blocking";

/// The clock interface wasmtime-wasi links (the version its WIT names;
/// guests importing any 0.2.x are matched to it).
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// Replaces the clock subscriptions WASI linked with ones that trap. Called
/// after `wasmtime_wasi::p2::add_to_linker_sync`.
pub(crate) fn refuse_sleep<T: 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    for name in ["subscribe-duration", "subscribe-instant"] {
        clock.func_wrap(
            name,
            |_, (_,): (u64,)| -> wasmtime::Result<(Resource<DynPollable>,)> {
                Err(wasmtime::Error::msg(SLEEP_REFUSED))
            },
        )?;
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// A guest's WASI context: fixed clocks, `random` for randomness, stderr
/// kept in `stderr`.
pub(crate) fn wasi_ctx(stderr: GuestOutput, random: &SeededRandom) -> WasiCtx {
    WasiCtx::builder()
        .stderr(stderr)
        .wall_clock(FixedWallClock)
        .monotonic_clock(FixedMonotonicClock)
        .secure_random(random.clone())
        .insecure_random(random.clone())
        .insecure_random_seed(u128::from(random.seed))
        .build()
}

struct FixedWallClock;

impl HostWallClock for FixedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

struct FixedMonotonicClock;

impl HostMonotonicClock for FixedMonotonicClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        0
    }
}

/// A splitmix64 generator whose state the host resets before every call
/// ([`SeededRandom::reseed`]); clones share the state, so the WASI context
/// holds one and the store's owner another.
#[derive(Clone)]
pub(crate) struct SeededRandom {
    seed: u64,
    state: Arc<AtomicU64>,
}

impl SeededRandom {
    /// A generator for the component with this sha256 (hex).
    pub(crate) fn for_component(sha256: &str) -> SeededRandom {
        let seed = u64::from_str_radix(sha256.get(..16).unwrap_or("0"), 16).unwrap_or(0);
        SeededRandom {
            seed,
            state: Arc::new(AtomicU64::new(seed)),
        }
    }

    /// Back to the start of the sequence: the next call draws what the
    /// last one drew.
    pub(crate) fn reseed(&self) {
        self.state.store(self.seed, Ordering::Relaxed);
    }

    fn next(&self) -> u64 {
        // One store owns the generator and calls it from one thread at a
        // time; the atomic only makes the shared state `Send`.
        let state = self
            .state
            .load(Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.state.store(state, Ordering::Relaxed);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl rand_core::TryRng for SeededRandom {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((self.next() >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.next())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.next().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::Rng;

    #[test]
    fn a_reseeded_generator_draws_the_same_bytes_again() {
        let random = SeededRandom::for_component("00ff00ff00ff00ffabcdef");
        let mut a = random.clone();
        let first: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        assert_eq!(first.len(), 4);
        assert_ne!(first[0], first[1]);
        random.reseed();
        let again: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        assert_eq!(first, again);
        let other = SeededRandom::for_component("1100000000000000");
        let mut b = other.clone();
        assert_ne!(
            b.next_u64(),
            first[0],
            "another component, another sequence"
        );
    }
}
