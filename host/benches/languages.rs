//! Benchmark: the same filter (`MinRating`) and the same rule
//! (`LongReviews`) written in Rust, Python and JavaScript, each made with
//! `laurel functions new --lang L` and built with the language's own tool,
//! measured in one run: cost per event in a batch, instantiation (create
//! from config included), component size and memory after a batch, as
//! ratios to Rust.
//!
//! cargo bench -p laurel --bench languages
//!
//! Needs python3 and npm: componentize-py and jco are installed on first
//! use under `<target>/polyglot`, as the tests do. Each per-event figure is
//! the median of rounds in which the languages alternate.

use std::hint::black_box;
use std::time::{Duration, Instant};

use laurel::event::Envelope;
use laurel::runtime::{Event, FilterInstance, Limits, RuleInstance, Runtime};

#[path = "support/row.rs"]
mod row;
use row::row;

#[path = "support/projects.rs"]
mod projects;

const LANGS: [&str; 3] = ["rust", "python", "js"];

fn events() -> usize {
    std::env::var("LAUREL_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn rounds() -> usize {
    std::env::var("LAUREL_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9)
}

const FILTER_CONFIG: &str = r#"{"field": "/rating", "min": 4}"#;
const RULE_CONFIG: &str = r#"{"counter": "long_reviews", "min_chars": 100}"#;

/// Reviews of every rating, long and short, some blocked.
fn batch(count: usize) -> Vec<Event> {
    (0..count)
        .map(|i| {
            let text = if i % 3 == 0 {
                "short".to_string()
            } else {
                "a fine review of a fine place ".repeat(5)
            };
            let status = if i % 10 == 9 { "blocked" } else { "active" };
            let raw = format!(
                r#"{{"id":"evt-{i}","source":"reviews","type":"review","user_id":"u-{}","authorized":true,"content_id":"c-{i}","status":"{status}","occurred_at":"2026-12-01T10:00:00Z","payload":{{"rating":{},"text":"{text}","object_id":"firm-{}"}}}}"#,
                i % 97,
                i % 6,
                i % 13
            );
            Envelope::parse(raw.as_bytes())
                .unwrap()
                .to_function_event()
        })
        .collect()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

struct Lang {
    name: &'static str,
    filter: FilterInstance,
    rule: RuleInstance,
    sizes: (usize, usize),
    instantiate: Duration,
    filter_ns: Vec<Duration>,
    rule_ns: Vec<Duration>,
}

fn main() {
    let runtime = Runtime::new(Limits::default(), None).expect("runtime");
    let events = batch(events());
    let mut langs: Vec<Lang> = LANGS
        .iter()
        .map(|&lang| {
            let suffix = match lang {
                "rust" => "Rs",
                "python" => "Py",
                _ => "Js",
            };
            let filter_bytes =
                projects::build(lang, "filter", &format!("MinRating{suffix}"), |_| {});
            let rule_bytes = projects::build(lang, "rule", &format!("LongReviews{suffix}"), |_| {});
            let filter_fn = runtime
                .load(&format!("MinRating{suffix}"), 1, &filter_bytes, None)
                .unwrap();
            let rule_fn = runtime
                .load(&format!("LongReviews{suffix}"), 1, &rule_bytes, None)
                .unwrap();
            // Instantiate + create from config: the median of 21.
            let mut samples = Vec::new();
            for _ in 0..21 {
                let t = Instant::now();
                black_box(FilterInstance::new(filter_fn.clone(), FILTER_CONFIG).unwrap());
                samples.push(t.elapsed());
            }
            Lang {
                name: lang,
                filter: FilterInstance::new(filter_fn, FILTER_CONFIG).unwrap(),
                rule: RuleInstance::new(rule_fn, RULE_CONFIG).unwrap(),
                sizes: (filter_bytes.len(), rule_bytes.len()),
                instantiate: median(samples),
                filter_ns: Vec::new(),
                rule_ns: Vec::new(),
            }
        })
        .collect();

    // Every language answers the same.
    let answers: Vec<_> = langs
        .iter_mut()
        .map(|l| {
            let matched = l.filter.matches(&events).unwrap();
            let counted: Vec<_> = l
                .rule
                .contribute(&events)
                .unwrap()
                .into_iter()
                .map(|r| r.map(|c| c.map(|c| (c.counters[0].value, c.additive))))
                .collect();
            (matched, counted)
        })
        .collect();
    for (lang, answer) in LANGS.iter().zip(&answers).skip(1) {
        assert_eq!(answer, &answers[0], "{lang} answers as Rust does");
    }

    for _ in 0..rounds() {
        for l in &mut langs {
            let t = Instant::now();
            black_box(l.filter.matches(&events).unwrap());
            l.filter_ns.push(t.elapsed());
            let t = Instant::now();
            black_box(l.rule.contribute(&events).unwrap());
            l.rule_ns.push(t.elapsed());
        }
    }

    let count = events.len() as f64;
    let per_event = |d: Duration| d.as_nanos() as f64 / count / 1e3;
    let rust = (
        per_event(median(langs[0].filter_ns.clone())),
        per_event(median(langs[0].rule_ns.clone())),
        langs[0].instantiate,
        langs[0].sizes,
        langs[0].filter.memory_bytes(),
    );
    println!(
        "MinRating and LongReviews in each language, {} events per batch, median of {} rounds",
        events.len(),
        rounds()
    );
    for l in &langs {
        let filter = per_event(median(l.filter_ns.clone()));
        let rule = per_event(median(l.rule_ns.clone()));
        let memory = l.filter.memory_bytes().max(l.rule.memory_bytes());
        println!(
            "  {:<6}: filter {filter:8.2} us/event, rule {rule:8.2} us/event, instantiate {:8.2} ms, \
             components {:.2} / {:.2} MiB, memory {:.1} MiB",
            l.name,
            l.instantiate.as_secs_f64() * 1e3,
            l.sizes.0 as f64 / 1048576.0,
            l.sizes.1 as f64 / 1048576.0,
            memory as f64 / 1048576.0
        );
        if l.name == "rust" {
            continue;
        }
        let title = if l.name == "python" {
            "Python"
        } else {
            "JavaScript"
        };
        row(
            "languages",
            &format!(
                "{title} filter (MinRating), per event in a batch (baseline: the same in Rust)"
            ),
            &format!("{filter:.2} us/event"),
            &format!("{:.2} us/event", rust.0),
            &format!("{:.1}x", filter / rust.0),
            "",
        );
        row(
            "languages",
            &format!("{title} rule (LongReviews), per event in a batch (baseline: Rust)"),
            &format!("{rule:.2} us/event"),
            &format!("{:.2} us/event", rust.1),
            &format!("{:.1}x", rule / rust.1),
            "",
        );
        row(
            "languages",
            &format!("{title}: instantiate + create from config, the filter (baseline: Rust)"),
            &format!("{:.2} ms", l.instantiate.as_secs_f64() * 1e3),
            &format!("{:.3} ms", rust.2.as_secs_f64() * 1e3),
            &format!("{:.0}x", l.instantiate.as_secs_f64() / rust.2.as_secs_f64()),
            "",
        );
        row(
            "languages",
            &format!("{title}: component size, the filter (baseline: Rust)"),
            &format!("{:.2} MiB", l.sizes.0 as f64 / 1048576.0),
            &format!("{:.2} MiB", rust.3.0 as f64 / 1048576.0),
            &format!("{:.0}x", l.sizes.0 as f64 / rust.3.0 as f64),
            "",
        );
        row(
            "languages",
            &format!("{title}: an instance's memory after a batch, the filter (baseline: Rust)"),
            &format!("{:.1} MiB", l.filter.memory_bytes() as f64 / 1048576.0),
            &format!("{:.1} MiB", rust.4 as f64 / 1048576.0),
            &format!("{:.1}x", l.filter.memory_bytes() as f64 / rust.4 as f64),
            "",
        );
    }
}
