//! What this process has done, as Prometheus counters, histograms and a
//! gauge (the Prometheus project's `prometheus-client`), served in the
//! Prometheus text format (version 0.0.4) at `/metrics`.
//!
//! One registry per process (each `laurel` process exposes its own;
//! Prometheus sums them). Callers record per batch or per function call,
//! never per event.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge as GaugeMetric;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Every family this process reports, with its help text. Counters are
/// named here as they are exposed (`_total`); they are registered without
/// the suffix, which the encoder adds.
const FAMILIES: &[(&str, Kind, &str)] = &[
    (
        EVENTS_APPLIED,
        Kind::Counter,
        "Events in committed batches, by source (including events that changed nothing and skipped users)",
    ),
    (
        EVENTS_DEAD_LETTERED,
        Kind::Counter,
        "Events sent to events.<source>.dead, by source",
    ),
    (
        EVENTS_HELD,
        Kind::Counter,
        "Events held for one objective (its function failed, is quarantined or cannot be bound; the other objectives applied them; kept for replay), by source, award and objective",
    ),
    (
        INGEST_RETRIES,
        Kind::Counter,
        "Batches retried because PostgreSQL or the broker was unavailable, by source",
    ),
    (
        FUNCTION_CALLS,
        Kind::Counter,
        "Wasm function calls (one call handles a batch), by function and kind",
    ),
    (
        FUNCTION_ERRORS,
        Kind::Counter,
        "Failed Wasm function calls, by function, kind and error (trap, timeout, memory, invalid_output, quarantined, other)",
    ),
    (
        FUNCTION_SECONDS,
        Kind::Histogram,
        "Wall time of one Wasm function call, by function and kind",
    ),
    (
        AWARDS_COMPLETED,
        Kind::Counter,
        "Awards completed, by award",
    ),
    (
        AWARDS_REVOKED,
        Kind::Counter,
        "Awards revoked (live awards that fell below their goal), by award",
    ),
    (
        NOTIFICATIONS_SENT,
        Kind::Counter,
        "Notifications delivered, by webhook",
    ),
    (
        NOTIFICATIONS_FAILED,
        Kind::Counter,
        "Failed notification delivery attempts, by webhook and whether the notification was given up (final) or will be retried",
    ),
    (
        HTTP_FUNCTION_REQUESTS,
        Kind::Counter,
        "Requests to HTTP functions, by component and outcome (the status code, or timeout, failed, too_large)",
    ),
    (
        HTTP_FUNCTION_SECONDS,
        Kind::Histogram,
        "Wall time of one request to an HTTP function (instantiation included), by component",
    ),
    (
        PREFILTER_EVENTS,
        Kind::Counter,
        "Events the pre-filter made of raw records, by pipeline and outcome (kept: produced for ingest; dropped: no enabled award can use it, or a record the transform made no event of, as one; dead: its record was dead-lettered)",
    ),
    (
        CONSUMER_LAG,
        Kind::Gauge,
        "Messages not yet consumed by the source's consumer group, by source (as last read from the brokers, every 10 s)",
    ),
    (
        PREFILTER_LAG,
        Kind::Gauge,
        "Raw records the pipeline's consumer group has not yet consumed from its input topic, by pipeline (as last read from the brokers, every 10 s)",
    ),
];

pub const EVENTS_APPLIED: &str = "laurel_events_applied_total";
pub const EVENTS_HELD: &str = "laurel_events_held_total";
pub const INGEST_RETRIES: &str = "laurel_ingest_retries_total";
pub const EVENTS_DEAD_LETTERED: &str = "laurel_events_dead_lettered_total";
pub const FUNCTION_CALLS: &str = "laurel_function_calls_total";
pub const FUNCTION_ERRORS: &str = "laurel_function_errors_total";
pub const FUNCTION_SECONDS: &str = "laurel_function_call_seconds";
pub const AWARDS_COMPLETED: &str = "laurel_awards_completed_total";
pub const AWARDS_REVOKED: &str = "laurel_awards_revoked_total";
pub const NOTIFICATIONS_SENT: &str = "laurel_notifications_sent_total";
pub const NOTIFICATIONS_FAILED: &str = "laurel_notifications_failed_total";
pub const HTTP_FUNCTION_REQUESTS: &str = "laurel_http_function_requests_total";
pub const HTTP_FUNCTION_SECONDS: &str = "laurel_http_function_seconds";
pub const CONSUMER_LAG: &str = "laurel_consumer_lag";
pub const PREFILTER_EVENTS: &str = "laurel_prefilter_events_total";
pub const PREFILTER_LAG: &str = "laurel_prefilter_lag";

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// The media type of what `render` writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

