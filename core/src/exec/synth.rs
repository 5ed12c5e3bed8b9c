//! Valid random inputs for a request: what `lz tune` runs every kernel on.
//!
//! Floats are seeded normal values scaled the way real inputs are (weights by
//! `1/sqrt(fan_in)`, norm weights near 1, scales positive); index tensors hold values in
//! range (embedding ids below the vocabulary, block tables below the page count with
//! context lengths that fill the table, expert ids below the expert count with positive
//! weights, packed `cu_seqlens` that split the sequence dim). The request's strides and
//! layout tags are applied by [`OpArgs::from_request`], so a strided request gets a strided
//! view of the same values.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::exec::args::OpArgs;
use crate::model::dtype::DType;
use crate::model::layout::Layout;
use crate::model::op::Op;
use crate::model::request::Request;
use crate::model::tensor::TensorDesc;
use crate::tensor::HostTensor;
use crate::tensor::rng::Rng;

/// Largest element count one synthesized tensor may have (4 GiB of f32): beyond it the
/// request is refused rather than the machine exhausted.
pub const MAX_ELEMENTS: u64 = 1 << 30;

/// Valid random inputs for `req` (any executable op), the same for the same seed.
pub fn synthesize(req: &Request, seed: u64) -> Result<OpArgs> {
    if req.op == Op::Tokenize {
        return Err(Error::invalid(format!("op {} has no executor in this build; nothing to synthesize", req.op)));
    }
    for (name, t) in &req.tensors {
        let n = t.numel();
        if n > MAX_ELEMENTS {
            return Err(Error::invalid(format!(
                "tensor `{name}` of shape {:?} has {n} elements; synthesizing more than {MAX_ELEMENTS} is refused",
                t.shape
            )));
        }
    }
    let mut rng = Rng::new(seed ^ 0x5459_4e54_4845_5349);
    let mut inputs = BTreeMap::new();
    for (name, desc) in &req.tensors {
        let values = values(req, name, desc, &mut rng)?;
        let shape: Vec<usize> = desc.shape.iter().map(|&d| d as usize).collect();
        let t = HostTensor::from_f32_as(desc.dtype, &shape, &values)
            .map_err(|e| Error::invalid(format!("tensor `{name}`: {e}")))?;
        inputs.insert(name.clone(), t);
    }
    OpArgs::from_request(req, inputs)
}

fn dim(req: &Request, tensor: &str, i: usize) -> Option<u64> {
    req.get(tensor).and_then(|t| t.shape.get(i).copied())
}

fn normal(rng: &mut Rng, n: usize, std: f64, mean: f64) -> Vec<f32> {
    (0..n).map(|_| (mean + rng.normal() * std) as f32).collect()
}

fn uniform(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Vec<f32> {
    (0..n).map(|_| (lo + rng.uniform() * (hi - lo)) as f32).collect()
}

fn ints_below(rng: &mut Rng, n: usize, bound: u64) -> Vec<f32> {
    (0..n).map(|_| rng.below(bound.max(1)) as f32).collect()
}

/// Signed 8-bit integers in [-127, 127].
fn int8(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.below(255) as f32 - 127.0).collect()
}

/// `1/sqrt(fan_in)`: keeps a product of `fan_in` terms near unit scale.
fn inv_sqrt(fan_in: Option<u64>) -> f64 {
    1.0 / (fan_in.unwrap_or(1).max(1) as f64).sqrt()
}

/// Generic values for a tensor no rule below names: normal floats, zeros for integers,
/// `true` for booleans.
fn generic(rng: &mut Rng, desc: &TensorDesc, n: usize) -> Vec<f32> {
    match desc.dtype {
        DType::Bool => vec![1.0; n],
        d if d.is_float() => normal(rng, n, 1.0, 0.0),
        _ => vec![0.0; n],
    }
}

