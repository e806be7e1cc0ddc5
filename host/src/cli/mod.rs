//! The `laurel` command line: its arguments (here), the commands that
//! print tables (`commands`), and the role supervisor behind `laurel up`
//! and `laurel serve` (`roles`).

mod commands;
mod progress;
mod roles;
pub mod settings;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::cli::settings::{Connections, Sandbox, Serving};
use crate::kafka::LocalBroker;
use crate::runtime::FunctionKind;

pub use roles::{Role, ingest_and_backfill, shutdown_signal};

#[derive(Debug, Parser)]
#[command(
    name = "laurel",
    version,
    about = "An achievements engine whose award logic ships as sandboxed WebAssembly"
)]
pub struct Cli {
    #[command(flatten)]
    connections: Connections,
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
        #[command(flatten)]
        serving: Box<Serving>,
    },
    /// Run some roles only (several processes may run the same roles).
    Serve {
        /// The roles to run, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        roles: Vec<Role>,
        #[command(flatten)]
        serving: Box<Serving>,
    },
    /// Apply migrations/ (creating the database if missing) and register the
    /// built-in function library, then exit.
    Migrate {
        #[command(flatten)]
        sandbox: Sandbox,
    },
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
    /// The pre-filter's pipelines: raw analytics topics, transformed into
    /// events some award can use.
    Pipelines {
        #[command(subcommand)]
        command: PipelinesCommand,
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
        /// The function's name, as award definitions reference it (an HTTP
        /// function: the id of the spin.toml component it serves).
        name: String,
        /// The component: a `.wasm` file built for wasm32-wasip2.
        file: PathBuf,
        /// The kind the component must be (filter, rule, strategy, transform
        /// or http): refused if it is another.
        #[arg(long, value_parser = parse_kind)]
        kind: Option<FunctionKind>,
        /// Push even if an award's config is refused by the new version.
        #[arg(long)]
        force: bool,
        /// Register it as a candidate that serves nothing until
        /// `laurel functions promote NAME VERSION`.
        #[arg(long, conflicts_with = "force")]
        shadow: bool,
        #[command(flatten)]
        limits: AskedLimits,
        #[command(flatten)]
        sandbox: Sandbox,
    },
    /// Make VERSION of NAME the one that serves (a shadow candidate, or an
    /// older version); every award that uses NAME is checked with it first.
    Promote {
        name: String,
        version: i32,
        /// Promote even if an award's config is refused by that version.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        sandbox: Sandbox,
    },
    /// Make the version that served before the last push, promote or
    /// rollback of NAME serve again, without a new version or a restart.
    Rollback {
        name: String,
        /// Roll back even if an award's config is refused by that version.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        sandbox: Sandbox,
    },
    /// What a candidate version of NAME would change before it serves: the
    /// recent events of every award that uses NAME (from Kafka) and the
    /// stored content items' last events through the live and the
    /// candidate version; per award, the users whose counters or progress
    /// would change, who would complete or lose a completion.
    Diff {
        name: String,
        /// The candidate [default: the newest version above the live one].
        #[arg(long)]
        version: Option<i32>,
        /// Messages read back per partition of each source.
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
        events: i64,
        /// Stored content items compared (each item's last applied event;
        /// whole users, in key order); 0 compares Kafka's window only.
        #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(i64).range(0..=10_000_000))]
        items: i64,
        /// Print the diff as JSON.
        #[arg(long)]
        json: bool,
        /// Kafka bootstrap servers.
        #[arg(long, env = "LAUREL_KAFKA_BROKERS", value_name = "HOST:PORT,...")]
        kafka_brokers: String,
        #[command(flatten)]
        sandbox: Sandbox,
    },
    /// Write a version of NAME's component to a file, as it was pushed.
    Get {
        name: String,
        /// The version [default: the live one].
        #[arg(long)]
        version: Option<i32>,
        /// Where to write it [default: NAME-vVERSION.wasm].
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Start a function in a project of its own (Rust, Python or
    /// JavaScript), outside any Laurel checkout: the SDK, an example of the
    /// kind, a fixture case that passes against it, and a README that says
    /// how to build, test and push it.
    New {
        /// The function's name, as awards will reference it (e.g. GoodRating).
        name: String,
        /// filter, rule, strategy or transform.
        #[arg(long, value_parser = parse_kind)]
        kind: FunctionKind,
        /// The project's language: rust, python (componentize-py) or js
        /// (jco).
        #[arg(long, value_name = "LANG", default_value = "rust")]
        lang: crate::scaffold::Lang,
        /// The project's folder [default: the name in kebab case, e.g.
        /// good-rating].
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Where the crate gets the guest SDK: bundled (the copy this
        /// binary carries, written to vendor/laurel-guest: no registry
        /// needed), a version (from the registry), git:URL[#REV] or
        /// path:DIR.
        #[arg(long, value_name = "SOURCE", default_value = "bundled")]
        sdk: crate::scaffold::Sdk,
    },
    /// Run FILE against fixtures under the production limits, with no
    /// database, broker or network: prints each case and exits non-zero if
    /// one fails.
    Test {
        /// The component: a `.wasm` file built for wasm32-wasip2.
        file: PathBuf,
        /// The config for cases that have no config.json of their own
        /// (JSON text, or @FILE).
        #[arg(long, value_name = "JSON")]
        config: Option<String>,
        /// One case, or a folder of cases (the format: `laurel::fixtures`
        /// in ARCHITECTURE.md).
        #[arg(long, value_name = "DIR", default_value = "fixtures")]
        fixtures: PathBuf,
        #[command(flatten)]
        limits: AskedLimits,
        #[command(flatten)]
        sandbox: Sandbox,
    },
    /// List functions: name, kind, live version, sha256.
    List {
        /// Every version (live, older and shadow candidates), not only the live one.
        #[arg(long)]
        all: bool,
    },
}

/// The limits one function version runs under, in place of the server's
/// defaults (`--function-cpu-ms`, `--function-memory-mib`), up to its
/// ceilings (`--function-max-cpu-ms`, `--function-max-memory-mib`).
#[derive(Debug, Clone, Copy, clap::Args)]
#[command(next_help_heading = "This function's limits")]
struct AskedLimits {
    /// CPU time one call (one batch of events) may take, in milliseconds.
    #[arg(long = "cpu-ms", value_name = "MS", value_parser = clap::value_parser!(u32).range(1..=i32::MAX as i64))]
    cpu_ms: Option<u32>,
    /// Memory one instance may grow to, in MiB.
    #[arg(long = "memory-mib", value_name = "MIB", value_parser = clap::value_parser!(u32).range(1..=i32::MAX as i64))]
    memory_mib: Option<u32>,
}

impl From<AskedLimits> for crate::runtime::FunctionLimits {
    fn from(asked: AskedLimits) -> Self {
        crate::runtime::FunctionLimits {
            cpu_ms: asked.cpu_ms,
            memory_mib: asked.memory_mib,
        }
    }
}

#[derive(Debug, Subcommand)]
enum AwardsCommand {
    /// Create or replace the award definitions in FILE (one object or an
    /// array), all or nothing.
    Apply {
        /// A JSON file: one award definition or an array of them.
        file: PathBuf,
        /// Check and compare only, writing nothing: per award, what would
        /// change against the award as it is now, on the recent events of
        /// its sources (with LAUREL_KAFKA_BROKERS; without, only checked).
        #[arg(long)]
        dry_run: bool,
        /// Messages read back per partition of each source (--dry-run).
        #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
        events: i64,
        /// Stored content items compared (--dry-run; each item's last
        /// applied event, whole users, in key order); 0: none.
        #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(i64).range(0..=10_000_000))]
        items: i64,
        /// Print the dry run as JSON.
        #[arg(long, requires = "dry_run")]
        json: bool,
        /// Kafka bootstrap servers (--dry-run).
        #[arg(long, env = "LAUREL_KAFKA_BROKERS", value_name = "HOST:PORT,...")]
        kafka_brokers: Option<String>,
        #[command(flatten)]
        sandbox: Sandbox,
    },
    /// List award definitions (and backfills in progress).
    List,
    /// Compute an award again for every user with counters for it (e.g.
    /// after its strategy function was fixed).
    Recompute {
        /// The award.
        id: String,
    },
    /// Credit the past: evaluate the award's objectives over the content
    /// items Laurel already stores (each item's last applied event), once
    /// per objective and item, in bounded steps that live traffic passes.
    /// Starts over if one was under way; a second run changes nothing.
    /// Works on it here, with a progress bar, until it ends (a running
    /// `laurel up`/`serve` with ingest shares the work).
    Backfill {
        /// The award.
        id: String,
        /// Start it and return: a process running ingest does the work
        /// (`laurel awards list` shows how far it is).
        #[arg(long)]
        detach: bool,
        #[command(flatten)]
        sandbox: Sandbox,
        /// Content items per step (one short transaction per source).
        #[arg(long, env = "LAUREL_BACKFILL_BATCH", default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
        batch: i64,
        /// Stored events larger than this are not evaluated (ingest's limit).
        #[arg(long, env = "LAUREL_MAX_EVENT_BYTES", default_value_t = crate::event::MAX_EVENT_BYTES)]
        max_event_bytes: usize,
        /// Kafka bootstrap servers: the retained analytics events of the
        /// award's sources are read there (without, they are not, and the
        /// output says so).
        #[arg(long, env = "LAUREL_KAFKA_BROKERS", value_name = "HOST:PORT,...")]
        kafka_brokers: Option<String>,
        /// How long ids of counted analytics events are kept (as `laurel
        /// up`): older retained messages are not read again.
        #[arg(
            long,
            env = "LAUREL_LOG_RETENTION_DAYS",
            default_value_t = 30,
            value_name = "DAYS"
        )]
        log_retention_days: i32,
    },
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
        /// The pool to fill.
        pool: String,
        /// A file, `-` for stdin, or an http(s) URL.
        source: String,
        /// Drop the pool's candidates that are not in this list.
        #[arg(long)]
        replace: bool,
    },
    /// Check every candidate of POOL now: failing members leave the
    /// eligible set, recovered ones come back.
    Check {
        /// The pool.
        pool: String,
    },
    /// A pool's proxies: eligible or why not, allocations, leases.
    List {
        /// The pool.
        pool: String,
    },
    /// Allocate the least-used eligible proxy of POOL (counted), COUNT
    /// times; prints each, or says the pool has none.
    Allocate {
        /// The pool.
        pool: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
}

