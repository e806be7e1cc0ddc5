//! The `laurel` command line.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tracing::{info, warn};

use crate::catalog::Catalog;
use crate::ingest::{self, LocalBroker};
use crate::registry::Registry;
use crate::runtime::{FunctionKind, Runtime};
use crate::settings::Settings;
use crate::store::{PushOutcome, Store};
use crate::{awards, definitions, demo, library, notify};

#[derive(Debug, Parser)]
#[command(
    name = "laurel",
    version,
    about = "An achievements engine whose award logic ships as sandboxed WebAssembly"
)]
pub struct Cli {
    #[command(flatten)]
    settings: Settings,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Everything in one process: migrate, register the built-in library,
    /// then run every role until SIGINT/SIGTERM. Without
    /// LAUREL_KAFKA_BROKERS, starts a Kafka broker in process.
    Up {
        /// Also load the demo awards and publish a small demo event stream.
        #[arg(long)]
        demo: bool,
    },
    /// Run some roles only (several processes may run the same roles).
    Serve {
        /// Comma-separated: ingest, awards, notify, proxies, api (prefilter
        /// arrives with its issue).
        #[arg(long, value_delimiter = ',', required = true)]
        roles: Vec<String>,
    },
    /// Apply migrations/ (creating the database if missing) and register the
    /// built-in function library, then exit.
    Migrate,
    /// Manage Wasm functions.
    Functions {
        #[command(subcommand)]
        command: FunctionsCommand,
    },
    /// Manage award definitions.
    Awards {
        #[command(subcommand)]
        command: AwardsCommand,
    },
    /// Manage event sources.
    Sources {
        #[command(subcommand)]
        command: SourcesCommand,
    },
    /// Proxy pools: settings, candidates, eligibility, allocation.
    Proxies {
        #[command(subcommand)]
        command: ProxiesCommand,
    },
    /// Where award notifications are delivered.
    Webhooks {
        #[command(subcommand)]
        command: WebhooksCommand,
    },
    /// Events that could not be applied (dead-lettered whole, or held for
    /// one objective), kept for replay after a fix.
    DeadLetters {
        #[command(subcommand)]
        command: DeadLettersCommand,
    },
    /// Users: their awards, and who gets none.
    Users {
        #[command(subcommand)]
        command: UsersCommand,
    },
    /// Development helpers.
    Dev {
        #[command(subcommand)]
        command: DevCommand,
    },
}

