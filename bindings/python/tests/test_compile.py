"""torch.compile and torch.export over LayerZero's ops (layerzero.torch_ops): each op passes
torch.library.opcheck; a block of rms_norm, GQA causal attention and a gated MLP compiles
with fullgraph=True (inductor) and exports with the ops kept as nodes, giving eager's outputs;
the kernel is selected when the op runs, never when it is traced."""

import importlib
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import layerzero as lz
import layerzero.torch_ops

L = torch.ops.layerzero

# The tests of opcheck run. test_autograd_registration runs on the cases whose float inputs
# require grad: the ops have no autograd formula, and the check passes because no output of
# the CPU kernel requires grad (torch's autograd fallback then attaches one that warns on
# backward; test_aot_dispatch_dynamic's backward triggers that warning, filtered below).
OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")

pytestmark = pytest.mark.filterwarnings("ignore:.*an autograd kernel was not registered:UserWarning")


def _r(*shape, dtype=torch.float32, grad=False):
    t = torch.randn(*shape, dtype=dtype)
    return t.requires_grad_() if grad else t


def _slopes(heads):
    start = 2 ** (-(2 ** -(math.log2(heads) - 3)))
    return torch.tensor([start * start**i for i in range(heads)])


def _cases():
    """(op, label, args, kwargs): f32 cases with inputs that require grad, bf16 ones."""
    torch.manual_seed(0)
    bf = torch.bfloat16
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)

    def qkv(b, sq, sk, dtype=torch.float32, grad=False, dv=16):
        return _r(b, sq, 4, 16, dtype=dtype, grad=grad), _r(b, sk, 2, 16, dtype=dtype, grad=grad), _r(b, sk, 2, dv, dtype=dtype)

    def mlp_w(dtype=torch.float32):
        return _r(32, 64, dtype=dtype), _r(32, 64, dtype=dtype), _r(64, 32, dtype=dtype)

    bhsd = tuple(t.transpose(1, 2).contiguous() for t in qkv(1, 5, 5, dv=8)) + (_r(1, 1, 5, 5),)
    sampling = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.01, "seed": 7}
    return [
        ("attention", "gqa_causal_f32", qkv(1, 5, 5, grad=True), {"causal": True}),
        ("attention", "gqa_causal_bf16", qkv(1, 5, 5, dtype=bf), {"causal": True}),
        ("attention", "decode_scale_softcap", qkv(2, 1, 7), {"causal": True, "scale": 0.1, "softcap": 30.0}),
        ("attention", "bhsd_float_mask_dv8", bhsd, {"layout": "BHSD"}),
        ("attention", "window_alibi", qkv(1, 5, 5), {"causal": True, "window": 2, "alibi_slopes": _slopes(4)}),
        ("attention", "varlen", qkv(1, 9, 9), {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "causal": True}),
        ("rms_norm", "f32", (_r(3, 64, grad=True), _r(64, grad=True)), {}),
        ("rms_norm", "bf16_eps", (_r(2, 3, 64, dtype=bf), _r(64, dtype=bf)), {"eps": 1e-5}),
        ("rms_norm_residual", "f32", (_r(3, 64, grad=True), _r(64), _r(3, 64, grad=True)), {}),
        ("rms_norm_residual", "bf16", (_r(2, 3, 64, dtype=bf), _r(64, dtype=bf), _r(2, 3, 64, dtype=bf)), {"eps": 1e-5}),
        ("layer_norm", "f32_bias", (_r(3, 64, grad=True), _r(64), _r(64)), {}),
        ("layer_norm", "bf16_no_bias", (_r(2, 3, 64, dtype=bf), _r(64, dtype=bf)), {"eps": 1e-6}),
        ("rope", "positions", (_r(1, 5, 4, 16, grad=True), torch.arange(5)), {}),
        ("rope", "interleaved_partial_bf16", (_r(1, 5, 4, 16, dtype=bf),), {"style": "interleaved", "rotary_dim": 8, "base": 500.0}),
        ("rope_qk", "cos_sin", qkv(1, 5, 5)[:2] + (torch.arange(5), _r(16, 8), _r(16, 8)), {}),
        ("rope_qk", "positions_2d", qkv(2, 5, 5)[:2] + (torch.arange(10).view(2, 5) % 7,), {}),
        ("linear", "f32_bias", (_r(3, 64, grad=True), _r(32, 64), _r(32)), {}),
        ("linear", "bf16", (_r(2, 3, 64, dtype=bf), _r(32, 64, dtype=bf)), {}),
        ("swiglu", "split", (_r(3, 64, grad=True),), {}),
        ("swiglu", "gate_up_bf16", (_r(3, 32, dtype=bf), _r(3, 32, dtype=bf)), {}),
        ("mlp", "silu_f32", (_r(3, 64, grad=True),) + mlp_w(), {}),
        ("mlp", "gelu_tanh_bf16", (_r(3, 64, dtype=bf),) + mlp_w(bf), {"activation": "gelu_tanh"}),
        ("embedding", "int64_f32", (torch.tensor([[0, 3], [4, 1]]), _r(5, 8, grad=True)), {}),
        ("embedding", "int32_bf16", (torch.tensor([2, 2, 0], dtype=torch.int32), _r(5, 8, dtype=bf)), {}),
        ("sample", "greedy", (_r(2, 10),), {}),
        ("sample", "seeded_filters", (_r(3, 50),), sampling),
    ]


