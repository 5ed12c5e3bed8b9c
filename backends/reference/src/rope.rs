//! RoPE, the oracle: each pair `(x1, x2)` of the first `rotary_dim` dims of every head
//! rotates by its position's angle: `x1' = x1 cos - x2 sin`, `x2' = x2 cos + x1 sin`.
//! Pairs are `(i, i + rot/2)` (rotate-half) or `(2i, 2i + 1)` (interleaved).
//!
//! Angles come from `semantics::rope_frequencies` (its `seq_len` is the largest position
//! plus one; its attention factor multiplies cos and sin, as YaRN does), or from the
//! `cos`/`sin` tables as given (no scaling or attention factor applied to them).

use super::{Heads, from_f64_as, index_values, zeros_for};
use layerzero_core::exec::args::{Outputs, RopeArgs};
use layerzero_core::exec::check::{expect_float, expect_rank, invalid};
use layerzero_core::exec::executor::KernelError;
use layerzero_core::exec::semantics::rope_frequencies;
use layerzero_core::model::attrs::RopeStyle;
use layerzero_core::tensor::HostTensor;

/// Position of token `s` of batch `b`.
struct Positions {
    values: Vec<i64>,
    /// True when one row of positions serves every batch.
    shared: bool,
    seq: usize,
}

impl Positions {
    fn get(&self, b: usize, s: usize) -> i64 {
        if self.shared { self.values[s] } else { self.values[b * self.seq + s] }
    }
}

/// cos and sin of every pair for a position.
enum Angles {
    Frequencies {
        inv_freq: Vec<f64>,
        attention_factor: f64,
    },
    /// Row-major `[max_position, half]` tables.
    Tables {
        cos: Vec<f64>,
        sin: Vec<f64>,
        half: usize,
    },
}

impl Angles {
    /// `(cos, sin)` of pair `i` at `pos` (table positions are checked before use).
    fn at(&self, pos: i64, i: usize) -> (f64, f64) {
        match self {
            Angles::Frequencies { inv_freq, attention_factor } => {
                let theta = pos as f64 * inv_freq[i];
                (theta.cos() * attention_factor, theta.sin() * attention_factor)
            }
            Angles::Tables { cos, sin, half } => {
                let k = pos as usize * half + i;
                (cos[k], sin[k])
            }
        }
    }
}

/// One table of `[max_position, half]` values.
fn table(name: &str, t: &HostTensor, half: usize) -> Result<Vec<f64>, KernelError> {
    expect_float(name, t)?;
    expect_rank(name, t, 2, &format!("[max_position, rotary_dim / 2 = {half}]"))?;
    if t.shape()[1] != half {
        return Err(invalid(format!(
            "tensor `{name}` has shape {:?}; its last dim must be rotary_dim / 2 = {half}",
            t.shape()
        )));
    }
    Ok(t.to_f64_vec())
}

/// Rotates one tensor `[B, S, H, D]` (BSHD or BHSD, any strides) into a contiguous copy.
fn rotate(
    name: &str,
    t: &HostTensor,
    pos: &Positions,
    angles: &Angles,
    rot: usize,
    style: RopeStyle,
) -> Result<HostTensor, KernelError> {
    expect_float(name, t)?;
    let x = Heads::new(name, t)?;
    let half = rot / 2;
    let mut out = zeros_for(&x.out_shape(x.d))?;
    for b in 0..x.b {
        for s in 0..x.s {
            let p = pos.get(b, s);
            for h in 0..x.h {
                for d in rot..x.d {
                    out[x.out_index(b, s, h, d, x.d)] = x.at(b, s, h, d);
                }
                for i in 0..half {
                    let (i1, i2) = match style {
                        RopeStyle::RotateHalf => (i, i + half),
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    };
                    let (cos, sin) = angles.at(p, i);
                    let (x1, x2) = (x.at(b, s, h, i1), x.at(b, s, h, i2));
                    out[x.out_index(b, s, h, i1, x.d)] = x1 * cos - x2 * sin;
                    out[x.out_index(b, s, h, i2, x.d)] = x2 * cos + x1 * sin;
                }
            }
        }
    }
    let shape = x.out_shape(x.d);
    let result = from_f64_as(t.dtype(), &shape, &out)?;
    Ok(match t.layout() {
        Some(l) => result.with_layout(l),
        None => result,
    })
}

