//! Settings shared by every command: flags, then environment variables,
//! then defaults (see the contract's table).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::api::{AdminToken, ApiSettings, Secret};
use crate::awards::AwardsSettings;
use crate::ingest::IngestSettings;
use crate::notify::NotifySettings;
use crate::runtime::Limits;

#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// PostgreSQL URL.
    #[arg(
        long,
        global = true,
        env = "LAUREL_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/laurel"
    )]
    pub database_url: String,

    /// Where compiled components are cached across restarts.
    #[arg(long, global = true, env = "LAUREL_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,

    /// CPU time a function call (one batch) may take, in milliseconds.
    #[arg(
        long,
        global = true,
        env = "LAUREL_FUNCTION_CPU_MS",
        default_value_t = 100
    )]
    pub function_cpu_ms: u64,

    /// Memory a function instance may use, in MiB.
    #[arg(
        long,
        global = true,
        env = "LAUREL_FUNCTION_MEMORY_MIB",
        default_value_t = 64
    )]
    pub function_memory_mib: usize,

    /// Largest component accepted, in MiB.
    #[arg(
        long,
        global = true,
        env = "LAUREL_FUNCTION_MAX_MIB",
        default_value_t = 16
    )]
    pub function_max_mib: usize,

    /// Redis (proxy pools).
    #[arg(
        long,
        global = true,
        env = "LAUREL_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,

    /// Kafka bootstrap servers; unset: `laurel up` starts a broker in process.
    #[arg(long, global = true, env = "LAUREL_KAFKA_BROKERS")]
    pub kafka_brokers: Option<String>,

    /// Most events per batch (one database transaction); a batch closes
    /// sooner when LAUREL_BATCH_WAIT_MS passes, so this only matters under
    /// load, where larger transactions go faster.
    #[arg(
        long,
        global = true,
        env = "LAUREL_BATCH_SIZE",
        default_value_t = 10_000
    )]
    pub batch_size: usize,

    /// Longest wait to fill a batch, in milliseconds.
    #[arg(
        long,
        global = true,
        env = "LAUREL_BATCH_WAIT_MS",
        default_value_t = 50
    )]
    pub batch_wait_ms: u64,

    /// Most bytes of messages per batch: a batch closes at this size even
    /// below LAUREL_BATCH_SIZE events, so memory is bounded whatever the
    /// events' sizes.
    #[arg(
        long,
        global = true,
        env = "LAUREL_BATCH_MAX_BYTES",
        default_value_t = 32 << 20
    )]
    pub batch_max_bytes: usize,

    /// Larger Kafka messages are dead-lettered, in bytes.
    #[arg(long, global = true, env = "LAUREL_MAX_EVENT_BYTES", default_value_t = 1 << 20)]
    pub max_event_bytes: usize,

    /// Kafka consumer session timeout, in milliseconds.
    #[arg(
        long,
        global = true,
        env = "LAUREL_KAFKA_SESSION_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub kafka_session_timeout_ms: u64,

    /// Processing-log entries are kept this many days.
    #[arg(
        long,
        global = true,
        env = "LAUREL_LOG_RETENTION_DAYS",
        default_value_t = 30
    )]
    pub log_retention_days: i32,

    /// Consecutive failures after which a function version is quarantined.
    #[arg(
        long,
        global = true,
        env = "LAUREL_FUNCTION_QUARANTINE_AFTER",
        default_value_t = 5
    )]
    pub function_quarantine_after: u32,

    /// Most changed (user, award) pairs an awards worker computes per
    /// cycle (one transaction).
    #[arg(
        long,
        global = true,
        env = "LAUREL_AWARDS_BATCH",
        default_value_t = 2000
    )]
    pub awards_batch: i64,

    /// Awards worker tasks per process.
    #[arg(
        long,
        global = true,
        env = "LAUREL_AWARDS_WORKERS",
        default_value_t = 1
    )]
    pub awards_workers: usize,

    /// Attempts before a webhook notification is given up.
    #[arg(
        long,
        global = true,
        env = "LAUREL_WEBHOOK_MAX_ATTEMPTS",
        default_value_t = 12
    )]
    pub webhook_max_attempts: i32,

    /// Wait after a failed delivery, in milliseconds; doubles per attempt.
    #[arg(
        long,
        global = true,
        env = "LAUREL_WEBHOOK_BACKOFF_MS",
        default_value_t = 1000
    )]
    pub webhook_backoff_ms: u64,

    /// Longest wait between delivery attempts, in milliseconds.
    #[arg(
        long,
        global = true,
        env = "LAUREL_WEBHOOK_BACKOFF_CAP_MS",
        default_value_t = 600_000
    )]
    pub webhook_backoff_cap_ms: u64,

    /// Where the HTTP server (public API, admin API, health) listens; port 0
    /// picks a free port (printed at start).
    #[arg(
        long,
        global = true,
        env = "LAUREL_HTTP_ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub http_addr: std::net::SocketAddr,

    /// Bearer token for `/admin/*`; unset, the admin API refuses everything.
    #[arg(
        long,
        global = true,
        env = "LAUREL_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<Secret>,

    /// More admin tokens, each with a name (the audit log's "who") and a
    /// role: comma-separated `name:role:token`, role `admin` or `read` (a
    /// read token gets 403 on every write). LAUREL_ADMIN_TOKEN, if set too,
    /// is one more, named `admin`, role admin.
    #[arg(
        long,
        global = true,
        env = "LAUREL_ADMIN_TOKENS",
        hide_env_values = true,
        value_parser = parse_admin_tokens
    )]
    pub admin_tokens: Option<AdminTokens>,

    /// A file of admin tokens, one `name:role:token` a line (`#` comments).
    #[arg(long, global = true, env = "LAUREL_ADMIN_TOKENS_FILE")]
    pub admin_tokens_file: Option<std::path::PathBuf>,

    /// HS256 secret of user tokens; unset (and no JWKS), the public API
    /// refuses everything.
    #[arg(long, global = true, env = "LAUREL_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<Secret>,

    /// An identity provider's public keys for RS256/ES256 user tokens: a
    /// JWKS file or an http(s) URL (refreshed every 10 minutes, and when a
    /// token names an unknown key).
    #[arg(long, global = true, env = "LAUREL_JWT_JWKS")]
    pub jwt_jwks: Option<String>,

    /// The `iss` every user token must carry.
    #[arg(long, global = true, env = "LAUREL_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,

    /// An `aud` every user token must carry.
    #[arg(long, global = true, env = "LAUREL_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,

    /// Refuse user tokens without `exp`.
    #[arg(
        long,
        global = true,
        env = "LAUREL_JWT_REQUIRE_EXP",
        default_value_t = false
    )]
    pub jwt_require_exp: bool,

    /// Clock skew allowed on a token's `exp` and `nbf`, in seconds.
    #[arg(
        long,
        global = true,
        env = "LAUREL_JWT_LEEWAY_SECONDS",
        default_value_t = 60
    )]
    pub jwt_leeway_seconds: u64,

    /// A request's headers must arrive within this, in milliseconds (a
    /// slow client is disconnected).
    #[arg(
        long,
        global = true,
        env = "LAUREL_HTTP_HEADER_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub http_header_timeout_ms: u64,

    /// A request's body must arrive within this, in milliseconds (408).
    #[arg(
        long,
        global = true,
        env = "LAUREL_HTTP_BODY_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub http_body_timeout_ms: u64,

    /// HTTP connections served at once.
    #[arg(
        long,
        global = true,
        env = "LAUREL_HTTP_MAX_CONNECTIONS",
        default_value_t = 1024
    )]
    pub http_max_connections: usize,

    /// After SIGINT/SIGTERM, how long work in hand may take to finish, in
    /// milliseconds; then the process exits (nothing is lost: what was not
    /// committed is done again).
    #[arg(
        long,
        global = true,
        env = "LAUREL_SHUTDOWN_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub shutdown_timeout_ms: u64,

    /// Largest JSON or text request body, in bytes.
    #[arg(
        long,
        global = true,
        env = "LAUREL_HTTP_MAX_BODY_BYTES",
        default_value_t = 1 << 20
    )]
    pub http_max_body_bytes: usize,

    /// The Spin manifest whose HTTP routes `laurel up` serves (unset:
    /// `spin.toml` in the working directory, if there is one).
    #[arg(long, global = true, env = "LAUREL_SPIN_MANIFEST")]
    pub spin_manifest: Option<std::path::PathBuf>,

    /// One request to an HTTP function: its time limit, in milliseconds,
    /// from arrival to the last byte of the response.
    #[arg(
        long,
        global = true,
        env = "LAUREL_HTTP_FUNCTION_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub http_function_timeout_ms: u64,

    /// A proxy pool for HTTP functions' outbound requests: each goes
    /// through a proxy allocated from it (unset: straight out).
    #[arg(long, global = true, env = "LAUREL_HTTP_FUNCTION_PROXY_POOL")]
    pub http_function_proxy_pool: Option<String>,

    /// One webhook request's time limit, in milliseconds.
    #[arg(
        long,
        global = true,
        env = "LAUREL_WEBHOOK_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub webhook_timeout_ms: u64,
}

