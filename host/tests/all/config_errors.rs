//! Invalid config is refused by every built-in with a message that names
//! the function, its version and the problem (the rest of the cases are in
//! tests/cases/*/*/error.txt).

use laurel::runtime::{
    FilterInstance, FunctionError, FunctionKind, RuleInstance, StrategyInstance, TransformInstance,
};

use crate::support;

#[test]
fn every_builtin_refuses_config_that_is_not_json() {
    let runtime = support::runtime();
    for builtin in laurel::library::BUILTINS {
        let function = support::builtin(&runtime, builtin.name);
        let error = match builtin.kind {
            FunctionKind::Filter => FilterInstance::new(function, "not json").err(),
            FunctionKind::Rule => RuleInstance::new(function, "not json").err(),
            FunctionKind::Strategy => StrategyInstance::new(function, "not json").err(),
            FunctionKind::Transform => TransformInstance::new(function, "not json").err(),
            FunctionKind::Http => panic!("{}: the library has no HTTP function", builtin.name),
        }
        .unwrap_or_else(|| panic!("{} accepted `not json`", builtin.name));
        assert!(
            matches!(error, FunctionError::Config { .. }),
            "{}: {error:?}",
            builtin.name
        );
        let message = error.to_string();
        assert!(
            message.starts_with(&format!(
                "function {} v1 rejected its config: invalid config:",
                builtin.name
            )),
            "{message}"
        );
    }
}

#[test]
fn a_config_error_does_not_count_towards_quarantine() {
    let runtime = support::runtime_with(laurel::runtime::Limits {
        quarantine_after: 1,
        ..Default::default()
    });
    let function = support::builtin(&runtime, "SourceFilter");
    for _ in 0..3 {
        FilterInstance::new(function.clone(), "{}")
            .err()
            .expect("refused");
    }
    assert_eq!(function.quarantined(), None);
    FilterInstance::new(function, r#"{"sources": ["photos"]}"#).expect("still usable");
}
