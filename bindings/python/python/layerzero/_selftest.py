"""``layerzero.selftest()``: every registered Python executor (attention, linear, RMSNorm,
SwiGLU and RoPE) run against float64 math on small cases it accepts, the result recorded for
this machine and library version. An
executor that passes becomes verified (selected without ``allow_unverified``)."""

import time

from . import _lz
from . import backends as _backends
from .backends import _record

# Tolerance per dtype, as the spec's table (max |got - want| <= atol + rtol * |want|).
_TOL = {"float32": (2e-5, 2e-5), "float16": (2e-3, 2e-3), "bfloat16": (2e-2, 2e-2)}


def _attention_cases(torch, device):
    g = torch.Generator(device="cpu").manual_seed(7)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for (b, sq, sk, hq, hkv, d, causal) in [
            (2, 16, 16, 4, 4, 32, False),
            (2, 16, 16, 4, 2, 64, True),
            (1, 1, 37, 8, 2, 64, True),
            (1, 24, 24, 2, 1, 128, True),
        ]:
            q = torch.randn(b, sq, hq, d, generator=g).to(device=device, dtype=dtype)
            k = torch.randn(b, sk, hkv, d, generator=g).to(device=device, dtype=dtype)
            v = torch.randn(b, sk, hkv, d, generator=g).to(device=device, dtype=dtype)
            yield {"q": q, "k": k, "v": v}, {"causal": causal}


def _attention_reference(torch, tensors, attrs):
    import torch.nn.functional as F

    q, k, v = (tensors[n].detach().to("cpu", torch.float64).transpose(1, 2) for n in ("q", "k", "v"))
    sq, sk = q.shape[-2], k.shape[-2]
    mask = None
    if attrs["causal"]:
        # Bottom-right alignment: query i sees keys up to i + (sk - sq).
        mask = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    return o.transpose(1, 2)


def _full_attrs(attrs):
    base = {
        "causal": False,
        "causal_alignment": "bottom_right",
        "dropout_p": 0.0,
        "window_left": None,
        "softcap": None,
        "alibi": False,
        "scale": None,
        "layouts": {"q": "BSHD", "k": "BSHD", "v": "BSHD"},
    }
    base.update(attrs)
    return base


def _linear_cases(torch, device):
    g = torch.Generator(device="cpu").manual_seed(8)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for m, k, n, bias in [(1, 256, 96, False), (7, 64, 48, True), (33, 512, 128, True)]:
            t = {
                "x": torch.randn(m, k, generator=g).to(device=device, dtype=dtype),
                "weight": torch.randn(n, k, generator=g).to(device=device, dtype=dtype),
            }
            if bias:
                t["bias"] = torch.randn(n, generator=g).to(device=device, dtype=dtype)
            yield t, {}


def _linear_reference(torch, tensors, attrs):
    import torch.nn.functional as F

    b = tensors.get("bias")
    x, w = (tensors[n].detach().to("cpu", torch.float64) for n in ("x", "weight"))
    return F.linear(x, w, None if b is None else b.detach().to("cpu", torch.float64))


def _norm_cases(torch, device):
    g = torch.Generator(device="cpu").manual_seed(9)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for rows, hidden in [(1, 256), (7, 1024), (33, 4096)]:
            t = {
                "x": torch.randn(rows, hidden, generator=g).to(device=device, dtype=dtype),
                "weight": (1 + 0.1 * torch.randn(hidden, generator=g)).to(device=device, dtype=dtype),
            }
            yield t, {"eps": 1e-6}


def _norm_reference(torch, tensors, attrs):
    x, w = (tensors[n].detach().to("cpu", torch.float64) for n in ("x", "weight"))
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + attrs["eps"]) * w


def _swiglu_cases(torch, device):
    g = torch.Generator(device="cpu").manual_seed(10)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for rows, width in [(1, 128), (9, 1024), (33, 2816)]:
            t = {n: torch.randn(rows, width, generator=g).to(device=device, dtype=dtype) for n in ("gate", "up")}
            yield t, {}


def _swiglu_reference(torch, tensors, attrs):
    gate, up = (tensors[n].detach().to("cpu", torch.float64) for n in ("gate", "up"))
    return torch.nn.functional.silu(gate) * up


def _rope_cases(torch, device):
    g = torch.Generator(device="cpu").manual_seed(11)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for b, s, h, d in [(1, 1, 4, 64), (2, 16, 8, 64), (1, 37, 4, 128)]:
            yield {"q": torch.randn(b, s, h, d, generator=g).to(device=device, dtype=dtype)}, {"base": 10000.0}


