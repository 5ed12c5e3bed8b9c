//! Opening a plugin: the library, its ABI version, its capabilities, its kernels.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use layerzero_core::capabilities::catalog::Catalog;
use layerzero_core::capabilities::spec::{BackendSpec, Execution};
use layerzero_core::error::{Error, ErrorKind, Result};
use layerzero_core::reason::{Reason, ReasonCode};
use layerzero_plugin_abi as abi;

/// An opened plugin: its namespaced backend and each kernel's entry point. The library stays
/// loaded while the plugin or any of its executors lives.
pub struct Plugin {
    /// The plugin's name (its capabilities' `backend`).
    pub name: String,
    /// Its version (its capabilities' `version`).
    pub version: String,
    /// The file it was opened from.
    pub path: PathBuf,
    /// blake3 of the library file, hex.
    pub library_hash: String,
    /// blake3 of the capabilities JSON it returned, hex.
    pub capabilities_hash: String,
    /// The capabilities JSON it returned.
    pub capabilities: String,
    backend: BackendSpec,
    runs: Runs,
}

/// Where a plugin's kernels run.
enum Runs {
    /// Loaded into this process: each kernel's entry point.
    InProcess { kernels: Vec<(String, abi::KernelFn)>, library: Arc<libloading::Library> },
    /// In a worker process (`crate::worker`); the library is never loaded here.
    #[cfg(unix)]
    Isolated(Arc<crate::worker::Worker>),
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("namespace", &self.namespace())
            .field("path", &self.path)
            .field("kernels", &self.backend.kernels.iter().map(|k| &k.id).collect::<Vec<_>>())
            .field("isolated", &self.is_isolated())
            .finish_non_exhaustive()
    }
}

/// A refusal of the plugin at `path`: an error of `kind` carrying the reason `code`.
pub fn plugin_error(code: ReasonCode, kind: ErrorKind, path: &Path, message: String) -> Error {
    let message = format!("plugin {}: {message} ({code})", path.display());
    Error::new(kind, message.clone()).with_reasons(vec![Reason::new(code, message)])
}

impl Plugin {
    /// Opens the plugin library at `path` (see the crate's documentation for the checks).
    pub fn open(path: &Path) -> Result<Plugin> {
        Plugin::open_expecting(path, None)
    }

    /// [`Plugin::open`], refusing (`PLUGIN_HASH_MISMATCH`) before the library is loaded when
    /// the file's blake3 is not `expected` (hex).
    pub fn open_expecting(path: &Path, expected: Option<&str>) -> Result<Plugin> {
        let bytes = std::fs::read(path).map_err(|e| {
            Error::new(ErrorKind::Io, format!("plugin {}: cannot read it: {e}", path.display())).with_source(e)
        })?;
        let library_hash = blake3::hash(&bytes).to_hex().to_string();
        if let Some(want) = expected
            && want != library_hash
        {
            return Err(plugin_error(
                ReasonCode::PLUGIN_HASH_MISMATCH,
                ErrorKind::InvalidInput,
                path,
                format!(
                    "the file's blake3 is {}, not the locked {}: it was changed after it was locked, so it is not loaded",
                    &library_hash[..16],
                    want.get(..16).unwrap_or(want)
                ),
            ));
        }
        #[cfg(target_os = "linux")]
        crate::elf::check(&bytes).map_err(|why| {
            plugin_error(
                ReasonCode::PLUGIN_NOT_LOADABLE,
                ErrorKind::InvalidInput,
                path,
                format!("it is not a loadable shared library: {why}"),
            )
        })?;
        let library = Arc::new(load_copy(&bytes, &library_hash, path)?);
        let version = abi_version(&library, path)?;
        if version != abi::ABI_VERSION {
            return Err(plugin_error(
                ReasonCode::PLUGIN_ABI_UNSUPPORTED,
                ErrorKind::InvalidInput,
                path,
                format!("it speaks plugin ABI {version}; this LayerZero speaks {}", abi::ABI_VERSION),
            ));
        }
        let text = capabilities(&library, path)?;
        let capabilities_hash = blake3::hash(text.as_bytes()).to_hex().to_string();
        let declared = parse(&text, path)?;
        let (name, version) = (declared.backend.clone(), declared.version.clone());
        let kernels = {
            let lookup = kernel_lookup(&library, path)?;
            let mut kernels = Vec::with_capacity(declared.kernels.len());
            for k in &declared.kernels {
                let Some(f) = lookup(&k.id) else {
                    return Err(plugin_error(
                        ReasonCode::PLUGIN_KERNEL_MISSING,
                        ErrorKind::InvalidInput,
                        path,
                        format!("it declares kernel {} but lz_plugin_kernel returns NULL for it", k.id),
                    ));
                };
                kernels.push((namespaced(&k.id, &name, &version), f));
            }
            kernels
        };
        let backend = namespace(declared);
        Ok(Plugin {
            name,
            version,
            path: path.to_path_buf(),
            library_hash,
            capabilities_hash,
            capabilities: text,
            backend,
            runs: Runs::InProcess { kernels, library },
        })
    }

