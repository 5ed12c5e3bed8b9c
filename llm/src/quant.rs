//! Projections quantized at load (`lz generate --weights int8|int4`): a decoder's q/k/v/o
//! and MLP weights become the operands of `linear_w8a8` or `linear_int4`, which selection
//! picks a kernel for like any other op; embeddings, norms and lm_head stay in the compute
//! dtype.
//!
//! - `int8`: llama.cpp's Q8_0 layout: blocks of `group` input features (32 is Q8_0's), one
//!   f32 scale each (`amax / 127`, values rounded half to even and clamped to ±127: the
//!   `quantize` op's per-block arithmetic; Q8_0 rounds half away from zero and stores the
//!   scale as f16); at run time each input row is quantized in the same blocks by a
//!   `quantize` dispatch, and `linear_w8a8` sums each block's exact integer dot times its
//!   pair of scales, as Q8_0 x Q8_0 does.
//! - `int4`: llama.cpp's Q4_0 arithmetic in blocks of `group` input features (32 is Q4_0's):
//!   the block's value of largest magnitude `m` gives `d = m / -8`, codes
//!   `q = min(15, floor(x / d + 8.5))`, `w = (q - 8) * d` with `d` rounded to f16 (held in
//!   f32, so the decode GEMV reads it in place); two codes
//!   per byte, the even element in the low nibble (LayerZero's `int4` format). The
//!   activations are rounded to int8 in the same blocks inside `linear_int4`
//!   (`attrs.activations = int8`, as Q4_0 takes Q8_0 activations; the decode GEMV then dots
//!   codes in integers), or stay in the compute dtype with `ActQuant::F32` (slower, closer
//!   to the f32 model).

use std::fmt;

use half::f16;

use layerzero::error::{Error, Result};
use layerzero::model::w4::ActQuant;
use layerzero::tensor::{HostTensor, Storage};

/// How projections are stored once loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightQuant {
    /// i8 weights and activations, one f32 scale per `group` input features (Q8_0's layout).
    Int8 {
        /// Input features per scale (32 is Q8_0's block).
        group: usize,
    },
    /// 4-bit codes, one f16 scale per `group` input features (Q4_0's arithmetic).
    Int4 {
        /// Input features per scale (even; 32 is Q4_0's block).
        group: usize,
        /// How `linear_int4` takes the activations (int8 by default, as Q4_0 does).
        activations: ActQuant,
    },
}

/// Q8_0's and Q4_0's block size, the default group.
pub const BLOCK: usize = 32;

impl WeightQuant {
    /// `int8` or `int4` in groups of `group` ([`BLOCK`] when `None`), int4's activations as
    /// `activations` names them (`int8` when `None`); a zero group, an odd one for int4,
    /// f32 activations for int8 weights, or another name is an error naming it.
    pub fn parse(name: &str, group: Option<usize>, activations: Option<&str>) -> Result<WeightQuant> {
        let group = group.unwrap_or(BLOCK);
        let activations = match activations {
            None | Some("int8") => ActQuant::Int8,
            Some("f32") => ActQuant::F32,
            Some(other) => return Err(Error::invalid(format!("--activations {other}: expected int8 or f32"))),
        };
        match name {
            _ if group == 0 => Err(Error::invalid("--group-size 0: a group holds at least one feature".to_owned())),
            "int8" if activations == ActQuant::F32 => Err(Error::invalid(
                "--activations f32 with --weights int8: linear_w8a8 multiplies int8 activations; f32 ones go with int4"
                    .to_owned(),
            )),
            "int8" => Ok(WeightQuant::Int8 { group }),
            "int4" if !group.is_multiple_of(2) => Err(Error::invalid(format!(
                "--group-size {group}: int4 groups hold whole bytes of two codes; give an even size such as 32"
            ))),
            "int4" => Ok(WeightQuant::Int4 { group, activations }),
            other => Err(Error::invalid(format!("--weights {other}: expected int8 or int4"))),
        }
    }

    /// int4 in groups of `group` with int8 activations (Q4_0's arithmetic).
    pub fn int4(group: usize) -> WeightQuant {
        WeightQuant::Int4 { group, activations: ActQuant::Int8 }
    }