def _rope_reference(torch, tensors, attrs):
    q = tensors["q"].detach().to("cpu", torch.float64)
    s, d = q.shape[1], q.shape[-1]
    inv = attrs["base"] ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(s, dtype=torch.float64)[:, None] * inv
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
    rotated = torch.cat([-q[..., d // 2 :], q[..., : d // 2]], -1)
    return q * cos + rotated * sin


# op -> (cases, reference, the attributes a Python executor gets, how explain is asked)
_OPS = {
    "attention": (_attention_cases, _attention_reference, _full_attrs, lambda t, a: dict(t, causal=a["causal"])),
    "linear": (_linear_cases, _linear_reference, lambda a: {"layouts": {"weight": "NT"}}, lambda t, a: dict(t)),
    "rms_norm": (_norm_cases, _norm_reference, lambda a: dict(a, layouts={}), lambda t, a: dict(t, eps=a["eps"])),
    "swiglu": (_swiglu_cases, _swiglu_reference, lambda a: {"layouts": {}}, lambda t, a: dict(t)),
    "rope": (
        _rope_cases,
        _rope_reference,
        lambda a: dict(a, style="rotate_half", layouts={"q": "BSHD"}),
        lambda t, a: dict(t, base=a["base"]),
    ),
}


def _applicable(op, ask, kernel, tensors, attrs):
    """True when the kernel's capability admits the case (only its being unverified may
    refuse it)."""
    report = _lz.explain(op, **ask(tensors, attrs))
    for c in report.candidates:
        if c.kernel == kernel:
            codes = {r.code.name for r in c.reasons}
            return codes <= {"EXECUTOR_UNVERIFIED"}
    return False


def _device_of(kernel):
    if kernel.endswith("_cpu") or kernel.startswith("zendnn."):
        return "cpu"
    return "cuda"


def selftest(kernels=None, verbose=False):
    """Runs each registered executor (or those named) on the small cases its capability
    admits on this machine, against PyTorch float64 math; records and returns
    ``{kernel: {"ok": bool | None, "cases": n, "max_err": x, "error": str | None}}`` (``ok``
    None: no case could run here, e.g. no GPU). Passing executors are re-registered verified."""
    import torch

    _backends.install()
    results = {}
    for kernel, (backend, fn, version) in sorted(_backends.EXECUTORS.items()):
        if kernels is not None and kernel not in kernels:
            continue
        op = kernel.split(".")[1]
        if op not in _OPS:
            results[kernel] = {"ok": None, "cases": 0, "max_err": None, "error": f"no self-test cases for {op} yet"}
            continue
        cases, reference, full_attrs, ask = _OPS[op]
        device = _device_of(kernel)
        if device == "cuda" and not torch.cuda.is_available():
            results[kernel] = {"ok": None, "cases": 0, "max_err": None, "error": "no CUDA device here"}
            continue
        ran, worst, error = 0, 0.0, None
        for tensors, attrs in cases(torch, device):
            if not _applicable(op, ask, kernel, tensors, attrs):
                continue
            try:
                got = fn(dict(tensors), full_attrs(attrs))
            except Exception as e:  # noqa: BLE001 - a raising executor fails its self-test
                error = f"{type(e).__name__}: {e}"
                break
            want = reference(torch, tensors, attrs)
            first = tensors.get("q", tensors.get("x", tensors.get("gate")))
            atol, rtol = _TOL[str(first.dtype).removeprefix("torch.")]
            # A sum over K rounds once per product in the input dtype: scale the tolerance.
            if op == "linear":
                atol *= first.shape[-1] ** 0.5
            diff = (got.detach().to("cpu", torch.float64) - want).abs()
            excess = (diff - (atol + rtol * want.abs())).max().item()
            worst = max(worst, diff.max().item())
            ran += 1
            if excess > 0:
                error = f"max error {diff.max().item():.3g} over tolerance on {tuple(first.shape)} {first.dtype}"
                break
        ok = None if ran == 0 and error is None else error is None
        results[kernel] = {"ok": ok, "cases": ran, "max_err": worst if ran else None, "error": error}
        if verbose:
            print(kernel, results[kernel])
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    machine = _record.machine()
    _record.save(
        {
            k: dict(r, version=_backends.EXECUTORS[k][2], machine=machine, at=stamp)
            for k, r in results.items()
            if r["ok"] is not None
        }
    )
    for k, r in results.items():
        if r["ok"]:
            _lz.register_executor(k, _backends.EXECUTORS[k][1], verified=True)
    return results
