//! Users' tokens for the public API: JWTs signed with the shared HS256
//! secret (`LAUREL_JWT_SECRET`) or with an identity provider's keys
//! (RS256/RS384/RS512/ES256/ES384 from a JWKS file or URL,
//! `LAUREL_JWT_JWKS`). The signature is checked by `jsonwebtoken`; the
//! claims here, by their types: `exp` and `nbf` must be numbers when
//! present (jsonwebtoken skips an `exp` it cannot read as an integer, so a
//! string `exp` would never expire), `exp` can be required, `iss` and `aud`
//! can be required to match. Each kind of key only verifies its own
//! algorithms: a token cannot pick the HS256 secret for a public key.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use tracing::{info, warn};

use super::auth::{Secret, bearer};
use super::error::ApiError;

/// How users' tokens are checked.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "User tokens")]
pub struct TokenSettings {
    /// HS256 secret shared with the app's login service; unset (and no
    /// JWKS), the public API refuses everything.
    #[arg(
        long = "jwt-secret",
        env = "LAUREL_JWT_SECRET",
        hide_env_values = true,
        value_name = "SECRET"
    )]
    pub secret: Option<Secret>,
    /// An identity provider's public keys for RS256/ES256 user tokens: a
    /// JWKS file or an http(s) URL, fetched at start and every
    /// `jwks_refresh` (10 minutes), and again (at most every 30 s) when a
    /// token names a key not yet known.
    #[arg(long = "jwt-jwks", env = "LAUREL_JWT_JWKS", value_name = "FILE|URL")]
    pub jwks: Option<String>,
    #[arg(skip = Duration::from_secs(600))]
    pub jwks_refresh: Duration,
    /// The `iss` every user token must carry.
    #[arg(long = "jwt-issuer", env = "LAUREL_JWT_ISSUER", value_name = "ISS")]
    pub issuer: Option<String>,
    /// An `aud` every user token must carry (alone or in its list).
    #[arg(long = "jwt-audience", env = "LAUREL_JWT_AUDIENCE", value_name = "AUD")]
    pub audience: Option<String>,
    /// Refuse user tokens without `exp`.
    #[arg(
        long = "jwt-require-exp",
        env = "LAUREL_JWT_REQUIRE_EXP",
        default_value_t = false
    )]
    pub require_exp: bool,
    /// Clock skew allowed on a token's `exp` and `nbf`, in seconds.
    #[arg(
        id = "jwt_leeway_seconds",
        long = "jwt-leeway-seconds",
        env = "LAUREL_JWT_LEEWAY_SECONDS",
        default_value = "60",
        value_parser = crate::settings::seconds,
        value_name = "SECONDS"
    )]
    pub leeway: Duration,
}

impl Default for TokenSettings {
    fn default() -> Self {
        crate::settings::defaults()
    }
}

/// Largest JWKS document read.
const JWKS_MAX_BYTES: usize = 1 << 20;
/// Least time between two fetches for an unknown key.
const JWKS_RETRY: Duration = Duration::from_secs(30);

/// The checker, with the identity provider's keys as last loaded.
pub struct UserTokens {
    settings: TokenSettings,
    keys: RwLock<Arc<JwkSet>>,
    last_load: Mutex<Option<Instant>>,
}

impl UserTokens {
    /// Loads the keys now if there are any to load, and keeps them fresh
    /// in the background (while the returned value lives).
    pub fn start(settings: TokenSettings) -> Arc<UserTokens> {
        let tokens = Arc::new(UserTokens {
            settings,
            keys: RwLock::new(Arc::new(JwkSet { keys: Vec::new() })),
            last_load: Mutex::new(None),
        });
        if tokens.settings.jwks.is_some() {
            let weak = Arc::downgrade(&tokens);
            let every = tokens.settings.jwks_refresh.max(Duration::from_secs(1));
            tokio::spawn(async move {
                loop {
                    let Some(tokens) = weak.upgrade() else {
                        return;
                    };
                    tokens.load_keys().await;
                    drop(tokens);
                    tokio::time::sleep(every).await;
                }
            });
        }
        tokens
    }

    pub fn enabled(&self) -> bool {
        self.settings.secret.is_some() || self.settings.jwks.is_some()
    }

