//! Data-driven cases for the built-in functions, run through real wasmtime
//! by the same fixture runner as `laurel functions test`:
//! `tests/cases/<FunctionName>/<case>/` is a case in the fixture format
//! (`laurel::fixtures`). Adding a case is adding a folder.

use std::path::{Path, PathBuf};

use crate::support;

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("cases")
}

#[test]
fn every_builtin_function_passes_its_cases() {
    let runtime = support::runtime();
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut functions_with_cases = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(cases_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    for function_dir in dirs {
        let function_name = function_dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let function = support::builtin(&runtime, &function_name);
        let results = laurel::fixtures::run_all(&function, None, &function_dir).unwrap();
        for result in results {
            ran += 1;
            for failure in &result.failures {
                failures.push(format!("{}: {failure}", result.case.display()));
            }
        }
        functions_with_cases.push(function_name);
    }
    assert!(
        failures.is_empty(),
        "{} failures in {ran} cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(ran >= 58, "only {ran} cases ran");
    for builtin in laurel::library::BUILTINS {
        assert!(
            functions_with_cases.iter().any(|f| f == builtin.name),
            "built-in {} has no cases",
            builtin.name
        );
    }
}
