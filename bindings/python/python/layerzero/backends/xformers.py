"""xFormers memory-efficient attention with the CUTLASS forward operator
(``xformers.ops.memory_efficient_attention`` with ``op=(fmha.cutlass.FwOp, None)``). Written
against the documented API; xFormers cannot be installed where this project is tested, so this
executor stays unverified until ``layerzero.selftest()`` passes for it on a machine that has
it."""

from ._attention import bshd, refuse

CI_VERIFIED = set()


def _probe():
    import xformers
    import xformers.ops  # noqa: F401 - the fmha operators

    return xformers, xformers.__version__.split("+")[0], xformers.__file__


def _cutlass(xformers):
    from xformers.ops import fmha

    def run(tensors, attrs):
        q, k, v, heads_first = bshd(tensors, attrs)
        refuse("cu_seqlens_q" in tensors, "varlen goes through BlockDiagonalMask, not wired here")
        bias = None
        if attrs.get("causal"):
            refuse("mask" in tensors, "a tensor bias and a causal mask are not combined here")
            if attrs.get("window_left") is not None:
                bias = fmha.attn_bias.LowerTriangularFromBottomRightLocalAttentionMask(int(attrs["window_left"]) + 1)
            elif attrs.get("causal_alignment") == "top_left":
                bias = fmha.attn_bias.LowerTriangularMask()
            else:
                bias = fmha.attn_bias.LowerTriangularFromBottomRightMask()
        elif "mask" in tensors:
            m = tensors["mask"]
            if m.dtype.is_floating_point:
                bias = m.to(q.dtype).expand(q.shape[0], q.shape[2], q.shape[1], k.shape[1])
            else:
                import torch

                zero = torch.zeros((), dtype=q.dtype, device=q.device)
                bias = torch.where(m, zero, torch.tensor(float("-inf"), dtype=q.dtype, device=q.device))
                bias = bias.expand(q.shape[0], q.shape[2], q.shape[1], k.shape[1])
        groups = q.shape[2] // k.shape[2]
        if groups > 1:
            # GQA as xFormers takes it: [B, M, G, H, K] with keys and values broadcast over H.
            b, s, hkv, d = k.shape
            q = q.reshape(q.shape[0], q.shape[1], hkv, groups, q.shape[3])
            k = k.unsqueeze(3).expand(b, s, hkv, groups, d)
            v = v.unsqueeze(3).expand(b, s, hkv, groups, v.shape[3])
        o = xformers.ops.memory_efficient_attention(
            q, k, v, attn_bias=bias, p=float(attrs.get("dropout_p") or 0.0), scale=attrs.get("scale"),
            op=(fmha.cutlass.FwOp, None),
        )
        if groups > 1:
            o = o.reshape(o.shape[0], o.shape[1], -1, o.shape[-1])
        return o.transpose(1, 2) if heads_first else o

    return run


def backends():
    return [("xformers", "xformers", _probe, lambda lib: {"xformers.attention.cutlass": _cutlass(lib)})]
