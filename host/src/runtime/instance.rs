//! Instances of a function version created from one config: the resource
//! the guest made from that config, in a store of its own, called per batch.

use std::collections::BTreeSet;
use std::sync::Arc;

use wasmtime::Store;
use wasmtime::component::ResourceAny;

use crate::metrics;

use super::bindings::{self, Contribution, ObjectiveState, Progress};
use super::event::{Event, pack};
use super::records::{PackedRecords, RawRecord};
use super::{Function, FunctionError, GuestState, InstanceShare, MemoryLimitExceeded, Pre, TICK};

/// Least time given to instantiate a component and create it from its
/// config (a call gets its CPU budget).
const INSTANTIATE_AT_LEAST: std::time::Duration = std::time::Duration::from_secs(1);

/// A world's bindings: how to instantiate it and create its resource.
trait World: Sized + Send + Sync {
    fn instantiate(pre: &Pre, store: &mut Store<GuestState>) -> wasmtime::Result<Self>;
    fn create(
        &self,
        store: &mut Store<GuestState>,
        config: &str,
    ) -> wasmtime::Result<Result<ResourceAny, String>>;
}

/// A filter's exports: `filters`, and `filter-scope` if it has it (a
/// filter built before `filter-scope` existed does not).
struct FilterWorld {
    filters: bindings::filters::Guest,
    scope: Option<bindings::filter_scope::Guest>,
}

impl World for FilterWorld {
    fn instantiate(pre: &Pre, store: &mut Store<GuestState>) -> wasmtime::Result<Self> {
        let Pre::Filter(pre) = pre else {
            unreachable!("a filter instance is only made from a filter")
        };
        let instance = pre.pre.instantiate(&mut *store)?;
        Ok(FilterWorld {
            filters: pre.required.load(&mut *store, &instance)?,
            scope: pre
                .optional
                .as_ref()
                .map(|scope| scope.load(&mut *store, &instance))
                .transpose()?,
        })
    }

    fn create(
        &self,
        store: &mut Store<GuestState>,
        config: &str,
    ) -> wasmtime::Result<Result<ResourceAny, String>> {
        self.filters.filter().call_create(store, config)
    }
}

impl World for bindings::rule::Rule {
    fn instantiate(pre: &Pre, store: &mut Store<GuestState>) -> wasmtime::Result<Self> {
        match pre {
            Pre::Rule(pre) => pre.instantiate(store),
            _ => unreachable!("a rule instance is only made from a rule"),
        }
    }

    fn create(
        &self,
        store: &mut Store<GuestState>,
        config: &str,
    ) -> wasmtime::Result<Result<ResourceAny, String>> {
        self.laurel_award_rules().rule().call_create(store, config)
    }
}

/// What one record of a batch became (a record that made no event has
/// none): `transform-scope`'s `answer`.
pub use bindings::transform_scope::Answer;

/// A transform's exports: `transforms`, and `transform-scope` if it has
/// it (a transform built before `transform-scope` existed does not).
struct TransformWorld {
    transforms: bindings::transforms::Guest,
    scope: Option<bindings::transform_scope::Guest>,
}

impl World for TransformWorld {
    fn instantiate(pre: &Pre, store: &mut Store<GuestState>) -> wasmtime::Result<Self> {
        let Pre::Transform(pre) = pre else {
            unreachable!("a transform instance is only made from a transform")
        };
        let instance = pre.pre.instantiate(&mut *store)?;
        Ok(TransformWorld {
            transforms: pre.required.load(&mut *store, &instance)?,
            scope: pre
                .optional
                .as_ref()
                .map(|scope| scope.load(&mut *store, &instance))
                .transpose()?,
        })
    }

    fn create(
        &self,
        store: &mut Store<GuestState>,
        config: &str,
    ) -> wasmtime::Result<Result<ResourceAny, String>> {
        self.transforms.transform().call_create(store, config)
    }
}

