//! Kafka as the API shows it: one background task reads the brokers'
//! health and every source's and pipeline's consumer lag, cached for
//! `/healthz`, `/metrics` and `/admin/v1/sources`.

use super::*;

/// Kafka as the API shows it, read by one background task (`watch_kafka`)
/// and cached: `/healthz`, `/metrics` and `/admin/v1/sources` make no Kafka
/// client per request (an unauthenticated flood costs nothing there).
#[derive(Debug, Default, Clone)]
pub(super) struct KafkaView {
    /// None until the first read.
    pub(super) brokers: Option<Result<(), String>>,
    /// Consumer lag by source.
    pub(super) lag: HashMap<String, Result<i64, String>>,
    /// Sources whose topic does not exist yet (nothing was produced to
    /// it): their consumers wait for it.
    pub(super) waiting: std::collections::HashSet<String>,
    /// The pre-filter's consumer lag by pipeline (on its input topic).
    pub(super) pipeline_lag: HashMap<String, Result<i64, String>>,
}

pub(super) async fn watch_kafka(
    view: std::sync::Weak<std::sync::RwLock<KafkaView>>,
    brokers: String,
    group_prefix: String,
    database_url: String,
    every: Duration,
) {
    let mut store: Option<crate::store::Store> = None;
    loop {
        let Some(shared) = view.upgrade() else {
            return;
        };
        let health = crate::kafka::check_brokers(&brokers, Duration::from_secs(3))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string());
        if store.as_ref().is_none_or(|s| s.is_closed()) {
            store = crate::store::Store::connect(&database_url).await.ok();
        }
        let (sources, pipelines) = match &store {
            Some(store) => (
                store.sources().await.unwrap_or_default(),
                store.pipelines().await.unwrap_or_default(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        let mut lag = HashMap::new();
        let mut waiting = std::collections::HashSet::new();
        let mut pipeline_lag = HashMap::new();
        if health.is_ok() {
            let behind = |group: String, topic: String| {
                let brokers = brokers.clone();
                async move { crate::kafka::consumer_lag(&brokers, &group, &topic).await }
            };
            for source in sources {
                let group = crate::kafka::source_group(&group_prefix, &source.name);
                let value = behind(group, source.topic).await;
                if matches!(value, Err(crate::kafka::BrokerError::NoTopic(_))) {
                    waiting.insert(source.name.clone());
                }
                lag.insert(source.name, value.map_err(|e| e.to_string()));
            }
            for pipeline in pipelines {
                let group = crate::kafka::pipeline_group(&group_prefix, &pipeline.name);
                let value = behind(group, pipeline.input_topic).await;
                pipeline_lag.insert(pipeline.name, value.map_err(|e| e.to_string()));
            }
        }
        *shared.write().unwrap_or_else(|p| p.into_inner()) = KafkaView {
            brokers: Some(health),
            lag,
            waiting,
            pipeline_lag,
        };
        drop(shared);
        tokio::time::sleep(every).await;
    }
}
