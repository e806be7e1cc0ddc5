//! The role supervisor: `laurel up` and `laurel serve` start each role with
//! the shutdown signal, stop them all when one fails or the signal comes,
//! and wait for the work in hand up to the shutdown deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::catalog::Catalog;
use crate::cli::settings::{Connections, Serving, backfill_settings, prefilter_settings};
use crate::kafka;
use crate::kafka::LocalBroker;
use crate::registry::Registry;
use crate::runtime::Runtime;
use crate::store::Store;
use crate::{awards, definitions, demo, ingest, library, notify, pipelines};

/// What a process runs: `laurel serve --roles` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Role {
    /// Consume every registered source into counters.
    Ingest,
    /// Turn changed counters into award progress and awards.
    Awards,
    /// Deliver award notifications to webhooks.
    Notify,
    /// Re-check proxy pools' candidates.
    Proxies,
    /// The HTTP server: public and admin APIs, HTTP functions, health,
    /// metrics.
    Api,
    /// Raw analytics topics into events some award can use (pipelines).
    Prefilter,
}

impl Role {
    /// The roles this build can run, in the order they start.
    pub const BUILT: [Role; 6] = [
        Role::Ingest,
        Role::Awards,
        Role::Notify,
        Role::Proxies,
        Role::Api,
        Role::Prefilter,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Role::Ingest => "ingest",
            Role::Awards => "awards",
            Role::Notify => "notify",
            Role::Proxies => "proxies",
            Role::Api => "api",
            Role::Prefilter => "prefilter",
        }
    }
}

/// Migrates the database (creating it if missing) and registers the
/// built-in library.
pub(super) async fn prepare(connections: &Connections, runtime: &Runtime) -> anyhow::Result<()> {
    let mut store = Store::connect(&connections.database_url).await?;
    for name in store.migrate().await? {
        info!(message = "Applied a migration.", migration = name);
    }
    library::register(&mut store, runtime).await?;
    Ok(())
}

/// `laurel up`: every role in one process, until `shutdown` resolves.
/// The in-process broker, when one is started, is left in `local`: the
/// caller drops it after every client of it (spawned tasks included), so
/// none sees its broker vanish while it shuts down.
pub(super) async fn up(
    connections: &Connections,
    mut serving: Serving,
    demo: bool,
    local: &mut Option<LocalBroker>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    serving.api.check_secrets()?;
    if demo {
        let serves_functions = serving.process.spin_manifest().is_some();
        demo::secrets(&mut serving.api, serves_functions);
    }
    let runtime = serving.sandbox.runtime()?;
    prepare(connections, &runtime).await?;
    let registry = Registry::start(&connections.database_url, runtime).await?;
    print_functions(&registry);
    let brokers = match &serving.process.kafka_brokers {
        Some(brokers) => brokers.clone(),
        None => {
            let broker = local.insert(LocalBroker::start(None).await?);
            create_source_topics(broker, &connections.database_url).await?;
            println!(
                "Kafka broker (in process, librdkafka mock cluster): {}",
                broker.bootstrap_servers()
            );
            println!(
                "  produce with e.g.: kcat -P -b {} -t events.photos -k u-42",
                broker.bootstrap_servers()
            );
            broker.bootstrap_servers().to_string()
        }
    };
    if demo {
        demo::run(&registry)?;
        let mut store = Store::connect(&connections.database_url).await?;
        let applied = definitions::apply(&mut store, &registry, demo::AWARDS).await?;
        for (id, version) in applied {
            println!("Demo award {id} v{version} applied.");
        }
        for (name, version) in pipelines::apply(&mut store, &registry, demo::PIPELINE).await? {
            println!(
                "Demo pipeline {name} v{version} applied: {} -> events.bss, only what an award needs.",
                demo::RAW_TOPIC
            );
        }
        if let Some(broker) = local {
            create_source_topics(broker, &connections.database_url).await?;
        }
        let brokers = brokers.clone();
        let database_url = connections.database_url.clone();
        tokio::spawn(async move {
            if let Err(error) = demo::publish_and_show(&brokers, &database_url).await {
                warn!(message = "The demo stream failed.", error = %format!("{error:#}"));
            }
        });
    }
    serving.wire(connections, &brokers);
    run_roles(connections, &serving, &Role::BUILT, registry, shutdown).await
}

/// Creates `events.<source>` and its dead-letter topic on the local broker
/// for every registered source, and each pipeline's raw topic and its
/// dead-letter topic, so consumers find them at once.
async fn create_source_topics(broker: &LocalBroker, database_url: &str) -> anyhow::Result<()> {
    let store = Store::connect(database_url).await?;
    for source in store.sources().await? {
        broker.create_topic(&source.topic, 4)?;
        broker.create_topic(&kafka::source_dead_topic(&source.name), 1)?;
    }
    for pipeline in store.pipelines().await? {
        broker.create_topic(&pipeline.input_topic, 4)?;
        broker.create_topic(&kafka::dead_topic(&pipeline.input_topic), 1)?;
    }
    Ok(())
}

