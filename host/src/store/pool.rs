//! A small pool of connections for request handlers: each request borrows
//! a connection of its own (a transaction needs one), and a broken
//! connection is replaced on the next checkout instead of failing every
//! request after a PostgreSQL restart.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{Store, StoreError};

pub struct StorePool {
    url: String,
    idle: Mutex<Vec<Store>>,
    /// One permit per connection that may exist.
    permits: Arc<Semaphore>,
    checkout_timeout: Duration,
}

/// Why no connection could be had.
#[derive(Debug, thiserror::Error)]
pub enum StorePoolError {
    #[error("every database connection is busy (waited {0:?})")]
    Busy(Duration),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl StorePool {
    /// A pool of at most `size` connections to `url`; none is opened yet.
    pub fn new(url: &str, size: usize) -> StorePool {
        StorePool {
            url: url.to_string(),
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(size.max(1))),
            checkout_timeout: Duration::from_secs(5),
        }
    }

    /// A connection, reused if an idle one is still open, else a new one.
    pub async fn get(&self) -> Result<PooledStore<'_>, StorePoolError> {
        let permit =
            tokio::time::timeout(self.checkout_timeout, self.permits.clone().acquire_owned())
                .await
                .map_err(|_| StorePoolError::Busy(self.checkout_timeout))?
                .expect("the pool's semaphore is never closed");
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let mut found = None;
            while let Some(store) = idle.pop() {
                if !store.client().is_closed() {
                    found = Some(store);
                    break;
                }
            }
            found
        };
        let store = match reused {
            Some(store) => store,
            None => Store::connect(&self.url).await?,
        };
        Ok(PooledStore {
            pool: self,
            store: Some(store),
            _permit: permit,
        })
    }
}

/// A borrowed connection; back to the pool when dropped.
pub struct PooledStore<'a> {
    pool: &'a StorePool,
    store: Option<Store>,
    _permit: OwnedSemaphorePermit,
}

impl Deref for PooledStore<'_> {
    type Target = Store;
    fn deref(&self) -> &Store {
        self.store.as_ref().expect("present until dropped")
    }
}

impl DerefMut for PooledStore<'_> {
    fn deref_mut(&mut self) -> &mut Store {
        self.store.as_mut().expect("present until dropped")
    }
}

impl Drop for PooledStore<'_> {
    fn drop(&mut self) {
        if let Some(store) = self.store.take()
            && !store.client().is_closed()
        {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(store);
        }
    }
}
