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
    /// Dequantization from int8 / fp8.
    Dequantize,
    /// Mixture-of-experts routing (softmax + top-k).
    MoeRoute,
    /// Text tokenization.
    Tokenize,
}

impl Op {
    /// Every op, in declaration order.
    pub const ALL: [Op; 15] = [
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
