//! oneDNN (`libdnnl`), loaded at run time: finding the library, reading its version, and the
//! executors of the `onednn` kernels. Nothing links against it: without it the crate builds,
//! and the backend reports itself not installed with every path tried.
//!
//! Search order ([`Search`], resolved by the runtime and handed in): `LAYERZERO_ONEDNN_LIB`
//! (a file), the loader's default paths (`libdnnl.so.3`, `libdnnl.so.2`), then the `lib/`
//! folder of the active Python environment (`$VIRTUAL_ENV`, then `$CONDA_PREFIX`), where the
//! `onednn-cpu-gomp` wheel puts `libdnnl.so.3`.
//!
//! | file | what |
//! |---|---|
//! | `loader.rs` | finding and opening the library, `dnnl_version()` |
//! | `api.rs` | the C API: entry points, engine, descriptors, primitives, `execute` |
//! | `jit.rs` | the primitive cache (oneDNN's JIT as LayerZero's): keys, counters, failures remembered |
//! | `matmul.rs` | `linear` and `linear_w8a8` (matmul primitive), packed weights |
//! | `rows.rs` | `layer_norm`, `gelu`, `silu`, `swiglu`, `geglu` in power-of-two row chunks |
//! | `buffers.rs` | tensors as raw buffers |

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod api;
mod buffers;
mod jit;
mod loader;
mod matmul;
mod rows;

use std::sync::{Arc, OnceLock};

pub use api::Dnnl;
pub use jit::{JitStats, MAX_PRIMITIVES, jit_stats};
pub use loader::{Loaded, Search, candidates, find};
pub use matmul::{Matmul, PackedStats, packed_stats};
pub use rows::{Kind, Rows};

/// The library names tried through the loader (those of `capabilities/onednn.json`).
const NAMES: [&str; 2] = ["libdnnl.so.3", "libdnnl.so.2"];

static SEARCH: OnceLock<Search> = OnceLock::new();

/// Sets where the process-wide library is looked for, once and before it is first opened
/// (the runtime hands it the process's settings); `false` when a search was already in
/// force, which then stays.
pub fn configure(search: Search) -> bool {
    let wanted = search.clone();
    SEARCH.set(search).is_ok() || SEARCH.get() == Some(&wanted)
}

/// The process-wide library and engine, when oneDNN loads and its entry points resolve.
pub fn dnnl() -> Result<Arc<Dnnl>, String> {
    static DNNL: OnceLock<Result<Arc<Dnnl>, String>> = OnceLock::new();
    DNNL.get_or_init(|| {
        let names: Vec<String> = NAMES.iter().map(|n| (*n).to_owned()).collect();
        let lib = Arc::new(find(SEARCH.get_or_init(Search::default), &names)?);
        Dnnl::new(lib).map(Arc::new)
    })
    .clone()
}

/// The row-wise kinds LayerZero runs through oneDNN primitives.
const ROW_KINDS: [Kind; 5] = [Kind::LayerNorm, Kind::Gelu, Kind::Silu, Kind::Swiglu, Kind::Geglu];

/// The kernels [`register`] binds when the library is there: what LayerZero can run through
/// oneDNN, known without loading it.
pub fn kernels() -> impl Iterator<Item = &'static str> {
    [matmul::LINEAR, matmul::W8A8].into_iter().chain(ROW_KINDS.map(|k| k.id()))
}

/// Registers the executors of the oneDNN kernels when the library is there.
pub fn register(r: &mut layerzero_core::exec::executor::Registry) {
    let Ok(d) = dnnl() else { return };
    r.register(matmul::LINEAR, Arc::new(Matmul::linear(d.clone())));
    r.register(matmul::W8A8, Arc::new(Matmul::w8a8(d.clone())));
    for kind in ROW_KINDS {
        let exec = Rows::new(d.clone(), kind);
        r.register(exec.id(), Arc::new(exec));
    }
}
