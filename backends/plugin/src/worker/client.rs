//! The host's side: one worker process per isolated plugin, started on first use and again
//! after it is lost. A call writes the inputs into the host's shared-memory file, sends where
//! they lie, and waits for the answer until the deadline; a worker that crashes or misses its
//! deadline is killed and the call fails with [`KernelError::WorkerLost`], so the runtime
//! falls back. Calls to one plugin take turns (one worker, one lock per plugin; no lock is
//! shared between plugins).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use layerzero_core::error::{Error, ErrorKind, Result};
use layerzero_core::exec::args::OpArgs;
use layerzero_core::exec::executor::{Executor, KernelError};
use layerzero_core::exec::outputs::Outputs;
use layerzero_core::reason::ReasonCode;
use layerzero_core::tensor::{HostTensor, Storage};

use super::shm::{self, Owned};
use super::wire::{self, Placed, Reply, Request};
use crate::executor::{self, OUTPUT_NAMES};
use crate::plugin_error;

/// How isolated plugins run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerOptions {
    /// The worker program (`layerzero-plugin-worker`).
    pub program: PathBuf,
    /// How long a call may take before its worker is killed.
    pub deadline: Duration,
}

/// What a worker said when it opened its plugin.
pub(crate) struct Opened {
    pub name: String,
    pub version: String,
    pub capabilities: String,
    pub library_blake3: String,
}

/// A plugin's worker process, started when needed.
pub struct Worker {
    path: PathBuf,
    blake3: String,
    options: WorkerOptions,
    capabilities: String,
    state: Mutex<State>,
    starts: AtomicU64,
    lost: AtomicU64,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("path", &self.path).field("starts", &self.starts()).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    live: Option<Live>,
    input: Option<Owned>,
}

/// A running worker.
struct Live {
    child: Child,
    stdin: ChildStdin,
    replies: Receiver<io::Result<Option<Vec<u8>>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// The worker's output files, opened once each.
    files: HashMap<PathBuf, File>,
}

/// The last bytes of a worker's stderr kept for a crash report.
const STDERR_TAIL: usize = 2048;

impl Worker {
    /// Starts a worker for the plugin at `path` (blake3 `blake3`) and opens it there.
    pub(crate) fn start(path: &Path, blake3: &str, options: WorkerOptions) -> Result<(Worker, Opened)> {
        let (live, opened) = spawn(path, blake3, &options)?;
        let worker = Worker {
            path: path.to_path_buf(),
            blake3: blake3.to_owned(),
            options,
            capabilities: opened.capabilities.clone(),
            state: Mutex::new(State { live: Some(live), input: None }),
            starts: AtomicU64::new(1),
            lost: AtomicU64::new(0),
        };
        Ok((worker, opened))
    }

    /// Workers started so far (the first and every restart after a loss).
    pub fn starts(&self) -> u64 {
        self.starts.load(Ordering::Relaxed)
    }

    /// Workers lost so far (crashed, or killed at the deadline).
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// The running worker's process id, if one is running.
    pub fn pid(&self) -> Option<u32> {
        self.state.lock().ok()?.live.as_ref().map(|l| l.child.id())
    }

