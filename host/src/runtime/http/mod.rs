//! HTTP functions: the components `spin.toml` routes requests to, served
//! with wasmtime-wasi-http. A component exports either
//! `wasi:http/handler@0.3.0` (spin-sdk 7, WASIp3) or
//! `wasi:http/incoming-handler@0.2.x` (older spin-sdk, WASIp2).
//!
//! Each request gets a fresh instance (no state leaks between users) under
//! a deadline and a memory limit; a trap, a timeout or an over-limit body
//! is that request's error, never the server's. When a request ends (past
//! its deadline too, the guest looping or asleep) its store is dropped:
//! nothing of it runs on. HTTP functions keep WASI's real clocks, random
//! and async waits (they serve requests, unlike the award functions). Outbound requests go only
//! to the component's `allowed_outbound_hosts`. The imports a component may
//! have are WASI (p2 and p3), `wasi:http`, Spin's variables and key-value
//! (`spin:*@3.0.0`, `fermyon:spin/*@2.0.0`) and Laurel's own
//! `laurel:http` interfaces; anything else is refused at load, naming the
//! import.

mod host;
pub mod manifest;

pub use host::{HttpServices, KvError, ProgressError};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView};

use self::manifest::{ComponentSpec, Manifest, OutboundHost};
use super::MemoryLimiter;
use super::guest_output::GuestOutput;
use super::ticker::Ticker;
use crate::metrics;

/// Limits of one request to an HTTP function.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "HTTP functions")]
pub struct HttpLimits {
    /// One request to an HTTP function: its time limit, in milliseconds,
    /// from arrival to the last byte of the response (504 beyond).
    #[arg(
        id = "http_function_timeout_ms",
        long = "http-function-timeout-ms",
        env = "LAUREL_HTTP_FUNCTION_TIMEOUT_MS",
        default_value = "10000",
        value_parser = crate::settings::positive_millis,
        value_name = "MS"
    )]
    pub timeout: Duration,
    /// The functions' memory limit (`runtime::Limits`).
    #[arg(skip = crate::runtime::Limits::default().memory_bytes)]
    pub memory_bytes: usize,
    /// Largest request body passed in, and response body passed out (the
    /// API's body limit).
    #[arg(skip = crate::settings::MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
}

impl Default for HttpLimits {
    fn default() -> HttpLimits {
        crate::settings::defaults()
    }
}

/// Why a request to an HTTP function got no response from it.
#[derive(Debug, thiserror::Error)]
pub enum HttpFunctionError {
    #[error("the request body is over the limit of {0} bytes")]
    RequestTooLarge(usize),
    #[error("component {component} did not answer within {timeout:?}")]
    Timeout {
        component: String,
        timeout: Duration,
    },
    #[error("component {component} failed: {reason}")]
    Failed { component: String, reason: String },
    #[error("component {component} answered with a body over the limit of {limit} bytes")]
    ResponseTooLarge { component: String, limit: usize },
}

/// Loading a manifest's components failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ManifestError(pub String);

/// The served components of one manifest.
pub struct HttpFunctions {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    /// Advances the engine's epoch while a guest runs.
    ticker: Arc<Ticker>,
    linker: Linker<HttpState>,
    app: Arc<str>,
    services: Arc<dyn HttpServices>,
    manifest: Manifest,
    /// By component id; a push swaps one (requests in flight finish on
    /// the code they started with).
    components: RwLock<HashMap<String, Arc<Served>>>,
    limits: HttpLimits,
}

struct Served {
    spec: Arc<ComponentSpec>,
    variables: Arc<HashMap<String, String>>,
    stores: Arc<Vec<String>>,
    pre: Pre,
    origin: Origin,
}

/// Where a served component's code came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Its `source` in the manifest (or the built-in of that file name).
    File,
    /// A version pushed to the registry under the component's id.
    Pushed { version: i32, sha256: String },
}