    /// Input features per scale.
    pub fn group(self) -> usize {
        match self {
            WeightQuant::Int8 { group } | WeightQuant::Int4 { group, .. } => group,
        }
    }
}

impl fmt::Display for WeightQuant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightQuant::Int8 { group } => write!(f, "int8 (group {group})"),
            WeightQuant::Int4 { group, activations } => {
                write!(f, "int4 (group {group}, {} activations)", activations.as_str())
            }
        }
    }
}

/// A projection's weight, `[out, in]` as HF stores it: as loaded, or quantized at load.
#[derive(Debug, Clone)]
pub enum Proj {
    /// In the compute dtype.
    Dense(HostTensor),
    /// i8 `[N, K]` and its f32 block scales `[N, K/group]` (`linear_w8a8`'s `weight` and
    /// `w_scale`).
    Int8 {
        /// The codes.
        weight: HostTensor,
        /// One scale per block.
        scale: HostTensor,
        /// Input features per scale.
        group: usize,
    },
    /// Packed codes `[N, K/2]` (i8 bytes) and scales `[N, K/group]` (`linear_int4`; f16
    /// values, as Q4_0 stores them, held in f32).
    Int4 {
        /// Two codes per byte.
        packed: HostTensor,
        /// One scale per block.
        scales: HostTensor,
        /// Input features per scale.
        group: usize,
        /// How `linear_int4` takes the activations.
        activations: ActQuant,
    },
}

impl Proj {
    /// The dense weight, unless quantized.
    pub fn dense(&self) -> Option<&HostTensor> {
        match self {
            Proj::Dense(t) => Some(t),
            _ => None,
        }
    }

    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        match self {
            Proj::Dense(t) | Proj::Int8 { weight: t, .. } => [dim(t, 0), dim(t, 1)],
            Proj::Int4 { packed, .. } => [dim(packed, 0), 2 * dim(packed, 1)],
        }
    }

    /// Bytes held (codes and scales).
    pub fn bytes(&self) -> usize {
        let b = |t: &HostTensor| t.numel() * t.dtype().size_bytes() as usize;
        let (codes, scales) = self.operands();
        b(codes) + scales.map_or(0, b)
    }

    /// Its tensors, both with one row per output feature: the weight or codes, and the
    /// block scales when quantized.
    pub(crate) fn operands(&self) -> (&HostTensor, Option<&HostTensor>) {
        match self {
            Proj::Dense(t) => (t, None),
            Proj::Int8 { weight, scale, .. } => (weight, Some(scale)),
            Proj::Int4 { packed, scales, .. } => (packed, Some(scales)),
        }
    }

    /// A projection of this kind (and group, and activations) over other operands; `None`
    /// when a quantized kind is given no scales.
    pub(crate) fn with_operands(&self, codes: HostTensor, scales: Option<HostTensor>) -> Option<Proj> {
        Some(match *self {
            Proj::Dense(_) => Proj::Dense(codes),
            Proj::Int8 { group, .. } => Proj::Int8 { weight: codes, scale: scales?, group },
            Proj::Int4 { group, activations, .. } => Proj::Int4 { packed: codes, scales: scales?, group, activations },
        })
    }

    /// Whether `other` is of this kind, group and activations (their rows stack into one).
    pub(crate) fn stacks_with(&self, other: &Proj) -> bool {
        match (self, other) {
            (Proj::Dense(a), Proj::Dense(b)) => a.dtype() == b.dtype(),
            (Proj::Int8 { group: a, .. }, Proj::Int8 { group: b, .. }) => a == b,
            (Proj::Int4 { group: a, activations: x, .. }, Proj::Int4 { group: b, activations: y, .. }) => {
                a == b && x == y
            }
            _ => false,
        }
    }

    /// This projection in `how` (a dense weight's values read once; a quantized one kept).
    pub fn quantized(&self, how: WeightQuant) -> Result<Proj> {
        let Proj::Dense(t) = self else { return Ok(self.clone()) };
        let [n, k] = self.shape();
        if t.rank() != 2 || !t.dtype().is_float() {
            return Err(Error::invalid(format!(
                "a projection of shape {:?} and dtype {} cannot be quantized: expected a float [out, in] weight",
                t.shape(),
                t.dtype()
            )));
        }
        let group = how.group();
        if !k.is_multiple_of(group) {
            return Err(Error::invalid(format!(
                "--group-size {group} does not divide a projection's {k} input features ([{n}, {k}])"
            )));
        }
        let w = t.to_f32_vec();
        Ok(match how {
            WeightQuant::Int8 { group } => {
                let (codes, scales) = int8_blocks(&w, group);
                Proj::Int8 {
                    weight: HostTensor::new(Storage::I8(codes.into()), &[n, k])?,
                    scale: HostTensor::from_f32(&[n, k / group], scales)?,
                    group,
                }
            }
            WeightQuant::Int4 { group, activations } => {
                let (bytes, scales) = q4_0_rows(&w, n, k, group);
                // Q4_0's f16 scales, held as the f32 values they are: the decode GEMV reads
                // them in place instead of converting a row's worth per row.
                let scales: Vec<f32> = scales.iter().map(|s| s.to_f32()).collect();
                Proj::Int4 {
                    packed: HostTensor::new(Storage::I8(bytes.into()), &[n, k / 2])?,
                    scales: HostTensor::from_f32(&[n, k / group], scales)?,
                    group,
                    activations,
                }
            }
        })
    }
}

