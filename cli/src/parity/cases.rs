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

mod rows_and_gemm;
pub use rows_and_gemm::rows_and_gemm;

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
        add("decode_s1_vs_203_mha_d64", dense(&mut rng, dtype, &d(1, 1, 203, 4, 4, 64), causal()));
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
    // changes this value. Change it only when the cases are meant to change (or their attrs'
    // Debug text does, as when linear_int4 gained `format` and `scale_order` and attention
    // `rope` and `mask_block`; dequantize's attrs gained them too, with three 4-bit cases; a
    // 5-row linear joined for the small-batch tiles; linear_int4 gained `activations` and two cases; an MHA decode joined).
    #[test]
    fn the_case_matrix_is_pinned() {
        let cases = matrix(None, 1);
        assert_eq!((cases.len(), fingerprint(&cases)), (249, 0x9945_7d74_71c6_a7b9));
    }
}