/// A version of an HTTP function from the registry, to serve in place of
/// the manifest's file for the component of the same id.
#[derive(Debug, Clone)]
pub struct PushedComponent {
    pub version: i32,
    pub sha256: String,
    pub bytes: Vec<u8>,
}

/// The engine HTTP functions run on: async, component-model async
/// (WASIp3), interrupted by epochs.
fn engine() -> Result<Engine, ManifestError> {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.wasm_component_model_async(true);
    Engine::new(&config).map_err(|e| ManifestError(format!("the Wasm engine: {e}")))
}

/// Compiles and links one component: which world it serves.
fn prepare(
    engine: &Engine,
    linker: &Linker<HttpState>,
    id: &str,
    what: &str,
    bytes: &[u8],
) -> Result<Pre, ManifestError> {
    let component = Component::new(engine, bytes).map_err(|e| {
        ManifestError(format!(
            "component `{id}` ({what}) is not a valid component: {e}"
        ))
    })?;
    link(linker, id, &component)
}

/// Links a compiled component: which world it serves.
fn link(linker: &Linker<HttpState>, id: &str, component: &Component) -> Result<Pre, ManifestError> {
    let pre = linker.instantiate_pre(component).map_err(|e| {
        ManifestError(format!(
            "component `{id}` cannot be served: {}",
            import_problem(&e)
        ))
    })?;
    match wasmtime_wasi_http::p3::bindings::ServicePre::new(pre.clone()) {
        Ok(pre) => Ok(Pre::P3(pre)),
        Err(_) => match wasmtime_wasi_http::p2::bindings::ProxyPre::new(pre) {
            Ok(pre) => Ok(Pre::P2(pre)),
            Err(_) => Err(ManifestError(format!(
                "component `{id}` exports neither wasi:http/handler@0.3.0 nor wasi:http/incoming-handler@0.2: it is not an HTTP component"
            ))),
        },
    }
}

/// Why pushed bytes cannot be served as an HTTP function.
#[derive(Debug)]
pub enum Unservable {
    /// Not a component (as the HTTP functions' engine reads them).
    Invalid(String),
    /// A component, but not one Laurel can serve (no wasi:http handler, an
    /// import it lacks).
    Refused(String),
}

/// Checks that `bytes` is an HTTP function Laurel can serve (valid,
/// exporting a wasi:http handler, importing only what is provided), as a
/// push does before registering it. Returns the world it serves.
pub fn inspect(name: &str, bytes: &[u8]) -> Result<&'static str, Unservable> {
    let engine = engine().map_err(|e| Unservable::Invalid(e.0))?;
    let linker = linker(&engine).map_err(|e| Unservable::Invalid(e.0))?;
    let component = Component::new(&engine, bytes).map_err(|e| {
        Unservable::Invalid(format!("component `{name}` is not a valid component: {e}"))
    })?;
    Ok(link(&linker, name, &component)
        .map_err(|e| Unservable::Refused(e.0))?
        .world())
}

enum Pre {
    P3(wasmtime_wasi_http::p3::bindings::ServicePre<HttpState>),
    P2(wasmtime_wasi_http::p2::bindings::ProxyPre<HttpState>),
}

impl Pre {
    fn world(&self) -> &'static str {
        match self {
            Pre::P3(_) => "wasi:http/handler@0.3.0",
            Pre::P2(_) => "wasi:http/incoming-handler@0.2",
        }
    }
}

const TICK: Duration = Duration::from_millis(5);

