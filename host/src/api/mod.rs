//! The HTTP surface: the public API (apps, with a user's JWT), the admin
//! API (operators and support, with the admin token), health and the
//! OpenAPI document, on one server (role `api`).
//!
//! **API Boundary:** handlers read and write through `store`,
//! `definitions` and `proxy`; they hold no SQL and no Redis commands of
//! their own. Errors map to status codes in one place (`error.rs`).

mod admin;
mod auth;
mod error;
mod explain;
mod progress;
mod public;
mod services;
mod tokens;

pub use auth::{AdminToken, Caller, Role, Secret, mint_user_token, random_secret};
pub use error::ApiError;
pub use tokens::{TokenSettings, UserTokens};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tracing::info;

use crate::catalog::Catalog;
use crate::proxy::ProxyPools;
use crate::registry::Registry;
use crate::runtime::http::manifest::Manifest;
use crate::runtime::http::{HttpFunctions, HttpLimits};
use crate::store::{PooledStore, StorePool};

/// The API's settings (see `Settings::api`).
#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub addr: SocketAddr,
    pub admin_token: Option<Secret>,
    /// Named admin tokens with roles (LAUREL_ADMIN_TOKENS); `admin_token`
    /// is one more, named `admin`.
    pub admin_tokens: Vec<AdminToken>,
    /// How users' tokens are checked (HS256 secret, JWKS, claims).
    pub tokens: TokenSettings,
    /// Largest JSON or text request body.
    pub max_body_bytes: usize,
    /// Largest component upload.
    pub max_function_bytes: usize,
    pub database_url: String,
    pub redis_url: String,
    /// Kafka, for consumer lag and health; `None` when this process has
    /// no brokers configured.
    pub kafka_brokers: Option<String>,
    /// Consumer groups are `<prefix>.<source>`.
    pub group_prefix: String,
    /// The proxy pool HTTP functions' outbound requests go through (none:
    /// straight out).
    pub http_function_proxy_pool: Option<String>,
    /// Connections to PostgreSQL the API may hold.
    pub database_connections: usize,
    /// Ingest's limit on a message, applied again when replaying.
    pub max_event_bytes: usize,
}

impl ApiSettings {
    pub fn new(database_url: &str) -> ApiSettings {
        ApiSettings {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin_token: None,
            admin_tokens: Vec::new(),
            tokens: TokenSettings::default(),
            max_body_bytes: 1 << 20,
            max_function_bytes: 16 << 20,
            database_url: database_url.to_string(),
            redis_url: "redis://127.0.0.1:6379".to_string(),
            kafka_brokers: None,
            group_prefix: "laurel".to_string(),
            http_function_proxy_pool: None,
            database_connections: 8,
            max_event_bytes: 1 << 20,
        }
    }
}

/// What every handler shares.
pub struct AppState {
    settings: ApiSettings,
    pool: StorePool,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    /// Connected at first use, so the API serves awards while Redis is
    /// away (the manager reconnects by itself afterwards).
    proxies: tokio::sync::OnceCell<ProxyPools>,
    zero: progress::ZeroProgress,
    /// The components `spin.toml` routes to, served for paths no Laurel
    /// route takes.
    functions: std::sync::OnceLock<Arc<HttpFunctions>>,
    /// Users' tokens, with the identity provider's keys kept fresh.
    tokens: Arc<UserTokens>,
    /// Every admin token: LAUREL_ADMIN_TOKENS and LAUREL_ADMIN_TOKEN.
    admin_tokens: Vec<AdminToken>,
}

