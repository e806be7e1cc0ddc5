//! The ownership invariants of ARCHITECTURE.md, checked: each external
//! service's client crate is named only in the module that owns it.

use std::path::{Path, PathBuf};

/// (crate, the files or folders under `host/src` that may name it).
const OWNERS: &[(&str, &[&str])] = &[
    ("wasmtime", &["runtime/"]),
    ("rdkafka", &["ingest/"]),
    ("tokio_postgres", &["store/"]),
    ("redis", &["redis_connection.rs", "proxy/", "keyvalue.rs"]),
];

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// Whether `line` names `krate` as a path (`krate::`), not as a part of
/// another name (`crate::redis_connection`, `my_redis::`).
fn names(line: &str, krate: &str) -> bool {
    let code = line.split("//").next().unwrap_or_default();
    let pattern = format!("{krate}::");
    code.match_indices(&pattern).any(|(at, _)| {
        code[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'))
    })
}

#[test]
fn each_service_client_is_named_by_its_owner_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 50,
        "{} files under {}",
        files.len(),
        root.display()
    );
    let mut strays = Vec::new();
    for file in &files {
        let relative = file
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(file).unwrap();
        for (krate, owners) in OWNERS {
            if owners.iter().any(|owner| relative.starts_with(owner)) {
                continue;
            }
            for (n, line) in text.lines().enumerate() {
                if names(line, krate) {
                    strays.push(format!("{relative}:{}: {krate}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        strays.is_empty(),
        "outside their owners:\n{}",
        strays.join("\n")
    );
    // The check sees what it looks for.
    assert!(names("use redis::AsyncCommands;", "redis"));
    assert!(names("    let x: rdkafka::Offset = y;", "rdkafka"));
    assert!(!names(
        "use crate::redis_connection::RedisConnection;",
        "redis"
    ));
    assert!(!names("// redis::cmd in a comment", "redis"));
}
