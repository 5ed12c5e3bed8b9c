"""FlashAttention-2 and -3 cases from the upstream test suites (issue 34).

Read at the commit capabilities/flash_attn_2.json and flash_attn_3.json cite:
  tests/test_flash_attn.py             FA2 CUDA -> flash_attn_2.attention.fwd / .paged_attention.kvcache
  tests/test_flash_attn_ck.py          FA2 ROCm -> flash_attn_2.attention.fwd_ck / .paged_attention.kvcache_ck
  tests/test_flash_attn_triton_amd.py  FA2 Triton on ROCm, its paged kvcache only (the dense and
                                       contiguous-cache Triton paths have no kernel id here)
  hopper/test_flash_attn.py            FA3 -> flash_attn_3.attention.fwd / .paged_attention.fwd
Left out: FA2's *_qkvpacked, *_deterministic, *_race_condition and bwd_* tests (the forward
inputs of test_flash_attn_output under backward-only conditions); hopper/test_kvcache.py (a
benchmark script); hopper/test_attn_kvcache.py (it passes gqa_parallel= and descale_q=, which
the hopper flash_attn_with_kvcache at this commit no longer takes).

A grid is far larger than its verdicts need, so rows cover every pair of values of the axes kept
(`strength` 2) or every value once (1, for tests that mostly repeat another's inputs), and the
hardware the test runs on is dealt round-robin over them: nothing in these forwards differs
between the sm80+ parts FA2's README names, nor between h100 and h200. Axes that change no
verdict (batch, kvpacked, deterministic) stay at the test's value. A kvcache call without a block
table is dense attention of Sq new queries against Sk cached keys; with one, paged attention.
"""

import ast
import json
import math
import os

from common import Fixture, Source, UpstreamChanged, dtype

REPO = "Dao-AILab/flash-attention"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FA2_GPUS = ["a100", "a10", "l4", "rtx4090", "h100", "h200"]  # README: Ampere, Ada, Hopper
AMD_GPUS = ["mi250x", "mi300x", "mi355x"]
FA3_GPUS = ["h100", "h200"]
FA2 = ("flash_attn_2.attention.fwd", "flash_attn_2.paged_attention.kvcache")
CK = ("flash_attn_2.attention.fwd_ck", "flash_attn_2.paged_attention.kvcache_ck")
TRITON = (None, "flash_attn_2.paged_attention.kvcache_triton_amd")
FA3 = ("flash_attn_3.attention.fwd", "flash_attn_3.paged_attention.fwd")
FP8 = "torch.float8_e4m3fn"
NON_CAUSAL_LOCAL = {"local": True, "causal": False}


class Text(Source):
    """A C++ upstream file: quoted and cited like a test. Source sets text and lines before it
    parses, and the parse of C++ is the only thing expected to fail."""

    def __post_init__(self):
        try:
            super().__post_init__()
        except SyntaxError:
            pass


def build(src, text, **flags):
    """A parametrize list written as an expression (`[torch.bfloat16] + ([...] if not DISABLE_FP8
    else [])`, `COMPILED_HDIMS`) in the default build: DISABLE_* off unless `flags` says so."""

    def ev(n):
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, (ast.List, ast.Tuple)):
            vals = [ev(e) for e in n.elts]
            return vals if isinstance(n, ast.List) else tuple(vals)
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Mult)):
            a, b = ev(n.left), ev(n.right)
            return a + b if isinstance(n.op, ast.Add) else a * b
        if isinstance(n, ast.IfExp):
            return ev(n.body) if ev(n.test) else ev(n.orelse)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            return not ev(n.operand)
        if isinstance(n, ast.BoolOp):
            vals = [ev(v) for v in n.values]
            return all(vals) if isinstance(n.op, ast.And) else any(vals)
        if isinstance(n, ast.Compare) and [type(o) for o in n.ops] == [ast.IsNot]:
            return ev(n.left) is not ev(n.comparators[0])
        if isinstance(n, ast.Attribute):
            return ast.unparse(n)  # torch.bfloat16 -> "torch.bfloat16", as Source.grid keeps it
        if isinstance(n, ast.Name):
            if n.id in flags:
                return flags[n.id]
            if n.id.startswith("DISABLE_"):
                return False
            if n.id == "apply_rotary_emb":  # `... if apply_rotary_emb is not None`: installed
                return n.id
            for node in src.tree.body:
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == n.id for t in node.targets):
                    return ev(node.value)
        raise UpstreamChanged(f"{src.path}: cannot evaluate {ast.unparse(n)}")

    return ev(ast.parse(text, mode="eval").body)


