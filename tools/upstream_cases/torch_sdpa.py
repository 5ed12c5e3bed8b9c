"""PyTorch SDPA cases (issue 34): what test/test_transformers.py runs through one SDPA backend.

The pytorch/pytorch mirror is too large to fetch: the module reads a plain directory holding
test/test_transformers.py as it is at COMMIT (common.Source). A test picks its backend with
sdpa_kernel, the legacy sdp_kernel flags or a _fused_sdp_choice assertion; SDPBackend.X is one
kernel id per device kind (KERNELS). Where a test runs is read from its decorators: its class's
instantiate_device_type_tests call, onlyCUDA, skipIfRocm and each unittest.skipIf condition,
evaluated per hardware profile (`Upstream.env`). A skip on the backend's own platform gate
(PLATFORM_SUPPORTS_FLASH_ATTENTION for flash, ...) makes the test's accepted inputs rejects there.

The gates themselves live in torch/testing/_internal/common_cuda.py (read at 0012bc1b, the version
stored; it is not stored at COMMIT): flash on CUDA sm80+, mem-efficient on any CUDA, both on ROCm
gfx90a/942/950/1100/1201; cuDNN on CUDA sm80+. CPU-device tests are taken as run on a host whose
GPU passes them (they say nothing of the CPU). ROCm builds run the "cuda" device tests.

Left out: tests naming no backend (default dispatch), compile / export / vmap / XPU tests,
backward-only checks, the ROCm CK regression (CK has no kernel id), TestAttnBias (CausalBias picks
its own path) and direct calls of the private fused ops but the CUDA-graph test's flash skip.
Collapsed: one arch class (a10/l4/rtx4090, h100/h200, the AMD parts, the CPUs) gives one verdict, so
an input goes to one of its profiles in turn and a grid's rows are dealt round-robin; batch, scale
and training collapse; dtype, head dim, causal with seq_q vs seq_k, dropout, GQA, mask kind and
broadcast, and strides keep every value.
"""

import ast
import collections
import glob
import itertools
import json
import math
import os

from common import Fixture, Source, UpstreamChanged
from common import dtype as dt  # None for float64: no request carries it (LACKS)

REPO = "pytorch/pytorch"
COMMIT = "001f694aef6f922b4fdf6d27d59162d27bf3df58"
TEST = "test/test_transformers.py"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FA, EA, CU, MATH = "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"
K = "torch_sdpa.attention."
KERNELS = {"cuda": {FA: K + "flash", EA: K + "efficient", CU: K + "cudnn", MATH: K + "math"},
           "rocm": {FA: K + "flash_rocm", EA: K + "efficient_rocm", MATH: K + "math_rocm"},
           "cpu": {FA: K + "flash_cpu", MATH: K + "math_cpu"}}
GATE = {FA: "PLATFORM_SUPPORTS_FLASH_ATTENTION", EA: "PLATFORM_SUPPORTS_MEM_EFF_ATTENTION",
        CU: "PLATFORM_SUPPORTS_CUDNN_ATTENTION"}
AOTRITON_GFX = ("gfx90a", "gfx942", "gfx1100", "gfx1201", "gfx950")
FM, TT, SD, CPU, CUDA = "TestSDPAFailureModes", "TestTransformers", "TestSDPA", "TestSDPACpuOnly", "TestSDPACudaOnly"


def req(d, q, k=None, v=None, *, layout="BHSD", strides=None, mask=None, causal=False, dropout=0.0,
        scale=None, dtypes=None, devices=None):
    """The call as SDPA sees it: shapes (B, H, S, D) unless `layout` is BSHD; `mask` is
    (dtype, shape[, strides]); is_causal is top-left aligned."""
    k = k or q
    tensors = {}
    for n, shape in (("q", q), ("k", k), ("v", v or k)):
        t = tensors[n] = {"dtype": (dtypes or {}).get(n, d), "shape": list(shape)}
        t.update({"layout": layout} if len(shape) == 4 else {})
        t.update({"strides": strides[n]} if n in (strides or {}) else {})
        t.update({"device": devices[n]} if n in (devices or {}) else {})
    if mask:
        tensors["mask"] = {"dtype": mask[0], "shape": list(mask[1]), **({"strides": mask[2]} if len(mask) > 2 else {})}
    attrs = {"causal": True, "causal_alignment": "top_left"} if causal else {}
    attrs.update({"dropout_p": dropout} if dropout else {}, **({"scale": scale} if scale is not None else {}))
    return {"op": "attention", "tensors": tensors, **({"attrs": attrs} if attrs else {})}


def packed(B, S, H, D):
    """q/k/v as `qkv.chunk(3, -1)` of a (B, S, 3*H*D) tensor viewed (B, S, H, D)."""
    return {"layout": "BSHD", "strides": {n: [S * 3 * H * D, 3 * H * D, D, 1] for n in "qkv"}}


def strided(shape, how):
    """Strides of make_strided_sdpa_input(shape, how): a (B, H, S, D) view, last dim unit."""
    B, H, S, D = shape
    return {"padded": [H * S * (D + 8), S * (D + 8), D + 8, 1], "offset": [H * S * (D + 16), S * (D + 16), D + 16, 1],
            "sequence_sliced": [H * 2 * S * D, 2 * S * D, 2 * D, 1], "head_sliced": [2 * H * S * D, 2 * S * D, D, 1],
            "transposed": [S * D, B * S * D, D, 1], "batch_expanded": [0, S * D, D, 1]}[how]


