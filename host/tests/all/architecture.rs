//! The invariants of ARCHITECTURE.md, checked: each external crate that
//! talks to the world (a service's client, the HTTP server and client, the
//! token library) is named only in the module that owns it; no role
//! imports another role; every module is on the code map.

use std::path::{Path, PathBuf};

/// (crate, the files or folders under `host/src` that may name it).
const OWNERS: &[(&str, &[&str])] = &[
    ("wasmtime", &["runtime/"]),
    ("rdkafka", &["kafka/"]),
    ("tokio_postgres", &["store/"]),
    ("redis", &["redis_connection.rs", "proxy/", "keyvalue.rs"]),
    ("reqwest", &["outbound.rs"]),
    ("rustls", &["outbound.rs"]),
    ("axum", &["api/"]),
    ("hyper", &["api/"]),
    ("jsonwebtoken", &["api/auth.rs", "api/tokens.rs"]),
];

/// The roles (what `cli/roles.rs` runs): (module path, files). A role may
/// use any capability, and no other role.
const ROLES: &[(&str, &str)] = &[
    ("ingest", "ingest/"),
    ("prefilter", "prefilter/"),
    ("awards", "awards.rs"),
    ("notify", "notify.rs"),
    ("proxy::recheck", "proxy/recheck.rs"),
    ("api", "api/"),
    ("backfill", "backfill.rs"),
];

/// Every source file under `host/src`, as (path relative to it, text).
fn host_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 50,
        "{} files under {}",
        files.len(),
        root.display()
    );
    files.sort();
    files
        .iter()
        .map(|file| {
            let relative = file
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            (relative, std::fs::read_to_string(file).unwrap())
        })
        .collect()
}

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

/// The crate modules `line` imports or names (`crate::ingest::run`,
/// `use crate::{awards, ingest};`), as their paths below `crate::`.
fn crate_paths(line: &str) -> Vec<String> {
    let code = line.split("//").next().unwrap_or_default();
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
        {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let group = group.split('}').next().unwrap_or_default();
                found.extend(
                    group
                        .split(',')
                        .map(|name| name.trim().replace(' ', ""))
                        .filter(|name| !name.is_empty()),
                );
            }
            None => found.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect(),
            ),
        }
    }
    found
}

/// Whether the crate path `path` (below `crate::`) reaches into `role`.
fn reaches(path: &str, role: &str) -> bool {
    path == role || path.starts_with(&format!("{role}::"))
}