#[derive(Debug, Subcommand)]
enum PoolCommand {
    /// Create or change a pool (its candidates stay).
    Set {
        /// The pool.
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
    Delete {
        /// The pool.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
enum WebhooksCommand {
    /// Create or replace a webhook.
    Set {
        /// The webhook's name.
        name: String,
        /// Where deliveries are POSTed (http or https).
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
    Delete {
        /// The webhook.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
enum SourcesCommand {
    /// List sources: topic and state.
    List,
    /// Register a source (topic `events.NAME` unless given).
    Add {
        /// The source's name (events carry it in `source`).
        name: String,
        #[arg(long)]
        topic: Option<String>,
    },
    /// Stop consuming a source (every process, within a second).
    Pause {
        /// The source.
        name: String,
    },
    /// Consume a paused source again.
    Resume {
        /// The source.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
enum PipelinesCommand {
    /// Create or replace the pipelines in FILE (one object or an array),
    /// all or nothing.
    Apply {
        /// A JSON file: `{"name", "input_topic", "source", "transform":
        /// {"name", "config"}}` or an array of them.
        file: PathBuf,
        #[command(flatten)]
        sandbox: Sandbox,
    },
    /// List pipelines: input topic, source, transform, state.
    List,
    /// Delete a pipeline (its consumer stops within a second).
    Delete {
        /// The pipeline.
        name: String,
    },
    /// Stop a pipeline (every process, within a second).
    Pause {
        /// The pipeline.
        name: String,
    },
    /// Run a paused pipeline again.
    Resume {
        /// The pipeline.
        name: String,
    },
    /// Put the pipeline's dead letters (on `<input_topic>.dead`) back on
    /// its input topic, once its transform or the data is fixed: each at
    /// its first position, so its events get the ids they would have had
    /// (a record replayed twice counts once). Each replay takes what the
    /// last one left.
    Replay {
        /// The pipeline.
        name: String,
        /// Kafka bootstrap servers.
        #[arg(long, env = "LAUREL_KAFKA_BROKERS", value_name = "HOST:PORT,...")]
        kafka_brokers: String,
    },
}

#[derive(Debug, Subcommand)]
enum DeadLettersCommand {
    /// A source's dead letters, newest first: what, for which objective
    /// (`-`: the whole event), why.
    List {
        /// The source.
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
        /// The source.
        source: String,
        /// Only those dead-lettered at or after this time (RFC 3339).
        #[arg(long)]
        since: Option<chrono::DateTime<chrono::Utc>>,
        /// Only those whose reason contains this text.
        #[arg(long)]
        reason: Option<String>,
        /// Larger messages are refused again, in bytes (as ingest does).
        #[arg(long, env = "LAUREL_MAX_EVENT_BYTES", default_value_t = crate::event::MAX_EVENT_BYTES)]
        max_event_bytes: usize,
        #[command(flatten)]
        sandbox: Sandbox,
    },
}

#[derive(Debug, Subcommand)]
enum UsersCommand {
    /// A user's award progress, as the awards worker last computed it.
    Show {
        /// The user.
        user_id: String,
    },
    /// A banned user's events are skipped (logged).
    Ban {
        /// The user.
        user_id: String,
    },
    /// A deleted user's events are skipped (logged).
    Delete {
        /// The user.
        user_id: String,
    },
    /// The user gets progress again (from new events on).
    Restore {
        /// The user.
        user_id: String,
    },
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
        .ok_or_else(|| format!("unknown kind {kind:?} (filter, rule, strategy, transform or http)"))
}

pub fn main() -> ExitCode {
    crate::without_huge_pages();
    let cli = Cli::parse();
    let otlp_endpoint = match &cli.command {
        Command::Up { serving, .. } | Command::Serve { serving, .. } => {
            serving.process.otlp_endpoint.clone()
        }
        _ => None,
    };
    let telemetry = match crate::telemetry::init(otlp_endpoint.as_deref()) {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("error: {error:#}");
            return ExitCode::FAILURE;
        }
    };
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
    // `laurel up`'s in-process broker outlives the runtime, so its clients,
    // tasks included, are gone before it.
    let mut local_broker = None;
    let ended = runtime.block_on(run(cli, &mut local_broker));
    drop(runtime);
    drop(local_broker);
    telemetry.shutdown();
    match ended {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli, local_broker: &mut Option<LocalBroker>) -> anyhow::Result<()> {
    let connections = &cli.connections;
    match cli.command {
        Command::Migrate { sandbox } => {
            roles::prepare(connections, &sandbox.runtime()?).await?;
            Ok(())
        }
        Command::Up { demo, serving } => {
            roles::up(connections, *serving, demo, local_broker, shutdown_signal()).await
        }
        Command::Serve { roles, serving } => {
            roles::serve(connections, *serving, &roles, shutdown_signal()).await
        }
        Command::Functions { command } => commands::functions(connections, command).await,
        Command::Awards { command } => commands::awards(connections, command).await,
        Command::Sources { command } => commands::sources(connections, command).await,
        Command::Pipelines { command } => commands::pipelines(connections, command).await,
        Command::Webhooks { command } => commands::webhooks(connections, command).await,
        Command::Proxies { command } => commands::proxies(connections, command).await,
        Command::DeadLetters { command } => commands::dead_letters(connections, command).await,
        Command::Users { command } => commands::users(connections, command).await,
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::{CommandFactory, Parser};

    use super::Cli;

    /// The settings table of docs/settings.md: flag -> (variable, default
    /// column).
    fn documented_settings() -> BTreeMap<String, (String, String)> {
        include_str!("../../../docs/settings.md")
            .lines()
            .filter(|line| line.starts_with("| `--"))
            .map(|line| {
                let cells: Vec<&str> = line.split(" | ").collect();
                let (flag, variable) = cells[0]
                    .trim_start_matches("| ")
                    .split_once(" / ")
                    .expect("a row names a flag and a variable");
                let unquote = |s: &str| s.trim().trim_matches('`').to_string();
                (unquote(flag), (unquote(variable), unquote(cells[1])))
            })
            .collect()
    }

    /// What `laurel SUBCOMMAND` reads: flag -> (variable, default).
    fn settings_of(subcommand: &str) -> BTreeMap<String, (String, Option<String>)> {
        let root = Cli::command();
        let sub = root.find_subcommand(subcommand).expect("a subcommand");
        root.get_arguments()
            .chain(sub.get_arguments())
            .filter_map(|arg| {
                let env = arg.get_env()?.to_string_lossy().into_owned();
                let default = arg
                    .get_default_values()
                    .first()
                    .map(|v| v.to_string_lossy().into_owned());
                Some((format!("--{}", arg.get_long()?), (env, default)))
            })
            .collect()
    }

    #[test]
    fn the_settings_page_names_every_setting_of_laurel_up_with_its_default() {
        let readme = documented_settings();
        let up = settings_of("up");
        let up_flags: Vec<&String> = up.keys().collect();
        let readme_flags: Vec<&String> = readme.keys().collect();
        assert_eq!(
            up_flags, readme_flags,
            "docs/settings.md flags vs `laurel up`'s"
        );
        for (flag, (env, default)) in &up {
            let (readme_env, readme_default) = &readme[flag];
            assert_eq!(env, readme_env, "{flag}'s variable");
            if let Some(default) = default {
                assert_eq!(default, readme_default, "{flag}'s default");
            }
        }
        assert_eq!(settings_of("serve"), up, "`serve` reads what `up` reads");
    }

    #[test]
    fn roles_are_checked_when_the_command_line_is_read() {
        let unknown = Cli::try_parse_from(["laurel", "serve", "--roles", "ingest,bogus"])
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("invalid value 'bogus'"), "{unknown}");
        assert!(
            unknown.contains("ingest, awards, notify, proxies, api, prefilter"),
            "{unknown}"
        );
        assert!(Cli::try_parse_from(["laurel", "serve", "--roles", "prefilter"]).is_ok());
        assert!(super::Role::BUILT.contains(&super::Role::Prefilter));
    }

    #[test]
    fn a_setting_out_of_its_range_is_refused_naming_the_flag() {
        let zero = Cli::try_parse_from(["laurel", "up", "--batch-size", "0"])
            .unwrap_err()
            .to_string();
        assert!(zero.contains("--batch-size"), "{zero}");
        assert!(zero.contains("must be at least 1"), "{zero}");
        let word = Cli::try_parse_from([
            "laurel",
            "serve",
            "--roles",
            "api",
            "--batch-wait-ms",
            "soon",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            word.contains("\"soon\" is not a whole number of milliseconds"),
            "{word}"
        );
    }

    #[test]
    fn a_table_command_reads_no_serving_setting() {
        let flags: Vec<String> = settings_of("sources").into_keys().collect();
        assert_eq!(flags, ["--database-url", "--redis-url"]);
    }
}
