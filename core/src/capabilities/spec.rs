//! What a kernel can do, as data: the typed form of `capabilities/*.json`.
//!
//! Every field here is read by a check in `constraint/` and flipped by a test; a field that
//! nothing checks must not exist. Lists and ranges that are absent do not restrict; feature
//! flags that are absent mean "not supported" (a capability is never assumed).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::hardware::profile::{ComputeCapability, CpuFeatures};
use crate::model::attrs::{
    Activation, CausalAlignment, GeluApproximate, QuantScheme, RopeScalingKind, RopeStyle, ScaleLayout,
};
use crate::model::device::DeviceKind;
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::model::tensor::TensorDesc;
use crate::model::w4::{ActQuant, ScaleOrder, W4Format};

/// How a backend's kernels get executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Execution {
    /// Compiled into LayerZero.
    Builtin,
    /// LayerZero's own code over a library loaded at run time (probe names the libraries).
    DynamicLibrary,
    /// Another project's library; runs when the host registers an executor for it.
    External,
}

/// Where the facts of a backend file were read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// Repository (`owner/name`).
    pub repository: String,
    /// Version string in that tree.
    pub version: String,
    /// Commit read.
    pub commit: String,
    /// Files read.
    #[serde(default)]
    pub files: Vec<String>,
}

/// How to find out at run time whether a dynamic-library backend is installed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    /// Shared libraries, any one of which makes the backend installed.
    pub libraries: Vec<String>,
    /// A loader that also searches a knob's path and the Python environment and reads the
    /// library's version (`onednn`); absent: the names through the system loader only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loader: Option<String>,
}

/// The library versions a kernel's facts were checked against: `min` inclusive, `below`
/// exclusive (`{"min": "3.2.0", "below": "4.0.0"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LibraryVersions {
    /// The oldest version checked.
    pub min: String,
    /// The first version not checked.
    pub below: String,
}

/// A compiled CUDA target: `8.0` (runs on 8.x with x >= 0) or `9.0a` (arch-specific: 9.0 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArchTarget {
    /// The capability compiled for.
    pub cc: ComputeCapability,
    /// Arch-specific features (`sm_90a`): runs on exactly that capability.
    pub arch_specific: bool,
}

impl ArchTarget {
    /// True when a binary for this target runs on a device of capability `dev`.
    pub fn runs_on(self, dev: ComputeCapability) -> bool {
        if self.arch_specific { dev == self.cc } else { dev.major == self.cc.major && dev.minor >= self.cc.minor }
    }
}

impl fmt::Display for ArchTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.cc, if self.arch_specific { "a" } else { "" })
    }
}

impl FromStr for ArchTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<ArchTarget, String> {
        let (base, arch_specific) = match s.strip_suffix('a') {
            Some(b) => (b, true),
            None => (s, false),
        };
        Ok(ArchTarget { cc: base.parse()?, arch_specific })
    }
}

impl Serialize for ArchTarget {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ArchTarget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ArchTarget, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// An inclusive range of compute capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CcRange {
    /// Lowest supported.
    #[serde(default)]
    pub min: Option<ComputeCapability>,
    /// Highest supported.
    #[serde(default)]
    pub max: Option<ComputeCapability>,
}

/// An inclusive integer range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Range {
    /// Lowest accepted.
    #[serde(default)]
    pub min: Option<u64>,
    /// Highest accepted.
    #[serde(default)]
    pub max: Option<u64>,
}

impl Range {
    /// True when `v` is inside.
    pub fn contains(&self, v: u64) -> bool {
        self.min.is_none_or(|m| v >= m) && self.max.is_none_or(|m| v <= m)
    }
}

/// A dtype that needs more of the hardware than the kernel in general.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DtypeRequirement {
    /// The dtype.
    pub dtype: DType,
    /// Lowest compute capability for this dtype.
    #[serde(default)]
    pub min_compute_capability: Option<ComputeCapability>,
    /// CPU feature sets, any one of which (all of its features) enables this dtype.
    #[serde(default)]
    pub cpu_isa_any_of: Option<Vec<CpuFeatures>>,
}

