//! Moving a bad database aside: renamed, never deleted, with its `-wal` and `-shm` files.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{Error, ErrorKind, Result};

/// `<path><suffix>`, e.g. `perfdb.sqlite-wal`.
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s: OsString = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The first free `<path>.corrupt-<secs>[-n]` (free for the file and its `-wal`/`-shm`).
pub(crate) fn aside_name(path: &Path, secs: i64) -> PathBuf {
    let taken = |p: &Path| {
        p.symlink_metadata().is_ok()
            || with_suffix(p, "-wal").symlink_metadata().is_ok()
            || with_suffix(p, "-shm").symlink_metadata().is_ok()
    };
    let base = with_suffix(path, &format!(".corrupt-{secs}"));
    if !taken(&base) {
        return base;
    }
    let mut n = 1u32;
    loop {
        let p = with_suffix(&base, &format!("-{n}"));
        if !taken(&p) || n == u32::MAX {
            return p;
        }
        n += 1;
    }
}

/// Renames `path` (and its `-wal`/`-shm`, where present) to a free `.corrupt-<secs>[-n]` name;
/// returns the new path of the main file.
pub(crate) fn move_aside(path: &Path, secs: i64) -> Result<PathBuf> {
    let to = aside_name(path, secs);
    let rename = |from: &Path, to: &Path| {
        std::fs::rename(from, to).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("perfdb {}: cannot move the damaged file aside to {}: {e}", from.display(), to.display()),
            )
            .with_source(e)
        })
    };
    // Only regular files are ever moved (a device node or a FIFO named as the PerfDB is
    // refused before this point; this keeps it so).
    if let Ok(meta) = path.symlink_metadata() {
        if !meta.is_file() {
            return Err(Error::new(
                ErrorKind::Io,
                format!("perfdb {}: not a regular file; it is not moved aside", path.display()),
            ));
        }
        rename(path, &to)?;
    }
    for suffix in ["-wal", "-shm"] {
        let side = with_suffix(path, suffix);
        if side.symlink_metadata().is_ok() {
            rename(&side, &with_suffix(&to, suffix))?;
        }
    }
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    #[test]
    fn names_skip_taken_ones_and_keep_companions() -> TestResult {
        let dir = tempfile::tempdir()?;
        let db = dir.path().join("perfdb.sqlite");
        std::fs::write(&db, b"main")?;
        std::fs::write(with_suffix(&db, "-wal"), b"wal")?;
        let first = move_aside(&db, 42)?;
        assert_eq!(first, dir.path().join("perfdb.sqlite.corrupt-42"));
        assert_eq!(std::fs::read(&first)?, b"main");
        assert_eq!(std::fs::read(with_suffix(&first, "-wal"))?, b"wal");
        assert!(!db.exists() && !with_suffix(&db, "-wal").exists());

        std::fs::write(&db, b"again")?;
        let second = move_aside(&db, 42)?;
        assert_eq!(second, dir.path().join("perfdb.sqlite.corrupt-42-1"));
        assert_eq!(std::fs::read(&second)?, b"again");
        assert_eq!(std::fs::read(&first)?, b"main");
        Ok(())
    }
}
