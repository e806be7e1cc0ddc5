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
pub mod keyvalue;
pub mod library;
pub mod metrics;
pub mod notify;
pub mod pipelines;
pub mod proxy;
pub mod redis_connection;
pub mod registry;
pub mod runtime;
pub mod scaffold;
pub mod secrets;
pub mod settings;
pub mod shadow;
pub mod store;
pub mod telemetry;

/// Every binary linking Laurel (the `laurel` command, tests, benchmarks)
/// allocates through mimalloc: ingest builds and drops many small maps and
/// JSON values per batch, and glibc's allocator spent about a quarter of
/// its CPU on that (perf, `cargo bench --bench ingest`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