impl World for bindings::strategy::Strategy {
    fn instantiate(pre: &Pre, store: &mut Store<GuestState>) -> wasmtime::Result<Self> {
        match pre {
            Pre::Strategy(pre) => pre.instantiate(store),
            _ => unreachable!("a strategy instance is only made from a strategy"),
        }
    }

    fn create(
        &self,
        store: &mut Store<GuestState>,
        config: &str,
    ) -> wasmtime::Result<Result<ResourceAny, String>> {
        self.laurel_award_strategies()
            .strategy()
            .call_create(store, config)
    }
}

struct Live<W> {
    store: Store<GuestState>,
    world: W,
    resource: ResourceAny,
    /// Given back after the store is dropped (fields drop in order).
    _share: InstanceShare,
}

/// A function version plus a config, and the live instance (re-made after a
/// trap: a trapped instance refuses further calls).
struct Slot<W> {
    function: Arc<Function>,
    config: String,
    live: Option<Live<W>>,
}

/// A new instance of `function` in a store of its own, within its limits
/// and its share of the pool, its resource not yet created.
fn start<W: World>(
    function: &Arc<Function>,
    budget_ticks: u64,
) -> Result<(Store<GuestState>, W, InstanceShare), FunctionError> {
    let inner = &function.runtime;
    let share = function.take_instance()?;
    let mut store = Store::new(
        &inner.engine,
        GuestState::new(function.limits.memory_bytes, &function.sha256),
    );
    store.limiter(|state| &mut state.limiter);
    // What the host copies out of one answer (every string and list
    // element, as it is lifted) is bounded by the function's memory:
    // an answer whose strings all point at the same bytes is refused
    // while it is read, not after (`classify`).
    store.set_hostcall_fuel(function.limits.memory_bytes);
    // Instantiating and creating from config get at least a second:
    // the deadline counts wall time (epochs), and on a loaded machine
    // setting up an instance can take longer than one call's budget
    // (seen: strategies failing "could not be instantiated: interrupt"
    // for every user of a cycle). It happens once per instance; a
    // creation that loops still ends.
    let setup_ticks = (INSTANTIATE_AT_LEAST.as_micros() / TICK.as_micros()) as u64 + 1;
    store.set_epoch_deadline(budget_ticks.max(setup_ticks));
    let _running = inner.ticker.running();
    let (pre, store_ref) = (&function.pre, &mut store);
    let world = outside_async(move || W::instantiate(pre, store_ref)).map_err(|error| {
        match error
            .chain()
            .find_map(|e| e.downcast_ref::<MemoryLimitExceeded>())
        {
            // Its initial memories are over its limit.
            Some(memory) => FunctionError::Memory {
                name: function.name.clone(),
                version: function.version,
                reason: memory.to_string(),
            },
            None => FunctionError::Instantiate {
                name: function.name.clone(),
                version: function.version,
                reason: format!("{error:#}"),
            },
        }
    })?;
    Ok((store, world, share))
}

impl Function {
    /// Instantiates this version once, as a call would, and drops the
    /// instance: whether it starts within its limits (a push checks).
    pub fn start(self: &Arc<Self>) -> Result<(), FunctionError> {
        let ticks = deadline_ticks(self.limits.cpu_budget);
        match self.kind {
            super::FunctionKind::Filter => start::<FilterWorld>(self, ticks).map(drop),
            super::FunctionKind::Rule => start::<bindings::rule::Rule>(self, ticks).map(drop),
            super::FunctionKind::Strategy => {
                start::<bindings::strategy::Strategy>(self, ticks).map(drop)
            }
            super::FunctionKind::Transform => start::<TransformWorld>(self, ticks).map(drop),
            super::FunctionKind::Http => Ok(()),
        }
    }
}

/// Ticks of one call's CPU budget (wall time, counted in epochs).
fn deadline_ticks(budget: std::time::Duration) -> u64 {
    (budget.as_micros() / TICK.as_micros()).max(1) as u64 + 1
}

impl<W: World> Slot<W> {
    fn new(function: Arc<Function>, config: &str) -> Result<Slot<W>, FunctionError> {
        let mut slot = Slot {
            function,
            config: config.to_string(),
            live: None,
        };
        slot.ensure_live()?;
        Ok(slot)
    }

