//! Stage-by-stage comparison of two dumps (ours and a reference such as HF transformers):
//! cosine similarity, L2-relative error and max-abs per tensor, in forward order, and the
//! first stage whose error leaves the threshold — where a divergence starts, not where it
//! ends up (seed 003: the last layers look wrong; the first divergent stage says why).

use std::collections::BTreeMap;

use serde::Serialize;

use layerzero::error::{Error, Result};
use layerzero::tensor::HostTensor;

/// The comparison of one tensor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageDiff {
    /// The tensor's name.
    pub name: String,
    /// Cosine similarity of the flattened tensors (1 is identical direction).
    pub cosine: f64,
    /// ||ours - ref|| / ||ref|| (the absolute norm when the reference is zero).
    pub l2_rel: f64,
    /// Largest absolute difference.
    pub max_abs: f64,
    /// Within the threshold.
    pub ok: bool,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiffReport {
    /// Every tensor both dumps hold, in forward order.
    pub stages: Vec<StageDiff>,
    /// The first stage over the threshold.
    pub first_divergence: Option<String>,
    /// Token ids that differ (`generated_ids`), as (position, ours, reference).
    pub token_mismatches: Vec<(usize, i64, i64)>,
    /// The L2-relative threshold used.
    pub threshold: f64,
}

impl DiffReport {
    /// True when every stage is within the threshold and the tokens agree.
    pub fn ok(&self) -> bool {
        self.first_divergence.is_none() && self.token_mismatches.is_empty()
    }
}

/// Where a name falls in the forward pass: per stack (an encoder's `enc.` stages before a
/// decoder's `dec.` ones), the patch embedding, then each layer's input and stages in order,
/// then the final norm and pooled output; then the logits of each step. Names of another
/// form (group 2) are extras, not compared.
fn order(name: &str) -> (u64, u64, u64, u64, String) {
    const STAGES: [&str; 16] = [
        "attn_norm",
        "q",
        "k",
        "attn_out",
        "o_proj",
        "post_attn",
        "attn_ln",
        "self_attn_out",
        "self_attn_ln",
        "cross_attn_out",
        "cross_attn_ln",
        "ffn_norm",
        "router_logits",
        "shared_out",
        "ffn_out",
        "out",
    ];
    const LAST: u64 = u64::MAX / 2 + 1;
    let num = |s: &str| s.parse::<u64>().unwrap_or(u64::MAX / 2);
    let (stack, rest) = match name.split_once('.') {
        Some(("enc", rest)) => (0, rest),
        Some(("dec", rest)) => (1, rest),
        _ => (0, name),
    };
    let parts: Vec<&str> = rest.split('.').collect();
    match parts.as_slice() {
        ["patch_embed"] => (0, stack, 0, 0, String::new()),
        // hidden.{i} is the input of layer i (the last: after the final norm, or the output).
        ["hidden", i] => (0, stack, num(i), 1, String::new()),
        ["layer", l, stage] => {
            let s = STAGES.iter().position(|x| x == stage).map_or(STAGES.len() as u64, |p| p as u64);
            (0, stack, num(l), 2 + s, (*stage).to_owned())
        }
        ["final_norm"] => (0, stack, LAST, 0, String::new()),
        ["pooled"] => (0, stack, LAST, 1, String::new()),
        ["logits"] => (1, 0, 0, 0, String::new()),
        ["logits", k] => (1, num(k), 0, 0, String::new()),
        _ => (2, 0, 0, 0, name.to_owned()),
    }
}

fn stats(ours: &[f64], reference: &[f64]) -> (f64, f64, f64) {
    let (mut dot, mut oo, mut rr, mut dd, mut max_abs) = (0.0, 0.0, 0.0, 0.0, 0.0f64);
    for (&o, &r) in ours.iter().zip(reference) {
        dot += o * r;
        oo += o * o;
        rr += r * r;
        dd += (o - r) * (o - r);
        max_abs = max_abs.max((o - r).abs());
    }
    let cosine = if oo == 0.0 && rr == 0.0 { 1.0 } else { dot / (oo.sqrt() * rr.sqrt()).max(f64::MIN_POSITIVE) };
    let l2_rel = if rr == 0.0 { dd.sqrt() } else { (dd / rr).sqrt() };
    (cosine, l2_rel, max_abs)
}

