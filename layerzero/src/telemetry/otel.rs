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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::args::{LinearArgs, OpArgs};
    use crate::model::attrs::NoAttrs;
    use crate::runtime::LayerZero;
    use crate::tensor::HostTensor;
    use opentelemetry::Value;
    use tracing_subscriber::layer::SubscriberExt;

    fn linear() -> OpArgs {
        let t = |shape: &[usize]| {
            HostTensor::from_f32(shape, vec![0.25; shape.iter().product()]).unwrap_or_else(|e| panic!("{e}"))
        };
        OpArgs::Linear(LinearArgs { x: t(&[4, 32]), weight: t(&[16, 32]), bias: None, attrs: NoAttrs {} })
    }

    fn attribute(span: &opentelemetry_sdk::trace::SpanData, key: &str) -> Option<Value> {
        span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.clone())
    }

    #[test]
    fn dispatch_and_select_spans_reach_the_exporter_with_their_attributes() {
        let (exporter, memory) = Exporter::in_memory();
        let subscriber = tracing_subscriber::registry().with(exporter.layer());
        let lz = LayerZero::detected().unwrap_or_else(|e| panic!("{e}"));
        let kernel = tracing::subscriber::with_default(subscriber, || {
            lz.dispatch(&linear()).map(|d| d.selection().kernel.clone()).unwrap_or_else(|e| panic!("{e}"))
        });
        exporter.flush();
        let spans = memory.get_finished_spans().unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert!(names.contains(&"lz.select") && names.contains(&"lz.dispatch"), "{names:?}");
        let dispatch = spans.iter().find(|s| s.name == "lz.dispatch").unwrap_or_else(|| panic!("no dispatch span"));
        let select = spans.iter().find(|s| s.name == "lz.select").unwrap_or_else(|| panic!("no select span"));
        assert_eq!(attribute(dispatch, "kernel"), Some(Value::from(kernel.clone())));
        assert_eq!(attribute(dispatch, "fallback_attempts"), Some(Value::I64(0)));
        assert_eq!(attribute(select, "kernel"), Some(Value::from(kernel)));
        assert_eq!(attribute(select, "source"), Some(Value::from("live")));
        assert!(attribute(select, "candidates").is_some() && attribute(select, "transform_cost_total").is_some());
        assert_eq!(select.parent_span_id, dispatch.span_context.span_id(), "selection happens inside the dispatch");
    }
}