    fn deadline_ticks(&self) -> u64 {
        deadline_ticks(self.function.limits.cpu_budget)
    }

    fn ensure_live(&mut self) -> Result<&mut Live<W>, FunctionError> {
        if self.live.is_none() {
            let live = self.instantiate();
            if let Err(error) = &live {
                self.function.record(&Err(error.clone()));
            }
            self.live = Some(live?);
        }
        Ok(self.live.as_mut().expect("just made"))
    }

    fn instantiate(&self) -> Result<Live<W>, FunctionError> {
        let function = &self.function;
        let (mut store, world, share) = start::<W>(function, self.deadline_ticks())?;
        let (config, store_ref, world_ref) = (self.config.as_str(), &mut store, &world);
        match outside_async(move || world_ref.create(store_ref, config)) {
            Ok(Ok(resource)) => Ok(Live {
                store,
                world,
                resource,
                _share: share,
            }),
            Ok(Err(reason)) => Err(FunctionError::Config {
                name: function.name.clone(),
                version: function.version,
                reason: truncate(reason, function.runtime.limits.max_text_bytes),
            }),
            Err(error) => {
                let stderr = store.data().stderr.take();
                Err(classify(function, error, stderr))
            }
        }
    }

    /// Runs one call under the CPU budget. A trap drops the instance.
    fn run<R>(
        &mut self,
        call: impl FnOnce(&W, &mut Store<GuestState>, ResourceAny) -> wasmtime::Result<R> + Send,
    ) -> Result<R, FunctionError>
    where
        R: Send,
    {
        let function = Arc::clone(&self.function);
        let _span = tracing::info_span!(
            "function",
            name = %function.name,
            version = function.version,
            kind = function.kind.as_str()
        )
        .entered();
        let labels = [
            ("function", function.name.as_str()),
            ("kind", function.kind.as_str()),
        ];
        metrics::add(metrics::FUNCTION_CALLS, &labels, 1);
        if let Some(reason) = self.function.quarantined() {
            let error = FunctionError::Quarantined {
                name: self.function.name.clone(),
                version: self.function.version,
                reason: reason.to_string(),
            };
            count_error(&self.function, &error);
            return Err(error);
        }
        let ticks = self.deadline_ticks();
        let live = match self.ensure_live() {
            Ok(live) => live,
            Err(error) => {
                count_error(&self.function, &error);
                return Err(error);
            }
        };
        live.store.set_epoch_deadline(ticks);
        live.store.data().random.reseed();
        let (world, store, resource) = (&live.world, &mut live.store, live.resource);
        let started = std::time::Instant::now();
        let running = function.runtime.ticker.running();
        let result = outside_async(move || call(world, store, resource));
        drop(running);
        metrics::observe(metrics::FUNCTION_SECONDS, &labels, started.elapsed());
        match result {
            Ok(value) => Ok(value),
            Err(error) => {
                let stderr = live.store.data().stderr.take();
                let error = classify(&self.function, error, stderr);
                self.live = None;
                self.function.record(&Err(error.clone()));
                count_error(&self.function, &error);
                Err(error)
            }
        }
    }

    fn invalid(&self, reason: String) -> FunctionError {
        let error = FunctionError::InvalidOutput {
            name: self.function.name.clone(),
            version: self.function.version,
            reason,
        };
        self.function.record(&Err(error.clone()));
        count_error(&self.function, &error);
        error
    }

    fn pack<'a>(
        &self,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<(bindings::types::EventBatch, usize), FunctionError> {
        pack(events).ok_or_else(|| FunctionError::Input {
            name: self.function.name.clone(),
            version: self.function.version,
            reason: "the batch's text is over 4 GiB: send smaller batches".to_string(),
        })
    }

    /// The live instance's linear memories together, in bytes (0 when
    /// none is live).
    fn memory_bytes(&self) -> usize {
        self.live
            .as_ref()
            .map_or(0, |live| live.store.data().limiter.used())
    }