/// Head dims that need more of the hardware than the kernel in general (FlashInfer's decode
/// compiles head dims above 256 on SM80 and newer, and with a one-byte KV cache only on
/// SM100 and newer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadDimRequirement {
    /// The requirement holds for head dims above this.
    pub above: u64,
    /// Only with these KV dtypes (every KV dtype when absent).
    #[serde(default)]
    pub kv_dtypes: Option<Vec<DType>>,
    /// Lowest compute capability.
    pub min_compute_capability: ComputeCapability,
}

/// A (query/key, value) head-dim pair a kernel is built for beside equal head dims (FA3's
/// dispatcher compiles (64, 256), (64, 512), (192, 128)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadDimPair {
    /// q/k head dim.
    pub head_dim: u64,
    /// v head dim.
    pub head_dim_v: u64,
    /// Only for these query dtypes (any when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtypes: Option<Vec<DType>>,
    /// Built only from this compute capability on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_compute_capability: Option<ComputeCapability>,
}

/// A check that a library makes in its single-request entry point only, not in its batch
/// wrappers (FlashInfer's `single_prefill_with_kv_cache`): a ragged or paged request skips it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SinglePathCheck {
    /// `exclusive`.
    Exclusive,
    /// `causal.seq_q_le_seq_k`: the batch wrappers take causal with more queries than keys
    /// (the rows before the first key give zeros), the single-request path refuses it.
    SeqQLeSeqK,
}

/// A head-dim multiple that holds below a compute capability instead of `multiple_by_dtype`
/// (xFormers' cutlass kernel aligns f32 head dims to 4 only where tensor cores run them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchMultiple {
    /// Devices below this compute capability.
    pub below_compute_capability: ComputeCapability,
    /// Query dtypes it is for.
    pub dtypes: Vec<DType>,
    /// The multiple there.
    pub multiple: u64,
}

/// RoPE fused into attention (`attrs.rope`): what the kernel's rotation covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FusedRope {
    /// Pair arrangements.
    pub styles: Vec<RopeStyle>,
    /// Frequency scalings it applies (none: unscaled frequencies only).
    #[serde(default)]
    pub scalings: Vec<RopeScalingKind>,
    /// Rotates a leading part of the head dim (`rotary_dim` below head_dim); otherwise all of it.
    #[serde(default)]
    pub partial: bool,
}

/// head_dim limits.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadDim {
    /// Smallest.
    #[serde(default)]
    pub min: Option<u64>,
    /// Largest.
    #[serde(default)]
    pub max: Option<u64>,
    /// Required multiple (all dtypes).
    #[serde(default)]
    pub multiple: Option<u64>,
    /// Required multiple for specific dtypes (overrides `multiple`).
    #[serde(default)]
    pub multiple_by_dtype: BTreeMap<DType, u64>,
    /// The only values built.
    #[serde(default)]
    pub values: Option<Vec<u64>>,
    /// Multiples that replace `multiple_by_dtype` / `multiple` on older devices (the first
    /// entry matching the device and dtype).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub multiple_by_arch: Vec<ArchMultiple>,
    /// The library's entry point pads a head dim up to a multiple of this before its own
    /// check (FlashAttention-2's Python wrappers): an unaligned head dim is taken, its pad
    /// planned as a transform the library performs, and charged.
    #[serde(default)]
    pub padded_to: Option<u64>,
}

/// The multiples `head_dim.padded_to` may name, with the name a planned pad carries as its
/// `to` (checked when a catalog loads).
pub const PAD_MULTIPLES: [(u64, &str); 4] =
    [(8, "multiple of 8"), (16, "multiple of 16"), (32, "multiple of 32"), (64, "multiple of 64")];

impl HeadDim {
    /// The multiple a head dim of `dtype` needs on a device of compute capability `cc`
    /// (unknown: the strictest, `multiple_by_dtype` / `multiple`).
    pub fn multiple_for(&self, dtype: DType, cc: Option<ComputeCapability>) -> Option<u64> {
        let older = cc.and_then(|cc| {
            self.multiple_by_arch.iter().find(|m| cc < m.below_compute_capability && m.dtypes.contains(&dtype))
        });
        older.map(|m| m.multiple).or_else(|| self.multiple_by_dtype.get(&dtype).copied()).or(self.multiple)
    }
}

