//! A kernel hub, laid out like Hugging Face's: `<repo>/build/<variant>/` holding
//! `metadata.json` and the variant's files, in a folder or served over `http://` (with
//! `build/index.json` listing the variants). `lz plugin add REPO` picks the variant this host
//! can load (plugin ABI, OS, architecture, kind; for a Python package, the Python environment
//! and its torch version), says why every other one was not chosen, copies the file into
//! LayerZero's plugin folder (bounded, atomically), checks it against the pinned hash, and
//! then opens a library, or installs a Python package's wheel into the environment (`pip`),
//! and locks it.

use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use crate::backend::plugin::{Plugin, plugin_error};
use crate::error::{Error, ErrorKind, Result};
use crate::reason::ReasonCode;

/// The most bytes a variant's `metadata.json` may hold.
pub const MAX_METADATA_BYTES: u64 = 64 << 10;
/// The most bytes a plugin library may hold.
pub const MAX_LIBRARY_BYTES: u64 = 1 << 30;

/// A variant's `metadata.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// `c_abi` (a shared library over the plugin C ABI) or `python` (a Python package).
    pub kind: String,
    /// The plugin ABI version the library speaks.
    pub abi: u32,
    /// `linux`, `macos`, ... (Rust's `std::env::consts::OS`).
    pub os: String,
    /// `x86_64`, `aarch64`, ... (Rust's `std::env::consts::ARCH`).
    pub arch: String,
    /// The library (or, for `python`, the wheel), relative to the variant's folder.
    pub library: String,
    /// `python`: the name of its `layerzero.backends` entry point (its backend's name).
    #[serde(default)]
    pub entry_point: Option<String>,
    /// `python`: the torch `MAJOR.MINOR` it was built against, when it matters.
    #[serde(default)]
    pub torch: Option<String>,
}

/// What the host offers the variants besides its OS and architecture: the Python interpreter a
/// Python package would be installed with, probed the first time a variant needs it.
#[derive(Debug)]
pub struct Host {
    program: PathBuf,
    python: std::cell::OnceCell<std::result::Result<PythonEnv, String>>,
}

impl Host {
    /// A host whose Python packages go to the environment of the interpreter `program`.
    pub fn new(program: PathBuf) -> Host {
        Host { program, python: std::cell::OnceCell::new() }
    }

    /// The Python environment, or why there is none usable.
    pub fn python(&self) -> std::result::Result<&PythonEnv, &str> {
        self.python.get_or_init(|| PythonEnv::probe(&self.program)).as_ref().map_err(String::as_str)
    }
}

/// A Python environment with the `layerzero` package importable.
#[derive(Debug, Clone)]
pub struct PythonEnv {
    /// Its interpreter.
    pub program: PathBuf,
    /// Its torch version (`2.14.1+cpu`), when torch imports.
    pub torch: Option<String>,
}

impl PythonEnv {
    /// The interpreter `program` if `layerzero` imports in it, with its torch version; `Err`
    /// says why it is not usable.
    pub fn probe(program: &Path) -> std::result::Result<PythonEnv, String> {
        let script = "import importlib.util as u, json\n\
                      t = None\n\
                      try:\n    import torch; t = torch.__version__\nexcept Exception:\n    pass\n\
                      print(json.dumps({'layerzero': u.find_spec('layerzero') is not None, 'torch': t}))";
        let out = std::process::Command::new(program)
            .args(["-c", script])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|_| format!("{} did not answer: {}", program.display(), String::from_utf8_lossy(&out.stderr)))?;
        if v["layerzero"] != true {
            return Err(format!("the layerzero package does not import in {}", program.display()));
        }
        Ok(PythonEnv { program: program.to_path_buf(), torch: v["torch"].as_str().map(str::to_owned) })
    }
}

/// One variant and whether it was chosen.
#[derive(Debug, Clone)]
pub struct Variant {
    /// The folder name under `build/`.
    pub name: String,
    /// Why it was not chosen (`None`: it can load here).
    pub rejected: Option<(ReasonCode, String)>,
    /// Its metadata, when it parsed.
    pub metadata: Option<Metadata>,
}

/// Where a hub repository is: a folder, or an `http://` URL (whose `build/index.json` lists
/// the variant folders, as a folder's listing does).
#[derive(Debug, Clone)]
pub enum Source {
    /// `<folder>/build/<variant>/...`.
    Dir(PathBuf),
    /// `<url>/build/index.json`, `<url>/build/<variant>/...`.
    Http(String),
}

