//! Selection keys (DESIGN invariant 5): every field a check reads, exact, plus the perf
//! axes bucketed. Two requests with the same key get the same verdict from every check.
//!
//! The exact part (`validity`) is a 128-bit stable hash of a canonical walk of the request:
//! op; per tensor its name, dtype, layout, device, and each dimension either as "perf axis
//! a" (at a position that carries axis a and holds its value) or as its exact size; per
//! dimension the stride as zero, as a ratio to the contiguous stride, or exact; the
//! attributes (every field, exact); and the order relations between perf values (seq_q vs
//! seq_k). The perf part is the bucket of each axis (see [`bucket`]; the axes of each op: [`axes`]).
//! Checks that read sizes compare them with other sizes (captured by the symbols and
//! relations), with 1 (bucket 0 is exactly 1) or with capability ranges whose bounds are
//! bucket edges (a test over the builtin catalog keeps it so).

pub mod axes;
pub mod bucket;

use std::fmt;

use crate::model::layout::contiguous_strides;
use crate::model::op::Op;
use crate::model::request::Request;
use axes::MAX_AXES;

/// Version of the canonical walk; part of every persisted key's meaning.
pub const KEY_FORMAT: u32 = 1;

/// A request's selection key, before the context (hardware, capabilities, policy) is mixed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SelectionKey {
    /// The op.
    pub op: Op,
    /// Hash of everything exact.
    pub validity: u128,
    /// The perf values, one per axis of the op (exact; bucketed at lookup).
    pub perf: [u64; MAX_AXES],
    /// How many of `perf` are used.
    pub axes: u8,
    /// The order of the related perf values (seq_q vs seq_k) the validity hash was derived
    /// with; a key whose `perf` was changed to another order has no buckets (it must be
    /// derived again), so a reused key can never skip a check that reads that order.
    pub order: u8,
}

/// The buckets of a key: one per axis; `None` when a value is outside its anchor's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Buckets(pub [u8; MAX_AXES]);

impl SelectionKey {
    /// Derives the key of `req`. Never panics; a request missing its axis tensors gets an
    /// exact key (no perf axes).
    pub fn derive(req: &Request) -> SelectionKey {
        let (perf, n) = axes::values(req).unwrap_or(([0; MAX_AXES], 0));
        let mut h = StableHasher::new();
        h.word(u64::from(KEY_FORMAT));
        h.bytes(req.op.as_str().as_bytes());
        h.word(n as u64);
        for (name, t) in &req.tensors {
            h.bytes(name.as_bytes());
            h.bytes(t.dtype.as_str().as_bytes());
            h.bytes(t.layout.map_or("-", |l| l.as_str()).as_bytes());
            match t.device {
                Some(d) => {
                    h.bytes(d.kind.as_str().as_bytes());
                    h.word(d.index.map_or(u64::MAX, u64::from));
                }
                None => h.word(u64::MAX - 1),
            }
            h.word(t.rank() as u64);
            // Which dimension carries which axis (at most one axis per dimension).
            let mut carries = [None::<usize>; 8];
            for (a, axis) in axes::axes(req.op).iter().enumerate().take(n) {
                for (tn, dim) in axis.at {
                    if *tn == name.as_str()
                        && let Some(i) = axes::resolve(t, *dim)
                        && i < carries.len()
                        && t.shape[i] == perf[a]
                    {
                        carries[i].get_or_insert(a);
                    }
                }
            }
            let contiguous = t.strides.as_ref().map(|_| contiguous_strides(&t.shape)).unwrap_or_default();
            for (i, &d) in t.shape.iter().enumerate() {
                match carries.get(i).copied().flatten() {
                    Some(a) => h.tagged(1, a as u64),
                    None => h.tagged(2, d),
                }
                if let Some(strides) = &t.strides {
                    let s = strides.get(i).copied().unwrap_or(0);
                    let c = contiguous.get(i).copied().unwrap_or(0);
                    if s == 0 {
                        h.tagged(3, 0);
                    } else if c > 0 && s % c == 0 {
                        h.tagged(4, s / c);
                    } else {
                        h.tagged(5, s);
                    }
                }
            }
            h.word(u64::from(t.strides.is_some()));
        }
        // Attributes as JSON streamed into the hasher (no allocation; fields in declaration
        // order, shortest round-trip floats). A table whose keys no longer match its
        // requests' re-derived keys is caught at load, so this form may change between versions.
        let mut w = AttrWriter { h: &mut h, word: 0, filled: 0, total: 0 };
        let _ = serde_json::to_writer(&mut w, &req.attrs);
        w.finish();
        let order = order_of(req.op, &perf, n);
        h.word(u64::from(order));
        SelectionKey { op: req.op, validity: h.finish128(), perf, axes: n as u8, order }
    }

