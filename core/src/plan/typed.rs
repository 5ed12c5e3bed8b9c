//! Keys from typed arguments, without building a `Request`.
//!
//! Deriving a [`SelectionKey`] walks a `Request` (tensor names, dtype names, attributes as
//! JSON) and costs ~0.5 µs, more than the whole cached selection it leads to. A host that
//! holds typed [`OpArgs`] gets its key here instead: a *fingerprint* of the arguments is
//! computed from their fields (dtypes, layouts, ranks, every size that is not a perf axis,
//! the attributes by value) and mapped to the validity hash by a small lock-free memo. The
//! memo is filled the first time a fingerprint is seen, by deriving the key the slow way.
//!
//! Soundness: the fingerprint is at least as fine as the validity hash. Perf axes are
//! replaced by symbols by the same rule the key uses (a dimension that carries an axis and
//! holds its value); the order of related axes is hashed; a tensor that is not contiguous
//! makes every size exact, since the key reads strides relative to the sizes. So two
//! arguments with one fingerprint always have one validity hash.

use std::sync::OnceLock;

use super::seqlock::SeqWords;
use crate::exec::args::{MAX_SLOTS, OpArgs};
use crate::key::axes::{self, Dim, MAX_AXES};
use crate::key::{SelectionKey, order_of};
use crate::model::fingerprint::Sig;
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::tensor::HostTensor;

/// The typed part of a key: the fingerprint and the perf values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Typed {
    /// The op.
    pub op: Op,
    /// Hash of everything but the perf values (128 bits: collisions are not a concern).
    pub fingerprint: u128,
    /// Perf values, one per axis.
    pub perf: [u64; MAX_AXES],
    /// Axes in use.
    pub axes: u8,
    /// Order of the related perf values.
    pub order: u8,
}

impl Typed {
    /// The buckets of the perf values (`None` outside an anchor's bounds).
    #[inline]
    pub fn buckets(&self) -> Option<super::Buckets> {
        let mut out = [0u8; MAX_AXES];
        for (i, axis) in axes::axes(self.op).iter().enumerate().take(usize::from(self.axes)) {
            out[i] = axis.anchor.bucket(self.perf[i])?;
        }
        Some(super::Buckets(out))
    }

    /// The selection key, given the validity hash the memo holds for this fingerprint.
    #[inline]
    pub fn key(&self, validity: u128) -> SelectionKey {
        SelectionKey { op: self.op, validity, perf: self.perf, axes: self.axes, order: self.order }
    }
}

/// A perf-axis position resolved for both sequence layouts: the dimension index in a BSHD
/// (or untagged) tensor and in a BHSD one.
#[derive(Debug, Clone, Copy, Default)]
struct Pos {
    slot: u8,
    axis: u8,
    bshd: u8,
    bhsd: u8,
}

impl Pos {
    fn new(slot: usize, axis: usize, d: Dim) -> Pos {
        let (bshd, bhsd) = match d {
            Dim::At(i) => (i, i),
            Dim::Seq => (1, 2),
        };
        Pos { slot: slot as u8, axis: axis as u8, bshd: bshd as u8, bhsd: bhsd as u8 }
    }

    /// The dimension in `t`, if `t` has it.
    #[inline(always)]
    fn dim(self, t: &HostTensor) -> Option<usize> {
        let i = usize::from(if t.layout() == Some(Layout::Bhsd) { self.bhsd } else { self.bshd });
        (i < t.rank()).then_some(i)
    }
}

/// Most positions of one axis, or held by one tensor.
const POSITIONS: usize = 4;

/// Where each op's perf axes live, by tensor slot rather than by name, in fixed arrays.
#[derive(Debug, Default)]
struct OpTable {
    axes: usize,
    /// Per axis, its positions in the order the key reads them.
    sources: [([Pos; POSITIONS], usize); MAX_AXES],
    /// Per slot, the positions it holds, in axis order.
    carriers: [([Pos; POSITIONS], usize); MAX_SLOTS],
}

fn table(op: Op, names: &[&str]) -> &'static OpTable {
    static TABLES: [OnceLock<OpTable>; Op::ALL.len()] = [const { OnceLock::new() }; Op::ALL.len()];
    let slot = (op as usize).min(Op::ALL.len() - 1);
    TABLES[slot].get_or_init(|| {
        let slot_of = |name: &str| names.iter().position(|n| *n == name);
        let list = axes::axes(op);
        let mut t = OpTable { axes: list.len().min(MAX_AXES), ..OpTable::default() };
        for (a, axis) in list.iter().enumerate().take(MAX_AXES) {
            for (name, d) in axis.at {
                let Some(s) = slot_of(name) else { continue };
                let p = Pos::new(s, a, *d);
                let (src, n) = &mut t.sources[a];
                if *n < POSITIONS {
                    src[*n] = p;
                    *n += 1;
                }
                if let Some((car, m)) = t.carriers.get_mut(s)
                    && *m < POSITIONS
                {
                    car[*m] = p;
                    *m += 1;
                }
            }
        }
        t
    })
}

