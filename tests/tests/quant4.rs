//! Spec 002 §6.5 and §22: 4-bit weights (nf4, mxfp4, nvfp4) run on this CPU against the f64
//! reference and PyTorch fixtures, scale layouts that are not the kernel's are refused with
//! SCALE_LAYOUT_MISMATCH naming what differs, and a quantized pipeline (embedding -> rms norm
//! -> 4-bit linear -> attention -> sampling) runs through dispatch within the error bound the
//! capability file declares for the quantized kernel.

use std::collections::BTreeMap;

use layerzero::capabilities::spec::ErrorBound;
use layerzero::exec::args::{DequantizeArgs, OpArgs};
use layerzero::model::attrs::{Int4Attrs, QuantAttrs, QuantScheme};
use layerzero::model::w4::{ScaleOrder, W4Format};
use layerzero::tensor::{HostTensor, Storage, io};
use layerzero::{Attrs, DType, LayerZero, Op, Request, TensorDesc};
use layerzero_tests::{TestResult, codes, planner, repo_root};

const CPU: &str = "cpu.linear_int4.fast";
const REFERENCE: &str = "cpu_reference.linear_int4.naive";

/// The bound the shipped catalog declares for `kernel`'s outputs of `dtype`.
fn declared_bound(lz: &LayerZero, kernel: &str, dtype: DType) -> TestResult<ErrorBound> {
    let i = lz.catalog().find(kernel).ok_or_else(|| format!("{kernel} is not in the catalog"))?;
    let bounds = lz.catalog().kernel(i).1.properties.error_bound.as_ref();
    Ok(*bounds.and_then(|b| b.get(&dtype)).ok_or_else(|| format!("{kernel} declares no error_bound for {dtype}"))?)
}

/// Every element of `got` within `bound` of `want`; the worst ratio |d| / allowed is returned.
fn within(what: &str, bound: ErrorBound, want: &HostTensor, got: &HostTensor) -> TestResult<f64> {
    if want.shape() != got.shape() {
        return Err(format!("{what}: shape {:?}, expected {:?}", got.shape(), want.shape()).into());
    }
    let mut worst = 0f64;
    for (i, (r, o)) in want.to_f64_vec().into_iter().zip(got.to_f64_vec()).enumerate() {
        if !bound.holds(r, o) {
            return Err(format!("{what}: [{i}] is {o}, the reference {r}: outside {bound:?}").into());
        }
        if o != r {
            worst = worst.max((o - r).abs() / (bound.atol + bound.rtol * r.abs()));
        }
    }
    Ok(worst)
}

/// The linear_int4 fixtures of the 4-bit formats (tools/quant4.py through tools/gen_fixtures.py).
fn w4_fixtures() -> TestResult<Vec<(String, OpArgs, HostTensor)>> {
    op_fixtures("linear_int4", 3)
}

/// The fixtures named `{op}_{format}_*` of each 4-bit format, at least `least` per format.
fn op_fixtures(op: &str, least: usize) -> TestResult<Vec<(String, OpArgs, HostTensor)>> {
    let dir = repo_root().join("tests/fixtures");
    let mut out = Vec::new();
    for fmt in ["nf4", "mxfp4", "nvfp4"] {
        let mut names: Vec<_> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .filter(|n| n.starts_with(&format!("{op}_{fmt}_")))
            .collect();
        names.sort();
        assert!(names.len() >= least, "{fmt}: only {names:?}");
        for name in names {
            let bytes = std::fs::read(dir.join(&name))?;
            let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)?;
            let request = meta.metadata().as_ref().and_then(|m| m.get("request")).ok_or("no request")?;
            let request = Request::from_json(request)?;
            let mut inputs: BTreeMap<String, HostTensor> = io::parse(&bytes, &name)?;
            let expected = inputs.remove("expected").ok_or("no expected")?;
            out.push((name, OpArgs::from_request(&request, inputs)?, expected));
        }
    }
    Ok(out)
}

