//! Hardware as data: profiles (shipped and named, or detected from this host).

pub mod cap;
pub mod detect;
pub mod measure;
pub mod memory;
pub mod named;
pub mod profile;
