//! `/healthz`: PostgreSQL, Redis and Kafka checked, each within a bound.

use super::*;

/// A health check's answer, or why it has none after `limit`.
async fn within(
    limit: Duration,
    name: &str,
    check: impl Future<Output = Result<(), String>>,
) -> Result<(), String> {
    match tokio::time::timeout(limit, check).await {
        Ok(result) => result,
        Err(_) => Err(format!("{name} did not answer within {limit:?}")),
    }
}

/// PostgreSQL, Redis and Kafka, each with how it answered; 503 if any
/// failed.
pub(super) async fn healthz(State(state): State<Arc<AppState>>) -> Response {
    const LIMIT: Duration = Duration::from_secs(3);
    let postgres = async {
        let store = state.store().await.map_err(|e| e.to_string())?;
        store.ping().await.map_err(|e| e.to_string())
    };
    let redis = async {
        let pools = state.proxies().await.map_err(|e| e.to_string())?;
        pools.ping().await.map_err(|e| e.to_string())
    };
    // As the watcher last saw it (every 10 s): no Kafka client per request.
    let kafka = async {
        let view = state
            .kafka
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match (view.brokers, &state.settings.kafka_brokers) {
            (Some(result), _) => result,
            // Before the watcher's first look: one look now.
            (None, Some(brokers)) => crate::kafka::check_brokers(brokers, LIMIT)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            (None, None) => Ok(()),
        }
    };
    let (postgres, redis, kafka) = tokio::join!(
        within(LIMIT, "PostgreSQL", postgres),
        within(LIMIT, "Redis", redis),
        within(LIMIT, "Kafka", kafka)
    );
    let kafka = if state.settings.kafka_brokers.is_none() {
        None
    } else {
        Some(kafka)
    };
    let healthy = postgres.is_ok() && redis.is_ok() && kafka.as_ref().is_none_or(Result::is_ok);
    let health = Health {
        status: if healthy { "ok" } else { "unavailable" },
        checks: Checks {
            postgres: Check::of(postgres),
            redis: Check::of(redis),
            kafka: kafka.map(Check::of),
        },
    };
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(health)).into_response()
}

/// `GET /healthz`: `ok`, or `unavailable` with which check failed and why.
#[derive(Debug, Serialize)]
struct Health {
    status: &'static str,
    checks: Checks,
}

#[derive(Debug, Serialize)]
struct Checks {
    postgres: Check,
    redis: Check,
    /// Only where this process has brokers to check.
    #[serde(skip_serializing_if = "Option::is_none")]
    kafka: Option<Check>,
}

#[derive(Debug, Serialize)]
struct Check {
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl Check {
    fn of(result: Result<(), String>) -> Check {
        Check {
            ok: result.is_ok(),
            error: result.err(),
        }
    }
}
