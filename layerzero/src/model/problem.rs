//! The problem a request poses: its validated, derived dimensions. Constraint checks and
//! the cost model read this, never raw shapes, so they agree on what `head_dim` means.
//!
//! A request that parses but is inconsistent (a missing tensor, a wrong rank, head dims
//! that disagree) yields `INVALID_REQUEST` reasons here, each naming the field and value.

use super::attrs::Attrs;
use super::dtype::DType;
use super::layout::Layout;
use super::op::Op;
use super::request::Request;
use super::tensor::TensorDesc;
use crate::reason::{Reason, ReasonCode};

/// What kind of attention mask a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MaskKind {
    /// Boolean keep-mask.
    Bool,
    /// Additive float mask of this dtype.
    Float(DType),
}

impl MaskKind {
    /// The stable name used in capability files (`bool`, `float`).
    pub fn as_str(self) -> &'static str {
        match self {
            MaskKind::Bool => "bool",
            MaskKind::Float(_) => "float",
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
    /// `linear` and the quantized linears: [m, k] x [k, n].
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
        Op::LayerNorm => &[("x", true), ("weight", true), ("bias", false)],
        Op::Rope => &[("q", true), ("k", false), ("positions", false), ("cos", false), ("sin", false)],
        Op::Linear => &[("x", true), ("weight", true), ("bias", false)],
        Op::Swiglu | Op::Geglu => &[("x", false), ("gate", false), ("up", false)],
        Op::Gelu | Op::Silu => &[("x", true)],
        Op::Mlp => &[("x", true), ("w_gate", true), ("w_up", true), ("w_down", true)],
        Op::MoeExperts => {
            &[("x", true), ("experts", true), ("weights", true), ("w_gate", true), ("w_up", true), ("w_down", true)]
        }
        Op::LinearW8a8 => &[("x", true), ("x_scale", true), ("weight", true), ("w_scale", true), ("bias", false)],
        Op::LinearInt4 => &[("x", true), ("weight", true), ("scales", true), ("zeros", false), ("bias", false)],
        Op::Embedding => &[("ids", true), ("table", true)],
        Op::Sample => &[("logits", true)],
        Op::Quantize => &[("x", true)],
        Op::Dequantize => &[("x", true), ("scale", true)],
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
        Op::LayerNorm => &["x", "weight", "bias"],
        Op::Rope => &["q", "k"],
        Op::Linear => &["x", "weight", "bias"],
        Op::Swiglu | Op::Geglu => &["x", "gate", "up"],
        Op::Gelu | Op::Silu => &["x"],
        Op::Mlp | Op::MoeExperts => &["x", "w_gate", "w_up", "w_down"],
        Op::LinearW8a8 | Op::LinearInt4 => &["x", "weight"],
        Op::Embedding => &["table"],
        Op::Sample | Op::MoeRoute => &["logits"],
        Op::Quantize => &["x"],
        Op::Dequantize => &["x", "scale"],
        Op::Tokenize => &[],
    }
}

struct Validator<'r> {
    req: &'r Request,
    errors: Vec<Reason>,
}

impl<'r> Validator<'r> {
    fn err(&mut self, msg: String) {
        self.errors.push(Reason::new(ReasonCode::INVALID_REQUEST, msg));
    }

    fn tensor(&self, name: &str) -> Option<&'r TensorDesc> {
        self.req.tensors.get(name)
    }

    /// The tensor if present with the given rank; records an error otherwise.
    fn ranked(&mut self, name: &str, rank: usize) -> Option<&'r TensorDesc> {
        let t = self.tensor(name)?;
        if t.rank() != rank {
            self.err(format!(
                "tensor `{name}` has rank {} (shape {:?}); {} needs rank {rank}",
                t.rank(),
                t.shape,
                self.req.op
            ));
            return None;
        }
        Some(t)
    }

    fn layout_in(&mut self, name: &str, t: &TensorDesc, allowed: &[Layout]) -> Option<Layout> {
        match t.layout {
            Some(l) if allowed.contains(&l) => Some(l),
            Some(l) => {
                let names: Vec<&str> = allowed.iter().map(|l| l.as_str()).collect();
                self.err(format!("tensor `{name}` has layout {l}; {} accepts {}", self.req.op, names.join(" or ")));
                None
            }
            None => {
                let names: Vec<&str> = allowed.iter().map(|l| l.as_str()).collect();
                self.err(format!("tensor `{name}` needs an explicit layout ({})", names.join(" or ")));
                None
            }
        }
    }

    fn dtype_in(&mut self, name: &str, t: &TensorDesc, allowed: &[DType]) -> bool {
        if allowed.contains(&t.dtype) {
            return true;
        }
        let names: Vec<&str> = allowed.iter().map(|d| d.as_str()).collect();
        self.err(format!("tensor `{name}` has dtype {}; expected {}", t.dtype, names.join(" or ")));
        false
    }

    fn eq(&mut self, what: &str, a: u64, b: u64) -> bool {
        if a != b {
            self.err(format!("{what}: {a} != {b}"));
            return false;
        }
        true
    }

    fn positive(&mut self, what: &str, v: u64) -> bool {
        if v == 0 {
            self.err(format!("{what} is 0; it must be at least 1"));
            return false;
        }
        true
    }
}

