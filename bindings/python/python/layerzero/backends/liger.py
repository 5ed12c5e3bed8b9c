"""Liger-Kernel's Triton kernels: RMSNorm, SwiGLU and Llama-style RoPE
(``liger_kernel.transformers.functional``). They run on CUDA; without a GPU they are
registered only where the library imports and stay unverified until ``layerzero.selftest()``
passes for them on a GPU."""

from ._attention import refuse

CI_VERIFIED = set()


def _probe():
    import liger_kernel
    from importlib.metadata import version

    return liger_kernel, version("liger-kernel"), liger_kernel.__file__


def _rms_norm(tensors, attrs):
    from liger_kernel.transformers.functional import liger_rms_norm

    refuse("residual" in tensors, "Liger's RMSNorm has no fused residual")
    eps = attrs.get("eps")
    return liger_rms_norm(tensors["x"], tensors["weight"], 1e-6 if eps is None else eps, 0.0, "llama", False)


def _swiglu(tensors, attrs):
    from liger_kernel.transformers.functional import liger_swiglu

    if "x" in tensors:
        gate, up = tensors["x"].chunk(2, dim=-1)
    else:
        gate, up = tensors["gate"], tensors["up"]
    return liger_swiglu(gate, up)


def _rope(tensors, attrs):
    import torch
    from liger_kernel.transformers.functional import liger_rope

    refuse(attrs.get("style", "rotate_half") != "rotate_half", "Liger's RoPE is rotate-half")
    refuse(attrs.get("rotary_dim") is not None or attrs.get("scaling") is not None, "partial or scaled RoPE")
    q, k = tensors["q"], tensors.get("k")
    heads_first = attrs.get("layouts", {}).get("q", "BSHD") == "BHSD"
    qh = q if heads_first else q.transpose(1, 2)
    kh = (k if heads_first else k.transpose(1, 2)) if k is not None else qh
    s, d = qh.shape[2], qh.shape[3]
    pos = tensors.get("positions")
    pos = torch.arange(s, device=q.device) if pos is None else pos.to(q.device)
    if "cos" in tensors:
        cos, sin = tensors["cos"][pos], tensors["sin"][pos]
    else:
        base = attrs.get("base") or 10000.0
        # Angles in f64: in f32, position x frequency carries half an ulp of the position
        # (1.2e-4 rad at 4096), over the f16 RoPE tolerance before any rounding of the output.
        inv = base ** (-torch.arange(0, d, 2, device=q.device, dtype=torch.float64) / d)
        ang = pos.to(torch.float64)[..., None] * inv
        cos, sin = ang.cos(), ang.sin()
    # Float32 tables: Liger's kernel casts q and k to the tables' dtype, so the rotation runs
    # in f32 and only the result is rounded; half tables lose accuracy at large positions
    # (bf16 at position 4096: 10x the RoPE tolerance, measured on an H100).
    cos = torch.cat([cos, cos], -1).to(torch.float32)
    sin = torch.cat([sin, sin], -1).to(torch.float32)
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    qo, ko = liger_rope(qh.contiguous(), kh.contiguous(), cos, sin)
    if not heads_first:
        qo, ko = qo.transpose(1, 2), ko.transpose(1, 2)
    return {"out": qo, "out_k": ko} if k is not None else qo


def backends():
    def executors(_lib):
        return {"liger.rms_norm.triton": _rms_norm, "liger.swiglu.triton": _swiglu, "liger.rope.triton": _rope}

    return [("liger", "liger_kernel", _probe, executors)]
