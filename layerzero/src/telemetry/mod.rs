//! Telemetry (E2E spec §12, §14): the `lz.select` and `lz.dispatch` tracing spans, the
//! structured selection log, redaction, the handle's recent decisions, and the subscriber
//! the CLI installs (and an engine may) from `LAYERZERO_LOG` and `LAYERZERO_OTEL`.
//!
//! Spans and events go through `tracing`: with no subscriber, or one that filters them out,
//! a span costs one relaxed load at its call site and no field is computed. Decisions
//! (live selections, fallbacks, breakers opening) are also kept in a bounded in-memory ring
//! per handle ([`Recent`]), for `lz snapshot` and engines that report on themselves; plan and
//! cache hits repeat a decision already logged and are not recorded.

#[cfg(feature = "otel")]
pub mod otel;
mod recent;
pub mod redact;
mod spans;

pub use recent::{Recent, Rejection, SelectionRecord};
pub(crate) use spans::{Dispatched, Selected, dispatch_span, record_dispatch, record_select, select_span};

use crate::error::{Error, Result};

/// The selection span's name.
pub const SELECT_SPAN: &str = "lz.select";
/// The dispatch span's name.
pub const DISPATCH_SPAN: &str = "lz.dispatch";
/// The target of selection-log events (filter with `layerzero::selection=info`).
pub const SELECTION_TARGET: &str = "layerzero::selection";

/// How `LAYERZERO_LOG` asks the log to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSpec {
    /// One JSON object per line, else human-readable text.
    pub json: bool,
    /// `RUST_LOG`-style directives (default `layerzero=info`).
    pub filter: String,
}

/// Parses `LAYERZERO_LOG`: `json` or `text`, optionally followed by `RUST_LOG`-style
/// directives, comma-separated (`json,layerzero::dispatch=debug`).
pub fn parse_log(spec: &str) -> Result<LogSpec> {
    let mut parts = spec.splitn(2, ',');
    let format = parts.next().unwrap_or_default().trim();
    let json = match format {
        "json" => true,
        "text" => false,
        other => {
            return Err(Error::invalid(format!(
                "LAYERZERO_LOG={spec:?}: the first item {other:?} must be json or text (then RUST_LOG-style directives)"
            )));
        }
    };
    let filter = parts.next().map(str::trim).filter(|f| !f.is_empty()).unwrap_or("layerzero=info").to_owned();
    tracing_subscriber::EnvFilter::try_new(&filter)
        .map_err(|e| Error::invalid(format!("LAYERZERO_LOG={spec:?}: directives {filter:?}: {e}")))?;
    Ok(LogSpec { json, filter })
}

/// Keeps exporters alive; flushes them when dropped.
#[derive(Default)]
pub struct Telemetry {
    /// Held for its `Drop` (flush and shutdown).
    #[cfg(feature = "otel")]
    _otel: Option<otel::Exporter>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

/// Installs the process's subscriber from `LAYERZERO_LOG` (a log on standard error) and
/// `LAYERZERO_OTEL` (span export, with the `otel` feature) in `settings`; nothing when
/// neither is set. Fails on a bad log spec, or when another subscriber is already installed.
pub fn init(settings: &crate::knobs::Settings) -> Result<Telemetry> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};

    let log = settings.log.as_deref().map(parse_log).transpose()?;
    let otel_kind = settings.otel;
    if log.is_none() && otel_kind.is_none() {
        return Ok(Telemetry::default());
    }
    let fmt_layer = log.map(|spec| {
        let filter = EnvFilter::new(&spec.filter);
        let base = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(false);
        if spec.json { base.json().with_filter(filter).boxed() } else { base.with_filter(filter).boxed() }
    });
    let registry = tracing_subscriber::registry().with(fmt_layer);
    #[cfg(feature = "otel")]
    {
        let exporter = otel_kind.map(otel::Exporter::new).transpose()?;
        let layer = exporter.as_ref().map(|e| e.layer());
        registry
            .with(layer)
            .try_init()
            .map_err(|e| Error::invalid(format!("cannot install the telemetry subscriber: {e}")))?;
        Ok(Telemetry { _otel: exporter })
    }
    #[cfg(not(feature = "otel"))]
    {
        if let Some(kind) = otel_kind {
            return Err(Error::invalid(format!(
                "LAYERZERO_OTEL={:?}: this build has no OpenTelemetry export (build with the `otel` feature)",
                crate::knobs::KnobValue::show(&kind)
            )));
        }
        registry.try_init().map_err(|e| Error::invalid(format!("cannot install the telemetry subscriber: {e}")))?;
        Ok(Telemetry::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    #[test]
    fn the_log_spec_takes_a_format_and_rust_log_directives_and_names_a_bad_one() -> TestResult {
        assert_eq!(parse_log("json").ok(), Some(LogSpec { json: true, filter: "layerzero=info".to_owned() }));
        let spec = parse_log("text,layerzero::dispatch=debug")?;
        assert_eq!((spec.json, spec.filter.as_str()), (false, "layerzero::dispatch=debug"));
        let err = parse_log("yaml").err().ok_or("an unknown log format must be refused")?.to_string();
        assert!(err.contains("LAYERZERO_LOG") && err.contains("yaml"), "{err}");
        assert!(parse_log("json,layerzero=loud").is_err());
        Ok(())
    }
}
