//! Vision Transformers (E2E §6.14): a tiny ViT classifier against HF transformers stage by
//! stage from every image form `lz classify` reads, channels-last and channels-first inputs
//! through the layout-sensitive patch embedding, and bad images refused by name.

use std::collections::BTreeMap;
use std::path::PathBuf;

use layerzero::LayerZero;
use layerzero::model::layout::Layout;
use layerzero::tensor::{HostTensor, io};
use layerzero_llm::vit::{self, Preprocess, VitModel};
use layerzero_tests::{TestResult, lz, repo_root};

fn dir() -> PathBuf {
    repo_root().join("tests/models/vit")
}

fn reference() -> TestResult<BTreeMap<String, HostTensor>> {
    Ok(io::read(&dir().join("reference.safetensors"))?)
}

#[test]
fn every_image_form_classifies_as_hf_does_at_every_stage() -> TestResult {
    let r = reference()?;
    let model = VitModel::load(&dir(), None)?;
    let pre = Preprocess::load(&dir(), 3)?;
    let lz = LayerZero::detected()?;
    for (file, layout) in
        [("image.ppm", Layout::Nhwc), ("image.png", Layout::Nhwc), ("image.safetensors", Layout::Nchw)]
    {
        let image = vit::read_image(&dir().join(file), &model, &pre).map_err(|e| format!("{file}: {e}"))?;
        assert_eq!(image.layout(), Some(layout), "{file}");
        let out = vit::classify(&model, &lz, &image, true).map_err(|e| format!("{file}: {e}"))?;
        let report = layerzero_llm::diff::diff(&out.dump, &r, 1e-5).map_err(|e| format!("{file}: {e}"))?;
        // The patch embedding, L + 1 hidden states, 7 stages per block, the final norm,
        // the pooled row and the logits.
        let layers = model.config.layers;
        assert_eq!(report.stages.len(), 1 + (layers + 1) + 7 * layers + 3, "{file}");
        assert!(report.ok(), "{file}: first divergence {:?}", report.first_divergence);
        let logits = out.logits.unwrap_or_default();
        let best = (0..logits.len()).max_by(|&i, &j| logits[i].total_cmp(&logits[j])).unwrap_or(usize::MAX);
        let hf = r["logits"].to_f64_vec();
        let hf_best = (0..hf.len()).max_by(|&i, &j| hf[i].total_cmp(&hf[j])).unwrap_or(usize::MAX);
        assert_eq!(best, hf_best, "{file}: the class HF predicts");
        assert!(out.stats.keys().any(|op| op.as_str() == "patch_embed"), "{file}: patch_embed dispatched");
    }
    Ok(())
}

#[test]
fn lz_classify_prints_the_classes_and_dumps_stages_lz_diff_accepts() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let out = lz()?
        .args(["classify", "--model"])
        .arg(dir())
        .arg("--image")
        .arg(dir().join("image.png"))
        .args(["--top", "3", "--json", "--dump"])
        .arg(tmp.path())
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let top = v["top"].as_array().cloned().unwrap_or_default();
    assert_eq!(top.len(), 3);
    assert_eq!(top[0]["label"], "LABEL_2", "the reference's prediction ({})", v["top"]);
    let p: Vec<f64> = top.iter().filter_map(|t| t["probability"].as_f64()).collect();
    assert!(p.windows(2).all(|w| w[0] >= w[1]) && p[0] < 1.0 && p[0] > 0.0);
    assert_eq!(v["image_layout"], "NHWC");
    // A channels-last image runs the channels-last kernel as given.
    assert_eq!(v["patch_embed"]["kernel"], "cpu.patch_embed.im2col");
    assert_eq!(v["patch_embed"]["transforms"], serde_json::json!([]));
    let diff = lz()?.arg("diff").arg(tmp.path()).arg(dir()).output()?;
    assert!(diff.status.success(), "{}", String::from_utf8_lossy(&diff.stdout));
    Ok(())
}

#[test]
fn a_channels_first_image_reaches_the_channels_last_kernel_through_a_costed_transform() -> TestResult {
    let model = VitModel::load(&dir(), None)?;
    let pre = Preprocess::load(&dir(), 3)?;
    let lz = LayerZero::detected()?;
    let run = |file: &str| -> TestResult<_> {
        let image = vit::read_image(&dir().join(file), &model, &pre)?;
        let out = vit::classify(&model, &lz, &image, false)?;
        Ok((out.patch_embed.ok_or_else(|| format!("{file}: no patch_embed ran"))?, out.logits.unwrap_or_default()))
    };
    let ((last_kernel, last_t), last_logits) = run("image.ppm")?;
    let ((first_kernel, first_t), first_logits) = run("image.safetensors")?;
    assert!(last_t.is_empty(), "NHWC needs no transform: {last_t:?}");
    if first_kernel == last_kernel {
        // The same kernel for NCHW: only through a relayout of the image, with its cost.
        assert_eq!(first_t.len(), 1, "NCHW transforms {first_t:?}");
        let t = &first_t[0];
        assert_eq!((t.tensor, t.from, t.to), ("image", "NCHW", "NHWC"));
        assert!(t.bytes == 2 * 3 * 32 * 32 * 4 && t.ns > 0.0, "{t:?}");
    } else {
        assert!(first_t.is_empty(), "a kernel that takes NCHW runs it as given");
    }
    for (a, b) in first_logits.iter().zip(&last_logits) {
        assert!((a - b).abs() < 1e-5, "the same image in either layout: {a} vs {b}");
    }
    Ok(())
}

#[test]
fn bad_images_are_refused_naming_the_file_and_what_is_wrong() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let ppm = std::fs::read(dir().join("image.ppm"))?;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "small.ppm",
            [b"P6\n16 16\n255\n".to_vec(), vec![0u8; 16 * 16 * 3]].concat(),
            "is 16x16; the model takes 32x32",
        ),
        ("short.ppm", ppm[..ppm.len() / 2].to_vec(), "bytes of pixels"),
        ("ascii.ppm", b"P3\n32 32\n255\n0 0 0".to_vec(), "magic \"P3\""),
        ("deep.ppm", b"P6\n32 32\n65535\n".to_vec(), "maxval 65535"),
        ("broken.png", b"\x89PNG\r\n\x1a\nnot really".to_vec(), "not a readable PNG"),
        ("image.jpg", vec![0xff, 0xd8], "not \"jpg\""),
    ];
    for (name, bytes, want) in cases {
        let path = tmp.path().join(name);
        std::fs::write(&path, bytes)?;
        let out = lz()?.args(["classify", "--model"]).arg(dir()).arg("--image").arg(&path).output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(name) && err.contains(want) && !err.contains("panicked"), "{name}: {err}");
    }
    Ok(())
}