impl HttpFunctions {
    /// Compiles and links every component of `manifest`. `fallback` finds
    /// a component's bytes when its `source` file does not exist (the
    /// built-in HTTP functions embedded in the binary, by file name).
    pub fn load(
        manifest: Manifest,
        limits: HttpLimits,
        services: Arc<dyn HttpServices>,
        fallback: &dyn Fn(&str) -> Option<&'static [u8]>,
        pushed: &HashMap<String, PushedComponent>,
    ) -> Result<HttpFunctions, ManifestError> {
        let engine = engine()?;
        let linker = linker(&engine)?;
        let mut components = HashMap::new();
        for (id, spec) in &manifest.components {
            let path: PathBuf = manifest.dir.join(&spec.source);
            let (pre, origin) = match pushed.get(id) {
                Some(version) => {
                    let what = format!("pushed v{}", version.version);
                    let pre = prepare(&engine, &linker, id, &what, &version.bytes)?;
                    let origin = Origin::Pushed {
                        version: version.version,
                        sha256: version.sha256.clone(),
                    };
                    (pre, origin)
                }
                None => {
                    let bytes: std::borrow::Cow<'static, [u8]> = match std::fs::read(&path) {
                        Ok(bytes) => bytes.into(),
                        Err(error) => {
                            let file = spec
                                .source
                                .file_name()
                                .map(|f| f.to_string_lossy().into_owned())
                                .unwrap_or_default();
                            match fallback(&file) {
                                Some(bytes) => bytes.into(),
                                None => {
                                    return Err(ManifestError(format!(
                                        "component `{id}`: cannot read {} (and no version of it is pushed): {error}",
                                        path.display()
                                    )));
                                }
                            }
                        }
                    };
                    let what = path.display().to_string();
                    (prepare(&engine, &linker, id, &what, &bytes)?, Origin::File)
                }
            };
            tracing::info!(message = "HTTP function loaded.", component = %id, world = pre.world(), origin = ?origin);
            components.insert(
                id.clone(),
                Arc::new(Served {
                    spec: Arc::new(spec.clone()),
                    variables: Arc::new(spec.variables.clone()),
                    stores: Arc::new(spec.key_value_stores.clone()),
                    pre,
                    origin,
                }),
            );
        }
        let ticker = Ticker::start(&engine, TICK, "laurel-http-epoch");
        let inner = Arc::new(Inner {
            engine,
            ticker,
            linker,
            app: manifest.name.as_str().into(),
            services,
            manifest,
            components: RwLock::new(components),
            limits,
        });
        Ok(HttpFunctions { inner })
    }

    /// Serves `pushed` for component `id` from now on (compiling it: call
    /// it off the async workers). Requests in flight finish on the code
    /// they started with; if it cannot be served, the current code stays.
    pub fn swap(&self, id: &str, pushed: &PushedComponent) -> Result<(), ManifestError> {
        let current = self
            .component(id)
            .ok_or_else(|| ManifestError(format!("no component `{id}` in the manifest")))?;
        let what = format!("pushed v{}", pushed.version);
        let inner = &self.inner;
        let pre = prepare(&inner.engine, &inner.linker, id, &what, &pushed.bytes)?;
        let served = Arc::new(Served {
            spec: current.spec.clone(),
            variables: current.variables.clone(),
            stores: current.stores.clone(),
            pre,
            origin: Origin::Pushed {
                version: pushed.version,
                sha256: pushed.sha256.clone(),
            },
        });
        inner
            .components
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), served);
        Ok(())
    }

    /// Every component's id and where its code came from.
    pub fn origins(&self) -> Vec<(String, Origin)> {
        let components = self
            .inner
            .components
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<_> = components
            .iter()
            .map(|(id, served)| (id.clone(), served.origin.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    fn component(&self, id: &str) -> Option<Arc<Served>> {
        self.inner
            .components
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    pub fn manifest(&self) -> &Manifest {
        &self.inner.manifest
    }

    /// Whether some route serves `path`.
    pub fn serves(&self, path: &str) -> bool {
        self.inner.manifest.route(path).is_some()
    }

    /// Runs the component routed to by `request`'s path; `None` if no
    /// route matches. `client` is the peer's address, if known.
    pub async fn handle(
        &self,
        request: http::Request<Bytes>,
        client: Option<std::net::SocketAddr>,
    ) -> Option<Result<http::Response<Bytes>, HttpFunctionError>> {
        let path = request.uri().path().to_string();
        let (route, params) = self.inner.manifest.route(&path)?;
        let served = self.component(&route.component)?;
        let component = route.component.clone();
        let limits = &self.inner.limits;
        if request.body().len() > limits.max_body_bytes {
            return Some(Err(HttpFunctionError::RequestTooLarge(
                limits.max_body_bytes,
            )));
        }
        let request = with_spin_headers(request, &route.pattern, &params, client);
        let started = std::time::Instant::now();
        let run = self.run(&served, request);
        let result = match tokio::time::timeout(limits.timeout, run).await {
            Ok(result) => result.map_err(|reason| match reason {
                Failure::Trap(reason) => HttpFunctionError::Failed {
                    component: component.clone(),
                    reason,
                },
                Failure::TooLarge => HttpFunctionError::ResponseTooLarge {
                    component: component.clone(),
                    limit: limits.max_body_bytes,
                },
                Failure::OutOfTime => HttpFunctionError::Timeout {
                    component: component.clone(),
                    timeout: limits.timeout,
                },
            }),
            Err(_) => Err(HttpFunctionError::Timeout {
                component: component.clone(),
                timeout: limits.timeout,
            }),
        };
        let labels = [("component", component.as_str())];
        metrics::observe(metrics::HTTP_FUNCTION_SECONDS, &labels, started.elapsed());
        let status;
        let outcome = match &result {
            Ok(response) => {
                status = response.status().as_u16().to_string();
                status.as_str()
            }
            Err(HttpFunctionError::Timeout { .. }) => "timeout",
            Err(HttpFunctionError::ResponseTooLarge { .. }) => "too_large",
            Err(_) => "failed",
        };
        metrics::add(
            metrics::HTTP_FUNCTION_REQUESTS,
            &[("component", component.as_str()), ("outcome", outcome)],
            1,
        );
        Some(result)
    }

    async fn run(
        &self,
        served: &Served,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, Failure> {
        let inner = &self.inner;
        let stderr = GuestOutput::new(2048);
        let spin = host::SpinCtx {
            app: inner.app.clone(),
            variables: served.variables.clone(),
            stores: served.stores.clone(),
            services: inner.services.clone(),
        };
        let sizes = (inner.limits.memory_bytes, inner.limits.max_body_bytes);
        let state = HttpState::new(&served.spec, spin, sizes, stderr.clone());
        let mut store = Store::new(&inner.engine, state);
        store.limiter(|s| &mut s.limiter);
        // What the host copies out of one call (a body chunk, headers, a
        // key-value write) is bounded by the component's memory.
        store.set_hostcall_fuel(inner.limits.memory_bytes);
        // The guest runs within this call, and, for a wasi:http 0.2
        // handler, in the task below until it returns.
        let _running = inner.ticker.running();
        // Every tick the guest yields to the executor, so a busy component
        // never holds a worker thread (others' requests go on); past the
        // request's time limit it is interrupted.
        let deadline = std::time::Instant::now() + inner.limits.timeout;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            Ok(if std::time::Instant::now() >= deadline {
                wasmtime::UpdateDeadline::Interrupt
            } else {
                wasmtime::UpdateDeadline::Yield(1)
            })
        });
        let fail = |error: wasmtime::Error| {
            let trap = error
                .chain()
                .find_map(|e| e.downcast_ref::<wasmtime::Trap>())
                .copied();
            if trap == Some(wasmtime::Trap::Interrupt) {
                Failure::OutOfTime
            } else {
                Failure::Trap(describe(&error, &stderr))
            }
        };
        let limit = inner.limits.max_body_bytes;
        let request = request.map(Full::new);
        match &served.pre {
            Pre::P3(pre) => {
                let service = pre.instantiate_async(&mut store).await.map_err(fail)?;
                let (request, io) = wasmtime_wasi_http::p3::Request::from_http(
                    &mut store.data_mut().hooks,
                    request,
                );
                store
                    .run_concurrent(async |store| {
                        let response = match service.handle(store, request).await? {
                            Ok(response) => response,
                            Err(code) => {
                                return Ok(Err(Failure::Trap(format!(
                                    "it answered with an error: {code:?}"
                                ))));
                            }
                        };
                        let response =
                            store.with(|store| response.into_http(store, async { Ok(()) }))?;
                        let (parts, body) = response.into_parts();
                        let body = collect(body, limit).await;
                        // The request body was handed over whole: nothing
                        // left to report on it.
                        drop(io);
                        wasmtime::error::Ok(body.map(|b| http::Response::from_parts(parts, b)))
                    })
                    .await
                    .map_err(fail)?
                    .map_err(fail)?
            }
            Pre::P2(pre) => {
                let (sender, receiver) = tokio::sync::oneshot::channel();
                let incoming = store
                    .data_mut()
                    .http()
                    .new_incoming_request(Scheme::Http, request)
                    .map_err(fail)?;
                let out = store
                    .data_mut()
                    .http()
                    .new_response_outparam(sender)
                    .map_err(fail)?;
                let pre = pre.clone();
                let running = inner.ticker.running();
                // The handler runs in a task of its own (it may go on
                // writing the body after answering). The task owns the
                // store: when this request ends, answered or past its
                // deadline, the task is aborted and the instance dropped,
                // wherever the guest was (a sleep, a loop).
                let mut task = AbortOnDrop(tokio::spawn(async move {
                    let _running = running;
                    let proxy = pre.instantiate_async(&mut store).await?;
                    proxy
                        .wasi_http_incoming_handler()
                        .call_handle(&mut store, incoming, out)
                        .await
                }));
                let task = &mut task.0;
                match receiver.await {
                    Ok(Ok(response)) => {
                        let (parts, body) = response.into_parts();
                        let body = collect(body, limit).await?;
                        Ok(http::Response::from_parts(parts, body))
                    }
                    Ok(Err(code)) => Err(Failure::Trap(format!(
                        "it answered with an error: {code:?}"
                    ))),
                    Err(_) => Err(match task.await {
                        Ok(Ok(())) => Failure::Trap("it returned without a response".into()),
                        Ok(Err(error)) => fail(error),
                        Err(error) => Failure::Trap(format!("its task failed: {error}")),
                    }),
                }
            }
        }
    }
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

enum Failure {
    Trap(String),
    /// The epoch deadline interrupted it (a loop).
    OutOfTime,
    TooLarge,
}

/// Reads a response body, up to `limit` bytes.
async fn collect(body: wasmtime_wasi_http::WasiBody, limit: usize) -> Result<Bytes, Failure> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(Failure::TooLarge),
        Err(error) => Err(Failure::Trap(format!("its response body failed: {error}"))),
    }
}

/// A trap's reason, with what the guest wrote to stderr (a panic message).
fn describe(error: &wasmtime::Error, stderr: &GuestOutput) -> String {
    let mut reason = match error
        .chain()
        .find_map(|e| e.downcast_ref::<wasmtime::Trap>())
    {
        Some(trap) => trap.to_string(),
        None => error.root_cause().to_string(),
    };
    let written = stderr.take();
    if !written.is_empty() {
        reason.push_str("; it wrote: ");
        reason.push_str(written.trim_end());
    }
    reason
}

/// The linker error for a missing import, reduced to the import's name.
fn import_problem(error: &wasmtime::Error) -> String {
    let text = format!("{error:#}");
    match text.split('`').nth(1) {
        Some(name) if text.contains("matching implementation was not found") => format!(
            "it imports `{name}`, which Laurel does not provide (HTTP functions may import WASI, wasi:http, spin:variables, spin:key-value and laurel:http)"
        ),
        _ => text,
    }
}

/// Spin's request headers: the full URL, the matched route and the rest of
/// the path, the client's address and each route parameter as
/// `spin-path-match-<name>`. Every `spin-` header is Laurel's to set: one
/// the client sent (a made-up `spin-client-addr`, a route parameter) is
/// dropped first.
fn with_spin_headers(
    request: http::Request<Bytes>,
    pattern: &str,
    params: &[(String, String)],
    client: Option<std::net::SocketAddr>,
) -> http::Request<Bytes> {
    let (mut parts, body) = request.into_parts();
    let sent: Vec<http::HeaderName> = parts
        .headers
        .keys()
        .filter(|name| name.as_str().starts_with("spin-"))
        .cloned()
        .collect();
    for name in sent {
        parts.headers.remove(name);
    }
    let host = parts
        .headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost")
        .to_string();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let full = format!("http://{host}{path_and_query}");
    if let Ok(uri) = full.parse::<http::Uri>() {
        parts.uri = uri;
    }
    let route_prefix = pattern.strip_suffix("/...").unwrap_or(pattern);
    let path = parts.uri.path().to_string();
    let matched = route_prefix.split('/').filter(|s| !s.is_empty()).count();
    let rest: String = path
        .split('/')
        .filter(|s| !s.is_empty())
        .skip(matched)
        .map(|s| format!("/{s}"))
        .collect();
    let mut set = |name: String, value: &str| {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::try_from(name),
            http::HeaderValue::from_str(value),
        ) {
            parts.headers.insert(name, value);
        }
    };
    set("spin-full-url".into(), &full);
    set("spin-matched-route".into(), pattern);
    set("spin-raw-component-route".into(), pattern);
    set("spin-component-route".into(), route_prefix);
    set("spin-base-path".into(), "/");
    set("spin-path-info".into(), &rest);
    if let Some(client) = client {
        set("spin-client-addr".into(), &client.to_string());
    }
    for (name, value) in params {
        set(format!("spin-path-match-{name}"), value);
    }
    http::Request::from_parts(parts, body)
}

