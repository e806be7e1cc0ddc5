//! `laurel functions new`: a standalone crate for one function, outside
//! any Laurel checkout: a Cargo.toml that depends on the guest SDK; the SDK
//! itself in `vendor/laurel-guest` (by default: the copy this binary
//! carries, so the crate builds with cargo and no registry); or by
//! version, git or path; `.cargo/config.toml` for the wasm32-wasip2
//! target; an example of the kind; a fixture case that passes against it;
//! a five-line README. Templates: `host/scaffold/`; the example and its
//! fixture case are the guest SDK's own (`functions/guest/examples/`), with
//! the example's type renamed.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::runtime::FunctionKind;

/// The guest SDK's version (checked against `functions/guest/Cargo.toml`
/// by a test).
pub const SDK_VERSION: &str = "0.1.0";

/// The guest SDK's package, as this binary carries it: (path in the
/// package, text).
pub const SDK_FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/guest_sdk.rs"));

/// Where a bundled SDK goes in a scaffolded crate.
pub const SDK_VENDOR_DIR: &str = "vendor/laurel-guest";

/// Where a scaffolded crate gets the guest SDK (`laurel-guest`) from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Sdk {
    /// The copy this binary carries, written into the crate
    /// (`vendor/laurel-guest`): `bundled`, the default.
    #[default]
    Bundled,
    /// A version from the registry: `0.1.0`.
    Version(String),
    /// A git repository holding Laurel: `git:URL` or `git:URL#REV`.
    Git { url: String, rev: Option<String> },
    /// A local copy of the SDK: `path:DIR` (the `functions/guest` folder).
    Path(PathBuf),
}

impl FromStr for Sdk {
    type Err = String;

    fn from_str(spec: &str) -> Result<Sdk, String> {
        if spec == "bundled" {
            return Ok(Sdk::Bundled);
        }
        if let Some(at) = spec.strip_prefix("git:") {
            let (url, rev) = match at.split_once('#') {
                Some((url, rev)) => (url, Some(rev.to_string())),
                None => (at, None),
            };
            if url.is_empty() {
                return Err("`git:` needs a URL, e.g. git:https://example.com/laurel.git".into());
            }
            return Ok(Sdk::Git {
                url: url.to_string(),
                rev,
            });
        }
        if let Some(dir) = spec.strip_prefix("path:") {
            let dir = std::path::absolute(dir).map_err(|e| format!("path {dir:?}: {e}"))?;
            if !dir.join("Cargo.toml").is_file() {
                return Err(format!(
                    "{} has no Cargo.toml: give the SDK's folder (functions/guest in Laurel)",
                    dir.display()
                ));
            }
            return Ok(Sdk::Path(dir));
        }
        let is_version = !spec.is_empty()
            && spec
                .split('.')
                .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
        if is_version {
            return Ok(Sdk::Version(spec.to_string()));
        }
        Err(format!(
            "{spec:?} is not an SDK source: bundled, a version (0.1.0), git:URL[#REV] or path:DIR"
        ))
    }
}

impl Sdk {
    /// The `[dependencies]` line.
    fn dependency(&self) -> String {
        let quoted = |text: &str| serde_json::Value::from(text).to_string();
        match self {
            Sdk::Bundled => format!(
                "laurel-guest = {{ path = {}, version = {} }}",
                quoted(SDK_VENDOR_DIR),
                quoted(SDK_VERSION)
            ),
            Sdk::Version(version) => format!("laurel-guest = {}", quoted(version)),
            Sdk::Git { url, rev: None } => format!("laurel-guest = {{ git = {} }}", quoted(url)),
            Sdk::Git {
                url,
                rev: Some(rev),
            } => format!(
                "laurel-guest = {{ git = {}, rev = {} }}",
                quoted(url),
                quoted(rev)
            ),
            Sdk::Path(dir) => format!(
                "laurel-guest = {{ path = {} }}",
                quoted(&dir.to_string_lossy())
            ),
        }
    }
}

/// What `laurel functions new` made.
#[derive(Debug)]
pub struct Scaffolded {
    pub dir: PathBuf,
    /// The component `cargo build --release` writes, relative to `dir`.
    pub component: PathBuf,
    pub files: Vec<PathBuf>,
}

