"""LayerZero's ops as torch custom ops, for ``torch.compile`` and ``torch.export``.

``import layerzero.torch_ops`` registers them in the ``layerzero`` namespace::

    import layerzero.torch_ops  # noqa: F401

    out = torch.ops.layerzero.rms_norm(x, weight, 1e-6)
    y = torch.ops.layerzero.attention(q, k, v, causal=True)

Each op is functional (its outputs are freshly allocated, no argument is mutated) and has a
fake (meta) kernel that gives the outputs' shapes, dtypes and devices without running
anything, so Dynamo traces through it without a graph break and ``torch.export`` keeps it in
the graph as one node. The kernel is selected inside the op, when it runs (a plan or cache
hit after the first call of a shape), never at trace time: a compiled graph called with a new
shape selects for that shape.

The ops are registered with ``torch.library.Library("layerzero", "DEF")`` (``define`` plus a
CPU ``impl`` and ``register_fake``), not with the ``torch.library.custom_op`` decorator: the
decorator puts a Python autograd kernel around every call, 3 to 4 us more per call on a tiny
input (about 1.5 times the Library form's cost there, whose own is 1.5 to 3 us over calling
``layerzero.ops`` directly); ``tools/bench_python_overhead.py`` measures both. Like
``layerzero.ops``, the ops take CPU and CUDA tensors (implementations for both dispatch
keys): on CUDA the selected kernel is one of the Python backends' (torch SDPA, Liger, ...),
handed torch's tensors; an op no GPU kernel serves (``linear``, ``embedding``) raises
``NoKernelError`` with each kernel's reasons.

The ops are for inference: none has an autograd formula. With inputs that require grad, the
outputs come from torch's default autograd fallback (a backward through them warns and gives
no gradient to the inputs).

Schemas (the attributes after ``*`` are keyword-only, as in ``layerzero.ops``; tensors are
positional-or-keyword, since torch's custom-op machinery takes no keyword-only tensors)::

    attention(Tensor q, Tensor k, Tensor v, Tensor? mask=None, Tensor? alibi_slopes=None,
              Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, *, bool causal=False,
              str causal_align="bottom_right", float? scale=None, int? window=None,
              float? softcap=None, str layout="BSHD", float dropout_p=0.) -> Tensor
    rms_norm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor
    rms_norm_residual(Tensor x, Tensor weight, Tensor residual, float eps=1e-06)
              -> (Tensor out, Tensor residual_out)
    layer_norm(Tensor x, Tensor weight, Tensor? bias=None, float eps=1e-05) -> Tensor
    rope(Tensor q, Tensor? positions=None, Tensor? cos=None, Tensor? sin=None, *,
         str style="rotate_half", int? rotary_dim=None, float? base=None) -> Tensor
    rope_qk(Tensor q, Tensor k, ...as rope...) -> (Tensor q_out, Tensor k_out)
    linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor
    swiglu(Tensor gate, Tensor? up=None) -> Tensor
    mlp(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, *, str activation="silu") -> Tensor
    embedding(Tensor ids, Tensor table) -> Tensor
    sample(Tensor logits, *, float? temperature=None, int? top_k=None, float? top_p=None,
           float? min_p=None, int? seed=None) -> Tensor

``window`` is the left window (an int); FlashAttention's ``(left, right)`` pair is taken by
``layerzero.ops.attention``, not by the op. ``attention`` is tagged ``nondeterministic_seeded``
as aten's SDPA is (with ``dropout_p > 0`` it draws from torch's generator). ``sample`` is
deterministic (a counter-based generator seeded by ``seed``, a fixed default without one), so
it is an ordinary functional op.

Importing twice, or ``importlib.reload``, registers nothing again.
"""

import torch as _torch

from . import _lz
from . import ops as _ops

__all__ = ["NAMESPACE", "OPS", "SCHEMAS"]

NAMESPACE = "layerzero"

