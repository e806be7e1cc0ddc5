//! The Wasm sandbox: engine, limits, compiled-artifact cache, and calls into
//! filter, rule, strategy and transform components.
//!
//! **Architecture Invariant:** only this module imports `wasmtime`. The rest
//! of the host sees [`Function`] (a loaded component version), the typed
//! instances ([`FilterInstance`], [`RuleInstance`], [`StrategyInstance`],
//! [`TransformInstance`]) and [`FunctionError`].
//!
//! Every call runs under a CPU budget (epoch deadline), a memory limit
//! (resource limiter; the pooling allocator caps it too) and output limits.
//! A trap replaces the instance; a version that fails
//! [`Limits::quarantine_after`] times in a row is quarantined: its calls fail
//! fast with [`FunctionError::Quarantined`] until a new version is pushed.

mod bindings;
mod cache;
mod event;
mod guest_output;
pub mod http;
mod instance;
mod records;
mod sandbox;
mod ticker;

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tracing::error;
use wasmtime::component::{Component, Linker, ResourceTable, types::ComponentItem};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

pub use bindings::{Contribution, Counter, ObjectiveState, Progress};
pub use event::{Event, Field, Scalar};
pub use instance::{
    Answer, FilterInstance, RuleInstance, StrategyInstance, TransformInstance, Transformed,
};
pub use records::{PackedRecords, RawRecord};

use self::cache::CompileCache;
use self::guest_output::GuestOutput;

/// What a component is for, recognised from the interface it exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FunctionKind {
    Filter,
    Rule,
    Strategy,
    /// The pre-filter's: raw records to events.
    Transform,
    /// Serves HTTP requests (a wasi:http handler, as Spin builds them) for
    /// the `spin.toml` component of its name.
    Http,
}

impl FunctionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FunctionKind::Filter => "filter",
            FunctionKind::Rule => "rule",
            FunctionKind::Strategy => "strategy",
            FunctionKind::Transform => "transform",
            FunctionKind::Http => "http",
        }
    }

    pub fn parse(kind: &str) -> Option<FunctionKind> {
        match kind {
            "filter" => Some(FunctionKind::Filter),
            "rule" => Some(FunctionKind::Rule),
            "strategy" => Some(FunctionKind::Strategy),
            "transform" => Some(FunctionKind::Transform),
            "http" => Some(FunctionKind::Http),
            _ => None,
        }
    }
}

