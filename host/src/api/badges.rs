//! Whether a user's progress may be shown on public badges: the user's
//! own choice (`PUT /v1/users/{user_id}/badges`, with the user's token),
//! which support can also set (`PUT /admin/v1/users/{user_id}/badges`).
//! An award's badge is public only if its definition says
//! `"public_badge": true` ([`super::progress::public_badge`]).

use serde::{Deserialize, Serialize};

use super::{ApiError, AppState};

/// The choice, as both APIs answer it.
#[derive(Debug, Serialize)]
pub struct BadgeChoice {
    pub user_id: String,
    /// False once the user opted out.
    pub public: bool,
}

/// What a `PUT` takes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Choice {
    public: bool,
}

pub async fn get(state: &AppState, user_id: &str) -> Result<BadgeChoice, ApiError> {
    let public = state.store().await?.badges_public(user_id).await?;
    Ok(BadgeChoice {
        user_id: user_id.to_string(),
        public,
    })
}

/// Records the choice in `body` (`{"public": false}` opts out).
pub async fn set(state: &AppState, user_id: &str, body: &[u8]) -> Result<BadgeChoice, ApiError> {
    let Choice { public } = serde_json::from_slice(body).map_err(|error| {
        ApiError::BadRequest(format!(
            "the request body must be {{\"public\": true|false}}: {error}"
        ))
    })?;
    check_user_id(user_id)?;
    state
        .store()
        .await?
        .set_badges_public(user_id, public)
        .await?;
    Ok(BadgeChoice {
        user_id: user_id.to_string(),
        public,
    })
}

/// A user id a write may store: as an event's user_id may be (PostgreSQL
/// refuses NUL in text).
pub fn check_user_id(user_id: &str) -> Result<(), ApiError> {
    if user_id.is_empty() || user_id.len() > crate::event::MAX_ID_BYTES || user_id.contains('\0') {
        return Err(ApiError::BadRequest(format!(
            "a user id is 1 to {} bytes without NUL",
            crate::event::MAX_ID_BYTES
        )));
    }
    Ok(())
}
