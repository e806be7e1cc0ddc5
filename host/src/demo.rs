//! `laurel up --demo`: the background write-up's examples, run through the
//! loaded components, so a first run shows the functions doing real work.

use std::sync::Arc;

use crate::event::Envelope;
use crate::registry::Registry;
use crate::runtime::{ObjectiveState, Progress};

const REVIEWS: &[&str] = &[
    r#"{"id":"demo-1","source":"reviews","type":"review.created","user_id":"u-42","authorized":true,"content_id":"review-1","status":"active","occurred_at":"2026-12-01T10:00:00Z","payload":{"object_id":"firm-17","text":"A long, careful review of the cafe: the coffee, the service, the prices and the view from the terrace, all of it worth a visit."}}"#,
    r#"{"id":"demo-2","source":"reviews","type":"review.created","user_id":"u-42","authorized":true,"content_id":"review-2","status":"active","occurred_at":"2026-12-01T10:05:00Z","payload":{"object_id":"firm-18","text":"Too short."}}"#,
    r#"{"id":"demo-3","source":"photos","type":"photo.status_changed","user_id":"u-42","authorized":true,"content_id":"photo-9","status":"active","occurred_at":"2026-12-01T10:06:00Z","payload":{"object_id":"firm-17"}}"#,
];

const THREE_OF_EITHER: &str = r#"{"goal": 3, "operation": "sum", "strategy": [{"objective_id": "reviews"}, {"objective_id": "photos"}]}"#;

const CONTENT_MAKER: &str = r#"{"goal": 15, "operation": "sum", "strategy": [
    {"goal": 5, "operation": "sum", "strategy": [{"objective_id": "photo"}, {"objective_id": "reviews"}]},
    {"goal": 10, "operation": "sum", "strategy": [{"objective_id": "navi", "normalization_factor": 0.001}]}]}"#;

fn state(id: &str, value: f64) -> ObjectiveState {
    ObjectiveState {
        objective_id: id.to_string(),
        value,
        counters: Vec::new(),
    }
}

fn show(progress: &Progress) -> String {
    format!(
        "progress {} of {}, started {}, completed {}",
        progress.progress, progress.goal, progress.started, progress.completed
    )
}

