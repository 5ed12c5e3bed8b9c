//! Tensors in device memory (a CUDA tensor lent by torch) through the runtime: selected for
//! their device, handed only to executors that take device memory, never read on the host,
//! and falling back like any other call. The device here is a stand-in region (no GPU is
//! needed): what the runtime does with it is the same.

use std::any::Any;
use std::sync::{Arc, Mutex};

use layerzero::LayerZero;
use layerzero::exec::args::{AttentionArgs, OpArgs, Outputs};
use layerzero::exec::executor::{Executor, KernelError};
use layerzero::model::attrs::AttentionAttrs;
use layerzero::model::device::{DeviceKind, DeviceRef};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::policy::Policy;
use layerzero::tensor::{HostTensor, Region, Storage};
use layerzero_tests::TestResult;

/// Memory "on cuda:0": a size and no host bytes, as the Python package lends a CUDA tensor.
struct OnGpu {
    bytes: usize,
}

impl Region for OnGpu {
    fn bytes(&self) -> &[u8] {
        &[]
    }
    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        None
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn device(&self) -> Option<(DeviceRef, usize)> {
        Some((DeviceRef { kind: DeviceKind::Cuda, index: Some(0) }, self.bytes))
    }
}

fn on_gpu(dtype: DType, shape: &[usize]) -> TestResult<HostTensor> {
    let n: usize = shape.iter().product();
    let storage = Storage::lent(dtype, Box::new(OnGpu { bytes: n * dtype.size_bytes() as usize }))?;
    let strides = layerzero::tensor::row_major_strides(shape);
    Ok(HostTensor::strided(storage, shape, &strides, 0)?.with_layout(Layout::Bshd))
}

fn attention(make: impl Fn(&[usize]) -> TestResult<HostTensor>) -> TestResult<OpArgs> {
    let attrs = AttentionAttrs { causal: true, ..AttentionAttrs::default() };
    Ok(OpArgs::Attention(AttentionArgs {
        q: make(&[1, 128, 8, 64])?,
        k: make(&[1, 128, 2, 64])?,
        v: make(&[1, 128, 2, 64])?,
        mask: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        attrs,
    }))
}

/// A GPU kernel's executor that records what it was handed and returns an output on the
/// device.
struct GpuKernel {
    name: &'static str,
    takes_device: bool,
    ran: Ran,
}

impl Executor for GpuKernel {
    fn takes_device_memory(&self) -> bool {
        self.takes_device
    }
    fn run(&self, args: &OpArgs) -> Result<Outputs, KernelError> {
        let q = args.tensors()[0].1.clone();
        self.ran.lock().map_err(|_| KernelError::Failed("poisoned".into()))?.push((self.name, q.device()));
        let out = on_gpu(q.dtype(), q.shape()).map_err(|e| KernelError::Failed(e.to_string()))?;
        let mut outputs = Outputs::new();
        outputs.insert("out", out);
        Ok(outputs)
    }
}

type Ran = Arc<Mutex<Vec<(&'static str, Option<DeviceRef>)>>>;

/// An H100 whose policy allows torch SDPA's CUDA kernels and LayerZero's CPU ones, each SDPA
/// kernel with a recording executor (`host_only`: one that reads host memory only).
fn h100(host_only: &[&str]) -> TestResult<(LayerZero, Ran)> {
    let ran: Ran = Arc::new(Mutex::new(Vec::new()));
    let policy = Policy::from_json(
        r#"{"rules": [{"action": "allow", "kernels": "torch_sdpa.attention.flash"},
            {"action": "allow", "kernels": "torch_sdpa.attention.efficient"},
            {"action": "allow", "kernels": "torch_sdpa.attention.math"}, {"action": "allow", "kernels": "cpu.*"}]}"#,
        "test",
    )?;
    let mut lz = LayerZero::planning("h100")?.with_policy(policy)?;
    for name in ["torch_sdpa.attention.flash", "torch_sdpa.attention.efficient", "torch_sdpa.attention.math"] {
        let exec = GpuKernel { name, takes_device: !host_only.contains(&name), ran: ran.clone() };
        lz = lz.register(name, Arc::new(exec))?;
    }
    Ok((lz, ran))
}

#[test]
fn device_tensors_describe_their_device_and_have_no_host_elements() -> TestResult {
    let t = on_gpu(DType::BF16, &[2, 3])?;
    assert_eq!(t.device().map(|d| d.to_string()).as_deref(), Some("cuda:0"));
    assert_eq!(t.desc().device, t.device());
    assert!(t.storage().is_empty() && t.storage().bytes().is_empty(), "the host must read none of its elements");
    // A view within it is fine; one past its end is not.
    assert!(t.view(&[3], &[1], 3).is_ok());
    assert!(t.view(&[3], &[1], 4).is_err());
    Ok(())
}

