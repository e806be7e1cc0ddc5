//! The award catalog: the enabled award definitions, kept current in every
//! running process (NOTIFY on `laurel_awards`, plus a periodic re-read).
//! Consumers compare [`Catalog::generation`] per batch and rebuild their
//! plans when it moves, so a change takes effect without a restart.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tracing::{info, warn};

use crate::definitions::AwardDefinition;
use crate::store::{self, Store, StoreError};

/// The catalog as of one load.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The enabled award definitions.
    pub awards: Arc<Vec<AwardDefinition>>,
    /// Every stored award's version, enabled or not.
    pub versions: HashMap<String, i32>,
}

const RESYNC_EVERY: Duration = Duration::from_secs(30);

pub struct Catalog {
    state: RwLock<Arc<Snapshot>>,
    /// One reload at a time, so an older read never replaces a newer one.
    reloading: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

impl Catalog {
    pub async fn start(database_url: &str) -> Result<Arc<Catalog>, StoreError> {
        let mut notifications = store::listen(database_url, &[store::AWARDS_CHANNEL]).await?;
        let mut store = Store::connect(database_url).await?;
        let catalog = Arc::new(Catalog {
            state: RwLock::new(Arc::new(Snapshot::default())),
            reloading: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        });
        catalog.reload(&store).await?;
        let weak = Arc::downgrade(&catalog);
        tokio::spawn(async move {
            let mut resync = tokio::time::interval(RESYNC_EVERY);
            resync.tick().await;
            loop {
                tokio::select! {
                    notification = notifications.recv() => if notification.is_none() { return },
                    _ = resync.tick() => {}
                }
                while notifications.try_recv().is_ok() {}
                let Some(catalog) = weak.upgrade() else {
                    return;
                };
                // A connection lost meanwhile (PostgreSQL restarted) is
                // made again here; the resync timer retries a failure.
                let reloaded = async { catalog.reload(store.healed().await?).await }.await;
                if let Err(error) = reloaded {
                    warn!(message = "Failed to reload award definitions; retrying at the next notification or resync.", %error);
                }
            }
        });
        Ok(catalog)
    }

    /// Reads the definitions again now (a worker that finds its versions
    /// behind the database's does not wait for the notification).
    pub async fn reload(&self, store: &Store) -> Result<(), StoreError> {
        let _one_at_a_time = self.reloading.lock().await;
        let rows = store.awards().await?;
        let versions: HashMap<String, i32> =
            rows.iter().map(|r| (r.id.clone(), r.version)).collect();
        let mut awards = Vec::new();
        for row in rows.into_iter().filter(|r| r.enabled) {
            match serde_json::from_value::<AwardDefinition>(row.definition) {
                Ok(award) => awards.push(award),
                Err(error) => {
                    warn!(message = "Ignoring an unreadable award definition.", award = %row.id, %error)
                }
            }
        }
        let changed = {
            let current = self.snapshot();
            *current.awards != awards || current.versions != versions
        };
        if changed {
            info!(message = "Award definitions loaded.", awards = awards.len());
            *self.state.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Snapshot {
                awards: Arc::new(awards),
                versions,
            });
            self.generation.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }

    pub fn awards(&self) -> Arc<Vec<AwardDefinition>> {
        self.snapshot().awards.clone()
    }

    /// The enabled definitions and every stored award's version, as of one
    /// load.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}
