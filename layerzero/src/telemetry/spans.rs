//! The `lz.select` and `lz.dispatch` spans: made with empty fields on the hot path (one
//! relaxed load when no subscriber wants them) and filled, redacted, only when enabled.

use super::redact;
use crate::capabilities::catalog::Catalog;
use crate::error::Error;
use crate::model::request::Request;

/// A `lz.select` span, fields still empty (filled by [`record_select`]).
#[inline]
pub(crate) fn select_span() -> tracing::Span {
    tracing::info_span!(
        target: "layerzero::select",
        "lz.select",
        op = tracing::field::Empty,
        kernel = tracing::field::Empty,
        backend = tracing::field::Empty,
        source = tracing::field::Empty,
        candidates = tracing::field::Empty,
        rejected = tracing::field::Empty,
        reasons = tracing::field::Empty,
        transform_cost_total = tracing::field::Empty,
        fused_ops = tracing::field::Empty,
        error = tracing::field::Empty,
    )
}

/// A selection as the `lz.select` span records it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Selected<'a> {
    pub kernel: &'a str,
    pub backend: &'a str,
    /// Plan, cache or live.
    pub source: &'static str,
    pub candidates: usize,
    pub rejected: usize,
    pub transform_ns: f64,
}

/// Fills an enabled `lz.select` span with `outcome` (the caller checks that the span is
/// enabled, so a disabled one costs nothing).
#[cold]
pub(crate) fn record_select(
    span: &tracing::Span,
    outcome: std::result::Result<Selected<'_>, &Error>,
    req: &Request,
    catalog: &Catalog,
) {
    use redact::Field;
    use tracing::field::display;
    let r = redact::current();
    span.record("op", display(Field(req.op.as_str(), r.ops())));
    match outcome {
        Ok(h) => {
            let fused =
                catalog.find(h.kernel).map(|k| crate::select::fused_ops(catalog.kernel(k).1, req)).unwrap_or_default();
            span.record("kernel", display(Field(h.kernel, r.kernels())));
            span.record("backend", display(Field(h.backend, r.backends())));
            span.record("source", h.source);
            span.record("candidates", count(h.candidates));
            span.record("rejected", count(h.rejected));
            span.record("transform_cost_total", h.transform_ns);
            span.record("fused_ops", display(fused.join(",")));
        }
        Err(e) => {
            span.record("reasons", count(e.reasons().len()));
            span.record("error", tracing::field::debug(e.kind()));
        }
    }
}

/// A count as a span attribute (OpenTelemetry attributes are signed).
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A `lz.dispatch` span, fields still empty (filled by [`record_dispatch`]).
#[inline]
pub(crate) fn dispatch_span() -> tracing::Span {
    tracing::info_span!(
        target: "layerzero::dispatch",
        "lz.dispatch",
        kernel = tracing::field::Empty,
        backend = tracing::field::Empty,
        source = tracing::field::Empty,
        fallback_attempts = tracing::field::Empty,
        failed = tracing::field::Empty,
        error = tracing::field::Empty,
    )
}

/// A dispatch as the `lz.dispatch` span records it.
#[derive(Debug, Clone)]
pub(crate) struct Dispatched<'a> {
    pub kernel: &'a str,
    pub backend: &'a str,
    /// Plan, cache or live.
    pub source: &'static str,
    /// The reason codes of the attempts that failed before it.
    pub failed: Vec<&'static str>,
}

/// Fills an enabled `lz.dispatch` span with `outcome` (the caller checks that the span is
/// enabled).
#[cold]
pub(crate) fn record_dispatch(span: &tracing::Span, outcome: std::result::Result<Dispatched<'_>, &Error>) {
    use redact::Field;
    use tracing::field::display;
    let r = redact::current();
    match outcome {
        Ok(d) => {
            span.record("kernel", display(Field(d.kernel, r.kernels())));
            span.record("backend", display(Field(d.backend, r.backends())));
            span.record("source", d.source);
            span.record("fallback_attempts", count(d.failed.len()));
            span.record("failed", display(d.failed.join(",")));
        }
        Err(e) => {
            let codes: Vec<&str> = e.reasons().iter().map(|r| r.code().as_str()).collect();
            span.record("fallback_attempts", count(e.reasons().len()));
            span.record("failed", display(codes.join(",")));
            span.record("error", tracing::field::debug(e.kind()));
        }
    }
}