#[test]
fn a_call_on_the_gpu_runs_a_gpu_kernel_handed_device_memory() -> TestResult {
    let (lz, ran) = h100(&[])?;
    let d = lz.dispatch(&attention(|s| on_gpu(DType::BF16, s))?)?;
    let kernel = d.selection().kernel.clone();
    assert!(kernel.starts_with("torch_sdpa.attention.") && !d.fell_back(), "{:?}", d.attempts());
    assert_eq!(d.outputs["out"].device(), Some(DeviceRef { kind: DeviceKind::Cuda, index: Some(0) }));
    let seen = ran.lock().map_err(|_| "poisoned")?.clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].1.map(|d| d.kind), Some(DeviceKind::Cuda));
    Ok(())
}

#[test]
fn the_same_shapes_in_host_memory_are_the_cpus_on_a_gpu_machine() -> TestResult {
    let (lz, _) = h100(&[])?;
    let host = |s: &[usize]| -> TestResult<HostTensor> {
        let n = s.iter().product();
        Ok(HostTensor::from_f32_as(DType::BF16, s, &vec![0.25; n])?.with_layout(Layout::Bshd))
    };
    // Host memory first, then the same shapes on the device: neither may be served the
    // other's cached selection.
    let on_cpu = lz.dispatch(&attention(host)?)?;
    assert!(on_cpu.selection().kernel.starts_with("cpu."), "{}", on_cpu.selection().kernel);
    let on_device = lz.dispatch(&attention(|s| on_gpu(DType::BF16, s))?)?;
    assert!(on_device.selection().kernel.starts_with("torch_sdpa."), "{}", on_device.selection().kernel);
    let again = lz.dispatch(&attention(host)?)?;
    assert_eq!(again.selection().kernel, on_cpu.selection().kernel);
    Ok(())
}

#[test]
fn an_injected_fault_on_a_gpu_kernel_falls_back_to_the_next_gpu_kernel() -> TestResult {
    let (healthy, _) = h100(&[])?;
    let first = healthy.dispatch(&attention(|s| on_gpu(DType::BF16, s))?)?.selection().kernel.clone();
    let (lz, ran) = h100(&[])?;
    let lz = lz.with_faults(&format!("{first}=error"))?;
    let d = lz.dispatch(&attention(|s| on_gpu(DType::BF16, s))?)?;
    assert!(d.fell_back() && d.selection().kernel != first, "{:?}", d.attempts());
    let why = d.failed()[0].reason.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(why.contains("KERNEL_FAILED") && why.contains("LAYERZERO_FAULTS"), "{why}");
    assert_eq!(ran.lock().map_err(|_| "poisoned")?.len(), 1, "the faulted kernel must not have run");
    Ok(())
}

#[test]
fn an_executor_that_reads_host_memory_is_never_handed_device_memory() -> TestResult {
    let (healthy, _) = h100(&[])?;
    let first = healthy.dispatch(&attention(|s| on_gpu(DType::BF16, s))?)?.selection().kernel.clone();
    let name: &'static str =
        ["torch_sdpa.attention.flash", "torch_sdpa.attention.efficient", "torch_sdpa.attention.math"]
            .into_iter()
            .find(|k| *k == first)
            .ok_or("the first kernel is one of SDPA's")?;
    let (lz, ran) = h100(&[name])?;
    let d = lz.dispatch(&attention(|s| on_gpu(DType::BF16, s))?)?;
    assert!(d.fell_back() && d.selection().kernel != first);
    let why = d.failed()[0].reason.as_ref().map(ToString::to_string).unwrap_or_default();
    assert!(why.contains("DEVICE_KIND_MISMATCH") && why.contains("host memory"), "{why}");
    assert!(ran.lock().map_err(|_| "poisoned")?.iter().all(|(k, _)| *k != name));
    Ok(())
}

#[test]
fn a_transform_that_copies_through_host_memory_refuses_device_tensors() -> TestResult {
    let args = attention(|s| on_gpu(DType::BF16, s))?;
    let t = layerzero::transform::Transform {
        tensor: "q",
        kind: layerzero::transform::TransformKind::Cast,
        from: "bf16",
        to: "f32",
        bytes: 0,
        ns: 0.0,
    };
    let e = layerzero::transform::apply_transforms(&args, &[t]).err().ok_or("a cast of device memory must fail")?;
    assert!(e.to_string().contains("cuda:0") && e.to_string().contains("host memory"), "{e}");
    Ok(())
}
