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

impl Secret {
    /// `LAUREL_ADMIN_TOKEN`: as long as any admin token must be.
    pub(super) fn admin_token(value: &str) -> Result<(), String> {
        if value.len() < 16 {
            return Err("at least 16 characters (a secret, not a password)".into());
        }
        Ok(())
    }

    /// `LAUREL_JWT_SECRET`: an HS256 key is at least as long as the hash
    /// (256 bits, RFC 7518 section 3.2).
    pub(super) fn jwt_secret(value: &str) -> Result<(), String> {
        if value.len() < 32 {
            return Err(format!(
                "at least 32 bytes for HS256 (RFC 7518, 3.2), not {}; e.g. `openssl rand -hex 32`",
                value.len()
            ));
        }
        Ok(())
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

/// What an admin token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything.
    Admin,
    /// Reads only: every write answers 403 (support staff, dashboards).
    Read,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Read => "read",
        }
    }
}

/// One admin token: its name (what the audit log records), its role.
#[derive(Debug, Clone)]
pub struct AdminToken {
    pub name: String,
    pub role: Role,
    pub token: Secret,
}

impl AdminToken {
    /// Parses `name:role:token` (role `admin` or `read`).
    pub fn parse(entry: &str) -> Result<AdminToken, String> {
        let mut parts = entry.trim().splitn(3, ':');
        let (Some(name), Some(role), Some(token)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err("an admin token is `name:role:token`".to_string());
        };
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@'));
        if !name_ok {
            return Err(format!(
                "admin token name {name:?}: 1 to 64 letters, digits, `_`, `-`, `.`, `@`"
            ));
        }
        let role = match role {
            "admin" => Role::Admin,
            "read" => Role::Read,
            other => {
                return Err(format!(
                    "admin token {name}: role {other:?} is neither admin nor read"
                ));
            }
        };
        if token.len() < 16 {
            return Err(format!(
                "admin token {name}: at least 16 characters (a secret, not a password)"
            ));
        }
        Ok(AdminToken {
            name: name.to_string(),
            role,
            token: Secret::new(token),
        })
    }

    /// Comma- or newline-separated entries (blank lines and `#` comments
    /// skipped).
    pub fn parse_list(text: &str) -> Result<Vec<AdminToken>, String> {
        text.split([',', '\n'])
            .map(str::trim)
            .filter(|e| !e.is_empty() && !e.starts_with('#'))
            .map(AdminToken::parse)
            .collect()
    }
}

/// Who is calling the admin API.
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: String,
    pub role: Role,
}

/// The caller whose token the request carries: 401 without one.
pub fn admin(headers: &HeaderMap, tokens: &[AdminToken]) -> Result<Caller, ApiError> {
    if tokens.is_empty() {
        return Err(ApiError::Unauthorized(
            "the admin API is disabled: set LAUREL_ADMIN_TOKEN or LAUREL_ADMIN_TOKENS to enable it"
                .into(),
        ));
    }
    let given = bearer(headers)?;
    // Every token is compared (by digest), so the time taken says nothing.
    let mut found = None;
    for token in tokens {
        if same_secret(given, token.token.expose()) && found.is_none() {
            found = Some(Caller {
                name: token.name.clone(),
                role: token.role,
            });
        }
    }
    found.ok_or_else(|| ApiError::Unauthorized("invalid admin token".into()))
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

/// A random secret, for the demo.
pub fn random_secret() -> Secret {
    Secret::new(crate::secrets::random_token())
}

impl Secret {
    /// The secret itself, to show it once where the operator asked for one
    /// to be made up.
    pub fn reveal(&self) -> &str {
        self.expose()
    }
}
