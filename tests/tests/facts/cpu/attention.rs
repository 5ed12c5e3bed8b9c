//! Our CPU kernels' attention and paged attention rows.

use super::*;

const ATTENTION: &str = "backends/cpu/src/attention.rs";
const ENGINE: &str = "backends/cpu/src/engine/mod.rs";
const PAGED: &str = "backends/cpu/src/paged.rs";
const ROTARY: &str = "backends/cpu/src/engine/rotary.rs";

/// `[1, 128, 8, d]` dense self-attention in `dtype` (BSHD).
fn dense(dtype: DType, d: u64) -> Request {
    attention(dtype, 1, 128, 128, 8, 8, d)
}

/// `req` with `v` of head dim `dv` (q and k keep theirs).
fn v_dim(req: Request, dv: u64) -> TestResult<Request> {
    let v: TensorDesc = req.get("v").cloned().ok_or("no v")?;
    let mut shape = v.shape.clone();
    shape[3] = dv;
    let v = TensorDesc { shape, ..v };
    Ok(req.tensor("v", v))
}

/// bf16 self-attention with q, k and v in BHSD (`[1, 8, 128, 128]`).
fn bhsd() -> TestResult<Request> {
    head_major(bf16(1, 128, 128, 8, 8, 128))
}

/// bf16 self-attention of `[1, 128, 8, 128]` with a `dtype` mask of `shape`.
fn masked(a: AttentionAttrs, dtype: DType, shape: &[u64]) -> Request {
    attrs(dense(DType::BF16, 128), a).tensor("mask", TensorDesc::new(dtype, shape.to_vec()))
}

/// Two sequences packed into batch 1 (`cu_seqlens` of 3 offsets over 256 tokens).
fn ragged() -> Request {
    attention(DType::BF16, 1, 256, 256, 8, 8, 128)
        .tensor("cu_seqlens_q", TensorDesc::new(DType::I32, [3]))
        .tensor("cu_seqlens_k", TensorDesc::new(DType::I32, [3]))
}

/// A paged decode of 4 sequences (32 q heads, 8 kv heads, head dim `d`, pages of 16) with
/// `q` in `dtype`, caches in `kv` and `layout`, block table in `table`.
fn paged_of(dtype: DType, kv: DType, d: u64, layout: Layout, table: DType) -> Request {
    paged(dtype, kv, 4, 1, 32, 8, d, 16, layout, table)
}

/// `req` asking for RoPE (rotate-half, default frequencies) fused into attention.
fn rotary(req: Request) -> Request {
    attrs(req, AttentionAttrs { rope: Some(RopeAttrs::default()), ..AttentionAttrs::default() })
}

/// `req` causal, aligned `alignment` (the other attributes default).
fn causal_as(req: Request, alignment: CausalAlignment) -> Request {
    attrs(req, AttentionAttrs { causal: true, causal_alignment: alignment, ..AttentionAttrs::default() })
}