/// Grouped-query attention support.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gqa {
    /// Whether heads_q != heads_kv is accepted natively.
    pub supported: bool,
    /// The only group sizes (heads_q / heads_kv) accepted, if restricted.
    #[serde(default)]
    pub group_sizes: Option<Vec<u64>>,
}

/// Causal masking support.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Causal {
    /// Alignments the kernel implements (they differ only when seq_q != seq_k).
    pub alignments: Vec<CausalAlignment>,
    /// Causal only with seq_q == seq_k.
    #[serde(default)]
    pub square_only: bool,
    /// Causal only with seq_q <= seq_k.
    #[serde(default)]
    pub seq_q_le_seq_k: bool,
}

/// Mask kinds by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskName {
    /// Boolean keep-mask.
    Bool,
    /// Additive float mask.
    Float,
    /// Bool block layout (`attrs.mask_block`) read without expanding it.
    BlockSparse,
}

/// An attention feature a call may use, for constraints on combinations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// `dropout_p > 0`.
    Dropout,
    /// tanh soft-capping.
    Softcap,
    /// A left sliding window.
    Window,
    /// Native ALiBi slopes.
    Alibi,
    /// An explicit mask tensor.
    Mask,
    /// Causal masking.
    Causal,
    /// A ragged batch (cu_seqlens).
    Varlen,
    /// A custom softmax scale.
    CustomScale,
    /// fp8 queries (e4m3 or e5m2).
    Fp8,
    /// RoPE fused into attention (`attrs.rope`).
    Rope,
}

impl Feature {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Feature::Dropout => "dropout",
            Feature::Softcap => "softcap",
            Feature::Window => "window",
            Feature::Alibi => "alibi",
            Feature::Mask => "mask",
            Feature::Causal => "causal",
            Feature::Varlen => "varlen",
            Feature::CustomScale => "custom_scale",
            Feature::Fp8 => "fp8",
            Feature::Rope => "rope",
        }
    }
}

/// What strides a kernel accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StrideRule {
    /// Any strides.
    Any,
    /// Any strides with stride(-1) == 1 (the kernel reads row and head strides).
    LastDimContiguous,
    /// Fully contiguous tensors only.
    Contiguous,
}

impl StrideRule {
    /// Whether `t`'s strides follow the rule.
    pub fn allows(self, t: &TensorDesc) -> bool {
        match self {
            StrideRule::Any => true,
            StrideRule::LastDimContiguous => t.last_dim_contiguous(),
            StrideRule::Contiguous => t.is_contiguous(),
        }
    }
}

/// Paged-cache page sizes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageSize {
    /// Required multiple.
    #[serde(default)]
    pub multiple: Option<u64>,
    /// The only values built.
    #[serde(default)]
    pub values: Option<Vec<u64>>,
}

/// The two swiglu input forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwigluForm {
    /// `x` holds both halves.
    Split,
    /// Separate `gate` and `up`.
    Separate,
}

impl SwigluForm {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            SwigluForm::Split => "split",
            SwigluForm::Separate => "separate",
        }
    }
}

