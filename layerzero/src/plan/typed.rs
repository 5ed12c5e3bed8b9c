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
use std::sync::atomic::{AtomicU64, Ordering, fence};

use serde::Serialize;
use serde::ser;

use super::axes::{self, Dim, MAX_AXES};
use super::key::{SelectionKey, order_of};
use crate::exec::args::OpArgs;
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
    /// The selection key, given the validity hash the memo holds for this fingerprint.
    #[inline]
    pub fn key(&self, validity: u128) -> SelectionKey {
        SelectionKey { op: self.op, validity, perf: self.perf, axes: self.axes, order: self.order }
    }
}

/// Where each op's perf axes live, by tensor slot rather than by name.
#[derive(Debug, Default)]
struct OpTable {
    /// Per axis, the (slot, dim) positions in the order the key reads them.
    sources: Vec<Vec<(usize, Dim)>>,
    /// Per slot, the (axis, dim) positions it holds, in axis order.
    carriers: Vec<Vec<(usize, Dim)>>,
}

fn table(op: Op, names: &[&str]) -> &'static OpTable {
    static TABLES: [OnceLock<OpTable>; Op::ALL.len()] = [const { OnceLock::new() }; Op::ALL.len()];
    let slot = (op as usize).min(Op::ALL.len() - 1);
    TABLES[slot].get_or_init(|| {
        let slot_of = |name: &str| names.iter().position(|n| *n == name);
        let list = axes::axes(op);
        let sources = list.iter().map(|a| a.at.iter().filter_map(|(n, d)| Some((slot_of(n)?, *d))).collect()).collect();
        let carriers = (0..names.len())
            .map(|s| {
                list.iter()
                    .enumerate()
                    .flat_map(|(ai, a)| a.at.iter().filter(|(n, _)| slot_of(n) == Some(s)).map(move |(_, d)| (ai, *d)))
                    .collect()
            })
            .collect();
        OpTable { sources, carriers }
    })
}

/// The index `dim` names in `t` (as [`axes::resolve`] for descriptions).
#[inline]
fn resolve(t: &HostTensor, dim: Dim) -> Option<usize> {
    let i = match dim {
        Dim::At(i) => i,
        Dim::Seq => match t.layout() {
            Some(Layout::Bhsd) => 2,
            _ => 1,
        },
    };
    (i < t.rank()).then_some(i)
}

/// Row-major contiguity (size-1 dims ignored), as `HostTensor::is_contiguous`, without
/// allocating.
#[inline]
fn contiguous(t: &HostTensor) -> bool {
    let mut expected = 1usize;
    for (&d, &s) in t.shape().iter().zip(t.strides()).rev() {
        if d > 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d.max(1));
    }
    true
}

/// Computes the fingerprint and perf values of `args`; `None` when an axis has no tensor
/// that carries it (such arguments are selected the slow way).
pub fn fingerprint(args: &OpArgs) -> Option<Typed> {
    let op = args.op();
    let (names, slots) = args.slots();
    let t = table(op, names);
    let mut perf = [0u64; MAX_AXES];
    for (p, sources) in perf.iter_mut().zip(&t.sources) {
        *p = sources.iter().find_map(|&(s, d)| {
            let x = slots.get(s).copied().flatten()?;
            resolve(x, d).map(|i| x.shape()[i] as u64)
        })?;
    }
    let n = t.sources.len().min(MAX_AXES);
    let order = order_of(op, &perf, n);
    let exact = slots.iter().flatten().any(|x| !contiguous(x));
    let mut h = Lanes::new();
    h.word((op as u64) | (u64::from(order) << 8) | (n as u64) << 16 | u64::from(exact) << 24);
    if exact {
        perf.iter().for_each(|&p| h.word(p));
    }
    for (s, slot) in slots.iter().enumerate().take(names.len()) {
        let Some(x) = slot else {
            h.word(u64::MAX);
            continue;
        };
        let layout = x.layout().map_or(0, |l| l as u64 + 1);
        h.word((x.dtype() as u64) | layout << 8 | (x.rank() as u64) << 16);
        let carriers = t.carriers.get(s).map_or(&[][..], Vec::as_slice);
        for (i, &d) in x.shape().iter().enumerate() {
            let carried = carriers.iter().find(|&&(a, dim)| resolve(x, dim) == Some(i) && d as u64 == perf[a]);
            match carried {
                Some(&(a, _)) if !exact => h.word(SYMBOL | a as u64),
                _ => h.word(d as u64),
            }
            if exact {
                h.word(x.strides()[i] as u64);
            }
        }
    }
    let mut attrs = AttrHash { lanes: h };
    args.hash_attrs(&mut attrs);
    Some(Typed { op, fingerprint: attrs.lanes.finish(), perf, axes: n as u8, order })
}

