//! The worker's side: opens one plugin, then runs its kernels on request, inputs read and
//! outputs written in place in shared-memory files. Whatever the plugin does to this process
//! (abort, a bad write, a loop) ends here; the host sees a closed pipe or a late answer.

use std::ffi::{CString, c_void};
use std::fs::File;
use std::io::{self, BufReader};

use layerzero_core::model::dtype::DType;
use layerzero_plugin_abi as abi;

use super::shm::{self, Mapped};
use super::wire::{self, Placed, Reply, Request};
use crate::Plugin;
use crate::executor::{self, Sink};

/// Runs the worker on this process's stdin and stdout until the host closes stdin (or goes
/// away); returns the exit code.
pub fn serve() -> i32 {
    let (requests, replies) = match private_pipes() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("layerzero-plugin-worker: {e}");
            return 2;
        }
    };
    watch_parent();
    let mut requests = BufReader::new(requests);
    let mut replies = io::BufWriter::new(replies);
    let mut state = State { plugin: None, input: None, output: Arena::default() };
    loop {
        let body = match wire::receive_bytes(&mut requests) {
            Ok(Some(body)) => body,
            Ok(None) => return 0,
            Err(e) => {
                eprintln!("layerzero-plugin-worker: reading a request: {e}");
                return 2;
            }
        };
        let reply = match wire::parse::<Request>(&body) {
            Ok(request) => state.handle(request),
            Err(e) => Reply::Done {
                status: abi::status::INVALID_INPUT,
                message: format!("bad request: {e}"),
                outputs: vec![],
            },
        };
        if let Err(e) = wire::send(&mut replies, &reply) {
            eprintln!("layerzero-plugin-worker: writing a reply: {e}");
            return 2;
        }
    }
}

struct State {
    plugin: Option<Plugin>,
    input: Option<Mapped>,
    output: Arena,
}

impl State {
    fn handle(&mut self, request: Request) -> Reply {
        match request {
            Request::Open { path, blake3 } => match Plugin::open_expecting(&path, Some(&blake3)) {
                Ok(p) => {
                    let reply = Reply::Opened {
                        name: p.name.clone(),
                        version: p.version.clone(),
                        capabilities: p.capabilities.clone(),
                        library_blake3: p.library_hash.clone(),
                    };
                    self.plugin = Some(p);
                    reply
                }
                Err(e) => Reply::Refused {
                    code: e.reasons().first().map_or_else(String::new, |r| r.code().as_str().to_owned()),
                    message: e.to_string(),
                },
            },
            Request::Call { kernel, segment, inputs, attrs } => {
                let (status, message, outputs) = match self.call(&kernel, &segment, &inputs, attrs) {
                    Ok(done) => done,
                    Err(why) => (abi::status::INVALID_INPUT, why, Vec::new()),
                };
                Reply::Done { status, message, outputs }
            }
        }
    }

    fn call(
        &mut self,
        kernel: &str,
        segment: &std::path::Path,
        inputs: &[Placed],
        attrs: String,
    ) -> Result<(i32, String, Vec<Placed>), String> {
        let plugin = self.plugin.as_ref().ok_or("no plugin is open in this worker")?;
        let entry = plugin.entry(kernel).ok_or_else(|| format!("the plugin has no kernel {kernel}"))?;
        if self.input.as_ref().is_none_or(|m| m.path != segment) {
            self.input = None;
            self.input = Some(Mapped::open(segment).map_err(|e| format!("mapping {}: {e}", segment.display()))?);
        }
        let Some(input) = self.input.as_mut() else { return Err("no input segment".into()) };
        let base = input.map.as_mut_ptr();
        let len = input.map.len();
        let names: Vec<CString> = inputs
            .iter()
            .map(|p| CString::new(p.name.as_str()).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let mut args = Vec::with_capacity(inputs.len());
        for (p, name) in inputs.iter().zip(&names) {
            check_input(p, len)?;
            args.push(abi::Arg {
                name: name.as_ptr(),
                tensor: abi::Tensor {
                    data: base.wrapping_add(p.offset).cast::<c_void>(),
                    dtype: p.dtype,
                    device: abi::device::CPU,
                    device_index: 0,
                    ndim: p.shape.len() as u32,
                    shape: p.shape.as_ptr(),
                    strides: p.strides.as_ptr(),
                },
            });
        }
        let attrs = CString::new(attrs).map_err(|e| e.to_string())?;
        self.output.begin().map_err(|e| format!("output memory: {e}"))?;
        let mut sink = ArenaSink { arena: &mut self.output, placed: Vec::new() };
        // SAFETY: `entry` is a kernel of `plugin`, loaded for the worker's life; each input
        // descriptor points into the mapped segment, inside it (`check_input`), with shape
        // and strides that stay alive in `inputs` until the call returns.
        #[allow(unsafe_code)]
        let (status, message) = unsafe { executor::invoke(entry, &args, &attrs, &mut sink) };
        let placed = if status == abi::status::OK { sink.placed } else { Vec::new() };
        Ok((status, message, placed))
    }
}

/// An input's bytes lie in the segment, aligned for its dtype, and cover its shape and strides.
fn check_input(p: &Placed, len: usize) -> Result<(), String> {
    let dtype = executor::dtype_of(p.dtype).ok_or_else(|| format!("input {}: dtype code {}", p.name, p.dtype))?;
    let size = executor::elem_bytes(dtype);
    let end = p.offset.checked_add(p.bytes).filter(|&e| e <= len);
    let extent = super::extent(&p.shape, &p.strides).and_then(|n| n.checked_mul(size));
    match (end, extent) {
        (Some(_), Some(need))
            if need <= p.bytes && p.offset.is_multiple_of(size) && p.shape.len() == p.strides.len() =>
        {
            Ok(())
        }
        _ => Err(format!("input {} does not lie inside the shared segment as described", p.name)),
    }
}

/// Output memory: shared-memory segments this worker creates, handed out front to back in a
/// call; the next call starts again at the front (one segment large enough for all).
#[derive(Default)]
struct Arena {
    segments: Vec<Mapped>,
    used: usize,
}

const ALIGN: usize = 64;
const FIRST_SEGMENT: usize = 1 << 20;

impl Arena {
    fn begin(&mut self) -> io::Result<()> {
        if self.segments.len() > 1 {
            let total: usize = self.segments.iter().map(|s| s.map.len()).sum();
            self.segments.clear();
            self.segments.push(Mapped::create(&shm::prefix('w', std::process::id()), total as u64)?);
        }
        self.used = 0;
        Ok(())
    }