impl Source {
    /// `http://...` is a URL; anything else a folder.
    pub fn parse(arg: &str) -> Source {
        if arg.starts_with("http://") || arg.starts_with("https://") {
            Source::Http(arg.trim_end_matches('/').to_owned())
        } else {
            Source::Dir(PathBuf::from(arg))
        }
    }

    /// The repository's name (its last path segment).
    pub fn repo_name(&self) -> String {
        let text = match self {
            Source::Dir(p) => p.file_name().map(|n| n.to_string_lossy().into_owned()),
            Source::Http(u) => u.rsplit('/').next().map(str::to_owned),
        };
        text.filter(|n| safe_name(n)).unwrap_or_else(|| "repo".into())
    }

    fn describe(&self) -> String {
        match self {
            Source::Dir(p) => p.display().to_string(),
            Source::Http(u) => u.clone(),
        }
    }

    fn names(&self) -> Result<Vec<String>> {
        let mut names: Vec<String> = match self {
            Source::Dir(repo) => {
                let build = repo.join("build");
                let entries = std::fs::read_dir(&build).map_err(|e| {
                    Error::new(
                        ErrorKind::Io,
                        format!("{} is not a hub repository (no readable build/ folder): {e}", repo.display()),
                    )
                })?;
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            }
            Source::Http(url) => {
                let index = format!("{url}/build/index.json");
                let body = super::http::get(&index, MAX_METADATA_BYTES).map_err(|e| Error::new(ErrorKind::Io, e))?;
                serde_json::from_slice::<Vec<String>>(&body)
                    .map_err(|e| Error::invalid(format!("{index}: not a JSON list of variant names: {e}")))?
            }
        };
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// The file `rel` of `variant`, at most `max` bytes, refused when its path is unsafe.
    fn read(&self, variant: &str, rel: &str, max: u64) -> std::result::Result<Vec<u8>, (ReasonCode, String)> {
        let unsafe_path = |why: String| (ReasonCode::PLUGIN_PATH_UNSAFE, why);
        if !safe_name(variant) {
            return Err(unsafe_path(format!("variant name {variant:?} is not a plain folder name")));
        }
        if Path::new(rel).components().any(|c| !matches!(c, Component::Normal(_))) || rel.contains('\\') {
            return Err(unsafe_path(format!("{rel:?} leaves the variant's folder (absolute, or with ..)")));
        }
        match self {
            Source::Dir(repo) => {
                let dir = repo.join("build").join(variant);
                let file = inside(&dir, rel).map_err(unsafe_path)?;
                let size =
                    std::fs::metadata(&file).map_err(|e| (ReasonCode::PLUGIN_VARIANT_REJECTED, e.to_string()))?.len();
                if size > max {
                    return Err(unsafe_path(format!("{rel} is {size} bytes; at most {max}")));
                }
                std::fs::read(&file).map_err(|e| (ReasonCode::PLUGIN_VARIANT_REJECTED, format!("{rel}: {e}")))
            }
            Source::Http(url) => super::http::get(&format!("{url}/build/{variant}/{rel}"), max)
                .map_err(|e| (ReasonCode::PLUGIN_VARIANT_REJECTED, e)),
        }
    }
}

/// A variant folder name: no separator, no `.` or `..`.
fn safe_name(n: &str) -> bool {
    !n.is_empty() && n != "." && n != ".." && n.chars().all(|c| c.is_ascii_alphanumeric() || "._-+".contains(c))
}

/// The variants of the repository, each judged for `host`, by name.
pub fn variants(source: &Source, host: &Host) -> Result<Vec<Variant>> {
    Ok(source.names()?.into_iter().map(|name| judge(source, host, name)).collect())
}

/// Why a variant of `metadata` cannot be used on `host` (`None`: it can).
fn unfit(metadata: &Metadata, host: &Host) -> Option<String> {
    let abi = crate::backend::plugin::abi::ABI_VERSION;
    let python = metadata.kind == "python";
    // A pure-Python wheel runs on any OS and architecture.
    let any = |v: &str| python && v == "any";
    if metadata.kind != "c_abi" && !python {
        return Some(format!("kind {:?}: a hub variant is c_abi or python", metadata.kind));
    }
    if metadata.abi != abi {
        return Some(format!("plugin ABI {}; this LayerZero speaks {abi}", metadata.abi));
    }
    if metadata.os != std::env::consts::OS && !any(&metadata.os) {
        return Some(format!("built for {}; this is {}", metadata.os, std::env::consts::OS));
    }
    if metadata.arch != std::env::consts::ARCH && !any(&metadata.arch) {
        return Some(format!("built for {}; this is {}", metadata.arch, std::env::consts::ARCH));
    }
    if !python {
        return None;
    }
    let env = match host.python() {
        Ok(env) => env,
        Err(why) => return Some(format!("a Python package, and {why} (--python names the interpreter)")),
    };
    if metadata.entry_point.as_deref().is_none_or(|e| !safe_name(e)) {
        return Some("a Python package without a plain `entry_point` name".into());
    }
    let have = env.torch.as_deref().map(|t| t.split('.').take(2).collect::<Vec<_>>().join("."));
    match (&metadata.torch, have) {
        (Some(want), None) => {
            Some(format!("built for torch {want}; torch does not import in {}", env.program.display()))
        }
        (Some(want), Some(have)) if *want != have => {
            Some(format!("built for torch {want}; the environment has {have}"))
        }
        _ => None,
    }
}

fn judge(source: &Source, host: &Host, name: String) -> Variant {
    let metadata = match source.read(&name, "metadata.json", MAX_METADATA_BYTES).and_then(|b| {
        serde_json::from_slice::<Metadata>(&b)
            .map_err(|e| (ReasonCode::PLUGIN_VARIANT_REJECTED, format!("metadata.json: {e}")))
    }) {
        Ok(m) => m,
        Err(rejected) => return Variant { name, rejected: Some(rejected), metadata: None },
    };
    let rejected =
        unfit(&metadata, host).map(|why| (ReasonCode::PLUGIN_VARIANT_REJECTED, why)).or_else(|| match source {
            Source::Dir(repo) => inside(&repo.join("build").join(&name), &metadata.library)
                .err()
                .map(|why| (ReasonCode::PLUGIN_PATH_UNSAFE, why)),
            Source::Http(_) => {
                Path::new(&metadata.library).components().any(|c| !matches!(c, Component::Normal(_))).then(|| {
                    (
                        ReasonCode::PLUGIN_PATH_UNSAFE,
                        format!("library {:?} leaves the variant's folder (absolute, or with ..)", metadata.library),
                    )
                })
            }
        });
    Variant { name, rejected, metadata: Some(metadata) }
}

/// `relative` names a regular file inside `dir`: no absolute path, no `..`, and no symlink
/// leading out (the resolved file must lie under the resolved folder).
fn inside(dir: &Path, relative: &str) -> std::result::Result<PathBuf, String> {
    let rel = Path::new(relative);
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(format!("library {relative:?} leaves the variant's folder (absolute, or with ..)"));
    }
    let root = dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))?;
    let file = dir.join(rel).canonicalize().map_err(|e| format!("library {relative:?}: {e}"))?;
    if !file.starts_with(&root) {
        return Err(format!("library {relative:?} resolves to {}, outside the variant's folder", file.display()));
    }
    if !file.is_file() {
        return Err(format!("library {relative:?} is not a regular file"));
    }
    Ok(file)
}