type Labels = Vec<(&'static str, String)>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;
type Gauges = Family<Labels, GaugeMetric<f64, AtomicU64>>;

/// The process's registry and its families, by the names callers use.
struct Metrics {
    registry: Registry,
    counters: HashMap<&'static str, Family<Labels, Counter>>,
    histograms: HashMap<&'static str, Histograms>,
    gauges: HashMap<&'static str, Gauges>,
    /// Gauges are set from what a scrape read: one scrape renders at a time.
    rendering: Mutex<()>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut metrics = Metrics {
        registry: Registry::default(),
        counters: HashMap::new(),
        histograms: HashMap::new(),
        gauges: HashMap::new(),
        rendering: Mutex::new(()),
    };
    for &(name, kind, help) in FAMILIES {
        match kind {
            Kind::Counter => {
                let family = Family::default();
                let base = name.strip_suffix("_total").unwrap_or(name);
                metrics.registry.register(base, help, family.clone());
                metrics.counters.insert(name, family);
            }
            Kind::Histogram => {
                let family: Histograms = Family::new_with_constructor(|| Histogram::new(BUCKETS));
                metrics.registry.register(name, help, family.clone());
                metrics.histograms.insert(name, family);
            }
            Kind::Gauge => {
                let family = Gauges::default();
                metrics.registry.register(name, help, family.clone());
                metrics.gauges.insert(name, family);
            }
        }
    }
    metrics
});

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, (*v).to_string())).collect()
}

/// Adds `by` to the counter `name` with `pairs` as labels.
pub fn add(name: &'static str, pairs: &[(&'static str, &str)], by: u64) {
    if by == 0 {
        return;
    }
    match METRICS.counters.get(name) {
        Some(family) => {
            family.get_or_create(&labels(pairs)).inc_by(by);
        }
        None => debug_assert!(false, "{name} is not a counter of FAMILIES"),
    }
}

/// The counter `name` with `pairs` as labels, as this process has it.
pub fn count(name: &'static str, pairs: &[(&'static str, &str)]) -> u64 {
    METRICS
        .counters
        .get(name)
        .map_or(0, |family| family.get_or_create(&labels(pairs)).get())
}

/// Records one observation of the histogram `name`.
pub fn observe(name: &'static str, pairs: &[(&'static str, &str)], took: Duration) {
    match METRICS.histograms.get(name) {
        Some(family) => family
            .get_or_create(&labels(pairs))
            .observe(took.as_secs_f64()),
        None => debug_assert!(false, "{name} is not a histogram of FAMILIES"),
    }
}

/// A gauge's value at scrape time.
pub struct Gauge {
    pub name: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

/// Everything recorded, plus `gauges` read just now, in the Prometheus
/// text format (`CONTENT_TYPE`). A family appears once it has a series.
pub fn render(gauges: &[Gauge]) -> String {
    let metrics = &*METRICS;
    let _one_scrape = metrics.rendering.lock().unwrap_or_else(|p| p.into_inner());
    for family in metrics.gauges.values() {
        family.clear();
    }
    for gauge in gauges {
        match metrics.gauges.get(gauge.name) {
            Some(family) => {
                family.get_or_create(&gauge.labels).set(gauge.value);
            }
            None => debug_assert!(false, "{} is not a gauge of FAMILIES", gauge.name),
        }
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &metrics.registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_histograms_and_gauges_render_in_the_text_format() {
        add(AWARDS_COMPLETED, &[("award", "unit-\"quoted\"\naward")], 2);
        add(AWARDS_COMPLETED, &[("award", "unit-\"quoted\"\naward")], 1);
        observe(
            FUNCTION_SECONDS,
            &[("function", "UnitFn"), ("kind", "rule")],
            Duration::from_micros(300),
        );
        observe(
            FUNCTION_SECONDS,
            &[("function", "UnitFn"), ("kind", "rule")],
            Duration::from_secs(3),
        );
        let text = render(&[Gauge {
            name: CONSUMER_LAG,
            labels: vec![("source", "photos".to_string())],
            value: 7.0,
        }]);
        assert!(
            text.contains("# TYPE laurel_awards_completed_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "laurel_awards_completed_total{award=\"unit-\\\"quoted\\\"\\naward\"} 3\n"
            ),
            "{text}"
        );
        assert!(text.contains(
            "laurel_function_call_seconds_bucket{le=\"0.00025\",function=\"UnitFn\",kind=\"rule\"} 0\n"
        ) || text.contains(
            "laurel_function_call_seconds_bucket{function=\"UnitFn\",kind=\"rule\",le=\"0.00025\"} 0\n"
        ), "{text}");
        assert!(text.contains("le=\"0.0005\"} 1\n"), "{text}");
        assert!(text.contains("le=\"+Inf\"} 2\n"), "{text}");
        assert!(
            text.contains(
                "laurel_function_call_seconds_count{function=\"UnitFn\",kind=\"rule\"} 2\n"
            ),
            "{text}"
        );
        let lag = text
            .lines()
            .find_map(|line| line.strip_prefix("laurel_consumer_lag{source=\"photos\"} "));
        assert_eq!(lag.and_then(|v| v.parse::<f64>().ok()), Some(7.0), "{text}");
        // A gauge is what the last scrape read: a source gone is gone.
        let text = render(&[]);
        assert!(!text.contains("laurel_consumer_lag{"), "{text}");
    }
}
