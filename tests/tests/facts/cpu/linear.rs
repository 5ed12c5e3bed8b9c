//! Our CPU kernels' matrix rows: linear, quantize and dequantize, W8A8, int4, the MLPs, the
//! MoE experts and the patch embedding.

use layerzero::model::attrs::{Activation, Int4Attrs, MlpAttrs, QuantAttrs, QuantScheme, ScaleLayout};

use super::super::reference::linear::{w8a8_blocks, w8a8_blocks_column_major};
use layerzero::model::w4::{ActQuant, W4Format};

use super::*;

const LINEAR: &str = "backends/cpu/src/linear/mod.rs";
const GEMM: &str = "backends/cpu/src/gemm/mod.rs";
const VIEW: &str = "backends/cpu/src/gemm/view.rs";
const QUANT: &str = "backends/cpu/src/quant.rs";
const QUANT4: &str = "backends/cpu/src/quant4.rs";
/// The line of `quant4.rs` that decodes a 4-bit weight's rows.
const W4_ROWS: &str = "out.par_chunks_mut(k).enumerate().for_each(|(r, row)| w.row(r, row));";
const W8A8: &str = "backends/cpu/src/linear/w8a8.rs";
const WEIGHTS: &str = "backends/cpu/src/gemm/weights.rs";
const MLP: &str = "backends/cpu/src/mlp.rs";
const PATCH: &str = "backends/cpu/src/patch.rs";

pub(super) fn linear_facts() -> TestResult<Vec<Fact>> {
    let k = "cpu.linear.fast";
    let nn = Request::new(Op::Linear)
        .tensor("x", TensorDesc::new(DType::BF16, [64, 4096]))
        .tensor("weight", TensorDesc::new(DType::BF16, [4096, 11008]).with_layout(Layout::Nn));
    Ok(vec![
        // f32, f16 and bf16 pass; another float dtype is Unsupported.
        fact(k, "dtypes", here(LINEAR, "expect_dense_float(\"x\", &a.x)?;"), "spr", linear_of(DType::BF16))
            .rejects(linear_of(DType::Fp8E4M3), "DTYPE_UNSUPPORTED"),
        fact(
            k,
            "dtypes",
            here(LINEAR, "DType::F32 | DType::F16 | DType::BF16 => Ok(()),"),
            "spr",
            linear_of(DType::F16),
        ),
        fact(
            k,
            "dtypes",
            here(LINEAR, "DType::F32 | DType::F16 | DType::BF16 => Ok(()),"),
            "spr",
            linear_of(DType::F32),
        ),
        fact(k, "weight_layouts", here(GEMM, "None | Some(Layout::Nt) => false,"), "spr", linear_of(DType::BF16)),
        fact(k, "weight_layouts", here(GEMM, "Some(Layout::Nn) => true,"), "spr", nn),
        // x keeps its column stride; the weight is a strided matrix view.
        fact(
            k,
            "strides",
            here(VIEW, "let cs = st.last().copied().unwrap_or(1);"),
            "spr",
            strided(linear_of(DType::BF16), "x")?,
        ),
    ])
}

/// `op` (quantize or dequantize) of a `[256, 512]` x of `dtype` under `scheme`, with `block`
/// and `layout` for per-block scales and `target` for quantize; dequantize gets the scale the
/// scheme implies (`[2, 4]` for 128 x 128 blocks, in `layout`'s memory order).
fn quant_in(
    op: Op,
    dtype: DType,
    scheme: QuantScheme,
    block: Option<[u64; 2]>,
    layout: Option<ScaleLayout>,
    target: Option<DType>,
) -> Request {
    let attrs = QuantAttrs {
        scheme,
        block,
        scale_layout: layout,
        target,
        out_dtype: None,
        format: None,
        scale_order: Default::default(),
    };
    let req = Request::new(op).attrs(Attrs::Quant(attrs)).tensor("x", TensorDesc::new(dtype, [256, 512]));
    if op == Op::Quantize {
        return req;
    }
    let scale = match (scheme, block) {
        (QuantScheme::PerChannel, _) => TensorDesc::new(DType::F32, [256]),
        (QuantScheme::PerBlock, Some([r, c])) => {
            let (gr, gc) = (256u64.div_ceil(r), 512u64.div_ceil(c));
            let t = TensorDesc::new(DType::F32, [gr, gc]);
            if layout == Some(ScaleLayout::ColumnMajor) { t.with_strides([1, gr]) } else { t }
        }
        _ => TensorDesc::new(DType::F32, [1]),
    };
    req.tensor("scale", scale)
}

