//! The parity case matrix: dtypes, GQA ratios, masks, windows, ALiBi, soft-capping, page
//! sizes, head dims 64/80/96/128/256 and sequence lengths 1, odd and not a multiple of any
//! tile. Inputs are seeded normal values, so every run sees the same cases.

use layerzero::compare::Category;
use layerzero::exec::args::{AttentionArgs, OpArgs, PagedAttentionArgs, RopeArgs};
use layerzero::model::attrs::{AttentionAttrs, CausalAlignment, RopeAttrs, RopeScaling, RopeStyle};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::model::op::Op;
use layerzero::tensor::HostTensor;
use layerzero::tensor::rng::Rng;

/// One parity case.
#[derive(Debug, Clone)]
pub struct Case {
    /// Stable name.
    pub name: String,
    /// Tolerance-table row.
    pub category: Category,
    /// The inputs.
    pub args: OpArgs,
}

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn tensor(rng: &mut Rng, dtype: DType, shape: &[usize], std: f64) -> HostTensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| (rng.normal() * std) as f32).collect();
    match HostTensor::from_f32_as(dtype, shape, &v) {
        Ok(t) => t,
        Err(e) => unreachable_tensor(e),
    }
}

fn ints(dtype: DType, shape: &[usize], v: &[i64]) -> HostTensor {
    let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    match HostTensor::from_f32_as(dtype, shape, &f) {
        Ok(t) => t,
        Err(e) => unreachable_tensor(e),
    }
}

// Shapes here are built from constants that always match their data.
fn unreachable_tensor(e: layerzero::Error) -> HostTensor {
    debug_assert!(false, "parity case tensor: {e}");
    HostTensor::zeros(DType::F32, &[0]).unwrap_or_else(|_| unreachable!("an empty tensor always builds"))
}

struct Dense {
    b: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    dv: usize,
    layout: Layout,
}

fn dense(rng: &mut Rng, dtype: DType, s: &Dense, attrs: AttentionAttrs) -> AttentionArgs {
    let shape = |seq: usize, h: usize, d: usize| match s.layout {
        Layout::Bhsd => vec![s.b, h, seq, d],
        _ => vec![s.b, seq, h, d],
    };
    AttentionArgs {
        q: tensor(rng, dtype, &shape(s.sq, s.hq, s.d), 1.0).with_layout(s.layout),
        k: tensor(rng, dtype, &shape(s.sk, s.hkv, s.d), 1.0).with_layout(s.layout),
        v: tensor(rng, dtype, &shape(s.sk, s.hkv, s.dv), 1.0).with_layout(s.layout),
        mask: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        attrs,
    }
}

fn d(b: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize) -> Dense {
    Dense { b, sq, sk, hq, hkv, d, dv: d, layout: Layout::Bshd }
}

fn causal() -> AttentionAttrs {
    AttentionAttrs { causal: true, ..AttentionAttrs::default() }
}

