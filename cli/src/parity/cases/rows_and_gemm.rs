//! Cases of the row-wise, GEMM, quantization, sampling, MoE and patch-embedding ops, one
//! function per op family. The families draw from one generator in turn, so the order they
//! are called in, and the order of the draws inside each, fixes every input.

use layerzero::compare::Category;
use layerzero::exec::args::{
    DequantizeArgs, EmbeddingArgs, GegluArgs, GeluArgs, Int4Args, LinearArgs, MlpArgs, MoeExpertsArgs, MoeRouteArgs,
    NormArgs, OpArgs, PatchEmbedArgs, QuantizeArgs, SampleArgs, SiluArgs, SwigluArgs, W8a8Args,
};
use layerzero::model::attrs::{
    Activation, GegluAttrs, GeluApproximate, GeluAttrs, Int4Attrs, MlpAttrs, MoeRouteAttrs, NoAttrs, NormAttrs,
    PatchEmbedAttrs, QuantAttrs, QuantScheme, SampleAttrs, ScaleLayout, SwigluAttrs, W8a8Attrs,
};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::model::w4::{ActQuant, W4Format};
use layerzero::tensor::HostTensor;
use layerzero::tensor::rng::Rng;

use super::{Case, DTYPES, ints, tensor, unreachable_tensor};

/// Cases of the row-wise, GEMM, quantization, sampling, MoE and patch-embedding ops.
pub fn rows_and_gemm(seed: u64) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for dtype in DTYPES {
        out.extend(norms(&mut rng, dtype));
        out.extend(linears(&mut rng, dtype));
        out.extend(activations(&mut rng, dtype));
        out.extend(embeddings(&mut rng, dtype));
        out.extend(mlps(&mut rng, dtype));
        out.extend(moe(&mut rng, dtype));
        out.extend(sampling(&mut rng, dtype));
        out.extend(quantize(&mut rng, dtype));
    }
    // Dequantize and the quantized linears take already-quantized inputs (dtype-independent).
    out.extend(dequantize(&mut rng));
    out.push(linear_w8a8(&mut rng));
    out.extend(linear_int4(&mut rng));
    out.push(linear_w8a8_per_tensor(&mut rng));
    out.extend(quantized_decode(&mut rng));
    // Patch embedding has its own generator: the cases above keep their inputs.
    let mut patch_rng = Rng::new(seed ^ 0x5041_5443_4845_4d42);
    for dtype in DTYPES {
        out.extend(patch_embeds(&mut patch_rng, dtype));
    }
    // So have the 4-bit formats.
    out.extend(linear_w4(&mut Rng::new(seed ^ 0x5734_4e46_4d58_4e56)));
    out.extend(dequantize_w4(&mut Rng::new(seed ^ 0x4445_5134_4445_5134)));
    out
}

fn case(name: String, category: Category, args: OpArgs) -> Case {
    Case { name, category, args }
}

/// Uniform int8 values in -127..=127.
fn int8(rng: &mut Rng, shape: &[usize]) -> HostTensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| (rng.below(255) as f32) - 127.0).collect();
    HostTensor::from_f32_as(DType::I8, shape, &v).unwrap_or_else(unreachable_tensor)
}

/// RMS and layer norms with and without a residual or a bias, and one over a strided view.
fn norms(rng: &mut Rng, dtype: DType) -> Vec<Case> {
    let mut out = Vec::new();
    for (rows, h) in [(7usize, 4097usize), (1, 64), (33, 256)] {
        let x = tensor(rng, dtype, &[rows, h], 2.0);
        let w = tensor(rng, dtype, &[h], 1.0);
        let b = tensor(rng, dtype, &[h], 1.0);
        let r = tensor(rng, dtype, &[rows, h], 1.0);
        let norm = |bias: Option<HostTensor>, residual: Option<HostTensor>| NormArgs {
            x: x.clone(),
            weight: w.clone(),
            bias,
            residual,
            attrs: NormAttrs::default(),
        };
        out.extend([
            case(format!("rms_norm/{rows}x{h}/{dtype}"), Category::Norms, OpArgs::RmsNorm(norm(None, None))),
            case(
                format!("rms_norm/{rows}x{h}_residual/{dtype}"),
                Category::Norms,
                OpArgs::RmsNorm(norm(None, Some(r))),
            ),
            case(
                format!("layer_norm/{rows}x{h}_bias/{dtype}"),
                Category::Norms,
                OpArgs::LayerNorm(norm(Some(b), None)),
            ),
            case(format!("layer_norm/{rows}x{h}/{dtype}"), Category::Norms, OpArgs::LayerNorm(norm(None, None))),
        ]);
    }
    // A transposed (strided) view normalizes along its own last dim.
    if let Ok(xt) = tensor(rng, dtype, &[48, 9], 1.0).permute(&[1, 0]) {
        let args = NormArgs {
            x: xt,
            weight: tensor(rng, dtype, &[48], 1.0),
            bias: None,
            residual: None,
            attrs: NormAttrs { eps: Some(1e-5) },
        };
        out.push(case(format!("rms_norm/strided_view/{dtype}"), Category::Norms, OpArgs::RmsNorm(args)));
    }
    out
}

