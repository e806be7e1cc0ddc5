//! Benchmark: the per-event cost of a chain of 3 built-in filters + 1 rule
//! through Wasm, against the same logic compiled natively (the very same
//! function crates, linked into this binary), measured in the same run.
//! Also: instantiate time, and (with a database) hot-swap latency.
//!
//! cargo bench -p laurel --bench wasm_chain
//!
//! Each figure is the median of several rounds; native and Wasm rounds
//! alternate so both see the same machine state. Reported as ratios.

use std::hint::black_box;
use std::time::{Duration, Instant};

use laurel::event::Envelope;
use laurel::registry::{self, Registry};
use laurel::runtime::{Event, FilterInstance, Limits, RuleInstance, Runtime};
use laurel_guest::{Filter as _, Rule as _};

#[path = "support/row.rs"]
mod row;
use row::row;

const EVENTS: usize = 1000;
const ROUNDS: usize = 15;

const SOURCE: &str = r#"{"sources": ["reviews"]}"#;
const TYPES: &str = r#"{"types": ["review.created", "review.updated"]}"#;
const LENGTH: &str = r#"{"allowed_length": 100}"#;

/// A mixed stream: reviews (long and short) and photos.
fn stream() -> Vec<Vec<u8>> {
    (0..EVENTS)
        .map(|i| {
            let (source, kind) = if i % 4 == 3 { ("photos", "photo.status_changed") } else { ("reviews", "review.created") };
            let text = if i % 3 == 0 { "short".to_string() } else { "a fine review of a fine place ".repeat(5) };
            format!(
                r#"{{"id":"evt-{i}","source":"{source}","type":"{kind}","user_id":"u-{}","authorized":true,"content_id":"c-{i}","status":"active","occurred_at":"2026-12-01T10:00:00Z","payload":{{"object_id":"firm-{}","text":"{text}","rating":4}}}}"#,
                i % 97,
                i % 13
            )
            .into_bytes()
        })
        .collect()
}

/// The native form of a batch: the guest SDK's own batch, read as views.
fn native_batch<'a>(
    envelopes: impl IntoIterator<Item = &'a Envelope>,
) -> laurel_guest::wit::EventBatch {
    let mut builder = laurel_guest::BatchBuilder::new();
    for e in envelopes {
        builder.push(
            &e.id,
            &e.source,
            &e.event_type,
            &e.user_id,
            e.content_id.as_deref(),
            e.status.as_deref(),
            e.occurred_at.timestamp_millis(),
            &serde_json::Value::Object(e.payload.clone()),
        );
    }
    builder.finish()
}

struct Native {
    source: source_filter::SourceFilter,
    types: event_type_filter::EventTypeFilter,
    length: reviews_length_filter::ReviewsLengthFilter,
    rule: review_unique_by_object_rule::ReviewUniqueByObjectRule,
}

impl Native {
    fn run(&self, batch: &laurel_guest::wit::EventBatch) -> usize {
        let mut counted = 0;
        for event in laurel_guest::events(batch) {
            if self.source.matches(&event)
                && self.types.matches(&event)
                && self.length.matches(&event)
                && let Ok(Some(c)) = self.rule.contribute(&event)
            {
                counted += c.counters.len();
            }
        }
        counted
    }
}

struct Wasm {
    source: FilterInstance,
    types: FilterInstance,
    length: FilterInstance,
    rule: RuleInstance,
}

