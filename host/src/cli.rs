//! The `laurel` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing::info;

use crate::registry::{self, Registry};
use crate::runtime::{FunctionKind, Runtime};
use crate::settings::Settings;
use crate::store::{PushOutcome, Store};
use crate::{demo, library};

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
    /// Migrate, register the built-in library, load every function and keep
    /// them current until SIGINT/SIGTERM.
    Up {
        /// Also run the demo: the background write-up's examples through the
        /// loaded functions.
        #[arg(long)]
        demo: bool,
    },
    /// Apply migrations/ (creating the database if missing) and register the
    /// built-in function library, then exit.
    Migrate,
    /// Manage Wasm functions.
    Functions {
        #[command(subcommand)]
        command: FunctionsCommand,
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
    },
    /// List functions: name, kind, current version, sha256.
    List {
        /// Every version, not only the current one.
        #[arg(long)]
        all: bool,
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
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
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
        Command::Functions {
            command: FunctionsCommand::Push { name, file, kind },
        } => {
            let bytes = std::fs::read(&file)
                .with_context(|| format!("failed to read {}", file.display()))?;
            let runtime = sandbox(&settings)?;
            let mut store = Store::connect(&settings.database_url).await?;
            store.migrate().await?;
            let (kind, outcome) = registry::push(&mut store, &runtime, &name, &bytes, kind).await?;
            match outcome {
                PushOutcome::Created { version } => println!("pushed {name} v{version} ({kind})"),
                PushOutcome::Unchanged { version } => {
                    println!("{name} v{version} ({kind}) already has these bytes")
                }
            }
            Ok(())
        }
        Command::Functions {
            command: FunctionsCommand::List { all },
        } => {
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
            Ok(())
        }
    }
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

/// `laurel up`: the roles that exist so far (the function registry with hot
/// reload), until `shutdown` resolves.
pub async fn up(
    settings: &Settings,
    demo: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let runtime = sandbox(settings)?;
    prepare(settings, &runtime).await?;
    let registry = Registry::start(&settings.database_url, runtime).await?;
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
    if demo {
        demo::run(&registry)?;
    }
    println!(
        "Watching for new function versions (laurel functions push NAME FILE.wasm); Ctrl-C to stop."
    );
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = registry.changed() => {
                for function in registry.functions() {
                    info!(message = "Function in service.", function = %function.name, version = function.version);
                }
            }
        }
    }
    info!(message = "Shutting down.");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