/// Linears with NT and NN weights, with and without a bias, from one row to a prefill's.
fn linears(rng: &mut Rng, dtype: DType) -> Vec<Case> {
    let mut out = Vec::new();
    // 5 rows against an NT weight: the small-batch register tiles (`gemm/small.rs`) at every
    // cap, each level's intrinsics.
    for (m, k, n, nn, bias) in [
        (1usize, 64usize, 7usize, false, true),
        (5, 130, 9, false, true),
        (17, 130, 64, true, false),
        (130, 64, 33, false, false),
    ] {
        let x = tensor(rng, dtype, &[m, k], 1.0);
        let weight = if nn {
            tensor(rng, dtype, &[k, n], 0.2).with_layout(Layout::Nn)
        } else {
            tensor(rng, dtype, &[n, k], 0.2).with_layout(Layout::Nt)
        };
        let bias = bias.then(|| tensor(rng, dtype, &[n], 1.0));
        let tag = if nn { "nn" } else { "nt" };
        out.push(case(
            format!("linear/{m}x{k}x{n}_{tag}/{dtype}"),
            Category::Gemm,
            OpArgs::Linear(LinearArgs { x, weight, bias, attrs: NoAttrs {} }),
        ));
    }
    out
}

/// GELU (erf and tanh), SiLU, and SwiGLU and GeGLU on one packed input and on a separate
/// gate and up.
fn activations(rng: &mut Rng, dtype: DType) -> Vec<Case> {
    let x = tensor(rng, dtype, &[9, 130], 2.0);
    let (g, u) = (tensor(rng, dtype, &[9, 65], 2.0), tensor(rng, dtype, &[9, 65], 2.0));
    let gelu = |attrs| OpArgs::Gelu(GeluArgs { x: x.clone(), attrs });
    vec![
        case(format!("gelu/erf/{dtype}"), Category::Gemm, gelu(GeluAttrs::default())),
        case(format!("gelu/tanh/{dtype}"), Category::Gemm, gelu(GeluAttrs { approximate: GeluApproximate::Tanh })),
        case(format!("silu/{dtype}"), Category::Gemm, OpArgs::Silu(SiluArgs { x: x.clone(), attrs: NoAttrs {} })),
        case(
            format!("swiglu/split/{dtype}"),
            Category::Gemm,
            OpArgs::Swiglu(SwigluArgs { x: Some(x.clone()), gate: None, up: None, attrs: SwigluAttrs { split: true } }),
        ),
        case(
            format!("swiglu/separate/{dtype}"),
            Category::Gemm,
            OpArgs::Swiglu(SwigluArgs {
                x: None,
                gate: Some(g.clone()),
                up: Some(u.clone()),
                attrs: SwigluAttrs { split: false },
            }),
        ),
        case(
            format!("geglu/split_tanh/{dtype}"),
            Category::Gemm,
            OpArgs::Geglu(GegluArgs {
                x: Some(x),
                gate: None,
                up: None,
                attrs: GegluAttrs { split: true, approximate: GeluApproximate::Tanh },
            }),
        ),
        case(
            format!("geglu/separate/{dtype}"),
            Category::Gemm,
            OpArgs::Geglu(GegluArgs { x: None, gate: Some(g), up: Some(u), attrs: GegluAttrs::default() }),
        ),
    ]
}

/// Embedding lookups with i32 and i64 ids.
fn embeddings(rng: &mut Rng, dtype: DType) -> Vec<Case> {
    let table = tensor(rng, dtype, &[50, 24], 1.0);
    [DType::I32, DType::I64]
        .into_iter()
        .map(|ids_dtype| {
            let v: Vec<i64> = (0..2 * 9).map(|_| rng.below(50) as i64).collect();
            let args = EmbeddingArgs { ids: ints(ids_dtype, &[2, 9], &v), table: table.clone(), attrs: NoAttrs {} };
            case(format!("embedding/ids_{ids_dtype}/{dtype}"), Category::Gemm, OpArgs::Embedding(args))
        })
        .collect()
}

