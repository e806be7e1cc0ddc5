//! Hostile guests: a real component (functions/testing/hostile) that loops,
//! allocates 1 GiB, panics, floods its output (or answers the same bytes
//! many times over) or sleeps on request, and a
//! filter, strategy and transform that sleep. Each ends with a clear error
//! within its budget, the host carries on, other functions keep working,
//! and repeated failure quarantines the offender. Clocks and random read
//! the same on every call.

use std::time::{Duration, Instant};

use laurel::runtime::{
    FilterInstance, FunctionError, FunctionKind, Limits, ObjectiveState, RawRecord, RuleInstance,
    StrategyInstance, TransformInstance,
};

use crate::support::{self, event_of_type};

fn hostile(limits: Limits) -> (laurel::runtime::Runtime, RuleInstance) {
    let runtime = support::runtime_with(limits);
    let function = runtime
        .load(
            "Hostile",
            1,
            &support::guest_bytes("hostile_function"),
            None,
        )
        .expect("hostile component loads");
    let rule = RuleInstance::new(function, "{}").expect("hostile rule creates");
    (runtime, rule)
}

/// Limits that let the hostile rule fail only as each test makes it: no
/// quarantine, and a CPU budget a loaded test machine does not run past
/// (the budget's own test sets a short one).
fn generous() -> Limits {
    Limits {
        quarantine_after: 100,
        cpu_budget: Duration::from_secs(10),
        ..Limits::default()
    }
}

