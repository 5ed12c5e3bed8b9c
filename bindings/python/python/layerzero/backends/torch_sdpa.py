"""PyTorch SDPA, one kernel per SDPA backend: ``F.scaled_dot_product_attention`` under
``torch.nn.attention.sdpa_kernel`` forcing that backend (CPU: flash and math; CUDA: flash,
efficient, cuDNN and math; ROCm: flash, efficient and math)."""

from ._attention import bhsd, refuse, top_left_causal

# Run against PyTorch's float64 math in this repository's CI (bindings/python/tests).
CI_VERIFIED = {"torch_sdpa.attention.flash_cpu", "torch_sdpa.attention.math_cpu"}

# kernel suffix -> SDPBackend member name
_KERNELS = {
    "flash_cpu": "FLASH_ATTENTION",
    "math_cpu": "MATH",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
    "flash_rocm": "FLASH_ATTENTION",
    "efficient_rocm": "EFFICIENT_ATTENTION",
    "math_rocm": "MATH",
}


def _probe():
    import torch
    import torch.nn.attention  # noqa: F401 - sdpa_kernel lives here

    return torch, torch.__version__.split("+")[0], torch.__file__


def _executor(torch, backend_name):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def run(tensors, attrs):
        refuse("cu_seqlens_q" in tensors, "SDPA has no varlen form")
        q, k, v, was_bshd = bhsd(tensors, attrs)
        causal = top_left_causal(attrs, q.shape[-2], k.shape[-2])
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=tensors.get("mask"),
                dropout_p=float(attrs.get("dropout_p") or 0.0),
                is_causal=causal,
                scale=attrs.get("scale"),
                enable_gqa=q.shape[1] != k.shape[1],
            )
        return o.transpose(1, 2) if was_bshd else o

    return run


def backends():
    def executors(torch):
        return {f"torch_sdpa.attention.{k}": _executor(torch, b) for k, b in _KERNELS.items()}

    return [("torch_sdpa", "torch", _probe, executors)]