class Upstream:
    """The test file at COMMIT, its gates evaluated per hardware profile, and the fixture."""

    def __init__(self, tree):
        self.src, self.fx = Source(tree, COMMIT, TEST), Fixture(library="torch_sdpa", repository=REPO, commit=COMMIT)
        self.profiles = {}
        for path in sorted(glob.glob(os.path.join(ROOT, "capabilities", "hardware", "*.json"))):
            prof = json.load(open(path))
            dev = prof["devices"][0]
            cc = dev.get("compute_capability")
            arch = tuple(int(x) for x in cc.split(".")) if dev["kind"] == "cuda" else dev.get("gfx")
            self.profiles[prof["name"]] = (dev["kind"], arch, dev.get("memory_bytes", 0))
        body = self.src.tree.body
        self.classes = {c.name: c for c in body if isinstance(c, ast.ClassDef)}
        self.module = {t.id: n.value for n in body if isinstance(n, ast.Assign)
                       for t in n.targets if isinstance(t, ast.Name)}
        kinds, self.devices = {"cpu": {"cpu"}, "cuda": {"cuda", "rocm"}, "xpu": set()}, {}
        for n in ast.walk(self.src.tree):
            if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "instantiate_device_type_tests":
                only = {kw.arg: kw.value for kw in n.keywords}["only_for"]  # the Name is ("cpu", "cuda", ...)
                self.devices[n.args[0].id] = set().union(*(kinds[x] for x in (
                    ["cpu", "cuda"] if isinstance(only, ast.Name) else [only.value])))
        # get_platform_specific_sdpa: `if <gate>: ret.append(SDPBackend.<backend>)` per backend
        self.specific = [(n.test.id, n.body[0].value.args[0].attr) for n in self.src.function(
            "get_platform_specific_sdpa").body if isinstance(n, ast.If) and isinstance(n.test, ast.Name)]
        self.envs = {hw: self.env(*p[:2]) for hw, p in self.profiles.items()}
        self.turn = collections.Counter()

    def env(self, kind, arch):
        cuda, rocm, host = kind == "cuda", kind == "rocm", kind == "cpu"
        sm = arch if cuda else (0, 0)
        fa = host or (cuda and sm >= (8, 0)) or (rocm and arch in AOTRITON_GFX)
        ea = host or cuda or (rocm and arch in AOTRITON_GFX)
        cu = host or (cuda and sm >= (8, 0))
        sm8x = cuda and sm in ((8, 6), (8, 7), (8, 9))
        e = {"TEST_WITH_ROCM": rocm, "SM80OrLater": not cuda or sm >= (8, 0), "PLATFORM_SUPPORTS_FLASH_ATTENTION": fa,
             "PLATFORM_SUPPORTS_MEM_EFF_ATTENTION": ea, "PLATFORM_SUPPORTS_CUDNN_ATTENTION": cu,
             "PLATFORM_SUPPORTS_FUSED_ATTENTION": fa or ea or cu, "PLATFORM_SUPPORTS_CK_SDPA": False,
             "IS_JETSON": False, "TEST_WITH_CROSSREF": False, "TEST_FAIRSEQ": False, "isSM8XDevice": sm8x,
             "isSM90Device": sm == (9, 0),
             "isSM120Device": sm[0] == 12, "isLessThanSM80Device": cuda and sm < (8, 0), "kind": kind, "sm": sm,
             "class": ("sm8x" if sm8x else "sm%d%d" % sm) if cuda else kind}
        e["PLATFORM_SPECIFIC_SDPA"] = [f"SDPBackend.{b}" for g, b in self.specific if e[g]] or [f"SDPBackend.{EA}"]
        return e

    def ev(self, node, env):
        """A decorator argument (skipIf condition, parametrize values) on one profile."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            vals = [self.ev(e, env) for e in node.elts]
            return vals if isinstance(node, ast.List) else tuple(vals)
        if isinstance(node, ast.Attribute):
            return ast.unparse(node)  # torch.float16, SDPBackend.MATH
        if isinstance(node, ast.Name) and (node.id in env or node.id in self.module):
            return env[node.id] if node.id in env else self.ev(self.module[node.id], env)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not self.ev(node.operand, env)
        if isinstance(node, ast.BoolOp):
            vals = [self.ev(v, env) for v in node.values]
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        if isinstance(node, ast.IfExp):
            return self.ev(node.body if self.ev(node.test, env) else node.orelse, env)
        text = ast.unparse(node)
        if "not in os.environ" in text or text.startswith("sys.version_info <"):
            return "not in os.environ" in text  # opt-in variables unset; Python >= 3.11
        raise UpstreamChanged(f"{TEST}: cannot evaluate {text}")

    def method(self, cls, name):
        for n in self.classes[cls].body:
            if isinstance(n, ast.FunctionDef) and n.name == name:
                return n
        raise UpstreamChanged(f"{TEST}: no {cls}.{name}")

    def cite(self, cls, name, needle):
        """`path:line` of `needle` inside test `name`, decorators included; a tuple of needles
        finds each after the one before."""
        fn = self.method(cls, name)
        line = min([fn.lineno] + [d.lineno for d in fn.decorator_list]) - 1
        for n in needle if isinstance(needle, tuple) else (needle,):
            line = self.src.line_of(n, line)
        if line > fn.end_lineno:
            raise UpstreamChanged(f"{TEST}: {needle!r} is not in {cls}.{name}")
        return f"{TEST}:{line}"

    def grid(self, cls, name, hw="a100"):
        """{argument: values} of the test's parametrize decorators on profile `hw`."""
        return {d.args[0].value: self.ev(d.args[1], self.envs[hw]) for d in self.method(cls, name).decorator_list
                if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "parametrize"}

    def runs(self, cls, name, hw):
        """(whether the test runs on `hw`, the skipIf decorator that stops it)."""
        kind = self.profiles[hw][0]
        if kind not in self.devices[cls]:
            return False, None
        for d in self.method(cls, name).decorator_list:
            f = ast.unparse(d.func if isinstance(d, ast.Call) else d)
            if (f == "onlyCUDA" and kind == "cpu") or (f == "skipIfRocm" and kind == "rocm") or f == "unittest.skip":
                return False, None
            if f == "unittest.skipIf" and self.ev(d.args[0], self.envs[hw]):
                return False, d
        return True, None

    def case(self, cls, name, backend, hw, expect, request, needle, why="", src=None, /, **params):
        kernel = KERNELS[self.profiles[hw][0]].get(str(backend).removeprefix("SDPBackend."))
        if kernel:
            inner = ",".join(f"{k}={v}" for k, v in params.items())
            self.fx.case(name=f"{TEST}::{cls}::{name}" + (f"[{inner}]" if inner else ""), kernel=kernel, hardware=hw,
                         source=src or self.cite(cls, name, needle), expect=expect, request=request,
                         why=why or ("the test runs this input" if expect == "accept" else "the test expects a raise"))

    def each(self, cls, name, backends, expect, request, needle, why="", where=None, gates=None, every=False, src=None,
             **params):
        """One input through `backends` (names, or the parametrize argument holding them) on one
        profile of each arch class in turn (`every`: on all). Off a backend's platform gate (a
        skipIf naming it, or an in-body skipTest quoted in `gates`) an accepted input is a reject."""
        classes = collections.defaultdict(list)
        for hw, env in self.envs.items():
            if not where or where(hw, env):
                classes[env["class"]].append(hw)
        for c, hws in classes.items():
            self.turn[c] += not every
            for hw in hws if every else [hws[self.turn[c] % len(hws)]]:
                env, (ok, skip) = self.envs[hw], self.runs(cls, name, hw)
                for b in (str(x).removeprefix("SDPBackend.") for x in (
                        backends if isinstance(backends, list) else self.grid(cls, name, hw)[backends])):
                    off = b in GATE and not env[GATE[b]] and env["kind"] != "cpu"
                    skip_ok = skip is not None and GATE.get(b, "?") in ast.unparse(skip.args[0])
                    if ok and not (off and b in (gates or {})):
                        self.case(cls, name, b, hw, expect, request, needle, why, src, **params)
                    elif expect == "accept" and off and (skip_ok or (ok and b in (gates or {}))):
                        at = f"{TEST}:{skip.lineno}" if skip_ok else self.cite(cls, name, gates[b])
                        self.case(cls, name, b, hw, "reject", request, None, f"skipped: {GATE[b]} is false on {hw}", at,
                                  **params)

    def sweep(self, cls, name, rows, where=None):
        """A grid test: the profiles with one grid share its rows round-robin. `rows(grid)` yields
        (backend, expect, request, needle, why, params)."""
        groups = {}
        for hw, env in self.envs.items():
            if self.runs(cls, name, hw)[0] and (not where or where(hw, env)):
                g = self.grid(cls, name, hw)
                groups.setdefault(repr((env["kind"], g)), (g, []))[1].append(hw)
        for g, hws in groups.values():
            for i, (b, expect, request, needle, why, params) in enumerate(rows(g)):
                self.case(cls, name, b, hws[i % len(hws)], expect, request, needle, why, **params)


