//! The types a knob's value can have, each parsed from the variable's text with an error
//! that names the variable, the value and what was expected.

use std::ffi::{OsStr, OsString};
use std::num::{NonZeroU32, NonZeroU64};
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::hardware::cap::IsaCap;
use crate::plan::PlanMode;
use crate::policy::RequireParity;
use crate::tensor::Residence;

/// Reads a variable: a function from a name to its value (`None` when unset).
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The process environment as a [`Lookup`].
pub fn process_env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// A type a knob's value can have.
pub trait KnobValue: Sized {
    /// The type as `lz doctor` shows it: `path`, `bool`, `u64`, `string`, `enum(a|b)`.
    fn type_name() -> String;

    /// Parses the set, non-empty value of the variable `name`.
    fn parse(name: &str, raw: &OsStr) -> Result<Self>;

    /// The value as text (a default, as `lz doctor` shows it).
    fn show(&self) -> String;
}

/// The value as UTF-8 text, or an error naming the variable.
fn text<'a>(name: &str, raw: &'a OsStr) -> Result<&'a str> {
    raw.to_str().ok_or_else(|| Error::invalid(format!("{name}={raw:?} is not valid UTF-8")))
}

fn expected(name: &str, text: &str, what: &str) -> Error {
    Error::invalid(format!("{name}={text:?}: expected {what}"))
}

impl KnobValue for PathBuf {
    fn type_name() -> String {
        "path".to_owned()
    }
    fn parse(_: &str, raw: &OsStr) -> Result<PathBuf> {
        Ok(PathBuf::from(raw))
    }
    fn show(&self) -> String {
        self.display().to_string()
    }
}

impl KnobValue for String {
    fn type_name() -> String {
        "string".to_owned()
    }
    fn parse(name: &str, raw: &OsStr) -> Result<String> {
        text(name, raw).map(str::to_owned)
    }
    fn show(&self) -> String {
        self.clone()
    }
}