/// RoPE (see `RopeArgs`): `out` (rotated q) and, when k is given, `out_k`.
pub fn rope(args: &RopeArgs) -> Result<Outputs, KernelError> {
    let a = &args.attrs;
    let q = Heads::new("q", &args.q)?;
    let rot = match a.rotary_dim {
        None => q.d,
        Some(r) => usize::try_from(r).unwrap_or(usize::MAX),
    };
    if rot % 2 != 0 || rot > q.d {
        return Err(invalid(format!("rotary_dim is {rot}; it must be even and at most head_dim {}", q.d)));
    }
    let half = rot / 2;
    if let Some(k) = &args.k {
        let kh = Heads::new("k", k)?;
        if (kh.b, kh.s, kh.d) != (q.b, q.s, q.d) {
            return Err(invalid(format!(
                "k [batch, seq, head_dim] = [{}, {}, {}] != q's [{}, {}, {}]",
                kh.b, kh.s, kh.d, q.b, q.s, q.d
            )));
        }
    }

    let positions = match &args.positions {
        None => Positions { values: (0..q.s as i64).collect(), shared: true, seq: q.s },
        Some(p) => {
            let shared = match p.shape() {
                [s] if *s == q.s => true,
                [b, s] if *b == q.b && *s == q.s => false,
                other => {
                    return Err(invalid(format!(
                        "tensor `positions` has shape {other:?}; expected [{}] or [{}, {}]",
                        q.s, q.b, q.s
                    )));
                }
            };
            let values = index_values("positions", p)?;
            if let Some((n, &v)) = values.iter().enumerate().find(|(_, v)| **v < 0) {
                return Err(invalid(format!("positions (flat index {n}) = {v} is negative")));
            }
            Positions { values, shared, seq: q.s }
        }
    };
    let max_pos = positions.values.iter().copied().max().unwrap_or(-1);

    let angles = match (&args.cos, &args.sin) {
        (None, None) => {
            let seq_len = usize::try_from(max_pos + 1).unwrap_or(usize::MAX);
            let (inv_freq, attention_factor) = rope_frequencies(a, rot, seq_len);
            Angles::Frequencies { inv_freq, attention_factor }
        }
        (Some(c), Some(s)) => {
            if c.shape() != s.shape() {
                return Err(invalid(format!("tensor `cos` shape {:?} != `sin` shape {:?}", c.shape(), s.shape())));
            }
            let (cos, sin) = (table("cos", c, half)?, table("sin", s, half)?);
            let rows = c.shape()[0];
            if max_pos >= rows as i64 {
                return Err(invalid(format!(
                    "positions reach {max_pos} but the cos/sin tables have {rows} rows (positions 0..{rows})"
                )));
            }
            Angles::Tables { cos, sin, half }
        }
        _ => return Err(invalid("rope takes both `cos` and `sin` tables or neither; one is missing")),
    };

    let mut outputs = Outputs::new();
    outputs.insert("out", rotate("q", &args.q, &positions, &angles, rot, a.style)?);
    if let Some(k) = &args.k {
        outputs.insert("out_k", rotate("k", k, &positions, &angles, rot, a.style)?);
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::test_util::{close, tensor};
    use layerzero_core::model::attrs::{RopeAttrs, RopeScaling};
    use layerzero_core::model::dtype::DType;
    use layerzero_core::model::layout::Layout;
    use layerzero_core::tensor::Storage;

    fn args(q: HostTensor, attrs: RopeAttrs) -> RopeArgs {
        RopeArgs { q, k: None, positions: None, cos: None, sin: None, attrs }
    }

    fn positions(p: Vec<i64>, shape: &[usize]) -> TestResult<Option<HostTensor>> {
        Ok(Some(HostTensor::new(Storage::I64(p.into()), shape)?))
    }

    fn out(a: &RopeArgs) -> TestResult<Vec<f32>> {
        Ok(rope(a)?["out"].to_f32_vec())
    }

    #[test]
    fn position_zero_is_identity_and_one_is_a_hand_checked_rotation() -> TestResult {
        let q = tensor(&[2, 1, 3, 8], 1, Layout::Bshd)?;
        for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
            close(&out(&args(q.clone(), RopeAttrs { style, ..Default::default() }))?, &q.to_f32_vec(), 0.0);
        }
        // D = 2: the single pair has inv_freq 1, so position 1 rotates by 1 radian.
        let x = HostTensor::from_f32(&[1, 2, 1, 2], vec![1.0, 0.0, 1.0, 0.0])?;
        let got = out(&args(x, RopeAttrs::default()))?;
        close(&got, &[1.0, 0.0, 1f64.cos() as f32, 1f64.sin() as f32], 1e-7);
        Ok(())
    }

    #[test]
    fn rotate_half_and_interleaved_relate_by_a_permutation() -> TestResult {
        let d = 8;
        let q = tensor(&[1, 5, 2, d], 2, Layout::Bshd)?;
        // perm[j]: the interleaved slot holding rotate-half dim j (i -> 2i, i + d/2 -> 2i + 1).
        let perm: Vec<usize> = (0..d).map(|j| if j < d / 2 { 2 * j } else { 2 * (j - d / 2) + 1 }).collect();
        let permute = |t: &[f32]| -> Vec<f32> {
            t.chunks(d).flat_map(|row| perm.iter().map(|&p| row[p]).collect::<Vec<_>>()).collect()
        };
        let qv = q.to_f32_vec();
        let half_in = HostTensor::from_f32(&[1, 5, 2, d], permute(&qv))?;
        let by_half = out(&args(half_in, RopeAttrs::default()))?;
        let inter = RopeAttrs { style: RopeStyle::Interleaved, ..Default::default() };
        let by_inter = out(&args(q, inter))?;
        close(&by_half, &permute(&by_inter), 0.0);
        Ok(())
    }

    #[test]
    fn partial_rotary_leaves_the_tail_unchanged() -> TestResult {
        let q = tensor(&[1, 4, 2, 10], 3, Layout::Bshd)?;
        for style in [RopeStyle::RotateHalf, RopeStyle::Interleaved] {
            let partial = out(&args(q.clone(), RopeAttrs { style, rotary_dim: Some(4), ..Default::default() }))?;
            // The rotated head equals a 4-dim RoPE over the first 4 dims.
            let head = q.view(&[1, 4, 2, 4], &[80, 20, 10, 1], 0)?;
            let alone = out(&args(head, RopeAttrs { style, ..Default::default() }))?;
            let qv = q.to_f32_vec();
            for (r, row) in partial.chunks(10).enumerate() {
                close(&row[4..], &qv[r * 10 + 4..r * 10 + 10], 0.0);
                close(&row[..4], &alone[r * 4..r * 4 + 4], 0.0);
            }
        }
        for bad in [3, 12] {
            let a = args(q.clone(), RopeAttrs { rotary_dim: Some(bad), ..Default::default() });
            assert!(matches!(rope(&a), Err(KernelError::InvalidInput(m)) if m.contains(&bad.to_string())));
        }
        Ok(())
    }

    #[test]
    fn linear_scaling_by_two_at_2p_equals_unscaled_at_p() -> TestResult {
        let q = tensor(&[1, 3, 2, 8], 4, Layout::Bshd)?;
        let mut plain = args(q.clone(), RopeAttrs::default());
        plain.positions = positions(vec![1, 3, 5], &[3])?;
        let mut scaled =
            args(q, RopeAttrs { scaling: Some(RopeScaling::Linear { factor: 2.0 }), ..Default::default() });
        scaled.positions = positions(vec![2, 6, 10], &[3])?;
        close(&out(&scaled)?, &out(&plain)?, 1e-6);
        Ok(())
    }

    #[test]
    fn yarn_attention_factor_scales_the_magnitude() -> TestResult {
        let q = tensor(&[1, 4, 1, 16], 5, Layout::Bshd)?;
        let yarn = RopeScaling::Yarn { factor: 4.0, original_max_position: 2, beta_fast: 32.0, beta_slow: 1.0 };
        let got = out(&args(q.clone(), RopeAttrs { scaling: Some(yarn), ..Default::default() }))?;
        let m = 0.1 * 4f64.ln() + 1.0;
        let qv = q.to_f32_vec();
        // A rotation preserves each pair's norm; the attention factor multiplies it.
        for i in 0..4 * 8 {
            let (r, p) = (i / 8, i % 8);
            let norm = |v: &[f32]| ((v[r * 16 + p] as f64).powi(2) + (v[r * 16 + p + 8] as f64).powi(2)).sqrt();
            assert!((norm(&got) - m * norm(&qv)).abs() < 1e-5);
        }
        Ok(())
    }

    #[test]
    fn tables_match_frequencies_and_reject_positions_past_them() -> TestResult {
        let (s, d) = (4, 6);
        let q = tensor(&[2, s, 1, d], 6, Layout::Bshd)?;
        let attrs = RopeAttrs { base: Some(100.0), ..Default::default() };
        let (inv, _) = rope_frequencies(&attrs, d, 8);
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in 0..8 {
            for f in &inv {
                cos.push((p as f64 * f).cos() as f32);
                sin.push((p as f64 * f).sin() as f32);
            }
        }
        let mut a = args(q, attrs);
        a.positions = positions(vec![7, 0, 3, 2, 1, 5, 6, 4], &[2, s])?;
        let by_freq = out(&a)?;
        a.cos = Some(HostTensor::from_f32(&[8, 3], cos.clone())?);
        a.sin = Some(HostTensor::from_f32(&[8, 3], sin.clone())?);
        close(&out(&a)?, &by_freq, 1e-6);
        a.positions = positions(vec![8, 0, 3, 2, 1, 5, 6, 4], &[2, s])?;
        assert!(matches!(rope(&a), Err(KernelError::InvalidInput(m)) if m.contains('8')));
        a.positions = positions(vec![-1, 0, 3, 2, 1, 5, 6, 4], &[2, s])?;
        assert!(matches!(rope(&a), Err(KernelError::InvalidInput(_))));
        a.positions = positions(vec![0, 1, 2], &[3])?;
        assert!(matches!(rope(&a), Err(KernelError::InvalidInput(_))));
        a.positions = None;
        a.sin = None;
        assert!(matches!(rope(&a), Err(KernelError::InvalidInput(_))));
        Ok(())
    }

    #[test]
    fn bhsd_views_k_and_dtype_are_kept() -> TestResult {
        let q = tensor(&[2, 3, 4, 8], 7, Layout::Bshd)?;
        let k = tensor(&[2, 3, 2, 8], 8, Layout::Bshd)?;
        let attrs = RopeAttrs { style: RopeStyle::Interleaved, ..Default::default() };
        let mut a = RopeArgs { q: q.clone(), k: Some(k.clone()), positions: None, cos: None, sin: None, attrs };
        a.positions = positions(vec![3, 1, 4, 1, 5, 9], &[2, 3])?;
        let bshd = rope(&a)?;
        let to_bhsd =
            |t: &HostTensor| -> TestResult<_> { Ok(t.permute(&[0, 2, 1, 3])?.contiguous().with_layout(Layout::Bhsd)) };
        a.q = to_bhsd(&q)?;
        // k as a strided BSHD view over BHSD storage.
        a.k = Some(to_bhsd(&k)?.permute(&[0, 2, 1, 3])?.with_layout(Layout::Bshd));
        let mixed = rope(&a)?;
        assert_eq!(mixed["out"].layout(), Some(Layout::Bhsd));
        assert_eq!(mixed["out"].shape(), &[2, 4, 3, 8]);
        let back = mixed["out"].permute(&[0, 2, 1, 3])?.to_f32_vec();
        close(&back, &bshd["out"].to_f32_vec(), 0.0);
        close(&mixed["out_k"].to_f32_vec(), &bshd["out_k"].to_f32_vec(), 0.0);
        assert!(mixed["out_k"].is_contiguous());
        let half = HostTensor::from_f32_as(DType::F16, &[2, 3, 4, 8], &q.to_f32_vec())?;
        assert_eq!(rope(&args(half, RopeAttrs::default()))?["out"].dtype(), DType::F16);
        Ok(())
    }
}
