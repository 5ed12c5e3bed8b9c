//! Capability facts, each held to the source line that justifies it: per backend, a request
//! the shipped kernel accepts and one it rejects with the declared reason, through the shipped
//! catalog in planning mode. An upstream row's source reads `owner/repo@commit:path:line`; a
//! row of our own kernels names a line of this repository by text that must occur on exactly
//! one line. Every constraint a shipped capability file declares needs a row: a fact cannot
//! land without its source.

mod cpu;
mod flash_attn;
mod flashinfer;
mod onednn;
mod others;
pub(super) mod reference;
mod rocm;
mod torch_sdpa;

use std::sync::Arc;

use layerzero::hardware::named;
use layerzero::hardware::profile::HardwareProfile;
use layerzero::model::attrs::{
    AttentionAttrs, Attrs, CausalAlignment, NormAttrs, RopeAttrs, RopeScaling, RopeStyle, SwigluAttrs,
};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::model::tensor::TensorDesc;
use layerzero::model::w4::W4Format;
use layerzero::select::Selector;
use layerzero_tests::{TestResult, attention, catalog, codes, paged, with_attrs};

/// One fact: `kernel`'s `field` accepts `accepted` on `hardware.0` and rejects `rejected.0` on
/// `hardware.1` with the code `rejected.1`, because of `source`. A feature the kernel takes
/// (`dropout: true`) has no request of its own to reject: `rejected` is `None`.
struct Fact {
    kernel: &'static str,
    field: &'static str,
    source: Source,
    hardware: (&'static str, &'static str),
    accepted: Request,
    rejected: Option<(Request, &'static str)>,
}

/// Where a fact comes from.
enum Source {
    /// An upstream library's line: `owner/repo@<40 hex>:path:line`.
    Upstream(&'static str),
    /// A line of this repository (our own kernels): the one line of `path` that contains
    /// `needle`, checked to exist so that the citation cannot rot.
    Here { path: &'static str, needle: &'static str },
}

/// A fact of `kernel`'s `field` from `source`, accepted on `hardware` as `accepted`; add what
/// it rejects with [`Fact::rejects`] or [`Fact::rejects_on`].
fn fact(kernel: &'static str, field: &'static str, source: Source, hardware: &'static str, accepted: Request) -> Fact {
    Fact { kernel, field, source, hardware: (hardware, hardware), accepted, rejected: None }
}

impl Fact {
    /// Rejects `req` on the accepting hardware with `code`.
    fn rejects(mut self, req: Request, code: &'static str) -> Fact {
        self.rejected = Some((req, code));
        self
    }