    /// The buckets of the perf values; `None` when one is outside its bounds or the values'
    /// order is not the one the key was derived with.
    #[inline]
    pub fn buckets(&self) -> Option<Buckets> {
        if order_of(self.op, &self.perf, self.axes as usize) != self.order {
            return None;
        }
        let mut out = [0u8; MAX_AXES];
        for (i, axis) in axes::axes(self.op).iter().enumerate().take(self.axes as usize) {
            out[i] = axis.anchor.bucket(self.perf[i])?;
        }
        Some(Buckets(out))
    }

    /// The validity hash as 32 hex digits (tables and PerfDB rows).
    pub fn validity_hex(&self) -> String {
        format!("{:032x}", self.validity)
    }
}

/// The orderings of the related perf values, two bits each.
#[inline]
pub(crate) fn order_of(op: Op, perf: &[u64; MAX_AXES], n: usize) -> u8 {
    let mut order = 0u8;
    for (k, &(i, j)) in axes::relations(op).iter().enumerate().take(4) {
        if i < n && j < n {
            order |= ((perf[i].cmp(&perf[j]) as i8 + 1) as u8) << (2 * k);
        }
    }
    order
}

impl Buckets {
    /// The buckets packed in one word (hashing, cache slots).
    #[inline]
    pub fn word(&self) -> u64 {
        self.0.iter().fold(0u64, |w, &b| (w << 8) | u64::from(b))
    }

    /// The buckets of [`Buckets::word`].
    #[inline]
    pub fn from_word(w: u64) -> Buckets {
        let mut out = [0u8; MAX_AXES];
        for (i, b) in out.iter_mut().enumerate() {
            *b = (w >> (8 * (MAX_AXES - 1 - i))) as u8;
        }
        Buckets(out)
    }

    /// `batch=1,seq_q=513..1024,seq_k=513..1024`: the bucket as written in tables and rows.
    pub fn text(&self, op: Op) -> String {
        let parts: Vec<String> = axes::axes(op)
            .iter()
            .zip(self.0)
            .map(|(axis, b)| {
                let (lo, hi) = axis.anchor.range(b);
                format!("{}={}", axis.name, bucket::range_text(lo, hi))
            })
            .collect();
        if parts.is_empty() { "exact".to_owned() } else { parts.join(",") }
    }
}

impl fmt::Display for SelectionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{:032x}", self.op, self.validity)
    }
}

/// A fixed-key 128-bit hasher (two independent 64-bit lanes): the same bytes give the same
/// hash in every process and on every machine, unlike `std`'s randomized hasher.
#[derive(Debug, Clone, Copy)]
pub struct StableHasher {
    a: u64,
    b: u64,
}

const K1: u64 = 0x9e37_79b9_7f4a_7c15;
const K2: u64 = 0xc2b2_ae3d_27d4_eb4f;

impl StableHasher {
    /// A hasher in its initial state.
    pub fn new() -> StableHasher {
        StableHasher { a: 0x243f_6a88_85a3_08d3, b: 0x1319_8a2e_0370_7344 }
    }

    /// Mixes one word.
    #[inline]
    pub fn word(&mut self, w: u64) {
        self.a = mix(self.a ^ w, K1);
        self.b = mix(self.b.wrapping_add(w), K2);
    }

    fn tagged(&mut self, tag: u64, w: u64) {
        self.word(tag);
        self.word(w);
    }

    /// Mixes a length-prefixed byte string.
    pub fn bytes(&mut self, bytes: &[u8]) {
        self.word(bytes.len() as u64);
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.word(u64::from_le_bytes(w));
        }
    }

    /// The 128-bit result.
    pub fn finish128(&self) -> u128 {
        let a = mix(self.a ^ self.b.rotate_left(29), K2);
        let b = mix(self.b ^ self.a.rotate_left(17), K1);
        (u128::from(a) << 64) | u128::from(b)
    }
}

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher::new()
    }
}

