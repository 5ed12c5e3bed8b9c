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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;

use super::config::Fields;
use super::forward::OpStats;
pub use super::pass::Affine;
use super::pass::Dispatcher;
use super::weights::Take;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::args::{AttentionArgs, OpArgs, PatchEmbedArgs};
use crate::model::attrs::{AttentionAttrs, PatchEmbedAttrs};
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::runtime::LayerZero;
use crate::tensor::Residence;
use crate::tensor::{HostTensor, row_major_strides};
use crate::transform::Transform;

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
        let c = VitConfig::parse(&crate::files::read_to_string(&path)?, &path.display().to_string())?;
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

/// What a forward pass produced.
#[derive(Debug, Clone)]
pub struct Classified {
    /// The CLS row after the final LayerNorm `[1, D]`.
    pub pooled: HostTensor,
    /// The classifier's logits `[1, labels]` (none for a bare `ViTModel`).
    pub logits: Option<Vec<f32>>,
    /// Wall time, ns.
    pub ns: u64,
    /// Per op, what ran.
    pub stats: BTreeMap<Op, OpStats>,
    /// With `dump`: every stage (`patch_embed`, `hidden.{i}`, `layer.{l}.*`, `final_norm`,
    /// `pooled`, `logits`).
    pub dump: BTreeMap<String, HostTensor>,
    /// What ran the patch embedding: the kernel and the adaptations applied for it (an NCHW
    /// image relaid out for a channels-last kernel, with its modeled cost).
    pub patch_embed: Option<(String, Vec<Transform>)>,
}