/// `laurel serve --roles ...`.
pub(super) async fn serve(
    connections: &Connections,
    mut serving: Serving,
    roles: &[Role],
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    serving.api.check_secrets()?;
    if let Some(role) = roles.iter().find(|r| !Role::BUILT.contains(r)) {
        anyhow::bail!(
            "role `{}` is not built yet (this build has: {})",
            role.name(),
            Role::BUILT.map(Role::name).join(", ")
        );
    }
    let brokers = match &serving.process.kafka_brokers {
        Some(brokers) => brokers.clone(),
        None if roles.contains(&Role::Ingest) => anyhow::bail!(
            "LAUREL_KAFKA_BROKERS (or --kafka-brokers) must name the brokers for `serve --roles ingest`; `laurel up` runs a local one"
        ),
        None => String::new(),
    };
    let runtime = serving.sandbox.runtime()?;
    prepare(connections, &runtime).await?;
    let registry = Registry::start(&connections.database_url, runtime).await?;
    serving.wire(connections, &brokers);
    run_roles(connections, &serving, roles, registry, shutdown).await
}

/// A running task of the process: its name and how it ended.
type Running<'a> = Pin<Box<dyn Future<Output = (&'static str, anyhow::Result<()>)> + Send + 'a>>;

/// What every role is started with.
struct Shared<'a> {
    connections: &'a Connections,
    serving: &'a Serving,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
}

/// Resolves once `stop` says so.
async fn until_stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// The ingest role as a process runs it: the source consumers, and the
/// backfills from history, taken up by whichever ingest process is free;
/// both until `shutdown`.
pub async fn ingest_and_backfill(
    settings: crate::ingest::IngestSettings,
    database_url: &str,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let (stop, stopped) = watch::channel(false);
    let backfills = crate::backfill::run(
        database_url.to_string(),
        registry.clone(),
        backfill_settings(&settings),
        stopped,
    );
    let ingest = async {
        let ended = ingest::run(settings, database_url, registry, catalog, shutdown).await;
        let _ = stop.send(true);
        ended
    };
    let (ended, ()) = tokio::join!(ingest, backfills);
    ended
}

/// Starts `role`: what it must have to run is checked (and printed) now,
/// so a bad setting fails the start, not a role later; the returned task
/// runs until `stopped` resolves.
async fn start<'a>(
    role: Role,
    shared: &Shared<'a>,
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<Running<'a>> {
    let stopped = until_stopped(stop.clone());
    let (connections, serving) = (shared.connections, shared.serving);
    let database_url = connections.database_url.as_str();
    let (registry, catalog) = (shared.registry.clone(), shared.catalog.clone());
    let name = role.name();
    Ok(match role {
        Role::Ingest => {
            info!(message = "Ingest starting.", brokers = %serving.ingest.brokers);
            let settings = serving.ingest.clone();
            Box::pin(async move {
                let ended =
                    ingest_and_backfill(settings, database_url, registry, catalog, stopped).await;
                (name, ended)
            })
        }
        Role::Awards => {
            info!(
                message = "Awards worker starting.",
                workers = serving.awards.workers
            );
            let settings = serving.awards.clone();
            Box::pin(async move {
                let ended = awards::run(settings, database_url, registry, catalog, stopped).await;
                (name, ended)
            })
        }
        Role::Notify => {
            info!(message = "Notifier starting.");
            let settings = serving.notify.clone();
            Box::pin(async move { (name, notify::run(settings, database_url, stopped).await) })
        }
        Role::Proxies => {
            info!(message = "Proxy re-checker starting.", redis = %crate::secrets::redact_url(&connections.redis_url));
            let redis_url = connections.redis_url.as_str();
            Box::pin(async move {
                let ended = crate::proxy::recheck::run(database_url, redis_url, stopped).await;
                (name, ended)
            })
        }
        Role::Api => {
            let (listener, state) = start_api(serving, registry, catalog).await?;
            Box::pin(async move { (name, crate::api::run(listener, state, stopped).await) })
        }
        Role::Prefilter => {
            info!(message = "Pre-filter starting.", brokers = %serving.ingest.brokers);
            let settings = prefilter_settings(&serving.ingest);
            Box::pin(async move {
                let ended =
                    crate::prefilter::run(settings, database_url, registry, catalog, stopped).await;
                (name, ended)
            })
        }
    })
}