fn linker(engine: &Engine) -> Result<Linker<HttpState>, ManifestError> {
    let mut linker = Linker::new(engine);
    let fail = |what: &str, e: wasmtime::Error| ManifestError(format!("linking {what}: {e}"));
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(|e| fail("WASIp2", e))?;
    wasmtime_wasi::p3::add_to_linker(&mut linker).map_err(|e| fail("WASIp3", e))?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
        .map_err(|e| fail("wasi:http@0.2", e))?;
    wasmtime_wasi_http::p3::add_to_linker(&mut linker).map_err(|e| fail("wasi:http@0.3", e))?;
    host::add_to_linker(&mut linker).map_err(|e| fail("Spin and Laurel interfaces", e))?;
    Ok(linker)
}

/// What one request's store holds.
pub(crate) struct HttpState {
    table: ResourceTable,
    wasi: WasiCtx,
    http: WasiHttpCtx,
    hooks: Outbound,
    limiter: MemoryLimiter,
    spin: host::SpinCtx,
}

impl HttpState {
    fn spin_view(&mut self) -> host::SpinView<'_> {
        host::SpinView::new(&self.spin, &mut self.table)
    }
}

impl HttpState {
    fn new(
        spec: &Arc<ComponentSpec>,
        spin: host::SpinCtx,
        (memory_bytes, max_body_bytes): (usize, usize),
        stderr: GuestOutput,
    ) -> HttpState {
        // No environment, arguments or files; stderr is kept for errors.
        let wasi = WasiCtx::builder().stderr(stderr).build();
        HttpState {
            table: ResourceTable::new(),
            wasi,
            http: WasiHttpCtx::new(),
            hooks: Outbound {
                component: spec.id.clone(),
                allowed: spec.allowed_outbound_hosts.clone(),
                services: spin.services.clone(),
                max_body_bytes,
            },
            limiter: MemoryLimiter::new(memory_bytes),
            spin,
        }
    }
}