#[test]
fn section_6_5_fp4_and_nf4_weights_match_pytorch_and_each_backend_stays_within_its_declared_bound() -> TestResult {
    let lz = LayerZero::detected()?;
    let reg = lz.registry();
    let reference = reg.get(REFERENCE).ok_or("no reference")?;
    for (name, args, expected) in w4_fixtures()? {
        let oracle = reference.run(&args)?.remove("out").ok_or("no out")?;
        let dtype = expected.dtype();
        // The reference computes what PyTorch computed in float64: one rounding apart at most.
        let one_rounding = ErrorBound { rtol: dtype_eps(dtype), atol: 0.0 };
        within(&format!("{name}: cpu_reference vs PyTorch"), one_rounding, &expected, &oracle)?;
        // Each backend's kernel within the bound its capability file declares (the
        // reference's own is 0: it is the oracle, bit for bit on every call).
        for kernel in [CPU, REFERENCE] {
            let got = reg.get(kernel).ok_or("no executor")?.run(&args)?.remove("out").ok_or("no out")?;
            let worst = within(&format!("{name}: {kernel}"), declared_bound(&lz, kernel, dtype)?, &oracle, &got)?;
            eprintln!("{name}: {kernel} uses {:.1}% of its declared bound", worst * 100.0);
        }
        // And dispatch picks a kernel that decodes the format, within its bound.
        let d = lz.dispatch(&args)?;
        let picked = d.selection().kernel.clone();
        within(&format!("{name}: dispatched"), declared_bound(&lz, &picked, dtype)?, &oracle, &d.outputs["out"])?;
    }
    Ok(())
}

/// Half an ulp of `dtype` relative: the most one rounding of an exact value moves it.
fn dtype_eps(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    }
}

#[test]
fn section_22_each_formats_nibble_order_is_pinned_by_its_identity_fixture() -> TestResult {
    // x = I makes `expected` the dequantized weight: swapping the two nibbles of every byte
    // must break the match, so the order each format states (nf4 high first, FP4 low first)
    // is the one PyTorch built, not a symmetric accident.
    let reg = layerzero::builtin_registry();
    let reference = reg.get(REFERENCE).ok_or("no reference")?;
    let mut seen = 0;
    for (name, args, expected) in w4_fixtures()?.into_iter().filter(|f| f.0.contains("identity")) {
        let OpArgs::LinearInt4(a) = &args else { return Err(format!("{name} is not linear_int4").into()) };
        let got = reference.run(&args)?.remove("out").ok_or("no out")?;
        assert_eq!(got.to_f64_vec(), expected.to_f64_vec(), "{name}: the dequantized weight");
        let Storage::I8(bytes) = a.weight.storage() else { return Err("weight is not i8".into()) };
        let swapped: Vec<i8> = bytes.iter().map(|&b| (b as u8).rotate_left(4) as i8).collect();
        let mut flipped = a.clone();
        flipped.weight = HostTensor::new(Storage::I8(swapped.into()), a.weight.shape())?;
        let wrong = reference.run(&OpArgs::LinearInt4(flipped))?.remove("out").ok_or("no out")?;
        assert_ne!(wrong.to_f64_vec(), expected.to_f64_vec(), "{name}: nibble order does not matter?");
        seen += 1;
    }
    assert_eq!(seen, 3, "one identity fixture per format");
    Ok(())
}

/// A 4-bit linear request: bf16 x `[4, 256]`, 32 output rows, scales `scale` of `shape`.
fn w4_request(attrs: Int4Attrs, scale: DType, shape: &[u64]) -> Request {
    Request::new(Op::LinearInt4)
        .attrs(Attrs::Int4(attrs))
        .tensor("x", TensorDesc::new(DType::BF16, [4, 256]))
        .tensor("weight", TensorDesc::new(DType::I8, [32, 128]))
        .tensor("scales", TensorDesc::new(scale, shape.to_vec()))
}