    fn succeeded(&self) {
        self.function.record(&Ok(()));
    }
}

/// `laurel_function_errors_total{function, kind, error}`.
fn count_error(function: &Function, error: &FunctionError) {
    let what = match error {
        FunctionError::Trap { .. } => "trap",
        FunctionError::Timeout { .. } => "timeout",
        FunctionError::Memory { .. } => "memory",
        FunctionError::InvalidOutput { .. } => "invalid_output",
        FunctionError::Quarantined { .. } => "quarantined",
        _ => "other",
    };
    metrics::add(
        metrics::FUNCTION_ERRORS,
        &[
            ("function", function.name.as_str()),
            ("kind", function.kind.as_str()),
            ("error", what),
        ],
        1,
    );
}

/// Runs a guest call where WASI's synchronous host calls may block: they
/// drive futures with `Handle::block_on`, which panics on a thread that is
/// running async tasks. Callers should call from a blocking thread (e.g.
/// `spawn_blocking`), where this costs nothing; from an async task this
/// steps out of it (`block_in_place`), or, on a current-thread runtime,
/// onto a scoped thread.
fn outside_async<R: Send>(call: impl FnOnce() -> R + Send) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Err(_) => call(),
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::CurrentThread => {
            std::thread::scope(|scope| {
                scope
                    .spawn(call)
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
        }
        Ok(_) => tokio::task::block_in_place(call),
    }
}

fn classify(function: &Function, error: wasmtime::Error, stderr: String) -> FunctionError {
    let (name, version) = (function.name.clone(), function.version);
    if let Some(memory) = error
        .chain()
        .find_map(|e| e.downcast_ref::<MemoryLimitExceeded>())
    {
        return FunctionError::Memory {
            name,
            version,
            reason: memory.to_string(),
        };
    }
    if error
        .chain()
        .any(|e| e.to_string().contains(HOSTCALL_FUEL_EXHAUSTED))
    {
        return FunctionError::InvalidOutput {
            name,
            version,
            reason: answer_too_large(function.limits.memory_bytes),
        };
    }
    let trap = error
        .chain()
        .find_map(|e| e.downcast_ref::<wasmtime::Trap>())
        .copied();
    if trap == Some(wasmtime::Trap::Interrupt) {
        return FunctionError::Timeout {
            name,
            version,
            budget_ms: function.limits.cpu_budget.as_millis(),
        };
    }
    let mut reason = match trap {
        Some(trap) => trap.to_string(),
        None => error.root_cause().to_string(),
    };
    if !stderr.is_empty() {
        reason.push_str("; the function wrote: ");
        reason.push_str(&stderr);
    }
    FunctionError::Trap {
        name,
        version,
        reason: truncate(reason, function.runtime.limits.max_text_bytes),
    }
}

/// How wasmtime says a lift ran out of hostcall fuel (its error type is
/// private); `hostile.rs` holds the text to the version in use.
const HOSTCALL_FUEL_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";

pub(super) fn answer_too_large(limit: usize) -> String {
    format!(
        "its answer is over {limit} bytes as read by the host (its strings and lists together, \
         counted as they are read; the limit is the function's memory: its push's --memory-mib, \
         or LAUREL_FUNCTION_MEMORY_MIB)"
    )
}

fn truncate(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// Most names a function may declare it reads (a filter's sources or
/// event types, a strategy's objectives).
pub const MAX_DECLARED: usize = 1000;

/// A declared list of names, checked: at most [`MAX_DECLARED`], each a
/// name as events and awards have them (1 to 256 bytes, no control
/// characters). Every plan and query is built from these lists.
fn declared(names: &[String], what: &str) -> Result<(), String> {
    if names.len() > MAX_DECLARED {
        return Err(format!(
            "{} {what} declared, over the limit of {MAX_DECLARED}",
            names.len()
        ));
    }
    for (n, name) in names.iter().enumerate() {
        if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
            return Err(format!(
                "{what}[{n}] is not a name (1 to 256 bytes, no control characters): {:?}",
                truncate(name.clone(), 64)
            ));
        }
    }
    Ok(())
}