/// Every constraint a kernel can declare.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constraints {
    // ---- hardware ----
    /// Compute-capability range the backend's own check enforces.
    #[serde(default)]
    pub compute_capability: Option<CcRange>,
    /// CUDA targets with compiled kernels; a device none of them runs on has no kernel image.
    #[serde(default)]
    pub built_archs: Option<Vec<ArchTarget>>,
    /// ROCm gfx architectures supported.
    #[serde(default)]
    pub gfx: Option<Vec<String>>,
    /// CPU features all required.
    #[serde(default)]
    pub cpu_isa: Option<CpuFeatures>,
    // ---- dtypes ----
    /// dtypes of the primary tensor (q, x, logits, table).
    #[serde(default)]
    pub dtypes: Option<Vec<DType>>,
    /// Extra hardware needs of particular dtypes.
    #[serde(default)]
    pub dtype_requirements: Vec<DtypeRequirement>,
    // ---- attention ----
    /// head_dim limits.
    #[serde(default)]
    pub head_dim: Option<HeadDim>,
    /// The value head_dim may differ from the query/key head_dim.
    #[serde(default)]
    pub different_v_head_dim: bool,
    /// GQA/MQA support; absent means heads_q must equal heads_kv.
    #[serde(default)]
    pub gqa: Option<Gqa>,
    /// seq_len_q range.
    #[serde(default)]
    pub seq_len_q: Option<Range>,
    /// Causal support; absent means no causal masking.
    #[serde(default)]
    pub causal: Option<Causal>,
    /// Mask kinds accepted (no mask is always accepted).
    #[serde(default)]
    pub masks: Vec<MaskName>,
    /// An additive float mask must have the query's dtype.
    #[serde(default)]
    pub float_mask_matches_q: bool,
    /// A mask may be combined with causal.
    #[serde(default)]
    pub mask_with_causal: bool,
    /// Batch and heads each at most this (a CUDA grid dimension: cuDNN's SDPA).
    #[serde(default)]
    pub max_batch_and_heads: Option<u64>,
    /// Stride rule of an attention mask (absent: any strides).
    #[serde(default)]
    pub mask_strides: Option<StrideRule>,
    /// (head_dim, head_dim_v) pairs built beside equal head dims (`different_v_head_dim`
    /// admits any pair; this only these).
    #[serde(default)]
    pub head_dim_pairs: Vec<HeadDimPair>,
    /// Checks made only on the library's single-request path (a ragged or paged request
    /// skips them).
    #[serde(default)]
    pub single_path_only: Vec<SinglePathCheck>,
    /// Dense attention: the dtypes k and v may have besides the query's (a quantized KV
    /// under a 16-bit query, FlashInfer's single decode and ragged prefill); absent: q's.
    #[serde(default)]
    pub kv_dtypes: Option<Vec<DType>>,
    /// Head dims that need a newer compute capability (per KV dtype).
    #[serde(default)]
    pub head_dim_requirements: Vec<HeadDimRequirement>,
    /// The K and V caches must have identical strides (FlashInfer's CUDA-core decode).
    #[serde(default)]
    pub kv_cache_equal_strides: bool,
    /// Strides aligned as xFormers' cutlass kernel reads them: q's and v's head stride
    /// (`stride(-2)` of BMHK) a multiple of the head_dim multiple of the dtype, and a float
    /// mask's strides but the last multiples of 16 bytes, its last stride 1.
    #[serde(default)]
    pub aligned_strides: bool,
    /// A mask may broadcast over batch/heads (otherwise it must be full [B, H, Sq, Sk]).
    #[serde(default)]
    pub mask_broadcast: bool,
    /// The kernel takes one mask per sequence, shared by every head: a mask with a heads
    /// dimension above one is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mask_shared_by_heads: bool,
    /// Dropout.
    #[serde(default)]
    pub dropout: bool,
    /// Left sliding window.
    #[serde(default)]
    pub window: bool,
    /// tanh soft-cap.
    #[serde(default)]
    pub softcap: bool,
    /// Native ALiBi.
    #[serde(default)]
    pub alibi: bool,
    /// Custom softmax scale.
    #[serde(default)]
    pub custom_scale: bool,
    /// Ragged batches through cu_seqlens.
    #[serde(default)]
    pub varlen: bool,
    /// Pairs of features the kernel takes alone but rejects together in one call (FA2:
    /// softcap with dropout).
    #[serde(default)]
    pub exclusive: Vec<[Feature; 2]>,
    // ---- layout ----
    /// Layout tags accepted for the data tensors that carry one.
    #[serde(default)]
    pub layouts: Option<Vec<Layout>>,
    /// Stride rule for the data tensors.
    #[serde(default)]
    pub strides: Option<StrideRule>,
    // ---- paged KV ----
    /// Page sizes.
    #[serde(default)]
    pub page_size: Option<PageSize>,
    /// Block-table dtypes.
    #[serde(default)]
    pub block_table_dtypes: Option<Vec<DType>>,
    /// KV cache layouts.
    #[serde(default)]
    pub kv_cache_layouts: Option<Vec<Layout>>,
    /// KV cache dtypes; absent means the cache must have the query's dtype.
    #[serde(default)]
    pub kv_cache_dtypes: Option<Vec<DType>>,
    /// Stride rule of the KV caches (strided pages: a page stride larger than a page, as
    /// in a cache carved from a larger pool); absent means any strides.
    #[serde(default)]
    pub kv_cache_strides: Option<StrideRule>,
    // ---- row-wise ops ----
    /// Range of the last (hidden) dimension.
    #[serde(default)]
    pub hidden_size: Option<Range>,
    /// rms_norm: fused residual add.
    #[serde(default)]
    pub fused_residual: bool,
    /// attention: RoPE applied to q and k inside the kernel (`attrs.rope`).
    #[serde(default)]
    pub fused_rope: Option<FusedRope>,
    /// rope: pair arrangements.
    #[serde(default)]
    pub rope_styles: Option<Vec<RopeStyle>>,
    /// rope: frequency scaling supported.
    #[serde(default)]
    pub rope_scaling: bool,
    /// gelu, geglu: approximations.
    #[serde(default)]
    pub gelu_approximations: Option<Vec<GeluApproximate>>,
    /// swiglu, geglu: input forms.
    #[serde(default)]
    pub glu_forms: Option<Vec<SwigluForm>>,
    /// linear: weight layouts.
    #[serde(default)]
    pub weight_layouts: Option<Vec<Layout>>,
    /// mlp, moe_experts: activations.
    #[serde(default)]
    pub activations: Option<Vec<Activation>>,
    // ---- quantization ----
    /// quantize, dequantize: granularities.
    #[serde(default)]
    pub quant_schemes: Option<Vec<QuantScheme>>,
    /// quantize: target dtypes; dequantize: input dtypes.
    #[serde(default)]
    pub quant_targets: Option<Vec<DType>>,
    /// quantize, dequantize: per_block block shapes [rows, cols].
    #[serde(default)]
    pub quant_blocks: Option<Vec<[u64; 2]>>,
    /// quantize, dequantize: memory orders of the scale tensor.
    #[serde(default)]
    pub scale_layouts: Option<Vec<ScaleLayout>>,
    /// linear_int4: group sizes.
    #[serde(default)]
    pub group_sizes: Option<Vec<u64>>,
    /// linear_int4 and dequantize: the 4-bit weight formats it decodes (linear_int4: `int4`
    /// only when absent; dequantize: none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_formats: Option<Vec<W4Format>>,
    /// linear_int4 and a 4-bit dequantize: the scale orders it reads (`linear` only when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_orders: Option<Vec<ScaleOrder>>,
    /// linear_int4: how it takes the activations (`f32` only when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub int4_activations: Option<Vec<ActQuant>>,
}

