//! Integration tests, in one binary (one link). Real wasmtime running the
//! components built from `functions/`, and a real PostgreSQL on loopback
//! (`LAUREL_TEST_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432`),
//! with a fresh database per test.

mod api;
mod architecture;
mod authoring;
mod awards;
mod backfill;
mod browser;
mod cases;
mod config_errors;
mod console;
mod definitions;
mod edges;
mod faults;
mod hostile;
mod http_functions;
mod notify;
mod openapi;
mod owned_postgres;
mod pipeline;
mod pipeline_support;
mod polyglot;
mod prefilter;
mod processes;
/// Function projects made with `laurel functions new` and built with their
/// language's tool, shared with the benches.
#[path = "../../benches/support/projects.rs"]
mod projects;
mod proxy;
mod quickstart;
mod registry;
mod schemas;
mod secrets;
mod shadow;
mod stream_goes_on;
mod support;
mod tokens;
mod traces;
mod user_locks;
mod walkthrough;
