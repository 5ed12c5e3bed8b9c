"""FlashInfer's executors hand the library what the request says. FlashInfer cannot be installed
where this project is tested, so a stand-in records the calls its documented API receives: a
fused RoPE becomes pos_encoding_mode="ROPE_LLAMA" with its base and linear scale, what
ROPE_LLAMA cannot do is refused, and a packed batch goes through the ragged wrapper with its
cu_seqlens as the indptrs."""

import pytest

torch = pytest.importorskip("torch")

from layerzero.backends import flashinfer as fib  # noqa: E402


class StandIn:
    """The FlashInfer calls the executors make, recorded; outputs are zeros of the right shape."""

    def __init__(self):
        self.calls = []
        calls = self.calls

        class Ragged:
            def __init__(self, workspace, layout, backend=None):
                calls.append(("ragged", {"layout": layout, "backend": backend}))

            def plan(self, qo_indptr, kv_indptr, heads, kv_heads, head_dim, **kw):
                calls.append(("ragged.plan", dict(kw, qo_indptr=qo_indptr.tolist(), kv_indptr=kv_indptr.tolist(),
                                                  heads=heads, kv_heads=kv_heads, head_dim=head_dim)))
                self.dv = kw["head_dim_vo"]

            def run(self, q, k, v):
                calls.append(("ragged.run", {"q": tuple(q.shape)}))
                return torch.zeros(q.shape[0], q.shape[1], self.dv)

        self.BatchPrefillWithRaggedKVCacheWrapper = Ragged

    def single_prefill_with_kv_cache(self, q, k, v, **kw):
        self.calls.append(("single_prefill", kw))
        return torch.zeros(q.shape[0], q.shape[1], v.shape[2])

    def single_decode_with_kv_cache(self, q, k, v, **kw):
        self.calls.append(("single_decode", kw))
        return torch.zeros(q.shape[0], v.shape[2])


def executor(kernel):
    fi = StandIn()
    (_, _, _, executors), = fib.backends()
    return fi, executors(fi)[kernel]


def dense(sq, sk, heads=4, dim=64):
    return {name: torch.zeros(1, s, heads, dim, dtype=torch.float16) for name, s in (("q", sq), ("k", sk), ("v", sk))}


def test_a_fused_rope_is_run_as_rope_llama_with_its_base_and_linear_scale():
    fi, run = executor("flashinfer.attention.prefill")
    rope = {"style": "rotate_half", "rotary_dim": None, "base": 500000.0, "scaling": {"type": "linear", "factor": 8.0}}
    out = run(dense(16, 32), {"causal": True, "rope": rope})
    assert tuple(out.shape) == (1, 16, 4, 64)
    (name, kw), = fi.calls
    assert name == "single_prefill" and kw["causal"] is True
    assert (kw["pos_encoding_mode"], kw["rope_theta"], kw["rope_scale"]) == ("ROPE_LLAMA", 500000.0, 8.0)


def test_decode_takes_the_default_base_and_no_scaling():
    fi, run = executor("flashinfer.attention.decode")
    run(dense(1, 32), {"rope": {"style": "rotate_half", "rotary_dim": 64, "base": None, "scaling": None}})
    (name, kw), = fi.calls
    assert name == "single_decode"
    assert (kw["pos_encoding_mode"], kw["rope_theta"], kw["rope_scale"]) == ("ROPE_LLAMA", 10000.0, 1.0)


@pytest.mark.parametrize("rope, alibi", [
    ({"style": "interleaved"}, False),
    ({"style": "rotate_half", "rotary_dim": 32}, False),
    ({"style": "rotate_half", "scaling": {"type": "yarn", "factor": 4.0, "original_max_position": 4096}}, False),
    ({"style": "rotate_half"}, True),
])
def test_what_rope_llama_cannot_do_is_refused_before_flashinfer_is_called(rope, alibi):
    fi, run = executor("flashinfer.attention.prefill")
    with pytest.raises(ValueError):
        run(dense(16, 32), {"rope": rope, "alibi": alibi})
    assert fi.calls == []


def test_a_packed_batch_goes_through_the_ragged_wrapper_with_its_cu_seqlens():
    fi, run = executor("flashinfer.attention.prefill")
    tensors = dense(30, 12)
    tensors["v"] = torch.zeros(1, 12, 4, 32, dtype=torch.float16)
    tensors["cu_seqlens_q"] = torch.tensor([0, 10, 30], dtype=torch.int32)
    tensors["cu_seqlens_k"] = torch.tensor([0, 4, 12], dtype=torch.int32)
    out = run(tensors, {"causal": True})
    assert tuple(out.shape) == (1, 30, 4, 32)
    (_, made), (_, plan), (_, ran) = fi.calls
    assert made == {"layout": "NHD", "backend": "fa2"}
    assert (plan["qo_indptr"], plan["kv_indptr"]) == ([0, 10, 30], [0, 4, 12])
    assert (plan["heads"], plan["kv_heads"], plan["head_dim"], plan["head_dim_vo"]) == (4, 4, 64, 32)
    assert plan["causal"] is True and "pos_encoding_mode" not in plan
    assert ran == {"q": (30, 4, 64)}