    /// Runs `kernel` on `args` in the worker.
    pub(crate) fn call(&self, kernel: &str, args: &OpArgs) -> std::result::Result<Outputs, KernelError> {
        let mut state = self.state.lock().map_err(|_| KernelError::Failed("the worker's lock is poisoned".into()))?;
        let state = &mut *state;
        if state.live.is_none() {
            let (live, opened) = spawn(&self.path, &self.blake3, &self.options)
                .map_err(|e| KernelError::WorkerLost(format!("restarting the worker: {e}")))?;
            self.starts.fetch_add(1, Ordering::Relaxed);
            state.live = Some(live);
            if opened.capabilities != self.capabilities {
                return Err(self.lose(state, "opened a plugin that declares other capabilities than at load"));
            }
        }
        let (segment, inputs) = write_inputs(&mut state.input, args)?;
        let attrs = serde_json::to_string(&args.attrs()).map_err(|e| KernelError::InvalidInput(e.to_string()))?;
        let request = Request::Call { kernel: kernel.to_owned(), segment, inputs, attrs };
        let Some(live) = state.live.as_mut() else { return Err(KernelError::Failed("no worker".into())) };
        let answer = match wire::send(&mut live.stdin, &request) {
            Ok(()) => live.replies.recv_timeout(self.options.deadline),
            Err(e) => Ok(Err(e)),
        };
        match answer {
            Ok(Ok(Some(body))) => match wire::parse::<Reply>(&body) {
                Ok(Reply::Done { status, message, outputs }) => {
                    if let Some(e) = executor::kernel_error(kernel, status, &message) {
                        return Err(e);
                    }
                    read_outputs(live, &outputs)
                }
                Ok(_) | Err(_) => Err(self.lose(state, "answered a call with something that is not a result")),
            },
            Ok(Ok(None) | Err(_)) | Err(RecvTimeoutError::Disconnected) => {
                Err(self.lose(state, &format!("died while running {kernel}")))
            }
            Err(RecvTimeoutError::Timeout) => Err(self.lose(
                state,
                &format!("did not finish {kernel} within its deadline of {} ms", self.options.deadline.as_millis()),
            )),
        }
    }

    /// Kills the running worker, reaps it, removes its files; the error says what happened.
    fn lose(&self, state: &mut State, what: &str) -> KernelError {
        self.lost.fetch_add(1, Ordering::Relaxed);
        let Some(mut live) = state.live.take() else { return KernelError::WorkerLost(what.to_owned()) };
        let pid = live.child.id();
        let _ = live.child.kill();
        let ended = live.child.wait().map(describe_exit).unwrap_or_else(|e| format!("cannot be reaped: {e}"));
        shm::remove_left_by(pid);
        let tail = live.stderr.lock().map(|t| String::from_utf8_lossy(&t).trim().to_owned()).unwrap_or_default();
        let tail = if tail.is_empty() { String::new() } else { format!("; its last words: {tail:?}") };
        KernelError::WorkerLost(format!(
            "the worker (pid {pid}) {what}; it {ended}{tail}; the next call starts a new worker"
        ))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(state) = self.state.get_mut()
            && let Some(mut live) = state.live.take()
        {
            // Closing stdin ends a waiting worker; a stuck one is killed.
            drop(live.stdin);
            let _ = live.child.kill();
            let _ = live.child.wait();
            shm::remove_left_by(live.child.id());
        }
    }
}

/// How a killed or dead worker ended.
fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(9)) => "was killed (SIGKILL)".to_owned(),
        (None, Some(sig)) => format!("ended by signal {sig} ({})", signal_name(sig)),
        (None, None) => "ended".to_owned(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        11 => "SIGSEGV",
        15 => "SIGTERM",
        _ => "another signal",
    }
}