impl Wasm {
    /// Batch calls; each filter sees only the events the previous passed.
    fn run(&mut self, events: &[Event]) -> usize {
        let mut passing: Vec<&Event> = events.iter().collect();
        for filter in [&mut self.source, &mut self.types, &mut self.length] {
            let keep = filter.matches(passing.iter().copied()).expect("filter");
            let mut keep = keep.into_iter();
            passing.retain(|_| keep.next().unwrap_or(false));
        }
        self.rule
            .contribute(passing)
            .expect("rule")
            .into_iter()
            .filter_map(|r| r.ok().flatten())
            .map(|c| c.counters.len())
            .sum()
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn per_event(d: Duration) -> f64 {
    d.as_nanos() as f64 / EVENTS as f64
}

fn main() {
    let runtime = Runtime::new(Limits::default(), None).expect("runtime");
    let load = |name: &str| {
        let b = laurel::library::builtin(name).unwrap();
        runtime.load(name, 1, b.bytes, Some(b.kind)).unwrap()
    };
    let native = Native {
        source: source_filter::SourceFilter::from_config(SOURCE).unwrap(),
        types: event_type_filter::EventTypeFilter::from_config(TYPES).unwrap(),
        length: reviews_length_filter::ReviewsLengthFilter::from_config(LENGTH).unwrap(),
        rule: review_unique_by_object_rule::ReviewUniqueByObjectRule::from_config("{}").unwrap(),
    };
    let mut wasm = Wasm {
        source: FilterInstance::new(load("SourceFilter"), SOURCE).unwrap(),
        types: FilterInstance::new(load("EventTypeFilter"), TYPES).unwrap(),
        length: FilterInstance::new(load("ReviewsLengthFilter"), LENGTH).unwrap(),
        rule: RuleInstance::new(load("ReviewUniqueByObjectRule"), "{}").unwrap(),
    };
    let raw = stream();
    let envelopes: Vec<Envelope> = raw.iter().map(|b| Envelope::parse(b).unwrap()).collect();
    let native_events = native_batch(&envelopes);
    let wasm_events: Vec<_> = envelopes.iter().map(Envelope::to_function_event).collect();
    assert_eq!(
        native.run(&native_events),
        wasm.run(&wasm_events),
        "both paths agree"
    );

    let (mut n_full, mut w_full, mut n_chain, mut w_chain) = (vec![], vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        // From the bytes read off Kafka to contributions.
        let t = Instant::now();
        let decoded: Vec<_> = raw.iter().map(|b| Envelope::parse(b).unwrap()).collect();
        black_box(native.run(&native_batch(&decoded)));
        n_full.push(t.elapsed());
        let t = Instant::now();
        let events: Vec<_> = raw
            .iter()
            .map(|b| Envelope::parse(b).unwrap().to_function_event())
            .collect();
        black_box(wasm.run(&events));
        w_full.push(t.elapsed());
        // The chain alone, events already decoded.
        let t = Instant::now();
        black_box(native.run(&native_events));
        n_chain.push(t.elapsed());
        let t = Instant::now();
        black_box(wasm.run(&wasm_events));
        w_chain.push(t.elapsed());
    }
    let (nf, wf, nc, wc) = (
        median(n_full),
        median(w_full),
        median(n_chain),
        median(w_chain),
    );
    println!(
        "Chain: SourceFilter -> EventTypeFilter -> ReviewsLengthFilter -> ReviewUniqueByObjectRule, {EVENTS} events per batch, median of {ROUNDS} rounds"
    );
    println!(
        "  from bytes to contributions: native {:8.0} ns/event, wasm {:8.0} ns/event, ratio {:.2}x",
        per_event(nf),
        per_event(wf),
        wf.as_secs_f64() / nf.as_secs_f64()
    );
    println!(
        "  chain only (decoded events): native {:8.0} ns/event, wasm {:8.0} ns/event, ratio {:.2}x",
        per_event(nc),
        per_event(wc),
        wc.as_secs_f64() / nc.as_secs_f64()
    );
    row(
        "wasm_chain",
        "Kafka bytes to contributions, 3 filters and a rule in Wasm (baseline: the same crates native)",
        &format!("{:.2} us/event", per_event(wf) / 1e3),
        &format!("{:.2} us/event", per_event(nf) / 1e3),
        &format!("{:.2}x", wf.as_secs_f64() / nf.as_secs_f64()),
        "<= 2x",
    );

    // What one event costs to cross into a component and back: a filter
    // that does nothing with it.
    let accept = runtime
        .load(
            "AcceptAll",
            1,
            &std::fs::read(laurel::library::guest_dir().join("accept_all_filter.wasm")).unwrap(),
            None,
        )
        .unwrap();
    let mut accept = FilterInstance::new(accept, "{}").unwrap();
    let mut samples = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        black_box(accept.matches(&wasm_events).unwrap());
        samples.push(t.elapsed());
    }
    let crossing = per_event(median(samples));
    println!(
        "  crossing alone (a filter that accepts everything): {crossing:8.0} ns/event per call"
    );
    row(
        "wasm_chain",
        "crossing into a component and back (a filter that accepts everything)",
        &format!("{crossing:.0} ns/event per call"),
        "",
        "",
        "",
    );

    // Instantiate: a new instance of a loaded version, created from a config.
    let function = load("ReviewsLengthFilter");
    let mut samples = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        black_box(FilterInstance::new(function.clone(), LENGTH).unwrap());
        samples.push(t.elapsed());
    }
    let instantiate = median(samples);
    let t = Instant::now();
    let compiled = Runtime::new(Limits::default(), None).unwrap();
    let bytes = laurel::library::builtin("ReviewsLengthFilter")
        .unwrap()
        .bytes;
    compiled
        .load("ReviewsLengthFilter", 1, bytes, None)
        .unwrap();
    let compile = t.elapsed();
    println!(
        "Instantiate + create from config: {:.1} us (median of 200); compiling the component: {:.0} ms",
        instantiate.as_secs_f64() * 1e6,
        compile.as_secs_f64() * 1e3
    );
    row(
        "wasm_chain",
        "instantiate + create from config (median of 200)",
        &format!("{:.1} us", instantiate.as_secs_f64() * 1e6),
        "",
        "",
        "",
    );

