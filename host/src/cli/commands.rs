//! The commands that manage Laurel's state and print it as tables.

use std::time::Duration;

use anyhow::Context;

use super::progress::Progress;
use super::{
    AwardsCommand, DeadLettersCommand, FunctionsCommand, PipelinesCommand, PoolCommand,
    ProxiesCommand, SourcesCommand, UsersCommand, WebhooksCommand,
};
use crate::catalog::Catalog;
use crate::cli::settings::Connections;
use crate::definitions;
use crate::registry::Registry;
use crate::store::{PushOutcome, Store};

/// The database, migrated.
async fn store(connections: &Connections) -> anyhow::Result<Store> {
    let mut store = Store::connect(&connections.database_url).await?;
    store.migrate().await?;
    Ok(store)
}

/// A diff as a table, each award's users and examples under it.
fn print_diff(diff: &crate::shadow::Diff) {
    println!(
        "{} v{} (live) -> v{} (candidate): {} recent events and {} stored items read",
        diff.function, diff.live_version, diff.candidate_version, diff.events, diff.items
    );
    if let Some(note) = &diff.note {
        println!("  not read: {note}");
    }
    if diff.awards.is_empty() {
        println!("no enabled award uses {}", diff.function);
        return;
    }
    print_award_diffs(&diff.awards);
}

/// Per award: what would change, the users named, examples.
fn print_award_diffs(awards: &[crate::shadow::AwardDiff]) {
    println!(
        "{:<28} {:>7} {:>6} {:>9} {:>9} {:>9} {:>6}",
        "AWARD", "EVENTS", "USERS", "COUNTERS", "PROGRESS", "COMPLETE", "LOSE"
    );
    for award in awards {
        println!(
            "{:<28} {:>7} {:>6} {:>9} {:>9} {:>9} {:>6}",
            award.award_id,
            award.events_changed,
            award.users_seen,
            award.counters_changed.len(),
            award.progress_changed.len(),
            award.would_complete.len(),
            award.would_lose_completion.len()
        );
        let names = |users: &[String]| {
            let mut shown: Vec<&str> = users.iter().take(20).map(String::as_str).collect();
            if users.len() > 20 {
                shown.push("...");
            }
            shown.join(", ")
        };
        for (what, users) in [
            ("progress changes", &award.progress_changed),
            ("would complete", &award.would_complete),
            ("would lose a completion", &award.would_lose_completion),
        ] {
            if !users.is_empty() {
                println!("  {what}: {}", names(users));
            }
        }
        for example in &award.examples {
            println!(
                "  {} ({}, objective {}): {} -> {}",
                example.event_id,
                example.user_id,
                example.objective_id,
                example.live,
                example.candidate
            );
        }
    }
}

/// `NAME now serves vTO (it was vFROM)`.
fn live_change(name: &str, change: crate::store::LiveChange) -> String {
    match change.from {
        Some(from) if from == change.to => format!("{name} v{from} already serves"),
        Some(from) => format!("{name} v{} serves now (it was v{from})", change.to),
        None => format!("{name} v{} serves now", change.to),
    }
}

/// `laurel functions test`: the fixtures' cases as a table, then an error
/// if one failed.
fn test_function(
    file: &std::path::Path,
    config: Option<&str>,
    fixtures: &std::path::Path,
    limits: crate::runtime::FunctionLimits,
    sandbox: &crate::cli::settings::Sandbox,
) -> anyhow::Result<()> {
    let config = match config {
        Some(at) if at.starts_with('@') => Some(
            std::fs::read_to_string(&at[1..])
                .with_context(|| format!("failed to read the config file {}", &at[1..]))?,
        ),
        other => other.map(str::to_string),
    };
    let bytes =
        std::fs::read(file).with_context(|| format!("failed to read {}", file.display()))?;
    let name = file
        .file_stem()
        .map_or("function".into(), |s| s.to_string_lossy().into_owned());
    let runtime = sandbox.runtime()?;
    let function = runtime
        .load_with(&name, 1, &bytes, None, limits)
        .with_context(|| format!("{} cannot be loaded", file.display()))?;
    let results = crate::fixtures::run_all(&function, config.as_deref(), fixtures)
        .map_err(anyhow::Error::msg)?;
    println!("{:<48} {:>6}  RESULT", "CASE", "ITEMS");
    for result in &results {
        let verdict = if result.passed() { "ok" } else { "FAILED" };
        println!(
            "{:<48} {:>6}  {verdict}",
            result.case.display(),
            result.items
        );
        for failure in &result.failures {
            println!("    {failure}");
        }
    }
    let failed = results.iter().filter(|r| !r.passed()).count();
    println!(
        "{name} ({}): {} cases, {} passed, {failed} failed",
        function.kind.as_str(),
        results.len(),
        results.len() - failed
    );
    if failed > 0 {
        anyhow::bail!("{failed} of {} cases failed", results.len());
    }
    Ok(())
}

