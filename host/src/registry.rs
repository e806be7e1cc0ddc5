//! Function names -> loaded component versions, kept current while running.
//!
//! The registry loads the current version of every function at start and
//! again whenever a push is announced (PostgreSQL LISTEN/NOTIFY on
//! `laurel_functions`), with a periodic re-sync in case a notification was
//! missed. A [`Binding`] (a function name plus a config) moves to a new
//! version at its next call; a call in flight finishes on the version it
//! started with, because instances hold their version alive.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tracing::{error, info, warn};

use crate::runtime::{
    FilterInstance, Function, FunctionError, FunctionKind, FunctionLimits, LoadError, RuleInstance,
    Runtime, StrategyInstance, TransformInstance,
};
use crate::store::{self, FunctionRow, PushOutcome, Store, StoreError};

/// How often the registry re-reads the table even without a notification.
const RESYNC_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("no function named {name} is registered")]
    NotFound { name: String },
    #[error("function {name} is a {actual}, not a {expected}")]
    WrongKind {
        name: String,
        expected: FunctionKind,
        actual: FunctionKind,
    },
    #[error("function {name} v{version} failed to load: {reason}")]
    Unloadable {
        name: String,
        version: i32,
        reason: String,
    },
    #[error("function {name}: {reason}")]
    Http { name: String, reason: String },
    #[error(transparent)]
    Function(#[from] FunctionError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub struct Registry {
    runtime: Runtime,
    functions: RwLock<HashMap<String, Arc<Function>>>,
    /// Versions that failed to load, by name: (version, reason).
    unloadable: RwLock<HashMap<String, (i32, String)>>,
    /// HTTP functions' live versions, by name: (version, sha256). The API
    /// serves them (`runtime::http`); nothing here calls them.
    http: RwLock<HashMap<String, (i32, String)>>,
    /// Bumped whenever a function changes; bindings compare it per call.
    generation: AtomicU64,
    changed: Notify,
    /// One sync at a time, so an older read never replaces a newer one.
    syncing: tokio::sync::Mutex<()>,
}

impl Registry {
    /// Loads every current function and keeps them current in the background.
    pub async fn start(
        database_url: &str,
        runtime: Runtime,
    ) -> Result<Arc<Registry>, RegistryError> {
        // Listen before the first load, so that no push falls in between.
        let mut notifications = store::listen(database_url, &[store::FUNCTIONS_CHANNEL]).await?;
        let mut store = Store::connect(database_url).await?;
        let registry = Arc::new(Registry {
            runtime: runtime.clone(),
            functions: RwLock::new(HashMap::new()),
            unloadable: RwLock::new(HashMap::new()),
            http: RwLock::new(HashMap::new()),
            generation: AtomicU64::new(0),
            changed: Notify::new(),
            syncing: tokio::sync::Mutex::new(()),
        });
        registry.sync(&store).await?;

        let mut quarantines = runtime.quarantine_reports();
        let weak = Arc::downgrade(&registry);
        tokio::spawn(async move {
            let mut resync = tokio::time::interval(RESYNC_EVERY);
            resync.tick().await;
            loop {
                tokio::select! {
                    notification = notifications.recv() => {
                        if notification.is_none() {
                            return;
                        }
                    }
                    _ = resync.tick() => {}
                    Some(quarantine) = quarantines.recv() => {
                        let recorded = async {
                            store.healed().await?.quarantine_function(&quarantine.name, quarantine.version, &quarantine.reason).await
                        }.await;
                        if let Err(error) = recorded {
                            error!(message = "Failed to record a quarantine.", function = %quarantine.name, %error);
                        }
                        continue;
                    }
                }
                let Some(registry) = weak.upgrade() else {
                    return;
                };
                // Several pushes in a burst: one sync covers them all.
                while let Ok(Some(_)) | Ok(None) = notifications.try_recv() {}
                // A connection lost meanwhile (PostgreSQL restarted) is
                // made again here; the resync timer retries a failure.
                let synced = async { registry.sync(store.healed().await?).await }.await;
                if let Err(error) = synced {
                    warn!(message = "Failed to reload functions; retrying at the next notification or resync.", %error);
                }
            }
        });
        Ok(registry)
    }

    /// Loads what changed in the database now, without waiting for its
    /// notification: after a push in this process, or before checking
    /// definitions that may name a version pushed by another process, so
    /// what a push answered is what the next check sees (read your writes).
    pub async fn sync_now(&self, store: &Store) -> Result<(), RegistryError> {
        self.sync(store).await
    }