impl fmt::Display for FunctionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Per-function limits. The defaults suit the built-in library with room to
/// spare.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Functions")]
pub struct Limits {
    /// CPU time one function call (one batch) may take, in milliseconds.
    #[arg(
        id = "function_cpu_ms",
        long = "function-cpu-ms",
        env = "LAUREL_FUNCTION_CPU_MS",
        default_value = "100",
        value_parser = crate::settings::positive_millis,
        value_name = "MS"
    )]
    pub cpu_budget: Duration,
    /// Memory one function instance may grow to, in MiB.
    #[arg(
        id = "function_memory_mib",
        long = "function-memory-mib",
        env = "LAUREL_FUNCTION_MEMORY_MIB",
        default_value = "64",
        value_parser = crate::settings::mebibytes,
        value_name = "MIB"
    )]
    pub memory_bytes: usize,
    /// The most CPU time a function may ask for at its push
    /// (`--cpu-ms`), in milliseconds (at least `--function-cpu-ms`).
    #[arg(
        id = "function_max_cpu_ms",
        long = "function-max-cpu-ms",
        env = "LAUREL_FUNCTION_MAX_CPU_MS",
        default_value = "2000",
        value_parser = crate::settings::positive_millis,
        value_name = "MS"
    )]
    pub max_cpu_budget: Duration,
    /// The most memory a function may ask for at its push
    /// (`--memory-mib`), in MiB (at least `--function-memory-mib`): the
    /// size of every slot of the instance pool (address space reserved,
    /// not memory used).
    #[arg(
        id = "function_max_memory_mib",
        long = "function-max-memory-mib",
        env = "LAUREL_FUNCTION_MAX_MEMORY_MIB",
        default_value = "512",
        value_parser = crate::settings::mebibytes,
        value_name = "MIB"
    )]
    pub max_memory_bytes: usize,
    /// Largest component accepted, in MiB (a Python component carries its
    /// interpreter: about 18 MiB).
    #[arg(
        id = "function_max_mib",
        long = "function-max-mib",
        env = "LAUREL_FUNCTION_MAX_MIB",
        default_value = "32",
        value_parser = crate::settings::mebibytes,
        value_name = "MIB"
    )]
    pub component_bytes: usize,
    /// Instances alive at once (pooling allocator slots).
    #[arg(skip = 1000u32)]
    pub instances: u32,
    /// Instances one pushed function version may hold alive at once (one
    /// per objective, pipeline or award it is bound to): its share of the
    /// pool of 1,000, so that no function leaves too few for the others.
    /// Built-in functions are not limited.
    #[arg(
        long = "function-instances",
        env = "LAUREL_FUNCTION_INSTANCES",
        default_value_t = 250,
        value_parser = clap::value_parser!(u32).range(1..=1000),
        value_name = "INSTANCES"
    )]
    pub instances_per_function: u32,
    /// Consecutive failures (trap, timeout, memory, invalid output) after
    /// which a function version is quarantined.
    #[arg(
        long = "function-quarantine-after",
        env = "LAUREL_FUNCTION_QUARANTINE_AFTER",
        default_value_t = 5,
        value_parser = clap::value_parser!(u32).range(1..),
        value_name = "FAILURES"
    )]
    pub quarantine_after: u32,
    /// Names each compiled function's code in `/tmp/perf-<pid>.map`, so
    /// `perf` shows a component's own functions (a transform's scan, the
    /// SDK's loop) by name rather than as addresses.
    #[arg(
        long = "function-perf-map",
        env = "LAUREL_FUNCTION_PERF_MAP",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub perf_map: bool,
    /// Counters one contribution may name.
    #[arg(skip = 64usize)]
    pub max_counters: usize,
    /// Longest string a function may return (names, error texts).
    #[arg(skip = 4096usize)]
    pub max_text_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

/// What one function version asks for at its push, in place of the
/// server's defaults ([`Limits::cpu_budget`], [`Limits::memory_bytes`]);
/// at most the server's ceilings. A Python or JavaScript function carries
/// an interpreter: it may need a longer budget for a large batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FunctionLimits {
    /// CPU time one call (one batch) may take, in milliseconds.
    pub cpu_ms: Option<u32>,
    /// Memory one instance may grow to, in MiB.
    pub memory_mib: Option<u32>,
}

impl FunctionLimits {
    pub fn is_default(&self) -> bool {
        *self == FunctionLimits::default()
    }
}

impl fmt::Display for FunctionLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(ms) = self.cpu_ms {
            parts.push(format!("CPU {ms} ms"));
        }
        if let Some(mib) = self.memory_mib {
            parts.push(format!("memory {mib} MiB"));
        }
        if parts.is_empty() {
            f.write_str("the server's defaults")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// The limits one loaded function version runs under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Effective {
    pub cpu_budget: Duration,
    pub memory_bytes: usize,
}

impl Limits {
    /// What `asked` comes to on this server: its own values where it has
    /// them, the defaults elsewhere; refused over a ceiling.
    pub fn effective(&self, name: &str, asked: FunctionLimits) -> Result<Effective, LoadError> {
        let over = |what: String| LoadError::OverLimit {
            name: name.to_string(),
            reason: what,
        };
        match asked.cpu_ms {
            Some(0) => return Err(over("it asks for a CPU budget of 0 ms".into())),
            Some(ms) if Duration::from_millis(ms.into()) > self.max_cpu_budget => {
                return Err(over(format!(
                    "it asks for a CPU budget of {ms} ms, over this server's ceiling of {} ms (LAUREL_FUNCTION_MAX_CPU_MS)",
                    self.max_cpu_budget.as_millis()
                )));
            }
            _ => {}
        }
        match asked.memory_mib {
            Some(0) => return Err(over("it asks for 0 MiB of memory".into())),
            Some(mib) if (mib as usize).saturating_mul(1 << 20) > self.max_memory_bytes => {
                return Err(over(format!(
                    "it asks for {mib} MiB of memory, over this server's ceiling of {} MiB (LAUREL_FUNCTION_MAX_MEMORY_MIB)",
                    self.max_memory_bytes >> 20
                )));
            }
            _ => {}
        }
        Ok(self.resolve(asked))
    }

