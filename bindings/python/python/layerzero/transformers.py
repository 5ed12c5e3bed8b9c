"""Hugging Face transformers through LayerZero, in one line::

    import layerzero.transformers  # registers attn_implementation="layerzero"
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="layerzero")

Importing this module registers (idempotently; :func:`register` does it again, as often as you
like) an attention function named ``"layerzero"`` with transformers' ``AttentionInterface``
and, for its masks, transformers' own SDPA mask builder with ``AttentionMaskInterface`` (a
boolean ``[B, 1, Sq, Sk]`` mask, or ``None`` where plain causal attention is exact). Every
attention call of the model then goes through :func:`layerzero.ops.attention`, which selects
the kernel for that call on this machine:

- q/k/v arrive as ``[batch, heads, seq, head_dim]`` and are lent as they are (``layout="BHSD"``,
  no copies); k/v keep their fewer heads under GQA/MQA (no ``repeat_kv``); the kernel writes
  straight into the ``[batch, seq, heads, head_dim]`` output transformers expects.
- The mask transformers built (padding, sliding window, custom 4-D masks; boolean or additive
  float) is passed to LayerZero as it is, cut to the key length. Without a mask a causal
  module runs ``causal=True``; queries of one token (decoding) are not masked, as in SDPA.
- ``scaling``, ``dropout``, ``softcap`` and Mistral-style ``sliding_window`` are honoured.

Errors are ``layerzero.LayerZeroError`` subclasses: a call no kernel can run (dropout in training
on a CPU, say) raises ``NoKernelError`` with every candidate's reasons; nothing falls back
silently to another implementation.

Opt-in, separately: :func:`patch_modules` routes a loaded model's Llama-style RMSNorm modules
through :func:`layerzero.ops.rms_norm` and its gated MLPs through :func:`layerzero.ops.mlp` by
replacing their ``forward`` (undone by :func:`unpatch_modules`). It is not done by
``register``: attention is the only part of the model this module changes unless asked.
"""

import contextlib as _contextlib
import types as _types
import warnings as _warnings

import layerzero as _layerzero

from . import ops as _ops

__all__ = [
    "NAME",
    "register",
    "attention_forward",
    "patch_modules",
    "unpatch_modules",
    "trace",
]

#: The ``attn_implementation`` name this module registers.
NAME = "layerzero"

# A list while `trace()` is active: one entry per attention call.
_trace = None


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("layerzero.transformers needs the `transformers` package (pip install transformers)") from e
    return transformers


def register(name=NAME):
    """Registers ``name`` (``"layerzero"``) as an ``attn_implementation`` of transformers: the
    attention function with ``AttentionInterface`` and SDPA's mask builder with
    ``AttentionMaskInterface`` (without a mask builder transformers 5 gives a custom attention
    no mask at all, dropping padding and sliding windows). Safe to call any number of times;
    returns ``name``."""
    _transformers()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _is_causal(module, is_causal):
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    config = getattr(module, "config", None)
    # transformers' "power feature": a decoder config with is_causal=False runs bidirectionally.
    return bool(is_causal) and bool(getattr(config, "is_causal", True))


def _position_bias_mask(position_bias, mask, causal, query, key):
    from transformers.integrations.sdpa_attention import create_position_bias_mask

    return create_position_bias_mask(position_bias, mask, causal, query, key)


def attention_forward(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    is_causal=None,
    sliding_window=None,
    softcap=None,
    position_bias=None,
    **kwargs,
):
    """transformers' attention contract over :func:`layerzero.ops.attention`.

    ``query`` ``[B, Hq, Sq, D]``, ``key`` / ``value`` ``[B, Hkv, Sk, D]`` (``Hq % Hkv == 0``),
    ``attention_mask`` ``None`` or broadcasting to ``[B, Hq, Sq, >= Sk]`` (bool keeps True, float
    is added). Returns ``(output [B, Sq, Hq, Dv], None)``: attention weights are never formed.
    """
    if kwargs.get("output_attentions", False):
        _warnings.warn(
            "attn_implementation='layerzero' does not return attention weights (output_attentions=True); "
            "use attn_implementation='eager' for them",
            stacklevel=2,
        )
    for sink in ("s_aux", "sinks"):
        if kwargs.get(sink) is not None:
            raise _layerzero.InvalidInputError(
                f"argument `{sink}`: attention sinks are not supported by lz.ops.attention"
            )

    q_len, kv_len = query.shape[2], key.shape[2]
    causal_module = _is_causal(module, is_causal)
    mask = attention_mask
    if mask is not None and mask.shape[-1] > kv_len:
        mask = mask[..., :kv_len]

    # As SDPA: a causal module without a mask is causal, except one query (decoding), which sees
    # every key. SDPA's is_causal is top-left aligned; without a mask, Sk > Sq > 1 happens only
    # for a prefill into an empty static cache, whose keys past Sq are unwritten: cutting them
    # makes top-left and LayerZero's bottom-right alignment one and the same.
    causal = causal_module and mask is None and q_len > 1
    if causal and kv_len > q_len:
        key = key[:, :, :q_len]
        value = value[:, :, :q_len]
        kv_len = q_len
        if position_bias is not None:
            position_bias = position_bias[..., :q_len]

    # transformers' sliding window keeps `sliding_window` keys including the diagonal:
    # LayerZero's window counts the keys left of it. Where a mask is given it already holds
    # the window; the window is then passed as well only where alignment is unambiguous
    # (Sq == Sk), so kernels may skip the blocks outside it.
    window = None
    if sliding_window is not None and causal_module and q_len == kv_len and sliding_window > 0:
        window = int(sliding_window) - 1

    if position_bias is not None:
        mask = _position_bias_mask(position_bias, mask, causal, query, key)
        causal = False

    torch = _ops._torch()
    if mask is not None and mask.dtype == torch.bool and mask.device.type != "cpu":
        # A GPU tensor is lent as device memory, which LayerZero takes for numbers only (a
        # bool's bytes are read on the host): the same mask, additive, in the query's dtype.
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    batch, heads, _, _ = query.shape
    out = torch.empty((batch, q_len, heads, value.shape[-1]), dtype=query.dtype, device=query.device)
    args = dict(
        causal=causal,
        mask=mask,
        scale=scaling,
        window=window,
        softcap=softcap,
        layout="BHSD",
        dropout_p=float(dropout or 0.0),
    )
    if _trace is not None:
        _record(module, query, key, value, args)
    _ops.attention(query, key, value, out=out.transpose(1, 2), **args)
    return out, None


