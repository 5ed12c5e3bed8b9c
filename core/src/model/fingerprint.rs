//! The words a typed fingerprint is made of (`plan::typed`), and every attribute type as
//! words: the hashing sits beside the vocabulary it hashes, so adding a field to an
//! attribute struct does not compile until the field is hashed.

use super::attrs::{
    Activation, AttentionAttrs, CausalAlignment, GegluAttrs, GeluApproximate, GeluAttrs, Int4Attrs, MlpAttrs,
    MoeRouteAttrs, NoAttrs, NormAttrs, PatchEmbedAttrs, QuantAttrs, QuantScheme, RopeAttrs, RopeScaling, RopeStyle,
    SampleAttrs, ScaleLayout, SwigluAttrs, TokenizeAttrs, W8a8Attrs,
};
use super::dtype::DType;
use super::w4::{ActQuant, ScaleOrder, W4Format};

/// Most words a fingerprint reads.
const SIG_WORDS: usize = 40;

/// The words a fingerprint is made of, gathered on the stack, then hashed in one pass.
#[derive(Debug)]
pub(crate) struct Sig {
    words: [u64; SIG_WORDS],
    n: usize,
}

const LANE_K: [u64; 4] = [0x9e37_79b9_7f4a_7c15, 0xc2b2_ae3d_27d4_eb4f, 0x1656_67b1_9e37_79f9, 0x27d4_eb2f_1656_67c5];

impl Sig {
    pub(crate) fn new() -> Sig {
        Sig { words: [0; SIG_WORDS], n: 0 }
    }

    #[inline]
    pub(crate) fn push(&mut self, w: u64) {
        if let Some(slot) = self.words.get_mut(self.n) {
            *slot = w;
        }
        self.n += 1;
    }

    /// 128 bits from four independent multiply-rotate lanes (one word each per round, so
    /// the multiplies of a round run side by side); `None` past the word budget.
    pub(crate) fn finish(&self) -> Option<u128> {
        // Words past `n` are still zero: round up to whole rounds.
        let words = self.words.get(..(self.n + 3) & !3)?;
        let [mut a, mut b, mut c, mut d] =
            [0x243f_6a88_85a3_08d3u64, 0x1319_8a2e_0370_7344, 0xa409_3822_299f_31d0, 0x082e_fa98_ec4e_6c89];
        let lane = |s: u64, w: u64, k: u64| (s ^ w).wrapping_mul(k).rotate_left(31);
        for w in words.chunks_exact(4) {
            a = lane(a, w[0], LANE_K[0]);
            b = lane(b, w[1], LANE_K[1]);
            c = lane(c, w[2], LANE_K[2]);
            d = lane(d, w[3], LANE_K[3]);
        }
        let n = self.n as u64;
        a = lane(a, n, LANE_K[0]);
        b = lane(b, !n, LANE_K[1]);
        c = lane(c, n.rotate_left(32), LANE_K[2]);
        d = lane(d, 0x5bd1_e995, LANE_K[3]);
        // Two full-width products, each of all four lanes, side by side.
        let fold = |x: u64, y: u64, k: u64| {
            let m = u128::from(x ^ y.rotate_left(17)).wrapping_mul(u128::from(k));
            (m as u64) ^ ((m >> 64) as u64)
        };
        let lo = fold(a ^ c.rotate_left(7), b ^ d.rotate_left(41), LANE_K[1]);
        let hi = fold(b ^ a.rotate_left(23), d ^ c.rotate_left(53), LANE_K[3]);
        Some((u128::from(hi) << 64) | u128::from(lo))
    }
}

/// Attribute values as fingerprint words: every field, exactly (floats by their bits).
/// Struct impls destructure without `..`, so a new field cannot be forgotten: it does not
/// compile until it is hashed.
pub(crate) trait Words {
    /// Pushes the value's words.
    fn words(&self, sig: &mut Sig);
}

impl Words for bool {
    fn words(&self, sig: &mut Sig) {
        sig.push(u64::from(*self));
    }
}

impl Words for u64 {
    fn words(&self, sig: &mut Sig) {
        sig.push(*self);
    }
}

impl Words for f64 {
    fn words(&self, sig: &mut Sig) {
        sig.push(self.to_bits());
    }
}

impl Words for String {
    fn words(&self, sig: &mut Sig) {
        sig.push(self.len() as u64);
        for c in self.as_bytes().chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            sig.push(u64::from_le_bytes(w));
        }
    }
}

impl<const N: usize> Words for [u64; N] {
    fn words(&self, sig: &mut Sig) {
        self.iter().for_each(|&w| sig.push(w));
    }
}

impl<T: Words> Words for Option<T> {
    fn words(&self, sig: &mut Sig) {
        match self {
            None => sig.push(0x6e6f_6e65),
            Some(v) => {
                sig.push(0x736f_6d65);
                v.words(sig);
            }
        }
    }
}

macro_rules! unit_enums {
    ($($t:ty),*) => {
        $(
            impl Words for $t {
                fn words(&self, sig: &mut Sig) {
                    sig.push(*self as u64);
                }
            }
        )*
    };
}

unit_enums!(
    DType,
    CausalAlignment,
    RopeStyle,
    GeluApproximate,
    QuantScheme,
    ScaleLayout,
    Activation,
    W4Format,
    ScaleOrder,
    ActQuant
);

macro_rules! struct_words {
    ($($t:ident { $($f:ident),* })*) => {
        $(
            impl Words for $t {
                #[allow(unused_variables)]
                fn words(&self, sig: &mut Sig) {
                    let $t { $($f),* } = self;
                    $( $f.words(sig); )*
                }
            }
        )*
    };
}

struct_words! {
    AttentionAttrs { causal, causal_alignment, dropout_p, window_left, softcap, alibi, scale, rope, mask_block }
    NormAttrs { eps }
    RopeAttrs { style, rotary_dim, base, scaling }
    SwigluAttrs { split }
    GeluAttrs { approximate }
    SampleAttrs { temperature, top_k, top_p, min_p, seed }
    QuantAttrs { scheme, block, scale_layout, target, out_dtype, format, scale_order }
    GegluAttrs { split, approximate }
    MlpAttrs { activation }
    MoeRouteAttrs { top_k, renormalize }
    TokenizeAttrs { tokenizer_id, return_offsets }
    W8a8Attrs { out_dtype, group_size }
    Int4Attrs { group_size, format, scale_order, activations }
    PatchEmbedAttrs { patch }
    NoAttrs {}
}

impl Words for RopeScaling {
    fn words(&self, sig: &mut Sig) {
        match self {
            RopeScaling::Linear { factor } => {
                sig.push(1);
                factor.words(sig);
            }
            RopeScaling::DynamicNtk { factor, original_max_position } => {
                sig.push(2);
                factor.words(sig);
                original_max_position.words(sig);
            }
            RopeScaling::Yarn { factor, original_max_position, beta_fast, beta_slow } => {
                sig.push(3);
                [factor, beta_fast, beta_slow].iter().for_each(|f| f.words(sig));
                original_max_position.words(sig);
            }
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                sig.push(4);
                [factor, low_freq_factor, high_freq_factor].iter().for_each(|f| f.words(sig));
                original_max_position.words(sig);
            }
        }
    }
}
