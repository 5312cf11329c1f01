//! Logs and traces: the service's `tracing` spans and events go to stderr (JSON or text, filtered
//! by `RUST_LOG`), and — when `telemetry.otlp_endpoint` is set — its spans also go to an
//! OpenTelemetry collector over OTLP/HTTP (protobuf), as traces: a span per request, per call,
//! per tool run, per sandbox run and per store write, each a child of the one that waited for it.
//!
//! The export runs on the SDK's batch processor thread, never on the request path: a slow or
//! absent collector costs a full queue (spans beyond it are dropped), not latency. What is
//! queued is flushed when the service stops ([`Telemetry::shutdown`]).
use std::time::Duration;

use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::{Deserialize, Serialize};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// `[telemetry]`: where traces go (docs/operator.md, "Traces").
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP endpoint of a collector: its base URL (`http://otel-collector:4318`, to
    /// which `/v1/traces` is added) or the full traces URL. Unset: no traces are exported.
    pub otlp_endpoint: Option<String>,
}

impl std::fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetryConfig")
            .field(
                "otlp_endpoint",
                &self.otlp_endpoint.as_deref().map(crate::config::redact_url),
            )
            .finish()
    }
}

/// How long an export may take before the exporter gives up on it: a collector that does not
/// answer holds the export thread no longer than this (spans queue meanwhile, then drop).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The traces URL for a configured endpoint: a base URL gets `/v1/traces` (as
/// `OTEL_EXPORTER_OTLP_ENDPOINT` does), a URL that already ends in it is kept.
pub fn traces_url(endpoint: &str) -> anyhow::Result<String> {
    let mut url = url::Url::parse(endpoint)
        .map_err(|e| anyhow::anyhow!("telemetry.otlp_endpoint {endpoint:?} is not a URL: {e}"))?;
    anyhow::ensure!(
        matches!(url.scheme(), "http" | "https"),
        "telemetry.otlp_endpoint {endpoint:?}: OTLP/HTTP needs an http:// or https:// URL (the collector's port 4318, not the gRPC port 4317)"
    );
    if !url.path().ends_with("/v1/traces") {
        let path = format!("{}/v1/traces", url.path().trim_end_matches('/'));
        url.set_path(&path);
    }
    Ok(url.to_string())
}

/// The trace export, if on; hand it back at shutdown to flush what is queued.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans still queued and stops the exporter. Blocks (on the export's HTTP
    /// request): call it off the async workers.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(e) = provider.shutdown()
        {
            // The subscriber may be gone with the exporter: say it on stderr directly.
            eprintln!("toolexec: flushing traces at shutdown failed: {e}");
        }
    }
}

/// Installs the global subscriber: logs on stderr in `format` (`json` or `text`) filtered by
/// `RUST_LOG` (default `info`), and the OTLP exporter when `config.otlp_endpoint` is set, with
/// `node` as the service instance. `RUST_LOG` filters the traces too: the service's spans are
/// at `info`, so a filter that turns the service's `info` off turns its traces off.
pub fn init(format: &str, config: &TelemetryConfig, node: &str) -> anyhow::Result<Telemetry> {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // The OpenTelemetry crates' own diagnostics (a target prefix: the SDK, the exporter) at
    // `warn` at most, whatever RUST_LOG asks: their debug events are emitted while spans are
    // being ended and exported, which must not be traced in turn.
    if let Ok(directive) = "opentelemetry=warn".parse() {
        filter = filter.add_directive(directive);
    }
    // The MCP SDK (the proxy's client to operators' upstream servers) logs at `info` every
    // notification an upstream sends and the upstream's self-description, whole: upstream
    // content, up to megabytes, that must not reach the logs (nor escape the token masking
    // of what the proxy records). Its warnings and errors are kept.
    if let Ok(directive) = "rmcp=warn".parse() {
        filter = filter.add_directive(directive);
    }
    // Colours only for a person at a terminal: escape codes in a log file or a collector are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let logs = if format == "text" {
        logs.boxed()
    } else {
        logs.json()
            .flatten_event(true)
            .with_current_span(true)
            // A span's fields appended to as they are recorded, not parsed and rewritten.
            .fmt_fields(crate::span_fields::JsonSpanFields)
            .boxed()
    };
    let (provider, traces) = match &config.otlp_endpoint {
        None => (None, None),
        Some(endpoint) => {
            let provider = tracer_provider(endpoint, node)?;
            // W3C trace context in and out (a caller's traceparent, forwarded requests).
            opentelemetry::global::set_text_map_propagator(
                opentelemetry_sdk::propagation::TraceContextPropagator::new(),
            );
            let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("toolexec"));
            (Some(provider), Some(layer))
        }
    };
    // One filter for both: per-layer filters (a second filter for the traces alone) dropped
    // some of the log's events here (tracing-subscriber's per-layer filter state with two
    // filtered layers), "listening" among them. The service's spans are all at `info`.
    tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(traces)
        .try_init()
        .context("installing the log subscriber")?;
    Ok(Telemetry { provider })
}

fn tracer_provider(endpoint: &str, node: &str) -> anyhow::Result<SdkTracerProvider> {
    let url = traces_url(endpoint)?;
    // reqwest is built with `rustls-no-provider` (web_fetch brings its own TLS configuration):
    // an https collector needs the process-wide provider installed first.
    toolexec_tools::web::install_tls_provider();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .with_context(|| format!("building the OTLP exporter for {url}"))?;
    let resource = Resource::builder()
        .with_service_name("toolexec")
        .with_attribute(opentelemetry::KeyValue::new(
            "service.instance.id",
            node.to_owned(),
        ))
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_gets_the_traces_path_and_a_full_one_is_kept() {
        assert_eq!(
            traces_url("http://collector:4318").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/").unwrap(),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.example/ingest/v1/traces").unwrap(),
            "https://otel.example/ingest/v1/traces"
        );
        assert_eq!(
            traces_url("http://otel.example/ingest/").unwrap(),
            "http://otel.example/ingest/v1/traces"
        );
        assert!(traces_url("collector:4317").is_err());
        assert!(traces_url("grpc://collector:4317").is_err());
    }
}