def _record(module, query, key, value, args):
    entry = {
        "layer": getattr(module, "layer_idx", None),
        "q": tuple(query.shape),
        "k": tuple(key.shape),
        "mask": None if args["mask"] is None else (str(args["mask"].dtype), tuple(args["mask"].shape)),
        "causal": args["causal"],
        "window": args["window"],
        "scale": args["scale"],
    }
    try:
        entry["kernel"] = _layerzero.which(
            "attention",
            q=query,
            k=key,
            v=value,
            mask=args["mask"],
            causal=args["causal"],
            scale=args["scale"],
            window_left=args["window"],
            softcap=args["softcap"],
            dropout_p=args["dropout_p"],
            layout="BHSD",
        )
    except _layerzero.LayerZeroError as e:
        entry["kernel"] = f"<none: {e}>"
    _trace.append(entry)


@_contextlib.contextmanager
def trace():
    """Records every attention call made inside the ``with`` block: yields a list that fills
    with one dict per call (``layer``, ``q``/``k`` shapes, ``mask`` dtype and shape, ``causal``,
    ``window``, ``scale`` and the ``kernel`` :func:`layerzero.which` selects for it). For
    debugging and tests: each record costs a selection."""
    global _trace
    previous, _trace = _trace, []
    try:
        yield _trace
    finally:
        _trace = previous


# ---------------------------------------------------------------------------------------------
# Opt-in: RMSNorm and gated MLP modules through LayerZero.

_RMS_NORM_CLASSES = {
    "LlamaRMSNorm",
    "MistralRMSNorm",
    "MixtralRMSNorm",
    "Qwen2RMSNorm",
    "Qwen2MoeRMSNorm",
    "Qwen3RMSNorm",
    "Qwen3MoeRMSNorm",
}

_MLP_CLASSES = {"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "Qwen2MoeMLP", "Qwen3MoeMLP"}

# transformers activation modules by class name -> lz.ops.mlp's activation.
_ACTIVATIONS = {
    "SiLU": "silu",
    "SiLUActivation": "silu",
    "GELUActivation": "gelu",
    "GELUTanh": "gelu_tanh",
    "PytorchGELUTanh": "gelu_tanh",
    "NewGELUActivation": "gelu_tanh",
    "FastGELUActivation": "gelu_tanh",
}


def _rms_norm_forward(self, hidden_states):
    return _ops.rms_norm(hidden_states, self.weight, eps=float(self.variance_epsilon))


def _mlp_forward(self, x):
    return _ops.mlp(
        x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight, activation=self._lz_activation
    )


def _activation(act):
    name = type(act).__name__
    if name == "GELU":  # torch.nn.GELU
        return "gelu_tanh" if getattr(act, "approximate", "none") == "tanh" else "gelu"
    return _ACTIVATIONS.get(name)


def _is_rms_norm(module):
    return (
        type(module).__name__ in _RMS_NORM_CLASSES
        and getattr(module, "weight", None) is not None
        and hasattr(module, "variance_epsilon")
    )


def _mlp_activation(module):
    if type(module).__name__ not in _MLP_CLASSES:
        return None
    linears = [getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if any(lin is None or getattr(lin, "bias", None) is not None or not hasattr(lin, "weight") for lin in linears):
        return None
    return _activation(getattr(module, "act_fn", None))


def patch_modules(model, *, norms=True, mlp=True):
    """Opt-in: routes ``model``'s Llama-style RMSNorm modules (``weight``, ``variance_epsilon``;
    Llama, Mistral, Mixtral, Qwen2, Qwen2-MoE, Qwen3, Qwen3-MoE) through
    :func:`layerzero.ops.rms_norm` and its gated MLPs (``down_proj(act(gate_proj(x)) *
    up_proj(x))`` without biases, act SiLU/GELU) through :func:`layerzero.ops.mlp`, by setting
    ``forward`` on each instance. Modules of other classes (Gemma's ``1 + weight`` norms, MLPs
    with biases, ...) are left alone. For inference: the LayerZero ops do not record autograd.
    Returns ``{"rms_norm": n, "mlp": m}``, the modules patched. Idempotent; undone by
    :func:`unpatch_modules`."""
    patched = {"rms_norm": 0, "mlp": 0}
    for module in model.modules():
        if norms and _is_rms_norm(module):
            module.forward = _types.MethodType(_rms_norm_forward, module)
            module._lz_patched = True
            patched["rms_norm"] += 1
        elif mlp:
            activation = _mlp_activation(module)
            if activation is not None:
                module._lz_activation = activation
                module.forward = _types.MethodType(_mlp_forward, module)
                module._lz_patched = True
                patched["mlp"] += 1
    return patched


def unpatch_modules(model):
    """Undoes :func:`patch_modules`: the modules' own ``forward`` again. Returns the count."""
    n = 0
    for module in model.modules():
        if module.__dict__.pop("_lz_patched", False):
            module.__dict__.pop("forward", None)
            module.__dict__.pop("_lz_activation", None)
            n += 1
    return n


register()