def values(src, test, arg, **flags):
    """What parametrize argument `arg` ("a", or "a,b" for a joint one) runs on sm80+."""
    key = tuple(arg.split(",")) if "," in arg else arg
    vals = src.grid(test, [key])[key][0]
    if len(vals) == 1 and isinstance(vals[0], str) and ("[" in vals[0] or vals[0].isidentifier()):
        return build(src, vals[0], **{"is_sm75": False, **flags})
    return vals


def pick(src, test, arg, wanted):
    """Representative values of an axis whose value changes no verdict, checked to be run."""
    missing = [w for w in wanted if w not in values(src, test, arg)]
    if missing:
        raise UpstreamChanged(f"{src.path}::{test}: {arg} no longer runs {missing}")
    return list(wanted)


def cover(axes, strength, avoid=()):
    """Rows holding every value (strength 1) or every pair of values (2) of `axes`, chosen
    greedily; no row matches all of a dict in `avoid` (inputs not run, or not expressible)."""
    names = list(axes)

    def ok(row):  # row: {axis: index}
        return not any(all(k in row and axes[k][row[k]] == v for k, v in p.items()) for p in avoid)

    if strength == 1:
        todo = {((n, i),) for n in names for i in range(len(axes[n]))}
    else:
        todo = {((a, i), (b, j)) for x, a in enumerate(names) for b in names[x + 1:]
                for i in range(len(axes[a])) for j in range(len(axes[b]))}
    todo = {t for t in todo if ok(dict(t))}
    rows = []
    while todo:
        row = dict(min(todo))
        for n in [a for a in names if a not in row]:
            fits = [i for i in range(len(axes[n])) if ok({**row, n: i})]
            if not fits:
                raise ValueError(f"no value of {n} fits {row}")
            gain = lambda i: sum(all({**row, n: i}.get(m) == k for m, k in t) for t in todo)
            row[n] = max(fits, key=lambda i: (gain(i), -i))
        todo = {t for t in todo if not all(row[m] == k for m, k in t)}
        rows.append({n: axes[n][row[n]] for n in names})
    return rows


def tensor(dt, shape, layout=None):
    return {"dtype": dt, "shape": shape, **({"layout": layout} if layout else {})}


def request(row, heads, batch, varlen):
    """The LayerZero request of one row. The tests draw a window with torch.randint(0, seqlen_k);
    it is held at seqlen_k // 2."""
    dt = dtype(row["dtype"])
    d, dv = row.get("d,dv", (row.get("d"), row.get("d")))
    sq, sk = row["seqlen_q,seqlen_k"]
    if row.get("swap_sq_sk"):
        sq, sk = sk, sq
    causal, local = row.get("causal,local", (row.get("causal", False), row.get("local", False)))
    hq, hk = heads(row)
    attrs = {"causal": True, "causal_alignment": "bottom_right"} if causal else {}
    if local:
        attrs["window_left"] = sk // 2
    for key, attr in (("dropout_p", "dropout_p"), ("softcap", "softcap"), ("alibi", "alibi")):
        if row.get(key):
            attrs[attr] = row[key]
    page = row.get("paged_kv_block_size", row.get("page_size"))
    if page:
        per_seq = math.ceil(sk / page)
        cache = [per_seq * batch * 3, page, hk, d]  # the pool _generate_block_kvcache makes
        tensors = {"q": tensor(dt, [batch, sq, hq, d], "BSHD"), "k_cache": tensor(dt, cache, "NHD"),
                   "v_cache": tensor(dt, cache, "NHD"), "block_table": tensor("i32", [batch, per_seq]),
                   "context_lens": tensor("i32", [batch])}
        return {"op": "paged_attention", "tensors": tensors, "attrs": attrs}
    b, tq, tk = (1, batch * sq, batch * sk) if varlen else (batch, sq, sk)
    tensors = {"q": tensor(dt, [b, tq, hq, d], "BSHD"), "k": tensor(dt, [b, tk, hk, d], "BSHD"),
               "v": tensor(dt, [b, tk, hk, dv], "BSHD")}
    if varlen:
        tensors["cu_seqlens_q"] = tensor("i32", [batch + 1])
        tensors["cu_seqlens_k"] = tensor("i32", [batch + 1])
    return {"op": "attention", "tensors": tensors, "attrs": attrs}