pub(super) fn attention_facts() -> TestResult<Vec<Fact>> {
    let k = "cpu.attention.flash";
    Ok(vec![
        // The output is written per dtype: f32, bf16 and f16 each have an arm of the engine's
        // `output_into`. An fp8 q would take its `other =>` arm (computed in f32, then encoded),
        // which no test holds: fp8 is not declared, so it is declined.
        fact(k, "dtypes", here(ENGINE, "DType::BF16 => {"), "spr", dense(DType::BF16, 128))
            .rejects(dense(DType::Fp8E4M3, 128), "DTYPE_UNSUPPORTED"),
        fact(k, "dtypes", here(ENGINE, "DType::F16 => {"), "spr", dense(DType::F16, 128)),
        fact(k, "dtypes", here(ENGINE, "DType::F32 => {"), "spr", dense(DType::F32, 128)),
        // No line bounds the head dim: q's is read here and every buffer is sized by it. 512 is
        // a conservative declaration (the tests run head dims up to 256), not a limit of the code.
        fact(k, "head_dim", here(ATTENTION, "let [b, sq, hq, d] = q.n;"), "spr", dense(DType::BF16, 512))
            .rejects(dense(DType::BF16, 513), "HEAD_DIM_TOO_LARGE"),
        fact(
            k,
            "different_v_head_dim",
            here(ATTENTION, "let [bv, skv, hkv_v, dv] = v.n;"),
            "spr",
            v_dim(dense(DType::BF16, 192), 128)?,
        ),
        fact(
            k,
            "gqa",
            here(ATTENTION, "if hq > 0 && (hkv == 0 || hq % hkv != 0) {"),
            "spr",
            attention(DType::BF16, 1, 128, 128, 32, 8, 128),
        ),
        // `visible_keys` (exec::semantics) aligns the causal mask either way.
        fact(
            k,
            "causal",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            causal_as(attention(DType::BF16, 1, 64, 128, 8, 8, 128), CausalAlignment::TopLeft),
        ),
        fact(
            k,
            "causal",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            causal_as(attention(DType::BF16, 1, 64, 128, 8, 8, 128), CausalAlignment::BottomRight),
        ),
        fact(
            k,
            "masks",
            here(ENGINE, "if !(t.dtype() == DType::Bool || t.dtype().is_float()) {"),
            "spr",
            masked(AttentionAttrs::default(), DType::Bool, &[1, 8, 128, 128]),
        ),
        fact(
            k,
            "masks",
            here(ENGINE, "Storage::F32(v) => s.iter_mut().enumerate().for_each(|(t, x)| *x += v[base + t * sj]),"),
            "spr",
            masked(AttentionAttrs::default(), DType::F32, &[1, 8, 128, 128]),
        ),
        // The mask is applied inside each query's visible (causal) key range.
        fact(
            k,
            "mask_with_causal",
            here(ENGINE, "p.mods.apply(seq, kvh * g + r / n, i0 + r % n, tj0 + a, seg);"),
            "spr",
            masked(layerzero_tests::causal(), DType::Bool, &[1, 8, 128, 128]),
        ),
        // Broadcast dims keep a zero stride.
        fact(
            k,
            "mask_broadcast",
            here(ENGINE, "let mut s = [0usize; 4];"),
            "spr",
            masked(AttentionAttrs::default(), DType::Bool, &[128, 128]),
        ),
        fact(
            k,
            "window",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            windowed(dense(DType::BF16, 128)),
        ),
        fact(
            k,
            "softcap",
            here(ENGINE, "*x = c * (*x / c).tanh();"),
            "spr",
            attrs(dense(DType::BF16, 128), softcap(0.0)),
        ),
        fact(
            k,
            "alibi",
            here(ENGINE, "*x -= (slope * alibi_distance(i, j0 + t, seq.sq, seq.sk)) as f32;"),
            "spr",
            attrs(dense(DType::BF16, 128), AttentionAttrs { alibi: true, ..AttentionAttrs::default() }),
        ),
        fact(
            k,
            "custom_scale",
            here(ATTENTION, "scale: softmax_scale(&a.attrs, d) as f32,"),
            "spr",
            attrs(dense(DType::BF16, 128), AttentionAttrs { scale: Some(0.1), ..AttentionAttrs::default() }),
        ),
        fact(k, "varlen", here(ATTENTION, "(Some(cq), Some(ck)) => {"), "spr", ragged()),
        // RoPE fused: q rows rotated as they are read, k rows as they are packed; a packed
        // batch would need positions per sequence, so rope and varlen are exclusive.
        fact(
            k,
            "fused_rope",
            here(ROTARY, "pub(crate) fn apply(&self, pos: usize, x: &mut [f32]) {"),
            "spr",
            rotary(dense(DType::BF16, 128)),
        ),
        fact(
            k,
            "exclusive",
            here(ATTENTION, "if a.cu_seqlens_q.is_some() || a.cu_seqlens_k.is_some() {"),
            "spr",
            rotary(dense(DType::BF16, 128)),
        )
        .rejects(rotary(ragged()), "FEATURES_EXCLUSIVE"),
        fact(k, "layouts", here(PACK, "Layout::Bshd => [0, 1, 2, 3],"), "spr", dense(DType::BF16, 128)),
        fact(k, "layouts", here(PACK, "Layout::Bhsd => [0, 2, 1, 3],"), "spr", bhsd()?),
        // Every read goes through the tensor's own strides.
        fact(
            k,
            "strides",
            here(PACK, "Ok(Bshd { st: t.storage(), off: t.offset(), n: perm.map(|d| sh[d]), s: perm.map(|d| st[d]) })"),
            "spr",
            strided_v(dense(DType::BF16, 128))?,
        ),
    ])
}

