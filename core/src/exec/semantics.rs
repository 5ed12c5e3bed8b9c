//! The meaning of the attention and RoPE options, written once: every kernel (the
//! reference, the fast CPU ones) calls these, and PyTorch fixtures check them.
//!
//! Attention score of query row `i` and key `j` (per head `h`):
//! `s = scale * q_i . k_j` (scale defaults to 1/sqrt(head_dim)); with a soft-cap `c`,
//! `s = c * tanh(s / c)`; with ALiBi, `s -= slope_h * |i + (seq_k - seq_q) - j|`; an additive
//! float mask adds to `s`; a bool keep-mask, causal masking and the window remove keys.
//! A query row with no visible key yields zeros (never NaN).

use crate::model::attrs::{AttentionAttrs, CausalAlignment, RopeAttrs, RopeScaling};

/// Standard ALiBi slopes for `n` heads (Press et al.): for a power of two `n`,
/// `2^(-8 (h+1) / n)`; otherwise the slopes of the closest lower power of two `m`, followed
/// by every other slope of `2m`.
pub fn alibi_slopes(n: usize) -> Vec<f64> {
    fn pow2_slopes(n: usize) -> Vec<f64> {
        let start = 2f64.powf(-8.0 / n as f64);
        (0..n).map(|i| start.powi(i as i32 + 1)).collect()
    }
    if n == 0 {
        return Vec::new();
    }
    if n.is_power_of_two() {
        return pow2_slopes(n);
    }
    let m = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let mut s = pow2_slopes(m);
    s.extend(pow2_slopes(2 * m).into_iter().step_by(2).take(n - m));
    s
}

/// Which keys query row `i` may see: the half-open range `[lo, hi)` within `[0, seq_k)`,
/// from causal masking and the left window. Rows aligned bottom-right map row `i` to key
/// position `i + seq_k - seq_q`; top-left maps it to `i`.
#[inline]
pub fn visible_keys(i: usize, seq_q: usize, seq_k: usize, a: &AttentionAttrs) -> (usize, usize) {
    let shift = match a.causal_alignment {
        CausalAlignment::BottomRight => seq_k as i64 - seq_q as i64,
        CausalAlignment::TopLeft => 0,
    };
    let diag = i as i64 + shift;
    let hi = if a.causal { (diag + 1).clamp(0, seq_k as i64) } else { seq_k as i64 };
    let lo = match a.window_left {
        Some(w) => (diag - w as i64).clamp(0, seq_k as i64),
        None => 0,
    };
    (lo as usize, hi.max(lo) as usize)
}

/// The ALiBi distance term for row `i`, key `j` (bottom-right aligned, as FlashAttention).
#[inline]
pub fn alibi_distance(i: usize, j: usize, seq_q: usize, seq_k: usize) -> f64 {
    (i as f64 + seq_k as f64 - seq_q as f64 - j as f64).abs()
}

/// The softmax scale.
pub fn softmax_scale(a: &AttentionAttrs, head_dim: usize) -> f64 {
    a.scale.unwrap_or_else(|| 1.0 / (head_dim.max(1) as f64).sqrt())
}

/// True when [`rope_frequencies`] depends on `seq_len` for these attributes (so a cached
/// table is valid for every length otherwise).
pub fn rope_frequencies_depend_on_length(a: &RopeAttrs) -> bool {
    match &a.scaling {
        None | Some(RopeScaling::Linear { .. }) | Some(RopeScaling::Yarn { .. }) | Some(RopeScaling::Llama3 { .. }) => {
            false
        }
        Some(RopeScaling::DynamicNtk { .. }) => true,
    }
}

