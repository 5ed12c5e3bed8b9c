//! Reason codes: the closed vocabulary in which every verdict is explained.
//!
//! A code is data: a stable SCREAMING_SNAKE string, a category, and a one-line meaning.
//! Messages carry the numbers (`HEAD_DIM_TOO_LARGE: head_dim 288 > max 256`) but are never
//! parsed; tools match on the code. `schemas/reason_codes.json` is generated from this
//! enum (`lz reason-codes --json`) and a test keeps the two in sync.

use std::fmt;

use serde::{Serialize, Serializer};

/// The stage of the data path a reason belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// The backend is not installed, not probed, or absent from the target device.
    Availability,
    /// A kernel constraint does not hold for the request on this hardware.
    Constraint,
    /// An operator policy rule removed the kernel.
    Policy,
    /// An adaptation the kernel would need is not allowed.
    Transform,
    /// Memory or workspace does not fit.
    Capacity,
    /// The kernel is not safe to capture into a CUDA graph.
    Graph,
    /// The backend is marked unhealthy by the runtime.
    Health,
    /// A baked plan could not serve the request.
    Plan,
    /// A PerfDB measurement was not used.
    Measurement,
    /// The request itself is malformed or inconsistent.
    Input,
    /// A plugin (a kernel library from outside) was refused at load.
    Plugin,
    /// The kernel's outputs did not match the reference on this machine, or were never
    /// checked where the policy requires it.
    Parity,
}

impl Category {
    /// Stable lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Availability => "availability",
            Category::Constraint => "constraint",
            Category::Policy => "policy",
            Category::Transform => "transform",
            Category::Capacity => "capacity",
            Category::Graph => "graph",
            Category::Health => "health",
            Category::Plan => "plan",
            Category::Measurement => "measurement",
            Category::Input => "input",
            Category::Plugin => "plugin",
            Category::Parity => "parity",
        }
    }
}

macro_rules! reason_codes {
    ($( $(#[doc = $doc:literal])+ $variant:ident => $category:ident, )+) => {
        /// Why a kernel was rejected (or why something else on the data path happened).
        ///
        /// Closed: a code that is not here cannot be reported. New codes are added in minor
        /// releases, so matches outside this crate need a wildcard arm.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[allow(non_camel_case_types)]
        #[non_exhaustive]
        pub enum ReasonCode {
            $( $(#[doc = $doc])+ $variant, )+
        }

        impl ReasonCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ReasonCode] = &[ $( ReasonCode::$variant, )+ ];

            /// The stable SCREAMING_SNAKE string.
            pub fn as_str(self) -> &'static str {
                match self { $( ReasonCode::$variant => stringify!($variant), )+ }
            }

            /// The data-path stage this code belongs to.
            pub fn category(self) -> Category {
                match self { $( ReasonCode::$variant => Category::$category, )+ }
            }

            /// What the code means, in one line.
            pub fn meaning(self) -> &'static str {
                match self { $( ReasonCode::$variant => concat!($($doc),+).trim_ascii(), )+ }
            }

            /// Parses the stable string.
            pub fn from_name(name: &str) -> Option<ReasonCode> {
                match name { $( stringify!($variant) => Some(ReasonCode::$variant), )+ _ => None }
            }
        }
    };
}