    async fn load_keys(&self) {
        let Some(source) = &self.settings.jwks else {
            return;
        };
        *self.last_load.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        match read_jwks(source).await {
            Ok(set) => {
                let count = set.keys.len();
                let changed = {
                    let current = self.keys.read().unwrap_or_else(|p| p.into_inner());
                    current.keys.len() != count
                        || current.keys.iter().zip(&set.keys).any(|(a, b)| a != b)
                };
                if changed {
                    info!(message = "Loaded the identity provider's keys.", keys = count, source = %crate::secrets::redact_url(source));
                }
                *self.keys.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(set);
            }
            Err(error) => {
                warn!(message = "Failed to load the identity provider's keys; keeping the last ones.", source = %crate::secrets::redact_url(source), error = %crate::secrets::redact_url_in(&error, source));
            }
        }
    }

    /// The key for a token signed with `algorithm` and naming `kid`.
    async fn key(&self, algorithm: Algorithm, kid: Option<&str>) -> Result<DecodingKey, ApiError> {
        match algorithm {
            Algorithm::HS256 => self
                .settings
                .secret
                .as_ref()
                .map(|s| DecodingKey::from_secret(s.expose().as_bytes()))
                .ok_or_else(|| {
                    ApiError::Unauthorized(
                        "invalid token: HS256 tokens are not accepted here (no shared secret is set)"
                            .into(),
                    )
                }),
            Algorithm::RS256
            | Algorithm::RS384
            | Algorithm::RS512
            | Algorithm::ES256
            | Algorithm::ES384 => {
                if self.settings.jwks.is_none() {
                    return Err(ApiError::Unauthorized(format!(
                        "invalid token: {algorithm:?} tokens are not accepted here (no JWKS is set)"
                    )));
                }
                if let Some(key) = self.find(algorithm, kid) {
                    return key;
                }
                // A key rotated in since the last load: fetch again, at
                // most every JWKS_RETRY.
                let due = self
                    .last_load
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .is_none_or(|at| at.elapsed() >= JWKS_RETRY);
                if due {
                    let _ = tokio::time::timeout(Duration::from_secs(5), self.load_keys()).await;
                }
                self.find(algorithm, kid).unwrap_or_else(|| {
                    Err(ApiError::Unauthorized(format!(
                        "invalid token: no {algorithm:?} key{} among the identity provider's keys",
                        kid.map(|k| format!(" with kid {k:?}")).unwrap_or_default()
                    )))
                })
            }
            other => Err(ApiError::Unauthorized(format!(
                "invalid token: {other:?} is not an accepted algorithm (HS256, RS256, RS384, RS512, ES256, ES384)"
            ))),
        }
    }

