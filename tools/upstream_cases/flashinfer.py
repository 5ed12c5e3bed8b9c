"""FlashInfer cases from tests/attention/ at the commit capabilities/flashinfer.json cites.

A test is described by the FlashInfer calls it makes (single / ragged / paged, decode / prefill,
backend fa2 / fa3 / auto), the axes kept and the skips or raises that depend on input or GPU.
- Axes that cannot change a verdict (batch, lengths, head counts beyond the GQA ratio, return_lse,
  CUDA graphs) keep their first value; the others vary one at a time around the first values,
  `cross` axes (a skip reading both) in full product. Constants a test sets in its body
  (`head_dim = 512`) are read from its top-level assignments.
- Profiles are grouped by outcome (kernel, accept/reject, cited line); a group is written once, on
  a profile picked by a hash of the case (stable, and spread over all profiles); `why` names the
  profiles it stands for.
- backend="auto" prefill is FA3 on sm90 exactly when determine_attention_backend
  (flashinfer/utils.py) says so; elsewhere FA2. The decode wrappers used here run on CUDA cores.
- A skip gating another call of the same test (SM90A before an fa2 reference) is no verdict on
  this call's kernel: those profiles are left out, not rejected. The batch tests' skip of causal
  with qo_len > kv_len guards their single-prefill reference (which refuses it); it rejects
  that reference call, and leaves the batch wrapper call out.
- num_qo_heads % num_kv_heads != 0 (skipped upstream) is no request at all: dropped.
- bf16 FA2 prefill on sm75 runs in tests without a skip but prefill.cuh asserts against it: no claim.
- A test running what another skips keeps both cases (they differ somewhere); an exact clash
  (kernel, GPU, request) is printed and the first kept.
"""

import ast
import json
import os
import re
import zlib

from common import Fixture, Source, UpstreamChanged, dtype, product

REPO = "flashinfer-ai/flashinfer"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROFILES = ("t4", "a100", "a10", "l4", "rtx4090", "h100", "h200", "b200")
ALL = None  # in `vary`: every value of the upstream grid
ROPE = {"style": "rotate_half", "base": 10000.0}  # pos_encoding_mode ROPE_LLAMA at FlashInfer's defaults
FP8 = ("fp8_e4m3", "fp8_e5m2")


