//! OpenTelemetry export of the `lz.select` and `lz.dispatch` spans (feature `otel`):
//! `LAYERZERO_OTEL=stdout` prints them, `LAYERZERO_OTEL=otlp` sends them over OTLP/HTTP to
//! `OTEL_EXPORTER_OTLP_ENDPOINT`. Tests export into memory ([`Exporter::in_memory`]);
//! `lz snapshot` captures the spans of its workload's calls ([`capture`]) and writes them as
//! OTLP/JSON ([`otlp_json`]: the document an OTLP/HTTP collector accepts in JSON).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
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

/// Runs `f` on this thread with its spans exported into memory: its result and the finished
/// spans as an OTLP/JSON document ([`otlp_json`]). A subscriber installed before is not
/// told of these spans.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, serde_json::Value) {
    use tracing_subscriber::layer::SubscriberExt;
    let (exporter, memory) = Exporter::in_memory();
    let subscriber = tracing_subscriber::registry().with(exporter.layer());
    let out = tracing::subscriber::with_default(subscriber, f);
    exporter.flush();
    (out, otlp_json(&memory.get_finished_spans().unwrap_or_default()))
}

/// Spans as the OTLP/JSON trace document (`resourceSpans` / `scopeSpans` / `spans`): ids in
/// hex, times as decimal strings of Unix nanoseconds, attributes as typed values, as the
/// protobuf JSON mapping of OTLP writes them.
pub fn otlp_json(spans: &[SpanData]) -> serde_json::Value {
    let spans: Vec<serde_json::Value> = spans.iter().map(span_json).collect();
    serde_json::json!({"resourceSpans": [{
        "resource": {"attributes": [attribute(&KeyValue::new("service.name", "layerzero"))]},
        "scopeSpans": [{"scope": {"name": "layerzero", "version": env!("CARGO_PKG_VERSION")}, "spans": spans}],
    }]})
}

fn span_json(s: &SpanData) -> serde_json::Value {
    use opentelemetry::trace::{SpanId, SpanKind, Status};
    let nanos = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0).to_string()
    };
    // OTLP's enum numbers: SPAN_KIND_INTERNAL = 1 ...; STATUS_CODE_OK = 1, _ERROR = 2.
    let kind = match s.span_kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    let status = match &s.status {
        Status::Unset => serde_json::json!({}),
        Status::Ok => serde_json::json!({"code": 1}),
        Status::Error { description } => serde_json::json!({"code": 2, "message": description}),
    };
    let parent = if s.parent_span_id == SpanId::INVALID { String::new() } else { s.parent_span_id.to_string() };
    serde_json::json!({
        "traceId": s.span_context.trace_id().to_string(),
        "spanId": s.span_context.span_id().to_string(),
        "parentSpanId": parent,
        "name": s.name,
        "kind": kind,
        "startTimeUnixNano": nanos(s.start_time),
        "endTimeUnixNano": nanos(s.end_time),
        "attributes": s.attributes.iter().map(attribute).collect::<Vec<_>>(),
        "status": status,
    })
}

fn attribute(kv: &KeyValue) -> serde_json::Value {
    serde_json::json!({"key": kv.key.as_str(), "value": any_value(&kv.value)})
}

fn any_value(v: &Value) -> serde_json::Value {
    match v {
        Value::Bool(b) => serde_json::json!({"boolValue": b}),
        // int64 is a decimal string in the protobuf JSON mapping.
        Value::I64(i) => serde_json::json!({"intValue": i.to_string()}),
        Value::F64(f) => serde_json::json!({"doubleValue": f}),
        other => serde_json::json!({"stringValue": other.as_str()}),
    }
}