impl WasiView for HttpState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HttpState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// Outbound requests: only to the component's allowed hosts, through a
/// proxy pool when Laurel is configured with one.
struct Outbound {
    component: String,
    allowed: Vec<OutboundHost>,
    services: Arc<dyn HttpServices>,
    max_body_bytes: usize,
}

type SendResult = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<wasmtime_wasi_http::WasiBody>,
                    Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
                ),
                wasmtime_wasi_http::Error,
            >,
        > + Send,
>;

impl WasiHttpHooks for Outbound {
    fn send_request(
        &mut self,
        request: http::Request<wasmtime_wasi_http::WasiBody>,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        fut: Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
    ) -> SendResult {
        let _ = fut;
        let uri = request.uri();
        let scheme = uri.scheme_str().unwrap_or("https").to_ascii_lowercase();
        let host = uri.host().unwrap_or_default().to_ascii_lowercase();
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "http" { 80 } else { 443 });
        if !self.allowed.iter().any(|h| h.allows(&scheme, &host, port)) {
            tracing::warn!(message = "HTTP function's outbound request refused: host not in allowed_outbound_hosts.", component = %self.component, url = %crate::secrets::redact_url(&uri.to_string()));
            return Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) });
        }
        if self.services.proxies_outbound() {
            let (services, limit) = (self.services.clone(), self.max_body_bytes);
            let component = self.component.clone();
            return Box::new(async move {
                let (parts, body) = request.into_parts();
                let body = http_body_util::Limited::new(body, limit)
                    .collect()
                    .await
                    .map_err(|_| wasmtime_wasi_http::Error::HttpRequestBodySize(None))?
                    .to_bytes();
                let response = services
                    .send_outbound(http::Request::from_parts(parts, body))
                    .await
                    .map_err(|reason| {
                        tracing::warn!(message = "HTTP function's outbound request through a proxy failed.", %component, %reason);
                        wasmtime_wasi_http::Error::InternalError(Some(reason))
                    })?;
                Ok((
                    response.map(|b| Full::new(b).map_err(|never| match never {}).boxed_unsync()),
                    Box::new(async { Ok(()) }) as Box<dyn Future<Output = _> + Send>,
                ))
            });
        }
        Box::new(async move {
            let (response, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as Box<dyn Future<Output = _> + Send>,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client cannot tell a function its own address, or a route
    /// parameter: every `spin-` header it sends is dropped, and Laurel's
    /// are set from the connection and the route.
    #[test]
    fn spin_headers_are_laurels_to_set() {
        let request = http::Request::builder()
            .uri("/badges/u-1/regular")
            .header("host", "laurel.example")
            .header("spin-client-addr", "6.6.6.6:1")
            .header("spin-path-match-user_id", "someone-else")
            .header("spin-made-up", "x")
            .header("x-kept", "yes")
            .body(Bytes::new())
            .unwrap();
        let client: std::net::SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let params = [("user_id".to_string(), "u-1".to_string())];
        let seen = with_spin_headers(request, "/badges/:user_id/:award_id", &params, Some(client));
        let header = |name: &str| {
            seen.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_string())
        };
        assert_eq!(
            header("spin-client-addr").as_deref(),
            Some("127.0.0.1:40000")
        );
        assert_eq!(header("spin-path-match-user_id").as_deref(), Some("u-1"));
        assert_eq!(header("spin-made-up"), None);
        assert_eq!(header("x-kept").as_deref(), Some("yes"));
        // Without a known client address, none is claimed.
        let request = http::Request::builder()
            .uri("/x")
            .header("spin-client-addr", "6.6.6.6:1")
            .body(Bytes::new())
            .unwrap();
        let seen = with_spin_headers(request, "/x", &[], None);
        assert!(seen.headers().get("spin-client-addr").is_none());
    }
}
