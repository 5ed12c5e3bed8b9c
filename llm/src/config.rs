//! A Hugging Face `config.json`, read for the architectures LayerZero runs, and refused with
//! the field and value named wherever it asks for something this code does not do: a
//! config is never silently approximated.
//!
//! Both spellings of RoPE are read: `rope_parameters` (transformers 5) and `rope_theta` with
//! `rope_scaling` (checkpoints written before it).

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::model::attrs::{RopeAttrs, RopeScaling, RopeStyle};
use crate::model::dtype::DType;

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

/// Reads a field of an object, naming the file and field when it is missing or mistyped.
pub(crate) struct Fields<'a> {
    pub(crate) map: &'a Map<String, Value>,
    pub(crate) origin: &'a str,
}

impl<'a> Fields<'a> {
    pub(crate) fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    pub(crate) fn err(&self, name: &str, what: String) -> Error {
        Error::invalid(format!("{}: field `{name}` {what}", self.origin))
    }

    pub(crate) fn usize(&self, name: &str) -> Result<usize> {
        self.opt_usize(name)?.ok_or_else(|| self.err(name, "is missing".into()))
    }

    pub(crate) fn opt_usize(&self, name: &str) -> Result<Option<usize>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(self.err(name, format!("is {v}; expected a positive integer"))),
            },
        }
    }

    pub(crate) fn f64(&self, name: &str) -> Result<Option<f64>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.err(name, format!("is {v}; expected a number"))),
            },
        }
    }

    pub(crate) fn bool(&self, name: &str) -> Result<Option<bool>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.err(name, format!("is {v}; expected true or false"))),
        }
    }

    /// The weights' dtype as the config states it (`dtype`, or the older `torch_dtype`).
    pub(crate) fn dtype(&self) -> Result<Option<DType>> {
        match self.str("dtype")?.or(self.str("torch_dtype")?) {
            None => Ok(None),
            Some("float32") => Ok(Some(DType::F32)),
            Some("bfloat16") => Ok(Some(DType::BF16)),
            Some("float16") => Ok(Some(DType::F16)),
            Some(other) => Err(self.err("dtype", format!("is {other:?}; expected float32, bfloat16 or float16"))),
        }
    }

    pub(crate) fn str(&self, name: &str) -> Result<Option<&'a str>> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.err(name, format!("is {v}; expected a string"))),
        }
    }
}

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn load(dir: &std::path::Path) -> Result<ModelConfig> {
        let path = dir.join("config.json");
        let origin = path.display().to_string();
        let text = crate::files::read_to_string(&path)?;
        ModelConfig::parse(&text, &origin)
    }

    /// Parses `config.json` text (`origin` names the file in errors).
    pub fn parse(text: &str, origin: &str) -> Result<ModelConfig> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
        let map = value.as_object().ok_or_else(|| Error::invalid(format!("{origin}: not a JSON object")))?;
        let f = Fields { map, origin };
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
                    format!(
                        "is {other:?}; LayerZero runs llama, qwen2, qwen3, mistral, mixtral and qwen2_moe decoders"
                    ),
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
        let act = f.str("hidden_act")?.unwrap_or("silu");
        if act != "silu" {
            return Err(f.err("hidden_act", format!("is {act:?}; these decoders use a SiLU-gated MLP (\"silu\")")));
        }
        let hidden = f.usize("hidden_size")?;
        let heads = f.usize("num_attention_heads")?;
        let kv_heads = f.opt_usize("num_key_value_heads")?.unwrap_or(heads);
        if heads % kv_heads != 0 {
            return Err(
                f.err("num_key_value_heads", format!("is {kv_heads}; it must divide num_attention_heads ({heads})"))
            );
        }
        let head_dim = match f.opt_usize("head_dim")? {
            Some(d) => d,
            None if hidden % heads == 0 => hidden / heads,
            None => {
                return Err(f.err(
                    "head_dim",
                    format!("is missing and hidden_size {hidden} is not a multiple of {heads} heads"),
                ));
            }
        };
        if head_dim % 2 != 0 {
            return Err(f.err("head_dim", format!("is {head_dim}; RoPE needs an even head size")));
        }
        let layers = f.usize("num_hidden_layers")?;
        let max_positions = f.opt_usize("max_position_embeddings")?.unwrap_or(2048);
        let rope = rope(&f, max_positions)?;
        let windows = windows(&f, arch, layers)?;
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
        let token = |name: &str| -> Result<Vec<u32>> {
            match f.get(name) {
                None => Ok(Vec::new()),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| {
                        v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| f.err(name, format!("holds {v}")))
                    })
                    .collect(),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(|n| vec![n])
                    .ok_or_else(|| f.err(name, format!("is {v}; expected a token id"))),
            }
        };
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
            bos: token("bos_token_id")?.first().copied(),
            eos: token("eos_token_id")?,
        })
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
            let shared = f.opt_usize("shared_expert_intermediate_size")?;
            // The shared expert runs as `shared / intermediate` more experts of the routed
            // size (a gated MLP splits exactly along its inner dimension).
            if let Some(s) = shared
                && s % intermediate != 0
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
                sparse: (0..layers).map(|l| !dense.contains(&l) && (l + 1) % step == 0).collect(),
            };
            checked(m, "num_experts")
        }
        _ => Ok(None),
    }
}

