//! What the command line reads, assembled from the settings each role and
//! capability owns: the connections every command reaches, the sandbox,
//! and everything a serving process reads, wired together ([`Serving::wire`])
//! and handed to each role in the form it takes.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::api::ApiSettings;
use crate::awards::AwardsSettings;
use crate::backfill::BackfillSettings;
use crate::ingest::IngestSettings;
use crate::notify::NotifySettings;
use crate::prefilter::PrefilterSettings;
use crate::runtime::http::HttpLimits;
use crate::runtime::{Limits, Runtime};
use crate::settings::{DATABASE_URL, REDIS_URL, millis};

/// Where Laurel keeps its state: every command reaches them.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connections")]
pub struct Connections {
    /// PostgreSQL URL (the database is created if missing).
    #[arg(long, global = true, env = "LAUREL_DATABASE_URL", default_value = DATABASE_URL)]
    pub database_url: String,

    /// Redis (proxy pools).
    #[arg(long, global = true, env = "LAUREL_REDIS_URL", default_value = REDIS_URL)]
    pub redis_url: String,
}

/// What runs functions: the commands that load components.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Functions")]
pub struct Sandbox {
    /// Where compiled components are cached across restarts [default:
    /// $XDG_CACHE_HOME/laurel/compiled or ~/.cache/laurel/compiled].
    #[arg(long, env = "LAUREL_CACHE_DIR", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,

    #[command(flatten)]
    pub limits: Limits,
}

impl Sandbox {
    /// A Wasm runtime with these limits and this cache.
    pub fn runtime(&self) -> anyhow::Result<Runtime> {
        Runtime::new(self.limits.clone(), self.cache_dir())
    }

    /// `--cache-dir`, else `$XDG_CACHE_HOME/laurel/compiled`, else
    /// `~/.cache/laurel/compiled`.
    pub fn cache_dir(&self) -> Option<PathBuf> {
        if let Some(dir) = &self.cache_dir {
            return Some(dir.clone());
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
        Some(base.join("laurel").join("compiled"))
    }
}

/// Everything a serving process (`laurel up`, `laurel serve`) reads.
#[derive(Debug, Clone, Args)]
pub struct Serving {
    #[command(flatten)]
    pub sandbox: Sandbox,

    #[command(flatten)]
    pub process: ProcessSettings,

    #[command(flatten)]
    pub ingest: IngestSettings,

    #[command(flatten)]
    pub awards: AwardsSettings,

    #[command(flatten)]
    pub notify: NotifySettings,

    #[command(flatten)]
    pub api: ApiSettings,

    #[command(flatten)]
    pub http_functions: HttpLimits,
}

/// What a serving process as a whole is told.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Process")]
pub struct ProcessSettings {
    /// Kafka bootstrap servers; unset: `laurel up` starts a broker in
    /// process and prints its address.
    #[arg(long, env = "LAUREL_KAFKA_BROKERS", value_name = "HOST:PORT,...")]
    pub kafka_brokers: Option<String>,

    /// Processing-log entries and dead letters are kept this many days
    /// (analytics event ids at least 7).
    #[arg(
        long,
        env = "LAUREL_LOG_RETENTION_DAYS",
        default_value_t = 30,
        value_name = "DAYS"
    )]
    pub log_retention_days: i32,

    /// After SIGINT/SIGTERM, how long work in hand may take to finish, in
    /// milliseconds; then the process exits (nothing is lost: what was not
    /// committed is done again).
    #[arg(
        id = "shutdown_timeout_ms",
        long = "shutdown-timeout-ms",
        env = "LAUREL_SHUTDOWN_TIMEOUT_MS",
        default_value = "30000",
        value_parser = millis,
        value_name = "MS"
    )]
    pub shutdown_timeout: Duration,

    /// The Spin manifest whose HTTP routes the server serves [default:
    /// `spin.toml` in the working directory, if there is one].
    #[arg(long, env = "LAUREL_SPIN_MANIFEST", value_name = "FILE")]
    pub spin_manifest: Option<PathBuf>,

    /// An OpenTelemetry collector's OTLP/HTTP base URL (e.g.
    /// http://127.0.0.1:4318): the spans of batches, function calls, awards
    /// cycles, deliveries and HTTP requests are sent to `<URL>/v1/traces`
    /// [default: none, spans only shape the log lines].
    #[arg(long, env = "LAUREL_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