#[test]
fn no_role_imports_another_role() {
    let mut strays = Vec::new();
    for (relative, text) in host_sources() {
        let Some((own, _)) = ROLES.iter().find(|(_, files)| relative.starts_with(files)) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for path in crate_paths(line) {
                for (role, _) in ROLES {
                    if role != own && reaches(&path, role) && !reaches(own, role) {
                        strays.push(format!("{relative}:{}: {role}: {}", n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        strays.is_empty(),
        "roles importing roles:\n{}",
        strays.join("\n")
    );
    // The check sees what it looks for.
    assert_eq!(crate_paths("use crate::ingest::Plan;"), ["ingest::Plan"]);
    assert_eq!(
        crate_paths("use crate::{awards, ingest::run};"),
        ["awards", "ingest::run"]
    );
    assert!(crate_paths("// crate::ingest in a comment").is_empty());
    assert!(reaches("proxy::recheck::run", "proxy::recheck"));
    assert!(!reaches("proxy::ProxyPools", "proxy::recheck"));
    assert!(!reaches("ingestion", "ingest"));
}

/// ARCHITECTURE.md's code map names every module: each file under
/// `host/src` by its path (`host/src/kafka/consume.rs`, or below
/// `host/src`: `kafka/consume.rs`; a `mod.rs` also by its folder,
/// `kafka/`).
#[test]
fn every_module_is_on_the_code_map() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let map = std::fs::read_to_string(repo.join("ARCHITECTURE.md")).unwrap();
    let named = |name: &str| map.contains(&format!("`{name}`"));
    let missing: Vec<String> = host_sources()
        .into_iter()
        .map(|(relative, _)| relative)
        .filter(|relative| {
            let folder = relative.strip_suffix("mod.rs");
            !(named(&format!("host/src/{relative}"))
                || named(relative)
                || folder
                    .is_some_and(|folder| named(folder) || named(&format!("host/src/{folder}"))))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "modules ARCHITECTURE.md does not name: {}",
        missing.join(", ")
    );
}

#[test]
fn each_service_client_is_named_by_its_owner_only() {
    let mut strays = Vec::new();
    for (relative, text) in host_sources() {
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

/// GitHub's anchor for a heading: lower case, spaces to `-`, punctuation
/// dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The README is a front door and the reference lives in docs/: every
/// relative link of the README, docs/ and the benchmarks' README names a
/// file that exists (and a heading of it, if it names one).
#[test]
fn the_docs_links_resolve() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut pages = vec![repo.join("README.md"), repo.join("host/benches/README.md")];
    pages.extend(crate::support::doc_pages());
    let readme_lines = std::fs::read_to_string(repo.join("README.md"))
        .unwrap()
        .lines()
        .count();
    assert!(readme_lines <= 250, "README.md is {readme_lines} lines");
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.starts_with("http") || target.is_empty() {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if anchor.is_empty() && !file.ends_with(".md") {
                // An image or another file: it exists.
                if !path.is_file() {
                    broken.push(format!("{}: {target}", page.display()));
                }
                continue;
            }
            let Ok(linked) = std::fs::read_to_string(&path) else {
                broken.push(format!("{}: {target}", page.display()));
                continue;
            };
            if !anchor.is_empty()
                && !linked
                    .lines()
                    .filter_map(|l| l.strip_prefix('#'))
                    .any(|h| slug(h.trim_start_matches('#')) == anchor)
            {
                broken.push(format!("{}: {target} (no such heading)", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// host/benches/README.md's table holds a row of every bench, written by
/// host/benches/regenerate from what the bench printed: each bench prints
/// its rows through benches/support/row.rs, and each row names the
/// command, the day and the commit it was measured on.
#[test]
fn every_bench_has_its_row_of_current_figures() {
    let host = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(host.join("Cargo.toml")).unwrap();
    let benches: Vec<&str> = manifest
        .split("[[bench]]")
        .skip(1)
        .filter_map(|section| section.split('"').nth(1))
        .collect();
    assert!(benches.len() >= 9, "{benches:?}");
    let page = std::fs::read_to_string(host.join("benches/README.md")).unwrap();
    let begin = "<!-- figures: written by host/benches/regenerate -->";
    let table = page
        .split_once(begin)
        .and_then(|(_, rest)| rest.split_once("<!-- /figures -->"))
        .map(|(table, _)| table)
        .expect("the figures markers");
    for bench in benches {
        let source = std::fs::read_to_string(host.join(format!("benches/{bench}.rs"))).unwrap();
        assert!(
            source.contains("mod row;") && source.contains(&format!("\"{bench}\"")),
            "benches/{bench}.rs prints no row of its own"
        );
        let rows: Vec<&str> = table
            .lines()
            .filter(|line| line.contains(&format!("--bench {bench}`")))
            .collect();
        assert!(
            !rows.is_empty(),
            "no row of {bench} in host/benches/README.md"
        );
        for row in rows {
            assert_eq!(row.matches(" | ").count(), 6, "seven columns: {row}");
            let measured = row.trim_end_matches(" |").rsplit(" | ").next().unwrap();
            let day = measured.split(',').next().unwrap();
            assert!(
                day.len() == 10 && day.as_bytes()[4] == b'-' && day.as_bytes()[7] == b'-',
                "a row names the day it was measured: {row}"
            );
        }
    }
}
