//! Per-op attributes, typed. Unknown attributes are an error, never ignored.

use serde::{Deserialize, Serialize};

use super::dtype::DType;
use super::w4::{ActQuant, ScaleOrder, W4Format};

/// Which way a causal mask is aligned when seq_q != seq_k.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CausalAlignment {
    /// Query i sees keys up to i + (seq_k - seq_q): FlashAttention's convention (the default).
    #[default]
    BottomRight,
    /// Query i sees keys up to i: PyTorch SDPA's `is_causal`.
    TopLeft,
}

impl CausalAlignment {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            CausalAlignment::BottomRight => "bottom_right",
            CausalAlignment::TopLeft => "top_left",
        }
    }
}

/// Attributes of `attention` and `paged_attention`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttentionAttrs {
    /// Causal masking.
    pub causal: bool,
    /// Alignment of the causal mask when seq_q != seq_k.
    pub causal_alignment: CausalAlignment,
    /// Dropout probability (0 for inference).
    pub dropout_p: f64,
    /// Left sliding-window size in keys; `None` is unbounded.
    pub window_left: Option<u64>,
    /// tanh soft-cap on the logits; `None` is off.
    pub softcap: Option<f64>,
    /// Native ALiBi slopes (standard geometric slopes per head).
    pub alibi: bool,
    /// Softmax scale; `None` means 1/sqrt(head_dim).
    pub scale: Option<f64>,
    /// RoPE applied to q and k inside the kernel (fused): key `j` sits at position `j`, query
    /// row `i` at `i + seq_k - seq_q` (the queries are the keys' last positions); `None`: q
    /// and k arrive rotated (or unrotated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rope: Option<RopeAttrs>,
    /// `[rows, cols]` of a block-sparse mask: `mask` is then a bool block layout
    /// broadcasting to [batch, heads, ceil(seq_q / rows), ceil(seq_k / cols)], whose entry
    /// keeps or drops a whole block of queries x keys (FlashInfer's BSR, xFormers'
    /// BlockSparse). `None`: `mask`, if any, is dense.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask_block: Option<[u64; 2]>,
}

/// Attributes of `rms_norm` and `layer_norm`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NormAttrs {
    /// Epsilon added to the variance; `None` is the op's default (1e-6 rms, 1e-5 layer).
    pub eps: Option<f64>,
}

/// RoPE pair arrangement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Rotate-half pairing (NeoX / Llama): element i pairs with i + rotary_dim/2.
    #[default]
    RotateHalf,
    /// Interleaved pairing (GPT-J): element 2i pairs with 2i + 1.
    Interleaved,
}

impl RopeStyle {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            RopeStyle::RotateHalf => "rotate_half",
            RopeStyle::Interleaved => "interleaved",
        }
    }
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RopeScaling {
    /// Positions divided by `factor`.
    Linear {
        /// Scaling factor.
        factor: f64,
    },
    /// Dynamic NTK-aware base scaling.
    DynamicNtk {
        /// Scaling factor.
        factor: f64,
        /// Context length the model was trained at.
        original_max_position: u64,
    },
    /// YaRN interpolation.
    Yarn {
        /// Scaling factor.
        factor: f64,
        /// Context length the model was trained at.
        original_max_position: u64,
        /// High-frequency boundary (rotations).
        #[serde(default = "yarn_beta_fast")]
        beta_fast: f64,
        /// Low-frequency boundary (rotations).
        #[serde(default = "yarn_beta_slow")]
        beta_slow: f64,
    },
    /// Llama 3 frequency-band scaling.
    Llama3 {
        /// Scaling factor.
        factor: f64,
        /// Low-frequency factor.
        low_freq_factor: f64,
        /// High-frequency factor.
        high_freq_factor: f64,
        /// Context length the model was trained at.
        original_max_position: u64,
    },
}

impl RopeScaling {
    /// Which scaling this is, without its parameters.
    pub fn kind(&self) -> RopeScalingKind {
        match self {
            RopeScaling::Linear { .. } => RopeScalingKind::Linear,
            RopeScaling::DynamicNtk { .. } => RopeScalingKind::DynamicNtk,
            RopeScaling::Yarn { .. } => RopeScalingKind::Yarn,
            RopeScaling::Llama3 { .. } => RopeScalingKind::Llama3,
        }
    }
}