/// Tokens, hidden size and intermediate size of the MLP and MoE cases.
const MLP_DIMS: (usize, usize, usize) = (17, 48, 80);

/// Gated MLPs, one per activation.
fn mlps(rng: &mut Rng, dtype: DType) -> Vec<Case> {
    let (t, h, i) = MLP_DIMS;
    [Activation::Silu, Activation::Gelu, Activation::GeluTanh]
        .into_iter()
        .map(|act| {
            // Magnitudes keep outputs near 1: an f32 sum of many larger terms cannot meet the
            // table's 1e-6 however it is ordered.
            let args = MlpArgs {
                x: tensor(rng, dtype, &[t, h], 0.5),
                w_gate: tensor(rng, dtype, &[i, h], 0.1),
                w_up: tensor(rng, dtype, &[i, h], 0.1),
                w_down: tensor(rng, dtype, &[h, i], 0.1),
                attrs: MlpAttrs { activation: act },
            };
            case(format!("mlp/{}/{dtype}", act.as_str()), Category::Gemm, OpArgs::Mlp(args))
        })
        .collect()
}

/// MoE experts over fixed routes, and routing with and without renormalization.
fn moe(rng: &mut Rng, dtype: DType) -> Vec<Case> {
    let (t, h, i) = MLP_DIMS;
    let (e, topk) = (4usize, 2usize);
    let ids: Vec<i64> = (0..t * topk).map(|j| ((j * 3 + j / topk) % e) as i64).collect();
    let experts = MoeExpertsArgs {
        x: tensor(rng, dtype, &[t, h], 0.5),
        experts: ints(DType::I32, &[t, topk], &ids),
        weights: tensor(rng, DType::F32, &[t, topk], 0.5),
        w_gate: tensor(rng, dtype, &[e, i, h], 0.1),
        w_up: tensor(rng, dtype, &[e, i, h], 0.1),
        w_down: tensor(rng, dtype, &[e, h, i], 0.1),
        attrs: MlpAttrs::default(),
    };
    let mut out =
        vec![case(format!("moe_experts/t{t}_e{e}_k{topk}/{dtype}"), Category::Gemm, OpArgs::MoeExperts(experts))];
    for renormalize in [false, true] {
        let args =
            MoeRouteArgs { logits: tensor(rng, dtype, &[t, 8], 2.0), attrs: MoeRouteAttrs { top_k: 2, renormalize } };
        out.push(case(format!("moe_route/renormalize_{renormalize}/{dtype}"), Category::Norms, OpArgs::MoeRoute(args)));
    }
    out
}

/// Greedy, temperature, top-k/top-p and min-p sampling of one set of logits: tokens must be
/// identical.
fn sampling(rng: &mut Rng, dtype: DType) -> Vec<Case> {
    let logits = tensor(rng, dtype, &[4, 1000], 3.0);
    let strategies = [
        ("greedy", SampleAttrs::default()),
        ("temperature", SampleAttrs { temperature: Some(0.8), seed: Some(7), ..Default::default() }),
        (
            "top_k_top_p",
            SampleAttrs {
                temperature: Some(1.0),
                top_k: Some(40),
                top_p: Some(0.9),
                seed: Some(11),
                ..Default::default()
            },
        ),
        ("min_p", SampleAttrs { temperature: Some(1.2), min_p: Some(0.05), seed: Some(3), ..Default::default() }),
    ];
    strategies
        .into_iter()
        .map(|(name, attrs)| {
            let args = SampleArgs { logits: logits.clone(), attrs };
            case(format!("sample/{name}/{dtype}"), Category::Norms, OpArgs::Sample(args))
        })
        .collect()
}