/// RoPE from `rope_parameters`, or from `rope_theta` and `rope_scaling`.
fn rope(f: &Fields<'_>, max_positions: usize) -> Result<RopeAttrs> {
    let (params, field) = match (f.get("rope_parameters"), f.get("rope_scaling")) {
        (Some(p), _) => (Some(p), "rope_parameters"),
        (None, Some(s)) => (Some(s), "rope_scaling"),
        (None, None) => (None, "rope_scaling"),
    };
    let mut base = f.f64("rope_theta")?;
    let Some(params) = params else {
        return Ok(RopeAttrs {
            style: RopeStyle::RotateHalf,
            rotary_dim: None,
            base: base.or(Some(10000.0)),
            scaling: None,
        });
    };
    let map = params.as_object().ok_or_else(|| f.err(field, format!("is {params}; expected an object")))?;
    let p = Fields { map, origin: f.origin };
    let name = |key: &str| format!("{field}.{key}");
    if let Some(theta) = p.f64("rope_theta")? {
        base = Some(theta);
    }
    let kind = p.str("rope_type")?.or(p.str("type")?).unwrap_or("default");
    let factor = || -> Result<f64> {
        match p.f64("factor")? {
            Some(x) if x >= 1.0 => Ok(x),
            Some(x) => Err(f.err(&name("factor"), format!("is {x}; expected at least 1"))),
            None => Err(f.err(&name("factor"), "is missing".into())),
        }
    };
    let original = |default: Option<usize>| -> Result<u64> {
        match p.opt_usize("original_max_position_embeddings")?.or(default) {
            Some(n) => Ok(n as u64),
            None => Err(f.err(&name("original_max_position_embeddings"), "is missing".into())),
        }
    };
    // Options of a RoPE type that this code does not implement are refused by name.
    let known: &[&str] = match kind {
        "default" => &[],
        "linear" => &["factor"],
        "dynamic" => &["factor", "original_max_position_embeddings"],
        "yarn" => &["factor", "original_max_position_embeddings", "beta_fast", "beta_slow"],
        "llama3" => &["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"],
        other => {
            return Err(f.err(
                &name("rope_type"),
                format!("is {other:?}; LayerZero implements default, linear, dynamic, yarn and llama3"),
            ));
        }
    };
    for key in map.keys() {
        let generic = ["rope_type", "type", "rope_theta"].contains(&key.as_str());
        if !generic && !known.contains(&key.as_str()) && !map[key].is_null() {
            return Err(f.err(
                &name(key),
                format!("is {}; it is not implemented for rope_type {kind:?} (only {})", map[key], known.join(", ")),
            ));
        }
    }
    let scaling = match kind {
        "default" => None,
        "linear" => Some(RopeScaling::Linear { factor: factor()? }),
        "dynamic" => {
            Some(RopeScaling::DynamicNtk { factor: factor()?, original_max_position: original(Some(max_positions))? })
        }
        "yarn" => Some(RopeScaling::Yarn {
            factor: factor()?,
            original_max_position: original(Some(max_positions))?,
            beta_fast: p.f64("beta_fast")?.unwrap_or(32.0),
            beta_slow: p.f64("beta_slow")?.unwrap_or(1.0),
        }),
        _ => Some(RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: p
                .f64("low_freq_factor")?
                .ok_or_else(|| f.err(&name("low_freq_factor"), "is missing".into()))?,
            high_freq_factor: p
                .f64("high_freq_factor")?
                .ok_or_else(|| f.err(&name("high_freq_factor"), "is missing".into()))?,
            original_max_position: original(None)?,
        }),
    };
    Ok(RopeAttrs { style: RopeStyle::RotateHalf, rotary_dim: None, base: base.or(Some(10000.0)), scaling })
}

