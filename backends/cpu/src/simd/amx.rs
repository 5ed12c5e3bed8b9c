//! bf16 tile GEMM on AMX. Products of bf16 values are exact in f32 and AMX sums them in f32,
//! so for bf16 inputs this is the f32 GEMM at many times the rate.

use std::sync::OnceLock;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use super::avx512_bf16;

/// True when AMX bf16 tiles are usable: the CPU has AMX-TILE and AMX-BF16, the AVX-512
/// level is on, and Linux granted this process the tile state (`arch_prctl`).
/// `LAYERZERO_CPU_ISA` below `amx` turns it off.
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
                && super::cap() >= layerzero_core::hardware::cap::IsaCap::Amx
                && x86::request_amx()
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            false
        }
    })
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
    if panel_operands("gemm_amx_bf16", m, n, k2, a, lda, b, pstride, c, ldc, accumulate) {
        #[cfg(target_arch = "x86_64")]
        x86::gemm_amx(m, n, k2, a, lda, b, pstride, c, ldc, accumulate);
    }
}

/// The checks of a bf16 panel product (`m`, `n`, `k2` multiples of 16; A, B and C holding
/// what they must, panicking with `name` otherwise) and its trivial cases: `false` when
/// nothing is left to multiply (an empty C; K = 0, where C is zeroed unless accumulating).
#[allow(clippy::too_many_arguments)]
pub(super) fn panel_operands(
    name: &str,
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
) -> bool {
    assert!(
        m.is_multiple_of(16) && n.is_multiple_of(16) && k2.is_multiple_of(16),
        "{name}: m, n, k2 must be multiples of 16"
    );
    if m == 0 || n == 0 {
        return false;
    }
    assert!(ldc >= n && c.len() >= (m - 1) * ldc + n, "{name}: C too short");
    if k2 == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(0.0);
            }
        }
        return false;
    }
    assert!(lda >= 2 * k2 && a.len() >= (m - 1) * lda + 2 * k2, "{name}: A too short");
    let last = (n - 1) / AMX_PANEL;
    assert!(pstride >= k2 * AMX_PANEL && b.len() >= last * pstride + k2 * AMX_PANEL, "{name}: B too short");
    true
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

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
}
