"""HF transformers through LayerZero: `attn_implementation="layerzero"` against transformers'
own eager attention on the committed tiny checkpoints (tests/models), plus the attention
function's contract checked directly and the opt-in RMSNorm / MLP patch.

Tolerance: everything runs in float32. Eager attention forms QK^T with one matmul and a
softmax; LayerZero's kernels accumulate blockwise with an online softmax, so the two differ
by float32 rounding only (observed ~2e-6 on logits of magnitude ~1-10 after 2-8 layers).
atol = rtol = 1e-4 leaves ~50x margin for that and is still ~1000x tighter than any real
masking or scaling error (a wrong window, a wrong causal alignment or a leaked pad key moves
logits by 1e-2..1). Greedy decoding must give identical tokens.
"""

import json
import math
import types
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import layerzero as lz  # noqa: E402
import layerzero.transformers as lzt  # noqa: E402

MODELS = Path(__file__).resolve().parents[3] / "tests" / "models"
REQUIRED = ["llama-gqa", "qwen3", "mistral-swa", "llama-tied-llama3"]
ATOL = RTOL = 1e-4
SEQ, BATCH, PAD, NEW_TOKENS = 24, 2, 5, 8


def _causal_lm_dirs():
    names = []
    for d in sorted(MODELS.iterdir()):
        cfg = d / "config.json"
        if cfg.is_file() and (d / "model.safetensors").is_file():
            archs = json.loads(cfg.read_text()).get("architectures") or []
            if any(a.endswith("ForCausalLM") for a in archs):
                names.append(d.name)
    return names


CAUSAL_LMS = _causal_lm_dirs()
_loaded = {}


def load(name, attn):
    key = (name, attn)
    if key not in _loaded:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            MODELS / name, attn_implementation=attn, dtype=torch.float32
        )
        _loaded[key] = model.eval()
    return _loaded[key]


def prompt(seed=0, vocab=256):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, :PAD] = 0  # row 1 left-padded
    ids[1, :PAD] = 0
    return ids, mask


def lz_calls(c):
    return c["plan_hits"] + c["cache_hits"] + c["cache_misses"] + c["uncacheable"]


def delta(before, after):
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def test_the_committed_models_cover_the_required_ones():
    assert set(REQUIRED) <= set(CAUSAL_LMS), CAUSAL_LMS
    sw = json.loads((MODELS / "mistral-swa" / "config.json").read_text())["sliding_window"]
    assert sw is not None and SEQ - PAD > 2 * sw, "the prompt must be longer than mistral-swa's window"


def test_register_is_idempotent_and_registers_attention_and_mask():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = (len(AttentionInterface._global_mapping), len(AttentionMaskInterface._global_mapping))
    for _ in range(3):
        assert lzt.register() == "layerzero"
    import layerzero.transformers as again  # noqa: F401  (a second import registers nothing new)

    assert again is lzt
    assert (len(AttentionInterface._global_mapping), len(AttentionMaskInterface._global_mapping)) == before
    assert ALL_ATTENTION_FUNCTIONS["layerzero"] is lzt.attention_forward
    assert ALL_ATTENTION_FUNCTIONS.valid_keys().count("layerzero") == 1
    assert ALL_MASK_ATTENTION_FUNCTIONS["layerzero"] is sdpa_mask
    model = load("llama-gqa", "layerzero")
    assert model.config._attn_implementation == "layerzero"


