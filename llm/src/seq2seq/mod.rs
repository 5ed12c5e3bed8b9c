//! Encoder-decoder models: `BartForConditionalGeneration`. The config and weights are read
//! here, refused by field where they ask for what this code does not do; the forward pass
//! (encoder once per input, decoder with separate self- and cross-attention caches) is in
//! [`forward`].

pub mod forward;

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::config::Fields;
use super::pass::Affine;
use super::weights::Take;
use layerzero::error::{Error, Result};
use layerzero::model::dtype::DType;
use layerzero::tensor::HostTensor;
use layerzero::tensor::Residence;

pub use forward::{Seq2SeqGenerated, encode, generate};

/// What the forward pass needs to know about a BART.
#[derive(Debug, Clone, PartialEq)]
pub struct Seq2SeqConfig {
    /// Model width.
    pub d_model: usize,
    /// Encoder layers.
    pub encoder_layers: usize,
    /// Decoder layers.
    pub decoder_layers: usize,
    /// Encoder attention heads.
    pub encoder_heads: usize,
    /// Decoder attention heads.
    pub decoder_heads: usize,
    /// Encoder MLP inner size.
    pub encoder_ffn: usize,
    /// Decoder MLP inner size.
    pub decoder_ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Learned positions (the tables hold 2 more rows: BART's offset).
    pub max_positions: usize,
    /// The token that starts every decoder sequence.
    pub decoder_start: u32,
    /// Padding token (batches are right-padded with it).
    pub pad: u32,
    /// End-of-sequence tokens.
    pub eos: Vec<u32>,
    /// The LM head is the shared embedding table.
    pub tied: bool,
    /// The weights' dtype as the config states it.
    pub dtype: Option<DType>,
}

/// BART's learned positions start at row 2 of their tables.
pub const POSITION_OFFSET: usize = 2;

/// LayerNorm epsilon (`nn.LayerNorm`'s default; BART's config has no field for it).
pub const EPS: f64 = 1e-5;

impl Seq2SeqConfig {
    /// Parses `config.json` text of a `bart` model (`origin` names the file in errors).
    pub fn parse(text: &str, origin: &str) -> Result<Seq2SeqConfig> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
        let map = value.as_object().ok_or_else(|| Error::invalid(format!("{origin}: not a JSON object")))?;
        let f = Fields { map, origin };
        match f.str("model_type")? {
            Some("bart") => {}
            other => {
                return Err(f.err("model_type", format!("is {other:?}; LayerZero runs the encoder-decoder \"bart\"")));
            }
        }
        if let Some(archs) = f.get("architectures").and_then(Value::as_array)
            && !archs.iter().any(|a| a.as_str() == Some("BartForConditionalGeneration"))
        {
            return Err(f.err(
                "architectures",
                format!("is {}; a bart config runs as BartForConditionalGeneration", Value::Array(archs.clone())),
            ));
        }
        let act = f.str("activation_function")?.unwrap_or("gelu");
        if act != "gelu" {
            return Err(
                f.err("activation_function", format!("is {act:?}; LayerZero's BART uses the exact GELU (\"gelu\")"))
            );
        }
        // mBART's pre-norm layers and final norms, and scaled embeddings, are other models.
        for (field, what) in [
            ("scale_embedding", "embeddings scaled by sqrt(d_model)"),
            ("normalize_before", "pre-norm layers"),
            ("add_final_layer_norm", "final layer norms"),
        ] {
            if f.bool(field)? == Some(true) {
                return Err(f.err(field, format!("is true; {what} are not implemented (BART's are false)")));
            }
        }
        let d_model = f.usize("d_model")?;
        let heads = |field: &str| -> Result<usize> {
            let h = f.usize(field)?;
            if d_model % h != 0 {
                return Err(f.err(field, format!("is {h}; it must divide d_model ({d_model})")));
            }
            Ok(h)
        };
        let token = |name: &str| -> Result<Option<u32>> {
            match f.get(name) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| f.err(name, format!("is {v}; expected a token id"))),
            }
        };
        let dtype = f.dtype()?;
        Ok(Seq2SeqConfig {
            d_model,
            encoder_layers: f.usize("encoder_layers")?,
            decoder_layers: f.usize("decoder_layers")?,
            encoder_heads: heads("encoder_attention_heads")?,
            decoder_heads: heads("decoder_attention_heads")?,
            encoder_ffn: f.usize("encoder_ffn_dim")?,
            decoder_ffn: f.usize("decoder_ffn_dim")?,
            vocab: f.usize("vocab_size")?,
            max_positions: f.usize("max_position_embeddings")?,
            decoder_start: token("decoder_start_token_id")?
                .ok_or_else(|| f.err("decoder_start_token_id", "is missing".into()))?,
            pad: token("pad_token_id")?.unwrap_or(1),
            eos: token("eos_token_id")?.into_iter().collect(),
            tied: f.bool("tie_word_embeddings")?.unwrap_or(true),
            dtype,
        })
    }
}