/// Quantization round trips: per tensor, per channel and per block, to int8 and fp8.
fn quantize(rng: &mut Rng, dtype: DType) -> Vec<Case> {
    let x = tensor(rng, dtype, &[130, 260], 3.0);
    let q = |scheme, block, scale_layout, target| QuantAttrs {
        scheme,
        block,
        scale_layout,
        target,
        out_dtype: None,
        format: None,
        scale_order: Default::default(),
    };
    let schemes = [
        ("per_tensor_i8", q(QuantScheme::PerTensor, None, None, Some(DType::I8))),
        ("per_channel_i8", q(QuantScheme::PerChannel, None, None, Some(DType::I8))),
        ("per_block_1x128_e4m3", q(QuantScheme::PerBlock, Some([1, 128]), None, Some(DType::Fp8E4M3))),
        (
            "per_block_128x128_col_i8",
            q(QuantScheme::PerBlock, Some([128, 128]), Some(ScaleLayout::ColumnMajor), Some(DType::I8)),
        ),
        ("cast_e5m2", q(QuantScheme::None, None, None, Some(DType::Fp8E5M2))),
    ];
    schemes
        .into_iter()
        .map(|(name, attrs)| {
            let args = QuantizeArgs { x: x.clone(), attrs };
            case(format!("quantize/{name}/{dtype}"), Category::Norms, OpArgs::Quantize(args))
        })
        .collect()
}

/// Dequantization of int8 values per channel, and per 128x128 block with a column-major
/// scale.
fn dequantize(rng: &mut Rng) -> Vec<Case> {
    let x8 = int8(rng, &[130, 260]);
    let scale_rows = tensor(rng, DType::F32, &[130], 0.01);
    let deq = |scale, scheme, block, scale_layout| {
        let attrs = QuantAttrs {
            scheme,
            block,
            scale_layout,
            target: None,
            out_dtype: Some(DType::F32),
            format: None,
            scale_order: Default::default(),
        };
        OpArgs::Dequantize(DequantizeArgs { x: x8.clone(), scale, global_scale: None, attrs })
    };
    // A column-major [2, 3] scale for 128x128 blocks of [130, 260].
    let col = HostTensor::from_f32(&[6], vec![0.01, 0.02, 0.03, 0.04, 0.05, 0.06])
        .and_then(|t| t.view(&[2, 3], &[1, 2], 0))
        .unwrap_or_else(unreachable_tensor);
    vec![
        case(
            "dequantize/per_channel_i8".to_owned(),
            Category::Norms,
            deq(scale_rows, QuantScheme::PerChannel, None, None),
        ),
        case(
            "dequantize/per_block_128x128_column_major".to_owned(),
            Category::Norms,
            deq(col, QuantScheme::PerBlock, Some([128, 128]), Some(ScaleLayout::ColumnMajor)),
        ),
    ]
}

/// (m, k, n) of the per-row W8A8 and the int4 linears.
const QUANT_LINEAR_DIMS: (usize, usize, usize) = (17, 256, 33);

/// An int8 linear with per-row and per-column scales and a bias.
fn linear_w8a8(rng: &mut Rng) -> Case {
    let (m, k, n) = QUANT_LINEAR_DIMS;
    let (x, weight) = (int8(rng, &[m, k]), int8(rng, &[n, k]));
    let args = W8a8Args {
        x,
        x_scale: tensor(rng, DType::F32, &[m], 0.01),
        weight,
        w_scale: tensor(rng, DType::F32, &[n], 0.01),
        bias: Some(tensor(rng, DType::F32, &[n], 1.0)),
        attrs: W8a8Attrs::default(),
    };
    case(format!("linear_w8a8/{m}x{k}x{n}"), Category::Gemm, OpArgs::LinearW8a8(args))
}

/// Int4 linears at group sizes 32, 64 and 128, with and without zero points.
fn linear_int4(rng: &mut Rng) -> Vec<Case> {
    let (m, k, n) = QUANT_LINEAR_DIMS;
    let mut out = Vec::new();
    for (group, zeros) in [(32usize, true), (64, false), (128, true)] {
        // Random bytes, as i8 (the nibbles are read unsigned from the byte's bits).
        let packed: Vec<f32> = (0..n * k / 2).map(|_| rng.below(256) as f32 - 128.0).collect();
        let args = Int4Args {
            x: tensor(rng, DType::F32, &[m, k], 0.05),
            weight: HostTensor::from_f32_as(DType::I8, &[n, k / 2], &packed).unwrap_or_else(unreachable_tensor),
            scales: tensor(rng, DType::F32, &[n, k / group], 0.05),
            zeros: zeros.then(|| {
                let z: Vec<f32> = (0..n * k / group).map(|_| rng.below(16) as f32).collect();
                HostTensor::from_f32(&[n, k / group], z).unwrap_or_else(unreachable_tensor)
            }),
            bias: None,
            global_scale: None,
            attrs: Int4Attrs::int4(group as u64),
        };
        out.push(case(format!("linear_int4/group{group}_zeros_{zeros}"), Category::Gemm, OpArgs::LinearInt4(args)));
    }
    // x rounded to int8 (Q4_0 x Q8_0): one decode row (the integer GEMV) and a batch (the f32
    // GEMM on the rounded x).
    for (rows, group) in [(1usize, 32usize), (m, 64)] {
        let packed: Vec<f32> = (0..n * k / 2).map(|_| rng.below(256) as f32 - 128.0).collect();
        let args = Int4Args {
            x: tensor(rng, DType::F32, &[rows, k], 0.05),
            weight: HostTensor::from_f32_as(DType::I8, &[n, k / 2], &packed).unwrap_or_else(unreachable_tensor),
            scales: tensor(rng, DType::F32, &[n, k / group], 0.05),
            zeros: None,
            bias: None,
            global_scale: None,
            attrs: Int4Attrs { activations: ActQuant::Int8, ..Int4Attrs::int4(group as u64) },
        };
        let name = format!("linear_int4/int8_activations_m{rows}_group{group}");
        out.push(case(name, Category::Gemm, OpArgs::LinearInt4(args)));
    }
    out
}

