//! Helpers for LayerZero's integration tests: request builders, catalogs and selectors,
//! fake capability files, the parity tolerance, and the table-driven case runner.

pub mod cases;
pub mod catalog;
pub mod close;
pub mod gqa;
pub mod stress;

use std::sync::Arc;

use layerzero::capabilities::catalog::Catalog;
use layerzero::hardware::named;
use layerzero::model::attrs::{AttentionAttrs, Attrs};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::model::tensor::TensorDesc;
use layerzero::policy::Policy;
use layerzero::select::{SelectionReport, Selector};

/// What a test, or a helper of one, returns: a failed call is an `Err` the harness prints,
/// not a panic.
pub type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Zero f32 attention arguments `[1, 4, 2, 8]` (BSHD) for q, k and v: a call whose numbers do
/// not matter (executors under test return their own outputs).
pub fn tiny_attention() -> TestResult<layerzero::OpArgs> {
    let t = layerzero::HostTensor::zeros(DType::F32, &[1, 4, 2, 8])?.with_layout(Layout::Bshd);
    Ok(layerzero::OpArgs::Attention(layerzero::AttentionArgs {
        q: t.clone(),
        k: t.clone(),
        v: t,
        mask: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        attrs: AttentionAttrs::default(),
    }))
}

/// The repository root (for shipped files).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(|p| p.to_path_buf()).unwrap_or_default()
}

/// The `lz` binary, run in the repository root with no `LAYERZERO_*` knob or
/// `RUST_BACKTRACE` inherited from the caller; built first when this crate's tests run alone
/// (`cargo test -p layerzero-tests`).
pub fn lz() -> TestResult<assert_cmd::Command> {
    // Built once per process; every later call gets the first build's verdict.
    static BUILT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let status = std::process::Command::new(cargo)
                .args(["build", "-q", "-p", "layerzero-cli", "--bin", "lz"])
                .current_dir(repo_root())
                .status();
            match status {
                Ok(s) if s.success() => Ok(()),
                other => Err(format!("building lz failed: {other:?}")),
            }
        })
        .clone()?;
    let mut c = assert_cmd::Command::cargo_bin("lz")?;
    c.current_dir(repo_root()).env_remove("RUST_BACKTRACE");
    for k in layerzero::knobs::all() {
        c.env_remove(k.name());
    }
    // State `lz` keeps (the measured hardware, PerfDB, calibration) stays in this test
    // process's folder, never the user's; a test sets its own to start from nothing.
    c.env("LAYERZERO_HOME", test_home()?);
    Ok(c)
}

/// A folder for `LAYERZERO_HOME` shared by this test process's `lz` runs.
pub fn test_home() -> TestResult<&'static std::path::Path> {
    static HOME: std::sync::OnceLock<Result<tempfile::TempDir, String>> = std::sync::OnceLock::new();
    match HOME.get_or_init(|| tempfile::tempdir().map_err(|e| format!("LAYERZERO_HOME for tests: {e}"))) {
        Ok(dir) => Ok(dir.path()),
        Err(e) => Err(e.clone().into()),
    }
}

/// Dense attention [batch, seq, heads, head_dim] in BSHD, no attributes set.
pub fn attention(
    dtype: DType,
    batch: u64,
    seq_q: u64,
    seq_k: u64,
    heads_q: u64,
    heads_kv: u64,
    head_dim: u64,
) -> Request {
    let t = |s: u64, h: u64| TensorDesc::new(dtype, [batch, s, h, head_dim]).with_layout(Layout::Bshd);
    Request::new(Op::Attention)
        .tensor("q", t(seq_q, heads_q))
        .tensor("k", t(seq_k, heads_kv))
        .tensor("v", t(seq_k, heads_kv))
}

/// Paged attention: q [batch, seq_q, heads_q, d], caches in `layout` with `page_size`.
#[allow(clippy::too_many_arguments)]
pub fn paged(
    dtype: DType,
    kv: DType,
    batch: u64,
    seq_q: u64,
    heads_q: u64,
    heads_kv: u64,
    head_dim: u64,
    page_size: u64,
    layout: Layout,
    table: DType,
) -> Request {
    let pages = 64;
    let shape = match layout {
        Layout::Hnd => [pages, heads_kv, page_size, head_dim],
        _ => [pages, page_size, heads_kv, head_dim],
    };
    let cache = TensorDesc::new(kv, shape).with_layout(layout);
    Request::new(Op::PagedAttention)
        .tensor("q", TensorDesc::new(dtype, [batch, seq_q, heads_q, head_dim]).with_layout(Layout::Bshd))
        .tensor("k_cache", cache.clone())
        .tensor("v_cache", cache)
        .tensor("block_table", TensorDesc::new(table, [batch, 8]))
        .tensor("context_lens", TensorDesc::new(DType::I32, [batch]))
}

/// Replaces the attention attributes.
pub fn with_attrs(req: Request, attrs: AttentionAttrs) -> Request {
    req.attrs(Attrs::Attention(attrs))
}

/// Causal attention attributes (bottom-right).
pub fn causal() -> AttentionAttrs {
    AttentionAttrs { causal: true, ..AttentionAttrs::default() }
}

/// The shipped catalog.
pub fn catalog() -> TestResult<Arc<Catalog>> {
    Catalog::builtin().map_err(|e| format!("the shipped capabilities do not load: {e}").into())
}

/// A planning selector over the shipped catalog for a shipped profile.
pub fn planner(hw: &str) -> TestResult<Selector> {
    planner_with(catalog()?, hw, Policy::default())
}

/// A planning selector with a given catalog and policy.
pub fn planner_with(catalog: Arc<Catalog>, hw: &str, policy: Policy) -> TestResult<Selector> {
    let profile = named::load(hw).map_err(|e| format!("profile {hw}: {e}"))?;
    Ok(Selector::planning(catalog, Arc::new(profile), Arc::new(policy)).map_err(|e| format!("selector: {e}"))?)
}

/// A table of one f32 linear entry (x [m, 64], weight [48, 64], m 1..16) solved by `selector`.
pub fn small_linear_table(selector: &Selector) -> TestResult<layerzero::DispatchTable> {
    use layerzero::plan::{solve, workload::Workload};
    let workload = Workload::from_json(
        r#"{"schema_version": 1, "name": "small-linear", "entries": [{"name": "proj", "request": {"op": "linear",
            "tensors": {"x": {"dtype": "f32", "shape": [8, 64]}, "weight": {"dtype": "f32", "shape": [48, 64]}}},
            "ranges": {"m": [1, 16]}}]}"#,
        "w.json",
    )?;
    let prov =
        solve::Provenance { perfdb_digest: None, created_at: "2026-11-28T00:00:00Z".into(), command: "test".into() };
    Ok(solve::solve(&workload, selector, prov)?)
}

/// A policy from JSON text.
pub fn policy(json: &str) -> TestResult<Policy> {
    Ok(Policy::from_json(json, "test policy").map_err(|e| format!("policy: {e}"))?)
}

/// The reason codes of one candidate, as strings, in report order.
pub fn codes(report: &SelectionReport, kernel: &str) -> TestResult<Vec<&'static str>> {
    let Some(c) = report.candidate(kernel) else {
        let candidates: Vec<_> = report.candidates.iter().map(|c| &c.kernel).collect();
        return Err(format!("{kernel} is not a candidate; candidates: {candidates:?}").into());
    };
    Ok(c.reasons.iter().map(|r| r.code().as_str()).collect())
}