#[test]
fn section_6_5_scale_layout_mismatches_are_refused_naming_what_differs() -> TestResult {
    let sel = planner("spr")?;
    let swizzled = Int4Attrs { scale_order: ScaleOrder::Swizzled32x4x4, ..Int4Attrs::of(W4Format::Nvfp4, 16) };
    let f32_global = TensorDesc::new(DType::F32, [1]);
    let cases: Vec<(&str, Request, &str)> = vec![
        ("swizzled scale order", w4_request(swizzled, DType::Fp8E4M3, &[32, 16]), "swizzled_32_4_4"),
        ("nvfp4 block size", w4_request(Int4Attrs::of(W4Format::Nvfp4, 32), DType::Fp8E4M3, &[32, 8]), "blocks of 16"),
        ("mxfp4 block size", w4_request(Int4Attrs::of(W4Format::Mxfp4, 64), DType::I8, &[32, 4]), "blocks of 32"),
        ("mxfp4 scale dtype", w4_request(Int4Attrs::of(W4Format::Mxfp4, 32), DType::F32, &[32, 8]), "E8M0"),
        ("nvfp4 scale dtype", w4_request(Int4Attrs::of(W4Format::Nvfp4, 16), DType::BF16, &[32, 16]), "fp8_e4m3"),
        ("nf4 scale dtype", w4_request(Int4Attrs::of(W4Format::Nf4, 64), DType::F16, &[32, 4]), "absmax"),
        ("per-channel scales", w4_request(Int4Attrs::of(W4Format::Nf4, 64), DType::F32, &[32]), "per-channel"),
        ("per-channel [N, 1]", w4_request(Int4Attrs::of(W4Format::Nf4, 64), DType::F32, &[32, 1]), "per-channel"),
        (
            "a global scale on mxfp4",
            w4_request(Int4Attrs::of(W4Format::Mxfp4, 32), DType::I8, &[32, 8]).tensor("global_scale", f32_global),
            "global_scale",
        ),
    ];
    for (what, req, names) in cases {
        let report = sel.explain(&req);
        assert!(report.request_errors.is_empty(), "{what}: {:?}", report.request_errors);
        assert_eq!(report.selected, None, "{what}: selected");
        for kernel in [CPU, REFERENCE] {
            assert_eq!(codes(&report, kernel)?, ["SCALE_LAYOUT_MISMATCH"], "{what}: {kernel}");
            let c = report.candidate(kernel).ok_or("no candidate")?;
            let said: Vec<String> = c.reasons.iter().map(|r| r.to_string()).collect();
            assert!(said.iter().any(|m| m.contains(names)), "{what}: {kernel} says {said:?}, not `{names}`");
        }
    }
    // The formats as they are defined are taken by both kernels.
    for (attrs, scale, shape) in [
        (Int4Attrs::of(W4Format::Nf4, 64), DType::F32, [32u64, 4]),
        (Int4Attrs::of(W4Format::Mxfp4, 32), DType::I8, [32, 8]),
        (Int4Attrs::of(W4Format::Nvfp4, 16), DType::Fp8E4M3, [32, 16]),
    ] {
        let report = sel.explain(&w4_request(attrs.clone(), scale, &shape));
        for kernel in [CPU, REFERENCE] {
            assert!(codes(&report, kernel)?.is_empty(), "{attrs:?}: {kernel} rejects {:?}", codes(&report, kernel));
        }
    }
    Ok(())
}

const DEQ_CPU: &str = "cpu.dequantize.fast";
const DEQ_REFERENCE: &str = "cpu_reference.dequantize.naive";

/// What the cpu dequantize may differ by from the exact value rounded once to `dtype`: its
/// f32 products (code * (scale * global), two roundings) then its one rounding to `dtype`,
/// which may land on the neighbouring value (one ulp); f16's subnormal step absolutely.
fn f32_then(dtype: DType) -> ErrorBound {
    let atol = if dtype == DType::F16 { 2f64.powi(-24) } else { 0.0 };
    ErrorBound { rtol: 2.0 * dtype_eps(dtype) + 2f64.powi(-22), atol }
}