/// Starts the worker program, opens the plugin in it, waits for its answer.
fn spawn(path: &Path, blake3: &str, options: &WorkerOptions) -> Result<(Live, Opened)> {
    let failed = |m: String| plugin_error(ReasonCode::PLUGIN_WORKER_FAILED, ErrorKind::Io, path, m);
    let mut child = Command::new(&options.program)
        .arg("--serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(format!("cannot start the worker program {}: {e}", options.program.display())))?;
    let (Some(stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        return Err(failed("the worker's pipes are missing".into()));
    };
    let replies = read_replies(stdout);
    let tail = keep_tail(stderr);
    let mut live = Live { child, stdin, replies, stderr: tail, files: HashMap::new() };
    let open = Request::Open { path: path.to_path_buf(), blake3: blake3.to_owned() };
    let answer = wire::send(&mut live.stdin, &open).map_err(|e| e.to_string()).and_then(|()| {
        match live.replies.recv_timeout(OPEN_DEADLINE) {
            Ok(Ok(Some(body))) => wire::parse::<Reply>(&body).map_err(|e| e.to_string()),
            Ok(Ok(None) | Err(_)) | Err(RecvTimeoutError::Disconnected) => Err("it exited before answering".into()),
            Err(RecvTimeoutError::Timeout) => Err(format!("it did not answer within {} s", OPEN_DEADLINE.as_secs())),
        }
    });
    let refuse = |live: &mut Live| {
        let _ = live.child.kill();
        let _ = live.child.wait();
    };
    match answer {
        Ok(Reply::Opened { name, version, capabilities, library_blake3 }) => {
            Ok((live, Opened { name, version, capabilities, library_blake3 }))
        }
        Ok(Reply::Refused { code, message }) => {
            refuse(&mut live);
            let code = ReasonCode::from_name(&code).unwrap_or(ReasonCode::PLUGIN_WORKER_FAILED);
            let mut e = Error::new(ErrorKind::InvalidInput, format!("(in its worker) {message}"));
            e = e.with_reasons(vec![layerzero_core::reason::Reason::new(code, message)]);
            Err(e)
        }
        Ok(Reply::Done { .. }) => {
            refuse(&mut live);
            Err(failed("the worker answered the opening with a call's result".into()))
        }
        Err(why) => {
            refuse(&mut live);
            Err(failed(format!("the worker {}: {why}", options.program.display())))
        }
    }
}

/// How long a worker may take to load its plugin.
const OPEN_DEADLINE: Duration = Duration::from_secs(30);

/// The worker's replies, read on their own thread so a call can wait with a deadline.
fn read_replies(mut stdout: std::process::ChildStdout) -> Receiver<io::Result<Option<Vec<u8>>>> {
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        loop {
            let frame = wire::receive_bytes(&mut stdout);
            let end = !matches!(frame, Ok(Some(_)));
            if send.send(frame).is_err() || end {
                return;
            }
        }
    });
    receive
}

/// Passes the worker's stderr through to the host's, keeping its last bytes for a report.
fn keep_tail(mut stderr: std::process::ChildStderr) -> Arc<Mutex<Vec<u8>>> {
    let tail = Arc::new(Mutex::new(Vec::new()));
    let kept = tail.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 1024];
        while let Ok(n @ 1..) = stderr.read(&mut chunk) {
            use std::io::Write;
            let _ = std::io::stderr().write_all(&chunk[..n]);
            if let Ok(mut t) = kept.lock() {
                t.extend_from_slice(&chunk[..n]);
                let over = t.len().saturating_sub(STDERR_TAIL);
                t.drain(..over);
            }
        }
    });
    tail
}

const ALIGN: usize = 64;

/// Writes each input's bytes (the span its strides reach) into the host's segment, grown into
/// a new file when too small; returns the segment and where each input lies.
fn write_inputs(
    segment: &mut Option<Owned>,
    args: &OpArgs,
) -> std::result::Result<(PathBuf, Vec<Placed>), KernelError> {
    let tensors = args.tensors();
    let io = |e: io::Error| KernelError::Failed(format!("shared memory for the inputs: {e}"));
    let mut placed = Vec::with_capacity(tensors.len());
    let mut at = 0usize;
    for (name, t) in &tensors {
        let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
        let strides: Vec<i64> = t.strides().iter().map(|&s| s as i64).collect();
        let size = executor::elem_bytes(t.dtype());
        let bytes = super::extent(&shape, &strides)
            .and_then(|n| n.checked_mul(size))
            .ok_or_else(|| KernelError::InvalidInput(format!("input {name}: its extent overflows")))?;
        placed.push(Placed {
            name: (*name).to_owned(),
            dtype: executor::code(t.dtype()),
            shape,
            strides,
            segment: None,
            offset: at,
            bytes,
        });
        at = (at + bytes).div_ceil(ALIGN) * ALIGN;
    }
    if segment.as_ref().is_none_or(|s| s.len < at as u64) {
        let len = (at as u64).max(segment.as_ref().map_or(0, |s| s.len * 2)).max(1 << 20);
        *segment = None;
        *segment = Some(Owned::new(&shm::prefix('h', std::process::id()), len).map_err(io)?);
    }
    let Some(file) = segment.as_ref() else { return Err(KernelError::Failed("no input segment".into())) };
    for ((_, t), p) in tensors.iter().zip(&placed) {
        let size = executor::elem_bytes(t.dtype());
        let all = t.storage().bytes();
        let start = t.offset() * size;
        let span = all.get(start..start + p.bytes).ok_or_else(|| {
            KernelError::InvalidInput(format!("input {}: its strides reach past its storage", p.name))
        })?;
        file.file.write_all_at(span, p.offset as u64).map_err(io)?;
    }
    Ok((file.path.clone(), placed))
}