    hot_swap(&runtime);
}

/// Push -> the running registry serves the new version, over a real
/// PostgreSQL: the database `laurel_bench_swap`, made anew each run on the
/// server at LAUREL_BENCH_SERVER_URL (default loopback). Skipped, and said
/// so, when no server answers.
fn hot_swap(runtime: &Runtime) {
    let server = std::env::var("LAUREL_BENCH_SERVER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let url = format!("{server}/laurel_bench_swap");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if let Ok((admin, connection)) =
            tokio_postgres::connect(&format!("{server}/postgres"), tokio_postgres::NoTls).await
        {
            tokio::spawn(connection);
            let _ = admin.batch_execute("DROP DATABASE IF EXISTS laurel_bench_swap WITH (FORCE)").await;
        }
        let Ok(mut store) = laurel::store::Store::connect(&url).await else {
            println!("Hot swap: skipped (no database at {url})");
            return;
        };
        store.migrate().await.unwrap();
        let dir = laurel::library::guest_dir();
        let accept = std::fs::read(dir.join("accept_all_filter.wasm")).unwrap();
        let reject = std::fs::read(dir.join("reject_all_filter.wasm")).unwrap();
        let registry = Registry::start(&url, runtime.clone()).await.unwrap();
        let mut samples = Vec::new();
        for round in 0..20 {
            let bytes = if round % 2 == 0 { &accept } else { &reject };
            let t = Instant::now();
            let (_, outcome) = registry::push(&mut store, runtime, "BenchSwap", bytes, None).await.unwrap();
            let version = match outcome {
                laurel::store::PushOutcome::Created { version } | laurel::store::PushOutcome::Unchanged { version } => version,
            };
            while registry.get("BenchSwap").map(|f| f.version) != Some(version) {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            samples.push(t.elapsed());
        }
        let swap = median(samples.clone());
        let worst = samples.iter().max().unwrap();
        println!(
            "Hot swap (push committed -> running registry serves it, compile included): median {:.1} ms, max {:.1} ms over 20 pushes",
            swap.as_secs_f64() * 1e3,
            worst.as_secs_f64() * 1e3
        );
        row(
            "wasm_chain",
            "hot swap: push committed -> running registry serves it (20 pushes)",
            &format!(
                "median {:.0} ms, max {:.0} ms",
                swap.as_secs_f64() * 1e3,
                worst.as_secs_f64() * 1e3
            ),
            "",
            "",
            "",
        );
    });
}
