//! SIMD primitives of the fast CPU kernels, chosen once at run time: AVX-512 and AVX2 GEMM
//! microkernels (intrinsics) for f32 tile products, an AMX tile GEMM for bf16 operands
//! (Linux, after `arch_prctl` grants the tile state), AVX-512 exponentials for the online
//! softmax, and portable loops that the compiler vectorizes inside `#[target_feature]`
//! wrappers for everything else. This is the only module of the `cpu` backend with
//! `unsafe` besides `alloc` (one `madvise` call): each block says why it is sound.
//!
//! `LZ_CPU_SIMD=avx2` or `LZ_CPU_SIMD=portable` caps the level, `LZ_CPU_SIMD=noamx` keeps
//! AVX-512 but turns AMX off (benchmarks, debugging).

use std::sync::OnceLock;

/// Instruction-set level used by the dispatchers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// AVX-512F (+ AVX2, FMA, F16C).
    Avx512,
    /// AVX2 + FMA (+ F16C).
    Avx2,
    /// Whatever the build target has.
    Portable,
}

/// The level detected on this CPU (capped by `LZ_CPU_SIMD`).
pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

fn detect() -> Level {
    let cap = std::env::var("LZ_CPU_SIMD").unwrap_or_default();
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 =
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
        let avx512 = avx2 && is_x86_feature_detected!("avx512f");
        if cap == "portable" {
            return Level::Portable;
        }
        if avx512 && cap != "avx2" {
            return Level::Avx512;
        }
        if avx2 {
            return Level::Avx2;
        }
    }
    let _ = cap;
    Level::Portable
}

/// Defines `pub(crate) fn $name(args) -> ret` that runs `$imp` (an `#[inline(always)]`
/// portable function) compiled for the best level this CPU has.
macro_rules! multiversion {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $imp:path;) => {
        $(#[$meta])*
        pub(crate) fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")]
                fn with_avx512($($arg: $ty),*) $(-> $ret)? {
                    $imp($($arg),*)
                }
                #[target_feature(enable = "avx2,fma,f16c")]
                fn with_avx2($($arg: $ty),*) $(-> $ret)? {
                    $imp($($arg),*)
                }
                match level() {
                    Level::Avx512 => {
                        #[allow(unsafe_code)]
                        // SAFETY: `level()` is Avx512 only when the CPU reports every feature enabled above.
                        let r = unsafe { with_avx512($($arg),*) };
                        return r;
                    }
                    Level::Avx2 => {
                        #[allow(unsafe_code)]
                        // SAFETY: `level()` is Avx2 only when the CPU reports AVX2, FMA and F16C.
                        let r = unsafe { with_avx2($($arg),*) };
                        return r;
                    }
                    Level::Portable => {}
                }
            }
            $imp($($arg),*)
        }
    };
}

// ---------------------------------------------------------------------------------------
// Portable element-wise helpers (vectorized by the wrappers).

/// exp(x) for f32 (Cephes polynomial, about 1 ulp); exactly 0 below -87 (so -inf gives 0).
#[inline(always)]
pub(crate) fn exp_approx(x: f32) -> f32 {
    let xc = x.clamp(-87.5, 88.0);
    let t = xc * std::f32::consts::LOG2_E;
    // Round to nearest with the 1.5 * 2^23 trick (valid for |t| < 2^22): the low mantissa
    // bits of `z` then hold n as an integer, so 2^n is built with integer ops only.
    const MAGIC: f32 = 12_582_912.0;
    let z = t + MAGIC;
    let n = z - MAGIC;
    let r = xc - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let pow2n = f32::from_bits(z.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127) << 23);
    if x < -87.0 { 0.0 } else { y * pow2n }
}

#[inline(always)]
fn hsum16(mut acc: [f32; 16]) -> f32 {
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
    }
    acc[0]
}

#[inline(always)]
fn exp_sub_sum_impl(x: &mut [f32], m: f32) -> f32 {
    exp_scale_sub_sum_impl(x, 1.0, m)
}

#[inline(always)]
fn exp_scale_sub_sum_impl(x: &mut [f32], c: f32, m: f32) -> f32 {
    let mut acc = [0f32; 16];
    let mut chunks = x.chunks_exact_mut(16);
    for ch in &mut chunks {
        for l in 0..16 {
            let e = exp_approx(ch[l] * c - m);
            ch[l] = e;
            acc[l] += e;
        }
    }
    let mut s = 0f32;
    for v in chunks.into_remainder() {
        let e = exp_approx(*v * c - m);
        *v = e;
        s += e;
    }
    hsum16(acc) + s
}

multiversion! {
    fn exp_sub_sum_generic(x: &mut [f32], m: f32) -> f32 => exp_sub_sum_impl;
}

/// `x[i] = exp(x[i] - m)` (0 for -inf); returns the sum.
pub(crate) fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected on this CPU.
        let r = unsafe { x86::exp_sub_sum_avx512(x, 1.0, m) };
        return r;
    }
    exp_sub_sum_generic(x, m)
}

#[inline(always)]
fn row_max_impl(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for ch in &mut chunks {
        for l in 0..16 {
            acc[l] = if ch[l] > acc[l] { ch[l] } else { acc[l] };
        }
    }
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            acc[l] = if acc[l + w] > acc[l] { acc[l + w] } else { acc[l] };
        }
    }
    chunks.remainder().iter().fold(acc[0], |a, &v| if v > a { v } else { a })
}

multiversion! {
    fn row_max_generic(x: &[f32]) -> f32 => row_max_impl;
}

/// The largest element (-inf when empty; NaN elements are skipped).
pub(crate) fn row_max(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected on this CPU.
        let r = unsafe { x86::row_max_avx512(x) };
        return r;
    }
    row_max_generic(x)
}

#[inline(always)]
fn scale_impl(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

multiversion! {
    /// `x *= s`.
    fn scale(x: &mut [f32], s: f32) => scale_impl;
}

#[inline(always)]
fn axpy_impl(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

multiversion! {
    /// `y += a * x` (over the shorter length).
    fn axpy(y: &mut [f32], a: f32, x: &[f32]) => axpy_impl;
}

#[inline(always)]
fn dot_impl(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc0 = [0f32; 16];
    let mut acc1 = [0f32; 16];
    let mut ca = a.chunks_exact(32);
    let mut cb = b.chunks_exact(32);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..16 {
            acc0[l] += x[l] * y[l];
            acc1[l] += x[l + 16] * y[l + 16];
        }
    }
    for l in 0..16 {
        acc0[l] += acc1[l];
    }
    let mut s = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s += x * y;
    }
    hsum16(acc0) + s
}

#[inline(always)]
fn dots_impl(q: &[f32], d: usize, k: &[f32], out: &mut [f32]) {
    if d == 0 {
        out.fill(0.0);
        return;
    }
    for (o, row) in out.iter_mut().zip(q.chunks_exact(d)) {
        *o = dot_impl(row, k);
    }
}

multiversion! {
    fn dots_generic(q: &[f32], d: usize, k: &[f32], out: &mut [f32]) => dots_impl;
}

/// `out[r] = q[r*d..(r+1)*d] . k[..d]` for each row of `q` (`out.len()` rows).
pub(crate) fn dots(q: &[f32], d: usize, k: &[f32], out: &mut [f32]) {
    assert!(q.len() >= out.len() * d && k.len() >= d, "dots: operands too short");
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected on this CPU.
        unsafe {
            x86::dots_avx512(q, d, k, out)
        };
        return;
    }
    dots_generic(q, d, k, out);
}

#[inline(always)]
fn bf16_to_f32_impl(src: &[half::bf16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits(u32::from(s.to_bits()) << 16);
    }
}

multiversion! {
    /// bf16 to f32 (exact).
    fn bf16_to_f32(src: &[half::bf16], dst: &mut [f32]) => bf16_to_f32_impl;
}

