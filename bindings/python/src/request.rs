//! Requests described from Python: an op's name and keyword arguments, the tensors given as
//! torch tensors (or anything with `shape`, `dtype`, `stride()` and `device`), the other
//! keywords as the op's attributes. Nothing is copied and torch is never imported: only the
//! tensors' metadata is read.

use layerzero::model::request::Request;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Value};

use crate::errors::invalid;

/// Keywords that are not attributes: the layout of the attention tensors, and per-tensor
/// layouts by name.
const LAYOUT: &str = "layout";
const LAYOUTS: &str = "layouts";

/// The tensors `layout=` tags: attention's and paged attention's queries, keys and values.
const LAYOUT_TAKERS: [&str; 3] = ["q", "k", "v"];

/// Attention takes q/k/v as [batch, seq, heads, head_dim] unless `layout=` says otherwise,
/// as FlashAttention does (`layout="BHSD"` is SDPA's order).
const DEFAULT_ATTENTION_LAYOUT: &str = "BSHD";

/// A request for `op` from keyword arguments; an error names the argument and its value.
pub fn describe(op: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Request> {
    let mut tensors = Map::new();
    let mut attrs = Map::new();
    let mut layout: Option<String> = None;
    let mut layouts: Vec<(String, String)> = Vec::new();
    for (key, value) in kwargs.into_iter().flat_map(|d| d.iter()) {
        let name: String = key.extract()?;
        if value.is_none() {
            continue;
        }
        if name == LAYOUT {
            layout =
                Some(value.extract().map_err(|_| invalid(format!("argument `layout`: {value}: expected a string")))?);
        } else if name == LAYOUTS {
            let d = value.cast::<PyDict>().map_err(|_| invalid("argument `layouts`: expected a dict"))?;
            for (k, v) in d.iter() {
                layouts.push((k.extract()?, v.extract()?));
            }
        } else if is_tensor(&value)? {
            tensors.insert(name.clone(), tensor(&name, &value)?);
        } else {
            attrs.insert(name.clone(), attribute(&name, &value)?);
        }
    }
    let tag = |tensors: &mut Map<String, Value>, name: &str, layout: &str| {
        if let Some(Value::Object(t)) = tensors.get_mut(name) {
            t.insert("layout".to_owned(), Value::String(layout.to_owned()));
        }
    };
    let attention = matches!(op, "attention" | "paged_attention");
    if let Some(l) = layout.as_deref().or(attention.then_some(DEFAULT_ATTENTION_LAYOUT)) {
        LAYOUT_TAKERS.iter().for_each(|n| tag(&mut tensors, n, l));
    }
    for (name, l) in &layouts {
        if !tensors.contains_key(name) {
            return Err(invalid(format!("argument `layouts`: {name:?} is not a tensor of this call")));
        }
        tag(&mut tensors, name, l);
    }
    let value = serde_json::json!({"op": op, "tensors": tensors, "attrs": attrs});
    Request::from_value(value).map_err(|e| invalid(e.to_string()))
}

/// A tensor is what has a shape and a dtype.
fn is_tensor(value: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(value.hasattr("shape")? && value.hasattr("dtype")?)
}

/// A tensor's description: dtype, shape, strides (in elements) and device.
fn tensor(name: &str, t: &Bound<'_, PyAny>) -> PyResult<Value> {
    let dtype = t.getattr("dtype")?.str()?.to_string();
    let dtype = crate::tensors::dtype_of(&dtype).map(|d| d.as_str()).ok_or_else(|| {
        invalid(format!(
            "tensor `{name}`: dtype {dtype} is not one LayerZero describes \
             (float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, int8, int32, int64, bool)"
        ))
    })?;
    let shape: Vec<u64> = t
        .getattr("shape")?
        .try_iter()?
        .map(|d| d.and_then(|d| d.extract::<u64>()))
        .collect::<PyResult<_>>()
        .map_err(|e| invalid(format!("tensor `{name}`: its shape is not a sequence of sizes: {e}")))?;
    let mut desc = Map::new();
    desc.insert("dtype".to_owned(), Value::String(dtype.to_owned()));
    desc.insert("shape".to_owned(), serde_json::json!(shape));
    if let Ok(stride) = t.getattr("stride")
        && stride.is_callable()
    {
        let strides: Vec<u64> = stride
            .call0()?
            .extract()
            .map_err(|e| invalid(format!("tensor `{name}`: its strides are not sizes: {e}")))?;
        // Row-major strides are what an absent `strides` means: left out, so the request's
        // key is a workload file's.
        let shape_usize: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let row_major: Vec<u64> =
            layerzero::tensor::row_major_strides(&shape_usize).iter().map(|&s| s as u64).collect();
        if strides != row_major {
            desc.insert("strides".to_owned(), serde_json::json!(strides));
        }
    }
    if let Ok(device) = t.getattr("device") {
        let device = device.str()?.to_string();
        if !matches!(device.split(':').next(), Some("cpu" | "cuda")) {
            return Err(invalid(format!(
                "tensor `{name}` is on device {device:?}; LayerZero runs on cpu and cuda devices"
            )));
        }
        // A CPU tensor is described as LayerZero's own host tensors are (no device), so that
        // a request from torch tensors and one from a workload file share their key.
        if device != "cpu" {
            desc.insert("device".to_owned(), Value::String(device));
        }
    }
    Ok(Value::Object(desc))
}

/// An attribute value as JSON: booleans, integers, floats, strings, and lists or dicts of them.
fn attribute(name: &str, v: &Bound<'_, PyAny>) -> PyResult<Value> {
    if v.is_none() {
        return Ok(Value::Null);
    }
    if v.is_instance_of::<PyBool>() {
        return Ok(Value::Bool(v.extract()?));
    }
    if v.is_instance_of::<PyInt>() {
        return Ok(match v.extract::<i64>() {
            Ok(i) => Value::from(i),
            Err(_) => Value::from(v.extract::<u64>()?),
        });
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(Value::from(v.extract::<f64>()?));
    }
    if v.is_instance_of::<PyString>() {
        return Ok(Value::String(v.extract()?));
    }
    if v.is_instance_of::<PyList>() || v.is_instance_of::<PyTuple>() {
        let items = v.try_iter()?.map(|x| x.and_then(|x| attribute(name, &x))).collect::<PyResult<Vec<_>>>()?;
        return Ok(Value::Array(items));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let mut out = Map::new();
        for (k, x) in d.iter() {
            out.insert(k.extract()?, attribute(name, &x)?);
        }
        return Ok(Value::Object(out));
    }
    let type_name = v.get_type().name()?.to_string();
    Err(invalid(format!("argument `{name}`: a {type_name} is neither a tensor nor an attribute value")))
}
