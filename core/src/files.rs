//! Files read and written the way a database treats them. Reading: only regular files (a FIFO
//! would block forever, a device or an endless stream would be read until memory runs out),
//! at most `LAYERZERO_MAX_READ_BYTES`. Writing: through a uniquely named temporary created
//! exclusively next to the target (a symlink planted there cannot redirect the write), then
//! renamed over the target, which must be a regular file or absent (a device node is never
//! replaced); an output that is also an input is refused; a failed write leaves nothing
//! behind.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, ErrorKind, Result};

/// What a path names, in words, when it is not a regular file.
fn special_kind(meta: &std::fs::Metadata) -> Option<&'static str> {
    let ft = meta.file_type();
    if ft.is_file() {
        return None;
    }
    if ft.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return Some("a FIFO");
        }
        if ft.is_char_device() {
            return Some("a character device");
        }
        if ft.is_block_device() {
            return Some("a block device");
        }
        if ft.is_socket() {
            return Some("a socket");
        }
    }
    Some("not a regular file")
}

fn io_error(what: String, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("{what}: {e}")).with_source(e)
}

/// Checks that `path` is a regular file LayerZero may read (following symlinks).
pub fn check_regular(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(format!("cannot read {}", path.display()), e))?;
    match special_kind(&meta) {
        None => Ok(()),
        Some(kind) => {
            Err(Error::new(ErrorKind::Io, format!("{} is {kind}; LayerZero reads only regular files", path.display())))
        }
    }
}

/// The read limit of a process that sets none: 256 MiB.
pub const DEFAULT_MAX_READ_BYTES: u64 = 256 << 20;

static MAX_READ_BYTES: AtomicU64 = AtomicU64::new(DEFAULT_MAX_READ_BYTES);

/// Sets the most bytes one input file may hold, for the whole process
/// (`LAYERZERO_MAX_READ_BYTES`, applied when the process's settings are resolved).
pub fn set_max_read_bytes(bytes: u64) {
    MAX_READ_BYTES.store(bytes, Ordering::Relaxed);
}

/// The most bytes one input file may hold.
fn read_limit() -> u64 {
    MAX_READ_BYTES.load(Ordering::Relaxed)
}

/// The bytes of the regular file `path`, at most the read limit.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    check_regular(path)?;
    let limit = read_limit();
    let too_big = |n: u64| {
        Error::new(
            ErrorKind::Io,
            format!(
                "{} holds {n} bytes, more than the {limit} an input may hold (LAYERZERO_MAX_READ_BYTES)",
                path.display()
            ),
        )
    };
    let file = std::fs::File::open(path).map_err(|e| io_error(format!("cannot read {}", path.display()), e))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len > limit {
        return Err(too_big(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // The file may grow while it is read: never past the limit.
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|e| io_error(format!("cannot read {}", path.display()), e))?;
    if bytes.len() as u64 > limit {
        return Err(too_big(bytes.len() as u64));
    }
    Ok(bytes)
}

/// The text of the regular file `path` (UTF-8), at most the read limit.
pub fn read_to_string(path: &Path) -> Result<String> {
    let bytes = read(path)?;
    String::from_utf8(bytes)
        .map_err(|e| Error::new(ErrorKind::Io, format!("{} is not UTF-8 text: {}", path.display(), e.utf8_error())))
}

/// Standard input as text, at most the read limit.
pub fn read_stdin(what: &str) -> Result<String> {
    let limit = read_limit();
    let mut bytes = Vec::new();
    std::io::stdin()
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(format!("cannot read {what} from standard input"), e))?;
    if bytes.len() as u64 > limit {
        return Err(Error::new(
            ErrorKind::Io,
            format!("{what} on standard input exceeds the {limit} bytes an input may hold (LAYERZERO_MAX_READ_BYTES)"),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|e| Error::new(ErrorKind::Io, format!("{what} on standard input is not UTF-8: {}", e.utf8_error())))
}

/// True when `a` and `b` name the same existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A new temporary next to `path`, created exclusively (never an existing file or link).
fn create_temp(path: &Path) -> Result<(PathBuf, std::fs::File)> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    for _ in 0..64 {
        let n = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
        let nanos = crate::time::now_subsec_nanos();
        let tmp = dir.join(format!(".{name}.{}.{n}.{nanos:08x}.tmp", std::process::id()));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error(format!("cannot write {}", path.display()), e)),
        }
    }
    Err(Error::new(ErrorKind::Io, format!("cannot write {}: no free temporary name next to it", path.display())))
}

