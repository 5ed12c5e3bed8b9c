//! A request: an op, its tensors by name, and its attributes. This is the contract with
//! outside tools (`schemas/request.schema.json`).

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::attrs::{
    AttentionAttrs, Attrs, GegluAttrs, GeluAttrs, Int4Attrs, MlpAttrs, MoeRouteAttrs, NoAttrs, NormAttrs,
    PatchEmbedAttrs, QuantAttrs, RopeAttrs, SampleAttrs, SwigluAttrs, TokenizeAttrs, W8a8Attrs,
};
use super::op::Op;
use super::tensor::TensorDesc;
use crate::error::{Error, Result};

/// An op call described for selection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Request {
    /// The op.
    pub op: Op,
    /// Tensors by role name (`q`, `k`, `v`, `mask`, `x`, `weight`, ...).
    pub tensors: BTreeMap<String, TensorDesc>,
    /// Typed attributes of the op.
    pub attrs: Attrs,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    op: String,
    tensors: BTreeMap<String, TensorDesc>,
    #[serde(default)]
    attrs: Option<serde_json::Value>,
}

impl Request {
    /// A request with the op's default attributes.
    pub fn new(op: Op) -> Request {
        Request { op, tensors: BTreeMap::new(), attrs: default_attrs(op) }
    }

    /// Adds a tensor under a role name.
    pub fn tensor(mut self, name: &str, desc: TensorDesc) -> Request {
        self.tensors.insert(name.to_owned(), desc);
        self
    }

    /// Replaces the attributes.
    pub fn attrs(mut self, attrs: Attrs) -> Request {
        self.attrs = attrs;
        self
    }

    /// The tensor under `name`, if present.
    pub fn get(&self, name: &str) -> Option<&TensorDesc> {
        self.tensors.get(name)
    }

    /// Attention attributes, for the attention ops.
    pub fn attention_attrs(&self) -> Option<&AttentionAttrs> {
        match &self.attrs {
            Attrs::Attention(a) => Some(a),
            _ => None,
        }
    }

    /// Parses a request from JSON text. Errors name the field path and the value.
    pub fn from_json(text: &str) -> Result<Request> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let raw: RawRequest = serde_path_to_error::deserialize(de).map_err(path_error)?;
        Request::from_raw(raw)
    }

    /// Parses a request from a JSON value (errors name the field, without a text position).
    pub fn from_value(value: serde_json::Value) -> Result<Request> {
        let raw: RawRequest = serde_path_to_error::deserialize(value).map_err(path_error)?;
        Request::from_raw(raw)
    }

    fn from_raw(raw: RawRequest) -> Result<Request> {
        let op = Op::from_name(&raw.op).ok_or_else(|| {
            let names: Vec<&str> = Op::ALL.iter().map(|o| o.as_str()).collect();
            Error::invalid(format!(
                "request field `op`: unknown op {:?} (expected one of {})",
                raw.op,
                names.join(", ")
            ))
        })?;
        let attrs = match raw.attrs {
            None | Some(serde_json::Value::Null) => default_attrs(op),
            Some(v) => parse_attrs(op, v)?,
        };
        Ok(Request { op, tensors: raw.tensors, attrs })
    }

    /// The request as its canonical JSON value (sorted keys; attribute defaults written out).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

fn default_attrs(op: Op) -> Attrs {
    match op {
        Op::Attention | Op::PagedAttention => Attrs::Attention(AttentionAttrs::default()),
        Op::RmsNorm | Op::LayerNorm => Attrs::Norm(NormAttrs::default()),
        Op::Rope => Attrs::Rope(RopeAttrs::default()),
        Op::Swiglu => Attrs::Swiglu(SwigluAttrs::default()),
        Op::Gelu => Attrs::Gelu(GeluAttrs::default()),
        Op::Sample => Attrs::Sample(SampleAttrs::default()),
        Op::Quantize | Op::Dequantize => Attrs::Quant(QuantAttrs {
            scheme: super::attrs::QuantScheme::PerTensor,
            block: None,
            scale_layout: None,
            target: None,
            out_dtype: None,
            format: None,
            scale_order: super::w4::ScaleOrder::Linear,
        }),
        Op::MoeRoute => Attrs::MoeRoute(MoeRouteAttrs { top_k: 1, renormalize: false }),
        Op::Tokenize => Attrs::Tokenize(TokenizeAttrs::default()),
        Op::Geglu => Attrs::Geglu(GegluAttrs::default()),
        Op::Mlp | Op::MoeExperts => Attrs::Mlp(MlpAttrs::default()),
        Op::LinearW8a8 => Attrs::W8a8(W8a8Attrs::default()),
        Op::LinearInt4 => Attrs::Int4(Int4Attrs::int4(128)),
        // ViT-Base's patch; a weight of another kernel size is refused by name.
        Op::PatchEmbed => Attrs::PatchEmbed(PatchEmbedAttrs { patch: 16 }),
        Op::Linear | Op::Silu | Op::Embedding => Attrs::None(NoAttrs {}),
    }
}

fn parse_attrs(op: Op, value: serde_json::Value) -> Result<Attrs> {
    fn typed<T: DeserializeOwned>(value: serde_json::Value) -> Result<T> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." || path.is_empty() {
                Error::invalid(format!("request field `attrs`: {inner}"))
            } else {
                Error::invalid(format!("request field `attrs.{path}`: {inner}"))
            }
        })
    }
    Ok(match op {
        Op::Attention | Op::PagedAttention => Attrs::Attention(typed(value)?),
        Op::RmsNorm | Op::LayerNorm => Attrs::Norm(typed(value)?),
        Op::Rope => Attrs::Rope(typed(value)?),
        Op::Swiglu => Attrs::Swiglu(typed(value)?),
        Op::Gelu => Attrs::Gelu(typed(value)?),
        Op::Sample => Attrs::Sample(typed(value)?),
        Op::Quantize | Op::Dequantize => Attrs::Quant(typed(value)?),
        Op::MoeRoute => Attrs::MoeRoute(typed(value)?),
        Op::Tokenize => Attrs::Tokenize(typed(value)?),
        Op::Geglu => Attrs::Geglu(typed(value)?),
        Op::Mlp | Op::MoeExperts => Attrs::Mlp(typed(value)?),
        Op::LinearW8a8 => Attrs::W8a8(typed(value)?),
        Op::LinearInt4 => Attrs::Int4(typed(value)?),
        Op::PatchEmbed => Attrs::PatchEmbed(typed(value)?),
        Op::Linear | Op::Silu | Op::Embedding => Attrs::None(typed(value)?),
    })
}

/// A deserialization error naming the field path (`request field `tensors.q.shape``).
fn path_error<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> Error {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if path == "." || path.is_empty() {
        Error::invalid(format!("request: {inner}"))
    } else {
        Error::invalid(format!("request field `{path}`: {inner}"))
    }
}
