//! Redaction (`LAYERZERO_REDACT`): fields a tenant considers sensitive are written as
//! `[redacted]` in logs, spans and the recent-selection records. Kept as bits in one atomic,
//! read with one load where a field is recorded.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{Error, Result};

const KERNELS: u8 = 1;
const SHAPES: u8 = 2;
const OPS: u8 = 4;
const BACKENDS: u8 = 8;
/// Not yet read from the environment.
const UNSET: u8 = 0x80;

static BITS: AtomicU8 = AtomicU8::new(UNSET);

/// Which fields are redacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Redaction(u8);

impl Redaction {
    /// Nothing redacted.
    pub const NONE: Redaction = Redaction(0);

    /// Parses `LAYERZERO_REDACT`'s value: comma-separated `kernels`, `shapes`, `ops`,
    /// `backends` (or `all`); an error names the variable and the item.
    pub fn parse(spec: &str) -> Result<Redaction> {
        let mut bits = 0;
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            bits |= match item {
                "kernels" => KERNELS,
                "shapes" => SHAPES,
                "ops" => OPS,
                "backends" => BACKENDS,
                "all" => KERNELS | SHAPES | OPS | BACKENDS,
                other => {
                    return Err(Error::invalid(format!(
                        "LAYERZERO_REDACT item {other:?}: expected kernels, shapes, ops, backends or all"
                    )));
                }
            };
        }
        Ok(Redaction(bits))
    }

    /// Kernel ids are redacted.
    pub fn kernels(self) -> bool {
        self.0 & KERNELS != 0
    }
    /// Request shapes are redacted.
    pub fn shapes(self) -> bool {
        self.0 & SHAPES != 0
    }
    /// Op names are redacted.
    pub fn ops(self) -> bool {
        self.0 & OPS != 0
    }
    /// Backend names are redacted.
    pub fn backends(self) -> bool {
        self.0 & BACKENDS != 0
    }
}

/// The redaction in force: set by [`set`] or [`configure`], else none.
pub fn current() -> Redaction {
    match BITS.load(Ordering::Relaxed) {
        UNSET => Redaction::NONE,
        bits => Redaction(bits),
    }
}

/// Sets the redaction from `LAYERZERO_REDACT`'s value, unless one was set already (the
/// process's settings, resolved at the first handle). An invalid value redacts everything
/// rather than leak; `lz doctor` reports the error.
pub fn configure(spec: Option<&str>) {
    let r = match spec {
        None => Redaction::NONE,
        Some(spec) => Redaction::parse(spec).unwrap_or(Redaction(KERNELS | SHAPES | OPS | BACKENDS)),
    };
    let _ = BITS.compare_exchange(UNSET, r.0, Ordering::Relaxed, Ordering::Relaxed);
}

/// Sets the redaction for this process (tests, engines configuring it in code).
pub fn set(r: Redaction) {
    BITS.store(r.0, Ordering::Relaxed);
}

/// A field value, or `[redacted]`.
#[derive(Debug, Clone, Copy)]
pub struct Field<'a>(pub &'a str, pub bool);

impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.1 { "[redacted]" } else { self.0 })
    }
}

/// `text`, or `[redacted]` when `hide`.
pub fn field(text: &str, hide: bool) -> String {
    if hide { "[redacted]".to_owned() } else { text.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    #[test]
    fn redaction_parses_each_field_and_names_a_bad_item() -> TestResult {
        let r = Redaction::parse("kernels, shapes")?;
        assert!(r.kernels() && r.shapes() && !r.ops() && !r.backends());
        assert!(Redaction::parse("all").is_ok_and(|r| r.ops() && r.backends()));
        let err = Redaction::parse("kernels,passwords")
            .err()
            .ok_or("an unknown redaction field must be refused")?
            .to_string();
        assert!(err.contains("LAYERZERO_REDACT") && err.contains("passwords"), "{err}");
        assert_eq!(Field("cpu.linear.fast", true).to_string(), "[redacted]");
        Ok(())
    }
}
