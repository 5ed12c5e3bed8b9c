//! `cpu.rope.fast`: rotary embeddings over BSHD/BHSD views of any strides. The cos/sin of
//! every distinct position are computed once in f64 (an f32 angle at position 4096 is off by
//! about 2e-4), the rotation is done in f64 and rounded once to the output dtype; rows are
//! processed in parallel.

use std::cell::RefCell;

use half::{bf16, f16};
use rayon::prelude::*;

/// Below this many elements the work runs on the calling thread: entering the pool from
/// outside it costs microseconds, more than a decode step's rotation.
const SEQUENTIAL_BELOW: usize = 1 << 14;

use layerzero_core::exec::args::{Outputs, RopeArgs};
use layerzero_core::exec::executor::KernelError;
use layerzero_core::exec::semantics::{rope_frequencies, rope_frequencies_depend_on_length};
use layerzero_core::model::attrs::{RopeAttrs, RopeStyle};
use layerzero_core::model::dtype::DType;
use layerzero_core::model::layout::Layout;
use layerzero_core::tensor::{HostTensor, Storage};

use super::alloc::{Out, with_scratch};
use super::pack::{Bshd, ints, invalid};

/// cos and sin per (position entry, pair): `[entries][half]`.
struct Table<'a> {
    cos: &'a [f64],
    sin: &'a [f64],
    half: usize,
    /// Position entry of (b, s): `s` when shared, else `b * seq + s`.
    shared: bool,
    seq: usize,
}

impl Table<'_> {
    #[inline]
    fn entry(&self, b: usize, s: usize) -> usize {
        if self.shared { s } else { b * self.seq + s }
    }
}

fn table_values(name: &str, t: &HostTensor, half: usize) -> Result<(), KernelError> {
    if !t.dtype().is_float() {
        return Err(invalid(format!("tensor `{name}` has dtype {}; expected a float dtype", t.dtype())));
    }
    if t.rank() != 2 || t.shape()[1] != half {
        return Err(invalid(format!(
            "tensor `{name}` has shape {:?}; expected [max_position, rotary_dim / 2 = {half}]",
            t.shape()
        )));
    }
    Ok(())
}

/// Runs RoPE: `out` (q rotated) and `out_k` when k is given.
/// `rope` into new buffers.
#[cfg(test)]
pub(crate) fn run(a: &RopeArgs) -> Result<Outputs, KernelError> {
    run_into(a, &mut Outputs::new())
}

