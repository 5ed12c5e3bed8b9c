"""FlashInfer: single-request prefill and decode (``single_prefill_with_kv_cache``,
``single_decode_with_kv_cache``), a packed batch through ``BatchPrefillWithRaggedKVCacheWrapper``,
and the paged wrappers with plan/run (``BatchPrefillWithPagedKVCacheWrapper``,
``BatchDecodeWithPagedKVCacheWrapper``); ``attrs.rope`` as ``pos_encoding_mode="ROPE_LLAMA"``. Written
against the documented API; FlashInfer cannot be installed where this project is tested, so
these executors stay unverified until ``layerzero.selftest()`` passes for them on a machine
that has it."""

from ._attention import bshd, refuse

CI_VERIFIED = set()

# Workspace for the paged wrappers, per device (FlashInfer's examples use 128 MiB).
_WORKSPACE_BYTES = 128 << 20
_workspaces = {}


def _probe():
    import flashinfer

    return flashinfer, flashinfer.__version__.split("+")[0], flashinfer.__file__


def _common(attrs, head_dim):
    kw = {"sm_scale": attrs.get("scale"), "window_left": -1 if attrs.get("window_left") is None else attrs["window_left"]}
    if attrs.get("softcap"):
        kw["logits_soft_cap"] = float(attrs["softcap"])
    if attrs.get("alibi"):
        kw["pos_encoding_mode"] = "ALIBI"
    rope = attrs.get("rope")
    if rope is not None:
        # ROPE_LLAMA: rotate-half pairs over the whole head, frequencies
        # rope_theta^(-2i/d) / rope_scale, query i at i + kv_len - qo_len (attrs.rope's positions).
        refuse(attrs.get("alibi"), "FlashInfer takes one pos_encoding_mode: RoPE or ALiBi, not both")
        refuse(rope.get("style", "rotate_half") != "rotate_half", "FlashInfer's fused RoPE pairs rotate-half only")
        refuse(rope.get("rotary_dim") not in (None, head_dim), "FlashInfer's fused RoPE rotates the whole head dim")
        scaling = rope.get("scaling")
        refuse(scaling is not None and scaling.get("type") != "linear", "FlashInfer's fused RoPE scales linearly only")
        kw["pos_encoding_mode"] = "ROPE_LLAMA"
        kw["rope_theta"] = float(rope.get("base") or 1e4)
        kw["rope_scale"] = float(scaling["factor"]) if scaling is not None else 1.0
    return kw


def _ragged(fi, tensors, attrs, backend):
    """A packed batch (cu_seqlens) through the ragged prefill wrapper: each request's queries
    sit at the last positions of its keys (causal bottom-right, RoPE positions)."""
    import torch

    refuse("mask" in tensors, "the ragged wrapper's custom mask is not wired here")
    refuse(attrs.get("layouts", {}).get("q", "BSHD") != "BSHD", "a packed batch is BSHD")
    q, k, v = tensors["q"][0], tensors["k"][0], tensors["v"][0]
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(_workspace(q.device), "NHD", backend=backend)
    w.plan(
        tensors["cu_seqlens_q"].to(torch.int32), tensors["cu_seqlens_k"].to(torch.int32), q.shape[1], k.shape[1],
        q.shape[2], head_dim_vo=v.shape[2], causal=bool(attrs.get("causal")), q_data_type=q.dtype,
        **_common(attrs, q.shape[2]),
    )
    return w.run(q, k, v).unsqueeze(0)


def _workspace(device):
    import torch

    ws = _workspaces.get(device)
    if ws is None:
        ws = _workspaces[device] = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return ws


def _single(fi, decode, backend):
    def run(tensors, attrs):
        refuse("mask" in tensors and decode, "single decode takes no mask")
        if "cu_seqlens_q" in tensors:
            refuse(decode, "single decode takes no packed batch")
            return _ragged(fi, tensors, attrs, backend)
        q, k, v, heads_first = bshd(tensors, attrs)
        outs = []
        for b in range(q.shape[0]):
            if decode:
                refuse(q.shape[1] != 1, "decode takes one query per sequence")
                kw = _common(attrs, q.shape[3])
                o = fi.single_decode_with_kv_cache(q[b, 0], k[b], v[b], kv_layout="NHD", **kw).unsqueeze(0)
            else:
                kw = _common(attrs, q.shape[3])
                if "mask" in tensors:
                    kw["custom_mask"] = tensors["mask"].broadcast_to(q.shape[0], 1, q.shape[1], k.shape[1])[b, 0]
                o = fi.single_prefill_with_kv_cache(
                    q[b], k[b], v[b], causal=bool(attrs.get("causal")), kv_layout="NHD", backend=backend, **kw
                )
            outs.append(o)
        import torch

        o = torch.stack(outs)
        return o.transpose(1, 2) if heads_first else o

    return run


def _paged(fi, decode, backend):
    def run(tensors, attrs):
        import torch

        q = tensors["q"]
        refuse("k_scale" in tensors or "v_scale" in tensors, "per-call fp8 scales are not passed to the wrapper here")
        layout = attrs.get("layouts", {}).get("k_cache", "NHD")
        k_cache, v_cache = tensors["k_cache"], tensors["v_cache"]
        page = k_cache.shape[1] if layout == "NHD" else k_cache.shape[2]
        lens = tensors["context_lens"].to(torch.int32)
        table = tensors["block_table"].to(torch.int32)
        pages = (lens + page - 1) // page
        indptr = torch.zeros(q.shape[0] + 1, dtype=torch.int32, device=q.device)
        indptr[1:] = torch.cumsum(pages, 0)
        indices = torch.cat([table[b, : int(pages[b])] for b in range(q.shape[0])])
        last = lens - (pages - 1) * page
        ws = _workspace(q.device)
        heads, kv_heads, dim = q.shape[2], k_cache.shape[2] if layout == "NHD" else k_cache.shape[1], q.shape[3]
        common = _common(attrs, dim)
        run_kw = {}
        if decode:
            refuse(q.shape[1] != 1, "decode takes one query per sequence")
            w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, layout)
            w.plan(indptr, indices, last, heads, kv_heads, dim, page, q_data_type=q.dtype, **common)
            return w.run(q[:, 0], (k_cache, v_cache), **run_kw).unsqueeze(1)
        qo_indptr = torch.arange(0, (q.shape[0] + 1) * q.shape[1], q.shape[1], dtype=torch.int32, device=q.device)
        w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, layout, backend=backend)
        w.plan(qo_indptr, indptr, indices, last, heads, kv_heads, dim, page, causal=bool(attrs.get("causal")),
               q_data_type=q.dtype, **common)
        out = w.run(q.reshape(-1, heads, dim), (k_cache, v_cache))
        return out.reshape(q.shape[0], q.shape[1], heads, -1)

    return run


def backends():
    def executors(fi):
        return {
            "flashinfer.attention.prefill": _single(fi, False, "fa2"),
            "flashinfer.attention.prefill_fa3": _single(fi, False, "fa3"),
            "flashinfer.attention.decode": _single(fi, True, None),
            "flashinfer.paged_attention.prefill": _paged(fi, False, "fa2"),
            "flashinfer.paged_attention.prefill_fa3": _paged(fi, False, "fa3"),
            "flashinfer.paged_attention.decode": _paged(fi, True, None),
        }

    return [("flashinfer", "flashinfer", _probe, executors)]
