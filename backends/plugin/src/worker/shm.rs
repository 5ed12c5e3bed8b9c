//! Shared-memory files: tensors cross between host and worker in files on `/dev/shm` (a
//! tmpfs: memory, never a disk), each created new (never one that someone else made), readable
//! by this user only, and removed by its creator. The worker maps them; the host only reads and
//! writes them at offsets, so a worker that truncates a file can never fault the host.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the files are: `/dev/shm`, else the temporary folder.
pub(crate) fn dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }
}

/// The name prefix of the files process `pid` creates as `side` (`h` host, `w` worker).
pub(crate) fn prefix(side: char, pid: u32) -> String {
    format!("layerzero-{side}{pid}-")
}

/// A new file of `len` bytes named `prefix` and a number, readable and writable by this user.
pub(crate) fn create(prefix: &str, len: u64) -> io::Result<(PathBuf, File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = dir().join(format!("{prefix}{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(&path)?;
    if let Err(e) = file.set_len(len) {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok((path, file))
}

/// Removes the files a dead worker `pid` left (its output segments).
pub(crate) fn remove_left_by(pid: u32) {
    let prefix = prefix('w', pid);
    let Ok(entries) = std::fs::read_dir(dir()) else { return };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A file this process created and removes when dropped, read and written at offsets.
#[derive(Debug)]
pub(crate) struct Owned {
    pub path: PathBuf,
    pub file: File,
    pub len: u64,
}

impl Owned {
    /// A new file of at least `len` bytes.
    pub fn new(prefix: &str, len: u64) -> io::Result<Owned> {
        let (path, file) = create(prefix, len)?;
        Ok(Owned { path, file, len })
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A file mapped into this process (the worker's view), removed on drop when this process
/// created it.
pub(crate) struct Mapped {
    pub path: PathBuf,
    pub map: memmap2::MmapMut,
    owned: bool,
}

impl Mapped {
    /// A new file of `len` bytes, mapped.
    pub fn create(prefix: &str, len: u64) -> io::Result<Mapped> {
        let (path, file) = create(prefix, len)?;
        match map(&file) {
            Ok(map) => Ok(Mapped { path, map, owned: true }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// The existing file at `path` (the host's), mapped.
    pub fn open(path: &Path) -> io::Result<Mapped> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Mapped { path: path.to_path_buf(), map: map(&file)?, owned: false })
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[allow(unsafe_code)]
fn map(file: &File) -> io::Result<memmap2::MmapMut> {
    // SAFETY: the file is a private shared-memory file of host and worker; the host never
    // truncates a file it has handed over (it makes a new one to grow), so the mapping stays
    // backed. A worker that broke that would fault only itself.
    unsafe { memmap2::MmapMut::map_mut(file) }
}