    /// Opens the plugin at `path` in a worker process (`options`), never loading it here: the
    /// worker checks the file against `expected` (blake3, hex) and makes every check
    /// [`Plugin::open`] makes; its capabilities are checked again here. Its kernels run in the
    /// worker, which is restarted after a crash or a missed deadline.
    #[cfg(unix)]
    pub fn open_isolated(path: &Path, expected: &str, options: crate::worker::WorkerOptions) -> Result<Plugin> {
        let (worker, opened) = crate::worker::Worker::start(path, expected, options)?;
        if opened.library_blake3 != expected {
            return Err(plugin_error(
                ReasonCode::PLUGIN_HASH_MISMATCH,
                ErrorKind::InvalidInput,
                path,
                format!("its worker loaded a file of blake3 {}, not {expected}", opened.library_blake3),
            ));
        }
        let declared = parse(&opened.capabilities, path)?;
        if declared.backend != opened.name || declared.version != opened.version {
            return Err(plugin_error(
                ReasonCode::PLUGIN_CAPABILITIES_INVALID,
                ErrorKind::InvalidInput,
                path,
                "its worker's capabilities do not match the name and version it reported".into(),
            ));
        }
        Ok(Plugin {
            name: opened.name,
            version: opened.version,
            path: path.to_path_buf(),
            library_hash: opened.library_blake3,
            capabilities_hash: blake3::hash(opened.capabilities.as_bytes()).to_hex().to_string(),
            capabilities: opened.capabilities,
            backend: namespace(declared),
            runs: Runs::Isolated(Arc::new(worker)),
        })
    }

    /// True when its kernels run in a worker process.
    pub fn is_isolated(&self) -> bool {
        !matches!(self.runs, Runs::InProcess { .. })
    }

    /// Its worker, when it is isolated.
    #[cfg(unix)]
    pub fn worker(&self) -> Option<&crate::worker::Worker> {
        match &self.runs {
            Runs::Isolated(w) => Some(w),
            Runs::InProcess { .. } => None,
        }
    }

    /// The entry point of kernel `id` (namespaced), when it runs in this process.
    pub(crate) fn entry(&self, id: &str) -> Option<abi::KernelFn> {
        match &self.runs {
            Runs::InProcess { kernels, .. } => kernels.iter().find(|(k, _)| k == id).map(|(_, f)| *f),
            #[cfg(unix)]
            Runs::Isolated(_) => None,
        }
    }

    /// Keeps the library loaded for as long as the borrow lasts (in-process plugins).
    pub(crate) fn library(&self) -> Option<&libloading::Library> {
        match &self.runs {
            Runs::InProcess { library, .. } => Some(library),
            #[cfg(unix)]
            Runs::Isolated(_) => None,
        }
    }

    /// `NAME@VERSION`: the backend name its kernels are declared under here.
    pub fn namespace(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }

    /// Its capabilities, in its namespace (`NAME@VERSION.op.variant`).
    pub fn backend(&self) -> &BackendSpec {
        &self.backend
    }

    /// Each kernel's namespaced id with its executor.
    pub fn executors(self: &Arc<Self>) -> Vec<(String, Arc<dyn layerzero_core::exec::executor::Executor>)> {
        use layerzero_core::exec::executor::Executor;
        match &self.runs {
            Runs::InProcess { kernels, .. } => kernels
                .iter()
                .map(|(id, f)| {
                    let e: Arc<dyn Executor> = Arc::new(crate::PluginExecutor::new(self.clone(), id.clone(), *f));
                    (id.clone(), e)
                })
                .collect(),
            #[cfg(unix)]
            Runs::Isolated(worker) => self
                .backend
                .kernels
                .iter()
                .map(|k| {
                    let e: Arc<dyn Executor> =
                        Arc::new(crate::worker::IsolatedExecutor::new(worker.clone(), k.id.clone()));
                    (k.id.clone(), e)
                })
                .collect(),
        }
    }
}

/// The backend a capabilities document `text` declares, schema-checked and renamed into its
/// namespace (`NAME@VERSION.op.variant`, run through registered executors): a plugin that is
/// not a library (a Python package) declares its kernels through this. `origin` names it in
/// errors (`PLUGIN_CAPABILITIES_INVALID`).
pub fn declared_backend(text: &str, origin: &Path) -> Result<BackendSpec> {
    parse(text, origin).map(namespace)
}

/// `name.op.variant` as `name@version.op.variant`.
fn namespaced(id: &str, name: &str, version: &str) -> String {
    format!("{name}@{version}{}", &id[name.len()..])
}

/// The declared backend renamed into its namespace; it runs through registered executors.
fn namespace(mut b: BackendSpec) -> BackendSpec {
    let (name, version) = (b.backend.clone(), b.version.clone());
    for k in &mut b.kernels {
        k.id = namespaced(&k.id, &name, &version);
    }
    b.backend = format!("{name}@{version}");
    b.execution = Execution::External;
    b.probe = None;
    b
}

/// The capabilities, schema-checked, every kernel in the plugin's own namespace.
fn parse(text: &str, path: &Path) -> Result<BackendSpec> {
    let invalid = |m: String| plugin_error(ReasonCode::PLUGIN_CAPABILITIES_INVALID, ErrorKind::Schema, path, m);
    let origin = format!("{} (lz_plugin_capabilities)", path.display());
    let catalog = Catalog::from_texts(&[(origin, text.to_owned())])
        .map_err(|e| invalid(format!("capabilities: {}", e.message())))?;
    let b = catalog.backends().first().cloned().ok_or_else(|| invalid("capabilities declare no backend".into()))?;
    if layerzero_core::capabilities::Version::parse(&b.version).is_none() {
        return Err(invalid(format!("field `version` is {:?}; a plugin version is MAJOR.MINOR.PATCH", b.version)));
    }
    if b.kernels.is_empty() {
        return Err(invalid("capabilities declare no kernel".into()));
    }
    Ok(b)
}

/// Loads the bytes that were read (and hashed) from `path` out of a private copy, removed once
/// loaded: the library runs exactly what was checked, and a later write over the user's file
/// (`cp` onto a loaded library rewrites its pages in place) cannot change code this process
/// has mapped.
fn load_copy(bytes: &[u8], hash: &str, path: &Path) -> Result<libloading::Library> {
    use std::io::Write;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("layerzero-plugin-{}-{n}-{}.so", std::process::id(), &hash[..16]);
    let copy = std::env::temp_dir().join(name);
    let mut options = std::fs::OpenOptions::new();
    // A new file only: a name someone else created first is an error, never a library we load.
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o700);
    let io = |e: std::io::Error| {
        Error::new(
            ErrorKind::Io,
            format!("plugin {}: cannot write its private copy {}: {e}", path.display(), copy.display()),
        )
    };
    let mut file = options.open(&copy).map_err(io)?;
    let written = file.write_all(bytes).map_err(io);
    drop(file);
    let loaded = written.and_then(|()| load(&copy, path));
    let _ = std::fs::remove_file(&copy);
    loaded
}