def label(src, test, row):
    parts = []
    for k, v in row.items():
        if k != "hardware":
            keys = k.split(",")
            parts += [f"{a}={str(b).replace('torch.', '')}" for a, b in zip(keys, v if len(keys) > 1 else (v,))]
    return f"{src.path}::{test}[{','.join(parts)}]"


def kv_heads(nheads, gqa):
    """(nheads, nheads_k) as the tests set them: nheads_k is nheads, 1 (mqa) or `gqa`."""
    return lambda r: (nheads, {"mha": nheads, "mqa": 1, "gqa": gqa}[r.get("mha_type", "mha")])


def emit(fx, src, test, *, call, kernels, hardware, axes, strength, heads, batch, varlen=False,
         rejects=(), avoid=(), note=lambda r: "", force=None):
    """Accept rows citing the test's `call`; for each (pin, skip line, why) of `rejects` rows with
    the pin held, citing the skip; with `force` (source, why) every row a reject of that source."""
    after = src.function(test).lineno
    pins = [p for p, _, _ in rejects] + list(avoid)
    sets = [(cover(axes, strength, pins), force)]
    for pin, needle, why in rejects:
        held = {**axes, **{k: [v] for k, v in pin.items()}}
        sets.append((cover(held, 1, [p for p in pins if p is not pin]), (src.cite(needle, after), why)))
    for rows, verdict in sets:
        for i, row in enumerate(rows):
            row["hardware"] = hardware[i % len(hardware)]
            page = row.get("paged_kv_block_size", row.get("page_size"))
            fx.case(name=label(src, test, row), source=verdict[0] if verdict else src.cite(call, after),
                    kernel=kernels[1] if page else kernels[0], hardware=row["hardware"],
                    expect="reject" if verdict else "accept", request=request(row, heads, batch, varlen),
                    why=verdict[1] if verdict else "the test runs this input" + note(row))


def lacks(fx, src, test, entries, after=None):
    """Unexpressible inputs of `test`: (where, missing, why, params); `where` is a parametrize
    argument or a line of the body (the first after the `after` line, if given)."""
    grid = src.grid(test)
    start = src.line_of(after, src.function(test).lineno) if after else src.function(test).lineno
    for where, missing, why, params in entries:
        cited = f"{src.path}:{grid[where][1]}" if where in grid else src.cite(where, start)
        fx.lacks(name=f"{src.path}::{test}[{params}]", source=cited, missing=missing, why=why)


WINDOW = ("window_size = (-1, -1) if not local", "window_right", "local draws both window bounds with "
          "torch.randint(0, seqlen_k); without causal the right one stays, and attrs has only window_left "
          "(causal sets it to 0)", "local=True,causal=False")
ALIBI = ("alibi_slopes = torch.rand(", "alibi_slopes", "random [batch, nheads] slopes; attrs.alibi means "
         "the standard geometric ones, so alibi rows stand for the feature only", "alibi=True")
CACHE = [("new_kv", "k_new/v_new", "k, v appended to the cache inside the call", "new_kv=True"),
         ("rotary_cos=cos", "rope at cache_seqlens offsets", "rotary on the appended keys and q from each "
          "sequence's cache_seqlens (interleaved or not); attrs.rope puts queries at seq_k - seq_q",
          "rotary_fraction=0.5")]


def pad_note(src, after=None):
    """The why-note of a row whose d is no multiple of 8: the upstream line padding it first."""
    where = src.cite("head_size_og % 8 != 0", src.line_of(after) if after else 0)
    return lambda r: f"; d={r['d']} is padded to a multiple of 8 before the kernel ({where})" if r["d"] % 8 else ""