    /// What `asked` comes to, unchecked ([`Limits::effective`] checks;
    /// a stored version was checked at its push).
    pub fn resolve(&self, asked: FunctionLimits) -> Effective {
        Effective {
            cpu_budget: asked
                .cpu_ms
                .map_or(self.cpu_budget, |ms| Duration::from_millis(ms.into())),
            memory_bytes: asked.memory_mib.map_or(self.memory_bytes, |mib| {
                (mib as usize).saturating_mul(1 << 20)
            }),
        }
    }
}

/// One instance's place in its function's share of the pool, given back
/// when the instance is dropped.
struct InstanceShare(Arc<Function>);

impl Drop for InstanceShare {
    fn drop(&mut self) {
        self.0.alive.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why loading a component failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("component {name} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        name: String,
        size: usize,
        limit: usize,
    },
    #[error("component {name} is refused: {reason}")]
    OverLimit { name: String, reason: String },
    #[error("component {name} cannot start within its limits: {reason}")]
    Unstartable { name: String, reason: String },
    #[error("component {name} is not a valid Wasm component: {reason}")]
    Invalid { name: String, reason: String },
    #[error(
        "component {name} exports none of the Laurel worlds (filter: {FILTER}, rule: {RULE}, strategy: {STRATEGY}, transform: {TRANSFORM}); \
         it exports: {exports}",
        FILTER = bindings::FILTER_EXPORT,
        RULE = bindings::RULE_EXPORT,
        STRATEGY = bindings::STRATEGY_EXPORT,
        TRANSFORM = bindings::TRANSFORM_EXPORT
    )]
    UnknownKind { name: String, exports: String },
    #[error(
        "component {name} exports more than one Laurel world ({kinds}); a function has one kind"
    )]
    AmbiguousKind { name: String, kinds: String },
    #[error("component {name} is a {actual}, but it is registered as a {expected}")]
    WrongKind {
        name: String,
        expected: FunctionKind,
        actual: FunctionKind,
    },
    #[error("component {name} cannot be linked: {reason}")]
    Link { name: String, reason: String },
    #[error(
        "component {name} is an HTTP function: it serves the requests spin.toml routes to its component of that name, not awards"
    )]
    Http { name: String },
}

/// Why a call into a function failed. Each names the function and version.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FunctionError {
    #[error("function {name} v{version} rejected its config: {reason}")]
    Config {
        name: String,
        version: i32,
        reason: String,
    },
    #[error("function {name} v{version} exceeded its CPU budget of {budget_ms} ms")]
    Timeout {
        name: String,
        version: i32,
        budget_ms: u128,
    },
    #[error("function {name} v{version} exceeded its memory limit: {reason}")]
    Memory {
        name: String,
        version: i32,
        reason: String,
    },
    #[error("function {name} v{version} trapped: {reason}")]
    Trap {
        name: String,
        version: i32,
        reason: String,
    },
    #[error("function {name} v{version} returned an invalid result: {reason}")]
    InvalidOutput {
        name: String,
        version: i32,
        reason: String,
    },
    #[error("function {name} v{version} is quarantined: {reason}")]
    Quarantined {
        name: String,
        version: i32,
        reason: String,
    },
    #[error("function {name} v{version} could not be instantiated: {reason}")]
    Instantiate {
        name: String,
        version: i32,
        reason: String,
    },
    #[error("function {name} v{version} was not called: {reason}")]
    Input {
        name: String,
        version: i32,
        reason: String,
    },
    #[error(
        "function {name} v{version} could not be instantiated: it has {share} instances alive, its share of \
         the instance pool (LAUREL_FUNCTION_INSTANCES); bind it to fewer objectives or raise its share"
    )]
    Share {
        name: String,
        version: i32,
        share: u32,
    },
}

