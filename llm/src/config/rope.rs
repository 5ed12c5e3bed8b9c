//! Position and window options of a decoder's attention: RoPE (`rope_parameters`, or
//! `rope_theta` with `rope_scaling`) and each layer's sliding window.

use serde_json::Value;

use super::{Arch, Fields};
use layerzero::error::Result;
use layerzero::model::attrs::{RopeAttrs, RopeScaling, RopeStyle};
use layerzero::reason::{Reason, ReasonCode};

/// RoPE from `rope_parameters`, or from `rope_theta` and `rope_scaling`.
pub(super) fn rope(f: &Fields<'_>, max_positions: usize) -> Result<RopeAttrs> {
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
            // XPos also decays q and k per dimension (q by zeta^(n/512), k by its inverse):
            // a rotation alone would run silently wrong, so it is named and refused.
            let what = if other == "xpos" { " (XPos: rotary with a per-dimension decay of q and k)" } else { "" };
            let message = format!("is {other:?}{what}; LayerZero implements default, linear, dynamic, yarn and llama3");
            let reason = Reason::new(ReasonCode::ROPE_VARIANT_UNSUPPORTED, format!("rope_type {other:?}{what}"));
            return Err(f.err(&name("rope_type"), message).with_reasons(vec![reason]));
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
pub(super) fn windows(f: &Fields<'_>, arch: Arch, layers: usize) -> Result<Vec<Option<usize>>> {
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