/// A LayerNorm's scale and shift.
pub type Norm = Affine;

/// A projection and its bias.
pub type Proj = Affine;

/// An attention block's projections.
#[derive(Debug, Clone)]
pub struct Attn {
    /// q_proj.
    pub q: Proj,
    /// k_proj.
    pub k: Proj,
    /// v_proj.
    pub v: Proj,
    /// out_proj.
    pub o: Proj,
}

/// One layer: self-attention, cross-attention (decoder only) and the MLP, each followed by
/// its LayerNorm of the residual sum.
#[derive(Debug, Clone)]
pub struct Layer {
    /// self_attn.
    pub self_attn: Attn,
    /// self_attn_layer_norm.
    pub self_ln: Norm,
    /// encoder_attn and encoder_attn_layer_norm (decoder layers).
    pub cross: Option<(Attn, Norm)>,
    /// fc1 `[ffn, d]`.
    pub fc1: Proj,
    /// fc2 `[d, ffn]`.
    pub fc2: Proj,
    /// final_layer_norm.
    pub ffn_ln: Norm,
}

/// Every weight of a BART, in the compute dtype.
#[derive(Debug, Clone)]
pub struct Seq2SeqWeights {
    /// The token table both stacks share `[V, d]`.
    pub shared: HostTensor,
    /// Encoder positions `[max + 2, d]`.
    pub enc_pos: HostTensor,
    /// Decoder positions `[max + 2, d]`.
    pub dec_pos: HostTensor,
    /// Encoder layernorm_embedding.
    pub enc_ln: Norm,
    /// Decoder layernorm_embedding.
    pub dec_ln: Norm,
    /// Encoder layers.
    pub encoder: Vec<Layer>,
    /// Decoder layers.
    pub decoder: Vec<Layer>,
    /// The LM head `[V, d]` (the shared table when tied).
    pub lm_head: HostTensor,
    /// final_logits_bias `[V]` (zeros when the file has none).
    pub logits_bias: HostTensor,
}

fn proj(t: &mut Take<'_>, name: &str, out: usize, inp: usize) -> Result<Proj> {
    Ok(Proj { weight: t.take(&format!("{name}.weight"), &[out, inp])?, bias: t.take(&format!("{name}.bias"), &[out])? })
}

fn norm(t: &mut Take<'_>, name: &str, d: usize) -> Result<Norm> {
    Ok(Norm { weight: t.take(&format!("{name}.weight"), &[d])?, bias: t.take(&format!("{name}.bias"), &[d])? })
}

fn attn(t: &mut Take<'_>, name: &str, d: usize) -> Result<Attn> {
    Ok(Attn {
        q: proj(t, &format!("{name}.q_proj"), d, d)?,
        k: proj(t, &format!("{name}.k_proj"), d, d)?,
        v: proj(t, &format!("{name}.v_proj"), d, d)?,
        o: proj(t, &format!("{name}.out_proj"), d, d)?,
    })
}

fn layer(t: &mut Take<'_>, prefix: &str, d: usize, ffn: usize, cross: bool) -> Result<Layer> {
    let p = |s: &str| format!("{prefix}.{s}");
    Ok(Layer {
        self_attn: attn(t, &p("self_attn"), d)?,
        self_ln: norm(t, &p("self_attn_layer_norm"), d)?,
        cross: if cross {
            Some((attn(t, &p("encoder_attn"), d)?, norm(t, &p("encoder_attn_layer_norm"), d)?))
        } else {
            None
        },
        fc1: proj(t, &p("fc1"), ffn, d)?,
        fc2: proj(t, &p("fc2"), d, ffn)?,
        ffn_ln: norm(t, &p("final_layer_norm"), d)?,
    })
}

/// A loaded encoder-decoder model.
#[derive(Debug, Clone)]
pub struct Seq2SeqModel {
    /// The folder it was read from.
    pub dir: PathBuf,
    /// The config.
    pub config: Seq2SeqConfig,
    /// The weights.
    pub weights: Seq2SeqWeights,
    /// The dtype every op computes in.
    pub dtype: DType,
}