    /// Rejects `req` on `hardware` with `code` (a fact about the hardware itself).
    fn rejects_on(mut self, hardware: &'static str, req: Request, code: &'static str) -> Fact {
        self.hardware.1 = hardware;
        self.rejected = Some((req, code));
        self
    }
}

/// The line of this repository's `path` that contains `needle`.
fn here(path: &'static str, needle: &'static str) -> Source {
    Source::Here { path, needle }
}

const FLASH_ATTN: &str = "Dao-AILab/flash-attention@0251105a2fb19d2957484b7f023cd8c115286ced";
const FLASHINFER: &str = "flashinfer-ai/flashinfer@fb28d7242b3506a2348265962041acc1fb56cca4";
const AOTRITON: &str = "ROCm/aotriton@6e00ef3e335b45dfb49065259533b59c68995bfe";
const XFORMERS: &str = "facebookresearch/xformers@bed3978b5efc34b92a84e6116b01f598d83b8af1";
const LIGER: &str = "linkedin/Liger-Kernel@ead96b618e5c67bddc6a6e9bcb99bfe6b5ab661c";
const ZENDNN: &str = "amd/ZenDNN@7b8c02fb3c2bbff7ce7a1e9d5f936c05d9459f5b";
const ZENTORCH: &str = "amd/ZenDNN-pytorch-plugin@69c48fafd4124b6b01462748c0995f155ad26e4c";

/// A `[64, 4096] x [4096, 4096]` linear request in `dtype`.
fn linear_of(dtype: DType) -> Request {
    Request::new(Op::Linear)
        .tensor("x", TensorDesc::new(dtype, [64, 4096]))
        .tensor("weight", TensorDesc::new(dtype, [4096, 4096]).with_layout(Layout::Nt))
}

/// A bf16 row-wise request of `op` over `[64, hidden]` (`x` and a `[hidden]` weight for the
/// norms; `x` alone for SwiGLU's split form, whose `hidden` holds both halves).
fn rows_of(op: Op, attrs: Attrs, hidden: u64) -> Request {
    let req = Request::new(op).attrs(attrs).tensor("x", TensorDesc::new(DType::BF16, [64, hidden]));
    match op {
        Op::RmsNorm => req.tensor("weight", TensorDesc::new(DType::BF16, [hidden])),
        _ => req,
    }
}

/// A bf16 RoPE request on `[1, 16, 8, 128]` queries in `style`.
fn rope_of(style: RopeStyle) -> Request {
    Request::new(Op::Rope)
        .attrs(Attrs::Rope(RopeAttrs { style, ..RopeAttrs::default() }))
        .tensor("q", TensorDesc::new(DType::BF16, [1, 16, 8, 128]).with_layout(Layout::Bshd))
}

/// A 4-bit `dequantize` of `format`: `[32, 128]` packed bytes (K = 256), blocks `[1, group]`,
/// `[32, 256 / group]` scales of `scale`'s dtype (nvfp4 with its global scale).
fn w4_dequantize(format: W4Format, group: u64, scale: DType) -> Request {
    let req = crate::quant4::deq_request(format, group, scale, &[32, 256 / group]);
    match format {
        W4Format::Nvfp4 => req.tensor("global_scale", TensorDesc::new(DType::F32, [1])),
        _ => req,
    }
}

/// An MI300X with another gfx target (`gfx908`: an MI100, which no ROCm kernel here is built
/// for), as a hardware name the facts' planner understands.
const MI100ISH: &str = "mi300x@gfx908";

/// A planning selector for a named profile, or `name@gfx` for that profile with its GPU's
/// gfx target replaced, under a policy without implicit adaptations: a fact is what the kernel
/// takes as given, not after a copy.
fn plan(hw: &str) -> TestResult<Selector> {
    let (name, gfx) = hw.split_once('@').map_or((hw, None), |(n, g)| (n, Some(g)));
    let mut p = named::load(name)?;
    let policy = layerzero_tests::policy(r#"{"schema_version": 1, "allow_adaptation": false}"#)?;
    let Some(gfx) = gfx else {
        return Ok(Selector::planning(catalog()?, Arc::new(p), Arc::new(policy))?);
    };
    p.devices[0].gfx = Some(gfx.to_owned());
    let p = HardwareProfile::new(format!("{name} as {gfx}"), p.description.clone(), p.devices);
    Ok(Selector::planning(catalog()?, Arc::new(p), Arc::new(policy))?)
}

fn bf16(b: u64, sq: u64, sk: u64, hq: u64, hkv: u64, d: u64) -> Request {
    attention(DType::BF16, b, sq, sk, hq, hkv, d)
}

fn attrs(req: Request, a: AttentionAttrs) -> Request {
    with_attrs(req, a)
}

/// `req` causal, aligned top-left (PyTorch's `is_causal`).
fn top_left(req: Request) -> Request {
    attrs(req, AttentionAttrs { causal: true, causal_alignment: CausalAlignment::TopLeft, ..AttentionAttrs::default() })
}

/// `req` causal with a left window of 64 keys.
fn windowed(req: Request) -> Request {
    attrs(req, AttentionAttrs { causal: true, window_left: Some(64), ..AttentionAttrs::default() })
}

/// `req` with dropout.
fn dropped(req: Request) -> Request {
    attrs(req, AttentionAttrs { dropout_p: 0.1, ..AttentionAttrs::default() })
}

/// `req` with its tensor `name` read every other element along its last dim
/// (`stride(-1) == 2`): a view of a twice-as-wide buffer.
fn strided(req: Request, name: &str) -> TestResult<Request> {
    let t: TensorDesc = req.get(name).cloned().ok_or_else(|| format!("no {name}"))?;
    let mut strides = vec![2u64; t.shape.len()];
    for d in (0..t.shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * t.shape[d + 1];
    }
    let t = t.with_strides(strides);
    Ok(req.tensor(name, t))
}

/// `req` with `v` read through [`strided`].
fn strided_v(req: Request) -> TestResult<Request> {
    strided(req, "v")
}

/// `req` (BSHD q, k, v) held head-major: each tensor [b, h, s, d] tagged BHSD.
fn head_major(req: Request) -> TestResult<Request> {
    let mut out = req.clone();
    for name in ["q", "k", "v"] {
        let t: TensorDesc = req.get(name).cloned().ok_or_else(|| format!("no {name}"))?;
        let [b, s, h, d] = [t.shape[0], t.shape[1], t.shape[2], t.shape[3]];
        out = out.tensor(name, TensorDesc::new(t.dtype, [b, h, s, d]).with_layout(Layout::Bhsd));
    }
    Ok(out)
}

fn softcap(dropout_p: f64) -> AttentionAttrs {
    AttentionAttrs { softcap: Some(30.0), dropout_p, ..AttentionAttrs::default() }
}

/// A bf16 paged decode on pages of `page` positions, the caches `page_stride` elements per
/// page (`None`: contiguous) and `elem` apart.
fn pages(page: u64, page_stride: Option<u64>, elem: u64) -> TestResult<Request> {
    queries_on_pages(1, page, page_stride, elem)
}

/// [`pages`] with `seq_q` queries per sequence (a paged prefill when above 1).
fn queries_on_pages(seq_q: u64, page: u64, page_stride: Option<u64>, elem: u64) -> TestResult<Request> {
    let req = paged(DType::BF16, DType::BF16, 4, seq_q, 32, 8, 128, page, Layout::Nhd, DType::I32);
    let Some(stride) = page_stride else { return Ok(req) };
    let cache = |name: &str| -> TestResult<TensorDesc> {
        let t: TensorDesc = req.get(name).cloned().ok_or_else(|| format!("no {name}"))?;
        Ok(t.with_strides([stride * elem, 8 * 128 * elem, 128 * elem, elem]))
    };
    let (k, v) = (cache("k_cache")?, cache("v_cache")?);
    Ok(req.tensor("k_cache", k).tensor("v_cache", v))
}

/// `repo:rest`, as the `'static` source a row holds.
fn src(repo: &str, rest: &str) -> Source {
    Source::Upstream(Box::leak(format!("{repo}:{rest}").into_boxed_str()))
}

fn facts() -> TestResult<Vec<Fact>> {
    let mut all = Vec::new();
    for rows in [
        cpu::facts()?,
        flash_attn::facts()?,
        flashinfer::facts()?,
        onednn::facts()?,
        others::facts()?,
        reference::facts()?,
        rocm::facts()?,
        torch_sdpa::facts()?,
    ] {
        all.extend(rows);
    }
    Ok(all)
}

/// `owner/repo@<40 hex>:path:line`.
fn well_formed(source: &str) -> bool {
    let Some((repo, rest)) = source.split_once('@') else { return false };
    let mut parts = rest.splitn(3, ':');
    let (commit, path, line) = (parts.next(), parts.next(), parts.next());
    repo.contains('/')
        && commit.is_some_and(|c| c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit()))
        && path.is_some_and(|p| !p.is_empty())
        && line.is_some_and(|l| l.parse::<u32>().is_ok_and(|n| n > 0))
}

/// Why `source` names no line, if it does not: an upstream source must be well formed, and a
/// line here must exist exactly once.
fn unsourced(source: &Source) -> Option<String> {
    match source {
        Source::Upstream(s) => (!well_formed(s)).then(|| format!("{s} is not owner/repo@commit:path:line")),
        Source::Here { path, needle } => {
            let text = match std::fs::read_to_string(layerzero_tests::repo_root().join(path)) {
                Ok(text) => text,
                Err(e) => return Some(format!("{path}: {e}")),
            };
            let lines: Vec<usize> =
                text.lines().enumerate().filter(|(_, l)| l.contains(needle)).map(|(i, _)| i + 1).collect();
            match lines.as_slice() {
                [_] => None,
                [] => Some(format!("{path} has no line containing {needle:?}")),
                many => Some(format!("{path} has {needle:?} on lines {many:?}: cite one line")),
            }
        }
    }
}

/// Every row's source names a line, and its kernel accepts and rejects as the row says.
fn hold(rows: Vec<Fact>) -> TestResult {
    let mut failures = Vec::new();
    for f in rows {
        let what = format!("{} {}", f.kernel, f.field);
        if let Some(why) = unsourced(&f.source) {
            failures.push(format!("{what}: {why}"));
        }
        let ok = plan(f.hardware.0)?.explain(&f.accepted);
        let got = codes(&ok, f.kernel)?;
        if !got.is_empty() {
            failures.push(format!("{what}: the accepted request is rejected: {got:?}"));
        }
        if let Some((rejected, code)) = &f.rejected {
            let bad = plan(f.hardware.1)?.explain(rejected);
            let got = codes(&bad, f.kernel)?;
            if !got.contains(code) {
                failures.push(format!("{what}: expected {code} among {got:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn our_cpu_kernels_accept_and_reject_as_their_code_says() -> TestResult {
    hold(cpu::facts()?)?;
    Ok(())
}

#[test]
fn the_reference_kernels_accept_and_reject_as_their_code_says() -> TestResult {
    hold(reference::facts()?)?;
    Ok(())
}

#[test]
fn flash_attention_accepts_and_rejects_as_its_upstream_lines_say() -> TestResult {
    hold(flash_attn::facts()?)?;
    Ok(())
}

#[test]
fn flashinfer_accepts_and_rejects_as_its_upstream_lines_say() -> TestResult {
    hold(flashinfer::facts()?)?;
    Ok(())
}

#[test]
fn onednn_accepts_and_rejects_as_its_upstream_lines_say() -> TestResult {
    hold(onednn::facts()?)?;
    Ok(())
}

#[test]
fn xformers_liger_and_zendnn_accept_and_reject_as_their_upstream_lines_say() -> TestResult {
    hold(others::facts()?)?;
    Ok(())
}

#[test]
fn the_rocm_kernels_accept_and_reject_as_their_upstream_lines_say() -> TestResult {
    hold(rocm::facts()?)?;
    Ok(())
}

#[test]
fn pytorch_sdpa_accepts_and_rejects_as_its_upstream_lines_say() -> TestResult {
    hold(torch_sdpa::facts()?)?;
    Ok(())
}

/// The (kernel, field) pairs every shipped capability file declares: fields that are set
/// (not absent, false or empty).
fn declared_facts() -> TestResult<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (_, _, k) in catalog()?.kernels() {
        let c = serde_json::to_value(&k.constraints).unwrap_or_default();
        for (field, v) in c.as_object().into_iter().flatten() {
            let set = match v {
                serde_json::Value::Null | serde_json::Value::Bool(false) => false,
                serde_json::Value::Array(a) => !a.is_empty(),
                serde_json::Value::Object(o) => !o.is_empty(),
                _ => true,
            };
            if set {
                out.push((k.id.clone(), field.clone()));
            }
        }
    }
    Ok(out)
}

#[test]
fn every_fact_a_shipped_capability_file_declares_has_a_source_row() -> TestResult {
    let rows: Vec<(String, String)> = facts()?.iter().map(|f| (f.kernel.to_owned(), f.field.to_owned())).collect();
    let missing: Vec<String> = declared_facts()?
        .into_iter()
        .filter(|fact| !rows.contains(fact))
        .map(|(kernel, field)| format!("{kernel} declares {field} with no source row (add one to tests/tests/facts/)"))
        .collect();
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    Ok(())
}

#[test]
fn an_mi300x_selects_a_rocm_kernel_for_common_attention_and_paged_requests_and_its_table_solves_them() -> TestResult {
    let sel = plan("mi300x")?;
    let masked = bf16(2, 128, 128, 16, 16, 128).tensor("mask", TensorDesc::new(DType::Bool, [2, 1, 128, 128]));
    for (what, req, want) in [
        (
            "GQA causal prefill",
            attrs(bf16(2, 2048, 2048, 32, 8, 128), layerzero_tests::causal()),
            "flash_attn_2.attention.fwd_ck",
        ),
        ("GQA decode", bf16(8, 1, 4096, 32, 8, 128), "flash_attn_2.attention.fwd_ck"),
        ("masked prefill", masked, "torch_sdpa.attention.efficient_rocm"),
        ("f32 prefill", attention(DType::F32, 1, 512, 512, 16, 16, 64), "torch_sdpa.attention.efficient_rocm"),
        ("paged decode on 16-position pages", pages(16, None, 1)?, "flash_attn_2.paged_attention.kvcache_triton_amd"),
        ("paged decode on 128-position pages", pages(128, None, 1)?, "flash_attn_2.paged_attention.kvcache_ck"),
    ] {
        let r = sel.explain(&req);
        assert_eq!(
            r.selected.as_deref(),
            Some(want),
            "{what}: {:?}",
            r.candidates.iter().map(|c| (&c.kernel, &c.reasons)).collect::<Vec<_>>()
        );
    }
    let table: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        layerzero_tests::repo_root().join("dispatch_tables/mi300x-llama-3-8b.json"),
    )?)?;
    let entries = table["entries"].as_array().cloned().unwrap_or_default();
    for op in ["attention", "paged_attention"] {
        assert!(entries.iter().any(|e| e["op"] == op), "{op} buckets are solved");
        let unsolved = table["unsolved"].as_array().cloned().unwrap_or_default();
        assert!(
            !unsolved.iter().any(|u| u["entry"].as_str().is_some_and(|e| e.starts_with(&format!("{op}.")))),
            "no {op} bucket is unsolved"
        );
    }
    Ok(())
}

#[test]
fn every_kernel_layerzero_runs_itself_has_an_executor_in_this_build() -> TestResult {
    use layerzero::capabilities::spec::Execution;
    // oneDNN's executors are bound only where the library loads; the kernels it would bind
    // are known without it.
    let registry = layerzero::builtin_registry();
    let runs = |id: &str| registry.contains(id) || layerzero::backend::onednn::kernels().any(|k| k == id);
    let catalog = catalog()?;
    let missing: Vec<&str> = catalog
        .kernels()
        .filter(|(_, b, k)| k.execution(b) != Execution::External && !runs(&k.id))
        .map(|(_, _, k)| k.id.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "declared as LayerZero's own (builtin or dynamic_library) with no executor: {missing:?}"
    );
    Ok(())
}