    fn find(
        &self,
        algorithm: Algorithm,
        kid: Option<&str>,
    ) -> Option<Result<DecodingKey, ApiError>> {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner()).clone();
        let jwk = keys
            .keys
            .iter()
            .filter(|k| kid.is_none_or(|kid| k.common.key_id.as_deref() == Some(kid)))
            .find(|k| fits(k, algorithm))?;
        Some(DecodingKey::from_jwk(jwk).map_err(|error| {
            ApiError::Unauthorized(format!("invalid token: its key cannot be used: {error}"))
        }))
    }

    /// Lets the request through if it carries a valid token whose `sub` is
    /// `user_id`: 401 for no or an invalid token, 403 for another user's.
    pub async fn check(&self, headers: &HeaderMap, user_id: &str) -> Result<(), ApiError> {
        if !self.enabled() {
            return Err(ApiError::Unauthorized(
                "the public API is disabled: set LAUREL_JWT_SECRET or LAUREL_JWT_JWKS to enable it"
                    .into(),
            ));
        }
        let token = bearer(headers)?;
        let header = jsonwebtoken::decode_header(token)
            .map_err(|error| ApiError::Unauthorized(format!("invalid token: {error}")))?;
        let key = self.key(header.alg, header.kid.as_deref()).await?;
        // The signature here; the claims below, by their types.
        let mut validation = Validation::new(header.alg);
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        let claims = jsonwebtoken::decode::<Value>(token, &key, &validation)
            .map_err(|error| ApiError::Unauthorized(format!("invalid token: {error}")))?
            .claims;
        let sub = self.claims(&claims)?;
        if sub == user_id {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "this token is for another user; it may read only /v1/users/{sub}/awards"
            )))
        }
    }

    /// Checks the claims; returns `sub`.
    fn claims<'a>(&self, claims: &'a Value) -> Result<&'a str, ApiError> {
        let refuse = |why: String| Err(ApiError::Unauthorized(format!("invalid token: {why}")));
        let now = chrono::Utc::now().timestamp() as f64;
        let leeway = self.settings.leeway.as_secs_f64();
        let sub = match claims.get("sub") {
            Some(Value::String(sub)) if !sub.is_empty() => sub.as_str(),
            Some(_) => return refuse("`sub` must be a non-empty string".into()),
            None => return refuse("it has no `sub`".into()),
        };
        match claims.get("exp") {
            None if self.settings.require_exp => return refuse("it has no `exp`".into()),
            None => {}
            Some(Value::Number(exp)) => {
                // A number too odd to compare (NaN) is expired too.
                let exp = exp.as_f64().unwrap_or(f64::NAN);
                if (exp + leeway).partial_cmp(&now) != Some(std::cmp::Ordering::Greater) {
                    return refuse("it has expired (`exp`)".into());
                }
            }
            Some(_) => return refuse("`exp` must be a number (seconds since 1970)".into()),
        }
        match claims.get("nbf") {
            None => {}
            Some(Value::Number(nbf)) => {
                let nbf = nbf.as_f64().unwrap_or(f64::NAN);
                if (nbf - leeway)
                    .partial_cmp(&now)
                    .is_none_or(|o| o == std::cmp::Ordering::Greater)
                {
                    return refuse("it is not valid yet (`nbf`)".into());
                }
            }
            Some(_) => return refuse("`nbf` must be a number (seconds since 1970)".into()),
        }
        if let Some(issuer) = &self.settings.issuer
            && claims.get("iss").and_then(Value::as_str) != Some(issuer.as_str())
        {
            return refuse(format!("`iss` must be {issuer:?}"));
        }
        if let Some(audience) = &self.settings.audience {
            let ok = match claims.get("aud") {
                Some(Value::String(aud)) => aud == audience,
                Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(audience)),
                _ => false,
            };
            if !ok {
                return refuse(format!("`aud` must name {audience:?}"));
            }
        }
        Ok(sub)
    }
}

/// Whether `jwk` may verify a token signed with `algorithm`: the key's
/// type must match, and its declared algorithm, if any.
fn fits(jwk: &Jwk, algorithm: Algorithm) -> bool {
    let family = matches!(
        (&jwk.algorithm, algorithm),
        (
            AlgorithmParameters::RSA(_),
            Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512
        ) | (
            AlgorithmParameters::EllipticCurve(_),
            Algorithm::ES256 | Algorithm::ES384
        )
    );
    let declared = jwk
        .common
        .key_algorithm
        .map(|declared| format!("{declared:?}") == format!("{algorithm:?}"))
        .unwrap_or(true);
    family && declared
}

async fn read_jwks(source: &str) -> Result<JwkSet, String> {
    let text = if source.starts_with("https://") || source.starts_with("http://") {
        let client = crate::outbound::client()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?;
        let response = client
            .get(source)
            .send()
            .await
            .map_err(|e| format!("fetching the JWKS failed: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("the JWKS URL answered {}", response.status()));
        }
        let body = crate::outbound::read_limited(response, JWKS_MAX_BYTES + 1)
            .await
            .map_err(|e| format!("reading the JWKS failed: {e}"))?;
        if body.len() > JWKS_MAX_BYTES {
            return Err(format!("the JWKS is over {JWKS_MAX_BYTES} bytes"));
        }
        body
    } else {
        let bytes = tokio::fs::read(source)
            .await
            .map_err(|e| format!("reading {source} failed: {e}"))?;
        if bytes.len() > JWKS_MAX_BYTES {
            return Err(format!("{source} is over {JWKS_MAX_BYTES} bytes"));
        }
        bytes
    };
    serde_json::from_slice(&text).map_err(|e| format!("the JWKS is not a valid key set: {e}"))
}