/// Quantized payloads: integers in range for i8, a wide normal for fp8.
fn quantized(rng: &mut Rng, desc: &TensorDesc, n: usize) -> Vec<f32> {
    match desc.dtype {
        DType::I8 => int8(rng, n),
        DType::Fp8E4M3 | DType::Fp8E5M2 => normal(rng, n, 8.0, 0.0),
        _ => normal(rng, n, 1.0, 0.0),
    }
}

fn values(req: &Request, name: &str, desc: &TensorDesc, rng: &mut Rng) -> Result<Vec<f32>> {
    let n = desc.numel() as usize;
    let v = match (req.op, name) {
        (Op::Attention, "mask") => match desc.dtype {
            // Keep most keys; a row may lose all of them (kernels give zeros there).
            DType::Bool => (0..n).map(|_| f32::from(rng.uniform() < 0.9)).collect(),
            _ => normal(rng, n, 0.5, 0.0),
        },
        (Op::Attention, "cu_seqlens_q") => cu_seqlens(req, "q", n)?,
        (Op::Attention, "cu_seqlens_k") => cu_seqlens(req, "k", n)?,
        (Op::PagedAttention, "block_table") => block_table(req, rng, n),
        (Op::PagedAttention, "context_lens") => context_lens(req, n),
        (Op::PagedAttention, "k_scale" | "v_scale") => uniform(rng, n, 0.5, 1.5),
        (Op::PagedAttention, "k_cache" | "v_cache") => match desc.dtype {
            DType::Fp8E4M3 | DType::Fp8E5M2 => normal(rng, n, 4.0, 0.0),
            _ => normal(rng, n, 1.0, 0.0),
        },
        (Op::Rope, "positions") => {
            let limit = dim(req, "cos", 0).unwrap_or(8192);
            ints_below(rng, n, limit)
        }
        (Op::Rope, "cos" | "sin") => {
            // A real table: cos and sin of the same angles (the generator restarts per name,
            // so both walk the same sequence).
            let mut angles = Rng::new(0x524f_5045);
            let a: Vec<f64> = (0..n).map(|_| angles.uniform() * std::f64::consts::TAU).collect();
            if name == "cos" {
                a.iter().map(|x| x.cos() as f32).collect()
            } else {
                a.iter().map(|x| x.sin() as f32).collect()
            }
        }
        (Op::RmsNorm | Op::LayerNorm, "weight") => normal(rng, n, 0.1, 1.0),
        (Op::RmsNorm | Op::LayerNorm, "bias") => normal(rng, n, 0.1, 0.0),
        (Op::Linear, "weight") => {
            let k = dim(req, "x", desc_last_axis(req, "x"));
            normal(rng, n, inv_sqrt(k), 0.0)
        }
        (Op::Linear | Op::LinearW8a8 | Op::LinearInt4, "bias") => normal(rng, n, 0.1, 0.0),
        (Op::Mlp, "w_gate" | "w_up") => normal(rng, n, inv_sqrt(desc.shape.last().copied()), 0.0),
        (Op::Mlp, "w_down") => normal(rng, n, inv_sqrt(desc.shape.last().copied()), 0.0),
        (Op::MoeExperts, "w_gate" | "w_up" | "w_down") => normal(rng, n, inv_sqrt(desc.shape.last().copied()), 0.0),
        (Op::MoeExperts, "experts") => experts(req, rng, desc),
        // [D, C, P, P]: the fan-in is C * P * P.
        (Op::PatchEmbed, "weight") => normal(rng, n, inv_sqrt(Some(desc.shape.iter().skip(1).product::<u64>())), 0.0),
        (Op::PatchEmbed, "bias") => normal(rng, n, 0.1, 0.0),
        (Op::MoeExperts, "weights") => routing_weights(rng, desc),
        (Op::Embedding, "ids") => ints_below(rng, n, dim(req, "table", 0).unwrap_or(1)),
        (Op::Sample, "logits") => normal(rng, n, 3.0, 0.0),
        (Op::MoeRoute, "logits") => normal(rng, n, 2.0, 0.0),
        (Op::Quantize, "x") => normal(rng, n, 3.0, 0.0),
        (Op::Dequantize, "x") => quantized(rng, desc, n),
        (Op::Dequantize, "scale") => uniform(rng, n, 0.005, 0.02),
        (Op::LinearW8a8, "x" | "weight") => quantized(rng, desc, n),
        (Op::LinearW8a8, "x_scale" | "w_scale") => uniform(rng, n, 0.005, 0.02),
        (Op::LinearInt4, "weight") => match desc.dtype {
            // Two unsigned nibbles per byte: any byte is valid.
            DType::I8 => (0..n).map(|_| rng.below(256) as f32 - 128.0).collect(),
            _ => ints_below(rng, n, 256),
        },
        (Op::LinearInt4, "scales") => match desc.dtype {
            // mxfp4's E8M0 exponent bytes: 2^-9 .. 2^-4.
            DType::I8 => (0..n).map(|_| 118.0 + rng.below(6) as f32).collect(),
            _ => uniform(rng, n, 0.01, 0.05),
        },
        (Op::LinearInt4, "global_scale") => vec![1.0; n],
        (Op::LinearInt4, "zeros") => ints_below(rng, n, 16),
        (Op::LinearInt4, "x") => normal(rng, n, 0.5, 0.0),
        _ => generic(rng, desc, n),
    };
    Ok(v)
}