/// RoPE inverse frequencies for the rotated dims and the attention (magnitude) factor,
/// following Hugging Face `transformers` `ROPE_INIT_FUNCTIONS` for each scaling type.
/// `seq_len` is the length the dynamic NTK scaling adapts to.
pub fn rope_frequencies(a: &RopeAttrs, rotary_dim: usize, seq_len: usize) -> (Vec<f64>, f64) {
    let base = a.base.unwrap_or(10000.0);
    let half = rotary_dim / 2;
    let inv =
        |base: f64| -> Vec<f64> { (0..half).map(|i| 1.0 / base.powf((2 * i) as f64 / rotary_dim as f64)).collect() };
    match &a.scaling {
        None => (inv(base), 1.0),
        Some(RopeScaling::Linear { factor }) => (inv(base).into_iter().map(|f| f / factor).collect(), 1.0),
        Some(RopeScaling::DynamicNtk { factor, original_max_position }) => {
            let orig = *original_max_position as f64;
            let len = (seq_len as f64).max(orig);
            let base = if len > orig {
                base * ((factor * len / orig) - (factor - 1.0)).powf(rotary_dim as f64 / (rotary_dim as f64 - 2.0))
            } else {
                base
            };
            (inv(base), 1.0)
        }
        Some(RopeScaling::Yarn { factor, original_max_position, beta_fast, beta_slow }) => {
            let dim = rotary_dim as f64;
            let orig = *original_max_position as f64;
            let correction_dim = |rot: f64| dim * (orig / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
            let low = correction_dim(*beta_fast).floor().max(0.0);
            let high = correction_dim(*beta_slow).ceil().min(dim - 1.0);
            let high = if (high - low).abs() < f64::EPSILON { high + 0.001 } else { high };
            let pos = inv(base);
            let freqs: Vec<f64> = (0..half)
                .map(|i| {
                    let extrapolation = pos[i];
                    let interpolation = pos[i] / factor;
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation_factor = 1.0 - ramp;
                    interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
                })
                .collect();
            let mscale = if *factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 };
            (freqs, mscale)
        }
        Some(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position }) => {
            let orig = *original_max_position as f64;
            let low_wavelen = orig / low_freq_factor;
            let high_wavelen = orig / high_freq_factor;
            let freqs = inv(base)
                .into_iter()
                .map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect();
            (freqs, 1.0)
        }
    }
}

/// Validated sampling options (`sample`), shared by every sampling kernel so that they
/// agree on what the attributes mean.
#[derive(Debug, Clone, Copy)]
pub struct SamplePlan {
    /// Argmax (lowest index on ties).
    pub greedy: bool,
    /// Softmax temperature (1 when absent).
    pub temperature: f64,
    /// 0 = no top-k.
    pub top_k: u64,
    /// Top-p mass, of what top-k keeps.
    pub top_p: Option<f64>,
    /// Min-p ratio (0 = off).
    pub min_p: f64,
    /// RNG seed (0 when absent).
    pub seed: u64,
}

/// Validates sampling attributes; the error names the attribute and its value.
pub fn sample_plan(a: &crate::model::attrs::SampleAttrs) -> Result<SamplePlan, String> {
    let temperature = a.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(format!("attrs.temperature is {temperature}; it must be a finite number >= 0"));
    }
    if let Some(p) = a.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(format!("attrs.top_p is {p}; it must be in (0, 1]"));
    }
    if let Some(p) = a.min_p
        && !(0.0..=1.0).contains(&p)
    {
        return Err(format!("attrs.min_p is {p}; it must be in [0, 1]"));
    }
    let top_k = a.top_k.unwrap_or(0);
    let filtered = top_k > 0 || a.top_p.is_some() || a.min_p.is_some();
    let greedy = temperature == 0.0 || (a.temperature.is_none() && !filtered);
    Ok(SamplePlan {
        greedy,
        temperature,
        top_k,
        top_p: a.top_p,
        min_p: a.min_p.unwrap_or(0.0),
        seed: a.seed.unwrap_or(0),
    })
}