/// Quantize bf16 under `scheme` (per-tensor scales, i8 unless `target`).
fn quantize(scheme: QuantScheme, target: Option<DType>) -> Request {
    quant_in(Op::Quantize, DType::BF16, scheme, None, None, target)
}

/// Quantize bf16 per block of `block`, scales in `layout`.
fn quantize_blocks(block: [u64; 2], layout: Option<ScaleLayout>) -> Request {
    quant_in(Op::Quantize, DType::BF16, QuantScheme::PerBlock, Some(block), layout, None)
}

/// Dequantize an x of `dtype` under `scheme` (per-block: 128 x 128).
fn dequantize(dtype: DType, scheme: QuantScheme) -> Request {
    let block = (scheme == QuantScheme::PerBlock).then_some([128, 128]);
    quant_in(Op::Dequantize, dtype, scheme, block, None, None)
}

/// Dequantize i8 per block of `block`, scales in `layout`.
fn dequantize_blocks(block: [u64; 2], layout: Option<ScaleLayout>) -> Request {
    quant_in(Op::Dequantize, DType::I8, QuantScheme::PerBlock, Some(block), layout, None)
}

/// An i8 `[4, 64] x [32, 64]` W8A8 linear with per-row scales, the weight tagged `layout`.
fn w8a8_in(layout: Option<Layout>) -> Request {
    let w = TensorDesc::new(DType::I8, [32, 64]);
    Request::new(Op::LinearW8a8)
        .tensor("x", TensorDesc::new(DType::I8, [4, 64]))
        .tensor("x_scale", TensorDesc::new(DType::F32, [4]))
        .tensor("weight", layout.map_or(w.clone(), |l| w.with_layout(l)))
        .tensor("w_scale", TensorDesc::new(DType::F32, [32]))
}

/// An int4 linear of `[4, 256]` x of `dtype` against 32 packed rows in groups of `group`.
fn int4_in(dtype: DType, group: u64) -> Request {
    Request::new(Op::LinearInt4)
        .attrs(Attrs::Int4(Int4Attrs::int4(group)))
        .tensor("x", TensorDesc::new(dtype, [4, 256]))
        .tensor("weight", TensorDesc::new(DType::I8, [32, 128]))
        .tensor("scales", TensorDesc::new(DType::F32, [32, 256 / group]))
}

/// `r` with x rounded to int8 first (`attrs.activations`).
fn int8_activations(r: Request) -> Request {
    let Attrs::Int4(a) = &r.attrs else { return r };
    let a = Int4Attrs { activations: ActQuant::Int8, ..a.clone() };
    r.attrs(Attrs::Int4(a))
}

/// A bf16 `[4, 256]` x against 4-bit weights of `format` in groups of `group`, scales `scale`.
fn w4_in(format: W4Format, group: u64, scale: DType) -> Request {
    Request::new(Op::LinearInt4)
        .attrs(Attrs::Int4(Int4Attrs::of(format, group)))
        .tensor("x", TensorDesc::new(DType::BF16, [4, 256]))
        .tensor("weight", TensorDesc::new(DType::I8, [32, 128]))
        .tensor("scales", TensorDesc::new(scale, [32, 256 / group]))
}

