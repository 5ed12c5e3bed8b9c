//! `lz classify`: an image through a Vision Transformer, every op selected and dispatched.

use super::args::ClassifyCmd;
use super::{Outcome, print_json};
use layerzero::error::{Error, ErrorKind, Result};
use layerzero::runtime::LayerZero;
use layerzero::tensor::io;
use layerzero_llm as llm;

/// `lz classify`: an image through a ViT.
pub(super) fn classify(a: ClassifyCmd) -> Result<Outcome> {
    let dtype = super::generate::parse_dtype(a.dtype.as_deref())?;
    let model = llm::vit::VitModel::load(&a.model, dtype)?;
    let pre = llm::vit::Preprocess::load(&a.model, model.config.channels)?;
    let image = llm::vit::read_image(&a.image, &model, &pre)?;
    let lz = LayerZero::host()?;
    let out = llm::vit::classify(&model, &lz, &image, a.dump.is_some())?;
    if let Some(dir) = &a.dump {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot create {}: {e}", dir.display())).with_source(e))?;
        io::write(&dir.join("dump.safetensors"), &out.dump)?;
    }
    let logits = out.logits.clone().ok_or_else(|| {
        Error::invalid(format!(
            "{}: the model has no classifier (a bare ViTModel); nothing to classify",
            a.model.display()
        ))
    })?;
    // Softmax in f64 for the printed probabilities.
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = logits.iter().map(|&l| f64::from(l - m).exp()).collect();
    let z: f64 = e.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&i, &j| logits[j].total_cmp(&logits[i]).then(i.cmp(&j)));
    let label = |i: usize| model.config.labels.get(i).cloned().unwrap_or_else(|| format!("{i}"));
    let top: Vec<serde_json::Value> = order
        .iter()
        .take(a.top.max(1))
        .map(|&i| serde_json::json!({"index": i, "label": label(i), "logit": logits[i], "probability": e[i] / z}))
        .collect();
    let layout = image.layout().map_or("NCHW", |l| l.as_str());
    if a.json {
        print_json(&serde_json::json!({
            "model": a.model.display().to_string(),
            "arch": "vit",
            "dtype": model.dtype,
            "image": a.image.display().to_string(),
            "image_layout": layout,
            "patch_embed": out.patch_embed.as_ref().map(|(kernel, transforms)| serde_json::json!({
                "kernel": kernel,
                "transforms": transforms,
            })),
            "top": top,
            "logits": logits,
            "timing": {"ms": out.ns as f64 / 1e6},
            "ops": super::generate::ops_json(&out.stats),
            "counters": lz.counters(),
            "dump": a.dump.as_ref().map(|d| d.join("dump.safetensors").display().to_string()),
        }));
    } else {
        for t in &top {
            println!("{:>8.4}  {}", t["probability"].as_f64().unwrap_or(0.0), t["label"].as_str().unwrap_or_default());
        }
        let how = match &out.patch_embed {
            Some((kernel, t)) if !t.is_empty() => {
                let moved: u64 = t.iter().map(|t| t.bytes).sum();
                format!("; patch_embed ran {kernel} after relaying out the image ({moved} bytes moved)")
            }
            Some((kernel, _)) => format!("; patch_embed ran {kernel} on the image as given"),
            None => String::new(),
        };
        eprintln!("classified a {layout} image in {:.2} ms{how}", out.ns as f64 / 1e6);
    }
    Ok(Outcome::Ok)
}
