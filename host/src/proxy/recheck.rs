//! The proxy re-checker role: checks pool members as they fall due, so a
//! member that stopped forwarding leaves its pool and one that came back
//! returns. Any number of processes may run it (the checks are claimed in
//! PostgreSQL).

use std::time::Duration;

use tracing::warn;

use super::ProxyPools;
use super::candidates::{ProxyPoolError, recheck_due};
use crate::store::Store;

/// The re-checker role: checks candidates as they fall due until
/// `shutdown`; rides out PostgreSQL or Redis being away.
pub async fn run(
    database_url: &str,
    redis_url: &str,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let mut pause = Duration::from_millis(200);
    loop {
        let connected = async {
            let store = Store::connect(database_url)
                .await
                .map_err(ProxyPoolError::from)?;
            let pools = ProxyPools::connect(redis_url).await?;
            Ok::<_, ProxyPoolError>((store, pools))
        };
        let (store, pools) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            connected = connected => match connected {
                Ok(both) => both,
                Err(error) => {
                    warn!(message = "Proxy re-checker cannot start; retrying.", %error);
                    tokio::select! {
                        _ = &mut shutdown => return Ok(()),
                        _ = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                    continue;
                }
            },
        };
        pause = Duration::from_millis(200);
        loop {
            let step = async {
                let checked = recheck_due(&store, &pools, 64).await?;
                if checked > 0 {
                    return Ok::<_, ProxyPoolError>(Duration::ZERO);
                }
                let next = store.next_proxy_check_due().await?;
                Ok(next
                    .map(|due| (due - chrono::Utc::now()).to_std().unwrap_or_default())
                    .unwrap_or(Duration::from_secs(1))
                    .clamp(Duration::from_millis(20), Duration::from_secs(1)))
            };
            let wait = tokio::select! {
                _ = &mut shutdown => return Ok(()),
                wait = step => wait,
            };
            match wait {
                Ok(wait) if wait.is_zero() => continue,
                Ok(wait) => tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    _ = tokio::time::sleep(wait) => {}
                },
                Err(ProxyPoolError::Store(error)) => {
                    warn!(message = "Proxy re-checker lost the database; reconnecting.", %error);
                    break;
                }
                Err(error) => {
                    warn!(message = "Proxy re-check failed; retrying.", %error);
                    tokio::select! {
                        _ = &mut shutdown => return Ok(()),
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    }
}
