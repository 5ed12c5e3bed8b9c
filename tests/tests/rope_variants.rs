//! Spec 002 §6.19, positional encoding variants: every RoPE scaling variant (default,
//! linear, dynamic NTK, YaRN, Llama 3) in both pair layouts (rotate-half and interleaved) run
//! by `cpu.rope.fast` and the f64 oracle against PyTorch fixtures (`tools/gen_fixtures.py`);
//! XPos and LongRoPE, which LayerZero does not implement, are refused by name with a reason
//! code; a kernel that lacks a layout refuses it with its reason code.

use layerzero::compare::Category;
use layerzero::exec::args::OpArgs;
use layerzero::model::attrs::{Attrs, RopeAttrs, RopeStyle};
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::model::op::Op;
use layerzero::model::request::Request;
use layerzero::model::tensor::TensorDesc;
use layerzero::{ErrorKind, LayerZero};
use layerzero_llm::ModelConfig;
use layerzero_tests::{TestResult, close, codes, planner};

use crate::fixtures::{fixture_dir, load};

/// (scaling variant, pair layout, the fixture that holds it).
const MATRIX: [(&str, RopeStyle, &str); 10] = [
    ("default", RopeStyle::RotateHalf, "rope_bshd_f32_rotate_half"),
    ("default", RopeStyle::Interleaved, "rope_bhsd_f32_interleaved"),
    ("linear", RopeStyle::RotateHalf, "rope_bshd_f32_linear"),
    ("linear", RopeStyle::Interleaved, "rope_bshd_f32_linear_interleaved"),
    ("dynamic_ntk", RopeStyle::RotateHalf, "rope_bshd_f32_dynamic_ntk"),
    ("dynamic_ntk", RopeStyle::Interleaved, "rope_bhsd_f32_dynamic_ntk_interleaved"),
    ("yarn", RopeStyle::RotateHalf, "rope_bshd_f32_yarn"),
    ("yarn", RopeStyle::Interleaved, "rope_bhsd_bf16_yarn_betas_interleaved"),
    ("llama3", RopeStyle::RotateHalf, "rope_bshd_f32_llama3"),
    ("llama3", RopeStyle::Interleaved, "rope_bshd_f32_llama3_interleaved"),
];

/// The scaling variant's name as the request spells it (`type`), or `default`.
fn variant(a: &RopeAttrs) -> TestResult<String> {
    Ok(match &a.scaling {
        None => "default".to_owned(),
        Some(s) => serde_json::to_value(s)?["type"].as_str().ok_or("a scaling without `type`")?.to_owned(),
    })
}

#[test]
fn section_6_19_every_scaling_variant_in_both_layouts_matches_its_pytorch_fixture() -> TestResult {
    let lz = LayerZero::host()?;
    for (want_variant, want_style, name) in MATRIX {
        let fx = load(&fixture_dir().join(format!("{name}.safetensors"))).map_err(|e| format!("{name}: {e}"))?;
        let request = Request::from_json(&fx.request_json)?;
        // The table cannot claim a fixture for a case it does not hold.
        let Attrs::Rope(attrs) = &request.attrs else { return Err(format!("{name} is not a rope request").into()) };
        assert_eq!((variant(attrs)?.as_str(), attrs.style), (want_variant, want_style), "{name}");
        let args = OpArgs::from_request(&request, fx.inputs.clone())?;
        for kernel in ["cpu.rope.fast", "cpu_reference.rope.naive"] {
            let exec = lz.registry().get(kernel).ok_or_else(|| format!("no executor for {kernel}"))?;
            let outs = exec.run(&args)?;
            for (output, want) in &fx.expected {
                let got = outs.get(output).ok_or_else(|| format!("{kernel} on {name}: no `{output}`"))?;
                close::tensors(&format!("{kernel} on {name} `{output}`"), Category::Rope, want, got)?;
            }
        }
    }
    Ok(())
}

/// A llama config whose `rope_scaling` is `scaling` (JSON).
fn config_with(scaling: &str) -> String {
    format!(
        r#"{{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu", "max_position_embeddings": 256,
        "rope_theta": 10000.0, "rope_scaling": {scaling}, "tie_word_embeddings": true}}"#
    )
}

#[test]
fn section_6_19_xpos_and_longrope_are_refused_by_name_with_a_reason_code() -> TestResult {
    // The same config with a variant LayerZero implements reads: only the variant differs.
    ModelConfig::parse(&config_with(r#"{"rope_type": "linear", "factor": 2.0}"#), "config.json")?;
    for (kind, named) in [("xpos", "XPos"), ("longrope", "\"longrope\"")] {
        let text = config_with(&format!(r#"{{"rope_type": "{kind}", "scale_base": 512}}"#));
        let err = ModelConfig::parse(&text, "config.json").err().ok_or(format!("a {kind} config was accepted"))?;
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.message().contains("`rope_scaling.rope_type`") && err.message().contains(named), "{err}");
        let codes: Vec<&str> = err.reasons().iter().map(|r| r.code().as_str()).collect();
        assert_eq!(codes, ["ROPE_VARIANT_UNSUPPORTED"], "{err}");
    }
    // A request naming it is refused when it is read, naming it too.
    let json = r#"{"op": "rope", "tensors": {"q": {"dtype": "f32", "shape": [1, 4, 2, 8]}},
        "attrs": {"scaling": {"type": "xpos", "factor": 1.0}}}"#;
    let err = Request::from_json(json).err().ok_or("a request with xpos scaling was accepted")?;
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("xpos"), "{err}");
    Ok(())
}

#[test]
fn section_6_19_a_kernel_without_the_interleaved_layout_refuses_it_and_the_cpu_kernel_takes_it() -> TestResult {
    let q = TensorDesc::new(DType::BF16, [1, 128, 8, 128]).with_layout(Layout::Bshd);
    let rope = |style| {
        Request::new(Op::Rope)
            .tensor("q", q.clone())
            .tensor("k", q.clone())
            .attrs(Attrs::Rope(RopeAttrs { style, ..RopeAttrs::default() }))
    };
    let h100 = planner("h100")?;
    let report = h100.explain(&rope(RopeStyle::Interleaved));
    assert!(codes(&report, "liger.rope.triton")?.contains(&"ATTR_UNSUPPORTED"), "{report:?}");
    let spr = planner("spr")?.explain(&rope(RopeStyle::Interleaved));
    assert_eq!(codes(&spr, "cpu.rope.fast")?, Vec::<&str>::new());
    assert_eq!(spr.selected.as_deref(), Some("cpu.rope.fast"));
    Ok(())
}