/// Dim `i` of `t`, 0 where it has none (a malformed projection reads as empty).
fn dim(t: &HostTensor, i: usize) -> usize {
    t.shape().get(i).copied().unwrap_or(0)
}

/// int8 in blocks of `g` (rows are whole blocks): codes and one scale per block.
fn int8_blocks(w: &[f32], g: usize) -> (Vec<i8>, Vec<f32>) {
    let mut codes = vec![0i8; w.len()];
    let mut scales = Vec::with_capacity(w.len() / g);
    for (block, out) in w.chunks_exact(g).zip(codes.chunks_exact_mut(g)) {
        let amax = block.iter().fold(0f32, |m, &x| if x.abs() > m { x.abs() } else { m });
        let s = if amax > 0.0 { amax / 127.0 } else { 1.0 };
        scales.push(s);
        for (c, &x) in out.iter_mut().zip(block) {
            let q = (x / s).round_ties_even();
            *c = if q.is_nan() { 0 } else { q.clamp(-127.0, 127.0) as i8 };
        }
    }
    (codes, scales)
}

/// Q4_0 blocks of `g` along each row: packed codes and f16 scales.
fn q4_0_rows(w: &[f32], n: usize, k: usize, g: usize) -> (Vec<i8>, Vec<f16>) {
    let mut bytes = vec![0i8; n * k / 2];
    let mut scales = Vec::with_capacity(n * k / g);
    for (b, block) in w[..n * k].chunks_exact(g).enumerate() {
        // The signed value of largest magnitude (the first of equals), as Q4_0 picks it.
        let m = block.iter().fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
        let d = m / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        scales.push(f16::from_f32(d));
        let out = &mut bytes[b * g / 2..(b + 1) * g / 2];
        for (o, pair) in out.iter_mut().zip(block.chunks_exact(2)) {
            let code = |x: f32| ((x * id + 8.5).floor().clamp(0.0, 15.0)) as u8;
            *o = (code(pair[0]) | (code(pair[1]) << 4)) as i8;
        }
    }
    (bytes, scales)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    fn dequant(p: &Proj) -> Vec<f32> {
        let [n, k] = p.shape();
        match p {
            Proj::Dense(t) => t.to_f32_vec(),
            Proj::Int8 { weight, scale, group } => {
                let (w, s) = (weight.to_f32_vec(), scale.to_f32_vec());
                (0..n * k).map(|i| w[i] * s[i / group]).collect()
            }
            Proj::Int4 { packed, scales, group, .. } => {
                let (Storage::I8(b), s) = (packed.storage(), scales.to_f32_vec()) else { return vec![] };
                (0..n * k)
                    .map(|i| {
                        let byte = b[i / 2] as u8;
                        let q = if i % 2 == 0 { byte & 15 } else { byte >> 4 };
                        (f32::from(q) - 8.0) * s[i / group]
                    })
                    .collect()
            }
        }
    }

    #[test]
    fn int4_follows_q4_0_so_the_block_extreme_is_exact_and_the_errors_are_q4_0s() -> TestResult {
        let (n, k) = (3, 64);
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
        let p = Proj::Dense(HostTensor::from_f32(&[n, k], w.clone())?).quantized(WeightQuant::int4(32))?;
        let back = dequant(&p);
        for (b, (orig, got)) in w.chunks(32).zip(back.chunks(32)).enumerate() {
            let m = orig.iter().fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
            let d = f32::from(f16::from_f32(m / -8.0));
            let at = orig.iter().position(|&x| x == m).ok_or("no extreme")?;
            // The extreme maps to code 0: (0 - 8) * d = m, up to d's f16 rounding.
            assert!((got[at] - m).abs() <= m.abs() * 1e-3, "block {b}: extreme {m} came back {}", got[at]);
            // Codes reach 8 steps on the extreme's side and 7 on the other: a value beyond 7
            // steps there clamps (within one step), every other lies within half a step.
            for (x, y) in orig.iter().zip(got) {
                let within = if (x / d).abs() > 7.0 && x.signum() != m.signum() { 1.0 } else { 0.5 };
                let bound = d.abs() * within + m.abs() * 1e-3;
                assert!((x - y).abs() <= bound, "block {b}: {x} came back {y} (step {d})");
            }
        }
        Ok(())
    }

    #[test]
    fn int8_blocks_keep_each_value_within_half_a_step_and_zero_blocks_stay_zero() -> TestResult {
        let (n, k) = (2, 8);
        let mut w: Vec<f32> = (0..k).map(|i| i as f32 - 3.5).collect();
        w.extend(vec![0.0; k]);
        let p = Proj::Dense(HostTensor::from_f32(&[n, k], w.clone())?).quantized(WeightQuant::Int8 { group: 8 })?;
        let back = dequant(&p);
        let step = 4.5 / 127.0;
        for (x, y) in w.iter().zip(&back) {
            assert!((x - y).abs() <= step * 0.5 + 1e-6, "{x} came back {y}");
        }
        assert_eq!(&back[k..], &vec![0.0; k][..]);
        Ok(())
    }

    #[test]
    fn a_group_that_does_not_divide_the_features_or_an_odd_one_is_refused_by_name() -> TestResult {
        let p = Proj::Dense(HostTensor::from_f32(&[1, 48], vec![1.0; 48])?);
        let e = p.quantized(WeightQuant::int4(32)).err().ok_or("48 features took groups of 32")?;
        assert!(e.to_string().contains("--group-size 32"), "{e}");
        let e = WeightQuant::parse("int4", Some(7), None).err().ok_or("an odd group was taken")?;
        assert!(e.to_string().contains("--group-size 7"), "{e}");
        let e = WeightQuant::parse("int8", Some(0), None).err().ok_or("int8 took a zero group")?;
        assert!(e.to_string().contains("--group-size 0"), "{e}");
        assert_eq!(WeightQuant::parse("int8", None, None)?, WeightQuant::Int8 { group: BLOCK });
        let e = WeightQuant::parse("q5", None, None).err().ok_or("q5 was taken")?;
        assert!(e.to_string().contains("--weights q5"), "{e}");
        // int4 takes int8 activations unless told f32; int8 weights take only int8 ones.
        assert_eq!(WeightQuant::parse("int4", None, None)?, WeightQuant::int4(BLOCK));
        let f32_act = WeightQuant::parse("int4", None, Some("f32"))?;
        assert_eq!(f32_act, WeightQuant::Int4 { group: BLOCK, activations: ActQuant::F32 });
        let e = WeightQuant::parse("int8", None, Some("f32")).err().ok_or("int8 took f32 activations")?;
        assert!(e.to_string().contains("--activations f32"), "{e}");
        let e = WeightQuant::parse("int4", None, Some("fp8")).err().ok_or("fp8 activations were taken")?;
        assert!(e.to_string().contains("--activations fp8"), "{e}");
        Ok(())
    }
}
