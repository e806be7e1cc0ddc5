//! The HTTP surface: the public API (apps, with a user's JWT), the admin
//! API (operators and support, with the admin token), health and the
//! OpenAPI document, on one server (role `api`).
//!
//! **API Boundary:** handlers read and write through `store`,
//! `definitions` and `proxy`; they hold no SQL and no Redis commands of
//! their own. Errors map to status codes in one place (`error.rs`).

mod admin;
mod auth;
mod badges;
mod console;
mod error;
mod explain;
mod functions;
mod health;
mod kafka_watch;
mod progress;
mod public;
mod services;
mod settings;
mod tokens;

pub use auth::{AdminToken, Caller, Role, Secret, mint_user_token, random_secret};
pub use error::ApiError;
pub use settings::ApiSettings;
pub use tokens::{TokenSettings, UserTokens};

use functions::{follow_pushes, http_function, pushed_component};
use health::healthz;
use kafka_watch::{KafkaView, watch_kafka};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use serde_json::Value;
use tokio::net::TcpListener;
use tracing::{Instrument, info, warn};

use crate::catalog::Catalog;
use crate::proxy::ProxyPools;
use crate::registry::Registry;
use crate::runtime::http::manifest::Manifest;
use crate::runtime::http::{HttpFunctions, HttpLimits, PushedComponent};
use crate::store::{PooledStore, StorePool};

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
    /// Kafka as last read by the watcher (brokers' health, consumer lag).
    kafka: Arc<std::sync::RwLock<KafkaView>>,
    /// Permits for heavy admin requests (`LAUREL_HTTP_HEAVY_REQUESTS`).
    heavy: Arc<tokio::sync::Semaphore>,
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
        let kafka = Arc::new(std::sync::RwLock::new(KafkaView::default()));
        if let Some(brokers) = &settings.kafka_brokers {
            tokio::spawn(watch_kafka(
                Arc::downgrade(&kafka),
                brokers.clone(),
                settings.group_prefix.clone(),
                settings.database_url.clone(),
                settings.kafka_every,
            ));
        }
        AppState {
            kafka,
            heavy: Arc::new(tokio::sync::Semaphore::new(settings.heavy_requests)),
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

    /// A permit for heavy work (`what`, e.g. "a diff"), held while it runs;
    /// 429 when as many are running as the settings allow.
    pub(crate) fn heavy(&self, what: &str) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        self.heavy.clone().try_acquire_owned().map_err(|_| {
            ApiError::TooManyRequests(format!(
                "busy: {} heavy admin requests (diffs, explains, replays) are running, as many as LAUREL_HTTP_HEAVY_REQUESTS allows; {what} can be asked again in a moment",
                self.settings.heavy_requests
            ))
        })
    }

    /// Largest component upload: the sandbox's limit.
    fn max_function_bytes(&self) -> usize {
        self.registry.runtime().limits().component_bytes
    }

    /// Loads the components of `manifest` and serves them on its routes
    /// (paths Laurel's own routes do not take). Once per state. A version
    /// pushed to the registry under a component's id (`laurel functions
    /// push ID FILE --kind http`) serves instead of its source file, and
    /// later pushes, promotions and rollbacks swap it without a restart.
    pub async fn serve_functions(
        self: &Arc<Self>,
        manifest: Manifest,
        limits: HttpLimits,
    ) -> anyhow::Result<()> {
        for route in &manifest.routes {
            let prefix = route.pattern.trim_end_matches("/...");
            for own in [
                "/v1",
                "/admin",
                "/healthz",
                "/metrics",
                "/openapi.json",
                "/schemas",
            ] {
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
            limits.max_body_bytes,
        )?;
        let mut pushed = HashMap::new();
        let live = self.registry.http_functions();
        for id in manifest.components.keys() {
            if let Some((version, _)) = live.get(id) {
                let store = self.store().await.map_err(|e| anyhow::anyhow!("{e}"))?;
                pushed.insert(id.clone(), pushed_component(&store, id, *version).await?);
            }
        }
        let functions = Arc::new(HttpFunctions::load(
            manifest,
            limits,
            Arc::new(services),
            &crate::library::http_builtin,
            &pushed,
        )?);
        self.functions
            .set(Arc::clone(&functions))
            .map_err(|_| anyhow::anyhow!("HTTP functions are already being served"))?;
        tokio::spawn(follow_pushes(Arc::downgrade(self), functions));
        Ok(())
    }

    /// Each served HTTP function's component id and where its code came
    /// from (none without a manifest).
    pub fn http_function_origins(&self) -> Vec<(String, crate::runtime::http::Origin)> {
        self.functions
            .get()
            .map(|functions| functions.origins())
            .unwrap_or_default()
    }

    async fn store(&self) -> Result<PooledStore<'_>, ApiError> {
        Ok(self.pool.get().await?)
    }

    /// A source's consumer lag (messages its group has yet to consume),
    /// as last read (every 10 s).
    fn lag(&self, source: &str) -> Result<i64, String> {
        self.cached_lag(|view| view.lag.get(source), "source")
    }

    /// Whether `source`'s topic did not exist at the last read (its
    /// consumers wait for a producer to create it).
    fn waiting_for_topic(&self, source: &str) -> bool {
        let view = self.kafka.read().unwrap_or_else(|p| p.into_inner());
        view.waiting.contains(source)
    }

    /// A pipeline's consumer lag on its input topic (raw records the
    /// pre-filter has yet to take), as last read (every 10 s).
    fn pipeline_lag(&self, pipeline: &str) -> Result<i64, String> {
        self.cached_lag(|view| view.pipeline_lag.get(pipeline), "pipeline")
    }

    /// The lag gauges of `/metrics`: every source's and pipeline's lag as
    /// last read (the watcher reads which there are from PostgreSQL, so a
    /// scrape does not).
    fn lag_gauges(&self) -> Vec<crate::metrics::Gauge> {
        let view = self.kafka.read().unwrap_or_else(|p| p.into_inner());
        let gauges = |name, label, lags: &HashMap<String, Result<i64, String>>| {
            lags.iter()
                .filter_map(|(of, lag)| {
                    lag.as_ref().ok().map(|lag| crate::metrics::Gauge {
                        name,
                        labels: vec![(label, of.clone())],
                        value: *lag as f64,
                    })
                })
                .collect::<Vec<_>>()
        };
        let mut all = gauges(crate::metrics::CONSUMER_LAG, "source", &view.lag);
        all.extend(gauges(
            crate::metrics::PREFILTER_LAG,
            "pipeline",
            &view.pipeline_lag,
        ));
        all
    }

    fn cached_lag(
        &self,
        of: impl FnOnce(&KafkaView) -> Option<&Result<i64, String>>,
        what: &str,
    ) -> Result<i64, String> {
        if self.settings.kafka_brokers.is_none() {
            return Err("this process has no Kafka brokers configured".to_string());
        }
        let view = self.kafka.read().unwrap_or_else(|p| p.into_inner());
        match (&view.brokers, of(&view)) {
            (_, Some(lag)) => lag.clone(),
            (None, None) => Err("not read yet (every 10 s)".to_string()),
            (Some(Err(error)), None) => Err(error.clone()),
            (Some(Ok(())), None) => Err(format!("not read yet (a new {what})")),
        }
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
        .merge(console::routes())
        .nest("/admin/v1", admin::routes(state.clone()))
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi))
        .route("/schemas/{name}", get(schema))
        .route("/metrics", get(metrics))
        .fallback(http_function)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            body_in_time,
        ))
        .layer(axum::middleware::from_fn(traced))
        .with_state(state)
}