impl FunctionError {
    /// Failures count towards quarantine; a rejected config does not (it is
    /// the award's mistake, reported when the award is applied).
    fn counts_as_failure(&self) -> bool {
        !matches!(
            self,
            FunctionError::Config { .. }
                | FunctionError::Quarantined { .. }
                | FunctionError::Input { .. }
                | FunctionError::Share { .. }
        )
    }
}

/// A quarantine, for whoever records it (the registry writes it to the
/// database).
#[derive(Debug, Clone)]
pub struct Quarantine {
    pub name: String,
    pub version: i32,
    pub reason: String,
}

/// The sandbox. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    /// Advances the engine's epoch while a guest runs.
    ticker: Arc<ticker::Ticker>,
    linker: Linker<GuestState>,
    limits: Limits,
    cache: Option<CompileCache>,
    quarantines: Mutex<Option<mpsc::UnboundedSender<Quarantine>>>,
}

/// What one component may define, in all its modules: more is refused at
/// instantiation (the pool's slots are shared by every function).
pub(crate) const MAX_MEMORIES_PER_COMPONENT: u32 = 4;
pub(crate) const MAX_TABLES_PER_COMPONENT: u32 = 16;
pub(crate) const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 64;

/// Epoch ticks per second; a call's deadline is its budget in ticks.
const TICK: Duration = Duration::from_millis(2);

