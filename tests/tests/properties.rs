//! Property tests: random and malformed requests, capability files and policies never
//! panic; selection is deterministic; denying never makes a kernel eligible.

use std::sync::Arc;

use layerzero::capabilities::catalog::Catalog;
use layerzero::model::attrs::{AttentionAttrs, Attrs, CausalAlignment};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::model::tensor::TensorDesc;
use layerzero_tests::{TestResult, catalog, planner, planner_with, policy};
use proptest::prelude::*;

fn dtype() -> impl Strategy<Value = DType> {
    proptest::sample::select(DType::ALL.to_vec())
}

fn layout() -> impl Strategy<Value = Option<Layout>> {
    proptest::option::of(proptest::sample::select(vec![
        Layout::Bshd,
        Layout::Bhsd,
        Layout::Nhd,
        Layout::Hnd,
        Layout::Nt,
        Layout::Nn,
    ]))
}

fn tensor() -> impl Strategy<Value = TensorDesc> {
    (
        dtype(),
        proptest::collection::vec(0u64..300, 0..6),
        layout(),
        proptest::option::of(proptest::collection::vec(0u64..5000, 0..6)),
    )
        .prop_map(|(d, shape, layout, strides)| TensorDesc { dtype: d, shape, layout, strides, device: None })
}

fn attention_attrs() -> impl Strategy<Value = AttentionAttrs> {
    (
        any::<bool>(),
        any::<bool>(),
        0.0f64..1.0,
        proptest::option::of(0u64..4096),
        proptest::option::of(-5.0f64..50.0),
        any::<bool>(),
        proptest::option::of(-1.0f64..2.0),
    )
        .prop_map(|(causal, tl, dropout_p, window_left, softcap, alibi, scale)| AttentionAttrs {
            causal,
            causal_alignment: if tl { CausalAlignment::TopLeft } else { CausalAlignment::BottomRight },
            dropout_p,
            window_left,
            softcap,
            alibi,
            scale,
            rope: None,
            mask_block: None,
        })
}

fn request() -> impl Strategy<Value = Request> {
    let names = proptest::sample::subsequence(
        vec![
            "q",
            "k",
            "v",
            "mask",
            "x",
            "weight",
            "k_cache",
            "v_cache",
            "block_table",
            "context_lens",
            "cu_seqlens_q",
            "bogus",
        ],
        0..8,
    );
    (proptest::sample::select(Op::ALL.to_vec()), names, proptest::collection::vec(tensor(), 8), attention_attrs())
        .prop_map(|(op, names, tensors, attrs)| {
            let mut r = Request::new(op);
            for (n, t) in names.into_iter().zip(tensors) {
                r = r.tensor(n, t);
            }
            if op.is_attention() { r.attrs(Attrs::Attention(attrs)) } else { r }
        })
}

/// Well-formed dense attention with random dims (including zero and odd sizes).
fn attention_request() -> impl Strategy<Value = Request> {
    (
        prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::BF16), Just(DType::Fp8E4M3)],
        0u64..4,
        0u64..600,
        0u64..600,
        1u64..9,
        1u64..5,
        0u64..300,
        any::<bool>(),
        attention_attrs(),
    )
        .prop_map(|(d, b, sq, sk, g, hkv, hd, bhsd, attrs)| {
            let l = if bhsd { Layout::Bhsd } else { Layout::Bshd };
            let t = |s: u64, h: u64| {
                let shape = if bhsd { vec![b, h, s, hd] } else { vec![b, s, h, hd] };
                TensorDesc::new(d, shape).with_layout(l)
            };
            Request::new(Op::Attention)
                .tensor("q", t(sq, g * hkv))
                .tensor("k", t(sk, hkv))
                .tensor("v", t(sk, hkv))
                .attrs(Attrs::Attention(attrs))
        })
}

