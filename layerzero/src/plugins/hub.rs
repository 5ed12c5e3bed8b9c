//! A kernel hub on disk, laid out like Hugging Face's: `<repo>/build/<variant>/` holding
//! `metadata.json` and the variant's files. `lz plugin add REPO` picks the variant this host
//! can load (plugin ABI, OS, architecture, kind), says why every other one was not chosen,
//! copies the library into LayerZero's plugin folder (bounded, atomically), checks it against
//! the pinned hash, opens it, and locks it.

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
    /// The library, relative to the variant's folder.
    pub library: String,
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

/// The variants of the repository at `repo`, each judged for this host, by name.
pub fn variants(repo: &Path) -> Result<Vec<Variant>> {
    let build = repo.join("build");
    let entries = std::fs::read_dir(&build).map_err(|e| {
        Error::new(
            ErrorKind::Io,
            format!("{} is not a hub repository (no readable build/ folder): {e}", repo.display()),
        )
    })?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names.into_iter().map(|name| judge(&build, name)).collect())
}

fn judge(build: &Path, name: String) -> Variant {
    let dir = build.join(&name);
    let metadata = match read_metadata(&dir) {
        Ok(m) => m,
        Err((code, why)) => return Variant { name, rejected: Some((code, why)), metadata: None },
    };
    let rejected = if metadata.kind != "c_abi" {
        Some(format!("kind {:?}: this LayerZero loads c_abi plugins from a hub", metadata.kind))
    } else if metadata.abi != crate::backend::plugin::abi::ABI_VERSION {
        Some(format!("plugin ABI {}; this LayerZero speaks {}", metadata.abi, crate::backend::plugin::abi::ABI_VERSION))
    } else if metadata.os != std::env::consts::OS {
        Some(format!("built for {}; this is {}", metadata.os, std::env::consts::OS))
    } else if metadata.arch != std::env::consts::ARCH {
        Some(format!("built for {}; this is {}", metadata.arch, std::env::consts::ARCH))
    } else {
        None
    };
    let rejected = rejected
        .map(|why| (ReasonCode::PLUGIN_VARIANT_REJECTED, why))
        .or_else(|| inside(&dir, &metadata.library).err().map(|why| (ReasonCode::PLUGIN_PATH_UNSAFE, why)));
    Variant { name, rejected, metadata: Some(metadata) }
}

fn read_metadata(dir: &Path) -> std::result::Result<Metadata, (ReasonCode, String)> {
    let path = dir.join("metadata.json");
    let size = std::fs::metadata(&path)
        .map_err(|e| (ReasonCode::PLUGIN_VARIANT_REJECTED, format!("no readable metadata.json: {e}")))?
        .len();
    if size > MAX_METADATA_BYTES {
        return Err((
            ReasonCode::PLUGIN_PATH_UNSAFE,
            format!("metadata.json is {size} bytes; at most {MAX_METADATA_BYTES}"),
        ));
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| (ReasonCode::PLUGIN_VARIANT_REJECTED, format!("metadata.json: {e}")))?;
    serde_json::from_str(&text).map_err(|e| (ReasonCode::PLUGIN_VARIANT_REJECTED, format!("metadata.json: {e}")))
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
    /// The installed library.
    pub path: PathBuf,
    /// The opened plugin.
    pub plugin: Plugin,
    /// Every variant, judged.
    pub variants: Vec<Variant>,
}

/// Installs the variant of `repo` this host can load into `into/<repo>/<variant>/<hash>/`,
/// refusing it when its hash is not `expect` (hex blake3), then opens it.
pub fn add(repo: &Path, into: &Path, expect: Option<&str>) -> Result<Added> {
    let judged = variants(repo)?;
    let Some(chosen) = judged.iter().find(|v| v.rejected.is_none()) else {
        let why: Vec<String> =
            judged.iter().filter_map(|v| v.rejected.as_ref().map(|(c, w)| format!("{}: {w} ({c})", v.name))).collect();
        return Err(plugin_error(
            ReasonCode::PLUGIN_VARIANT_REJECTED,
            ErrorKind::InvalidInput,
            repo,
            format!(
                "no variant loads here: {}",
                if why.is_empty() { "build/ is empty".into() } else { why.join("; ") }
            ),
        ));
    };
    let meta = chosen.metadata.as_ref().ok_or_else(|| Error::invalid("a chosen variant without metadata"))?;
    let source = inside(&repo.join("build").join(&chosen.name), &meta.library)
        .map_err(|why| plugin_error(ReasonCode::PLUGIN_PATH_UNSAFE, ErrorKind::InvalidInput, repo, why))?;
    let size =
        std::fs::metadata(&source).map_err(|e| Error::new(ErrorKind::Io, format!("{}: {e}", source.display())))?.len();
    if size > MAX_LIBRARY_BYTES {
        return Err(plugin_error(
            ReasonCode::PLUGIN_PATH_UNSAFE,
            ErrorKind::InvalidInput,
            &source,
            format!("it is {size} bytes; at most {MAX_LIBRARY_BYTES}"),
        ));
    }
    let bytes = std::fs::read(&source).map_err(|e| Error::new(ErrorKind::Io, format!("{}: {e}", source.display())))?;
    let hash = blake3::hash(&bytes).to_hex().to_string();
    if let Some(want) = expect
        && want != hash
    {
        return Err(plugin_error(
            ReasonCode::PLUGIN_HASH_MISMATCH,
            ErrorKind::InvalidInput,
            &source,
            format!("its blake3 is {hash}, not the expected {want}; nothing was installed"),
        ));
    }
    let repo_name = repo.file_name().map_or_else(|| "repo".into(), |n| n.to_string_lossy().into_owned());
    let file_name = Path::new(&meta.library).file_name().map_or_else(|| "plugin.so".into(), |n| n.to_os_string());
    // Content-addressed: an install never overwrites a file another lock entry pins.
    let target = into.join(&repo_name).join(&chosen.name).join(&hash[..16]).join(file_name);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot create {}: {e}", parent.display())))?;
    }
    crate::files::write(&target, &bytes, &[])?;
    let plugin = Plugin::open_expecting(&target, Some(&hash))?;
    Ok(Added { variant: chosen.name.clone(), path: target, plugin, variants: judged })
}
