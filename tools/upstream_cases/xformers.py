"""xFormers cases (issue 34): what tests/test_mem_eff_attention.py runs on cutlassF-pt, the
forward operator behind our `xformers.attention.cutlass`.

The test does not list its inputs in decorators. `_generate_op_device_dtype_biasT_B_Mq_Mkv_H_K_Kv`
builds them per operator from `generate_test_shapes_B_Mq_Mkv_H_K_Kv` (shape lists), the op's
SUPPORTED_DTYPES and a random pick among its SUPPORTED_ATTN_BIAS_TYPES, and `create_tensors` then
skips every input the op's own `not_supported_reasons` refuses. So the verdict of an input is
the op's checks (common.py / cutlass.py), run by the test: this module reads the lists and
class attributes from the source with `ast` (so a changed list changes the cases), and re-states
the checks themselves as `Upstream.verdict`, citing each line it relies on.

Collapsed on purpose: batch and heads (representative B=1, H=1: no check reads them), the
random bias pick (every supported bias type is crossed with every dtype instead), fmt/packed
(BMHK; packing keeps stride(-2) == K) and test_logsumexp (the same grid as test_forward).
Kept: every K / Kv the shape generator names, every dtype, every bias type and window size.
"""

import ast
import glob
import json
import os

from common import Fixture, Source, dtype

