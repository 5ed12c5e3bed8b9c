//! The reference kernels' matrix rows: linear, quantize and dequantize, W8A8, int4, the MLPs,
//! the MoE experts and the patch embedding.

use layerzero::model::attrs::{
    Activation, Int4Attrs, MlpAttrs, PatchEmbedAttrs, QuantAttrs, QuantScheme, ScaleLayout, W8a8Attrs,
};
use layerzero::model::w4::{ActQuant, W4Format};

use super::*;

const LINEAR: &str = "backends/reference/src/linear.rs";
const QUANT: &str = "backends/reference/src/quant.rs";
const MLP: &str = "backends/reference/src/mlp.rs";
const PATCH: &str = "backends/reference/src/patch.rs";
const CHECK: &str = "core/src/exec/check/mod.rs";
const CHECK_LINEAR: &str = "core/src/exec/check/linear.rs";
const CHECK_MLP: &str = "core/src/exec/check/mlp.rs";
const CHECK_MOE: &str = "core/src/exec/check/moe.rs";
const CHECK_PATCH: &str = "core/src/exec/check/patch.rs";

fn quant_attrs(scheme: QuantScheme, block: Option<[u64; 2]>, layout: Option<ScaleLayout>) -> QuantAttrs {
    QuantAttrs {
        scheme,
        block,
        scale_layout: layout,
        target: None,
        out_dtype: None,
        format: None,
        scale_order: Default::default(),
    }
}

/// Quantizes a bf16 `[256, 512]` x to `target` under `a`.
fn quantize(a: QuantAttrs, target: Option<DType>) -> Request {
    Request::new(Op::Quantize)
        .attrs(Attrs::Quant(QuantAttrs { target, ..a }))
        .tensor("x", TensorDesc::new(DType::BF16, [256, 512]))
}

/// Dequantizes a `[256, 512]` x of `dtype` with `scale` under `a`.
fn dequantize(a: QuantAttrs, dtype: DType, scale: TensorDesc) -> Request {
    Request::new(Op::Dequantize)
        .attrs(Attrs::Quant(a))
        .tensor("x", TensorDesc::new(dtype, [256, 512]))
        .tensor("scale", scale)
}

fn f32_of(shape: &[u64]) -> TensorDesc {
    TensorDesc::new(DType::F32, shape.to_vec())
}

/// An i8 `[4, 64] x [32, 64]` linear with per-row scales; `weight` as given.
fn w8a8(weight: TensorDesc) -> Request {
    Request::new(Op::LinearW8a8)
        .tensor("x", TensorDesc::new(DType::I8, [4, 64]))
        .tensor("x_scale", f32_of(&[4]))
        .tensor("weight", weight)
        .tensor("w_scale", f32_of(&[32]))
}

/// The same linear with scales per block of `g` features (`[4, 64/g]`, `[32, 64/g]`).
pub(in crate::facts) fn w8a8_blocks(g: u64) -> Request {
    Request::new(Op::LinearW8a8)
        .attrs(Attrs::W8a8(W8a8Attrs { out_dtype: None, group_size: Some(g) }))
        .tensor("x", TensorDesc::new(DType::I8, [4, 64]))
        .tensor("x_scale", f32_of(&[4, 64 / g]))
        .tensor("weight", TensorDesc::new(DType::I8, [32, 64]))
        .tensor("w_scale", f32_of(&[32, 64 / g]))
}

/// [`w8a8_blocks`] with both block scales stored column-major (`x_scale [4, 64/g]` with
/// strides `[1, 4]`, `w_scale` likewise).
pub(in crate::facts) fn w8a8_blocks_column_major(g: u64) -> Request {
    let mut req = w8a8_blocks(g);
    for (name, rows) in [("x_scale", 4u64), ("w_scale", 32)] {
        if let Some(t) = req.tensors.get_mut(name) {
            t.strides = Some(vec![1, rows]);
        }
    }
    req
}

