//! The function registry against a real PostgreSQL: migrations, the built-in
//! library, pushes with kind checks, hot swap, quarantine records and the
//! compiled-artifact cache.

use std::sync::Arc;
use std::time::Duration;

use laurel::library;
use laurel::registry::{self, Registry, RegistryError};
use laurel::runtime::{FunctionKind, Limits, LoadError, Runtime};
use laurel::store::PushOutcome;

use crate::support::{self, TestDb, event_of_type};

#[tokio::test]
async fn migrate_registers_the_builtin_library_once() {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    let first = library::register(&mut store, &runtime).await.unwrap();
    assert_eq!(first.len(), library::BUILTINS.len());
    assert!(
        first
            .iter()
            .all(|(_, outcome)| *outcome == PushOutcome::Created { version: 1 })
    );
    // Again: nothing new, and migrations are not re-applied.
    assert!(
        library::register(&mut store, &runtime)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.migrate().await.unwrap().is_empty());

    let sql = db.sql().await;
    let rows = sql
        .query(
            "SELECT name, kind, version, builtin FROM functions ORDER BY name",
            &[],
        )
        .await
        .unwrap();
    let listed: Vec<(String, String, i32, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let mut expected: Vec<(String, String, i32, bool)> = library::BUILTINS
        .iter()
        .map(|b| (b.name.to_string(), b.kind.as_str().to_string(), 1, true))
        .collect();
    expected.sort();
    assert_eq!(listed, expected);
    db.drop_database().await;
}

#[tokio::test]
async fn push_checks_the_component_and_its_kind() {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime_with(Limits {
        component_bytes: 1 << 20,
        ..Limits::default()
    });
    let hostile = support::guest_bytes("hostile_function");

    let wrong = registry::push(
        &mut store,
        &runtime,
        "Mine",
        &hostile,
        Some(FunctionKind::Filter),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(wrong, RegistryError::Load(LoadError::WrongKind { .. })),
        "{wrong:?}"
    );
    assert_eq!(
        wrong.to_string(),
        "component Mine is a rule, but it is registered as a filter"
    );

    let junk = registry::push(&mut store, &runtime, "Mine", b"\0asm not really", None)
        .await
        .unwrap_err();
    assert!(
        junk.to_string()
            .starts_with("component Mine is not a valid Wasm component:"),
        "{junk}"
    );

    let big = vec![0u8; (1 << 20) + 1];
    let too_big = registry::push(&mut store, &runtime, "Mine", &big, None)
        .await
        .unwrap_err();
    assert_eq!(
        too_big.to_string(),
        "component Mine is 1048577 bytes, over the limit of 1048576 bytes"
    );

    // A plain core module is not a component either.
    let core = b"\0asm\x01\0\0\0";
    let not_component = registry::push(&mut store, &runtime, "Mine", core, None)
        .await
        .unwrap_err();
    assert!(
        not_component
            .to_string()
            .starts_with("component Mine is not a valid Wasm component:"),
        "{not_component}"
    );

    let sql = db.sql().await;
    let count: i64 = sql
        .query_one("SELECT count(*) FROM functions", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 0, "nothing refused was persisted");

    let (kind, outcome) = registry::push(&mut store, &runtime, "Mine", &hostile, None)
        .await
        .unwrap();
    assert_eq!(
        (kind, outcome),
        (FunctionKind::Rule, PushOutcome::Created { version: 1 })
    );
    let (_, again) = registry::push(&mut store, &runtime, "Mine", &hostile, None)
        .await
        .unwrap();
    assert_eq!(again, PushOutcome::Unchanged { version: 1 });
    db.drop_database().await;
}

/// Waits (bounded) for the registry to serve `version` of `name`.
async fn wait_for_version(registry: &Registry, name: &str, version: i32) -> Duration {
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), async {
        while registry.get(name).map(|f| f.version) != Some(version) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} v{version} was not loaded within 10 s"));
    started.elapsed()
}