impl AppState {
    pub fn new(settings: ApiSettings, registry: Arc<Registry>, catalog: Arc<Catalog>) -> AppState {
        let mut admin_tokens = settings.admin_tokens.clone();
        if let Some(token) = &settings.admin_token {
            admin_tokens.push(AdminToken {
                name: "admin".into(),
                role: Role::Admin,
                token: token.clone(),
            });
        }
        AppState {
            admin_tokens,
            tokens: UserTokens::start(settings.tokens.clone()),
            pool: StorePool::new(&settings.database_url, settings.database_connections),
            settings,
            registry,
            catalog,
            proxies: tokio::sync::OnceCell::new(),
            zero: progress::ZeroProgress::default(),
            functions: std::sync::OnceLock::new(),
        }
    }

    /// Loads the components of `manifest` and serves them on its routes
    /// (paths Laurel's own routes do not take). Once per state.
    pub fn serve_functions(
        self: &Arc<Self>,
        manifest: Manifest,
        limits: HttpLimits,
    ) -> anyhow::Result<()> {
        for route in &manifest.routes {
            let prefix = route.pattern.trim_end_matches("/...");
            for own in ["/v1", "/admin", "/healthz", "/metrics", "/openapi.json"] {
                // A catch-all (`/...`) only gets what Laurel's routes leave.
                let overlaps = !prefix.is_empty()
                    && (prefix == own
                        || prefix.starts_with(&format!("{own}/"))
                        || own.starts_with(&format!("{prefix}/")));
                if overlaps {
                    anyhow::bail!(
                        "spin.toml route `{}` (component `{}`) overlaps Laurel's own {own}",
                        route.pattern,
                        route.component
                    );
                }
            }
        }
        let services = services::Services::new(
            Arc::downgrade(self),
            self.settings.kafka_brokers.as_deref(),
            self.settings.http_function_proxy_pool.clone(),
            limits.timeout,
        )?;
        let functions = HttpFunctions::load(
            manifest,
            limits,
            Arc::new(services),
            &crate::library::http_builtin,
        )?;
        self.functions
            .set(Arc::new(functions))
            .map_err(|_| anyhow::anyhow!("HTTP functions are already being served"))
    }

    async fn store(&self) -> Result<PooledStore<'_>, ApiError> {
        Ok(self.pool.get().await?)
    }

    /// A source's consumer lag (messages its group has yet to consume).
    async fn lag(&self, source: &str, topic: &str) -> Result<i64, String> {
        let Some(brokers) = &self.settings.kafka_brokers else {
            return Err("this process has no Kafka brokers configured".to_string());
        };
        let group = format!("{}.{source}", self.settings.group_prefix);
        crate::ingest::consumer_lag(brokers, &group, topic).await
    }

    async fn proxies(&self) -> Result<&ProxyPools, ApiError> {
        Ok(self
            .proxies
            .get_or_try_init(|| ProxyPools::connect(&self.settings.redis_url))
            .await?)
    }
}

/// Every route.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .merge(public::routes())
        .nest("/admin/v1", admin::routes(state.clone()))
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .fallback(http_function)
        .method_not_allowed_fallback(wrong_method)
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` resolves; requests in
/// flight finish first.
pub async fn run(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    info!(message = "HTTP API listening.", addr = %listener.local_addr()?);
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

/// The OpenAPI document, as served at `/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
        .into_response()
}

pub(super) async fn no_route(request: Request) -> ApiError {
    ApiError::NotFound(format!(
        "no route for {} {} (routes: /openapi.json)",
        request.method(),
        request.uri().path()
    ))
}

async fn wrong_method(request: Request) -> ApiError {
    ApiError::MethodNotAllowed(format!(
        "{} is not allowed on {}",
        request.method(),
        request.uri().path()
    ))
}

/// A health check's answer, or why it has none after `limit`.
async fn within(
    limit: Duration,
    name: &str,
    check: impl Future<Output = Result<(), String>>,
) -> Result<(), String> {
    match tokio::time::timeout(limit, check).await {
        Ok(result) => result,
        Err(_) => Err(format!("{name} did not answer within {limit:?}")),
    }
}

