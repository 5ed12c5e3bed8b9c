//! Images for a ViT: a `pixel_values` safetensors file (already preprocessed,
//! channels-first), or a binary PPM (P6) or PNG of the model's image size, preprocessed as
//! `preprocessor_config.json` says into a channels-last tensor.

use std::path::Path;

use serde_json::Value;

use super::VitModel;
use crate::config::Fields;
use layerzero::error::{Error, ErrorKind, Result};
use layerzero::model::layout::Layout;
use layerzero::tensor::{HostTensor, row_major_strides};

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
        let value: Value = serde_json::from_str(&layerzero::files::read_to_string(&path)?)
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
            let mut t = layerzero::tensor::io::read(path)?;
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
        "ppm" => read_ppm(&layerzero::files::read(path)?, &origin)?,
        "png" => read_png(&layerzero::files::read(path)?, &origin)?,
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
