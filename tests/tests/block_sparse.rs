//! E2E spec §6.9, block-sparse masks: a bool block layout (`attrs.mask_block` = [rows,
//! cols]) is refused with BLOCK_SPARSE_MASK_UNSUPPORTED by every kernel that reads none,
//! served by one that takes a dense bool mask through the planned expansion (its cost in the
//! report's transform total), and its output equals the float64 oracle's on the same mask
//! expanded densely by this test.

use layerzero::compare::Category;
use layerzero::exec::args::{AttentionArgs, OpArgs};
use layerzero::model::attrs::{AttentionAttrs, Attrs};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::model::tensor::TensorDesc;
use layerzero::schema::{SchemaKind, violations};
use layerzero::select::{SelectionReport, Verdict};
use layerzero::tensor::{HostTensor, Storage};
use layerzero::transform::TransformKind;
use layerzero::{LayerZero, ReasonCode};
use layerzero_tests::gqa::{self, values};
use layerzero_tests::{TestResult, attention, close, planner};

/// 80 queries over 96 keys in blocks of 16 x 32: 5 x 3 blocks, the last key block full,
/// 4 query heads over 2 KV heads, head dim 32.
const SQ: usize = 80;
const SK: usize = 96;
const BLOCK: [usize; 2] = [16, 32];
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 32;
const BLOCKS: [usize; 2] = [SQ.div_ceil(BLOCK[0]), SK.div_ceil(BLOCK[1])];

fn attrs(causal: bool, block: Option<[usize; 2]>) -> AttentionAttrs {
    let mask_block = block.map(|[r, c]| [r as u64, c as u64]);
    AttentionAttrs { causal, mask_block, ..AttentionAttrs::default() }
}

/// A per-head layout that drops some blocks, and every block of query block 2 for head 1
/// (rows that see no key are zeros, as for a dense mask).
fn layout() -> Vec<bool> {
    let mut keep: Vec<bool> = values(96, HQ * BLOCKS[0] * BLOCKS[1], 1.0).iter().map(|&x| x > -0.4).collect();
    for c in 0..BLOCKS[1] {
        keep[(BLOCKS[0] + 2) * BLOCKS[1] + c] = false;
    }
    keep
}

/// The dense [1, HQ, SQ, SK] mask the layout means, expanded here (not by the runtime).
fn dense(keep: &[bool]) -> Vec<bool> {
    let mut out = Vec::with_capacity(HQ * SQ * SK);
    for h in 0..HQ {
        for i in 0..SQ {
            out.extend((0..SK).map(|j| keep[(h * BLOCKS[0] + i / BLOCK[0]) * BLOCKS[1] + j / BLOCK[1]]));
        }
    }
    out
}

fn args(dtype: DType, mask: HostTensor, attrs: AttentionAttrs) -> TestResult<OpArgs> {
    let t = |seed: u64, s: usize, h: usize, amp: f32| -> TestResult<HostTensor> {
        Ok(HostTensor::from_f32_as(dtype, &[1, s, h, D], &values(seed, s * h * D, amp))?.with_layout(Layout::Bshd))
    };
    Ok(OpArgs::Attention(AttentionArgs {
        q: t(1, SQ, HQ, 2.0)?,
        k: t(2, SK, HKV, 1.0)?,
        v: t(3, SK, HKV, 1.0)?,
        mask: Some(mask),
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        attrs,
    }))
}

fn bools(shape: &[usize], v: Vec<bool>) -> TestResult<HostTensor> {
    Ok(HostTensor::new(Storage::Bool(v), shape)?)
}

#[test]
fn section_6_9_a_block_sparse_mask_output_equals_the_dense_reference_in_f32_and_bf16() -> TestResult {
    let (lz, oracle) = (LayerZero::detected()?, gqa::oracle()?);
    let keep = layout();
    for dtype in [DType::F32, DType::BF16] {
        for causal in [false, true] {
            let sparse = args(dtype, bools(&[1, HQ, BLOCKS[0], BLOCKS[1]], keep.clone())?, attrs(causal, Some(BLOCK)))?;
            let d = lz.dispatch(&sparse)?;
            gqa::served_first_try(&d)?;
            let expanded = d.selection().transforms.iter().any(|t| t.kind == TransformKind::ExpandBlockMask);
            assert!(
                expanded,
                "{} served without expanding the layout: {:?}",
                d.selection().kernel,
                d.selection().transforms
            );
            let full = args(dtype, bools(&[1, HQ, SQ, SK], dense(&keep))?, attrs(causal, None))?;
            let want = oracle.dispatch(&full)?.outputs["out"].to_f64_vec();
            let what = format!("{} on a block-sparse mask, {dtype}, causal {causal}", d.selection().kernel);
            close::values(&what, Category::Attention, dtype, &want, &d.outputs["out"].to_f64_vec())?;
        }
    }
    Ok(())
}