impl Seq2SeqModel {
    /// Loads `dir` (`config.json`, `*.safetensors`), computing in `dtype` (`None`: stored).
    pub fn load(dir: &Path, dtype: Option<DType>) -> Result<Seq2SeqModel> {
        let path = dir.join("config.json");
        let c = Seq2SeqConfig::parse(&layerzero::files::read_to_string(&path)?, &path.display().to_string())?;
        let (mut t, stored) = Take::open(dir, dtype, Residence::Resident)?;
        let (d, v, positions) = (c.d_model, c.vocab, c.max_positions + POSITION_OFFSET);
        let shared = t.take("model.shared.weight", &[v, d])?;
        // Checkpoints may also store the tables tied to the shared one.
        for copy in ["model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"] {
            t.skip(copy);
        }
        let enc_pos = t.take("model.encoder.embed_positions.weight", &[positions, d])?;
        let dec_pos = t.take("model.decoder.embed_positions.weight", &[positions, d])?;
        let enc_ln = norm(&mut t, "model.encoder.layernorm_embedding", d)?;
        let dec_ln = norm(&mut t, "model.decoder.layernorm_embedding", d)?;
        let encoder = (0..c.encoder_layers)
            .map(|l| layer(&mut t, &format!("model.encoder.layers.{l}"), d, c.encoder_ffn, false))
            .collect::<Result<Vec<_>>>()?;
        let decoder = (0..c.decoder_layers)
            .map(|l| layer(&mut t, &format!("model.decoder.layers.{l}"), d, c.decoder_ffn, true))
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if c.tied {
            t.skip("lm_head.weight");
            shared.clone()
        } else {
            t.take("lm_head.weight", &[v, d])?
        };
        let compute = t.compute;
        let logits_bias = if t.has("final_logits_bias") {
            let b = t.take("final_logits_bias", &[1, v])?;
            b.view(&[v], &[1], b.offset())?
        } else {
            HostTensor::zeros(compute, &[v])?
        };
        t.finish(&format!("a BART of {} encoder and {} decoder layers", c.encoder_layers, c.decoder_layers))?;
        let weights =
            Seq2SeqWeights { shared, enc_pos, dec_pos, enc_ln, dec_ln, encoder, decoder, lm_head, logits_bias };
        Ok(Seq2SeqModel { dir: dir.to_path_buf(), config: c, weights, dtype: dtype.unwrap_or(stored) })
    }
}

/// The `model_type` of the folder's `config.json` (to tell decoders from encoder-decoders).
pub fn model_type(dir: &Path) -> Result<String> {
    let path = dir.join("config.json");
    let origin = path.display().to_string();
    let value: Value = serde_json::from_str(&layerzero::files::read_to_string(&path)?)
        .map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
    Ok(value.get("model_type").and_then(Value::as_str).unwrap_or_default().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    const BART: &str = r#"{"model_type": "bart", "architectures": ["BartForConditionalGeneration"], "d_model": 64,
        "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
        "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 256, "max_position_embeddings": 64,
        "activation_function": "gelu", "decoder_start_token_id": 2, "pad_token_id": 1, "eos_token_id": 2,
        "scale_embedding": false}"#;

    #[test]
    fn a_bart_config_reads_whole() -> TestResult {
        let c = Seq2SeqConfig::parse(BART, "c")?;
        assert_eq!((c.d_model, c.encoder_heads, c.decoder_ffn, c.decoder_start, c.pad), (64, 4, 128, 2, 1));
        assert!(c.tied);
        Ok(())
    }

    #[test]
    fn what_this_code_does_not_run_is_refused_with_the_field_and_value() -> TestResult {
        for (from, to, want) in [
            (r#""gelu""#, r#""relu""#, "`activation_function` is \"relu\""),
            (r#""scale_embedding": false"#, r#""scale_embedding": true"#, "`scale_embedding` is true"),
            (r#""encoder_attention_heads": 4"#, r#""encoder_attention_heads": 5"#, "`encoder_attention_heads` is 5"),
            (r#""bart""#, r#""t5""#, "`model_type` is Some(\"t5\")"),
        ] {
            let err = Seq2SeqConfig::parse(&BART.replace(from, to), "m/config.json").unwrap_err().to_string();
            assert!(err.starts_with("m/config.json: ") && err.contains(want), "{err}");
        }
        Ok(())
    }
}
