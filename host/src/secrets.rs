//! Secrets: made fresh where Laurel needs one ([`random_token`]), and never
//! shown: URLs appear without their credentials (`redis://:***@host:6379`)
//! and without the values of query parameters that look like secrets
//! (`?token=***`), wherever Laurel writes them: errors, logs, `/healthz`,
//! the processing log.

/// 128 random bits from the operating system's generator, as hex.
pub fn random_token() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    // The OS generator does not fail on the systems Laurel runs on; if it
    // ever did, no token is better than a guessable one.
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .expect("the operating system's random generator answers");
    hex::encode(bytes)
}

/// `url` with the password of its user info, and the values of query
/// parameters named like secrets, replaced by `***`. Text that is not a
/// URL comes back as it was.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest_start = scheme_end + 3;
    let rest = &url[rest_start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let mut out = String::with_capacity(url.len());
    out.push_str(&url[..rest_start]);
    match authority.rfind('@') {
        Some(at) => {
            let user_info = &authority[..at];
            let user = user_info.split(':').next().unwrap_or("");
            out.push_str(user);
            out.push_str(":***");
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let tail = &rest[authority_end..];
    let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
    let path: Vec<&str> = tail[..path_end]
        .split('/')
        .map(|segment| {
            if secret_segment(segment) {
                "***"
            } else {
                segment
            }
        })
        .collect();
    out.push_str(&path.join("/"));
    let tail = &tail[path_end..];
    match tail.find('?') {
        Some(q) => {
            out.push_str(&tail[..=q]);
            let (query, fragment) = match tail[q + 1..].find('#') {
                Some(h) => (&tail[q + 1..q + 1 + h], &tail[q + 1 + h..]),
                None => (&tail[q + 1..], ""),
            };
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if secret_name(name) => format!("{name}=***"),
                    _ => pair.to_string(),
                })
                .collect();
            out.push_str(&pairs.join("&"));
            out.push_str(fragment);
        }
        None => out.push_str(tail),
    }
    out
}

/// A path segment that looks like a key (webhook URLs carry theirs in the
/// path: Slack's `/services/T../B../<token>`, Discord's
/// `/api/webhooks/<id>/<token>`): at least 20 characters of letters,
/// digits, `-` and `_`, with letters and digits both.
fn secret_segment(segment: &str) -> bool {
    segment.len() >= 20
        && segment
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && segment.chars().any(|c| c.is_ascii_digit())
        && segment.chars().any(|c| c.is_ascii_alphabetic())
}

fn secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "token",
        "key",
        "secret",
        "pass",
        "pwd",
        "sig",
        "auth",
        "credential",
    ]
    .iter()
    .any(|word| name.contains(word))
}

/// `text` with every occurrence of `secret_url` in it shown as
/// [`redact_url`] shows it
/// (for messages of libraries that quote the URL they were given).
pub fn redact_url_in(text: &str, secret_url: &str) -> String {
    let redacted = redact_url(secret_url);
    if redacted == secret_url {
        return text.to_string();
    }
    text.replace(secret_url, &redacted)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Webhook URLs that carry their key in the path show without it.
    #[test]
    fn keys_in_a_path_are_hidden() {
        assert_eq!(
            redact_url(
                "https://hooks.slack.com/services/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"
            ),
            "https://hooks.slack.com/services/T0A1B2C3D/B0A1B2C3D/***"
        );
        assert_eq!(
            redact_url(
                "https://discord.com/api/webhooks/123456789012345678/Ab-cD_3fGhIjKlMnOpQrStUvWxYz0123456789abcdefGHIJKLmnopqrstuvwxyz0123?wait=true"
            ),
            "https://discord.com/api/webhooks/123456789012345678/***?wait=true"
        );
        // Ordinary paths stay as they are.
        assert_eq!(
            redact_url("https://hooks.example/laurel/awards-completed/v1"),
            "https://hooks.example/laurel/awards-completed/v1"
        );
    }

    #[test]
    fn credentials_and_secret_parameters_are_hidden() {
        assert_eq!(
            redact_url("redis://:hunter2@10.0.0.5:6379/0"),
            "redis://:***@10.0.0.5:6379/0"
        );
        assert_eq!(
            redact_url("postgres://laurel:hunter2@db/laurel?sslmode=require"),
            "postgres://laurel:***@db/laurel?sslmode=require"
        );
        assert_eq!(
            redact_url("https://hooks.example/in?token=abc&team=7#x"),
            "https://hooks.example/in?token=***&team=7#x"
        );
        assert_eq!(
            redact_url("https://user:p@ss@example.com/"),
            "https://user:***@example.com/"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(
            redact_url_in(
                "error for url (https://u:pw@h/x): refused",
                "https://u:pw@h/x"
            ),
            "error for url (https://u:***@h/x): refused"
        );
    }
}
