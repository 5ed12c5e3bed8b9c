//! oneDNN (`libdnnl`), loaded at run time: finding the library and reading its version.
//! Nothing links against it: without it the crate builds, and the backend reports itself
//! not installed with every path tried.
//!
//! Search order: `LAYERZERO_ONEDNN_LIB` (a file), the loader's default paths
//! (`libdnnl.so.3`, `libdnnl.so.2`), then the `lib/` folder of the active Python
//! environment (`$VIRTUAL_ENV`, then `$CONDA_PREFIX`), where the `onednn-cpu-gomp` wheel
//! puts `libdnnl.so.3`.

mod loader;

pub use loader::{Loaded, Version, candidates, find, find_in};
