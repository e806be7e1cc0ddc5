//! Function projects made as a product engineer makes them: `laurel
//! functions new` in a folder outside the checkout, built with the
//! language's own tool (cargo; componentize-py from PyPI and jco from npm,
//! installed on first use), the component's bytes kept. Shared by the
//! Python and JavaScript tests (`tests/all/polyglot.rs`) and the bench
//! that compares the languages (`benches/languages.rs`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Tools and projects live beside the build (kept between runs, like it),
/// outside the checkout.
pub fn work_dir() -> PathBuf {
    // LAUREL_GUEST_DIR = <target>/guest/wasm32-wasip2/guest
    laurel::library::guest_dir()
        .ancestors()
        .nth(3)
        .unwrap()
        .join("polyglot")
}

pub fn laurel() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_laurel"));
    command
        .env("LAUREL_LOG", "warn")
        .env_remove("LAUREL_KAFKA_BROKERS");
    command
}

/// Runs `command`; what it printed, or a panic that shows it.
pub fn run(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let printed = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{what} failed:\n{printed}");
    printed
}

/// A folder whose `bin/` has componentize-py as a new project's
/// requirements.txt pins it (installed from PyPI into a virtual
/// environment on first use).
pub fn python_tools() -> &'static Path {
    static TOOLS: OnceLock<PathBuf> = OnceLock::new();
    TOOLS.get_or_init(|| {
        // The requirements.txt `laurel functions new` writes.
        let pin = include_str!("../../scaffold/python/requirements.txt").trim();
        let venv = work_dir().join("python-tools");
        let version = pin.trim_start_matches("componentize-py==");
        let installed = Command::new(venv.join("bin/componentize-py"))
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains(version))
            .unwrap_or(false);
        if !installed {
            let _ = std::fs::remove_dir_all(&venv);
            run(
                Command::new("python3").args(["-m", "venv"]).arg(&venv),
                "python3 -m venv",
            );
            run(
                Command::new(venv.join("bin/pip")).args(["install", "--quiet", pin]),
                "pip install componentize-py",
            );
        }
        venv
    })
}

/// PATH with `dir` first.
fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Makes a project with `laurel functions new` in a new folder, lets
/// `edit` change it, builds it with its language's tool and runs `laurel
/// functions test` on its fixtures: the component's bytes.
pub fn build(lang: &str, kind: &str, name: &str, edit: impl FnOnce(&Path)) -> Vec<u8> {
    let dir = work_dir().join(format!("{lang}-{kind}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let printed = run(
        laurel()
            .args([
                "functions",
                "new",
                name,
                "--kind",
                kind,
                "--lang",
                lang,
                "--dir",
            ])
            .arg(&dir),
        "functions new",
    );
    let crate_name = laurel::scaffold::crate_name(name);
    let file = crate_name.replace('-', "_") + ".wasm";
    let vendor = match lang {
        "python" => "vendor/laurel-python",
        "js" => "vendor/laurel-js",
        _ => "vendor/laurel-guest",
    };
    assert!(
        dir.join(vendor).join("wit/award.wit").is_file(),
        "the SDK and its WIT are written with the project"
    );
    edit(&dir);
    let wasm = match lang {
        "python" => {
            assert!(printed.contains("./build.sh"), "{printed}");
            run(
                Command::new(dir.join("build.sh"))
                    .current_dir(&dir)
                    .env("PATH", path_with(&python_tools().join("bin"))),
                &format!("{name}: ./build.sh"),
            );
            dir.join(&file)
        }
        "js" => {
            assert!(printed.contains("npm run build"), "{printed}");
            // The project's own commands; npm's cache makes every install
            // after the first one quick.
            run(
                Command::new("npm")
                    .args(["install", "--prefer-offline", "--no-audit", "--no-fund"])
                    .current_dir(&dir),
                &format!("{name}: npm install"),
            );
            run(
                Command::new("npm")
                    .args(["run", "--silent", "build"])
                    .current_dir(&dir),
                &format!("{name}: npm run build"),
            );
            dir.join(&file)
        }
        _ => {
            assert!(printed.contains("cargo build --release"), "{printed}");
            // A target folder of its own (a running cargo holds the lock
            // on the outer one), kept between runs.
            let target = work_dir().join("rust-target");
            run(
                Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                    .args(["build", "--release", "--quiet"])
                    .current_dir(&dir)
                    .env("CARGO_TARGET_DIR", &target)
                    .env_remove("RUSTFLAGS")
                    .env_remove("CARGO_ENCODED_RUSTFLAGS")
                    .env_remove("CARGO_BUILD_TARGET"),
                &format!("{name}: cargo build --release"),
            );
            target.join("wasm32-wasip2/release").join(&file)
        }
    };
    let printed = run(
        laurel()
            .args(["functions", "test"])
            .arg(&wasm)
            .current_dir(&dir),
        &format!("{name}: laurel functions test"),
    );
    assert!(
        printed.contains(&format!("({kind}): 1 cases, 1 passed, 0 failed")),
        "{printed}"
    );
    let bytes = std::fs::read(&wasm).unwrap();
    // Only the component is kept: JavaScript's node_modules are large.
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}
