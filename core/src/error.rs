//! The one public error type: opaque, with a kind and the reasons behind it.

use std::fmt;
use std::sync::Arc;

use crate::reason::Reason;

/// What went wrong, broadly. Match on this, not on messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A request, capability, hardware or policy document is malformed or names an unknown value.
    InvalidInput,
    /// A file could not be read or written.
    Io,
    /// A document does not satisfy its JSON Schema.
    Schema,
    /// No kernel qualifies for the request; `reasons()` lists why, per candidate.
    NoKernel,
    /// Kernels qualified, but every eligible one failed when it ran; `reasons()` lists each
    /// attempt and why it failed.
    KernelFailed,
    /// A policy lock names a kernel that is not eligible; `reasons()` lists why.
    LockViolation,
    /// A named hardware profile does not exist.
    UnknownHardware,
    /// The ranks of a distributed engine would not serve the same kernels: their catalogs,
    /// policies, tables, hardware, libraries or per-bucket choices differ (the message names
    /// the ranks and what differs).
    PlanMismatch,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::InvalidInput,
        ErrorKind::Io,
        ErrorKind::Schema,
        ErrorKind::NoKernel,
        ErrorKind::KernelFailed,
        ErrorKind::LockViolation,
        ErrorKind::UnknownHardware,
        ErrorKind::PlanMismatch,
    ];

    /// A stable snake_case name (what crosses a process boundary).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Io => "io",
            ErrorKind::Schema => "schema",
            ErrorKind::NoKernel => "no_kernel",
            ErrorKind::KernelFailed => "kernel_failed",
            ErrorKind::LockViolation => "lock_violation",
            ErrorKind::UnknownHardware => "unknown_hardware",
            ErrorKind::PlanMismatch => "plan_mismatch",
        }
    }

    /// The kind named `name` ([`ErrorKind::as_str`]).
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// LayerZero's error: a kind, a one-line message that names the field and the value, and
/// (for selection failures) every reason collected on the way.
#[derive(Debug, Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    reasons: Vec<Reason>,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// The longest message an error keeps: a value echoed back (a 10 MB environment variable, a
/// huge JSON field) is cut here, with a note of how much was left out.
const MAX_MESSAGE: usize = 2048;

fn bounded(mut message: String) -> String {
    if message.len() <= MAX_MESSAGE {
        return message;
    }
    let cut = (0..=MAX_MESSAGE).rev().find(|&i| message.is_char_boundary(i)).unwrap_or(0);
    let left = message.len() - cut;
    message.truncate(cut);
    message.push_str(&format!("... ({left} more bytes)"));
    message
}

impl Error {
    /// An error of `kind` with `message` (bounded: a huge message is cut, saying how much).
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: bounded(message.into()), reasons: Vec::new(), source: None }
    }

    /// The same error caused by `source` (an I/O, SQLite or library error), which
    /// [`std::error::Error::source`] returns.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Error {
        self.source = Some(Arc::new(source));
        self
    }

    /// The same error carrying `reasons` (every candidate's verdict, say).
    pub fn with_reasons(mut self, reasons: Vec<Reason>) -> Error {
        self.reasons = reasons;
        self
    }

    /// An [`ErrorKind::InvalidInput`] error with `message`.
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidInput, message)
    }

    /// The same error with `origin: ` in front of its message (a file, an entry).
    pub fn context(mut self, origin: &str) -> Error {
        self.message = bounded(format!("{origin}: {}", self.message));
        self
    }

    /// The broad kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The reasons behind a selection failure (empty for other kinds).
    pub fn reasons(&self) -> &[Reason] {
        &self.reasons
    }

    /// The message without the reasons.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Result with LayerZero's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_echoed_value_is_cut_with_a_note_of_what_was_left_out() {
        let value = "é".repeat(1 << 20);
        let e = Error::invalid(format!("LAYERZERO_TEST_X={value:?}: expected a number"));
        assert!(e.message().len() <= MAX_MESSAGE + 40, "{} bytes", e.message().len());
        assert!(e.message().starts_with("LAYERZERO_TEST_X=\"éé") && e.message().ends_with("more bytes)"));
        let short = Error::invalid("short".to_owned()).context("file.json");
        assert_eq!(short.message(), "file.json: short");
    }
}