/// A bf16 `[4, 256]` x against int4 weights `[32, 256]` packed in i8 `[32, 128]`, groups of 64.
fn int4() -> Request {
    Request::new(Op::LinearInt4)
        .attrs(Attrs::Int4(Int4Attrs::int4(64)))
        .tensor("x", TensorDesc::new(DType::BF16, [4, 256]))
        .tensor("weight", TensorDesc::new(DType::I8, [32, 128]))
        .tensor("scales", f32_of(&[32, 4]))
}

/// A bf16 `[4, 256]` x against 4-bit weights of `format` in groups of `group`, scales `scale`.
fn w4(format: W4Format, group: u64, scale: DType) -> Request {
    Request::new(Op::LinearInt4)
        .attrs(Attrs::Int4(Int4Attrs::of(format, group)))
        .tensor("x", TensorDesc::new(DType::BF16, [4, 256]))
        .tensor("weight", TensorDesc::new(DType::I8, [32, 128]))
        .tensor("scales", TensorDesc::new(scale, [32, 256 / group]))
}

/// A bf16 gated MLP (`mlp`: [16, 64] x, intermediate 128) or its expert form (`moe_experts`:
/// 4 experts, top 2) with `act`.
fn mlp(op: Op, act: Activation) -> Request {
    let t = |s: &[u64]| TensorDesc::new(DType::BF16, s.to_vec());
    let r = Request::new(op).attrs(Attrs::Mlp(MlpAttrs { activation: act })).tensor("x", t(&[16, 64]));
    match op {
        Op::MoeExperts => r
            .tensor("experts", TensorDesc::new(DType::I32, [16, 2]))
            .tensor("weights", f32_of(&[16, 2]))
            .tensor("w_gate", t(&[4, 128, 64]))
            .tensor("w_up", t(&[4, 128, 64]))
            .tensor("w_down", t(&[4, 64, 128])),
        _ => r.tensor("w_gate", t(&[128, 64])).tensor("w_up", t(&[128, 64])).tensor("w_down", t(&[64, 128])),
    }
}

/// ViT-Base's patch embedding of one bf16 224x224 RGB image: `image` as given.
fn patch_embed(image: TensorDesc) -> Request {
    Request::new(Op::PatchEmbed)
        .attrs(Attrs::PatchEmbed(PatchEmbedAttrs { patch: 16 }))
        .tensor("image", image)
        .tensor("weight", TensorDesc::new(DType::BF16, [768, 3, 16, 16]))
}

fn nchw() -> TensorDesc {
    TensorDesc::new(DType::BF16, [1, 3, 224, 224])
}

