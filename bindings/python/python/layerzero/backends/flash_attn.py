"""FlashAttention 2 (``flash_attn``: ``flash_attn_func``, ``flash_attn_varlen_func``,
``flash_attn_with_kvcache``) and 3 (``flash_attn_interface``, the Hopper build). Written
against each library's documented API; neither library can be installed where this project is
tested, so these executors stay unverified until ``layerzero.selftest()`` passes for them on a
machine that has them."""

from . import _alibi
from ._attention import bshd, refuse, window

CI_VERIFIED = set()


def _probe2():
    import flash_attn

    return flash_attn, flash_attn.__version__, flash_attn.__file__


def _probe3():
    import flash_attn_interface

    version = getattr(flash_attn_interface, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("flash_attn_3")
    return flash_attn_interface, version.split("+")[0], flash_attn_interface.__file__


def _first(result):
    # Some releases return (out, lse) or (out, lse, probs); the output comes first.
    return result[0] if isinstance(result, (tuple, list)) else result


def _dense(fa, v3):
    def run(tensors, attrs):
        q, k, v, heads_first = bshd(tensors, attrs)
        refuse(float(attrs.get("dropout_p") or 0.0) != 0.0 and v3, "FlashAttention-3 has no dropout")
        kw = dict(softmax_scale=attrs.get("scale"), causal=bool(attrs.get("causal")), window_size=window(attrs))
        if attrs.get("softcap"):
            kw["softcap"] = float(attrs["softcap"])
        if attrs.get("alibi"):
            refuse(v3, "FlashAttention-3 has no ALiBi")
            kw["alibi_slopes"] = _alibi.tensor(q.shape[2], q.device)
        if not v3:
            kw["dropout_p"] = float(attrs.get("dropout_p") or 0.0)
        if "cu_seqlens_q" in tensors:
            cq, ck = tensors["cu_seqlens_q"], tensors["cu_seqlens_k"]
            max_q = int((cq[1:] - cq[:-1]).max())
            max_k = int((ck[1:] - ck[:-1]).max())
            o = _first(fa.flash_attn_varlen_func(q[0], k[0], v[0], cq, ck, max_q, max_k, **kw)).unsqueeze(0)
        else:
            o = _first(fa.flash_attn_func(q, k, v, **kw))
        return o.transpose(1, 2) if heads_first else o

    return run


def _paged(fa):
    def run(tensors, attrs):
        layouts = attrs.get("layouts", {})
        refuse(layouts.get("k_cache", "NHD") != "NHD", "flash_attn_with_kvcache takes NHD caches")
        refuse("k_scale" in tensors or "v_scale" in tensors, "flash_attn_with_kvcache takes no fp8 scales")
        kw = dict(softmax_scale=attrs.get("scale"), causal=bool(attrs.get("causal")), window_size=window(attrs))
        if attrs.get("softcap"):
            kw["softcap"] = float(attrs["softcap"])
        q = tensors["q"]
        if attrs.get("alibi"):
            kw["alibi_slopes"] = _alibi.tensor(q.shape[2], q.device)
        import torch

        return _first(
            fa.flash_attn_with_kvcache(
                q,
                tensors["k_cache"],
                tensors["v_cache"],
                cache_seqlens=tensors["context_lens"].to(torch.int32),
                block_table=tensors["block_table"].to(torch.int32),
                **kw,
            )
        )

    return run


def backends():
    def fa2(lib):
        return {
            "flash_attn_2.attention.fwd": _dense(lib, False),
            "flash_attn_2.paged_attention.kvcache": _paged(lib),
            "flash_attn_2.attention.fwd_ck": _dense(lib, False),
            "flash_attn_2.paged_attention.kvcache_ck": _paged(lib),
            "flash_attn_2.paged_attention.kvcache_triton_amd": _paged(lib),
        }

    def fa3(lib):
        return {"flash_attn_3.attention.fwd": _dense(lib, True), "flash_attn_3.paged_attention.fwd": _paged(lib)}

    return [("flash_attn_2", "flash_attn", _probe2, fa2), ("flash_attn_3", "flash_attn_interface", _probe3, fa3)]
