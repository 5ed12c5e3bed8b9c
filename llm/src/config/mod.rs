//! A Hugging Face `config.json`, read for the architectures LayerZero runs, and refused with
//! the field and value named wherever it asks for something this code does not do: a
//! config is never silently approximated.
//!
//! Both spellings of RoPE are read: `rope_parameters` (transformers 5) and `rope_theta` with
//! `rope_scaling` (checkpoints written before it).

mod fields;
mod rope;
mod tp;

use serde_json::Value;

pub(crate) use fields::Fields;
use layerzero::error::{Error, Result};
use layerzero::model::attrs::RopeAttrs;
use layerzero::model::dtype::DType;

/// The decoder families LayerZero runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `LlamaForCausalLM`.
    Llama,
    /// `Qwen2ForCausalLM`: q/k/v biases.
    Qwen2,
    /// `Qwen3ForCausalLM`: RMSNorm of q and k per head before RoPE, explicit head_dim.
    Qwen3,
    /// `MistralForCausalLM`: sliding-window attention.
    Mistral,
    /// `MixtralForCausalLM`: Mistral's attention, a routed mixture of experts for the MLP.
    Mixtral,
    /// `Qwen2MoeForCausalLM`: Qwen2's attention, routed experts plus a gated shared expert.
    Qwen2Moe,
}

impl Arch {
    /// The `model_type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Mistral => "mistral",
            Arch::Mixtral => "mixtral",
            Arch::Qwen2Moe => "qwen2_moe",
        }
    }

    /// The class HF instantiates for it.
    pub fn class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Mistral => "MistralForCausalLM",
            Arch::Mixtral => "MixtralForCausalLM",
            Arch::Qwen2Moe => "Qwen2MoeForCausalLM",
        }
    }
}

/// A mixture-of-experts MLP: each token's router logits pick `top_k` of `experts` gated
/// MLPs, whose outputs are summed with the routing weights.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Routed experts E.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Each expert's MLP inner size.
    pub intermediate: usize,
    /// The kept routing weights are renormalized to sum to one (Mixtral always;
    /// Qwen2-MoE when `norm_topk_prob`).
    pub renormalize: bool,
    /// Qwen2-MoE: the inner size of the shared expert every token also runs, its output
    /// scaled by `sigmoid(shared_expert_gate(x))`.
    pub shared_intermediate: Option<usize>,
    /// Per layer: whether its MLP is the mixture (else a dense MLP of `intermediate_size`).
    pub sparse: Vec<bool>,
}