pub(super) fn matrix_ops() -> TestResult<Vec<Fact>> {
    let fp8 = DType::Fp8E4M3;
    let block = Some([128, 128]);
    let w8 = || TensorDesc::new(DType::I8, [32, 64]);
    let mlp_weights = ["x", "w_gate", "w_up", "w_down"];
    Ok(vec![
        // linear
        fact(
            "cpu_reference.linear.naive",
            "dtypes",
            here(CHECK, "DType::F32 | DType::F16 | DType::BF16 => Ok(()),"),
            "spr",
            linear_of(DType::BF16),
        )
        .rejects(linear_of(fp8), "DTYPE_UNSUPPORTED"),
        fact("cpu_reference.linear.naive", "weight_layouts", here(LINEAR, "WeightLayout::Nt => matmul_f64("), "spr", {
            linear_of(DType::BF16)
        }),
        fact("cpu_reference.linear.naive", "weight_layouts", here(LINEAR, "WeightLayout::Nn => matmul_f64("), "spr", {
            linear_of(DType::BF16).tensor("weight", TensorDesc::new(DType::BF16, [4096, 4096]).with_layout(Layout::Nn))
        }),
        fact("cpu_reference.linear.naive", "strides", here(LINEAR, "let w = a.weight.to_f64_vec();"), "spr", {
            strided(linear_of(DType::BF16), "weight")?
        }),
        // quantize
        fact(
            "cpu_reference.quantize.naive",
            "dtypes",
            here(QUANT, "if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {"),
            "spr",
            quantize(quant_attrs(QuantScheme::PerTensor, None, None), None),
        ),
        fact(
            "cpu_reference.quantize.naive",
            "quant_schemes",
            here(QUANT, "let none = grid.scheme == QuantScheme::None;"),
            "spr",
            quantize(quant_attrs(QuantScheme::None, None, None), Some(DType::Fp8E4M3)),
        ),
        fact(
            "cpu_reference.quantize.naive",
            "quant_schemes",
            here(QUANT, "let scales: Vec<f32> = amax.iter()"),
            "spr",
            quantize(quant_attrs(QuantScheme::PerChannel, None, None), None),
        ),
        fact(
            "cpu_reference.quantize.naive",
            "quant_schemes",
            here(QUANT, "let scale = if grid.scheme == QuantScheme::PerBlock"),
            "spr",
            quantize(quant_attrs(QuantScheme::PerBlock, block, None), None),
        ),
        fact("cpu_reference.quantize.naive", "quant_targets", here(QUANT, "Target::I8 => Storage::I8("), "spr", {
            quantize(quant_attrs(QuantScheme::PerTensor, None, None), Some(DType::I8))
        }),
        fact(
            "cpu_reference.quantize.naive",
            "quant_targets",
            here(QUANT, "Target::Fp8(Fp8::E5M2) => Storage::Fp8E5M2("),
            "spr",
            quantize(quant_attrs(QuantScheme::PerTensor, None, None), Some(DType::Fp8E5M2)),
        ),
        fact(
            "cpu_reference.quantize.naive",
            "scale_layouts",
            here(QUANT, "let column_major = a.attrs.scale_layout == Some(ScaleLayout::ColumnMajor);"),
            "spr",
            quantize(quant_attrs(QuantScheme::PerBlock, block, Some(ScaleLayout::ColumnMajor)), None),
        ),
        fact("cpu_reference.quantize.naive", "strides", here(QUANT, "let vals = x.to_f32_vec();"), "spr", {
            strided(quantize(quant_attrs(QuantScheme::PerTensor, None, None), None), "x")?
        }),
        // dequantize
        fact(
            "cpu_reference.dequantize.naive",
            "dtypes",
            here(QUANT, "Target::of(x.dtype(), \"tensor `x` dtype\")?;"),
            "spr",
            dequantize(quant_attrs(QuantScheme::PerTensor, None, None), DType::I8, f32_of(&[1])),
        ),
        fact("cpu_reference.dequantize.naive", "quant_schemes", here(QUANT, "v * scales[grid.group(i)]"), "spr", {
            dequantize(quant_attrs(QuantScheme::PerChannel, None, None), DType::I8, f32_of(&[256]))
        }),
        fact(
            "cpu_reference.dequantize.naive",
            "quant_targets",
            here(QUANT, "Target::of(x.dtype(), \"tensor `x` dtype\")?;"),
            "spr",
            dequantize(quant_attrs(QuantScheme::PerTensor, None, None), DType::Fp8E5M2, f32_of(&[1])),
        ),
        fact(
            "cpu_reference.dequantize.naive",
            "scale_layouts",
            here(QUANT, "check_scale(&a.attrs, x, &a.scale, &grid)?;"),
            "spr",
            {
                let column_major = f32_of(&[2, 4]).with_strides([1, 2]);
                dequantize(
                    quant_attrs(QuantScheme::PerBlock, block, Some(ScaleLayout::ColumnMajor)),
                    DType::I8,
                    column_major,
                )
            },
        ),
        fact("cpu_reference.dequantize.naive", "strides", here(QUANT, "let vals = x.to_f64_vec();"), "spr", {
            strided(dequantize(quant_attrs(QuantScheme::PerTensor, None, None), DType::I8, f32_of(&[1])), "x")?
        }),
        // A 4-bit dequantize decodes with linear_int4's decoder, each format at its block.
        fact(
            "cpu_reference.dequantize.naive",
            "weight_formats",
            here(QUANT, "from_f64_as(out_dtype, &[n, k], &decode_w4(&a.w4_scales(format, g as u64), &a.x, n, k, g))"),
            "spr",
            w4_dequantize(W4Format::Nf4, 64, DType::F32),
        ),
        fact(
            "cpu_reference.dequantize.naive",
            "weight_formats",
            here(QUANT, "from_f64_as(out_dtype, &[n, k], &decode_w4(&a.w4_scales(format, g as u64), &a.x, n, k, g))"),
            "spr",
            w4_dequantize(W4Format::Mxfp4, 32, DType::I8),
        ),
        fact(
            "cpu_reference.dequantize.naive",
            "weight_formats",
            here(QUANT, "from_f64_as(out_dtype, &[n, k], &decode_w4(&a.w4_scales(format, g as u64), &a.x, n, k, g))"),
            "spr",
            w4_dequantize(W4Format::Nvfp4, 16, DType::Fp8E4M3),
        ),
        // linear_w8a8
        fact(
            "cpu_reference.linear_w8a8.naive",
            "dtypes",
            here(CHECK_LINEAR, "if t.dtype() != DType::I8 {"),
            "spr",
            w8a8(w8()),
        ),
        fact("cpu_reference.linear_w8a8.naive", "strides", here(LINEAR, "let x = a.x.to_i64_vec();"), "spr", {
            strided(w8a8(w8()), "x")?
        }),
        // The kernel refuses a weight tagged other than NT (a limit the file did not declare:
        // added).
        fact(
            "cpu_reference.linear_w8a8.naive",
            "layouts",
            here(CHECK_LINEAR, "if matches!(a.weight.layout(), Some(l) if l != Layout::Nt) {"),
            "spr",
            w8a8(w8().with_layout(Layout::Nt)),
        )
        .rejects(w8a8(w8().with_layout(Layout::Nn)), "LAYOUT_UNSUPPORTED"),
        fact(
            "cpu_reference.linear_w8a8.naive",
            "group_sizes",
            here(LINEAR, "Some(_) => xs[i * blocks + b] * ws[j * blocks + b],"),
            "spr",
            w8a8_blocks(32),
        )
        .rejects(w8a8_blocks(8), "ATTR_UNSUPPORTED"),
        fact(
            "cpu_reference.linear_w8a8.naive",
            "scale_layouts",
            here(LINEAR, "let xs = a.x_scale.to_f64_vec();"),
            "spr",
            w8a8_blocks_column_major(32),
        ),
        // linear_int4
        fact(
            "cpu_reference.linear_int4.naive",
            "dtypes",
            here(CHECK, "DType::F32 | DType::F16 | DType::BF16 => Ok(()),"),
            "spr",
            int4(),
        ),
        fact(
            "cpu_reference.linear_int4.naive",
            "strides",
            here(LINEAR, "let packed = packed.to_i64_vec();"),
            "spr",
            strided(int4(), "weight")?,
        ),
        fact(
            "cpu_reference.linear_int4.naive",
            "int4_activations",
            here(LINEAR, "ActQuant::Int8 => round_to_int8(&a.x.to_f32_vec(), g)"),
            "spr",
            Request { attrs: Attrs::Int4(Int4Attrs { activations: ActQuant::Int8, ..Int4Attrs::int4(64) }), ..int4() },
        ),
        fact(
            "cpu_reference.linear_int4.naive",
            "weight_formats",
            here(LINEAR, "other => f64::from(other.code(q)),"),
            "spr",
            w4(W4Format::Nf4, 64, DType::F32),
        ),
        fact(
            "cpu_reference.linear_int4.naive",
            "weight_formats",
            here(LINEAR, "W4Format::Mxfp4 => scales.to_i64_vec().into_iter().map(|e| e8m0(e as i8 as u8)).collect(),"),
            "spr",
            w4(W4Format::Mxfp4, 32, DType::I8),
        ),
        fact(
            "cpu_reference.linear_int4.naive",
            "weight_formats",
            here(LINEAR, "let global = global.map_or(1.0, |g| g.to_f64_vec()[0]);"),
            "spr",
            w4(W4Format::Nvfp4, 16, DType::Fp8E4M3),
        ),
        // mlp
        fact(
            "cpu_reference.mlp.naive",
            "dtypes",
            here(CHECK_MLP, "expect_dense_float(\"x\", &a.x)?;"),
            "spr",
            mlp(Op::Mlp, Activation::Silu),
        )
        .rejects(retyped(mlp(Op::Mlp, Activation::Silu), &mlp_weights, fp8)?, "DTYPE_UNSUPPORTED"),
        fact(
            "cpu_reference.mlp.naive",
            "activations",
            here(ACTIVATION, "Activation::Silu => silu_f64(x),"),
            "spr",
            mlp(Op::Mlp, Activation::Silu),
        ),
        fact(
            "cpu_reference.mlp.naive",
            "activations",
            here(ACTIVATION, "Activation::Gelu => gelu_erf(x),"),
            "spr",
            mlp(Op::Mlp, Activation::Gelu),
        ),
        fact(
            "cpu_reference.mlp.naive",
            "activations",
            here(ACTIVATION, "Activation::GeluTanh => gelu_tanh(x),"),
            "spr",
            mlp(Op::Mlp, Activation::GeluTanh),
        ),
        fact("cpu_reference.mlp.naive", "strides", here(MLP, "let x = a.x.to_f64_vec();"), "spr", {
            strided(mlp(Op::Mlp, Activation::Silu), "x")?
        }),
        // The kernel refuses weights tagged other than NT (a limit the file did not declare:
        // added).
        fact(
            "cpu_reference.mlp.naive",
            "layouts",
            here(CHECK_MLP, "if matches!(t.layout(), Some(l) if l != Layout::Nt) {"),
            "spr",
            {
                let req = mlp(Op::Mlp, Activation::Silu);
                req.tensor("w_up", TensorDesc::new(DType::BF16, [128, 64]).with_layout(Layout::Nt))
            },
        )
        .rejects(
            mlp(Op::Mlp, Activation::Silu)
                .tensor("w_up", TensorDesc::new(DType::BF16, [128, 64]).with_layout(Layout::Nn)),
            "LAYOUT_UNSUPPORTED",
        ),
        // moe_experts
        fact(
            "cpu_reference.moe_experts.naive",
            "dtypes",
            here(CHECK_MOE, "expect_float(\"x\", &a.x)?;"),
            "spr",
            mlp(Op::MoeExperts, Activation::Silu),
        )
        .rejects(retyped(mlp(Op::MoeExperts, Activation::Silu), &mlp_weights, fp8)?, "DTYPE_UNSUPPORTED"),
        fact(
            "cpu_reference.moe_experts.naive",
            "activations",
            here(ACTIVATION, "Activation::Silu => silu_f64(x),"),
            "spr",
            mlp(Op::MoeExperts, Activation::Silu),
        ),
        fact(
            "cpu_reference.moe_experts.naive",
            "activations",
            here(ACTIVATION, "Activation::Gelu => gelu_erf(x),"),
            "spr",
            mlp(Op::MoeExperts, Activation::Gelu),
        ),
        fact(
            "cpu_reference.moe_experts.naive",
            "activations",
            here(ACTIVATION, "Activation::GeluTanh => gelu_tanh(x),"),
            "spr",
            mlp(Op::MoeExperts, Activation::GeluTanh),
        ),
        fact("cpu_reference.moe_experts.naive", "strides", here(MOE, "let x = a.x.to_f64_vec();"), "spr", {
            strided(mlp(Op::MoeExperts, Activation::Silu), "x")?
        }),
        // patch_embed
        fact(
            "cpu_reference.patch_embed.naive",
            "dtypes",
            here(CHECK_PATCH, "expect_dense_float(\"image\", &a.image)?;"),
            "spr",
            patch_embed(nchw()),
        ),
        fact(
            "cpu_reference.patch_embed.naive",
            "layouts",
            here(CHECK_PATCH, "None | Some(Layout::Nchw) => false,"),
            "spr",
            patch_embed(nchw().with_layout(Layout::Nchw)),
        ),
        fact("cpu_reference.patch_embed.naive", "layouts", here(CHECK_PATCH, "Some(Layout::Nhwc) => true,"), "spr", {
            patch_embed(TensorDesc::new(DType::BF16, [1, 224, 224, 3]).with_layout(Layout::Nhwc))
        }),
        fact("cpu_reference.patch_embed.naive", "strides", here(PATCH, "let img = a.image.to_f64_vec();"), "spr", {
            strided(patch_embed(nchw()), "image")?
        }),
    ])
}