REPO = "facebookresearch/xformers"
COMMIT = "bed3978b5efc34b92a84e6116b01f598d83b8af1"
KERNEL = "xformers.attention.cutlass"
TEST = "tests/test_mem_eff_attention.py"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _num(node):
    """An int literal that may be written as arithmetic (`256 + 8`, `1 + 2**16`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp):
        ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__, ast.Pow: int.__pow__}
        return ops[type(node.op)](_num(node.left), _num(node.right))
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_num(e) for e in node.elts]
    raise ValueError(ast.dump(node))


def _class_attrs(src, cls):
    """{attribute: (value node, line)} of class `cls` in `src`."""
    for node in ast.walk(src.tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            out = {}
            for st in node.body:
                if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name):
                    out[st.targets[0].id] = (st.value, st.lineno)
                elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                    out[st.target.id] = (st.value, st.lineno)
            return out
    raise ValueError(f"{src.path}: no class {cls}")


def _loops(fn):
    """[(loop variable, literal values or None, line)] of the `for` loops in `fn`, in order."""
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            try:
                values = _num(node.iter)
            except (ValueError, KeyError):
                values = None
            out.append((node.target.id, values, node.lineno))
    return sorted(out, key=lambda x: x[2])


def _assigned(fn, name):
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value, node.lineno
    raise ValueError(f"{fn.name}: no assignment to {name}")


def _profiles():
    """Our GPU profiles: name -> (8, 0) for CUDA, None for ROCm."""
    out = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "capabilities", "hardware", "*.json"))):
        prof = json.load(open(path))
        for dev in prof["devices"]:
            if dev["kind"] == "cuda":
                out[prof["name"]] = tuple(int(x) for x in dev["compute_capability"].split("."))
            elif dev["kind"] == "rocm":
                out[prof["name"]] = None
    return out


def _request(dt, B, Mq, Mkv, Hq, K, Kv, Hkv=None, *, bias=None, q_strides=None, device=None):
    """A BSHD request; `bias` is a `_Bias` variant (or None) laid over the shape."""
    Hkv = Hkv or Hq
    tensors = {}
    for name, shape in (("q", [B, Mq, Hq, K]), ("k", [B, Mkv, Hkv, K]), ("v", [B, Mkv, Hkv, Kv])):
        tensors[name] = {"dtype": dt, "shape": shape, "layout": "BSHD"}
        tensors[name].update({"strides": q_strides} if q_strides else {}, **({"device": device} if device else {}))
    attrs = {}
    if bias:
        attrs.update(bias.attrs)
        if bias.varlen:
            # Block-diagonal biases pack the batch into batch 1 (create_tensors); the number of
            # blocks is drawn at random upstream, 4 stands for it.
            for name, m in (("q", Mq), ("k", Mkv), ("v", Mkv)):
                tensors[name]["shape"][:2] = [1, B * m]
            tensors["cu_seqlens_q"] = {"dtype": "i32", "shape": [5]}
            tensors["cu_seqlens_k"] = {"dtype": "i32", "shape": [5]}
        if bias.tensor:
            tensors["mask"] = {"dtype": bias.mask_dtype or dt, "shape": [B, Hq, Mq, Mkv]}
            strides = bias.strides(Hq, Mq, Mkv)
            if strides[2] != Mkv:
                tensors["mask"]["strides"] = strides
    r = {"op": "attention", "tensors": tensors}
    if attrs:
        r["attrs"] = attrs
    return r


class _Bias:
    """One attn_bias type as request fields."""

    def __init__(self, cls, *, causal=None, window=None, varlen=False, tensor=False, align=8, mask_dtype=None):
        self.cls, self.window, self.varlen, self.tensor = cls, window, varlen, tensor
        self.align, self.mask_dtype = align, mask_dtype
        self.attrs = {}
        if causal:
            self.attrs.update(causal=True, causal_alignment=causal)
        if window:
            # xFormers' window_size counts the diagonal key: keys (i - window_size, i] are seen,
            # which is window_left = window_size - 1 in our terms.
            self.attrs["window_left"] = window - 1

    def label(self):
        return self.cls + (f"(window_size={self.window})" if self.window else "")

    def strides(self, H, Mq, Mkv):
        """[B, H, Mq, Mkv] strides of the tensor bias: _create_aligned_bias pads the last dim to
        a multiple of `align`, then narrows it back."""
        pad = -(-Mkv // self.align) * self.align
        return [H * Mq * pad, Mq * pad, pad, 1] if self.tensor else None


class Upstream:
    """The facts, read at COMMIT."""

    def __init__(self, gitdir):
        self.test = Source(gitdir, COMMIT, TEST)
        self.cutlass = Source(gitdir, COMMIT, "xformers/ops/fmha/cutlass.py")
        self.common = Source(gitdir, COMMIT, "xformers/ops/fmha/common.py")
        self.compat = Source(gitdir, COMMIT, "xformers/ops/fmha/torch_attention_compat.py")
        self.utils = Source(gitdir, COMMIT, "xformers/attn_bias_utils.py")
        self.dispatch = Source(gitdir, COMMIT, "xformers/ops/fmha/dispatch.py")
        fw = _class_attrs(self.cutlass, "FwOp")
        base = _class_attrs(self.common, "AttentionOpBase")
        self.name = fw["NAME"][0].value
        self.max_cc = tuple(_num(fw["CUDA_MAXIMUM_COMPUTE_CAPABILITY"][0]))
        self.min_cc = tuple(_num(base["CUDA_MINIMUM_COMPUTE_CAPABILITY"][0]))
        self.dtypes = sorted(dtype(ast.unparse(e)) for e in fw["SUPPORTED_DTYPES"][0].elts)
        self.max_k = _num(fw["SUPPORTED_MAX_K"][0])
        self.test_k = _num(fw["_TEST_K"][0])
        self.bias_types = [ast.unparse(e).split(".")[-1] for e in fw["SUPPORTED_ATTN_BIAS_TYPES"][0].elts]
        self.bias_line = fw["SUPPORTED_ATTN_BIAS_TYPES"][1]
        windows, _ = _assigned(self.utils.function("create_attn_bias"), "window_size")
        self.windows = [_num(v) for v in windows.value.values]
        align, _ = _assigned(self.utils.function("_create_aligned_bias"), "align_to")
        self.bias_align = _num(align)
        # Lines the verdicts rest on.
        c, t = self.common.cite, self.test.cite
        self.at = {
            "skip": t("pytest.skip(err_msg)"),
            "filter": t("op.CUDA_MAXIMUM_COMPUTE_CAPABILITY >= compute_capability"),
            "available": t("and op.is_available()"),
            "too_new": c("(too new)"),
            "bf16": c("bf16 is only supported on A100+ GPUs"),
            "lastdim": c('reasons.append(f"{name}.shape[-1] % {alignment} != 0")'),
            "stride2": c('f"{name}.stride(-2) % {alignment} != 0'),
            "stride1": c('f"{name}.stride(-1) > 1'),
            "gemm": self.cutlass.cite("def _minimum_gemm_alignment"),
            "rocm": self.compat.cite('raise ImportError("CUTLASS is not supported on ROCm")'),
            "bias_align": self.cutlass.cite("alignment = 128 // torch.finfo(attn_bias_tensor.dtype).bits"),
            "bias_stride1": self.cutlass.cite("if attn_bias_tensor.stride(-1) > 1:"),
        }

    def alignment(self, cc, dt):
        """_minimum_gemm_alignment: 4 from sm80, widened to 128 bits when tensor cores are used
        (always from sm80, half types only on sm70-75)."""
        sm = cc[0] * 10 + cc[1]
        bits = 32 if dt == "f32" else 16
        align = 4 if sm >= 80 else 1
        if sm >= 80 or (sm >= 70 and bits == 16):
            align = max(align, 128 // bits)
        return align

    def verdict(self, cc, dt, K, Kv, *, stride2=None, stride1=1, bias_strides=None, bias_dtype=None):
        """(expect, why) of cutlassF-pt on a device of compute capability `cc` (None: ROCm), as
        not_supported_reasons decides it."""
        if cc is None:
            return "reject", f"not built on ROCm ({self.at['rocm']}): filtered from ALL_FW_OPS ({self.at['available']})"
        if cc > self.max_cc or cc < self.min_cc:
            return "reject", (f"sm{cc[0]}{cc[1]} outside {self.min_cc}..{self.max_cc} "
                              f"({self.at['too_new']}; {self.at['filter']})")
        if dt == "bf16" and cc[0] < 8:
            return "reject", f"bf16 needs sm80 ({self.at['bf16']})"
        a = self.alignment(cc, dt)
        for what, d in (("query", K), ("value", Kv)):
            if d % a:
                return "reject", (f"{what}.shape[-1]={d} % {a} != 0 for {dt} on sm{cc[0]}{cc[1]} "
                                  f"({self.at['lastdim']}, {self.at['gemm']})")
        if stride2 is not None and stride2 % a:
            return "reject", f"stride(-2)={stride2} % {a} != 0 ({self.at['stride2']})"
        if stride1 > 1:
            return "reject", f"stride(-1)={stride1} > 1 ({self.at['stride1']})"
        if bias_strides:
            ba = 128 // (32 if (bias_dtype or dt) == "f32" else 16)
            if any(s % ba for s in bias_strides[:-1]):
                return "reject", f"attn_bias strides {bias_strides} not multiples of {ba} ({self.at['bias_align']})"
            if bias_strides[-1] > 1:
                return "reject", f"attn_bias.stride(-1) > 1 ({self.at['bias_stride1']})"
        return "accept", f"{self.name} supports it on sm{cc[0]}{cc[1]} (not_supported_reasons empty)"

    # attn_bias type -> (causal alignment, block-diagonal, tensor bias, local window); None: no
    # request can carry it. The causal alignments follow _custom_mask_type (cutlass.py).
    KINDS = {
        "type(None)": (None, False, False, False),
        "Tensor": (None, False, True, False),
        "LowerTriangularMask": ("top_left", False, False, False),
        "LowerTriangularFromBottomRightMask": ("bottom_right", False, False, False),
        "LowerTriangularFromBottomRightLocalAttentionMask": ("bottom_right", False, False, True),
        "LowerTriangularMaskWithTensorBias": ("top_left", False, True, False),
        "BlockDiagonalMask": (None, True, False, False),
        "BlockDiagonalCausalMask": ("top_left", True, False, False),
        "BlockDiagonalCausalFromBottomRightMask": ("bottom_right", True, False, False),
        "BlockDiagonalCausalLocalAttentionMask": ("top_left", True, False, True),
        "BlockDiagonalCausalLocalAttentionFromBottomRightMask": ("bottom_right", True, False, True),
        "BlockDiagonalCausalWithOffsetPaddedKeysMask": None,
    }

    def biases(self):
        """{bias type: [its variants as _Bias, one per window size create_attn_bias picks from]}
        over cutlassF-pt's SUPPORTED_ATTN_BIAS_TYPES; None for a type no request expresses."""
        out = {}
        for cls in self.bias_types:
            kind = self.KINDS[cls]  # a KeyError here: a bias type this module does not know yet
            if kind is None or cls == "type(None)":
                out["NoneType" if kind else cls] = [None] if kind else None
                continue
            causal, varlen, tensor, local = kind
            out[cls] = [_Bias(cls, causal=causal, varlen=varlen, tensor=tensor, align=self.bias_align, window=w)
                        for w in (self.windows if local else [None])]
        return out


