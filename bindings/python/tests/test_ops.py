"""lz.ops on torch tensors: results against PyTorch, no copies, inputs untouched."""

import json

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import layerzero as lz  # noqa: E402

TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)}


def close(got, want, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(got.double(), want.double(), atol=atol, rtol=rtol)


def sdpa_bshd(q, k, v, causal=False, mask=None, scale=None):
    """PyTorch's attention on BSHD tensors in float64, causal bottom-right."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    if causal:
        sq, sk = q.shape[-2], k.shape[-2]
        mask = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return o.transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sq,sk,causal", [(33, 33, True), (1, 40, True), (16, 24, False)])
def test_attention_matches_pytorch_with_gqa(dtype, sq, sk, causal):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, sq, 8, 64, generator=g).to(dtype)
    k = torch.randn(2, sk, 2, 64, generator=g).to(dtype)
    v = torch.randn(2, sk, 2, 64, generator=g).to(dtype)
    out = lz.ops.attention(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == dtype
    close(out, sdpa_bshd(q, k, v, causal), dtype)


def test_attention_top_left_and_bhsd_match_sdpa_is_causal():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 4, n, 32, generator=g) for n in (8, 12, 12))
    got = lz.ops.attention(q, k, v, causal=True, causal_align="top_left", layout="BHSD")
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    close(got, want, torch.float32)


def test_attention_masks_and_scale_match_pytorch():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 10, 4, 32, generator=g) for _ in range(3))
    keep = torch.rand(2, 1, 10, 10, generator=g) > 0.3
    keep[..., 0] = True
    close(lz.ops.attention(q, k, v, mask=keep, scale=0.2), sdpa_bshd(q, k, v, mask=keep, scale=0.2), torch.float32)
    bias = torch.randn(2, 4, 10, 10, generator=g)
    close(lz.ops.attention(q, k, v, mask=bias), sdpa_bshd(q, k, v, mask=bias.double()), torch.float32)


def test_attention_window_keeps_only_recent_keys():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 20, 2, 16, generator=g) for _ in range(3))
    i = torch.arange(20)
    mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] <= 5)
    close(lz.ops.attention(q, k, v, causal=True, window=5), sdpa_bshd(q, k, v, mask=mask), torch.float32)
    close(lz.ops.attention(q, k, v, causal=True, window=(5, 0)), sdpa_bshd(q, k, v, mask=mask), torch.float32)


def test_varlen_attention_attends_within_each_sequence():
    g = torch.Generator().manual_seed(5)
    lens = [5, 11, 3]
    q = torch.randn(1, sum(lens), 4, 32, generator=g)
    k = torch.randn(1, sum(lens), 2, 32, generator=g)
    v = torch.randn(1, sum(lens), 2, 32, generator=g)
    cu = torch.tensor([0, 5, 16, 19], dtype=torch.int32)
    got = lz.ops.attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        s = slice(a, b)
        close(got[:, s], sdpa_bshd(q[:, s], k[:, s], v[:, s], causal=True), torch.float32)


def test_outputs_are_written_into_the_callers_buffer_and_inputs_are_lent_not_copied():
    x = torch.randn(8, 256)
    w = torch.randn(256)
    x_before, w_before = x.clone(), w.clone()
    out = torch.empty_like(x)
    got = lz.ops.rms_norm(x, w, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(x, x_before) and torch.equal(w, w_before)
    close(got, F.rms_norm(x, (256,), w, eps=1e-6), torch.float32)
    q = torch.randn(1, 16, 4, 32)
    out = torch.empty_like(q)
    assert lz.ops.attention(q, q, q, causal=True, out=out).data_ptr() == out.data_ptr()


def test_strided_inputs_are_read_in_place():
    big = torch.randn(2, 12, 8, 32)
    q = big[:, :, :4]  # non-contiguous view
    got = lz.ops.attention(q, q, q, causal=True)
    close(got, sdpa_bshd(q, q, q, True), torch.float32)
    assert torch.equal(big, big.clone())


def test_rms_norm_with_residual_returns_the_sum():
    g = torch.Generator().manual_seed(6)
    x, r = torch.randn(4, 64, generator=g).bfloat16(), torch.randn(4, 64, generator=g).bfloat16()
    w = torch.randn(64, generator=g).bfloat16()
    out, s = lz.ops.rms_norm(x, w, residual=r, eps=1e-5)
    want_s = x.float() + r.float()
    close(s, want_s, torch.bfloat16)
    close(out, F.rms_norm(want_s.double(), (64,), w.double(), eps=1e-5), torch.bfloat16)


def test_layer_norm_linear_mlp_swiglu_embedding_match_pytorch():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 5, 32, generator=g)
    w, b = torch.randn(32, generator=g), torch.randn(32, generator=g)
    close(lz.ops.layer_norm(x, w, b), F.layer_norm(x, (32,), w, b, eps=1e-5), torch.float32)
    lw, lb = torch.randn(48, 32, generator=g), torch.randn(48, generator=g)
    close(lz.ops.linear(x, lw, lb), F.linear(x.double(), lw.double(), lb.double()), torch.float32)
    wg, wu, wd = torch.randn(64, 32, generator=g), torch.randn(64, 32, generator=g), torch.randn(32, 64, generator=g)
    want = F.linear(F.silu(F.linear(x.double(), wg.double())) * F.linear(x.double(), wu.double()), wd.double())
    torch.testing.assert_close(lz.ops.mlp(x, wg, wu, wd).double(), want, atol=1e-4, rtol=1e-4)
    gate, up = torch.randn(6, 16, generator=g), torch.randn(6, 16, generator=g)
    close(lz.ops.swiglu(gate, up), F.silu(gate) * up, torch.float32)
    close(lz.ops.swiglu(torch.cat([gate, up], -1)), F.silu(gate) * up, torch.float32)
    ids = torch.tensor([[3, 0, 9], [1, 1, 2]])
    table = torch.randn(10, 8, generator=g)
    assert torch.equal(lz.ops.embedding(ids, table), F.embedding(ids, table))


def test_rope_rotates_like_the_llama_formula():
    g = torch.Generator().manual_seed(8)
    q, k = torch.randn(1, 6, 2, 16, generator=g), torch.randn(1, 6, 1, 16, generator=g)
    qo, ko = lz.ops.rope(q, k)
    inv = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    ang = torch.arange(6, dtype=torch.float64)[:, None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1)[None, :, None], torch.cat([ang.sin()] * 2, -1)[None, :, None]

    def rot(x):
        x = x.double()
        half = torch.cat([-x[..., 8:], x[..., :8]], -1)
        return x * cos + half * sin

    close(qo, rot(q), torch.float32)
    close(ko, rot(k), torch.float32)


def test_greedy_sample_is_the_argmax():
    logits = torch.randn(4, 100)
    assert torch.equal(lz.ops.sample(logits), logits.argmax(-1))


def test_calls_after_the_first_are_cache_hits():
    x, w = torch.randn(2, 96), torch.randn(96)
    lz.ops.rms_norm(x, w)
    before = lz.counters()
    for _ in range(5):
        lz.ops.rms_norm(x, w)
    after = lz.counters()
    assert after["cache_hits"] + after["plan_hits"] - before["cache_hits"] - before["plan_hits"] == 5
    assert after["live"] == before["live"]


def test_bad_inputs_raise_errors_naming_the_argument():
    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(lz.InvalidInputError, match="argument `k`.*list"):
        lz.ops.attention(q, [1, 2], q)
    with pytest.raises(lz.InvalidInputError, match="argument `x`.*complex64.*DTYPE_UNSUPPORTED"):
        lz.ops.rms_norm(torch.randn(2, 4, dtype=torch.complex64), torch.randn(4))
    with pytest.raises(lz.LayerZeroError) as e:
        lz.ops.attention(torch.randn(4, 2, 8), torch.randn(4, 2, 8), torch.randn(4, 2, 8))
    assert "rank" in str(e.value) or "4-D" in str(e.value) or "dims" in str(e.value)
    with pytest.raises(lz.LayerZeroError):
        lz.ops.attention(q, q.double(), q)
    with pytest.raises(lz.InvalidInputError, match="position"):
        lz.ops.embedding(torch.tensor([0, 12]), torch.randn(10, 4))


def test_a_meta_tensor_gets_a_clear_error_not_a_crash():
    q = torch.randn(1, 4, 2, 8, device="meta")
    with pytest.raises(lz.LayerZeroError, match="meta"):
        lz.ops.attention(q, q, q)


def test_a_cuda_request_without_a_gpu_says_why_no_kernel_runs():
    report = lz.explain(
        "attention",
        q=_Desc((1, 16, 8, 64), "cuda:0"),
        k=_Desc((1, 16, 8, 64), "cuda:0"),
        v=_Desc((1, 16, 8, 64), "cuda:0"),
    )
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert report.selected is None
    codes = {str(r.code) for c in report.candidates for r in c.reasons}
    assert "ReasonCode.DEVICE_NOT_PRESENT" in codes or "ReasonCode.BACKEND_NOT_INSTALLED" in codes


class _Desc:
    """A tensor description on a device this machine may not have (metadata only)."""

    def __init__(self, shape, device, dtype="torch.bfloat16"):
        self.shape, self.device, self.dtype = shape, device, dtype

    def stride(self):
        s, out = 1, []
        for d in reversed(self.shape):
            out.append(s)
            s *= d
        return tuple(reversed(out))


def test_report_serializes():
    q = torch.randn(1, 8, 2, 16)
    data = json.loads(lz.explain("attention", q=q, k=q, v=q).to_json())
    assert data["candidates"]


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_paged_attention_reads_the_block_table_like_dense_attention(kv_layout):
    g = torch.Generator().manual_seed(9)
    pages, page, hkv, d = 8, 4, 2, 32
    k_nhd = torch.randn(pages, page, hkv, d, generator=g)
    v_nhd = torch.randn(pages, page, hkv, d, generator=g)
    table = torch.tensor([[5, 2, 7, 0], [1, 6, 3, 4]], dtype=torch.int32)
    lens = torch.tensor([7, 13], dtype=torch.int32)
    q = torch.randn(2, 1, 4, d, generator=g)
    if kv_layout == "HND":
        k_cache, v_cache = k_nhd.transpose(1, 2).contiguous(), v_nhd.transpose(1, 2).contiguous()
    else:
        k_cache, v_cache = k_nhd, v_nhd
    got = lz.ops.paged_attention(q, k_cache, v_cache, table, lens, kv_layout=kv_layout)
    for b in range(2):
        n = int(lens[b])
        k = k_nhd[table[b].long()].reshape(-1, hkv, d)[:n].unsqueeze(0)
        v = v_nhd[table[b].long()].reshape(-1, hkv, d)[:n].unsqueeze(0)
        close(got[b : b + 1], sdpa_bshd(q[b : b + 1], k, v, causal=True), torch.float32)


def test_the_gil_is_released_while_a_kernel_runs():
    import threading
    import time

    q = torch.randn(1, 1024, 8, 64)
    done = threading.Event()
    ticks = 0

    def work():
        for _ in range(3):
            lz.ops.attention(q, q, q, causal=True)
        done.set()

    t = threading.Thread(target=work)
    start = time.perf_counter()
    t.start()
    while not done.is_set():
        ticks += 1  # pure Python: runs only while the other thread does not hold the GIL
    t.join()
    elapsed = time.perf_counter() - start
    # Three 1024-token attentions take tens of milliseconds or more; a GIL held through them
    # would leave this loop a few switch intervals' worth of ticks (5 ms each).
    assert elapsed > 0.02 and ticks > 100_000, (elapsed, ticks)


def test_an_object_that_only_looks_like_a_tensor_is_never_read_by_address():
    class Impostor:
        shape, dtype, is_cpu = (1, 4, 2, 8), torch.float32, True

        def stride(self):
            return (64, 16, 8, 1)

        def is_contiguous(self):
            return True

        def data_ptr(self):
            return 16  # an address no one owns

    q = torch.randn(1, 4, 2, 8)
    with pytest.raises(lz.InvalidInputError, match="argument `k`.*only a torch.Tensor"):
        lz.ops.attention(q, Impostor(), q)


def test_inputs_on_two_devices_are_refused_naming_both_tensors_and_devices():
    q = torch.randn(1, 4, 2, 8, dtype=torch.bfloat16)
    k = _Desc((1, 4, 2, 8), "cuda:0")  # described only: no GPU is needed to be refused
    with pytest.raises(lz.InvalidInputError, match=r"DEVICE_MIXED: tensor `k` is on cuda:0 but tensor `q` is on cpu"):
        lz.select("attention", q=q, k=k, v=q)
    if torch.cuda.is_available():
        k = torch.randn(1, 4, 2, 8, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(lz.InvalidInputError, match=r"DEVICE_MIXED: tensor `k` is on cuda:0 but tensor `q` is on cpu"):
            lz.ops.attention(q, k, q, causal=True)
    else:
        # Running a call lends memory: a description is refused before anything is selected.
        with pytest.raises(lz.InvalidInputError, match=r"argument `k`: a _Desc .* only a torch.Tensor"):
            lz.ops.attention(q, k, q, causal=True)