/// Admin tokens from the command line or the environment.
#[derive(Debug, Clone)]
pub struct AdminTokens(pub Vec<AdminToken>);

fn parse_admin_tokens(text: &str) -> Result<AdminTokens, String> {
    AdminToken::parse_list(text).map(AdminTokens)
}

impl Settings {
    pub fn limits(&self) -> Limits {
        Limits {
            cpu_budget: Duration::from_millis(self.function_cpu_ms),
            memory_bytes: self.function_memory_mib << 20,
            component_bytes: self.function_max_mib << 20,
            quarantine_after: self.function_quarantine_after.max(1),
            ..Limits::default()
        }
    }

    /// Ingest settings for the given brokers.
    pub fn ingest(&self, brokers: &str) -> IngestSettings {
        IngestSettings {
            batch_size: self.batch_size.max(1),
            batch_wait: Duration::from_millis(self.batch_wait_ms),
            batch_max_bytes: self.batch_max_bytes.max(1),
            max_event_bytes: self.max_event_bytes,
            session_timeout: Duration::from_millis(self.kafka_session_timeout_ms),
            ..IngestSettings::new(brokers)
        }
    }

    /// API settings; `brokers` (if any) serve consumer lag and health.
    pub fn api(&self, brokers: Option<&str>) -> anyhow::Result<ApiSettings> {
        let mut admin_tokens: Vec<AdminToken> = self
            .admin_tokens
            .as_ref()
            .map(|t| t.0.clone())
            .unwrap_or_default();
        if let Some(file) = &self.admin_tokens_file {
            let text = std::fs::read_to_string(file).map_err(|e| {
                anyhow::anyhow!(
                    "failed to read LAUREL_ADMIN_TOKENS_FILE {}: {e}",
                    file.display()
                )
            })?;
            admin_tokens.extend(AdminToken::parse_list(&text).map_err(|e| {
                anyhow::anyhow!("LAUREL_ADMIN_TOKENS_FILE {}: {e}", file.display())
            })?);
        }
        Ok(ApiSettings {
            admin_tokens,
            addr: self.http_addr,
            admin_token: self.admin_token.clone(),
            tokens: crate::api::TokenSettings {
                secret: self.jwt_secret.clone(),
                jwks: self.jwt_jwks.clone(),
                issuer: self.jwt_issuer.clone(),
                audience: self.jwt_audience.clone(),
                require_exp: self.jwt_require_exp,
                leeway: Duration::from_secs(self.jwt_leeway_seconds),
                ..crate::api::TokenSettings::default()
            },
            max_body_bytes: self.http_max_body_bytes.max(1),
            max_function_bytes: self.function_max_mib << 20,
            redis_url: self.redis_url.clone(),
            kafka_brokers: brokers.filter(|b| !b.is_empty()).map(str::to_string),
            http_function_proxy_pool: self.http_function_proxy_pool.clone(),
            max_event_bytes: self.max_event_bytes,
            header_timeout: Duration::from_millis(self.http_header_timeout_ms.max(1)),
            body_timeout: Duration::from_millis(self.http_body_timeout_ms.max(1)),
            max_connections: self.http_max_connections.max(1),
            // The API drains within the process's deadline, a little inside it.
            shutdown_timeout: Duration::from_millis(self.shutdown_timeout_ms * 9 / 10),
            ..ApiSettings::new(&self.database_url)
        })
    }

