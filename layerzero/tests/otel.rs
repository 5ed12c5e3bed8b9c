//! The OpenTelemetry export (feature `otel`): the spans of a dispatch reach an exporter with
//! their attributes. Run: `cargo test -p layerzero --features otel --test otel`.

use layerzero::exec::args::{LinearArgs, OpArgs};
use layerzero::model::attrs::NoAttrs;
use layerzero::runtime::LayerZero;
use layerzero::telemetry::otel::Exporter;
use layerzero::tensor::HostTensor;
use opentelemetry::Value;
use tracing_subscriber::layer::SubscriberExt;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn linear() -> layerzero::Result<OpArgs> {
    let t = |shape: &[usize]| HostTensor::from_f32(shape, vec![0.25; shape.iter().product()]);
    Ok(OpArgs::Linear(LinearArgs { x: t(&[4, 32])?, weight: t(&[16, 32])?, bias: None, attrs: NoAttrs {} }))
}

fn attribute(span: &opentelemetry_sdk::trace::SpanData, key: &str) -> Option<Value> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.clone())
}

#[test]
fn dispatch_and_select_spans_reach_the_exporter_with_their_attributes() -> TestResult {
    let (exporter, memory) = Exporter::in_memory();
    let subscriber = tracing_subscriber::registry().with(exporter.layer());
    let lz = LayerZero::detected()?;
    let args = linear()?;
    let kernel =
        tracing::subscriber::with_default(subscriber, || lz.dispatch(&args).map(|d| d.selection().kernel.clone()))?;
    exporter.flush();
    let spans = memory.get_finished_spans()?;
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    assert!(names.contains(&"lz.select") && names.contains(&"lz.dispatch"), "{names:?}");
    let dispatch = spans.iter().find(|s| s.name == "lz.dispatch").ok_or("no dispatch span")?;
    let select = spans.iter().find(|s| s.name == "lz.select").ok_or("no select span")?;
    assert_eq!(attribute(dispatch, "kernel"), Some(Value::from(kernel.clone())));
    assert_eq!(attribute(dispatch, "fallback_attempts"), Some(Value::I64(0)));
    assert_eq!(attribute(select, "kernel"), Some(Value::from(kernel)));
    assert_eq!(attribute(select, "source"), Some(Value::from("live")));
    assert!(attribute(select, "candidates").is_some() && attribute(select, "transform_cost_total").is_some());
    assert_eq!(select.parent_span_id, dispatch.span_context.span_id(), "selection happens inside the dispatch");
    Ok(())
}
