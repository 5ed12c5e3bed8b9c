//! Plans: workloads, dispatch tables and the selection cache, over the keys of [`crate::key`].
//! Pure except for reading table files.
//!
//! A dispatch table maps (op, validity key, bucket) to a kernel; a lookup is a hash probe
//! plus a bucket index.

pub mod cache;
mod seqlock;
pub mod solve;
pub mod table;
pub mod typed;
pub mod workload;

use std::hash::Hasher;
use std::sync::Arc;

pub use crate::key::{Buckets, SelectionKey};
pub use cache::SelectionCache;
pub use table::{DispatchTable, Plan};

use serde::Serialize;

use crate::exec::executor::Executor;
use crate::select::Selection;

/// How a runtime uses a dispatch table (`LAYERZERO_PLAN_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanMode {
    /// Tables are not used.
    Off,
    /// A table serves what it has; a mismatched table or a miss selects live, with a reason.
    #[default]
    Prefer,
    /// A mismatched table is refused at load and a miss is an error.
    Strict,
}

impl std::str::FromStr for PlanMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<PlanMode, String> {
        match s {
            "off" => Ok(PlanMode::Off),
            "prefer" => Ok(PlanMode::Prefer),
            "strict" => Ok(PlanMode::Strict),
            other => Err(format!("plan mode {other:?} is not one of off, prefer, strict")),
        }
    }
}

/// A plan or cache entry: the selection and the executor it resolved to when the entry was
/// made, so serving it needs no registry lookup.
#[derive(Clone)]
pub struct Resolved {
    /// The selection.
    pub selection: Arc<Selection>,
    /// The executor of its kernel (`None`: none is registered in this process).
    pub executor: Option<Arc<dyn Executor>>,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("selection", &self.selection)
            .field("executor", &self.executor.is_some())
            .finish()
    }
}

/// A hasher for keys that are already hashes: folds words with one multiply each. Plan and
/// cache probes cost nanoseconds; SipHash would double them.
#[derive(Debug, Default, Clone, Copy)]
pub struct FoldHasher(u64);

impl Hasher for FoldHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u64(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(23) ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    #[inline]
    fn write_u128(&mut self, w: u128) {
        self.write_u64(w as u64);
        self.write_u64((w >> 64) as u64);
    }

    #[inline]
    fn write_u8(&mut self, w: u8) {
        self.write_u64(u64::from(w));
    }

    #[inline]
    fn write_usize(&mut self, w: usize) {
        self.write_u64(w as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 31)
    }
}