/// The tokens a sampling plan keeps for one row of logits, in descending order with their
/// weights `exp((l - m) / T)` (unnormalized), and the sum of those weights in that order:
/// the distribution every sampling kernel draws from (see `cpu_reference.sample.naive` for
/// the rules). `l` must hold no NaN and at least one logit above -inf; the largest weight
/// is 1, so the result is never empty.
pub fn sample_kept(l: &[f64], plan: &SamplePlan) -> (Vec<(usize, f64)>, f64) {
    let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weight = |x: f64| {
        if m == f64::INFINITY { if x == f64::INFINITY { 1.0 } else { 0.0 } } else { ((x - m) / plan.temperature).exp() }
    };
    let w: Vec<f64> = l.iter().map(|&x| weight(x)).collect();
    let mut z = 0.0;
    for &x in &w {
        z += x;
    }
    let mut order: Vec<usize> = (0..l.len()).collect();
    order.sort_by(|&i, &j| l[j].partial_cmp(&l[i]).unwrap_or(std::cmp::Ordering::Equal).then(i.cmp(&j)));
    let cap = if plan.top_k == 0 { l.len() } else { usize::try_from(plan.top_k).unwrap_or(usize::MAX).min(l.len()) };
    // The mass top-p is a fraction of: what top-k keeps, summed in order (or everything).
    let zk = if cap < l.len() {
        let mut zk = 0.0;
        for &i in &order[..cap] {
            zk += w[i];
        }
        zk
    } else {
        z
    };
    let mut kept: Vec<(usize, f64)> = Vec::new();
    let mut mass = 0.0;
    for &i in &order[..cap] {
        let wi = w[i];
        // Weights do not increase along the order: the first failure ends the prefix.
        if wi <= 0.0 || wi < plan.min_p {
            break;
        }
        kept.push((i, wi));
        mass += wi;
        if let Some(p) = plan.top_p
            && mass >= p * zk
        {
            break;
        }
    }
    (kept, mass)
}

/// The SplitMix64 output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The sampler's draw for a row: uniform in [0, 1), element `row` of the SplitMix64 stream
/// whose state starts at `mix(seed)` (53 random bits). Counter-based: it depends only on
/// (seed, row), never on thread count or the order rows are visited.
pub fn sample_uniform(seed: u64, row: u64) -> f64 {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    let state = mix(seed ^ 0x5851_F42D_4C95_7F2D).wrapping_add(row.wrapping_add(1).wrapping_mul(GAMMA));
    (mix(state) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alibi_slopes_match_the_published_values() {
        let s8 = alibi_slopes(8);
        let expect8: Vec<f64> = (1..=8).map(|i| 2f64.powi(-i)).collect();
        for (a, b) in s8.iter().zip(&expect8) {
            assert!((a - b).abs() < 1e-12);
        }
        // 12 heads: the 8 slopes of 8, then slopes 1, 3, 5, 7 (0-based 0, 2, 4, 6) of 16.
        let s12 = alibi_slopes(12);
        assert_eq!(s12.len(), 12);
        assert!((s12[8] - 2f64.powf(-0.5)).abs() < 1e-12 && (s12[9] - 2f64.powf(-1.5)).abs() < 1e-12);
    }

    #[test]
    fn causal_alignments_agree_when_square_and_differ_otherwise() {
        let br = AttentionAttrs { causal: true, ..Default::default() };
        let tl = AttentionAttrs { causal: true, causal_alignment: CausalAlignment::TopLeft, ..Default::default() };
        for i in 0..5 {
            assert_eq!(visible_keys(i, 5, 5, &br), visible_keys(i, 5, 5, &tl));
        }
        assert_eq!(visible_keys(0, 2, 5, &br), (0, 4));
        assert_eq!(visible_keys(0, 2, 5, &tl), (0, 1));
        // seq_q > seq_k bottom-right: the first rows see nothing.
        assert_eq!(visible_keys(0, 5, 2, &br), (0, 0));
        let win = AttentionAttrs { causal: true, window_left: Some(2), ..Default::default() };
        assert_eq!(visible_keys(4, 5, 5, &win), (2, 5));
    }
}
