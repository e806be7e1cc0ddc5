//! What this process has done, as Prometheus counters and histograms,
//! rendered in the text exposition format at `/metrics`.
//!
//! One set per process (each `laurel` process exposes its own; Prometheus
//! sums them). Recording takes a short lock per call; callers record per
//! batch or per function call, never per event, so the lock is off the hot
//! path's critical cost.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

/// Every family this process reports, with its help text. A family with
/// nothing recorded yet is still described, so dashboards can be built
/// before the first event.
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
        CONSUMER_LAG,
        Kind::Gauge,
        "Messages not yet consumed by the source's consumer group, by source (read from the brokers at scrape time)",
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

/// Upper bounds (seconds) of the latency histogram's buckets.
const BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

type Labels = Vec<(&'static str, String)>;

enum Value {
    Counter(u64),
    Histogram {
        /// Per bucket (not cumulative); the last slot is +Inf.
        buckets: [u64; BUCKETS.len() + 1],
        sum: f64,
        count: u64,
    },
}

static SERIES: LazyLock<Mutex<BTreeMap<(&'static str, Labels), Value>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

fn labels(pairs: &[(&'static str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, (*v).to_string())).collect()
}

/// Adds `by` to the counter `name` with `pairs` as labels.
pub fn add(name: &'static str, pairs: &[(&'static str, &str)], by: u64) {
    if by == 0 {
        return;
    }
    let mut series = SERIES.lock().unwrap_or_else(|p| p.into_inner());
    if let Value::Counter(total) = series
        .entry((name, labels(pairs)))
        .or_insert(Value::Counter(0))
    {
        *total += by;
    }
}

/// Records one observation of the histogram `name`.
pub fn observe(name: &'static str, pairs: &[(&'static str, &str)], took: Duration) {
    let seconds = took.as_secs_f64();
    let mut series = SERIES.lock().unwrap_or_else(|p| p.into_inner());
    if let Value::Histogram {
        buckets,
        sum,
        count,
    } = series
        .entry((name, labels(pairs)))
        .or_insert(Value::Histogram {
            buckets: [0; BUCKETS.len() + 1],
            sum: 0.0,
            count: 0,
        })
    {
        let slot = BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(BUCKETS.len());
        buckets[slot] += 1;
        *sum += seconds;
        *count += 1;
    }
}

/// A gauge's value at scrape time.
pub struct Gauge {
    pub name: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

/// Everything recorded, plus `gauges` read just now, in the Prometheus
/// text format (version 0.0.4).
pub fn render(gauges: &[Gauge]) -> String {
    let series = SERIES.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = String::new();
    for (family, kind, help) in FAMILIES {
        let kind_name = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let _ = writeln!(out, "# HELP {family} {help}");
        let _ = writeln!(out, "# TYPE {family} {kind_name}");
        for ((name, labels), value) in series.range((*family, Vec::new())..) {
            if name != family {
                break;
            }
            match value {
                Value::Counter(total) => {
                    let _ = writeln!(out, "{family}{} {total}", label_text(labels, None));
                }
                Value::Histogram {
                    buckets,
                    sum,
                    count,
                } => {
                    let base = family;
                    let mut cumulative = 0;
                    for (slot, n) in buckets.iter().enumerate() {
                        cumulative += n;
                        let le = BUCKETS
                            .get(slot)
                            .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
                        let _ = writeln!(
                            out,
                            "{base}_bucket{} {cumulative}",
                            label_text(labels, Some(&le))
                        );
                    }
                    let _ = writeln!(out, "{base}_sum{} {sum}", label_text(labels, None));
                    let _ = writeln!(out, "{base}_count{} {count}", label_text(labels, None));
                }
            }
        }
        for gauge in gauges.iter().filter(|g| g.name == *family) {
            let _ = writeln!(
                out,
                "{family}{} {}",
                label_text(&gauge.labels, None),
                gauge.value
            );
        }
    }
    out
}

fn label_text(labels: &[(&'static str, String)], le: Option<&str>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// Label values escape backslash, double quote and newline.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_render_in_the_text_format() {
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
        assert!(text.contains("# TYPE laurel_awards_completed_total counter\n"));
        assert!(
            text.contains(
                "laurel_awards_completed_total{award=\"unit-\\\"quoted\\\"\\naward\"} 3\n"
            )
        );
        assert!(text.contains(
            "laurel_function_call_seconds_bucket{function=\"UnitFn\",kind=\"rule\",le=\"0.00025\"} 0\n"
        ));
        assert!(text.contains(
            "laurel_function_call_seconds_bucket{function=\"UnitFn\",kind=\"rule\",le=\"0.0005\"} 1\n"
        ));
        assert!(text.contains(
            "laurel_function_call_seconds_bucket{function=\"UnitFn\",kind=\"rule\",le=\"+Inf\"} 2\n"
        ));
        assert!(
            text.contains(
                "laurel_function_call_seconds_count{function=\"UnitFn\",kind=\"rule\"} 2\n"
            )
        );
        assert!(text.contains("laurel_consumer_lag{source=\"photos\"} 7\n"));
        // Described even before anything happened.
        assert!(text.contains("# TYPE laurel_notifications_failed_total counter\n"));
    }
}