reason_codes! {
    /// The backend is not installed on this host (no library found, no executor registered).
    BACKEND_NOT_INSTALLED => Availability,
    /// The kernel runs on another kind of device than the request's tensors.
    DEVICE_KIND_MISMATCH => Availability,
    /// The request names a device index the hardware profile does not have.
    DEVICE_NOT_PRESENT => Availability,
    /// The backend's library was loaded in a version the kernel's facts were not checked
    /// against (`library_versions` in its capability file).
    BACKEND_VERSION_UNSUPPORTED => Availability,
    /// No executor is registered for the kernel in this process (it can be planned, not run).
    EXECUTOR_NOT_REGISTERED => Availability,
    /// The kernel's executor is registered but has not passed its self-test against the
    /// reference on this machine (`lz.selftest()`), and the policy does not allow unverified
    /// executors (`allow_unverified`).
    EXECUTOR_UNVERIFIED => Availability,
    /// The runtime marked the backend (or the kernel's circuit) unhealthy after failures.
    BACKEND_UNHEALTHY => Health,
    /// The kernel errored or panicked while running; the runtime fell back.
    KERNEL_FAILED => Health,
    /// The kernel's circuit is open after failures: it is not called until its cooldown ends.
    KERNEL_QUARANTINED => Health,
    /// The kernel did not return within its deadline (`kernel_timeout_ms`); it was abandoned.
    KERNEL_TIMEOUT => Health,
    /// The kernel produced NaN/Inf outputs from finite inputs (`validate_outputs`).
    KERNEL_OUTPUT_INVALID => Health,
    /// A shadow check (`shadow_check`) ran the reference on rows of the call's inputs and the
    /// kernel's rows diverged beyond its tolerance (or, for float outputs, a cosine below
    /// 0.999): the kernel is quarantined, the call falls back, a failing parity record is
    /// written.
    KERNEL_OUTPUT_DIVERGED => Health,
    /// The kernel ran out of memory; a kernel with a smaller workspace is tried next.
    KERNEL_OUT_OF_MEMORY => Health,
    /// The worker process running an isolated kernel crashed (a signal, an abort) or hung
    /// past its deadline; it was killed, the call fell back, and the next call starts a new
    /// worker.
    KERNEL_WORKER_LOST => Health,
    /// The kernel's device was lost or it made an illegal memory access: its backend is
    /// disabled until a probe succeeds.
    DEVICE_LOST => Health,
    /// The kernel's JIT could not compile it for this shape on this machine (the library has
    /// no implementation, or ran out of memory): it is disabled for that shape, never
    /// compiled again, and the next kernel runs.
    JIT_COMPILE_FAILED => Health,
    /// The device's compute capability is below the kernel's minimum.
    COMPUTE_CAPABILITY_TOO_OLD => Constraint,
    /// The device's compute capability is above the kernel's maximum.
    COMPUTE_CAPABILITY_TOO_NEW => Constraint,
    /// The backend ships no kernel image that runs on this architecture.
    NO_KERNEL_IMAGE_FOR_ARCH => Constraint,
    /// The ROCm gfx architecture is not supported.
    GFX_ARCH_UNSUPPORTED => Constraint,
    /// The kernel takes each of two features of the request alone but not both in one call
    /// (FlashAttention-2: softcap with dropout).
    FEATURES_EXCLUSIVE => Constraint,
    /// The KV cache's strides are not ones the kernel reads (contiguous pages only, or the
    /// last dim strided).
    KV_CACHE_STRIDES_UNSUPPORTED => Constraint,
    /// The CPU lacks an instruction-set extension the kernel requires.
    CPU_ISA_MISSING => Constraint,
    /// The kernel does not accept the tensor's dtype.
    DTYPE_UNSUPPORTED => Constraint,
    /// The dtype is accepted, but not on this hardware.
    DTYPE_UNSUPPORTED_ON_HARDWARE => Constraint,
    /// The head dim (with this KV dtype) is built only for a newer compute capability than
    /// the device's.
    HEAD_DIM_UNSUPPORTED_ON_HARDWARE => Constraint,
    /// Tensors that must share a dtype do not.
    DTYPE_MISMATCH => Constraint,
    /// head_dim is below the kernel's minimum.
    HEAD_DIM_TOO_SMALL => Constraint,
    /// head_dim is above the kernel's maximum.
    HEAD_DIM_TOO_LARGE => Constraint,
    /// head_dim is not a multiple of the kernel's required alignment.
    HEAD_DIM_ALIGNMENT => Constraint,
    /// head_dim is not one of the values the kernel is built for.
    HEAD_DIM_UNSUPPORTED => Constraint,
    /// The value head_dim differs from the query/key head_dim and the kernel needs them equal.
    HEAD_DIM_V_MISMATCH => Constraint,
    /// Query and key/value head counts differ (GQA/MQA) and the kernel needs them equal.
    GQA_UNSUPPORTED => Constraint,
    /// The GQA group size (q heads per kv head) is not one the kernel supports.
    GQA_GROUP_SIZE_UNSUPPORTED => Constraint,
    /// seq_len_q is outside the kernel's range.
    SEQ_LEN_Q_UNSUPPORTED => Constraint,
    /// The kernel takes no attention mask of this kind.
    MASK_UNSUPPORTED => Constraint,
    /// An additive float mask must have the query's dtype.
    MASK_DTYPE_MISMATCH => Constraint,
    /// An explicit mask together with causal is not accepted by this kernel.
    MASK_CAUSAL_CONFLICT => Constraint,
    /// The kernel needs a full [batch, heads, seq_q, seq_k] mask, not a broadcast one.
    MASK_BROADCAST_UNSUPPORTED => Constraint,
    /// The kernel takes one mask shared by every head; this mask differs per head.
    MASK_PER_HEAD_UNSUPPORTED => Constraint,
    /// The kernel reads no block-sparse mask (a bool block layout, `attrs.mask_block`); one
    /// that takes a dense bool mask is served through the layout's expansion.
    BLOCK_SPARSE_MASK_UNSUPPORTED => Constraint,
    /// The kernel does not do causal masking.
    CAUSAL_UNSUPPORTED => Constraint,
    /// The kernel cannot honour the requested causal alignment (they differ when seq_q != seq_k).
    CAUSAL_ALIGNMENT_UNSUPPORTED => Constraint,
    /// Causal attention with seq_q > seq_k is not accepted by this kernel.
    CAUSAL_SEQ_Q_EXCEEDS_SEQ_K => Constraint,
    /// The kernel does no dropout.
    DROPOUT_UNSUPPORTED => Constraint,
    /// The kernel does no sliding-window (local) attention.
    WINDOW_UNSUPPORTED => Constraint,
    /// The kernel does no tanh logit soft-capping.
    SOFTCAP_UNSUPPORTED => Constraint,
    /// The kernel takes no native ALiBi slopes.
    ALIBI_UNSUPPORTED => Constraint,
    /// The kernel does not apply RoPE inside attention; the unfused chain (rope, then attention) does.
    FUSED_ROPE_UNSUPPORTED => Constraint,
    /// The kernel takes no custom softmax scale.
    SCALE_UNSUPPORTED => Constraint,
    /// The kernel takes no ragged (cu_seqlens) batches.
    VARLEN_UNSUPPORTED => Constraint,
    /// The kernel does not accept the tensor layout.
    LAYOUT_UNSUPPORTED => Constraint,
    /// The kernel needs stride(-1) == 1.
    LAST_DIM_NOT_CONTIGUOUS => Constraint,
    /// The kernel needs fully contiguous tensors.
    NOT_CONTIGUOUS => Constraint,
    /// A stride is not aligned as the kernel reads memory (xFormers' cutlass: q/k/v's head
    /// stride a multiple of the head-dim alignment, a float mask's rows on 16-byte
    /// boundaries); a contiguous copy of q/k/v may fix it, a mask must be allocated padded.
    STRIDE_ALIGNMENT => Constraint,
    /// The batch or the head count is above what the kernel launches (a CUDA grid
    /// dimension: cuDNN's SDPA takes each below 65536).
    BATCH_OR_HEADS_TOO_LARGE => Constraint,
    /// The paged KV cache page size is not accepted.
    PAGE_SIZE_UNSUPPORTED => Constraint,
    /// The block table dtype is not accepted.
    BLOCK_TABLE_DTYPE_UNSUPPORTED => Constraint,
    /// The KV cache layout (NHD/HND) is not accepted.
    KV_CACHE_LAYOUT_UNSUPPORTED => Constraint,
    /// The KV cache dtype is not accepted.
    KV_CACHE_DTYPE_UNSUPPORTED => Constraint,
    /// The normalized / activated dimension exceeds what the kernel handles.
    HIDDEN_SIZE_UNSUPPORTED => Constraint,
    /// The kernel needs the op's attribute in another form (e.g. a fused split, an approximation).
    ATTR_UNSUPPORTED => Constraint,
    /// A scale tensor's shape or memory order does not match the quantization scheme or what the kernel reads
    /// (a 4-bit weight's scales: block size, scale dtype, per-channel for per-block, swizzled vs linear order).
    SCALE_LAYOUT_MISMATCH => Constraint,
    /// A policy deny rule matched the kernel.
    POLICY_DENIED => Policy,
    /// An allow-list is active for this request and does not name the kernel.
    POLICY_NOT_ALLOWED => Policy,
    /// A policy lock selects another kernel for this request.
    POLICY_LOCKED_OTHER => Policy,
    /// The policy requires deterministic kernels and this one is not.
    NON_DETERMINISTIC => Policy,
    /// The kernel needs JIT compilation and the policy forbids it.
    JIT_DISALLOWED => Policy,
    /// The kernel needs an adaptation (layout, contiguity, dtype) and strict_mode forbids implicit transforms.
    TRANSFORM_REJECTED_STRICT => Transform,
    /// The kernel needs more workspace than the device has left after the request's tensors.
    MEMORY_HEADROOM_EXCEEDED => Capacity,
    /// The kernel is not safe to capture into a CUDA graph and graph_strict_mode is on.
    GRAPH_UNSAFE => Graph,
    /// The request is malformed or inconsistent (missing tensor, wrong rank, mismatched dims).
    INVALID_REQUEST => Input,
    /// The request's tensors live on different devices.
    DEVICE_MIXED => Input,
    /// The RoPE variant named (a model config's `rope_type`, e.g. XPos or LongRoPE) is not one LayerZero implements.
    ROPE_VARIANT_UNSUPPORTED => Input,
    /// The tokenizer's identity hash (vocabulary, merges, normalizer, special tokens...) is
    /// not the one the caller pinned: its ids would mean other text.
    TOKENIZER_MISMATCH => Input,
    /// The loaded dispatch table has no entry for the request's key and bucket; selected live.
    PLAN_BUCKET_MISS => Plan,
    /// A plan or cached selection was made for another tokenizer of the model (its identity
    /// hash differs): not served.
    TOKENIZER_HASH_MISMATCH => Plan,
    /// The dispatch table was made for another hardware fingerprint.
    PLAN_HARDWARE_MISMATCH => Plan,
    /// The dispatch table was made from other capabilities (capabilities hash differs).
    PLAN_CAPABILITIES_MISMATCH => Plan,
    /// The dispatch table was made under another policy (policy hash differs).
    PLAN_POLICY_MISMATCH => Plan,
    /// The dispatch table's schema or key format is not the one this layerzero reads.
    PLAN_SCHEMA_MISMATCH => Plan,
    /// A dispatch-table entry names a kernel that is unknown or not eligible here.
    PLAN_KERNEL_INELIGIBLE => Plan,
    /// A PerfDB row was measured on another hardware fingerprint; ignored.
    PERFDB_HARDWARE_MISMATCH => Measurement,
    /// A PerfDB row was measured with another kernel or backend version; ignored.
    PERFDB_VERSION_MISMATCH => Measurement,
    /// A PerfDB row has too few samples or too much variance to be trusted; ignored.
    PERFDB_LOW_CONFIDENCE => Measurement,
    /// The policy requires a passing parity record (`require_parity: strict`) and the kernel
    /// has none for this machine, its versions and the request's kind and bucket (`lz parity
    /// --record`).
    PARITY_UNVERIFIED => Parity,
    /// The kernel's last comparison against the reference on this machine, for the request's
    /// kind and bucket, failed (the message has the figures and when); refused under every
    /// `require_parity` unless the policy lists it in `allow_parity_failed`.
    PARITY_FAILED => Parity,
    /// The file is not a LayerZero plugin: it does not load as a shared library (truncated,
    /// another architecture, a missing dependency) or lacks the plugin symbols.
    PLUGIN_NOT_LOADABLE => Plugin,
    /// The plugin speaks another version of the plugin C ABI than this LayerZero.
    PLUGIN_ABI_UNSUPPORTED => Plugin,
    /// The plugin's capabilities are not valid JSON, fail the capabilities schema, or declare
    /// kernels outside the plugin's own namespace.
    PLUGIN_CAPABILITIES_INVALID => Plugin,
    /// The plugin declares a kernel it does not export (`lz_plugin_kernel` returns NULL).
    PLUGIN_KERNEL_MISSING => Plugin,
    /// The plugin's namespace is a builtin backend's or another loaded plugin's (the same
    /// name and version loaded twice).
    PLUGIN_NAMESPACE_CLASH => Plugin,
    /// The plugin's library or capabilities hash, name or version is not what the lockfile
    /// pinned (a tampered or replaced file).
    PLUGIN_HASH_MISMATCH => Plugin,
    /// A plugin was found (a Python package's `layerzero.backends` entry point) that the
    /// lockfile does not pin: it is not imported.
    PLUGIN_NOT_LOCKED => Plugin,
    /// The policy's plugin allowlist (`allow_plugins`) does not name the plugin.
    PLUGIN_NOT_ALLOWED => Plugin,
    /// A hub variant was not chosen: another ABI, OS or architecture, a kind this LayerZero
    /// cannot load, or metadata that does not parse.
    PLUGIN_VARIANT_REJECTED => Plugin,
    /// A path in hub metadata leaves the variant's folder (`..`, an absolute path, a symlink
    /// pointing out), or a file is larger than the bound.
    PLUGIN_PATH_UNSAFE => Plugin,
    /// Two plugins need different major versions of one native runtime (`requires`), which
    /// cannot share a process.
    PLUGIN_REQUIREMENTS_CONFLICT => Plugin,
    /// An isolated plugin's worker process could not be started, or did not open the plugin
    /// (the worker program is missing, or it exited before answering); or the policy isolates
    /// a plugin that cannot run in a worker (a Python plugin).
    PLUGIN_WORKER_FAILED => Plugin,
}

