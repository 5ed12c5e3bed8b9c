//! Vision Transformers (`ViTForImageClassification`, `ViTModel`): the patch embedding
//! (`patch_embed`, whose kernels care whether the image is channels-first or channels-last),
//! pre-norm encoder blocks with LayerNorm and GELU, the final LayerNorm, the CLS row pooled
//! and the classifier; every op a dispatch.
//!
//! Each LayerNorm takes the residual stream fused (`layer_norm` with `residual`): the first
//! adds the position embeddings to `[CLS; patches]`, the others add each block's branch.
//!
//! Images: a `pixel_values` safetensors file (already preprocessed, channels-first), or a
//! binary PPM (P6) or PNG of the model's image size, preprocessed as `preprocessor_config.json`
//! says (`rescale_factor`, `image_mean`, `image_std`) into a channels-last tensor.

mod forward;
mod image;

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::config::Fields;
pub use super::pass::Affine;
use super::weights::Take;
use layerzero::error::{Error, Result};
use layerzero::model::dtype::DType;
use layerzero::tensor::HostTensor;
use layerzero::tensor::Residence;

pub use forward::{Classified, classify};
pub use image::{Preprocess, read_image};

/// What the forward pass needs to know about a ViT.
#[derive(Debug, Clone, PartialEq)]
pub struct VitConfig {
    /// Width D.
    pub hidden: usize,
    /// Encoder blocks.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// MLP inner size.
    pub intermediate: usize,
    /// Image side (square images).
    pub image_size: usize,
    /// Patch side P.
    pub patch: usize,
    /// Image channels C.
    pub channels: usize,
    /// LayerNorm epsilon.
    pub eps: f64,
    /// Class names by index (`id2label`), for a classifier.
    pub labels: Vec<String>,
    /// The weights' dtype as the config states it.
    pub dtype: Option<DType>,
}

impl VitConfig {
    /// Parses a `vit` `config.json` (`origin` names the file in errors).
    pub fn parse(text: &str, origin: &str) -> Result<VitConfig> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
        let map = value.as_object().ok_or_else(|| Error::invalid(format!("{origin}: not a JSON object")))?;
        let f = Fields { map, origin };
        match f.str("model_type")? {
            Some("vit") => {}
            other => return Err(f.err("model_type", format!("is {other:?}; LayerZero runs \"vit\" image models"))),
        }
        let act = f.str("hidden_act")?.unwrap_or("gelu");
        if act != "gelu" {
            return Err(f.err("hidden_act", format!("is {act:?}; LayerZero's ViT uses the exact GELU (\"gelu\")")));
        }
        if f.bool("qkv_bias")? == Some(false) {
            return Err(f.err("qkv_bias", "is false; ViT checkpoints have q/k/v biases".into()));
        }
        let hidden = f.usize("hidden_size")?;
        let heads = f.usize("num_attention_heads")?;
        if hidden % heads != 0 {
            return Err(f.err("num_attention_heads", format!("is {heads}; it must divide hidden_size ({hidden})")));
        }
        let (image_size, patch) = (f.usize("image_size")?, f.usize("patch_size")?);
        if image_size % patch != 0 {
            return Err(f.err("patch_size", format!("is {patch}; it must divide image_size ({image_size})")));
        }
        let labels = match f.get("id2label").and_then(Value::as_object) {
            None => Vec::new(),
            Some(m) => {
                let mut v: Vec<(usize, String)> = m
                    .iter()
                    .map(|(k, name)| {
                        let i = k.parse::<usize>().map_err(|_| f.err("id2label", format!("has the key {k:?}")))?;
                        Ok((i, name.as_str().unwrap_or_default().to_owned()))
                    })
                    .collect::<Result<_>>()?;
                v.sort();
                v.into_iter().map(|(_, n)| n).collect()
            }
        };
        let dtype = f.dtype()?;
        Ok(VitConfig {
            hidden,
            layers: f.usize("num_hidden_layers")?,
            heads,
            intermediate: f.usize("intermediate_size")?,
            image_size,
            patch,
            channels: f.opt_usize("num_channels")?.unwrap_or(3),
            eps: f.f64("layer_norm_eps")?.unwrap_or(1e-12),
            labels,
            dtype,
        })
    }

    /// Patches per image.
    pub fn patches(&self) -> usize {
        (self.image_size / self.patch).pow(2)
    }
}

