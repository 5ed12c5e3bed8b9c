//! Executors written in Python (a thin call into torch SDPA, zentorch, FlashAttention, ...),
//! run by the runtime as any other executor: selected, guarded, timed, fault-injected and
//! counted by the health system. The kernel gets the call's tensors as torch tensors (the
//! caller's own objects, or views of them; copies only of what a transform made) and the
//! attributes as a dict, and returns a tensor (the output `out`) or a dict of them by output
//! name.

use std::collections::BTreeMap;

use layerzero::exec::args::{OpArgs, Outputs};
use layerzero::exec::executor::{Executor, KernelError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::tensors::{lend, meta, output_name, to_torch};

/// A Python callable bound to a kernel id.
pub struct PyExecutor {
    kernel: String,
    func: Py<PyAny>,
}

impl PyExecutor {
    pub fn new(kernel: String, func: Py<PyAny>) -> PyExecutor {
        PyExecutor { kernel, func }
    }

    fn call(&self, py: Python<'_>, args: &OpArgs) -> PyResult<Outputs> {
        let tensors = PyDict::new(py);
        let layouts = PyDict::new(py);
        for (name, t) in args.tensors() {
            tensors.set_item(name, to_torch(py, t)?)?;
            if let Some(l) = t.layout() {
                layouts.set_item(name, l.as_str())?;
            }
        }
        let attrs = serde_json::to_string(&args.attrs()).map_err(|e| crate::errors::invalid(e.to_string()))?;
        let attrs = py.import("json")?.call_method1("loads", (attrs,))?;
        attrs.set_item("layouts", layouts)?;
        let result = self.func.bind(py).call1((tensors, attrs))?;
        let mut outputs = Outputs::new();
        let mut add = |name: &str, value: &Bound<'_, PyAny>| -> PyResult<()> {
            let key = output_name(name).ok_or_else(|| {
                crate::errors::invalid(format!("{} returned an unknown output {name:?}", self.kernel))
            })?;
            let m = meta(name, value)?;
            outputs.insert(key, lend(name, value, &m, false, None)?);
            Ok(())
        };
        if let Ok(d) = result.cast::<PyDict>() {
            let items: BTreeMap<String, Bound<'_, PyAny>> = d.extract()?;
            for (name, value) in &items {
                add(name, value)?;
            }
        } else {
            add("out", &result)?;
        }
        Ok(outputs)
    }
}

impl Executor for PyExecutor {
    /// The executor is handed torch tensors, on whatever device they are.
    fn takes_device_memory(&self) -> bool {
        true
    }

    fn run(&self, args: &OpArgs) -> Result<Outputs, KernelError> {
        Python::attach(|py| {
            self.call(py, args).map_err(|e| {
                let text = e.to_string();
                // torch raises RuntimeError "... out of memory ..." for an allocation failure.
                if text.contains("out of memory") {
                    KernelError::OutOfMemory(format!("{}: {text}", self.kernel))
                } else {
                    KernelError::Failed(format!("{}: {text}", self.kernel))
                }
            })
        })
    }
}