#[test]
fn section_6_5_each_4_bit_format_dequantizes_as_pytorch_does_on_both_backends() -> TestResult {
    let lz = LayerZero::detected()?;
    let reg = lz.registry();
    let fixtures = op_fixtures("dequantize", 1)?;
    assert_eq!(fixtures.len(), 3, "one dequantize fixture per format");
    for (name, args, expected) in fixtures {
        let dtype = expected.dtype();
        // The reference computes what PyTorch computed in float64: one rounding apart at most.
        let oracle = reg.get(DEQ_REFERENCE).ok_or("no reference")?.run(&args)?.remove("out").ok_or("no out")?;
        within(
            &format!("{name}: cpu_reference vs PyTorch"),
            ErrorBound { rtol: dtype_eps(dtype), atol: 0.0 },
            &expected,
            &oracle,
        )?;
        let got = reg.get(DEQ_CPU).ok_or("no cpu kernel")?.run(&args)?.remove("out").ok_or("no out")?;
        let worst = within(&format!("{name}: {DEQ_CPU} vs PyTorch"), f32_then(dtype), &expected, &got)?;
        eprintln!("{name}: {DEQ_CPU} uses {:.1}% of its bound", worst * 100.0);
        // Dispatch takes the request too, and answers within the same bound.
        let d = lz.dispatch(&args)?;
        within(&format!("{name}: dispatched"), f32_then(dtype), &expected, &d.outputs["out"])?;
        // The nibble order is the format's: swapped nibbles no longer match PyTorch.
        let OpArgs::Dequantize(a) = &args else { return Err(format!("{name} is not dequantize").into()) };
        let Storage::I8(bytes) = a.x.storage() else { return Err("x is not i8".into()) };
        let mut flipped = a.clone();
        let swapped: Vec<i8> = bytes.iter().map(|&b| (b as u8).rotate_left(4) as i8).collect();
        flipped.x = HostTensor::new(Storage::I8(swapped.into()), a.x.shape())?;
        for kernel in [DEQ_CPU, DEQ_REFERENCE] {
            let args = OpArgs::Dequantize(flipped.clone());
            let wrong = reg.get(kernel).ok_or("no kernel")?.run(&args)?.remove("out").ok_or("no out")?;
            assert_ne!(wrong.to_f64_vec(), expected.to_f64_vec(), "{name}: {kernel} ignores the nibble order");
        }
    }
    Ok(())
}

/// A 4-bit dequantize request: x `[32, 128]` packed bytes (K = 256), blocks `[1, group]`,
/// scales `scale` of `shape`.
pub(crate) fn deq_request(format: W4Format, group: u64, scale: DType, shape: &[u64]) -> Request {
    let attrs = QuantAttrs {
        scheme: QuantScheme::PerBlock,
        block: Some([1, group]),
        scale_layout: None,
        target: None,
        out_dtype: None,
        format: Some(format),
        scale_order: ScaleOrder::Linear,
    };
    Request::new(Op::Dequantize)
        .attrs(Attrs::Quant(attrs))
        .tensor("x", TensorDesc::new(DType::I8, [32, 128]))
        .tensor("scale", TensorDesc::new(scale, shape.to_vec()))
}

fn with_order(mut req: Request, order: ScaleOrder) -> Request {
    if let Attrs::Quant(a) = &mut req.attrs {
        a.scale_order = order;
    }
    req
}

