//! Finding and opening `libdnnl`, and reading `dnnl_version()`.

use std::ffi::{CStr, c_char, c_int, c_uint};
use std::path::PathBuf;

use layerzero_core::capabilities::Version;
use layerzero_core::hardware::cap::IsaCap;

/// `dnnl_version_t` (oneDNN's `dnnl_common_types.h`).
#[repr(C)]
struct RawVersion {
    major: c_int,
    minor: c_int,
    patch: c_int,
    hash: *const c_char,
    cpu_runtime: c_uint,
    gpu_runtime: c_uint,
}

/// The opened library: kept open for the life of the process (executors resolve their
/// symbols from it).
#[derive(Debug)]
pub struct Loaded {
    /// The name or path it was opened by.
    pub path: String,
    /// `dnnl_version()`.
    pub version: Version,
    /// The commit hash it reports.
    pub hash: String,
    /// The instruction set its JIT generates code for on this CPU
    /// (`dnnl_get_effective_cpu_isa`), e.g. `avx512_core_amx`.
    pub isa: Option<&'static str>,
    library: libloading::Library,
}

impl Loaded {
    /// The library handle, for resolving symbols.
    pub fn library(&self) -> &libloading::Library {
        &self.library
    }
}

/// Where oneDNN is looked for, and the ceiling its JIT is given: resolved by the runtime
/// (`LAYERZERO_ONEDNN_LIB`, the active Python environments, `LAYERZERO_CPU_ISA`), handed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Search {
    /// A library file tried first.
    pub library: Option<PathBuf>,
    /// Python environment prefixes whose `lib/` folder is tried last (where the
    /// `onednn-cpu-gomp` wheel puts `libdnnl.so.3`).
    pub prefixes: Vec<PathBuf>,
    /// The instruction-set ceiling of oneDNN's JIT (`dnnl_set_max_cpu_isa`).
    pub max_isa: IsaCap,
}

impl Default for Search {
    /// The loader's paths only, no ceiling.
    fn default() -> Search {
        Search { library: None, prefixes: Vec::new(), max_isa: IsaCap::Native }
    }
}

/// The candidates, in search order, for the library names of the capability file's probe
/// (`libdnnl.so.3`, ...): the search's file, the names through the loader's default paths,
/// then the names in each Python environment's `lib/`.
pub fn candidates(search: &Search, names: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    out.extend(search.library.iter().map(|p| p.display().to_string()));
    out.extend(names.iter().cloned());
    for prefix in &search.prefixes {
        let lib = prefix.join("lib");
        out.extend(names.iter().filter(|n| !n.contains('/')).map(|n| lib.join(n).display().to_string()));
    }
    out
}

/// Opens the first loadable candidate and reads its version; the error lists every
/// candidate tried and why it did not load.
pub fn find(search: &Search, names: &[String]) -> Result<Loaded, String> {
    let mut failures = Vec::new();
    for name in candidates(search, names) {
        match open(&name, search.max_isa) {
            Ok(l) => return Ok(l),
            Err(why) => failures.push(format!("{name} ({why})")),
        }
    }
    Err(format!("oneDNN not found; tried {}", failures.join("; ")))
}

#[allow(unsafe_code)]
fn open(name: &str, max_isa: IsaCap) -> Result<Loaded, String> {
    // SAFETY: loading runs the library's initialisers; the candidates name oneDNN (the
    // knob, the loader's `libdnnl` names, a Python environment's `libdnnl.so.3`), whose
    // initialisers are made to run in any host process.
    let library = unsafe { libloading::Library::new(name) }.map_err(|e| layerzero_dylib::describe(&e))?;
    // SAFETY: `dnnl_version` is declared `const dnnl_version_t *dnnl_version(void)` in
    // oneDNN's `dnnl.h` since v1.1; the signature below matches it.
    let f = unsafe { library.get::<unsafe extern "C" fn() -> *const RawVersion>(b"dnnl_version\0") }
        .map_err(|e| format!("loaded, but it has no dnnl_version: {}", layerzero_dylib::describe(&e)))?;
    // SAFETY: the function takes no arguments and returns a pointer to a static struct
    // (or null, checked below).
    let raw = unsafe { f() };
    if raw.is_null() {
        return Err("dnnl_version() returned null".to_owned());
    }
    // SAFETY: non-null, points to the library's static `dnnl_version_t`, which lives as long
    // as the library, which `Loaded` keeps open.
    let v = unsafe { &*raw };
    let hash = if v.hash.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated static string of the library.
        unsafe { CStr::from_ptr(v.hash) }.to_string_lossy().into_owned()
    };
    let part = |x: c_int| u32::try_from(x).unwrap_or(0);
    let version = Version(part(v.major), part(v.minor), part(v.patch));
    let _ = (v.cpu_runtime, v.gpu_runtime);
    cap_isa(&library, max_isa);
    let isa = effective_isa(&library);
    Ok(Loaded { path: name.to_owned(), version, hash, isa, library })
}