impl Runtime {
    /// Builds the engine for the synchronous worlds. `cache_dir`: where
    /// compiled artifacts are kept across restarts (`None`: compile always).
    pub fn new(mut limits: Limits, cache_dir: Option<PathBuf>) -> anyhow::Result<Runtime> {
        // A ceiling is at least the default under it.
        limits.max_cpu_budget = limits.max_cpu_budget.max(limits.cpu_budget);
        limits.max_memory_bytes = limits.max_memory_bytes.max(limits.memory_bytes);
        let mut config = Config::new();
        // The filter/rule/strategy worlds are synchronous: without
        // concurrency support each call is cheaper (pitfalls: ~25%).
        config.concurrency_support(false);
        config.epoch_interruption(true);
        if limits.perf_map {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(limits.instances)
            .total_core_instances(limits.instances.saturating_mul(8))
            .total_memories(limits.instances.saturating_mul(2))
            .total_tables(limits.instances.saturating_mul(4))
            // One component cannot take more than its share of the pool's
            // memories, tables and instances (a Rust, Python or JS function
            // has one memory and a few tables; more is refused at
            // instantiation, with why).
            .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
            .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
            .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
            // Every slot fits the largest memory a function may ask for.
            .max_memory_size(limits.max_memory_bytes)
            .max_unused_warm_slots(limits.instances.min(100));
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config)
            .map_err(|e| anyhow::anyhow!("failed to create the Wasm engine: {e}"))?;

        let mut linker = Linker::new(&engine);
        // Even pure wasm32-wasip2 guests import wasi:cli and wasi:io; none
        // of it may block (sandbox.rs).
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .and_then(|()| sandbox::refuse_sleep(&mut linker))
            .map_err(|e| anyhow::anyhow!("failed to link WASI: {e}"))?;
        // The shared types interface has no functions; it only needs to exist.
        linker
            .instance(bindings::TYPES_IMPORT)
            .map_err(|e| anyhow::anyhow!("failed to define {}: {e}", bindings::TYPES_IMPORT))?;

        let cache = cache_dir.and_then(|dir| CompileCache::new(dir, &engine));
        let ticker = ticker::Ticker::start(&engine, TICK, "laurel-wasm-epoch");
        let inner = Arc::new(Inner {
            engine,
            ticker,
            linker,
            limits,
            cache,
            quarantines: Mutex::new(None),
        });
        Ok(Runtime { inner })
    }

    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Where quarantines are reported (one receiver; a later call replaces it).
    pub fn quarantine_reports(&self) -> mpsc::UnboundedReceiver<Quarantine> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self
            .inner
            .quarantines
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(tx);
        rx
    }

    /// The kind of a component, checking it on the way: size, validity,
    /// exactly one Laurel world, that its imports can be satisfied, and
    /// that it starts (instantiates) within the limits it asks for.
    /// `expected`: the kind it must be, if known.
    pub fn inspect(
        &self,
        name: &str,
        bytes: &[u8],
        expected: Option<FunctionKind>,
        asked: FunctionLimits,
    ) -> Result<FunctionKind, LoadError> {
        let function = self.load_with(name, 0, bytes, expected, asked)?;
        function.start().map_err(|error| LoadError::Unstartable {
            name: name.to_string(),
            reason: error.to_string(),
        })?;
        Ok(function.kind)
    }

    /// [`Runtime::load_with`] the server's default limits.
    pub fn load(
        &self,
        name: &str,
        version: i32,
        bytes: &[u8],
        expected: Option<FunctionKind>,
    ) -> Result<Arc<Function>, LoadError> {
        self.load_with(name, version, bytes, expected, FunctionLimits::default())
    }

    /// Loads (compiles, or takes from the cache) a component version, to
    /// run under the limits it asks for. `expected`: the kind it is
    /// registered as, if known. The compiled artifact is found by the
    /// sha256 of `bytes`, computed here: two different components never
    /// share one.
    pub fn load_with(
        &self,
        name: &str,
        version: i32,
        bytes: &[u8],
        expected: Option<FunctionKind>,
        asked: FunctionLimits,
    ) -> Result<Arc<Function>, LoadError> {
        let limits = self.inner.limits.effective(name, asked)?;
        let limit = self.inner.limits.component_bytes;
        if bytes.len() > limit {
            return Err(LoadError::TooLarge {
                name: name.to_string(),
                size: bytes.len(),
                limit,
            });
        }
        let sha256 = hex::encode(Sha256::digest(bytes));
        let sha256 = sha256.as_str();
        let component = match &self.inner.cache {
            Some(cache) => cache.load_or_compile(sha256, bytes),
            None => Component::new(&self.inner.engine, bytes),
        }
        .map_err(|e| LoadError::Invalid {
            name: name.to_string(),
            reason: format!("{e:#}"),
        })?;

        let kind = kind_of(name, &component, &self.inner.engine)?;
        if let Some(expected) = expected
            && expected != kind
        {
            return Err(LoadError::WrongKind {
                name: name.to_string(),
                expected,
                actual: kind,
            });
        }
        // Served by the HTTP functions' own engine, never called here.
        let http = || LoadError::Http {
            name: name.to_string(),
        };
        if kind == FunctionKind::Http {
            return Err(http());
        }
        let link_error = |e: wasmtime::Error| LoadError::Link {
            name: name.to_string(),
            reason: format!("{e:#}"),
        };
        let pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(link_error)?;
        let pre = match kind {
            FunctionKind::Filter => Pre::Filter(
                bindings::Scoped::new(
                    pre,
                    bindings::filters::GuestIndices::new,
                    bindings::FILTER_SCOPE_EXPORT,
                    bindings::filter_scope::GuestIndices::new,
                )
                .map_err(link_error)?,
            ),
            FunctionKind::Rule => Pre::Rule(bindings::rule::RulePre::new(pre).map_err(link_error)?),
            FunctionKind::Strategy => {
                Pre::Strategy(bindings::strategy::StrategyPre::new(pre).map_err(link_error)?)
            }
            FunctionKind::Transform => Pre::Transform(
                bindings::Scoped::new(
                    pre,
                    bindings::transforms::GuestIndices::new,
                    bindings::TRANSFORM_SCOPE_EXPORT,
                    bindings::transform_scope::GuestIndices::new,
                )
                .map_err(link_error)?,
            ),
            FunctionKind::Http => return Err(http()),
        };
        Ok(Arc::new(Function {
            name: name.to_string(),
            version,
            sha256: sha256.to_string(),
            kind,
            limits,
            pre,
            failures: AtomicU32::new(0),
            quarantine: OnceLock::new(),
            alive: AtomicU32::new(0),
            shared: std::sync::atomic::AtomicBool::new(true),
            runtime: self.inner.clone(),
        }))
    }
}

