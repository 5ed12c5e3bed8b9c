"""Ops on torch tensors through LayerZero: each call selects a kernel (on a plan or cache hit
after the first call of a shape), runs it with the GIL released, and falls back to the next
kernel when one fails.

CPU tensors are lent to the kernel in place (no copy of inputs); outputs are allocated by
torch and written in place by the kernel (or, when the selected kernel cannot write into
them, copied there once). CUDA tensors are selected for their GPU and handed as they are to
the selected kernel's Python executor (torch SDPA, Liger, ...); LayerZero never reads their
memory on the host, and a kernel that fails falls back as on the CPU. The caller's tensors
are never modified, except an ``out=`` buffer. Every function raises ``layerzero.LayerZeroError`` subclasses: ``InvalidInputError`` naming
the argument and value, ``NoKernelError`` with every candidate's reasons, ``KernelFailedError``
with each attempt.
"""

import contextvars as _contextvars

from . import _lz

__all__ = [
    "attention",
    "paged_attention",
    "rms_norm",
    "layer_norm",
    "rope",
    "linear",
    "swiglu",
    "mlp",
    "embedding",
    "sample",
]

# The handle ops run on inside `layerzero.graph_safe()` (or another scope); None: the process's.
_scoped = _contextvars.ContextVar("layerzero_ops_handle", default=None)

# One Call per op and set of attributes, made on first use (parsing and checking the
# attributes once); a plan or cache hit then costs the lending and the kernel.
_calls = {}


def _call(key, op, attrs, inputs, outputs, layout=None, layouts=None):
    call = _calls.get(key)
    if call is None:
        from . import _ready

        _ready()
        call = _lz.Call(op, attrs, inputs, outputs, layout, layouts)
        _calls[key] = call
    return call


def _torch():
    import torch

    return torch


class _LazyTorch:
    """torch, imported on first use (this package imports without it)."""

    def __getattr__(self, name):
        global _torch_module
        _torch_module = _torch()
        return getattr(_torch_module, name)


_torch_module = _LazyTorch()


def _empty_like_shape(t, shape, dtype=None):
    return _torch().empty(shape, dtype=t.dtype if dtype is None else dtype, device=t.device)


def _alibi_standard(slopes, heads):
    """True when ``slopes`` are the standard geometric ALiBi slopes for ``heads`` heads."""
    from .backends._alibi import slopes as standard

    expect = standard(heads)
    got = slopes.detach().float().flatten().cpu().tolist()
    return len(got) == heads and all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for a, b in zip(got, expect))


_ATTENTION_INPUTS = ["q", "k", "v", "mask", "cu_seqlens_q", "cu_seqlens_k"]


def attention(
    q,
    k,
    v,
    *,
    causal=False,
    causal_align="bottom_right",
    mask=None,
    scale=None,
    window=None,
    softcap=None,
    alibi_slopes=None,
    layout="BSHD",
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    dropout_p=0.0,
    out=None, handle=None,
):
    """Scaled dot-product attention.

    q ``[B, Sq, Hq, D]``, k ``[B, Sk, Hkv, D]``, v ``[B, Sk, Hkv, Dv]`` (``layout="BSHD"``,
    FlashAttention's order) or ``[B, H, S, D]`` (``layout="BHSD"``, SDPA's); ``Hq % Hkv == 0``
    (GQA). ``causal`` masks aligned bottom-right by default, as FlashAttention does (the same
    as top-left when Sq == Sk); ``causal_align="top_left"`` is SDPA's ``is_causal``. ``mask``
    broadcasts to ``[B, Hq, Sq, Sk]`` (bool keeps True; float is added). ``window`` keeps the
    ``window`` keys left of the diagonal (an int, or FlashAttention's ``(left, right)`` with
    right 0 or -1). ``softcap`` applies ``softcap * tanh(s / softcap)``. ``alibi_slopes`` must
    be the standard geometric slopes. Varlen: ``cu_seqlens_q`` / ``cu_seqlens_k`` (int32
    ``[N+1]``) with sequences packed along the sequence dim of batch 1. Returns a tensor of q's
    shape with head dim Dv, in q's dtype and layout.
    """
    if window is None and softcap is None and alibi_slopes is None and not dropout_p:
        # The common call: its Call is found by four attributes.
        call = _plain_attention.get((causal, causal_align, scale, layout))
        if call is None:
            call = _attention_call(causal, causal_align, scale, None, None, False, layout, 0.0)
            _plain_attention[(causal, causal_align, scale, layout)] = call
    else:
        call = _attention_call(causal, causal_align, scale, window, softcap, alibi_slopes, layout, dropout_p, q)
    if out is None:
        try:
            same = v.shape[-1] == q.shape[-1]
        except (AttributeError, IndexError, TypeError):
            same = None  # not tensors: the runtime names the argument
        if same:
            out = _torch_module.empty_like(q, memory_format=_torch_module.contiguous_format)
        elif same is not None:
            out = _empty_like_shape(q, tuple(q.shape[:-1]) + (v.shape[-1],))
    (result,) = _lz.dispatch(
        call, (q, k, v, mask, cu_seqlens_q, cu_seqlens_k), (out,), _scoped.get() if handle is None else handle
    )
    return result