def fa2_dense(fx, src, kernels, hardware, heads, pads, softcap):
    """test_flash_attn_output (pairwise) and test_flash_attn_varlen_output (each value)."""
    for test, call, varlen in (("test_flash_attn_output", "= flash_attn_func(", False),
                               ("test_flash_attn_varlen_output", "= flash_attn_varlen_func(", True)):
        keep = ["d", "dtype", "causal", "local", "alibi", "dropout_p", "mha_type"] + (["softcap"] if softcap else [])
        axes = {k: values(src, test, k) for k in keep}
        axes["seqlen_q,seqlen_k"] = pick(src, test, "seqlen_q,seqlen_k", [(113, 203), (512, 256)])
        rejects = [({"softcap": 50.0, "dropout_p": 0.17}, 'pytest.skip("Softcap and dropout not supported together")',
                    "FA2 refuses softcap with dropout; the test skips it")] if softcap else []
        emit(fx, src, test, call=call, kernels=kernels, hardware=hardware, axes=axes, strength=1 + (not varlen),
             heads=heads, batch=4, varlen=varlen, rejects=rejects, avoid=[NON_CAUSAL_LOCAL],
             note=pads["varlen" if varlen else "dense"])
        lacks(fx, src, test, [WINDOW, ALIBI, ("return_attn_probs=True", "return_attn_probs", "the test reads "
              "the softmax and dropout mask the kernel also returns; a request names out only",
              "return_attn_probs=True")])


def fa2_kvcache(fx, src, kernels, hardware, batch, padded, pages=None):
    """test_flash_attn_kvcache with new_kv, rotary, leftpad and batch_idx off, num_splits 0."""
    test = "test_flash_attn_kvcache"
    axes = {k: values(src, test, k) for k in ("d", "dtype", "causal", "local", "alibi", "mha_type")}
    axes["paged_kv_block_size"] = pages or values(src, test, "paged_kv_block_size")
    axes["seqlen_q,seqlen_k"] = pick(src, test, "seqlen_q,seqlen_k", [(1, 339), (64, 800)])
    emit(fx, src, test, call="out = flash_attn_with_kvcache(", kernels=kernels, hardware=hardware, axes=axes,
         strength=2, heads=kv_heads(6, 3), batch=batch, avoid=[NON_CAUSAL_LOCAL], note=padded)
    entries = [ALIBI] + CACHE + [("num_splits=num_splits", "num_splits", "num_splits=1 forces a single KV "
               "split; a request cannot pin it", "num_splits=1")]
    entries += [WINDOW] if True in axes["local"] else []
    if True in values(src, test, "has_leftpad"):
        entries.append(("cache_leftpad=cache_leftpad", "cache_leftpad", "left-padded caches; the test skips "
                        "them with a block table, which FA2 refuses", "has_leftpad=True"))
    if True in values(src, test, "has_batch_idx"):
        entries.append(("cache_batch_idx=cache_batch_idx", "cache_batch_idx", "cache rows picked by an index "
                        "tensor; the test skips it with a block table", "has_batch_idx=True"))
    lacks(fx, src, test, entries)


def fa2_causal(fx, src, kernels, hardware, padded):
    """test_flash_attn_causal: causal always on, seqlen_q > seqlen_k through swap_sq_sk."""
    test = "test_flash_attn_causal"
    axes = {k: values(src, test, k) for k in ("d", "dtype", "local", "swap_sq_sk")}
    axes["seqlen_q,seqlen_k"] = pick(src, test, "seqlen_q,seqlen_k", [(3, 799), (113, 203)])
    emit(fx, src, test, call="out = flash_attn_func(q, k, v, 0.0, causal=causal", kernels=kernels,
         hardware=hardware, axes={**axes, "causal": [True]}, strength=1, heads=lambda r: (9, 9), batch=8,
         note=padded)


