//! `moe` kernels of the `cpu` backend: `cpu.moe_route.fast` and `cpu.moe_experts.grouped`.
//!
//! `cpu.moe_route.fast`: rows in parallel; per row `exp(l - max)` in f32 with the sums in
//! f64, and the top_k by partial selection (`select_nth_unstable_by`) over the logits'
//! descending order, ties by lower index. The experts are exactly the reference's (the
//! order is decided on the logits, not on rounded probabilities) and the weights agree
//! with its f64 softmax to about 1e-7.
//!
//! `cpu.moe_experts.grouped`: the routed (token, slot) pairs are grouped by expert (a stable
//! counting sort); each expert's rows are split into panels of at most `ROWS` tokens, and
//! each panel, in parallel (rayon): gathers its token rows of x, then for blocks of `IB`
//! intermediate columns runs `G = X Wg^T`, `U = X Wu^T`, `A = act(G) * U`,
//! `Y += A Wd^T` with `matrixmultiply::sgemm` (f32; f32 weights are read in place through
//! their strides, f16/bf16 blocks are converted into a buffer). Finally every token sums
//! `weights[t, j] * Y[pair]` over its slots in slot order, in parallel over tokens, and the
//! f32 result is rounded once to x's dtype. The decomposition depends only on the shapes
//! and the routing, never on the thread count, so results are deterministic.

use std::cmp::Ordering;
use std::sync::Arc;

use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::pack::f32_cow;
use super::pack::invalid;
use super::wrong_op;
use layerzero_core::exec::args::{MoeExpertsArgs, MoeRouteArgs, OpArgs, Outputs};
use layerzero_core::exec::executor::{KernelError, Registry};
use layerzero_core::model::attrs::Activation;
use layerzero_core::model::dtype::DType;
use layerzero_core::tensor::{HostTensor, Storage};

/// Routing kernel id.
pub(crate) const MOE_ROUTE: &str = "cpu.moe_route.fast";
/// Expert MLP kernel id.
pub(crate) const MOE_EXPERTS: &str = "cpu.moe_experts.grouped";

/// Token rows per GEMM panel.
const ROWS: usize = 128;
/// Intermediate columns per block.
const IB: usize = 256;

/// Binds these kernels.
pub(crate) fn register(registry: &mut Registry) {
    registry.register(
        MOE_ROUTE,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::MoeRoute(a) => route(a),
            other => Err(wrong_op(MOE_ROUTE, other)),
        }),
    );
    registry.register(
        MOE_EXPERTS,
        Arc::new(|args: &OpArgs| match args {
            OpArgs::MoeExperts(a) => experts(a, ROWS, IB).map(|t| Outputs::from([("out", t)])),
            other => Err(wrong_op(MOE_EXPERTS, other)),
        }),
    );
}

fn failed(e: impl std::fmt::Display) -> KernelError {
    KernelError::Failed(format!("building the output: {e}"))
}

fn expect_rank(name: &str, t: &HostTensor, rank: usize, what: &str) -> Result<(), KernelError> {
    if t.rank() != rank {
        return Err(invalid(format!("tensor `{name}` has shape {:?} (rank {}); expected {what}", t.shape(), t.rank())));
    }
    Ok(())
}

fn expect_float(name: &str, t: &HostTensor) -> Result<(), KernelError> {
    if !t.dtype().is_float() {
        return Err(invalid(format!("tensor `{name}` has dtype {}; expected a float dtype", t.dtype())));
    }
    Ok(())
}

