//! This machine, at the edge: its hardware detected and measured, its memory headroom
//! polled, its backends probed, the executors built into LayerZero, and the settings that
//! are process-wide by nature.

pub mod backends;
pub mod detect;
pub mod measure;
pub mod memory;
pub mod probe;

use std::sync::OnceLock;

pub use backends::builtin_registry;

use crate::error::Error;
use crate::knobs::{Settings, process_env};

/// The settings of this process, resolved from its environment on first use (a bad value
/// falls back to its knob's default; `lz doctor` reports it), with the process-wide ones
/// handed to the parts that obey them: the ISA ceiling of the `cpu` kernels and oneDNN,
/// where oneDNN is searched, the read limit and redaction. Later changes to the environment
/// are not seen. Every handle, and the builtin registry, resolves it before a kernel runs.
pub fn process() -> &'static Settings {
    &resolved().0
}

/// Why knobs of this process's environment were not taken (each fell back to its default).
pub fn process_errors() -> &'static [Error] {
    &resolved().1
}

fn resolved() -> &'static (Settings, Vec<Error>) {
    static PROCESS: OnceLock<(Settings, Vec<Error>)> = OnceLock::new();
    PROCESS.get_or_init(|| {
        let (settings, errors) = Settings::lenient(&process_env);
        crate::files::set_max_read_bytes(settings.max_read_bytes);
        crate::backend::cpu::set_isa_cap(settings.cpu_isa);
        crate::backend::onednn::configure(onednn_search(&settings));
        crate::telemetry::redact::configure(settings.redact.as_deref());
        (settings, errors)
    })
}

/// Where oneDNN is looked for under `settings`, and the ceiling its JIT is given.
pub fn onednn_search(settings: &Settings) -> crate::backend::onednn::Search {
    crate::backend::onednn::Search {
        library: settings.onednn_lib.clone(),
        prefixes: settings.python_prefixes.clone(),
        max_isa: settings.cpu_isa,
    }
}