    /// `bytes` zeroed bytes: the segment, the offset, the address.
    fn alloc(&mut self, bytes: usize) -> io::Result<(std::path::PathBuf, usize, *mut u8)> {
        let at = self.used.div_ceil(ALIGN) * ALIGN;
        let fits = self.segments.last().is_some_and(|s| at + bytes <= s.map.len());
        let at = if fits {
            at
        } else {
            let last = self.segments.last().map_or(0, |s| s.map.len());
            let len = bytes.max(last * 2).max(FIRST_SEGMENT);
            self.segments.push(Mapped::create(&shm::prefix('w', std::process::id()), len as u64)?);
            0
        };
        let Some(segment) = self.segments.last_mut() else { return Err(io::Error::other("no segment")) };
        let region = &mut segment.map[at..at + bytes];
        region.fill(0);
        self.used = at + bytes;
        Ok((segment.path.clone(), at, region.as_mut_ptr()))
    }
}

struct ArenaSink<'a> {
    arena: &'a mut Arena,
    placed: Vec<Placed>,
}

impl Sink for ArenaSink<'_> {
    fn alloc(&mut self, name: &'static str, dtype: DType, dims: &[usize], bytes: usize) -> Result<*mut c_void, String> {
        let (segment, offset, data) = self.arena.alloc(bytes).map_err(|e| format!("output memory: {e}"))?;
        self.placed.push(Placed {
            name: name.to_owned(),
            dtype: executor::code(dtype),
            shape: dims.iter().map(|&d| d as i64).collect(),
            strides: layerzero_core::tensor::row_major_strides(dims).iter().map(|&s| s as i64).collect(),
            segment: Some(segment),
            offset,
            bytes,
        });
        Ok(data.cast())
    }
}

/// The protocol's own copies of stdin and stdout; the process's stdin becomes `/dev/null` and
/// its stdout its stderr, so a plugin that prints cannot corrupt the protocol.
#[allow(unsafe_code)]
fn private_pipes() -> io::Result<(File, File)> {
    use std::os::fd::FromRawFd;
    let null = File::open("/dev/null")?;
    // SAFETY: plain descriptor calls on fds 0, 1, 2 and one just opened; each result is
    // checked, and each new descriptor is owned by exactly one `File`.
    unsafe {
        let requests = libc::dup(0);
        let replies = libc::dup(1);
        if requests < 0 || replies < 0 {
            return Err(io::Error::last_os_error());
        }
        let (requests, replies) = (File::from_raw_fd(requests), File::from_raw_fd(replies));
        if libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 0) < 0 || libc::dup2(2, 1) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((requests, replies))
    }
}

/// Ends this process when the host is gone, even while a kernel is stuck: a worker never
/// outlives the process it serves.
fn watch_parent() {
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            if std::os::unix::process::parent_id() != parent {
                shm::remove_left_by(std::process::id());
                std::process::exit(3);
            }
        }
    });
}