    /// Loads what changed since the last sync.
    async fn sync(&self, store: &Store) -> Result<(), RegistryError> {
        let _one_at_a_time = self.syncing.lock().await;
        let rows = store.current_functions().await?;
        let mut changed = false;
        let (http, rows): (Vec<FunctionRow>, Vec<FunctionRow>) = rows
            .into_iter()
            .partition(|row| row.kind == FunctionKind::Http.as_str());
        let http: HashMap<String, (i32, String)> = http
            .into_iter()
            .map(|row| (row.name, (row.version, row.sha256)))
            .collect();
        {
            // A name that was another kind before serves nothing here now.
            let mut functions = self.functions.write().unwrap_or_else(|p| p.into_inner());
            let before = functions.len();
            functions.retain(|name, _| !http.contains_key(name));
            changed |= functions.len() != before;
            let mut served = self.http.write().unwrap_or_else(|p| p.into_inner());
            if *served != http {
                *served = http;
                changed = true;
            }
        }
        for row in rows {
            let loaded = self.get(&row.name);
            if let Some(function) = &loaded
                && function.version == row.version
            {
                if let Some(reason) = &row.quarantine_reason {
                    function.set_quarantined(reason.clone());
                }
                continue;
            }
            if self
                .unloadable
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&row.name)
                .is_some_and(|(v, _)| *v == row.version)
            {
                continue;
            }
            match self.load_row(store, &row).await {
                Ok(function) => {
                    info!(
                        message = "Loaded a function.",
                        function = %function.name,
                        version = function.version,
                        kind = %function.kind,
                        previous = loaded.map(|f| f.version)
                    );
                    self.unloadable
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&row.name);
                    self.functions
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(row.name.clone(), function);
                    changed = true;
                }
                Err(error) => {
                    // The previous version (if any) stays in service.
                    error!(message = "Failed to load a function version.", function = %row.name, version = row.version, %error);
                    self.unloadable
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(row.name.clone(), (row.version, error.to_string()));
                }
            }
        }
        if changed {
            self.generation.fetch_add(1, Ordering::Release);
            self.changed.notify_waiters();
        }
        Ok(())
    }

    async fn load_row(
        &self,
        store: &Store,
        row: &FunctionRow,
    ) -> Result<Arc<Function>, RegistryError> {
        let version = store
            .function_version(&row.name, row.version)
            .await?
            .ok_or_else(|| RegistryError::NotFound {
                name: row.name.clone(),
            })?;
        let expected = FunctionKind::parse(&version.kind);
        let runtime = self.runtime.clone();
        // Compiling is CPU work: keep it off the async workers.
        let function = tokio::task::spawn_blocking(move || {
            runtime.load_with(
                &version.name,
                version.version,
                &version.bytes,
                expected,
                version.limits,
            )
        })
        .await
        .map_err(|e| RegistryError::Unloadable {
            name: row.name.clone(),
            version: row.version,
            reason: e.to_string(),
        })??;
        if let Some(reason) = &row.quarantine_reason {
            function.set_quarantined(reason.clone());
        }
        // The built-ins are bound by most objectives; only pushed
        // components are held to a share of the instance pool.
        if crate::library::is_builtin(&function.sha256) {
            function.unshared();
        }
        Ok(function)
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// A fixed copy of what this registry serves, with each of
    /// `replacements` serving in its name's place: nothing in it moves (no
    /// database, no background sync). A shadow diff binds candidates here.
    pub fn with_replaced(&self, replacements: &[Arc<Function>]) -> Arc<Registry> {
        let mut functions = self
            .functions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for function in replacements {
            functions.insert(function.name.clone(), Arc::clone(function));
        }
        Arc::new(Registry {
            runtime: self.runtime.clone(),
            functions: RwLock::new(functions),
            unloadable: RwLock::new(HashMap::new()),
            http: RwLock::new(HashMap::new()),
            generation: AtomicU64::new(0),
            changed: Notify::new(),
            syncing: tokio::sync::Mutex::new(()),
        })
    }

    /// The current version of `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Function>> {
        self.functions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// The live version of every HTTP function: name -> (version, sha256).
    pub fn http_functions(&self) -> HashMap<String, (i32, String)> {
        self.http.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every loaded function, by name.
    pub fn functions(&self) -> Vec<Arc<Function>> {
        let mut all: Vec<_> = self
            .functions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Versions that are registered but failed to load: (name, version, reason).
    pub fn unloadable(&self) -> Vec<(String, i32, String)> {
        let map = self.unloadable.read().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<_> = map
            .iter()
            .map(|(n, (v, r))| (n.clone(), *v, r.clone()))
            .collect();
        all.sort();
        all
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Resolves once a sync has loaded something new.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    fn resolve(&self, name: &str, expected: FunctionKind) -> Result<Arc<Function>, RegistryError> {
        let function = self.get(name).ok_or_else(|| {
            match self
                .unloadable
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(name)
            {
                Some((version, reason)) => RegistryError::Unloadable {
                    name: name.to_string(),
                    version: *version,
                    reason: reason.clone(),
                },
                None if self
                    .http
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(name) =>
                {
                    RegistryError::WrongKind {
                        name: name.to_string(),
                        expected,
                        actual: FunctionKind::Http,
                    }
                }
                None => RegistryError::NotFound {
                    name: name.to_string(),
                },
            }
        })?;
        if function.kind != expected {
            return Err(RegistryError::WrongKind {
                name: name.to_string(),
                expected,
                actual: function.kind,
            });
        }
        Ok(function)
    }

    /// A filter bound by name: it follows new versions of the function.
    pub fn bind_filter(
        self: &Arc<Self>,
        name: &str,
        config: &str,
    ) -> Result<Binding<FilterInstance>, RegistryError> {
        Binding::new(self, name, config)
    }

    pub fn bind_rule(
        self: &Arc<Self>,
        name: &str,
        config: &str,
    ) -> Result<Binding<RuleInstance>, RegistryError> {
        Binding::new(self, name, config)
    }

    pub fn bind_strategy(
        self: &Arc<Self>,
        name: &str,
        config: &str,
    ) -> Result<Binding<StrategyInstance>, RegistryError> {
        Binding::new(self, name, config)
    }

    pub fn bind_transform(
        self: &Arc<Self>,
        name: &str,
        config: &str,
    ) -> Result<Binding<TransformInstance>, RegistryError> {
        Binding::new(self, name, config)
    }
}

/// Registers `bytes` as a new version of `name` after checking them: size,
/// a valid component, exactly one Laurel world, linkable imports, and (if
/// given) the expected kind, and that it starts within the server's
/// default limits.
pub async fn push(
    store: &mut Store,
    runtime: &Runtime,
    name: &str,
    bytes: &[u8],
    expected: Option<FunctionKind>,
) -> Result<(FunctionKind, PushOutcome), RegistryError> {
    let asked = FunctionLimits::default();
    push_staged(store, runtime, name, bytes, expected, asked, Stage::Live).await
}

/// Whether a pushed version serves at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// It serves from its push on.
    Live,
    /// A candidate: it serves nothing until promoted.
    Shadow,
}

/// [`push`], as a live version or a shadow candidate, to run under the
/// limits it asks for (`asked`, in place of the server's defaults).
pub async fn push_staged(
    store: &mut Store,
    runtime: &Runtime,
    name: &str,
    bytes: &[u8],
    expected: Option<FunctionKind>,
    asked: FunctionLimits,
    stage: Stage,
) -> Result<(FunctionKind, PushOutcome), RegistryError> {
    let kind = match expected {
        Some(FunctionKind::Http) => inspect_http(runtime, name, bytes)?,
        _ => match runtime.inspect(name, bytes, expected, asked) {
            Ok(kind) => kind,
            Err(LoadError::Http { .. }) => inspect_http(runtime, name, bytes)?,
            // The awards' engine compiles no WASIp3 component: it may be
            // an HTTP function still (then what is wrong with it is told).
            Err(error @ LoadError::Invalid { .. }) if expected.is_none() => {
                use crate::runtime::http::Unservable;
                // (Its size was checked before it was found invalid.)
                match crate::runtime::http::inspect(name, bytes) {
                    Ok(_) => FunctionKind::Http,
                    Err(Unservable::Invalid(_)) => return Err(error.into()),
                    Err(Unservable::Refused(reason)) => {
                        return Err(RegistryError::Http {
                            name: name.to_string(),
                            reason,
                        });
                    }
                }
            }
            Err(error) => return Err(error.into()),
        },
    };
    if kind == FunctionKind::Http && !asked.is_default() {
        return Err(RegistryError::Http {
            name: name.to_string(),
            reason: format!(
                "an HTTP function runs under the server's limits (LAUREL_HTTP_FUNCTION_TIMEOUT_MS per request, \
                 LAUREL_FUNCTION_MEMORY_MIB), not its own: push it without {asked}"
            ),
        });
    }
    let sha256 = hex::encode(Sha256::digest(bytes));
    let pushed = crate::store::Pushing {
        name,
        kind: kind.as_str(),
        sha256: &sha256,
        bytes,
        limits: asked,
        builtin: false,
    };
    let outcome = store.push_function(pushed, stage == Stage::Shadow).await?;
    Ok((kind, outcome))
}

/// Checks `bytes` as an HTTP function (size, a valid component, a
/// wasi:http handler, imports the API provides).
fn inspect_http(
    runtime: &Runtime,
    name: &str,
    bytes: &[u8],
) -> Result<FunctionKind, RegistryError> {
    let limit = runtime.limits().component_bytes;
    if bytes.len() > limit {
        return Err(LoadError::TooLarge {
            name: name.to_string(),
            size: bytes.len(),
            limit,
        }
        .into());
    }
    use crate::runtime::http::Unservable;
    match crate::runtime::http::inspect(name, bytes) {
        Ok(_) => Ok(FunctionKind::Http),
        Err(Unservable::Invalid(reason) | Unservable::Refused(reason)) => {
            Err(RegistryError::Http {
                name: name.to_string(),
                reason,
            })
        }
    }
}

/// What a [`Binding`] can hold.
pub trait BoundInstance: Sized {
    const KIND: FunctionKind;
    fn create(function: Arc<Function>, config: &str) -> Result<Self, FunctionError>;
    fn function(&self) -> &Arc<Function>;
}

impl BoundInstance for FilterInstance {
    const KIND: FunctionKind = FunctionKind::Filter;
    fn create(function: Arc<Function>, config: &str) -> Result<Self, FunctionError> {
        FilterInstance::new(function, config)
    }
    fn function(&self) -> &Arc<Function> {
        FilterInstance::function(self)
    }
}

impl BoundInstance for RuleInstance {
    const KIND: FunctionKind = FunctionKind::Rule;
    fn create(function: Arc<Function>, config: &str) -> Result<Self, FunctionError> {
        RuleInstance::new(function, config)
    }
    fn function(&self) -> &Arc<Function> {
        RuleInstance::function(self)
    }
}

impl BoundInstance for TransformInstance {
    const KIND: FunctionKind = FunctionKind::Transform;
    fn create(function: Arc<Function>, config: &str) -> Result<Self, FunctionError> {
        TransformInstance::new(function, config)
    }
    fn function(&self) -> &Arc<Function> {
        TransformInstance::function(self)
    }
}

impl BoundInstance for StrategyInstance {
    const KIND: FunctionKind = FunctionKind::Strategy;
    fn create(function: Arc<Function>, config: &str) -> Result<Self, FunctionError> {
        StrategyInstance::new(function, config)
    }
    fn function(&self) -> &Arc<Function> {
        StrategyInstance::function(self)
    }
}

/// A function name and a config, bound to the name's current version.
pub struct Binding<I> {
    registry: Arc<Registry>,
    name: String,
    config: String,
    instance: I,
    generation: u64,
}

impl<I: BoundInstance> Binding<I> {
    fn new(registry: &Arc<Registry>, name: &str, config: &str) -> Result<Self, RegistryError> {
        let generation = registry.generation();
        let function = registry.resolve(name, I::KIND)?;
        let instance = I::create(function, config)?;
        Ok(Binding {
            registry: registry.clone(),
            name: name.to_string(),
            config: config.to_string(),
            instance,
            generation,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version the binding is on now (without moving to a newer one).
    pub fn current_function(&self) -> &Arc<Function> {
        self.instance.function()
    }

    /// The instance of the current version: a version pushed since the last
    /// call takes over here. If the new version rejects this config, the
    /// binding stays on the version it has (and says so in the log).
    pub fn instance(&mut self) -> &mut I {
        let generation = self.registry.generation();
        if generation != self.generation {
            self.generation = generation;
            if let Ok(current) = self.registry.resolve(&self.name, I::KIND)
                && !Arc::ptr_eq(&current, self.instance.function())
            {
                let (from, to) = (self.instance.function().version, current.version);
                match I::create(current, &self.config) {
                    Ok(instance) => {
                        info!(message = "Binding moved to a new function version.", function = %self.name, from, to);
                        self.instance = instance;
                    }
                    Err(error) => {
                        error!(message = "New function version refused a bound config; staying on the old one.", function = %self.name, from, to, %error);
                    }
                }
            }
        }
        &mut self.instance
    }
}