#[derive(Debug, Subcommand)]
enum FunctionsCommand {
    /// Register FILE as a new version of NAME (its kind is read from the
    /// component; `--kind` makes it a check).
    Push {
        name: String,
        file: PathBuf,
        #[arg(long, value_parser = parse_kind)]
        kind: Option<FunctionKind>,
        /// Push even if an award's config is refused by the new version.
        #[arg(long)]
        force: bool,
    },
    /// List functions: name, kind, current version, sha256.
    List {
        /// Every version, not only the current one.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Subcommand)]
enum AwardsCommand {
    /// Create or replace the award definitions in FILE (one object or an
    /// array), all or nothing.
    Apply { file: PathBuf },
    /// List award definitions (and backfills in progress).
    List,
    /// Compute an award again for every user with counters for it (e.g.
    /// after its strategy function was fixed).
    Recompute { id: String },
}

#[derive(Debug, Subcommand)]
enum ProxiesCommand {
    /// Configure proxy pools: what each admits and how it hands out.
    Pool {
        #[command(subcommand)]
        command: PoolCommand,
    },
    /// Configured pools and their settings.
    Pools,
    /// Read a free proxy list (SOURCE: a file, `-` for stdin, or an
    /// http(s) URL; one scheme://host:port a line) into POOL: each
    /// candidate is checked now and the eligible admitted.
    Import {
        pool: String,
        source: String,
        /// Drop the pool's candidates that are not in this list.
        #[arg(long)]
        replace: bool,
    },
    /// Check every candidate of POOL now: failing members leave the
    /// eligible set, recovered ones come back.
    Check { pool: String },
    /// A pool's proxies: eligible or why not, allocations, leases.
    List { pool: String },
    /// Allocate the least-used eligible proxy of POOL (counted), COUNT
    /// times; prints each, or says the pool has none.
    Allocate {
        pool: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
}

#[derive(Debug, Subcommand)]
enum PoolCommand {
    /// Create or change a pool (its candidates stay).
    Set {
        name: String,
        /// Requested through each candidate; must answer 2xx.
        #[arg(long)]
        check_url: String,
        /// least-used, or least-concurrent (leases).
        #[arg(long, default_value = "least-used")]
        policy: String,
        #[arg(long, default_value_t = 5000)]
        timeout_ms: u64,
        /// Slower candidates are refused.
        #[arg(long, default_value_t = 2000)]
        max_latency_ms: u64,
        /// Schemes a member may have.
        #[arg(long, value_delimiter = ',', default_value = "http")]
        schemes: Vec<String>,
        /// Hosts never admitted.
        #[arg(long, value_delimiter = ',')]
        deny: Vec<String>,
        /// How often every candidate is checked again.
        #[arg(long, default_value_t = 300_000)]
        recheck_ms: u64,
        /// least-concurrent: a lease not released by then expires.
        #[arg(long, default_value_t = 60_000)]
        lease_ttl_ms: u64,
        /// least-concurrent: leases one member may hold at once.
        #[arg(long)]
        max_in_flight: Option<i32>,
        /// Admit candidates on loopback, link-local and private addresses
        /// (refused otherwise).
        #[arg(long)]
        allow_private: bool,
    },
    /// Delete a pool: its settings, candidates and Redis keys.
    Delete { name: String },
}

#[derive(Debug, Subcommand)]
enum WebhooksCommand {
    /// Create or replace a webhook.
    Set {
        name: String,
        url: String,
        /// Comma-separated: award.completed, award.revoked.
        #[arg(long, value_delimiter = ',', default_value = "award.completed")]
        events: Vec<String>,
        /// Send each delivery through a proxy allocated from this pool.
        #[arg(long)]
        proxy_pool: Option<String>,
    },
    /// List webhooks.
    List,
    /// Delete a webhook (its pending notifications are given up).
    Delete { name: String },
}

#[derive(Debug, Subcommand)]
enum SourcesCommand {
    /// List sources: topic and state.
    List,
    /// Register a source (topic `events.NAME` unless given).
    Add {
        name: String,
        #[arg(long)]
        topic: Option<String>,
    },
    /// Stop consuming a source (every process, within a second).
    Pause { name: String },
    /// Consume a paused source again.
    Resume { name: String },
}

#[derive(Debug, Subcommand)]
enum DeadLettersCommand {
    /// A source's dead letters, newest first: what, for which objective
    /// (`-`: the whole event), why.
    List {
        source: String,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Replayed ones too.
        #[arg(long)]
        all: bool,
    },
    /// Re-drive a source's open dead letters after a fix: each applies
    /// once per objective (an objective that applied an event never
    /// applies it again); those that still fail stay, with their reason.
    Replay {
        source: String,
        /// Only those dead-lettered at or after this time (RFC 3339).
        #[arg(long)]
        since: Option<chrono::DateTime<chrono::Utc>>,
        /// Only those whose reason contains this text.
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum UsersCommand {
    /// A user's award progress, as the awards worker last computed it.
    Show { user_id: String },
    /// A banned user's events are skipped (logged).
    Ban { user_id: String },
    /// A deleted user's events are skipped (logged).
    Delete { user_id: String },
    /// The user gets progress again (from new events on).
    Restore { user_id: String },
}

#[derive(Debug, Subcommand)]
enum DevCommand {
    /// Run a Kafka-protocol broker (librdkafka's mock cluster) in this
    /// process until SIGINT/SIGTERM, and print its bootstrap address.
    Kafka {
        /// Also accept bootstrap connections on 127.0.0.1:PORT.
        #[arg(long)]
        port: Option<u16>,
    },
}

fn parse_kind(kind: &str) -> Result<FunctionKind, String> {
    FunctionKind::parse(kind)
        .ok_or_else(|| format!("unknown kind {kind:?} (filter, rule or strategy)"))
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: failed to start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LAUREL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tokio_postgres=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let settings = cli.settings;
    match cli.command {
        Command::Migrate => {
            let runtime = sandbox(&settings)?;
            prepare(&settings, &runtime).await?;
            Ok(())
        }
        Command::Up { demo } => up(&settings, demo, shutdown_signal()).await,
        Command::Serve { roles } => serve(&settings, &roles, shutdown_signal()).await,
        Command::Functions { command } => functions(&settings, command).await,
        Command::Awards { command } => awards(&settings, command).await,
        Command::Sources { command } => sources(&settings, command).await,
        Command::Webhooks { command } => webhooks(&settings, command).await,
        Command::Proxies { command } => proxies(&settings, command).await,
        Command::DeadLetters { command } => dead_letters(&settings, command).await,
        Command::Users { command } => {
            let mut store = Store::connect(&settings.database_url).await?;
            store.migrate().await?;
            if let UsersCommand::Show { user_id } = &command {
                return show_user(&store, user_id).await;
            }
            let (user, state) = match &command {
                UsersCommand::Show { .. } => unreachable!("handled above"),
                UsersCommand::Ban { user_id } => (user_id, "banned"),
                UsersCommand::Delete { user_id } => (user_id, "deleted"),
                UsersCommand::Restore { user_id } => (user_id, "active"),
            };
            store.set_user_state(user, state).await?;
            println!("user {user} is {state}");
            Ok(())
        }
        Command::Dev {
            command: DevCommand::Kafka { port },
        } => {
            let broker = LocalBroker::start(port).await?;
            println!(
                "Kafka broker (librdkafka mock cluster) at {}",
                broker.bootstrap_servers()
            );
            println!("LAUREL_KAFKA_BROKERS={}", broker.bootstrap_servers());
            shutdown_signal().await;
            drop(broker);
            Ok(())
        }
    }
}

async fn functions(settings: &Settings, command: FunctionsCommand) -> anyhow::Result<()> {
    match command {
        FunctionsCommand::Push {
            name,
            file,
            kind,
            force,
        } => {
            let bytes = std::fs::read(&file)
                .with_context(|| format!("failed to read {}", file.display()))?;
            let runtime = sandbox(settings)?;
            let mut store = Store::connect(&settings.database_url).await?;
            store.migrate().await?;
            let (kind, outcome) =
                definitions::push_function(&mut store, &runtime, &name, &bytes, kind, force)
                    .await?;
            match outcome {
                PushOutcome::Created { version } => println!("pushed {name} v{version} ({kind})"),
                PushOutcome::Unchanged { version } => {
                    println!("{name} v{version} ({kind}) already has these bytes")
                }
            }
        }
        FunctionsCommand::List { all } => {
            let mut store = Store::connect(&settings.database_url).await?;
            store.migrate().await?;
            let rows = if all {
                store.all_function_versions().await?
            } else {
                store.current_functions().await?
            };
            println!(
                "{:<28} {:<9} {:>7} {:>9}  {:<64}  note",
                "NAME", "KIND", "VERSION", "BYTES", "SHA256"
            );
            for row in rows {
                let note = match (&row.quarantine_reason, row.builtin) {
                    (Some(reason), _) => format!("QUARANTINED: {reason}"),
                    (None, true) => "built-in".to_string(),
                    (None, false) => String::new(),
                };
                println!(
                    "{:<28} {:<9} {:>7} {:>9}  {}  {note}",
                    row.name, row.kind, row.version, row.size, row.sha256
                );
            }
        }
    }
    Ok(())
}

async fn awards(settings: &Settings, command: AwardsCommand) -> anyhow::Result<()> {
    match command {
        AwardsCommand::Apply { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("failed to read {}", file.display()))?;
            let runtime = sandbox(settings)?;
            prepare(settings, &runtime).await?;
            let registry = Registry::start(&settings.database_url, runtime).await?;
            let mut store = Store::connect(&settings.database_url).await?;
            let applied = definitions::apply(&mut store, &registry, &text).await?;
            for (id, version) in applied {
                println!("applied {id} v{version}");
            }
        }
        AwardsCommand::List => {
            let mut store = Store::connect(&settings.database_url).await?;
            store.migrate().await?;
            println!(
                "{:<28} {:>7} {:<8} {:<10} title",
                "ID", "VERSION", "ENABLED", "OBJECTIVES"
            );
            for row in store.awards().await? {
                let title = row
                    .definition
                    .get("title")
                    .and_then(|t| t.as_str())
                    .unwrap_or_default();
                let objectives = row
                    .definition
                    .get("objectives")
                    .and_then(|o| o.as_array())
                    .map(|o| {
                        o.iter()
                            .filter_map(|o| o.get("id").and_then(|i| i.as_str()))
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default();
                println!(
                    "{:<28} {:>7} {:<8} {:<10} {title}",
                    row.id, row.version, row.enabled, objectives
                );
            }
            for (award, users, error) in store.strategy_errors().await? {
                println!(
                    "{award}: progress of {users} user(s) not computed (kept as it was): {error}; \
                     fix the function, then `laurel awards recompute {award}`"
                );
            }
            for backfill in store.backfills().await?.iter().filter(|b| !b.finished) {
                println!(
                    "backfill of {} v{} in progress: {} users marked since {}",
                    backfill.award_id,
                    backfill.award_version,
                    backfill.marked,
                    backfill.started_at.to_rfc3339()
                );
            }
        }
        AwardsCommand::Recompute { id } => {
            let mut store = Store::connect(&settings.database_url).await?;
            store.migrate().await?;
            anyhow::ensure!(store.request_backfill(&id).await?, "no award named {id}");
            println!("{id} will be computed again for every user with counters for it");
        }
    }
    Ok(())
}

async fn show_user(store: &Store, user_id: &str) -> anyhow::Result<()> {
    println!(
        "{:<24} {:>10} {:>10} {:<8} {:<10} {:<25} error",
        "AWARD", "PROGRESS", "GOAL", "STARTED", "COMPLETED", "COMPLETED AT"
    );
    for (award, state) in store.user_achievements(user_id).await? {
        println!(
            "{:<24} {:>10} {:>10} {:<8} {:<10} {:<25} {}",
            award,
            state.progress,
            state.goal,
            state.started,
            state.completed,
            state
                .completed_at
                .map(|t| t.to_rfc3339())
                .unwrap_or_default(),
            state.error.unwrap_or_default()
        );
    }
    Ok(())
}

async fn proxies(settings: &Settings, command: ProxiesCommand) -> anyhow::Result<()> {
    use crate::proxy::{self, ProxyPools};
    let pools = ProxyPools::connect(&settings.redis_url).await?;
    let store = || async {
        let mut store = Store::connect(&settings.database_url).await?;
        store.migrate().await?;
        anyhow::Ok(store)
    };
    match command {
        ProxiesCommand::Allocate { pool, count } => {
            for _ in 0..count {
                match pools.allocate(&pool).await? {
                    Some(proxy) => println!("{proxy}"),
                    None => anyhow::bail!("proxy pool {pool} has no eligible proxy"),
                }
            }
        }
        ProxiesCommand::Pool {
            command:
                PoolCommand::Set {
                    name,
                    check_url,
                    policy,
                    timeout_ms,
                    max_latency_ms,
                    schemes,
                    deny,
                    recheck_ms,
                    lease_ttl_ms,
                    max_in_flight,
                    allow_private,
                },
        } => {
            let pool = crate::store::ProxyPoolRow {
                name,
                policy,
                check_url,
                timeout: Duration::from_millis(timeout_ms),
                schemes,
                max_latency: Duration::from_millis(max_latency_ms),
                deny,
                recheck_every: Duration::from_millis(recheck_ms),
                lease_ttl: Duration::from_millis(lease_ttl_ms),
                max_in_flight,
                allow_private,
            };
            proxy::checked_pool(&pool).map_err(anyhow::Error::msg)?;
            store().await?.set_proxy_pool(&pool).await?;
            println!(
                "proxy pool {} ({}, checked via {})",
                pool.name, pool.policy, pool.check_url
            );
        }
        ProxiesCommand::Pool {
            command: PoolCommand::Delete { name },
        } => {
            proxy::check_pool(&name)?;
            let existed = store().await?.delete_proxy_pool(&name).await?;
            pools.delete_pool(&name).await?;
            anyhow::ensure!(existed, "no proxy pool named {name}");
            println!("deleted proxy pool {name}");
        }
        ProxiesCommand::Pools => {
            println!(
                "{:<24} {:<17} {:>8} {:>8} {:>9} CHECK URL",
                "NAME", "POLICY", "TIMEOUT", "CEILING", "RECHECK"
            );
            for p in store().await?.proxy_pools().await? {
                println!(
                    "{:<24} {:<17} {:>6}ms {:>6}ms {:>8}s {}",
                    p.name,
                    p.policy,
                    p.timeout.as_millis(),
                    p.max_latency.as_millis(),
                    p.recheck_every.as_secs(),
                    p.check_url
                );
            }
        }
        ProxiesCommand::Import {
            pool,
            source,
            replace,
        } => {
            let list = if source == "-" {
                std::io::read_to_string(std::io::stdin()).context("failed to read stdin")?
            } else if source.starts_with("http://") || source.starts_with("https://") {
                proxy::candidates::fetch_list(&source)
                    .await
                    .map_err(anyhow::Error::msg)?
            } else {
                std::fs::read_to_string(&source)
                    .with_context(|| format!("failed to read {source}"))?
            };
            let store = store().await?;
            let report = proxy::candidates::import(&store, &pools, &pool, &list, replace).await?;
            print_report(&pool, &report);
        }
        ProxiesCommand::Check { pool } => {
            let store = store().await?;
            let report = proxy::candidates::check_pool_now(&store, &pools, &pool).await?;
            print_report(&pool, &report);
        }
        ProxiesCommand::List { pool } => {
            let store = store().await?;
            let status = proxy::pool_status(&store, &pools, &pool).await?;
            if status.config.is_none() {
                println!("(pool {pool} is not configured: no checks, least-used)");
            }
            println!(
                "{:<32} {:<8} {:>11} {:>9} {:>8} WHY NOT",
                "PROXY", "ELIGIBLE", "ALLOCATIONS", "IN FLIGHT", "LATENCY"
            );
            for m in status.members {
                println!(
                    "{:<32} {:<8} {:>11} {:>9} {:>8} {}",
                    m.proxy,
                    if m.eligible { "yes" } else { "no" },
                    m.allocations,
                    m.in_flight,
                    m.latency_ms.map(|l| format!("{l}ms")).unwrap_or_default(),
                    m.reason.unwrap_or_default()
                );
            }
        }
    }
    Ok(())
}

fn print_report(pool: &str, report: &crate::proxy::ImportReport) {
    for (proxy, latency, start) in &report.admitted {
        println!(
            "eligible {proxy} ({} ms; at {start} allocations)",
            latency.as_millis()
        );
    }
    for (proxy, reason) in &report.refused {
        println!("refused  {proxy}: {reason}");
    }
    for proxy in &report.dropped {
        println!("dropped  {proxy}");
    }
    for junk in &report.junk {
        println!("line {}: {:?}: {}", junk.line, junk.text, junk.reason);
    }
    println!(
        "{pool}: {} eligible, {} refused, {} dropped, {} junk lines",
        report.admitted.len(),
        report.refused.len(),
        report.dropped.len(),
        report.junk.len()
    );
}

async fn webhooks(settings: &Settings, command: WebhooksCommand) -> anyhow::Result<()> {
    let mut store = Store::connect(&settings.database_url).await?;
    store.migrate().await?;
    match command {
        WebhooksCommand::Set {
            name,
            url,
            events,
            proxy_pool,
        } => {
            let webhook = notify::checked_webhook(&name, &url, &events, proxy_pool.as_deref())
                .map_err(anyhow::Error::msg)?;
            store.set_webhook(&webhook).await?;
            println!("webhook {name} -> {url} ({})", events.join(", "));
        }
        WebhooksCommand::List => {
            println!("{:<20} {:<48} events", "NAME", "URL");
            for w in store.webhooks().await? {
                println!("{:<20} {:<48} {}", w.name, w.url, w.events.join(","));
            }
        }
        WebhooksCommand::Delete { name } => {
            anyhow::ensure!(
                store.delete_webhook(&name).await?,
                "no webhook named {name}"
            );
            println!("webhook {name} deleted");
        }
    }
    Ok(())
}

async fn sources(settings: &Settings, command: SourcesCommand) -> anyhow::Result<()> {
    let mut store = Store::connect(&settings.database_url).await?;
    store.migrate().await?;
    match command {
        SourcesCommand::List => {
            println!("{:<20} {:<28} state", "SOURCE", "TOPIC");
            for source in store.sources().await? {
                println!(
                    "{:<20} {:<28} {}",
                    source.name,
                    source.topic,
                    if source.paused { "paused" } else { "running" }
                );
            }
        }
        SourcesCommand::Add { name, topic } => {
            store.add_source(&name, topic.as_deref()).await?;
            println!("source {name} registered");
        }
        SourcesCommand::Pause { name } => {
            anyhow::ensure!(
                store.set_source_paused(&name, true).await?,
                "no source named {name}"
            );
            println!("source {name} paused");
        }
        SourcesCommand::Resume { name } => {
            anyhow::ensure!(
                store.set_source_paused(&name, false).await?,
                "no source named {name}"
            );
            println!("source {name} resumed");
        }
    }
    Ok(())
}

async fn dead_letters(settings: &Settings, command: DeadLettersCommand) -> anyhow::Result<()> {
    let mut store = Store::connect(&settings.database_url).await?;
    store.migrate().await?;
    match command {
        DeadLettersCommand::List { source, limit, all } => {
            println!(
                "{:>8}  {:<20} {:<24} {:<24} {:<16} reason",
                "ID", "DEAD AT", "EVENT", "OBJECTIVE", "STATE"
            );
            for row in store.dead_letters(&source, all, limit, None).await? {
                let objective = match (&row.award_id, &row.objective_id) {
                    (Some(award), Some(objective)) => format!("{award}/{objective}"),
                    _ => "-".to_string(),
                };
                let state = match row.replayed_at {
                    Some(_) => "replayed".to_string(),
                    None if row.attempts > 0 => format!("open ({} tries)", row.attempts),
                    None => "open".to_string(),
                };
                println!(
                    "{:>8}  {:<20} {:<24} {:<24} {:<16} {}",
                    row.id,
                    row.dead_at.format("%Y-%m-%d %H:%M:%S"),
                    row.event_id.as_deref().unwrap_or("?"),
                    objective,
                    state,
                    row.reason
                );
            }
        }
        DeadLettersCommand::Replay {
            source,
            since,
            reason,
        } => {
            let registry = Registry::start(&settings.database_url, sandbox(settings)?).await?;
            let catalog = Catalog::start(&settings.database_url).await?;
            let filter = crate::store::LetterFilter { since, reason };
            let report = crate::ingest::replay(
                &mut store,
                &registry,
                &catalog,
                &source,
                &filter,
                settings.max_event_bytes,
            )
            .await?;
            println!(
                "replayed {} dead letters of {source}; {} still fail{}",
                report.replayed,
                report.still_failing,
                if report.taken > 0 {
                    format!("; {} taken by another replay", report.taken)
                } else {
                    String::new()
                }
            );
            for (id, reason) in &report.failures {
                println!("  {id}: {reason}");
            }
        }
    }
    Ok(())
}

fn sandbox(settings: &Settings) -> anyhow::Result<Runtime> {
    Runtime::new(settings.limits(), settings.cache_dir())
}

/// Migrates the database (creating it if missing) and registers the
/// built-in library.
async fn prepare(settings: &Settings, runtime: &Runtime) -> anyhow::Result<()> {
    let mut store = Store::connect(&settings.database_url).await?;
    for name in store.migrate().await? {
        info!(message = "Applied a migration.", migration = name);
    }
    library::register(&mut store, runtime).await?;
    Ok(())
}

/// `laurel up`: every role in one process, until `shutdown` resolves.
pub async fn up(
    settings: &Settings,
    demo: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut settings = settings.clone();
    if demo {
        demo_secrets(&mut settings);
    }
    let settings = &settings;
    let runtime = sandbox(settings)?;
    prepare(settings, &runtime).await?;
    let registry = Registry::start(&settings.database_url, runtime).await?;
    print_functions(&registry);
    // The local broker lives as long as this function.
    let (brokers, local_broker) = match &settings.kafka_brokers {
        Some(brokers) => (brokers.clone(), None),
        None => {
            let broker = LocalBroker::start(None).await?;
            create_source_topics(&broker, &settings.database_url).await?;
            println!(
                "Kafka broker (in process, librdkafka mock cluster): {}",
                broker.bootstrap_servers()
            );
            println!(
                "  produce with e.g.: kcat -P -b {} -t events.photos -k u-42",
                broker.bootstrap_servers()
            );
            (broker.bootstrap_servers().to_string(), Some(broker))
        }
    };
    if demo {
        demo::run(&registry)?;
        let mut store = Store::connect(&settings.database_url).await?;
        let applied = definitions::apply(&mut store, &registry, demo::AWARDS).await?;
        for (id, version) in applied {
            println!("Demo award {id} v{version} applied.");
        }
        if let Some(broker) = &local_broker {
            create_source_topics(broker, &settings.database_url).await?;
        }
        let brokers = brokers.clone();
        let database_url = settings.database_url.clone();
        tokio::spawn(async move {
            if let Err(error) = demo::publish_and_show(&brokers, &database_url).await {
                warn!(message = "The demo stream failed.", error = %format!("{error:#}"));
            }
        });
    }
    let roles = ["ingest", "awards", "notify", "proxies", "api"].map(String::from);
    run_roles(settings, &brokers, &roles, registry, shutdown).await
}

/// For the demo, an admin token and a JWT secret when none is set, printed
/// with requests to try.
fn demo_secrets(settings: &mut Settings) {
    let base = format!("http://{}", settings.http_addr);
    println!("Demo: try the HTTP API:");
    // A secret the operator set is never printed.
    let admin = match &settings.admin_token {
        Some(_) => "$LAUREL_ADMIN_TOKEN".to_string(),
        None => {
            let made = crate::api::random_secret();
            let shown = made.reveal().to_string();
            settings.admin_token = Some(made);
            shown
        }
    };
    let user = match &settings.jwt_secret {
        Some(_) => "<a token for u-42 signed with LAUREL_JWT_SECRET>".to_string(),
        None => {
            let made = crate::api::random_secret();
            let token = crate::api::mint_user_token(&made, "u-42", Duration::from_secs(24 * 3600));
            settings.jwt_secret = Some(made);
            token
        }
    };
    println!("  curl -H 'Authorization: Bearer {user}' {base}/v1/users/u-42/awards");
    println!("  curl -H 'Authorization: Bearer {admin}' {base}/admin/v1/users/u-42/log");
    println!(
        "  curl -H 'Authorization: Bearer {admin}' {base}/admin/v1/users/u-42/awards/content-maker/explain"
    );
    println!("  curl {base}/metrics");
    if settings.spin_manifest().is_some() {
        println!(
            "  curl {base}/badges/u-42/content-maker    (an HTTP function from spin.toml: an SVG badge)"
        );
    }
}

/// Creates `events.<source>` and its dead-letter topic on the local broker
/// for every registered source, so consumers find them at once.
async fn create_source_topics(broker: &LocalBroker, database_url: &str) -> anyhow::Result<()> {
    let store = Store::connect(database_url).await?;
    for source in store.sources().await? {
        broker.create_topic(&source.topic, 4)?;
        broker.create_topic(&format!("events.{}.dead", source.name), 1)?;
    }
    Ok(())
}

/// `laurel serve --roles ...`.
pub async fn serve(
    settings: &Settings,
    roles: &[String],
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    const KNOWN: &[&str] = &["ingest", "awards", "notify", "proxies", "api", "prefilter"];
    const BUILT: &[&str] = &["ingest", "awards", "notify", "proxies", "api"];
    for role in roles {
        anyhow::ensure!(
            KNOWN.contains(&role.as_str()),
            "unknown role `{role}` (roles: {})",
            KNOWN.join(", ")
        );
        anyhow::ensure!(
            BUILT.contains(&role.as_str()),
            "role `{role}` is not built yet (this build has: {})",
            BUILT.join(", ")
        );
    }
    let brokers = match &settings.kafka_brokers {
        Some(brokers) => brokers.clone(),
        None if roles.iter().any(|r| r == "ingest") => anyhow::bail!(
            "LAUREL_KAFKA_BROKERS (or --kafka-brokers) must name the brokers for `serve --roles ingest`; `laurel up` runs a local one"
        ),
        None => String::new(),
    };
    let runtime = sandbox(settings)?;
    prepare(settings, &runtime).await?;
    let registry = Registry::start(&settings.database_url, runtime).await?;
    run_roles(settings, &brokers, roles, registry, shutdown).await
}

/// A running role: its name and how it ended.
type RoleTask<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = (&'a str, anyhow::Result<()>)> + Send + 'a>>;

async fn run_roles(
    settings: &Settings,
    brokers: &str,
    roles: &[String],
    registry: Arc<Registry>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let roles: BTreeSet<&str> = roles.iter().map(String::as_str).collect();
    let catalog = Catalog::start(&settings.database_url).await?;
    let retention = tokio::spawn(prune_forever(
        settings.database_url.clone(),
        settings.log_retention_days,
    ));
    // Every role stops when `shutdown` resolves, or when another role
    // fails.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    let mut running: FuturesUnordered<RoleTask<'_>> = FuturesUnordered::new();
    if roles.contains("ingest") {
        info!(message = "Ingest starting.", brokers = %brokers);
        let stopped = until_stopped(stopped.clone());
        let (registry, catalog) = (registry.clone(), catalog.clone());
        running.push(Box::pin(async move {
            let result = ingest::run(
                settings.ingest(brokers),
                &settings.database_url,
                registry,
                catalog,
                stopped,
            )
            .await;
            ("ingest", result)
        }));
    }
    if roles.contains("awards") {
        info!(
            message = "Awards worker starting.",
            workers = settings.awards().workers
        );
        let stopped = until_stopped(stopped.clone());
        let (registry, catalog) = (registry.clone(), catalog.clone());
        running.push(Box::pin(async move {
            let result = awards::run(
                settings.awards(),
                &settings.database_url,
                registry,
                catalog,
                stopped,
            )
            .await;
            ("awards", result)
        }));
    }
    if roles.contains("notify") {
        info!(message = "Notifier starting.");
        let stopped = until_stopped(stopped.clone());
        running.push(Box::pin(async move {
            let result = notify::run(settings.notify(), &settings.database_url, stopped).await;
            ("notify", result)
        }));
    }
    if roles.contains("proxies") {
        info!(message = "Proxy re-checker starting.", redis = %crate::secrets::redact_url(&settings.redis_url));
        let stopped = until_stopped(stopped.clone());
        running.push(Box::pin(async move {
            let result =
                crate::proxy::candidates::run(&settings.database_url, &settings.redis_url, stopped)
                    .await;
            ("proxies", result)
        }));
    }
    if roles.contains("api") {
        let listener = tokio::net::TcpListener::bind(settings.http_addr)
            .await
            .with_context(|| {
                format!(
                    "failed to listen on {} (LAUREL_HTTP_ADDR)",
                    settings.http_addr
                )
            })?;
        let addr = listener.local_addr()?;
        println!("HTTP API at http://{addr} (admin API under /admin/v1, OpenAPI at /openapi.json)");
        if settings.admin_token.is_none()
            && settings.admin_tokens.is_none()
            && settings.admin_tokens_file.is_none()
        {
            println!(
                "  the admin API refuses every request: neither LAUREL_ADMIN_TOKEN nor LAUREL_ADMIN_TOKENS is set"
            );
        }
        if settings.jwt_secret.is_none() {
            println!("  the public API refuses every request: LAUREL_JWT_SECRET is not set");
        }
        let state = Arc::new(crate::api::AppState::new(
            settings.api(Some(brokers))?,
            registry.clone(),
            catalog.clone(),
        ));
        if let Some(path) = settings.spin_manifest() {
            let manifest =
                crate::runtime::http::manifest::load(&path, &|name| std::env::var(name).ok())
                    .map_err(anyhow::Error::msg)?;
            let routes: Vec<String> = manifest
                .routes
                .iter()
                .map(|r| format!("{} -> {}", r.pattern, r.component))
                .collect();
            state
                .serve_functions(manifest, settings.http_limits())
                .with_context(|| format!("cannot serve {}", path.display()))?;
            println!("HTTP functions from {}:", path.display());
            for route in routes {
                println!("  {route}");
            }
        }
        let stopped = until_stopped(stopped.clone());
        running.push(Box::pin(async move {
            ("api", crate::api::run(listener, state, stopped).await)
        }));
    }
    tokio::pin!(shutdown);
    let mut result = Ok(());
    tokio::select! {
        _ = &mut shutdown => {}
        Some((role, ended)) = running.next() => {
            result = ended.with_context(|| format!("role {role} stopped"));
            if result.is_ok() {
                warn!(message = "A role ended on its own; stopping the others.", role);
            }
        }
    }
    let _ = stop.send(true);
    // Batches, cycles and requests in hand finish, up to the deadline;
    // past it the process exits anyway: nothing is lost, since what was
    // not committed (a batch, its offsets, a claimed cycle) rolls back and
    // is taken again by the next process.
    let deadline = Duration::from_millis(settings.shutdown_timeout_ms);
    let stopping = async {
        while let Some((role, ended)) = running.next().await {
            if let Err(error) = ended {
                warn!(message = "A role failed while stopping.", role, error = %format!("{error:#}"));
            }
        }
    };
    if tokio::time::timeout(deadline, stopping).await.is_err() {
        warn!(
            message = "Roles still stopping at the shutdown deadline; exiting (what they did not commit is rolled back and done again).",
            deadline_ms = settings.shutdown_timeout_ms
        );
        retention.abort();
        std::process::exit(1);
    }
    retention.abort();
    info!(message = "Shut down.");
    result
}

/// Keeps the processing log and the applied-event ids within their
/// retention, a bounded batch at a time.
async fn prune_forever(database_url: String, log_days: i32) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tick.tick().await;
        let Ok(store) = Store::connect(&database_url).await else {
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

/// Resolves on SIGINT or SIGTERM.
/// SIGINT or SIGTERM. The handlers are installed when this is called (not
/// when the future is first polled), so a signal during start-up is a
/// clean stop too, not the default action (killed by the signal).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
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