#[inline(always)]
fn f16_to_f32_impl(src: &[half::f16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

multiversion! {
    /// f16 to f32 (exact).
    fn f16_to_f32(src: &[half::f16], dst: &mut [f32]) => f16_to_f32_impl;
}

// ---------------------------------------------------------------------------------------
// Norm rows: one reading pass for the statistics, one pass that reads the row again (from
// L1/L2) and writes the output; bf16 rows are read as bf16 both times (no f32 copy).

/// bf16 to f32 (exact: the bits shifted up).
#[inline(always)]
fn bf16_f32(x: half::bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// `(Σ (x - k), Σ (x - k)²)` accumulated in f64 (32 lanes each), so that the one-pass
/// variance `q/n - (s/n)²` keeps f32 precision whatever the mean (the shift `k`, a value
/// of the row, keeps the sums small as well).
#[inline(always)]
fn shifted_sums<S: Copy>(x: &[S], k: f32, load: impl Fn(S) -> f32) -> (f64, f64) {
    const L: usize = 32;
    let k = f64::from(k);
    let (mut s, mut q) = ([0f64; L], [0f64; L]);
    let mut ch = x.chunks_exact(L);
    for c in &mut ch {
        for l in 0..L {
            let d = f64::from(load(c[l])) - k;
            s[l] += d;
            q[l] += d * d;
        }
    }
    let (mut ts, mut tq) = (0f64, 0f64);
    for &v in ch.remainder() {
        let d = f64::from(load(v)) - k;
        ts += d;
        tq += d * d;
    }
    (s.iter().sum::<f64>() + ts, q.iter().sum::<f64>() + tq)
}

#[inline(always)]
fn shifted_sums_f32_impl(x: &[f32], k: f32) -> (f64, f64) {
    shifted_sums(x, k, |v| v)
}

#[inline(always)]
fn shifted_sums_bf16_impl(x: &[half::bf16], k: f32) -> (f64, f64) {
    shifted_sums(x, k, bf16_f32)
}

multiversion! {
    /// `(Σ (x - k), Σ (x - k)²)` in f64.
    fn shifted_sums_f32(x: &[f32], k: f32) -> (f64, f64) => shifted_sums_f32_impl;
}

multiversion! {
    /// `(Σ (x - k), Σ (x - k)²)` in f64 over a bf16 row.
    fn shifted_sums_bf16(x: &[half::bf16], k: f32) -> (f64, f64) => shifted_sums_bf16_impl;
}

/// True when the CPU has AVX512_BF16 (and AVX-512 is the level in use).
pub(crate) fn avx512_bf16() -> bool {
    static BF16: OnceLock<bool> = OnceLock::new();
    *BF16.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            level() == Level::Avx512 && is_x86_feature_detected!("avx512bf16") && is_x86_feature_detected!("avx512bw")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// `(Σ x, Σ x²)` of a bf16 row from exact bf16 products (AVX512_BF16 `vdpbf16ps`, which
/// sums pairs in f32), in f32 within blocks of 512 elements and f64 across them: about
/// 16 f32 roundings per lane and block, a relative error near 1e-6 of Σ x². `None` where
/// the instruction is missing or a block's sums are not finite (values past 1e19, or
/// infinities and NaN: the caller's f64 form handles those rows).
pub(crate) fn sums_bf16_dp(x: &[half::bf16]) -> Option<(f64, f64)> {
    #[cfg(target_arch = "x86_64")]
    if avx512_bf16() {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F/BW and AVX512_BF16 were detected; the kernel reads `x` only.
        let (s, q) = unsafe { x86::sums_bf16_dp(x) };
        return (s.is_finite() && q.is_finite()).then_some((s, q));
    }
    let _ = x;
    None
}

/// `out[i] = round(((x[i] - hi) - lo) * inv * w[i] (+ b[i]))`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn affine<S: Copy, D>(
    x: &[S],
    (hi, lo, inv): (f32, f32, f32),
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [D],
    load: impl Fn(S) -> f32,
    round: impl Fn(f32) -> D,
) {
    let n = out.len();
    let (x, w) = (&x[..n], &w[..n]);
    match b {
        Some(b) => {
            let b = &b[..n];
            for i in 0..n {
                out[i] = round(((load(x[i]) - hi) - lo) * inv * w[i] + b[i]);
            }
        }
        None => {
            for i in 0..n {
                out[i] = round(((load(x[i]) - hi) - lo) * inv * w[i]);
            }
        }
    }
}

/// `bf16_bits` for a value that is not NaN, or is the default quiet NaN that arithmetic on
/// non-NaN values produces (it stays NaN); infinities stay infinite.
#[inline(always)]
pub(crate) fn bf16_bits_finite(x: f32) -> u16 {
    let b = x.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The affine step of a norm: mean split in two f32 parts, and the inverse deviation.
pub(crate) type Norm = (f32, f32, f32);

#[inline(always)]
fn affine_f32_f32_impl(x: &[f32], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [f32]) {
    affine(x, n, w, b, out, |v| v, |v| v);
}

#[inline(always)]
fn affine_bf16_f32_impl(x: &[half::bf16], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [f32]) {
    affine(x, n, w, b, out, bf16_f32, |v| v);
}

#[inline(always)]
fn affine_f32_bf16_impl(x: &[f32], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [half::bf16], finite: bool) {
    // Without NaN inputs a NaN can only be the default quiet NaN, which the plain rounding
    // keeps NaN: no NaN select.
    if finite {
        affine(x, n, w, b, out, |v| v, |v| half::bf16::from_bits(bf16_bits_finite(v)));
    } else {
        affine(x, n, w, b, out, |v| v, |v| half::bf16::from_bits(bf16_bits(v)));
    }
}

#[inline(always)]
fn affine_bf16_bf16_impl(
    x: &[half::bf16],
    n: Norm,
    w: &[f32],
    b: Option<&[f32]>,
    out: &mut [half::bf16],
    finite: bool,
) {
    if finite {
        affine(x, n, w, b, out, bf16_f32, |v| half::bf16::from_bits(bf16_bits_finite(v)));
    } else {
        affine(x, n, w, b, out, bf16_f32, |v| half::bf16::from_bits(bf16_bits(v)));
    }
}

multiversion! {
    /// `out[i] = ((x[i] - hi) - lo) * inv * w[i] (+ b[i])` with `(hi, lo, inv) = n`.
    fn affine_f32_f32(x: &[f32], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [f32]) => affine_f32_f32_impl;
}

multiversion! {
    /// `affine_f32_f32` from a bf16 row.
    fn affine_bf16_f32(x: &[half::bf16], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [f32]) => affine_bf16_f32_impl;
}

multiversion! {
    /// `affine_f32_f32` rounded to bf16 (`finite`: no input is NaN).
    fn affine_f32_bf16(x: &[f32], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [half::bf16], finite: bool)
        => affine_f32_bf16_impl;
}

multiversion! {
    /// `affine_f32_f32` from a bf16 row rounded to bf16 (`finite`: no input is NaN).
    fn affine_bf16_bf16(x: &[half::bf16], n: Norm, w: &[f32], b: Option<&[f32]>, out: &mut [half::bf16], finite: bool)
        => affine_bf16_bf16_impl;
}

// ---------------------------------------------------------------------------------------
// Online softmax over a score tile.

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

// ---------------------------------------------------------------------------------------
// GEMM: C[m x n] (+)= A[m x k] . B[k x n], all row-major with leading dimensions.

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gemm_portable(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    for i in 0..m {
        let crow = &mut c[i * ldc..i * ldc + n];
        if !accumulate {
            crow.fill(0.0);
        }
        if k == 0 {
            continue;
        }
        let arow = &a[i * lda..i * lda + k];
        for (p, &av) in arow.iter().enumerate() {
            let brow = &b[p * ldb..p * ldb + n];
            for (cv, &bv) in crow.iter_mut().zip(brow) {
                *cv += av * bv;
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check_gemm(m: usize, n: usize, k: usize, a: &[f32], lda: usize, b: &[f32], ldb: usize, c: &[f32], ldc: usize) {
    assert!(m == 0 || n == 0 || c.len() >= (m - 1) * ldc + n, "gemm: C too short");
    assert!(m == 0 || k == 0 || a.len() >= (m - 1) * lda + k, "gemm: A too short");
    assert!(n == 0 || k == 0 || b.len() >= (k - 1) * ldb + n, "gemm: B too short");
    assert!(ldc >= n && (m <= 1 || lda >= k) && (k <= 1 || ldb >= n), "gemm: leading dimensions");
}

/// `C = A . B` (or `C += A . B` when `accumulate`); C is m x n, A m x k, B k x n, row-major
/// with leading dimensions `lda`, `ldb`, `ldc`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    check_gemm(m, n, k, a, lda, b, ldb, c, ldc);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(0.0);
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    match level() {
        Level::Avx512 => {
            #[allow(unsafe_code)]
            // SAFETY: AVX-512F was detected on this CPU.
            unsafe {
                x86::gemm_avx512(m, n, k, a, lda, b, ldb, c, ldc, accumulate)
            };
            return;
        }
        Level::Avx2 => {
            #[allow(unsafe_code)]
            // SAFETY: AVX2 and FMA were detected on this CPU.
            unsafe {
                x86::gemm_avx2(m, n, k, a, lda, b, ldb, c, ldc, accumulate)
            };
            return;
        }
        Level::Portable => {}
    }
    gemm_portable(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

/// Columns per packed B panel of [`gemm_panels`].
pub(crate) const PANEL: usize = 64;

/// [`gemm`] with B packed as panels: columns `64q..64q+64` of B are the `k x 64` row-major
/// block at `b[q * pstride..]` (so each microkernel streams contiguous memory).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_panels(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    pstride: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let mut q = 0;
    while q * PANEL < n {
        let nw = (n - q * PANEL).min(PANEL);
        let bq = if k == 0 { &b[..0] } else { &b[q * pstride..] };
        gemm(m, nw, k, a, lda, bq, PANEL, &mut c[q * PANEL..], ldc, accumulate);
        q += 1;
    }
}

/// The portable GEMM (tests compare the microkernels with it).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_reference(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    check_gemm(m, n, k, a, lda, b, ldb, c, ldc);
    gemm_portable(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
}

// ---------------------------------------------------------------------------------------
// bf16 tile GEMM on AMX. Products of bf16 values are exact in f32 and AMX sums them in f32,
// so for bf16 inputs this is the f32 GEMM at many times the rate.

/// True when AMX bf16 tiles are usable: the CPU has AMX-TILE and AMX-BF16, the AVX-512
/// level is on, and Linux granted this process the tile state (`arch_prctl`).
/// `LZ_CPU_SIMD=noamx` (or any cap below AVX-512) turns it off.
pub(crate) fn amx_bf16() -> bool {
    static AMX: OnceLock<bool> = OnceLock::new();
    *AMX.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            let cpu = raw_cpuid::CpuId::new()
                .get_extended_feature_info()
                .is_some_and(|f| f.has_amx_tile() && f.has_amx_bf16());
            cpu && avx512_bf16()
                && is_x86_feature_detected!("avx512vl")
                && std::env::var("LZ_CPU_SIMD").map_or(true, |v| v != "noamx")
                && x86::request_amx()
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            false
        }
    })
}

/// bf16 bits of `x`, round to nearest even; NaN keeps its sign and becomes quiet.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    if x.is_nan() { ((b >> 16) as u16) | 0x0040 } else { rounded }
}

#[inline(always)]
fn f32_to_bf16_bits_impl(src: &[f32], dst: &mut [u16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = bf16_bits(x);
    }
}

multiversion! {
    /// f32 to bf16 bits, round to nearest even (NaN stays NaN).
    fn f32_to_bf16_bits(src: &[f32], dst: &mut [u16]) => f32_to_bf16_bits_impl;
}

#[inline(always)]
fn f32_to_bf16_impl(src: &[f32], dst: &mut [half::bf16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = half::bf16::from_bits(bf16_bits(x));
    }
}

multiversion! {
    /// f32 to bf16, round to nearest even (as `half::bf16::from_f32`).
    fn f32_to_bf16(src: &[f32], dst: &mut [half::bf16]) => f32_to_bf16_impl;
}

/// [`softmax_tile`] for the bf16 tile path: the probabilities go to `pb` as bf16 (row
/// stride `ldp`, `kw >= w` columns, zeros outside each row's range) and are computed with a
/// cheaper exponential (relative error 3e-6, far below bf16's 2^-9); `s` is only read.
/// Only callable when [`amx_bf16`] is true.
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
    assert!(amx_bf16(), "softmax_tile_bf16 needs AMX (AVX512_BF16)");
    assert!(kw >= w && ldp >= kw && lds >= w);
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(unsafe_code)]
        // SAFETY: `amx_bf16()` (asserted above) detected AVX-512F/BW/VL and AVX512_BF16.
        unsafe {
            x86::softmax_tile_bf16_avx512(s, lds, w, rows, o, ldo, dv, pb, ldp, kw)
        };
    }
}

/// Columns per B panel of [`gemm_amx_bf16`] (16-column panels, whose tile loads are
/// contiguous, measured slower here).
pub(crate) const AMX_PANEL: usize = 64;

/// `C (+)= A . B` on AMX tiles. A is row-major bf16 bits, `m` rows of `lda` elements (the
/// first `2 * k2` used); B is in 16-column panels, panel `q` at `b[q * pstride..]` holding
/// `k2` rows of 16 `u32` pairs (low half: B[2p][n], high: B[2p+1][n]); C is f32 with `ldc`.
/// `m`, `n` and `k2` must be multiples of 16. Only callable when [`amx_bf16`] is true.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_amx_bf16(
    m: usize,
    n: usize,
    k2: usize,
    a: &[u16],
    lda: usize,
    b: &[u32],
    pstride: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    assert!(amx_bf16(), "gemm_amx_bf16 needs AMX");
    assert!(
        m.is_multiple_of(16) && n.is_multiple_of(16) && k2.is_multiple_of(16),
        "gemm_amx_bf16: m, n, k2 must be multiples of 16"
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(ldc >= n && c.len() >= (m - 1) * ldc + n, "gemm_amx_bf16: C too short");
    if k2 == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(0.0);
            }
        }
        return;
    }
    assert!(lda >= 2 * k2 && a.len() >= (m - 1) * lda + 2 * k2, "gemm_amx_bf16: A too short");
    let last = (n - 1) / AMX_PANEL;
    assert!(pstride >= k2 * AMX_PANEL && b.len() >= last * pstride + k2 * AMX_PANEL, "gemm_amx_bf16: B too short");
    #[cfg(target_arch = "x86_64")]
    x86::gemm_amx(m, n, k2, a, lda, b, pstride, c, ldc, accumulate);
}

