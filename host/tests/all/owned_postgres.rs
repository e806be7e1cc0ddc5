//! A PostgreSQL cluster of a test's (or a benchmark's) own: `initdb` into
//! a temporary directory and `pg_ctl` on a free loopback port, so it can be
//! stopped, crashed and started again without touching the shared server.
//! Shared by the tests and `benches/recovery.rs` (`#[path]`).

use std::path::PathBuf;
use std::process::Command;

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// A PostgreSQL cluster of its own, on a free loopback port.
pub struct OwnedPostgres {
    dir: PathBuf,
    port: u16,
}

/// initdb and the server refuse to run as root: run them as `postgres`.
fn pg_command(program: &str) -> Command {
    let path = format!("{PG_BIN}/{program}");
    if running_as_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--", &path]);
        command
    } else {
        Command::new(path)
    }
}

fn running_as_root() -> bool {
    std::env::var("USER").is_ok_and(|u| u == "root")
        || std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"))
        })
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl OwnedPostgres {
    pub fn start() -> OwnedPostgres {
        let dir =
            std::env::temp_dir().join(format!("laurel-pg-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        if running_as_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(status.success());
        }
        let status = pg_command("initdb")
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(dir.join("data"))
            .stdout(std::process::Stdio::null())
            .status()
            .expect("initdb runs");
        assert!(status.success(), "initdb failed");
        let cluster = OwnedPostgres {
            dir,
            port: free_port(),
        };
        cluster.pg_ctl(&["start", "-w"]);
        cluster
    }

    fn pg_ctl(&self, args: &[&str]) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off",
            self.port,
            self.dir.display()
        );
        let status = pg_command("pg_ctl")
            .args(args)
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-o", &options, "-l"])
            .arg(self.dir.join("log"))
            .stdout(std::process::Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(status.success(), "pg_ctl {args:?} failed");
    }

    /// `postgres://postgres@127.0.0.1:PORT`, without a database.
    pub fn server_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    /// A crash-like stop (`immediate`: no checkpoint) or a clean one.
    pub fn stop(&self, immediate: bool) {
        self.pg_ctl(&[
            "stop",
            "-w",
            "-m",
            if immediate { "immediate" } else { "fast" },
        ]);
    }

    pub fn start_again(&self) {
        self.pg_ctl(&["start", "-w"]);
    }
}

impl Drop for OwnedPostgres {
    fn drop(&mut self) {
        let _ = pg_command("pg_ctl")
            .args(["stop", "-m", "immediate", "-D"])
            .arg(self.dir.join("data"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