/// A filter created from one config.
pub struct FilterInstance {
    slot: Slot<FilterWorld>,
    sources: Option<Vec<String>>,
    event_types: Option<Vec<String>>,
}

impl FilterInstance {
    /// Instantiates `function` and creates the filter from `config`; a
    /// config the function rejects is [`FunctionError::Config`].
    pub fn new(function: Arc<Function>, config: &str) -> Result<FilterInstance, FunctionError> {
        let mut slot: Slot<FilterWorld> = Slot::new(function, config)?;
        let sources = slot
            .run(|world, store, resource| world.filters.filter().call_sources(store, resource))?;
        let config = slot.config.clone();
        let event_types = slot.run(move |world, store, _| match &world.scope {
            Some(scope) => scope.call_event_types(store, &config),
            None => Ok(None),
        })?;
        if let Some(list) = &sources {
            declared(list, "sources").map_err(|reason| slot.invalid(reason))?;
        }
        if let Some(list) = &event_types {
            declared(list, "event_types").map_err(|reason| slot.invalid(reason))?;
        }
        Ok(FilterInstance {
            slot,
            sources,
            event_types,
        })
    }

    pub fn function(&self) -> &Arc<Function> {
        &self.slot.function
    }

    /// The memory its instance holds now, all its memories together.
    pub fn memory_bytes(&self) -> usize {
        self.slot.memory_bytes()
    }

    /// The sources this filter can match (`None`: any).
    pub fn sources(&self) -> Option<&[String]> {
        self.sources.as_deref()
    }

    /// The event types this filter can match (`None`: any, or the filter
    /// does not say).
    pub fn event_types(&self) -> Option<&[String]> {
        self.event_types.as_deref()
    }

    /// One answer per event.
    pub fn matches<'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<Vec<bool>, FunctionError> {
        let (batch, count) = self.slot.pack(events)?;
        let answers = self.slot.run(|world, store, resource| {
            world.filters.filter().call_matches(store, resource, &batch)
        })?;
        if answers.len() != count {
            return Err(self
                .slot
                .invalid(format!("{} answers for {count} events", answers.len())));
        }
        self.slot.succeeded();
        Ok(answers)
    }
}

/// A rule created from one config.
pub struct RuleInstance {
    slot: Slot<bindings::rule::Rule>,
}

impl RuleInstance {
    pub fn new(function: Arc<Function>, config: &str) -> Result<RuleInstance, FunctionError> {
        Ok(RuleInstance {
            slot: Slot::new(function, config)?,
        })
    }

    pub fn function(&self) -> &Arc<Function> {
        &self.slot.function
    }

    /// The memory its instance holds now, all its memories together.
    pub fn memory_bytes(&self) -> usize {
        self.slot.memory_bytes()
    }

    /// One answer per event: `Ok(None)` when the rule ignores the event,
    /// `Err(reason)` when the rule says the event is unusable.
    pub fn contribute<'a>(
        &mut self,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<Vec<Result<Option<Contribution>, String>>, FunctionError> {
        let (batch, count) = self.slot.pack(events)?;
        let answers = self.slot.run(|world, store, resource| {
            world
                .laurel_award_rules()
                .rule()
                .call_contribute(store, resource, &batch)
        })?;
        if answers.len() != count {
            return Err(self
                .slot
                .invalid(format!("{} answers for {count} events", answers.len())));
        }
        let limits = &self.slot.function.runtime.limits;
        let mut checked = Vec::with_capacity(answers.len());
        for answer in answers {
            match answer {
                Ok(Some(contribution)) => {
                    if let Err(reason) = check_contribution(
                        &contribution,
                        limits.max_counters,
                        limits.max_text_bytes,
                    ) {
                        return Err(self.slot.invalid(reason));
                    }
                    checked.push(Ok(Some(contribution)));
                }
                Ok(None) => checked.push(Ok(None)),
                Err(reason) => checked.push(Err(truncate(reason, limits.max_text_bytes))),
            }
        }
        self.slot.succeeded();
        Ok(checked)
    }
}