/// A helper's error as a failed case: inside `proptest!` a body returns `TestCaseError`.
fn case<T>(r: TestResult<T>) -> Result<T, TestCaseError> {
    r.map_err(|e| TestCaseError::fail(e.to_string()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_requests_never_panic_and_are_deterministic(req in request(), hw in proptest::sample::select(vec!["h100", "t4", "zen4", "mi300x", "b200"])) {
        let sel = case(planner(hw))?;
        let a = serde_json::to_string(&sel.explain(&req).to_json()).unwrap_or_default();
        let b = serde_json::to_string(&sel.explain(&req).to_json()).unwrap_or_default();
        prop_assert_eq!(a, b);
        let _ = sel.select(&req);
    }

    #[test]
    fn wellformed_attention_gets_a_verdict_with_reasons_for_every_rejection(req in attention_request(), hw in proptest::sample::select(vec!["h100", "a100", "t4", "spr", "zen3", "l4", "b200"])) {
        let r = case(planner(hw))?.explain(&req);
        for c in &r.candidates {
            prop_assert_eq!(c.reasons.is_empty(), c.score.is_some());
            if let Some(s) = &c.score {
                prop_assert!(s.total_ns.is_finite() && s.total_ns >= 0.0, "{} {:?}", c.kernel, s);
            }
        }
    }

    #[test]
    fn select_and_explain_agree_on_the_winner_and_its_score(req in attention_request(), hw in proptest::sample::select(vec!["h100", "a100", "t4", "zen4", "b200"]), strict in any::<bool>()) {
        let p = case(policy(&format!(r#"{{"strict_mode": {strict}}}"#)))?;
        let sel = case(planner_with(case(catalog())?, hw, p))?;
        let report = sel.explain(&req);
        match sel.select(&req) {
            Ok(s) => {
                prop_assert_eq!(Some(&s.kernel), report.selected.as_ref());
                let c = report.selected_candidate().and_then(|c| c.score.clone());
                prop_assert_eq!(Some(s.score), c);
            }
            Err(e) => {
                prop_assert!(report.selected.is_none(), "select failed ({}) but explain selected {:?}", e, report.selected);
                prop_assert!(!e.reasons().is_empty());
            }
        }
    }

    #[test]
    fn enormous_dimensions_never_overflow(dims in proptest::collection::vec(prop_oneof![Just(u64::MAX), Just(u64::MAX / 3), Just(1u64 << 40), 1u64..5], 8), hw in proptest::sample::select(vec!["h100", "zen4"])) {
        let t = |b: u64, s: u64, h: u64, d: u64| TensorDesc::new(DType::BF16, [b, s, h, d]).with_layout(Layout::Bshd);
        let attn = Request::new(Op::Attention)
            .tensor("q", t(dims[0], dims[1], dims[2], dims[3]))
            .tensor("k", t(dims[0], dims[4], dims[2], dims[3]))
            .tensor("v", t(dims[0], dims[4], dims[2], dims[3]).with_strides([dims[5], dims[6], 2, dims[7]]))
            .tensor("mask", TensorDesc::new(DType::F32, [dims[1], dims[4]]).with_strides([0]))
            .attrs(Attrs::Attention(AttentionAttrs { causal: true, window_left: Some(dims[6]), ..AttentionAttrs::default() }));
        let linear = Request::new(Op::Linear)
            .tensor("x", TensorDesc::new(DType::F16, [dims[0], dims[1], dims[2]]))
            .tensor("weight", TensorDesc::new(DType::F16, [dims[3], dims[2]]));
        let norm = Request::new(Op::RmsNorm)
            .tensor("x", TensorDesc::new(DType::F16, [dims[0], dims[1], dims[2]]))
            .tensor("weight", TensorDesc::new(DType::F16, [dims[2]]));
        for req in [attn, linear, norm] {
            let sel = case(planner(hw))?;
            let r = sel.explain(&req);
            for c in &r.candidates {
                if let Some(s) = &c.score {
                    prop_assert!(!s.total_ns.is_nan(), "{}", c.kernel);
                }
            }
            let _ = sel.select(&req);
        }
    }

    #[test]
    fn random_json_requests_never_panic(text in "\\PC{0,200}") {
        let _ = Request::from_json(&text);
    }

    #[test]
    fn mutated_request_json_never_panics(req in attention_request(), key in "[a-z_]{1,12}", val in prop_oneof![Just(serde_json::json!(null)), Just(serde_json::json!(-1)), Just(serde_json::json!("x")), Just(serde_json::json!([1, -2])), Just(serde_json::json!({"a": 1}))]) {
        let mut v = req.to_value();
        v["attrs"][key.clone()] = val.clone();
        let _ = Request::from_value(v.clone());
        v["tensors"]["q"][key] = val;
        if let Ok(r) = Request::from_value(v) {
            let _ = case(planner("h100"))?.explain(&r);
        }
    }

    #[test]
    fn mutated_capability_files_are_rejected_or_loaded_never_a_panic(idx in 0usize..11, path in proptest::collection::vec("[a-z_]{1,10}", 1..4), val in prop_oneof![Just(serde_json::json!(null)), Just(serde_json::json!(-3)), Just(serde_json::json!("9.x")), Just(serde_json::json!([])), Just(serde_json::json!({"min": "a"}))]) {
        let dir = layerzero_tests::repo_root().join("capabilities");
        let mut files: Vec<_> = std::fs::read_dir(&dir).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "json")).collect()).unwrap_or_default();
        files.sort();
        let f = &files[idx % files.len()];
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap_or_default()).unwrap_or_default();
        let mut cur = &mut v["kernels"][0]["constraints"];
        for p in &path[..path.len() - 1] {
            cur = &mut cur[p.as_str()];
        }
        cur[path[path.len() - 1].as_str()] = val;
        let _ = Catalog::from_texts(&[("mutated.json".to_owned(), v.to_string())]);
    }

    #[test]
    fn denying_kernels_never_makes_another_kernel_eligible(req in attention_request(), pattern in proptest::sample::select(vec!["flash_attn_*", "torch_sdpa.*", "*.attention.*", "xformers.*", "flashinfer.*"])) {
        let free = case(planner("h100"))?.explain(&req);
        let deny = case(policy(&format!(r#"{{"rules": [{{"action": "deny", "kernels": "{pattern}"}}]}}"#)))?;
        let denied = case(planner_with(case(catalog())?, "h100", deny))?.explain(&req);
        for (a, b) in free.candidates.iter().zip(&denied.candidates) {
            prop_assert!(!(a.score.is_none() && b.score.is_some()), "{} became eligible", a.kernel);
        }
    }
}

#[test]
fn an_empty_catalog_selects_nothing_with_a_clear_error() -> TestResult {
    let c = Arc::new(Catalog::from_backends(Vec::new())?);
    let sel = planner_with(c, "h100", layerzero::policy::Policy::default())?;
    let req = layerzero_tests::attention(DType::BF16, 1, 16, 16, 8, 8, 64);
    let err = sel.select(&req).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("no kernel is declared for op attention"), "{err}");
    Ok(())
}
