//! Who may call what: the admin token for `/admin/*` (users' tokens for
//! the public API are `tokens.rs`'s).

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use jsonwebtoken::Algorithm;
use sha2::{Digest, Sha256};

use super::error::ApiError;

/// A secret from the environment: never printed.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    pub(super) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Secret {
    type Err = String;
    fn from_str(value: &str) -> Result<Secret, String> {
        if value.is_empty() {
            Err("a secret must not be empty".into())
        } else {
            Ok(Secret::new(value))
        }
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

pub(super) fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers
        .get(AUTHORIZATION)
        .ok_or_else(|| ApiError::Unauthorized("missing Authorization: Bearer <token>".into()))?;
    let value = value
        .to_str()
        .map_err(|_| ApiError::Unauthorized("the Authorization header is not text".into()))?;
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(ApiError::Unauthorized(
            "the Authorization header must be `Bearer <token>`".into(),
        ));
    }
    Ok(token.trim())
}

/// Compares digests, so the time taken says nothing about the token.
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Lets the request through if it carries the admin token.
pub fn admin(headers: &HeaderMap, token: Option<&Secret>) -> Result<(), ApiError> {
    let Some(token) = token else {
        return Err(ApiError::Unauthorized(
            "the admin API is disabled: set LAUREL_ADMIN_TOKEN to enable it".into(),
        ));
    };
    if same_secret(bearer(headers)?, token.expose()) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized("invalid admin token".into()))
    }
}

/// A token for `user_id` signed with `secret`, valid for `ttl` (the demo
/// prints one; apps get theirs from their own login service).
pub fn mint_user_token(secret: &Secret, user_id: &str, ttl: std::time::Duration) -> String {
    let exp = chrono::Utc::now().timestamp() + ttl.as_secs() as i64;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        &serde_json::json!({"sub": user_id, "exp": exp}),
        &jsonwebtoken::EncodingKey::from_secret(secret.expose().as_bytes()),
    )
    .expect("HS256 signing of a JSON object cannot fail")
}

/// A random secret (128 bits from the process's hash seeds, which the
/// standard library draws from the operating system).
pub fn random_secret() -> Secret {
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
    Secret::new(format!("{:016x}{:016x}", half(), half()))
}

impl Secret {
    /// The secret itself, to show it once where the operator asked for one
    /// to be made up.
    pub fn reveal(&self) -> &str {
        self.expose()
    }
}