/// The hostile rule answers normally again, and a built-in keeps working.
fn assert_still_serving(runtime: &laurel::runtime::Runtime, rule: &mut RuleInstance) {
    let answers = rule
        .contribute(&[event_of_type("ok-1", "photo.created")])
        .expect("a normal event works after");
    assert_eq!(
        answers[0].as_ref().unwrap().as_ref().unwrap().counters[0].value,
        1
    );
    let source = support::builtin(runtime, "SourceFilter");
    let mut filter = FilterInstance::new(source, r#"{"sources": ["photos"]}"#).unwrap();
    assert_eq!(
        filter
            .matches(&[event_of_type("ok-2", "photo.created")])
            .unwrap(),
        vec![true]
    );
}

#[test]
fn endless_loop_ends_at_the_cpu_budget() {
    let (runtime, mut rule) = hostile(Limits {
        cpu_budget: Duration::from_millis(50),
        ..generous()
    });
    let started = Instant::now();
    let error = rule
        .contribute(&[event_of_type("e-loop", "loop")])
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(
        matches!(error, FunctionError::Timeout { budget_ms: 50, .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "function Hostile v1 exceeded its CPU budget of 50 ms"
    );
    // A bound, not a benchmark: the budget plus scheduling slack.
    assert!(elapsed < Duration::from_secs(2), "the loop ran {elapsed:?}");
    assert_still_serving(&runtime, &mut rule);
}

#[test]
fn one_gib_allocation_hits_the_memory_limit() {
    let (runtime, mut rule) = hostile(Limits {
        memory_bytes: 32 << 20,
        ..generous()
    });
    let error = rule
        .contribute(&[event_of_type("e-alloc", "alloc")])
        .unwrap_err();
    assert!(matches!(error, FunctionError::Memory { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.starts_with("function Hostile v1 exceeded its memory limit"),
        "{message}"
    );
    assert!(
        message.contains("over the limit of 33554432 bytes"),
        "{message}"
    );
    assert_still_serving(&runtime, &mut rule);
}

#[test]
fn panic_is_a_trap_that_names_the_function_and_says_why() {
    let (runtime, mut rule) = hostile(generous());
    let error = rule
        .contribute(&[event_of_type("e-17", "panic")])
        .unwrap_err();
    assert!(matches!(error, FunctionError::Trap { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.starts_with("function Hostile v1 trapped:"),
        "{message}"
    );
    assert!(
        message.contains("hostile rule panics on event e-17"),
        "the guest's panic message is kept: {message}"
    );
    assert_still_serving(&runtime, &mut rule);
}

#[test]
fn huge_output_is_refused() {
    let (runtime, mut rule) = hostile(generous());
    let error = rule
        .contribute(&[event_of_type("e-huge", "huge")])
        .unwrap_err();
    assert!(
        matches!(error, FunctionError::InvalidOutput { .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "function Hostile v1 returned an invalid result: a contribution names 100000 counters, over the limit of 64"
    );
    assert_still_serving(&runtime, &mut rule);
}

#[test]
fn an_answer_is_bounded_as_it_is_read_not_after() {
    // 64 counter names that are all the same 1 MiB of the guest's memory:
    // 64 MiB to copy out of 1 MiB, refused while it is read.
    let (runtime, mut rule) = hostile(Limits {
        memory_bytes: 32 << 20,
        ..generous()
    });
    let error = rule
        .contribute(&[event_of_type("e-alias", "alias")])
        .unwrap_err();
    assert!(
        matches!(error, FunctionError::InvalidOutput { .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "function Hostile v1 returned an invalid result: its answer is over 33554432 bytes as read by \
         the host (its strings and lists together, counted as they are read; the limit is the \
         function's memory: its push's --memory-mib, or LAUREL_FUNCTION_MEMORY_MIB)"
    );
    assert_still_serving(&runtime, &mut rule);
}

#[test]
fn a_pushed_function_holds_only_its_share_of_the_instance_pool() {
    let runtime = support::runtime_with(Limits {
        instances_per_function: 2,
        ..generous()
    });
    let bytes = support::guest_bytes("hostile_function");
    let function = runtime.load("Hostile", 1, &bytes, None).unwrap();
    assert!(!laurel::library::is_builtin(&function.sha256));
    let first = RuleInstance::new(function.clone(), "{}").unwrap();
    let mut second = RuleInstance::new(function.clone(), "{}").unwrap();
    let error = RuleInstance::new(function.clone(), "{}")
        .err()
        .expect("a third instance is over the share");
    assert!(matches!(error, FunctionError::Share { .. }), "{error:?}");
    assert_eq!(
        error.to_string(),
        "function Hostile v1 could not be instantiated: it has 2 instances alive, its share of the \
         instance pool (LAUREL_FUNCTION_INSTANCES); bind it to fewer objectives or raise its share"
    );
    assert_eq!(function.instances_alive(), 2);
    // Not a failure of the function: no step towards quarantine, and the
    // instances it has keep answering.
    assert!(function.quarantined().is_none());
    assert!(
        second
            .contribute(&[event_of_type("ok", "photo.created")])
            .is_ok()
    );

    // Another function has a share of its own.
    let source = support::builtin(&runtime, "SourceFilter");
    assert!(laurel::library::is_builtin(&source.sha256));
    let filters: Vec<_> = (0..2)
        .map(|_| FilterInstance::new(source.clone(), r#"{"sources": ["photos"]}"#).unwrap())
        .collect();

    // A trapped instance gives its place back when it is dropped and takes
    // it again when it is made anew.
    let error = second
        .contribute(&[event_of_type("e-panic", "panic")])
        .unwrap_err();
    assert!(matches!(error, FunctionError::Trap { .. }), "{error:?}");
    assert_eq!(function.instances_alive(), 1);
    let third = RuleInstance::new(function.clone(), "{}").expect("a place was given back");
    assert!(
        second
            .contribute(&[event_of_type("ok", "photo.created")])
            .is_err()
    );
    drop((first, third));
    assert_eq!(function.instances_alive(), 0);
    assert!(
        second
            .contribute(&[event_of_type("ok", "photo.created")])
            .is_ok()
    );

    // The built-ins are not held to a share once marked as such (the
    // registry marks every component whose bytes are a built-in's).
    source.unshared();
    let more: Vec<_> = (0..3)
        .map(|_| FilterInstance::new(source.clone(), r#"{"sources": ["photos"]}"#).unwrap())
        .collect();
    assert_eq!(source.instances_alive(), 5);
    drop((filters, more));
}

#[test]
fn panic_while_creating_is_reported() {
    let runtime = support::runtime();
    let function = runtime
        .load(
            "Hostile",
            3,
            &support::guest_bytes("hostile_function"),
            None,
        )
        .unwrap();
    let error = RuleInstance::new(function, r#"{"on_create": "panic"}"#)
        .err()
        .expect("creation fails");
    let message = error.to_string();
    assert!(
        message.starts_with("function Hostile v3 trapped:"),
        "{message}"
    );
    assert!(
        message.contains("hostile rule panics on create"),
        "{message}"
    );
}

#[test]
fn repeated_failure_quarantines_only_the_offender() {
    let (runtime, mut rule) = hostile(Limits {
        quarantine_after: 3,
        ..Limits::default()
    });
    let mut reports = runtime.quarantine_reports();
    for i in 0..3 {
        let error = rule
            .contribute(&[event_of_type(&format!("p-{i}"), "panic")])
            .unwrap_err();
        assert!(matches!(error, FunctionError::Trap { .. }), "{error:?}");
    }
    // Now even a harmless event is refused without running the guest.
    let error = rule
        .contribute(&[event_of_type("fine", "photo.created")])
        .unwrap_err();
    assert!(
        matches!(error, FunctionError::Quarantined { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.starts_with("function Hostile v1 is quarantined: 3 consecutive failures"),
        "{message}"
    );
    assert!(
        message.contains("hostile rule panics on event p-2"),
        "{message}"
    );
    let report = reports.try_recv().expect("the quarantine is reported");
    assert_eq!((report.name.as_str(), report.version), ("Hostile", 1));
    // Other functions in the same runtime are unaffected.
    let source = support::builtin(&runtime, "SourceFilter");
    let mut filter = FilterInstance::new(source, r#"{"sources": ["photos"]}"#).unwrap();
    assert_eq!(
        filter
            .matches(&[event_of_type("ok", "photo.created")])
            .unwrap(),
        vec![true]
    );
}

#[test]
fn success_resets_the_failure_count() {
    let (_runtime, mut rule) = hostile(Limits {
        quarantine_after: 3,
        ..Limits::default()
    });
    for round in 0..3 {
        for i in 0..2 {
            rule.contribute(&[event_of_type(&format!("p-{round}-{i}"), "panic")])
                .unwrap_err();
        }
        rule.contribute(&[event_of_type(&format!("ok-{round}"), "photo.created")])
            .expect("not quarantined");
    }
}

/// A guest that sleeps in a blocking WASI call would hold the host thread
/// (the epoch deadline only fires while Wasm runs): it traps at once.
fn assert_sleep_refused(error: FunctionError, name: &str, started: Instant) {
    assert!(matches!(error, FunctionError::Trap { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.starts_with(&format!("function {name} v1 trapped: "))
            && message.contains("tried to sleep or wait on a clock"),
        "{message}"
    );
    // A bound, not a benchmark: the guest asked for an hour.
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(2),
        "the sleep took {elapsed:?}"
    );
}

#[test]
fn a_sleeping_rule_traps_at_once_and_the_next_call_is_served() {
    let (runtime, mut rule) = hostile(generous());
    let started = Instant::now();
    let error = rule
        .contribute(&[event_of_type("e-sleep", "sleep")])
        .unwrap_err();
    assert_sleep_refused(error, "Hostile", started);
    assert_still_serving(&runtime, &mut rule);
}

#[test]
fn a_sleeping_filter_strategy_and_transform_trap_at_once() {
    let runtime = support::runtime_with(generous());
    let load = |name: &str, file: &str, kind| {
        runtime
            .load(name, 1, &support::guest_bytes(file), Some(kind))
            .unwrap_or_else(|e| panic!("{name} loads: {e}"))
    };

    let mut filter = FilterInstance::new(
        load("HostileFilter", "hostile_filter", FunctionKind::Filter),
        "{}",
    )
    .unwrap();
    let started = Instant::now();
    let error = filter
        .matches(&[event_of_type("f-sleep", "sleep")])
        .unwrap_err();
    assert_sleep_refused(error, "HostileFilter", started);
    assert_eq!(
        filter
            .matches(&[event_of_type("f-ok", "photo.created")])
            .unwrap(),
        vec![true],
        "a new instance answers the next call"
    );

    let strategy = load(
        "HostileStrategy",
        "hostile_strategy",
        FunctionKind::Strategy,
    );
    let user = vec![ObjectiveState {
        objective_id: "photos".into(),
        value: 3.0,
        counters: vec![],
    }];
    let mut sleepy = StrategyInstance::new(
        strategy.clone(),
        r#"{"objective": "photos", "goal": 5, "sleep": true}"#,
    )
    .unwrap();
    let started = Instant::now();
    let error = sleepy.evaluate(std::slice::from_ref(&user)).unwrap_err();
    assert_sleep_refused(error, "HostileStrategy", started);
    let mut awake =
        StrategyInstance::new(strategy, r#"{"objective": "photos", "goal": 5}"#).unwrap();
    let progress = awake.evaluate(&[user]).unwrap().remove(0).unwrap();
    assert_eq!((progress.progress, progress.goal), (3.0, 5.0));

    let mut transform = TransformInstance::new(
        load(
            "HostileTransform",
            "hostile_transform",
            FunctionKind::Transform,
        ),
        "{}",
    )
    .unwrap();
    let record = |value: &'static str| RawRecord {
        value: value.as_bytes(),
        ..Default::default()
    };
    let started = Instant::now();
    let error = transform.apply("raw", &[record("sleep")]).unwrap_err();
    assert_sleep_refused(error, "HostileTransform", started);
    let answers = transform
        .apply("raw", &[record("u-1 navi.trip_finished")])
        .unwrap();
    assert_eq!(answers[0].as_ref().unwrap().len(), 1);
}

/// The clocks answer a fixed value and random is seeded per call: a
/// redelivered event, a backfill and a shadow diff get the first answer.
#[test]
fn clocks_are_fixed_and_random_repeats_on_every_call() {
    let (runtime, mut rule) = hostile(generous());
    let read = |rule: &mut RuleInstance, id: &str| -> Vec<(String, i64)> {
        let answers = rule.contribute(&[event_of_type(id, "clock")]).unwrap();
        answers[0]
            .as_ref()
            .unwrap()
            .as_ref()
            .unwrap()
            .counters
            .iter()
            .map(|c| (c.name.clone(), c.value))
            .collect()
    };
    let first = read(&mut rule, "c-1");
    assert_eq!(first[0], ("wall".to_string(), 0), "{first:?}");
    assert_eq!(first[1], ("monotonic".to_string(), 0), "{first:?}");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(read(&mut rule, "c-2"), first, "the same instance, later");
    let function = runtime
        .load(
            "Hostile",
            1,
            &support::guest_bytes("hostile_function"),
            None,
        )
        .unwrap();
    let mut other = RuleInstance::new(function, "{}").unwrap();
    assert_eq!(read(&mut other, "c-3"), first, "another instance");
}

/// What a filter declares it reads (its sources, its event types) builds
/// every plan and query: a list past 1,000 names, or a name that is no
/// name, is refused as an invalid result when the filter is made, with
/// what is wrong; a list within bounds is taken.
#[test]
fn a_filter_declaring_too_many_or_broken_names_is_refused() {
    let runtime = support::runtime_with(generous());
    let filter = runtime
        .load(
            "HostileFilter",
            1,
            &support::guest_bytes("hostile_filter"),
            Some(FunctionKind::Filter),
        )
        .unwrap();
    let made = FilterInstance::new(filter.clone(), r#"{"sources": 3}"#).unwrap();
    assert_eq!(
        made.sources(),
        Some(&["s-0".to_string(), "s-1".into(), "s-2".into()][..])
    );
    let error = FilterInstance::new(filter.clone(), r#"{"sources": 1001}"#)
        .err()
        .expect("refused");
    assert_eq!(
        error.to_string(),
        "function HostileFilter v1 returned an invalid result: 1001 sources declared, over the limit of 1000"
    );
    let error = FilterInstance::new(filter, r#"{"bad_source": true}"#)
        .err()
        .expect("refused");
    assert_eq!(
        error.to_string(),
        "function HostileFilter v1 returned an invalid result: sources[0] is not a name (1 to 256 bytes, no control characters): \"bad\\0name\""
    );
}