def _verdicts(up, cls):
    """acc(name, backends, request, needle, why, **kw) / rej(...): `up.each` for one test class."""
    return (lambda name, b, r, needle, why="", **kw: up.each(cls, name, b, "accept", r, needle, why, **kw),
            lambda name, b, r, needle, why="", **kw: up.each(cls, name, b, "reject", r, needle, why, **kw))


def _failure_modes(up):
    acc, rej = _verdicts(up, FM)
    sm80 = lambda hw, e: e["SM80OrLater"]  # noqa: E731 (bf16 inputs of tests with no SM80 gate)
    rej("test_attn_mask_and_is_causal_errors_before_dispatch", "backend",
        req("f32", (2, 4, 8, 16), mask=("f32", (8, 8)), causal=True), "attn_mask=attn_mask, is_causal=True)",
        "attn_mask with is_causal raises before any backend is tried")
    rej("test_invalid_fused_inputs_broadcast", "kernel", req("f16", (1, 4, 3, 8), (2, 4, 3, 8)),
        "size_broadcast = (1, 4, 3, 8)", "fused kernels take no batch broadcast of dense inputs")
    rej("test_invalid_last_dim_stride", "kernel", req("f16", (2, 2, 8, 8), strides={"q": [2, 2, 2, 2]}),
        "q.as_strided_(size, [2, 2, 2, 2])", "q.stride(-1) == 2: fused kernels need stride(-1) == 1")
    rej("test_mask_invalid_last_dim_stride", "kernel",
        req("f16", (2, 2, 8, 8), mask=("f16", (2, 2, 8, 8), [2, 2, 2, 2])), "attn_mask.as_strided_(size, [2, 2, 2, 2])",
        "attn_mask.stride(-1) == 2: GPU backends need it unit-stride")
    hd, rocm, cuda = "test_invalid_fused_inputs_head_dim", (lambda hw, e: e["kind"] == "rocm"), \
        (lambda hw, e: e["kind"] == "cuda")
    rej(hd, "kernel", req("f16", (2, 2, 3, 513)), "SdpaShape(2, 2, 3, 513)", "head_dim 513 > 512", where=rocm)
    rej(hd, [EA], req("f16", (2, 2, 3, 9)), "SdpaShape(2, 2, 3, 9) if", "head_dim 9: no multiple of 8", where=cuda)
    rej(hd, [FA, CU], req("f16", (2, 2, 3, 257)), "else SdpaShape(2, 2, 3, 257)", "head_dim 257", where=cuda)
    rej("test_invalid_fused_inputs_attn_mask_present", "kernel", req("f16", (2, 2, 3, 16), mask=("f16", (2, 2, 3, 3))),
        "mask = torch.ones((2, 2, 3, 3)", "flash takes no attn_mask")
    rej("test_unaligned_tensors", [EA], req("f16", (2, 2, 8, 5)), "size = SdpaShape(2, 2, 8, 5)",
        "head_dim 5: no multiple of 8 (f16)")
    rej("test_flash_fail_fp32", [FA], req("f32", (16, 16, 32, 32)), "{Half, BFloat16}", "flash takes f16/bf16")
    for d, t in (("f16", "float16"), ("bf16", "bfloat16")):
        acc(f"test_flash_autocast_fp32_{t}", [FA], req(d, (16, 16, 32, 32)), f"dtype=torch.{t}):",
            f"autocast hands flash {d} inputs")
    kv16 = {"k": "f16", "v": "f16"}
    rej("test_invalid_inputs_different_datatypes", "kernel", req("f32", (1, 4, 8, 16), dtypes=kv16),
        "key = torch.randn(shape, dtype=torch.float16, device=device)", "q f32 with k/v f16")
    rej("test_invalid_inputs_different_devices", "kernel",
        req("f32", (1, 4, 8, 16), dtypes=kv16, devices={"k": "cpu", "v": "cpu"}), "device='cpu')",
        "k/v on the CPU: validate_sdpa_input raises before dispatch, whatever the backend")
    rej("test_invalid_inputs_1_dimensional_inputs", "kernel", req("f16", (4,), (1, 4)),
        "query = torch.randn(4, dtype=torch.float16", "a 1-D query")
    rej("test_mem_efficient_fail_bfloat16_less_than_sm80", [EA], req("bf16", (16, 16, 32, 32)), "{Half, Float}",
        "below sm80 efficient takes f16/f32")
    acc("test_flash_atteention_large_bf16_nan_values", [FA], req("bf16", (1, 1, 1, 64)), "torch.full((1, 1, 1, 64)")
    rej("test_flash_attention_fail_with_non_square_causal_attention", [FA],
        req("bf16", (1, 1, 8, 16), (1, 1, 12, 16), causal=True), "kv_shape = SdpaShape(1, 1, 12, 16)",
        "is_causal with seqlen_q != seqlen_k")
    acc("test_mem_eff_attention_fail_with_batch_size_geq_65536", [EA], req("f16", (65536, 2, 2, 8)),
        "query = torch.rand([batch_size, 2, 2, 8]")
    acc("test_mem_eff_attention_large_seq_len_uniform_attention", [EA],
        req("bf16", (1, 2, 49999, 16), mask=("bool", (49999, 49999))), "mask = torch.ones((num_queries,", where=sm80)
    big = "test_mem_eff_attention_large_seq_len_attn_mask_index_overflow"
    acc(big, [EA], req("bf16", (1, 1, 66000, 16), causal=True), "query, key, value, is_causal=True", where=sm80)
    acc(big, [EA], req("bf16", (1, 1, 66000, 16), mask=("bf16", (66000, 66000))),
        "query, key, value, attn_mask=attn_mask", where=sm80)


