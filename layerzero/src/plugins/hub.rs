//! A kernel hub, laid out like Hugging Face's: `<repo>/build/<variant>/` holding
//! `metadata.json` and the variant's files, in a folder or served over `http://` (with
//! `build/index.json` listing the variants). `lz plugin add REPO` picks the variant this host
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

/// The variants of the repository, each judged for this host, by name.
pub fn variants(source: &Source) -> Result<Vec<Variant>> {
    Ok(source.names()?.into_iter().map(|name| judge(source, name)).collect())
}

fn judge(source: &Source, name: String) -> Variant {
    let metadata = match source.read(&name, "metadata.json", MAX_METADATA_BYTES).and_then(|b| {
        serde_json::from_slice::<Metadata>(&b)
            .map_err(|e| (ReasonCode::PLUGIN_VARIANT_REJECTED, format!("metadata.json: {e}")))
    }) {
        Ok(m) => m,
        Err(rejected) => return Variant { name, rejected: Some(rejected), metadata: None },
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
    let rejected = rejected.map(|why| (ReasonCode::PLUGIN_VARIANT_REJECTED, why)).or_else(|| match source {
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
    /// The installed library.
    pub path: PathBuf,
    /// The opened plugin.
    pub plugin: Plugin,
    /// Every variant, judged.
    pub variants: Vec<Variant>,
}

/// Installs the variant of `source` this host can load into `into/<repo>/<variant>/<hash>/`,
/// refusing it when its hash is not `expect` (hex blake3), then opens it.
pub fn add(source: &Source, into: &Path, expect: Option<&str>) -> Result<Added> {
    let judged = variants(source)?;
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
    if let Some(want) = expect
        && want != hash
    {
        return Err(plugin_error(
            ReasonCode::PLUGIN_HASH_MISMATCH,
            ErrorKind::InvalidInput,
            &origin,
            format!("variant {}: its blake3 is {hash}, not the expected {want}; nothing was installed", chosen.name),
        ));
    }
    let file_name = Path::new(&meta.library).file_name().map_or_else(|| "plugin.so".into(), |n| n.to_os_string());
    // Content-addressed: an install never overwrites a file another lock entry pins.
    let target = into.join(source.repo_name()).join(&chosen.name).join(&hash[..16]).join(file_name);
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot create {}: {e}", parent.display())))?;
    }
    crate::files::write(&target, &bytes, &[])?;
    let plugin = Plugin::open_expecting(&target, Some(&hash))?;
    Ok(Added { variant: chosen.name.clone(), path: target, plugin, variants: judged })
}
