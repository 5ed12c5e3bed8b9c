//! Typed arguments, one struct per op family. The selection `Request` is derived from them
//! (`describe`), so what is selected and what is executed cannot disagree. Each struct's
//! doc comment is the semantics every kernel of the op implements.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::model::attrs::{
    AttentionAttrs, Attrs, GegluAttrs, GeluAttrs, Int4Attrs, MlpAttrs, MoeRouteAttrs, NoAttrs, NormAttrs,
    PatchEmbedAttrs, QuantAttrs, RopeAttrs, SampleAttrs, SwigluAttrs, W8a8Attrs,
};
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::model::request::Request;
use crate::tensor::HostTensor;

/// Most tensors any op's arguments hold.
pub(crate) const MAX_SLOTS: usize = 8;

/// Takes a tensor by role name (`None` when the request does not have it).
type Take<'a> = dyn FnMut(&str) -> Result<Option<HostTensor>> + 'a;
/// Maps a tensor by role name.
type MapFn<'a> = dyn FnMut(&str, &HostTensor) -> Result<HostTensor> + 'a;

macro_rules! op_args {
    ($(#[$doc:meta])* $name:ident { attrs: $attrs:ty, required: [$($req:ident),*], optional: [$($opt:ident),*] }) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        #[allow(missing_docs)]
        pub struct $name {
            $( pub $req: HostTensor, )*
            $( pub $opt: Option<HostTensor>, )*
            /// Options.
            pub attrs: $attrs,
        }

        impl $name {
            /// Tensor role names in slot order (required, then optional).
            const NAMES: &'static [&'static str] = &[$( stringify!($req), )* $( stringify!($opt), )*];

            /// The tensors by slot (see `NAMES`), without allocating.
            fn slots(&self) -> [Option<&HostTensor>; MAX_SLOTS] {
                let list = [$( Some(&self.$req), )* $( self.$opt.as_ref(), )*];
                let mut out = [None; MAX_SLOTS];
                for (o, t) in out.iter_mut().zip(list) {
                    *o = t;
                }
                out
            }

            fn tensor_list(&self) -> Vec<(&'static str, &HostTensor)> {
                #[allow(unused_mut)]
                let mut v: Vec<(&'static str, &HostTensor)> = vec![$( (stringify!($req), &self.$req), )*];
                $( if let Some(t) = &self.$opt { v.push((stringify!($opt), t)); } )*
                v
            }

            fn map(&self, f: &mut MapFn<'_>) -> Result<$name> {
                Ok($name {
                    $( $req: f(stringify!($req), &self.$req)?, )*
                    $( $opt: match &self.$opt { Some(t) => Some(f(stringify!($opt), t)?), None => None }, )*
                    attrs: self.attrs.clone(),
                })
            }

            #[allow(unused_variables)]
            fn take(take: &mut Take<'_>, attrs: $attrs, op: Op) -> Result<$name> {
                Ok($name {
                    $( $req: take(stringify!($req))?.ok_or_else(|| {
                        Error::invalid(format!("the request has no tensor `{}`, which {op} needs", stringify!($req)))
                    })?, )*
                    $( $opt: take(stringify!($opt))?, )*
                    attrs,
                })
            }
        }

        const _: () = assert!($name::NAMES.len() <= MAX_SLOTS, "raise MAX_SLOTS");
    };
}

op_args! {
    /// `attention`: q, k, v in BSHD or BHSD (any strides), optional mask and ragged offsets.
    ///
    /// Shapes: q `[B, Sq, Hq, D]` (BSHD) or `[B, Hq, Sq, D]` (BHSD); k `[B, Sk, Hkv, D]`; v
    /// `[B, Sk, Hkv, Dv]`; Hq % Hkv == 0 and query head `h` reads kv head `h / (Hq / Hkv)`.
    /// `mask` broadcasts to `[B, Hq, Sq, Sk]`: bool keeps `true`, a float mask is added to the
    /// scores. With `cu_seqlens_q`/`cu_seqlens_k` (i32 `[N+1]`) q and k/v hold N sequences
    /// packed along the sequence dim of batch 1; each attends only within itself and causal
    /// alignment applies per sequence. The output has q's layout with head dim Dv and q's
    /// dtype. Score order: see `semantics`.
    AttentionArgs { attrs: AttentionAttrs, required: [q, k, v], optional: [mask, cu_seqlens_q, cu_seqlens_k] }
}

op_args! {
    /// `paged_attention`: q `[B, Sq, Hq, D]` (BSHD) against caches addressed by a block table.
    ///
    /// Caches are NHD `[pages, page_size, Hkv, D]` or HND `[pages, Hkv, page_size, D]`;
    /// `block_table` (i32/i64 `[B, max_pages]`) maps sequence b's logical page p to a physical
    /// page; `context_lens` (i32 `[B]`) is each sequence's key count. The Sq queries of
    /// sequence b are its last Sq positions (bottom-right alignment). fp8 caches are
    /// dequantized with `k_scale`/`v_scale` (f32, `[1]` per tensor or `[Hkv]` per head; 1 when
    /// absent). A table entry that a context reaches but that lies outside the cache, or a
    /// context longer than the table, is an error; entries past the pages a context reaches
    /// are never read (padding).
    PagedAttentionArgs {
        attrs: AttentionAttrs,
        required: [q, k_cache, v_cache, block_table, context_lens],
        optional: [k_scale, v_scale]
    }
}

op_args! {
    /// `rope`: rotates q (and k) `[B, S, H, D]` in BSHD or BHSD.
    ///
    /// The first `rotary_dim` (default D) dims of each head rotate; the rest pass through.
    /// Positions are `positions` (i32/i64, `[S]` or `[B, S]`) or 0..S. Angles are
    /// `position * inv_freq` (see `semantics::rope_frequencies`), or come from `cos`/`sin`
    /// (`[max_position, rotary_dim / 2]`, indexed by position) when given. Outputs `out` (q)
    /// and `out_k` (k).
    RopeArgs { attrs: RopeAttrs, required: [q], optional: [k, positions, cos, sin] }
}

op_args! {
    /// `rms_norm` and `layer_norm` over the last dim H of x `[..., H]`, computed in f32 (f64 in
    /// the reference) and rounded once to x's dtype.
    ///
    /// rms_norm: `s = x + residual` (when given; also output as `residual_out`), then
    /// `out = s / sqrt(mean(s^2) + eps) * weight` (eps inside the root, as
    /// `torch.nn.functional.rms_norm` and Hugging Face's LlamaRMSNorm; default 1e-6).
    /// layer_norm: `out = (x - mean) / sqrt(var + eps) * weight + bias`, biased variance,
    /// as `torch.nn.functional.layer_norm` (default eps 1e-5).
    NormArgs { attrs: NormAttrs, required: [x, weight], optional: [bias, residual] }
}

op_args! {
    /// `linear`: `out = x @ W^T + bias` with x `[..., K]`, weight `[N, K]` (layout NT, the
    /// default) or `[K, N]` (layout NN), bias `[N]`; f32 accumulation; out `[..., N]` in x's dtype.
    LinearArgs { attrs: NoAttrs, required: [x, weight], optional: [bias] }
}

op_args! {
    /// `swiglu`: `silu(gate) * up`, from `gate` and `up`, or (split) from `x` whose last dim
    /// holds gate then up. Output in the input dtype.
    SwigluArgs { attrs: SwigluAttrs, required: [], optional: [x, gate, up] }
}

op_args! {
    /// `geglu`: `gelu(gate) * up` (erf or tanh GELU), forms as `swiglu`.
    GegluArgs { attrs: GegluAttrs, required: [], optional: [x, gate, up] }
}

op_args! {
    /// `gelu`: `0.5 x (1 + erf(x / sqrt 2))`, or with tanh:
    /// `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
    GeluArgs { attrs: GeluAttrs, required: [x], optional: [] }
}

op_args! {
    /// `silu`: `x * sigmoid(x)`.
    SiluArgs { attrs: NoAttrs, required: [x], optional: [] }
}

op_args! {
    /// `mlp`: `out = (act(x @ w_gate^T) * (x @ w_up^T)) @ w_down^T` with x `[..., H]`,
    /// w_gate/w_up `[I, H]`, w_down `[H, I]`; f32 accumulation; out `[..., H]` in x's dtype.
    MlpArgs { attrs: MlpAttrs, required: [x, w_gate, w_up, w_down], optional: [] }
}

op_args! {
    /// `moe_experts`: for token t, `out[t] = sum_j weights[t, j] * mlp_e(x[t])` with
    /// `e = experts[t, j]` and expert e's weights `w_gate[e]` `[I, H]`, `w_up[e]`, `w_down[e]`
    /// `[H, I]`. An expert id outside [0, E) is an error naming the position.
    MoeExpertsArgs { attrs: MlpAttrs, required: [x, experts, weights, w_gate, w_up, w_down], optional: [] }
}

op_args! {
    /// `embedding`: `out[..., :] = table[ids[...], :]`; ids i32/i64 of any shape, table
    /// `[V, H]`; an id outside [0, V) is an error naming its position.
    EmbeddingArgs { attrs: NoAttrs, required: [ids, table], optional: [] }
}

op_args! {
    /// `sample`: one token per row of logits `[B, V]`, output `tokens` (i64 `[B]`).
    ///
    /// Greedy (argmax, lowest index on ties) when temperature is absent or 0 and no filter is
    /// set. Otherwise: probabilities `softmax(logits / temperature)` (temperature 1 when
    /// absent); top-k keeps the k most probable (ties by lower index); top-p keeps the
    /// smallest prefix of the descending order whose mass reaches p of what top-k kept (the
    /// order of Hugging Face and vLLM); min-p keeps tokens with p >= min_p * max p; the kept
    /// mass is renormalized and one token is drawn by inverse
    /// CDF over the kept tokens in descending order with `u = uniform(seed, row)` from a
    /// counter-based generator, so the same seed gives the same tokens on any thread count.
    SampleArgs { attrs: SampleAttrs, required: [logits], optional: [] }
}

op_args! {
    /// `quantize`: x (f32/f16/bf16) to `out` (i8 or fp8) and `scale` (f32) with
    /// `x ~ out * scale`. Per tensor / channel (row of a 2-D x) / block (`[r, c]` tiles of a
    /// 2-D x): `scale = amax / qmax` (qmax 127 for i8, 448 for e4m3, 57344 for e5m2; 1 when
    /// amax is 0), `out = round_half_even(x / scale)` clamped to `[-qmax, qmax]` (i8) or
    /// saturated (fp8). `none` casts to fp8 with saturation (scale 1). Per-block scales are
    /// [ceil(R/r), ceil(C/c)], stored row- or column-major as `scale_layout` says.
    QuantizeArgs { attrs: QuantAttrs, required: [x], optional: [] }
}

op_args! {
    /// `dequantize`: `out = x * scale` broadcast by the scheme (the inverse of `quantize`),
    /// in `out_dtype` (f32 by default). A scale whose shape or memory order does not match
    /// the scheme is an error (SCALE_LAYOUT_MISMATCH). With `attrs.format`, x is i8 `[N, K/2]`
    /// packed 4-bit codes, `scale` their `[N, K / group]` block scales (`block` `[1, group]`),
    /// `global_scale` nvfp4's f32 `[1]`, and `out` the `[N, K]` weight (`model::w4`).
    DequantizeArgs { attrs: QuantAttrs, required: [x, scale], optional: [global_scale] }
}

op_args! {
    /// `moe_route`: `p = softmax(logits[t])` (f32); the top_k experts by p (ties by lower
    /// index) as `experts` (i32 `[T, k]`, descending p) and their `weights` (f32 `[T, k]`),
    /// renormalized to sum 1 when `renormalize`.
    MoeRouteArgs { attrs: MoeRouteAttrs, required: [logits], optional: [] }
}

op_args! {
    /// `linear_w8a8`: `out[m, n] = (sum_k x[m, k] * weight[n, k]) * x_scale[m] * w_scale[n]`
    /// (`+ bias[n]`) with i8 x `[M, K]` and weight `[N, K]`, i32 accumulation, scales f32 (`[1]`
    /// broadcasts), out in `out_dtype` (f32 by default).
    W8a8Args { attrs: W8a8Attrs, required: [x, x_scale, weight, w_scale], optional: [bias] }
}

op_args! {
    /// `linear_int4`: weight-only 4-bit linear. `weight` i8 `[N, K/2]` packs two 4-bit codes
    /// q per byte (low nibble for the even k, high nibble for nf4); with g = k / group_size:
    /// - `int4`: `w[n, k] = (q[n, k] - zero[n, g]) * scale[n, g]`, zero 8 when `zeros` is absent;
    /// - `nf4`: `w = NF4[q] * scale[n, g]` (f32 absmax);
    /// - `mxfp4`: `w = E2M1[q] * 2^(scale[n, g] - 127)` (E8M0 bytes in i8, group 32);
    /// - `nvfp4`: `w = E2M1[q] * scale[n, g] * global_scale` (fp8_e4m3 scales, group 16,
    ///   optional f32 `global_scale` [1], 1 when absent);
    ///
    /// then `out = x @ w^T (+ bias)` with f32 accumulation, in x's dtype (`model::w4`).
    Int4Args { attrs: Int4Attrs, required: [x, weight, scales], optional: [zeros, bias, global_scale] }
}

op_args! {
    /// `patch_embed`: the patch embedding of a Vision Transformer (Hugging Face
    /// `ViTPatchEmbeddings`): a Conv2d with kernel = stride = P = `attrs.patch`, no padding,
    /// flattened.
    ///
    /// `image` is `[B, C, H, W]` (layout NCHW, the default when untagged, as PyTorch's) or
    /// `[B, H, W, C]` (layout NHWC); `weight` `[D, C, P, P]` (PyTorch's Conv2d weight: out
    /// channels, in channels, kh, kw); optional `bias` `[D]`; all of one float dtype (f32,
    /// f16, bf16); H and W multiples of P. `out` is `[B, N, D]` in the image's dtype with
    /// N = (H / P) * (W / P), patches in row-major order (patch row i, column j at
    /// n = i * (W / P) + j): `out[b, n, d] = bias[d] + sum_{c, u, v} weight[d, c, u, v] *
    /// image(b, c, i * P + u, j * P + v)`, i.e. `conv2d(x, w, b, stride=P).flatten(2)
    /// .transpose(1, 2)`. Sums in f32 (f64 in the reference), rounded once.
    PatchEmbedArgs { attrs: PatchEmbedAttrs, required: [image, weight], optional: [bias] }
}

macro_rules! op_enum {
    ($( $variant:ident($args:ident) = $op:ident, $attrs:ident; )*) => {
        /// The arguments of any op LayerZero executes.
        #[derive(Debug, Clone)]
        #[allow(missing_docs)]
        pub enum OpArgs { $( $variant($args), )* }

        impl OpArgs {
            /// The op.
            pub fn op(&self) -> Op {
                match self { $( OpArgs::$variant(_) => Op::$op, )* }
            }

            /// The tensors by role name.
            pub fn tensors(&self) -> Vec<(&'static str, &HostTensor)> {
                match self { $( OpArgs::$variant(a) => a.tensor_list(), )* }
            }

            /// The role names of the tensor slots and the tensors in them (no allocation):
            /// the typed selection path reads them.
            pub(crate) fn slots(&self) -> (&'static [&'static str], [Option<&HostTensor>; MAX_SLOTS]) {
                match self { $( OpArgs::$variant(a) => ($args::NAMES, a.slots()), )* }
            }

            /// The first tensor in device memory (a CUDA tensor lent by torch) and its
            /// device, without allocating: dispatch asks it of every call.
            pub fn on_device(&self) -> Option<(&'static str, crate::model::device::DeviceRef)> {
                let (names, slots) = self.slots();
                names.iter().zip(slots).find_map(|(n, t)| t.and_then(|t| t.device()).map(|d| (*n, d)))
            }

            /// Feeds every attribute into a fingerprint (exact; floats by their bits).
            pub(crate) fn hash_attrs(&self, sig: &mut crate::model::fingerprint::Sig) {
                use crate::model::fingerprint::Words;
                match self { $( OpArgs::$variant(a) => a.attrs.words(sig), )* }
            }

            /// The typed attributes.
            pub fn attrs(&self) -> Attrs {
                match self { $( OpArgs::$variant(a) => Attrs::$attrs(a.attrs.clone()), )* }
            }

            /// The same arguments with every tensor passed through `f(name, tensor)`.
            pub fn map_tensors(&self, mut f: impl FnMut(&str, &HostTensor) -> Result<HostTensor>) -> Result<OpArgs> {
                Ok(match self { $( OpArgs::$variant(a) => OpArgs::$variant(a.map(&mut f)?), )* })
            }

            fn build(op: Op, attrs: &Attrs, take: &mut Take<'_>) -> Result<OpArgs> {
                match (op, attrs) {
                    $( (Op::$op, Attrs::$attrs(a)) => Ok(OpArgs::$variant($args::take(take, a.clone(), op)?)), )*
                    (op, _) => Err(Error::invalid(format!("op {op} has no executor in this build"))),
                }
            }
        }
    };
}

