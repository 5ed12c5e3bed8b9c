//! Tensor descriptors: what selection knows about a tensor (never its data).

use serde::{Deserialize, Serialize};

use super::device::DeviceRef;
use super::dtype::DType;
use super::layout::{Layout, contiguous_strides};

/// A tensor as a request describes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorDesc {
    /// Element type.
    pub dtype: DType,
    /// Sizes, outermost first.
    pub shape: Vec<u64>,
    /// What the dimensions mean; required where an op has more than one possible meaning
    /// and no default (an untagged `patch_embed` image is NCHW, PyTorch's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<Layout>,
    /// Strides in elements, one per dimension; absent means contiguous row-major.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strides: Option<Vec<u64>>,
    /// Where the tensor lives; absent means the hardware profile's primary device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceRef>,
}

impl TensorDesc {
    /// A contiguous tensor on the primary device.
    pub fn new(dtype: DType, shape: impl Into<Vec<u64>>) -> TensorDesc {
        TensorDesc { dtype, shape: shape.into(), layout: None, strides: None, device: None }
    }

    /// The same tensor with a layout tag.
    pub fn with_layout(mut self, layout: Layout) -> TensorDesc {
        self.layout = Some(layout);
        self
    }

    /// The same tensor with explicit strides.
    pub fn with_strides(mut self, strides: impl Into<Vec<u64>>) -> TensorDesc {
        self.strides = Some(strides.into());
        self
    }

    /// The same tensor on an explicit device.
    pub fn on(mut self, device: DeviceRef) -> TensorDesc {
        self.device = Some(device);
        self
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (saturating).
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// Bytes the elements occupy when contiguous (saturating).
    pub fn bytes(&self) -> u64 {
        self.numel().saturating_mul(self.dtype.size_bytes())
    }

    /// The stride of the last dimension (1 when strides are absent).
    pub fn last_stride(&self) -> u64 {
        match &self.strides {
            Some(s) => s.last().copied().unwrap_or(1),
            None => 1,
        }
    }

    /// True when the last dimension is unit-stride (or has size 1, where stride is moot).
    pub fn last_dim_contiguous(&self) -> bool {
        self.last_stride() == 1 || self.shape.last().is_some_and(|&d| d <= 1)
    }

    /// True when the strides are those of a contiguous row-major tensor (size-1 dims ignored).
    pub fn is_contiguous(&self) -> bool {
        let Some(strides) = &self.strides else { return true };
        let expected = contiguous_strides(&self.shape);
        strides.iter().zip(&expected).zip(&self.shape).all(|((s, e), &d)| d <= 1 || s == e)
    }
}