/// Longest de-duplication key a rule may return, in bytes.
pub const MAX_DEDUP_KEY_BYTES: usize = 512;

fn check_contribution(
    contribution: &Contribution,
    max_counters: usize,
    max_text: usize,
) -> Result<(), String> {
    if contribution.counters.len() > max_counters {
        return Err(format!(
            "a contribution names {} counters, over the limit of {max_counters}",
            contribution.counters.len()
        ));
    }
    for counter in &contribution.counters {
        if counter.name.is_empty() || counter.name.len() > 128 {
            return Err(format!(
                "counter name of {} bytes (must be 1 to 128)",
                counter.name.len()
            ));
        }
        if counter.name.contains('\0') {
            return Err("a counter name contains a NUL character".to_string());
        }
    }
    if let Some(key) = &contribution.dedup_key {
        // Stored in an index beside the user's and the item's ids.
        let max = max_text.min(MAX_DEDUP_KEY_BYTES);
        if key.is_empty() || key.len() > max {
            return Err(format!(
                "de-duplication key of {} bytes (must be 1 to {max})",
                key.len()
            ));
        }
        if key.contains('\0') {
            return Err("the de-duplication key contains a NUL character".to_string());
        }
    }
    Ok(())
}

/// A strategy created from one config (the award's strategy tree).
pub struct StrategyInstance {
    slot: Slot<bindings::strategy::Strategy>,
    objectives: Vec<String>,
}

impl StrategyInstance {
    pub fn new(function: Arc<Function>, config: &str) -> Result<StrategyInstance, FunctionError> {
        let mut slot: Slot<bindings::strategy::Strategy> = Slot::new(function, config)?;
        let objectives = slot.run(|world, store, resource| {
            world
                .laurel_award_strategies()
                .strategy()
                .call_objectives(store, resource)
        })?;
        declared(&objectives, "objectives").map_err(|reason| slot.invalid(reason))?;
        Ok(StrategyInstance { slot, objectives })
    }

    pub fn function(&self) -> &Arc<Function> {
        &self.slot.function
    }

    /// The objective ids the strategy's config refers to.
    pub fn objectives(&self) -> &[String] {
        &self.objectives
    }

    /// One answer per user.
    pub fn evaluate(
        &mut self,
        users: &[Vec<ObjectiveState>],
    ) -> Result<Vec<Result<Progress, String>>, FunctionError> {
        let answers = self.slot.run(|world, store, resource| {
            world
                .laurel_award_strategies()
                .strategy()
                .call_evaluate(store, resource, users)
        })?;
        if answers.len() != users.len() {
            return Err(self.slot.invalid(format!(
                "{} answers for {} users",
                answers.len(),
                users.len()
            )));
        }
        let max_text = self.slot.function.runtime.limits.max_text_bytes;
        let mut checked = Vec::with_capacity(answers.len());
        for answer in answers {
            match answer {
                Ok(p) if !(p.progress.is_finite() && p.goal.is_finite()) => {
                    return Err(self.slot.invalid(format!(
                        "non-finite progress {} / goal {}",
                        p.progress, p.goal
                    )));
                }
                Ok(p) => checked.push(Ok(p)),
                Err(reason) => checked.push(Err(truncate(reason, max_text))),
            }
        }
        self.slot.succeeded();
        Ok(checked)
    }
}

/// An event a transform made (its source is the pipeline's).
pub type Transformed = bindings::transform::exports::laurel::award::transforms::Envelope;

/// Most events one raw record may become.
pub const MAX_EVENTS_PER_RECORD: usize = 1000;

/// A transform created from one config (a pipeline's).
pub struct TransformInstance {
    slot: Slot<TransformWorld>,
}

impl TransformInstance {
    pub fn new(function: Arc<Function>, config: &str) -> Result<TransformInstance, FunctionError> {
        Ok(TransformInstance {
            slot: Slot::new(function, config)?,
        })
    }

    pub fn function(&self) -> &Arc<Function> {
        &self.slot.function
    }