/// 4-bit linears of the other formats, each at its block size: nf4 (f32 absmax), mxfp4 (E8M0
/// bytes 2^-9 .. 2^-4), nvfp4 (e4m3 scales and a global scale).
fn linear_w4(rng: &mut Rng) -> Vec<Case> {
    let (m, k, n) = QUANT_LINEAR_DIMS;
    let mut out = Vec::new();
    for (format, group) in [(W4Format::Nf4, 64usize), (W4Format::Mxfp4, 32), (W4Format::Nvfp4, 16)] {
        let (weight, scales, global) = w4_weight(rng, format, n, k, group);
        let args = Int4Args {
            x: tensor(rng, DType::F32, &[m, k], 0.05),
            weight,
            scales,
            zeros: None,
            bias: None,
            global_scale: global,
            attrs: Int4Attrs::of(format, group as u64),
        };
        let name = format!("linear_int4/{}_group{group}", format.as_str());
        out.push(case(name, Category::Gemm, OpArgs::LinearInt4(args)));
    }
    out
}

/// A random packed `[n, k/2]` weight of `format` with its `[n, k / group]` block scales (mxfp4:
/// E8M0 bytes 2^-9 .. 2^-4; nvfp4: e4m3 scales) and nvfp4's global scale.
fn w4_weight(
    rng: &mut Rng,
    format: W4Format,
    n: usize,
    k: usize,
    group: usize,
) -> (HostTensor, HostTensor, Option<HostTensor>) {
    let packed: Vec<f32> = (0..n * k / 2).map(|_| rng.below(256) as f32 - 128.0).collect();
    let shape = [n, k / group];
    let scales = match format {
        W4Format::Mxfp4 => {
            let e: Vec<f32> = (0..n * k / group).map(|_| 118.0 + rng.below(6) as f32).collect();
            HostTensor::from_f32_as(DType::I8, &shape, &e).unwrap_or_else(unreachable_tensor)
        }
        W4Format::Nvfp4 => tensor(rng, DType::Fp8E4M3, &shape, 0.05),
        _ => tensor(rng, DType::F32, &shape, 0.05),
    };
    let global =
        (format == W4Format::Nvfp4).then(|| HostTensor::from_f32(&[1], vec![1.5]).unwrap_or_else(unreachable_tensor));
    let weight = HostTensor::from_f32_as(DType::I8, &[n, k / 2], &packed).unwrap_or_else(unreachable_tensor);
    (weight, scales, global)
}

/// Packed 4-bit weights of each format dequantized at its block size, to bf16 (nf4 f32 absmax
/// per 64, mxfp4 E8M0 per 32, nvfp4 e4m3 per 16 and a global scale).
fn dequantize_w4(rng: &mut Rng) -> Vec<Case> {
    let (n, k) = (33usize, 256usize);
    let mut out = Vec::new();
    for (format, group) in [(W4Format::Nf4, 64usize), (W4Format::Mxfp4, 32), (W4Format::Nvfp4, 16)] {
        let (x, scale, global_scale) = w4_weight(rng, format, n, k, group);
        let attrs = QuantAttrs {
            scheme: QuantScheme::PerBlock,
            block: Some([1, group as u64]),
            scale_layout: None,
            target: None,
            out_dtype: Some(DType::BF16),
            format: Some(format),
            scale_order: Default::default(),
        };
        let args = DequantizeArgs { x, scale, global_scale, attrs };
        let name = format!("dequantize/{}_block{group}_bf16", format.as_str());
        out.push(case(name, Category::Norms, OpArgs::Dequantize(args)));
    }
    out
}