op_enum! {
    Attention(AttentionArgs) = Attention, Attention;
    PagedAttention(PagedAttentionArgs) = PagedAttention, Attention;
    Rope(RopeArgs) = Rope, Rope;
    RmsNorm(NormArgs) = RmsNorm, Norm;
    LayerNorm(NormArgs) = LayerNorm, Norm;
    Linear(LinearArgs) = Linear, None;
    Swiglu(SwigluArgs) = Swiglu, Swiglu;
    Geglu(GegluArgs) = Geglu, Geglu;
    Gelu(GeluArgs) = Gelu, Gelu;
    Silu(SiluArgs) = Silu, None;
    Mlp(MlpArgs) = Mlp, Mlp;
    MoeExperts(MoeExpertsArgs) = MoeExperts, Mlp;
    Embedding(EmbeddingArgs) = Embedding, None;
    Sample(SampleArgs) = Sample, Sample;
    Quantize(QuantizeArgs) = Quantize, Quant;
    Dequantize(DequantizeArgs) = Dequantize, Quant;
    MoeRoute(MoeRouteArgs) = MoeRoute, MoeRoute;
    LinearW8a8(W8a8Args) = LinearW8a8, W8a8;
    LinearInt4(Int4Args) = LinearInt4, Int4;
    PatchEmbed(PatchEmbedArgs) = PatchEmbed, PatchEmbed;
}

