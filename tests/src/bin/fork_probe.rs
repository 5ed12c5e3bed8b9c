//! E2E spec §16, a handle used by a forked child: builds a handle and dispatches a parallel
//! kernel (rayon's pool starts; with `deadline`, a deadline runner too), forks, and dispatches
//! with the inherited handle in the child. With `model DIR` it generates greedily from the
//! model's Hugging Face reference prompt instead, in the parent and in the child. The parent
//! waits for the child at most 60 s (then kills it: a hang) and prints one JSON line: the
//! kernel, how far the parent's output is from its reference (the f64 oracle; HF's tokens),
//! and what the child got. `fork` is not a `Command`: a child started with `exec` inherits
//! nothing.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use layerzero::LayerZero;
use layerzero::exec::args::{NormArgs, OpArgs};
use layerzero::policy::Policy;
use layerzero::tensor::HostTensor;
use layerzero_llm as llm;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// rms_norm over 2048 rows of 512: large enough that the `cpu` kernel splits it over rayon.
fn norm() -> Result<OpArgs> {
    let (rows, hidden) = (2048, 512);
    let x = HostTensor::from_f32(&[rows, hidden], (0..rows * hidden).map(|i| (i % 13) as f32 * 0.25 - 1.5).collect())?;
    let weight = HostTensor::from_f32(&[hidden], (0..hidden).map(|i| 0.5 + (i % 3) as f32 * 0.25).collect())?;
    Ok(OpArgs::RmsNorm(NormArgs { x, weight, bias: None, residual: None, attrs: Default::default() }))
}

fn run(lz: &LayerZero, args: &OpArgs) -> Result<(String, Vec<f32>)> {
    let d = lz.dispatch(args)?;
    let out = d.outputs.get("out").ok_or("no output `out`")?.to_f32_vec();
    Ok((d.selection().kernel.clone(), out))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[allow(unsafe_code)]
fn fork() -> i32 {
    // SAFETY: `fork` has no preconditions. The child only dispatches on the inherited handle
    // (what this program tests), writes one line and leaves with `_exit`.
    unsafe { libc::fork() }
}

#[allow(unsafe_code)]
fn exit_now(code: i32) -> ! {
    let _ = std::io::stdout().flush();
    // SAFETY: `_exit` ends the process without running the parent's exit handlers twice.
    unsafe { libc::_exit(code) }
}

/// The child: the parent's work twice with the inherited handle, each compared with the
/// parent's output.
fn child(work: &dyn Fn() -> Result<Vec<f32>>, parent: &[f32]) -> ! {
    let mut verdicts = Vec::new();
    for _ in 0..2 {
        verdicts.push(match work() {
            Ok(out) if max_diff(&out, parent) == 0.0 => "same".to_owned(),
            Ok(out) => format!("differs by {}", max_diff(&out, parent)),
            Err(e) => format!("error: {e}"),
        });
    }
    println!("{}", serde_json::json!(verdicts));
    exit_now(if verdicts.iter().all(|v| v == "same") { 0 } else { 1 })
}

#[allow(unsafe_code)]
fn wait(pid: i32, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    let mut status = 0;
    while start.elapsed() < limit {
        // SAFETY: waits for our own child; `status` is a live local.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Some(if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -1 });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kills and reaps our own child, which did not finish in time.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
    None
}

/// Greedy tokens from `model` for its HF reference's prompt, as f32s, and HF's.
fn generate(lz: &LayerZero, model: &llm::Model) -> Result<(Vec<f32>, Vec<f32>)> {
    let reference = layerzero::tensor::io::read(&model.dir.join("reference.safetensors"))?;
    let ids = |name: &str| -> Result<Vec<u32>> {
        let t = reference.get(name).ok_or_else(|| format!("no reference tensor {name}"))?;
        Ok(t.to_f64_vec().iter().map(|&x| x as u32).collect())
    };
    let (prompt, hf) = (ids("prompt_ids")?, ids("generated_ids")?);
    let g = llm::Generation { max_new_tokens: hf.len(), stop_at_eos: false, ..llm::Generation::default() };
    let out = llm::generate::generate(model, lz, &prompt, &g, |_| {})?;
    let ours = out.sequences.first().ok_or("no sequence")?.generated_ids.iter().map(|&t| t as f32).collect();
    Ok((ours, hf.iter().map(|&t| t as f32).collect()))
}

fn main() -> Result<ExitCode> {
    let argv: Vec<String> = std::env::args().collect();
    let deadline = argv.iter().any(|a| a == "deadline");
    let model_dir = argv.iter().position(|a| a == "model").and_then(|i| argv.get(i + 1));
    let lz = LayerZero::detected()?;
    if deadline {
        lz.set_policy(Policy::from_json(r#"{"kernel_timeout_ms": 20000}"#, "deadline")?)?;
    }
    let args = norm()?;
    let model = model_dir.map(|d| llm::Model::load(std::path::Path::new(d), None)).transpose()?;
    let work = || -> Result<Vec<f32>> {
        match &model {
            Some(m) => Ok(generate(&lz, m)?.0),
            None => Ok(run(&lz, &args)?.1),
        }
    };
    let (kernel, parent, reference) = match &model {
        Some(m) => {
            let (ours, hf) = generate(&lz, m)?;
            (m.dir.display().to_string(), ours, hf)
        }
        None => {
            let (kernel, parent) = run(&lz, &args)?;
            let lock = r#"{"rules": [{"action": "lock", "kernels": "cpu_reference.rms_norm.naive"}]}"#;
            let oracle = LayerZero::detected()?.with_policy(Policy::from_json(lock, "oracle")?)?;
            (kernel, parent, run(&oracle, &args)?.1)
        }
    };
    let _ = std::io::stdout().flush();
    let pid = fork();
    if pid == 0 {
        child(&work, &parent);
    }
    if pid < 0 {
        return Err("fork failed".into());
    }
    let started = Instant::now();
    let code = wait(pid, Duration::from_secs(60));
    let child = match code {
        Some(0) => "same",
        Some(_) => "failed",
        None => "hang",
    };
    println!(
        "{}",
        serde_json::json!({"kernel": kernel, "deadline": deadline, "parent_vs_reference": max_diff(&parent, &reference),
                           "child": child, "child_ms": started.elapsed().as_millis() as u64})
    );
    Ok(if code == Some(0) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