/// What the forward pass needs to know about a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The family.
    pub arch: Arch,
    /// Hidden size H.
    pub hidden: usize,
    /// MLP inner size.
    pub intermediate: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (GQA when fewer than `heads`).
    pub kv_heads: usize,
    /// Per-head size.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// RoPE options (rotate-half pairing, base, scaling).
    pub rope: RopeAttrs,
    /// `max_position_embeddings`.
    pub max_positions: usize,
    /// The LM head is the embedding table.
    pub tied: bool,
    /// q/k/v projections have biases.
    pub qkv_bias: bool,
    /// The output projection has a bias.
    pub o_bias: bool,
    /// The MLP projections have biases.
    pub mlp_bias: bool,
    /// q and k are RMS-normalized per head before RoPE.
    pub qk_norm: bool,
    /// Per layer, the sliding window (keys a query sees, itself included), if any.
    pub windows: Vec<Option<usize>>,
    /// The mixture of experts, for the MoE families.
    pub moe: Option<MoeConfig>,
    /// The weights' dtype as the config states it (`dtype` or `torch_dtype`).
    pub dtype: Option<DType>,
    /// Beginning-of-sequence token.
    pub bos: Option<u32>,
    /// End-of-sequence tokens.
    pub eos: Vec<u32>,
}

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn load(dir: &std::path::Path) -> Result<ModelConfig> {
        let path = dir.join("config.json");
        let origin = path.display().to_string();
        let text = layerzero::files::read_to_string(&path)?;
        ModelConfig::parse(&text, &origin)
    }

    /// Parses `config.json` text (`origin` names the file in errors).
    pub fn parse(text: &str, origin: &str) -> Result<ModelConfig> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
        let map = value.as_object().ok_or_else(|| Error::invalid(format!("{origin}: not a JSON object")))?;
        let f = Fields { map, origin };
        let arch = arch(&f)?;
        let act = f.str("hidden_act")?.unwrap_or("silu");
        if act != "silu" {
            return Err(f.err("hidden_act", format!("is {act:?}; these decoders use a SiLU-gated MLP (\"silu\")")));
        }
        let hidden = f.usize("hidden_size")?;
        let (heads, kv_heads, head_dim) = heads(&f, hidden)?;
        let layers = f.usize("num_hidden_layers")?;
        let max_positions = f.opt_usize("max_position_embeddings")?.unwrap_or(2048);
        let rope = rope::rope(&f, max_positions)?;
        let windows = rope::windows(&f, arch, layers)?;
        let attention_bias = f.bool("attention_bias")?.unwrap_or(false);
        let (qkv_bias, o_bias) = match arch {
            // Qwen2 always has q/k/v biases and none on the output projection.
            Arch::Qwen2 => (true, false),
            // Qwen2-MoE has them unless `qkv_bias` says otherwise.
            Arch::Qwen2Moe => (f.bool("qkv_bias")?.unwrap_or(true), false),
            _ => (attention_bias, attention_bias),
        };
        let moe = moe(&f, arch, layers)?;
        let dtype = f.dtype()?;
        Ok(ModelConfig {
            arch,
            hidden,
            intermediate: f.usize("intermediate_size")?,
            layers,
            heads,
            kv_heads,
            head_dim,
            vocab: f.usize("vocab_size")?,
            eps: f.f64("rms_norm_eps")?.unwrap_or(1e-6),
            rope,
            max_positions,
            tied: f.bool("tie_word_embeddings")?.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias: f.bool("mlp_bias")?.unwrap_or(false),
            qk_norm: arch == Arch::Qwen3,
            windows,
            moe,
            dtype,
            bos: tokens(&f, "bos_token_id")?.first().copied(),
            eos: tokens(&f, "eos_token_id")?,
        })
    }
}

/// The family `model_type` names, checked against `architectures`.
fn arch(f: &Fields<'_>) -> Result<Arch> {
    let model_type = f.str("model_type")?.ok_or_else(|| f.err("model_type", "is missing".into()))?;
    let arch = match model_type {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        "mistral" => Arch::Mistral,
        "mixtral" => Arch::Mixtral,
        "qwen2_moe" => Arch::Qwen2Moe,
        other => {
            return Err(f.err(
                "model_type",
                format!("is {other:?}; LayerZero runs llama, qwen2, qwen3, mistral, mixtral and qwen2_moe decoders"),
            ));
        }
    };
    if let Some(archs) = f.get("architectures").and_then(Value::as_array) {
        let expected = arch.class();
        if !archs.iter().any(|a| a.as_str() == Some(expected)) {
            return Err(f.err(
                "architectures",
                format!("is {}; a {model_type} config runs as {expected}", Value::Array(archs.clone())),
            ));
        }
    }
    Ok(arch)
}