/// Which ops may declare which op-specific constraint fields.
pub(crate) fn fields_for_op(op: Op) -> &'static [&'static str] {
    const ATTN: &[&str] = &[
        "head_dim",
        "different_v_head_dim",
        "gqa",
        "seq_len_q",
        "causal",
        "masks",
        "float_mask_matches_q",
        "mask_with_causal",
        "aligned_strides",
        "head_dim_requirements",
        "head_dim_pairs",
        "single_path_only",
        "kv_dtypes",
        "max_batch_and_heads",
        "mask_strides",
        "mask_broadcast",
        "mask_shared_by_heads",
        "dropout",
        "window",
        "softcap",
        "alibi",
        "custom_scale",
        "varlen",
        "fused_rope",
        "exclusive",
    ];
    const PAGED: &[&str] = &[
        "head_dim",
        "head_dim_requirements",
        "head_dim_pairs",
        "single_path_only",
        "kv_cache_equal_strides",
        "different_v_head_dim",
        "gqa",
        "seq_len_q",
        "causal",
        "softcap",
        "alibi",
        "custom_scale",
        "window",
        "page_size",
        "block_table_dtypes",
        "kv_cache_layouts",
        "kv_cache_dtypes",
        "kv_cache_strides",
        "fused_rope",
        "exclusive",
    ];
    match op {
        Op::Attention => ATTN,
        Op::PagedAttention => PAGED,
        Op::RmsNorm => &["hidden_size", "fused_residual"],
        Op::LayerNorm => &["hidden_size", "fused_residual"],
        Op::Rope => &["hidden_size", "rope_styles", "rope_scaling"],
        Op::Gelu => &["hidden_size", "gelu_approximations"],
        Op::Swiglu => &["hidden_size", "glu_forms"],
        Op::Geglu => &["hidden_size", "glu_forms", "gelu_approximations"],
        Op::Linear => &["weight_layouts"],
        Op::Mlp | Op::MoeExperts => &["activations"],
        Op::Quantize => &["hidden_size", "quant_schemes", "quant_targets", "quant_blocks", "scale_layouts"],
        Op::Dequantize => &[
            "hidden_size",
            "quant_schemes",
            "quant_targets",
            "quant_blocks",
            "scale_layouts",
            "weight_formats",
            "scale_orders",
        ],
        Op::LinearInt4 => &["group_sizes", "weight_formats", "scale_orders", "int4_activations"],
        Op::LinearW8a8 => &["group_sizes", "scale_layouts"],
        Op::PatchEmbed | Op::Tokenize => &[],
        _ => &["hidden_size"],
    }
}