    /// The Spin manifest to serve, if any: the one named, or `spin.toml`
    /// here if it exists.
    pub fn spin_manifest(&self) -> Option<std::path::PathBuf> {
        match &self.spin_manifest {
            Some(path) => Some(path.clone()),
            None => {
                let here = std::path::PathBuf::from("spin.toml");
                here.exists().then_some(here)
            }
        }
    }

    /// Limits of HTTP functions: their own time limit, the functions'
    /// memory limit, the API's body limit.
    pub fn http_limits(&self) -> crate::runtime::http::HttpLimits {
        crate::runtime::http::HttpLimits {
            timeout: Duration::from_millis(self.http_function_timeout_ms.max(1)),
            memory_bytes: self.function_memory_mib << 20,
            max_body_bytes: self.http_max_body_bytes.max(1),
        }
    }

    pub fn awards(&self) -> AwardsSettings {
        AwardsSettings {
            batch: self.awards_batch.max(1),
            workers: self.awards_workers.max(1),
            ..AwardsSettings::default()
        }
    }

    pub fn notify(&self) -> NotifySettings {
        NotifySettings {
            max_attempts: self.webhook_max_attempts.max(1),
            backoff: Duration::from_millis(self.webhook_backoff_ms),
            backoff_cap: Duration::from_millis(
                self.webhook_backoff_cap_ms.max(self.webhook_backoff_ms),
            ),
            timeout: Duration::from_millis(self.webhook_timeout_ms.max(1)),
            redis_url: Some(self.redis_url.clone()),
            ..NotifySettings::default()
        }
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
