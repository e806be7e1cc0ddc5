//! Secrets: made fresh where Laurel needs one ([`random_token`]), and never
//! shown: URLs appear without their credentials (`redis://:***@host:6379`)
//! and without the values of query parameters that look like secrets
//! (`?token=***`), wherever Laurel writes them: errors, logs, `/healthz`,
//! the processing log.

/// 128 random bits as hex (from the standard library's hasher seeds,
/// which it draws from the operating system).
pub fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let half = || {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        hasher.finish()
    };
    format!("{:016x}{:016x}", half(), half())
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