#[tokio::test]
async fn pushed_version_takes_over_without_restart_and_calls_in_flight_keep_theirs() {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    registry::push(
        &mut store,
        &runtime,
        "Swap",
        &support::guest_bytes("accept_all_filter"),
        None,
    )
    .await
    .unwrap();
    let registry = Registry::start(&db.url, runtime.clone()).await.unwrap();

    let mut binding = registry.bind_filter("Swap", "{}").unwrap();
    let events = [event_of_type("e-1", "photo.created")];
    assert_eq!(binding.instance().matches(&events).unwrap(), vec![true]);
    // An instance taken before the push stands for a call in flight.
    let in_flight =
        laurel::runtime::FilterInstance::new(registry.get("Swap").unwrap(), "{}").unwrap();

    let (_, outcome) = registry::push(
        &mut store,
        &runtime,
        "Swap",
        &support::guest_bytes("reject_all_filter"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(outcome, PushOutcome::Created { version: 2 });
    wait_for_version(&registry, "Swap", 2).await;

    assert_eq!(
        binding.instance().matches(&events).unwrap(),
        vec![false],
        "the next call uses v2"
    );
    assert_eq!(binding.instance().function().version, 2);
    let mut in_flight = in_flight;
    assert_eq!(
        in_flight.matches(&events).unwrap(),
        vec![true],
        "the older instance still runs v1"
    );
    assert_eq!(in_flight.function().version, 1);
    db.drop_database().await;
}

#[tokio::test]
async fn a_version_that_fails_to_load_leaves_the_previous_in_service() {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    registry::push(
        &mut store,
        &runtime,
        "Swap",
        &support::guest_bytes("accept_all_filter"),
        None,
    )
    .await
    .unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    // Bytes that passed no checks (as if written by an older, laxer Laurel).
    let sql = db.sql().await;
    sql.execute(
        "INSERT INTO functions (name, version, kind, sha256, bytes) VALUES ('Swap', 2, 'filter', repeat('0', 64), '\\x00'::bytea)",
        &[],
    )
    .await
    .unwrap();
    sql.execute(
        "UPDATE function_live SET previous = version, version = 2 WHERE name = 'Swap'",
        &[],
    )
    .await
    .unwrap();
    sql.execute("NOTIFY laurel_functions, 'Swap'", &[])
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while registry.unloadable().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the failure is reported");
    let (name, version, reason) = registry.unloadable().remove(0);
    assert_eq!((name.as_str(), version), ("Swap", 2));
    assert!(reason.contains("not a valid Wasm component"), "{reason}");
    assert_eq!(
        registry.get("Swap").unwrap().version,
        1,
        "v1 stays in service"
    );
    db.drop_database().await;
}

#[tokio::test]
async fn binding_reports_unknown_and_wrong_kind() {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    library::register(&mut store, &runtime).await.unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    let unknown = registry.bind_filter("NoSuchFilter", "{}").err().unwrap();
    assert_eq!(
        unknown.to_string(),
        "no function named NoSuchFilter is registered"
    );
    let wrong = registry.bind_filter("CountRule", "{}").err().unwrap();
    assert_eq!(
        wrong.to_string(),
        "function CountRule is a rule, not a filter"
    );
    let config = registry
        .bind_rule("CountRule", r#"{"countr": "x"}"#)
        .err()
        .unwrap();
    assert!(
        config.to_string().starts_with(
            "function CountRule v1 rejected its config: invalid config: unknown field `countr`"
        ),
        "{config}"
    );
    db.drop_database().await;
}

#[tokio::test]
async fn quarantine_is_recorded_in_the_database() {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime_with(Limits {
        quarantine_after: 2,
        ..Limits::default()
    });
    registry::push(
        &mut store,
        &runtime,
        "Hostile",
        &support::guest_bytes("hostile_function"),
        None,
    )
    .await
    .unwrap();
    let registry = Registry::start(&db.url, runtime).await.unwrap();
    let mut rule = registry.bind_rule("Hostile", "{}").unwrap();
    for i in 0..2 {
        rule.instance()
            .contribute(&[event_of_type(&format!("p-{i}"), "panic")])
            .unwrap_err();
    }
    let sql = db.sql().await;
    let reason: String = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let row = sql
                .query_one("SELECT quarantine_reason FROM functions WHERE name = 'Hostile' AND version = 1", &[])
                .await
                .unwrap();
            if let Some(reason) = row.get::<_, Option<String>>(0) {
                return reason;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("quarantine recorded");
    assert!(
        reason.starts_with("2 consecutive failures, the last: function Hostile v1 trapped"),
        "{reason}"
    );
    db.drop_database().await;
}

#[test]
fn compiled_components_are_cached_by_their_own_sha256_and_a_changed_entry_is_recompiled() {
    use sha2::Digest;
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("laurel-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bytes = library::builtin("SourceFilter").unwrap().bytes;
    let sha = hex::encode(sha2::Sha256::digest(bytes));
    let first = Runtime::new(Limits::default(), Some(dir.clone())).unwrap();
    first.load("SourceFilter", 1, bytes, None).unwrap();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the cache is Laurel's user's alone");
    let entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "one artifact: {entries:?}");
    assert!(
        entries[0]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(&format!("{sha}-"))
    );

    // Another process (a new runtime) loads the artifact.
    let second = Runtime::new(Limits::default(), Some(dir.clone())).unwrap();
    let function = second.load("SourceFilter", 1, bytes, None).unwrap();
    assert_eq!(function.sha256, sha);
    let mut filter =
        laurel::runtime::FilterInstance::new(function, r#"{"sources": ["photos"]}"#).unwrap();
    assert_eq!(
        filter.matches(&[event_of_type("e", "t")]).unwrap(),
        vec![true]
    );

    // Another component's valid artifact put in its place is not loaded as
    // this one: it is recompiled from the real bytes.
    let other = library::builtin("EventTypeFilter").unwrap().bytes;
    second.load("EventTypeFilter", 1, other, None).unwrap();
    let other_sha = hex::encode(sha2::Sha256::digest(other));
    let other_path = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&other_sha)
        })
        .unwrap();
    std::fs::copy(&other_path, &entries[0]).unwrap();
    let third = Runtime::new(Limits::default(), Some(dir.clone())).unwrap();
    let function = third.load("SourceFilter", 1, bytes, None).unwrap();
    laurel::runtime::FilterInstance::new(function, r#"{"sources": ["photos"]}"#)
        .expect("the real SourceFilter, which takes this config");
    assert_ne!(
        std::fs::read(&entries[0]).unwrap(),
        std::fs::read(&other_path).unwrap(),
        "the entry was rewritten"
    );
    // And garbage is recompiled too.
    std::fs::write(&entries[0], b"garbage").unwrap();
    let fourth = Runtime::new(Limits::default(), Some(dir.clone())).unwrap();
    fourth
        .load("SourceFilter", 1, bytes, None)
        .expect("recompiled");
    assert!(std::fs::read(&entries[0]).unwrap().len() > 1000);

    // A directory others may write is tightened.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    Runtime::new(Limits::default(), Some(dir.clone())).unwrap();
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cache_directory_of_another_user_is_not_used() {
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
    });
    if !root {
        // Only root can give a directory to another user here.
        return;
    }
    let dir = std::env::temp_dir().join(format!("laurel-cache-other-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let status = std::process::Command::new("chown")
        .args(["65534:65534"])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(status.success());
    let runtime = Runtime::new(Limits::default(), Some(dir.clone())).unwrap();
    runtime
        .load(
            "SourceFilter",
            1,
            library::builtin("SourceFilter").unwrap().bytes,
            None,
        )
        .expect("compiled without the cache");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing written there"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_version_serves_nothing_until_promoted_and_rollback_returns_without_restart() {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    let accept = support::guest_bytes("accept_all_filter");
    let reject = support::guest_bytes("reject_all_filter");
    registry::push(&mut store, &runtime, "Gate", &accept, None)
        .await
        .unwrap();
    let registry = Registry::start(&db.url, runtime.clone()).await.unwrap();
    let mut binding = registry.bind_filter("Gate", "{}").unwrap();
    let events = [event_of_type("e-1", "photo.created")];
    assert_eq!(binding.instance().matches(&events).unwrap(), vec![true]);

    // A shadow candidate: registered, listed, serving nothing.
    let (_, outcome) = laurel::definitions::push_shadow(
        &mut store,
        &runtime,
        "Gate",
        laurel::definitions::Pushed::of(&reject),
    )
    .await
    .unwrap();
    assert_eq!(outcome, PushOutcome::Created { version: 2 });
    registry.sync_now(&store).await.unwrap();
    assert_eq!(registry.get("Gate").unwrap().version, 1);
    assert_eq!(binding.instance().matches(&events).unwrap(), vec![true]);
    let versions: Vec<(i32, bool)> = store
        .all_function_versions()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.name == "Gate")
        .map(|r| (r.version, r.live))
        .collect();
    assert_eq!(versions, vec![(2, false), (1, true)]);
    // Pushing the candidate's bytes as a shadow again changes nothing.
    let (_, again) = laurel::definitions::push_shadow(
        &mut store,
        &runtime,
        "Gate",
        laurel::definitions::Pushed::of(&reject),
    )
    .await
    .unwrap();
    assert_eq!(again, PushOutcome::Unchanged { version: 2 });

    // Promoted: the next call runs it, in this running registry.
    let change = laurel::definitions::promote(&mut store, &runtime, "Gate", 2, false)
        .await
        .unwrap();
    assert_eq!((change.from, change.to), (Some(1), 2));
    wait_for_version(&registry, "Gate", 2).await;
    assert_eq!(binding.instance().matches(&events).unwrap(), vec![false]);

    // Rolled back in one step: v1 again, no new version.
    let change = laurel::definitions::rollback(&mut store, &runtime, "Gate", false)
        .await
        .unwrap();
    assert_eq!((change.from, change.to), (Some(2), 1));
    wait_for_version(&registry, "Gate", 1).await;
    assert_eq!(binding.instance().matches(&events).unwrap(), vec![true]);
    assert_eq!(
        store
            .all_function_versions()
            .await
            .unwrap()
            .iter()
            .filter(|r| r.name == "Gate")
            .count(),
        2
    );

    // What cannot be done is said.
    let error = laurel::definitions::promote(&mut store, &runtime, "Gate", 9, false)
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "Gate has no version 9");
    registry::push(&mut store, &runtime, "Lonely", &accept, None)
        .await
        .unwrap();
    let error = laurel::definitions::rollback(&mut store, &runtime, "Lonely", false)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "Lonely v1 is the only version that has served: there is nothing to roll back to"
    );
    let error = laurel::definitions::rollback(&mut store, &runtime, "Nobody", false)
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "no function named Nobody is registered");
    db.drop_database().await;
}