/// Runs `image` (`[1, C, H, W]` tagged NCHW, or `[1, H, W, C]` tagged NHWC, in the model's
/// dtype or any float dtype) through the model.
pub fn classify(model: &VitModel, lz: &LayerZero, image: &HostTensor, dump: bool) -> Result<Classified> {
    let c = &model.config;
    let (d, n, s) = (c.hidden, c.patches(), c.image_size);
    let want: [usize; 4] = match image.layout() {
        Some(Layout::Nhwc) => [1, s, s, c.channels],
        _ => [1, c.channels, s, s],
    };
    if image.shape() != want {
        return Err(Error::invalid(format!(
            "the image has shape {:?}; the model takes {want:?} ({} channels of {s}x{s}, config.json `image_size`)",
            image.shape(),
            c.channels
        )));
    }
    let image = if image.dtype() == model.dtype {
        image.clone()
    } else {
        HostTensor::from_f32_as(model.dtype, image.shape(), &image.to_f32_vec())?
            .with_layout(image.layout().unwrap_or(Layout::Nchw))
    };
    let mut pass = Dispatcher::new(lz, dump);
    let mut patch_embed = None;
    let start = Instant::now();
    let result = rayon::scope(|_| -> Result<(HostTensor, Option<Vec<f32>>)> {
        let ran = pass.dispatch(&OpArgs::PatchEmbed(PatchEmbedArgs {
            image,
            weight: model.patch.weight.clone(),
            bias: Some(model.patch.bias.clone()),
            attrs: PatchEmbedAttrs { patch: c.patch as u64 },
        }))?;
        patch_embed = Some((ran.selection().kernel.clone(), ran.selection().transforms.clone()));
        let mut outs = ran.outputs;
        let patches = outs.remove("out").ok_or_else(|| Error::invalid("patch_embed produced no `out`".to_owned()))?;
        let patches = patches.view(&[n, d], &row_major_strides(&[n, d]), patches.offset())?;
        pass.keep(|| "patch_embed".into(), &patches);
        // [CLS; patches]: a copy into one buffer (data movement, as a KV cache write).
        let mut x = HostTensor::zeros(model.dtype, &[n + 1, d])?;
        x.write_at(0, &model.cls)?;
        x.write_at(d, &patches.contiguous())?;
        let mut branch = x;
        let mut stream = model.positions.clone();
        for (l, layer) in model.layers.iter().enumerate() {
            let (h, res) = pass.layer_norm(branch, &layer.attn_norm, Some(stream), c.eps)?;
            pass.keep(|| format!("hidden.{l}"), &res);
            if l > 0 {
                pass.keep(|| format!("layer.{}.out", l - 1), &res);
            }
            pass.keep(|| format!("layer.{l}.attn_norm"), &h);
            let hd = d / c.heads;
            let q = pass.linear(&h, &layer.q)?;
            let k = pass.linear(&h, &layer.k)?;
            let v = pass.linear(&h, &layer.v)?;
            let heads = |t: &HostTensor| -> Result<HostTensor> {
                Ok(t.view(&[1, n + 1, c.heads, hd], &row_major_strides(&[1, n + 1, c.heads, hd]), t.offset())?
                    .with_layout(Layout::Bshd))
            };
            let a = pass.out(OpArgs::Attention(AttentionArgs {
                q: heads(&q)?,
                k: heads(&k)?,
                v: heads(&v)?,
                mask: None,
                cu_seqlens_q: None,
                cu_seqlens_k: None,
                attrs: AttentionAttrs::default(),
            }))?;
            let a = if a.is_contiguous() { a } else { a.contiguous() };
            let a = a.view(&[n + 1, d], &[d, 1], a.offset())?;
            pass.keep(|| format!("layer.{l}.attn_out"), &a);
            let o = pass.linear(&a, &layer.o)?;
            pass.keep(|| format!("layer.{l}.o_proj"), &o);
            let (f, post) = pass.layer_norm(o, &layer.ffn_norm, Some(res), c.eps)?;
            pass.keep(|| format!("layer.{l}.post_attn"), &post);
            pass.keep(|| format!("layer.{l}.ffn_norm"), &f);
            let g = pass.linear(&f, &layer.fc1)?;
            let g = pass.gelu(g)?;
            let out = pass.linear(&g, &layer.fc2)?;
            pass.keep(|| format!("layer.{l}.ffn_out"), &out);
            branch = out;
            stream = post;
        }
        let (normed, last) = pass.layer_norm(branch, &model.norm, Some(stream), c.eps)?;
        pass.keep(|| format!("hidden.{}", c.layers), &last);
        pass.keep(|| format!("layer.{}.out", c.layers - 1), &last);
        pass.keep(|| "final_norm".into(), &normed);
        let pooled = normed.view(&[1, d], &[d, 1], normed.offset())?;
        pass.keep(|| "pooled".into(), &pooled);
        let logits = match &model.classifier {
            Some(cls) => {
                let l = pass.linear(&pooled, cls)?;
                pass.keep(|| "logits".into(), &l);
                Some(l.to_f32_vec())
            }
            None => None,
        };
        Ok((pooled, logits))
    })?;
    Ok(Classified {
        pooled: result.0,
        logits: result.1,
        ns: start.elapsed().as_nanos() as u64,
        stats: pass.stats,
        dump: pass.dump.unwrap_or_default(),
        patch_embed,
    })
}

/// Preprocessing of 8-bit images: `(u8 * rescale - mean[c]) / std[c]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Preprocess {
    /// `rescale_factor` (1/255).
    pub rescale: f64,
    /// `image_mean` per channel.
    pub mean: Vec<f64>,
    /// `image_std` per channel.
    pub std: Vec<f64>,
}