/// Dense attention cases.
pub fn attention(seed: u64) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for dtype in DTYPES {
        let mut add = |name: &str, a: AttentionArgs| {
            out.push(Case {
                name: format!("attention/{name}/{dtype}"),
                category: Category::Attention,
                args: OpArgs::Attention(a),
            });
        };
        add("mha_causal_s67_d64", dense(&mut rng, dtype, &d(2, 67, 67, 4, 4, 64), causal()));
        add("gqa4_s33_d128", dense(&mut rng, dtype, &d(1, 33, 33, 8, 2, 128), AttentionAttrs::default()));
        add("mqa_causal_s17_d80", dense(&mut rng, dtype, &d(2, 17, 17, 4, 1, 80), causal()));
        add(
            "cross_top_left_16x48_d96",
            dense(
                &mut rng,
                dtype,
                &d(1, 16, 48, 2, 2, 96),
                AttentionAttrs { causal: true, causal_alignment: CausalAlignment::TopLeft, ..Default::default() },
            ),
        );
        add("cross_bottom_right_16x48_d96", dense(&mut rng, dtype, &d(1, 16, 48, 2, 2, 96), causal()));
        add("causal_seq_q_gt_seq_k_20x7", dense(&mut rng, dtype, &d(1, 20, 7, 2, 2, 64), causal()));
        // A bool keep-mask [Sq, Sk] with one fully masked row (it must give zeros).
        let mut a = dense(&mut rng, dtype, &d(2, 31, 31, 2, 2, 64), AttentionAttrs::default());
        let keep: Vec<f32> =
            (0..31 * 31).map(|i| if i / 31 == 5 { 0.0 } else { f32::from(rng.uniform() > 0.2) }).collect();
        a.mask = HostTensor::from_f32_as(DType::Bool, &[31, 31], &keep).ok();
        add("bool_mask_2d_with_empty_row", a);
        let mut a = dense(&mut rng, dtype, &d(2, 20, 20, 2, 2, 64), AttentionAttrs::default());
        a.mask = Some(tensor(&mut rng, dtype, &[2, 1, 20, 20], 1.0));
        add("float_mask_b1qk", a);
        add(
            "window16_causal_s65",
            dense(
                &mut rng,
                dtype,
                &d(1, 65, 65, 2, 2, 64),
                AttentionAttrs { causal: true, window_left: Some(16), ..Default::default() },
            ),
        );
        add(
            "alibi_6_heads_causal_s37",
            dense(
                &mut rng,
                dtype,
                &d(1, 37, 37, 6, 6, 64),
                AttentionAttrs { causal: true, alibi: true, ..Default::default() },
            ),
        );
        add(
            "softcap_5",
            dense(
                &mut rng,
                dtype,
                &d(1, 29, 29, 2, 2, 64),
                AttentionAttrs { softcap: Some(5.0), scale: Some(1.0), ..Default::default() },
            ),
        );
        add(
            "custom_scale_0_3",
            dense(&mut rng, dtype, &d(1, 23, 23, 2, 2, 64), AttentionAttrs { scale: Some(0.3), ..Default::default() }),
        );
        add("decode_s1_vs_257_gqa4_d128", dense(&mut rng, dtype, &d(2, 1, 257, 8, 2, 128), causal()));
        add("seq_len_1", dense(&mut rng, dtype, &d(1, 1, 1, 2, 2, 64), causal()));
        add("seq_130_crosses_tiles_gqa2", dense(&mut rng, dtype, &d(1, 130, 130, 4, 2, 64), causal()));
        add("head_dim_256", dense(&mut rng, dtype, &d(1, 9, 9, 2, 2, 256), causal()));
        let mut bhsd = d(2, 19, 19, 4, 2, 96);
        bhsd.layout = Layout::Bhsd;
        add("bhsd_d96", dense(&mut rng, dtype, &bhsd, causal()));
        // A permuted view: BSHD storage seen as BHSD (stride(-1) == 1, other strides permuted).
        let mut a = dense(&mut rng, dtype, &d(1, 21, 21, 4, 4, 64), causal());
        for t in [&mut a.q, &mut a.k, &mut a.v] {
            if let Ok(p) = t.permute(&[0, 2, 1, 3]) {
                *t = p.with_layout(Layout::Bhsd);
            }
        }
        add("bhsd_permuted_view", a);
        // Ragged: three sequences packed in batch 1.
        let mut a = dense(&mut rng, dtype, &d(1, 30, 41, 4, 2, 64), causal());
        a.cu_seqlens_q = Some(ints(DType::I32, &[4], &[0, 5, 17, 30]));
        a.cu_seqlens_k = Some(ints(DType::I32, &[4], &[0, 9, 17, 41]));
        add("varlen_3_sequences", a);
    }
    out
}