#[test]
fn section_22_a_4_bit_dequantize_with_scales_not_its_formats_is_refused_naming_what_differs() -> TestResult {
    let sel = planner("spr")?;
    let global = TensorDesc::new(DType::F32, [1]);
    let cases: Vec<(&str, Request, &str)> = vec![
        (
            "swizzled scale order",
            with_order(deq_request(W4Format::Nvfp4, 16, DType::Fp8E4M3, &[32, 16]), ScaleOrder::Swizzled32x4x4),
            "swizzled_32_4_4",
        ),
        ("nvfp4 block size", deq_request(W4Format::Nvfp4, 32, DType::Fp8E4M3, &[32, 8]), "blocks of 16"),
        ("mxfp4 block size", deq_request(W4Format::Mxfp4, 64, DType::I8, &[32, 4]), "blocks of 32"),
        ("mxfp4 scale dtype", deq_request(W4Format::Mxfp4, 32, DType::F32, &[32, 8]), "E8M0"),
        ("nvfp4 scale dtype", deq_request(W4Format::Nvfp4, 16, DType::BF16, &[32, 16]), "fp8_e4m3"),
        ("nf4 scale dtype", deq_request(W4Format::Nf4, 64, DType::F16, &[32, 4]), "absmax"),
        ("per-channel scales", deq_request(W4Format::Nf4, 64, DType::F32, &[32]), "per-channel"),
        ("per-channel [N, 1]", deq_request(W4Format::Nf4, 64, DType::F32, &[32, 1]), "per-channel"),
        (
            "a global scale on mxfp4",
            deq_request(W4Format::Mxfp4, 32, DType::I8, &[32, 8]).tensor("global_scale", global),
            "global_scale",
        ),
    ];
    for (what, req, names) in cases {
        let report = sel.explain(&req);
        assert!(report.request_errors.is_empty(), "{what}: {:?}", report.request_errors);
        assert_eq!(report.selected, None, "{what}: selected");
        for kernel in [DEQ_CPU, DEQ_REFERENCE] {
            assert_eq!(codes(&report, kernel)?, ["SCALE_LAYOUT_MISMATCH"], "{what}: {kernel}");
            let c = report.candidate(kernel).ok_or("no candidate")?;
            let said: Vec<String> = c.reasons.iter().map(|r| r.to_string()).collect();
            assert!(said.iter().any(|m| m.contains(names)), "{what}: {kernel} says {said:?}, not `{names}`");
        }
    }
    // A block the cpu kernel does not declare is refused by it alone; the reference takes any.
    let report = sel.explain(&deq_request(W4Format::Nf4, 8, DType::F32, &[32, 32]));
    assert_eq!(codes(&report, DEQ_CPU)?, ["ATTR_UNSUPPORTED"]);
    assert!(codes(&report, DEQ_REFERENCE)?.is_empty());
    // A 4-bit format is per_block with a block along K; anything else is an invalid request.
    let mut per_channel = deq_request(W4Format::Nf4, 64, DType::F32, &[32, 4]);
    if let Attrs::Quant(a) = &mut per_channel.attrs {
        a.scheme = QuantScheme::PerChannel;
    }
    assert!(sel.explain(&per_channel).request_errors.iter().any(|e| e.to_string().contains("per_block")));
    // The formats as defined (and int4) are taken by both kernels, the cpu one selected.
    for (format, group, scale, groups) in [
        (W4Format::Nf4, 64, DType::F32, 4u64),
        (W4Format::Mxfp4, 32, DType::I8, 8),
        (W4Format::Nvfp4, 16, DType::Fp8E4M3, 16),
        (W4Format::Int4, 128, DType::BF16, 2),
    ] {
        let report = sel.explain(&deq_request(format, group, scale, &[32, groups]));
        for kernel in [DEQ_CPU, DEQ_REFERENCE] {
            assert!(codes(&report, kernel)?.is_empty(), "{format:?}: {kernel} rejects {:?}", codes(&report, kernel));
        }
        assert_eq!(report.selected.as_deref(), Some(DEQ_CPU), "{format:?}");
    }
    // Called directly, both kernels refuse per-channel scales with the same code, no panic.
    let x = HostTensor::new(Storage::I8(vec![0x21; 4 * 64].into()), &[4, 64])?;
    let attrs = match deq_request(W4Format::Nf4, 64, DType::F32, &[4, 1]).attrs {
        Attrs::Quant(a) => a,
        _ => return Err("not quant attrs".into()),
    };
    let args = OpArgs::Dequantize(DequantizeArgs {
        x,
        scale: HostTensor::from_f32(&[4], vec![1.0; 4])?,
        global_scale: None,
        attrs,
    });
    for kernel in [DEQ_CPU, DEQ_REFERENCE] {
        let err = lz_registry_run(kernel, &args);
        assert!(err.contains("SCALE_LAYOUT_MISMATCH") && err.contains("per-channel"), "{kernel}: {err}");
    }
    Ok(())
}

/// The error text of running `kernel` on `args` (empty when it succeeds).
fn lz_registry_run(kernel: &str, args: &OpArgs) -> String {
    let reg = layerzero::builtin_registry();
    match reg.get(kernel).map(|k| k.run(args)) {
        Some(Err(e)) => e.to_string(),
        Some(Ok(_)) => String::new(),
        None => format!("{kernel} is not registered"),
    }
}
