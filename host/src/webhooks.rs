//! Webhooks as an admin defines them: checked before they are stored.

use crate::store::Webhook;

/// Transition types a webhook can receive.
pub const EVENTS: &[&str] = &["award.completed", "award.revoked"];

/// A webhook, checked: a name the database accepts, an http(s) URL, known
/// event types.
pub fn checked_webhook(
    name: &str,
    url: &str,
    events: &[String],
    proxy_pool: Option<&str>,
) -> Result<Webhook, String> {
    let name_ok = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if !name_ok {
        return Err(format!(
            "invalid webhook name {name:?}: letters, digits, `_`, `.`, `-`, starting with a letter or digit, at most 128"
        ));
    }
    match crate::outbound::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.host().is_some() => {}
        Ok(parsed) => {
            return Err(format!(
                "invalid webhook URL {:?}: expected http:// or https:// with a host, got scheme {:?}",
                crate::secrets::redact_url(url),
                parsed.scheme()
            ));
        }
        Err(error) => {
            return Err(format!(
                "invalid webhook URL {:?}: {error}",
                crate::secrets::redact_url(url)
            ));
        }
    }
    if events.is_empty() {
        return Err("a webhook needs at least one event type".into());
    }
    if let Some(pool) = proxy_pool {
        crate::proxy::check_pool(pool).map_err(|e| e.to_string())?;
    }
    for event in events {
        if !EVENTS.contains(&event.as_str()) {
            return Err(format!(
                "unknown event type {event:?} (expected {})",
                EVENTS.join(" or ")
            ));
        }
    }
    Ok(Webhook {
        name: name.to_string(),
        url: url.to_string(),
        events: events.to_vec(),
        proxy_pool: proxy_pool.map(str::to_string),
    })
}
