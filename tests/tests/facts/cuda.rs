//! Our CUDA kernels' facts (`capabilities/cuda.json`), each held to the line of our code that
//! implements or enforces it.

use super::*;

pub(super) fn facts() -> Vec<Fact> {
    vec![]
}
