//! One reconciling supervisor for the roles that run a consumer per row
//! (ingest per source, the pre-filter per pipeline): it reads the rows,
//! starts a task for each new one, restarts one whose version changed,
//! stops one that is gone, hands each its pause flag, and on shutdown
//! stops them all and waits for the batches in hand.
//!
//! The rows are read again at every notification and every second; a
//! failed read is said once per outage, and the running tasks carry on
//! meanwhile.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

/// A task the rows ask for.
pub struct Wanted<T> {
    /// What it is called (a source's or pipeline's name).
    pub name: String,
    /// A change of it restarts the task.
    pub version: String,
    pub paused: bool,
    /// What the task is started with.
    pub row: T,
}

/// How the supervisor names what it runs, in its log.
pub struct Names {
    /// The rows, plural ("sources").
    pub rows: &'static str,
    /// One task ("source consumer").
    pub task: &'static str,
}

/// What a started task gets: its pause flag (followed while it runs) and
/// its stop signal.
pub struct Supervised {
    pub paused: Arc<AtomicBool>,
    pub stop: watch::Receiver<bool>,
}

struct Running {
    version: String,
    paused: Arc<AtomicBool>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Runs what `read` asks for until `shutdown`, starting each with `start`.
/// `read` is lent `state` (the role's database connection) for each read
/// and gives it back.
pub async fn run<S, T, E: Display, N, F>(
    names: Names,
    mut notifications: mpsc::UnboundedReceiver<N>,
    state: S,
    mut read: impl FnMut(S) -> F,
    mut start: impl FnMut(T, Supervised) -> JoinHandle<()>,
    shutdown: impl Future<Output = ()>,
) where
    F: Future<Output = (S, Result<Vec<Wanted<T>>, E>)>,
{
    let mut state = Some(state);
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut failing = false;
    loop {
        let (back, wanted) = read(state.take().expect("given back by every read")).await;
        state = Some(back);
        match wanted {
            Ok(wanted) => {
                if std::mem::take(&mut failing) {
                    info!(message = %format!("Reading {} again.", names.rows));
                }
                reconcile(&names, &mut running, wanted, &mut start).await;
            }
            // Said once per outage; the tasks carry on meanwhile.
            Err(error) if !failing => {
                failing = true;
                warn!(message = %format!("Failed to read {}; retrying every second.", names.rows), %error);
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = notifications.recv() => {}
            _ = tick.tick() => {}
        }
    }
    for r in running.values() {
        let _ = r.stop.send(true);
    }
    for (name, r) in running {
        if let Err(error) = r.task.await {
            error!(message = %format!("A {} ended abnormally.", names.task), name = %name, %error);
        }
    }
}

/// Makes `running` what `wanted` says.
async fn reconcile<T>(
    names: &Names,
    running: &mut HashMap<String, Running>,
    wanted: Vec<Wanted<T>>,
    start: &mut impl FnMut(T, Supervised) -> JoinHandle<()>,
) {
    // Gone or changed: stop.
    let stale: Vec<String> = running
        .iter()
        .filter(|(name, r)| {
            !wanted
                .iter()
                .any(|w| &w.name == *name && w.version == r.version)
        })
        .map(|(name, _)| name.clone())
        .collect();
    for name in stale {
        if let Some(old) = running.remove(&name) {
            let _ = old.stop.send(true);
            let _ = old.task.await;
            info!(message = %format!("A {} stopped.", names.task), name = %name);
        }
    }
    for w in wanted {
        if let Some(r) = running.get(&w.name) {
            r.paused.store(w.paused, Ordering::Release);
            continue;
        }
        let paused = Arc::new(AtomicBool::new(w.paused));
        let (stop, stop_rx) = watch::channel(false);
        let task = start(
            w.row,
            Supervised {
                paused: paused.clone(),
                stop: stop_rx,
            },
        );
        running.insert(
            w.name,
            Running {
                version: w.version,
                paused,
                stop,
                task,
            },
        );
    }
}

/// Starts `make` again with backoff (200 ms doubling to 10 s) while it
/// fails, until it gives a value or `stop` is set; each failure is logged
/// as the start of a `what` ("source consumer") named `name`.
pub async fn retrying<T, F>(
    what: &str,
    name: &str,
    stop: &mut watch::Receiver<bool>,
    mut make: impl FnMut() -> F,
) -> Option<T>
where
    F: Future<Output = anyhow::Result<T>>,
{
    let mut backoff = Duration::from_millis(200);
    loop {
        match make().await {
            Ok(made) => return Some(made),
            Err(error) => {
                error!(message = %format!("Failed to start a {what}; retrying."), name = %name, error = %format!("{error:#}"));
            }
        }
        if *stop.borrow() {
            return None;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return None,
        }
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}