impl Preprocess {
    /// `dir/preprocessor_config.json`, or ViT's defaults (mean 0.5, std 0.5, 1/255) when the
    /// folder has none. Resizing is not done: images must have the model's size.
    pub fn load(dir: &Path, channels: usize) -> Result<Preprocess> {
        let path = dir.join("preprocessor_config.json");
        let default = Preprocess { rescale: 1.0 / 255.0, mean: vec![0.5; channels], std: vec![0.5; channels] };
        if !path.exists() {
            return Ok(default);
        }
        let origin = path.display().to_string();
        let value: Value = serde_json::from_str(&crate::files::read_to_string(&path)?)
            .map_err(|e| Error::invalid(format!("{origin}: invalid JSON: {e}")))?;
        let map = value.as_object().ok_or_else(|| Error::invalid(format!("{origin}: not a JSON object")))?;
        let f = Fields { map, origin: &origin };
        let per_channel = |name: &str, fallback: &[f64]| -> Result<Vec<f64>> {
            match f.get(name) {
                None => Ok(fallback.to_vec()),
                Some(Value::Array(a)) if a.len() == channels => a
                    .iter()
                    .map(|x| x.as_f64().ok_or_else(|| f.err(name, format!("holds {x}; expected numbers"))))
                    .collect(),
                Some(Value::Number(x)) => Ok(vec![x.as_f64().unwrap_or(0.0); channels]),
                Some(v) => Err(f.err(name, format!("is {v}; expected {channels} numbers"))),
            }
        };
        let on = |name: &str| -> Result<bool> { Ok(f.bool(name)?.unwrap_or(true)) };
        let p = Preprocess {
            rescale: if on("do_rescale")? { f.f64("rescale_factor")?.unwrap_or(1.0 / 255.0) } else { 1.0 },
            mean: if on("do_normalize")? { per_channel("image_mean", &default.mean)? } else { vec![0.0; channels] },
            std: if on("do_normalize")? { per_channel("image_std", &default.std)? } else { vec![1.0; channels] },
        };
        if let Some(i) = p.std.iter().position(|&s| s == 0.0) {
            return Err(f.err("image_std", format!("is 0 for channel {i}")));
        }
        Ok(p)
    }

    /// Channels-last `[1, H, W, C]` f32 values of `rgb` (H·W·C bytes, row by row).
    pub fn apply(&self, rgb: &[u8], (h, w, c): (usize, usize, usize)) -> Result<HostTensor> {
        // (u8 - mean / rescale) / (std / rescale): transformers' fused form, rounded once.
        let v: Vec<f32> = rgb
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let ch = i % c;
                ((f64::from(x) - self.mean[ch] / self.rescale) / (self.std[ch] / self.rescale)) as f32
            })
            .collect();
        Ok(HostTensor::from_f32(&[1, h, w, c], v)?.with_layout(Layout::Nhwc))
    }
}

/// Reads an image for `model`: `pixel_values` from a safetensors file (channels-first,
/// `[1, C, H, W]` or `[C, H, W]`), or a binary PPM (P6, 8-bit) or PNG (8-bit RGB, RGBA or
/// gray) preprocessed by `pre` into channels-last.
pub fn read_image(path: &Path, model: &VitModel, pre: &Preprocess) -> Result<HostTensor> {
    let c = &model.config;
    let origin = path.display().to_string();
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or_default().to_ascii_lowercase();
    let (rgb, h, w) = match ext.as_str() {
        "safetensors" => {
            let mut t = crate::tensor::io::read(path)?;
            let names: Vec<String> = t.keys().cloned().collect();
            // `pixel_values`, or the file's only tensor.
            let only = if names.len() == 1 { names.first().cloned() } else { None };
            let x = t
                .remove("pixel_values")
                .or_else(|| only.and_then(|n| t.remove(&n)))
                .ok_or_else(|| Error::invalid(format!("{origin}: no tensor `pixel_values` (it holds {names:?})")))?;
            let x = match x.shape() {
                [ch, hh, ww] => x.view(&[1, *ch, *hh, *ww], &row_major_strides(&[1, *ch, *hh, *ww]), x.offset())?,
                [1, _, _, _] => x,
                s => {
                    return Err(Error::invalid(format!(
                        "{origin}: `pixel_values` has shape {s:?}; expected [1, C, H, W] or [C, H, W]"
                    )));
                }
            };
            return Ok(x.with_layout(Layout::Nchw));
        }
        "ppm" => read_ppm(&crate::files::read(path)?, &origin)?,
        "png" => read_png(&crate::files::read(path)?, &origin)?,
        other => {
            return Err(Error::invalid(format!(
                "{origin}: images are .png, .ppm or .safetensors (pixel_values); not {other:?}"
            )));
        }
    };
    if (h, w) != (c.image_size, c.image_size) || c.channels != 3 {
        return Err(Error::invalid(format!(
            "{origin} is {w}x{h}; the model takes {s}x{s} images of {} channels (config.json `image_size`; resize it first)",
            c.channels,
            s = c.image_size
        )));
    }
    pre.apply(&rgb, (h, w, 3))
}