/// A gated MLP (`op` mlp or moe_experts: 4 experts, top-2) of 16 tokens, hidden 64,
/// intermediate 128, in `dtype`, activation `act`, weights tagged `layout` when given.
fn mlp_in(op: Op, dtype: DType, act: Activation, layout: Option<Layout>) -> Request {
    let t = |s: &[u64]| {
        let t = TensorDesc::new(dtype, s.to_vec());
        layout.map_or(t.clone(), |l| t.with_layout(l))
    };
    let req =
        Request::new(op).attrs(Attrs::Mlp(MlpAttrs { activation: act })).tensor("x", TensorDesc::new(dtype, [16, 64]));
    match op {
        Op::MoeExperts => req
            .tensor("experts", TensorDesc::new(DType::I32, [16, 2]))
            .tensor("weights", TensorDesc::new(DType::F32, [16, 2]))
            .tensor("w_gate", t(&[4, 128, 64]))
            .tensor("w_up", t(&[4, 128, 64]))
            .tensor("w_down", t(&[4, 64, 128])),
        _ => req.tensor("w_gate", t(&[128, 64])).tensor("w_up", t(&[128, 64])).tensor("w_down", t(&[64, 128])),
    }
}

/// ViT-Base's patch embedding of one 224 x 224 RGB image of `dtype` (16 x 16 patches to 768),
/// the image in `layout` (`None`: untagged, which is NCHW).
fn patch_in(dtype: DType, layout: Option<Layout>) -> Request {
    let image = match layout {
        Some(Layout::Nhwc) => TensorDesc::new(dtype, [1, 224, 224, 3]).with_layout(Layout::Nhwc),
        _ => TensorDesc::new(dtype, [1, 3, 224, 224]),
    };
    Request::new(Op::PatchEmbed).tensor("image", image).tensor("weight", TensorDesc::new(dtype, [768, 3, 16, 16]))
}

