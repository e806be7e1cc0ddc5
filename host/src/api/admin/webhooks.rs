//! Webhooks: where award notifications are delivered.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Serialize;

use crate::api::auth::{Caller, Role};
use crate::api::{ApiError, AppState, json_body};
use crate::store::Webhook;

/// A webhook as the caller may see it: a read token sees its URL with
/// credentials redacted.
#[derive(Debug, Serialize)]
pub(super) struct WebhookLine {
    name: String,
    url: String,
    events: Vec<String>,
    proxy_pool: Option<String>,
}

impl WebhookLine {
    fn of(w: &Webhook, caller: &Caller) -> WebhookLine {
        let url = match caller.role {
            Role::Admin => w.url.clone(),
            Role::Read => crate::secrets::redact_url(&w.url),
        };
        WebhookLine {
            name: w.name.clone(),
            url,
            events: w.events.clone(),
            proxy_pool: w.proxy_pool.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub(super) struct WebhookList {
    webhooks: Vec<WebhookLine>,
}

pub(super) async fn list(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<WebhookList>, ApiError> {
    let hooks = state.store().await?.webhooks().await?;
    Ok(Json(WebhookList {
        webhooks: hooks.iter().map(|w| WebhookLine::of(w, &caller)).collect(),
    }))
}

pub(super) async fn get(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Json<WebhookLine>, ApiError> {
    let hooks = state.store().await?.webhooks().await?;
    hooks
        .iter()
        .find(|w| w.name == name)
        .map(|w| Json(WebhookLine::of(w, &caller)))
        .ok_or_else(|| ApiError::NotFound(format!("no webhook named {name}")))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WebhookBody {
    url: String,
    #[serde(default)]
    events: Option<Vec<String>>,
    #[serde(default)]
    proxy_pool: Option<String>,
}

pub(super) async fn put(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<WebhookLine>, ApiError> {
    let value = json_body(raw, state.settings.max_body_bytes)?;
    let hook: WebhookBody = serde_json::from_value(value)
        .map_err(|error| ApiError::unprocessable(format!("webhook {name}: {error}")))?;
    let events = hook
        .events
        .unwrap_or_else(|| vec!["award.completed".to_string()]);
    let webhook =
        crate::webhooks::checked_webhook(&name, &hook.url, &events, hook.proxy_pool.as_deref())
            .map_err(|reason| ApiError::unprocessable(format!("webhook {name}: {reason}")))?;
    state.store().await?.set_webhook(&webhook).await?;
    Ok(Json(WebhookLine::of(
        &webhook,
        &Caller {
            name: String::new(),
            role: Role::Admin,
        },
    )))
}

pub(super) async fn delete(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    if !state.store().await?.delete_webhook(&name).await? {
        return Err(ApiError::NotFound(format!("no webhook named {name}")));
    }
    Ok(StatusCode::NO_CONTENT)
}