def fa2_cuda(fx, src, api, pads):
    fa2_dense(fx, src, FA2, FA2_GPUS, lambda r: kv_heads(4 if r.get("softcap") else 6, 2)(r), pads, True)
    fa2_causal(fx, src, FA2, FA2_GPUS, pads["dense"])
    fa2_kvcache(fx, src, FA2, FA2_GPUS, 2, pad_note(api))

    test = "test_flash_attn_splitkv"  # keys up to 100000, batch 1
    axes = {k: values(src, test, k) for k in ("d", "dtype", "causal", "local", "alibi", "swap_sq_sk")}
    axes["seqlen_q,seqlen_k"] = pick(src, test, "seqlen_q,seqlen_k", [(3, 1024), (16, 100000)])
    emit(fx, src, test, call="out, lse, _ = flash_attn_func(", kernels=FA2, hardware=FA2_GPUS, axes=axes,
         strength=1, heads=lambda r: (12, 12), batch=1, avoid=[NON_CAUSAL_LOCAL], note=pads["dense"])
    lacks(fx, src, test, [WINDOW])

    test = "test_flash_attn_varlen_causal"  # its dense rows; the paged ones have ragged queries
    axes = {k: values(src, test, k) for k in ("d", "dtype", "local", "swap_sq_sk")}
    axes["seqlen_q,seqlen_k"] = pick(src, test, "seqlen_q,seqlen_k", [(1, 239), (113, 203)])
    emit(fx, src, test, call="out_unpad = flash_attn_varlen_func(", kernels=FA2, hardware=FA2_GPUS,
         axes={**axes, "causal": [True]}, strength=1, heads=lambda r: (9, 9), batch=8, varlen=True,
         note=pads["varlen"])
    lacks(fx, src, test, [("paged_kv_block_size", "cu_seqlens_q with block_table", "flash_attn_varlen_func "
                           "over pages of 256 and 512: paged_attention has no ragged queries",
                           "paged_kv_block_size=512")])

    # A paged decode through the varlen entry: one query a sequence, window_size_right=0 (causal).
    test = "test_flash_attn_varlen_paged_kv_num_splits"
    axes = {"dtype": values(src, test, "dtype"), "seqlen_q,seqlen_k": [(1, 1024)], "paged_kv_block_size": [256],
            "d": [64], "causal": [True]}
    emit(fx, src, test, call="out_default = _flash_attn_varlen_forward(", kernels=FA2, hardware=FA2_GPUS,
         axes=axes, strength=1, heads=lambda r: (4, 2), batch=2)
    lacks(fx, src, test, [('pytest.raises(RuntimeError, match="num_splits > 1', "num_splits", "num_splits=2 "
                           "over a paged cache raises; a request cannot name a split count", "num_splits=2")])

    test = "test_flash_attn_kvcache_paged_block_table_bounds"  # its positive control
    axes = {"dtype": values(src, test, "dtype"), "paged_kv_block_size": values(src, test, "paged_kv_block_size"),
            "seqlen_q,seqlen_k": [(1, 256)], "d": [64]}
    emit(fx, src, test, call="out = flash_attn_with_kvcache(", kernels=FA2, hardware=FA2_GPUS, axes=axes,
         strength=1, heads=lambda r: (1, 1), batch=1)
    lacks(fx, src, test, [('pytest.raises(RuntimeError, match="block_table")', "context_lens values",
                           "cache_seqlens past the block table's capacity raises; a request gives context_lens' "
                           "shape, not its values", "append_knew=False,cache_seqlens=capacity+1")])

    # Turing: the dtype axis still names sm75 (f16 there); every entry point refuses cc < 8.
    force = (api.cite("FlashAttention only supports Ampere GPUs or newer."), "FA2 needs sm80 or newer")
    for test, call, shape, pages in (("test_flash_attn_output", "= flash_attn_func(", (113, 203), {}),
                                     ("test_flash_attn_kvcache", "out = flash_attn_with_kvcache(", (64, 800),
                                      {"paged_kv_block_size": [256]})):
        axes = {"d": values(src, test, "d"), "dtype": values(src, test, "dtype", is_sm75=True),
                "seqlen_q,seqlen_k": [shape], **pages}
        emit(fx, src, test, call=call, kernels=FA2, hardware=["t4"], axes=axes, strength=1,
             heads=lambda r: (6, 6), batch=2, force=force)