/// Writes `bytes` to `path`: through an exclusive temporary in the same folder, synced, then
/// renamed over `path`. `path` must be absent or a regular file, and none of `inputs` (the
/// files this run reads) may be the same file.
pub fn write(path: &Path, bytes: &[u8], inputs: &[&Path]) -> Result<()> {
    if let Ok(meta) = std::fs::metadata(path)
        && let Some(kind) = special_kind(&meta)
    {
        return Err(Error::new(
            ErrorKind::Io,
            format!("{} is {kind}; LayerZero writes only regular files", path.display()),
        ));
    }
    if let Some(input) = inputs.iter().find(|i| same_file(path, i)) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("the output {} is also an input ({}); refusing to overwrite it", path.display(), input.display()),
        ));
    }
    let (tmp, mut file) = create_temp(path)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all()).and_then(|()| {
        drop(file);
        std::fs::rename(&tmp, path)
    });
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_error(format!("cannot write {}", path.display()), e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    /// The temporaries left in `dir`; a folder that cannot be read is an error, not "none".
    fn leftovers(dir: &Path) -> TestResult<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                names.push(name);
            }
        }
        Ok(names)
    }

    #[test]
    fn a_write_replaces_a_regular_file_and_leaves_no_temporary() -> TestResult {
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("out.json");
        std::fs::write(&out, "old")?;
        write(&out, b"new", &[])?;
        assert_eq!(std::fs::read_to_string(&out)?, "new");
        assert!(leftovers(dir.path())?.is_empty());
        Ok(())
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_planted_at_the_old_temporary_name_redirects_nothing() -> TestResult {
        let dir = tempfile::tempdir()?;
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep")?;
        let out = dir.path().join("out.json");
        std::os::unix::fs::symlink(&victim, dir.path().join("out.json.tmp"))?;
        write(&out, b"table", &[])?;
        assert_eq!(std::fs::read_to_string(&victim)?, "keep");
        assert_eq!(std::fs::read_to_string(&out)?, "table");
        Ok(())
    }

    #[test]
    fn special_files_are_neither_read_nor_replaced() -> TestResult {
        let dir = tempfile::tempdir()?;
        let err = write(dir.path(), b"x", &[]).err().ok_or("writing over a folder must be refused")?.to_string();
        assert!(err.contains("is a directory") && err.contains("writes only regular files"), "{err}");
        assert!(leftovers(dir.path().parent().unwrap_or(dir.path()))?.iter().all(|n| !n.contains(".tmp.")));
        let err = read(dir.path()).err().ok_or("reading a folder must be refused")?.to_string();
        assert!(err.contains("is a directory") && err.contains("reads only regular files"), "{err}");
        #[cfg(unix)]
        if Path::new("/dev/full").exists() {
            let err =
                write(Path::new("/dev/full"), b"x", &[]).err().ok_or("writing /dev/full must be refused")?.to_string();
            assert!(err.contains("character device"), "{err}");
            let err = read(Path::new("/dev/zero")).err().ok_or("reading /dev/zero must be refused")?.to_string();
            assert!(err.contains("character device"), "{err}");
        }
        Ok(())
    }

    #[test]
    fn an_output_that_is_an_input_is_refused_and_the_input_kept() -> TestResult {
        let dir = tempfile::tempdir()?;
        let input = dir.path().join("workload.json");
        std::fs::write(&input, "{}")?;
        let alias = dir.path().join(".").join("workload.json");
        let err =
            write(&alias, b"table", &[&input]).err().ok_or("an output that is an input must be refused")?.to_string();
        assert!(err.contains("is also an input"), "{err}");
        assert_eq!(std::fs::read_to_string(&input)?, "{}");
        Ok(())
    }

    #[test]
    fn a_missing_folder_fails_cleanly() -> TestResult {
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("no").join("out.json");
        let err = write(&out, b"x", &[]).err().ok_or("a write into a missing folder must fail")?.to_string();
        assert!(err.contains("cannot write") && err.contains("out.json"), "{err}");
        Ok(())
    }
}