pub(super) async fn functions(
    connections: &Connections,
    command: FunctionsCommand,
) -> anyhow::Result<()> {
    match command {
        FunctionsCommand::Push {
            name,
            file,
            kind,
            force,
            shadow,
            limits,
            sandbox,
        } => {
            let bytes = std::fs::read(&file)
                .with_context(|| format!("failed to read {}", file.display()))?;
            let runtime = sandbox.runtime()?;
            let mut store = store(connections).await?;
            let pushed = definitions::Pushed {
                bytes: &bytes,
                expected: kind,
                limits: limits.into(),
            };
            let asked = pushed.limits;
            let limits = if asked.is_default() {
                String::new()
            } else {
                format!(" with limits {asked}")
            };
            let (kind, outcome) = if shadow {
                definitions::push_shadow(&mut store, &runtime, &name, pushed).await?
            } else {
                definitions::push_function(&mut store, &runtime, &name, pushed, force).await?
            };
            match (outcome, shadow) {
                (PushOutcome::Created { version }, false) => {
                    println!("pushed {name} v{version} ({kind}){limits}");
                    if kind == crate::runtime::FunctionKind::Http {
                        println!(
                            "  it serves spin.toml's component `{name}` in every process that serves that manifest, from their next request"
                        );
                    }
                }
                (PushOutcome::Created { version }, true) => println!(
                    "pushed {name} v{version} ({kind}){limits} as a shadow candidate: it serves nothing until `laurel functions promote {name} {version}`"
                ),
                (PushOutcome::Unchanged { version }, _) => {
                    println!("{name} v{version} ({kind}) already has these bytes and limits")
                }
            }
        }
        FunctionsCommand::Promote {
            name,
            version,
            force,
            sandbox,
        } => {
            let runtime = sandbox.runtime()?;
            let mut store = store(connections).await?;
            let change = definitions::promote(&mut store, &runtime, &name, version, force).await?;
            println!("{}", live_change(&name, change));
        }
        FunctionsCommand::Rollback {
            name,
            force,
            sandbox,
        } => {
            let runtime = sandbox.runtime()?;
            let mut store = store(connections).await?;
            let change = definitions::rollback(&mut store, &runtime, &name, force).await?;
            println!("{}", live_change(&name, change));
        }
        FunctionsCommand::Diff {
            name,
            version,
            events,
            items,
            json,
            kafka_brokers,
            sandbox,
        } => {
            let store = store(connections).await?;
            let registry = Registry::start(&connections.database_url, sandbox.runtime()?).await?;
            let reach = crate::shadow::Reach { events, items };
            let progress = Progress::new("steps");
            let watch = |step: crate::watch::Step<'_>| progress.follow(step);
            let diff = crate::shadow::diff(
                &store,
                &registry,
                &kafka_brokers,
                &name,
                version,
                reach,
                &watch,
            )
            .await?;
            progress.finish();
            if json {
                println!("{}", serde_json::to_string_pretty(&diff)?);
            } else {
                print_diff(&diff);
            }
        }
        FunctionsCommand::Get {
            name,
            version,
            output,
        } => {
            let store = store(connections).await?;
            let version = match version {
                Some(version) => version,
                None => {
                    store
                        .live_function(&name)
                        .await?
                        .with_context(|| format!("no function named {name} is registered"))?
                        .0
                }
            };
            let found = store
                .function_version(&name, version)
                .await?
                .with_context(|| format!("{name} has no version {version}"))?;
            let output = output.unwrap_or_else(|| format!("{name}-v{version}.wasm").into());
            std::fs::write(&output, &found.bytes)
                .with_context(|| format!("failed to write {}", output.display()))?;
            println!(
                "wrote {name} v{version} ({}, {} bytes, sha256 {}) to {}",
                found.kind,
                found.bytes.len(),
                found.sha256,
                output.display()
            );
        }
        FunctionsCommand::New {
            name,
            kind,
            lang,
            dir,
            sdk,
        } => {
            let dir = dir.unwrap_or_else(|| crate::scaffold::crate_name(&name).into());
            let made = crate::scaffold::create(&name, kind, lang, &dir, &sdk)
                .map_err(anyhow::Error::msg)?;
            println!("created {} ({} {name}):", made.dir.display(), kind.as_str());
            for file in &made.files {
                println!("  {}", file.display());
            }
            println!("next, in {}:", made.dir.display());
            for command in &made.build {
                println!("  {command}");
            }
            println!("  laurel functions test {}", made.component.display());
            println!(
                "  laurel functions push {name} {}",
                made.component.display()
            );
        }
        FunctionsCommand::Test {
            file,
            config,
            fixtures,
            limits,
            sandbox,
        } => test_function(&file, config.as_deref(), &fixtures, limits.into(), &sandbox)?,
        FunctionsCommand::List { all } => {
            let store = store(connections).await?;
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
                let mut notes = Vec::new();
                if all && row.live {
                    notes.push("live".to_string());
                }
                if row.builtin {
                    notes.push("built-in".to_string());
                }
                if !row.limits.is_default() {
                    notes.push(format!("limits: {}", row.limits));
                }
                if let Some(reason) = &row.quarantine_reason {
                    notes.push(format!("QUARANTINED: {reason}"));
                }
                let note = notes.join(", ");
                println!(
                    "{:<28} {:<9} {:>7} {:>9}  {}  {note}",
                    row.name, row.kind, row.version, row.size, row.sha256
                );
            }
        }
    }
    Ok(())
}