/// What `add` installed.
#[derive(Debug)]
pub struct Added {
    /// The variant chosen.
    pub variant: String,
    /// The installed file (the library, or the wheel).
    pub path: PathBuf,
    /// blake3 of the file downloaded, hex.
    pub blake3: String,
    /// The plugin as locked.
    pub installed: Installed,
    /// Every variant, judged.
    pub variants: Vec<Variant>,
}

/// What a chosen variant became.
#[derive(Debug)]
pub enum Installed {
    /// A library, opened.
    Library(Box<Plugin>),
    /// A Python package: its wheel installed into the environment and its entry point
    /// locked (the entry `python -m layerzero.plugins lock` wrote).
    Python(super::LockEntry),
}

/// Installs the variant of `source` that `host` can use into `into/<repo>/<variant>/<hash>/`,
/// refusing it when its hash is not `expect` (hex blake3), nor the download pinned by the
/// lockfile at `lock_path` for the same plugin. A library is then opened; a Python package's
/// wheel is installed into `host`'s environment (`pip install --no-deps`) and locked there.
pub fn add(source: &Source, into: &Path, expect: Option<&str>, host: &Host, lock_path: &Path) -> Result<Added> {
    let judged = variants(source, host)?;
    let origin = PathBuf::from(source.describe());
    let Some(chosen) = judged.iter().find(|v| v.rejected.is_none()) else {
        let why: Vec<String> =
            judged.iter().filter_map(|v| v.rejected.as_ref().map(|(c, w)| format!("{}: {w} ({c})", v.name))).collect();
        return Err(plugin_error(
            ReasonCode::PLUGIN_VARIANT_REJECTED,
            ErrorKind::InvalidInput,
            &origin,
            format!(
                "no variant loads here: {}",
                if why.is_empty() { "build/ is empty".into() } else { why.join("; ") }
            ),
        ));
    };
    let meta = chosen.metadata.as_ref().ok_or_else(|| Error::invalid("a chosen variant without metadata"))?;
    let bytes = source
        .read(&chosen.name, &meta.library, MAX_LIBRARY_BYTES)
        .map_err(|(code, why)| plugin_error(code, ErrorKind::InvalidInput, &origin, why))?;
    let hash = blake3::hash(&bytes).to_hex().to_string();
    let mismatch = |pinned: &str, by: &str| {
        plugin_error(
            ReasonCode::PLUGIN_HASH_MISMATCH,
            ErrorKind::InvalidInput,
            &origin,
            format!(
                "variant {}: its blake3 is {hash}, not {pinned} {by}; nothing was installed (remove the lock entry \
                 first if the change is wanted)",
                chosen.name
            ),
        )
    };
    if let Some(want) = expect
        && want != hash
    {
        return Err(mismatch(want, "as expected"));
    }
    // A Python package is refused before pip changes the environment.
    let locked = if lock_path.exists() { super::Lockfile::read(lock_path)? } else { super::Lockfile::default() };
    if let Some(name) = meta.entry_point.as_deref().filter(|_| meta.kind == "python")
        && let Some(pinned) = locked
            .plugins
            .iter()
            .filter(|e| e.name == name && e.kind == super::PluginKind::Python)
            .find_map(|e| e.download_blake3.as_deref().filter(|d| *d != hash))
    {
        return Err(mismatch(pinned, "as locked"));
    }
    let file_name = Path::new(&meta.library).file_name().map_or_else(|| "plugin.so".into(), |n| n.to_os_string());
    // Content-addressed: an install never overwrites a file another lock entry pins.
    let target = into.join(source.repo_name()).join(&chosen.name).join(&hash[..16]).join(file_name);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot create {}: {e}", parent.display())))?;
    }
    crate::files::write(&target, &bytes, &[])?;
    let installed = match (host.python(), meta.entry_point.as_deref()) {
        (Ok(env), Some(entry_point)) if meta.kind == "python" => {
            Installed::Python(install_python(env, &target, entry_point, lock_path)?)
        }
        _ => Installed::Library(Box::new(Plugin::open_expecting(&target, Some(&hash))?)),
    };
    Ok(Added { variant: chosen.name.clone(), path: target, blake3: hash, installed, variants: judged })
}