_CASES = _cases()


def test_every_op_is_registered_once_and_a_reload_registers_nothing_again():
    for name in layerzero.torch_ops.OPS:
        assert hasattr(L, name), name
    before = {name: str(getattr(L, name).default._schema) for name in layerzero.torch_ops.OPS}
    importlib.reload(layerzero.torch_ops)
    importlib.import_module("layerzero.torch_ops")
    after = {name: str(getattr(L, name).default._schema) for name in layerzero.torch_ops.OPS}
    assert before == after
    x, w = _r(2, 64), _r(64)
    assert torch.equal(L.rms_norm(x, w), lz.ops.rms_norm(x, w))


def test_every_op_has_a_cpu_and_a_cuda_kernel_so_a_gpu_model_dispatches_through_it():
    # On CUDA tensors the op selects among the GPU kernels (torch SDPA, Liger, ...); the
    # registration is what lets a graph built on a GPU call it (checked here without one).
    for name in layerzero.torch_ops.OPS:
        for key in ("CPU", "CUDA"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"layerzero::{name}", key), (name, key)


def test_every_registered_op_has_an_opcheck_case():
    assert {c[0] for c in _CASES} == set(layerzero.torch_ops.OPS)


@pytest.mark.parametrize("op,label,args,kwargs", _CASES, ids=[f"{c[0]}-{c[1]}" for c in _CASES])
def test_opcheck(op, label, args, kwargs):
    result = torch.library.opcheck(getattr(L, op).default, args, kwargs, test_utils=OPCHECK_UTILS)
    assert set(result.values()) == {"SUCCESS"}, result


def test_the_ops_give_lz_ops_results():
    q, k, v = _r(1, 5, 4, 16), _r(1, 5, 2, 16), _r(1, 5, 2, 16)
    assert torch.equal(L.attention(q, k, v, causal=True), lz.ops.attention(q, k, v, causal=True))
    x, w, res = _r(3, 64), _r(64), _r(3, 64)
    out, s = L.rms_norm_residual(x, w, res, 1e-5)
    want_out, want_s = lz.ops.rms_norm(x, w, eps=1e-5, residual=res)
    assert torch.equal(out, want_out) and torch.equal(s, want_s)
    qo, ko = L.rope_qk(q, k, torch.arange(5))
    want_q, want_k = lz.ops.rope(q, k, positions=torch.arange(5))
    assert torch.equal(qo, want_q) and torch.equal(ko, want_k)
    assert torch.equal(L.swiglu(x), lz.ops.swiglu(x))