/// The index of the last dimension of `tensor` (0 when absent).
fn desc_last_axis(req: &Request, tensor: &str) -> usize {
    req.get(tensor).map_or(0, |t| t.rank().saturating_sub(1))
}

/// The sequence dim of a dense attention tensor.
fn seq_dim(t: &TensorDesc) -> usize {
    if t.layout == Some(Layout::Bhsd) { 2 } else { 1 }
}

/// `[0, ..., total]` splitting the packed sequence dim of `tensor` into `n - 1` nearly equal
/// sequences.
fn cu_seqlens(req: &Request, tensor: &str, n: usize) -> Result<Vec<f32>> {
    let Some(t) = req.get(tensor) else {
        return Err(Error::invalid(format!("cu_seqlens_{tensor} needs tensor `{tensor}`")));
    };
    let total = t.shape.get(seq_dim(t)).copied().unwrap_or(0) as usize;
    let seqs = n.saturating_sub(1).max(1);
    Ok((0..n).map(|i| (i.min(seqs) * total / seqs) as f32).collect())
}

/// Geometry of a paged cache request: (batch, table columns, pages, page size, query len).
fn paged_geometry(req: &Request) -> (usize, usize, usize, usize, usize) {
    let b = dim(req, "block_table", 0).unwrap_or(1) as usize;
    let cols = dim(req, "block_table", 1).unwrap_or(1) as usize;
    let cache = req.get("k_cache");
    let pages = cache.and_then(|c| c.shape.first().copied()).unwrap_or(1) as usize;
    let page_size = cache
        .map(|c| {
            let i = if c.layout == Some(Layout::Hnd) { 2 } else { 1 };
            c.shape.get(i).copied().unwrap_or(1)
        })
        .unwrap_or(1) as usize;
    let sq = dim(req, "q", 1).unwrap_or(1) as usize;
    (b, cols, pages, page_size, sq)
}

/// Every sequence fills its table row (the bucket's `pages` axis is what is measured).
fn context_lens(req: &Request, n: usize) -> Vec<f32> {
    let (_, cols, _, page_size, sq) = paged_geometry(req);
    let len = (cols * page_size).max(sq.min(cols * page_size)).max(1);
    vec![len as f32; n]
}