/// Copies each output out of the worker's file into a host tensor.
fn read_outputs(live: &mut Live, outputs: &[Placed]) -> std::result::Result<Outputs, KernelError> {
    let bad = |m: String| KernelError::Failed(format!("the worker's output {m}"));
    let mut out = Outputs::new();
    let own = shm::prefix('w', live.child.id());
    for p in outputs {
        let name = OUTPUT_NAMES
            .iter()
            .find(|n| **n == p.name)
            .ok_or_else(|| bad(format!("{:?} is not an output name", p.name)))?;
        let dtype = executor::dtype_of(p.dtype).ok_or_else(|| bad(format!("{name}: dtype code {}", p.dtype)))?;
        let dims: Vec<usize> = p.shape.iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect();
        let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n.and_then(|n| n.checked_mul(executor::elem_bytes(dtype))) != Some(p.bytes) {
            return Err(bad(format!("{name}: {} bytes for shape {:?}", p.bytes, p.shape)));
        }
        let path = p.segment.as_ref().ok_or_else(|| bad(format!("{name}: no segment")))?;
        // Only the worker's own files, in the shared-memory folder.
        let named = path.parent() == Some(shm::dir().as_path())
            && path.file_name().is_some_and(|f| f.to_string_lossy().starts_with(&own));
        if !named {
            return Err(bad(format!("{name}: segment {} is not the worker's", path.display())));
        }
        if !live.files.contains_key(path) {
            let f = File::open(path).map_err(|e| bad(format!("{name}: opening {}: {e}", path.display())))?;
            live.files.retain(|p, _| p.exists());
            live.files.insert(path.clone(), f);
        }
        let Some(file) = live.files.get(path) else { return Err(bad(format!("{name}: no file"))) };
        let mut storage = Storage::zeros(dtype, n.unwrap_or(0));
        let read =
            |buf: &mut [u8]| file.read_exact_at(buf, p.offset as u64).map_err(|e| bad(format!("{name}: reading: {e}")));
        match bytes_mut(&mut storage) {
            Some(buf) => read(buf)?,
            None => {
                let mut raw = vec![0u8; p.bytes];
                read(&mut raw)?;
                storage = Storage::Bool(raw.into_iter().map(|b| b != 0).collect());
            }
        }
        let tensor = HostTensor::new(storage, &dims).map_err(|e| bad(format!("{name}: {e}")))?;
        out.insert(name, tensor);
    }
    Ok(out)
}

/// The elements' bytes, writable (`None` for bool, held as `Vec<bool>`).
fn bytes_mut(s: &mut Storage) -> Option<&mut [u8]> {
    Some(match s {
        Storage::F32(b) => bytemuck::cast_slice_mut(&mut b[..]),
        Storage::F16(b) => bytemuck::cast_slice_mut(&mut b[..]),
        Storage::BF16(b) => bytemuck::cast_slice_mut(&mut b[..]),
        Storage::Fp8E4M3(b) | Storage::Fp8E5M2(b) => &mut b[..],
        Storage::I8(b) => bytemuck::cast_slice_mut(&mut b[..]),
        Storage::I32(b) => bytemuck::cast_slice_mut(&mut b[..]),
        Storage::I64(b) => bytemuck::cast_slice_mut(&mut b[..]),
        Storage::Bool(_) => return None,
    })
}

/// One kernel of an isolated plugin: each call runs in the plugin's worker process.
pub struct IsolatedExecutor {
    worker: Arc<Worker>,
    id: String,
}

impl IsolatedExecutor {
    pub(crate) fn new(worker: Arc<Worker>, id: String) -> IsolatedExecutor {
        IsolatedExecutor { worker, id }
    }
}

impl Executor for IsolatedExecutor {
    fn run(&self, args: &OpArgs) -> std::result::Result<Outputs, KernelError> {
        self.worker.call(&self.id, args)
    }

    fn kills_at_deadline(&self) -> bool {
        true
    }
}
