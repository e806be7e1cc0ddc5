//! Builds the guest components in `functions/` for wasm32-wasip2, so that
//! the built-in function library can be embedded in the `laurel` binary and
//! the tests can load real components (including the test-only ones).
//!
//! The guests build with their own cargo invocation into `<target>/guest`,
//! a directory of its own: the outer cargo holds the lock on its own target
//! directory while this script runs.

use std::path::{Path, PathBuf};
use std::process::Command;

const GUESTS: &[&str] = &[
    "source-filter",
    "event-type-filter",
    "status-filter",
    "reviews-length-filter",
    "field-filter",
    "content-status-rule",
    "count-rule",
    "review-unique-by-object-rule",
    "sum-field-rule",
    "tree-strategy",
    "json-transform",
    "key-value-transform",
    "csv-transform",
    "hostile-function",
    "hostile-transform",
    "hostile-filter",
    "hostile-strategy",
    "accept-all-filter",
    "reject-all-filter",
    "plain-filter",
    "plain-transform",
    "disorderly-transform",
];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    for watched in ["functions", "wit", "migrations", "Cargo.lock", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    // Cargo's hashes don't depend on where the checkout is, so two checkouts
    // sharing a target directory (CI's clones do) share this script's output,
    // and the paths above would be the other checkout's. Run again whenever
    // cargo is started from somewhere else.
    println!("cargo:rerun-if-env-changed=PWD");

    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let target_dir = guest_target_dir(&out_dir);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = guest_build(&cargo, &root, &target_dir);
    for guest in GUESTS {
        command.args(["-p", guest]);
    }
    run(command);
    // HTTP functions (spin-sdk) are a workspace of their own.
    let mut command = guest_build(&cargo, &root, &target_dir);
    command
        .arg("--manifest-path")
        .arg(root.join("functions/http/Cargo.toml"));
    run(command);
    let wasm_dir = target_dir.join("wasm32-wasip2").join("guest");
    println!("cargo:rustc-env=LAUREL_GUEST_DIR={}", wasm_dir.display());

    write_migrations(&root.join("migrations"), &out_dir.join("migrations.rs"));
    write_guest_sdk(&root.join("functions/guest"), &out_dir.join("guest_sdk.rs"));
    let wit = root.join("wit/award.wit");
    write_sdk(
        &root.join("functions/guest-python"),
        &wit,
        &out_dir.join("python_sdk.rs"),
    );
    write_sdk(
        &root.join("functions/guest-js"),
        &wit,
        &out_dir.join("js_sdk.rs"),
    );
}

/// `cargo build` of guests for wasm32-wasip2 into `target_dir`.
fn guest_build(cargo: &str, root: &Path, target_dir: &Path) -> Command {
    let mut command = Command::new(cargo);
    command
        .current_dir(root)
        .args([
            "build",
            "--quiet",
            "--target",
            "wasm32-wasip2",
            "--profile",
            "guest",
        ])
        .arg("--target-dir")
        .arg(target_dir);
    // What the outer build set for the host must not leak into the guests.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_PROFILE_DEV_OPT_LEVEL",
    ] {
        command.env_remove(var);
    }
    command
}

fn run(mut command: Command) {
    let status = command
        .status()
        .expect("failed to run cargo to build the guest components");
    if !status.success() {
        panic!(
            "building the guest components in functions/ failed (see above). \
             Is the target installed? `rustup target add wasm32-wasip2`"
        );
    }
}

/// `<target>/guest`, from OUT_DIR = `<target>/<profile>/build/<pkg>-<hash>/out`
/// (or `<target>/<triple>/<profile>/...`): stable across profiles and tools,
/// so `cargo test` and `cargo clippy` share one guest build.
fn guest_target_dir(out_dir: &Path) -> PathBuf {
    let mut dir = out_dir;
    for _ in 0..4 {
        dir = dir.parent().unwrap_or(dir);
    }
    // Cross builds have one more level (the triple).
    if dir.join("CACHEDIR.TAG").exists() {
        dir.join("guest")
    } else {
        dir.parent().unwrap_or(dir).join("guest")
    }
}

/// Embeds `migrations/*.sql` in order, so the binary carries its schema.
fn write_migrations(dir: &Path, out: &Path) {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("migrations/ is missing")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
        .collect();
    files.sort();
    let mut code = String::from("&[\n");
    for path in files {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        code.push_str(&format!(
            "    ({name:?}, include_str!({:?})),\n",
            path.display().to_string()
        ));
    }
    code.push_str("]\n");
    std::fs::write(out, code).unwrap();
}

/// Every file under `dir`, but Python's and npm's caches.
fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if name == "__pycache__" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            walk(&path, files);
        } else {
            files.push(path);
        }
    }
}

/// Embeds the guest SDK's package (its manifest's `include`: the manifest,
/// README, sources, examples and WIT), so `laurel functions new` can write
/// it where cargo finds it with no registry.
fn write_guest_sdk(dir: &Path, out: &Path) {
    let mut files = vec![
        dir.join("Cargo.toml"),
        dir.join("README.md"),
        dir.join("wit/award.wit"),
    ];
    walk(&dir.join("src"), &mut files);
    walk(&dir.join("examples"), &mut files);
    let files = files
        .into_iter()
        .map(|path| (path.strip_prefix(dir).unwrap().to_path_buf(), path))
        .collect();
    write_bundle(files, out);
}

/// The Python or JavaScript SDK (every file of `dir` but its examples),
/// with the WIT it is built against in `wit/award.wit`.
fn write_sdk(dir: &Path, wit: &Path, out: &Path) {
    let mut paths = Vec::new();
    walk(dir, &mut paths);
    let mut files: Vec<(PathBuf, PathBuf)> = paths
        .into_iter()
        .map(|path| (path.strip_prefix(dir).unwrap().to_path_buf(), path))
        .filter(|(relative, _)| !relative.starts_with("examples"))
        .collect();
    files.push((PathBuf::from("wit/award.wit"), wit.to_path_buf()));
    write_bundle(files, out);
}

/// `&[(path in the package, include_str!(file)), ...]`, sorted by path.
fn write_bundle(mut files: Vec<(PathBuf, PathBuf)>, out: &Path) {
    files.sort();
    let mut code = String::from("&[\n");
    for (relative, path) in files {
        code.push_str(&format!(
            "    ({:?}, include_str!({:?})),\n",
            relative.to_string_lossy(),
            path.display().to_string()
        ));
    }
    code.push_str("]\n");
    std::fs::write(out, code).unwrap();
}