def _generic(up):
    """TestTransformers, TestSDPA and TestSDPACpuOnly."""
    up.cite(TT, "test_scaled_dot_product_attention", "@sdpa_kernel(backends=[SDPBackend.MATH])")
    plain = ("Explicit attn_mask", "else:", "value, attn_mask, dropout_p, is_causal)")  # the call without is_causal

    def sdp(g):
        for (dim, mdim, causal), p in itertools.product(g["input_dim,attn_mask_dim,is_causal"], g["dropout_p"]):
            if dim == 4:  # 3-D inputs: in LACKS
                N, ps = g["batch_size"][-1], dict(mask=mdim, causal=causal, dropout_p=p)
                mask = mdim and ("bool", (4, 3) if mdim == 2 else (N, 2, 4, 3))
                r = req("f32", (N, 2, 4, 6), (N, 2, 3, 6), mask=None if causal else mask, causal=causal, dropout=p)
                yield MATH, "accept", r, "value, None, dropout_p, is_causal)" if causal else plain, "", ps
                if causal:
                    r = req("f32", (N, 2, 4, 6), (N, 2, 3, 6), mask=mask, causal=True, dropout=p)
                    yield MATH, "reject", r, '"Explicit attn_mask should', "attn_mask with is_causal raises", ps
    up.sweep(TT, "test_scaled_dot_product_attention", sdp)
    acc = _verdicts(up, TT)[0]
    acc("test_math_backend_high_precision", [MATH], req("bf16", (1, 128, 2, 80), layout="BSHD"), "rand([1, 128, 2")
    # is_causal_kernels: MultiheadAttention(E, 1) on (1, 2, E) with batch_first=False, is_causal and no
    # key padding mask hands SDPA q (2, 1, 1, E) with is_causal and the mask dropped.
    mha, gpu = "MultiheadAttention(E, 1) on (1, 2, E): SDPA gets (2, 1, 1, E), is_causal", \
        (lambda hw, e: e["kind"] != "cpu")
    ok = req("f32", (2, 1, 1, 4), causal=True)
    acc("test_train_with_is_causal", [MATH], ok, "self.is_causal_kernels([SDPBackend.MATH], device)", mha)
    acc("test_is_causal_gpu", [MATH, EA], ok, "self.is_causal_kernels([SDPBackend.MATH,", mha, where=gpu)
    up.each(TT, "test_is_causal_gpu", [EA], "reject", req("f32", (2, 1, 1, 2), causal=True), None,
            mha + "; E=2: head_dim 2 is no multiple of 4 (f32)", where=gpu,
            src=up.cite(TT, "is_causal_kernels", 'with self.assertRaisesRegex(RuntimeError, "No available kernel"):'))
    # CPU. rand_sdpa_tensor(dense) is (batch, seq, heads, dim), which SDPA reads as (B, H, S, D).
    acc, rej = _verdicts(up, CPU)
    n, g = "test_fused_sdp_choice_cpu", up.grid(CPU, "test_fused_sdp_choice_cpu", "icx")
    for d, p in itertools.product(g["dtype"], g["dropout"]):
        if dt(d) and p:
            r = req(dt(d), (2, 128, 8, 64), dropout=p)
            acc(n, [MATH], r, "!= SDPBackend.MATH.value", "dropout: MATH is chosen", every=True, dtype=d, dropout=p)
            rej(n, [FA], r, "!= SDPBackend.MATH.value", "flash_cpu takes no dropout", every=True, dtype=d, dropout=p)
        elif dt(d):
            acc(n, [FA], req(dt(d), (2, 128, 8, 64)), "!= SDPBackend.FLASH_ATTENTION", every=True, dtype=d, dropout=p)
    fused, ref = "q, k, v, attn_mask=attn_mask, dropout_p=0.0, ", "q2, k2, v2, attn_mask=attn_mask, dropout_p=0.0, "

    def masks(g):
        B, H, D = g["batch_size"][0], g["n_head"][-1], g["head_dim"][0]
        modes = ("none", "causal", "bool", "float")
        for d, sq, sk, mode in itertools.product(g["dtype"], g["q_seq_len"], g["kv_seq_len"], modes):
            if dt(d):
                m = {"bool": ("bool", (B, H, sq, sk)), "float": (dt(d), (B, H, sq, sk))}.get(mode)
                r = req(dt(d), (B, sq, H, D), (B, sk, H, D), layout="BSHD", mask=m, causal=mode == "causal")
                for b, n in ((FA, fused), (MATH, ref)):
                    yield b, "accept", r, n + "is_causal=casual)", "", dict(dtype=d, q=sq, kv=sk, mask=mode)
        sq, sk = g["q_seq_len"][0], g["kv_seq_len"][0]  # every broadcast shape the test loops over
        shapes = [*itertools.product([sq, 1], [sk, 1]), *itertools.product([B, 1], [H, 1], [sq, 1], [sk, 1])]
        for shape, m in itertools.product(shapes, ("bool", "f32")):
            r = req("f32", (B, sq, H, D), (B, sk, H, D), layout="BSHD", mask=(m, shape))
            yield FA, "accept", r, fused + "is_causal=casual)", "", dict(mask=m, mask_shape=list(shape))
    up.sweep(CPU, "test_scaled_dot_product_fused_attention_mask_vs_math_cpu", masks)
    acc("test_mqa_singleton_head_broadcast", [FA, MATH], req("f32", (2, 8, 16, 32), (2, 1, 32, 32)),
        "key = torch.randn(2, 1, 32, 32", "one kv head broadcast over 8: MQA")
    gqa = "test_scaled_dot_product_fused_attention_gqa_vs_math_cpu"
    up.cite(CPU, gqa, "batch_size, q_seq_len, kv_seq_len, head_dim = 12, 17, 100, 8")

    def gqa_rows(g):
        for d, (hq, hkv) in itertools.product(g["dtype"], g["n_heads"]):
            r = dt(d) and req(dt(d), (12, 17, hq, 8), (12, 100, hkv, 8), layout="BSHD", mask=(dt(d), (12, hq, 17, 100)))
            for b, n in ((FA, fused), (MATH, ref)) if r else ():
                yield b, "accept", r, n + "enable_gqa=True)", "", dict(dtype=d, n_heads=[hq, hkv])
    up.sweep(CPU, gqa, gqa_rows)
    acc("test_sdpa_with_inf", [FA, MATH], req("f32", (1, 2, 600, 8), mask=("f32", (600, 600))),
        "input_shape = SdpaShape(1, 600, 2, 8)", "rand_sdpa_tensor gives (1, 2, 600, 8): H=2, S=600")
    acc("test_sdpa_backward_with_gradient", [FA, MATH], req("f32", (2, 2, 49, 32)), "size=[2, 2, 49, 32]")
    up.sweep(CPU, "test_fully_masked_out_rows", lambda g: (
        (b, "accept", req(dt(d), (1, 1, s, hd), mask=("bool", (1, 1, s, s))), "masked_out = scaled_dot_product_att",
         "", dict(backend=b, seq_len=s, head_dim=hd, dtype=d))
        for b, s, hd, d in itertools.product(g["backend"] + [MATH], g["seq_len"], g["head_dim"], g["dtype"])))
    for d in up.grid(CPU, "test_cpu_flash_attn_nan_propagation", "icx")["dtype"]:
        acc("test_cpu_flash_attn_nan_propagation", [FA], req(dt(d), (1, 1, 16, 16)),
            "key = torch.randn(1, 1, 16, 16, dtype=dtype)", every=True, dtype=d)


