//! The ROCm backend: AMD GPU probing through `rocmrc` with dynamic loading (builds and runs
//! with no ROCm installed; reports itself unavailable with a reason).

pub mod probe;
