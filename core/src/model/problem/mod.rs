//! The problem a request poses: its validated, derived dimensions. Constraint checks and
//! the cost model read this, never raw shapes, so they agree on what `head_dim` means.
//!
//! A request that parses but is inconsistent (a missing tensor, a wrong rank, head dims
//! that disagree) yields `INVALID_REQUEST` reasons here, each naming the field and value.

mod attention;
mod linear;
mod patch;
mod rows;
mod validator;

use super::attrs::Attrs;
use super::dtype::DType;
use super::layout::Layout;
use super::op::Op;
use super::request::Request;
use super::tensor::TensorDesc;
use crate::reason::Reason;
use validator::Validator;

/// What kind of attention mask a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MaskKind {
    /// Boolean keep-mask.
    Bool,
    /// Additive float mask of this dtype.
    Float(DType),
    /// Bool block layout: each entry keeps or drops a block of queries x keys
    /// (`attrs.mask_block`).
    BlockSparse,
}

impl MaskKind {
    /// The stable name used in capability files (`bool`, `float`).
    pub fn as_str(self) -> &'static str {
        match self {
            MaskKind::Bool => "bool",
            MaskKind::Float(_) => "float",
            MaskKind::BlockSparse => "block_sparse",
        }
    }
}

/// The mask of an attention request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MaskInfo {
    /// Its kind.
    pub kind: MaskKind,
    /// True when the mask is a full [batch, heads, seq_q, seq_k] tensor (no broadcasting).
    pub full: bool,
    /// True when the mask differs per head: a heads dimension above one, not expanded with
    /// stride 0.
    pub per_head: bool,
}

/// Paged-KV facts of a `paged_attention` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PagedDims {
    /// Tokens per page.
    pub page_size: u64,
    /// Pages in the cache.
    pub num_pages: u64,
    /// Block-table entries per sequence.
    pub max_pages: u64,
    /// Cache layout (NHD or HND).
    pub kv_layout: Layout,
    /// Block-table dtype.
    pub block_table_dtype: DType,
}

/// Derived dimensions of an attention request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttentionDims {
    /// Sequences.
    pub batch: u64,
    /// Query tokens per sequence.
    pub seq_q: u64,
    /// Key tokens per sequence (for paged: the block-table capacity).
    pub seq_k: u64,
    /// Query heads.
    pub heads_q: u64,
    /// Key/value heads.
    pub heads_kv: u64,
    /// Query/key head dimension.
    pub head_dim: u64,
    /// Value head dimension.
    pub head_dim_v: u64,
    /// dtype of k and v (or of the KV cache).
    pub kv_dtype: DType,
    /// The mask, if any.
    pub mask: Option<MaskInfo>,
    /// Ragged batch through cu_seqlens.
    pub varlen: bool,
    /// Paged-cache facts, for `paged_attention`.
    pub paged: Option<PagedDims>,
}

impl AttentionDims {
    /// True when `causal` changes the result. A single query row under bottom-right
    /// alignment sees every key, so it is the same as no causal mask (FlashAttention makes
    /// the same substitution); with ALiBi the flag still changes the bias, so it stays.
    pub fn masks_causally(&self, a: &super::attrs::AttentionAttrs) -> bool {
        a.causal && !(self.seq_q == 1 && a.causal_alignment == super::attrs::CausalAlignment::BottomRight && !a.alibi)
    }

    /// Query heads per key/value head.
    pub fn group_size(&self) -> u64 {
        self.heads_q / self.heads_kv.max(1)
    }
}

/// Op-specific dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dims {
    /// `attention`, `paged_attention`.
    Attention(AttentionDims),
    /// Row-wise ops (norms, activations, rope, sampling, routing): rows x hidden.
    Rows {
        /// Number of rows (all dims but the last).
        rows: u64,
        /// The last dimension.
        hidden: u64,
    },
    /// `mlp` and `moe_experts`: tokens x hidden through `experts` gated MLPs of width
    /// `intermediate`, `top_k` of them per token (1 and 1 for `mlp`).
    Mlp {
        /// Tokens (rows of x).
        tokens: u64,
        /// Model width.
        hidden: u64,
        /// MLP width.
        intermediate: u64,
        /// Experts.
        experts: u64,
        /// Experts per token.
        top_k: u64,
    },
    /// `linear` and the quantized linears: [m, k] x [k, n]; `patch_embed` as the GEMM it
    /// is (m = B * N patches, k = C * P * P, n = D).
    Gemm {
        /// Rows of x.
        m: u64,
        /// Output features.
        n: u64,
        /// Input features.
        k: u64,
    },
    /// Nothing derived (tokenize, or an invalid request).
    None,
}