pub use super::outputs::Outputs;

impl OpArgs {
    /// The selection request these arguments pose.
    pub fn describe(&self) -> Request {
        let tensors = self.tensors().into_iter().map(|(n, t)| (n.to_owned(), t.desc())).collect();
        Request { op: self.op(), tensors, attrs: self.attrs() }
    }

    /// Arguments of `op` from tensors by role name, each taken as it is (its strides and
    /// layout tag kept: nothing is copied), and the op's attributes; a tensor the op does not
    /// take is an error naming it.
    pub fn from_tensors(op: Op, attrs: &Attrs, mut inputs: BTreeMap<&str, HostTensor>) -> Result<OpArgs> {
        let mut take = |name: &str| -> Result<Option<HostTensor>> { Ok(inputs.remove(name)) };
        let args = OpArgs::build(op, attrs, &mut take)?;
        if let Some(extra) = inputs.keys().next() {
            return Err(Error::invalid(format!("{op} takes no tensor `{extra}`")));
        }
        Ok(args)
    }

    /// Arguments for `request` from tensors by name (e.g. read from safetensors). Each
    /// request tensor must be present with the request's dtype and shape; its layout tag and
    /// strides are applied (a strided request gets a strided view of the same values).
    pub fn from_request(request: &Request, mut inputs: BTreeMap<String, HostTensor>) -> Result<OpArgs> {
        let mut take = |name: &str| -> Result<Option<HostTensor>> {
            let Some(desc) = request.tensors.get(name) else { return Ok(None) };
            let t = inputs
                .remove(name)
                .ok_or_else(|| Error::invalid(format!("input tensor `{name}` is missing (the request names it)")))?;
            if t.dtype() != desc.dtype {
                return Err(Error::invalid(format!(
                    "input tensor `{name}` has dtype {}; the request says {}",
                    t.dtype(),
                    desc.dtype
                )));
            }
            let shape: Vec<usize> = desc.shape.iter().map(|&d| d as usize).collect();
            if t.shape() != shape.as_slice() {
                return Err(Error::invalid(format!(
                    "input tensor `{name}` has shape {:?}; the request says {:?}",
                    t.shape(),
                    desc.shape
                )));
            }
            let t = match &desc.strides {
                Some(s) => strided_copy(&t, &s.iter().map(|&x| x as usize).collect::<Vec<_>>())
                    .map_err(|e| Error::invalid(format!("input tensor `{name}`: {e}")))?,
                None => t,
            };
            Ok(Some(match desc.layout {
                Some(l) => t.with_layout(l),
                None => t,
            }))
        };
        let args = OpArgs::build(request.op, &request.attrs, &mut take)?;
        if let Some(extra) = request.tensors.keys().find(|k| !args.tensors().iter().any(|(n, _)| n == k)) {
            return Err(Error::invalid(format!("request tensor `{extra}` is not one {} takes", request.op)));
        }
        if let Some(extra) = inputs.keys().next() {
            return Err(Error::invalid(format!("input tensor `{extra}` is not named by the request")));
        }
        Ok(args)
    }
}