pub fn run(registry: &Arc<Registry>) -> anyhow::Result<()> {
    println!(
        "\nDemo: the reviews objective of the contract (SourceFilter reviews -> ReviewsLengthFilter 100 -> ReviewUniqueByObjectRule)"
    );
    let mut source = registry.bind_filter("SourceFilter", r#"{"sources": ["reviews"]}"#)?;
    let mut length = registry.bind_filter("ReviewsLengthFilter", r#"{"allowed_length": 100}"#)?;
    let mut rule = registry.bind_rule("ReviewUniqueByObjectRule", "{}")?;
    let events = REVIEWS
        .iter()
        .map(|json| Envelope::parse(json.as_bytes()).map(|e| e.to_function_event()))
        .collect::<Result<Vec<_>, _>>()?;
    let from_source = source.instance().matches(&events)?;
    let long_enough = length.instance().matches(&events)?;
    let contributions = rule.instance().contribute(&events)?;
    for (i, event) in events.iter().enumerate() {
        let verdict = if !from_source[i] {
            "excluded by SourceFilter".to_string()
        } else if !long_enough[i] {
            "excluded by ReviewsLengthFilter".to_string()
        } else {
            match &contributions[i] {
                Ok(Some(c)) => {
                    let counters: Vec<String> = c
                        .counters
                        .iter()
                        .map(|c| format!("{} = {}", c.name, c.value))
                        .collect();
                    let key = c
                        .dedup_key
                        .as_deref()
                        .map(|k| format!(", one per object {k}"))
                        .unwrap_or_default();
                    format!("counts {}{key}", counters.join(", "))
                }
                Ok(None) => "ignored by the rule".to_string(),
                Err(reason) => format!("unusable: {reason}"),
            }
        };
        println!(
            "  {} ({} {}): {verdict}",
            event.id,
            event.source,
            event.content_id.as_deref().unwrap_or("-")
        );
    }

    println!("\nDemo: TreeStrategy on the write-up's examples");
    let mut either = registry.bind_strategy("TreeStrategy", THREE_OF_EITHER)?;
    let mut maker = registry.bind_strategy("TreeStrategy", CONTENT_MAKER)?;
    let results = either
        .instance()
        .evaluate(&[vec![state("reviews", 1.0), state("photos", 2.0)]])?;
    for result in results {
        println!(
            "  3 reviews or 3 photos, with 1 review + 2 photos: {}",
            show(&result.map_err(anyhow::Error::msg)?)
        );
    }
    let results = maker.instance().evaluate(&[vec![
        state("photo", 3.0),
        state("reviews", 1.0),
        state("navi", 5500.0),
    ]])?;
    for result in results {
        println!(
            "  content-maker, with 3 photos + 1 review + 5.5 km: {}",
            show(&result.map_err(anyhow::Error::msg)?)
        );
    }
    println!();
    Ok(())
}

/// The demo awards: the contract's example and the write-up's "3 reviews
/// or 3 photos".
pub const AWARDS: &str = concat!(
    "[",
    include_str!("../demo/content-maker.json"),
    ",",
    include_str!("../demo/three-of-either.json"),
    "]"
);

/// The demo's pre-filter pipeline: navigator logs (`key=value` lines) on
/// `raw.navigator` into `bss` events.
pub const PIPELINE: &str = include_str!("../demo/navigator-pipeline.json");
pub const RAW_TOPIC: &str = "raw.navigator";

/// Navigator log lines for u-42: a finished trip (the only one an award
/// counts), two events no award needs, and one without a user.
const RAW_LINES: [&str; 4] = [
    "ts=1764583260 uid=u-42 event=navi.route_built dist=5600",
    "ts=1764583800 uid=u-42 event=navi.trip_finished dist=5500",
    "ts=1764583810 uid=u-42 event=navi.app_closed",
    "ts=1764583900 event=navi.trip_finished dist=700",
];

const DEMO_USER: &str = "u-42";

fn demo_event(
    i: usize,
    source: &str,
    kind: &str,
    content: Option<(&str, &str)>,
    payload: serde_json::Value,
) -> String {
    let mut event = serde_json::json!({
        "id": format!("demo-evt-{i}"),
        "source": source,
        "type": kind,
        "user_id": DEMO_USER,
        "authorized": true,
        "occurred_at": format!("2026-12-01T10:{:02}:00Z", i),
        "payload": payload,
    });
    if let Some((content_id, status)) = content {
        event["content_id"] = content_id.into();
        event["status"] = status.into();
    }
    event.to_string()
}

/// Publishes a small stream for user u-42 and prints the counters it leads to.
pub async fn publish_and_show(brokers: &str, database_url: &str) -> anyhow::Result<()> {
    use serde_json::json;
    let long = "A long, careful review: the coffee, the service, the prices and the view from the terrace, all of it worth a visit.";
    let events = [
        (
            "photos",
            demo_event(
                1,
                "photos",
                "photo.status_changed",
                Some(("photo-1", "moderation")),
                json!({}),
            ),
        ),
        (
            "photos",
            demo_event(
                2,
                "photos",
                "photo.status_changed",
                Some(("photo-1", "active")),
                json!({}),
            ),
        ),
        (
            "photos",
            demo_event(
                3,
                "photos",
                "photo.status_changed",
                Some(("photo-2", "active")),
                json!({}),
            ),
        ),
        (
            "photos",
            demo_event(
                4,
                "photos",
                "photo.status_changed",
                Some(("photo-3", "active")),
                json!({}),
            ),
        ),
        (
            "photos",
            demo_event(
                5,
                "photos",
                "photo.status_changed",
                Some(("photo-3", "blocked")),
                json!({}),
            ),
        ),
        (
            "reviews",
            demo_event(
                6,
                "reviews",
                "review.created",
                Some(("review-1", "active")),
                json!({"object_id": "firm-17", "text": long}),
            ),
        ),
        (
            "reviews",
            demo_event(
                7,
                "reviews",
                "review.created",
                Some(("review-2", "active")),
                json!({"object_id": "firm-17", "text": long}),
            ),
        ),
        (
            "reviews",
            demo_event(
                8,
                "reviews",
                "review.created",
                Some(("review-3", "active")),
                json!({"object_id": "firm-18", "text": "Too short."}),
            ),
        ),
        (
            "bss",
            demo_event(10, "bss", "card.opened", None, json!({"card": "firm-17"})),
        ),
    ];
    let producer = crate::kafka::producer(brokers)?;
    for (source, event) in &events {
        crate::kafka::publish(
            &producer,
            &format!("events.{source}"),
            Some(DEMO_USER.as_bytes()),
            event.as_bytes(),
            &[],
        )
        .await?;
    }
    for line in RAW_LINES {
        crate::kafka::publish(
            &producer,
            RAW_TOPIC,
            Some(DEMO_USER.as_bytes()),
            line.as_bytes(),
            &[],
        )
        .await?;
    }
    println!(
        "Demo: published {} events for {DEMO_USER} (photos, reviews, bss) and {} navigator log lines to {RAW_TOPIC}.",
        events.len(),
        RAW_LINES.len()
    );
    let outcome = |outcome| {
        crate::metrics::count(
            crate::metrics::PREFILTER_EVENTS,
            &[("pipeline", "navigator"), ("outcome", outcome)],
        )
    };
    // The pipeline's consumer joins its group first (seconds on the local
    // broker); its trip reaches the counters after that.
    for _ in 0..120 {
        if outcome("kept") + outcome("dropped") >= 3 && outcome("dead") >= 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let store = crate::store::Store::connect(database_url).await?;
    let mut last = None;
    for _ in 0..60 {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let counters = store.user_counters(DEMO_USER).await?;
        let trip_counted = counters.keys().any(|(_, objective)| objective == "navi");
        if last.as_ref() == Some(&counters) && trip_counted {
            break;
        }
        last = Some(counters);
    }
    println!(
        "Demo: pipeline navigator kept {} of its events for awards, dropped {} no award needs, dead-lettered {} record to {RAW_TOPIC}.dead.",
        outcome("kept"),
        outcome("dropped"),
        outcome("dead")
    );
    println!("Demo: {DEMO_USER}'s objective counters:");
    for ((award, objective), counters) in last.unwrap_or_default() {
        println!(
            "  {award:<16} {objective:<8} {}",
            serde_json::to_string(&counters)?
        );
    }
    // The awards worker computes progress from those counters.
    let mut awards = Vec::new();
    for _ in 0..40 {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let now = store.user_achievements(DEMO_USER).await?;
        if !now.is_empty() && now == awards {
            break;
        }
        awards = now;
    }
    println!("Demo: {DEMO_USER}'s awards:");
    for (award, state) in awards {
        println!(
            "  {award:<16} progress {} of {}{}",
            state.progress,
            state.goal,
            if state.completed { " (completed)" } else { "" }
        );
    }
    Ok(())
}

/// For the demo, an admin token and a JWT secret when none is set, printed
/// with requests to try.
pub fn secrets(api: &mut crate::api::ApiSettings, serves_functions: bool) {
    let base = format!("http://{}", api.addr);
    println!("Demo: try the HTTP API:");
    // A secret the operator set is never printed.
    let admin = match &api.admin_token {
        Some(_) => "$LAUREL_ADMIN_TOKEN".to_string(),
        None => {
            let made = crate::api::random_secret();
            let shown = made.reveal().to_string();
            api.admin_token = Some(made);
            shown
        }
    };
    let user = match &api.tokens.secret {
        Some(_) => "<a token for u-42 signed with LAUREL_JWT_SECRET>".to_string(),
        None => {
            let made = crate::api::random_secret();
            let token = crate::api::mint_user_token(
                &made,
                "u-42",
                std::time::Duration::from_secs(24 * 3600),
            );
            api.tokens.secret = Some(made);
            token
        }
    };
    println!("  curl -H 'Authorization: Bearer {user}' {base}/v1/users/u-42/awards");
    println!("  curl -H 'Authorization: Bearer {admin}' {base}/admin/v1/users/u-42/log");
    println!(
        "  curl -H 'Authorization: Bearer {admin}' {base}/admin/v1/users/u-42/awards/content-maker/explain"
    );
    println!("  curl {base}/metrics");
    if serves_functions {
        println!(
            "  curl {base}/badges/u-42/content-maker    (an HTTP function from spin.toml: an SVG badge)"
        );
    }
}
