//! Reading a `config.json`'s fields, each error naming the file, the field and its value.

use serde_json::{Map, Value};

use layerzero::error::{Error, Result};
use layerzero::model::dtype::DType;

/// Reads a field of an object, naming the file and field when it is missing or mistyped.
pub(crate) struct Fields<'a> {
    pub(crate) map: &'a Map<String, Value>,
    pub(crate) origin: &'a str,
}

impl<'a> Fields<'a> {
    pub(crate) fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    pub(crate) fn err(&self, name: &str, what: String) -> Error {
        Error::invalid(format!("{}: field `{name}` {what}", self.origin))
    }

    pub(crate) fn usize(&self, name: &str) -> Result<usize> {
        self.opt_usize(name)?.ok_or_else(|| self.err(name, "is missing".into()))
    }

    pub(crate) fn opt_usize(&self, name: &str) -> Result<Option<usize>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.err(name, format!("is {v}; expected a positive integer"))),
            },
        }
    }

    pub(crate) fn f64(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.err(name, format!("is {v}; expected a number"))),
            },
        }
    }

    pub(crate) fn bool(&self, name: &str) -> Result<Option<bool>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.err(name, format!("is {v}; expected true or false"))),
        }
    }

    /// The weights' dtype as the config states it (`dtype`, or the older `torch_dtype`).
    pub(crate) fn dtype(&self) -> Result<Option<DType>> {
        match self.str("dtype")?.or(self.str("torch_dtype")?) {
            None => Ok(None),
            Some("float32") => Ok(Some(DType::F32)),
            Some("bfloat16") => Ok(Some(DType::BF16)),
            Some("float16") => Ok(Some(DType::F16)),
            Some(other) => Err(self.err("dtype", format!("is {other:?}; expected float32, bfloat16 or float16"))),
        }
    }

    pub(crate) fn str(&self, name: &str) -> Result<Option<&'a str>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.err(name, format!("is {v}; expected a string"))),
        }
    }
}