def _cuda(up):
    """TestSDPACudaOnly (CUDA and ROCm builds)."""
    acc, rej = _verdicts(up, CUDA)
    sm80, new = (lambda hw, e: e["SM80OrLater"]), (lambda hw, e: e["sm"] in ((9, 0), (10, 0)))
    old = lambda hw, e: e["kind"] == "cuda" and e["sm"] < (9, 0)  # noqa: E731 (off cuDNN's d192/d256 surface)
    c = "with sdpa_kernel(backends=[SDPBackend.{}]):".format
    acc("test_cudnn_attention_different_dk_dv", [CU], req("bf16", (32, 16, 640, 128), v=(32, 16, 640, 64)), c(CU))
    for b in (EA, MATH):
        acc("test_mqa_singleton_head_broadcast", [b], req("f32", (2, 8, 16, 32), (2, 1, 32, 32)), c(b), "MQA")
    acc("test_mqa_singleton_head_broadcast_native_cuda", "fused_kernel", req("f16", (2, 8, 16, 32), (2, 1, 32, 32)),
        "actual = scaled_dot_product_attention(query, key, value)", "MQA",
        gates={FA: 'self.skipTest("Flash attention is not', CU: 'self.skipTest("cuDNN attention is not'})

    def gqa(g):
        cols = "num_query_heads,num_kv_heads,is_causal,use_attn_mask,q_layout,k_layout,v_layout"
        for d, (hq, hkv, causal, use, ql, kl, vl) in itertools.product(g["dtype"], g[cols]):
            q, k, v = (2, hq, 16, 32), (2, hkv, 32, 32), (2, hkv, 32, 16)
            st = {"q": strided(q, ql), "k": strided(k, kl), "v": strided(v, vl)}
            r = req(dt(d), q, k, v, causal=causal, strides=st, mask=use and (dt(d), q, strided(q, "offset")))
            for b in (EA, MATH):
                yield b, "accept", r, c(b), "GQA, strided views", dict(dtype=d, heads=[hq, hkv], layouts=[ql, kl, vl])
    up.sweep(CUDA, "test_mem_efficient_attention_gqa", gqa)
    n, q, k, v, m = "test_mem_efficient_attention_gqa_dropout", (2, 6, 17, 32), (2, 2, 33, 32), (2, 2, 33, 24), \
        (2, 6, 17, 33)
    st = {"q": strided(q, "sequence_sliced"), "k": strided(k, "offset"), "v": strided(v, "transposed")}
    acc(n, [EA], req("f32", q, k, v, dropout=0.2, scale=0.37, mask=("f32", m, strided(m, "padded")), strides=st),
        "actual = scaled_dot_product_attention(", "GQA 6 over 2, dropout, strided views")
    acc(n, [EA], req("f32", q, (2, 6, 33, 32), (2, 6, 33, 24), mask=("f32", m), dropout=0.2, scale=0.37),
        "expected = scaled_dot_product_attention(", "the same with K/V repeated")
    acc("test_mem_efficient_attention_gqa_split_key", [MATH],
        req("f32", (1, 6, 17, 64), (1, 2, 4096, 64), (1, 2, 4096, 40)), "query, key, value, enable_gqa=True")
    rej("test_cudnn_attention_d256_heuristic", [CU], req("bf16", (32, 16, 640, 256), v=(32, 16, 640, 64)),
        "No available kernel.", "d_qk 256 below sm90: 'No available kernel'", where=old)
    # On sm90/sm10x these run or raise by the cuDNN version the build links, which no hardware
    # profile or request names: listed with that field rather than guessed.
    for name, needle, why in (
            ("test_cudnn_attention_dense_d256_sm90_sm10x", 'self.skipTest("head_dim=256 cuDNN attention requires',
             "head_dim 256 in bf16 on sm90/sm10x runs with a cuDNN frontend that supports it, the test skips otherwise"),
            ("test_cudnn_attention_d192_heuristic", "if _cudnn_supports_d192_attention():",
             "(192, 128) in bf16 on sm90/sm10x runs with cuDNN >= 9.11 and raises 'No available kernel' below")):
        up.fx.lacks(name=f"{TEST}::{CUDA}::{name}", source=up.cite(CUDA, name, needle), missing="cudnn_version",
                    why=why)
    d192 = req("bf16", (32, 16, 640, 192), v=(32, 16, 640, 128))
    rej("test_cudnn_attention_d192_heuristic", [CU], d192, ("else:", "No available kernel."),
        "(192, 128) below sm90: 'No available kernel'", where=old)
    for shape in up.grid(CUDA, "test_cudnn_attention_fail_large_batch_or_num_heads")["shape"]:
        rej("test_cudnn_attention_fail_large_batch_or_num_heads", [CU], req("f16", shape), "No available kernel.",
            "cuDNN takes batch and heads below 65536", shape=list(shape))
    acc("test_cudnn_attention_trivial_output_transpose", [CU], req("f16", (2, 4, 1, 64), layout="BSHD"), "(x2, x2, x2)")
    acc("test_cudnn_attention_nonmodulo64seqlen", [CU],
        req("f16", (2, 32, 157, 128), (2, 32, 6404, 128), mask=("bool", (2, 1, 157, 6404))), "attn_mask=mask,")
    for order in itertools.permutations(range(3)):  # randn(permuted shape).permute(inverse order)
        order, st = list(order) + [3], {}
        for t, shape in (("q", (4, 16, 256, 64)), ("k", (4, 16, 512, 64)), ("v", (4, 16, 512, 64))):
            phys = [shape[i] for i in order]
            st[t] = [math.prod(phys[order.index(dim) + 1:]) for dim in range(4)]
        acc("test_cudnn_attention_preserves_query_layout", [CU], req("bf16", (4, 16, 256, 64), (4, 16, 512, 64),
            strides=st), "return F.scaled_dot_product_attention(q, k, v)", "eager (use_compile=False)", order=order)
    zero = {"q": [0, 0, 128, 1], "k": [0, 0, 128, 1], "v": [0, 0, 64, 1]}
    for d in up.grid(CUDA, "test_cudnn_attention_broadcast_stride_zero")["dtype"]:
        acc("test_cudnn_attention_broadcast_stride_zero", [CU], req(dt(d), (8, 2, 64, 128), (8, 2, 16, 128),
            (8, 2, 16, 64), causal=True, strides=zero), "(q_bc, k_bc, v_bc,", dtype=d)
    acc("test_cudnn_attention_seqlen1_dropout_heuristic", [FA], req("f16", (2, 8, 1, 128), dropout=0.5),
        "dropout_p=0.5)", "CUDNN and FLASH enabled; cuDNN takes no dropout with seq_q 1, so flash runs it")
    acc("test_cudnn_attention_broken_166211", [CU], req("bf16", (20, 4, 4, 32)), "shape = (20, 4, 4, 32)")
    for b in (CU, MATH):
        acc("test_cudnn_attention_mask_broken_177842", [b], req("bf16", (1, 10, 8, 8), (1, 10, 1, 8), layout="BSHD",
            mask=("bool", (10, 10))), f"with sdpa_kernel(SDPBackend.{b}):", "MQA with a bool mask")
    g = up.grid(CUDA, "test_cudnn_attention_attn_mask_dtype")
    for d, md in itertools.product(g["dtype"], g["mask_dtype"]):
        acc("test_cudnn_attention_attn_mask_dtype", [CU], req(dt(d), (2, 8, 128, 64), mask=(dt(md or d),
            (2, 1, 128, 128))), "attn_mask=m)", dtype=d, mask_dtype=md)
    for dim in up.grid(CUDA, "test_mem_efficient_attention_mask_variants")["mask_dim"]:
        shape = {2: (64, 15), 3: (8, 64, 15), 4: (8, 8, 64, 15)}.get(dim)  # 1: a rank-1 mask, in LACKS
        if shape:
            acc("test_mem_efficient_attention_mask_variants", [EA], req("f16", (8, 8, 64, 64), (8, 8, 15, 64),
                mask=("f16", shape)), f"elif mask_dim == {dim}:", mask_dim=dim)
    for b, n in ((EA, "actual_mask)"), (MATH, "expected_mask)")):
        acc("test_mem_eff_attention_mask_only_requires_grad", [b],
            req("f32", (1, 1, 64, 16), mask=("f32", (1, 1, 64, 64))), n)
    for d in up.grid(CUDA, "test_mem_eff_attention_non_contiguous_mask")["dtype"]:
        acc("test_mem_eff_attention_non_contiguous_mask", [EA], req(dt(d), (8, 8, 64, 64), (8, 8, 16, 64),
            mask=(dt(d), (8, 8, 64, 16), [0, 0, 0, 1])), "(0, 0, 0, 1))", dtype=d)
        acc("test_mem_eff_attention_long_sequence_mask", [EA], req(dt(d), (1, 32, 8192, 64),
            mask=(dt(d), (1, 32, 8192, 8192))), "= 8192, 8192", "on 80 GiB devices (it returns early below)",
            dtype=d, where=lambda hw, e: up.profiles[hw][2] >= 80 * 2**30)
    st = {"q": [2304, 128, 2048, 1], "k": [3584, 0, 256, 1], "v": [3584, 0, 256, 1]}
    acc("test_mem_eff_attention_non_contig_mask_bug", [EA], req("f32", (3, 16, 1, 128), (3, 16, 14, 128), strides=st,
        mask=("f32", (3, 1, 1, 14), [14, 14, 14, 1])), "(query, key, value, bias)")
    tail = lambda H: {"q": [289 * H * 512, 512, H * 512, 1], "k": [0, 0, 512, 1], "v": [0, 0, 512, 1]}  # noqa: E731
    acc("test_mem_eff_attention_single_query_tail_mask", [EA], req("bf16", (1, 16, 289, 512), strides=tail(16),
        scale=1.0, mask=("bool", (1, 1, 289, 289))), "actual = F.scaled_dot_product_attention(query, key, value, mask,",
        where=sm80)
    for kv, H, causal in up.grid(CUDA, "test_mem_eff_attention_single_query_tail")["kv_len,num_heads,is_causal"]:
        acc("test_mem_eff_attention_single_query_tail", [EA], req("bf16", (1, H, 289, 512), (1, H, kv, 512),
            strides=tail(H), causal=causal, scale=1.0), "actual = F.scaled_dot_product_attention(query, key, value, is",
            kv_len=kv, heads=H)
    drop = "(query, key, value, dropout_p=0.5, scale=1.0)"
    acc("test_mem_eff_attention_dropout_rng_offset_no_wraparound", [EA],
        req("bf16", (1, 2, 65536, 64), dropout=0.5, scale=1.0), drop)
    acc("test_mem_eff_attention_dropout_single_query_tail", [EA], req("bf16", (1, 32, 65, 64), (1, 32, 1, 64),
        dropout=0.5, scale=1.0, strides={"k": [0, 0, 64, 1], "v": [0, 0, 64, 1]}), drop)
    acc("test_mem_eff_attention_save_on_cpu_unaligned_bias_stride", [EA], req("f16", (1, 8, 1, 64), (1, 8, 361, 64),
        mask=("f16", (1, 1, 1, 361))), "ref_out = F.scaled_dot_product_attention(")
    acc("test_singelton_head_dim_stride_ne_1", [FA],
        req("f16", (1, 1, 2, 1), (1, 1, 1, 1), strides={"q": [2, 2, 1, 2]}), "enable_flash=True",
        "the legacy sdp_kernel flags enable flash alone; head_dim 1")
    for cont in (True, False):
        acc("test_scaled_dot_product_attention_fused_kernels_packed", [EA], req("f16", (32, 16, 64, 64)) if cont else
            req("f16", (32, 64, 16, 64), **packed(32, 64, 16, 64)), c(EA), is_contiguous=cont)
    acc("test_scaled_dot_product_attention_fused_kernels_packed_accuracy", "fused_kernel",
        req("f16", (16, 8, 4, 64), **packed(16, 8, 4, 64)), "query_lp, key_lp, value_lp, attn_mask=None")
    for n, b, dts in (("test_sdp_mem_efficient_grad_against_math", EA, ["f32"]),
                      ("test_sdp_flash_attention_grad_against_math", FA, ["f16", "bf16"])):
        for d, cont, causal in itertools.product(dts, (True, False), (True, False)):
            r = req(d, (4, 2, 4, 16), causal=causal) if cont else \
                req(d, (4, 4, 2, 16), causal=causal, **packed(4, 4, 2, 16))
            acc(n, [b], r, "value_lp, None, 0.0, is_causal)", dtype=d, contiguous_inputs=cont, is_causal=causal)
    n, pick, p = "test_fused_sdp_choice", "SDPBackend.{}.value)".format, packed(2, 128, 8, 64)
    r16, r32 = req("f16", (2, 128, 8, 64), **p), req("f32", (2, 128, 8, 64), **p)
    acc(n, [CU], r16, pick(CU), "chosen on sm90/sm10x with cuDNN > 9.15", where=new)
    acc(n, [FA], r16, ("elif PLATFORM_SUPPORTS_FLASH", pick(FA)), "chosen unless cuDNN is preferred",
        where=lambda hw, e: e[GATE[FA]])
    acc(n, [EA], r16, ("we're on Windows", c(CU), pick(EA)), "chosen with neither flash nor cuDNN",
        where=lambda hw, e: not e[GATE[FA]])
    acc(n, [EA], r32, "!= SDPBackend.EFFICIENT_ATTENTION.value:", "f32: efficient is chosen")
    acc("test_sdp_choice_with_determinism", [EA], req("f32", (1, 64, 8, 64)), "!= SDPBackend.EFFICIENT_ATTENTION",
        "deterministic algorithms on; rand_sdpa_tensor gives (1, 64, 8, 64)")
    acc("test_fused_sdp_priority_order", [CU, MATH, EA, FA], req("f16", (64, 8, 1024, 64)), "with sdpa_kernel(order, s",
        "eager (use_compile=False): each order's first backend runs it")
    acc("test_fused_backwards_throws_determinism_warning", "fused_kernel", req("f16", (1, 64, 8, 64)),
        "with sdpa_kernel(backends=[fused_kernel]):", "the forward runs (the determinism check is on backward)")


