//! What the hot-path benches share: a workload, a prefill request, typed prefill arguments
//! and a dispatch table solved for them on an H100 profile.

use layerzero::exec::args::{AttentionArgs, OpArgs};
use layerzero::plan::solve::{self, Provenance};
use layerzero::plan::workload::Workload;
use layerzero::{AttentionAttrs, DType, DispatchTable, HostTensor, LayerZero, Layout};

/// Causal GQA attention, batch 1..8, sequences 1..8192.
pub const WORKLOAD: &str = r#"{"schema_version": 1, "name": "bench", "entries": [
    {"name": "attn", "request": {"op": "attention", "tensors": {
        "q": {"dtype": "bf16", "shape": [1, 16, 32, 128], "layout": "BSHD"},
        "k": {"dtype": "bf16", "shape": [1, 16, 8, 128], "layout": "BSHD"},
        "v": {"dtype": "bf16", "shape": [1, 16, 8, 128], "layout": "BSHD"}},
        "attrs": {"causal": true}}, "ranges": {"batch": [1, 8], "seq_q": [1, 8192], "seq_k": "seq_q"}}
]}"#;

/// A prefill of two sequences of 1500 tokens.
pub const PREFILL: &str = r#"{"op": "attention", "tensors": {
    "q": {"dtype": "bf16", "shape": [2, 1500, 32, 128], "layout": "BSHD"},
    "k": {"dtype": "bf16", "shape": [2, 1500, 8, 128], "layout": "BSHD"},
    "v": {"dtype": "bf16", "shape": [2, 1500, 8, 128], "layout": "BSHD"}},
    "attrs": {"causal": true}}"#;

/// A planning handle for an H100.
pub fn planning() -> LayerZero {
    LayerZero::planning("h100").expect("shipped profile")
}

/// The table `lz solve` would write for `WORKLOAD` on `lz`'s machine.
pub fn table(lz: &LayerZero) -> DispatchTable {
    let w = Workload::from_json(WORKLOAD, "bench").expect("workload");
    let prov = Provenance { perfdb_digest: None, created_at: String::new(), command: String::new() };
    solve::solve(&w, &lz.selector(), prov).expect("solve")
}

/// `PREFILL` as typed arguments.
pub fn typed() -> OpArgs {
    let t = |h: usize| HostTensor::zeros(DType::BF16, &[2, 1500, h, 128]).expect("tensor").with_layout(Layout::Bshd);
    OpArgs::Attention(AttentionArgs {
        q: t(32),
        k: t(8),
        v: t(8),
        mask: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        attrs: AttentionAttrs { causal: true, ..AttentionAttrs::default() },
    })
}