def _load(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return json.load(f)


CC = {p: float(_load("capabilities", "hardware", f"{p}.json")["devices"][0]["compute_capability"]) for p in PROFILES}
COMMIT = _load("capabilities", "flashinfer.json")["upstream"]["commit"]

# Upstream parameter / variable names -> the request's dimensions (a tuple sets several; () none).
NAMES = {
    "batch_size": "b", "kv_len": "kv", "qo_len": "qo", "q_len": "qo", "num_qo_heads": "hq", "num_kv_heads": "hkv",
    "num_heads": ("hq", "hkv"), "head_dim": "d", "head_dim_qk": "d", "head_dim_vo": "dv", "page_size": "page",
    "kv_layout": "layout", "causal": "causal", "pos_encoding_mode": "pos", "window_left": "window",
    "logits_soft_cap": "softcap", "soft_cap": "softcap", "q_dtype": "q_dt", "kv_dtype": "kv_dt",
    "dtype": ("q_dt", "kv_dt"), "group_size": "group", "seq_len": "kv", "backend": "backend",
    # Not part of a request: the LSE output (listed as unexpressible), CUDA graphs, storage.
    "return_lse": (), "use_cuda_graph": (), "contiguous_kv": (),
}
DEFAULTS = dict(b=1, qo=1, kv=1, page=16, layout="NHD", causal=False, pos="NONE", softcap=0.0, window=-1,
                mask=False, kv5=False, kpad=0, vpad=0, packed=False, scales=False)


def gate(needle, cond, via=None, only=None, kind="pytest.skip", apis=None):
    """A skip/raise at the line holding `needle`; `cond(cc, p)` says it fires; `via` is the helper
    call the test body must hold; `only` names the backends, `apis` the calls, whose kernel it
    judges (a skip guarding a test's reference call is no verdict on the call under test)."""
    return dict(needle=needle, cond=cond, via=via, only=only, kind=kind, apis=apis)


HD512_SM80 = gate('"16-bit FA2 head_dim > 256 is only supported on SM80 or newer"',
                  lambda cc, p: p["d"] > 256 and cc < 8, via="skip_if_head_dim")
FP8_512_SM100 = gate('"head_dim > 256 with FP8 KV is only validated on SM100 or newer"',
                     lambda cc, p: p["d"] > 256 and p["kv_dt"] in FP8 and cc < 10, via="skip_if_head_dim_dtype")
HD512_SM100 = gate('"head_dim > 256 is only supported on SM100 or newer"',
                   lambda cc, p: p["d"] > 256 and cc < 10, via="skip_if_head_dim_unsupported(head_dim)")
SM90A = gate('pytest.skip("SM90A is not supported")', lambda cc, p: cc != 9.0, only={"fa3"})
FA3_SM90A = gate('pytest.skip("FA3 is not supported on this device")', lambda cc, p: cc != 9.0, only={"fa3"})
CAUSAL = gate('"qo_len > kv_len and causal is not supported"', lambda cc, p: p["causal"] and p["qo"] > p["kv"])
# The batch tests skip causal with more queries than keys for their single-prefill reference,
# which refuses it (prefill.cuh l.2533); their batch wrappers run it elsewhere (custom mask,
# fully masked rows). The skip judges the reference call only.
CAUSAL_REF = dict(CAUSAL, apis={"prefill"})
ALIBI_CAUSAL = gate('"Causal attention requires q_len <= kv_len"', lambda cc, p: p["causal"] and p["qo"] > p["kv"])


def route(api, backend, cc, p):
    """Our kernel id for a FlashInfer call on a GPU of compute capability `cc`."""
    family = "paged_attention" if api in ("pdecode", "pprefill") else "attention"
    if api in ("decode", "pdecode"):
        return f"flashinfer.{family}.decode"
    hd = (p["d"], p["dv"])
    auto_fa3 = (cc == 9.0 and p["pos"] == "NONE" and not p["mask"] and not (p["kv_dt"] in FP8 and p["q_dt"] not in FP8)
                and (hd in ((64, 64), (128, 128), (256, 256)) or hd == (192, 128)))
    fa3 = backend == "fa3" or (backend == "auto" and auto_fa3)
    return f"flashinfer.{family}.prefill" + ("_fa3" if fa3 else "")


def _t(dt, shape, layout=None, strides=None):
    return {k: v for k, v in (("dtype", dt), ("shape", shape), ("layout", layout), ("strides", strides)) if v}


def request(api, p):
    """The LayerZero request for one call with dimensions `p`."""
    a = {"causal": True} if p["causal"] else {}
    if p["softcap"] > 0:
        a["softcap"] = float(p["softcap"])
    if p["window"] >= 0:
        a["window_left"] = p["window"]
    if p["pos"] == "ALIBI":
        a["alibi"] = True
    if p["pos"] == "ROPE_LLAMA":
        a["rope"] = dict(ROPE)
    b, qo, kv, hq, hkv, d = p["b"], p["qo"], p["kv"], p["hq"], p["hkv"], p["d"]
    row = (hq + 2 * hkv) * d  # a token's row in a packed qkv tensor (the non-contiguous tests)
    if api in ("pdecode", "pprefill"):
        n, page, nhd = -(-kv // p["page"]), p["page"], p["layout"] == "NHD"

        def cache(pad):
            # k/v pools sliced from a [pages, 2, ...] tensor (kv5) and/or a parent with padded heads
            h = hkv + pad
            lead = (2 if p["kv5"] else 1) * page * h * d
            strides = [lead, h * d, d, 1] if nhd else [lead, page * d, d, 1]
            shape = [b * n, page, hkv, d] if nhd else [b * n, hkv, page, d]
            return _t(p["kv_dt"], shape, p["layout"], strides if (p["kv5"] or pad) else None)

        t = {"q": _t(p["q_dt"], [b, qo, hq, d], "BSHD", [qo * row, row, d, 1] if p["packed"] else None),
             "k_cache": cache(p["kpad"]), "v_cache": cache(p["vpad"]),
             "block_table": _t("i32", [b, n]), "context_lens": _t("i32", [b])}
        if p["scales"]:
            t["k_scale"], t["v_scale"] = _t("f32", [1]), _t("f32", [1])
        return {"op": "paged_attention", "tensors": t, "attrs": a}
    ragged, bhsd = api == "ragged", p["layout"] == "HND"
    bb = b if api == "masked" else 1  # single_* take one request; ragged packs all into batch 1
    sq, sk = (b * qo, b * kv) if ragged else (qo, kv)

    def dense(dt, s, h, dd):
        shape = [bb, h, s, dd] if bhsd else [bb, s, h, dd]
        return _t(dt, shape, "BHSD" if bhsd else "BSHD", [s * row, row, dd, 1] if p["packed"] else None)

    t = {"q": dense(p["q_dt"], sq, hq, d), "k": dense(p["kv_dt"], sk, hkv, d), "v": dense(p["kv_dt"], sk, hkv, p["dv"])}
    if ragged:
        t["cu_seqlens_q"], t["cu_seqlens_k"] = _t("i32", [b + 1]), _t("i32", [b + 1])
    if p["mask"]:
        t["mask"] = _t("bool", [qo, kv])  # one [qo_len, kv_len] keep-mask shared by requests and heads
    return {"op": "attention", "tensors": t, "attrs": a}


def _flat(raw):
    """(name, value) pairs, a tuple-named axis ("a, b": [(1, 2)]) split up."""
    for k, v in raw.items():
        yield from zip(k, v) if isinstance(k, tuple) else [(k, v)]


def _assigned(s, body, names):
    """{name: value} of the `name = literal` (or torch dtype) statements of `body` naming `names`."""
    out = {}
    for st in (st for st in body if isinstance(st, ast.Assign) and len(st.targets) == 1):
        tgt, val = st.targets[0], st.value
        pairs = zip(tgt.elts, val.elts) if isinstance(tgt, ast.Tuple) and isinstance(val, ast.Tuple) else [(tgt, val)]
        for t, v in ((t, v) for t, v in pairs if isinstance(t, ast.Name) and t.id in names):
            text = ast.get_source_segment(s.text, v)
            try:
                out[t.id] = ast.literal_eval(v)
            except ValueError:
                if text.startswith("torch."):
                    out[t.id] = text
    return out


def cover(axes, cross):
    """Inputs: each `cross` group in full product, every other axis one value at a time, the rest at
    its first value. Yields (values, the axis that decided this input)."""
    base = {k: v[0] for k, v in axes.items()}
    rest = [(k,) for k in axes if not any(k in g for g in cross)]
    # varied axes first, so the base input cites one of them rather than a collapsed batch size
    groups = [tuple(g) for g in cross] + sorted(rest, key=lambda g: len(axes[g[0]]) == 1)
    seen = []
    for g in groups:
        for combo in product({k: axes[k] for k in g}):
            p = {**base, **combo}
            if p not in seen:
                seen.append(p)
                yield p, next((k for k in g if combo[k] != base[k]), g[0])


class Run:
    """Reads upstream files once and writes the cases of one test at a time."""

    def __init__(self, gitdir):
        self.gitdir, self.src, self.conflicts = gitdir, {}, []
        self.fx = Fixture(library="flashinfer", repository=REPO, commit=COMMIT)

    def source(self, name):
        if name not in self.src:
            self.src[name] = Source(self.gitdir, COMMIT, f"tests/attention/{name}")
        return self.src[name]

    def body(self, s, fn, text):
        """The line of `text` inside test `fn`; fails when the test no longer holds it."""
        node = s.function(fn)
        line = s.line_of(text, after=node.lineno - 1)
        if line > node.end_lineno:
            raise UpstreamChanged(f"{s.path}: {fn} no longer holds {text!r}")
        return line

    def lacks(self, file, fn, needle, missing, why):
        s = self.source(file)
        line = self.body(s, fn, needle)
        self.fx.lacks(name=f"{s.path}::{fn}", source=f"{s.path}:{line}", missing=missing, why=f"{why} (l.{line})")

    def test(self, file, fn, calls, vary=(), cross=(), gates=(), fixed=None, names=None, inputs=None):
        """`calls`: [(api, backend, text the body must hold, dimension overrides)]; `vary`: {axis:
        values or ALL}; `fixed`: {dimension: (value, text the body must hold)} for what no variable
        names; `inputs`: for a test without a grid, [(values, text cited for running them)]."""
        s, names = self.source(file), dict(NAMES, **(names or {}))
        grid, vary = s.grid(fn), dict(vary)
        assert set(vary) <= set(grid), (fn, set(vary) - set(grid))
        local = {**_assigned(s, s.tree.body, names), **_assigned(s, s.function(fn).body, names)}
        fixed = {k: v for k, (v, needle) in (fixed or {}).items() if self.body(s, fn, needle)}  # body() fails if gone
        for _, _, needle, _ in calls:
            self.body(s, fn, needle)
        if "return_lse" in grid and True in grid["return_lse"][0]:
            line = grid["return_lse"][1]
            self.fx.lacks(name=f"{s.path}::{fn}", source=f"{s.path}:{line}", missing="return_lse",
                          why=f"the test also checks the log-sum-exp; no LayerZero output carries it (l.{line})")
        if inputs is None:
            axes = {}
            for k, (vals, _) in grid.items():
                if len(vals) == 1 and isinstance(vals[0], str):  # a module-level list (SEQ_LENS = [...])
                    vals = _assigned(s, s.tree.body, {vals[0]}).get(vals[0], vals)
                want = vals if vary.get(k, 0) is ALL else vary.get(k, vals[:1])
                assert set(map(str, want)) <= set(map(str, vals)), (fn, k, want, vals)
                axes[k] = list(want)
            cited = [(raw, grid[axis][1], f"parametrize {axis} {raw[axis]!r}") for raw, axis in cover(axes, cross)]
        else:
            cited = [(raw, self.body(s, fn, needle), f"`{needle.strip()}`") for raw, needle in inputs]
        for raw, line, what in cited:
            p = dict(DEFAULTS, **fixed)
            for k, v in list(local.items()) + list(_flat(raw)):
                v = dtype(v) if isinstance(v, str) and v.startswith("torch.") else v
                assert v is not None, (fn, k)
                for dim in names[k] if isinstance(names[k], tuple) else (names[k],):
                    p[dim] = v
            if "q_dt" not in p:  # no dtype parameter: the test makes its tensors in float16
                node = s.function(fn)
                assert re.search(r"torch\.(float16|half)", "\n".join(s.lines[node.lineno:node.end_lineno])), fn
                p["q_dt"] = "f16"
            if "group" in p:
                p["hq"] = p["hkv"] * p["group"]
            p.setdefault("kv_dt", p["q_dt"])
            p.setdefault("dv", p["d"])
            if p["hq"] % p["hkv"]:
                continue
            label = ",".join(f"{k}={v}" for k, v in _flat(raw))
            for api, backend, needle, over in calls:
                q = dict(p, **over)
                name = f"{s.path}::{fn}[{label}]" + (f" `{needle.strip()}`" if len(calls) > 1 else "")
                self.emit(s, fn, name, api, q.get("backend", backend), q, line, what, gates)

    def emit(self, s, fn, name, api, backend, p, line, what, gates):
        outcomes = {}
        for prof in PROFILES:
            cc, kernel = CC[prof], route(api, backend, CC[prof], p)
            if kernel.endswith(".prefill") and p["q_dt"] == "bf16" and cc < 8:
                continue
            verdict = ("accept", f"{s.path}:{line}", f"runs: {what} (l.{line})")
            for g in (g for g in gates if g["cond"](cc, p)):
                if (g["only"] is not None and backend not in g["only"]) or (g["apis"] is not None and api not in g["apis"]):
                    verdict = None
                    break
                if g["via"]:
                    self.body(s, fn, g["via"])
                try:
                    at = self.body(s, fn, g["needle"])
                except UpstreamChanged:
                    at = s.line_of(g["needle"])  # inside the helper named by `via`
                msg = re.search(r'"([^"]+)"', g["needle"]).group(1)
                verdict = ("reject", f"{s.path}:{at}", f"{g['kind']}: {msg} (l.{at})")
                break
            if verdict is not None:
                outcomes.setdefault((kernel,) + verdict, []).append(prof)
        req = request(api, p)
        for (kernel, expect, source, why), profs in outcomes.items():
            prof = profs[zlib.crc32(f"{name} {kernel}".encode()) % len(profs)]
            if backend == "auto" and api not in ("decode", "pdecode"):
                why += f"; backend auto picks {'fa3' if kernel.endswith('_fa3') else 'fa2'} on this GPU"
            if len(profs) > 1:
                why += f"; stands for {'/'.join(profs)}"
            key = json.dumps([kernel, prof, req], sort_keys=True)
            self.conflicts += [(name, c["name"], kernel, prof) for c in self.fx.cases
                               if c["_key"] == key and c["expect"] != expect]
            self.fx.case(name=name, source=source, kernel=kernel, hardware=prof, expect=expect, request=req, why=why)


# Inputs the tests run that no request can express: (file, tests, text in each, missing field, why).
DEC, PRE, HOP, H8 = ("test_batch_decode_kernels.py", "test_batch_prefill_kernels.py", "test_hopper.py",
                     "test_hopper_fp8_attention.py")
FP8_RUNS = ("test_single_prefill", "test_batch_prefill_ragged", "test_batch_prefill_paged", "test_batch_decode_paged",
            "test_batch_prefill_paged_scale_types")
SWA8 = ("test_fp8_ragged_prefill_sliding_window", "test_fp8_paged_prefill_sliding_window")
LACKS = [
    (DEC, ["test_batch_decode_with_paged_kv_cache_nvfp4"], "create_nvfp4_kv(", "kv_cache dtype nvfp4",
     "NVFP4 (packed e2m1 + fp8 block scales) KV pages: no LayerZero dtype is a 4-bit KV cache"),
    (PRE, ["test_batch_prefill_with_paged_kv_cache_nvfp4", "test_batch_prefill_with_ragged_kv_cache_nvfp4"],
     "create_nvfp4_kv(", "kv_cache dtype nvfp4", "NVFP4 K/V on the batch prefill wrappers"),
    (PRE, ["test_batch_prefill_with_paged_kv_cache_custom_mask"], "custom_mask=custom_mask,", "mask (paged_attention)",
     "a boolean custom mask on the paged prefill wrapper: paged_attention takes no mask tensor"),
    (PRE, ["test_batch_prefill_with_paged_kv_cache_multi_item_scoring"], "prefix_len_ptr=", "multi_item_scoring",
     "multi-item scoring (prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr): a mask mode no field names"),
    (HOP, ["test_batch_prefill_with_paged_kv_cache_multi_item_scoring_fa3",
           "test_batch_prefill_with_paged_kv_cache_multi_item_scoring_fa3_bsz2"], "prefix_len_ptr=",
     "multi_item_scoring", "multi-item scoring on the FA3 paged prefill wrapper"),
    (H8, FP8_RUNS, "s_q", "q_scale", "per-head fp8 descale of q (s_q): no request tensor names a query scale"),
    (H8, FP8_RUNS, "o_dtype", "out_dtype", "fp8 inputs with an f16 output (o_dtype); LayerZero's output has q's dtype"),
    ("test_hopper_fp8_sliding_window.py", SWA8, "sq, sk, sv", "q_scale", "per-head fp8 descale of q passed to run()"),
    ("test_decode_fp8_calibration_scale.py", ["test_single_decode_fp8_calibration_scale"], "k_scale=k_scale,",
     "k_scale/v_scale (attention)", "fp8 K/V with calibration scales on single decode: attention has no k/v scales"),
    ("test_attention_sink.py", ["test_attention_sink"], '["sink"]', "sink",
     "a per-head attention sink in the softmax (AttentionSink variant of the batch prefill wrappers)"),
]


def extract(gitdir):
    r = Run(gitdir)
    seq = dict(seq_len=("qo", "kv"))  # tests where seq_len is both the query and the KV length
    fa2 = lambda w, over={}: [(w, "fa2", 'backend="fa2"', over)]  # noqa: E731
    both = lambda w: fa2(w) + [(w, "fa3", 'backend="fa3"', {})]  # noqa: E731
    # --- paged decode, and the single decode each batch entry is checked against
    r.test(DEC, "test_batch_decode_with_paged_kv_cache",
           [("pdecode", "auto", "BatchDecodeWithPagedKVCacheWrapper(", {"kv5": True}),
            ("decode", "auto", "o_ref_i = flashinfer.decode.single_decode_with_kv_cache(", {})],
           vary=dict(page_size=ALL, num_qo_heads=ALL, head_dim=ALL, pos_encoding_mode=ALL, kv_dtype=ALL),
           cross=[("head_dim", "kv_dtype")], gates=[HD512_SM80, FP8_512_SM100])
    r.test(DEC, "test_batch_decode_rejects_unequal_kv_strides_nvfp4_contract",
           [("pdecode", "auto", "BatchDecodeWithPagedKVCacheWrapper(", {})], names=dict(kpad="kpad", vpad="vpad"),
           inputs=[(dict(kpad=1, vpad=1), "k_equal = padded_pool(1)"),
                   (dict(kpad=1, vpad=2), "v_unequal = padded_pool(2)")],
           gates=[gate('match="must have identical strides"', lambda cc, p: p["kpad"] != p["vpad"],
                       kind="pytest.raises")])
    r.test(DEC, "test_tensor_core_decode_rejects_mismatched_q_len", [("pdecode", "auto", "use_tensor_cores=False", {})],
           fixed=dict(kv=(16, "last_len = torch.full((batch_size,), page_size,")), names=dict(q_len_per_req="qo"),
           inputs=[(dict(q_len_per_req=2), "q_len_per_req=2,")],
           gates=[gate('match="use_tensor_cores"', lambda cc, p: p["qo"] > 1, kind="pytest.raises")])
    # --- paged and ragged prefill
    causal_axes = dict(qo_len=[37, 577], num_qo_heads=ALL, head_dim=ALL, causal=ALL, pos_encoding_mode=ALL)
    # each request checked against single prefill on its own NHD slices
    ref = ("prefill", "auto", "o_ref_i = flashinfer.prefill.single_prefill_with_kv_cache(", {"layout": "NHD"})
    r.test(PRE, "test_batch_prefill_with_paged_kv_cache",
           [("pprefill", "auto", "PagedKVCacheWrapper(", {"kv5": True}), ref],
           vary=dict(causal_axes, page_size=ALL), cross=[("qo_len", "causal")], gates=[CAUSAL_REF])
    r.test(PRE, "test_batch_prefill_with_ragged_kv_cache", [("ragged", "auto", "RaggedKVCacheWrapper(", {}), ref],
           vary=causal_axes, cross=[("qo_len", "causal")], gates=[CAUSAL_REF])
    for fn, w, over in (("test_batch_prefill_with_paged_kv_cache_head_dim_512", "pprefill", {"kv5": True}),
                        ("test_batch_prefill_with_ragged_kv_cache_head_dim_512", "ragged", {})):
        r.test(PRE, fn, fa2(w, over), vary=dict(causal=ALL, pos_encoding_mode=ALL), gates=[HD512_SM80])
    # Equal-length requests sharing one mask: a padded batch with a [qo, kv] mask. Its causal call
    # runs qo_len > kv_len with no skip (the batch kernels mask whole rows; single prefill refuses).
    r.test(PRE, "test_batch_prefill_with_ragged_kv_cache_custom_mask",
           [("masked", "auto", "custom_mask=custom_mask,", {"mask": True}),
            ("ragged", "auto", "causal=True,", {"causal": True})],
           vary=dict(qo_len=[37, 577], num_qo_heads=ALL, head_dim=ALL, pos_encoding_mode=ALL, logits_soft_cap=ALL),
           cross=[("qo_len", "logits_soft_cap")])
    r.test(PRE, "test_batch_prefill_paged_shared_kv_smem_unequal_kv_strides", fa2("pprefill"),
           vary=dict(kv_layout=ALL, qo_len=ALL), gates=[HD512_SM80],
           fixed=dict(kpad=(1, "k = padded_pool(1)"), vpad=(3, "v = padded_pool(3)")))
    r.test(PRE, "test_paged_prefill_fully_masked_rows", fa2("pprefill"), vary=dict(dtype=ALL),
           fixed=dict(causal=(True, "causal=True")))
    # --- single prefill on FA2, and the sm90 comparisons of FA2 with FA3
    r.test("test_single_prefill.py", "test_sinqle_prefill_with_paged_kv_cache", fa2("prefill"),
           vary=dict(qo_len=[37, 577], num_qo_heads=ALL, head_dim=ALL, causal=ALL), cross=[("qo_len", "causal")],
           gates=[CAUSAL])
    r.test(HOP, "test_single_prefill", both("prefill"), names=seq, gates=[SM90A],
           vary=dict(num_qo_heads=ALL, causal=ALL, head_dim=ALL, logits_soft_cap=ALL))
    r.test(HOP, "test_batch_ragged_prefill", both("ragged"), names=seq, gates=[SM90A],
           vary=dict(num_qo_heads=ALL, causal=ALL, logits_soft_cap=ALL))
    r.test(HOP, "test_deepseek_prefill", both("ragged"), names=seq, gates=[SM90A], vary=dict(causal=ALL, dtype=ALL))
    # (192, 128) on FA2 on every GPU, on FA3 on sm90
    mla = "test_deepseek_mla.py"
    r.test(mla, "test_single_prefill_with_kv_cache", [("prefill", "fa2", "flashinfer.single_prefill_with_kv_cache(", {})],
           gates=[FA3_SM90A], vary=dict(causal=ALL, backend=ALL))
    r.test(mla, "test_batch_prefill_with_ragged_kv_cache", [("ragged", "fa2", "BatchPrefillWithRaggedKVCacheWrapper(", {})],
           gates=[FA3_SM90A], vary=dict(causal=ALL, backend=ALL))
    r.test(HOP, "test_batch_paged_prefill", both("pprefill"), names=seq, gates=[SM90A],
           vary=dict(page_size=ALL, num_qo_heads=ALL, causal=ALL, head_dim=ALL, logits_soft_cap=ALL))
    # --- fp8 on sm90 (FA3); each fp8 call has an f16 reference on the same backend. Requests carry
    # no q/k/v descales (FlashInfer defaults them to ones); the scaled runs are in LACKS.
    ref = {"q_dt": "f16", "kv_dt": "f16"}
    fp8 = lambda w, call: [(w, "fa3", call, {}), (w, "fa3", 'backend="fa3"', ref)]  # noqa: E731
    lens = dict(qo=(128, "qo_lens = [128 * (i + 1)"), kv=(128, "kv_lens = [128 * (i + 1)"))
    r.test(H8, "test_single_prefill", fp8("prefill", "o_fp8 = flashinfer.single_prefill_with_kv_cache("), names=seq,
           gates=[SM90A], vary=dict(causal=ALL, head_dim=ALL, dtype=ALL))
    fp8_axes = dict(head_dim=ALL, causal=ALL, dtype=ALL)
    r.test(H8, "test_batch_prefill_ragged", fp8("ragged", "wrapper_fp8 = flashinfer.BatchPrefillWithRaggedKVCache"),
           gates=[SM90A], vary=fp8_axes, fixed=lens)
    for fn, vary in (("test_batch_prefill_paged", fp8_axes), ("test_batch_prefill_paged_gqa", {})):
        r.test(H8, fn, fp8("pprefill", "wrapper_fp8 = flashinfer.BatchPrefillWithPagedKVCache"), gates=[SM90A],
               vary=vary, fixed=lens)
    # Tensor-core decode with backend="fa3" runs the FA3 paged prefill module with one query.
    r.test(H8, "test_batch_decode_paged", fp8("pprefill", "wrapper_fp8 = flashinfer.BatchDecodeWithPagedKVCache"),
           gates=[SM90A], fixed=dict(kv=lens["kv"]))
    swa = dict(names=dict(seq, HQ="hq", HKV="hkv", D="d", DT=("q_dt", "kv_dt")),
               fixed=dict(causal=(True, "causal=True")))
    for fn, w in zip(SWA8, ("ragged", "pprefill")):
        r.test("test_hopper_fp8_sliding_window.py", fn,
               [(w, "fa3", "fp8_w = flashinfer.", {}), (w, "fa3", "ref_w = flashinfer.", ref)], gates=[SM90A], **swa)
    # --- soft-cap and ALiBi on the single entry points (auto: FA3 takes soft-cap on sm90)
    cap, ali, alibi = "test_logits_cap.py", "test_alibi.py", dict(pos=("ALIBI", 'pos_encoding_mode="ALIBI"'))
    r.test(cap, "test_single_decode_logits_soft_cap", [("decode", "auto", "single_decode_with_kv_cache(", {})],
           vary=dict(head_dim=ALL, soft_cap=ALL))
    r.test(cap, "test_single_prefill_logits_soft_cap", [("prefill", "auto", "single_prefill_with_kv_cache(", {})],
           vary=dict(head_dim=ALL, soft_cap=ALL))
    r.test(ali, "test_single_decode_alibi", [("decode", "auto", "single_decode_with_kv_cache(", {})],
           vary=dict(head_dim=ALL), fixed=alibi)
    r.test(ali, "test_single_prefill_alibi", [("prefill", "auto", "single_prefill_with_kv_cache(", {})],
           vary=dict(q_len=[1, 17], head_dim=ALL, causal=ALL), cross=[("q_len", "causal")], gates=[ALIBI_CAUSAL],
           fixed=alibi)
    # --- q/k/v as strided views of one packed qkv tensor
    packed = dict(packed=(True, "qkv_packed"))
    r.test("test_non_contiguous_decode.py", "test_batch_paged_decode_packed_input",
           [("pdecode", "auto", "BatchDecodeWithPagedKVCacheWrapper(", {})], vary=dict(page_size=ALL, head_dim=ALL),
           fixed=packed)
    for fn, w, more in (("test_single_prefill_packed_input", "prefill", {}),
                        ("test_batch_ragged_prefill_packed_input", "ragged", {}),
                        ("test_batch_paged_prefill_packed_input", "pprefill", dict(page_size=ALL))):
        r.test("test_non_contiguous_prefill.py", fn, [(w, "auto", "o_packed = ", {})], names=seq,
               vary=dict(head_dim=ALL, causal=ALL, **more), fixed=packed)
    # --- sliding window (head_dim 512 gated on sm80 here, through FA2 and CUDA-core decode)
    sw, heads = "test_sliding_window.py", dict(num_kv_heads=ALL, num_qo_heads=ALL, head_dim=ALL)
    r.test(sw, "test_single_decode_sliding_window", [("decode", "auto", "window_left=window_left)", {})],
           vary=dict(heads, window_left=ALL), gates=[HD512_SM80])
    r.test(sw, "test_batch_decode_sliding_window", [("pdecode", "auto", "BatchDecodeWithPagedKVCacheWrapper(", {})],
           vary=dict(heads, window_left=ALL, page_size=ALL), gates=[HD512_SM80])
    r.test(sw, "test_single_prefill_sliding_window",
           [("prefill", "auto", "custom_mask=mask)", {"mask": True, "window": -1}),
            ("prefill", "auto", "window_left=window_left, causal=True", {"causal": True})],
           names=seq, vary=dict(window_left=ALL, num_qo_heads=ALL, head_dim=ALL), gates=[HD512_SM80])
    for fn, w, more in (("test_batch_paged_prefill_sliding_window", "pprefill", dict(page_size=ALL)),
                        ("test_batch_ragged_prefill_sliding_window", "ragged", {})):
        r.test(sw, fn, [(w, "auto", "backend=backend", {"causal": True})], gates=[HD512_SM80],
               vary=dict(qo_len=ALL, num_qo_heads=ALL, head_dim=ALL, backend=ALL, **more))
    # --- CUDA-core decode next to tensor-core decode: the grids with HND layouts and group sizes
    tc = "test_tensor_cores_decode.py"
    tc_axes = dict(group_size=ALL, head_dim=ALL, kv_layout=ALL, pos_encoding_mode=ALL)
    r.test(tc, "test_single_decode_tensor_cores", [("decode", "auto", "use_tensor_cores=False", {})], vary=tc_axes)
    r.test(tc, "test_batch_decode_tensor_cores", [("pdecode", "auto", "(workspace_buffer, kv_layout)", {"kv5": True})],
           vary=dict(tc_axes, page_size=ALL))
    # --- fp8 KV under an f16 query on FA2 (head_dim 512 gated on sm100 in this file)
    fp, kv8 = "test_fp8_prefill.py", dict(dtype="kv_dt")
    paged_axes = dict(page_size=ALL, num_qo_heads=ALL, head_dim=ALL, kv_layout=ALL, dtype=ALL)
    r.test(fp, "test_batch_prefill_with_paged_kv_cache_fp8_calibration_scale",
           [("pprefill", "fa2", "wrapper_f8 = flashinfer.", {"kv5": True, "scales": True})], names=kv8,
           vary=paged_axes, gates=[HD512_SM100])
    r.test(fp, "test_batch_prefill_with_ragged_kv_cache_fp8", [("ragged", "fa2", "wrapper_f8 = flashinfer.", {})],
           names=kv8, vary=dict(num_qo_heads=ALL, head_dim=ALL, causal=ALL, dtype=ALL), gates=[HD512_SM100])
    r.test(fp, "test_batch_decode_with_prefill_with_paged_kv_cache",
           [("pprefill", "fa2", "wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(", {"kv5": True}),
            ("pdecode", "fa2", "decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(", {"kv5": True})],
           names=kv8, vary=paged_axes)
    r.test("test_decode_fp8_calibration_scale.py", "test_batch_decode_with_paged_kv_cache_fp8_calibration_scale",
           [("pdecode", "auto", "k_scale=k_scale, v_scale=v_scale", {"kv5": True, "scales": True})], names=kv8,
           vary=dict(paged_axes, pos_encoding_mode=ALL))
    for file, fns, needle, missing, why in LACKS:
        for fn in fns:
            r.lacks(file, fn, needle, missing, why)
    for c in r.conflicts:
        print(f"flashinfer: {c[0]} runs what {c[1]} skips ({c[2]} on {c[3]}); the first one written is kept")
    return r.fx