impl ProcessSettings {
    /// The Spin manifest to serve, if any: the one named, or `spin.toml`
    /// here if it exists.
    pub fn spin_manifest(&self) -> Option<PathBuf> {
        match &self.spin_manifest {
            Some(path) => Some(path.clone()),
            None => {
                let here = PathBuf::from("spin.toml");
                here.exists().then_some(here)
            }
        }
    }
}

impl Serving {
    /// Settings that are another capability's too, passed on: the database
    /// and Redis, the brokers, the limits HTTP functions share with the
    /// API and the sandbox, the API's share of the shutdown deadline.
    pub fn wire(&mut self, connections: &Connections, brokers: &str) {
        let brokers = brokers.to_string();
        self.ingest.brokers = brokers.clone();
        self.ingest.log_retention_days = self.process.log_retention_days;
        self.notify.redis_url = Some(connections.redis_url.clone());
        let api = &mut self.api;
        api.database_url = connections.database_url.clone();
        api.redis_url = connections.redis_url.clone();
        api.kafka_brokers = Some(brokers).filter(|b| !b.is_empty());
        api.max_event_bytes = self.ingest.max_event_bytes;
        // The API drains within the process's deadline, a little inside it.
        api.shutdown_timeout = self.process.shutdown_timeout * 9 / 10;
        self.http_functions.memory_bytes = self.sandbox.limits.memory_bytes;
        self.http_functions.max_body_bytes = api.max_body_bytes;
    }
}

/// What the pre-filter takes of ingest's settings (the same consumer
/// flags).
pub fn prefilter_settings(ingest: &IngestSettings) -> PrefilterSettings {
    PrefilterSettings {
        consumer: ingest.consumer(),
        group_prefix: ingest.group_prefix.clone(),
        max_event_bytes: ingest.max_event_bytes,
    }
}

/// What a backfill from history takes of ingest's settings.
pub fn backfill_settings(ingest: &IngestSettings) -> BackfillSettings {
    BackfillSettings {
        batch: ingest.backfill_batch as i64,
        max_event_bytes: ingest.max_event_bytes,
        brokers: Some(ingest.brokers.clone()),
        retention_days: ingest.log_retention_days.max(7),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::defaults;

    #[test]
    fn every_capability_builds_its_defaults_from_its_flags() {
        let ingest: IngestSettings = defaults();
        assert_eq!(ingest.batch_size, 10_000);
        assert_eq!(ingest.batch_wait, Duration::from_millis(50));
        assert_eq!(ingest.max_event_bytes, 1 << 20);
        assert_eq!(ingest.group_prefix, crate::kafka::GROUP_PREFIX);
        let limits: Limits = defaults();
        assert_eq!(limits.cpu_budget, Duration::from_millis(100));
        assert_eq!(limits.memory_bytes, 64 << 20);
        assert_eq!(limits.instances, 1000);
        let awards: AwardsSettings = defaults();
        assert_eq!((awards.batch, awards.workers), (2000, 1));
        let notify: NotifySettings = defaults();
        assert_eq!(notify.backoff_cap, Duration::from_secs(600));
        let api: ApiSettings = defaults();
        assert_eq!(api.addr.to_string(), "127.0.0.1:8080");
        assert_eq!(api.tokens.leeway, Duration::from_secs(60));
        assert_eq!(api.redis_url, REDIS_URL);
        let http: HttpLimits = defaults();
        assert_eq!(http.timeout, Duration::from_secs(10));
        let serving: Serving = defaults();
        assert_eq!(serving.process.shutdown_timeout, Duration::from_secs(30));
    }
}
