//! The executors built into LayerZero, wired into one registry: the reference oracle, the
//! fast `cpu` kernels, and oneDNN's where its library loads.

use crate::backend::{cpu, cpu_reference, onednn};
use crate::exec::executor::Registry;

/// LayerZero's own executors: `cpu_reference` and `cpu`, and `onednn`'s when it loads. The
/// process's settings are resolved first ([`super::process`]), so the kernels obey its ISA
/// ceiling and oneDNN is searched where `LAYERZERO_ONEDNN_LIB` says.
pub fn builtin_registry() -> Registry {
    super::process();
    let mut r = Registry::new();
    cpu_reference::register(&mut r);
    cpu::register(&mut r);
    onednn::register(&mut r);
    r
}