pub(super) fn quant_facts() -> TestResult<Vec<Fact>> {
    let (q, dq) = ("cpu.quantize.fast", "cpu.dequantize.fast");
    let per_tensor = |dtype: DType| quant_in(Op::Quantize, dtype, QuantScheme::PerTensor, None, None, None);
    let blocks = "for (j, blk) in row.chunks(bc).enumerate() {";
    let scaled_rows = "let srow = &scales[(r / grid.br) * grid.gc..(r / grid.br + 1) * grid.gc];";
    let target_of_x = "Target::of(x.dtype(), \"tensor `x` dtype\")?;";
    Ok(vec![
        fact(
            q,
            "dtypes",
            here(QUANT, "if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {"),
            "spr",
            per_tensor(DType::BF16),
        ),
        fact(
            q,
            "dtypes",
            here(QUANT, "if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {"),
            "spr",
            per_tensor(DType::F16),
        ),
        fact(
            q,
            "dtypes",
            here(QUANT, "if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {"),
            "spr",
            per_tensor(DType::F32),
        ),
        fact(
            q,
            "quant_schemes",
            here(QUANT, "let scale = if grid.scheme == QuantScheme::None {"),
            "spr",
            quantize(QuantScheme::None, Some(DType::Fp8E4M3)),
        ),
        fact(q, "quant_schemes", here(QUANT, "if !grid.banded() {"), "spr", quantize(QuantScheme::PerTensor, None)),
        fact(
            q,
            "quant_schemes",
            here(QUANT, "let (br, bc, gc) = (grid.br, grid.bc, grid.gc);"),
            "spr",
            quantize(QuantScheme::PerChannel, None),
        ),
        fact(
            q,
            "quant_schemes",
            here(QUANT, "let (br, bc, gc) = (grid.br, grid.bc, grid.gc);"),
            "spr",
            quantize_blocks([128, 128], None),
        ),
        fact(
            q,
            "quant_targets",
            here(QUANT, "Target::I8 => {"),
            "spr",
            quantize(QuantScheme::PerTensor, Some(DType::I8)),
        ),
        fact(
            q,
            "quant_targets",
            here(QUANT, "Target::Fp8(f) => {"),
            "spr",
            quantize(QuantScheme::PerTensor, Some(DType::Fp8E4M3)),
        ),
        fact(
            q,
            "quant_targets",
            here(QUANT, "Target::Fp8(f) => {"),
            "spr",
            quantize(QuantScheme::PerChannel, Some(DType::Fp8E5M2)),
        ),
        fact(
            q,
            "scale_layouts",
            here(QUANT, "sc.finish(&grid.shape())?"),
            "spr",
            quantize_blocks([128, 128], Some(ScaleLayout::RowMajor)),
        ),
        fact(
            q,
            "scale_layouts",
            here(QUANT, "let column_major = grid.scheme == QuantScheme::PerBlock && a.attrs.scale_layout"),
            "spr",
            quantize_blocks([128, 128], Some(ScaleLayout::ColumnMajor)),
        ),
        fact(
            q,
            "strides",
            here(QUANT, "super::gemm::rows_view(x, holder)"),
            "spr",
            strided(per_tensor(DType::BF16), "x")?,
        ),
        // Any positive block is computed (bands of `br` rows, column blocks of `bc`); the
        // file declares DeepSeek-V3's two (activations 1 x 128, weights 128 x 128), the ones
        // the tests compare against the reference: a conservative list, not a limit of the code.
        fact(q, "quant_blocks", here(QUANT, blocks), "spr", quantize_blocks([128, 128], None))
            .rejects(quantize_blocks([64, 64], None), "ATTR_UNSUPPORTED"),
        fact(q, "quant_blocks", here(QUANT, blocks), "spr", quantize_blocks([1, 128], None)),
        fact(dq, "dtypes", here(QUANT, target_of_x), "spr", dequantize(DType::I8, QuantScheme::PerTensor)),
        fact(dq, "dtypes", here(QUANT, target_of_x), "spr", dequantize(DType::Fp8E4M3, QuantScheme::PerTensor)),
        fact(dq, "dtypes", here(QUANT, target_of_x), "spr", dequantize(DType::Fp8E5M2, QuantScheme::PerTensor)),
        fact(
            dq,
            "quant_targets",
            here(QUANT, "if let Storage::I8(v) = x.st"),
            "spr",
            dequantize(DType::I8, QuantScheme::PerChannel),
        ),
        fact(
            dq,
            "quant_targets",
            here(QUANT, "read_f32(x.st, x.at(r, 0), x.cs, out);"),
            "spr",
            dequantize(DType::Fp8E4M3, QuantScheme::PerChannel),
        ),
        fact(
            dq,
            "quant_targets",
            here(QUANT, "read_f32(x.st, x.at(r, 0), x.cs, out);"),
            "spr",
            dequantize(DType::Fp8E5M2, QuantScheme::PerBlock),
        ),
        fact(
            dq,
            "quant_schemes",
            here(QUANT, "QuantScheme::None | QuantScheme::PerTensor => row.iter_mut().for_each(|v| *v *= scales[0]),"),
            "spr",
            dequantize(DType::Fp8E4M3, QuantScheme::None),
        ),
        fact(
            dq,
            "quant_schemes",
            here(QUANT, "QuantScheme::None | QuantScheme::PerTensor => row.iter_mut().for_each(|v| *v *= scales[0]),"),
            "spr",
            dequantize(DType::I8, QuantScheme::PerTensor),
        ),
        fact(
            dq,
            "quant_schemes",
            here(QUANT, "QuantScheme::PerChannel => row.iter_mut().for_each(|v| *v *= scales[r]),"),
            "spr",
            dequantize(DType::I8, QuantScheme::PerChannel),
        ),
        fact(dq, "quant_schemes", here(QUANT, scaled_rows), "spr", dequantize(DType::I8, QuantScheme::PerBlock)),
        // The scale is read in logical order (after `check_scale` matched its memory order
        // against attrs.scale_layout), so either order is taken.
        fact(
            dq,
            "scale_layouts",
            here(QUANT, "let scales = a.scale.to_f32_vec();"),
            "spr",
            dequantize_blocks([128, 128], Some(ScaleLayout::RowMajor)),
        ),
        fact(
            dq,
            "scale_layouts",
            here(QUANT, "let scales = a.scale.to_f32_vec();"),
            "spr",
            dequantize_blocks([128, 128], Some(ScaleLayout::ColumnMajor)),
        ),
        fact(
            dq,
            "strides",
            here(QUANT, "read_f32(x.st, x.at(r, 0), x.cs, out);"),
            "spr",
            strided(dequantize(DType::I8, QuantScheme::PerTensor), "x")?,
        ),
        // As for quantize: any positive block; the two declared are a conservative list.
        fact(dq, "quant_blocks", here(QUANT, scaled_rows), "spr", dequantize_blocks([128, 128], None))
            .rejects(dequantize_blocks([64, 64], None), "ATTR_UNSUPPORTED"),
        fact(dq, "quant_blocks", here(QUANT, scaled_rows), "spr", dequantize_blocks([1, 128], None)),
        // A 4-bit dequantize runs linear_int4's row decoder (whole bytes per block: even
        // blocks, those declared); an undeclared block is refused.
        fact(dq, "weight_formats", here(QUANT4, W4_ROWS), "spr", w4_dequantize(W4Format::Nf4, 64, DType::F32))
            .rejects(w4_dequantize(W4Format::Nf4, 8, DType::F32), "ATTR_UNSUPPORTED"),
        fact(dq, "weight_formats", here(QUANT4, W4_ROWS), "spr", w4_dequantize(W4Format::Mxfp4, 32, DType::I8)),
        fact(dq, "weight_formats", here(QUANT4, W4_ROWS), "spr", w4_dequantize(W4Format::Nvfp4, 16, DType::Fp8E4M3)),
        fact(dq, "quant_blocks", here(QUANT4, W4_ROWS), "spr", w4_dequantize(W4Format::Int4, 128, DType::BF16)),
    ])
}

