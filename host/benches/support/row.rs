//! The rows a bench adds to the table of current figures in
//! `host/benches/README.md`. Each bench prints its rows as it finishes;
//! `host/benches/regenerate` runs the benches and writes the rows it
//! collects into the table, so the page holds what the benches measured,
//! never figures typed in by hand.

/// The prefix `host/benches/regenerate` looks for.
const PREFIX: &str = "bench-row";

/// Prints one row: what was measured, its figure, the baseline measured in
/// the same run, the ratio of the two and the goal ("" where there is
/// none). The command that reproduces it names the bench and every
/// `LAUREL_BENCH_*` setting this run was given.
pub fn row(bench: &str, measure: &str, figure: &str, baseline: &str, ratio: &str, goal: &str) {
    let mut settings: Vec<String> = std::env::vars()
        .filter(|(name, _)| name.starts_with("LAUREL_BENCH_"))
        .map(|(name, value)| format!("{name}={value} "))
        .collect();
    settings.sort();
    let dash = |text: &str| {
        if text.is_empty() {
            "-".to_string()
        } else {
            text.to_string()
        }
    };
    println!(
        "{PREFIX} | {measure} | {} | {} | {} | {} | `{}cargo bench -p laurel --bench {bench}` |",
        dash(figure),
        dash(baseline),
        dash(ratio),
        dash(goal),
        settings.concat(),
    );
}

/// Several rounds' figures as one: "31.9K-34.6K events/s (median 33.3K,
/// 2 rounds)", or the one value; `show` formats a value, `unit` follows
/// the range. The median of an even count is the mean of the middle two.
#[allow(dead_code)] // not every bench has rounds
pub fn spread(values: &[f64], show: impl Fn(f64) -> String, unit: &str) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    match sorted.as_slice() {
        [] => String::new(),
        [one] => format!("{}{unit}", show(*one)),
        [low, .., high] => {
            let middle = sorted.len() / 2;
            let median = if sorted.len().is_multiple_of(2) {
                (sorted[middle - 1] + sorted[middle]) / 2.0
            } else {
                sorted[middle]
            };
            format!(
                "{}-{}{unit} (median {}, {} rounds)",
                show(*low),
                show(*high),
                show(median),
                sorted.len()
            )
        }
    }
}

/// Thousands with one decimal: 38,312 -> "38.3K".
#[allow(dead_code)]
pub fn thousands(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.2}M", value / 1e6)
    } else {
        format!("{:.1}K", value / 1e3)
    }
}