/// Marks a dimension that holds a perf axis (sizes never reach 2^63).
const SYMBOL: u64 = 1 << 63;

/// Two independent multiply-rotate lanes: a few cycles a word, 128 bits out.
#[derive(Debug, Clone, Copy)]
struct Lanes {
    a: u64,
    b: u64,
}

impl Lanes {
    fn new() -> Lanes {
        Lanes { a: 0x243f_6a88_85a3_08d3, b: 0x1319_8a2e_0370_7344 }
    }

    #[inline]
    fn word(&mut self, w: u64) {
        self.a = (self.a ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29);
        self.b = (self.b.wrapping_add(w)).wrapping_mul(0xc2b2_ae3d_27d4_eb4f).rotate_left(31);
    }

    fn finish(mut self) -> u128 {
        let (a, b) = (self.a, self.b);
        self.word(b);
        let lo = self.a;
        self.word(a);
        (u128::from(self.b) << 64) | u128::from(lo)
    }
}

/// Feeds attribute values into the fingerprint through `serde` (every field, in
/// declaration order; the struct type is fixed by the op, so names need not be hashed).
#[derive(Debug)]
pub struct AttrHash {
    lanes: Lanes,
}

impl AttrHash {
    /// Adds one attribute struct.
    pub(crate) fn add<T: Serialize>(&mut self, attrs: &T) {
        // The serializer below cannot fail: every value becomes words.
        let _ = attrs.serialize(&mut *self);
    }
}

/// The error type of [`AttrHash`]'s serializer (never produced).
#[derive(Debug)]
pub struct Never;

impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("attribute hashing does not fail")
    }
}

impl std::error::Error for Never {}

impl ser::Error for Never {
    fn custom<T: std::fmt::Display>(_: T) -> Never {
        Never
    }
}

macro_rules! words {
    ($($name:ident: $t:ty => $e:expr;)*) => {
        $(
            #[inline]
            fn $name(self, v: $t) -> Result<(), Never> {
                #[allow(clippy::redundant_closure_call)]
                self.lanes.word(($e)(v));
                Ok(())
            }
        )*
    };
}

impl ser::Serializer for &mut AttrHash {
    type Ok = ();
    type Error = Never;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    words! {
        serialize_bool: bool => u64::from;
        serialize_i8: i8 => |v: i8| v as u64;
        serialize_i16: i16 => |v: i16| v as u64;
        serialize_i32: i32 => |v: i32| v as u64;
        serialize_i64: i64 => |v: i64| v as u64;
        serialize_u8: u8 => u64::from;
        serialize_u16: u16 => u64::from;
        serialize_u32: u32 => u64::from;
        serialize_u64: u64 => |v: u64| v;
        serialize_f32: f32 => |v: f32| u64::from(v.to_bits());
        serialize_f64: f64 => f64::to_bits;
        serialize_char: char => u64::from;
    }