/// Paged attention cases.
pub fn paged(seed: u64) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let configs: [(Layout, usize, DType, DType, DType, usize); 9] = [
        (Layout::Nhd, 16, DType::F16, DType::F16, DType::I32, 1),
        (Layout::Hnd, 16, DType::F16, DType::F16, DType::I64, 1),
        (Layout::Nhd, 1, DType::BF16, DType::BF16, DType::I32, 1),
        (Layout::Hnd, 256, DType::F32, DType::F32, DType::I32, 4),
        (Layout::Nhd, 16, DType::F16, DType::Fp8E4M3, DType::I32, 1),
        (Layout::Hnd, 16, DType::BF16, DType::Fp8E5M2, DType::I64, 1),
        (Layout::Nhd, 7, DType::F32, DType::BF16, DType::I32, 3),
        (Layout::Nhd, 16, DType::F32, DType::F32, DType::I32, 1),
        (Layout::Hnd, 32, DType::BF16, DType::BF16, DType::I64, 5),
    ];
    for (i, &(layout, page, qd, kvd, table, sq)) in configs.iter().enumerate() {
        let (b, hq, hkv, dh) = (3usize, 8usize, 2usize, if i % 2 == 0 { 64 } else { 128 });
        let lens = [sq.max(1) as i64 + 2, 37, 300];
        let max_pages = lens.iter().map(|&l| (l as usize).div_ceil(page)).max().unwrap_or(1);
        let used: usize = lens.iter().map(|&l| (l as usize).div_ceil(page)).sum();
        let num_pages = used + 3;
        // A shuffled page assignment, so logical order differs from physical.
        let mut ids: Vec<i64> = (0..num_pages as i64).collect();
        for j in (1..ids.len()).rev() {
            ids.swap(j, rng.below(j as u64 + 1) as usize);
        }
        let mut table_v = vec![0i64; b * max_pages];
        let mut next = 0;
        for (s, &l) in lens.iter().enumerate() {
            for p in 0..(l as usize).div_ceil(page) {
                table_v[s * max_pages + p] = ids[next];
                next += 1;
            }
        }
        let cache_shape = match layout {
            Layout::Hnd => vec![num_pages, hkv, page, dh],
            _ => vec![num_pages, page, hkv, dh],
        };
        let scale_std = if matches!(kvd, DType::Fp8E4M3 | DType::Fp8E5M2) { 8.0 } else { 1.0 };
        // Values are stored x8 in fp8 (to use its range); scales of 1/8 bring them back.
        let scale = |n: usize| HostTensor::from_f32(&[n], vec![0.125; n]).ok();
        let (k_scale, v_scale) = match kvd {
            DType::Fp8E4M3 => (scale(hkv), scale(1)),
            DType::Fp8E5M2 => (scale(1), None),
            _ => (None, None),
        };
        let attrs = AttentionAttrs {
            causal: true,
            softcap: (i == 7).then_some(20.0),
            window_left: (i == 6).then_some(24),
            alibi: i == 8,
            ..AttentionAttrs::default()
        };
        let args = PagedAttentionArgs {
            q: tensor(&mut rng, qd, &[b, sq, hq, dh], 1.0).with_layout(Layout::Bshd),
            k_cache: tensor(&mut rng, kvd, &cache_shape, scale_std).with_layout(layout),
            v_cache: tensor(&mut rng, kvd, &cache_shape, scale_std).with_layout(layout),
            block_table: ints(table, &[b, max_pages], &table_v),
            context_lens: ints(DType::I32, &[b], &lens),
            k_scale,
            v_scale,
            attrs,
        };
        out.push(Case {
            name: format!("paged_attention/{layout}_page{page}_q{qd}_kv{kvd}_table{table}_sq{sq}_d{dh}"),
            category: Category::Attention,
            args: OpArgs::PagedAttention(args),
        });
    }
    out
}

