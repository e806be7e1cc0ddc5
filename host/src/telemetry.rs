//! Logs and traces: one line per significant event on stderr, carrying the
//! fields of the spans it happened in (a batch, a function call, an awards
//! cycle, a delivery, an HTTP request), and, when an OTLP endpoint is set,
//! the same spans sent to a collector (OTLP over HTTP, protobuf).

use std::io::IsTerminal;

use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The log filter when `LAUREL_LOG` is unset.
const DEFAULT_FILTER: &str = "info,tokio_postgres=warn";

/// Tracing as set up for this process; spans still buffered are sent when
/// it is shut down.
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
}

/// Sets up logging to stderr (`LAUREL_LOG` filters it) and, if
/// `otlp_endpoint` is given (a collector's base URL, e.g.
/// `http://127.0.0.1:4318`), span export to it. Call before any async
/// runtime starts: the exporter sends from a thread of its own.
pub fn init(otlp_endpoint: Option<&str>) -> anyhow::Result<Telemetry> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LAUREL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let traces = otlp_endpoint.map(tracer_provider).transpose()?;
    let export = traces
        .as_ref()
        .map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer("laurel")));
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colours for a terminal, plain text for a file or a pipe.
                .with_ansi(std::io::stderr().is_terminal()),
        )
        .with(export)
        .init();
    Ok(Telemetry { traces })
}

impl Telemetry {
    /// Sends the spans still buffered (waits for the collector, within the
    /// exporter's timeout).
    pub fn shutdown(self) {
        if let Some(provider) = self.traces
            && let Err(error) = provider.shutdown()
        {
            eprintln!("warning: the last spans could not be sent to the OTLP collector: {error}");
        }
    }
}

/// The collector's traces URL: `<endpoint>/v1/traces` unless given whole.
fn traces_url(endpoint: &str) -> String {
    let endpoint = endpoint.trim_end_matches('/');
    if endpoint.ends_with("/v1/traces") {
        endpoint.to_string()
    } else {
        format!("{endpoint}/v1/traces")
    }
}

fn tracer_provider(endpoint: &str) -> anyhow::Result<SdkTracerProvider> {
    let url = traces_url(endpoint);
    // The exporter's HTTP client (reqwest, rustls without a built-in
    // provider) uses the process's provider, as every client of Laurel's.
    crate::outbound::install_tls();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(&url)
        .build()
        .with_context(|| {
            format!(
                "cannot export spans to {} (LAUREL_OTLP_ENDPOINT)",
                crate::secrets::redact_url(&url)
            )
        })?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("laurel").build())
        .build())
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn the_traces_path_is_added_once() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces/"),
            "http://c:4318/v1/traces"
        );
    }
}
