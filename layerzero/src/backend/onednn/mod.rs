//! oneDNN (`libdnnl`), loaded at run time: finding the library and reading its version.
//! Nothing links against it: without it the crate builds, and the backend reports itself
//! not installed with every path tried.
//!
//! Search order: `LAYERZERO_ONEDNN_LIB` (a file), the loader's default paths
//! (`libdnnl.so.3`, `libdnnl.so.2`), then the `lib/` folder of the active Python
//! environment (`$VIRTUAL_ENV`, then `$CONDA_PREFIX`), where the `onednn-cpu-gomp` wheel
//! puts `libdnnl.so.3`.

mod loader;
mod matmul;

use std::sync::{Arc, OnceLock};

pub use loader::{Loaded, Version, candidates, find, find_in};
pub use matmul::Matmul;

/// The library names tried through the loader (those of `capabilities/onednn.json`).
const NAMES: [&str; 2] = ["libdnnl.so.3", "libdnnl.so.2"];

/// The process-wide matmul executor, when oneDNN loads and its entry points resolve.
pub fn matmul() -> Result<Arc<Matmul>, String> {
    static MATMUL: OnceLock<Result<Arc<Matmul>, String>> = OnceLock::new();
    MATMUL
        .get_or_init(|| {
            let names: Vec<String> = NAMES.iter().map(|n| (*n).to_owned()).collect();
            let lib = Arc::new(find(&names)?);
            Matmul::new(lib).map(Arc::new)
        })
        .clone()
}

/// Registers the executors of the oneDNN kernels when the library is there.
pub fn register(r: &mut crate::exec::executor::Registry) {
    if let Ok(m) = matmul() {
        r.register("onednn.linear.matmul", m);
    }
}
