//! The `cpu` backend's attention kernels on the shapes `tools/bench.py` compares
//! with PyTorch CPU SDPA: prefill (B=1, Hq=32, Hkv=8, D=128, causal), decode (one query
//! against a 4096-key cache) and paged decode (the same cache in pages of 16).
//! Run: `cargo bench -p layerzero --bench attention`.

use layerzero::exec::args::{AttentionArgs, OpArgs, PagedAttentionArgs};
use layerzero::exec::executor::Executor;
use layerzero::model::attrs::AttentionAttrs;
use layerzero::model::dtype::DType;
use layerzero::model::layout::Layout;
use layerzero::tensor::{HostTensor, Storage};

fn main() {
    divan::main();
}

const HQ: usize = 32;
const HKV: usize = 8;
const D: usize = 128;
const CACHE: usize = 4096;
const PAGE: usize = 16;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) as f32
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u64, dtype: DType, layout: Layout) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::from_f32_as(dtype, shape, &values(n, seed)).expect("tensor").with_layout(layout)
}

fn kernel(id: &str) -> std::sync::Arc<dyn Executor> {
    layerzero::builtin_registry().get(id).expect("kernel registered").clone()
}

fn prefill_args(s: usize, dtype: DType) -> OpArgs {
    OpArgs::Attention(AttentionArgs {
        q: tensor(&[1, s, HQ, D], 1, dtype, Layout::Bshd),
        k: tensor(&[1, s, HKV, D], 2, dtype, Layout::Bshd),
        v: tensor(&[1, s, HKV, D], 3, dtype, Layout::Bshd),
        mask: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        attrs: AttentionAttrs { causal: true, ..Default::default() },
    })
}

fn run(bencher: divan::Bencher, id: &str, args: OpArgs) {
    let k = kernel(id);
    bencher.bench_local(|| k.run(divan::black_box(&args)).map(|o| o.len()));
}

#[divan::bench(args = [512, 2048], sample_count = 10, sample_size = 1)]
fn prefill_causal_f32(bencher: divan::Bencher, s: usize) {
    run(bencher, "cpu.attention.flash", prefill_args(s, DType::F32));
}

#[divan::bench(args = [512, 2048], sample_count = 10, sample_size = 1)]
fn prefill_causal_bf16(bencher: divan::Bencher, s: usize) {
    run(bencher, "cpu.attention.flash", prefill_args(s, DType::BF16));
}

#[divan::bench(sample_count = 200)]
fn decode_f32_cache4096(bencher: divan::Bencher) {
    let args = OpArgs::Attention(AttentionArgs {
        q: tensor(&[1, 1, HQ, D], 1, DType::F32, Layout::Bshd),
        k: tensor(&[1, CACHE, HKV, D], 2, DType::F32, Layout::Bshd),
        v: tensor(&[1, CACHE, HKV, D], 3, DType::F32, Layout::Bshd),
        mask: None,
        cu_seqlens_q: None,
        cu_seqlens_k: None,
        attrs: AttentionAttrs { causal: true, ..Default::default() },
    });
    run(bencher, "cpu.attention.flash", args);
}

#[divan::bench(sample_count = 200)]
fn paged_decode_f32_cache4096_page16(bencher: divan::Bencher) {
    let pages = CACHE / PAGE;
    // Pages in a scattered (but fixed) order: page p of the sequence is physical 7p mod pages.
    let table: Vec<i32> = (0..pages).map(|p| ((p * 7) % pages) as i32).collect();
    let args = OpArgs::PagedAttention(PagedAttentionArgs {
        q: tensor(&[1, 1, HQ, D], 1, DType::F32, Layout::Bshd),
        k_cache: tensor(&[pages, PAGE, HKV, D], 2, DType::F32, Layout::Nhd),
        v_cache: tensor(&[pages, PAGE, HKV, D], 3, DType::F32, Layout::Nhd),
        block_table: HostTensor::new(Storage::I32(table.into()), &[1, pages]).expect("table"),
        context_lens: HostTensor::new(Storage::I32(vec![CACHE as i32].into()), &[1]).expect("lens"),
        k_scale: None,
        v_scale: None,
        attrs: AttentionAttrs { causal: true, ..Default::default() },
    });
    run(bencher, "cpu.paged_attention.split_kv", args);
}
