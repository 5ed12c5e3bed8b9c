"""AMD ZenDNN through its PyTorch extension ``zentorch``: the flash SDPA of ZenDNNL
(``torch.ops.zentorch.zentorch_sdpa``). The backend's version is the ZenDNNL that zentorch
bundles (read from ``zentorch.__config__``), which the kernel's facts are checked against."""

import re

from ._attention import bhsd, refuse, top_left_causal

# Run against PyTorch's float64 math in this repository's CI (bindings/python/tests), with the
# zentorch wheel that CI installs. The matmul is not: zentorch 2.14.0.1's bf16 linear returned
# results uncorrelated with the reference (relative error 1.4) on an AMD EPYC with AVX512-BF16,
# so it is selected only where `layerzero.selftest()` passed it on the machine.
CI_VERIFIED = {"zendnn.attention.flash_sdpa"}


def _probe():
    import zentorch

    config = str(getattr(zentorch, "__config__", ""))
    m = re.search(r"ZENDNNL?\s+v(\d+\.\d+\.\d+)", config)
    if m is None:
        raise ImportError(f"zentorch {zentorch.__version__} does not say which ZenDNN it bundles")
    return zentorch, m.group(1), zentorch.__file__


def _sdpa(tensors, attrs):
    import torch

    refuse("cu_seqlens_q" in tensors, "zentorch_sdpa has no varlen form")
    q, k, v, was_bshd = bhsd(tensors, attrs)
    out, _ = torch.ops.zentorch.zentorch_sdpa(
        q,
        k,
        v,
        float(attrs.get("dropout_p") or 0.0),
        top_left_causal(attrs, q.shape[-2], k.shape[-2]),
        attn_mask=tensors.get("mask"),
        scale=attrs.get("scale"),
    )
    return out.transpose(1, 2) if was_bshd else out


def _linear(tensors, attrs):
    import torch

    x, w = tensors["x"], tensors["weight"]
    if attrs.get("layouts", {}).get("weight") == "NN":
        w = w.t()  # [K, N] seen as the [N, K] the op takes (a view)
    rows = x.reshape(-1, x.shape[-1])
    out = torch.ops.zentorch.zentorch_linear_unary(rows, w, tensors.get("bias"))
    return out.reshape(*x.shape[:-1], w.shape[0])


def backends():
    def executors(_lib):
        return {"zendnn.attention.flash_sdpa": _sdpa, "zendnn.linear.matmul": _linear}

    return [("zendnn", "zentorch", _probe, executors)]
