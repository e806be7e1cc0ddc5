//! PostgreSQL: connections, the schema (migrations) and every query.
//!
//! **Architecture Invariant:** only this module imports `tokio_postgres`.
//! Other modules get typed rows and typed errors.

mod achievements;
mod audit;
mod awards;
mod counters;
mod dead_letters;
mod functions;
mod history;
mod isolating;
mod json_text;
mod migrations;
mod notifications;
mod pipelines;
mod pool;
mod proxies;
mod users;

pub use achievements::{
    AchieveState, AchieveUpdate, Backfill, ChangedAward, ClaimedChanges, CycleReport,
    OUTBOX_CHANNEL, ObjectiveCounters, Transition, TransitionKind, TransitionRow,
};
pub use audit::AuditEntry;
pub use awards::{AWARDS_CHANNEL, AwardRow, SOURCES_CHANNEL, SourceRow};
pub use counters::{
    Applied, Batch, BatchPart, Counters, DeadEvent, Effect, LogEntry, Message, Outcome,
    PLACE_HEADER, Replaying, place_header,
};
pub use dead_letters::{DeadLetterRow, HeldObjective, LetterFilter, StoredLetter};
pub use functions::{FunctionRow, FunctionVersion, LiveChange, PushOutcome, Pushing};
pub use history::{EventsStep, HistoryBackfill, HistoryStep, Lease, StoredItem};
pub use migrations::MIGRATIONS;
pub use notifications::{Delivery, NotificationRow, Webhook};
pub use pipelines::{PIPELINES_CHANNEL, PipelineRow};
pub use pool::{PooledStore, StorePool, StorePoolError};
pub use proxies::{CandidateRow, ProxyPoolRow};
pub use users::{ItemRow, LogRecord};

use std::time::Duration;

use futures_util::{StreamExt, stream};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls, config::Config};
use tracing::{debug, info, warn};

/// The channel on which a function push is announced; the payload is the
/// function's name.
pub const FUNCTIONS_CHANNEL: &str = "laurel_functions";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid database URL {url:?}: {source}")]
    InvalidUrl {
        url: String,
        source: tokio_postgres::Error,
    },
    #[error("failed to connect to PostgreSQL at {target}: {source}")]
    Connect {
        target: String,
        source: tokio_postgres::Error,
    },
    #[error("migration {name} failed: {source}")]
    Migration {
        name: String,
        source: tokio_postgres::Error,
    },
    #[error(
        "migration {name} was changed after it was applied (applied sha256 {applied}, file sha256 {file}); \
         migrations are never edited once landed: add a new one"
    )]
    MigrationEdited {
        name: String,
        applied: String,
        file: String,
    },
    #[error("database error while {context}: {}", describe_error(.source))]
    Query {
        context: &'static str,
        source: tokio_postgres::Error,
    },
}

impl StoreError {
    /// Whether the error belongs to the data a statement carried:
    /// PostgreSQL's data exceptions (class 22: a NUL in text, a value out of
    /// range) and program limits (class 54: an index entry too large), or a
    /// value the client could not encode. The same data fails again, so a
    /// retry cannot help; everything else (a lost connection, a server
    /// shutting down, a serialization failure or deadlock, no free
    /// connection) is the environment's, and is retried.
    pub fn is_data_error(&self) -> bool {
        match self {
            StoreError::Query { source, .. } => match source.code() {
                Some(code) => {
                    let class = &code.code()[..2];
                    class == "22" || class == "54"
                }
                None => source
                    .to_string()
                    .starts_with("error serializing parameter"),
            },
            _ => false,
        }
    }
}

/// tokio-postgres says only "db error" for a server error: say what the
/// server said.
fn describe_error(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut text = format!("{} ({})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                text.push_str(": ");
                text.push_str(detail);
            }
            text
        }
        None => error.to_string(),
    }
}

pub(crate) trait QueryContext<T> {
    fn context(self, context: &'static str) -> Result<T, StoreError>;
}

impl<T> QueryContext<T> for Result<T, tokio_postgres::Error> {
    fn context(self, context: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| StoreError::Query { context, source })
    }
}

/// A connection to Laurel's database. A connection that was lost (the
/// server restarted, the backend was terminated) is replaced by
/// [`Store::heal`], which every long-lived holder calls before its work.
pub struct Store {
    client: Client,
    config: Config,
}

fn describe(config: &Config) -> String {
    let hosts = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect::<Vec<_>>()
        .join(",");
    let ports = config
        .get_ports()
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",");
    format!("{hosts}:{ports}/{}", config.get_dbname().unwrap_or("?"))
}

fn parse(url: &str) -> Result<Config, StoreError> {
    url.parse::<Config>()
        .map_err(|source| StoreError::InvalidUrl {
            url: crate::secrets::redact_url(url),
            source,
        })
}

async fn open(
    config: &Config,
) -> Result<
    (
        Client,
        tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>,
    ),
    StoreError,
> {
    config
        .connect(NoTls)
        .await
        .map_err(|source| StoreError::Connect {
            target: describe(config),
            source,
        })
}

