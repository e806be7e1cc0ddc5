//! `laurel functions new`: a standalone project for one function, outside
//! any Laurel checkout, in Rust, Python or JavaScript: the SDK of its
//! language in `vendor/` (the copy this binary carries, so it builds with
//! the language's own tool and no Laurel registry; a Rust crate may name
//! the SDK by version, git or path instead); the build's configuration
//! (Cargo.toml and `.cargo/config.toml`; `build.sh` and
//! `requirements.txt` for componentize-py; `package.json` for jco); an
//! example of the kind; a fixture case that passes against it; a short
//! README. Templates: `host/scaffold/<lang>/`; the examples are the SDKs'
//! own (`functions/guest*/examples/`), with the example's type renamed, and
//! share one fixture case per kind.

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

/// The language of a new function's project.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Lang {
    #[default]
    Rust,
    Python,
    Js,
}

impl FromStr for Lang {
    type Err = String;

    fn from_str(lang: &str) -> Result<Lang, String> {
        match lang {
            "rust" => Ok(Lang::Rust),
            "python" | "py" => Ok(Lang::Python),
            "js" | "javascript" => Ok(Lang::Js),
            other => Err(format!(
                "{other:?} is not a language of Laurel's SDKs: rust, python or js"
            )),
        }
    }
}

/// The Python SDK as this binary carries it (`functions/guest-python`,
/// with the WIT): (path, text).
pub const PYTHON_SDK_FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/python_sdk.rs"));
/// The JavaScript SDK likewise (`functions/guest-js`).
pub const JS_SDK_FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/js_sdk.rs"));

/// What `laurel functions new` made.
#[derive(Debug)]
pub struct Scaffolded {
    pub dir: PathBuf,
    /// The component the build writes, relative to `dir`.
    pub component: PathBuf,
    /// The commands that install the tools (if any) and build, in `dir`.
    pub build: Vec<&'static str>,
    pub files: Vec<PathBuf>,
}

/// Writes a project for function `name` of `kind` in `lang` into `dir`
/// (which must not exist or be empty). `sdk` is where a Rust crate gets
/// the SDK; Python and JavaScript projects always get the bundled copy.
pub fn create(
    name: &str,
    kind: FunctionKind,
    lang: Lang,
    dir: &Path,
    sdk: &Sdk,
) -> Result<Scaffolded, String> {
    check_name(name)?;
    let Some(example) = example(kind) else {
        return Err(format!(
            "laurel functions new writes filter, rule, strategy and transform projects, not {kind}: an HTTP function is a spin-sdk crate (see Laurel's docs/http-functions.md)"
        ));
    };
    if lang != Lang::Rust && *sdk != Sdk::Bundled {
        return Err(
            "--sdk says where a Rust crate gets its SDK; Python and JavaScript projects get the copy this binary carries".into(),
        );
    }
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
    let world = match kind {
        FunctionKind::Filter => "scoped-filter",
        FunctionKind::Transform => "scoped-transform",
        _ => kind.as_str(),
    };
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{crate}}", &krate)
            .replace("{{wasm}}", &wasm)
            .replace("{{kind}}", kind.as_str())
            .replace("{{world}}", world)
            .replace("{{sdk}}", &sdk.dependency())
    };
    let code = |text: &str| text.replace(example.name, name);
    let (project, vendored, component, build): (Vec<(&str, String)>, _, PathBuf, Vec<&str>) =
        match lang {
            Lang::Rust => (
                vec![
                    (
                        "Cargo.toml",
                        fill(include_str!("../scaffold/rust/Cargo.toml.tmpl")),
                    ),
                    (
                        ".cargo/config.toml",
                        include_str!("../scaffold/rust/config.toml").into(),
                    ),
                    (
                        ".gitignore",
                        include_str!("../scaffold/rust/gitignore").into(),
                    ),
                    (
                        "README.md",
                        fill(include_str!("../scaffold/rust/README.md.tmpl")),
                    ),
                    ("src/lib.rs", code(example.rust)),
                ],
                match sdk {
                    Sdk::Bundled => Some((SDK_VENDOR_DIR, SDK_FILES)),
                    _ => None,
                },
                Path::new("target/wasm32-wasip2/release").join(format!("{wasm}.wasm")),
                vec!["cargo build --release"],
            ),
            Lang::Python => (
                vec![
                    ("app.py", code(example.python)),
                    (
                        "build.sh",
                        fill(include_str!("../scaffold/python/build.sh.tmpl")),
                    ),
                    (
                        "requirements.txt",
                        include_str!("../scaffold/python/requirements.txt").into(),
                    ),
                    (
                        ".gitignore",
                        include_str!("../scaffold/python/gitignore").into(),
                    ),
                    (
                        "README.md",
                        fill(include_str!("../scaffold/python/README.md.tmpl")),
                    ),
                ],
                Some(("vendor/laurel-python", PYTHON_SDK_FILES)),
                PathBuf::from(format!("{wasm}.wasm")),
                vec!["pip install -r requirements.txt", "./build.sh"],
            ),
            Lang::Js => (
                vec![
                    ("function.js", code(example.js)),
                    (
                        "package.json",
                        fill(include_str!("../scaffold/js/package.json.tmpl")),
                    ),
                    (
                        ".gitignore",
                        include_str!("../scaffold/js/gitignore").into(),
                    ),
                    (
                        "README.md",
                        fill(include_str!("../scaffold/js/README.md.tmpl")),
                    ),
                ],
                Some(("vendor/laurel-js", JS_SDK_FILES)),
                PathBuf::from(format!("{wasm}.wasm")),
                vec!["npm install", "npm run build"],
            ),
        };
    let fixtures = [
        ("fixtures/example/config.json", example.config),
        ("fixtures/example/input.jsonl", example.input),
        ("fixtures/example/expected.jsonl", example.expected),
    ];
    let files = project
        .into_iter()
        .map(|(path, text)| (path.to_string(), text))
        .chain(fixtures.map(|(path, text)| (path.to_string(), text.to_string())))
        .chain(vendored.into_iter().flat_map(|(vendor, files)| {
            files
                .iter()
                .map(move |(path, text)| (format!("{vendor}/{path}"), text.to_string()))
        }));
    let mut written = Vec::new();
    for (path, text) in files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        if path.extension().is_some_and(|e| e == "sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("cannot make {} executable: {e}", path.display()))?;
        }
        written.push(path);
    }
    Ok(Scaffolded {
        dir: dir.to_path_buf(),
        component,
        build,
        files: written,
    })
}