/// `cpu.moe_route.fast`.
fn route(a: &MoeRouteArgs) -> Result<Outputs, KernelError> {
    let logits = &a.logits;
    expect_rank("logits", logits, 2, "[tokens, experts]")?;
    expect_float("logits", logits)?;
    let (t, e) = (logits.shape()[0], logits.shape()[1]);
    let k = usize::try_from(a.attrs.top_k).ok().filter(|&k| k >= 1 && k <= e).ok_or_else(|| {
        invalid(format!(
            "attrs.top_k is {}; it must be in [1, {e}] (`logits` has shape {:?}: {e} experts)",
            a.attrs.top_k,
            logits.shape()
        ))
    })?;
    if i32::try_from(e).is_err() {
        return Err(KernelError::Unsupported(format!("{e} experts do not fit the i32 `experts` output")));
    }
    let data = f32_cow(logits);
    let mut experts = vec![0i32; t * k];
    let mut weights = vec![0f32; t * k];
    let renormalize = a.attrs.renormalize;
    let errors: Vec<Option<KernelError>> = experts
        .par_chunks_mut(k)
        .zip(weights.par_chunks_mut(k))
        .enumerate()
        .map_init(Vec::new, |idx, (row, (ex, wt))| {
            route_row(&data[row * e..(row + 1) * e], row, renormalize, idx, ex, wt).err()
        })
        .collect();
    if let Some(err) = errors.into_iter().flatten().next() {
        return Err(err);
    }
    let experts = HostTensor::new(Storage::I32(experts.into()), &[t, k]).map_err(failed)?;
    let weights = HostTensor::new(Storage::F32(weights.into()), &[t, k]).map_err(failed)?;
    Ok(Outputs::from([("experts", experts), ("weights", weights)]))
}

fn route_row(
    l: &[f32],
    row: usize,
    renormalize: bool,
    idx: &mut Vec<u32>,
    ex: &mut [i32],
    wt: &mut [f32],
) -> Result<(), KernelError> {
    let mut m = f32::NEG_INFINITY;
    for (j, &x) in l.iter().enumerate() {
        if x.is_nan() {
            return Err(invalid(format!("tensor `logits` is NaN at [{row}, {j}]")));
        }
        m = m.max(x);
    }
    if m == f32::NEG_INFINITY {
        return Err(invalid(format!("row {row} of tensor `logits` is all -inf; it routes to no expert")));
    }
    let weight = |x: f32| if m == f32::INFINITY { f32::from(u8::from(x == f32::INFINITY)) } else { (x - m).exp() };
    let k = ex.len();
    let cmp = |a: &u32, b: &u32| l[*b as usize].partial_cmp(&l[*a as usize]).unwrap_or(Ordering::Equal).then(a.cmp(b));
    idx.clear();
    idx.extend(0..l.len() as u32);
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx[..k].sort_unstable_by(cmp);
    let denom: f64 = if renormalize {
        idx[..k].iter().map(|&i| f64::from(weight(l[i as usize]))).sum()
    } else {
        l.iter().map(|&x| f64::from(weight(x))).sum()
    };
    for ((&i, e), w) in idx[..k].iter().zip(ex.iter_mut()).zip(wt.iter_mut()) {
        *e = i as i32;
        *w = (f64::from(weight(l[i as usize])) / denom) as f32;
    }
    Ok(())
}

/// The gated MLP's activation (computed in f64, stored in f32).
fn activate(act: Activation, x: f32) -> f32 {
    let x = f64::from(x);
    let y = match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::Gelu => 0.5 * x * f64::from(super::math::erfc_f32((-x / std::f64::consts::SQRT_2) as f32)),
        Activation::GeluTanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        }
    };
    y as f32
}

/// `c = a b + beta c` (f32) for an m x k matrix `a`, k x n `b` and m x n `c`, each given
/// as a slice and element strides; every element must lie inside its slice and `c` must
/// be laid out row-major with unit column stride (so no two elements of `c` overlap).
#[allow(clippy::too_many_arguments)]
#[allow(unsafe_code)]
fn gemm(
    (m, k, n): (usize, usize, usize),
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    (rsb, csb): (usize, usize),
    beta: f32,
    c: &mut [f32],
    rsc: usize,
) -> Result<(), KernelError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| {
        (rows - 1).checked_mul(rs).and_then(|x| (cols.max(1) - 1).checked_mul(cs).and_then(|y| x.checked_add(y)))
    };
    let inside = |len: usize, l: Option<usize>| l.is_some_and(|l| l < len);
    if k == 0
        || !inside(a.len(), last(m, k, rsa, csa))
        || !inside(b.len(), last(k, n, rsb, csb))
        || !inside(c.len(), last(m, n, rsc, 1))
        || rsc < n
    {
        return Err(KernelError::Failed(format!(
            "internal GEMM bounds: m {m} k {k} n {n}, a {} ({rsa}, {csa}), b {} ({rsb}, {csb}), c {} ({rsc}, 1)",
            a.len(),
            b.len(),
            c.len()
        )));
    }
    let s = |x: usize| isize::try_from(x).map_err(|_| KernelError::Failed(format!("stride {x} overflows isize")));
    let (rsa, csa, rsb, csb, rsc) = (s(rsa)?, s(csa)?, s(rsb)?, s(csb)?, s(rsc)?);
    // SAFETY: sgemm reads a[i * rsa + p * csa] (i < m, p < k) and b[p * rsb + j * csb]
    // (p < k, j < n), and reads/writes c[i * rsc + j] (i < m, j < n). The checks above put
    // the largest of each inside its slice (all strides are non-negative), `c` is borrowed
    // exclusively so it aliases neither input, and rsc >= n keeps its elements distinct, so
    // the threads sgemm may use never write the same element.
    unsafe {
        matrixmultiply::sgemm(m, k, n, 1.0, a.as_ptr(), rsa, csa, b.as_ptr(), rsb, csb, beta, c.as_mut_ptr(), rsc, 1);
    }
    Ok(())
}