#[tokio::test]
async fn promoting_a_version_that_breaks_an_award_is_refused_naming_it() {
    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime();
    laurel::library::register(&mut store, &runtime)
        .await
        .unwrap();
    // A shadow "SourceFilter" that is a rule: every award using the filter
    // would break.
    let rule = laurel::library::builtin("CountRule").unwrap().bytes;
    let registry = Registry::start(&db.url, runtime.clone()).await.unwrap();
    laurel::definitions::apply(
        &mut store,
        &registry,
        r#"{"id": "photographer", "title": "Photographer",
            "objectives": [{"id": "photos",
              "filters": [{"name": "SourceFilter", "config": {"sources": ["photos"]}}],
              "rule": {"name": "CountRule", "config": {"counter": "count"}},
              "progress_counter": "count"}],
            "strategy": {"goal": 3, "strategy": [{"objective_id": "photos"}]}}"#,
    )
    .await
    .unwrap();
    let (_, outcome) = laurel::definitions::push_shadow(
        &mut store,
        &runtime,
        "SourceFilter",
        laurel::definitions::Pushed::of(rule),
    )
    .await
    .unwrap();
    let PushOutcome::Created { version } = outcome else {
        panic!("{outcome:?}")
    };
    let error = laurel::definitions::promote(&mut store, &runtime, "SourceFilter", version, false)
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("refusing to promote SourceFilter: the new version would break an award that uses it (promote with --force to do it anyway)"),
        "{message}"
    );
    assert!(message.contains("photographer"), "{message}");
    assert_eq!(
        store
            .live_function("SourceFilter")
            .await
            .unwrap()
            .unwrap()
            .0,
        version - 1
    );
    db.drop_database().await;
}