/// Query heads, key/value heads and the head size: GQA's heads divide the query heads, and
/// RoPE needs an even size.
fn heads(f: &Fields<'_>, hidden: usize) -> Result<(usize, usize, usize)> {
    let heads = f.usize("num_attention_heads")?;
    let kv_heads = f.opt_usize("num_key_value_heads")?.unwrap_or(heads);
    for (field, n) in [("num_attention_heads", heads), ("num_key_value_heads", kv_heads)] {
        if n == 0 {
            return Err(f.err(field, "is 0; expected at least 1".into()));
        }
    }
    if !heads.is_multiple_of(kv_heads) {
        return Err(
            f.err("num_key_value_heads", format!("is {kv_heads}; it must divide num_attention_heads ({heads})"))
        );
    }
    let head_dim = match f.opt_usize("head_dim")? {
        Some(d) => d,
        None if hidden.is_multiple_of(heads) => hidden / heads,
        None => {
            return Err(
                f.err("head_dim", format!("is missing and hidden_size {hidden} is not a multiple of {heads} heads"))
            );
        }
    };
    if head_dim % 2 != 0 {
        return Err(f.err("head_dim", format!("is {head_dim}; RoPE needs an even head size")));
    }
    Ok((heads, kv_heads, head_dim))
}

/// Token ids of field `name`: one id or a list.
fn tokens(f: &Fields<'_>, name: &str) -> Result<Vec<u32>> {
    match f.get(name) {
        None => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| f.err(name, format!("holds {v}"))))
            .collect(),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(|n| vec![n])
            .ok_or_else(|| f.err(name, format!("is {v}; expected a token id"))),
    }
}

