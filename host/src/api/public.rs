//! The public API: apps read their user's awards with the user's token.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::get;
use axum::{Json, Router};

use super::progress::{Audience, UserAwards, user_awards};
use super::{ApiError, AppState};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/users/{user_id}/awards", get(awards))
}

async fn awards(
    State(state): State<Arc<AppState>>,
    Path(user_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<UserAwards>, ApiError> {
    state.tokens.check(&headers, &user_id).await?;
    Ok(Json(user_awards(&state, &user_id, Audience::User).await?))
}