def fa3(fx, src, api):
    fp8_note = lambda r: " (fp8 without the q/k/v descale the test passes)" if r["dtype"] == FP8 else ""
    for test, call, varlen in (("test_flash_attn_output", "out = flash_attn_func(", False),
                               ("test_flash_attn_varlen_output", "out_unpad = flash_attn_varlen_func(", True)):
        # The value head dims each d runs, as the test's dv_vals line (checked present) gives them.
        src.line_of("dv_vals = [128, d] if d > 128 and d <= 192 else ([256, 512, d] if d <= 64 else [d])",
                    src.function(test).lineno)
        pairs = [(d, dv) for d in values(src, test, "d")
                 for dv in ([128, d] if 128 < d <= 192 else [256, 512, d] if d <= 64 else [d])]
        axes = {"d,dv": pairs, **{k: values(src, test, k) for k in ("dtype", "causal", "local", "softcap", "mha_type")}}
        axes["seqlen_q,seqlen_k"] = pick(src, test, "seqlen_q,seqlen_k", [(113, 203), (512, 256)])
        not_run = [{"dtype": FP8, "d,dv": p} for p in pairs if p[0] != p[1]]  # fp8: dv_vals = [d]
        emit(fx, src, test, call=call, kernels=FA3, hardware=FA3_GPUS, axes=axes, strength=1 + (not varlen),
             heads=kv_heads(6, 2), batch=4 if varlen else 9, varlen=varlen, avoid=[NON_CAUSAL_LOCAL] + not_run,
             note=fp8_note)
        entries = [WINDOW,
                   ("q_descale, k_descale, v_descale = [torch.rand(", "q_descale/k_descale/v_descale", "fp8 runs "
                    "with per (batch, kv head) descale factors; a request has no such tensors", "dtype=float8_e4m3fn"),
                   ('pytest.skip("Has Qv requires hdim 64', "qv", "has_qv adds a second query against v (d=64, "
                    "dv 256/512, not fp8; the test skips the rest)", "has_qv=True"),
                   ("attention_chunk_vals = [torch.randint(", "attention_chunk", "chunked local attention of a "
                    "drawn chunk size", "attention_chunk>0"),
                   ("pack_gqa_vals = [False, True]", "pack_gqa/num_splits", "pack_gqa=True and num_splits=3 pin "
                    "the schedule; a request cannot", "pack_gqa=True,num_splits=3")]
        if varlen:
            entries.append(("seqused_q=seqused_q,", "seqused_q/seqused_k", "add_unused_qkv leaves tokens "
                            "inside cu_seqlens that seqused_* exclude", "add_unused_qkv=True"))
        lacks(fx, src, test, entries)

    # Below sm90 the suite drops fp8 from its dtype axis (DISABLE_FP8 ... capability < 9).
    test = "test_flash_attn_output"
    assert FP8 not in values(src, test, "dtype", DISABLE_FP8=True)
    axes = {"d,dv": [(d, d) for d in values(src, test, "d")], "dtype": [FP8], "seqlen_q,seqlen_k": [(113, 203)]}
    emit(fx, src, test, call="out = flash_attn_func(", kernels=FA3, hardware=["a100"], axes=axes, strength=1,
         heads=kv_heads(6, 2), batch=9, force=(src.cite("DISABLE_FP8 = "), "FA3 runs fp8 on sm90 only; the "
                                                "suite drops it below"))

    test = "test_flash_attn_cluster"
    axes = {k: values(src, test, k) for k in ("d", "dtype", "causal", "seqlen_q,seqlen_k")}
    emit(fx, src, test, call="flash_attn_func(q, k, v, causal=causal)", kernels=FA3, hardware=FA3_GPUS,
         axes=axes, strength=1, heads=lambda r: (16, 4), batch=2)

    # Its d axis (copied from FA2) holds 59 and 111: the hopper interface does not pad and
    # mha_fwd refuses them, so the test would fail there rather than skip.
    test = "test_flash_attn_race_condition"
    axes = {k: values(src, test, k) for k in ("d", "dtype", "causal")}
    axes["seqlen_q,seqlen_k"] = pick(src, test, "seqlen_q,seqlen_k", [(239, 1), (1, 239)])
    refused = (api.cite('"head_size should be a multiple of " + std::to_string(alignment)'),
               "FA3 mha_fwd refuses a head dim that is no multiple of 8 (no padding in the hopper interface)")
    for ds, force in (([d for d in axes["d"] if d % 8 == 0], None), ([d for d in axes["d"] if d % 8], refused)):
        emit(fx, src, test, call="out0 = flash_attn_func(q, k, v, causal=causal)", kernels=FA3, hardware=FA3_GPUS,
             axes={**axes, "d": ds}, strength=1, heads=lambda r: (4, 4), batch=60, force=force)

    test = "test_flash_attn_kvcache"  # d 128, so dv 128; new_kv, leftpad, batch_idx, varlen_q off
    axes = {k: values(src, test, k) for k in ("d", "dtype", "causal,local", "page_size", "mha_type")}
    axes["seqlen_q,seqlen_k"] = pick(src, test, "seqlen_q,seqlen_k", [(1, 128), (64, 256)])
    call = "out, lse, *rest = flash_attn_with_kvcache("
    emit(fx, src, test, call=call, kernels=FA3, hardware=FA3_GPUS, axes=axes, strength=2, heads=kv_heads(6, 3),
         batch=5, avoid=[{"causal,local": (False, True)}], note=lambda r: " with num_splits=1")
    lacks(fx, src, test, [("window_size = (-1, -1) if not local",) + WINDOW[1:3] + ("causal=False,local=True",)])
    lacks(fx, src, test, after=call, entries=CACHE + [
        ("cache_leftpad=cache_leftpad,", "cache_leftpad", "left-padded caches", "has_leftpad=True"),
        ("cache_batch_idx=cache_batch_idx,", "cache_batch_idx", "cache rows picked by an index tensor",
         "has_batch_idx=True"),
        ("cu_seqlens_q=cu_seqlens_q,", "cu_seqlens_q with a kv cache", "ragged queries against a batched or "
         "paged cache", "varlen_q=True"),
        ("scheduler_metadata=scheduler_metadata,", "num_splits/scheduler_metadata", "split counts 3 and 0 and "
         "precomputed scheduler metadata pin the schedule", "num_splits=3,precompute_metadata=True"),
        ("attention_chunk=attention_chunk,", "attention_chunk", "chunked local attention of a drawn chunk size",
         "attention_chunk>0")])


