//! A check-in app's webhooks as Laurel events: `POST /ingest/checkins`.
//!
//! The app sends one webhook object or an array of them:
//!
//! ```json
//! {"event": "checkin.created", "occurred_at": "2026-12-01T10:00:00Z",
//!  "checkin": {"id": "c-1", "user_id": "u-42", "venue": {"id": "v-9", "category": "cafe"}}}
//! ```
//!
//! `Authorization: Bearer <webhook_token>` (a spin.toml variable) is
//! required. Every webhook is checked; if any is wrong nothing is
//! published and the answer (400) names each problem. Otherwise each
//! becomes one event on the `source` variable's topic: the check-in is the
//! content item (created: `active`, deleted: `deleted`), so a deleted
//! check-in takes back what it gave. Answer: 202 `{"published": n}`.

use serde_json::{Value, json};
use spin_sdk::http::body::IncomingBodyExt;
use spin_sdk::http::{IntoResponse, Request};
use spin_sdk::http_service;

spin_sdk::wit_bindgen::generate!({
    path: "../../../wit/http",
    world: "laurel:http/imports",
    runtime_path: "spin_sdk::wit_bindgen::rt",
});

use laurel::http::events::publish;

/// Most webhooks in one request.
const MAX_BATCH: usize = 100;

#[http_service]
async fn ingest(request: Request) -> impl IntoResponse {
    if request.method() != http::Method::POST {
        return answer(405, json!({"error": "use POST"}));
    }
    let token = spin_sdk::variables::get("webhook_token")
        .await
        .unwrap_or_default();
    if token.is_empty() {
        return answer(503, json!({"error": "webhook_token is not configured"}));
    }
    let given = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_string();
    if !same(given.as_bytes(), token.as_bytes()) {
        return answer(401, json!({"error": "missing or wrong bearer token"}));
    }
    let source = spin_sdk::variables::get("source")
        .await
        .unwrap_or_else(|_| "checkins".to_string());
    let body = match request.into_body().bytes().await {
        Ok(body) => body,
        Err(error) => return answer(400, json!({"error": format!("unreadable body: {error:?}")})),
    };
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(error) => {
            return answer(
                400,
                json!({"error": format!("the body is not JSON: {error}")}),
            );
        }
    };
    let webhooks = match parsed {
        Value::Array(items) => items,
        single @ Value::Object(_) => vec![single],
        _ => {
            return answer(
                400,
                json!({"error": "send a webhook object or an array of them"}),
            );
        }
    };
    if webhooks.is_empty() || webhooks.len() > MAX_BATCH {
        return answer(
            400,
            json!({"error": format!("send 1 to {MAX_BATCH} webhooks, not {}", webhooks.len())}),
        );
    }
    let mut events = Vec::with_capacity(webhooks.len());
    let mut problems = Vec::new();
    for (index, webhook) in webhooks.iter().enumerate() {
        match event(&source, webhook) {
            Ok(event) => events.push(event.to_string()),
            Err(problem) => problems.push(format!("webhook {index}: {problem}")),
        }
    }
    if !problems.is_empty() {
        return answer(
            400,
            json!({"error": "nothing was published", "problems": problems}),
        );
    }
    match publish(&source, &events) {
        Ok(published) => answer(202, json!({"published": published})),
        Err(error) => answer(422, json!({"error": error})),
    }
}

/// One webhook as a Laurel event, or what is wrong with it.
fn event(source: &str, webhook: &Value) -> Result<Value, String> {
    let text = |pointer: &str| -> Result<String, String> {
        match webhook.pointer(pointer) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(_) => Err(format!(
                "{} must be a non-empty string",
                &pointer[1..].replace('/', ".")
            )),
            None => Err(format!("{} is missing", &pointer[1..].replace('/', "."))),
        }
    };
    let kind = text("/event")?;
    let status = match kind.as_str() {
        "checkin.created" => "active",
        "checkin.deleted" => "deleted",
        other => {
            return Err(format!(
                "event `{other}` is not checkin.created or checkin.deleted"
            ));
        }
    };
    let checkin = text("/checkin/id")?;
    let user = text("/checkin/user_id")?;
    let occurred_at = text("/occurred_at")?;
    let venue = text("/checkin/venue/id")?;
    let category = webhook
        .pointer("/checkin/venue/category")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    Ok(json!({
        "id": format!("{source}/{checkin}/{kind}"),
        "source": source,
        "type": kind,
        "user_id": user,
        "authorized": true,
        "content_id": format!("checkin-{checkin}"),
        "status": status,
        "occurred_at": occurred_at,
        "payload": {"venue_id": venue, "venue_category": category},
    }))
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

fn answer(status: u16, body: Value) -> http::Response<String> {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(body.to_string())
        .unwrap_or_else(|_| http::Response::new(String::new()))
}