/// Computes the fingerprint and perf values of `args`; `None` when an axis has no tensor
/// that carries it, or the arguments are too large to fingerprint (such arguments are
/// selected the slow way).
pub fn fingerprint(args: &OpArgs) -> Option<Typed> {
    let op = args.op();
    let (names, slots) = args.slots();
    let t = table(op, names);
    let n = t.axes;
    let mut perf = [0u64; MAX_AXES];
    for (p, (src, cnt)) in perf.iter_mut().zip(&t.sources).take(n) {
        *p = src[..*cnt].iter().find_map(|pos| {
            let x = slots[usize::from(pos.slot)]?;
            pos.dim(x).map(|i| x.shape()[i] as u64)
        })?;
    }
    let order = order_of(op, &perf, n);
    let exact = slots.iter().flatten().any(|x| !x.is_contiguous());
    let mut sig = Sig::new();
    sig.push((op as u64) | (u64::from(order) << 8) | (n as u64) << 16 | u64::from(exact) << 24);
    if exact {
        perf.iter().for_each(|&p| sig.push(p));
    }
    for (slot, (car, cnt)) in slots.iter().zip(&t.carriers).take(names.len()) {
        let Some(x) = slot else {
            sig.push(u64::MAX);
            continue;
        };
        let shape = x.shape();
        let layout = x.layout().map_or(0, |l| l as u64 + 1);
        // The device too: a CUDA tensor of the same shape is another request.
        let device = x.device().map_or(0, |d| (d.kind as u64 + 1) | u64::from(d.ordinal()) << 8);
        sig.push((x.dtype() as u64) | layout << 8 | (shape.len() as u64) << 16 | device << 24);
        // The axis each dimension carries, as the key decides it: the first axis (in axis
        // order) with a position at this dimension that holds the axis's value.
        let mut carries = [u8::MAX; 8];
        if !exact {
            for pos in &car[..*cnt] {
                if let Some(i) = pos.dim(x)
                    && let Some(c) = carries.get_mut(i)
                    && *c == u8::MAX
                    && shape[i] as u64 == perf[usize::from(pos.axis)]
                {
                    *c = pos.axis;
                }
            }
        }
        // Two dimensions a word (each below 2^31, or a symbol with the top bit set).
        let mut pair = 0u64;
        for (i, &d) in shape.iter().enumerate() {
            let v = match carries.get(i) {
                Some(&a) if a != u8::MAX => HALF_SYMBOL | u64::from(a),
                _ if (d as u64) < HALF_SYMBOL => d as u64,
                _ => return None,
            };
            if i % 2 == 0 {
                pair = v;
            } else {
                sig.push(pair | v << 32);
            }
        }
        if shape.len() % 2 == 1 {
            sig.push(pair | EMPTY_HALF << 32);
        }
        if exact {
            x.strides().iter().for_each(|&st| sig.push(st as u64));
        }
    }
    args.hash_attrs(&mut sig);
    Some(Typed { op, fingerprint: sig.finish()?, perf, axes: n as u8, order })
}

/// Marks a dimension (in its half word) that holds a perf axis; sizes at or above it take
/// the slow path.
const HALF_SYMBOL: u64 = 1 << 31;
/// The second half of the last word of an odd rank.
const EMPTY_HALF: u64 = u32::MAX as u64;

/// A direct-mapped, lock-free memo from fingerprint to validity hash: each slot holds both,
/// four words behind a sequence lock (a torn read is a miss; a busy slot is skipped).
#[derive(Debug)]
pub struct KeyMemo {
    slots: Box<[SeqWords]>,
    mask: usize,
}

impl KeyMemo {
    /// A memo of `capacity` slots (rounded up to a power of two, at least 1).
    pub fn new(capacity: usize) -> KeyMemo {
        let n = capacity.max(1).next_power_of_two();
        KeyMemo { slots: (0..n).map(|_| SeqWords::default()).collect(), mask: n - 1 }
    }

    #[inline]
    fn slot(&self, fingerprint: u128) -> Option<&SeqWords> {
        self.slots.get((fingerprint as usize ^ (fingerprint >> 64) as usize) & self.mask)
    }

    /// The validity hash memoized for `fingerprint`.
    #[inline]
    pub fn get(&self, fingerprint: u128) -> Option<u128> {
        let w = self.slot(fingerprint)?.read()?;
        let f = (u128::from(w[0]) << 64) | u128::from(w[1]);
        (f == fingerprint).then_some((u128::from(w[2]) << 64) | u128::from(w[3]))
    }