/// What applying a definition file needs: its text, a registry to check
/// it against (the database migrated, the built-ins registered) and a
/// store.
async fn definition_file(
    connections: &Connections,
    file: &std::path::Path,
    sandbox: &crate::cli::settings::Sandbox,
) -> anyhow::Result<(String, std::sync::Arc<Registry>, Store)> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("failed to read {}", file.display()))?;
    let runtime = sandbox.runtime()?;
    super::roles::prepare(connections, &runtime).await?;
    let registry = Registry::start(&connections.database_url, runtime).await?;
    let store = Store::connect(&connections.database_url).await?;
    Ok((text, registry, store))
}

pub(super) async fn awards(
    connections: &Connections,
    command: AwardsCommand,
) -> anyhow::Result<()> {
    match command {
        AwardsCommand::Apply {
            file,
            dry_run: false,
            sandbox,
            ..
        } => {
            let (text, registry, mut store) = definition_file(connections, &file, &sandbox).await?;
            let applied = definitions::apply(&mut store, &registry, &text).await?;
            for (id, version) in applied {
                println!("applied {id} v{version}");
                if let Some(backfill) = store.history_backfill(&id).await?
                    && backfill.award_version == version
                    && backfill.finished_at.is_none()
                {
                    println!(
                        "  backfill from history started over {} stored item(s); `laurel awards list` shows how far it is",
                        backfill.total
                    );
                }
            }
        }
        AwardsCommand::Apply {
            file,
            dry_run: true,
            events,
            items,
            json,
            kafka_brokers,
            sandbox,
        } => {
            let (text, registry, store) = definition_file(connections, &file, &sandbox).await?;
            let (checked, _) = definitions::check(&store, &registry, &text).await?;
            let ids: Vec<&str> = checked.iter().map(|d| d.id.as_str()).collect();
            let Some(brokers) = kafka_brokers else {
                println!(
                    "checked {} (nothing written); no Kafka brokers (LAUREL_KAFKA_BROKERS), so nothing compared",
                    ids.join(", ")
                );
                return Ok(());
            };
            let reach = crate::shadow::Reach { events, items };
            let progress = Progress::new("steps");
            let watch = |step: crate::watch::Step<'_>| progress.follow(step);
            let dry = crate::shadow::dry_run(&store, &registry, &brokers, &checked, reach, &watch)
                .await?;
            progress.finish();
            if json {
                println!("{}", serde_json::to_string_pretty(&dry)?);
            } else {
                println!(
                    "checked {} (nothing written): {} recent events and {} stored items read",
                    ids.join(", "),
                    dry.events,
                    dry.items
                );
                if let Some(note) = &dry.note {
                    println!("  not read: {note}");
                }
                print_award_diffs(&dry.awards);
            }
        }
        AwardsCommand::List => {
            let store = store(connections).await?;
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
            for backfill in store.history_backfills().await? {
                if backfill.finished_at.is_none() {
                    println!(
                        "backfill of {} v{} from history: {:.1}% ({} of {} items, {} changed, {} unrecoverable, {} failed) since {}",
                        backfill.award_id,
                        backfill.award_version,
                        backfill.percent(),
                        backfill.done,
                        backfill.total,
                        backfill.changed,
                        backfill.unrecoverable,
                        backfill.failed,
                        backfill.started_at.to_rfc3339()
                    );
                } else {
                    print!("{}: ", backfill.award_id);
                    print_history_backfill(&backfill);
                }
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
        AwardsCommand::Backfill {
            id,
            detach,
            sandbox,
            batch,
            max_event_bytes,
            kafka_brokers,
            log_retention_days,
        } => {
            let runtime = sandbox.runtime()?;
            super::roles::prepare(connections, &runtime).await?;
            let registry = Registry::start(&connections.database_url, runtime).await?;
            let store = Store::connect(&connections.database_url).await?;
            let started = crate::definitions::request_backfill(&store, &registry, &id).await?;
            println!(
                "backfill of {id} v{} from history: {} stored item(s) of {}",
                started.award_version,
                started.total,
                if started.sources.is_empty() {
                    "no source (no objective matches a registered source)".to_string()
                } else {
                    format!("source(s) {}", started.sources.join(", "))
                }
            );
            if detach {
                println!(
                    "started; a process running ingest does it (`laurel awards list` shows how far it is)"
                );
                return Ok(());
            }
            let settings = crate::backfill::BackfillSettings {
                batch,
                max_event_bytes,
                brokers: kafka_brokers,
                retention_days: log_retention_days.max(7),
            };
            let done = backfill_here(store, registry, settings, &id).await?;
            print_history_backfill(&done);
            anyhow::ensure!(
                done.failed == 0,
                "{} item(s) failed: fix what the last reason names, then run `laurel awards backfill {id}` again",
                done.failed
            );
        }
        AwardsCommand::Recompute { id } => {
            let store = store(connections).await?;
            anyhow::ensure!(store.request_backfill(&id).await?, "no award named {id}");
            println!("{id} will be computed again for every user with counters for it");
        }
    }
    Ok(())
}

/// Works on the backfill of `id` until it ends, sharing it with any
/// process that holds it now (then only following its progress). A bar on
/// a terminal, a line per step otherwise.
async fn backfill_here(
    store: Store,
    registry: std::sync::Arc<Registry>,
    settings: crate::backfill::BackfillSettings,
    id: &str,
) -> anyhow::Result<crate::store::HistoryBackfill> {
    let progress = Progress::new("items and retained messages");
    let show = |b: &crate::store::HistoryBackfill| {
        progress.update(
            (b.done + b.events_done) as u64,
            (b.total + b.events_total) as u64,
            format!(
                "({} of {} items, {} of {} retained messages)",
                b.done, b.total, b.events_done, b.events_total
            ),
        );
    };
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut backfiller = crate::backfill::Backfiller::new(store, registry, settings);
    // PostgreSQL away for a moment (restarted, a connection cut) costs a
    // pause: the walk resumes where its last step ended.
    const TRIES: u32 = 12;
    const PAUSE: std::time::Duration = std::time::Duration::from_secs(5);
    let mut failures = 0;
    let done = loop {
        // Some(the backfill, if it finished), or None: it was removed.
        let turn = async {
            if let Some(b) = backfiller.work(Some(id), &stop, &show).await?
                && b.finished_at.is_some()
            {
                return anyhow::Ok(Some(Some(b)));
            }
            // Another process holds it: follow it, and take over if it stops.
            Ok(match backfiller.store().history_backfill(id).await? {
                None => None,
                Some(b) if b.finished_at.is_some() => Some(Some(b)),
                Some(b) => {
                    show(&b);
                    Some(None)
                }
            })
        };
        match turn.await {
            Ok(Some(Some(b))) => break b,
            Ok(Some(None)) => {
                failures = 0;
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Ok(None) => anyhow::bail!("the backfill of {id} was removed (the award was deleted)"),
            Err(error) if failures + 1 < TRIES => {
                failures += 1;
                progress.say(&format!(
                    "a step failed ({error:#}); trying again in {} s (try {} of {TRIES}), from where the last step ended",
                    PAUSE.as_secs(),
                    failures + 1
                ));
                tokio::time::sleep(PAUSE).await;
            }
            Err(error) => {
                return Err(error.context(format!(
                    "the backfill of {id} stopped here; it stays where its last step ended, and a process running ingest takes it up (`laurel awards list` shows it)"
                )));
            }
        }
    };
    progress.finish();
    Ok(done)
}

fn refused_note(refused: usize) -> String {
    match refused {
        0 => String::new(),
        n => format!("({n} refused)"),
    }
}

fn print_history_backfill(b: &crate::store::HistoryBackfill) {
    println!(
        "backfilled {} v{} from history: {} item(s), {} changed a counter, {} unrecoverable; {} retained message(s) read, {} analytics event(s) counted; {} failed",
        b.award_id,
        b.award_version,
        b.done,
        b.changed,
        b.unrecoverable,
        b.events_done,
        b.events_applied,
        b.failed
    );
    if b.unrecoverable > 0 {
        println!(
            "  {} item(s) were applied before Laurel kept their events: they are not credited",
            b.unrecoverable
        );
    }
    match (&b.events_note, b.from_start, b.events_from) {
        (Some(note), _, _) => println!("  {note}"),
        (None, true, _) => println!(
            "  analytics: every partition still holds its first message, so no analytics event is past Kafka's retention"
        ),
        (None, false, Some(from)) => println!(
            "  analytics before {} are past Kafka's retention (or Laurel's record of counted events): not credited",
            from.to_rfc3339()
        ),
        (None, false, None) => println!(
            "  analytics: Kafka retains none of the events before the award (past its retention): not credited"
        ),
    }
    if let Some(reason) = &b.last_failure {
        println!("  last failure: {reason}");
    }
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

pub(super) async fn proxies(
    connections: &Connections,
    command: ProxiesCommand,
) -> anyhow::Result<()> {
    use crate::proxy::{self, ProxyPools};
    let pools = ProxyPools::connect(&connections.redis_url).await?;
    let store = || store(connections);
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
            proxy::checked_pool(&pool)?;
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
                proxy::candidates::fetch_list(&source).await?
            } else {
                std::fs::read_to_string(&source)
                    .with_context(|| format!("failed to read {source}"))?
            };
            let store = store().await?;
            let progress = Progress::new("proxies checked");
            let watch = |c: proxy::candidates::Checking| {
                progress.update(c.checked as u64, c.total as u64, refused_note(c.refused));
            };
            let report =
                proxy::candidates::import_watched(&store, &pools, &pool, &list, replace, &watch)
                    .await?;
            progress.finish();
            print_report(&pool, &report);
        }
        ProxiesCommand::Check { pool } => {
            let store = store().await?;
            let progress = Progress::new("proxies checked");
            let watch = |c: proxy::candidates::Checking| {
                progress.update(c.checked as u64, c.total as u64, refused_note(c.refused));
            };
            let report =
                proxy::candidates::check_pool_watched(&store, &pools, &pool, &watch).await?;
            progress.finish();
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

pub(super) async fn webhooks(
    connections: &Connections,
    command: WebhooksCommand,
) -> anyhow::Result<()> {
    let store = store(connections).await?;
    match command {
        WebhooksCommand::Set {
            name,
            url,
            events,
            proxy_pool,
        } => {
            let webhook =
                crate::webhooks::checked_webhook(&name, &url, &events, proxy_pool.as_deref())
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

pub(super) async fn sources(
    connections: &Connections,
    command: SourcesCommand,
) -> anyhow::Result<()> {
    let store = store(connections).await?;
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

pub(super) async fn pipelines(
    connections: &Connections,
    command: PipelinesCommand,
) -> anyhow::Result<()> {
    match command {
        PipelinesCommand::Apply { file, sandbox } => {
            let (text, registry, mut store) = definition_file(connections, &file, &sandbox).await?;
            for (name, version) in crate::pipelines::apply(&mut store, &registry, &text).await? {
                println!("applied pipeline {name} v{version}");
            }
        }
        PipelinesCommand::List => {
            let store = store(connections).await?;
            println!(
                "{:<20} {:>7} {:<24} {:<12} {:<20} state",
                "PIPELINE", "VERSION", "INPUT TOPIC", "SOURCE", "TRANSFORM"
            );
            for p in store.pipelines().await? {
                println!(
                    "{:<20} {:>7} {:<24} {:<12} {:<20} {}",
                    p.name,
                    p.version,
                    p.input_topic,
                    p.source,
                    p.transform,
                    if p.paused { "paused" } else { "running" }
                );
            }
        }
        PipelinesCommand::Delete { name } => {
            let store = store(connections).await?;
            anyhow::ensure!(
                store.delete_pipeline(&name).await?,
                "no pipeline named {name}"
            );
            println!("pipeline {name} deleted");
        }
        PipelinesCommand::Pause { name } => {
            let store = store(connections).await?;
            anyhow::ensure!(
                store.set_pipeline_paused(&name, true).await?,
                "no pipeline named {name}"
            );
            println!("pipeline {name} paused");
        }
        PipelinesCommand::Resume { name } => {
            let store = store(connections).await?;
            anyhow::ensure!(
                store.set_pipeline_paused(&name, false).await?,
                "no pipeline named {name}"
            );
            println!("pipeline {name} resumed");
        }
        PipelinesCommand::Replay {
            name,
            kafka_brokers,
        } => {
            let store = store(connections).await?;
            let pipeline = store
                .pipelines()
                .await?
                .into_iter()
                .find(|p| p.name == name)
                .ok_or_else(|| anyhow::anyhow!("no pipeline named {name}"))?;
            let key = crate::replay::raw::ReplayKey::load(&store).await?;
            let progress = Progress::new("dead-letter records read");
            let watch = |step: crate::watch::Step<'_>| progress.follow(step);
            let report = crate::replay::raw::replay_watched(
                &kafka_brokers,
                crate::kafka::GROUP_PREFIX,
                &pipeline,
                &key,
                &watch,
            )
            .await?;
            progress.finish();
            println!(
                "replayed {} dead letters of pipeline {name} from {} to {}",
                report.replayed, report.dead_topic, pipeline.input_topic
            );
            if report.unsigned > 0 {
                println!(
                    "  {} of them not dead-lettered by Laurel (no valid {}): put back as new records, read at their new position by every pipeline of {}",
                    report.unsigned,
                    crate::replay::raw::DEAD_SIGNATURE_HEADER,
                    pipeline.input_topic
                );
            }
            if report.other_pipelines > 0 {
                println!(
                    "  {} dead letters of other pipelines of {} left alone",
                    report.other_pipelines, pipeline.input_topic
                );
            }
            if !report.without_value.is_empty() {
                println!(
                    "  {} could not be replayed: their value was over the size limit (at partition/offset {} of {})",
                    report.without_value.len(),
                    report.without_value.join(", "),
                    pipeline.input_topic
                );
            }
        }
    }
    Ok(())
}

pub(super) async fn dead_letters(
    connections: &Connections,
    command: DeadLettersCommand,
) -> anyhow::Result<()> {
    let mut store = store(connections).await?;
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
            max_event_bytes,
            sandbox,
        } => {
            let registry = Registry::start(&connections.database_url, sandbox.runtime()?).await?;
            let catalog = Catalog::start(&connections.database_url).await?;
            let filter = crate::store::LetterFilter { since, reason };
            let progress = Progress::new("dead letters replayed");
            let watch = |step: crate::watch::Step<'_>| progress.follow(step);
            let report = crate::replay::replay_watched(
                &mut store,
                &registry,
                &catalog,
                &source,
                &filter,
                max_event_bytes,
                &watch,
            )
            .await?;
            progress.finish();
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

/// `laurel users ...`.
pub(super) async fn users(connections: &Connections, command: UsersCommand) -> anyhow::Result<()> {
    let mut store = store(connections).await?;
    let (user, state) = match &command {
        UsersCommand::Show { user_id } => return show_user(&store, user_id).await,
        UsersCommand::Ban { user_id } => (user_id, "banned"),
        UsersCommand::Delete { user_id } => (user_id, "deleted"),
        UsersCommand::Restore { user_id } => (user_id, "active"),
    };
    store.set_user_state(user, state).await?;
    println!("user {user} is {state}");
    Ok(())
}