def _grids(up):
    """The forward-vs-math grids of TestSDPACudaOnly: row i takes the i-th (seq_q, seq_k) pair in turn."""
    def eff(g, masked):
        pairs = list(itertools.product(g["seq_len_q"], g["seq_len_k"]))
        axes = itertools.product(g["dtype"], g["head_dim"], g["is_causal"], g["dropout_p"])
        for i, (d, hd, causal, p) in enumerate(axes):
            (sq, sk), sc = pairs[i % len(pairs)], g["scale"][i % 2]
            r = req(dt(d), (1, 4, sq, hd), (1, 4, sk, hd), mask=masked and (dt(d), (sq, sk)), causal=causal, dropout=p,
                    scale=sc and 1 / hd)
            yield EA, "accept", r, "out = F.scaled_dot_product_attention(query, key, value", "", \
                dict(dtype=d, seq_q=sq, seq_k=sk, head_dim=hd, is_causal=causal, dropout_p=p, scale=sc)
    up.sweep(CUDA, "test_mem_efficient_attention_vs_math_ref_grads", lambda g: eff(g, False))
    up.sweep(CUDA, "test_mem_efficient_attention_attn_mask_vs_math_ref_grads", lambda g: eff(g, True))
    skip = 'self.skipTest("Flash V2 does not accept is_casual'
    why = "is_causal with seq_q != seq_k: the test skips it for flash"

    def flash(g):
        pairs = list(itertools.product(g["seq_len_q"], g["seq_len_k"]))
        equal, unequal = [p for p in pairs if p[0] == p[1]], [p for p in pairs if p[0] != p[1]]
        heads = [(4, 4)] + [tuple(h) for h in g["n_heads"]]  # enable_gqa=False keeps 4 heads each
        drops = [x for x in g["dropout_p"] if x in (0.0, 0.22)]  # 0.48 repeats 0.22's verdict
        for i, (d, hd, (hq, hkv), causal, p) in enumerate(itertools.product(
                g["dtype"], g["head_dim"], heads, g["is_causal"], drops)):
            runs = [(pairs[i % len(pairs)], "accept")]
            if causal:  # a square pair runs, a non-square one is skipped
                runs = [(equal[i % 2], "accept"), (unequal[i % len(unequal)], "reject")]
            for (sq, sk), expect in runs:
                r = req(dt(d), (1, hq, sq, hd), (1, hkv, sk, hd), causal=causal, dropout=p,
                        scale=g["scale"][i % 2] and 1 / hd)
                note = "dropout: the test calls the flash op on inputs padded to 8" if p else ""
                yield FA, expect, r, "scale=scale, enable_gqa=enable_gqa)" if expect == "accept" else skip, \
                    why if expect == "reject" else note, \
                    dict(dtype=d, seq_q=sq, seq_k=sk, head_dim=hd, heads=[hq, hkv], is_causal=causal, dropout_p=p)
    # It skips itself on sm86/89 for every head dim (`isSM8XDevice or ...`): no verdict there.
    up.sweep(CUDA, "test_flash_attention_vs_math_ref_grads", flash, where=lambda hw, e: not e["isSM8XDevice"])

    def graph(g):
        rows = itertools.product(g["fused_kernel"], g["seq_len_q"], g["seq_len_k"], g["is_causal"], g["dropout_p"])
        # cuDNN with dropout is left out: the op is called directly, past selection's dropout check.
        for i, (b, sq, sk, causal, p) in enumerate(r for r in rows if not (r[0].endswith(CU) and r[4])):
            bad, hd = b.endswith(FA) and causal and sq != sk, g["head_dim"][i % 2]
            r = req("f16", (1, 4, sq, hd), (1, 4, sk, hd), causal=causal, dropout=p)
            ps = dict(kernel=b, seq_q=sq, seq_k=sk, head_dim=hd, is_causal=causal, dropout_p=p)
            if bad:
                yield b, "reject", r, skip, why, ps
            else:
                yield b, "accept", r, "output_tuple = fused_op(query, key, value, **kwargs)", "the fused op runs it", ps
    up.sweep(CUDA, "test_fused_attention_vs_math_ref_grads_cudagraph", graph)


