//! Scale layouts as part of a quantized kernel's contract (issue 33, seed 004's
//! `shuffle_scale`): a fallback wrote row-major block scales where the GEMM read column-major
//! ones, and every number after it was wrong. Here the stored order of each scale tensor is
//! judged against the `scale_layouts` the kernel declares, and a mismatch is refused at
//! selection naming both layouts.

use std::sync::Arc;

use layerzero::exec::args::{OpArgs, W8a8Args, strided_copy};
use layerzero::hardware::named;
use layerzero::model::attrs::W8a8Attrs;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::policy::Policy;
use layerzero::select::{Selector, Verdict};
use layerzero::tensor::HostTensor;
use layerzero::{LayerZero, ReasonCode};
use layerzero_tests::TestResult;
use layerzero_tests::catalog::{Backend, Kernel};
use serde_json::json;

/// A block-scaled int8 linear of 64 x 128 by 32 x 128 in blocks of 32, the scales' strides
/// as given (`None`: row-major).
fn w8a8(x_strides: Option<[u64; 2]>, w_strides: Option<[u64; 2]>) -> TestResult<Request> {
    let mut x_scale = json!({"dtype": "f32", "shape": [64, 4]});
    let mut w_scale = json!({"dtype": "f32", "shape": [32, 4]});
    if let Some(s) = x_strides {
        x_scale["strides"] = json!(s);
    }
    if let Some(s) = w_strides {
        w_scale["strides"] = json!(s);
    }
    let req = json!({"op": "linear_w8a8", "tensors": {
        "x": {"dtype": "i8", "shape": [64, 128]}, "x_scale": x_scale,
        "weight": {"dtype": "i8", "shape": [32, 128]}, "w_scale": w_scale},
        "attrs": {"group_size": 32}});
    Ok(Request::from_json(&req.to_string())?)
}

/// Two kernels that differ only in the scale order they read.
fn selector() -> TestResult<Selector> {
    let kernel = |id: &str, layouts: &[&str]| {
        let mut c = json!({"dtypes": ["i8"], "strides": "any", "group_sizes": [32]});
        if !layouts.is_empty() {
            c["scale_layouts"] = json!(layouts);
        }
        Kernel::new(id, Op::LinearW8a8).constraints(c)
    };
    let catalog = Backend::new("probe", "cpu")
        .kernel(kernel("probe.linear_w8a8.column_major", &["column_major"]))
        .kernel(kernel("probe.linear_w8a8.row_major", &[]))
        .catalog()?;
    Ok(Selector::planning(catalog, Arc::new(named::load("spr")?), Arc::new(Policy::default()))?)
}

/// The reasons `kernel` was refused for `req`, as one text.
fn refusal(sel: &Selector, req: &Request, kernel: &str) -> TestResult<Option<String>> {
    let report = sel.explain(req);
    let c = report.candidate(kernel).ok_or_else(|| format!("{kernel} is a candidate"))?;
    if c.verdict != Verdict::Rejected {
        return Ok(None);
    }
    assert!(c.reasons.iter().all(|r| r.code() == ReasonCode::SCALE_LAYOUT_MISMATCH), "{:?}", c.reasons);
    Ok(Some(c.reasons.iter().map(|r| r.message().to_owned()).collect::<Vec<_>>().join("; ")))
}

#[test]
fn row_major_scales_where_column_major_are_read_are_refused_naming_both_layouts() -> TestResult {
    let sel = selector()?;
    // The seed's bug: the producer wrote row-major scales; the GEMM reads column-major.
    let planted = w8a8(None, None)?;
    let why = refusal(&sel, &planted, "probe.linear_w8a8.column_major")?.ok_or("must be refused")?;
    assert!(why.contains("tensor `x_scale` [64, 4] is stored row_major"), "{why}");
    assert!(why.contains("the kernel reads column_major scales"), "{why}");
    assert_eq!(refusal(&sel, &planted, "probe.linear_w8a8.row_major")?, None, "the row-major reader takes them");
    assert_eq!(sel.select(&planted)?.kernel, "probe.linear_w8a8.row_major");
    // Column-major scales: the other way round.
    let column = w8a8(Some([1, 64]), Some([1, 32]))?;
    assert_eq!(refusal(&sel, &column, "probe.linear_w8a8.column_major")?, None);
    let why = refusal(&sel, &column, "probe.linear_w8a8.row_major")?.ok_or("must be refused")?;
    assert!(why.contains("is stored column_major (strides [1, 64])") && why.contains("reads row_major"), "{why}");
    // Strides that are neither are named as such.
    let odd = w8a8(Some([8, 2]), None)?;
    let why = refusal(&sel, &odd, "probe.linear_w8a8.column_major")?.ok_or("must be refused")?;
    assert!(why.contains("neither row- nor column-major"), "{why}");
    Ok(())
}

#[test]
fn the_cpu_kernel_reads_column_major_block_scales_as_it_declares() -> TestResult {
    let lz = LayerZero::detected()?;
    let (m, k, n, g) = (8usize, 64usize, 16usize, 32usize);
    let ints = |len: usize, seed: usize| -> Vec<f32> { (0..len).map(|i| ((i * 7 + seed) % 15) as f32 - 7.0).collect() };
    let scales =
        |len: usize, seed: usize| -> Vec<f32> { (0..len).map(|i| 0.01 + ((i + seed) % 5) as f32 * 0.003).collect() };
    let x = HostTensor::from_f32_as(layerzero::DType::I8, &[m, k], &ints(m * k, 1))?;
    let weight = HostTensor::from_f32_as(layerzero::DType::I8, &[n, k], &ints(n * k, 4))?;
    let x_scale = HostTensor::from_f32(&[m, k / g], scales(m * k / g, 0))?;
    let w_scale = HostTensor::from_f32(&[n, k / g], scales(n * k / g, 2))?;
    let attrs = W8a8Attrs { group_size: Some(g as u64), ..Default::default() };
    let rows = OpArgs::LinearW8a8(W8a8Args {
        x: x.clone(),
        x_scale: x_scale.clone(),
        weight: weight.clone(),
        w_scale: w_scale.clone(),
        bias: None,
        attrs: attrs.clone(),
    });
    let columns = OpArgs::LinearW8a8(W8a8Args {
        x,
        x_scale: strided_copy(&x_scale, &[1, m])?,
        weight,
        w_scale: strided_copy(&w_scale, &[1, n])?,
        bias: None,
        attrs,
    });
    let (a, b) = (lz.dispatch(&rows)?, lz.dispatch(&columns)?);
    assert_eq!(b.selection().kernel, "cpu.linear_w8a8.fast");
    assert_eq!(a.outputs["out"].to_f64_vec(), b.outputs["out"].to_f64_vec(), "the same values in either order");
    Ok(())
}