/// The validated view of a request that checks and the cost model read.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// The op.
    pub op: Op,
    /// The compute dtype (dtype of the primary tensor: q, x, logits...).
    pub dtype: DType,
    /// Derived dimensions.
    pub dims: Dims,
    /// Bytes of all request tensors (inputs), for capacity and cost.
    pub input_bytes: u64,
    /// `INVALID_REQUEST` reasons; empty when the request is consistent.
    pub errors: Vec<Reason>,
}

/// Tensor roles an op accepts: (name, required).
pub fn tensor_roles(op: Op) -> &'static [(&'static str, bool)] {
    match op {
        Op::Attention => {
            &[("q", true), ("k", true), ("v", true), ("mask", false), ("cu_seqlens_q", false), ("cu_seqlens_k", false)]
        }
        Op::PagedAttention => &[
            ("q", true),
            ("k_cache", true),
            ("v_cache", true),
            ("block_table", true),
            ("context_lens", true),
            ("k_scale", false),
            ("v_scale", false),
        ],
        Op::RmsNorm => &[("x", true), ("weight", true), ("residual", false)],
        Op::LayerNorm => &[("x", true), ("weight", true), ("bias", false), ("residual", false)],
        Op::Rope => &[("q", true), ("k", false), ("positions", false), ("cos", false), ("sin", false)],
        Op::Linear => &[("x", true), ("weight", true), ("bias", false)],
        Op::Swiglu | Op::Geglu => &[("x", false), ("gate", false), ("up", false)],
        Op::Gelu | Op::Silu => &[("x", true)],
        Op::Mlp => &[("x", true), ("w_gate", true), ("w_up", true), ("w_down", true)],
        Op::MoeExperts => {
            &[("x", true), ("experts", true), ("weights", true), ("w_gate", true), ("w_up", true), ("w_down", true)]
        }
        Op::LinearW8a8 => &[("x", true), ("x_scale", true), ("weight", true), ("w_scale", true), ("bias", false)],
        Op::LinearInt4 => &[
            ("x", true),
            ("weight", true),
            ("scales", true),
            ("zeros", false),
            ("bias", false),
            ("global_scale", false),
        ],
        Op::Embedding => &[("ids", true), ("table", true)],
        Op::PatchEmbed => &[("image", true), ("weight", true), ("bias", false)],
        Op::Sample => &[("logits", true)],
        Op::Quantize => &[("x", true)],
        Op::Dequantize => &[("x", true), ("scale", true), ("global_scale", false)],
        Op::MoeRoute => &[("logits", true)],
        Op::Tokenize => &[],
    }
}

/// Tensor roles whose memory layout kernels read as data (layout and stride checks apply).
pub fn data_roles(op: Op) -> &'static [&'static str] {
    match op {
        Op::Attention => &["q", "k", "v"],
        Op::PagedAttention => &["q", "k_cache", "v_cache"],
        Op::RmsNorm => &["x", "weight", "residual"],
        Op::LayerNorm => &["x", "weight", "bias", "residual"],
        Op::Rope => &["q", "k"],
        Op::Linear => &["x", "weight", "bias"],
        Op::Swiglu | Op::Geglu => &["x", "gate", "up"],
        Op::Gelu | Op::Silu => &["x"],
        Op::Mlp | Op::MoeExperts => &["x", "w_gate", "w_up", "w_down"],
        Op::LinearW8a8 | Op::LinearInt4 => &["x", "weight"],
        Op::Embedding => &["table"],
        Op::PatchEmbed => &["image", "weight", "bias"],
        Op::Sample | Op::MoeRoute => &["logits"],
        Op::Quantize => &["x"],
        Op::Dequantize => &["x", "scale"],
        Op::Tokenize => &[],
    }
}

/// The layout of tensor `name` of an `op` request: its tag, or the op's default for an
/// untagged tensor where the op has one (a rank-4 `image` of `patch_embed` is NCHW, as
/// PyTorch's default). Layout checks and transforms read this, so an untagged image is
/// judged and adapted as the NCHW it means.
pub fn layout_of(op: Op, name: &str, t: &TensorDesc) -> Option<Layout> {
    match (t.layout, op, name) {
        (Some(l), _, _) => Some(l),
        (None, Op::PatchEmbed, "image") if t.rank() == 4 => Some(Layout::Nchw),
        _ => None,
    }
}