_ATTENTION = (
    "attention(Tensor q, Tensor k, Tensor v, Tensor? mask=None, Tensor? alibi_slopes=None, "
    "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, *, bool causal=False, "
    'str causal_align="bottom_right", float? scale=None, int? window=None, float? softcap=None, '
    'str layout="BSHD", float dropout_p=0.) -> Tensor'
)
_ROPE_ATTRS = (
    "Tensor? positions=None, Tensor? cos=None, Tensor? sin=None, *, "
    'str style="rotate_half", int? rotary_dim=None, float? base=None'
)

SCHEMAS = {
    "attention": _ATTENTION,
    "rms_norm": "rms_norm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor",
    "rms_norm_residual": (
        "rms_norm_residual(Tensor x, Tensor weight, Tensor residual, float eps=1e-06) "
        "-> (Tensor out, Tensor residual_out)"
    ),
    "layer_norm": "layer_norm(Tensor x, Tensor weight, Tensor? bias=None, float eps=1e-05) -> Tensor",
    "rope": f"rope(Tensor q, {_ROPE_ATTRS}) -> Tensor",
    "rope_qk": f"rope_qk(Tensor q, Tensor k, {_ROPE_ATTRS}) -> (Tensor q_out, Tensor k_out)",
    "linear": "linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor",
    "swiglu": "swiglu(Tensor gate, Tensor? up=None) -> Tensor",
    "mlp": 'mlp(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, *, str activation="silu") -> Tensor',
    "embedding": "embedding(Tensor ids, Tensor table) -> Tensor",
    "sample": (
        "sample(Tensor logits, *, float? temperature=None, int? top_k=None, float? top_p=None, "
        "float? min_p=None, int? seed=None) -> Tensor"
    ),
}

OPS = tuple(SCHEMAS)


# The kernels (CPU and CUDA dispatch keys alike). The dispatcher leaves out trailing arguments equal to their defaults, so
# each function's defaults are its schema's.


def _attention(
    q,
    k,
    v,
    mask=None,
    alibi_slopes=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    *,
    causal=False,
    causal_align="bottom_right",
    scale=None,
    window=None,
    softcap=None,
    layout="BSHD",
    dropout_p=0.0,
):
    if (
        window is None
        and softcap is None
        and alibi_slopes is None
        and not dropout_p
        and cu_seqlens_q is None
        and v.shape[-1] == q.shape[-1]
    ):
        # The common call, without a second round of keyword arguments: the Call of
        # lz.ops.attention's plain path, and a contiguous output like q.
        call = _ops._plain_attention.get((causal, causal_align, scale, layout))
        if call is not None:
            out = _torch.empty_like(q, memory_format=_torch.contiguous_format)
            handle = _ops._scoped.get()
            return _lz.dispatch(call, (q, k, v, mask, None, None), (out,), handle)[0]
    return _ops.attention(
        q,
        k,
        v,
        causal=causal,
        causal_align=causal_align,
        mask=mask,
        scale=scale,
        window=window,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        layout=layout,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        dropout_p=dropout_p,
    )


def _rms_norm(x, weight, eps=1e-6):
    call = _ops._calls.get(("rms_norm", eps))
    if call is not None:
        out = _torch.empty_like(x, memory_format=_torch.contiguous_format)
        return _lz.dispatch(call, (x, weight, None), (out,), _ops._scoped.get())[0]
    return _ops.rms_norm(x, weight, eps=eps)


def _rms_norm_residual(x, weight, residual, eps=1e-6):
    return _ops.rms_norm(x, weight, eps=eps, residual=residual)


def _layer_norm(x, weight, bias=None, eps=1e-5):
    return _ops.layer_norm(x, weight, bias, eps=eps)


def _rope(q, positions=None, cos=None, sin=None, *, style="rotate_half", rotary_dim=None, base=None):
    return _ops.rope(q, positions=positions, cos=cos, sin=sin, style=style, rotary_dim=rotary_dim, base=base)


def _rope_qk(q, k, positions=None, cos=None, sin=None, *, style="rotate_half", rotary_dim=None, base=None):
    return _ops.rope(q, k, positions=positions, cos=cos, sin=sin, style=style, rotary_dim=rotary_dim, base=base)


def _linear(x, weight, bias=None):
    return _ops.linear(x, weight, bias)


def _swiglu(gate, up=None):
    return _ops.swiglu(gate, up)