impl Store {
    /// Connects to the database at `url`, creating the database first if the
    /// server is there but the database is not.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        let config = parse(url)?;
        let (client, connection) = match open(&config).await {
            Ok(pair) => pair,
            Err(StoreError::Connect { source, .. })
                if source.as_db_error().is_some_and(|e| {
                    e.code() == &tokio_postgres::error::SqlState::UNDEFINED_DATABASE
                }) =>
            {
                create_database(&config).await?;
                open(&config).await?
            }
            Err(error) => return Err(error),
        };
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                warn!(message = "PostgreSQL connection closed.", %error);
            }
        });
        Ok(Store { client, config })
    }

    /// A second connection to the same database (to read one thing while
    /// this one writes another).
    pub async fn another(&self) -> Result<Store, StoreError> {
        let (client, connection) = open(&self.config).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                warn!(message = "PostgreSQL connection closed.", %error);
            }
        });
        Ok(Store {
            client,
            config: self.config.clone(),
        })
    }

    /// Whether the connection is gone (every query would fail).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Reconnects if the connection is gone; returns whether it did.
    pub async fn heal(&mut self) -> Result<bool, StoreError> {
        if !self.client.is_closed() {
            return Ok(false);
        }
        let (client, connection) = open(&self.config).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                warn!(message = "PostgreSQL connection closed.", %error);
            }
        });
        self.client = client;
        info!(message = "Reconnected to PostgreSQL.", target = %describe(&self.config));
        Ok(true)
    }

    /// This store, its connection made again first if it was lost
    /// (PostgreSQL restarted): `store.healed().await?.call()`.
    pub async fn healed(&mut self) -> Result<&mut Store, StoreError> {
        self.heal().await?;
        Ok(self)
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn client_mut(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Applies the embedded migrations that have not been applied yet.
    pub async fn migrate(&mut self) -> Result<Vec<&'static str>, StoreError> {
        migrations::apply(self).await
    }
}

async fn create_database(config: &Config) -> Result<(), StoreError> {
    let name = config.get_dbname().unwrap_or("laurel").to_string();
    let mut admin = config.clone();
    admin.dbname("postgres");
    let (client, connection) = open(&admin).await?;
    let task = tokio::spawn(connection);
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    match client
        .batch_execute(&format!("CREATE DATABASE {quoted}"))
        .await
    {
        Ok(()) => info!(message = "Created the database.", database = %name),
        // Another process created it first.
        Err(error)
            if error.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE) => {}
        Err(source) => {
            return Err(StoreError::Query {
                context: "creating the database",
                source,
            });
        }
    }
    drop(client);
    let _ = task.await;
    Ok(())
}

/// Forwards notifications on `channels` to the returned receiver, over a
/// connection of its own. On a connection loss it reconnects (with backoff)
/// and sends `None`, meaning "notifications may have been missed: reload".
pub async fn listen(
    url: &str,
    channels: &[&str],
) -> Result<mpsc::UnboundedReceiver<Option<(String, String)>>, StoreError> {
    let config = parse(url)?;
    let channels: Vec<String> = channels.iter().map(|c| c.to_string()).collect();
    let (tx, rx) = mpsc::unbounded_channel();
    // The first connection is made here so that a wrong URL fails loudly.
    let first = subscribe(&config, &channels, tx.clone()).await?;
    tokio::spawn(async move {
        let mut session = first;
        let mut backoff = Duration::from_millis(100);
        loop {
            let reason = session.await.unwrap_or_else(|error| error.to_string());
            if tx.is_closed() {
                return;
            }
            warn!(message = "Lost the notification connection; reconnecting.", error = %reason);
            loop {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                match subscribe(&config, &channels, tx.clone()).await {
                    Ok(next) => {
                        session = next;
                        backoff = Duration::from_millis(100);
                        let _ = tx.send(None);
                        break;
                    }
                    Err(error) => warn!(message = "Reconnecting for notifications failed.", %error),
                }
                if tx.is_closed() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// One LISTEN session; the returned task ends with the reason it ended.
async fn subscribe(
    config: &Config,
    channels: &[String],
    tx: mpsc::UnboundedSender<Option<(String, String)>>,
) -> Result<tokio::task::JoinHandle<String>, StoreError> {
    let (client, mut connection) = open(config).await?;
    let client = std::sync::Arc::new(client);
    let session_client = client.clone();
    let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
    // This task polls the connection (which the LISTEN commands below need)
    // and owns a handle to the client: the session lives as long as it does.
    let task = tokio::spawn(async move {
        let _client = session_client;
        loop {
            match messages.next().await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    debug!(
                        message = "Notification.",
                        channel = n.channel(),
                        payload = n.payload()
                    );
                    if tx
                        .send(Some((n.channel().to_string(), n.payload().to_string())))
                        .is_err()
                    {
                        return "listener dropped".to_string();
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => return error.to_string(),
                None => return "connection closed".to_string(),
            }
        }
    });
    for channel in channels {
        client
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .context("subscribing to notifications")?;
    }
    Ok(task)
}