/// Every attention kernel either reads the layout expanded (eligible or selected with the
/// expansion planned) or is refused with BLOCK_SPARSE_MASK_UNSUPPORTED; the selected one's
/// transforms are the report's transform cost.
fn refused_or_expanded(report: &SelectionReport, what: &str) -> TestResult<String> {
    let selected = report.selected.clone().ok_or_else(|| format!("{what}: nothing selected"))?;
    for c in &report.candidates {
        let expands = c.transforms.iter().any(|t| t.kind == TransformKind::ExpandBlockMask);
        let refused = c.reasons.iter().any(|r| r.code() == ReasonCode::BLOCK_SPARSE_MASK_UNSUPPORTED);
        if (c.verdict == Verdict::Rejected) != refused || (c.verdict != Verdict::Rejected) != expands {
            let codes: Vec<_> = c.reasons.iter().map(|r| r.code().as_str()).collect();
            return Err(format!(
                "{what}: {} is {} with {codes:?}, transforms {:?}",
                c.kernel,
                c.verdict.as_str(),
                c.transforms
            )
            .into());
        }
    }
    let chosen = report.candidate(&selected).ok_or("the selected kernel is not a candidate")?;
    let cost: f64 = chosen.transforms.iter().map(|t| t.ns).sum();
    assert!(
        cost > 0.0 && (report.transform_cost_total - cost).abs() <= 1e-9 * cost,
        "{what}: cost {cost} vs {}",
        report.transform_cost_total
    );
    Ok(selected)
}

#[test]
fn section_6_9_a_block_sparse_mask_is_refused_by_kernels_that_read_no_layout_and_served_through_its_expansion()
-> TestResult {
    let request = |dtype: DType, causal: bool| {
        let mask = TensorDesc::new(DType::Bool, [1, HQ as u64, BLOCKS[0] as u64, BLOCKS[1] as u64]);
        attention(dtype, 1, SQ as u64, SK as u64, HQ as u64, HKV as u64, D as u64)
            .tensor("mask", mask)
            .attrs(Attrs::Attention(attrs(causal, Some(BLOCK))))
    };
    let lz = LayerZero::detected()?;
    let report = lz.explain(&request(DType::F32, true));
    let host = refused_or_expanded(&report, "this host")?;
    assert!(host.starts_with("cpu.") || host.starts_with("onednn."), "this host served it with {host}");
    // The request (with attrs.mask_block) and the report (with the expansion) are in their schemas.
    let (req, json) = (serde_json::to_value(&report.request)?, report.to_json());
    assert_eq!(violations(SchemaKind::Request, &req)?, Vec::<String>::new(), "{req}");
    assert_eq!(violations(SchemaKind::SelectionReport, &json)?, Vec::<String>::new());
    for hw in ["h100", "a100", "mi300x"] {
        let report = planner(hw)?.explain(&request(DType::F16, false));
        let chosen = refused_or_expanded(&report, hw)?;
        assert!(!chosen.starts_with("cpu"), "{hw} served it with {chosen}");
        // FlashAttention reads no mask at all: refused for the layout, not served through it.
        let fa = report.candidate("flash_attn_2.attention.fwd").ok_or("no flash_attn_2 candidate")?;
        assert_eq!(fa.verdict, Verdict::Rejected, "{hw}");
    }
    Ok(())
}

#[test]
fn section_6_9_a_block_layout_that_does_not_fit_its_blocks_is_a_request_error_naming_the_field() -> TestResult {
    let lz = LayerZero::detected()?;
    let base = attention(DType::F32, 1, SQ as u64, SK as u64, HQ as u64, HKV as u64, D as u64);
    for (mask, block, field) in [
        (TensorDesc::new(DType::Bool, [1, 1, 4, 3]), [16, 32], "mask"),
        (TensorDesc::new(DType::F32, [1, 1, 5, 3]), [16, 32], "mask"),
        (TensorDesc::new(DType::Bool, [1, 1, 5, 3]), [0, 32], "attrs.mask_block"),
    ] {
        let req = base
            .clone()
            .tensor("mask", mask.clone())
            .attrs(Attrs::Attention(AttentionAttrs { mask_block: Some(block), ..AttentionAttrs::default() }));
        let report = lz.explain(&req);
        let named = report.request_errors.iter().any(|r| r.message().contains(field));
        assert!(named, "{mask:?} in blocks of {block:?}: errors {:?}", report.request_errors);
        assert_eq!(report.selected, None);
    }
    // No layout at all.
    let req = base.attrs(Attrs::Attention(AttentionAttrs { mask_block: Some([16, 32]), ..AttentionAttrs::default() }));
    assert!(lz.explain(&req).request_errors.iter().any(|r| r.message().contains("mask_block")));
    Ok(())
}
