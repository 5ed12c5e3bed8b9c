//! Hardware as data: profiles (shipped and named; detected ones come from `host::detect`),
//! the ISA ceiling, and the memory gauge selection reads.

pub mod cap;
pub mod memory;
pub mod named;
pub mod profile;