_plain_attention = {}


def _attention_call(causal, causal_align, scale, window, softcap, alibi_slopes, layout, dropout_p, q=None):
    if isinstance(window, (tuple, list)):
        left, right = window
        if right not in (0, -1):
            raise _lz.InvalidInputError(f"argument `window`: {window!r}: only a left window is supported (right 0 or -1)")
        window = None if left is None or left < 0 else int(left)
    alibi = False
    if alibi_slopes is not None and alibi_slopes is not False:
        heads = q.shape[2] if layout == "BSHD" else q.shape[1]
        if not _alibi_standard(alibi_slopes, heads):
            raise _lz.InvalidInputError(
                "argument `alibi_slopes`: only the standard geometric slopes are supported (reason ALIBI_UNSUPPORTED)"
            )
        alibi = True
    key = ("attention", causal, causal_align, scale, window, softcap, alibi, layout, dropout_p)
    return _call(
        key,
        "attention",
        {
            "causal": bool(causal),
            "causal_alignment": causal_align,
            "scale": scale,
            "window_left": window,
            "softcap": softcap,
            "alibi": alibi,
            "dropout_p": float(dropout_p),
        },
        _ATTENTION_INPUTS,
        ["out"],
        layout,
    )


_PAGED_INPUTS = ["q", "k_cache", "v_cache", "block_table", "context_lens", "k_scale", "v_scale"]


def paged_attention(
    q,
    k_cache,
    v_cache,
    block_table,
    context_lens,
    *,
    causal=True,
    scale=None,
    window=None,
    softcap=None,
    k_scale=None,
    v_scale=None,
    kv_layout="NHD",
    out=None, handle=None,
):
    """Attention of q ``[B, Sq, Hq, D]`` over paged KV caches.

    Caches are ``[pages, page_size, Hkv, D]`` (``kv_layout="NHD"``) or
    ``[pages, Hkv, page_size, D]`` (``"HND"``); ``block_table`` (int32/int64 ``[B, max_pages]``)
    maps sequence b's logical page to a physical one; ``context_lens`` (int32 ``[B]``) is each
    sequence's key count; q's Sq rows are each sequence's last Sq positions. fp8 caches are
    dequantized with ``k_scale`` / ``v_scale``. Returns ``[B, Sq, Hq, Dv]`` in q's dtype.
    """
    if kv_layout not in ("NHD", "HND"):
        raise _lz.InvalidInputError(f"argument `kv_layout`: {kv_layout!r}: expected NHD or HND")
    key = ("paged_attention", causal, scale, window, softcap, kv_layout)
    call = _calls.get(key) or _call(
        key,
        "paged_attention",
        {"causal": bool(causal), "scale": scale, "window_left": window, "softcap": softcap},
        _PAGED_INPUTS,
        ["out"],
        "BSHD",
        [("k_cache", kv_layout), ("v_cache", kv_layout)],
    )
    if out is None:
        out = _empty_like_shape(q, tuple(q.shape[:-1]) + (v_cache.shape[-1],))
    (result,) = _lz.dispatch(
        call, (q, k_cache, v_cache, block_table, context_lens, k_scale, v_scale), (out,),
        _scoped.get() if handle is None else handle,
    )
    return result


def rms_norm(x, weight, *, eps=1e-6, residual=None, out=None, handle=None):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim, computed in f32.

    With ``residual``: normalizes ``s = x + residual`` and returns ``(out, s)``.
    """
    if residual is None:
        call = _calls.get(("rms_norm", eps)) or _call(("rms_norm", eps), "rms_norm", {"eps": eps}, ["x", "weight", "residual"], ["out"])
        if out is None:
            out = _torch_module.empty_like(x, memory_format=_torch_module.contiguous_format)
        (result,) = _lz.dispatch(call, (x, weight, None), (out,), _scoped.get() if handle is None else handle)
        return result
    call = _call(("rms_norm+", eps), "rms_norm", {"eps": eps}, ["x", "weight", "residual"], ["out", "residual_out"])
    torch = _torch()
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    res = torch.empty_like(x, memory_format=torch.contiguous_format)
    result = _lz.dispatch(call, (x, weight, residual), (out, res), _scoped.get() if handle is None else handle)
    return result[0], result[1]


def layer_norm(x, weight, bias=None, *, eps=1e-5, out=None, handle=None):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last dim (biased variance)."""
    call = _call(("layer_norm", eps), "layer_norm", {"eps": eps}, ["x", "weight", "bias"], ["out"])
    if out is None:
        out = _torch().empty_like(x, memory_format=_torch().contiguous_format)
    (result,) = _lz.dispatch(call, (x, weight, bias), (out,), _scoped.get() if handle is None else handle)
    return result