/// A [E, R, C] weight tensor from which 2-D blocks of one expert are taken as f32.
struct Weights<'a> {
    t: &'a HostTensor,
}

impl Weights<'_> {
    /// Rows `r0..r0 + nr`, columns `c0..c0 + nc` of expert `e` as (slice, row stride,
    /// column stride): f32 storage in place, other dtypes converted into `buf` (row-major).
    fn block<'b>(
        &'b self,
        e: usize,
        (r0, nr): (usize, usize),
        (c0, nc): (usize, usize),
        buf: &'b mut Vec<f32>,
    ) -> Result<(&'b [f32], usize, usize), KernelError> {
        let st = self.t.strides();
        let (s0, s1, s2) = (st[0], st[1], st[2]);
        let base = self.t.offset() + e * s0 + r0 * s1 + c0 * s2;
        let last = base + (nr.max(1) - 1) * s1 + (nc.max(1) - 1) * s2;
        let storage = self.t.storage();
        if last >= storage.len() {
            return Err(KernelError::Failed(format!("internal: weight block reaches {last} of {}", storage.len())));
        }
        if let Storage::F32(v) = storage {
            return Ok((&v[base..], s1, s2));
        }
        buf.clear();
        buf.resize(nr * nc, 0.0);
        for (r, dst) in buf.chunks_exact_mut(nc.max(1)).enumerate().take(nr) {
            let rb = base + r * s1;
            match storage {
                Storage::F16(v) if s2 == 1 => v[rb..rb + nc].convert_to_f32_slice(dst),
                Storage::BF16(v) if s2 == 1 => v[rb..rb + nc].convert_to_f32_slice(dst),
                _ => {
                    for (c, d) in dst.iter_mut().enumerate() {
                        *d = storage.get_f32(rb + c * s2);
                    }
                }
            }
        }
        Ok((buf.as_slice(), nc, 1))
    }
}