/// Writes a crate for function `name` of `kind` into `dir` (which must not
/// exist or be empty).
pub fn create(name: &str, kind: FunctionKind, dir: &Path, sdk: &Sdk) -> Result<Scaffolded, String> {
    check_name(name)?;
    let Some((example_name, (lib, config, input, expected))) = example(kind) else {
        return Err(format!(
            "laurel functions new writes filter, rule, strategy and transform crates, not {kind}: an HTTP function is a spin-sdk crate (see Laurel's docs/http-functions.md)"
        ));
    };
    if dir.exists() {
        let empty = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
            .next()
            .is_none();
        if !empty {
            return Err(format!(
                "{} exists and is not empty: give a new folder with --dir",
                dir.display()
            ));
        }
    }
    let krate = crate_name(name);
    let wasm = krate.replace('-', "_");
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{crate}}", &krate)
            .replace("{{wasm}}", &wasm)
            .replace("{{kind}}", kind.as_str())
            .replace("{{sdk}}", &sdk.dependency())
    };
    let files: [(&str, String); 8] = [
        (
            "Cargo.toml",
            fill(include_str!("../scaffold/Cargo.toml.tmpl")),
        ),
        (
            ".cargo/config.toml",
            include_str!("../scaffold/config.toml").into(),
        ),
        (".gitignore", include_str!("../scaffold/gitignore").into()),
        (
            "README.md",
            fill(include_str!("../scaffold/README.md.tmpl")),
        ),
        ("src/lib.rs", lib.replace(example_name, name)),
        ("fixtures/example/config.json", config.into()),
        ("fixtures/example/input.jsonl", input.into()),
        ("fixtures/example/expected.jsonl", expected.into()),
    ];
    let vendored = match sdk {
        Sdk::Bundled => SDK_FILES
            .iter()
            .map(|(path, text)| (format!("{SDK_VENDOR_DIR}/{path}"), text.to_string()))
            .collect(),
        _ => Vec::new(),
    };
    let files = files
        .into_iter()
        .map(|(path, text)| (path.to_string(), text))
        .chain(vendored);
    let mut written = Vec::new();
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(Scaffolded {
        dir: dir.to_path_buf(),
        component: Path::new("target/wasm32-wasip2/release").join(format!("{wasm}.wasm")),
        files: written,
    })
}

/// The SDK's example of a kind: its type's name, (src/lib.rs, config.json,
/// input.jsonl, expected.jsonl).
type Example = (
    &'static str,
    (&'static str, &'static str, &'static str, &'static str),
);

fn example(kind: FunctionKind) -> Option<Example> {
    macro_rules! kind {
        ($kind:literal, $name:literal) => {
            (
                $name,
                (
                    include_str!(concat!("../../functions/guest/examples/", $kind, ".rs")),
                    include_str!(concat!(
                        "../../functions/guest/examples/fixtures/",
                        $kind,
                        "/config.json"
                    )),
                    include_str!(concat!(
                        "../../functions/guest/examples/fixtures/",
                        $kind,
                        "/input.jsonl"
                    )),
                    include_str!(concat!(
                        "../../functions/guest/examples/fixtures/",
                        $kind,
                        "/expected.jsonl"
                    )),
                ),
            )
        };
    }
    Some(match kind {
        FunctionKind::Filter => kind!("filter", "MinRating"),
        FunctionKind::Rule => kind!("rule", "LongReviews"),
        FunctionKind::Strategy => kind!("strategy", "WeightedGoal"),
        FunctionKind::Transform => kind!("transform", "TripLines"),
        FunctionKind::Http => return None,
    })
}

/// A function name the example can use as its Rust type: a letter, then
/// letters and digits (e.g. `GoodRating`).
fn check_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_uppercase())
        && name.chars().all(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} cannot name a new function: use 1-64 letters and digits, starting with a capital (e.g. GoodRating)"
        ))
    }
}

/// `GoodRating` -> `good-rating`.
pub fn crate_name(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_sources_parse_and_write_a_dependency() {
        assert_eq!(Sdk::default(), Sdk::Bundled);
        assert_eq!(
            "bundled".parse::<Sdk>().unwrap().dependency(),
            r#"laurel-guest = { path = "vendor/laurel-guest", version = "0.1.0" }"#
        );
        assert_eq!(
            "0.1.0".parse::<Sdk>().unwrap().dependency(),
            r#"laurel-guest = "0.1.0""#
        );
        assert_eq!(
            "git:https://example.com/laurel.git#v0.1.0"
                .parse::<Sdk>()
                .unwrap()
                .dependency(),
            r#"laurel-guest = { git = "https://example.com/laurel.git", rev = "v0.1.0" }"#
        );
        let error = "path:/nowhere".parse::<Sdk>().unwrap_err();
        assert!(error.contains("has no Cargo.toml"), "{error}");
        let error = "latest".parse::<Sdk>().unwrap_err();
        assert!(error.contains("is not an SDK source"), "{error}");
    }

    #[test]
    fn the_default_sdk_is_the_guest_sdk_version() {
        let manifest = include_str!("../../functions/guest/Cargo.toml");
        assert!(
            manifest.contains(&format!("\nversion = \"{SDK_VERSION}\"\n")),
            "functions/guest/Cargo.toml's version is not {SDK_VERSION}"
        );
    }

    #[test]
    fn the_bundled_sdk_is_the_whole_package_with_its_wit() {
        let paths: Vec<&str> = SDK_FILES.iter().map(|(path, _)| *path).collect();
        for needed in [
            "Cargo.toml",
            "README.md",
            "src/lib.rs",
            "wit/award.wit",
            "examples/filter.rs",
            "examples/fixtures/transform/expected.jsonl",
        ] {
            assert!(paths.contains(&needed), "{needed} missing from {paths:?}");
        }
        let (_, manifest) = SDK_FILES.iter().find(|(p, _)| *p == "Cargo.toml").unwrap();
        assert!(
            !manifest.contains(".workspace") && !manifest.contains("workspace = true"),
            "the SDK's manifest must stand alone:\n{manifest}"
        );
    }

    #[test]
    fn names_become_crates_and_bad_names_are_refused() {
        assert_eq!(crate_name("GoodRating"), "good-rating");
        assert_eq!(crate_name("Km2Filter"), "km2-filter");
        for bad in ["", "good", "Good-Rating", "Good Rating", "Ünicode"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