/// Each request in a span (method, route, status): what is logged while
/// serving it carries them, and one debug line says how it ended.
async fn traced(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("(function or none)", |path| path.as_str())
        .to_string();
    let span = tracing::info_span!(
        "http_request",
        method = %request.method(),
        route = %route,
        status = tracing::field::Empty
    );
    let started = std::time::Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    span.record("status", response.status().as_u16());
    span.in_scope(|| {
        tracing::debug!(
            message = "Request served.",
            took_us = started.elapsed().as_micros() as u64
        )
    });
    response
}

/// Serves the API on `listener` until `shutdown` resolves; requests in
/// flight finish first.
pub async fn run(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    info!(message = "HTTP API listening.", addr = %listener.local_addr()?);
    let settings = state.settings.clone();
    let app = router(state);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let connections = Arc::new(tokio::sync::Semaphore::new(settings.max_connections.max(1)));
    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = Duration::from_millis(5);
    loop {
        // At most max_connections at once: the next accept waits for one
        // to end (the kernel's backlog holds the rest).
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => permit?,
            _ = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff = Duration::from_millis(5);
                    stream
                }
                Err(error) => {
                    // Out of file descriptors, say: back off, with a cap.
                    warn!(message = "Failed to accept a connection.", %error);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(settings.header_timeout)
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(error) = connection.await {
                tracing::debug!(message = "A connection ended with an error.", %error);
            }
        });
    }
    drop(listener);
    // Requests in flight finish; past the deadline their connections close.
    if tokio::time::timeout(settings.shutdown_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(
            message =
                "Requests still in flight at the shutdown deadline; closing their connections.",
            deadline_ms = settings.shutdown_timeout.as_millis() as u64
        );
    }
    Ok(())
}