def _name(fn, **params):
    inner = ",".join(f"{k}={v}" for k, v in params.items())
    return f"{TEST}::{fn}" + (f"[{inner}]" if inner else "")


def _head_dims(up):
    """(K, Kv, Mq, Mkv, cited line) for every head-dim pair generate_test_shapes_B_Mq_Mkv_H_K_Kv
    gives cutlassF-pt, each with the sequence lengths of the loop it comes from."""
    fn = up.test.function("generate_test_shapes_B_Mq_Mkv_H_K_Kv")
    loops = {}
    for var, values, line in _loops(fn):
        loops.setdefault(var, []).append((values, line))
    mq, mkv = loops["Mq"][0][0], loops["Mkv"][0][0]
    fixed = {n: _num(_assigned(fn, n)[0]) for n in ("Mq", "Mkv", "K")}
    out = [(k, k, mq[-1], mkv[-1], up.test.cite("for K in op._TEST_K:")) for k in up.test_k]
    ks, ks_line = _assigned(fn, "Ks")
    out += [(k, k, fixed["Mq"], fixed["Mkv"], f"{TEST}:{ks_line}") for k in _num(ks) if k <= up.max_k]
    kv_values, kv_line = [x for x in loops["_K"] if x[0]][0]
    for k in kv_values:
        out += [(fixed["K"], k, fixed["Mq"], fixed["Mkv"], f"{TEST}:{kv_line}"),
                (k, fixed["K"], fixed["Mq"], fixed["Mkv"], f"{TEST}:{kv_line}")]
    # The 200 random shapes draw K and Kv from multiples of 8 in [8, 248]: the ends stand for them.
    rnd = up.test.cite("K_CHOICES = [8 * i for i in range(1, 256 // 8)]")
    out += [(a, b, 256, 256, rnd) for a, b in ((8, 8), (248, 248), (8, 248), (248, 8))]
    uniq = {}
    for entry in out:
        uniq.setdefault(entry[:2], entry)  # the first source naming a (K, Kv) pair stands for it
    return list(uniq.values()), (mq, mkv, loops["M"][0][0])