/// `cpu.moe_experts.grouped` with `rows` tokens per panel and `ib` intermediate columns
/// per block.
fn experts(a: &MoeExpertsArgs, rows: usize, ib: usize) -> Result<HostTensor, KernelError> {
    // What makes MoE arguments valid is defined once, in the core (`MoeExpertsArgs::dims`).
    let d = a.dims()?;
    let (tokens, hidden, slots, n_exp, inter) = (d.tokens, d.hidden, d.slots, d.experts, d.inter);
    let ids = match a.experts.dtype() {
        DType::I32 | DType::I64 => a.experts.to_i64_vec(),
        other => return Err(invalid(format!("tensor `experts` has dtype {other}; expected i32 or i64"))),
    };
    let mut expert_of = Vec::with_capacity(ids.len());
    for (pos, &e) in ids.iter().enumerate() {
        match usize::try_from(e) {
            Ok(e) if e < n_exp => expert_of.push(e),
            _ => {
                return Err(invalid(format!(
                    "tensor `experts` holds {e} at [{}, {}]; expert ids must be in [0, {n_exp})",
                    pos / slots,
                    pos % slots
                )));
            }
        }
    }
    let pairs = tokens * slots;
    let out_shape = [tokens, hidden];
    if pairs == 0 || hidden == 0 || inter == 0 {
        return HostTensor::zeros(a.x.dtype(), &out_shape).map_err(failed);
    }
    let (rows, ib) = (rows.max(1), ib.max(1));
    let x = f32_cow(&a.x);
    let route_w = f32_cow(&a.weights);

    // Group the pairs by expert (stable: token order within an expert).
    let mut start = vec![0usize; n_exp + 1];
    for &e in &expert_of {
        start[e + 1] += 1;
    }
    for e in 0..n_exp {
        start[e + 1] += start[e];
    }
    let mut next = start.clone();
    let mut grouped = vec![0usize; pairs];
    let mut slot_of = vec![0usize; pairs];
    for (p, &e) in expert_of.iter().enumerate() {
        grouped[next[e]] = p;
        slot_of[p] = next[e];
        next[e] += 1;
    }
    // Panels: (expert, first grouped position, length); they tile the grouped positions.
    let mut panels = Vec::new();
    for e in 0..n_exp {
        let mut p0 = start[e];
        while p0 < start[e + 1] {
            let len = rows.min(start[e + 1] - p0);
            panels.push((e, p0, len));
            p0 += len;
        }
    }
    let y_len = pairs
        .checked_mul(hidden)
        .ok_or_else(|| invalid(format!("{pairs} routed rows of {hidden} values overflow the address space")))?;
    let mut y = vec![0f32; y_len];
    let mut chunks = Vec::with_capacity(panels.len());
    let mut rest = y.as_mut_slice();
    for &(_, _, len) in &panels {
        let (head, tail) = rest.split_at_mut(len * hidden);
        chunks.push(head);
        rest = tail;
    }
    let (wg, wu, wd) = (Weights { t: &a.w_gate }, Weights { t: &a.w_up }, Weights { t: &a.w_down });
    let act = a.attrs.activation;
    let errors: Vec<Option<KernelError>> = panels
        .par_iter()
        .zip(chunks.into_par_iter())
        .map(|(&(e, p0, len), yc)| {
            let dims = Dims { hidden, inter, slots, ib };
            panel(&x, &grouped[p0..p0 + len], e, (&wg, &wu, &wd), act, dims, yc).err()
        })
        .collect();
    if let Some(err) = errors.into_iter().flatten().next() {
        return Err(err);
    }
    let mut out = vec![0f32; tokens * hidden];
    out.par_chunks_mut(hidden).enumerate().for_each(|(t, o)| {
        for j in 0..slots {
            let p = t * slots + j;
            let w = route_w[p];
            let yr = &y[slot_of[p] * hidden..(slot_of[p] + 1) * hidden];
            for (o, &v) in o.iter_mut().zip(yr) {
                *o += w * v;
            }
        }
    });
    HostTensor::from_f32_as(a.x.dtype(), &out_shape, &out).map_err(failed)
}

#[derive(Clone, Copy)]
struct Dims {
    hidden: usize,
    inter: usize,
    slots: usize,
    ib: usize,
}

