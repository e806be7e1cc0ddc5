//! The admin console (`/console/`): a page for support, product and
//! operators over the admin API. Its files (`host/console/`) are built into
//! the binary as they are: no build step, no Node, nothing fetched from
//! elsewhere. Every answer carries a strict Content-Security-Policy (no
//! inline script or style, nothing but this origin), and the page keeps the
//! admin token in sessionStorage, sent only in the Authorization header.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

/// The console's files: name, media type, content.
const FILES: [(&str, &str, &str); 3] = [
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../../console/index.html"),
    ),
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/console.js"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("../../console/console.css"),
    ),
];

/// Each file's ETag: a digest of its content.
static TAGS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
    use sha2::Digest;
    FILES
        .iter()
        .map(|(_, _, content)| {
            let digest = hex::encode(sha2::Sha256::digest(content.as_bytes()));
            format!("\"{}\"", &digest[..16])
        })
        .collect()
});

/// Only this origin, and no inline code: an injected `<script>` or a
/// `style=` attribute does nothing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route(
            "/console/",
            get(|headers: HeaderMap| async move { file("index.html", &headers) }),
        )
        .route(
            "/console/{file}",
            get(
                |Path(name): Path<String>, headers: HeaderMap| async move { file(&name, &headers) },
            ),
        )
}

/// One of the console's files (304 when the caller has it already), or 404.
fn file(name: &str, headers: &HeaderMap) -> Response {
    let Some((_, media_type, content)) = FILES.iter().find(|(n, _, _)| *n == name) else {
        return super::ApiError::NotFound(format!(
            "the console has no file {:?}",
            crate::text::printable(name, 128)
        ))
        .into_response();
    };
    let tag = &TAGS[FILES.iter().position(|(n, _, _)| *n == name).unwrap_or(0)];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|given| given.as_bytes() == tag.as_bytes());
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, *media_type)], *content).into_response()
    };
    let set = response.headers_mut();
    set.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    set.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    set.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    set.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Always asked again (a new binary brings new files), cheaply by tag.
    set.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(tag) = HeaderValue::from_str(tag) {
        set.insert(header::ETAG, tag);
    }
    response
}
