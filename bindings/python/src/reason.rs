//! A reason as a Python object: a stable code (a member of `layerzero.ReasonCode`), its
//! category and a message with the numbers.

use pyo3::prelude::*;

/// Why a kernel was refused (or a note on a selection): a stable code and a message with the
/// numbers.
#[pyclass(module = "layerzero", frozen)]
#[derive(Debug, Clone)]
pub struct Reason {
    code: &'static str,
    category: &'static str,
    message: String,
}

impl From<&layerzero::reason::Reason> for Reason {
    fn from(r: &layerzero::reason::Reason) -> Reason {
        Reason { code: r.code().as_str(), category: r.category().as_str(), message: r.message().to_owned() }
    }
}

#[pymethods]
impl Reason {
    /// The code, a member of `layerzero.ReasonCode`.
    #[getter]
    fn code<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("layerzero")?.getattr("ReasonCode")?.get_item(self.code)
    }

    /// The category of the code: `availability`, `constraint`, `policy`, ...
    #[getter]
    fn category(&self) -> &'static str {
        self.category
    }

    /// What was found, with the numbers.
    #[getter]
    fn message(&self) -> &str {
        &self.message
    }

    fn __str__(&self) -> String {
        format!("{}: {}", self.code, self.message)
    }

    fn __repr__(&self) -> String {
        format!("Reason({}: {:?})", self.code, self.message)
    }
}