/// A strided region for a kernel to bring into L2 while it computes: `rows` pieces of
/// `len` elements, `stride` apart, from the start of a slice that holds them all.
#[derive(Clone, Copy)]
pub(crate) struct Prefetch<'a> {
    base: *const u8,
    rows: usize,
    len: usize,
    stride: usize,
    _data: std::marker::PhantomData<&'a [u8]>,
}

impl<'a> Prefetch<'a> {
    /// `rows` pieces of `len` elements of `data`, `stride` elements apart (nothing when
    /// they would reach past its end).
    pub(crate) fn rows<T>(data: &'a [T], rows: usize, len: usize, stride: usize) -> Self {
        let size = std::mem::size_of::<T>();
        let fits = rows == 0 || (rows - 1) * stride + len <= data.len();
        let rows = if fits { rows } else { 0 };
        Prefetch { base: data.as_ptr().cast(), rows, len: len * size, stride: stride * size, _data: Default::default() }
    }

    /// All of `data`.
    pub(crate) fn all<T>(data: &'a [T]) -> Self {
        Self::rows(data, 1, data.len(), 0)
    }

    /// Cache lines (64 bytes) in the region.
    fn lines(&self) -> usize {
        self.rows * self.len.div_ceil(64)
    }

    /// The address of line `l < self.lines()` (inside the slice given).
    fn line(&self, l: usize) -> *const u8 {
        let per = self.len.div_ceil(64);
        self.base.wrapping_add((l / per) * self.stride + 64 * (l % per))
    }
}

/// Elements (u16) of one A tile of [`gemm_amx_bf16_tiles`]: 16 rows of 32 bf16.
pub(crate) const AMX_A_TILE: usize = 512;
/// Elements (u32) of one B tile of [`gemm_amx_bf16_tiles`]: 16 pair rows of 16 columns.
pub(crate) const AMX_B_TILE: usize = 256;

/// `C (+)= A . B` on AMX tiles with both operands packed in tile order, so that every tile
/// load reads 1 KiB of contiguous memory (the GEMM of wide operands, where strided tile
/// rows measured up to 1.7x slower). A is `mt` row tiles of `kt` K steps: tile (i, s), rows
/// 16 i.. and bf16 columns 32 s.., is row-major at `a[(i * kt + s) * AMX_A_TILE..]`. B is
/// `nt` column tiles, each `16 kt` pair rows of 16 `u32` (low half B[2p][n], high
/// B[2p + 1][n]) at `b[j * kt * AMX_B_TILE..]`. C is f32 [16 mt, 16 nt] with row stride
/// `ldc`. `prefetch` (any regions, may be none) is brought into L2 a few lines per K step,
/// so that the caller's next operand arrives while the tiles compute. Only callable when
/// [`amx_bf16`] is true.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_amx_bf16_tiles(
    mt: usize,
    nt: usize,
    kt: usize,
    a: &[u16],
    b: &[u32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    prefetch: &[Prefetch],
) {
    assert!(amx_bf16(), "gemm_amx_bf16_tiles needs AMX");
    if mt == 0 || nt == 0 {
        return;
    }
    assert!(ldc >= 16 * nt && c.len() >= (16 * mt - 1) * ldc + 16 * nt, "gemm_amx_bf16_tiles: C too short");
    if kt == 0 {
        if !accumulate {
            for i in 0..16 * mt {
                c[i * ldc..i * ldc + 16 * nt].fill(0.0);
            }
        }
        return;
    }
    assert!(
        a.len() >= mt * kt * AMX_A_TILE && b.len() >= nt * kt * AMX_B_TILE,
        "gemm_amx_bf16_tiles: A or B too short"
    );
    #[cfg(target_arch = "x86_64")]
    x86::gemm_amx_tiles(mt, nt, kt, a, b, c, ldc, accumulate, prefetch);
}

/// One AMX B tile from bf16 rows: `dst[16 q + c] = src[c ld + 2 q] | src[c ld + 2 q + 1] << 16`
/// for the `rows <= 16` rows and `cols <= 32` columns of `src` (row c at `c * ld`), zero
/// elsewhere; `dst` holds 256 pairs. AVX-512 transposes full 16 x 32 blocks in registers.
pub(crate) fn pair_tile(src: &[u16], ld: usize, rows: usize, cols: usize, dst: &mut [u32]) {
    assert!(rows <= 16 && cols <= 32 && dst.len() >= 256, "pair_tile: block too large");
    assert!(rows == 0 || src.len() >= (rows - 1) * ld + cols, "pair_tile: source too short");
    #[cfg(target_arch = "x86_64")]
    if rows == 16 && cols == 32 && level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected; the asserts above cover the 16 rows of 32
        // elements read and the 256 pairs written.
        unsafe {
            x86::pair_tile_16x32(src, ld, dst)
        };
        return;
    }
    dst[..256].fill(0);
    for c in 0..rows {
        for (e, &v) in src[c * ld..c * ld + cols].iter().enumerate() {
            dst[16 * (e / 2) + c] |= u32::from(v) << (16 * (e % 2));
        }
    }
}

/// `dst[i][off + j] = bf16(c[j * ldc + i] (+ bias[j]))` for `i < dst.len()`, `j < nb`: an
/// f32 block `c` [nb, ldc] written transposed into output rows, rounded once (as
/// `bf16::from_f32`). AVX-512 transposes 16 x 16 blocks in registers.
pub(crate) fn transpose_round_bf16(
    c: &[f32],
    ldc: usize,
    nb: usize,
    bias: Option<&[f32]>,
    dst: &mut [&mut [half::bf16]],
    off: usize,
) {
    let rows = dst.len();
    if rows == 0 || nb == 0 {
        return;
    }
    assert!(ldc >= rows && c.len() >= (nb - 1) * ldc + rows, "transpose_round_bf16: C too short");
    assert!(bias.is_none_or(|b| b.len() >= nb), "transpose_round_bf16: bias too short");
    assert!(dst.iter().all(|d| d.len() >= off + nb), "transpose_round_bf16: rows too short");
    let (mut i0, mut j_done) = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        let jb = nb / 16 * 16;
        while i0 + 16 <= rows {
            for j0 in (0..jb).step_by(16) {
                #[allow(unsafe_code)]
                // SAFETY: AVX-512F was detected; the asserts above keep every access of
                // the block (rows i0..i0 + 16 of dst, columns j0..j0 + 16) in bounds.
                unsafe {
                    x86::transpose_round_bf16_16x16(c, ldc, i0, j0, bias, &mut dst[i0..i0 + 16], off)
                };
            }
            i0 += 16;
        }
        j_done = jb;
    }
    // What the blocks left: rows i0.. (all columns), and columns j_done.. of rows ..i0.
    for (i, d) in dst.iter_mut().enumerate() {
        let j_start = if i < i0 { j_done } else { 0 };
        for j in j_start..nb {
            let v = c[j * ldc + i] + bias.map_or(0.0, |b| b[j]);
            d[off + j] = half::bf16::from_bits(bf16_bits(v));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Packed f32 GEMM tile: the microkernel of the cache-blocked GEMM in `linear.rs`.

/// Rows of a [`gemm_tile_packed`] tile (the broadcast operand).
pub(crate) const TILE_MR: usize = 12;
/// Columns of a [`gemm_tile_packed`] tile (two 16-lane vectors).
pub(crate) const TILE_NR: usize = 32;

/// `C (+)= A . B` for one tile of up to `TILE_MR` x `TILE_NR`: `a` is a packed A panel
/// (`kc` steps of `TILE_MR` row values, `a[p * TILE_MR + i]` = A[i][p]), `b` a packed B
/// panel (`kc` steps of `TILE_NR` column values, `b[p * TILE_NR + j]` = B[p][j]); `c`
/// holds the tile's rows (at most `TILE_MR`), updated at columns `j0..j0 + nr`. Rows of
/// the panels past `c.len()` and columns past `nr` are computed and dropped (pad them with
/// anything finite or not: lanes are independent). The sums run over p in order, per
/// element, in registers; C is read and written once, or (`overwrite`) written only.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_tile_packed(
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: &mut [&mut [f32]],
    j0: usize,
    nr: usize,
    overwrite: bool,
) {
    assert!(a.len() >= kc * TILE_MR && b.len() >= kc * TILE_NR, "gemm_tile_packed: panels too short");
    assert!(c.len() <= TILE_MR && nr <= TILE_NR, "gemm_tile_packed: tile too large");
    assert!(c.iter().all(|r| r.len() >= j0 + nr), "gemm_tile_packed: C rows too short");
    if nr == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected on this CPU; the asserts above are the kernel's
        // bounds.
        unsafe {
            x86::tile_packed_avx512::<TILE_MR, { TILE_NR / 16 }>(kc, a, b, c, j0, nr, overwrite)
        };
        return;
    }
    for (i, row) in c.iter_mut().enumerate() {
        for (j, out) in row[j0..j0 + nr].iter_mut().enumerate() {
            let mut s = 0f32;
            for p in 0..kc {
                s = a[p * TILE_MR + i].mul_add(b[p * TILE_NR + j], s);
            }
            *out = if overwrite { s } else { *out + s };
        }
    }
}

