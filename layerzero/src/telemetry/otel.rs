//! OpenTelemetry export of the `lz.select` and `lz.dispatch` spans (feature `otel`):
//! `LAYERZERO_OTEL=stdout` prints them, `LAYERZERO_OTEL=otlp` sends them over OTLP/HTTP to
//! `OTEL_EXPORTER_OTLP_ENDPOINT`. Tests export into memory ([`Exporter::in_memory`]).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::error::{Error, Result};
use crate::knobs::OtelExport;

/// A tracer provider and its exporter; flushed and shut down when dropped.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// The exporter `LAYERZERO_OTEL` names: `stdout` or `otlp`.
    pub fn new(kind: OtelExport) -> Result<Exporter> {
        let builder = SdkTracerProvider::builder();
        let provider = match kind {
            OtelExport::Stdout => builder.with_simple_exporter(opentelemetry_stdout::SpanExporter::default()).build(),
            OtelExport::Otlp => {
                let exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .build()
                    .map_err(|e| Error::invalid(format!("LAYERZERO_OTEL=otlp: cannot build the OTLP exporter: {e}")))?;
                builder.with_batch_exporter(exporter).build()
            }
        };
        Ok(Exporter { provider })
    }

    /// An exporter that keeps finished spans in memory, and the store to read them from.
    pub fn in_memory() -> (Exporter, InMemorySpanExporter) {
        let memory = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(memory.clone()).build();
        (Exporter { provider }, memory)
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans of this exporter.
    pub fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer().with_tracer(self.provider.tracer("layerzero"))
    }

    /// Exports every finished span now.
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.provider.force_flush();
        let _ = self.provider.shutdown();
    }
}
