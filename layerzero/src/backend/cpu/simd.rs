//! SIMD primitives of the fast CPU kernels, chosen once at run time: AVX-512 and AVX2
//! microkernels (intrinsics) for the tile products, and portable loops that the compiler
//! vectorizes inside `#[target_feature]` wrappers for everything else. This is the only
//! module of the `cpu` backend with `unsafe`: each block says why it is sound.
//!
//! `LZ_CPU_SIMD=avx2` or `LZ_CPU_SIMD=portable` caps the level (benchmarks, debugging).

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
    let mut acc = [0f32; 16];
    let mut chunks = x.chunks_exact_mut(16);
    for ch in &mut chunks {
        for l in 0..16 {
            let e = exp_approx(ch[l] - m);
            ch[l] = e;
            acc[l] += e;
        }
    }
    let mut s = 0f32;
    for v in chunks.into_remainder() {
        let e = exp_approx(*v - m);
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
        let r = unsafe { x86::exp_sub_sum_avx512(x, m) };
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
    /// The largest element (-inf when empty; NaN elements are skipped).
    fn row_max(x: &[f32]) -> f32 => row_max_impl;
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
// Online softmax over a score tile.

/// Per-row bookkeeping of an online softmax tile.
pub(crate) struct SoftmaxRows<'a> {
    /// Visible columns `[a, b)` of each row within the tile.
    pub ranges: &'a [(usize, usize)],
    /// Running max per row.
    pub m: &'a mut [f32],
    /// Running sum per row.
    pub l: &'a mut [f32],
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
    exp_sum: impl Fn(&mut [f32], f32) -> f32,
) {
    let SoftmaxRows { ranges, m, l } = rows;
    for (r, &(a, b)) in ranges.iter().enumerate() {
        let row = &mut s[r * lds..r * lds + w];
        if a >= b {
            row.fill(0.0);
            continue;
        }
        row[..a].fill(0.0);
        row[b..].fill(0.0);
        let seg = &mut row[a..b];
        let m_new = m[r].max(row_max_impl(seg));
        if m_new == f32::NEG_INFINITY {
            seg.fill(0.0);
            continue;
        }
        let corr = exp_approx(m[r] - m_new);
        let sum = exp_sum(seg, m_new);
        l[r] = l[r] * corr + sum;
        m[r] = m_new;
        if corr != 1.0 {
            scale_impl(&mut o[r * ldo..r * ldo + dv], corr);
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn softmax_tile_portable(
    s: &mut [f32],
    lds: usize,
    w: usize,
    rows: SoftmaxRows,
    o: &mut [f32],
    ldo: usize,
    dv: usize,
) {
    softmax_tile_body(s, lds, w, rows, o, ldo, dv, exp_sub_sum_impl);
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
pub(crate) fn softmax_tile(s: &mut [f32], lds: usize, w: usize, rows: SoftmaxRows, o: &mut [f32], ldo: usize, dv: usize) {
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
// bf16 pair GEMM (AVX512_BF16 `vdpbf16ps`): products of bf16 values are exact in f32, so
// for bf16 inputs this computes what the f32 GEMM would, at twice the rate.

/// True when the bf16 pair GEMM runs on this CPU (AVX-512 level and AVX512_BF16;
/// `LZ_CPU_SIMD=nobf16` turns it off).
pub(crate) fn bf16_dot() -> bool {
    static BF16: OnceLock<bool> = OnceLock::new();
    *BF16.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            level() == Level::Avx512
                && is_x86_feature_detected!("avx512bf16")
                && std::env::var("LZ_CPU_SIMD").map_or(true, |v| v != "nobf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

#[inline(always)]
fn f32_to_bf16_bits_impl(src: &[f32], dst: &mut [u16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let b = x.to_bits();
        let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
        *d = if x.is_nan() { 0x7FC0 } else { rounded };
    }
}

multiversion! {
    /// f32 to bf16 bits, round to nearest even (NaN stays NaN).
    fn f32_to_bf16_bits(src: &[f32], dst: &mut [u16]) => f32_to_bf16_bits_impl;
}

/// `C (+)= A . B` over bf16 pairs: A is row-major bf16 bits with `lda` (even) elements per
/// row and `2 * k2` columns; columns `64q..64q+64` of B are the panel at `b[q * pstride..]`,
/// `k2` rows of 64 `u32`, each the pair (B[2p][n] low, B[2p+1][n] high). Only callable
/// when [`bf16_dot`] is true.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_bf16_panels(
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
    assert!(bf16_dot(), "gemm_bf16_panels needs AVX512_BF16");
    assert!(lda % 2 == 0 && (m == 0 || k2 == 0 || a.len() >= (m - 1) * lda + 2 * k2), "gemm_bf16: A too short");
    assert!(m == 0 || n == 0 || (ldc >= n && c.len() >= (m - 1) * ldc + n), "gemm_bf16: C too short");
    if m == 0 || n == 0 {
        return;
    }
    if k2 == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(0.0);
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let mut q = 0;
        while q * PANEL < n {
            let nw = (n - q * PANEL).min(PANEL);
            assert!(b.len() >= q * pstride + (k2 - 1) * PANEL + nw, "gemm_bf16: B too short");
            #[allow(unsafe_code)]
            // SAFETY: `bf16_dot()` (asserted above) detected AVX-512F and AVX512_BF16.
            unsafe {
                x86::gemm_bf16_avx512(m, nw, k2, a, lda, &b[q * pstride..], c, q * PANEL, ldc, accumulate)
            };
            q += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

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

    /// `x = exp(x - m)` (exactly 0 for -inf), returning the sum: 2^t with t = (x - m) log2 e
    /// split into round(t) (applied by `vscalefps`) and a degree-6 polynomial on [-1/2, 1/2].
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f")]
    pub(super) fn exp_sub_sum_avx512(x: &mut [f32], m: f32) -> f32 {
        let n = x.len();
        let p = x.as_mut_ptr();
        let (vm, log2e, floor) =
            (_mm512_set1_ps(m), _mm512_set1_ps(std::f32::consts::LOG2_E), _mm512_set1_ps(-150.0));
        let c = [
            _mm512_set1_ps(1.540_353_e-4),
            _mm512_set1_ps(1.333_355_8e-3),
            _mm512_set1_ps(9.618_129e-3),
            _mm512_set1_ps(5.550_411e-2),
            _mm512_set1_ps(2.402_265e-1),
            _mm512_set1_ps(6.931_472e-1),
            _mm512_set1_ps(1.0),
        ];
        let mut sum = _mm512_setzero_ps();
        let mut i = 0;
        while i < n {
            let len = (n - i).min(16);
            let mask: u16 = if len == 16 { 0xFFFF } else { (1u16 << len) - 1 };
            // SAFETY: lanes i..i+len lie within `x`; masked-off lanes are not accessed.
            let v = unsafe { _mm512_maskz_loadu_ps(mask, p.add(i)) };
            // max(floor, t) returns t when t is NaN, so NaN propagates; -inf becomes 2^-150 = 0.
            let t = _mm512_max_ps(floor, _mm512_mul_ps(_mm512_sub_ps(v, vm), log2e));
            let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
            let f = _mm512_sub_ps(t, k);
            let mut y = c[0];
            for &ci in &c[1..] {
                y = _mm512_fmadd_ps(y, f, ci);
            }
            let e = _mm512_maskz_mov_ps(mask, _mm512_scalef_ps(y, k));
            // SAFETY: as for the load.
            unsafe { _mm512_mask_storeu_ps(p.add(i), mask, e) };
            sum = _mm512_add_ps(sum, e);
            i += len;
        }
        _mm512_reduce_add_ps(sum)
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
        super::softmax_tile_body(s, lds, w, rows, o, ldo, dv, |x, m| exp_sub_sum_avx512(x, m));
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

    /// One 64-column panel of [`super::gemm_bf16_panels`] (`nw` columns), written at column
    /// `c0` of C.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) fn gemm_bf16_avx512(
        m: usize,
        nw: usize,
        k2: usize,
        a: &[u16],
        lda: usize,
        b: &[u32],
        c: &mut [f32],
        c0: usize,
        ldc: usize,
        acc: bool,
    ) {
        let nv = nw.div_ceil(16);
        let rem = nw - (nv - 1) * 16;
        let mask: u16 = if rem == 16 { 0xFFFF } else { (1u16 << rem) - 1 };
        let mut rb = 0;
        while rb < m {
            let mr = (m - rb).min(MR);
            let (a_s, c_s) = (&a[rb * lda..], &mut c[rb * ldc + c0..]);
            by_shape!(micro_bf16, mr, nv, (k2, a_s, lda, b, c_s, ldc, mask, acc));
            rb += mr;
        }
    }

    /// C[R x cols] (+)= A[R x 2 k2] (bf16) . B[k2 pairs x cols], cols = (NV - 1) * 16 +
    /// popcount(mask); B rows are 64 `u32` apart.
    #[allow(clippy::too_many_arguments)]
    #[allow(unsafe_code)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn micro_bf16<const R: usize, const NV: usize>(
        k2: usize,
        a: &[u16],
        lda: usize,
        b: &[u32],
        c: &mut [f32],
        ldc: usize,
        mask: u16,
        acc: bool,
    ) {
        const LDB: usize = super::PANEL;
        let tail = mask.count_ones() as usize;
        let cols = (NV - 1) * 16 + tail;
        assert!(tail > 0 && (u32::from(mask) + 1).is_power_of_two());
        assert!(k2 > 0 && a.len() >= (R - 1) * lda + 2 * k2 && b.len() >= (k2 - 1) * LDB + cols);
        assert!(c.len() >= (R - 1) * ldc + cols);
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let mut accs = [[_mm512_setzero_ps(); NV]; R];
        // SAFETY: the asserts above bound every access: A reads the u32 pair at elements
        // 2p, 2p + 1 < 2 k2 of rows i < R (read unaligned); B reads rows p < k2 at columns
        // < cols (the last vector masked; masked-off lanes are not accessed); C reads and
        // writes rows i < R, columns < cols. `__m512i` and `__m512bh` are both 512 bits.
        unsafe {
            if acc {
                for (i, row) in accs.iter_mut().enumerate() {
                    for (v, x) in row.iter_mut().enumerate() {
                        let mk = if v + 1 == NV { mask } else { 0xFFFF };
                        *x = _mm512_maskz_loadu_ps(mk, cp.add(i * ldc + v * 16));
                    }
                }
            }
            for p in 0..k2 {
                let mut bv = [_mm512_setzero_si512(); NV];
                for (v, x) in bv.iter_mut().enumerate() {
                    let mk = if v + 1 == NV { mask } else { 0xFFFF };
                    *x = _mm512_maskz_loadu_epi32(mk, bp.add(p * LDB + v * 16).cast());
                }
                for (i, row) in accs.iter_mut().enumerate() {
                    let pair = ap.add(i * lda + 2 * p).cast::<u32>().read_unaligned();
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair as i32));
                    for (x, &bvv) in row.iter_mut().zip(&bv) {
                        *x = _mm512_dpbf16_ps(*x, av, std::mem::transmute::<__m512i, __m512bh>(bvv));
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
    fn exp_is_accurate_and_zero_for_minus_infinity() {
        let mut x: Vec<f32> = (-1000..=100).map(|i| i as f32 * 0.087).collect();
        x.push(f32::NEG_INFINITY);
        let orig = x.clone();
        let s = exp_sub_sum(&mut x, 0.0);
        let mut want = 0f64;
        for (y, &o) in x.iter().zip(&orig) {
            let e = f64::from(o).exp();
            want += e;
            if o < -87.0 {
                assert_eq!(*y, 0.0);
            } else {
                assert!((f64::from(*y) - e).abs() <= 3e-7 * e, "exp({o}) = {y}, want {e}");
            }
        }
        assert!((f64::from(s) - want).abs() < 1e-5 * want);
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
}

#[cfg(test)]
mod perf {
    #[test]
    #[ignore]
    fn gemm_speed() {
        // (m, n, k, ldb): ldb 64 is a packed panel; 256 / 128 are tile rows.
        for &(m, n, k, ldb) in &[(72usize, 64usize, 128usize, 64usize), (72, 64, 128, 256), (72, 64, 128, 128), (72, 64, 256, 64), (72, 64, 256, 128)] {
            let a = vec![0.5f32; m * k];
            let b = vec![0.25f32; k * ldb];
            let mut c = vec![0f32; m * n];
            let iters = 20000;
            let t = std::time::Instant::now();
            for _ in 0..iters {
                super::gemm(m, n, k, &a, k, &b, ldb, &mut c, n, true);
            }
            let s = t.elapsed().as_secs_f64();
            eprintln!("{m}x{n}x{k} ldb {ldb}: {:.1} GFLOP/s", (2 * m * n * k * iters) as f64 / s / 1e9);
        }
    }
}