/// An int8 linear with one scale for all of x and of the weight, no bias, a bf16 output.
fn linear_w8a8_per_tensor(rng: &mut Rng) -> Case {
    let (m, k, n) = (9usize, 64usize, 40usize);
    let args = W8a8Args {
        x: int8(rng, &[m, k]),
        x_scale: HostTensor::from_f32(&[1], vec![0.02]).unwrap_or_else(unreachable_tensor),
        weight: int8(rng, &[n, k]),
        w_scale: HostTensor::from_f32(&[1], vec![0.005]).unwrap_or_else(unreachable_tensor),
        bias: None,
        attrs: W8a8Attrs { out_dtype: Some(DType::BF16), group_size: None },
    };
    case(format!("linear_w8a8/{m}x{k}x{n}_per_tensor_bf16"), Category::Gemm, OpArgs::LinearW8a8(args))
}

/// The decode rows of `--weights int8|int4` (one row of x, blocks of 32, as Q8_0 and Q4_0):
/// the quantized GEMVs (`simd::dot_i8_block_rows`, `simd::dot_int4`) at every cap's parity run.
fn quantized_decode(rng: &mut Rng) -> Vec<Case> {
    let (k, n, g) = (256usize, 33usize, 32usize);
    let packed: Vec<f32> = (0..n * k / 2).map(|_| rng.below(256) as f32 - 128.0).collect();
    let int4 = Int4Args {
        x: tensor(rng, DType::F32, &[1, k], 0.05),
        weight: HostTensor::from_f32_as(DType::I8, &[n, k / 2], &packed).unwrap_or_else(unreachable_tensor),
        scales: tensor(rng, DType::F32, &[n, k / g], 0.05),
        zeros: None,
        bias: Some(tensor(rng, DType::F32, &[n], 1.0)),
        global_scale: None,
        attrs: Int4Attrs::int4(g as u64),
    };
    let blocks = |rng: &mut Rng, rows: usize| tensor(rng, DType::F32, &[rows, k / g], 0.01);
    let mut out =
        vec![case(format!("linear_int4/decode_1x{k}x{n}_group{g}"), Category::Gemm, OpArgs::LinearInt4(int4))];
    for m in [1usize, 3] {
        let w8 = W8a8Args {
            x: int8(rng, &[m, k]),
            x_scale: blocks(rng, m),
            weight: int8(rng, &[n, k]),
            w_scale: blocks(rng, n),
            bias: Some(tensor(rng, DType::F32, &[n], 1.0)),
            attrs: W8a8Attrs { out_dtype: None, group_size: Some(g as u64) },
        };
        out.push(case(format!("linear_w8a8/{m}x{k}x{n}_blocks{g}"), Category::Gemm, OpArgs::LinearW8a8(w8)));
    }
    out
}

/// Patch embeddings: channels-last, and NCHW (which the im2col kernel takes through a layout
/// copy), untagged meaning NCHW.
fn patch_embeds(rng: &mut Rng, dtype: DType) -> Vec<Case> {
    let mut out = Vec::new();
    for (b, c, h, w, p, d, layout, bias) in [
        (2usize, 3usize, 8usize, 12usize, 4usize, 16usize, Some(Layout::Nhwc), true),
        (2, 3, 8, 12, 4, 16, Some(Layout::Nchw), false),
        (1, 1, 8, 12, 1, 8, None, true),
        (1, 3, 32, 16, 16, 24, Some(Layout::Nchw), true),
    ] {
        let shape = if layout == Some(Layout::Nhwc) { [b, h, w, c] } else { [b, c, h, w] };
        let image = tensor(rng, dtype, &shape, 1.0);
        let args = PatchEmbedArgs {
            image: match layout {
                Some(l) => image.with_layout(l),
                None => image,
            },
            weight: tensor(rng, dtype, &[d, c, p, p], 0.5 / ((c * p * p) as f64).sqrt()),
            bias: bias.then(|| tensor(rng, dtype, &[d], 0.5)),
            attrs: PatchEmbedAttrs { patch: p as u64 },
        };
        let tag = layout.map_or("untagged", |l| l.as_str());
        out.push(case(
            format!("patch_embed/{tag}_{b}x{c}x{h}x{w}_p{p}_d{d}/{dtype}"),
            Category::Gemm,
            OpArgs::PatchEmbed(args),
        ));
    }
    out
}
