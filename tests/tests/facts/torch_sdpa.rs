//! PyTorch SDPA facts (`capabilities/torch_sdpa.json`) on CUDA, CPU and ROCm, each held to its
//! upstream line.

use super::*;

pub(super) fn facts() -> Vec<Fact> {
    vec![]
}