def extract(gitdir):
    caps = {}
    for name in ("flash_attn_2", "flash_attn_3"):
        with open(os.path.join(ROOT, "capabilities", f"{name}.json")) as f:
            caps[name] = json.load(f)["upstream"]["commit"]
    commit = caps["flash_attn_2"]
    assert caps["flash_attn_3"] == commit, f"FA2 and FA3 capabilities cite different commits: {caps}"
    fx = Fixture(library="flash_attn", repository=REPO, commit=commit)

    # FA2's tests run d = 59 and 111: the Python wrappers pad them before mha_fwd, and
    # mha_fwd_kvcache pads inside (the capability counts the former as the caller's rewrite).
    iface = Source(gitdir, commit, "flash_attn/flash_attn_interface.py")
    pads = {"dense": pad_note(iface, "class FlashAttnFunc("), "varlen": pad_note(iface, "class FlashAttnVarlenFunc(")}
    fa2_cuda(fx, Source(gitdir, commit, "tests/test_flash_attn.py"),
             Text(gitdir, commit, "csrc/flash_attn/flash_api.cpp"), pads)
    ck = Source(gitdir, commit, "tests/test_flash_attn_ck.py")
    fa2_dense(fx, ck, CK, AMD_GPUS, kv_heads(9, 3), pads, softcap=False)
    fa2_causal(fx, ck, CK, AMD_GPUS, pads["dense"])
    fa2_kvcache(fx, ck, CK, AMD_GPUS, 1, pad_note(Text(gitdir, commit, "csrc/flash_attn_ck/mha_fwd_kvcache.cpp")))
    # The Triton kernel pads any head dim to a power of two itself: no note.
    fa2_kvcache(fx, Source(gitdir, commit, "tests/test_flash_attn_triton_amd.py"), TRITON, AMD_GPUS, 2,
                lambda r: "", pages=[256])
    fa3(fx, Source(gitdir, commit, "hopper/test_flash_attn.py"), Text(gitdir, commit, "hopper/flash_api.cpp"))
    return fx