impl Serialize for ReasonCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One reason: a code plus a message with the numbers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reason {
    code: ReasonCode,
    message: String,
}

impl Reason {
    /// A reason with its message.
    pub fn new(code: ReasonCode, message: impl Into<String>) -> Reason {
        Reason { code, message: message.into() }
    }

    /// The code.
    pub fn code(&self) -> ReasonCode {
        self.code
    }

    /// The category of the code.
    pub fn category(&self) -> Category {
        self.code.category()
    }

    /// The message, with the numbers.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Reason", 3)?;
        st.serialize_field("code", self.code.as_str())?;
        st.serialize_field("category", self.code.category().as_str())?;
        st.serialize_field("message", &self.message)?;
        st.end()
    }
}

/// The `schemas/reason_codes.json` document: every code with its category and meaning.
pub fn reason_codes_document() -> serde_json::Value {
    let codes: Vec<serde_json::Value> = ReasonCode::ALL
        .iter()
        .map(|c| {
            serde_json::json!({
                "code": c.as_str(),
                "category": c.category().as_str(),
                "meaning": c.meaning(),
            })
        })
        .collect();
    serde_json::json!({
        "description": "Every LayerZero reason code. Generated from layerzero::ReasonCode by `lz reason-codes --json`; do not edit by hand.",
        "codes": codes,
    })
}