    /// One answer per record of `topic`: the events it becomes (none, one
    /// or more), or why it is malformed.
    pub fn apply(
        &mut self,
        topic: &str,
        records: &[RawRecord<'_>],
    ) -> Result<Vec<Result<Vec<Transformed>, String>>, FunctionError> {
        self.apply_for_types(topic, records, None)
    }

    /// As [`TransformInstance::apply`], where only events of `types` (none:
    /// every type) need be made: a transform with `transform-scope` may
    /// leave the others out; one without makes them all.
    pub fn apply_for_types(
        &mut self,
        topic: &str,
        records: &[RawRecord<'_>],
        types: Option<&BTreeSet<String>>,
    ) -> Result<Vec<Result<Vec<Transformed>, String>>, FunctionError> {
        let packed = PackedRecords::of(topic, records).ok_or_else(|| FunctionError::Input {
            name: self.slot.function.name.clone(),
            version: self.slot.function.version,
            reason: "the batch's bytes are over 4 GiB: send smaller batches".to_string(),
        })?;
        let mut every: Vec<_> = (0..records.len()).map(|_| Ok(Vec::new())).collect();
        for answer in self.apply_packed(&packed, types)? {
            every[answer.index as usize] = answer.events;
        }
        Ok(every)
    }

    /// As [`TransformInstance::apply_for_types`], on records packed as they
    /// were read; answered for the records that made events or are
    /// malformed only, in order (a record not named made none).
    pub fn apply_packed(
        &mut self,
        records: &PackedRecords,
        types: Option<&BTreeSet<String>>,
    ) -> Result<Vec<Answer>, FunctionError> {
        let types: Option<Vec<String>> = types.map(|t| t.iter().cloned().collect());
        let batch = records.batch();
        let count = records.len();
        let answers = self.slot.run(move |world, store, resource| {
            // Lent, not copied: the batch crosses into the guest's memory
            // from where it was packed.
            match (&world.scope, types) {
                (Some(scope), Some(types)) => scope
                    .call_apply_for_types(store, resource, batch, Some(&types))
                    .map(Ok),
                // One without `transform-scope` answers every record.
                _ => world
                    .transforms
                    .transform()
                    .call_apply(store, resource, batch)
                    .map(|every| sparse(every, count)),
            }
        })?;
        let mut answers = answers.map_err(|reason| self.slot.invalid(reason))?;
        let max_text = self.slot.function.runtime.limits.max_text_bytes;
        let mut next = 0;
        for Answer { index, events } in &mut answers {
            let at = *index as usize;
            if at >= count {
                return Err(self
                    .slot
                    .invalid(format!("an answer for record {at} of a batch of {count}")));
            }
            if at < next {
                return Err(self.slot.invalid(format!(
                    "an answer for record {at} after one for record {}: one answer a record at most, in the batch's order",
                    next - 1
                )));
            }
            next = at + 1;
            match events {
                Ok(events) if events.len() > MAX_EVENTS_PER_RECORD => {
                    return Err(self.slot.invalid(format!(
                        "{} events from one record, over the limit of {MAX_EVENTS_PER_RECORD}",
                        events.len()
                    )));
                }
                Ok(_) => {}
                Err(reason) => *reason = truncate(std::mem::take(reason), max_text),
            }
        }
        // A record named with no event made none, as one not named: each
        // is counted once, as dropped.
        answers.retain(|answer| !matches!(&answer.events, Ok(events) if events.is_empty()));
        self.slot.succeeded();
        Ok(answers)
    }
}

/// `apply`'s answer for each of `count` records, as `apply-for-types`
/// gives it (the records that made no event left out); or what is wrong
/// with it.
fn sparse(
    every: Vec<Result<Vec<Transformed>, String>>,
    count: usize,
) -> Result<Vec<Answer>, String> {
    if every.len() != count {
        return Err(format!("{} answers for {count} records", every.len()));
    }
    Ok((0u32..)
        .zip(every)
        .filter(|(_, events)| !matches!(events, Ok(made) if made.is_empty()))
        .map(|(index, events)| Answer { index, events })
        .collect())
}