/// The API's listener and state, with `spin.toml`'s functions loaded.
async fn start_api(
    serving: &Serving,
    registry: Arc<Registry>,
    catalog: Arc<Catalog>,
) -> anyhow::Result<(tokio::net::TcpListener, Arc<crate::api::AppState>)> {
    let mut settings = serving.api.clone();
    let listener = tokio::net::TcpListener::bind(settings.addr)
        .await
        .with_context(|| format!("failed to listen on {} (LAUREL_HTTP_ADDR)", settings.addr))?;
    let addr = listener.local_addr()?;
    println!("HTTP API at http://{addr} (admin API under /admin/v1, OpenAPI at /openapi.json)");
    if !settings.admin_enabled() {
        println!(
            "  the admin API refuses every request: neither LAUREL_ADMIN_TOKEN nor LAUREL_ADMIN_TOKENS is set"
        );
    }
    if settings.tokens.secret.is_none() && settings.tokens.jwks.is_none() {
        println!("  the public API refuses every request: LAUREL_JWT_SECRET is not set");
    }
    settings.read_admin_tokens_file()?;
    let state = Arc::new(crate::api::AppState::new(settings, registry, catalog));
    if let Some(path) = serving.process.spin_manifest() {
        let manifest =
            crate::runtime::http::manifest::load(&path, &|name| std::env::var(name).ok())?;
        let routes: Vec<(String, String)> = manifest
            .routes
            .iter()
            .map(|r| (r.pattern.clone(), r.component.clone()))
            .collect();
        state
            .serve_functions(manifest, serving.http_functions.clone())
            .await
            .with_context(|| format!("cannot serve {}", path.display()))?;
        let origins: std::collections::HashMap<_, _> =
            state.http_function_origins().into_iter().collect();
        println!("HTTP functions from {}:", path.display());
        for (pattern, component) in routes {
            match origins.get(&component) {
                Some(crate::runtime::http::Origin::Pushed { version, .. }) => {
                    println!("  {pattern} -> {component} (pushed v{version})")
                }
                _ => println!("  {pattern} -> {component}"),
            }
        }
    }
    Ok((listener, state))
}

/// Runs `roles` (and the retention task) until `shutdown` resolves or one
/// of them fails; then stops them all, up to the shutdown deadline.
async fn run_roles(
    connections: &Connections,
    serving: &Serving,
    roles: &[Role],
    registry: Arc<Registry>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut roles = roles.to_vec();
    roles.sort();
    roles.dedup();
    let shared = Shared {
        connections,
        serving,
        catalog: Catalog::start(&connections.database_url).await?,
        registry,
    };
    // Every task stops when `shutdown` resolves, or when one fails.
    let (stop, stopped) = watch::channel(false);
    let mut running: FuturesUnordered<Running<'_>> = FuturesUnordered::new();
    let database_url = connections.database_url.clone();
    let days = serving.process.log_retention_days;
    let retention = until_stopped(stopped.clone());
    running.push(Box::pin(async move {
        prune(&database_url, days, retention).await;
        ("retention", Ok(()))
    }));
    for role in roles {
        running.push(start(role, &shared, &stopped).await?);
    }
    tokio::pin!(shutdown);
    let mut result = Ok(());
    tokio::select! {
        _ = &mut shutdown => {}
        Some((task, ended)) = running.next() => {
            result = ended.with_context(|| format!("role {task} stopped"));
            if result.is_ok() {
                warn!(message = "A role ended on its own; stopping the others.", role = task);
            }
        }
    }
    let _ = stop.send(true);
    // Batches, cycles and requests in hand finish, up to the deadline;
    // past it the process exits anyway: nothing is lost, since what was
    // not committed (a batch, its offsets, a claimed cycle) rolls back and
    // is taken again by the next process.
    let deadline = serving.process.shutdown_timeout;
    let stopping = async {
        while let Some((task, ended)) = running.next().await {
            if let Err(error) = ended {
                warn!(message = "A role failed while stopping.", role = task, error = %format!("{error:#}"));
            }
        }
    };
    if tokio::time::timeout(deadline, stopping).await.is_err() {
        warn!(
            message = "Roles still stopping at the shutdown deadline; exiting (what they did not commit is rolled back and done again).",
            deadline_ms = deadline.as_millis() as u64
        );
        std::process::exit(1);
    }
    info!(message = "Shut down.");
    result
}

/// Keeps the processing log and the applied-event ids within their
/// retention, a bounded batch at a time, until `stopped` resolves.
async fn prune(database_url: &str, log_days: i32, stopped: impl Future<Output = ()>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    let pruning = async {
        loop {
            tick.tick().await;
            let Ok(store) = Store::connect(database_url).await else {
                continue;
            };
            loop {
                match store.prune(log_days, log_days.max(7), 10_000).await {
                    Ok(0) => break,
                    Ok(n) => info!(message = "Pruned old log entries.", rows = n),
                    Err(error) => {
                        warn!(message = "Pruning failed.", %error);
                        break;
                    }
                }
            }
        }
    };
    // A batch being pruned at the stop is rolled back: the next process
    // prunes it.
    tokio::select! {
        _ = stopped => {}
        _ = pruning => {}
    }
}

fn print_functions(registry: &Registry) {
    println!("Laurel is up. Functions loaded:");
    for function in registry.functions() {
        let note = function
            .quarantined()
            .map(|r| format!("  QUARANTINED: {r}"))
            .unwrap_or_default();
        println!(
            "  {:<28} {:<9} v{:<4} {}{note}",
            function.name,
            function.kind,
            function.version,
            &function.sha256[..12]
        );
    }
    for (name, version, reason) in registry.unloadable() {
        println!("  {name:<28} v{version} FAILED TO LOAD: {reason}");
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is
/// called (not when the future is first polled), so a signal during
/// start-up is a clean stop too, not the default action (killed by the
/// signal).
pub fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate()).ok();
        let interrupt = signal(SignalKind::interrupt()).ok();
        async move {
            let until = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = until(term) => {}
                _ = until(interrupt) => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