impl KnobValue for bool {
    fn type_name() -> String {
        "bool".to_owned()
    }
    fn parse(name: &str, raw: &OsStr) -> Result<bool> {
        let t = text(name, raw)?;
        match t.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(expected(name, t, "a boolean (1/true/yes/on or 0/false/no/off)")),
        }
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl KnobValue for u64 {
    fn type_name() -> String {
        "u64".to_owned()
    }
    fn parse(name: &str, raw: &OsStr) -> Result<u64> {
        let t = text(name, raw)?;
        t.trim().parse().map_err(|_| expected(name, t, "a non-negative integer"))
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

/// A count that fits the policy's 32-bit fields.
impl KnobValue for u32 {
    fn type_name() -> String {
        u64::type_name()
    }
    fn parse(name: &str, raw: &OsStr) -> Result<u32> {
        let n = u64::parse(name, raw)?;
        u32::try_from(n).map_err(|_| Error::invalid(format!("{name}={n}: expected at most {}", u32::MAX)))
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl KnobValue for NonZeroU32 {
    fn type_name() -> String {
        u64::type_name()
    }
    fn parse(name: &str, raw: &OsStr) -> Result<NonZeroU32> {
        NonZeroU32::new(u32::parse(name, raw)?).ok_or_else(|| Error::invalid(format!("{name}=0: expected at least 1")))
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl KnobValue for NonZeroU64 {
    fn type_name() -> String {
        u64::type_name()
    }
    fn parse(name: &str, raw: &OsStr) -> Result<NonZeroU64> {
        NonZeroU64::new(u64::parse(name, raw)?).ok_or_else(|| Error::invalid(format!("{name}=0: expected at least 1")))
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

/// An optional value: unset is `None`.
impl<T: KnobValue> KnobValue for Option<T> {
    fn type_name() -> String {
        T::type_name()
    }
    fn parse(name: &str, raw: &OsStr) -> Result<Option<T>> {
        T::parse(name, raw).map(Some)
    }
    fn show(&self) -> String {
        self.as_ref().map_or_else(|| "none".to_owned(), T::show)
    }
}

/// `LAYERZERO_SHADOW_CHECK`: `N`, `every=N,rows=R`, or `off` (no shadow checks, whatever
/// the policy says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shadow(pub Option<crate::policy::ShadowCheck>);

impl KnobValue for Shadow {
    fn type_name() -> String {
        "string".to_owned()
    }
    fn parse(name: &str, raw: &OsStr) -> Result<Shadow> {
        let t = text(name, raw)?;
        crate::policy::ShadowCheck::parse(t).map(Shadow).map_err(|why| Error::invalid(format!("{name}={t:?}: {why}")))
    }
    fn show(&self) -> String {
        match self.0 {
            Some(c) => format!("every={},rows={}", c.every, c.rows),
            None => "off".to_owned(),
        }
    }
}

/// A sampling period in milliseconds, at least [`Period::MIN_MS`] (a thread that wakes more
/// often costs more than it tells).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period(pub Duration);

impl Period {
    /// The shortest period a knob accepts.
    pub const MIN_MS: u64 = 10;

    /// `ms` milliseconds.
    pub const fn ms(ms: u64) -> Period {
        Period(Duration::from_millis(ms))
    }
}

impl KnobValue for Period {
    fn type_name() -> String {
        u64::type_name()
    }
    fn parse(name: &str, raw: &OsStr) -> Result<Period> {
        match u64::parse(name, raw)? {
            n if n < Period::MIN_MS => Err(Error::invalid(format!("{name}={n}: expected at least {}", Period::MIN_MS))),
            n => Ok(Period::ms(n)),
        }
    }
    fn show(&self) -> String {
        self.0.as_millis().to_string()
    }
}

/// A comma-separated list (empty items dropped), with the text it was read from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct List {
    /// The items, trimmed.
    pub items: Vec<String>,
    /// The variable's text.
    pub text: String,
}

impl List {
    /// The empty list.
    pub const EMPTY: List = List { items: Vec::new(), text: String::new() };
}

impl KnobValue for List {
    fn type_name() -> String {
        String::type_name()
    }
    fn parse(name: &str, raw: &OsStr) -> Result<List> {
        let text = String::parse(name, raw)?;
        let items = text.split(',').map(str::trim).filter(|g| !g.is_empty()).map(str::to_owned).collect();
        Ok(List { items, text })
    }
    fn show(&self) -> String {
        if self.text.is_empty() { "none".to_owned() } else { self.text.clone() }
    }
}

/// Kernel ids or globs, comma-separated: each must be one word.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Globs(pub List);

impl KnobValue for Globs {
    fn type_name() -> String {
        List::type_name()
    }
    fn parse(name: &str, raw: &OsStr) -> Result<Globs> {
        let list = List::parse(name, raw)?;
        if let Some(bad) = list.items.iter().find(|g| g.chars().any(|c| c.is_whitespace() || c.is_control())) {
            return Err(Error::invalid(format!("{name}: {bad:?} is not a kernel id or glob")));
        }
        Ok(Globs(list))
    }
    fn show(&self) -> String {
        self.0.show()
    }
}

/// Where the `lz.select` / `lz.dispatch` spans are exported with OpenTelemetry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtelExport {
    /// Printed on standard output.
    Stdout,
    /// OTLP over HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`.
    Otlp,
}

/// Enums whose knob values are their names.
macro_rules! choices {
    ($($t:ty { $($variant:path = $word:literal),+ $(,)? })+) => {
        $(
            impl KnobValue for $t {
                fn type_name() -> String {
                    format!("enum({})", [$($word),+].join("|"))
                }
                fn parse(name: &str, raw: &OsStr) -> Result<$t> {
                    let t = text(name, raw)?;
                    match t.trim().to_ascii_lowercase().as_str() {
                        $($word => Ok($variant),)+
                        _ => Err(expected(name, t, &format!("one of {}", [$($word),+].join(", ")))),
                    }
                }
                fn show(&self) -> String {
                    match self { $($variant => $word,)+ }.to_owned()
                }
            }
        )+
    };
}

choices! {
    PlanMode { PlanMode::Off = "off", PlanMode::Prefer = "prefer", PlanMode::Strict = "strict" }
    Residence { Residence::Resident = "resident", Residence::Mapped = "mapped" }
    OtelExport { OtelExport::Stdout = "stdout", OtelExport::Otlp = "otlp" }
    RequireParity { RequireParity::Off = "off", RequireParity::Warn = "warn", RequireParity::Strict = "strict" }
}

impl KnobValue for IsaCap {
    fn type_name() -> String {
        format!("enum({})", IsaCap::ALL.map(IsaCap::as_str).join("|"))
    }
    fn parse(name: &str, raw: &OsStr) -> Result<IsaCap> {
        let t = text(name, raw)?;
        IsaCap::parse(&t.to_ascii_lowercase())
            .ok_or_else(|| expected(name, t, &format!("one of {}", IsaCap::ALL.map(IsaCap::as_str).join(", "))))
    }
    fn show(&self) -> String {
        self.as_str().to_owned()
    }
}