/// A RoPE frequency scaling by name (what a kernel declares it applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeScalingKind {
    /// `linear`.
    Linear,
    /// `dynamic_ntk`.
    DynamicNtk,
    /// `yarn`.
    Yarn,
    /// `llama3`.
    Llama3,
}

impl RopeScalingKind {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            RopeScalingKind::Linear => "linear",
            RopeScalingKind::DynamicNtk => "dynamic_ntk",
            RopeScalingKind::Yarn => "yarn",
            RopeScalingKind::Llama3 => "llama3",
        }
    }
}

fn yarn_beta_fast() -> f64 {
    32.0
}
fn yarn_beta_slow() -> f64 {
    1.0
}

/// Attributes of `rope`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RopeAttrs {
    /// Pair arrangement.
    pub style: RopeStyle,
    /// Rotated leading part of head_dim; `None` rotates all of it.
    pub rotary_dim: Option<u64>,
    /// Frequency base (theta); `None` is 10000.
    pub base: Option<f64>,
    /// Frequency scaling.
    pub scaling: Option<RopeScaling>,
}

/// Attributes of `swiglu`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SwigluAttrs {
    /// `x` holds gate and up as two halves of its last dimension.
    pub split: bool,
}

/// GELU approximation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GeluApproximate {
    /// Exact erf form.
    #[default]
    None,
    /// tanh approximation.
    Tanh,
}

impl GeluApproximate {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            GeluApproximate::None => "none",
            GeluApproximate::Tanh => "tanh",
        }
    }
}

/// Attributes of `gelu`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GeluAttrs {
    /// Approximation.
    pub approximate: GeluApproximate,
}

/// Attributes of `sample`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SampleAttrs {
    /// Softmax temperature; 0 or `None` with no other filter means greedy.
    pub temperature: Option<f64>,
    /// Keep the k most likely tokens.
    pub top_k: Option<u64>,
    /// Keep the smallest set whose probability reaches p.
    pub top_p: Option<f64>,
    /// Drop tokens below min_p times the top probability.
    pub min_p: Option<f64>,
    /// RNG seed.
    pub seed: Option<u64>,
}

/// Quantization granularity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuantScheme {
    /// A plain saturating cast (fp8 targets; the scale is 1).
    None,
    /// One scale for the whole tensor.
    PerTensor,
    /// One scale per output channel (row).
    PerChannel,
    /// One scale per block of `block` elements.
    PerBlock,
}

/// Memory order of a scale tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleLayout {
    /// Row-major scales.
    RowMajor,
    /// Column-major scales.
    ColumnMajor,
}

/// Attributes of `quantize` and `dequantize`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantAttrs {
    /// Granularity.
    pub scheme: QuantScheme,
    /// Block shape [rows, cols] for `per_block`.
    #[serde(default)]
    pub block: Option<[u64; 2]>,
    /// Scale memory order.
    #[serde(default)]
    pub scale_layout: Option<ScaleLayout>,
    /// Quantized dtype (i8, fp8_e4m3 or fp8_e5m2); i8 when absent.
    #[serde(default)]
    pub target: Option<DType>,
    /// Dequantized dtype (f32, f16, bf16); f32 when absent.
    #[serde(default)]
    pub out_dtype: Option<DType>,
    /// `dequantize` of packed 4-bit weights: x is i8 `[N, K/2]` bytes of this format's codes
    /// (`model::w4`), `scheme` per_block with `block` `[1, group]`. Absent: x holds int8 or
    /// fp8 values, as before the 4-bit formats (and then not serialized).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<W4Format>,
    /// The order a 4-bit format's block scales are stored in (`linear` when absent).
    #[serde(default, skip_serializing_if = "ScaleOrder::is_linear")]
    pub scale_order: ScaleOrder,
}

impl QuantAttrs {
    /// `scheme` alone: int8 / fp8 values, every other attribute its default.
    pub fn of(scheme: QuantScheme) -> QuantAttrs {
        QuantAttrs {
            scheme,
            block: None,
            scale_layout: None,
            target: None,
            out_dtype: None,
            format: None,
            scale_order: ScaleOrder::Linear,
        }
    }
}

impl QuantScheme {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            QuantScheme::None => "none",
            QuantScheme::PerTensor => "per_tensor",
            QuantScheme::PerChannel => "per_channel",
            QuantScheme::PerBlock => "per_block",
        }
    }
}

impl ScaleLayout {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            ScaleLayout::RowMajor => "row_major",
            ScaleLayout::ColumnMajor => "column_major",
        }
    }
}