    /// Memoizes `validity` for `fingerprint` (skipped when another writer holds the slot).
    pub fn insert(&self, fingerprint: u128, validity: u128) {
        if let Some(s) = self.slot(fingerprint) {
            s.write([(fingerprint >> 64) as u64, fingerprint as u64, (validity >> 64) as u64, validity as u64]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::TestResult;
    use crate::exec::args::{AttentionArgs, NormArgs};
    use crate::model::attrs::{AttentionAttrs, NormAttrs};
    use crate::model::dtype::DType;

    fn t(dtype: DType, shape: &[usize], layout: Option<Layout>) -> TestResult<HostTensor> {
        let x = HostTensor::zeros(dtype, shape)?;
        Ok(match layout {
            Some(l) => x.with_layout(l),
            None => x,
        })
    }

    fn attention(b: usize, sq: usize, sk: usize, layout: Layout, causal: bool, dtype: DType) -> TestResult<OpArgs> {
        let shape = |s: usize, h: usize| if layout == Layout::Bhsd { [b, h, s, 16] } else { [b, s, h, 16] };
        Ok(OpArgs::Attention(AttentionArgs {
            q: t(dtype, &shape(sq, 4), Some(layout))?,
            k: t(dtype, &shape(sk, 2), Some(layout))?,
            v: t(dtype, &shape(sk, 2), Some(layout))?,
            mask: None,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            attrs: AttentionAttrs { causal, ..AttentionAttrs::default() },
        }))
    }

    fn cases() -> TestResult<Vec<OpArgs>> {
        let mut out = Vec::new();
        for (b, sq, sk) in [(1, 1, 1), (1, 1, 7), (1, 4, 4), (2, 3, 3), (1, 2, 4), (1, 4, 2), (4, 2, 2), (1, 2, 2)] {
            for layout in [Layout::Bshd, Layout::Bhsd] {
                for causal in [false, true] {
                    for dtype in [DType::F32, DType::BF16] {
                        out.push(attention(b, sq, sk, layout, causal, dtype)?);
                    }
                }
            }
        }
        // Strided views: a permuted q keeps its exact strides in the key.
        for s in [2, 3, 4] {
            let OpArgs::Attention(mut a) = attention(1, s, s, Layout::Bshd, true, DType::F32)? else { continue };
            a.q = t(DType::F32, &[1, 4, s, 16], None)?.permute(&[0, 2, 1, 3])?.with_layout(Layout::Bshd);
            out.push(OpArgs::Attention(a));
        }
        for (rows, h, eps) in
            [(1, 8, None), (3, 8, None), (4, 8, None), (4, 16, None), (4, 8, Some(1e-5)), (1, 1, None)]
        {
            out.push(OpArgs::RmsNorm(NormArgs {
                x: t(DType::F32, &[rows, h], None)?,
                weight: t(DType::F32, &[h], None)?,
                bias: None,
                residual: None,
                attrs: NormAttrs { eps },
            }));
        }
        Ok(out)
    }

    #[test]
    fn one_fingerprint_always_means_one_validity_hash() -> TestResult {
        let mut validity_of: HashMap<u128, u128> = HashMap::new();
        let mut fingerprint_of: HashMap<u128, u128> = HashMap::new();
        for args in cases()? {
            let typed = fingerprint(&args).ok_or("arguments the fast path cannot fingerprint")?;
            let key = SelectionKey::derive(&args.describe());
            assert_eq!((typed.perf, typed.axes, typed.order), (key.perf, key.axes, key.order), "{args:?}");
            let v = *validity_of.entry(typed.fingerprint).or_insert(key.validity);
            assert_eq!(v, key.validity, "two validity hashes behind one fingerprint: {args:?}");
            // Contiguous arguments are no finer than their key: every size of a validity
            // class shares one memo entry (decode steps whose cache grows hit it).
            let contiguous = args.tensors().iter().all(|(_, t)| t.is_contiguous());
            if contiguous {
                let f = *fingerprint_of.entry(key.validity).or_insert(typed.fingerprint);
                assert_eq!(f, typed.fingerprint, "one validity class split across fingerprints: {args:?}");
            }
        }
        assert!(validity_of.len() >= 20, "the cases span many classes ({})", validity_of.len());
        Ok(())
    }

    #[test]
    fn the_memo_returns_what_was_stored_and_nothing_else() {
        let m = KeyMemo::new(4);
        assert_eq!(m.get(7), None);
        m.insert(7, 70);
        assert_eq!(m.get(7), Some(70));
        m.insert(7 + (1 << 100), 71);
        assert_eq!(m.get(7 + (1 << 100)), Some(71));
        assert_eq!(m.get(11), None);
    }
}