/// PostgreSQL, Redis and Kafka, each with how it answered; 503 if any
/// failed.
async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    const LIMIT: Duration = Duration::from_secs(3);
    let postgres = async {
        let store = state.store().await.map_err(|e| e.to_string())?;
        store.ping().await.map_err(|e| e.to_string())
    };
    let redis = async {
        let pools = state.proxies().await.map_err(|e| e.to_string())?;
        pools.ping().await.map_err(|e| e.to_string())
    };
    let kafka = async {
        match &state.settings.kafka_brokers {
            Some(brokers) => crate::ingest::check_brokers(brokers, LIMIT)
                .await
                .map(|_| ()),
            None => Ok(()),
        }
    };
    let (postgres, redis, kafka) = tokio::join!(
        within(LIMIT, "PostgreSQL", postgres),
        within(LIMIT, "Redis", redis),
        within(LIMIT, "Kafka", kafka)
    );
    let kafka = if state.settings.kafka_brokers.is_none() {
        None
    } else {
        Some(kafka)
    };
    let report = |r: &Result<(), String>| match r {
        Ok(()) => json!({"ok": true}),
        Err(error) => json!({"ok": false, "error": error}),
    };
    let healthy = postgres.is_ok() && redis.is_ok() && kafka.as_ref().is_none_or(Result::is_ok);
    let mut checks = json!({"postgres": report(&postgres), "redis": report(&redis)});
    if let Some(kafka) = &kafka {
        checks["kafka"] = report(kafka);
    }
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({"status": if healthy { "ok" } else { "unavailable" }, "checks": checks})),
    )
        .into_response()
}

/// A path no Laurel route takes: an HTTP function's, if `spin.toml`
/// routes it to one, else 404.
async fn http_function(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let Some(functions) = state
        .functions
        .get()
        .filter(|f| f.serves(request.uri().path()))
    else {
        return no_route(request).await.into_response();
    };
    let limit = state.settings.max_body_bytes;
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return ApiError::PayloadTooLarge(format!(
                "the request body is over the limit of {limit} bytes"
            ))
            .into_response();
        }
    };
    match functions
        .handle(axum::http::Request::from_parts(parts, bytes), None)
        .await
    {
        Some(Ok(response)) => response.map(axum::body::Body::from).into_response(),
        Some(Err(error)) => ApiError::from(error).into_response(),
        None => ApiError::NotFound("no route".into()).into_response(),
    }
}

/// This process's counters and histograms, and each source's consumer lag
/// read from the brokers now, in the Prometheus text format. Counters are
/// served even when PostgreSQL or Kafka is away (the lag is then missing).
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let sources = match state.store().await {
        Ok(store) => store.sources().await.unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let lags = futures_util::future::join_all(sources.iter().map(|source| {
        let state = &state;
        async move {
            state
                .lag(&source.name, &source.topic)
                .await
                .ok()
                .map(|lag| crate::metrics::Gauge {
                    name: crate::metrics::CONSUMER_LAG,
                    labels: vec![("source", source.name.clone())],
                    value: lag as f64,
                })
        }
    }))
    .await;
    let gauges: Vec<_> = lags.into_iter().flatten().collect();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::render(&gauges),
    )
        .into_response()
}

/// A JSON number that prints whole values without a fraction (`15`, not
/// `15.0`), as the contract's examples do.
pub(crate) fn number(value: f64) -> Value {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        json!(value as i64)
    } else {
        json!(value)
    }
}

/// A request body, or why it was refused (too large, unreadable).
pub(crate) fn body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(format!(
                "the request body is over the limit of {limit} bytes"
            ))
        } else {
            ApiError::BadRequest(format!("the request body could not be read: {rejection}"))
        }
    })
}

/// A JSON request body, or a 400 saying where it is broken.
pub(crate) fn json_body(
    raw: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Value, ApiError> {
    let bytes = body(raw, limit)?;
    serde_json::from_slice(&bytes).map_err(|error| {
        ApiError::BadRequest(format!("the request body is not valid JSON: {error}"))
    })
}
