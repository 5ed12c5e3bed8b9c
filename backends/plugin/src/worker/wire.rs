//! What host and worker say to each other over the worker's stdin and stdout: JSON messages,
//! each after its length (4 bytes, little-endian). Tensor data never travels here: it is in
//! shared-memory files, and a message says where.

use std::io::{self, Read, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// No message is longer (capabilities and metadata, never data).
const MAX_MESSAGE: usize = 16 << 20;

/// Host to worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Request {
    /// Open the plugin at `path` if its blake3 is `blake3`.
    Open {
        /// The library file.
        path: PathBuf,
        /// Its expected blake3, hex.
        blake3: String,
    },
    /// Run `kernel` on the inputs in the host's segment `segment`.
    Call {
        /// The namespaced kernel id.
        kernel: String,
        /// The shared-memory file the inputs are in.
        segment: PathBuf,
        /// Each input, where it lies in `segment`.
        inputs: Vec<Placed>,
        /// The attributes, JSON.
        attrs: String,
    },
}

/// Worker to host.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reply {
    /// The plugin opened.
    Opened {
        /// Its name.
        name: String,
        /// Its version.
        version: String,
        /// Its capabilities JSON, as it returned them.
        capabilities: String,
        /// blake3 of the library file the worker loaded, hex.
        library_blake3: String,
    },
    /// The plugin was refused.
    Refused {
        /// The reason code.
        code: String,
        /// The message.
        message: String,
    },
    /// The kernel returned.
    Done {
        /// Its status code.
        status: i32,
        /// Its message (empty on success).
        message: String,
        /// Its outputs, where each lies (in the worker's segments).
        outputs: Vec<Placed>,
    },
}

/// A tensor in a shared-memory file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Placed {
    /// Its name.
    pub name: String,
    /// Its ABI dtype code.
    pub dtype: u32,
    /// Its sizes.
    pub shape: Vec<i64>,
    /// Its strides, in elements.
    pub strides: Vec<i64>,
    /// The file (outputs; inputs are in the call's segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<PathBuf>,
    /// Byte offset of its first element in the file.
    pub offset: usize,
    /// Bytes from there that it spans.
    pub bytes: usize,
}

/// Writes `message` as one frame.
pub(crate) fn send<T: Serialize>(w: &mut impl Write, message: &T) -> io::Result<()> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("message too long"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&body)?;
    w.flush()
}

/// Reads one frame's bytes; `Ok(None)` at a clean end of the stream.
pub(crate) fn receive_bytes(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::other(format!("a message of {len} bytes (at most {MAX_MESSAGE})")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// Parses a frame's bytes.
pub(crate) fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> io::Result<T> {
    serde_json::from_slice(body).map_err(io::Error::other)
}