/// The mixture of experts of Mixtral (`num_local_experts`, every layer) and Qwen2-MoE
/// (`num_experts`, the layers `decoder_sparse_step` and `mlp_only_layers` select).
fn moe(f: &Fields<'_>, arch: Arch, layers: usize) -> Result<Option<MoeConfig>> {
    let top_k = || f.usize("num_experts_per_tok");
    let checked = |m: MoeConfig, experts_field: &str| -> Result<Option<MoeConfig>> {
        if m.top_k > m.experts {
            return Err(f.err(
                "num_experts_per_tok",
                format!("is {}; a token cannot pick more than the {} experts of `{experts_field}`", m.top_k, m.experts),
            ));
        }
        Ok(Some(m))
    };
    match arch {
        Arch::Mixtral => {
            // `router_jitter_noise` scales the input by noise in training only.
            let m = MoeConfig {
                experts: f.usize("num_local_experts")?,
                top_k: top_k()?,
                intermediate: f.usize("intermediate_size")?,
                renormalize: true,
                shared_intermediate: None,
                sparse: vec![true; layers],
            };
            checked(m, "num_local_experts")
        }
        Arch::Qwen2Moe => {
            let experts = f.usize("num_experts")?;
            let step = f.opt_usize("decoder_sparse_step")?.unwrap_or(1);
            if step == 0 {
                return Err(f.err("decoder_sparse_step", "is 0; expected at least 1".into()));
            }
            let dense: Vec<usize> = match f.get("mlp_only_layers") {
                None => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| {
                        v.as_u64().and_then(|n| usize::try_from(n).ok()).filter(|&n| n < layers).ok_or_else(|| {
                            f.err("mlp_only_layers", format!("holds {v}; expected layer indices below {layers}"))
                        })
                    })
                    .collect::<Result<_>>()?,
                Some(v) => return Err(f.err("mlp_only_layers", format!("is {v}; expected an array of layer indices"))),
            };
            let intermediate = f.usize("moe_intermediate_size")?;
            if intermediate == 0 {
                return Err(f.err("moe_intermediate_size", "is 0; expected at least 1".into()));
            }
            let shared = f.opt_usize("shared_expert_intermediate_size")?;
            // The shared expert runs as `shared / intermediate` more experts of the routed
            // size (a gated MLP splits exactly along its inner dimension).
            if let Some(s) = shared
                && !s.is_multiple_of(intermediate)
            {
                return Err(f.err(
                    "shared_expert_intermediate_size",
                    format!("is {s}; LayerZero runs the shared expert as experts of moe_intermediate_size ({intermediate}), so it must be a multiple of it"),
                ));
            }
            let m = MoeConfig {
                experts,
                top_k: top_k()?,
                intermediate,
                renormalize: f.bool("norm_topk_prob")?.unwrap_or(false),
                shared_intermediate: shared,
                sparse: (0..layers).map(|l| !dense.contains(&l) && (l + 1).is_multiple_of(step)).collect(),
            };
            checked(m, "num_experts")
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;
    use layerzero::model::attrs::RopeScaling;

    const LLAMA: &str = r#"{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu", "max_position_embeddings": 256,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, "tie_word_embeddings": true,
        "dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": [2, 3]}"#;

    #[test]
    fn a_llama3_config_reads_whole() -> TestResult {
        let c = ModelConfig::parse(LLAMA, "config.json")?;
        assert_eq!((c.hidden, c.heads, c.kv_heads, c.head_dim, c.layers), (64, 4, 2, 16, 2));
        assert_eq!(c.rope.base, Some(500000.0));
        assert!(matches!(c.rope.scaling, Some(RopeScaling::Llama3 { original_max_position: 64, .. })));
        assert!(c.tied && !c.qkv_bias && !c.qk_norm);
        assert_eq!((c.dtype, c.bos, c.eos.clone()), (Some(DType::BF16), Some(1), vec![2, 3]));
        assert_eq!(c.windows, vec![None, None]);
        Ok(())
    }

    #[test]
    fn the_older_rope_scaling_spelling_reads_the_same() -> TestResult {
        let old = LLAMA.replace(
            r#""rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,"#,
            r#""rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3","#,
        );
        assert_eq!(ModelConfig::parse(&old, "c")?, ModelConfig::parse(LLAMA, "c")?);
        Ok(())
    }

    #[test]
    fn what_this_code_does_not_run_is_refused_with_the_field_and_value() -> TestResult {
        let cases = [
            (LLAMA.replace(r#""llama""#, r#""gpt2""#), "field `model_type` is \"gpt2\""),
            (LLAMA.replace(r#""silu""#, r#""gelu""#), "field `hidden_act` is \"gelu\""),
            (
                LLAMA.replace(r#""rope_type": "llama3""#, r#""rope_type": "longrope""#),
                "`rope_parameters.rope_type` is \"longrope\"",
            ),
            (
                LLAMA.replace(r#""num_key_value_heads": 2"#, r#""num_key_value_heads": 3"#),
                "field `num_key_value_heads` is 3",
            ),
            (
                LLAMA.replace(r#""low_freq_factor": 1.0,"#, r#""low_freq_factor": 1.0, "mscale": 2.0,"#),
                "`rope_parameters.mscale` is 2.0",
            ),
            (LLAMA.replace(r#""hidden_size": 64,"#, ""), "field `hidden_size` is missing"),
            (LLAMA.replace("LlamaForCausalLM", "LlamaForSequenceClassification"), "field `architectures`"),
        ];
        for (text, want) in cases {
            let err = ModelConfig::parse(&text, "m/config.json").err().ok_or("the config must be refused")?.to_string();
            assert!(err.starts_with("m/config.json: ") && err.contains(want), "{err}");
        }
        Ok(())
    }

    #[test]
    fn mistral_windows_every_layer_and_qwen_only_the_marked_ones() -> TestResult {
        let m = r#"{"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "sliding_window": 4}"#;
        assert_eq!(ModelConfig::parse(m, "c")?.windows, vec![Some(4), Some(4)]);
        let q = r#"{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "sliding_window": 8,
            "use_sliding_window": true, "layer_types": ["full_attention", "sliding_attention"]}"#;
        let c = ModelConfig::parse(q, "c")?;
        assert_eq!(c.windows, vec![None, Some(8)]);
        assert!(c.qkv_bias && !c.o_bias);
        let off = q.replace(r#""use_sliding_window": true"#, r#""use_sliding_window": false"#);
        assert_eq!(ModelConfig::parse(&off, "c")?.windows, vec![None, None]);
        Ok(())
    }
}
