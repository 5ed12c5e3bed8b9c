//! Backends at the edge: probing what is installed on this host. The only place `unsafe`
//! may appear (leaf modules, each block with a SAFETY comment).

pub mod cpu;
pub mod cpu_reference;
pub mod cuda;
mod gpus;
pub mod library;
pub mod onednn;
pub mod rocm;