/// Names of the op-specific fields a constraint set actually declares.
pub(crate) fn declared_op_fields(c: &Constraints) -> Vec<&'static str> {
    let mut v = Vec::new();
    let mut add = |present: bool, name: &'static str| {
        if present {
            v.push(name);
        }
    };
    add(c.head_dim.is_some(), "head_dim");
    add(c.different_v_head_dim, "different_v_head_dim");
    add(c.gqa.is_some(), "gqa");
    add(c.seq_len_q.is_some(), "seq_len_q");
    add(c.causal.is_some(), "causal");
    add(!c.masks.is_empty(), "masks");
    add(c.float_mask_matches_q, "float_mask_matches_q");
    add(c.mask_with_causal, "mask_with_causal");
    add(c.aligned_strides, "aligned_strides");
    add(!c.head_dim_requirements.is_empty(), "head_dim_requirements");
    add(!c.head_dim_pairs.is_empty(), "head_dim_pairs");
    add(!c.single_path_only.is_empty(), "single_path_only");
    add(c.kv_dtypes.is_some(), "kv_dtypes");
    add(c.max_batch_and_heads.is_some(), "max_batch_and_heads");
    add(c.mask_strides.is_some(), "mask_strides");
    add(c.kv_cache_equal_strides, "kv_cache_equal_strides");
    add(c.mask_broadcast, "mask_broadcast");
    add(c.mask_shared_by_heads, "mask_shared_by_heads");
    add(c.dropout, "dropout");
    add(c.window, "window");
    add(c.softcap, "softcap");
    add(c.alibi, "alibi");
    add(c.custom_scale, "custom_scale");
    add(c.varlen, "varlen");
    add(c.page_size.is_some(), "page_size");
    add(c.block_table_dtypes.is_some(), "block_table_dtypes");
    add(c.kv_cache_layouts.is_some(), "kv_cache_layouts");
    add(c.kv_cache_dtypes.is_some(), "kv_cache_dtypes");
    add(c.kv_cache_strides.is_some(), "kv_cache_strides");
    add(!c.exclusive.is_empty(), "exclusive");
    add(c.hidden_size.is_some(), "hidden_size");
    add(c.fused_residual, "fused_residual");
    add(c.fused_rope.is_some(), "fused_rope");
    add(c.rope_styles.is_some(), "rope_styles");
    add(c.rope_scaling, "rope_scaling");
    add(c.gelu_approximations.is_some(), "gelu_approximations");
    add(c.glu_forms.is_some(), "glu_forms");
    add(c.weight_layouts.is_some(), "weight_layouts");
    add(c.activations.is_some(), "activations");
    add(c.quant_schemes.is_some(), "quant_schemes");
    add(c.quant_targets.is_some(), "quant_targets");
    add(c.quant_blocks.is_some(), "quant_blocks");
    add(c.scale_layouts.is_some(), "scale_layouts");
    add(c.group_sizes.is_some(), "group_sizes");
    add(c.weight_formats.is_some(), "weight_formats");
    add(c.scale_orders.is_some(), "scale_orders");
    add(c.int4_activations.is_some(), "int4_activations");
    v
}