/// A view with the given strides holding the same logical values as `t` (the storage is
/// allocated as large as the strides reach; untouched slots are zero).
pub fn strided_copy(t: &HostTensor, strides: &[usize]) -> Result<HostTensor> {
    if strides.len() != t.rank() {
        return Err(Error::invalid(format!("{} strides for rank {}", strides.len(), t.rank())));
    }
    if t.numel() == 0 {
        return Ok(t.clone());
    }
    let span = t
        .shape()
        .iter()
        .zip(strides)
        .try_fold(1usize, |a, (&d, &s)| (d - 1).checked_mul(s).and_then(|x| a.checked_add(x)))
        .ok_or_else(|| Error::invalid(format!("strides {strides:?} overflow")))?;
    // Distinct logical elements must land on distinct slots, or the view would alias.
    let mut order: Vec<usize> = (0..t.rank()).filter(|&d| t.shape()[d] > 1).collect();
    order.sort_by_key(|&d| strides[d]);
    let mut reach = 1usize;
    for &d in &order {
        if strides[d] < reach {
            return Err(Error::invalid(format!("strides {strides:?} make elements of shape {:?} overlap", t.shape())));
        }
        reach = strides[d].saturating_mul(t.shape()[d]);
    }
    let logical = t.to_f32_vec();
    let mut flat = vec![0f32; span];
    let target = HostTensor::from_f32(&[span], vec![0.0; span])?.view(t.shape(), strides, 0)?;
    let mut k = 0;
    target.for_each_index(|i| {
        flat[i] = logical[k];
        k += 1;
    });
    let base = HostTensor::from_f32_as(t.dtype(), &[span], &flat)?;
    let v = base.view(t.shape(), strides, 0)?;
    Ok(match t.layout() {
        Some(l) => v.with_layout(l),
        None => v,
    })
}

/// Layout of a dense attention tensor (BSHD when untagged).
pub fn layout_of(t: &HostTensor) -> Layout {
    t.layout().unwrap_or(Layout::Bshd)
}
