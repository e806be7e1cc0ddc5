//! Laurel: an achievements engine whose award logic ships as sandboxed
//! WebAssembly. See ARCHITECTURE.md for the map.

pub mod api;
pub mod awards;
pub mod backfill;
pub mod catalog;
pub mod cli;
pub mod definitions;
pub mod demo;
pub mod event;
pub mod fixtures;
pub mod ingest;
pub mod kafka;
pub mod keyvalue;
pub mod library;
pub mod metrics;
pub mod notify;
pub mod objectives;
pub mod outbound;
pub mod pipelines;
pub mod prefilter;
pub mod progress;
pub mod proxy;
pub mod redis_connection;
pub mod registry;
pub mod replay;
pub mod runtime;
pub mod scaffold;
pub mod secrets;
pub mod settings;
pub mod shadow;
pub mod store;
pub mod supervise;
pub mod telemetry;
pub mod text;
pub mod watch;
pub mod webhooks;

/// Every binary linking Laurel (the `laurel` command, tests, benchmarks)
/// allocates through mimalloc: ingest builds and drops many small maps and
/// JSON values per batch, and glibc's allocator spent about a quarter of
/// its CPU on that (perf, `cargo bench --bench ingest`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (`prctl`), unless
/// `MIMALLOC_ALLOW_THP=1` asks for them. mimalloc asks the kernel for huge
/// pages on its arenas, and the first touch of each zeroes 2 MiB where a
/// batch's buffers touch a few KiB of it: the pre-filter spent 30% of its
/// core in the kernel's `clear_page_erms`; with them off its rate went
/// from 1.04-1.35M (mean 1.16M) to 1.19-1.38M records/s (mean 1.29M)
/// (`cargo bench --bench prefilter`, host/benches/README.md). The kernel checks the flag
/// at each fault, so memory mapped before this call is covered too.
pub(crate) fn without_huge_pages() {
    if std::env::var("MIMALLOC_ALLOW_THP").is_ok_and(|v| v.trim() == "1") {
        return;
    }
    // SAFETY: PR_SET_THP_DISABLE takes an int flag and no pointers. It
    // fails only on kernels older than 3.15, which leave them as they are.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}
