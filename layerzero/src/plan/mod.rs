//! Plans: selection keys, perf-axis buckets, workloads, dispatch tables and the selection
//! cache. Pure except for [`table`]'s file loading.
//!
//! DESIGN: validity fields are exact, perf fields (batch, sequence lengths, tokens) are
//! bucketed; a dispatch table maps (op, validity key, bucket) to a kernel; a lookup is a
//! hash probe plus a bucket index.

pub mod axes;
pub mod bucket;
pub mod key;
pub mod workload;

pub use key::{Buckets, SelectionKey};