/// Distinct shuffled pages while the cache has enough, else pages drawn at random; every
/// entry below the page count.
fn block_table(req: &Request, rng: &mut Rng, n: usize) -> Vec<f32> {
    let (_, _, pages, _, _) = paged_geometry(req);
    if pages >= n {
        let mut ids: Vec<usize> = (0..pages).collect();
        for j in (1..ids.len()).rev() {
            ids.swap(j, rng.below(j as u64 + 1) as usize);
        }
        ids.truncate(n);
        ids.into_iter().map(|p| p as f32).collect()
    } else {
        ints_below(rng, n, pages as u64)
    }
}

/// Distinct experts per token (while there are enough), each below the expert count.
fn experts(req: &Request, rng: &mut Rng, desc: &TensorDesc) -> Vec<f32> {
    let e = dim(req, "w_gate", 0).unwrap_or(1).max(1) as usize;
    let (t, k) = match desc.shape.as_slice() {
        [t, k] => (*t as usize, *k as usize),
        _ => (desc.numel() as usize, 1),
    };
    let mut out = Vec::with_capacity(t * k);
    for _ in 0..t {
        let mut ids: Vec<usize> = (0..e).collect();
        for j in 0..k {
            if j < e {
                let pick = j + rng.below((e - j) as u64) as usize;
                ids.swap(j, pick);
                out.push(ids[j] as f32);
            } else {
                out.push(rng.below(e as u64) as f32);
            }
        }
    }
    out
}

/// Positive routing weights summing to 1 per token.
fn routing_weights(rng: &mut Rng, desc: &TensorDesc) -> Vec<f32> {
    let n = desc.numel() as usize;
    let k = desc.shape.last().copied().unwrap_or(1).max(1) as usize;
    let mut v = uniform(rng, n, 0.1, 1.0);
    for row in v.chunks_mut(k) {
        let s: f32 = row.iter().sum();
        row.iter_mut().for_each(|x| *x /= s);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestResult;

    #[test]
    fn index_tensors_are_in_range() -> TestResult {
        let req = Request::from_json(
            r#"{"op": "paged_attention", "tensors": {
                "q": {"dtype": "f32", "shape": [3, 1, 8, 64], "layout": "BSHD"},
                "k_cache": {"dtype": "f32", "shape": [10, 16, 2, 64], "layout": "NHD"},
                "v_cache": {"dtype": "f32", "shape": [10, 16, 2, 64], "layout": "NHD"},
                "block_table": {"dtype": "i32", "shape": [3, 5]},
                "context_lens": {"dtype": "i32", "shape": [3]}},
              "attrs": {"causal": true}}"#,
        )?;
        let OpArgs::PagedAttention(a) = synthesize(&req, 1)? else { return Err("not paged".into()) };
        assert!(a.block_table.to_i64_vec().iter().all(|&p| (0..10).contains(&p)));
        assert!(a.context_lens.to_i64_vec().iter().all(|&l| l == 5 * 16));
        let req = Request::from_json(
            r#"{"op": "embedding", "tensors": {
                "ids": {"dtype": "i64", "shape": [4, 33]},
                "table": {"dtype": "f32", "shape": [50, 8]}}}"#,
        )?;
        let OpArgs::Embedding(a) = synthesize(&req, 1)? else { return Err("not embedding".into()) };
        assert!(a.ids.to_i64_vec().iter().all(|&i| (0..50).contains(&i)));
        Ok(())
    }

    #[test]
    fn the_same_seed_gives_the_same_inputs() -> TestResult {
        let req = Request::from_json(
            r#"{"op": "rms_norm", "tensors": {
                "x": {"dtype": "f32", "shape": [3, 64]}, "weight": {"dtype": "f32", "shape": [64]}}}"#,
        )?;
        let a = synthesize(&req, 9)?;
        let b = synthesize(&req, 9)?;
        let c = synthesize(&req, 10)?;
        let x = |a: &OpArgs| a.tensors()[0].1.to_f32_vec();
        assert_eq!(x(&a), x(&b));
        assert_ne!(x(&a), x(&c));
        Ok(())
    }
}