/// A binary PPM (P6, maxval 255): its RGB bytes, height, width.
fn read_ppm(bytes: &[u8], origin: &str) -> Result<(Vec<u8>, usize, usize)> {
    let bad = |what: &str| Error::invalid(format!("{origin}: not a binary PPM (P6): {what}"));
    let mut fields = Vec::with_capacity(4);
    let mut i = 0;
    while fields.len() < 4 {
        // Whitespace and comments separate the header's fields.
        while i < bytes.len() && (bytes[i].is_ascii_whitespace() || bytes[i] == b'#') {
            if bytes[i] == b'#' {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            i += 1;
        }
        let start = i;
        while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if start == i {
            return Err(bad("the header ends early"));
        }
        fields.push(std::str::from_utf8(&bytes[start..i]).map_err(|_| bad("the header is not text"))?.to_owned());
    }
    if fields[0] != "P6" {
        return Err(bad(&format!("magic {:?}", fields[0])));
    }
    let num = |s: &str, what: &str| s.parse::<usize>().map_err(|_| bad(&format!("{what} {s:?}")));
    let (w, h, max) = (num(&fields[1], "width")?, num(&fields[2], "height")?, num(&fields[3], "maxval")?);
    if max != 255 {
        return Err(bad(&format!("maxval {max}; only 8-bit (255) images are read")));
    }
    // One whitespace byte ends the header.
    let data = bytes.get(i + 1..).ok_or_else(|| bad("no pixel data"))?;
    let n = w.checked_mul(h).and_then(|x| x.checked_mul(3)).ok_or_else(|| bad("the size overflows"))?;
    if data.len() < n {
        return Err(bad(&format!("{} bytes of pixels for {w}x{h} RGB ({n} needed)", data.len())));
    }
    Ok((data[..n].to_vec(), h, w))
}

/// An 8-bit PNG as RGB bytes (gray expanded, alpha dropped), height, width.
fn read_png(bytes: &[u8], origin: &str) -> Result<(Vec<u8>, usize, usize)> {
    let bad = |e: String| Error::new(ErrorKind::InvalidInput, format!("{origin}: not a readable PNG: {e}"));
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(|e| bad(e.to_string()))?;
    let size = reader.output_buffer_size().ok_or_else(|| bad("the image is too large".to_owned()))?;
    let mut buf = vec![0u8; size];
    let info = reader.next_frame(&mut buf).map_err(|e| bad(e.to_string()))?;
    let (w, h) = (info.width as usize, info.height as usize);
    let px = &buf[..info.buffer_size()];
    let rgb: Vec<u8> = match info.color_type {
        png::ColorType::Rgb => px.to_vec(),
        png::ColorType::Rgba => px.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect(),
        png::ColorType::Grayscale => px.iter().flat_map(|&g| [g, g, g]).collect(),
        png::ColorType::GrayscaleAlpha => px.chunks_exact(2).flat_map(|p| [p[0], p[0], p[0]]).collect(),
        png::ColorType::Indexed => return Err(bad("an indexed image was not expanded".to_owned())),
    };
    Ok((rgb, h, w))
}