/// [b, s, h, d] of a BSHD/BHSD tensor.
fn bshd(t: &TensorDesc, layout: Layout) -> [u64; 4] {
    let s = &t.shape;
    match layout {
        Layout::Bhsd => [s[0], s[2], s[1], s[3]],
        _ => [s[0], s[1], s[2], s[3]],
    }
}

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::Fp8E4M3, DType::Fp8E5M2];
const INDEX: &[DType] = &[DType::I32, DType::I64];

impl Problem {
    /// Validates `req` and derives its dimensions. Never panics.
    pub fn describe(req: &Request) -> Problem {
        let mut v = Validator { req, errors: Vec::new() };
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

    fn dense_attention(v: &mut Validator<'_>) -> (DType, Dims) {
        let q = v.ranked("q", 4);
        let k = v.ranked("k", 4);
        let val = v.ranked("v", 4);
        let dtype = q.map(|t| t.dtype).unwrap_or(DType::F32);
        let (Some(q), Some(k), Some(val)) = (q, k, val) else { return (dtype, Dims::None) };
        let dense = [Layout::Bshd, Layout::Bhsd];
        let (Some(lq), Some(lk), Some(lv)) =
            (v.layout_in("q", q, &dense), v.layout_in("k", k, &dense), v.layout_in("v", val, &dense))
        else {
            return (dtype, Dims::None);
        };
        if !(v.dtype_in("q", q, FLOATS) & v.dtype_in("k", k, FLOATS) & v.dtype_in("v", val, FLOATS)) {
            return (dtype, Dims::None);
        }
        let [bq, sq, hq, d] = bshd(q, lq);
        let [bk, sk, hk, dk] = bshd(k, lk);
        let [bv, sv, hv, dv] = bshd(val, lv);
        let varlen = v.tensor("cu_seqlens_q").is_some() || v.tensor("cu_seqlens_k").is_some();
        let mut batch = bq;
        if varlen {
            for name in ["cu_seqlens_q", "cu_seqlens_k"] {
                let Some(t) = v.ranked(name, 1) else {
                    v.err(format!(
                        "ragged attention needs both `cu_seqlens_q` and `cu_seqlens_k`; `{name}` is missing"
                    ));
                    continue;
                };
                v.dtype_in(name, t, &[DType::I32]);
                if t.shape[0] < 2 {
                    v.err(format!("tensor `{name}` has {} entries; it needs batch + 1 >= 2", t.shape[0]));
                }
            }
            if bq != 1 {
                v.err(format!("ragged attention packs all tokens into batch 1 of q; q batch is {bq}"));
            }
            batch =
                v.tensor("cu_seqlens_q").map(|t| t.shape.first().copied().unwrap_or(1).saturating_sub(1)).unwrap_or(1);
        } else {
            v.eq("k batch must equal q batch", bk, bq);
        }
        v.eq("v batch must equal k batch", bv, bk);
        v.eq("k head_dim must equal q head_dim", dk, d);
        v.eq("v seq_len must equal k seq_len", sv, sk);
        v.eq("v heads must equal k heads", hv, hk);
        for (what, n) in [
            ("q batch", bq),
            ("q seq_len", sq),
            ("k seq_len", sk),
            ("q heads", hq),
            ("k heads", hk),
            ("head_dim", d),
            ("v head_dim", dv),
        ] {
            v.positive(what, n);
        }
        if hk > 0 && hq % hk != 0 {
            v.err(format!("q heads {hq} are not divisible by kv heads {hk}"));
        }
        if k.dtype != val.dtype {
            v.err(format!("k dtype {} != v dtype {}", k.dtype, val.dtype));
        }
        let mask = v.tensor("mask").and_then(|m| Self::mask(v, m, [batch, hq, sq, sk]));
        let dims = AttentionDims {
            batch,
            seq_q: sq,
            seq_k: sk,
            heads_q: hq,
            heads_kv: hk,
            head_dim: d,
            head_dim_v: dv,
            kv_dtype: k.dtype,
            mask,
            varlen,
            paged: None,
        };
        (dtype, Dims::Attention(dims))
    }

    fn mask(v: &mut Validator<'_>, m: &TensorDesc, full: [u64; 4]) -> Option<MaskInfo> {
        let kind = match m.dtype {
            DType::Bool => MaskKind::Bool,
            DType::F32 | DType::F16 | DType::BF16 => MaskKind::Float(m.dtype),
            other => {
                v.err(format!("tensor `mask` has dtype {other}; a mask is bool (keep) or f32/f16/bf16 (additive)"));
                return None;
            }
        };
        if !(2..=4).contains(&m.rank()) {
            v.err(format!("tensor `mask` has rank {}; it must be 2, 3 or 4 and broadcast to [batch, heads, seq_q, seq_k] = {full:?}", m.rank()));
            return None;
        }
        let offset = 4 - m.rank();
        for (i, &dim) in m.shape.iter().enumerate() {
            let target = full[offset + i];
            if dim != target && dim != 1 {
                v.err(format!("tensor `mask` shape {:?} does not broadcast to [batch, heads, seq_q, seq_k] = {full:?} (dim {i} is {dim})", m.shape));
                return None;
            }
        }
        let expanded_ok = |i: usize| m.shape[i] == full[i] || m.strides.as_ref().is_some_and(|s| s.get(i) == Some(&0));
        let is_full = m.rank() == 4 && (0..4).all(expanded_ok);
        Some(MaskInfo { kind, full: is_full })
    }

    fn paged(v: &mut Validator<'_>) -> (DType, Dims) {
        let q = v.ranked("q", 4);
        let kc = v.ranked("k_cache", 4);
        let vc = v.ranked("v_cache", 4);
        let bt = v.ranked("block_table", 2);
        let cl = v.ranked("context_lens", 1);
        let dtype = q.map(|t| t.dtype).unwrap_or(DType::F32);
        let (Some(q), Some(kc), Some(vc), Some(bt), Some(cl)) = (q, kc, vc, bt, cl) else {
            return (dtype, Dims::None);
        };
        let Some(lq) = v.layout_in("q", q, &[Layout::Bshd]) else { return (dtype, Dims::None) };
        let caches = [Layout::Nhd, Layout::Hnd];
        let (Some(lk), Some(lv)) = (v.layout_in("k_cache", kc, &caches), v.layout_in("v_cache", vc, &caches)) else {
            return (dtype, Dims::None);
        };
        if lk != lv {
            v.err(format!("k_cache layout {lk} != v_cache layout {lv}"));
        }
        let ok = v.dtype_in("q", q, FLOATS)
            & v.dtype_in("k_cache", kc, FLOATS)
            & v.dtype_in("v_cache", vc, FLOATS)
            & v.dtype_in("block_table", bt, INDEX)
            & v.dtype_in("context_lens", cl, &[DType::I32]);
        if !ok {
            return (dtype, Dims::None);
        }
        if kc.shape != vc.shape {
            v.err(format!("k_cache shape {:?} != v_cache shape {:?}", kc.shape, vc.shape));
        }
        if kc.dtype != vc.dtype {
            v.err(format!("k_cache dtype {} != v_cache dtype {}", kc.dtype, vc.dtype));
        }
        let [b, sq, hq, d] = bshd(q, lq);
        let (num_pages, page_size, hk, dk) = match lk {
            Layout::Hnd => (kc.shape[0], kc.shape[2], kc.shape[1], kc.shape[3]),
            _ => (kc.shape[0], kc.shape[1], kc.shape[2], kc.shape[3]),
        };
        let dv = vc.shape[3];
        v.eq("k_cache head_dim must equal q head_dim", dk, d);
        v.eq("block_table rows must equal q batch", bt.shape[0], b);
        v.eq("context_lens length must equal q batch", cl.shape[0], b);
        for (what, n) in [
            ("q batch", b),
            ("q seq_len", sq),
            ("q heads", hq),
            ("head_dim", d),
            ("kv heads", hk),
            ("page_size", page_size),
            ("num_pages", num_pages),
            ("block_table width", bt.shape[1]),
        ] {
            v.positive(what, n);
        }
        if hk > 0 && hq % hk != 0 {
            v.err(format!("q heads {hq} are not divisible by kv heads {hk}"));
        }
        for scale in ["k_scale", "v_scale"] {
            if let Some(s) = v.tensor(scale) {
                v.dtype_in(scale, s, &[DType::F32]);
                let per_tensor = s.numel() == 1;
                let per_head = s.rank() == 1 && s.shape[0] == hk;
                if !(per_tensor || per_head) {
                    v.err(format!(
                        "tensor `{scale}` shape {:?} is neither per-tensor [1] nor per-head [{hk}]",
                        s.shape
                    ));
                }
            }
        }
        let paged =
            PagedDims { page_size, num_pages, max_pages: bt.shape[1], kv_layout: lk, block_table_dtype: bt.dtype };
        let dims = AttentionDims {
            batch: b,
            seq_q: sq,
            seq_k: bt.shape[1].saturating_mul(page_size),
            heads_q: hq,
            heads_kv: hk,
            head_dim: d,
            head_dim_v: dv,
            kv_dtype: kc.dtype,
            mask: None,
            varlen: false,
            paged: Some(paged),
        };
        (dtype, Dims::Attention(dims))
    }

    fn linear(v: &mut Validator<'_>) -> (DType, Dims) {
        let x = v.tensor("x");
        let w = v.ranked("weight", 2);
        let dtype = x.map(|t| t.dtype).unwrap_or(DType::F32);
        let (Some(x), Some(w)) = (x, w) else { return (dtype, Dims::None) };
        if x.rank() < 2 {
            v.err(format!("tensor `x` has rank {}; linear needs [..., in_features]", x.rank()));
            return (dtype, Dims::None);
        }
        let k = x.shape[x.rank() - 1];
        let m = x.shape[..x.rank() - 1].iter().fold(1u64, |a, &d| a.saturating_mul(d));
        let (n, wk) = match w.layout {
            Some(Layout::Nn) => (w.shape[1], w.shape[0]),
            Some(Layout::Nt) | None => (w.shape[0], w.shape[1]),
            Some(other) => {
                v.err(format!("tensor `weight` has layout {other}; linear accepts NT ([out, in]) or NN ([in, out])"));
                return (dtype, Dims::None);
            }
        };
        v.eq("weight in_features must equal x's last dim", wk, k);
        if let Some(b) = v.tensor("bias")
            && (b.rank() != 1 || b.shape[0] != n)
        {
            v.err(format!("tensor `bias` shape {:?} must be [{n}]", b.shape));
        }
        (dtype, Dims::Gemm { m, n, k })
    }

    fn quantized_linear(v: &mut Validator<'_>) -> (DType, Dims) {
        let op = v.req.op;
        let x = v.ranked("x", 2);
        let w = v.ranked("weight", 2);
        let dtype = x.map(|t| t.dtype).unwrap_or(DType::F32);
        let (Some(x), Some(w)) = (x, w) else { return (dtype, Dims::None) };
        let (m, k) = (x.shape[0], x.shape[1]);
        let n = w.shape[0];
        if op == Op::LinearW8a8 {
            v.dtype_in("x", x, &[DType::I8]);
            v.dtype_in("weight", w, &[DType::I8]);
            v.eq("weight in_features must equal x's last dim", w.shape[1], k);
            for name in ["x_scale", "w_scale"] {
                if let Some(s) = v.tensor(name) {
                    v.dtype_in(name, s, &[DType::F32]);
                }
            }
        } else {
            v.dtype_in("x", x, &[DType::F32, DType::F16, DType::BF16]);
            v.dtype_in("weight", w, &[DType::I8]);
            if k % 2 != 0 {
                v.err(format!("linear_int4 packs two input features per byte; x's last dim {k} is odd"));
            }
            v.eq("packed weight columns must be in_features / 2", w.shape[1], k / 2);
            for name in ["scales", "zeros"] {
                if let Some(s) = v.tensor(name) {
                    v.dtype_in(name, s, &[DType::F32, DType::F16, DType::BF16]);
                }
            }
        }
        if let Some(b) = v.tensor("bias")
            && (b.rank() != 1 || b.shape[0] != n)
        {
            v.err(format!("tensor `bias` shape {:?} must be [{n}]", b.shape));
        }
        (dtype, Dims::Gemm { m, n, k })
    }

    fn mlp(v: &mut Validator<'_>) -> (DType, Dims) {
        let moe = v.req.op == Op::MoeExperts;
        let lead = usize::from(moe);
        let x = v.tensor("x");
        let (wg, wu, wd) = (v.ranked("w_gate", 2 + lead), v.ranked("w_up", 2 + lead), v.ranked("w_down", 2 + lead));
        let dtype = x.map(|t| t.dtype).unwrap_or(DType::F32);
        let (Some(x), Some(wg), Some(wu), Some(wd)) = (x, wg, wu, wd) else { return (dtype, Dims::None) };
        if x.rank() < 2 || (moe && x.rank() != 2) {
            v.err(format!("tensor `x` has rank {}; {} needs [tokens, hidden]", x.rank(), v.req.op));
            return (dtype, Dims::None);
        }
        let hidden = x.shape[x.rank() - 1];
        let tokens = x.shape[..x.rank() - 1].iter().fold(1u64, |a, &d| a.saturating_mul(d));
        let experts = if moe { wg.shape[0] } else { 1 };
        let inter = wg.shape[lead];
        let e_shape = |rest: [u64; 2]| if moe { vec![experts, rest[0], rest[1]] } else { rest.to_vec() };
        for (name, t, want) in [
            ("w_gate", wg, e_shape([inter, hidden])),
            ("w_up", wu, e_shape([inter, hidden])),
            ("w_down", wd, e_shape([hidden, inter])),
        ] {
            if t.shape != want {
                v.err(format!("tensor `{name}` shape {:?} must be {want:?}", t.shape));
            }
        }
        let mut top_k = 1;
        if moe {
            let ids = v.ranked("experts", 2);
            let w = v.ranked("weights", 2);
            if let (Some(ids), Some(w)) = (ids, w) {
                v.dtype_in("experts", ids, &[DType::I32, DType::I64]);
                v.dtype_in("weights", w, &[DType::F32, DType::F16, DType::BF16]);
                v.eq("experts rows must equal tokens", ids.shape[0], tokens);
                if w.shape != ids.shape {
                    v.err(format!("tensor `weights` shape {:?} must equal `experts` shape {:?}", w.shape, ids.shape));
                }
                top_k = ids.shape[1];
            }
        }
        (dtype, Dims::Mlp { tokens, hidden, intermediate: inter, experts, top_k })
    }

    fn quant(v: &mut Validator<'_>) -> (DType, Dims) {
        let Some(x) = v.tensor("x") else { return (DType::F32, Dims::None) };
        let Attrs::Quant(a) = &v.req.attrs else { return (x.dtype, Dims::None) };
        let quantized = [DType::I8, DType::Fp8E4M3, DType::Fp8E5M2];
        if v.req.op == Op::Quantize {
            v.dtype_in("x", x, &[DType::F32, DType::F16, DType::BF16]);
            let target = a.target.unwrap_or(DType::I8);
            if !quantized.contains(&target) {
                v.err(format!("attrs.target is {target}; quantize targets i8, fp8_e4m3 or fp8_e5m2"));
            }
            if a.scheme == crate::model::attrs::QuantScheme::None && target == DType::I8 {
                v.err("attrs.scheme none is a plain cast; it needs an fp8 target".to_owned());
            }
        } else {
            v.dtype_in("x", x, &quantized);
            if let Some(s) = v.tensor("scale") {
                v.dtype_in("scale", s, &[DType::F32]);
            }
            if let Some(o) = a.out_dtype
                && !matches!(o, DType::F32 | DType::F16 | DType::BF16)
            {
                v.err(format!("attrs.out_dtype is {o}; dequantize produces f32, f16 or bf16"));
            }
        }
        use crate::model::attrs::QuantScheme;
        match a.scheme {
            QuantScheme::PerChannel | QuantScheme::PerBlock if x.rank() != 2 => {
                v.err(format!(
                    "{} quantization needs a 2-D x [rows, cols]; x has rank {}",
                    a.scheme.as_str(),
                    x.rank()
                ));
            }
            QuantScheme::PerBlock => match a.block {
                Some([r, c]) if r > 0 && c > 0 => {}
                other => v.err(format!("attrs.block is {other:?}; per_block needs [rows, cols] >= 1")),
            },
            _ => {}
        }
        let hidden = x.shape.last().copied().unwrap_or(1);
        let rows = x.shape[..x.rank().saturating_sub(1)].iter().fold(1u64, |acc, &d| acc.saturating_mul(d));
        (x.dtype, Dims::Rows { rows, hidden })
    }

    fn rows(v: &mut Validator<'_>) -> (DType, Dims) {
        let op = v.req.op;
        let primary = match op {
            Op::Rope => "q",
            Op::Embedding => "table",
            Op::Sample | Op::MoeRoute => "logits",
            Op::Swiglu | Op::Geglu => {
                if v.tensor("x").is_some() {
                    "x"
                } else {
                    "gate"
                }
            }
            _ => "x",
        };
        let Some(t) = v.tensor(primary) else {
            if matches!(op, Op::Swiglu | Op::Geglu) {
                v.err(format!("{op} needs either `x` (with attrs.split = true) or both `gate` and `up`"));
            }
            return (DType::F32, Dims::None);
        };
        if t.rank() == 0 {
            v.err(format!("tensor `{primary}` is a scalar; {op} needs at least one dimension"));
            return (t.dtype, Dims::None);
        }
        let hidden = t.shape[t.rank() - 1];
        let rows = t.shape[..t.rank() - 1].iter().fold(1u64, |a, &d| a.saturating_mul(d));
        match op {
            Op::RmsNorm | Op::LayerNorm => {
                for name in ["weight", "bias"] {
                    if let Some(w) = v.tensor(name)
                        && w.shape != [hidden]
                    {
                        v.err(format!("tensor `{name}` shape {:?} must be [{hidden}] (x's last dim)", w.shape));
                    }
                }
                if let Some(r) = v.tensor("residual")
                    && r.shape != t.shape
                {
                    v.err(format!("tensor `residual` shape {:?} must equal x's shape {:?}", r.shape, t.shape));
                }
            }
            Op::Swiglu | Op::Geglu => {
                let split = matches!(&v.req.attrs, Attrs::Swiglu(a) if a.split)
                    || matches!(&v.req.attrs, Attrs::Geglu(a) if a.split);
                match (v.tensor("x").is_some(), v.tensor("gate"), v.tensor("up")) {
                    (true, None, None) if split => {
                        if hidden % 2 != 0 {
                            v.err(format!("{op} with split = true needs an even last dim; x's is {hidden}"));
                        }
                        return (t.dtype, Dims::Rows { rows, hidden: hidden / 2 });
                    }
                    (true, None, None) => v.err(format!("{op} with `x` needs attrs.split = true")),
                    (false, Some(_), Some(u)) => {
                        if u.shape != t.shape {
                            v.err(format!("tensor `up` shape {:?} must equal `gate` shape {:?}", u.shape, t.shape));
                        }
                    }
                    _ => v.err(format!("{op} takes either `x` alone (split) or `gate` and `up`")),
                }
            }
            Op::Embedding => {
                if let Some(ids) = v.tensor("ids") {
                    v.dtype_in("ids", ids, INDEX);
                }
                if t.rank() != 2 {
                    v.err(format!("tensor `table` has rank {}; embedding needs [vocab, hidden]", t.rank()));
                }
                let tokens = v.tensor("ids").map(|i| i.numel()).unwrap_or(0);
                return (t.dtype, Dims::Rows { rows: tokens, hidden });
            }
            Op::Rope => {
                if let Some(l) = t.layout
                    && !matches!(l, Layout::Bshd | Layout::Bhsd)
                {
                    v.err(format!("tensor `q` has layout {l}; rope accepts BSHD or BHSD"));
                }
                if let Some(p) = v.tensor("positions") {
                    v.dtype_in("positions", p, INDEX);
                }
            }
            _ => {}
        }
        (t.dtype, Dims::Rows { rows, hidden })
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