def test_errors_come_through_the_op_as_layerzero_errors():
    with pytest.raises(lz.InvalidInputError, match="outside"):
        L.embedding(torch.tensor([7]), _r(5, 8))
    x, w = _r(2, 64, dtype=torch.bfloat16), _r(64)  # a bf16 x with an f32 weight
    with pytest.raises(lz.LayerZeroError) as direct:
        lz.ops.rms_norm(x, w)
    with pytest.raises(type(direct.value)):
        L.rms_norm(x, w)


def test_attention_is_tagged_as_seeded_like_sdpa():
    assert torch.Tag.nondeterministic_seeded in L.attention.default.tags
    for name in layerzero.torch_ops.OPS:
        assert torch.Tag.pt2_compliant_tag in getattr(L, name).default.tags


def test_fake_kernels_give_shapes_without_selecting_anything():
    from torch._subclasses.fake_tensor import FakeTensorMode

    before = lz.counters()
    with FakeTensorMode():
        q, k, v = torch.empty(2, 13, 4, 16), torch.empty(2, 13, 2, 16), torch.empty(2, 13, 2, 8)
        out = L.attention(q, k, v, causal=True)
        assert out.shape == (2, 13, 4, 8) and out.dtype == torch.float32
        emb = L.embedding(torch.empty(3, 4, dtype=torch.int32), torch.empty(11, 6, dtype=torch.bfloat16))
        assert emb.shape == (3, 4, 6) and emb.dtype == torch.bfloat16
        assert L.swiglu(torch.empty(3, 10)).shape == (3, 5)
        assert L.sample(torch.empty(4, 10)).dtype == torch.int64
    assert lz.counters() == before


class Block(nn.Module):
    """A pre-norm decoder layer made of LayerZero ops: rms_norm, q/k/v projections, causal
    GQA attention, output projection, fused residual rms_norm, gated MLP."""

    def __init__(self, hidden=64, heads=4, kv_heads=2, head_dim=16, inter=96):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        g = torch.Generator().manual_seed(0)

        def p(*shape, scale=0.1):
            return nn.Parameter(torch.randn(*shape, generator=g) * scale)

        self.norm1 = p(hidden, scale=1.0)
        self.norm2 = p(hidden, scale=1.0)
        self.wq = p(heads * head_dim, hidden)
        self.wk = p(kv_heads * head_dim, hidden)
        self.wv = p(kv_heads * head_dim, hidden)
        self.wo = p(hidden, heads * head_dim)
        self.w_gate = p(inter, hidden)
        self.w_up = p(inter, hidden)
        self.w_down = p(hidden, inter)

    def forward(self, x):
        b, s, _ = x.shape
        h = L.rms_norm(x, self.norm1, 1e-6)
        q = L.linear(h, self.wq).view(b, s, self.heads, self.head_dim)
        k = L.linear(h, self.wk).view(b, s, self.kv_heads, self.head_dim)
        v = L.linear(h, self.wv).view(b, s, self.kv_heads, self.head_dim)
        a = L.attention(q, k, v, causal=True)
        o = L.linear(a.reshape(b, s, self.heads * self.head_dim), self.wo)
        h2, resid = L.rms_norm_residual(o, self.norm2, x, 1e-6)
        return resid + L.mlp(h2, self.w_gate, self.w_up, self.w_down)


N_LZ_OPS = 8  # layerzero ops per Block.forward


@pytest.fixture(scope="module")
def block():
    return Block().eval()