/// Tells oneDNN the ceiling `cap` (`dnnl_set_max_cpu_isa`, before it has generated any
/// code), so its JIT uses no instruction the cap leaves out. A second call
/// (the library is opened by the probe and by the executors) is refused by oneDNN and
/// changes nothing.
#[allow(unsafe_code)]
fn cap_isa(library: &libloading::Library, cap: IsaCap) {
    // `dnnl_cpu_isa_t` values of dnnl_types.h: sse41, avx2, avx512_core_vnni, avx512_core_fp16
    // (bf16 and fp16, no AMX).
    let value: c_int = match cap {
        IsaCap::Portable => 0x1,
        IsaCap::Avx2 => 0x7,
        IsaCap::Avx512 => 0x67,
        IsaCap::Avx512Bf16 => 0x1ef,
        IsaCap::Amx | IsaCap::Native => return,
    };
    // SAFETY: declared `dnnl_status_t dnnl_set_max_cpu_isa(dnnl_cpu_isa_t isa)` in dnnl.h
    // since v1.x; the enum is a C int.
    let Ok(f) = (unsafe { library.get::<unsafe extern "C" fn(c_int) -> c_int>(b"dnnl_set_max_cpu_isa\0") }) else {
        return;
    };
    // SAFETY: takes a valid dnnl_cpu_isa_t value; refuses (a status) once code was generated.
    let _ = unsafe { f(value) };
}

/// `dnnl_get_effective_cpu_isa()` by its name in `dnnl_types.h` (v3.2; `None` when the symbol
/// is missing or the value is one this build does not know).
#[allow(unsafe_code)]
fn effective_isa(library: &libloading::Library) -> Option<&'static str> {
    // SAFETY: declared `dnnl_cpu_isa_t dnnl_get_effective_cpu_isa(void)` (an enum, C int) in
    // oneDNN's dnnl.h since v1.x.
    let f = unsafe { library.get::<unsafe extern "C" fn() -> c_int>(b"dnnl_get_effective_cpu_isa\0") }.ok()?;
    // SAFETY: takes no arguments, reads the library's CPU detection.
    let isa = unsafe { f() };
    Some(match isa {
        0x0 => "default",
        0x1 => "sse41",
        0x3 => "avx",
        0x7 => "avx2",
        0xf => "avx2_vnni",
        0x1f => "avx2_vnni_2",
        0x27 => "avx512_core",
        0x67 => "avx512_core_vnni",
        0xe7 => "avx512_core_bf16",
        0x1ef => "avx512_core_fp16",
        0xfef => "avx512_core_amx",
        0x1fef => "avx512_core_amx_fp16",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_order_is_the_file_the_loader_then_the_python_environment() {
        let search = Search {
            library: Some("/opt/dnnl/libdnnl.so.3".into()),
            prefixes: vec!["/venv".into()],
            max_isa: IsaCap::Native,
        };
        let names = ["libdnnl.so.3".to_owned(), "libdnnl.so.2".to_owned()];
        assert_eq!(
            candidates(&search, &names),
            vec![
                "/opt/dnnl/libdnnl.so.3".to_owned(),
                "libdnnl.so.3".to_owned(),
                "libdnnl.so.2".to_owned(),
                "/venv/lib/libdnnl.so.3".to_owned(),
                "/venv/lib/libdnnl.so.2".to_owned()
            ]
        );
    }

    #[test]
    fn a_missing_library_lists_every_path_tried() {
        let search = Search { library: Some("/nowhere/libdnnl.so.3".into()), ..Search::default() };
        match find(&search, &["libdnnl.so.2".to_owned()]) {
            Err(why) => assert!(why.contains("/nowhere/libdnnl.so.3") && why.contains("libdnnl.so.2"), "{why}"),
            // A machine with oneDNN on the loader path finds it after the first path fails.
            Ok(l) => assert!(l.version.0 >= 2, "{l:?}"),
        }
    }
}
