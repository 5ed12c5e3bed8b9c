//! Selection speed: cold selection over the whole catalog, and a full explain (report + JSON).
//! Run: `cargo bench -p layerzero --bench selection`.

use std::sync::Arc;

use layerzero::capabilities::catalog::Catalog;
use layerzero::hardware::named;
use layerzero::model::request::Request;
use layerzero::policy::Policy;
use layerzero::select::Selector;

fn main() {
    divan::main();
}

const PREFILL: &str = r#"{"op": "attention",
 "tensors": {"q": {"dtype": "bf16", "shape": [2, 2048, 32, 128], "layout": "BSHD"},
             "k": {"dtype": "bf16", "shape": [2, 2048, 8, 128], "layout": "BSHD"},
             "v": {"dtype": "bf16", "shape": [2, 2048, 8, 128], "layout": "BSHD", "strides": [8388608, 4096, 512, 4]},
             "mask": {"dtype": "bool", "shape": [2048, 2048]}},
 "attrs": {"causal": true, "causal_alignment": "bottom_right", "dropout_p": 0.0, "window_left": null, "softcap": null, "alibi": false, "scale": null}}"#;

const DECODE: &str = r#"{"op": "attention",
 "tensors": {"q": {"dtype": "bf16", "shape": [8, 1, 32, 128], "layout": "BSHD"},
             "k": {"dtype": "bf16", "shape": [8, 4096, 8, 128], "layout": "BSHD"},
             "v": {"dtype": "bf16", "shape": [8, 4096, 8, 128], "layout": "BSHD"}},
 "attrs": {"causal": true}}"#;

fn selector(hw: &str) -> Selector {
    let catalog = Catalog::builtin().expect("shipped capabilities load");
    let profile = Arc::new(named::load(hw).expect("shipped profile"));
    Selector::planning(catalog, profile, Arc::new(Policy::default())).expect("selector")
}

fn request(text: &str) -> Request {
    Request::from_json(text).expect("request parses")
}

#[divan::bench(args = ["prefill_masked_strided", "decode"])]
fn cold_select_h100(bencher: divan::Bencher, case: &str) {
    let sel = selector("h100");
    let req = request(if case == "decode" { DECODE } else { PREFILL });
    bencher.bench_local(|| sel.select(divan::black_box(&req)).map(|s| s.score.total_ns));
}

#[divan::bench]
fn explain_h100(bencher: divan::Bencher) {
    let sel = selector("h100");
    let req = request(PREFILL);
    bencher.bench_local(|| sel.explain(divan::black_box(&req)).candidates.len());
}

#[divan::bench]
fn explain_to_json_text_h100(bencher: divan::Bencher) {
    let sel = selector("h100");
    let req = request(PREFILL);
    bencher.bench_local(|| serde_json::to_string(&sel.explain(divan::black_box(&req))).map(|s| s.len()));
}

#[divan::bench]
fn parse_request(bencher: divan::Bencher) {
    bencher.bench_local(|| Request::from_json(divan::black_box(PREFILL)).map(|r| r.tensors.len()));
}