/// The sliding window of each layer: Mistral's applies to every layer; Qwen's to the layers
/// `layer_types` marks `sliding_attention` when `use_sliding_window` is on.
fn windows(f: &Fields<'_>, arch: Arch, layers: usize) -> Result<Vec<Option<usize>>> {
    // Qwen2-MoE writes 0 when `use_sliding_window` is off: no window.
    let window = match f.get("sliding_window") {
        Some(v) if v.as_u64() == Some(0) => None,
        _ => f.opt_usize("sliding_window")?,
    };
    let kinds: Option<Vec<&str>> = match f.get("layer_types") {
        None => None,
        Some(Value::Array(a)) if a.len() == layers => Some(
            a.iter()
                .map(|v| v.as_str().ok_or_else(|| f.err("layer_types", format!("holds {v}; expected strings"))))
                .collect::<Result<_>>()?,
        ),
        Some(v) => {
            return Err(f.err("layer_types", format!("is {v}; expected one entry per layer ({layers})")));
        }
    };
    let uses_window = match arch {
        // A window of null is full attention.
        Arch::Mistral | Arch::Mixtral => window.is_some(),
        Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen2Moe => f.bool("use_sliding_window")?.unwrap_or(false),
        Arch::Llama => false,
    };
    (0..layers)
        .map(|l| {
            let kind = kinds.as_ref().map_or("", |k| k[l]);
            let sliding = match kind {
                "" => uses_window,
                "full_attention" => false,
                "sliding_attention" => true,
                other => {
                    return Err(f.err(
                        &format!("layer_types[{l}]"),
                        format!("is {other:?}; expected full_attention or sliding_attention"),
                    ));
                }
            };
            match (sliding && uses_window, window) {
                (true, Some(w)) => Ok(Some(w)),
                (true, None) => Err(f.err("sliding_window", "is missing but a layer uses sliding attention".into())),
                (false, _) => Ok(None),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &str = r#"{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu", "max_position_embeddings": 256,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}, "tie_word_embeddings": true,
        "dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": [2, 3]}"#;

    #[test]
    fn a_llama3_config_reads_whole() {
        let c = ModelConfig::parse(LLAMA, "config.json").unwrap();
        assert_eq!((c.hidden, c.heads, c.kv_heads, c.head_dim, c.layers), (64, 4, 2, 16, 2));
        assert_eq!(c.rope.base, Some(500000.0));
        assert!(matches!(c.rope.scaling, Some(RopeScaling::Llama3 { original_max_position: 64, .. })));
        assert!(c.tied && !c.qkv_bias && !c.qk_norm);
        assert_eq!((c.dtype, c.bos, c.eos.clone()), (Some(DType::BF16), Some(1), vec![2, 3]));
        assert_eq!(c.windows, vec![None, None]);
    }

    #[test]
    fn the_older_rope_scaling_spelling_reads_the_same() {
        let old = LLAMA.replace(
            r#""rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0,"#,
            r#""rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3","#,
        );
        assert_eq!(ModelConfig::parse(&old, "c").unwrap(), ModelConfig::parse(LLAMA, "c").unwrap());
    }

    #[test]
    fn what_this_code_does_not_run_is_refused_with_the_field_and_value() {
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
            let err = ModelConfig::parse(&text, "m/config.json").unwrap_err().to_string();
            assert!(err.starts_with("m/config.json: ") && err.contains(want), "{err}");
        }
    }

    #[test]
    fn mistral_windows_every_layer_and_qwen_only_the_marked_ones() {
        let m = r#"{"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "sliding_window": 4}"#;
        assert_eq!(ModelConfig::parse(m, "c").unwrap().windows, vec![Some(4), Some(4)]);
        let q = r#"{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "sliding_window": 8,
            "use_sliding_window": true, "layer_types": ["full_attention", "sliding_attention"]}"#;
        let c = ModelConfig::parse(q, "c").unwrap();
        assert_eq!(c.windows, vec![None, Some(8)]);
        assert!(c.qkv_bias && !c.o_bias);
        let off = q.replace(r#""use_sliding_window": true"#, r#""use_sliding_window": false"#);
        assert_eq!(ModelConfig::parse(&off, "c").unwrap().windows, vec![None, None]);
    }
}