def _mlp(x, w_gate, w_up, w_down, *, activation="silu"):
    return _ops.mlp(x, w_gate, w_up, w_down, activation=activation)


def _embedding(ids, table):
    return _ops.embedding(ids, table)


def _sample(logits, *, temperature=None, top_k=None, top_p=None, min_p=None, seed=None):
    return _ops.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)


_IMPLS = {
    "attention": _attention,
    "rms_norm": _rms_norm,
    "rms_norm_residual": _rms_norm_residual,
    "layer_norm": _layer_norm,
    "rope": _rope,
    "rope_qk": _rope_qk,
    "linear": _linear,
    "swiglu": _swiglu,
    "mlp": _mlp,
    "embedding": _embedding,
    "sample": _sample,
}


# The fake kernels: the outputs' shapes, dtypes and devices, as the CPU kernels allocate them
# (contiguous). Shapes may be symbolic; nothing here selects or runs a kernel.


def _empty(like, shape, dtype=None):
    return like.new_empty(tuple(shape), dtype=like.dtype if dtype is None else dtype)


def _attention_fake(q, k, v, *tensors, **attrs):
    return _empty(q, tuple(q.shape[:-1]) + (v.shape[-1],))


def _same_fake(x, *args, **kwargs):
    return _empty(x, x.shape)


def _rms_norm_residual_fake(x, weight, residual, eps=1e-6):
    return _empty(x, x.shape), _empty(x, x.shape)


def _rope_qk_fake(q, k, *tensors, **attrs):
    return _empty(q, q.shape), _empty(k, k.shape)


def _linear_fake(x, weight, bias=None):
    return _empty(x, tuple(x.shape[:-1]) + (weight.shape[0],))


def _swiglu_fake(gate, up=None):
    last = gate.shape[-1] // 2 if up is None else gate.shape[-1]
    return _empty(gate, tuple(gate.shape[:-1]) + (last,))


def _mlp_fake(x, w_gate, w_up, w_down, **attrs):
    return _empty(x, tuple(x.shape[:-1]) + (w_down.shape[0],))


def _embedding_fake(ids, table):
    return _empty(table, tuple(ids.shape) + (table.shape[-1],))


def _sample_fake(logits, **attrs):
    return _empty(logits, (logits.shape[0],), _torch.int64)


_FAKES = {
    "attention": _attention_fake,
    "rms_norm": _same_fake,
    "rms_norm_residual": _rms_norm_residual_fake,
    "layer_norm": _same_fake,
    "rope": _same_fake,
    "rope_qk": _rope_qk_fake,
    "linear": _linear_fake,
    "swiglu": _swiglu_fake,
    "mlp": _mlp_fake,
    "embedding": _embedding_fake,
    "sample": _sample_fake,
}


# attention with dropout_p > 0 draws from torch's generator (the torch_sdpa executor), so it
# is tagged as aten's SDPA is: no CSE of two calls, no constant folding. pt2_compliant_tag on
# every op: each passes opcheck (tests/test_compile.py).
_TAGS = {"attention": (_torch.Tag.nondeterministic_seeded,)}


def _defined(name):
    try:
        _torch._C._dispatch_find_schema_or_throw(f"{NAMESPACE}::{name}", "")
    except RuntimeError:
        return False
    return True


def _register():
    """Defines the ops once per process. The Library is kept on the ``layerzero`` package
    (registrations live as long as their Library object), so a reload of this module, or a
    second import of it, finds it there and defines nothing again."""
    import sys

    package = sys.modules[__package__]
    lib = getattr(package, "_torch_library", None)
    if lib is not None or all(_defined(name) for name in SCHEMAS):
        return lib
    lib = _torch.library.Library(NAMESPACE, "DEF")
    for name, schema in SCHEMAS.items():
        lib.define(schema, tags=_TAGS.get(name, ()) + (_torch.Tag.pt2_compliant_tag,))
        lib.impl(name, _IMPLS[name], "CPU")
        lib.impl(name, _IMPLS[name], "CUDA")
        _torch.library.register_fake(f"{NAMESPACE}::{name}", _FAKES[name], lib=lib)
    package._torch_library = lib
    return lib


_LIBRARY = _register()