/// RoPE cases.
pub fn rope(seed: u64) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let yarn = RopeScaling::Yarn { factor: 4.0, original_max_position: 16, beta_fast: 32.0, beta_slow: 1.0 };
    let llama3 =
        RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 16 };
    for dtype in DTYPES {
        let variants: Vec<(&str, RopeAttrs, bool, Layout)> = vec![
            ("rotate_half", RopeAttrs::default(), false, Layout::Bshd),
            ("interleaved", RopeAttrs { style: RopeStyle::Interleaved, ..Default::default() }, false, Layout::Bshd),
            ("partial_32_bhsd", RopeAttrs { rotary_dim: Some(32), ..Default::default() }, false, Layout::Bhsd),
            ("positions_base_500k", RopeAttrs { base: Some(500000.0), ..Default::default() }, true, Layout::Bshd),
            (
                "linear_2",
                RopeAttrs { scaling: Some(RopeScaling::Linear { factor: 2.0 }), ..Default::default() },
                true,
                Layout::Bshd,
            ),
            (
                "dynamic_ntk",
                RopeAttrs {
                    scaling: Some(RopeScaling::DynamicNtk { factor: 2.0, original_max_position: 8 }),
                    ..Default::default()
                },
                true,
                Layout::Bshd,
            ),
            ("yarn", RopeAttrs { scaling: Some(yarn.clone()), ..Default::default() }, true, Layout::Bshd),
            ("llama3", RopeAttrs { scaling: Some(llama3.clone()), ..Default::default() }, true, Layout::Bshd),
        ];
        for (name, attrs, positions, layout) in variants {
            let (b, s, h, hk, dh) = (2usize, 17usize, 4usize, 2usize, 64usize);
            let shape = |h: usize| if layout == Layout::Bhsd { vec![b, h, s, dh] } else { vec![b, s, h, dh] };
            let pos = positions.then(|| {
                let v: Vec<i64> = (0..b * s).map(|_| rng.below(4096) as i64).collect();
                ints(DType::I64, &[b, s], &v)
            });
            let args = RopeArgs {
                q: tensor(&mut rng, dtype, &shape(h), 1.0).with_layout(layout),
                k: Some(tensor(&mut rng, dtype, &shape(hk), 1.0).with_layout(layout)),
                positions: pos,
                cos: None,
                sin: None,
                attrs,
            };
            out.push(Case { name: format!("rope/{name}/{dtype}"), category: Category::Rope, args: OpArgs::Rope(args) });
        }
        // Precomputed cos/sin tables indexed by positions.
        let (max_pos, rot) = (64usize, 64usize);
        let angles: Vec<(f32, f32)> = (0..max_pos * rot / 2)
            .map(|i| {
                let (p, j) = (i / (rot / 2), i % (rot / 2));
                let a = p as f64 / 10000f64.powf(2.0 * j as f64 / rot as f64);
                (a.cos() as f32, a.sin() as f32)
            })
            .collect();
        let cos: Vec<f32> = angles.iter().map(|a| a.0).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.1).collect();
        let pos: Vec<i64> = (0..17).map(|_| rng.below(max_pos as u64) as i64).collect();
        let args = RopeArgs {
            q: tensor(&mut rng, dtype, &[1, 17, 2, 64], 1.0).with_layout(Layout::Bshd),
            k: None,
            positions: Some(ints(DType::I32, &[17], &pos)),
            cos: HostTensor::from_f32(&[max_pos, rot / 2], cos).ok(),
            sin: HostTensor::from_f32(&[max_pos, rot / 2], sin).ok(),
            attrs: RopeAttrs::default(),
        };
        out.push(Case {
            name: format!("rope/cos_sin_table/{dtype}"),
            category: Category::Rope,
            args: OpArgs::Rope(args),
        });
    }
    out
}

/// Every case of `op` (or of every executable op).
pub fn matrix(op: Option<Op>, seed: u64) -> Vec<Case> {
    let mut v = Vec::new();
    if op.is_none_or(|o| o == Op::Attention) {
        v.extend(attention(seed));
    }
    if op.is_none_or(|o| o == Op::PagedAttention) {
        v.extend(paged(seed.wrapping_add(1)));
    }
    if op.is_none_or(|o| o == Op::Rope) {
        v.extend(rope(seed.wrapping_add(2)));
    }
    if op.is_none_or(|o| !matches!(o, Op::Attention | Op::PagedAttention | Op::Rope)) {
        v.extend(rows_and_gemm(seed.wrapping_add(3)).into_iter().filter(|c| op.is_none_or(|o| c.args.op() == o)));
    }
    v
}