/// `pip install --no-deps` of `wheel` into `env`, then `python -m layerzero.plugins lock
/// ENTRY_POINT --lock LOCK` there; returns the entry it wrote.
fn install_python(env: &PythonEnv, wheel: &Path, entry_point: &str, lock_path: &Path) -> Result<super::LockEntry> {
    let run = |what: &str, args: &[&std::ffi::OsStr]| -> Result<()> {
        let out = std::process::Command::new(&env.program)
            .args(args)
            .output()
            .map_err(|e| Error::new(ErrorKind::Io, format!("{what}: cannot run {}: {e}", env.program.display())))?;
        if out.status.success() {
            return Ok(());
        }
        let said = String::from_utf8_lossy(&out.stderr);
        let tail: String = said.trim().lines().rev().take(3).collect::<Vec<_>>().join(" / ");
        // `check-archive` exits 3 for members that leave the install folder.
        if out.status.code() == Some(3) {
            return Err(plugin_error(ReasonCode::PLUGIN_PATH_UNSAFE, ErrorKind::InvalidInput, wheel, tail));
        }
        Err(Error::new(ErrorKind::Io, format!("{what} failed ({}): {tail}", out.status)))
    };
    // Checked before pip unpacks it: no member may land outside the environment.
    let check = ["-m", "layerzero.plugins", "check-archive"].map(std::ffi::OsStr::new);
    run("checking the wheel", &check.into_iter().chain([wheel.as_os_str()]).collect::<Vec<_>>())?;
    run(
        "pip install",
        &["-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall"]
            .map(std::ffi::OsStr::new)
            .into_iter()
            .chain([wheel.as_os_str()])
            .collect::<Vec<_>>(),
    )?;
    let args = ["-m", "layerzero.plugins", "lock", entry_point, "--lock"].map(std::ffi::OsStr::new);
    run("locking the Python plugin", &args.into_iter().chain([lock_path.as_os_str()]).collect::<Vec<_>>())?;
    let lock = super::Lockfile::read(lock_path)?;
    lock.plugins.into_iter().find(|e| e.name == entry_point && e.kind == super::PluginKind::Python).ok_or_else(|| {
        Error::invalid(format!("{} holds no entry for {entry_point} after locking it", lock_path.display()))
    })
}