def _grid(up, fx, profiles):
    """test_forward over the generated grid: head dims x dtypes, then bias types x dtypes."""
    dtype_line = up.test.cite("for dtype in sorted(op.SUPPORTED_DTYPES, key=str):")
    head_dims, (mq, mkv, weird) = _head_dims(up)
    full = {"a100", "t4"}
    spot_k = {36, 38, up.test_k[1]}

    def emit(hw, dt, B, Mq, Mkv, H, K, Kv, bias, accept_src, note="", **params):
        cc = profiles[hw]
        expect, why = up.verdict(cc, dt, K, Kv, bias_strides=bias.strides(H, Mq, Mkv) if bias else None)
        if expect == "reject":
            # Off CUDA sm50-90 the op is not even parametrized (_filter_unsupported_ops).
            src = up.at["available"] if cc is None else up.at["filter"] if cc > up.max_cc else up.at["skip"]
        else:
            src, why = accept_src, why + note
        name = _name("test_forward", op=up.name, dtype=dt, bias=bias.label() if bias else "NoneType",
                     B=B, Mq=Mq, Mkv=Mkv, H=H, K=K, Kv=Kv, **params)
        fx.case(name=name, source=src, kernel=KERNEL, hardware=hw, expect=expect, why=why,
                request=_request(dt, B, Mq, Mkv, H, K, Kv, bias=bias))

    for hw in profiles:
        for dt in up.dtypes:
            for K, Kv, Mq, Mkv, src in head_dims:
                if hw in full:
                    if hw == "t4" and dt == "bf16" and (K != Kv or K not in up.test_k):
                        continue  # every bf16 input is refused on sm75: a few stand for all
                elif profiles[hw] is None or profiles[hw] > up.max_cc:
                    if (K, Kv) != (up.test_k[1],) * 2:
                        continue
                elif K != Kv or K not in spot_k:
                    continue
                emit(hw, dt, 1, Mq, Mkv, 1, K, Kv, None, src, f"; dtypes from {dtype_line}")

    # Specific shapes run without a bias (large heads, sequences past 2**16).
    fn = up.test.function("_generate_op_device_dtype_biasT_B_Mq_Mkv_H_K_Kv")
    shapes, line = [(v, ln) for var, v, ln in _loops(fn) if var == "shape" and v][0]
    for dt in up.dtypes:
        for B, Mq, Mkv, H, K, Kv in shapes:
            emit("a100", dt, B, Mq, Mkv, H, K, Kv, None, f"{TEST}:{line}")

    # Bias types: every supported one, as the random pick could draw any.
    pick = up.test.cite("bias_type = r.choice(LIST_MASKS)")
    widen = up.test.cite("Mq, Mkv = min(Mkv, Mq), max(Mkv, Mq) + 2")
    force = up.test.cite("kv_len = q_len")
    # create_tensors' `mask_is_bottom_right` list (it includes the top-left local mask too).
    bottom_right = {"LowerTriangularFromBottomRightMask", "LowerTriangularFromBottomRightLocalAttentionMask",
                    "BlockDiagonalCausalFromBottomRightMask", "BlockDiagonalCausalLocalAttentionMask",
                    "BlockDiagonalCausalLocalAttentionFromBottomRightMask"}
    if 15 not in weird:
        raise ValueError("generate_test_shapes no longer has M=15")
    seqs = [(mq[0], mkv[0]), (mq[0], mkv[2]), (mq[-1], mkv[0]), (mq[-1], 15)]
    K = up.test_k[0]
    for cls, variants in up.biases().items():
        if variants is None:
            fx.lacks(name=_name("test_forward", op=up.name, bias=cls), source=pick,
                     missing="padded-keys varlen (per-sequence key counts inside fixed kv_padding slots, seqused_k)",
                     why=f"{cls} (cutlass.py:{up.bias_line}): keys of sequence i sit at i*kv_padding, only the first "
                         "k_seqlen[i] used; cu_seqlens_k describes packed keys, not this")
            continue
        for bias in variants:
            for hw, dts, seq_list in (("a100", up.dtypes, seqs if not (bias and bias.window) else seqs[1:2]),
                                      ("t4", ["f16"], seqs[1:2])):
                for dt in dts:
                    for Mq, Mkv in seq_list:
                        note = f"; bias types: {up.cutlass.path}:{up.bias_line}"
                        if bias and bias.cls in ("BlockDiagonalCausalFromBottomRightMask",
                                                 "BlockDiagonalCausalLocalAttentionFromBottomRightMask"):
                            Mq, Mkv, note = min(Mq, Mkv), max(Mq, Mkv) + 2, f"{note}; seq lengths widened at {widen}"
                        if bias and bias.cls in bottom_right and Mq > Mkv:
                            Mkv, note = Mq, f"{note}; kv_len raised to q_len at {force}"
                        emit(hw, dt, 1, Mq, Mkv, 1, K, K, bias, pick, note)