/// One panel: the rows `pairs` (pair ids t * slots + j) of expert `e`, written to `yc`
/// ([pairs.len(), hidden], unweighted).
fn panel(
    x: &[f32],
    pairs: &[usize],
    e: usize,
    (wg, wu, wd): (&Weights<'_>, &Weights<'_>, &Weights<'_>),
    act: Activation,
    d: Dims,
    yc: &mut [f32],
) -> Result<(), KernelError> {
    let (n, h) = (pairs.len(), d.hidden);
    let mut xp = vec![0f32; n * h];
    for (dst, &p) in xp.chunks_exact_mut(h).zip(pairs) {
        let t = p / d.slots;
        dst.copy_from_slice(&x[t * h..(t + 1) * h]);
    }
    let ib = d.ib.min(d.inter);
    let (mut g, mut u) = (vec![0f32; n * ib], vec![0f32; n * ib]);
    let (mut bg, mut bu, mut bd) = (Vec::new(), Vec::new(), Vec::new());
    let mut i0 = 0;
    while i0 < d.inter {
        let nb = ib.min(d.inter - i0);
        let (g, u) = (&mut g[..n * nb], &mut u[..n * nb]);
        // G [n, nb] = X [n, h] . Wg[e][i0.., :]^T: B[p][j] = Wg[e][i0 + j][p].
        let (s, rs, cs) = wg.block(e, (i0, nb), (0, h), &mut bg)?;
        gemm((n, h, nb), &xp, (h, 1), s, (cs, rs), 0.0, g, nb)?;
        let (s, rs, cs) = wu.block(e, (i0, nb), (0, h), &mut bu)?;
        gemm((n, h, nb), &xp, (h, 1), s, (cs, rs), 0.0, u, nb)?;
        for (gv, &uv) in g.iter_mut().zip(u.iter()) {
            *gv = activate(act, *gv) * uv;
        }
        // Y [n, h] += A [n, nb] . Wd[e][:, i0..]^T: B[p][j] = Wd[e][j][i0 + p].
        let (s, rs, cs) = wd.block(e, (0, h), (i0, nb), &mut bd)?;
        gemm((n, nb, h), g, (nb, 1), s, (cs, rs), if i0 == 0 { 0.0 } else { 1.0 }, yc, h)?;
        i0 += nb;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use layerzero_core::compare::{Tolerance, check_within, ulp_rel};
    use layerzero_core::model::attrs::{MlpAttrs, MoeRouteAttrs};
    use layerzero_core::tensor::rng::Rng;
    use layerzero_reference as cpu_reference;

    fn reference(args: &OpArgs, kernel: &str) -> Result<Outputs, KernelError> {
        let mut r = Registry::new();
        cpu_reference::register(&mut r);
        r.get(kernel).ok_or_else(|| KernelError::Failed(format!("{kernel} is not registered")))?.run(args)
    }

    fn fast(args: &OpArgs, kernel: &str) -> Result<Outputs, KernelError> {
        let mut r = Registry::new();
        register(&mut r);
        r.get(kernel).ok_or_else(|| KernelError::Failed(format!("{kernel} is not registered")))?.run(args)
    }

    /// Within `rtol * (|want| + max |want|)`, or one 16-bit step. The bound is relative to the
    /// largest output, not the table's GEMM tolerance: expert outputs are weighted sums that
    /// cancel, and with GELU the f32 kernel is 2.1e-6 from the oracle on an element of 5e-3
    /// (its erfc approximation), outside the table's 1e-6 + 1e-6 |ref|.
    fn within_experts_bound(what: &str, want: &HostTensor, got: &HostTensor) -> TestResult {
        assert_eq!((got.shape(), got.dtype()), (want.shape(), want.dtype()), "{what}");
        let w = want.to_f64_vec();
        let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let rtol = match want.dtype() {
            DType::F32 => 1e-5,
            DType::F16 => 1e-3,
            _ => 1e-2,
        };
        let tol = Tolerance { rtol, atol: rtol * scale, ulp: ulp_rel(want.dtype()) };
        Ok(check_within(what, tol, &w, &got.to_f64_vec())?)
    }

    #[test]
    fn route_matches_the_reference() -> TestResult {
        let mut rng = Rng::new(1);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for (t, e) in [(1usize, 4usize), (7, 8), (33, 64), (5, 3)] {
                // Coarse values (many ties) and continuous ones.
                for coarse in [false, true] {
                    let vals: Vec<f32> = (0..t * e)
                        .map(|_| if coarse { rng.below(4) as f32 } else { (rng.normal() * 3.0) as f32 })
                        .collect();
                    let logits = HostTensor::from_f32_as(dtype, &[t, e], &vals)?;
                    for k in [1, 2, e as u64] {
                        for renormalize in [false, true] {
                            let args = OpArgs::MoeRoute(MoeRouteArgs {
                                logits: logits.clone(),
                                attrs: MoeRouteAttrs { top_k: k, renormalize },
                            });
                            let want = reference(&args, "cpu_reference.moe_route.naive")?;
                            let got = fast(&args, MOE_ROUTE)?;
                            let what = format!("{dtype} t {t} e {e} k {k} renormalize {renormalize}");
                            assert_eq!(got["experts"].dtype(), DType::I32);
                            assert_eq!(got["experts"].shape(), &[t, k as usize]);
                            assert_eq!(got["experts"].to_i64_vec(), want["experts"].to_i64_vec(), "{what}");
                            let (gw, ww) = (got["weights"].to_f32_vec(), want["weights"].to_f32_vec());
                            for (g, w) in gw.iter().zip(&ww) {
                                assert!((g - w).abs() <= 1e-6, "{what}: {g} vs {w}");
                            }
                            if renormalize {
                                for r in gw.chunks(k as usize) {
                                    assert!((r.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{what}");
                                }
                            }
                        }
                    }
                }
            }
        }
        // Errors agree.
        let l = HostTensor::from_f32(&[2, 2], vec![0.0, 1.0, f32::NAN, 0.0])?;
        let args = OpArgs::MoeRoute(MoeRouteArgs { logits: l, attrs: MoeRouteAttrs { top_k: 1, renormalize: false } });
        let e = fast(&args, MOE_ROUTE).err().ok_or("a NaN logit must be refused")?;
        assert_eq!(reference(&args, "cpu_reference.moe_route.naive").err().as_ref(), Some(&e));
        let l = HostTensor::from_f32(&[1, 2], vec![0.0, 1.0])?;
        let args = OpArgs::MoeRoute(MoeRouteArgs { logits: l, attrs: MoeRouteAttrs { top_k: 3, renormalize: true } });
        assert!(matches!(fast(&args, MOE_ROUTE), Err(KernelError::InvalidInput(m)) if m.contains("top_k")));
        assert!(matches!(fast(&args, MOE_EXPERTS), Err(KernelError::Unsupported(_))));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn moe_args(
        t: usize,
        e: usize,
        k: usize,
        h: usize,
        i: usize,
        dtype: DType,
        act: Activation,
        seed: u64,
    ) -> TestResult<MoeExpertsArgs> {
        let mut rng = Rng::new(seed);
        let mut normals =
            |n: usize, scale: f64| -> Vec<f32> { (0..n).map(|_| (rng.normal() * scale) as f32).collect() };
        let x = normals(t * h, 1.0);
        let wg = normals(e * i * h, 1.0 / (h as f64).sqrt());
        let wu = normals(e * i * h, 1.0 / (h as f64).sqrt());
        let wd = normals(e * h * i, 1.0 / (i as f64).sqrt());
        let weights: Vec<f32> = normals(t * k, 1.0).iter().map(|v| v.abs() + 0.1).collect();
        let mut rng = Rng::new(seed ^ 0xABCD);
        let ids: Vec<i32> = (0..t * k).map(|_| rng.below(e as u64) as i32).collect();
        Ok(MoeExpertsArgs {
            x: HostTensor::from_f32_as(dtype, &[t, h], &x)?,
            experts: HostTensor::new(Storage::I32(ids.into()), &[t, k])?,
            weights: HostTensor::from_f32(&[t, k], weights)?,
            w_gate: HostTensor::from_f32_as(dtype, &[e, i, h], &wg)?,
            w_up: HostTensor::from_f32_as(dtype, &[e, i, h], &wu)?,
            w_down: HostTensor::from_f32_as(dtype, &[e, h, i], &wd)?,
            attrs: MlpAttrs { activation: act },
        })
    }

    #[test]
    fn grouped_experts_match_the_reference() -> TestResult {
        let mut cases = 0;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for t in [1, 5, 33] {
                for e in [4, 8] {
                    for k in [1, 2] {
                        for h in [16, 48] {
                            for (ai, act) in
                                [Activation::Silu, Activation::Gelu, Activation::GeluTanh].into_iter().enumerate()
                            {
                                let seed = (t * 1000 + e * 100 + k * 10 + h + ai) as u64;
                                let a = OpArgs::MoeExperts(moe_args(t, e, k, h, 32, dtype, act, seed)?);
                                let want = reference(&a, "cpu_reference.moe_experts.naive")?;
                                let got = fast(&a, MOE_EXPERTS)?;
                                let what = format!("{dtype} t {t} e {e} k {k} h {h} {act:?}");
                                within_experts_bound(&what, &want["out"], &got["out"])?;
                                cases += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 216);
        Ok(())
    }

    #[test]
    fn blocking_views_and_thread_counts_do_not_change_the_result() -> TestResult {
        for dtype in [DType::F32, DType::BF16] {
            let a = moe_args(33, 8, 2, 48, 32, dtype, Activation::Gelu, 5)?;
            let want = reference(&OpArgs::MoeExperts(a.clone()), "cpu_reference.moe_experts.naive")?;
            let base = experts(&a, ROWS, IB)?;
            within_experts_bound("default blocking", &want["out"], &base)?;
            // Small panels and intermediate blocks that do not divide the dims.
            let small = experts(&a, 3, 5)?;
            within_experts_bound("panels of 3, blocks of 5", &want["out"], &small)?;
            // Thread count: bit-identical.
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
                let again = pool.install(|| experts(&a, ROWS, IB))?;
                assert_eq!(again.to_f32_vec(), base.to_f32_vec(), "{threads} threads");
            }
            // Strided weights (a transposed copy viewed back) and x, and i64 ids.
            let mut v = a.clone();
            let swap = |w: &HostTensor| -> TestResult<_> {
                let p = w.permute(&[0, 2, 1])?.contiguous();
                Ok(p.permute(&[0, 2, 1])?)
            };
            v.w_gate = swap(&a.w_gate)?;
            v.w_up = swap(&a.w_up)?;
            v.w_down = swap(&a.w_down)?;
            v.x = a.x.permute(&[1, 0])?.contiguous().permute(&[1, 0])?;
            v.experts = HostTensor::new(Storage::I64(a.experts.to_i64_vec().into()), a.experts.shape())?;
            assert!(!v.w_gate.is_contiguous() && !v.x.is_contiguous());
            let strided = experts(&v, ROWS, IB)?;
            within_experts_bound("strided views", &want["out"], &strided)?;
        }
        Ok(())
    }

    #[test]
    fn grouped_experts_reject_bad_input_and_handle_empty_shapes() -> TestResult {
        let mut a = moe_args(5, 4, 2, 16, 32, DType::F32, Activation::Silu, 1)?;
        let mut ids = a.experts.to_i64_vec();
        ids[7] = 4;
        a.experts = HostTensor::new(Storage::I64(ids.clone().into()), &[5, 2])?;
        let args = OpArgs::MoeExperts(a.clone());
        let e = fast(&args, MOE_EXPERTS).err().ok_or("expert 4 of 4 must be refused")?;
        assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains("holds 4 at [3, 1]")), "{e}");
        assert_eq!(reference(&args, "cpu_reference.moe_experts.naive").err().as_ref(), Some(&e));
        ids[7] = -2;
        a.experts = HostTensor::new(Storage::I64(ids.into()), &[5, 2])?;
        let e = fast(&OpArgs::MoeExperts(a.clone()), MOE_EXPERTS).err().ok_or("expert -2 must be refused")?;
        assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains("-2")), "{e}");
        let good = moe_args(5, 4, 2, 16, 32, DType::F32, Activation::Silu, 1)?;
        // Each field of the arguments with a tensor of the wrong shape or dtype for it.
        type Field = fn(&mut MoeExpertsArgs) -> &mut HostTensor;
        let wrong: [(&str, Field, HostTensor); 6] = [
            ("w_up", |a| &mut a.w_up, HostTensor::zeros(DType::F32, &[4, 16, 32])?),
            ("w_down", |a| &mut a.w_down, HostTensor::zeros(DType::F32, &[4, 32, 16])?),
            ("weights", |a| &mut a.weights, HostTensor::zeros(DType::F32, &[5, 1])?),
            ("experts", |a| &mut a.experts, HostTensor::zeros(DType::F32, &[5, 2])?),
            ("x", |a| &mut a.x, HostTensor::zeros(DType::I32, &[5, 16])?),
            ("w_gate", |a| &mut a.w_gate, HostTensor::zeros(DType::F32, &[4, 32])?),
        ];
        for (name, field, tensor) in wrong {
            let mut b = good.clone();
            *field(&mut b) = tensor;
            let e = fast(&OpArgs::MoeExperts(b), MOE_EXPERTS)
                .err()
                .ok_or_else(|| format!("a bad `{name}` must be refused"))?;
            assert!(matches!(&e, KernelError::InvalidInput(m) if m.contains(&format!("`{name}`"))), "{name}: {e}");
        }
        // No tokens, no slots: zeros of x's dtype.
        for (t, k) in [(0, 2), (3, 0)] {
            let a = moe_args(t, 4, k, 16, 8, DType::BF16, Activation::Silu, 2)?;
            let out = experts(&a, ROWS, IB)?;
            assert_eq!((out.shape(), out.dtype()), (&[t, 16][..], DType::BF16));
            assert!(out.to_f32_vec().iter().all(|&v| v == 0.0));
        }
        assert!(matches!(fast(&OpArgs::MoeExperts(good), MOE_ROUTE), Err(KernelError::Unsupported(_))));
        Ok(())
    }
}
