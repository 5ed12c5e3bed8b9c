//! The `lz.select` and `lz.dispatch` spans: made with empty fields on the hot path (one
//! relaxed load when no subscriber wants them) and filled, redacted, only when enabled.

use super::redact;
use crate::error::Result;

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

/// Fills a `lz.select` span (nothing is computed when the span is disabled). `reasons` is
/// the number of rejection reasons an error carries.
#[inline]
pub(crate) fn record_select(
    span: &tracing::Span,
    hit: &Result<crate::runtime::Hit<'_>>,
    req: impl FnOnce() -> crate::model::request::Request,
    catalog: &crate::capabilities::catalog::Catalog,
) {
    if span.is_disabled() {
        return;
    }
    record_select_slow(span, hit, req(), catalog);
}

#[cold]
fn record_select_slow(
    span: &tracing::Span,
    hit: &Result<crate::runtime::Hit<'_>>,
    req: crate::model::request::Request,
    catalog: &crate::capabilities::catalog::Catalog,
) {
    use redact::Field;
    use tracing::field::display;
    let r = redact::current();
    span.record("op", display(Field(req.op.as_str(), r.ops())));
    match hit {
        Ok(h) => {
            let fused = catalog
                .find(&h.kernel)
                .map(|k| crate::select::fused_ops(catalog.kernel(k).1, &req))
                .unwrap_or_default();
            span.record("kernel", display(Field(&h.kernel, r.kernels())));
            span.record("backend", display(Field(&h.backend, r.backends())));
            span.record("source", h.source().as_str());
            span.record("candidates", count(h.candidates));
            span.record("rejected", count(h.rejected));
            span.record("transform_cost_total", h.score.transform_ns);
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

/// Fills a `lz.dispatch` span.
#[inline]
pub(crate) fn record_dispatch(span: &tracing::Span, result: &Result<crate::runtime::Dispatch<'_>>) {
    if span.is_disabled() {
        return;
    }
    record_dispatch_slow(span, result);
}

#[cold]
fn record_dispatch_slow(span: &tracing::Span, result: &Result<crate::runtime::Dispatch<'_>>) {
    use redact::Field;
    use tracing::field::display;
    let r = redact::current();
    match result {
        Ok(d) => {
            let sel = d.selection();
            span.record("kernel", display(Field(&sel.kernel, r.kernels())));
            span.record("backend", display(Field(&sel.backend, r.backends())));
            span.record("source", d.source().as_str());
            span.record("fallback_attempts", count(d.failed().len()));
            let codes: Vec<&str> =
                d.failed().iter().filter_map(|a| a.reason.as_ref().map(|r| r.code().as_str())).collect();
            span.record("failed", display(codes.join(",")));
        }
        Err(e) => {
            let codes: Vec<&str> = e.reasons().iter().map(|r| r.code().as_str()).collect();
            span.record("fallback_attempts", count(e.reasons().len()));
            span.record("failed", display(codes.join(",")));
            span.record("error", tracing::field::debug(e.kind()));
        }
    }
}
