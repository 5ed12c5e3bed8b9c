//! Layout tags: what each dimension of a tensor's shape means.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The meaning of a tensor's dimensions. Layouts are always explicit: LayerZero never
/// guesses them from shapes or strides (a contiguous BSHD and BHSD look the same when S == H);
/// an untagged tensor means its op's documented default (`model::problem::layout_of`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Layout {
    /// [batch, seq, heads, head_dim].
    #[serde(rename = "BSHD")]
    Bshd,
    /// [batch, heads, seq, head_dim].
    #[serde(rename = "BHSD")]
    Bhsd,
    /// Paged KV cache [num_pages, page_size, kv_heads, head_dim].
    #[serde(rename = "NHD")]
    Nhd,
    /// Paged KV cache [num_pages, kv_heads, page_size, head_dim].
    #[serde(rename = "HND")]
    Hnd,
    /// Linear weight [out_features, in_features] (x @ W^T).
    #[serde(rename = "NT")]
    Nt,
    /// Linear weight [in_features, out_features] (x @ W).
    #[serde(rename = "NN")]
    Nn,
    /// Image, channels first: [batch, channels, height, width] (PyTorch's default).
    #[serde(rename = "NCHW")]
    Nchw,
    /// Image, channels last: [batch, height, width, channels].
    #[serde(rename = "NHWC")]
    Nhwc,
}

impl Layout {
    /// Every layout, in declaration order.
    pub const ALL: [Layout; 8] =
        [Layout::Bshd, Layout::Bhsd, Layout::Nhd, Layout::Hnd, Layout::Nt, Layout::Nn, Layout::Nchw, Layout::Nhwc];

    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Bshd => "BSHD",
            Layout::Bhsd => "BHSD",
            Layout::Nhd => "NHD",
            Layout::Hnd => "HND",
            Layout::Nt => "NT",
            Layout::Nn => "NN",
            Layout::Nchw => "NCHW",
            Layout::Nhwc => "NHWC",
        }
    }

    /// Parses the stable name.
    pub fn from_name(name: &str) -> Option<Layout> {
        Layout::ALL.iter().copied().find(|l| l.as_str() == name)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Row-major strides (in elements) of a contiguous tensor of `shape`.
pub fn contiguous_strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    strides
}