/// The SDKs' example of a kind, in each language, and its fixture case
/// (the same for every language).
struct Example {
    /// The example's class or type name, replaced by the new function's.
    name: &'static str,
    rust: &'static str,
    python: &'static str,
    js: &'static str,
    config: &'static str,
    input: &'static str,
    expected: &'static str,
}

fn example(kind: FunctionKind) -> Option<Example> {
    macro_rules! kind {
        ($kind:literal, $name:literal) => {
            Example {
                name: $name,
                rust: include_str!(concat!("../../functions/guest/examples/", $kind, ".rs")),
                python: include_str!(concat!(
                    "../../functions/guest-python/examples/",
                    $kind,
                    ".py"
                )),
                js: include_str!(concat!("../../functions/guest-js/examples/", $kind, ".js")),
                config: include_str!(concat!(
                    "../../functions/guest/examples/fixtures/",
                    $kind,
                    "/config.json"
                )),
                input: include_str!(concat!(
                    "../../functions/guest/examples/fixtures/",
                    $kind,
                    "/input.jsonl"
                )),
                expected: include_str!(concat!(
                    "../../functions/guest/examples/fixtures/",
                    $kind,
                    "/expected.jsonl"
                )),
            }
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
    fn the_python_and_javascript_sdks_are_bundled_with_their_wit() {
        let python: Vec<&str> = PYTHON_SDK_FILES.iter().map(|(path, _)| *path).collect();
        for kind in ["filter", "rule", "strategy", "transform"] {
            assert!(
                python.contains(&format!("laurel_{kind}.py").as_str()),
                "{python:?}"
            );
        }
        for needed in [
            "laurel/__init__.py",
            "filters.py",
            "rules.py",
            "strategies.py",
            "transforms.py",
            "wit/award.wit",
        ] {
            assert!(python.contains(&needed), "{needed} missing from {python:?}");
        }
        let js: Vec<&str> = JS_SDK_FILES.iter().map(|(path, _)| *path).collect();
        assert_eq!(js, ["laurel.js", "package.json", "wit/award.wit"]);
        for path in python.iter().chain(&js) {
            assert!(!path.starts_with("examples"), "{path}");
        }
        let wit = include_str!("../../wit/award.wit");
        for files in [PYTHON_SDK_FILES, JS_SDK_FILES] {
            assert_eq!(
                files.iter().find(|(p, _)| *p == "wit/award.wit").unwrap().1,
                wit
            );
        }
        assert_eq!("py".parse::<Lang>(), Ok(Lang::Python));
        assert_eq!("javascript".parse::<Lang>(), Ok(Lang::Js));
        let error = "kotlin".parse::<Lang>().unwrap_err();
        assert!(error.contains("rust, python or js"), "{error}");
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