#[allow(unsafe_code)]
fn load(file: &Path, path: &Path) -> Result<libloading::Library> {
    // SAFETY: loading runs the library's initialisers. Only files the caller chose to trust
    // are opened (the lockfile lists them with their hash); a library that is not a plugin
    // is refused below before anything of it is called.
    unsafe { libloading::Library::new(file) }.map_err(|e| {
        plugin_error(
            ReasonCode::PLUGIN_NOT_LOADABLE,
            ErrorKind::InvalidInput,
            path,
            format!("it does not load as a shared library: {}", layerzero_dylib::describe(&e)),
        )
    })
}

/// The symbol `name` of type `T`, or a refusal naming it.
#[allow(unsafe_code)]
fn symbol<T: Copy>(library: &libloading::Library, name: &[u8], path: &Path) -> Result<T> {
    // SAFETY: the caller gives `T` as the plugin ABI declares the symbol (`layerzero_plugin_abi`).
    let s = unsafe { library.get::<T>(name) }.map_err(|e| {
        plugin_error(
            ReasonCode::PLUGIN_NOT_LOADABLE,
            ErrorKind::InvalidInput,
            path,
            format!(
                "it has no symbol {} (not a LayerZero plugin?): {}",
                String::from_utf8_lossy(name.strip_suffix(b"\0").unwrap_or(name)),
                layerzero_dylib::describe(&e)
            ),
        )
    })?;
    Ok(*s)
}

#[allow(unsafe_code)]
fn abi_version(library: &libloading::Library, path: &Path) -> Result<u32> {
    let f: abi::AbiVersionFn = symbol(library, abi::SYMBOL_ABI_VERSION, path)?;
    // SAFETY: `uint32_t lz_plugin_abi_version(void)`: no arguments, returns a value.
    Ok(unsafe { f() })
}

#[allow(unsafe_code)]
fn capabilities(library: &libloading::Library, path: &Path) -> Result<String> {
    let f: abi::CapabilitiesFn = symbol(library, abi::SYMBOL_CAPABILITIES, path)?;
    // SAFETY: `const char *lz_plugin_capabilities(void)`: no arguments; the ABI says the
    // string is NUL-terminated and lives while the library is loaded (checked for NULL).
    let raw = unsafe { f() };
    if raw.is_null() {
        return Err(plugin_error(
            ReasonCode::PLUGIN_CAPABILITIES_INVALID,
            ErrorKind::InvalidInput,
            path,
            "lz_plugin_capabilities returned NULL".into(),
        ));
    }
    // SAFETY: non-NULL and NUL-terminated, per the ABI; copied out at once.
    let text = unsafe { CStr::from_ptr(raw) };
    text.to_str().map(str::to_owned).map_err(|e| {
        plugin_error(
            ReasonCode::PLUGIN_CAPABILITIES_INVALID,
            ErrorKind::InvalidInput,
            path,
            format!("capabilities are not UTF-8: {e}"),
        )
    })
}

/// `id -> entry point` through `lz_plugin_kernel`.
#[allow(unsafe_code)]
fn kernel_lookup(library: &libloading::Library, path: &Path) -> Result<impl Fn(&str) -> Option<abi::KernelFn>> {
    let f: abi::KernelLookupFn = symbol(library, abi::SYMBOL_KERNEL, path)?;
    Ok(move |id: &str| {
        let id = CString::new(id).ok()?;
        // SAFETY: `lz_kernel_fn lz_plugin_kernel(const char *)` with a NUL-terminated id that
        // outlives the call; a NULL result is `None` (the ABI's `Option<fn>`).
        unsafe { f(id.as_ptr()) }
    })
}