/// Feeds a byte stream into a hasher a word at a time (serde_json writes many tiny pieces).
struct AttrWriter<'a> {
    h: &'a mut StableHasher,
    word: u64,
    filled: u32,
    total: u64,
}

impl AttrWriter<'_> {
    fn finish(self) {
        if self.filled > 0 {
            self.h.word(self.word);
        }
        self.h.word(self.total);
    }
}

impl std::io::Write for AttrWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for &b in buf {
            self.word |= u64::from(b) << (8 * self.filled);
            self.filled += 1;
            if self.filled == 8 {
                self.h.word(self.word);
                self.word = 0;
                self.filled = 0;
            }
        }
        self.total += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One round of a multiply-xorshift mixer (full-width multiply, fold the halves).
#[inline]
fn mix(x: u64, k: u64) -> u64 {
    let m = u128::from(x ^ (x >> 32)).wrapping_mul(u128::from(k));
    let y = (m as u64) ^ ((m >> 64) as u64);
    y ^ (y >> 29)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use crate::model::attrs::{AttentionAttrs, Attrs};
    use crate::model::dtype::DType;
    use crate::model::layout::Layout;
    use crate::model::tensor::TensorDesc;

    fn attention(b: u64, sq: u64, sk: u64, causal: bool) -> Request {
        let t = |s: u64, h: u64| TensorDesc::new(DType::BF16, [b, s, h, 128]).with_layout(Layout::Bshd);
        Request::new(Op::Attention)
            .tensor("q", t(sq, 32))
            .tensor("k", t(sk, 8))
            .tensor("v", t(sk, 8))
            .attrs(Attrs::Attention(AttentionAttrs { causal, ..AttentionAttrs::default() }))
    }

    #[test]
    fn sizes_within_a_bucket_share_a_key_and_its_buckets() -> TestResult {
        let a = SelectionKey::derive(&attention(2, 600, 600, true));
        let b = SelectionKey::derive(&attention(2, 1000, 1000, true));
        assert_eq!(a.validity, b.validity);
        assert_eq!(a.buckets(), b.buckets());
        assert_eq!(
            a.buckets().ok_or("the key has no buckets")?.text(Op::Attention),
            "batch=2,seq_q=513..1024,seq_k=513..1024"
        );
        Ok(())
    }

    #[test]
    fn every_exact_field_changes_the_key() -> TestResult {
        let base = SelectionKey::derive(&attention(1, 64, 64, true)).validity;
        assert_ne!(base, SelectionKey::derive(&attention(1, 64, 64, false)).validity, "attrs");
        let mut r = attention(1, 64, 64, true);
        r.tensors.get_mut("q").ok_or("no q")?.shape[3] = 64;
        r.tensors.get_mut("k").ok_or("no k")?.shape[3] = 64;
        r.tensors.get_mut("v").ok_or("no v")?.shape[3] = 64;
        assert_ne!(base, SelectionKey::derive(&r).validity, "head_dim");
        let mut r = attention(1, 64, 64, true);
        r.tensors.get_mut("v").ok_or("no v")?.strides = Some(vec![64 * 3072, 3072, 128, 1]);
        assert_ne!(base, SelectionKey::derive(&r).validity, "strides");
        let mut r = attention(1, 64, 64, true);
        r.tensors.get_mut("q").ok_or("no q")?.dtype = DType::F16;
        assert_ne!(base, SelectionKey::derive(&r).validity, "dtype");
        Ok(())
    }

    #[test]
    fn the_order_of_sequence_lengths_is_part_of_the_key() {
        // seq_q == seq_k, < and > read differently by causal checks.
        let eq = SelectionKey::derive(&attention(1, 64, 64, true)).validity;
        let lt = SelectionKey::derive(&attention(1, 63, 64, true)).validity;
        let gt = SelectionKey::derive(&attention(1, 64, 63, true)).validity;
        assert!(eq != lt && lt != gt && eq != gt);
    }

    #[test]
    fn a_reused_key_whose_sequence_order_changed_has_no_bucket() {
        let k = SelectionKey::derive(&attention(1, 64, 64, true));
        assert!(SelectionKey { perf: [1, 600, 600], ..k }.buckets().is_some());
        assert!(SelectionKey { perf: [1, 600, 700], ..k }.buckets().is_none(), "seq_q < seq_k needs its own key");
    }
}