impl Problem {
    /// Elements of the op's main output.
    pub fn output_elements(&self) -> u64 {
        match self.dims {
            Dims::Attention(a) => {
                a.batch.saturating_mul(a.seq_q).saturating_mul(a.heads_q).saturating_mul(a.head_dim_v)
            }
            Dims::Rows { rows, hidden } => rows.saturating_mul(hidden),
            Dims::Gemm { m, n, .. } => m.saturating_mul(n),
            Dims::Mlp { tokens, hidden, .. } => tokens.saturating_mul(hidden),
            Dims::None => 0,
        }
    }

    /// Validates `req` and derives its dimensions. Never panics.
    pub fn describe(req: &Request) -> Problem {
        let mut v = Validator::new(req);
        let roles = tensor_roles(req.op);
        for name in req.tensors.keys() {
            if !roles.iter().any(|(r, _)| r == name) {
                let names: Vec<&str> = roles.iter().map(|(r, _)| *r).collect();
                v.err(format!("unexpected tensor `{name}` for {} (accepted: {})", req.op, names.join(", ")));
            }
        }
        for (name, required) in roles {
            if *required && !req.tensors.contains_key(*name) {
                v.err(format!("missing tensor `{name}` required by {}", req.op));
            }
        }
        for (name, t) in &req.tensors {
            if let Some(strides) = &t.strides
                && strides.len() != t.rank()
            {
                v.err(format!("tensor `{name}` has {} strides for rank {}", strides.len(), t.rank()));
            }
        }
        let (dtype, dims) = match req.op {
            Op::Attention => Self::dense_attention(&mut v),
            Op::PagedAttention => Self::paged(&mut v),
            Op::Linear => Self::linear(&mut v),
            Op::LinearW8a8 | Op::LinearInt4 => Self::quantized_linear(&mut v),
            Op::Mlp | Op::MoeExperts => Self::mlp(&mut v),
            Op::Quantize | Op::Dequantize => Self::quant(&mut v),
            Op::PatchEmbed => Self::patch_embed(&mut v),
            Op::Tokenize => (DType::I32, Dims::None),
            _ => Self::rows(&mut v),
        };
        Self::check_attrs(&mut v);
        let input_bytes = req.tensors.values().fold(0u64, |a, t| a.saturating_add(t.bytes()));
        Problem { op: req.op, dtype, dims, input_bytes, errors: v.errors }
    }

    /// The attention dims, for the attention ops with a valid request.
    pub fn attention(&self) -> Option<&AttentionDims> {
        match &self.dims {
            Dims::Attention(a) => Some(a),
            _ => None,
        }
    }

    fn check_attrs(v: &mut Validator<'_>) {
        let mut errs = Vec::new();
        match &v.req.attrs {
            Attrs::Attention(a) => {
                if !(0.0..1.0).contains(&a.dropout_p) {
                    errs.push(format!("attrs.dropout_p is {}; it must be in [0, 1)", a.dropout_p));
                }
                if let Some(c) = a.softcap
                    && !(c.is_finite() && c > 0.0)
                {
                    errs.push(format!("attrs.softcap is {c}; it must be a positive number (or null for off)"));
                }
                if let Some(s) = a.scale
                    && !(s.is_finite() && s > 0.0)
                {
                    errs.push(format!(
                        "attrs.scale is {s}; it must be a positive number (or null for 1/sqrt(head_dim))"
                    ));
                }
            }
            Attrs::Norm(n) => {
                if let Some(e) = n.eps
                    && !(e.is_finite() && e >= 0.0)
                {
                    errs.push(format!("attrs.eps is {e}; it must be a non-negative number"));
                }
            }
            Attrs::PatchEmbed(p) if p.patch == 0 => {
                errs.push("attrs.patch is 0; it must be at least 1".to_owned());
            }
            Attrs::Sample(s) => {
                if let Some(t) = s.temperature
                    && !(t.is_finite() && t >= 0.0)
                {
                    errs.push(format!("attrs.temperature is {t}; it must be >= 0"));
                }
                for (name, p) in [("top_p", s.top_p), ("min_p", s.min_p)] {
                    if let Some(p) = p
                        && !(0.0..=1.0).contains(&p)
                    {
                        errs.push(format!("attrs.{name} is {p}; it must be in [0, 1]"));
                    }
                }
            }
            _ => {}
        }
        for e in errs {
            v.err(e);
        }
    }
}