def rope(q, k=None, *, positions=None, cos=None, sin=None, style="rotate_half", rotary_dim=None, base=None, handle=None):
    """Rotary position embedding of q (and k) ``[B, S, H, D]``.

    The first ``rotary_dim`` (default D) dims of each head rotate, pairs by ``style``
    (``"rotate_half"``: Llama/NeoX, ``"interleaved"``: GPT-J). Positions are ``positions``
    (int ``[S]`` or ``[B, S]``) or 0..S; angles ``position * base^(-2i/rotary_dim)`` (base
    10000), or taken from ``cos`` / ``sin`` (``[max_position, rotary_dim / 2]``). Returns the
    rotated q, or ``(q, k)`` when k is given.
    """
    key = ("rope", style, rotary_dim, base, k is None)
    outputs = ["out"] if k is None else ["out", "out_k"]
    call = _call(
        key,
        "rope",
        {"style": style, "rotary_dim": rotary_dim, "base": base},
        ["q", "k", "positions", "cos", "sin"],
        outputs,
    )
    torch = _torch()
    outs = (torch.empty_like(q, memory_format=torch.contiguous_format),)
    if k is not None:
        outs += (torch.empty_like(k, memory_format=torch.contiguous_format),)
    result = _lz.dispatch(call, (q, k, positions, cos, sin), outs, _scoped.get() if handle is None else handle)
    return result[0] if k is None else (result[0], result[1])


def linear(x, weight, bias=None, *, out=None, handle=None):
    """``x @ weight.T + bias``: x ``[..., K]``, weight ``[N, K]``; f32 accumulation."""
    call = _call(("linear",), "linear", {}, ["x", "weight", "bias"], ["out"])
    if out is None:
        out = _empty_like_shape(x, tuple(x.shape[:-1]) + (weight.shape[0],))
    (result,) = _lz.dispatch(call, (x, weight, bias), (out,), _scoped.get() if handle is None else handle)
    return result


def swiglu(gate, up=None, *, out=None, handle=None):
    """``silu(gate) * up``; with ``up`` absent, ``gate`` holds gate then up in its last dim."""
    split = up is None
    call = _call(("swiglu", split), "swiglu", {"split": split}, ["x", "gate", "up"], ["out"])
    if out is None:
        shape = tuple(gate.shape[:-1]) + ((gate.shape[-1] // 2,) if split else (gate.shape[-1],))
        out = _empty_like_shape(gate, shape)
    inputs = (gate, None, None) if split else (None, gate, up)
    (result,) = _lz.dispatch(call, inputs, (out,), _scoped.get() if handle is None else handle)
    return result


def mlp(x, w_gate, w_up, w_down, *, activation="silu", out=None, handle=None):
    """A gated MLP: ``(act(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T``; activation ``silu``,
    ``gelu`` or ``gelu_tanh``."""
    call = _call(("mlp", activation), "mlp", {"activation": activation}, ["x", "w_gate", "w_up", "w_down"], ["out"])
    if out is None:
        out = _empty_like_shape(x, tuple(x.shape[:-1]) + (w_down.shape[0],))
    (result,) = _lz.dispatch(call, (x, w_gate, w_up, w_down), (out,), _scoped.get() if handle is None else handle)
    return result


def embedding(ids, table, *, out=None, handle=None):
    """``table[ids]``: ids int32/int64 of any shape, table ``[V, H]``; an id outside [0, V) is
    an ``InvalidInputError`` naming its position."""
    call = _call(("embedding",), "embedding", {}, ["ids", "table"], ["out"])
    if out is None:
        out = _empty_like_shape(table, tuple(ids.shape) + (table.shape[-1],))
    (result,) = _lz.dispatch(call, (ids, table), (out,), _scoped.get() if handle is None else handle)
    return result


def sample(logits, *, temperature=None, top_k=None, top_p=None, min_p=None, seed=None, handle=None):
    """One token per row of ``logits`` ``[B, V]`` (int64 ``[B]``): greedy when no temperature
    or filter is set; otherwise softmax(logits / temperature) filtered by top-k, top-p, min-p,
    drawn with a counter-based generator from ``seed`` (the same tokens on any thread count)."""
    attrs = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "seed": seed}
    call = _call(("sample",) + tuple(attrs.values()), "sample", attrs, ["logits"], ["tokens"])
    out = _torch().empty((logits.shape[0],), dtype=_torch().int64)
    (result,) = _lz.dispatch(call, (logits,), (out,), _scoped.get() if handle is None else handle)
    return result
