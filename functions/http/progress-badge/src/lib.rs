//! A user's progress on one award as an SVG badge:
//! `GET /badges/{user_id}/{award_id}[.svg]`.
//!
//! Progress comes from Laurel (`laurel:http/progress`, `public-badge`):
//! only awards whose definition says `"public_badge": true` have a badge,
//! and a user who opted out, or is unknown, shows no progress, the same
//! badge as a user who has none. The badge's label comes from the `label`
//! variable, and each badge's view count is kept in the default key-value
//! store (sent back as `x-badge-views`) once the user has started: a
//! request for an unknown user id writes nothing.

use serde::Deserialize;
use spin_sdk::http::{IntoResponse, Request};
use spin_sdk::http_service;
use spin_sdk::key_value::Store;

spin_sdk::wit_bindgen::generate!({
    path: "../../../wit/http",
    world: "laurel:http/imports",
    runtime_path: "spin_sdk::wit_bindgen::rt",
});

use laurel::http::progress::{ProgressError, public_badge};

#[derive(Deserialize)]
struct Award {
    title: String,
    progress: f64,
    goal: f64,
    started: bool,
    completed: bool,
}

#[http_service]
async fn badge(request: Request) -> impl IntoResponse {
    let param = |name: &str| {
        request
            .headers()
            .get(format!("spin-path-match-{name}"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let user_id = param("user_id");
    let award_param = param("award_id");
    let award_id = award_param.strip_suffix(".svg").unwrap_or(&award_param);
    if user_id.is_empty() || award_id.is_empty() {
        return text(400, "use /badges/{user_id}/{award_id}");
    }
    let award = match public_badge(&user_id, award_id) {
        Ok(json) => json,
        Err(ProgressError::NotFound(why)) => return text(404, &why),
        Err(ProgressError::Unavailable(why)) => {
            return text(503, &format!("progress is unavailable: {why}"));
        }
    };
    let award: Award = match serde_json::from_str(&award) {
        Ok(award) => award,
        Err(error) => {
            return text(
                502,
                &format!("Laurel answered unreadable progress: {error}"),
            );
        }
    };
    let label = spin_sdk::variables::get("label")
        .await
        .unwrap_or_else(|_| "Laurel".to_string());
    // Views are counted once the user has started, so a crawler of
    // made-up ids writes nothing.
    let views = if award.started {
        count_view(&format!("views/{user_id}/{award_id}")).await
    } else {
        None
    };
    let svg = render(&label, &award);
    let mut response = http::Response::builder()
        .status(200)
        .header("content-type", "image/svg+xml")
        .header("cache-control", "no-cache");
    if let Some(views) = views {
        response = response.header("x-badge-views", views.to_string());
    }
    response
        .body(svg)
        .unwrap_or_else(|_| http::Response::new(String::new()))
}

/// Adds one to a badge's view count; None if the store is unavailable (a
/// badge is still worth showing without it).
async fn count_view(key: &str) -> Option<u64> {
    let store = Store::open_default().await.ok()?;
    let seen: u64 = match store.get(key).await.ok()? {
        Some(bytes) => String::from_utf8(bytes).ok()?.parse().ok()?,
        None => 0,
    };
    store
        .set(key, (seen + 1).to_string().as_bytes())
        .await
        .ok()?;
    Some(seen + 1)
}

fn text(status: u16, message: &str) -> http::Response<String> {
    http::Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(format!("{message}\n"))
        .unwrap_or_else(|_| http::Response::new(String::new()))
}

/// Whole numbers without a fraction, others with up to two decimals.
fn number(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        let text = format!("{value:.2}");
        text.trim_end_matches('0').to_string()
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn render(label: &str, award: &Award) -> String {
    let share = if award.goal > 0.0 {
        (award.progress / award.goal).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let status = if award.completed {
        "completed".to_string()
    } else {
        format!("{} / {}", number(award.progress), number(award.goal))
    };
    let colour = if award.completed {
        "#2e7d32"
    } else {
        "#1565c0"
    };
    let bar = (share * 236.0).round();
    let (label, title, status) = (escape(label), escape(&award.title), escape(&status));
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="240" height="48" role="img" aria-label="{label}: {title}, {status}">
  <title>{label}: {title}, {status}</title>
  <rect width="240" height="48" rx="4" fill="#263238"/>
  <text x="8" y="18" fill="#eceff1" font-family="Verdana,sans-serif" font-size="11">{label} · {title}</text>
  <text x="232" y="18" fill="#eceff1" font-family="Verdana,sans-serif" font-size="11" text-anchor="end">{status}</text>
  <rect x="2" y="30" width="236" height="12" rx="3" fill="#455a64"/>
  <rect x="2" y="30" width="{bar}" height="12" rx="3" fill="{colour}" data-progress="{share:.4}"/>
</svg>
"##
    )
}