    fn serialize_str(self, v: &str) -> Result<(), Never> {
        self.serialize_bytes(v.as_bytes())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), Never> {
        self.lanes.word(v.len() as u64);
        for c in v.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.lanes.word(u64::from_le_bytes(w));
        }
        Ok(())
    }

    fn serialize_none(self) -> Result<(), Never> {
        self.lanes.word(0x6e6f_6e65);
        Ok(())
    }

    fn serialize_some<T: ?Sized + Serialize>(self, v: &T) -> Result<(), Never> {
        self.lanes.word(0x736f_6d65);
        v.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Never> {
        self.lanes.word(0x756e_6974);
        Ok(())
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Never> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(self, _: &'static str, index: u32, _: &'static str) -> Result<(), Never> {
        self.lanes.word(u64::from(index));
        Ok(())
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(self, _: &'static str, v: &T) -> Result<(), Never> {
        v.serialize(self)
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        index: u32,
        _: &'static str,
        v: &T,
    ) -> Result<(), Never> {
        self.lanes.word(u64::from(index));
        v.serialize(self)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Self, Never> {
        self.lanes.word(len.map_or(u64::MAX, |l| l as u64));
        Ok(self)
    }

    fn serialize_tuple(self, len: usize) -> Result<Self, Never> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Self, Never> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_variant(self, _: &'static str, index: u32, _: &'static str, len: usize) -> Result<Self, Never> {
        self.lanes.word(u64::from(index));
        self.serialize_seq(Some(len))
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Self, Never> {
        self.serialize_seq(len)
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Never> {
        Ok(self)
    }

    fn serialize_struct_variant(self, _: &'static str, index: u32, _: &'static str, _: usize) -> Result<Self, Never> {
        self.lanes.word(u64::from(index));
        Ok(self)
    }
}

macro_rules! compound {
    ($($trait:ident :: $method:ident),*) => {
        $(
            impl ser::$trait for &mut AttrHash {
                type Ok = ();
                type Error = Never;
                fn $method<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), Never> {
                    v.serialize(&mut **self)
                }
                fn end(self) -> Result<(), Never> {
                    self.lanes.word(0x656e_64);
                    Ok(())
                }
            }
        )*
    };
}

compound!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

impl ser::SerializeMap for &mut AttrHash {
    type Ok = ();
    type Error = Never;
    fn serialize_key<T: ?Sized + Serialize>(&mut self, k: &T) -> Result<(), Never> {
        k.serialize(&mut **self)
    }
    fn serialize_value<T: ?Sized + Serialize>(&mut self, v: &T) -> Result<(), Never> {
        v.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Never> {
        self.lanes.word(0x656e_64);
        Ok(())
    }
}

impl ser::SerializeStruct for &mut AttrHash {
    type Ok = ();
    type Error = Never;
    fn serialize_field<T: ?Sized + Serialize>(&mut self, _: &'static str, v: &T) -> Result<(), Never> {
        v.serialize(&mut **self)
    }
    fn skip_field(&mut self, _: &'static str) -> Result<(), Never> {
        self.lanes.word(0x736b_6970);
        Ok(())
    }
    fn end(self) -> Result<(), Never> {
        self.lanes.word(0x656e_64);
        Ok(())
    }
}

impl ser::SerializeStructVariant for &mut AttrHash {
    type Ok = ();
    type Error = Never;
    fn serialize_field<T: ?Sized + Serialize>(&mut self, _: &'static str, v: &T) -> Result<(), Never> {
        v.serialize(&mut **self)
    }
    fn end(self) -> Result<(), Never> {
        self.lanes.word(0x656e_64);
        Ok(())
    }
}

/// A direct-mapped, lock-free memo from fingerprint to validity hash. Each slot is a
/// sequence lock over four words: readers retry nothing (a torn read is a miss), writers
/// that find a slot busy skip it.
#[derive(Debug)]
pub struct KeyMemo {
    slots: Box<[MemoSlot]>,
    mask: usize,
}

#[derive(Debug, Default)]
struct MemoSlot {
    seq: AtomicU64,
    words: [AtomicU64; 4],
}

impl KeyMemo {
    /// A memo of `capacity` slots (rounded up to a power of two, at least 1).
    pub fn new(capacity: usize) -> KeyMemo {
        let n = capacity.max(1).next_power_of_two();
        KeyMemo { slots: (0..n).map(|_| MemoSlot::default()).collect(), mask: n - 1 }
    }

    #[inline]
    fn slot(&self, fingerprint: u128) -> Option<&MemoSlot> {
        self.slots.get((fingerprint as usize ^ (fingerprint >> 64) as usize) & self.mask)
    }

    /// The validity hash memoized for `fingerprint`.
    #[inline]
    pub fn get(&self, fingerprint: u128) -> Option<u128> {
        let s = self.slot(fingerprint)?;
        let before = s.seq.load(Ordering::Acquire);
        if before == 0 || before & 1 == 1 {
            return None;
        }
        let w: [u64; 4] = std::array::from_fn(|i| s.words[i].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        if s.seq.load(Ordering::Relaxed) != before {
            return None;
        }
        let f = (u128::from(w[0]) << 64) | u128::from(w[1]);
        (f == fingerprint).then_some((u128::from(w[2]) << 64) | u128::from(w[3]))
    }

    /// Memoizes `validity` for `fingerprint` (skipped when another writer holds the slot).
    pub fn insert(&self, fingerprint: u128, validity: u128) {
        let Some(s) = self.slot(fingerprint) else { return };
        let seq = s.seq.load(Ordering::Relaxed);
        if seq & 1 == 1 || s.seq.compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return;
        }
        fence(Ordering::Release);
        let w = [(fingerprint >> 64) as u64, fingerprint as u64, (validity >> 64) as u64, validity as u64];
        for (slot, v) in s.words.iter().zip(w) {
            slot.store(v, Ordering::Relaxed);
        }
        s.seq.store(seq + 2, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::exec::args::{AttentionArgs, NormArgs};
    use crate::model::attrs::{AttentionAttrs, NormAttrs};
    use crate::model::dtype::DType;

    fn t(dtype: DType, shape: &[usize], layout: Option<Layout>) -> HostTensor {
        let x = HostTensor::zeros(dtype, shape).unwrap();
        match layout {
            Some(l) => x.with_layout(l),
            None => x,
        }
    }

    fn attention(b: usize, sq: usize, sk: usize, layout: Layout, causal: bool, dtype: DType) -> OpArgs {
        let shape = |s: usize, h: usize| if layout == Layout::Bhsd { [b, h, s, 16] } else { [b, s, h, 16] };
        OpArgs::Attention(AttentionArgs {
            q: t(dtype, &shape(sq, 4), Some(layout)),
            k: t(dtype, &shape(sk, 2), Some(layout)),
            v: t(dtype, &shape(sk, 2), Some(layout)),
            mask: None,
            cu_seqlens_q: None,
            cu_seqlens_k: None,
            attrs: AttentionAttrs { causal, ..AttentionAttrs::default() },
        })
    }

    fn cases() -> Vec<OpArgs> {
        let mut out = Vec::new();
        for (b, sq, sk) in [(1, 1, 1), (1, 1, 7), (1, 4, 4), (2, 3, 3), (1, 2, 4), (1, 4, 2), (4, 2, 2), (1, 2, 2)] {
            for layout in [Layout::Bshd, Layout::Bhsd] {
                for causal in [false, true] {
                    for dtype in [DType::F32, DType::BF16] {
                        out.push(attention(b, sq, sk, layout, causal, dtype));
                    }
                }
            }
        }
        // Strided views: a permuted q keeps its exact strides in the key.
        for s in [2, 3, 4] {
            let OpArgs::Attention(mut a) = attention(1, s, s, Layout::Bshd, true, DType::F32) else { continue };
            a.q = t(DType::F32, &[1, 4, s, 16], None).permute(&[0, 2, 1, 3]).unwrap().with_layout(Layout::Bshd);
            out.push(OpArgs::Attention(a));
        }
        for (rows, h, eps) in
            [(1, 8, None), (3, 8, None), (4, 8, None), (4, 16, None), (4, 8, Some(1e-5)), (1, 1, None)]
        {
            out.push(OpArgs::RmsNorm(NormArgs {
                x: t(DType::F32, &[rows, h], None),
                weight: t(DType::F32, &[h], None),
                bias: None,
                residual: None,
                attrs: NormAttrs { eps },
            }));
        }
        out
    }

    #[test]
    fn one_fingerprint_always_means_one_validity_hash() {
        let mut validity_of: HashMap<u128, u128> = HashMap::new();
        let mut fingerprint_of: HashMap<u128, u128> = HashMap::new();
        for args in cases() {
            let typed = fingerprint(&args).unwrap();
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