/// `dst[i * ldd + j] = src[j * lds + i]` for i, j < 16: one 16 x 16 f32 block transposed
/// (AVX-512 shuffles in registers; scalar elsewhere).
pub(crate) fn transpose_16x16(src: &[f32], lds: usize, dst: &mut [f32], ldd: usize) {
    assert!(src.len() >= 15 * lds + 16 && dst.len() >= 15 * ldd + 16, "transpose_16x16: operands too short");
    #[cfg(target_arch = "x86_64")]
    if level() == Level::Avx512 {
        #[allow(unsafe_code)]
        // SAFETY: AVX-512F was detected on this CPU; the assert above is the kernel's bound.
        unsafe {
            x86::transpose_16x16_avx512(src, lds, dst, ldd)
        };
        return;
    }
    for i in 0..16 {
        for j in 0..16 {
            dst[i * ldd + j] = src[j * lds + i];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The 16 x 16 block of `transpose_round_bf16` at rows `i0..` of C's columns and
    /// columns `j0..` of C's rows; `dst` holds the 16 output rows.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) fn transpose_round_bf16_16x16(
        c: &[f32],
        ldc: usize,
        i0: usize,
        j0: usize,
        bias: Option<&[f32]>,
        dst: &mut [&mut [half::bf16]],
        off: usize,
    ) {
        let r: [__m512; 16] = std::array::from_fn(|j| {
            // SAFETY: the caller checked that c holds rows j0..j0 + 16 up to column i0 + 16.
            unsafe { _mm512_loadu_ps(c.as_ptr().add((j0 + j) * ldc + i0)) }
        });
        let cols = transpose16(r);
        let bias = bias.map(|b| {
            // SAFETY: the caller checked bias.len() >= j0 + 16.
            unsafe { _mm512_loadu_ps(b.as_ptr().add(j0)) }
        });
        let (half, lsb, quiet, abs, inf) = (
            _mm512_set1_epi32(0x7fff),
            _mm512_set1_epi32(1),
            _mm512_set1_epi32(0x40),
            _mm512_set1_epi32(0x7fff_ffff),
            _mm512_set1_epi32(0x7f80_0000),
        );
        for (i, &o) in cols.iter().enumerate() {
            let o = match bias {
                Some(b) => _mm512_add_ps(o, b),
                None => o,
            };
            // Round to nearest even on the bits; NaN made quiet (as `bf16_bits`).
            let b = _mm512_castps_si512(o);
            let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), lsb);
            let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(b, _mm512_add_epi32(half, odd)));
            let nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, abs), inf);
            let bits = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(_mm512_srli_epi32::<16>(b), quiet));
            let row = &mut dst[i];
            // SAFETY: the caller checked row.len() >= off + j0 + 16 (32 bytes stored).
            unsafe { _mm256_storeu_si256(row.as_mut_ptr().add(off + j0).cast(), _mm512_cvtepi32_epi16(bits)) };
        }
    }

    /// [`super::sums_bf16_dp`] on this CPU.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) fn sums_bf16_dp(x: &[half::bf16]) -> (f64, f64) {
        const BLOCK: usize = 512;
        let bits: &[u16] = half::slice::HalfFloatSliceExt::reinterpret_cast(x);
        // SAFETY: `__m512i` and `__m512bh` are both 512-bit vectors of plain bits.
        let bh = |v: __m512i| -> __m512bh { unsafe { std::mem::transmute(v) } };
        // bf16 1.0 in every element: x . 1 sums the pairs.
        let ones = bh(_mm512_set1_epi16(0x3f80));
        // f64 sums of the blocks, 8 lanes each (reduced once at the end).
        let (mut s, mut q) = (_mm512_setzero_pd(), _mm512_setzero_pd());
        let widen = |acc: __m512d, v: __m512| {
            let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
            let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))));
            _mm512_add_pd(acc, _mm512_add_pd(lo, hi))
        };
        for blk in bits.chunks(BLOCK) {
            let (mut s0, mut q0, mut s1, mut q1) =
                (_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps());
            let (pairs, tail) = blk.as_chunks::<64>();
            for p in pairs {
                // SAFETY: `p` is 64 elements (128 bytes): two unaligned 64-byte loads.
                let (a, b) =
                    unsafe { (_mm512_loadu_si512(p.as_ptr().cast()), _mm512_loadu_si512(p.as_ptr().add(32).cast())) };
                let (a, b) = (bh(a), bh(b));
                s0 = _mm512_dpbf16_ps(s0, a, ones);
                q0 = _mm512_dpbf16_ps(q0, a, a);
                s1 = _mm512_dpbf16_ps(s1, b, ones);
                q1 = _mm512_dpbf16_ps(q1, b, b);
            }
            for piece in tail.chunks(32) {
                // Masked: elements past the row read as zero.
                let mask: u32 = if piece.len() == 32 { u32::MAX } else { (1u32 << piece.len()) - 1 };
                // SAFETY: the mask keeps the load inside `piece`.
                let a = unsafe { _mm512_maskz_loadu_epi16(mask, piece.as_ptr().cast()) };
                let a = bh(a);
                s0 = _mm512_dpbf16_ps(s0, a, ones);
                q0 = _mm512_dpbf16_ps(q0, a, a);
            }
            s = widen(s, _mm512_add_ps(s0, s1));
            q = widen(q, _mm512_add_ps(q0, q1));
        }
        (_mm512_reduce_add_pd(s), _mm512_reduce_add_pd(q))
    }

    /// The 16 x 16 transpose of 32-bit lanes: `out[i]` lane `j` is `r[j]` lane `i`.
    #[target_feature(enable = "avx512f")]
    fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
        // Pairs of rows interleaved, then pairs of pairs: u[4g + q], lane L, holds output
        // row 4L + q at columns 4g..4g + 4.
        let t: [__m512; 16] = std::array::from_fn(|k| {
            let (a, b) = (r[k & !1], r[k | 1]);
            if k % 2 == 0 { _mm512_unpacklo_ps(a, b) } else { _mm512_unpackhi_ps(a, b) }
        });
        let u: [__m512; 16] = std::array::from_fn(|k| {
            let (g, q) = (k / 4, k % 4);
            let (a, b) = (_mm512_castps_pd(t[4 * g + q / 2]), _mm512_castps_pd(t[4 * g + 2 + q / 2]));
            _mm512_castpd_ps(if q % 2 == 0 { _mm512_unpacklo_pd(a, b) } else { _mm512_unpackhi_pd(a, b) })
        });
        let mut out = [_mm512_setzero_ps(); 16];
        for q in 0..4 {
            // The 4 x 4 transpose of 128-bit lanes.
            let v0 = _mm512_shuffle_f32x4::<0x44>(u[q], u[4 + q]);
            let v1 = _mm512_shuffle_f32x4::<0xEE>(u[q], u[4 + q]);
            let v2 = _mm512_shuffle_f32x4::<0x44>(u[8 + q], u[12 + q]);
            let v3 = _mm512_shuffle_f32x4::<0xEE>(u[8 + q], u[12 + q]);
            out[q] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
            out[4 + q] = _mm512_shuffle_f32x4::<0xDD>(v0, v2);
            out[8 + q] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
            out[12 + q] = _mm512_shuffle_f32x4::<0xDD>(v1, v3);
        }
        out
    }

    /// [`super::pair_tile`] for a full 16 x 32 block, after its checks.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) fn pair_tile_16x32(src: &[u16], ld: usize, dst: &mut [u32]) {
        let r: [__m512; 16] = std::array::from_fn(|c| {
            // SAFETY: the caller checked that src holds 16 rows of 32 elements, ld apart.
            unsafe { _mm512_loadu_ps(src.as_ptr().add(c * ld).cast()) }
        });
        for (q, row) in transpose16(r).iter().enumerate() {
            // SAFETY: the caller checked dst.len() >= 256.
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(16 * q).cast(), *row) };
        }
    }

    /// Rows per microkernel.
    const MR: usize = 6;

    /// Dispatches (rows, vectors) to the monomorphized microkernel.
    macro_rules! by_shape {
        ($kern:ident, $mr:expr, $nv:expr, ($($args:expr),*)) => {
            match ($mr, $nv) {
                (6, 4) => $kern::<6, 4>($($args),*),
                (6, 3) => $kern::<6, 3>($($args),*),
                (6, 2) => $kern::<6, 2>($($args),*),
                (6, 1) => $kern::<6, 1>($($args),*),
                (5, 4) => $kern::<5, 4>($($args),*),
                (5, 3) => $kern::<5, 3>($($args),*),
                (5, 2) => $kern::<5, 2>($($args),*),
                (5, 1) => $kern::<5, 1>($($args),*),
                (4, 4) => $kern::<4, 4>($($args),*),
                (4, 3) => $kern::<4, 3>($($args),*),
                (4, 2) => $kern::<4, 2>($($args),*),
                (4, 1) => $kern::<4, 1>($($args),*),
                (3, 4) => $kern::<3, 4>($($args),*),
                (3, 3) => $kern::<3, 3>($($args),*),
                (3, 2) => $kern::<3, 2>($($args),*),
                (3, 1) => $kern::<3, 1>($($args),*),
                (2, 4) => $kern::<2, 4>($($args),*),
                (2, 3) => $kern::<2, 3>($($args),*),
                (2, 2) => $kern::<2, 2>($($args),*),
                (2, 1) => $kern::<2, 1>($($args),*),
                (1, 4) => $kern::<1, 4>($($args),*),
                (1, 3) => $kern::<1, 3>($($args),*),
                (1, 2) => $kern::<1, 2>($($args),*),
                _ => $kern::<1, 1>($($args),*),
            }
        };
    }

    /// `x = exp(x scale - m)` (exactly 0 for -inf, NaN stays NaN), returning the sum.
    /// Cephes range reduction (n = round(x log2 e), r = x - n ln 2 in two parts), a
    /// degree-6 polynomial for e^r, and `vscalefps` for the 2^n (overflow gives inf, deep
    /// underflow 0).
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) fn exp_sub_sum_avx512(x: &mut [f32], scale: f32, m: f32) -> f32 {
        let n = x.len();
        let p = x.as_mut_ptr();
        let (vc, vm, log2e, floor) = (
            _mm512_set1_ps(scale),
            _mm512_set1_ps(-m),
            _mm512_set1_ps(std::f32::consts::LOG2_E),
            _mm512_set1_ps(-104.0),
        );
        let (ln2_hi, ln2_lo) = (_mm512_set1_ps(0.693_359_4), _mm512_set1_ps(-2.121_944_4e-4));
        let c = [
            _mm512_set1_ps(1.987_569_1e-4),
            _mm512_set1_ps(1.398_199_9e-3),
            _mm512_set1_ps(8.333_452e-3),
            _mm512_set1_ps(4.166_579_6e-2),
            _mm512_set1_ps(1.666_666_5e-1),
            _mm512_set1_ps(0.5),
        ];
        let one = _mm512_set1_ps(1.0);
        let mut sum = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let len = (n - i).min(16);
            let mask: u16 = if len == 16 { 0xFFFF } else { (1u16 << len) - 1 };
            // SAFETY: lanes i..i+len lie within `x`; masked-off lanes are not accessed.
            let v = unsafe { _mm512_maskz_loadu_ps(mask, p.add(i)) };
            // max(floor, y) returns y when y is NaN, so NaN propagates; -inf becomes -104,
            // whose e^x underflows to 0 below.
            let xc = _mm512_max_ps(floor, _mm512_fmadd_ps(v, vc, vm));
            let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(xc, log2e));
            let r = _mm512_fnmadd_ps(k, ln2_lo, _mm512_fnmadd_ps(k, ln2_hi, xc));
            let mut y = c[0];
            for &ci in &c[1..] {
                y = _mm512_fmadd_ps(y, r, ci);
            }
            let y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), one);
            let e = _mm512_maskz_mov_ps(mask, _mm512_scalef_ps(y, k));
            // SAFETY: as for the load.
            unsafe { _mm512_mask_storeu_ps(p.add(i), mask, e) };
            sum = _mm512_add_ps(sum, e);
            i += len;
        }
        _mm512_reduce_add_ps(sum)
    }

    /// e^(x scale - m) for the bf16 path: 2^t, t = x scale log2 e - m log2 e, a degree-4
    /// fit of 2^f on [-1/2, 1/2] (relative error 2.6e-6); writes bf16 bits, returns the sum.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
    fn exp_to_bf16_avx512(x: &[f32], scale: f32, m: f32, out: &mut [u16]) -> f32 {
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

    /// The largest element of `x` (-inf when empty; NaN lanes are skipped).
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) fn row_max_avx512(x: &[f32]) -> f32 {
        let (n, p) = (x.len(), x.as_ptr());
        let mut acc = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i < n {
            let len = (n - i).min(16);
            let mask: u16 = if len == 16 { 0xFFFF } else { (1u16 << len) - 1 };
            // SAFETY: lanes i..i+len lie within `x`; masked-off lanes are not accessed.
            let v = unsafe { _mm512_mask_loadu_ps(acc, mask, p.add(i)) };
            // max(v, acc) returns acc where v is NaN.
            acc = _mm512_max_ps(v, acc);
            i += len;
        }
        _mm512_reduce_max_ps(acc)
    }

    /// [`super::softmax_tile_bf16`] after its checks.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl,avx2,fma")]
    pub(super) fn softmax_tile_bf16_avx512(
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
            let m_new = m[r].max(scale * row_max_avx512(seg));
            if m_new == f32::NEG_INFINITY {
                prow[a..b].fill(0);
                continue;
            }
            let corr = super::exp_approx(m[r] - m_new);
            let sum = exp_to_bf16_avx512(seg, scale, m_new, &mut prow[a..b]);
            l[r] = l[r] * corr + sum;
            m[r] = m_new;
            if corr != 1.0 {
                super::scale_impl(&mut o[r * ldo..r * ldo + dv], corr);
            }
        }
    }

    /// [`super::softmax_tile`] with the AVX-512 exponential.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c")]
    pub(super) fn softmax_tile_avx512(
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
            |x| row_max_avx512(x),
            |x, c, m| exp_sub_sum_avx512(x, c, m),
        );
    }

    /// Dot products of each row of `q` (`d` wide) with `k`, four rows at a time.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) fn dots_avx512(q: &[f32], d: usize, k: &[f32], out: &mut [f32]) {
        let rows = out.len();
        assert!(q.len() >= rows * d && k.len() >= d);
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        let mut r = 0;
        while r < rows {
            let nr = (rows - r).min(4);
            let mut acc = [[_mm512_setzero_ps(); 2]; 4];
            let mut i = 0;
            let mut flip = 0;
            while i < d {
                let len = (d - i).min(16);
                let mask: u16 = if len == 16 { 0xFFFF } else { (1u16 << len) - 1 };
                // SAFETY: columns i..i+len < d of k and of rows r..r+nr of q (asserted above);
                // masked-off lanes are not accessed.
                let kv = unsafe { _mm512_maskz_loadu_ps(mask, kp.add(i)) };
                for (x, a) in acc.iter_mut().enumerate().take(nr) {
                    // SAFETY: as above.
                    let qv = unsafe { _mm512_maskz_loadu_ps(mask, qp.add((r + x) * d + i)) };
                    a[flip] = _mm512_fmadd_ps(qv, kv, a[flip]);
                }
                flip ^= 1;
                i += len;
            }
            for (x, a) in acc.iter().enumerate().take(nr) {
                out[r + x] = _mm512_reduce_add_ps(_mm512_add_ps(a[0], a[1]));
            }
            r += nr;
        }
    }

    /// [`super::transpose_16x16`] after its check.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) fn transpose_16x16_avx512(src: &[f32], lds: usize, dst: &mut [f32], ldd: usize) {
        assert!(src.len() >= 15 * lds + 16 && dst.len() >= 15 * ldd + 16);
        let r: [__m512; 16] = std::array::from_fn(|j| {
            // SAFETY: row j < 16 of the block, 16 floats at j lds (asserted).
            unsafe { _mm512_loadu_ps(src.as_ptr().add(j * lds)) }
        });
        for (i, &row) in transpose16(r).iter().enumerate() {
            // SAFETY: output row i < 16, 16 floats at i ldd (asserted).
            unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add(i * ldd), row) };
        }
    }

    /// K steps ahead that [`tile_packed_avx512`] prefetches B.
    const B_AHEAD: usize = 8;

    /// [`super::gemm_tile_packed`] after its checks, for R rows of NV vectors.
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) fn tile_packed_avx512<const R: usize, const NV: usize>(
        kc: usize,
        a: &[f32],
        b: &[f32],
        c: &mut [&mut [f32]],
        j0: usize,
        nr: usize,
        overwrite: bool,
    ) {
        // The bounds every access below relies on.
        assert!(a.len() >= kc * R && b.len() >= kc * NV * 16 && c.len() <= R && nr <= NV * 16);
        assert!(c.iter().all(|r| r.len() >= j0 + nr));
        // C comes from L3 or memory: its lines are requested now and used after the sums.
        for row in c.iter() {
            if nr > 0 && !overwrite {
                _mm_prefetch::<_MM_HINT_T0>(row[j0..].as_ptr().cast());
                _mm_prefetch::<_MM_HINT_T0>(row[j0 + nr - 1..].as_ptr().cast());
            }
        }
        let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        for _ in 0..kc {
            // B lines a few steps ahead into L1 (a prefetch never faults; past the panel it
            // fetches whatever follows).
            for v in 0..NV {
                _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(16 * NV * B_AHEAD + 16 * v).cast());
            }
            // SAFETY: step p (0..kc) reads a[p R..p R + R] and b[p 16 NV..(p + 1) 16 NV],
            // inside the panels (asserted); the pointers advance by one step each pass.
            unsafe {
                let bv: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(bp.add(16 * v)));
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.add(i));
                    for (x, &bvv) in row.iter_mut().zip(&bv) {
                        *x = _mm512_fmadd_ps(av, bvv, *x);
                    }
                }
                ap = ap.add(R);
                bp = bp.add(16 * NV);
            }
        }
        // Constant indices only (a dynamic index would keep `acc` in memory).
        for (i, sums) in acc.iter().enumerate() {
            let Some(row) = c.get_mut(i) else { break };
            let cp = row.as_mut_ptr();
            for (v, &x) in sums.iter().enumerate() {
                let lanes = nr.saturating_sub(16 * v).min(16);
                let mk: u16 = if lanes == 16 { 0xFFFF } else { (1u16 << lanes) - 1 };
                // SAFETY: the lanes j0 + 16 v.. + lanes <= j0 + nr lie inside the row
                // (asserted); masked-off lanes are not accessed.
                unsafe {
                    let p = cp.add(j0 + 16 * v);
                    let sum = if overwrite { x } else { _mm512_add_ps(_mm512_maskz_loadu_ps(mk, p), x) };
                    _mm512_mask_storeu_ps(p, mk, sum);
                }
            }
        }
    }

    /// Blocked driver over the AVX-512 microkernel (6 rows x up to 64 columns).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub(super) fn gemm_avx512(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        acc: bool,
    ) {
        let mut nb = 0;
        while nb < n {
            let nw = (n - nb).min(64);
            let nv = nw.div_ceil(16);
            let rem = nw - (nv - 1) * 16;
            let mask: u16 = if rem == 16 { 0xFFFF } else { (1u16 << rem) - 1 };
            let mut rb = 0;
            while rb < m {
                let mr = (m - rb).min(MR);
                let (a_s, b_s, c_s) = (&a[rb * lda..], &b[nb..], &mut c[rb * ldc + nb..]);
                by_shape!(micro_avx512, mr, nv, (k, a_s, lda, b_s, ldb, c_s, ldc, mask, acc));
                rb += mr;
            }
            nb += nw;
        }
    }

    /// C[MR x cols] (+)= A[MR x k] . B[k x cols], cols = (NV - 1) * 16 + popcount(mask).
    #[allow(clippy::too_many_arguments)]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    fn micro_avx512<const R: usize, const NV: usize>(
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        mask: u16,
        acc: bool,
    ) {
        let tail = mask.count_ones() as usize;
        let cols = (NV - 1) * 16 + tail;
        // The mask must be a run of low bits so that only columns < cols are touched.
        assert!(tail > 0 && (u32::from(mask) + 1).is_power_of_two());
        assert!(k > 0 && a.len() >= (R - 1) * lda + k && b.len() >= (k - 1) * ldb + cols);
        assert!(c.len() >= (R - 1) * ldc + cols);
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let mut accs = [[_mm512_setzero_ps(); NV]; R];
        // SAFETY: the asserts above bound every access: A reads rows i < R at columns p < k;
        // B reads rows p < k at columns < cols (the last vector is masked to `tail` lanes and
        // masked-off lanes are not accessed); C reads and writes rows i < R, columns < cols.
        unsafe {
            if acc {
                for (i, row) in accs.iter_mut().enumerate() {
                    for (v, x) in row.iter_mut().enumerate() {
                        let mk = if v + 1 == NV { mask } else { 0xFFFF };
                        *x = _mm512_maskz_loadu_ps(mk, cp.add(i * ldc + v * 16));
                    }
                }
            }
            for p in 0..k {
                let mut bv = [_mm512_setzero_ps(); NV];
                for (v, x) in bv.iter_mut().enumerate() {
                    let mk = if v + 1 == NV { mask } else { 0xFFFF };
                    *x = _mm512_maskz_loadu_ps(mk, bp.add(p * ldb + v * 16));
                }
                for (i, row) in accs.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*ap.add(i * lda + p));
                    for (x, &bvv) in row.iter_mut().zip(&bv) {
                        *x = _mm512_fmadd_ps(av, bvv, *x);
                    }
                }
            }
            for (i, row) in accs.iter().enumerate() {
                for (v, &x) in row.iter().enumerate() {
                    let mk = if v + 1 == NV { mask } else { 0xFFFF };
                    _mm512_mask_storeu_ps(cp.add(i * ldc + v * 16), mk, x);
                }
            }
        }
    }

    /// Asks Linux for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
    #[allow(unsafe_code)]
    pub(super) fn request_amx() -> bool {
        const ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
        const XFEATURE_XTILEDATA: i64 = 18;
        let ret: i64;
        // SAFETY: the arch_prctl system call with these arguments only changes this
        // process's permitted xstate features; it reads and writes no user memory. `syscall`
        // clobbers rcx and r11, declared here.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack)
            );
        }
        ret == 0
    }

    /// Tile configuration: palette 1, all eight tiles 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig([u8; 64]);

    const fn tile_config() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut t = 0;
        while t < 8 {
            c[16 + 2 * t] = 64;
            c[48 + t] = 16;
            t += 1;
        }
        TileConfig(c)
    }

    /// Accumulators tmm0-3 for one block of C: with `acc`, loaded from the four 16 x 16
    /// f32 blocks at `c` (rows `sc` bytes apart), else zeros.
    ///
    /// # Safety
    /// The tile configuration is loaded (16 rows of 64 bytes per tile) and, with `acc`,
    /// each of the four blocks is 16 readable rows of 16 floats, `sc` bytes apart.
    #[allow(unsafe_code)]
    #[inline(always)]
    unsafe fn start_c(acc: bool, c: [*mut f32; 4], sc: usize) {
        // SAFETY: the caller's contract above.
        unsafe {
            if acc {
                std::arch::asm!(
                    "tileloadd tmm0, [{c0} + {sc}*1]",
                    "tileloadd tmm1, [{c1} + {sc}*1]",
                    "tileloadd tmm2, [{c2} + {sc}*1]",
                    "tileloadd tmm3, [{c3} + {sc}*1]",
                    c0 = in(reg) c[0], c1 = in(reg) c[1], c2 = in(reg) c[2], c3 = in(reg) c[3],
                    sc = in(reg) sc,
                    options(nostack, readonly)
                );
            } else {
                std::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
            }
        }
    }

    /// [`super::gemm_amx_bf16`] after its checks: C blocks of 32 x 32 (tmm0-3) from A
    /// tiles (tmm4-5, 16 rows x 32 bf16) and B tiles (tmm6-7, 16 pair rows x 16 columns),
    /// 16 x 16 blocks at the edges.
    #[allow(clippy::too_many_arguments)]
    #[allow(unsafe_code)]
    pub(super) fn gemm_amx(
        m: usize,
        n: usize,
        k2: usize,
        a: &[u16],
        lda: usize,
        b: &[u32],
        pstride: usize,
        c: &mut [f32],
        ldc: usize,
        acc: bool,
    ) {
        // The checks every tile access below relies on.
        const BP: usize = super::AMX_PANEL;
        let last = n.saturating_sub(1) / BP;
        assert!(super::amx_bf16() && m.is_multiple_of(16) && n.is_multiple_of(16) && k2.is_multiple_of(16));
        assert!(m > 0 && n > 0 && k2 > 0 && ldc >= n && c.len() >= (m - 1) * ldc + n);
        assert!(lda >= 2 * k2 && a.len() >= (m - 1) * lda + 2 * k2);
        assert!(pstride >= k2 * BP && b.len() >= last * pstride + k2 * BP);
        let cfg = tile_config();
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let (sa, sb, sc) = (lda * 2, BP * 4, ldc * 4);
        // SAFETY: (for every block below) AMX is enabled (asserted); m, n, k2 are multiples
        // of 16, A holds m rows of lda >= 2 k2 elements, B the k2 rows of 16 u32 of every
        // panel up to column n, and C m rows of ldc >= n floats (asserted above). An A tile at (r, p) reads
        // rows r..r+16, elements 2p..2p+32 <= 2 k2; a B tile at (pair p, column j) reads
        // pair rows p..p+16 < k2 of panel j / 64, columns j % 64..+16 <= 64 and < n; a C
        // tile at (r, j) reads or writes rows r..r+16 <= m, columns j..j+16 <= n. The tile
        // registers are configured first and released last; no other code uses them.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        }
        let a_at = |r: usize, p: usize| ap.wrapping_add(r * lda + 2 * p);
        let b_at = |p: usize, j: usize| bp.wrapping_add((j / BP) * pstride + p * BP + j % BP);
        let c_at = |r: usize, j: usize| cp.wrapping_add(r * ldc + j);
        // Blocks of C: 32 x 32 (16 rows or columns at the edges).
        let mut r = 0;
        while r < m {
            let two_r = r + 32 <= m;
            let mut j = 0;
            while j < n {
                let two_c = j + 32 <= n;
                let blocks = [
                    c_at(r, j),
                    if two_c { c_at(r, j + 16) } else { c_at(r, j) },
                    if two_r { c_at(r + 16, j) } else { c_at(r, j) },
                    if two_r && two_c { c_at(r + 16, j + 16) } else { c_at(r, j) },
                ];
                // SAFETY: see above.
                unsafe { start_c(acc, blocks, sc) };
                let mut p = 0;
                while p < k2 {
                    let (a0, b0) = (a_at(r, p), b_at(p, j));
                    // SAFETY: see above.
                    unsafe {
                        match (two_r, two_c) {
                            (true, true) => std::arch::asm!(
                                "tileloadd tmm4, [{a0} + {sa}*1]",
                                "tileloadd tmm5, [{a1} + {sa}*1]",
                                "tileloadd tmm6, [{b0} + {sb}*1]",
                                "tileloadd tmm7, [{b1} + {sb}*1]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm1, tmm4, tmm7",
                                "tdpbf16ps tmm2, tmm5, tmm6",
                                "tdpbf16ps tmm3, tmm5, tmm7",
                                a0 = in(reg) a0, a1 = in(reg) a_at(r + 16, p), b0 = in(reg) b0,
                                b1 = in(reg) b_at(p, j + 16), sa = in(reg) sa, sb = in(reg) sb,
                                options(nostack, readonly)
                            ),
                            (true, false) => std::arch::asm!(
                                "tileloadd tmm4, [{a0} + {sa}*1]",
                                "tileloadd tmm5, [{a1} + {sa}*1]",
                                "tileloadd tmm6, [{b0} + {sb}*1]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm2, tmm5, tmm6",
                                a0 = in(reg) a0, a1 = in(reg) a_at(r + 16, p), b0 = in(reg) b0,
                                sa = in(reg) sa, sb = in(reg) sb,
                                options(nostack, readonly)
                            ),
                            (false, true) => std::arch::asm!(
                                "tileloadd tmm4, [{a0} + {sa}*1]",
                                "tileloadd tmm6, [{b0} + {sb}*1]",
                                "tileloadd tmm7, [{b1} + {sb}*1]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm1, tmm4, tmm7",
                                a0 = in(reg) a0, b0 = in(reg) b0, b1 = in(reg) b_at(p, j + 16),
                                sa = in(reg) sa, sb = in(reg) sb,
                                options(nostack, readonly)
                            ),
                            (false, false) => std::arch::asm!(
                                "tileloadd tmm4, [{a0} + {sa}*1]",
                                "tileloadd tmm6, [{b0} + {sb}*1]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                a0 = in(reg) a0, b0 = in(reg) b0, sa = in(reg) sa, sb = in(reg) sb,
                                options(nostack, readonly)
                            ),
                        }
                    }
                    p += 16;
                }
                // SAFETY: see above.
                unsafe {
                    std::arch::asm!("tilestored [{c0} + {sc}*1], tmm0", c0 = in(reg) c_at(r, j), sc = in(reg) sc, options(nostack));
                    if two_c {
                        std::arch::asm!("tilestored [{c1} + {sc}*1], tmm1", c1 = in(reg) c_at(r, j + 16), sc = in(reg) sc, options(nostack));
                    }
                    if two_r {
                        std::arch::asm!("tilestored [{c2} + {sc}*1], tmm2", c2 = in(reg) c_at(r + 16, j), sc = in(reg) sc, options(nostack));
                    }
                    if two_r && two_c {
                        std::arch::asm!("tilestored [{c3} + {sc}*1], tmm3", c3 = in(reg) c_at(r + 16, j + 16), sc = in(reg) sc, options(nostack));
                    }
                }
                j += if two_c { 32 } else { 16 };
            }
            r += if two_r { 32 } else { 16 };
        }
        // SAFETY: releases the tile state configured above.
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem));
        }
    }

    /// [`super::gemm_amx_bf16_tiles`] after its checks: C blocks of 2 x 2 tiles (tmm0-3)
    /// from two A tiles (tmm4-5) and two B tiles (tmm6-7) per K step, single tiles at the
    /// edges. Column blocks are the outer loop, so the two B column tiles (the narrow
    /// operand's, re-read once per row block) stay in L2 while A streams past.
    #[allow(clippy::too_many_arguments)]
    #[allow(unsafe_code)]
    pub(super) fn gemm_amx_tiles(
        mt: usize,
        nt: usize,
        kt: usize,
        a: &[u16],
        b: &[u32],
        c: &mut [f32],
        ldc: usize,
        acc: bool,
        prefetch: &[super::Prefetch],
    ) {
        const TA: usize = super::AMX_A_TILE;
        const TB: usize = super::AMX_B_TILE;
        const TILE_AHEAD: usize = 2;
        // The checks every tile access below relies on.
        assert!(super::amx_bf16() && mt > 0 && nt > 0 && kt > 0);
        assert!(ldc >= 16 * nt && c.len() >= (16 * mt - 1) * ldc + 16 * nt);
        assert!(a.len() >= mt * kt * TA && b.len() >= nt * kt * TB);
        let cfg = tile_config();
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        // Tile rows are 64 bytes apart in A and B; C rows ldc floats apart.
        let (st, sc) = (64usize, ldc * 4);
        // SAFETY: (for every block below) AMX is enabled (asserted); tile (i, s) of A reads
        // the 1 KiB at (i kt + s) TA < mt kt TA <= a.len(), tile (j, s) of B the 1 KiB at
        // (j kt + s) TB < nt kt TB <= b.len(); a C tile at row tile i, column tile j reads or
        // writes rows 16 i..16 i + 16 <= 16 mt, columns 16 j..16 j + 16 <= 16 nt <= ldc,
        // inside `c` (asserted above). The tile registers are configured first and released
        // last; no other code uses them.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        }
        let a_at = |i: usize| ap.wrapping_add(i * kt * TA);
        let b_at = |j: usize| bp.wrapping_add(j * kt * TB);
        let c_at = |i: usize, j: usize| cp.wrapping_add(16 * i * ldc + 16 * j);
        // Prefetch: the 64-byte lines of `prefetch`, spread evenly over the K steps.
        let steps = nt.div_ceil(2) * mt.div_ceil(2) * kt;
        let lines: usize = prefetch.iter().map(|p| p.lines()).sum();
        let mut regions = prefetch.iter().flat_map(|p| (0..p.lines()).map(move |l| p.line(l)));
        let per_step = lines.div_ceil(steps);
        let mut j = 0;
        while j < nt {
            let two_c = j + 2 <= nt;
            let mut i = 0;
            while i < mt {
                let two_r = i + 2 <= mt;
                // Edge blocks load and store their single tiles twice (same addresses).
                let (i1, j1) = (if two_r { i + 1 } else { i }, if two_c { j + 1 } else { j });
                // SAFETY: see above.
                unsafe { start_c(acc, [c_at(i, j), c_at(i, j1), c_at(i1, j), c_at(i1, j1)], sc) };
                let (mut a0, mut a1, mut b0, mut b1) = (a_at(i), a_at(i1), b_at(j), b_at(j1));
                // SAFETY: see above (a0..b1 walk the kt tiles of their row or column).
                unsafe {
                    std::arch::asm!(
                        "tileloadd tmm4, [{a0} + {st}*1]",
                        "tileloadd tmm6, [{b0} + {st}*1]",
                        "tileloadd tmm7, [{b1} + {st}*1]",
                        "tileloadd tmm5, [{a1} + {st}*1]",
                        a0 = in(reg) a0, a1 = in(reg) a1, b0 = in(reg) b0, b1 = in(reg) b1,
                        st = in(reg) st,
                        options(nostack, readonly)
                    );
                }
                for s in 1..=kt {
                    // Each step's products, with the next step's tiles loaded into each
                    // register as soon as its last product has been issued (tile registers
                    // are not renamed: a load waits for the products reading its register).
                    if s == kt {
                        // SAFETY: tile operations on registers loaded above.
                        unsafe {
                            std::arch::asm!(
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm1, tmm4, tmm7",
                                "tdpbf16ps tmm2, tmm5, tmm6",
                                "tdpbf16ps tmm3, tmm5, tmm7",
                                options(nostack, nomem)
                            );
                        }
                        break;
                    }
                    (a0, a1, b0, b1) =
                        (a0.wrapping_add(TA), a1.wrapping_add(TA), b0.wrapping_add(TB), b1.wrapping_add(TB));
                    // The two B tiles TILE_AHEAD steps ahead into L1 (a microbenchmark on
                    // L2-resident tiles ran up to 2.5x slower without; inside the linear GEMM,
                    // where the B pair is reused across row tiles, it measured within noise).
                    for l in 0..16 {
                        // SAFETY: a prefetch only hints the cache and never faults.
                        unsafe {
                            _mm_prefetch::<_MM_HINT_T0>(b0.wrapping_add(TILE_AHEAD * TB + 16 * l).cast());
                            _mm_prefetch::<_MM_HINT_T0>(b1.wrapping_add(TILE_AHEAD * TB + 16 * l).cast());
                        }
                    }
                    // SAFETY: see above; s < kt, so a0..b1 point at step s of their tiles.
                    unsafe {
                        std::arch::asm!(
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            "tileloadd tmm4, [{a0} + {st}*1]",
                            "tdpbf16ps tmm2, tmm5, tmm6",
                            "tileloadd tmm6, [{b0} + {st}*1]",
                            "tdpbf16ps tmm3, tmm5, tmm7",
                            "tileloadd tmm5, [{a1} + {st}*1]",
                            "tileloadd tmm7, [{b1} + {st}*1]",
                            a0 = in(reg) a0, a1 = in(reg) a1, b0 = in(reg) b0, b1 = in(reg) b1,
                            st = in(reg) st,
                            options(nostack, readonly)
                        );
                    }
                    for line in regions.by_ref().take(per_step) {
                        // SAFETY: a prefetch only hints the cache and never faults (the
                        // address is inside a slice given anyway).
                        unsafe { _mm_prefetch::<_MM_HINT_T1>(line.cast()) };
                    }
                }
                // SAFETY: see above. The duplicated edge tiles hold the same sums (their
                // products were computed from the same tiles), stored in order.
                unsafe {
                    std::arch::asm!(
                        "tilestored [{c3} + {sc}*1], tmm3",
                        "tilestored [{c2} + {sc}*1], tmm2",
                        "tilestored [{c1} + {sc}*1], tmm1",
                        "tilestored [{c0} + {sc}*1], tmm0",
                        c0 = in(reg) c_at(i, j), c1 = in(reg) c_at(i, j1),
                        c2 = in(reg) c_at(i1, j), c3 = in(reg) c_at(i1, j1),
                        sc = in(reg) sc,
                        options(nostack)
                    );
                }
                i += 2;
            }
            j += 2;
        }
        // SAFETY: releases the tile state configured above.
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem));
        }
    }

    /// Blocked driver over the AVX2 microkernel (6 rows x up to 16 columns).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn gemm_avx2(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        acc: bool,
    ) {
        let mut nb = 0;
        while nb < n {
            let nw = (n - nb).min(16);
            let nv = nw.div_ceil(8);
            let tail = nw - (nv - 1) * 8;
            let mut rb = 0;
            while rb < m {
                let mr = (m - rb).min(MR);
                let (a_s, b_s, c_s) = (&a[rb * lda..], &b[nb..], &mut c[rb * ldc + nb..]);
                by_shape!(micro_avx2, mr, nv, (k, a_s, lda, b_s, ldb, c_s, ldc, tail, acc));
                rb += mr;
            }
            nb += nw;
        }
    }

    /// C[MR x cols] (+)= A[MR x k] . B[k x cols], cols = (NV - 1) * 8 + tail.
    #[allow(clippy::too_many_arguments)]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx2,fma")]
    fn micro_avx2<const R: usize, const NV: usize>(
        k: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        tail: usize,
        acc: bool,
    ) {
        let cols = (NV - 1) * 8 + tail;
        assert!((1..=8).contains(&tail) && NV <= 2);
        assert!(k > 0 && a.len() >= (R - 1) * lda + k && b.len() >= (k - 1) * ldb + cols);
        assert!(c.len() >= (R - 1) * ldc + cols);
        let lanes: [i32; 8] = std::array::from_fn(|l| if l < tail { -1 } else { 0 });
        let full = tail == 8;
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let mut accs = [[_mm256_setzero_ps(); 2]; R];
        // SAFETY: the asserts above bound every access: A reads rows i < R at columns p < k;
        // B reads rows p < k at columns < cols (the last vector is a masked load touching only
        // `tail` lanes unless it is full); C reads and writes rows i < R, columns < cols.
        unsafe {
            let mk = _mm256_loadu_si256(lanes.as_ptr().cast());
            if acc {
                for (i, row) in accs.iter_mut().enumerate() {
                    for (v, x) in row.iter_mut().enumerate().take(NV) {
                        let src = cp.add(i * ldc + v * 8);
                        *x = if v + 1 == NV && !full { _mm256_maskload_ps(src, mk) } else { _mm256_loadu_ps(src) };
                    }
                }
            }
            for p in 0..k {
                let mut bv = [_mm256_setzero_ps(); 2];
                for (v, x) in bv.iter_mut().enumerate().take(NV) {
                    let src = bp.add(p * ldb + v * 8);
                    *x = if v + 1 == NV && !full { _mm256_maskload_ps(src, mk) } else { _mm256_loadu_ps(src) };
                }
                for (i, row) in accs.iter_mut().enumerate() {
                    let av = _mm256_set1_ps(*ap.add(i * lda + p));
                    for v in 0..NV {
                        row[v] = _mm256_fmadd_ps(av, bv[v], row[v]);
                    }
                }
            }
            for (i, row) in accs.iter().enumerate() {
                for (v, &x) in row.iter().enumerate().take(NV) {
                    let dst = cp.add(i * ldc + v * 8);
                    if v + 1 == NV && !full {
                        _mm256_maskstore_ps(dst, mk, x);
                    } else {
                        _mm256_storeu_ps(dst, x);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_round_bf16_matches_the_scalar_rounding() {
        let (nb, rows, ldc) = (50usize, 37usize, 40usize);
        let mut c: Vec<f32> = (0..nb * ldc).map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.0137).collect();
        (c[3], c[ldc + 5], c[17 * ldc + 20], c[2 * ldc]) = (f32::NAN, f32::INFINITY, -f32::NAN, 1e-40);
        let bias: Vec<f32> = (0..nb).map(|j| j as f32 * 0.25 - 3.0).collect();
        for b in [None, Some(&bias[..])] {
            let mut out = vec![vec![half::bf16::ZERO; nb + 3]; rows];
            let mut refs: Vec<&mut [half::bf16]> = out.iter_mut().map(|r| &mut r[..]).collect();
            transpose_round_bf16(&c, ldc, nb, b, &mut refs, 2);
            for (i, row) in out.iter().enumerate() {
                for j in 0..nb {
                    let want = half::bf16::from_f32(c[j * ldc + i] + b.map_or(0.0, |b| b[j]));
                    let got = row[2 + j];
                    assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{i} {j}");
                }
            }
        }
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn gemm_matches_the_portable_loops_on_odd_shapes() {
        let mut seed = 7u64;
        for &(m, n, k) in &[(1, 1, 1), (6, 64, 128), (7, 65, 3), (13, 130, 80), (64, 128, 96), (5, 17, 256), (2, 9, 1)]
        {
            for acc in [false, true] {
                let (lda, ldb, ldc) = (k + 3, n + 5, n + 2);
                let a: Vec<f32> = (0..m * lda).map(|_| lcg(&mut seed)).collect();
                let b: Vec<f32> = (0..k * ldb).map(|_| lcg(&mut seed)).collect();
                let c0: Vec<f32> = (0..m * ldc).map(|_| lcg(&mut seed)).collect();
                let mut c1 = c0.clone();
                let mut c2 = c0.clone();
                gemm(m, n, k, &a, lda, &b, ldb, &mut c1, ldc, acc);
                gemm_reference(m, n, k, &a, lda, &b, ldb, &mut c2, ldc, acc);
                for i in 0..m * ldc {
                    assert!((c1[i] - c2[i]).abs() < 1e-4, "{m}x{n}x{k} acc={acc} at {i}: {} vs {}", c1[i], c2[i]);
                }
                // Padding columns beyond n are untouched.
                for i in 0..m {
                    for j in n..ldc {
                        assert_eq!(c1[i * ldc + j], c0[i * ldc + j]);
                    }
                }
            }
        }
    }

    #[test]
    fn amx_gemm_matches_the_f32_gemm_on_bf16_values() {
        if !amx_bf16() {
            return;
        }
        let mut seed = 3u64;
        let bf = |x: f32| half::bf16::from_f32(x);
        for &(m, n, k2, acc) in
            &[(16usize, 16usize, 16usize, false), (48, 80, 32, true), (64, 160, 48, false), (32, 64, 16, true)]
        {
            let (lda, ldc) = (2 * k2 + 6, n + 4);
            let a: Vec<half::bf16> = (0..m * lda).map(|_| bf(lcg(&mut seed))).collect();
            // B as f32 k x n (row-major) and as 64-column pair panels.
            let bm: Vec<half::bf16> = (0..2 * k2 * n).map(|_| bf(lcg(&mut seed))).collect();
            let panels = n.div_ceil(AMX_PANEL);
            let pstride = k2 * AMX_PANEL + 8;
            let mut bp = vec![0u32; panels * pstride];
            for p in 0..k2 {
                for j in 0..n {
                    let (lo, hi) = (bm[2 * p * n + j].to_bits(), bm[(2 * p + 1) * n + j].to_bits());
                    bp[(j / AMX_PANEL) * pstride + p * AMX_PANEL + j % AMX_PANEL] =
                        u32::from(lo) | (u32::from(hi) << 16);
                }
            }
            let c0: Vec<f32> = (0..m * ldc).map(|_| lcg(&mut seed)).collect();
            let (mut c1, mut c2) = (c0.clone(), c0.clone());
            let a_bits: Vec<u16> = a.iter().map(|x| x.to_bits()).collect();
            gemm_amx_bf16(m, n, k2, &a_bits, lda, &bp, pstride, &mut c1, ldc, acc);
            let af: Vec<f32> = a.iter().map(|x| x.to_f32()).collect();
            let bf32: Vec<f32> = bm.iter().map(|x| x.to_f32()).collect();
            gemm_reference(m, n, 2 * k2, &af, lda, &bf32, n, &mut c2, ldc, acc);
            for i in 0..m * ldc {
                assert!((c1[i] - c2[i]).abs() < 1e-4, "{m}x{n}x{k2} at {i}: {} vs {}", c1[i], c2[i]);
            }
        }
    }

    #[test]
    fn exp_is_accurate_and_zero_for_minus_infinity() {
        let mut x: Vec<f32> = (-1000..=1000).map(|i| i as f32 * 0.087).collect();
        x.push(f32::NEG_INFINITY);
        x.push(f32::NEG_INFINITY);
        let orig = x.clone();
        let s = exp_sub_sum(&mut x, 0.0);
        let mut want = 0f64;
        for (y, &o) in x.iter().zip(&orig) {
            let e = f64::from(o).exp();
            want += e;
            if o < -87.0 {
                // Zero, or the (sub)normal value itself.
                assert!(*y >= 0.0 && *y < 2e-38, "exp({o}) = {y}");
            } else if o > 88.0 {
                assert!(*y > 1e38, "exp({o}) = {y}");
            } else {
                assert!((f64::from(*y) - e).abs() <= 3e-7 * e, "exp({o}) = {y}, want {e}");
            }
        }
        assert!(want > 1e38 || (f64::from(s) - want).abs() < 1e-5 * want);
        assert_eq!(x[x.len() - 1], 0.0);
        // The scalar form is 0 below -87.
        assert_eq!(exp_approx(-87.5), 0.0);
        assert_eq!(exp_approx(f32::NEG_INFINITY), 0.0);
        assert!(exp_approx(f32::NAN).is_nan());
        let mut nan = [f32::NAN, 0.0];
        assert!(exp_sub_sum(&mut nan, 0.0).is_nan());
    }

    #[test]
    fn reductions_and_dots() {
        let x: Vec<f32> = (0..37).map(|i| ((i * 7) % 11) as f32 - 3.0).collect();
        assert_eq!(row_max(&x), 7.0);
        assert_eq!(row_max(&[]), f32::NEG_INFINITY);
        let q: Vec<f32> = (0..3 * 41).map(|i| (i % 5) as f32).collect();
        let k: Vec<f32> = (0..41).map(|i| (i % 3) as f32).collect();
        let mut out = [0f32; 3];
        dots(&q, 41, &k, &mut out);
        for r in 0..3 {
            let want: f32 = (0..41).map(|i| q[r * 41 + i] * k[i]).sum();
            assert!((out[r] - want).abs() < 1e-3);
        }
        let mut y = vec![1f32; 19];
        axpy(&mut y, 2.0, &k[..19]);
        assert_eq!(y[2], 5.0);
        scale(&mut y, 0.5);
        assert_eq!(y[2], 2.5);
    }

    #[test]
    fn bf16_dot_sums_match_f64_sums_or_decline() {
        if !avx512_bf16() {
            assert!(sums_bf16_dp(&[half::bf16::ONE]).is_none());
            return;
        }
        let mut seed = 5;
        // Lengths around the 64-element steps, the 32-element tail and the 512 blocks.
        for n in [1usize, 31, 32, 33, 63, 64, 65, 511, 512, 513, 4096 + 37] {
            let x: Vec<half::bf16> = (0..n).map(|_| half::bf16::from_f32(lcg(&mut seed) * 3.0 + 0.5)).collect();
            let (s, q) = sums_bf16_dp(&x).expect("finite row");
            let ws: f64 = x.iter().map(|v| f64::from(v.to_f32())).sum();
            let wq: f64 = x.iter().map(|v| f64::from(v.to_f32()).powi(2)).sum();
            assert!((s - ws).abs() <= 1e-5 * wq.sqrt() * (n as f64).sqrt() + 1e-9, "n {n}: {s} vs {ws}");
            assert!((q - wq).abs() <= 2e-6 * wq, "n {n}: {q} vs {wq}");
        }
        // Squares past f32 and non-finite values are left to the f64 form.
        assert!(sums_bf16_dp(&[half::bf16::from_f32(1e30); 3]).is_none());
        assert!(sums_bf16_dp(&[half::bf16::ONE, half::bf16::NAN]).is_none());
        assert_eq!(sums_bf16_dp(&[]), Some((0.0, 0.0)));
    }
}
