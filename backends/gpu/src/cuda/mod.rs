//! The CUDA backend: driver probing through `cudarc` with dynamic loading (builds and runs
//! with no CUDA installed; reports itself unavailable with a reason).

pub mod probe;
