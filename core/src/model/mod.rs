//! The vocabulary: ops, dtypes, layouts, devices, tensor descriptors, requests, and the
//! validated problem a request poses.

pub mod attrs;
pub mod device;
pub mod dtype;
pub(crate) mod fingerprint;
pub mod layout;
pub mod op;
pub mod problem;
pub mod request;
pub mod tensor;
pub mod w4;