@pytest.mark.parametrize("name", CAUSAL_LMS)
def test_logits_match_eager_with_a_left_padded_batch(name):
    eager, lzm = load(name, "eager"), load(name, "layerzero")
    layers = lzm.config.num_hidden_layers
    ids, mask = prompt()
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask).logits
        before = lz.counters()
        got = lzm(input_ids=ids, attention_mask=mask).logits
        after = lz.counters()
        with lzt.trace() as calls:
            lzm(input_ids=ids, attention_mask=mask)
    d = delta(before, after)
    assert lz_calls(after) - lz_calls(before) == layers, d  # every attention call went through lz
    assert d.get("fallbacks", 0) == 0 and d.get("kernel_failures", 0) == 0, d
    assert len(calls) == layers
    kernels = sorted({c["kernel"] for c in calls})
    assert all(not k.startswith("<none") for k in kernels), kernels
    # padding reaches LayerZero as transformers' boolean mask, k/v with their own (GQA) heads
    assert all(c["mask"] is not None and c["mask"][0] == "torch.bool" for c in calls), calls
    kv_heads = lzm.config.num_key_value_heads
    assert all(c["k"][1] == kv_heads and c["q"][1] == lzm.config.num_attention_heads for c in calls)
    valid = mask.bool()  # pad rows attend to nothing; their logits are implementation-defined
    diff = (got - want).abs()[valid].max().item()
    print(f"{name}: max |logits - eager| = {diff:.3g} (valid positions), kernels {kernels}, counters {d}")
    assert torch.isfinite(got[valid]).all()
    torch.testing.assert_close(got[valid], want[valid], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", CAUSAL_LMS)
def test_logits_match_eager_without_padding(name):
    eager, lzm = load(name, "eager"), load(name, "layerzero")
    ids, _ = prompt(seed=1)
    with torch.no_grad():
        want = eager(input_ids=ids).logits
        with lzt.trace() as calls:
            got = lzm(input_ids=ids).logits
    sw = getattr(lzm.config, "sliding_window", None)
    if sw is None or not sw:
        # no mask from transformers: LayerZero's own causal masking (Sq == Sk)
        assert all(c["mask"] is None and c["causal"] for c in calls), calls
    diff = (got - want).abs().max().item()
    print(f"{name}: max |logits - eager| = {diff:.3g} (no padding), kernels {sorted({c['kernel'] for c in calls})}")
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("padded", [True, False], ids=["left-padded", "unpadded"])
@pytest.mark.parametrize("name", CAUSAL_LMS)
def test_greedy_generate_matches_eager(name, padded):
    eager, lzm = load(name, "eager"), load(name, "layerzero")
    ids, mask = prompt(seed=2)
    if not padded:  # decoding then gets no mask from transformers (except past a sliding window)
        mask = torch.ones_like(mask)
    kw = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = eager.generate(ids, **kw)
        before = lz.counters()
        with lzt.trace() as calls:
            got = lzm.generate(ids, **kw)
        after = lz.counters()
    assert got.shape == (BATCH, SEQ + NEW_TOKENS)
    assert got.tolist() == want.tolist(), (got[:, SEQ:].tolist(), want[:, SEQ:].tolist())
    decode = [c for c in calls if c["q"][2] == 1]
    assert decode and all(not c["causal"] for c in decode)  # one query is never masked top-left
    if not padded and not getattr(lzm.config, "sliding_window", None):
        assert all(c["mask"] is None and c["k"][2] > 1 for c in decode), decode
    assert lz_calls(after) - lz_calls(before) >= len(calls) == lzm.config.num_hidden_layers * NEW_TOKENS
    kernels = sorted({c["kernel"] for c in calls})
    print(f"{name} ({'left-padded' if padded else 'unpadded'}): generated {got[:, SEQ:].tolist()}, kernels {kernels}")


def test_static_cache_prefill_cuts_the_unwritten_keys():
    """An empty static cache prefill without padding: transformers gives no mask and keys of the
    cache's full length; SDPA relies on its top-left is_causal there."""
    eager, lzm = load("llama-gqa", "eager"), load("llama-gqa", "layerzero")
    ids, _ = prompt(seed=3)
    kw = dict(
        attention_mask=torch.ones_like(ids),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=0,
        cache_implementation="static",
    )
    with torch.no_grad():
        want = eager.generate(ids, **kw)
        with lzt.trace() as calls:
            got = lzm.generate(ids, **kw)
    assert got.tolist() == want.tolist()
    prefill = [c for c in calls if c["q"][2] == SEQ]
    assert prefill and all(c["mask"] is None and c["causal"] and c["k"][2] == SEQ for c in prefill), prefill


def test_the_sliding_window_matters_and_is_honoured():
    name = "mistral-swa"
    lzm = load(name, "layerzero")
    sw = lzm.config.sliding_window
    full = transformers.AutoModelForCausalLM.from_pretrained(
        MODELS / name, attn_implementation="eager", dtype=torch.float32, sliding_window=None
    ).eval()
    assert full.config.sliding_window is None
    ids, mask = prompt(seed=4)
    with torch.no_grad():
        with lzt.trace() as calls:
            got = lzm(input_ids=ids, attention_mask=mask).logits
        unwindowed = full(input_ids=ids, attention_mask=mask).logits
        want = load(name, "eager")(input_ids=ids, attention_mask=mask).logits
    assert all(c["window"] == sw - 1 for c in calls), calls  # window passed as keys left of diagonal
    # row 0 (no padding): positions < window see the same keys either way, later ones do not
    torch.testing.assert_close(got[0, :sw], unwindowed[0, :sw], atol=ATOL, rtol=RTOL)
    assert (got[0, sw:] - unwindowed[0, sw:]).abs().max() > 1e-2
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=ATOL, rtol=RTOL)


