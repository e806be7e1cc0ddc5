//! Laurel: an achievements engine whose award logic ships as sandboxed
//! WebAssembly. See ARCHITECTURE.md for the map.

pub mod api;
pub mod awards;
pub mod catalog;
pub mod cli;
pub mod definitions;
pub mod demo;
pub mod event;
pub mod ingest;
pub mod library;
pub mod metrics;
pub mod notify;
pub mod proxy;
pub mod registry;
pub mod runtime;
pub mod settings;
pub mod store;