pub(super) fn gemm_facts() -> TestResult<Vec<Fact>> {
    let (w8, int4) = ("cpu.linear_w8a8.fast", "cpu.linear_int4.fast");
    let (fused, chain, moe) = ("cpu.mlp.fused", "cpu.mlp.chain", "cpu.moe_experts.grouped");
    let patch = "cpu.patch_embed.im2col";
    let mlp_dims = || here(MLP, "a.dims()?;");
    let silu = || here(MLP, "*g = *g / (1.0 + simd::exp_approx(-*g)) * u;");
    let gelu = || here(MLP, "let e = super::math::erfc_f32(x.abs() * std::f32::consts::FRAC_1_SQRT_2);");
    let gelu_tanh = || here(MLP, "let t = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);");
    let mlp = |op: Op, act: Activation| mlp_in(op, DType::BF16, act, None);
    // An NHWC view of NCHW memory ([1, 3, 224, 224] permuted): channels 50176 apart.
    let permuted = Request::new(Op::PatchEmbed)
        .tensor(
            "image",
            TensorDesc::new(DType::F32, [1, 224, 224, 3])
                .with_layout(Layout::Nhwc)
                .with_strides([150528, 224, 1, 50176]),
        )
        .tensor("weight", TensorDesc::new(DType::F32, [768, 3, 16, 16]));
    Ok(vec![
        fact(w8, "dtypes", here(W8A8, "linear_w8a8 expects i8"), "spr", w8a8_in(None)),
        // A strided i8 operand is copied into rows first.
        fact(
            w8,
            "strides",
            here(W8A8, "*holder = t.to_i64_vec().into_iter().map(|v| v as i8).collect();"),
            "spr",
            strided(w8a8_in(None), "x")?,
        ),
        fact(w8, "layouts", here(W8A8, "linear_w8a8 takes [N, K] (NT) weights"), "spr", w8a8_in(Some(Layout::Nt)))
            .rejects(w8a8_in(Some(Layout::Nn)), "LAYOUT_UNSUPPORTED"),
        fact(w8, "group_sizes", here(W8A8, "simd::dot_i8_block_rows("), "spr", w8a8_blocks(32))
            .rejects(w8a8_blocks(8), "ATTR_UNSUPPORTED"),
        // A strided (column-major) block scale is copied into row order.
        fact(w8, "scale_layouts", here(W8A8, "*holder = t.to_f32_vec();"), "spr", w8a8_blocks_column_major(32)),
        fact(int4, "dtypes", here(LINEAR, "by_dtype!(a.x.dtype(), INT4, T => {"), "spr", int4_in(DType::BF16, 128)),
        fact(int4, "dtypes", here(LINEAR, "by_dtype!(a.x.dtype(), INT4, T => {"), "spr", int4_in(DType::F16, 64)),
        fact(int4, "dtypes", here(LINEAR, "by_dtype!(a.x.dtype(), INT4, T => {"), "spr", int4_in(DType::F32, 32)),
        fact(
            int4,
            "strides",
            here(VIEW, "let cs = st.last().copied().unwrap_or(1);"),
            "spr",
            strided(int4_in(DType::BF16, 128), "x")?,
        ),
        // A group is dequantized from whole bytes (`b0 = gi * g / 2`): any even group size that
        // divides K computes; the list declares the three the tests and GPTQ/AWQ checkpoints
        // use (conservative; an odd group would start mid-byte and is never declared).
        fact(int4, "group_sizes", here(WEIGHTS, "let b0 = gi * self.g / 2;"), "spr", int4_in(DType::BF16, 128))
            .rejects(int4_in(DType::BF16, 8), "ATTR_UNSUPPORTED"),
        // 16 is nvfp4's block.
        fact(int4, "group_sizes", here(WEIGHTS, "let b0 = gi * self.g / 2;"), "spr", int4_in(DType::BF16, 16)),
        fact(
            int4,
            "weight_formats",
            here(WEIGHTS, "let (even, odd) = if self.format.high_nibble_first() { (4, 0) } else { (0, 4) };"),
            "spr",
            w4_in(W4Format::Nf4, 64, DType::F32),
        ),
        fact(
            int4,
            "weight_formats",
            here(WEIGHTS, "W4Format::Mxfp4 => sc.iter_mut().for_each(|s| *s = e8m0_f32(*s as i8 as u8)),"),
            "spr",
            w4_in(W4Format::Mxfp4, 32, DType::I8),
        ),
        fact(
            int4,
            "weight_formats",
            here(WEIGHTS, "W4Format::Nvfp4 => sc.iter_mut().for_each(|s| *s *= self.global),"),
            "spr",
            w4_in(W4Format::Nvfp4, 16, DType::Fp8E4M3),
        ),
        fact(int4, "group_sizes", here(WEIGHTS, "let b0 = gi * self.g / 2;"), "spr", int4_in(DType::BF16, 64)),
        fact(int4, "group_sizes", here(WEIGHTS, "let b0 = gi * self.g / 2;"), "spr", int4_in(DType::BF16, 32)),
        fact(
            int4,
            "int4_activations",
            here(LINEAR, "|v| round_rows_int8(&x, g, v),"),
            "spr",
            int8_activations(int4_in(DType::F32, 32)),
        ),
        // f32, f16 and bf16 pass the shared MLP check; fp8 is Unsupported there.
        fact(fused, "dtypes", mlp_dims(), "spr", mlp(Op::Mlp, Activation::Silu))
            .rejects(mlp_in(Op::Mlp, DType::Fp8E4M3, Activation::Silu, None), "DTYPE_UNSUPPORTED"),
        fact(
            fused,
            "dtypes",
            here(MLP, "by_dtype!(a.x.dtype(), FUSED, T => {"),
            "spr",
            mlp_in(Op::Mlp, DType::F32, Activation::Silu, None),
        ),
        fact(fused, "activations", silu(), "spr", mlp(Op::Mlp, Activation::Silu)),
        fact(fused, "activations", gelu(), "spr", mlp(Op::Mlp, Activation::Gelu)),
        fact(fused, "activations", gelu_tanh(), "spr", mlp(Op::Mlp, Activation::GeluTanh)),
        fact(
            fused,
            "strides",
            here(MLP, "let x = rows_view(&a.x, holder)?;"),
            "spr",
            strided(mlp(Op::Mlp, Activation::Silu), "x")?,
        ),
        fact(fused, "layouts", mlp_dims(), "spr", mlp_in(Op::Mlp, DType::BF16, Activation::Silu, Some(Layout::Nt)))
            .rejects(mlp_in(Op::Mlp, DType::BF16, Activation::Silu, Some(Layout::Nn)), "LAYOUT_UNSUPPORTED"),
        fact(chain, "dtypes", mlp_dims(), "spr", mlp(Op::Mlp, Activation::Gelu))
            .rejects(mlp_in(Op::Mlp, DType::Fp8E5M2, Activation::Gelu, None), "DTYPE_UNSUPPORTED"),
        fact(chain, "dtypes", mlp_dims(), "spr", mlp_in(Op::Mlp, DType::F16, Activation::Gelu, None)),
        fact(chain, "activations", silu(), "spr", mlp(Op::Mlp, Activation::Silu)),
        fact(chain, "activations", gelu(), "spr", mlp(Op::Mlp, Activation::Gelu)),
        fact(chain, "activations", gelu_tanh(), "spr", mlp(Op::Mlp, Activation::GeluTanh)),
        fact(
            chain,
            "strides",
            here(MLP, "wu: Mat::of(&a.w_up),"),
            "spr",
            strided(mlp(Op::Mlp, Activation::Silu), "w_up")?,
        ),
        fact(chain, "layouts", mlp_dims(), "spr", mlp_in(Op::Mlp, DType::BF16, Activation::Gelu, Some(Layout::Nt)))
            .rejects(mlp_in(Op::Mlp, DType::BF16, Activation::Gelu, Some(Layout::Nn)), "LAYOUT_UNSUPPORTED"),
        // The shared MoE check takes float x and weights; a non-float x is refused. An fp8 x
        // would be read too, but is not declared (untested): declined.
        fact(moe, "dtypes", here(MOE, "let d = a.dims()?;"), "spr", mlp(Op::MoeExperts, Activation::Silu))
            .rejects(mlp_in(Op::MoeExperts, DType::I8, Activation::Silu, None), "DTYPE_UNSUPPORTED"),
        fact(
            moe,
            "dtypes",
            here(MOE, "HostTensor::from_f32_as(a.x.dtype(), &out_shape, &out).map_err(failed)"),
            "spr",
            mlp_in(Op::MoeExperts, DType::F32, Activation::Silu, None),
        ),
        fact(
            moe,
            "activations",
            here(MOE, "Activation::Silu => x / (1.0 + (-x).exp()),"),
            "spr",
            mlp(Op::MoeExperts, Activation::Silu),
        ),
        fact(
            moe,
            "activations",
            here(MOE, "Activation::Gelu => 0.5 * x"),
            "spr",
            mlp(Op::MoeExperts, Activation::Gelu),
        ),
        fact(
            moe,
            "activations",
            here(MOE, "0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())"),
            "spr",
            mlp(Op::MoeExperts, Activation::GeluTanh),
        ),
        fact(
            moe,
            "strides",
            here(MOE, "let x = f32_cow(&a.x);"),
            "spr",
            strided(mlp(Op::MoeExperts, Activation::Silu), "x")?,
        ),
        fact(
            patch,
            "dtypes",
            here(PATCH, "by_dtype!(a.image.dtype(), PATCH_EMBED, T => {"),
            "spr",
            patch_in(DType::F32, Some(Layout::Nhwc)),
        ),
        fact(
            patch,
            "dtypes",
            here(PATCH, "by_dtype!(a.image.dtype(), PATCH_EMBED, T => {"),
            "spr",
            patch_in(DType::BF16, Some(Layout::Nhwc)),
        ),
        // An NCHW image is refused (selection plans its copy to NHWC where adaptation is allowed).
        fact(patch, "layouts", here(PATCH, "if !g.nhwc {"), "spr", patch_in(DType::F32, Some(Layout::Nhwc)))
            .rejects(patch_in(DType::F32, None), "LAYOUT_UNSUPPORTED"),
        // A patch row that is not packed is gathered pixel by pixel through the strides.
        fact(patch, "strides", here(PATCH, "read_f32(st, base + v * sw, sc, px);"), "spr", permuted),
    ])
}