/// One pre-norm encoder block.
#[derive(Debug, Clone)]
pub struct VitLayer {
    /// layernorm_before.
    pub attn_norm: Affine,
    /// query, key, value `[D, D]`.
    pub q: Affine,
    /// See `q`.
    pub k: Affine,
    /// See `q`.
    pub v: Affine,
    /// attention.output.dense.
    pub o: Affine,
    /// layernorm_after.
    pub ffn_norm: Affine,
    /// intermediate.dense `[I, D]`.
    pub fc1: Affine,
    /// output.dense `[D, I]`.
    pub fc2: Affine,
}

/// A loaded ViT.
#[derive(Debug, Clone)]
pub struct VitModel {
    /// The folder.
    pub dir: PathBuf,
    /// The config.
    pub config: VitConfig,
    /// The patch projection `[D, C, P, P]` and its bias.
    pub patch: Affine,
    /// The CLS token `[D]`.
    pub cls: HostTensor,
    /// Position embeddings `[N + 1, D]`.
    pub positions: HostTensor,
    /// The blocks.
    pub layers: Vec<VitLayer>,
    /// The final LayerNorm.
    pub norm: Affine,
    /// The classifier `[labels, D]` (absent for a bare `ViTModel`).
    pub classifier: Option<Affine>,
    /// The compute dtype.
    pub dtype: DType,
}

fn affine(t: &mut Take<'_>, name: &str, shape: &[usize]) -> Result<Affine> {
    Ok(Affine {
        weight: t.take(&format!("{name}.weight"), shape)?,
        bias: t.take(&format!("{name}.bias"), &shape[..1])?,
    })
}

impl VitModel {
    /// Loads `dir` (`config.json`, `*.safetensors`), computing in `dtype` (`None`: stored).
    pub fn load(dir: &Path, dtype: Option<DType>) -> Result<VitModel> {
        let path = dir.join("config.json");
        let c = VitConfig::parse(&layerzero::files::read_to_string(&path)?, &path.display().to_string())?;
        let (mut t, stored) = Take::open(dir, dtype, Residence::Resident)?;
        let (d, n) = (c.hidden, c.patches());
        // `ViTForImageClassification` prefixes the encoder with `vit.`; a bare `ViTModel` does not.
        let prefix = if t.has("vit.embeddings.cls_token") { "vit." } else { "" };
        let p = |s: &str| format!("{prefix}{s}");
        let patch = affine(&mut t, &p("embeddings.patch_embeddings.projection"), &[d, c.channels, c.patch, c.patch])?;
        let cls = t.take(&p("embeddings.cls_token"), &[1, 1, d])?;
        let cls = cls.view(&[d], &[1], cls.offset())?;
        let positions = t.take(&p("embeddings.position_embeddings"), &[1, n + 1, d])?;
        let positions = positions.view(&[n + 1, d], &[d, 1], positions.offset())?;
        let layers = (0..c.layers)
            .map(|l| {
                let q = |s: &str| p(&format!("encoder.layer.{l}.{s}"));
                Ok(VitLayer {
                    attn_norm: affine(&mut t, &q("layernorm_before"), &[d])?,
                    q: affine(&mut t, &q("attention.attention.query"), &[d, d])?,
                    k: affine(&mut t, &q("attention.attention.key"), &[d, d])?,
                    v: affine(&mut t, &q("attention.attention.value"), &[d, d])?,
                    o: affine(&mut t, &q("attention.output.dense"), &[d, d])?,
                    ffn_norm: affine(&mut t, &q("layernorm_after"), &[d])?,
                    fc1: affine(&mut t, &q("intermediate.dense"), &[c.intermediate, d])?,
                    fc2: affine(&mut t, &q("output.dense"), &[d, c.intermediate])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = affine(&mut t, &p("layernorm"), &[d])?;
        let classifier = if t.has("classifier.weight") {
            let labels = c.labels.len().max(1);
            Some(affine(&mut t, "classifier", &[labels, d])?)
        } else {
            None
        };
        // A bare ViTModel's pooler (dense + tanh) is not what the classifier reads.
        for name in [p("pooler.dense.weight"), p("pooler.dense.bias")] {
            t.skip(&name);
        }
        t.finish(&format!("a {}-layer ViT", c.layers))?;
        Ok(VitModel {
            dir: dir.to_path_buf(),
            config: c,
            patch,
            cls,
            positions,
            layers,
            norm,
            classifier,
            dtype: dtype.unwrap_or(stored),
        })
    }
}
