//! Online softmax over a score tile (f32 probabilities, or bf16 for the AMX path).

use super::avx512_bf16;
use super::vector::{exp_approx, exp_scale_sub_sum_impl, row_max_impl, scale_impl};
use super::{Level, level};

/// Per-row bookkeeping of an online softmax tile.
pub(crate) struct SoftmaxRows<'a> {
    /// Visible columns `[a, b)` of each row within the tile.
    pub ranges: &'a [(usize, usize)],
    /// Running max per row.
    pub m: &'a mut [f32],
    /// Running sum per row.
    pub l: &'a mut [f32],
    /// Factor (> 0) applied to the scores before the softmax.
    pub scale: f32,
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn softmax_tile_body(
    s: &mut [f32],
    lds: usize,
    w: usize,
    rows: SoftmaxRows,
    o: &mut [f32],
    ldo: usize,
    dv: usize,
    row_max: impl Fn(&[f32]) -> f32,
    exp_sum: impl Fn(&mut [f32], f32, f32) -> f32,
) {
    let SoftmaxRows { ranges, m, l, scale } = rows;
    for (r, &(a, b)) in ranges.iter().enumerate() {
        let row = &mut s[r * lds..r * lds + w];
        if a >= b {
            row.fill(0.0);
            continue;
        }
        row[..a].fill(0.0);
        row[b..].fill(0.0);
        let seg = &mut row[a..b];
        let m_new = m[r].max(scale * row_max(seg));
        if m_new == f32::NEG_INFINITY {
            seg.fill(0.0);
            continue;
        }
        let corr = exp_approx(m[r] - m_new);
        let sum = exp_sum(seg, scale, m_new);
        l[r] = l[r] * corr + sum;
        m[r] = m_new;
        if corr != 1.0 {
            scale_impl(&mut o[r * ldo..r * ldo + dv], corr);
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn softmax_tile_portable(s: &mut [f32], lds: usize, w: usize, rows: SoftmaxRows, o: &mut [f32], ldo: usize, dv: usize) {
    softmax_tile_body(s, lds, w, rows, o, ldo, dv, row_max_impl, exp_scale_sub_sum_impl);
}

multiversion! {
    #[allow(clippy::too_many_arguments)]
    fn softmax_tile_generic(s: &mut [f32], lds: usize, w: usize, rows: SoftmaxRows, o: &mut [f32], ldo: usize, dv: usize) => softmax_tile_portable;
}

/// One online-softmax step over the score tile `s` (rows of stride `lds`, `w` columns):
/// for each row, columns outside its range become 0; inside, `exp(s - m_new)` with
/// `m_new = max(m, max s)`; `l = l * exp(m - m_new) + sum`; the output row of `o` (stride
/// `ldo`, `dv` wide) is rescaled by `exp(m - m_new)`. Rows that have seen no finite score
/// stay zero.
#[allow(clippy::too_many_arguments)]
pub(crate) fn softmax_tile(
    s: &mut [f32],
    lds: usize,
    w: usize,
    rows: SoftmaxRows,
    o: &mut [f32],
    ldo: usize,
    dv: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected on this CPU.
        unsafe {
            x86::softmax_tile_avx512(s, lds, w, rows, o, ldo, dv)
        };
        return;
    }
    softmax_tile_generic(s, lds, w, rows, o, ldo, dv);
}

/// [`softmax_tile`] for the bf16 tile path: the probabilities go to `pb` as bf16 (row
/// stride `ldp`, `kw >= w` columns, zeros outside each row's range) and are computed with a
/// cheaper exponential (relative error 3e-6, far below bf16's 2^-9); `s` is only read.
/// Only callable when [`avx512_bf16`] is true.
#[allow(clippy::too_many_arguments)]
pub(crate) fn softmax_tile_bf16(
    s: &[f32],
    lds: usize,
    w: usize,
    rows: SoftmaxRows,
    o: &mut [f32],
    ldo: usize,
    dv: usize,
    pb: &mut [u16],
    ldp: usize,
    kw: usize,
) {
    assert!(avx512_bf16(), "softmax_tile_bf16 needs AVX512_BF16");
    assert!(kw >= w && ldp >= kw && lds >= w);
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(unsafe_code)]
        // SAFETY: `avx512_bf16()` (asserted above) detected AVX-512F/BW/VL and AVX512_BF16.
        unsafe {
            x86::softmax_tile_bf16_avx512(s, lds, w, rows, o, ldo, dv, pb, ldp, kw)
        };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::vector::x86::{exp_sub_sum_avx512, row_max_avx512};

    /// e^(x scale - m) for the bf16 path: 2^t, t = x scale log2 e - m log2 e, a degree-4
    /// fit of 2^f on [-1/2, 1/2] (relative error 2.6e-6); writes bf16 bits, returns the sum.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW/VL and AVX512_BF16.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
    unsafe fn exp_to_bf16_avx512(x: &[f32], scale: f32, m: f32, out: &mut [u16]) -> f32 {
        let n = x.len().min(out.len());
        let (xp, op) = (x.as_ptr(), out.as_mut_ptr());
        let l2e = std::f32::consts::LOG2_E;
        let (vc, vm, floor) = (_mm512_set1_ps(scale * l2e), _mm512_set1_ps(-m * l2e), _mm512_set1_ps(-150.0));
        let c = [
            _mm512_set1_ps(9.570_102e-3),
            _mm512_set1_ps(5.591_786_3e-2),
            _mm512_set1_ps(2.402_474_4e-1),
            _mm512_set1_ps(6.931_218e-1),
            _mm512_set1_ps(0.999_999_3),
        ];
        let mut sum = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let len = (n - i).min(16);
            let mask: u16 = if len == 16 { 0xFFFF } else { (1u16 << len) - 1 };
            // SAFETY: lanes i..i+len lie within `x` and `out`; masked-off lanes are not accessed.
            let v = unsafe { _mm512_maskz_loadu_ps(mask, xp.add(i)) };
            let t = _mm512_max_ps(floor, _mm512_fmadd_ps(v, vc, vm));
            let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
            let f = _mm512_sub_ps(t, k);
            let mut y = c[0];
            for &ci in &c[1..] {
                y = _mm512_fmadd_ps(y, f, ci);
            }
            let e = _mm512_maskz_mov_ps(mask, _mm512_scalef_ps(y, k));
            sum = _mm512_add_ps(sum, e);
            // SAFETY: `__m256bh` and `__m256i` are both 256-bit vectors of plain bits.
            let bits: __m256i = unsafe { std::mem::transmute(_mm512_cvtneps_pbh(e)) };
            // SAFETY: as for the load.
            unsafe { _mm256_mask_storeu_epi16(op.add(i).cast(), mask, bits) };
            i += len;
        }
        _mm512_reduce_add_ps(sum)
    }

    /// [`super::softmax_tile_bf16`] after its checks.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW/VL, AVX512_BF16, AVX2 and FMA.
    #[allow(unsafe_code)]
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn softmax_tile_bf16_avx512(
        s: &[f32],
        lds: usize,
        w: usize,
        rows: super::SoftmaxRows,
        o: &mut [f32],
        ldo: usize,
        dv: usize,
        pb: &mut [u16],
        ldp: usize,
        kw: usize,
    ) {
        let super::SoftmaxRows { ranges, m, l, scale } = rows;
        for (r, &(a, b)) in ranges.iter().enumerate() {
            let prow = &mut pb[r * ldp..r * ldp + kw];
            let b = b.min(w);
            if a >= b {
                prow.fill(0);
                continue;
            }
            prow[..a].fill(0);
            prow[b..].fill(0);
            let seg = &s[r * lds + a..r * lds + b];
            // SAFETY: AVX-512F is enabled here (this function's contract).
            let m_new = m[r].max(scale * unsafe { row_max_avx512(seg) });
            if m_new == f32::NEG_INFINITY {
                prow[a..b].fill(0);
                continue;
            }
            let corr = super::exp_approx(m[r] - m_new);
            // SAFETY: AVX-512F/BW/VL and AVX512_BF16 are enabled here (this function's contract).
            let sum = unsafe { exp_to_bf16_avx512(seg, scale, m_new, &mut prow[a..b]) };
            l[r] = l[r] * corr + sum;
            m[r] = m_new;
            if corr != 1.0 {
                super::scale_impl(&mut o[r * ldo..r * ldo + dv], corr);
            }
        }
    }

    /// [`super::softmax_tile`] with the AVX-512 exponential.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/VL/BW/DQ, AVX2, FMA and F16C.
    #[allow(unsafe_code)]
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")]
    pub(super) unsafe fn softmax_tile_avx512(
        s: &mut [f32],
        lds: usize,
        w: usize,
        rows: super::SoftmaxRows,
        o: &mut [f32],
        ldo: usize,
        dv: usize,
    ) {
        super::softmax_tile_body(
            s,
            lds,
            w,
            rows,
            o,
            ldo,
            dv,
            |x| {
                // SAFETY: AVX-512F is enabled here (this function's contract).
                unsafe { row_max_avx512(x) }
            },
            |x, c, m| {
                // SAFETY: as above.
                unsafe { exp_sub_sum_avx512(x, c, m) }
            },
        );
    }
}