/// Cases of the row-wise, GEMM, quantization, sampling, MoE and patch-embedding ops.
pub fn rows_and_gemm(seed: u64) -> Vec<Case> {
    use layerzero::exec::args::{
        DequantizeArgs, EmbeddingArgs, GegluArgs, GeluArgs, Int4Args, LinearArgs, MlpArgs, MoeExpertsArgs,
        MoeRouteArgs, NormArgs, PatchEmbedArgs, QuantizeArgs, SampleArgs, SiluArgs, SwigluArgs, W8a8Args,
    };
    use layerzero::model::attrs::{
        Activation, GegluAttrs, GeluApproximate, GeluAttrs, Int4Attrs, MlpAttrs, MoeRouteAttrs, NoAttrs, NormAttrs,
        PatchEmbedAttrs, QuantAttrs, QuantScheme, SampleAttrs, ScaleLayout, SwigluAttrs, W8a8Attrs,
    };
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let mut push = |name: String, category: Category, args: OpArgs| out.push(Case { name, category, args });
    for dtype in DTYPES {
        // Norms.
        for (rows, h) in [(7usize, 4097usize), (1, 64), (33, 256)] {
            let x = tensor(&mut rng, dtype, &[rows, h], 2.0);
            let w = tensor(&mut rng, dtype, &[h], 1.0);
            let b = tensor(&mut rng, dtype, &[h], 1.0);
            let r = tensor(&mut rng, dtype, &[rows, h], 1.0);
            let norm = |bias: Option<HostTensor>, residual: Option<HostTensor>| NormArgs {
                x: x.clone(),
                weight: w.clone(),
                bias,
                residual,
                attrs: NormAttrs::default(),
            };
            push(format!("rms_norm/{rows}x{h}/{dtype}"), Category::Norms, OpArgs::RmsNorm(norm(None, None)));
            push(
                format!("rms_norm/{rows}x{h}_residual/{dtype}"),
                Category::Norms,
                OpArgs::RmsNorm(norm(None, Some(r.clone()))),
            );
            push(
                format!("layer_norm/{rows}x{h}_bias/{dtype}"),
                Category::Norms,
                OpArgs::LayerNorm(norm(Some(b.clone()), None)),
            );
            push(format!("layer_norm/{rows}x{h}/{dtype}"), Category::Norms, OpArgs::LayerNorm(norm(None, None)));
        }
        // A transposed (strided) view normalizes along its own last dim.
        if let Ok(xt) = tensor(&mut rng, dtype, &[48, 9], 1.0).permute(&[1, 0]) {
            let args = NormArgs {
                x: xt,
                weight: tensor(&mut rng, dtype, &[48], 1.0),
                bias: None,
                residual: None,
                attrs: NormAttrs { eps: Some(1e-5) },
            };
            push(format!("rms_norm/strided_view/{dtype}"), Category::Norms, OpArgs::RmsNorm(args));
        }
        // Linear.
        for (m, k, n, nn, bias) in
            [(1usize, 64usize, 7usize, false, true), (17, 130, 64, true, false), (130, 64, 33, false, false)]
        {
            let x = tensor(&mut rng, dtype, &[m, k], 1.0);
            let weight = if nn {
                tensor(&mut rng, dtype, &[k, n], 0.2).with_layout(Layout::Nn)
            } else {
                tensor(&mut rng, dtype, &[n, k], 0.2).with_layout(Layout::Nt)
            };
            let bias = bias.then(|| tensor(&mut rng, dtype, &[n], 1.0));
            let tag = if nn { "nn" } else { "nt" };
            push(
                format!("linear/{m}x{k}x{n}_{tag}/{dtype}"),
                Category::Gemm,
                OpArgs::Linear(LinearArgs { x, weight, bias, attrs: NoAttrs {} }),
            );
        }
        // Activations.
        let x = tensor(&mut rng, dtype, &[9, 130], 2.0);
        push(
            format!("gelu/erf/{dtype}"),
            Category::Gemm,
            OpArgs::Gelu(GeluArgs { x: x.clone(), attrs: GeluAttrs::default() }),
        );
        push(
            format!("gelu/tanh/{dtype}"),
            Category::Gemm,
            OpArgs::Gelu(GeluArgs { x: x.clone(), attrs: GeluAttrs { approximate: GeluApproximate::Tanh } }),
        );
        push(format!("silu/{dtype}"), Category::Gemm, OpArgs::Silu(SiluArgs { x: x.clone(), attrs: NoAttrs {} }));
        let (g, u) = (tensor(&mut rng, dtype, &[9, 65], 2.0), tensor(&mut rng, dtype, &[9, 65], 2.0));
        push(
            format!("swiglu/split/{dtype}"),
            Category::Gemm,
            OpArgs::Swiglu(SwigluArgs { x: Some(x.clone()), gate: None, up: None, attrs: SwigluAttrs { split: true } }),
        );
        push(
            format!("swiglu/separate/{dtype}"),
            Category::Gemm,
            OpArgs::Swiglu(SwigluArgs {
                x: None,
                gate: Some(g.clone()),
                up: Some(u.clone()),
                attrs: SwigluAttrs { split: false },
            }),
        );
        push(
            format!("geglu/split_tanh/{dtype}"),
            Category::Gemm,
            OpArgs::Geglu(GegluArgs {
                x: Some(x),
                gate: None,
                up: None,
                attrs: GegluAttrs { split: true, approximate: GeluApproximate::Tanh },
            }),
        );
        push(
            format!("geglu/separate/{dtype}"),
            Category::Gemm,
            OpArgs::Geglu(GegluArgs { x: None, gate: Some(g), up: Some(u), attrs: GegluAttrs::default() }),
        );
        // Embedding.
        let table = tensor(&mut rng, dtype, &[50, 24], 1.0);
        for ids_dtype in [DType::I32, DType::I64] {
            let v: Vec<i64> = (0..2 * 9).map(|_| rng.below(50) as i64).collect();
            let args = EmbeddingArgs { ids: ints(ids_dtype, &[2, 9], &v), table: table.clone(), attrs: NoAttrs {} };
            push(format!("embedding/ids_{ids_dtype}/{dtype}"), Category::Gemm, OpArgs::Embedding(args));
        }
        // MLP and MoE.
        let (t, h, i) = (17usize, 48usize, 80usize);
        for act in [Activation::Silu, Activation::Gelu, Activation::GeluTanh] {
            // Magnitudes keep outputs near 1: an f32 sum of many larger terms cannot meet the
            // table's 1e-6 however it is ordered.
            let args = MlpArgs {
                x: tensor(&mut rng, dtype, &[t, h], 0.5),
                w_gate: tensor(&mut rng, dtype, &[i, h], 0.1),
                w_up: tensor(&mut rng, dtype, &[i, h], 0.1),
                w_down: tensor(&mut rng, dtype, &[h, i], 0.1),
                attrs: MlpAttrs { activation: act },
            };
            push(format!("mlp/{}/{dtype}", act.as_str()), Category::Gemm, OpArgs::Mlp(args));
        }
        let (e, topk) = (4usize, 2usize);
        let ids: Vec<i64> = (0..t * topk).map(|j| ((j * 3 + j / topk) % e) as i64).collect();
        let args = MoeExpertsArgs {
            x: tensor(&mut rng, dtype, &[t, h], 0.5),
            experts: ints(DType::I32, &[t, topk], &ids),
            weights: tensor(&mut rng, DType::F32, &[t, topk], 0.5),
            w_gate: tensor(&mut rng, dtype, &[e, i, h], 0.1),
            w_up: tensor(&mut rng, dtype, &[e, i, h], 0.1),
            w_down: tensor(&mut rng, dtype, &[e, h, i], 0.1),
            attrs: MlpAttrs::default(),
        };
        push(format!("moe_experts/t{t}_e{e}_k{topk}/{dtype}"), Category::Gemm, OpArgs::MoeExperts(args));
        for renormalize in [false, true] {
            let args = MoeRouteArgs {
                logits: tensor(&mut rng, dtype, &[t, 8], 2.0),
                attrs: MoeRouteAttrs { top_k: 2, renormalize },
            };
            push(format!("moe_route/renormalize_{renormalize}/{dtype}"), Category::Norms, OpArgs::MoeRoute(args));
        }
        // Sampling: tokens must be identical.
        let logits = tensor(&mut rng, dtype, &[4, 1000], 3.0);
        for (name, attrs) in [
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
        ] {
            push(
                format!("sample/{name}/{dtype}"),
                Category::Norms,
                OpArgs::Sample(SampleArgs { logits: logits.clone(), attrs }),
            );
        }
        // Quantization round trips.
        let x = tensor(&mut rng, dtype, &[130, 260], 3.0);
        let q =
            |scheme, block, scale_layout, target| QuantAttrs { scheme, block, scale_layout, target, out_dtype: None };
        for (name, attrs) in [
            ("per_tensor_i8", q(QuantScheme::PerTensor, None, None, Some(DType::I8))),
            ("per_channel_i8", q(QuantScheme::PerChannel, None, None, Some(DType::I8))),
            ("per_block_1x128_e4m3", q(QuantScheme::PerBlock, Some([1, 128]), None, Some(DType::Fp8E4M3))),
            (
                "per_block_128x128_col_i8",
                q(QuantScheme::PerBlock, Some([128, 128]), Some(ScaleLayout::ColumnMajor), Some(DType::I8)),
            ),
            ("cast_e5m2", q(QuantScheme::None, None, None, Some(DType::Fp8E5M2))),
        ] {
            push(
                format!("quantize/{name}/{dtype}"),
                Category::Norms,
                OpArgs::Quantize(QuantizeArgs { x: x.clone(), attrs: attrs.clone() }),
            );
        }
    }
    // Dequantize and the quantized linears take already-quantized inputs (dtype-independent).
    let q8: Vec<f32> = (0..130 * 260).map(|_| (rng.below(255) as f32) - 127.0).collect();
    let x8 = HostTensor::from_f32_as(DType::I8, &[130, 260], &q8).unwrap_or_else(unreachable_tensor);
    let scale_rows = tensor(&mut rng, DType::F32, &[130], 0.01);
    let deq = |x: HostTensor, scale: HostTensor, scheme, block, layout| DequantizeArgs {
        x,
        scale,
        attrs: QuantAttrs { scheme, block, scale_layout: layout, target: None, out_dtype: Some(DType::F32) },
    };
    push(
        "dequantize/per_channel_i8".to_owned(),
        Category::Norms,
        OpArgs::Dequantize(deq(x8.clone(), scale_rows, QuantScheme::PerChannel, None, None)),
    );
    // A column-major [2, 3] scale for 128x128 blocks of [130, 260].
    let col = HostTensor::from_f32(&[6], vec![0.01, 0.02, 0.03, 0.04, 0.05, 0.06])
        .and_then(|t| t.view(&[2, 3], &[1, 2], 0))
        .unwrap_or_else(unreachable_tensor);
    push(
        "dequantize/per_block_128x128_column_major".to_owned(),
        Category::Norms,
        OpArgs::Dequantize(deq(
            x8.clone(),
            col,
            QuantScheme::PerBlock,
            Some([128, 128]),
            Some(ScaleLayout::ColumnMajor),
        )),
    );
    let (m, k, n) = (17usize, 256usize, 33usize);
    let xi: Vec<f32> = (0..m * k).map(|_| (rng.below(255) as f32) - 127.0).collect();
    let wi: Vec<f32> = (0..n * k).map(|_| (rng.below(255) as f32) - 127.0).collect();
    let w8 = W8a8Args {
        x: HostTensor::from_f32_as(DType::I8, &[m, k], &xi).unwrap_or_else(unreachable_tensor),
        x_scale: tensor(&mut rng, DType::F32, &[m], 0.01),
        weight: HostTensor::from_f32_as(DType::I8, &[n, k], &wi).unwrap_or_else(unreachable_tensor),
        w_scale: tensor(&mut rng, DType::F32, &[n], 0.01),
        bias: Some(tensor(&mut rng, DType::F32, &[n], 1.0)),
        attrs: W8a8Attrs::default(),
    };
    push("linear_w8a8/17x256x33".to_owned(), Category::Gemm, OpArgs::LinearW8a8(w8));
    for (group, zeros) in [(32usize, true), (64, false), (128, true)] {
        // Random bytes, as i8 (the nibbles are read unsigned from the byte's bits).
        let packed: Vec<f32> = (0..n * k / 2).map(|_| rng.below(256) as f32 - 128.0).collect();
        let args = Int4Args {
            x: tensor(&mut rng, DType::F32, &[m, k], 0.05),
            weight: HostTensor::from_f32_as(DType::I8, &[n, k / 2], &packed).unwrap_or_else(unreachable_tensor),
            scales: tensor(&mut rng, DType::F32, &[n, k / group], 0.05),
            zeros: zeros.then(|| {
                let z: Vec<f32> = (0..n * k / group).map(|_| rng.below(16) as f32).collect();
                HostTensor::from_f32(&[n, k / group], z).unwrap_or_else(unreachable_tensor)
            }),
            bias: None,
            attrs: Int4Attrs { group_size: group as u64 },
        };
        push(format!("linear_int4/group{group}_zeros_{zeros}"), Category::Gemm, OpArgs::LinearInt4(args));
    }
    // One scale for all of x and of the weight, no bias, a bf16 output.
    let (m, k, n) = (9usize, 64usize, 40usize);
    let xi: Vec<f32> = (0..m * k).map(|_| (rng.below(255) as f32) - 127.0).collect();
    let wi: Vec<f32> = (0..n * k).map(|_| (rng.below(255) as f32) - 127.0).collect();
    let per_tensor = W8a8Args {
        x: HostTensor::from_f32_as(DType::I8, &[m, k], &xi).unwrap_or_else(unreachable_tensor),
        x_scale: HostTensor::from_f32(&[1], vec![0.02]).unwrap_or_else(unreachable_tensor),
        weight: HostTensor::from_f32_as(DType::I8, &[n, k], &wi).unwrap_or_else(unreachable_tensor),
        w_scale: HostTensor::from_f32(&[1], vec![0.005]).unwrap_or_else(unreachable_tensor),
        bias: None,
        attrs: W8a8Attrs { out_dtype: Some(DType::BF16) },
    };
    push("linear_w8a8/9x64x40_per_tensor_bf16".to_owned(), Category::Gemm, OpArgs::LinearW8a8(per_tensor));
    // Patch embedding (its own generator: the cases above keep their inputs):
    // channels-last, and NCHW (which the im2col kernel takes through a layout copy),
    // untagged meaning NCHW.
    let mut prng = Rng::new(seed ^ 0x5041_5443_4845_4d42);
    for dtype in DTYPES {
        for (b, c, h, w, p, d, layout, bias) in [
            (2usize, 3usize, 8usize, 12usize, 4usize, 16usize, Some(Layout::Nhwc), true),
            (2, 3, 8, 12, 4, 16, Some(Layout::Nchw), false),
            (1, 1, 8, 12, 1, 8, None, true),
            (1, 3, 32, 16, 16, 24, Some(Layout::Nchw), true),
        ] {
            let shape = if layout == Some(Layout::Nhwc) { [b, h, w, c] } else { [b, c, h, w] };
            let image = tensor(&mut prng, dtype, &shape, 1.0);
            let args = PatchEmbedArgs {
                image: match layout {
                    Some(l) => image.with_layout(l),
                    None => image,
                },
                weight: tensor(&mut prng, dtype, &[d, c, p, p], 0.5 / ((c * p * p) as f64).sqrt()),
                bias: bias.then(|| tensor(&mut prng, dtype, &[d], 0.5)),
                attrs: PatchEmbedAttrs { patch: p as u64 },
            };
            let tag = layout.map_or("untagged", |l| l.as_str());
            push(
                format!("patch_embed/{tag}_{b}x{c}x{h}x{w}_p{p}_d{d}/{dtype}"),
                Category::Gemm,
                OpArgs::PatchEmbed(args),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a, 64-bit: written out so the pinned value does not depend on std's hasher.
    struct Fnv(u64);

    impl Fnv {
        fn bytes(&mut self, b: &[u8]) {
            for &x in b {
                self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }

        fn text(&mut self, s: &str) {
            self.bytes(&(s.len() as u64).to_le_bytes());
            self.bytes(s.as_bytes());
        }

        fn usizes(&mut self, v: &[usize]) {
            self.bytes(&(v.len() as u64).to_le_bytes());
            for &x in v {
                self.bytes(&(x as u64).to_le_bytes());
            }
        }
    }

    /// Every case's name, category, op and attributes, and every tensor's role, dtype,
    /// layout, shape, strides, offset and values (by their bits, in logical order).
    fn fingerprint(cases: &[Case]) -> u64 {
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        for c in cases {
            h.text(&c.name);
            h.text(&format!("{:?} {} {:?}", c.category, c.args.op(), c.args.attrs()));
            for (role, t) in c.args.tensors() {
                h.text(&format!("{role} {} {:?}", t.dtype(), t.layout()));
                h.usizes(t.shape());
                h.usizes(t.strides());
                h.usizes(&[t.offset()]);
                for v in t.to_f64_vec() {
                    h.bytes(&v.to_bits().to_le_bytes());
                }
            }
        }
        h.0
    }

    // Inputs are drawn from one generator in sequence: reordering the draws, or any case,
    // changes this value. Change it only when the cases are meant to change.
    #[test]
    fn the_case_matrix_is_pinned() {
        let cases = matrix(None, 1);
        assert_eq!((cases.len(), fingerprint(&cases)), (232, 0x6e4b_6c3a_555b_9ee0));
    }
}