/// Compares every stage tensor `reference` holds with ours of the same name. A reference
/// tensor missing from ours, or of another shape, is an error naming it.
pub fn diff(
    ours: &BTreeMap<String, HostTensor>,
    reference: &BTreeMap<String, HostTensor>,
    threshold: f64,
) -> Result<DiffReport> {
    // Stages only (hidden.*, layer.*, logits.*): a reference may carry extras of its own.
    let mut names: Vec<&String> = reference.keys().filter(|n| order(n).0 < 2).collect();
    names.sort_by_key(|n| order(n));
    let mut stages = Vec::with_capacity(names.len());
    for name in names {
        let r = &reference[name];
        let o = ours
            .get(name)
            .ok_or_else(|| Error::invalid(format!("tensor `{name}` is in the reference but not in ours")))?;
        if o.shape() != r.shape() {
            return Err(Error::invalid(format!(
                "tensor `{name}` has shape {:?} in ours and {:?} in the reference",
                o.shape(),
                r.shape()
            )));
        }
        let (cosine, l2_rel, max_abs) = stats(&o.to_f64_vec(), &r.to_f64_vec());
        let ok = l2_rel <= threshold && l2_rel.is_finite();
        stages.push(StageDiff { name: name.clone(), cosine, l2_rel, max_abs, ok });
    }
    let first_divergence = stages.iter().find(|s| !s.ok).map(|s| s.name.clone());
    let ids = |m: &BTreeMap<String, HostTensor>| m.get("generated_ids").map(|t| t.to_f64_vec());
    let mut token_mismatches = Vec::new();
    if let (Some(o), Some(r)) = (ids(ours), ids(reference)) {
        for (i, (a, b)) in o.iter().zip(&r).enumerate() {
            if a != b {
                token_mismatches.push((i, *a as i64, *b as i64));
            }
        }
        if o.len() != r.len() {
            let i = o.len().min(r.len());
            token_mismatches.push((i, o.get(i).map_or(-1, |x| *x as i64), r.get(i).map_or(-1, |x| *x as i64)));
        }
    }
    Ok(DiffReport { stages, first_divergence, token_mismatches, threshold })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    fn t(v: &[f32]) -> layerzero::error::Result<HostTensor> {
        HostTensor::from_f32(&[v.len()], v.to_vec())
    }

    #[test]
    fn the_first_divergence_is_named_in_forward_order_not_by_name() -> TestResult {
        let mut r = BTreeMap::new();
        let mut o = BTreeMap::new();
        for (name, ours) in [
            ("hidden.0", [1.0, 2.0]),
            ("layer.0.attn_norm", [1.0, 2.0]),
            ("layer.0.ffn_out", [1.0, 2.5]),
            ("layer.0.q", [1.0, 2.1]),
            ("logits.0", [9.0, 2.0]),
        ] {
            r.insert(name.to_owned(), t(&[1.0, 2.0])?);
            o.insert(name.to_owned(), t(&ours)?);
        }
        let d = diff(&o, &r, 1e-3)?;
        let order: Vec<&str> = d.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(order, ["hidden.0", "layer.0.attn_norm", "layer.0.q", "layer.0.ffn_out", "logits.0"]);
        assert_eq!(d.first_divergence.as_deref(), Some("layer.0.q"));
        assert!(!d.ok());
        assert!((d.stages[2].max_abs - 0.1).abs() < 1e-6);
        Ok(())
    }

    #[test]
    fn an_encoder_is_compared_before_its_decoder_and_extras_are_left_out() -> TestResult {
        let names = [
            "dec.layer.0.out",
            "logits.0",
            "enc.hidden.1",
            "dec.hidden.0",
            "batch.enc.hidden.0",
            "enc.layer.0.attn_out",
        ];
        let r = names
            .iter()
            .map(|n| Ok(((*n).to_owned(), t(&[1.0])?)))
            .collect::<TestResult<BTreeMap<String, HostTensor>>>()?;
        let d = diff(&r, &r, 1e-3)?;
        let order: Vec<&str> = d.stages.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(order, ["enc.layer.0.attn_out", "enc.hidden.1", "dec.hidden.0", "dec.layer.0.out", "logits.0"]);
        Ok(())
    }

    #[test]
    fn a_missing_or_reshaped_tensor_is_an_error_naming_it() -> TestResult {
        let mut r = BTreeMap::new();
        r.insert("hidden.3".to_owned(), t(&[1.0])?);
        let e = diff(&BTreeMap::new(), &r, 1e-3).err().ok_or("a missing tensor must be refused")?;
        assert!(e.to_string().contains("hidden.3"), "{e}");
        let mut o = BTreeMap::new();
        o.insert("hidden.3".to_owned(), t(&[1.0, 2.0])?);
        let e = diff(&o, &r, 1e-3).err().ok_or("a reshaped tensor must be refused")?;
        assert!(e.to_string().contains("shape"));
        Ok(())
    }
}