def _reference_block(m, x):
    """Block.forward in plain PyTorch, to check the ops' composition against."""
    b, s, _ = x.shape
    h = F.rms_norm(x, (x.shape[-1],), m.norm1, eps=1e-6)
    q = F.linear(h, m.wq).view(b, s, m.heads, m.head_dim).transpose(1, 2)
    k = F.linear(h, m.wk).view(b, s, m.kv_heads, m.head_dim).transpose(1, 2)
    v = F.linear(h, m.wv).view(b, s, m.kv_heads, m.head_dim).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
    resid = F.linear(a.reshape(b, s, -1), m.wo) + x
    h2 = F.rms_norm(resid, (x.shape[-1],), m.norm2, eps=1e-6)
    return resid + F.linear(F.silu(F.linear(h2, m.w_gate)) * F.linear(h2, m.w_up), m.w_down)


def _lz_targets(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith("layerzero.")]


def test_the_block_matches_plain_pytorch(block):
    x = _r(2, 7, 64)
    with torch.no_grad():
        torch.testing.assert_close(block(x), _reference_block(block, x), atol=1e-5, rtol=1e-5)


def test_dynamo_traces_the_block_in_one_graph(block):
    with torch.no_grad():
        explained = torch._dynamo.explain(block)(_r(1, 6, 64))
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert len(_lz_targets(explained.graphs[0])) == N_LZ_OPS


def test_torch_compile_fullgraph_inductor_gives_eager_outputs_and_selects_at_run_time(block):
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="inductor")
    with torch.no_grad():
        x = _r(1, 6, 64)
        torch.testing.assert_close(compiled(x), block(x), atol=1e-6, rtol=0)

        # A sequence length no other test runs: the first call selects for the new shapes
        # (cache misses), each later call hits the cache once per op. Compiled code runs the
        # selection inside the op, per call.
        x = _r(1, 23, 64)
        before = lz.counters()
        y = compiled(x)
        first = lz.counters()
        assert first["cache_misses"] > before["cache_misses"]
        assert (first["cache_hits"] + first["cache_misses"]) - (before["cache_hits"] + before["cache_misses"]) == N_LZ_OPS
        y2 = compiled(x)
        second = lz.counters()
        assert second["cache_hits"] - first["cache_hits"] == N_LZ_OPS
        assert second["cache_misses"] == first["cache_misses"]
        torch.testing.assert_close(y, block(x), atol=1e-6, rtol=0)
        assert torch.equal(y, y2)


def test_torch_export_keeps_the_ops_with_their_shapes_and_runs_like_eager(block):
    x = _r(2, 19, 64)
    before = lz.counters()
    seq = torch.export.Dim("seq", min=2, max=512)
    with torch.no_grad():
        exported = torch.export.export(block, (x,), dynamic_shapes={"x": {1: seq}})
    assert lz.counters() == before, "tracing for export selected a kernel"

    nodes = _lz_targets(exported.graph_module)
    assert sorted({str(n.target) for n in nodes}) == sorted(
        f"layerzero.{name}.default" for name in ("rms_norm", "linear", "attention", "rms_norm_residual", "mlp")
    )
    assert "torch.ops.layerzero.attention.default" in exported.graph_module.code
    # Every output: f32 on the CPU, [2, seq, ...] with seq symbolic, the rest as the op gives.
    last_dims = {
        "rms_norm": [(64,)],
        "linear": [(64,), (32,), (32,), (64,)],  # q, k, v projections, then the output one
        "attention": [(4, 16)],
        "rms_norm_residual": [(64,), (64,)],
        "mlp": [(64,)],
    }
    seen = {}
    for n in nodes:
        name = n.target._opname
        vals = n.meta["val"] if isinstance(n.meta["val"], (tuple, list)) else (n.meta["val"],)
        for val in vals:
            assert val.dtype == torch.float32 and val.device.type == "cpu"
            assert val.shape[0] == 2 and isinstance(val.shape[1], torch.SymInt), val.shape
            seen.setdefault(name, []).append(tuple(val.shape[2:]))
    for name, dims in last_dims.items():
        assert seen[name] == dims, (name, seen[name])

    module = exported.module()
    with torch.no_grad():
        for s in (19, 5):
            xs = _r(2, s, 64)
            torch.testing.assert_close(module(xs), block(xs), atol=1e-6, rtol=0)
