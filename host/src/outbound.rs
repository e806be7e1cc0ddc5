//! Outbound HTTP: the one owner of reqwest. Every request Laurel makes
//! (webhooks, proxy checks and lists, HTTP functions' outbound calls, the
//! JWKS fetch) is built here: TLS through ring (installed once, for this
//! process, also for the trace exporter's client), no redirect followed (a
//! hop could lead anywhere, so a 3xx is an answer), bodies read up to a
//! bound, errors told with their causes.
//!
//! **Architecture Invariant:** only this module imports `reqwest`; the
//! types others need are re-exported from here.

pub use reqwest::{Client, ClientBuilder, Error, Proxy, Response, StatusCode, Url};

/// Installs ring as the process's TLS provider (reqwest and the trace
/// exporter are built without a default one). Idempotent.
pub fn install_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client builder with TLS ready and redirects never followed.
pub fn client() -> ClientBuilder {
    install_tls();
    Client::builder().redirect(reqwest::redirect::Policy::none())
}

/// A response's body, at most `limit` bytes (the rest is not read).
pub async fn read_limited(mut response: Response, limit: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| error_chain(&e.without_url()))?
    {
        let room = limit.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= limit {
            break;
        }
    }
    Ok(body)
}

/// An error with its causes, `outer: inner: innermost`.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
