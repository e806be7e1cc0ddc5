//! An engine's epoch ticker: advances the epoch every tick while a guest
//! runs, so a call past its deadline is interrupted, and sleeps while none
//! does, so an idle process is not woken hundreds of times a second.
//!
//! Every stretch of guest code on the engine runs while a [`Running`] is
//! held. The first one taken wakes the ticker; the ticker parks when it
//! sees none held. A wake-up that comes just before it parks is kept by
//! the thread's park token, so it is not lost.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::Thread;
use std::time::Duration;

use wasmtime::Engine;

/// How long an idle ticker sleeps before it looks whether its engine is
/// gone (dropping the ticker wakes it at once anyway).
const IDLE_CHECK: Duration = Duration::from_secs(1);

pub(crate) struct Ticker {
    engine: Engine,
    tick: Duration,
    /// Guests running now.
    running: AtomicUsize,
    /// Epochs advanced so far.
    ticks: AtomicU64,
    thread: OnceLock<Thread>,
}

/// Held while guest code runs: the epoch advances.
pub(crate) struct Running(Arc<Ticker>);

impl Ticker {
    /// Starts a thread called `name` that advances `engine`'s epoch every
    /// `tick` while a guest runs; it ends when the ticker is dropped.
    pub(crate) fn start(engine: &Engine, tick: Duration, name: &str) -> Arc<Ticker> {
        let ticker = Arc::new(Ticker {
            engine: engine.clone(),
            tick,
            running: AtomicUsize::new(0),
            ticks: AtomicU64::new(0),
            thread: OnceLock::new(),
        });
        let weak = Arc::downgrade(&ticker);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || tick_while_running(weak))
            .unwrap_or_else(|e| panic!("failed to spawn the epoch ticker thread {name}: {e}"));
        let _ = ticker.thread.set(thread.thread().clone());
        ticker
    }

    /// Marks a guest running until the answer is dropped.
    pub(crate) fn running(self: &Arc<Self>) -> Running {
        if self.running.fetch_add(1, Ordering::AcqRel) == 0 {
            self.wake();
        }
        Running(Arc::clone(self))
    }

    /// Epochs advanced so far.
    #[cfg(test)]
    fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::Acquire)
    }

    fn wake(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        // Its thread sees the ticker gone and ends.
        self.wake();
    }
}

fn tick_while_running(ticker: Weak<Ticker>) {
    while let Some(live) = ticker.upgrade() {
        if live.running.load(Ordering::Acquire) == 0 {
            drop(live);
            std::thread::park_timeout(IDLE_CHECK);
            continue;
        }
        live.engine.increment_epoch();
        live.ticks.fetch_add(1, Ordering::AcqRel);
        let tick = live.tick;
        drop(live);
        std::thread::sleep(tick);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Waits until `ticker` has not ticked for 50 ms (at most 10 s), and
    /// answers its count then.
    fn settled(ticker: &Ticker) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let before = ticker.ticks();
            std::thread::sleep(Duration::from_millis(50));
            let after = ticker.ticks();
            if after == before {
                return after;
            }
            assert!(Instant::now() < deadline, "the ticker never stops ticking");
        }
    }

    #[test]
    fn ticks_while_a_guest_runs_and_sleeps_while_none_does() {
        let engine = Engine::default();
        let ticker = Ticker::start(&engine, Duration::from_millis(1), "test-epoch");
        // Idle from the start.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(ticker.ticks(), 0);
        for _ in 0..3 {
            let idle = settled(&ticker);
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(ticker.ticks(), idle, "it ticked with no guest running");
            // Two guests at once, then one, then none.
            let first = ticker.running();
            let second = ticker.running();
            let deadline = Instant::now() + Duration::from_secs(10);
            while ticker.ticks() < idle + 3 {
                assert!(Instant::now() < deadline, "no tick while a guest runs");
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(first);
            let one = ticker.ticks();
            while ticker.ticks() < one + 3 {
                assert!(Instant::now() < deadline, "no tick while one guest runs");
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(second);
        }
    }

    #[test]
    fn its_thread_ends_with_it() {
        let engine = Engine::default();
        let ticker = Ticker::start(&engine, Duration::from_millis(1), "test-epoch-end");
        let weak = Arc::downgrade(&ticker);
        let guest = ticker.running();
        drop(ticker);
        // A running guest keeps it alive.
        assert!(weak.upgrade().is_some());
        drop(guest);
        // Its thread ends.
        let deadline = Instant::now() + Duration::from_secs(10);
        while threads_called("test-epoch-end") > 0 {
            assert!(Instant::now() < deadline, "the ticker's thread still runs");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(weak.upgrade().is_none());
    }

    fn threads_called(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count()
    }
}