# --- the attention function's contract, checked directly against transformers' eager ---------


def _module(kv_groups, causal=True):
    return types.SimpleNamespace(
        is_causal=causal, num_key_value_groups=kv_groups, training=False, config=types.SimpleNamespace(), layer_idx=0
    )


def _eager(module, q, k, v, mask, scaling, softcap=None):
    from transformers.integrations.sdpa_attention import repeat_kv

    k = repeat_kv(k, module.num_key_value_groups)
    v = repeat_kv(v, module.num_key_value_groups)
    s = torch.matmul(q, k.transpose(2, 3)) * scaling
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    return torch.matmul(s.softmax(-1), v).transpose(1, 2)


def _qkv(b=2, hq=4, hkv=2, sq=20, sk=20, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    # transformers' q/k/v: [B, S, H, D] projections viewed as [B, H, S, D] (not contiguous)
    q = torch.randn(b, sq, hq, d, generator=g).transpose(1, 2)
    k = torch.randn(b, sk, hkv, d, generator=g).transpose(1, 2)
    v = torch.randn(b, sk, hkv, d, generator=g).transpose(1, 2)
    return q, k, v


def _causal(sq, sk, window=None):
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    keep = j <= i
    if window is not None:
        keep &= j > i - window
    return keep[None, None]


def test_the_output_is_batch_seq_heads_dim_and_no_weights():
    q, k, v = _qkv()
    out, weights = lzt.attention_forward(_module(2), q, k, v, None, scaling=0.25)
    assert weights is None
    assert out.shape == (2, 20, 4, 16) and out.is_contiguous()
    torch.testing.assert_close(out, _eager(_module(2), q, k, v, _causal(20, 20), 0.25), atol=1e-5, rtol=1e-5)


def test_a_window_without_a_mask_is_run_by_layerzero():
    q, k, v = _qkv(sq=32, sk=32)
    with lzt.trace() as calls:
        out, _ = lzt.attention_forward(_module(2), q, k, v, None, scaling=0.25, sliding_window=5)
    assert calls[0]["window"] == 4 and calls[0]["causal"] and calls[0]["mask"] is None
    torch.testing.assert_close(out, _eager(_module(2), q, k, v, _causal(32, 32, 5), 0.25), atol=1e-5, rtol=1e-5)


def test_one_query_sees_every_key_and_a_longer_key_cache_is_cut_for_prefill():
    q, k, v = _qkv(sq=1, sk=17)
    out, _ = lzt.attention_forward(_module(2), q, k, v, None, scaling=0.25)
    torch.testing.assert_close(out, _eager(_module(2), q, k, v, None, 0.25), atol=1e-5, rtol=1e-5)
    # Sk > Sq > 1 without a mask: SDPA's top-left is_causal (an empty static cache)
    q, k, v = _qkv(sq=6, sk=17)
    out, _ = lzt.attention_forward(_module(2), q, k, v, None, scaling=0.25)
    top_left = (torch.arange(17)[None, :] <= torch.arange(6)[:, None])[None, None]
    torch.testing.assert_close(out, _eager(_module(2), q, k, v, top_left, 0.25), atol=1e-5, rtol=1e-5)


def test_additive_float_masks_longer_than_the_keys_and_softcap():
    q, k, v = _qkv(sq=12, sk=12)
    g = torch.Generator().manual_seed(5)
    keep = _causal(12, 12) & (torch.rand(2, 1, 12, 12, generator=g) > 0.3)
    keep[..., 0] = True
    # an additive mask 4 keys longer than the keys (cut to them), with -min entries and a bias
    wide = torch.cat([keep, torch.ones(2, 1, 12, 4, dtype=torch.bool)], -1)
    additive = torch.zeros(2, 1, 12, 16).masked_fill(~wide, torch.finfo(torch.float32).min)
    additive[..., :12] += torch.randn(2, 1, 12, 12, generator=g)
    out, _ = lzt.attention_forward(_module(2), q, k, v, additive, scaling=0.3)
    torch.testing.assert_close(out, _eager(_module(2), q, k, v, additive[..., :12], 0.3), atol=1e-5, rtol=1e-5)
    out, _ = lzt.attention_forward(_module(2), q, k, v, keep, scaling=0.3, softcap=2.0)
    torch.testing.assert_close(out, _eager(_module(2), q, k, v, keep, 0.3, softcap=2.0), atol=1e-5, rtol=1e-5)


def test_a_non_causal_module_is_not_masked():
    q, k, v = _qkv(hkv=4, sq=9, sk=9)
    out, _ = lzt.attention_forward(_module(1, causal=False), q, k, v, None, scaling=0.25)
    torch.testing.assert_close(out, _eager(_module(1), q, k, v, None, 0.25), atol=1e-5, rtol=1e-5)


# --- opt-in RMSNorm / MLP patch -----------------------------------------------------------------


@pytest.mark.parametrize("name", REQUIRED)
def test_patch_modules_routes_norms_and_mlps_through_layerzero(name):
    eager = load(name, "eager")
    patched = transformers.AutoModelForCausalLM.from_pretrained(
        MODELS / name, attn_implementation="layerzero", dtype=torch.float32
    ).eval()
    cfg = patched.config
    counts = lzt.patch_modules(patched)
    # input + post-attention norm per layer and the final norm (+ q/k norms per layer for Qwen3)
    norms = 2 * cfg.num_hidden_layers + 1 + (2 * cfg.num_hidden_layers if cfg.model_type == "qwen3" else 0)
    assert counts == {"rms_norm": norms, "mlp": cfg.num_hidden_layers}
    assert lzt.patch_modules(patched) == counts  # idempotent
    ids, mask = prompt(seed=6)
    with torch.no_grad():
        want = eager(input_ids=ids, attention_mask=mask).logits
        before = lz.counters()
        got = patched(input_ids=ids, attention_mask=mask).logits
        after = lz.counters()
        assert lz_calls(after) - lz_calls(before) == norms + 2 * cfg.num_hidden_layers  # + mlp and attention
        gen = patched.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        want_gen = eager.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    valid = mask.bool()
    diff = (got - want).abs()[valid].max().item()
    x = torch.randn(2, SEQ, cfg.hidden_size)
    mlp = patched.model.layers[0].mlp
    kernels = (
        lz.which("rms_norm", x=x, weight=patched.model.norm.weight, eps=cfg.rms_norm_eps),
        lz.which("mlp", x=x, w_gate=mlp.gate_proj.weight, w_up=mlp.up_proj.weight, w_down=mlp.down_proj.weight),
    )
    print(f"{name} patched: max |logits - eager| = {diff:.3g}, kernels {kernels}")
    torch.testing.assert_close(got[valid], want[valid], atol=ATOL, rtol=RTOL)
    assert gen.tolist() == want_gen.tolist()
    assert lzt.unpatch_modules(patched) == norms + cfg.num_hidden_layers
    assert "forward" not in vars(patched.model.norm)


def test_patch_modules_leaves_other_modules_alone():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    assert lzt.patch_modules(model) == {"rms_norm": 0, "mlp": 0}
    assert math.isclose(float(model[1].eps), 1e-5)