/// Execution properties of a kernel.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Properties {
    /// Bitwise-reproducible across runs.
    pub deterministic: bool,
    /// Safe to capture into a CUDA graph (no allocation, no host sync).
    pub graph_safe: bool,
    /// Compiles at first use.
    pub needs_jit: bool,
    /// Scratch memory it allocates, in bytes.
    pub workspace_bytes: u64,
    /// Per output dtype: how far its outputs may be from the f64 `cpu_reference` kernel of
    /// the same op on the same inputs (declared for quantized kernels: spec 002 §5 asks for
    /// exact bounds per backend); tests enforce the bound read from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_bound: Option<BTreeMap<DType, ErrorBound>>,
}

/// An elementwise bound: `|out - reference| <= atol + rtol * |reference|`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBound {
    /// Relative part.
    pub rtol: f64,
    /// Absolute part.
    pub atol: f64,
}

impl ErrorBound {
    /// Whether `out` is within the bound of `reference`.
    pub fn holds(&self, reference: f64, out: f64) -> bool {
        (out - reference).abs() <= self.atol + self.rtol * reference.abs()
    }
}

/// Cost-model coefficients of a kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerfModel {
    /// Fraction of the device's peak FLOP/s the kernel reaches.
    pub eff_compute: f64,
    /// Fraction of the device's memory bandwidth the kernel reaches.
    pub eff_mem: f64,
    /// Fixed per-call cost, ns.
    pub launch_ns: f64,
    /// `mlp`/`moe_experts`: the kernel keeps the intermediate projections in cache instead
    /// of writing them to memory and reading them back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fused: bool,
}

/// One kernel of a backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSpec {
    /// `backend.op.variant`.
    pub id: String,
    /// The op.
    pub op: Op,
    /// Device kind it runs on, when it differs from the backend's (PyTorch SDPA has CPU
    /// and CUDA kernels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceKind>,
    /// Kernel version (defaults to the backend's).
    #[serde(default)]
    pub version: Option<String>,
    /// How it runs, when it differs from the backend's: `external` for a kernel of a library
    /// LayerZero loads but has no executor for (it runs when the host registers one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<Execution>,
    /// For a backend loaded at run time: the library versions this kernel's facts were
    /// checked against; another loaded version rejects it (`BACKEND_VERSION_UNSUPPORTED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library_versions: Option<LibraryVersions>,
    /// What it accepts.
    pub constraints: Constraints,
    /// How it behaves.
    pub properties: Properties,
    /// Cost-model coefficients.
    pub perf: PerfModel,
    /// Where each fact comes from (upstream file and line, or the test that shows it).
    #[serde(default)]
    pub sources: Vec<String>,
}

impl KernelSpec {
    /// The device kind the kernel runs on.
    pub fn device_kind(&self, backend: &BackendSpec) -> DeviceKind {
        self.device.unwrap_or(backend.device)
    }

    /// How the kernel is executed.
    pub fn execution(&self, backend: &BackendSpec) -> Execution {
        self.execution.unwrap_or(backend.execution)
    }
}

/// One backend file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSpec {
    /// Reference to the schema (ignored).
    #[serde(rename = "$schema", default, skip_serializing)]
    pub schema_ref: Option<String>,
    /// File format version.
    pub schema_version: u32,
    /// Backend name.
    pub backend: String,
    /// What it is.
    pub description: String,
    /// Device kind its kernels run on (a kernel may override it).
    pub device: DeviceKind,
    /// Backend version the facts describe.
    pub version: String,
    /// How its kernels run.
    pub execution: Execution,
    /// How to detect it on a host (dynamic libraries).
    #[serde(default)]
    pub probe: Option<Probe>,
    /// Where the facts come from.
    #[serde(default)]
    pub upstream: Option<Upstream>,
    /// Native runtimes its library needs, by name, with the major version (`{"cuda": "12"}`):
    /// two backends needing different majors of one runtime cannot share a process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires: Option<std::collections::BTreeMap<String, String>>,
    /// Its kernels.
    pub kernels: Vec<KernelSpec>,
}

/// The capability-file format version this build reads.
pub const CAPABILITIES_SCHEMA_VERSION: u32 = 1;