/// The frequencies of `rope_frequencies`, kept per thread for the last attributes asked
/// (every call of a model asks the same, and the table is a few hundred values).
fn frequencies<R>(attrs: &RopeAttrs, rot: usize, seq_len: usize, f: impl FnOnce(&[f64], f64) -> R) -> R {
    /// (attributes, rotary dim, sequence length, inverse frequencies, attention factor).
    type Memo = Option<(RopeAttrs, usize, usize, Vec<f64>, f64)>;
    thread_local! {
        static LAST: RefCell<Memo> = const { RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| {
        let len_matters = rope_frequencies_depend_on_length(attrs);
        let hit =
            last.as_ref().is_some_and(|(a, r, l, _, _)| a == attrs && *r == rot && (!len_matters || *l == seq_len));
        if !hit {
            let (inv, factor) = rope_frequencies(attrs, rot, seq_len);
            *last = Some((attrs.clone(), rot, seq_len, inv, factor));
        }
        match last.as_ref() {
            Some((_, _, _, inv, factor)) => f(inv, *factor),
            None => f(&[], 1.0),
        }
    })
}

/// `rope`: `out` (q) and `out_k`, into the caller's buffers where they fit.
pub(crate) fn run_into(a: &RopeArgs, bufs: &mut Outputs) -> Result<Outputs, KernelError> {
    let attrs = &a.attrs;
    let q = Bshd::new(&a.q, "q")?;
    let [nb, ns, _, d] = q.n;
    let rot = match attrs.rotary_dim {
        None => d,
        Some(r) => usize::try_from(r).unwrap_or(usize::MAX),
    };
    if rot % 2 != 0 || rot > d {
        return Err(invalid(format!("rotary_dim is {rot}; it must be even and at most head_dim {d}")));
    }
    let half = rot / 2;
    let k = a.k.as_ref().map(|k| Bshd::new(k, "k")).transpose()?;
    if let Some(k) = &k
        && (k.n[0], k.n[1], k.n[3]) != (nb, ns, d)
    {
        return Err(invalid(format!(
            "k [batch, seq, head_dim] = [{}, {}, {}] != q's [{nb}, {ns}, {d}]",
            k.n[0], k.n[1], k.n[3]
        )));
    }
    let owned;
    let (positions, shared): (&[i64], bool) = match &a.positions {
        None => {
            owned = (0..ns as i64).collect::<Vec<_>>();
            (&owned, true)
        }
        Some(p) => {
            let shared = match p.shape() {
                [s] if *s == ns => true,
                [b, s] if *b == nb && *s == ns => false,
                other => {
                    return Err(invalid(format!(
                        "tensor `positions` has shape {other:?}; expected [{ns}] or [{nb}, {ns}]"
                    )));
                }
            };
            let v = match (p.storage(), p.is_contiguous()) {
                (Storage::I64(v), true) => &v[p.offset()..p.offset() + p.numel()],
                _ => {
                    owned = ints(p, "positions")?;
                    &owned[..]
                }
            };
            if let Some((n, &x)) = v.iter().enumerate().find(|(_, x)| **x < 0) {
                return Err(invalid(format!("positions (flat index {n}) = {x} is negative")));
            }
            (v, shared)
        }
    };
    let max_pos = positions.iter().copied().max().unwrap_or(-1);
    let entries = positions.len();
    with_scratch::<f64, _>(2 * entries * half, |table| {
        let (cos, sin) = table.split_at_mut(entries * half);
        match (&a.cos, &a.sin) {
            (None, None) => {
                let seq_len = usize::try_from(max_pos + 1).unwrap_or(usize::MAX);
                frequencies(attrs, rot, seq_len, |inv_freq, factor| {
                    let angles = |(c, s): (&mut [f64], &mut [f64]), pos: i64| {
                        for i in 0..c.len().min(s.len()).min(inv_freq.len()) {
                            let theta = pos as f64 * inv_freq[i];
                            c[i] = theta.cos() * factor;
                            s[i] = theta.sin() * factor;
                        }
                    };
                    // A decode step's table is a few dozen angles: handing it to the thread pool
                    // costs more than computing it here.
                    if half > 0 && entries * half < SEQUENTIAL_BELOW {
                        cos.chunks_mut(half)
                            .zip(sin.chunks_mut(half))
                            .zip(positions)
                            .for_each(|(cs, &p)| angles(cs, p));
                    } else if half > 0 {
                        cos.par_chunks_mut(half)
                            .zip(sin.par_chunks_mut(half))
                            .zip(positions)
                            .for_each(|(cs, &p)| angles(cs, p));
                    }
                });
            }
            (Some(ct), Some(st)) => {
                if ct.shape() != st.shape() {
                    return Err(invalid(format!(
                        "tensor `cos` shape {:?} != `sin` shape {:?}",
                        ct.shape(),
                        st.shape()
                    )));
                }
                table_values("cos", ct, half)?;
                table_values("sin", st, half)?;
                let rows = ct.shape()[0];
                if max_pos >= rows as i64 {
                    return Err(invalid(format!(
                        "positions reach {max_pos} but the cos/sin tables have {rows} rows (positions 0..{rows})"
                    )));
                }
                for (e, &pos) in positions.iter().enumerate() {
                    for i in 0..half {
                        let (p, c) = (pos as usize, e * half + i);
                        cos[c] = ct.storage().get_f64(ct.offset() + p * ct.strides()[0] + i * ct.strides()[1]);
                        sin[c] = st.storage().get_f64(st.offset() + p * st.strides()[0] + i * st.strides()[1]);
                    }
                }
            }
            _ => return Err(invalid("rope takes both `cos` and `sin` tables or neither; one is missing")),
        }
        let table = Table { cos, sin, half, shared, seq: ns };
        let mut outs = Outputs::one("out", rotate(&a.q, &q, &table, rot, attrs.style, bufs, "out")?);
        if let (Some(kt), Some(k)) = (&a.k, &k) {
            outs.insert("out_k", rotate(kt, k, &table, rot, attrs.style, bufs, "out_k")?);
        }
        Ok(outs)
    })
}

/// Rotates every row of `x` into a contiguous tensor of `t`'s dtype and layout (the
/// caller's buffer `name` when it fits).
fn rotate(
    t: &HostTensor,
    x: &Bshd,
    table: &Table<'_>,
    rot: usize,
    style: RopeStyle,
    bufs: &mut Outputs,
    name: &'static str,
) -> Result<HostTensor, KernelError> {
    let [nb, ns, nh, d] = x.n;
    let bhsd = t.layout() == Some(Layout::Bhsd);
    let rows = nb * ns * nh;
    // (b, s, h) of contiguous output row r.
    let coords = move |r: usize| {
        if bhsd { (r / (nh * ns), r % ns, (r / ns) % nh) } else { (r / (ns * nh), (r / nh) % ns, r % nh) }
    };
    let row = move |r: usize, out: &mut [f64], src: &mut [f32]| {
        let (b, s, h) = coords(r);
        x.read(b, s, h, src);
        let e = table.entry(b, s);
        let half = table.half;
        let (c, sn) = (&table.cos[e * half..(e + 1) * half], &table.sin[e * half..(e + 1) * half]);
        for (o, &v) in out[rot..].iter_mut().zip(&src[rot..]) {
            *o = f64::from(v);
        }
        match style {
            RopeStyle::RotateHalf => {
                let (o1, o2) = out[..2 * half].split_at_mut(half);
                let (x1, x2) = src[..2 * half].split_at(half);
                for i in 0..half {
                    let (a, b) = (f64::from(x1[i]), f64::from(x2[i]));
                    o1[i] = a * c[i] - b * sn[i];
                    o2[i] = b * c[i] + a * sn[i];
                }
            }
            RopeStyle::Interleaved => {
                let pairs = out[..2 * half].chunks_exact_mut(2).zip(src[..2 * half].chunks_exact(2));
                for (i, (o, x)) in pairs.enumerate() {
                    let (a, b) = (f64::from(x[0]), f64::from(x[1]));
                    o[0] = a * c[i] - b * sn[i];
                    o[1] = b * c[i] + a * sn[i];
                }
            }
        }
    };
    fn fill<T: Send>(
        out: &mut [T],
        d: usize,
        conv: impl Fn(f64) -> T + Sync,
        row: &(impl Fn(usize, &mut [f64], &mut [f32]) + Sync),
    ) {
        if d == 0 {
            return;
        }
        if out.len() < SEQUENTIAL_BELOW {
            with_scratch::<f64, _>(d, |buf| {
                with_scratch::<f32, _>(d, |src| {
                    for (r, dst) in out.chunks_mut(d).enumerate() {
                        row(r, buf, src);
                        for (o, &v) in dst.iter_mut().zip(buf.iter()) {
                            *o = conv(v);
                        }
                    }
                })
            });
            return;
        }
        out.par_chunks_mut(d).enumerate().with_min_len(16).for_each_init(
            || (vec![0f64; d], vec![0f32; d]),
            |(buf, src), (r, dst)| {
                row(r, buf, src);
                for (o, &v) in dst.iter_mut().zip(buf.iter()) {
                    *o = conv(v);
                }
            },
        );
    }
    let n = rows * d;
    let shape = if bhsd { [nb, nh, ns, d] } else { [nb, ns, nh, d] };
    let out = match t.dtype() {
        DType::F16 => {
            let mut o = Out::<f16>::take(bufs, name, n);
            fill(&mut o.v, d, f16::from_f64, &row);
            o.finish(&shape)?
        }
        DType::BF16 => {
            let mut o = Out::<bf16>::take(bufs, name, n);
            fill(&mut o.v, d, bf16::from_f64, &row);
            o.finish(&shape)?
        }
        DType::F32 => {
            let mut o = Out::<f32>::take(bufs, name, n);
            fill(&mut o.v, d, |x| x as f32, &row);
            o.finish(&shape)?
        }
        other => {
            let mut v = vec![0f32; n];
            fill(&mut v, d, |x| x as f32, &row);
            HostTensor::new(Storage::from_f32(other, &v), &shape)
                .map_err(|e| KernelError::Failed(format!("building the output: {e}")))?
        }
    };
    Ok(match t.layout() {
        Some(l) => out.with_layout(l),
        None => out,
    })
}