NESTED, F64 = "nested tensors (ragged sequences per batch)", "dtype f64 (torch.float64)"
RANK3 = "rank-3 q/k/v (no heads dim)"
GQA_FLAG = "enable_gqa=False with q heads != kv heads (unequal heads in a request mean GQA)"
LACKS = {  # missing field -> tests, as "Class.test"
    NESTED: "FM.test_fused_kernels_nested_broadcasting_error_cases FM.test_nested_fails_on_padding_head_dim "
            "FM.test_fused_kernels_seq_len_0_inputs FM.test_fused_kernels_nested_broadcasting_requires_grad_failure "
            "CPU.test_fused_sdp_choice_cpu CUDA.test_scaled_dot_product_attention_fused_kernels_packed "
            "CUDA.test_scaled_dot_product_attention_cudnn_nested CUDA.test_fused_sdp_choice "
            "CUDA.test_scaled_dot_product_attention_fused_kernels_packed_accuracy "
            "CUDA.test_fused_kernels_seq_len_1_inputs "
            "CUDA.test_fused_kernels_nested_broadcasting CUDA.test_fused_kernels_nested_broadcasting_query_dense "
            "CUDA.test_flash_attention_vs_math_ref_grads_nestedtensor",
    F64: "TT.test_scaled_dot_product_attention TT.test_math_backend_high_precision SD.test_sdp_math_gradcheck "
         "FM.test_invalid_fused_inputs_invalid_dtype CPU.test_fused_sdp_choice_cpu "
         "CPU.test_scaled_dot_product_fused_attention_mask_vs_math_cpu "
         "CPU.test_scaled_dot_product_fused_attention_gqa_vs_math_cpu "
         "CUDA.test_sdp_mem_efficient_grad_against_math CUDA.test_sdp_flash_attention_grad_against_math",
    RANK3: "TT.test_scaled_dot_product_attention FM.test_fused_inputs_dim_3 CPU.test_fused_inputs_dim_3_cpu",
    GQA_FLAG: "FM.test_invalid_sdpa_kernel_grouped_query_attention_cuda CUDA.test_cudnn_attention_gqa",
    "v heads != k heads (cuDNN takes h_k != h_v)": "CUDA.test_cudnn_attention_gqa",
    "rank-1 mask (seq_k,)": "CUDA.test_mem_efficient_attention_mask_variants",
    "negative scale (attrs.scale must be positive)": "SD.test_scaled_dot_product_attention_math_with_negative_scale "
                                                     "CPU.test_scaled_dot_product_attention_math_with_negative_scale",
    "storage offset (a data pointer off 16-byte alignment)":
        "FM.test_mem_efficient_attention_misaligned_data_ptr_sm80_or_later",
    "training (compute_log_sumexp): the batch > 65535 refusal holds for dropout with the logsumexp kept":
        "FM.test_mem_eff_attention_fail_with_batch_size_geq_65536_error",
}


def extract(tree):
    up = Upstream(tree)
    _failure_modes(up)
    _generic(up)
    _cuda(up)
    _grids(up)
    for missing, tests in LACKS.items():
        for cls, name in (t.split(".") for t in tests.split()):
            cls = {"TT": TT, "SD": SD, "FM": FM, "CPU": CPU, "CUDA": CUDA}[cls]
            up.fx.lacks(name=f"{TEST}::{cls}::{name}", source=f"{TEST}:{up.method(cls, name).lineno}", missing=missing,
                        why="the test runs this input and no request carries it")
    return up.fx