def _other_tests(up, fx, profiles):
    t = up.test
    # test_logsumexp_mqa: K/V heads expanded from one (stride 0) = MQA in our terms.
    line = t.cite("def test_logsumexp_mqa")
    for hw in ("a100", "t4", "h100", "b200"):
        expect, why = up.verdict(profiles[hw], "f16", 128, 128)
        fx.case(name=_name("test_logsumexp_mqa", op=up.name), source=line if expect == "accept" else up.at["filter"],
                kernel=KERNEL, hardware=hw, expect=expect, why=why,
                request=_request("f16", 1, 1, 16, 32, 128, 128, Hkv=1))
    # test_unsupported_cpu: CPU tensors raise ValueError (cutlassF-pt is CUDA only).
    fx.case(name=_name("test_unsupported_cpu", op=up.name), source=t.cite("with pytest.raises(ValueError):"),
            kernel=KERNEL, hardware="a100", expect="reject", why="SUPPORTED_DEVICES = {'cuda'}: device=cpu is refused",
            request=_request("f32", 1, 1, 1, 1, 32, 32, device="cpu"))
    # test_unsupported_stride_{lastdim,alignment}: the strided call raises, the .contiguous() retry runs.
    for fn, shape, strides in (("test_unsupported_stride_lastdim", [1, 4, 1, 32], [128, 1, 128, 4]),
                               ("test_unsupported_stride_alignment", [1, 2, 1, 32], [66, 33, 33, 1])):
        start = t.line_of(f"def {fn}")
        B, M, H, K = shape
        expect, why = up.verdict(profiles["a100"], "f16", K, K, stride2=strides[2], stride1=strides[3])
        fx.case(name=_name(fn, op=up.name, strides=strides), source=t.cite("except ValueError as e:", start),
                kernel=KERNEL, hardware="a100", expect=expect, why=why,
                request=_request("f16", B, M, M, H, K, K, q_strides=strides))
        fx.case(name=_name(fn, op=up.name, contiguous=True), source=t.cite("q = q.contiguous()", start),
                kernel=KERNEL, hardware="a100", expect="accept", why="the contiguous retry must run",
                request=_request("f16", B, M, M, H, K, K))
    # TestAttnBias: B=2, Mq=Mkv=32, H=3, K=Kv=16 unless the test says otherwise.
    # No op is named there: the dispatcher tries flash (no tensor bias) then cutlassF-pt.
    order = up.dispatch.cite("cutlass.FwOp,", up.dispatch.line_of("def _dispatch_fw_priority_list"))
    for fn, qdt, bad in (("test_f16_biasf32", "f16", "f32"), ("test_f32_biasf16", "f32", "f16")):
        start = t.line_of(f"def {fn}")
        good = _Bias("Tensor", tensor=True, align=1)
        fx.case(name=_name(f"TestAttnBias::{fn}", bias_dtype=qdt), kernel=KERNEL, hardware="a100", expect="accept",
                source=t.cite("fmha.memory_efficient_attention(q, k, v, attn_bias=bias)", start),
                why=f"a bias of the query's dtype runs (dispatched to cutlassF-pt: {order})",
                request=_request(qdt, 2, 32, 32, 3, 16, 16, bias=good))
        fx.case(name=_name(f"TestAttnBias::{fn}", bias_dtype=bad),
                source=t.cite("with pytest.raises((ValueError, RuntimeError)):", start), kernel=KERNEL,
                hardware="a100", expect="reject", why="the aten kernel refuses a bias dtype other than the query's",
                request=_request(qdt, 2, 32, 32, 3, 16, 16, bias=_Bias("Tensor", tensor=True, align=1, mask_dtype=bad)))
    start = t.line_of("def test_wrong_alignment")
    for dt in (dtype(v) for v in t.grid("test_wrong_alignment")["dtype"][0]):
        # torch.randn([2, 3, 7, 5]) is unpadded; pad_bias pads the last dim to 16.
        for padded, align in ((False, 1), (True, 16)):
            bias = _Bias("Tensor", tensor=True, align=align)
            expect, why = up.verdict(profiles["a100"], dt, 16, 16, bias_strides=bias.strides(3, 7, 5), bias_dtype=dt)
            src = t.cite("bias_padded = self.pad_bias(bias)" if padded else "except (ValueError, RuntimeError):", start)
            fx.case(name=_name("TestAttnBias::test_wrong_alignment", dtype=dt, padded=padded), source=src,
                    kernel=KERNEL, hardware="a100", expect=expect, why=why,
                    request=_request(dt, 2, 7, 5, 3, 16, 16, bias=bias))
    start = t.line_of("def test_permuted_attn_bias")
    req = _request("f16", 2, 7, 7, 3, 16, 16, bias=_Bias("Tensor", tensor=True, align=1))
    req["tensors"]["mask"]["strides"] = [147, 49, 1, 7]
    expect, why = up.verdict(profiles["a100"], "f16", 16, 16, bias_strides=[147, 49, 1, 7])
    fx.case(name=_name("TestAttnBias::test_permuted_attn_bias", transposed=True),
            source=t.cite("except (ValueError, RuntimeError):", start), kernel=KERNEL, hardware="a100",
            expect=expect, why=why, request=req)
    # test_forward_gqa: BMGHK with G=2 groups of H=16 query heads over one expanded K/V head each:
    # 32 query heads over 2 kv heads. Mq=1 with a top-left causal bias is skipped by the test for
    # its reference ("undefined upper left"), not by the op: those inputs are left out.
    grid = t.grid("test_forward_gqa")
    skip_mq1 = {"LowerTriangularMask", "LowerTriangularMaskWithTensorBias", "BlockDiagonalCausalMask",
                "BlockDiagonalCausalLocalAttentionMask"}
    line = t.cite("B_Mq_Mkv_H_K_Kv = (3, Mq, 512, 16, 128, 128)")
    for Mq in grid["Mq"][0]:
        for cls, variants in up.biases().items():
            if variants is None:
                fx.lacks(name=_name("test_forward_gqa", op=up.name, bias=cls), source=line,
                         missing="padded-keys varlen (seqused_k)", why=f"{cls} keys padded per sequence")
                continue
            for bias in variants:
                if Mq == 1 and cls in skip_mq1:
                    continue
                expect, why = up.verdict(profiles["a100"], "f16", 128, 128)
                fx.case(name=_name("test_forward_gqa", op=up.name, bias=bias.label() if bias else cls, Mq=Mq),
                        source=line, kernel=KERNEL, hardware="a100", expect=expect, why=why,
                        request=_request("f16", 3, Mq, 512, 32, 128, 128, Hkv=2, bias=bias))
    # test_forward_gqa_one_group: G=1 is plain multi-head attention.
    fx.case(name=_name("test_forward_gqa_one_group", op=up.name),
            source=t.cite("B, Mq, Mkv, H, K = 3, 13, 16, 5, 128"), kernel=KERNEL, hardware="a100",
            expect="accept", why="SUPPORTS_BMGHK; one group is BMHK",
            request=_request("f16", 3, 13, 16, 5, 128, 128))
    # Inputs no request can carry.
    for fn, missing in (("test_empty_tensors_empty_query", "zero-length seq_q (q[:, :0])"),
                        ("test_empty_tensors_empty_kv", "zero-length seq_k (k[:, :0], v[:, :0])"),
                        ("test_empty_tensors_empty_b", "zero batch (q[:0])")):
        fx.lacks(name=_name(fn, op=up.name), source=t.cite(f"def {fn}"), missing=missing,
                 why="our request validator requires positive batch and sequence lengths")
    fx.lacks(name=_name("test_attn_bias_padded"), source=t.cite("def test_attn_bias_padded"),
             missing="padded-keys varlen (seqused_k)", why="BlockDiagonalCausalWithOffsetPaddedKeysMask with scale=1.0")


def extract(gitdir):
    up = Upstream(gitdir)
    fx = Fixture(library="xformers", repository=REPO, commit=COMMIT)
    profiles = _profiles()
    _grid(up, fx, profiles)
    _other_tests(up, fx, profiles)
    return fx
