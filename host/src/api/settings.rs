//! The API's settings: its address, limits, tokens, and what the process
//! wires in (the database, Redis, the brokers).

use super::*;

/// The API's settings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "HTTP API")]
pub struct ApiSettings {
    /// Where the HTTP server (public API, admin API, HTTP functions,
    /// health, metrics) listens; port 0 picks a free port (printed at
    /// start).
    #[arg(
        id = "http_addr",
        long = "http-addr",
        env = "LAUREL_HTTP_ADDR",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    pub addr: SocketAddr,
    /// Bearer token for `/admin/*` (named `admin`, role admin); unset, and
    /// no LAUREL_ADMIN_TOKENS, the admin API refuses everything.
    #[arg(
        long = "admin-token",
        env = "LAUREL_ADMIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub admin_token: Option<Secret>,
    /// More admin tokens, each with a name (the audit log's "who") and a
    /// role: comma-separated `name:role:token`, role `admin` or `read` (a
    /// read token gets 403 on every write).
    #[arg(
        long = "admin-tokens",
        env = "LAUREL_ADMIN_TOKENS",
        hide_env_values = true,
        value_delimiter = ',',
        value_parser = AdminToken::parse,
        value_name = "NAME:ROLE:TOKEN"
    )]
    pub admin_tokens: Vec<AdminToken>,
    /// A file of admin tokens, one `name:role:token` a line (`#`
    /// comments); read at start.
    #[arg(
        long = "admin-tokens-file",
        env = "LAUREL_ADMIN_TOKENS_FILE",
        value_name = "FILE"
    )]
    pub admin_tokens_file: Option<std::path::PathBuf>,
    /// How users' tokens are checked (HS256 secret, JWKS, claims).
    #[command(flatten)]
    pub tokens: TokenSettings,
    /// Largest JSON or text request body, in bytes (413 beyond).
    #[arg(
        long = "http-max-body-bytes",
        env = "LAUREL_HTTP_MAX_BODY_BYTES",
        default_value_t = crate::settings::MAX_BODY_BYTES,
        value_parser = crate::settings::positive,
        value_name = "BYTES"
    )]
    pub max_body_bytes: usize,
    /// The process's `--database-url`.
    #[arg(skip = crate::settings::DATABASE_URL.to_string())]
    pub database_url: String,
    /// The process's `--redis-url`.
    #[arg(skip = crate::settings::REDIS_URL.to_string())]
    pub redis_url: String,
    /// Kafka, for consumer lag and health; `None` when this process has
    /// no brokers configured.
    #[arg(skip)]
    pub kafka_brokers: Option<String>,
    /// Consumer groups are `<prefix>.<source>`.
    #[arg(skip = crate::kafka::GROUP_PREFIX.to_string())]
    pub group_prefix: String,
    /// A proxy pool that every outbound request of an HTTP function goes
    /// through (unset: straight out).
    #[arg(
        long = "http-function-proxy-pool",
        env = "LAUREL_HTTP_FUNCTION_PROXY_POOL",
        value_name = "POOL"
    )]
    pub http_function_proxy_pool: Option<String>,
    /// Connections to PostgreSQL the API may hold.
    #[arg(skip = 8usize)]
    pub database_connections: usize,
    /// Ingest's limit on a message, applied again when replaying.
    #[arg(skip = crate::event::MAX_EVENT_BYTES)]
    pub max_event_bytes: usize,
    /// A request's headers must arrive within this, in milliseconds (a
    /// slow client is disconnected).
    #[arg(
        id = "http_header_timeout_ms",
        long = "http-header-timeout-ms",
        env = "LAUREL_HTTP_HEADER_TIMEOUT_MS",
        default_value = "10000",
        value_parser = crate::settings::positive_millis,
        value_name = "MS"
    )]
    pub header_timeout: Duration,
    /// A request's body must arrive within this, in milliseconds (408).
    #[arg(
        id = "http_body_timeout_ms",
        long = "http-body-timeout-ms",
        env = "LAUREL_HTTP_BODY_TIMEOUT_MS",
        default_value = "30000",
        value_parser = crate::settings::positive_millis,
        value_name = "MS"
    )]
    pub body_timeout: Duration,
    /// Heavy admin requests served at once (a function's diff, explain,
    /// dead-letter and pipeline replays: each reads Kafka and holds a
    /// database connection); more are answered 429.
    #[arg(
        long = "http-heavy-requests",
        env = "LAUREL_HTTP_HEAVY_REQUESTS",
        default_value = "2",
        value_parser = crate::settings::positive,
        value_name = "REQUESTS"
    )]
    pub heavy_requests: usize,
    /// HTTP connections served at once; more wait to be accepted.
    #[arg(
        id = "http_max_connections",
        long = "http-max-connections",
        env = "LAUREL_HTTP_MAX_CONNECTIONS",
        default_value = "1024",
        value_parser = crate::settings::positive,
        value_name = "CONNECTIONS"
    )]
    pub max_connections: usize,
    /// How long a stop waits for requests in flight before closing their
    /// connections (a share of the process's shutdown deadline).
    #[arg(skip = Duration::from_secs(30))]
    pub shutdown_timeout: Duration,
    /// How often Kafka's health and the consumer lag are read (once for
    /// the process, cached for every request).
    #[arg(skip = Duration::from_secs(10))]
    pub kafka_every: Duration,
}

impl ApiSettings {
    /// The defaults, with the database at `database_url`.
    pub fn new(database_url: &str) -> ApiSettings {
        ApiSettings {
            database_url: database_url.to_string(),
            ..ApiSettings::default()
        }
    }

    /// Reads LAUREL_ADMIN_TOKENS_FILE, if set, into `admin_tokens`.
    pub fn read_admin_tokens_file(&mut self) -> anyhow::Result<()> {
        let Some(file) = self.admin_tokens_file.take() else {
            return Ok(());
        };
        let text = std::fs::read_to_string(&file).map_err(|e| {
            anyhow::anyhow!(
                "failed to read LAUREL_ADMIN_TOKENS_FILE {}: {e}",
                file.display()
            )
        })?;
        let tokens = AdminToken::parse_list(&text)
            .map_err(|e| anyhow::anyhow!("LAUREL_ADMIN_TOKENS_FILE {}: {e}", file.display()))?;
        self.admin_tokens.extend(tokens);
        Ok(())
    }

    /// Refuses secrets too short to be secrets, naming the setting and the
    /// minimum, never the value (a parse error would quote it).
    pub fn check_secrets(&self) -> anyhow::Result<()> {
        if let Some(token) = &self.admin_token {
            Secret::admin_token(token.expose())
                .map_err(|why| anyhow::anyhow!("LAUREL_ADMIN_TOKEN (--admin-token): {why}"))?;
        }
        if let Some(secret) = &self.tokens.secret {
            Secret::jwt_secret(secret.expose())
                .map_err(|why| anyhow::anyhow!("LAUREL_JWT_SECRET (--jwt-secret): {why}"))?;
        }
        Ok(())
    }

    /// Whether any admin token is configured.
    pub fn admin_enabled(&self) -> bool {
        self.admin_token.is_some()
            || !self.admin_tokens.is_empty()
            || self.admin_tokens_file.is_some()
    }
}

impl Default for ApiSettings {
    fn default() -> Self {
        crate::settings::defaults()
    }
}
