//! How settings are read: flags, then environment variables, then defaults
//! (see docs/settings.md).
//!
//! Each capability owns its settings as a `clap::Args` struct with one
//! default per setting, in its attribute: `IngestSettings`,
//! `AwardsSettings`, `NotifySettings`, `ApiSettings` (with
//! `TokenSettings`), `runtime::Limits`, `HttpLimits`. The command line
//! flattens them into the commands that use them; tests and benches build
//! them from the same attributes (`defaults`), so the two cannot drift.
//! Fields a process wires up itself (a URL, a broker address) are
//! `#[arg(skip)]`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::api::ApiSettings;
use crate::awards::AwardsSettings;
use crate::ingest::IngestSettings;
use crate::notify::NotifySettings;
use crate::runtime::http::HttpLimits;
use crate::runtime::{Limits, Runtime};

/// PostgreSQL, when none is given.
pub const DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/laurel";
/// Redis, when none is given.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";

/// A settings struct with every setting at its default, as the command
/// line would give it with no flags and no environment.
pub fn defaults<T: Args + clap::FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults"))
        .mut_args(|arg| arg.env(None::<&'static str>));
    let parsed = command
        .try_get_matches_from(["defaults"])
        .and_then(|matches| T::from_arg_matches(&matches));
    match parsed {
        Ok(settings) => settings,
        Err(error) => panic!("a setting has no default: {error}"),
    }
}

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

/// A whole number of `unit`s.
fn whole<T: std::str::FromStr>(text: &str, unit: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not a whole number{unit}"))
}

/// A number of milliseconds.
pub fn millis(text: &str) -> Result<Duration, String> {
    whole(text, " of milliseconds").map(Duration::from_millis)
}

/// A number of milliseconds above zero.
pub fn positive_millis(text: &str) -> Result<Duration, String> {
    let duration = millis(text)?;
    if duration.is_zero() {
        return Err("must be at least 1 millisecond".to_string());
    }
    Ok(duration)
}

/// A number of seconds.
pub fn seconds(text: &str) -> Result<Duration, String> {
    whole(text, " of seconds").map(Duration::from_secs)
}

/// A number of MiB above zero, as bytes.
pub fn mebibytes(text: &str) -> Result<usize, String> {
    let mib: usize = whole(text, " of MiB")?;
    if mib == 0 {
        return Err("must be at least 1 MiB".to_string());
    }
    mib.checked_mul(1 << 20)
        .ok_or_else(|| format!("{mib} MiB is more than this machine can address"))
}

/// A count above zero.
pub fn positive(text: &str) -> Result<usize, String> {
    let n: usize = whole(text, "")?;
    if n == 0 {
        return Err("must be at least 1".to_string());
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_capability_builds_its_defaults_from_its_flags() {
        let ingest: IngestSettings = defaults();
        assert_eq!(ingest.batch_size, 10_000);
        assert_eq!(ingest.batch_wait, Duration::from_millis(50));
        assert_eq!(ingest.max_event_bytes, 1 << 20);
        assert_eq!(ingest.group_prefix, crate::ingest::GROUP_PREFIX);
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

    #[test]
    fn parsers_refuse_what_cannot_be_a_setting() {
        assert_eq!(millis("250"), Ok(Duration::from_millis(250)));
        assert!(millis("-1").unwrap_err().contains("milliseconds"));
        assert_eq!(
            positive_millis("0").unwrap_err(),
            "must be at least 1 millisecond"
        );
        assert_eq!(mebibytes("2"), Ok(2 << 20));
        assert_eq!(mebibytes("0").unwrap_err(), "must be at least 1 MiB");
        assert!(mebibytes(&usize::MAX.to_string()).is_err());
        assert_eq!(positive("0").unwrap_err(), "must be at least 1");
    }
}