/// The activation of a gated MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// SiLU (SwiGLU).
    #[default]
    Silu,
    /// Exact GELU (GEGLU).
    Gelu,
    /// tanh-approximated GELU.
    GeluTanh,
}

impl Activation {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu_tanh",
        }
    }
}

/// Attributes of `geglu`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GegluAttrs {
    /// `x` holds gate and up as two halves of its last dimension.
    pub split: bool,
    /// GELU approximation.
    pub approximate: GeluApproximate,
}

/// Attributes of `mlp` and `moe_experts`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MlpAttrs {
    /// Activation applied to the gate projection.
    pub activation: Activation,
}

/// Attributes of `linear_w8a8`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct W8a8Attrs {
    /// Output dtype (f32, f16, bf16); f32 when absent.
    pub out_dtype: Option<DType>,
    /// Input features per scale (llama.cpp's Q8_0 takes 32): `x_scale` `[M, K/g]` and
    /// `w_scale` `[N, K/g]`, row-major, each block's exact integer sum scaled by its pair.
    /// Absent: one scale per row of each (`[M]` or `[1]`, `[N]` or `[1]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_size: Option<u64>,
}

/// Attributes of `linear_int4`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Int4Attrs {
    /// Input features per scale (and zero point) group.
    pub group_size: u64,
    /// The 4-bit code of the weight (`int4` when absent; see `model::w4`).
    #[serde(default, skip_serializing_if = "W4Format::is_int4")]
    pub format: W4Format,
    /// The order the scales are stored in (`linear` when absent).
    #[serde(default, skip_serializing_if = "ScaleOrder::is_linear")]
    pub scale_order: ScaleOrder,
    /// How x enters the product (`f32` when absent; `int8`: rounded in blocks of
    /// `group_size` first, as llama.cpp's Q4_0 takes Q8_0 activations; see `model::w4`).
    #[serde(default, skip_serializing_if = "ActQuant::is_f32")]
    pub activations: ActQuant,
}

impl Int4Attrs {
    /// Plain int4 in groups of `group_size`, scales in linear order, f32 activations.
    pub fn int4(group_size: u64) -> Int4Attrs {
        Int4Attrs::of(W4Format::Int4, group_size)
    }

    /// `format` in groups of `group_size`, scales in linear order, f32 activations.
    pub fn of(format: W4Format, group_size: u64) -> Int4Attrs {
        Int4Attrs { group_size, format, scale_order: ScaleOrder::Linear, activations: ActQuant::F32 }
    }
}

/// Attributes of `patch_embed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchEmbedAttrs {
    /// Side P of the square patches: the convolution's kernel size and stride (at least 1).
    pub patch: u64,
}

/// Attributes of `moe_route`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeRouteAttrs {
    /// Experts per token.
    pub top_k: u64,
    /// Renormalize the kept weights to sum to one.
    #[serde(default)]
    pub renormalize: bool,
}

/// Attributes of `tokenize`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenizeAttrs {
    /// Identity of the tokenizer (name or hash).
    pub tokenizer_id: Option<String>,
    /// Whether offsets are wanted.
    pub return_offsets: bool,
}

/// Attributes, typed per op family.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Attrs {
    /// `attention`, `paged_attention`.
    Attention(AttentionAttrs),
    /// `rms_norm`, `layer_norm`.
    Norm(NormAttrs),
    /// `rope`.
    Rope(RopeAttrs),
    /// `swiglu`.
    Swiglu(SwigluAttrs),
    /// `gelu`.
    Gelu(GeluAttrs),
    /// `sample`.
    Sample(SampleAttrs),
    /// `quantize`, `dequantize`.
    Quant(QuantAttrs),
    /// `moe_route`.
    MoeRoute(MoeRouteAttrs),
    /// `tokenize`.
    Tokenize(TokenizeAttrs),
    /// `geglu`.
    Geglu(GegluAttrs),
    /// `mlp`, `moe_experts`.
    Mlp(MlpAttrs),
    /// `linear_w8a8`.
    W8a8(W8a8Attrs),
    /// `linear_int4`.
    Int4(Int4Attrs),
    /// `patch_embed`.
    PatchEmbed(PatchEmbedAttrs),
    /// Ops without attributes (`linear`, `silu`, `embedding`).
    None(NoAttrs),
}

/// The empty attribute set.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoAttrs {}
