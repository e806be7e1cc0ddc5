//! HTTP functions: the components `spin.toml` routes to, served for paths
//! no Laurel route takes, swapped in when a new version is pushed.

use super::*;

/// A version of an HTTP function, read from the registry.
pub(super) async fn pushed_component(
    store: &crate::store::Store,
    name: &str,
    version: i32,
) -> anyhow::Result<PushedComponent> {
    let found = store
        .function_version(name, version)
        .await?
        .ok_or_else(|| anyhow::anyhow!("{name} has no version {version}"))?;
    Ok(PushedComponent {
        version,
        sha256: found.sha256,
        bytes: found.bytes,
    })
}

/// How often the HTTP functions are compared with the registry even
/// without a change announced (the registry re-reads every 30 s).
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Keeps the served HTTP functions on the registry's live versions: after
/// a push, promote or rollback (the registry's sync), each component whose
/// live version moved is compiled and swapped in. A version that cannot be
/// served is logged once, and the current code stays.
pub(super) async fn follow_pushes(state: std::sync::Weak<AppState>, functions: Arc<HttpFunctions>) {
    let mut refused: HashMap<String, i32> = HashMap::new();
    let mut seen = None;
    loop {
        let Some(state) = state.upgrade() else {
            return;
        };
        let registry = Arc::clone(&state.registry);
        let generation = registry.generation();
        if seen != Some(generation) {
            seen = Some(generation);
            let live = registry.http_functions();
            for (id, origin) in functions.origins() {
                let Some((version, sha256)) = live.get(&id) else {
                    continue;
                };
                let current = crate::runtime::http::Origin::Pushed {
                    version: *version,
                    sha256: sha256.clone(),
                };
                if origin == current || refused.get(&id) == Some(version) {
                    continue;
                }
                let swapped = match state.store().await {
                    Ok(store) => swap(&store, &functions, &id, *version).await,
                    Err(error) => Err(anyhow::anyhow!("{error}")),
                };
                match swapped {
                    Ok(()) => {
                        refused.remove(&id);
                        tracing::info!(message = "HTTP function swapped to a pushed version.", component = %id, version, from = ?origin);
                    }
                    Err(error) => {
                        // Read again at the next change or tick; a version
                        // that cannot be served is not tried again.
                        if error.is::<crate::runtime::http::ManifestError>() {
                            refused.insert(id.clone(), *version);
                        } else {
                            seen = None;
                        }
                        tracing::error!(message = "HTTP function not swapped; it serves what it served.", component = %id, version, %error);
                    }
                }
            }
        }
        drop(state);
        tokio::select! {
            _ = registry.changed() => {}
            _ = tokio::time::sleep(FOLLOW_EVERY) => {}
        }
    }
}

async fn swap(
    store: &crate::store::Store,
    functions: &Arc<HttpFunctions>,
    id: &str,
    version: i32,
) -> anyhow::Result<()> {
    let pushed = pushed_component(store, id, version).await?;
    let (functions, id) = (Arc::clone(functions), id.to_string());
    tokio::task::spawn_blocking(move || functions.swap(&id, &pushed)).await??;
    Ok(())
}

/// A path no Laurel route takes: an HTTP function's, if `spin.toml`
/// routes it to one, else 404.
pub(super) async fn http_function(
    State(state): State<Arc<AppState>>,
    request: Request,
) -> Response {
    let Some(functions) = state
        .functions
        .get()
        .filter(|f| f.serves(request.uri().path()))
    else {
        return no_route(request).await.into_response();
    };
    let limit = state.settings.max_body_bytes;
    let (parts, body) = request.into_parts();
    let bytes = match super::read_body(body, limit).await {
        Ok(bytes) => bytes,
        Err(error) => return error.into_response(),
    };
    match functions
        .handle(axum::http::Request::from_parts(parts, bytes), None)
        .await
    {
        Some(Ok(response)) => response.map(axum::body::Body::from).into_response(),
        Some(Err(error)) => ApiError::from(error).into_response(),
        None => ApiError::NotFound("no route".into()).into_response(),
    }
}