fn kind_of(name: &str, component: &Component, engine: &Engine) -> Result<FunctionKind, LoadError> {
    let ty = component.component_type();
    let mut kinds = Vec::new();
    let mut exports = Vec::new();
    for (export, item) in ty.exports(engine) {
        exports.push(export.to_string());
        if !matches!(item.ty, ComponentItem::ComponentInstance(_)) {
            continue;
        }
        match export {
            bindings::FILTER_EXPORT => kinds.push(FunctionKind::Filter),
            bindings::RULE_EXPORT => kinds.push(FunctionKind::Rule),
            bindings::STRATEGY_EXPORT => kinds.push(FunctionKind::Strategy),
            bindings::TRANSFORM_EXPORT => kinds.push(FunctionKind::Transform),
            http if http == "wasi:http/handler@0.3.0"
                || http.starts_with("wasi:http/incoming-handler@0.2") =>
            {
                kinds.push(FunctionKind::Http)
            }
            _ => {}
        }
    }
    match kinds.as_slice() {
        [kind] => Ok(*kind),
        [] => Err(LoadError::UnknownKind {
            name: name.to_string(),
            exports: if exports.is_empty() {
                "nothing".into()
            } else {
                exports.join(", ")
            },
        }),
        many => Err(LoadError::AmbiguousKind {
            name: name.to_string(),
            kinds: many
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

enum Pre {
    Filter(
        bindings::Scoped<
            bindings::filters::GuestIndices,
            bindings::filter_scope::GuestIndices,
            GuestState,
        >,
    ),
    Rule(bindings::rule::RulePre<GuestState>),
    Strategy(bindings::strategy::StrategyPre<GuestState>),
    Transform(
        bindings::Scoped<
            bindings::transforms::GuestIndices,
            bindings::transform_scope::GuestIndices,
            GuestState,
        >,
    ),
}

/// One loaded component version: compiled, linked, ready to instantiate.
/// Instances hold an `Arc` of it, so a call in flight finishes on the
/// version it started with while a newer one takes over.
pub struct Function {
    pub name: String,
    pub version: i32,
    pub sha256: String,
    pub kind: FunctionKind,
    /// What the limits its push asked for come to here.
    pub limits: Effective,
    pre: Pre,
    failures: AtomicU32,
    quarantine: OnceLock<String>,
    /// Instances of this version alive, and whether they count against
    /// [`Limits::instances_per_function`] (a built-in's do not).
    alive: AtomicU32,
    shared: std::sync::atomic::AtomicBool,
    runtime: Arc<Inner>,
}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("kind", &self.kind)
            .field("sha256", &self.sha256)
            .finish_non_exhaustive()
    }
}

impl Function {
    /// The reason this version was quarantined, if it was.
    pub fn quarantined(&self) -> Option<&str> {
        self.quarantine.get().map(String::as_str)
    }

    /// Quarantines this version (also used when the database says it was
    /// quarantined by another process).
    pub fn set_quarantined(&self, reason: String) -> bool {
        self.quarantine.set(reason).is_ok()
    }

    /// Lets this version's instances use the pool beyond a share: for the
    /// built-in functions, which the binary carries (one memory each).
    pub fn unshared(&self) {
        self.shared.store(false, Ordering::Relaxed);
    }

    /// Instances of this version alive now.
    pub fn instances_alive(&self) -> u32 {
        self.alive.load(Ordering::Relaxed)
    }

    /// One more instance of this version, within its share of the pool.
    fn take_instance(self: &Arc<Self>) -> Result<InstanceShare, FunctionError> {
        let share = self.runtime.limits.instances_per_function;
        let shared = self.shared.load(Ordering::Relaxed);
        self.alive
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |alive| {
                (!shared || alive < share).then_some(alive + 1)
            })
            .map_err(|_| FunctionError::Share {
                name: self.name.clone(),
                version: self.version,
                share,
            })?;
        Ok(InstanceShare(self.clone()))
    }

    fn record(&self, outcome: &Result<(), FunctionError>) {
        match outcome {
            Ok(()) => {
                if self.failures.load(Ordering::Relaxed) != 0 {
                    self.failures.store(0, Ordering::Relaxed);
                }
            }
            Err(error) if error.counts_as_failure() => {
                let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                let limit = self.runtime.limits.quarantine_after;
                if failures >= limit {
                    let reason = format!("{failures} consecutive failures, the last: {error}");
                    if self.set_quarantined(reason.clone()) {
                        error!(
                            message = "Function quarantined.",
                            function = %self.name,
                            version = self.version,
                            error = %reason
                        );
                        let sender = self
                            .runtime
                            .quarantines
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .clone();
                        if let Some(sender) = sender {
                            let _ = sender.send(Quarantine {
                                name: self.name.clone(),
                                version: self.version,
                                reason,
                            });
                        }
                    }
                }
            }
            Err(_) => {}
        }
    }
}

/// What a guest's store holds.
pub(crate) struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryLimiter,
    stderr: GuestOutput,
    /// Reset before every call (sandbox.rs).
    random: sandbox::SeededRandom,
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl GuestState {
    /// The state of an instance of the component with this sha256.
    fn new(memory_bytes: usize, sha256: &str) -> GuestState {
        let stderr = GuestOutput::new(2048);
        // No environment, arguments, files or network, fixed clocks and
        // seeded random: a function sees only what it is called with. Its
        // stderr is kept (the tail) so a panic message can be reported.
        let random = sandbox::SeededRandom::for_component(sha256);
        let wasi = sandbox::wasi_ctx(stderr.clone(), &random);
        GuestState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(memory_bytes),
            stderr,
            random,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("tried to grow its memories to {desired} bytes in all, over the limit of {limit} bytes")]
struct MemoryLimitExceeded {
    desired: usize,
    limit: usize,
}

/// The instance's memory limit, over all of its linear memories together
/// (a component may define several; each alone within the limit is not
/// enough).
pub(crate) struct MemoryLimiter {
    limit: usize,
    /// The sizes of the instance's memories together, as granted.
    used: usize,
    /// The growth granted last, taken back if it failed.
    granted: usize,
}

impl MemoryLimiter {
    /// The instance's memories' sizes together, as granted.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    pub(crate) fn new(limit: usize) -> MemoryLimiter {
        MemoryLimiter {
            limit,
            used: 0,
            granted: 0,
        }
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let growth = desired.saturating_sub(current);
        let total = self.used.saturating_add(growth);
        if total > self.limit {
            return Err(wasmtime::Error::new(MemoryLimitExceeded {
                desired: total,
                limit: self.limit,
            }));
        }
        self.used = total;
        self.granted = growth;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.used = self.used.saturating_sub(self.granted);
        self.granted = 0;
        Ok(())
    }

    // Per store, so per instance: the same caps as the pool's per
    // component, also for HTTP functions (allocated on demand).
    fn memories(&self) -> usize {
        MAX_MEMORIES_PER_COMPONENT as usize
    }

    fn tables(&self) -> usize {
        MAX_TABLES_PER_COMPONENT as usize
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES_PER_COMPONENT as usize
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::ResourceLimiter;

    use super::*;

    const MIB: usize = 1 << 20;

    /// The limit holds over all of an instance's memories together: two
    /// memories of 40 MiB do not fit in 64, whichever grows; a growth that
    /// failed is given back.
    #[test]
    fn the_memory_limit_counts_every_memory_of_the_instance() {
        let mut limiter = MemoryLimiter::new(64 * MIB);
        assert!(limiter.memory_growing(0, 40 * MIB, None).unwrap());
        let refused = limiter.memory_growing(0, 40 * MIB, None).unwrap_err();
        assert_eq!(
            refused.to_string(),
            format!(
                "tried to grow its memories to {} bytes in all, over the limit of {} bytes",
                80 * MIB,
                64 * MIB
            )
        );
        // The first grows on to the limit, then fails for other reasons.
        assert!(limiter.memory_growing(40 * MIB, 64 * MIB, None).unwrap());
        limiter
            .memory_grow_failed(wasmtime::Error::msg("no"))
            .unwrap();
        assert!(limiter.memory_growing(0, 24 * MIB, None).unwrap());
        assert!(limiter.memory_growing(0, 1, None).is_err());
        assert_eq!(limiter.memories(), 4);
    }
}