/// A request's body must arrive whole within the body timeout (a client
/// that sends slowly does not hold a handler, or a stop, for ever). Nothing
/// is read here: the body is read by its handler, after the route's
/// authentication and with the route's own limit (`DefaultBodyLimit`), so
/// an unauthenticated request is refused before any of its body is read.
/// A body past its deadline fails to read with [`BodyLate`] (408).
async fn body_in_time(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let timeout = state.settings.body_timeout;
    let request = request.map(|body| {
        axum::body::Body::new(Deadline {
            body,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
        })
    });
    next.run(request).await
}

/// A body that fails once its deadline passes.
struct Deadline {
    body: axum::body::Body,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            let late = BodyLate(self.timeout);
            return std::task::Poll::Ready(Some(Err(axum::Error::new(late))));
        }
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A request body that did not arrive within the body timeout.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {} ms", .0.as_millis())]
pub(crate) struct BodyLate(Duration);

impl BodyLate {
    /// The deadline this error (or one of its causes) names, if any.
    fn in_chain<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyLate> {
        let mut cause = Some(error);
        while let Some(error) = cause {
            if let Some(late) = error.downcast_ref::<BodyLate>() {
                return Some(late);
            }
            cause = error.source();
        }
        None
    }
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

/// The JSON Schemas of what Laurel takes, as served at `/schemas/NAME`:
/// the award and pipeline definitions, the event envelope and the fixture
/// lines.
pub const SCHEMAS: [(&str, &str); 4] = [
    ("award.json", include_str!("schemas/award.json")),
    ("pipeline.json", include_str!("schemas/pipeline.json")),
    ("event.json", include_str!("schemas/event.json")),
    ("fixture.json", include_str!("schemas/fixture.json")),
];

async fn schema(axum::extract::Path(name): axum::extract::Path<String>) -> Response {
    match SCHEMAS.iter().find(|(file, _)| *file == name) {
        Some((_, text)) => (
            [(axum::http::header::CONTENT_TYPE, "application/schema+json")],
            *text,
        )
            .into_response(),
        None => ApiError::NotFound(format!(
            "no schema named {name:?} (award.json, pipeline.json, event.json, fixture.json)"
        ))
        .into_response(),
    }
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

/// This process's counters and histograms, and the consumer lag of each
/// source and each pre-filter pipeline as last read from the brokers, in
/// the Prometheus text format; a scrape asks neither PostgreSQL nor Kafka.
/// Counters are served even when PostgreSQL or Kafka is away (the lag is
/// then missing, from the watcher's next read on).
async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let gauges = state.lag_gauges();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            crate::metrics::CONTENT_TYPE,
        )],
        crate::metrics::render(&gauges),
    )
        .into_response()
}

/// A JSON number that prints whole values without a fraction (`15`, not
/// `15.0`), as the contract's examples do (a typed response's field, with
/// `serialize_with`).
pub(crate) fn whole_number<S: serde::Serializer>(value: &f64, to: S) -> Result<S::Ok, S::Error> {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        to.serialize_i64(*value as i64)
    } else {
        to.serialize_f64(*value)
    }
}

/// A request body, or why it was refused (too large, unreadable).
pub(crate) fn body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if let Some(late) = BodyLate::in_chain(&rejection) {
            ApiError::RequestTimeout(late.to_string())
        } else if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(format!(
                "the request body is over the limit of {limit} bytes"
            ))
        } else {
            ApiError::BadRequest(format!("the request body could not be read: {rejection}"))
        }
    })
}

/// A body read by its handler (after the route's authentication), up to
/// `limit` bytes: 413 beyond, 408 if it came too slowly.
pub(crate) async fn read_body(body: axum::body::Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|error| {
        if let Some(late) = BodyLate::in_chain(&error) {
            ApiError::RequestTimeout(late.to_string())
        } else {
            ApiError::PayloadTooLarge(format!(
                "the request body is over the limit of {limit} bytes, or could not be read"
            ))
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