/// With `--function-perf-map`, `perf` can name a component's own code: the
/// map it reads names the built-in JSON transform's functions.
#[test]
fn the_perf_map_names_a_components_own_functions() {
    let map = std::path::PathBuf::from(format!("/tmp/perf-{}.map", std::process::id()));
    let _ = std::fs::remove_file(&map);
    let limits = Limits {
        perf_map: true,
        ..Limits::default()
    };
    let runtime = Runtime::new(limits, None).unwrap();
    support::builtin(&runtime, "JsonTransform");
    let text = std::fs::read_to_string(&map).expect("the perf map is written");
    let _ = std::fs::remove_file(&map);
    assert!(
        text.lines().any(|line| line.contains("json_transform")),
        "{}",
        text.lines().take(5).collect::<Vec<_>>().join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_asked_at_push_are_checked_kept_with_their_version_and_served() {
    use laurel::definitions::{self, Pushed};
    use laurel::runtime::{FunctionError, FunctionLimits, RuleInstance};

    let db = TestDb::new().await;
    let mut store = db.store().await;
    let runtime = support::runtime_with(Limits {
        cpu_budget: Duration::from_millis(100),
        max_cpu_budget: Duration::from_millis(500),
        memory_bytes: 64 << 20,
        max_memory_bytes: 128 << 20,
        quarantine_after: 100,
        ..Limits::default()
    });
    let hostile = support::guest_bytes("hostile_function");
    let asking = |cpu_ms: Option<u32>, memory_mib: Option<u32>| Pushed {
        bytes: &hostile,
        expected: None,
        limits: FunctionLimits { cpu_ms, memory_mib },
    };

    // Over a ceiling, or too little memory to start: refused, with why.
    let refused = [
        (
            asking(Some(501), None),
            "component Mine is refused: it asks for a CPU budget of 501 ms, over this server's \
             ceiling of 500 ms (LAUREL_FUNCTION_MAX_CPU_MS)",
        ),
        (
            asking(None, Some(129)),
            "component Mine is refused: it asks for 129 MiB of memory, over this server's \
             ceiling of 128 MiB (LAUREL_FUNCTION_MAX_MEMORY_MIB)",
        ),
        (
            asking(None, Some(1)),
            "component Mine cannot start within its limits: function Mine v0 exceeded its \
             memory limit: tried to grow its memories to",
        ),
    ];
    for (pushed, expected) in refused {
        let error = definitions::push_function(&mut store, &runtime, "Mine", pushed, false)
            .await
            .unwrap_err()
            .to_string();
        assert!(error.starts_with(expected), "{error}\nexpected: {expected}");
    }
    let sql = db.sql().await;
    let count: i64 = sql
        .query_one("SELECT count(*) FROM functions", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 0, "nothing refused was persisted");

    // Accepted, kept with the version: the same bytes with other limits
    // are a new version; with the same, nothing new.
    for (limits, expected) in [
        (
            asking(Some(30), Some(16)),
            PushOutcome::Created { version: 1 },
        ),
        (
            asking(Some(30), Some(16)),
            PushOutcome::Unchanged { version: 1 },
        ),
        (asking(Some(60), None), PushOutcome::Created { version: 2 }),
    ] {
        let (_, outcome) = definitions::push_function(&mut store, &runtime, "Mine", limits, false)
            .await
            .unwrap();
        assert_eq!(outcome, expected);
    }
    let stored = |version| {
        let store = &store;
        async move {
            store
                .function_version("Mine", version)
                .await
                .unwrap()
                .unwrap()
                .limits
        }
    };
    assert_eq!(
        stored(1).await,
        FunctionLimits {
            cpu_ms: Some(30),
            memory_mib: Some(16)
        }
    );
    assert_eq!(
        stored(2).await,
        FunctionLimits {
            cpu_ms: Some(60),
            memory_mib: None
        }
    );

    // Served under its own limits: a loop ends at its budget, not the
    // server's; a rollback returns to the previous version's.
    let registry = Registry::start(&db.url, runtime.clone()).await.unwrap();
    let ends_at = |registry: &Arc<Registry>| {
        let function = registry.get("Mine").unwrap();
        let limits = function.limits;
        let mut rule = RuleInstance::new(function, "{}").unwrap();
        let error = rule
            .contribute(&[event_of_type("e-loop", "loop")])
            .unwrap_err();
        match error {
            FunctionError::Timeout { budget_ms, .. } => (budget_ms, limits.memory_bytes >> 20),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(ends_at(&registry), (60, 64));
    definitions::rollback(&mut store, &runtime, "Mine", false)
        .await
        .unwrap();
    registry.sync_now(&store).await.unwrap();
    assert_eq!(ends_at(&registry), (30, 16));
    db.drop_database().await;
}
