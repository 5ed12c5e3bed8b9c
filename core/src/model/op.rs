//! The canonical operation enum: one name per operation, everywhere.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An operation LayerZero selects kernels for. Names are stable snake_case strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Dense scaled-dot-product attention (prefill, decode against a contiguous cache, cross).
    Attention,
    /// Attention against a paged KV cache addressed through a block table.
    PagedAttention,
    /// RMS normalization.
    RmsNorm,
    /// Layer normalization.
    LayerNorm,
    /// Rotary position embedding.
    Rope,
    /// Dense linear layer (GEMM with optional bias).
    Linear,
    /// SwiGLU gated activation.
    Swiglu,
    /// GELU activation.
    Gelu,
    /// SiLU activation.
    Silu,
    /// Embedding-table lookup.
    Embedding,
    /// Token sampling from logits.
    Sample,
    /// Quantization to int8 / fp8.
    Quantize,
    /// Dequantization from int8 / fp8, or of packed 4-bit weights (`attrs.format`).
    Dequantize,
    /// Mixture-of-experts routing (softmax + top-k).
    MoeRoute,
    /// Text tokenization.
    Tokenize,
    /// GEGLU gated activation.
    Geglu,
    /// A gated MLP block: down(act(x @ gate^T) * (x @ up^T)).
    Mlp,
    /// Mixture-of-experts expert computation over routed tokens (grouped GEMM).
    MoeExperts,
    /// int8 x int8 linear with per-token and per-channel scales (w8a8).
    LinearW8a8,
    /// Linear with packed int4 weights in groups (weight-only quantization).
    LinearInt4,
    /// Vision Transformer patch embedding: a Conv2d with kernel = stride = patch, flattened.
    PatchEmbed,
}

impl Op {
    /// Every op, in declaration order.
    pub const ALL: [Op; 21] = [
        Op::Attention,
        Op::PagedAttention,
        Op::RmsNorm,
        Op::LayerNorm,
        Op::Rope,
        Op::Linear,
        Op::Swiglu,
        Op::Gelu,
        Op::Silu,
        Op::Embedding,
        Op::Sample,
        Op::Quantize,
        Op::Dequantize,
        Op::MoeRoute,
        Op::Tokenize,
        Op::Geglu,
        Op::Mlp,
        Op::MoeExperts,
        Op::LinearW8a8,
        Op::LinearInt4,
        Op::PatchEmbed,
    ];

    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Attention => "attention",
            Op::PagedAttention => "paged_attention",
            Op::RmsNorm => "rms_norm",
            Op::LayerNorm => "layer_norm",
            Op::Rope => "rope",
            Op::Linear => "linear",
            Op::Swiglu => "swiglu",
            Op::Gelu => "gelu",
            Op::Silu => "silu",
            Op::Embedding => "embedding",
            Op::Sample => "sample",
            Op::Quantize => "quantize",
            Op::Dequantize => "dequantize",
            Op::MoeRoute => "moe_route",
            Op::Tokenize => "tokenize",
            Op::Geglu => "geglu",
            Op::Mlp => "mlp",
            Op::MoeExperts => "moe_experts",
            Op::LinearW8a8 => "linear_w8a8",
            Op::LinearInt4 => "linear_int4",
            Op::PatchEmbed => "patch_embed",
        }
    }

    /// Parses the stable name.
    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.iter().copied().find(|o| o.as_str() == name)
    }

    /// Position in [`Op::ALL`]; used to index per-op tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// True for the two attention ops, which share their constraint vocabulary.
    pub fn is_attention(self) -> bool {
        matches!(self, Op::Attention | Op::PagedAttention)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
