//! The public API: apps read their user's awards with the user's token.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Json, Router};

use super::badges::{self, BadgeChoice};
use super::progress::{Audience, UserAwards, user_awards};
use super::{ApiError, AppState, read_body};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/users/{user_id}/awards", get(awards))
        .route(
            "/v1/users/{user_id}/badges",
            get(badge_choice).put(set_badge_choice),
        )
}

async fn awards(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<UserAwards>, ApiError> {
    state.tokens.check(&headers, &user_id).await?;
    Ok(Json(user_awards(&state, &user_id, Audience::User).await?))
}

/// `GET /v1/users/{user_id}/badges`: whether the user's progress shows on
/// public badges.
async fn badge_choice(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<BadgeChoice>, ApiError> {
    state.tokens.check(&headers, &user_id).await?;
    Ok(Json(badges::get(&state, &user_id).await?))
}

/// `PUT /v1/users/{user_id}/badges` (`{"public": false}` opts out). The
/// token is checked before the body is read.
async fn set_badge_choice(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
    request: Request,
) -> Result<Json<BadgeChoice>, ApiError> {
    state.tokens.check(request.headers(), &user_id).await?;
    let body = read_body(request.into_body(), state.settings.max_body_bytes).await?;
    Ok(Json(badges::set(&state, &user_id, &body).await?))
}