pub(super) fn paged_facts() -> TestResult<Vec<Fact>> {
    let k = "cpu.paged_attention.split_kv";
    let bf = |d: u64| paged_of(DType::BF16, DType::BF16, d, Layout::Nhd, DType::I32);
    Ok(vec![
        // The output is q's dtype, written by the engine's `output_into` (its f32, bf16
        // and f16 arms); an fp8 q would take the untested `other =>` arm: declined.
        fact(
            k,
            "dtypes",
            here(PAGED, "output_into(&p, [b, sq, hq, dv], Layout::Bshd, a.q.dtype(), bufs)"),
            "spr",
            bf(128),
        )
        .rejects(paged_of(DType::Fp8E4M3, DType::BF16, 128, Layout::Nhd, DType::I32), "DTYPE_UNSUPPORTED"),
        fact(
            k,
            "dtypes",
            here(PAGED, "output_into(&p, [b, sq, hq, dv], Layout::Bshd, a.q.dtype(), bufs)"),
            "spr",
            paged_of(DType::F32, DType::F32, 128, Layout::Nhd, DType::I32),
        ),
        fact(
            k,
            "dtypes",
            here(PAGED, "output_into(&p, [b, sq, hq, dv], Layout::Bshd, a.q.dtype(), bufs)"),
            "spr",
            paged_of(DType::F16, DType::F16, 128, Layout::Nhd, DType::I32),
        ),
        // As for dense attention: no line bounds the head dim; 512 is a conservative declaration.
        fact(k, "head_dim", here(PAGED, "let [b, sq, hq, d] = q.n;"), "spr", bf(512))
            .rejects(bf(513), "HEAD_DIM_TOO_LARGE"),
        fact(k, "gqa", here(PAGED, "if hkv == 0 || hq % hkv != 0 {"), "spr", bf(128)),
        fact(
            k,
            "causal",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            causal_as(queries_on_pages(4, 16, None, 1)?, CausalAlignment::TopLeft),
        ),
        fact(
            k,
            "causal",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            causal_as(queries_on_pages(4, 16, None, 1)?, CausalAlignment::BottomRight),
        ),
        fact(
            k,
            "window",
            here(ENGINE, "visible_keys(i, seq.sq, seq.sk, self.attrs)"),
            "spr",
            windowed(queries_on_pages(4, 16, None, 1)?),
        ),
        fact(
            k,
            "softcap",
            here(PAGED, "softcap: a.attrs.softcap.map(|c| c as f32),"),
            "spr",
            attrs(bf(128), softcap(0.0)),
        ),
        fact(
            k,
            "alibi",
            here(PAGED, "alibi: a.attrs.alibi.then(|| alibi_slopes(hq)),"),
            "spr",
            attrs(bf(128), AttentionAttrs { alibi: true, ..AttentionAttrs::default() }),
        ),
        fact(
            k,
            "custom_scale",
            here(PAGED, "scale: softmax_scale(&a.attrs, d) as f32,"),
            "spr",
            attrs(bf(128), AttentionAttrs { scale: Some(0.1), ..AttentionAttrs::default() }),
        ),
        fact(k, "layouts", here(PAGED, "paged attention takes BSHD queries"), "spr", bf(128)),
        // Pages 2 x 16 x 8 x 128 elements apart (K and V interleaved per page), elements 1 apart.
        fact(
            k,
            "strides",
            here(PAGED, "let s = perm.map(|d| t.strides()[d]);"),
            "spr",
            pages(16, Some(2 * 16 * 8 * 128), 1)?,
        ),
        fact(
            k,
            "block_table_dtypes",
            here(PACK, "Storage::I32(v) => v.get(off..off + n).map(IntSlice::I32),"),
            "spr",
            bf(128),
        ),
        fact(
            k,
            "block_table_dtypes",
            here(PACK, "Storage::I64(v) => v.get(off..off + n).map(IntSlice::I64),"),
            "spr",
            paged_of(DType::BF16, DType::BF16, 128, Layout::Nhd, DType::I64),
        ),
        fact(k, "kv_cache_layouts", here(PAGED, "Some(Layout::Nhd) => [0, 1, 2, 3],"), "spr", bf(128)),
        fact(
            k,
            "kv_cache_layouts",
            here(PAGED, "Some(Layout::Hnd) => [0, 2, 1, 3],"),
            "spr",
            paged_of(DType::BF16, DType::BF16, 128, Layout::Hnd, DType::I32),
        ),
        // Cache rows are decoded to f32 by dtype (fp8 through a 256-entry table).
        fact(k, "kv_cache_dtypes", here(PACK, "Storage::BF16(v) => simd::bf16_to_f32(&v[r], out),"), "spr", bf(128)),
        fact(
            k,
            "kv_cache_dtypes",
            here(PACK, "Storage::Fp8E4M3(v) => lut(&v[r], fp8_table(Fp8::E4M3), out),"),
            "spr",
            paged_of(DType::BF16, DType::Fp8E4M3, 128, Layout::Nhd, DType::I32),
        ),
        fact(
            k,
            "kv_cache_dtypes",
            here(PACK, "Storage::Fp8E5M2(v) => lut(&v[r], fp8_table(Fp8::E5M2), out),"),
            "spr",
            paged_of(DType::F32, DType::Fp8E5M2, 128, Layout::Nhd, DType::I32),
        ),
        fact(
            k,
            "kv_cache_dtypes",
            here(PACK, "Storage::F16(v) => simd::f16_to_f32(&v[r], out),"),
            "spr",
            paged_of(DType::BF16, DType::F16, 128, Layout::Nhd, DType::I32),
        ),
        fact(
            k,
            "kv_cache_dtypes",
            here(PACK, "Storage::F32(v) => out.copy_from_slice(&v[r]),"),
            "spr",
            paged_of(DType::BF16, DType::F32, 128, Layout::Nhd, DType::I32),
        ),
    ])
}
