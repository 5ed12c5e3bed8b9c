#!/usr/bin/env python3
"""The per-call cost of LayerZero's Python paths on tiny inputs, where the call costs more
than the kernel: lz.ops directly, the torch custom ops (torch.ops.layerzero.*, registered by
layerzero.torch_ops with torch.library.Library) in eager mode, the same ops registered with
the torch.library.custom_op decorator (in a namespace of this script's own, for comparison),
and the Library ops under torch.compile (inductor); and PyTorch's own
F.scaled_dot_product_attention and F.rms_norm on the same inputs.

Inputs: rms_norm of x [1, 64] f32 with weight [64]; attention of q, k, v [1, 1, 2, 16] f32
(BSHD; SDPA gets the BHSD views, made once outside the timing). Each round times every
variant once (CALLS calls each, in turn), so the variants are interleaved round by round; the
script prints the median over rounds of the per-call time in microseconds.

Usage: /tmp/lz-py-venv/bin/python tools/bench_python_overhead.py [--rounds 21] [--calls 400]
       [--no-compile]
Requires: torch and the layerzero package (bindings/python).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import layerzero as lz
import layerzero.torch_ops as lz_torch_ops

DECORATOR_NS = "lz_decorator_bench"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def register_decorator_ops():
    """rms_norm and attention through torch.library.custom_op, same schemas and fakes as the
    Library ops (registered once per process)."""
    ops = {}
    for name, fn, fake in (
        ("rms_norm", lz_torch_ops._rms_norm, lz_torch_ops._same_fake),
        ("attention", lz_torch_ops._attention, lz_torch_ops._attention_fake),
    ):
        schema = lz_torch_ops.SCHEMAS[name]
        schema = schema[schema.index("(") :]
        op = torch.library.custom_op(f"{DECORATOR_NS}::{name}", fn, mutates_args=(), schema=schema)
        op.register_fake(fake)
        ops[name] = getattr(getattr(torch.ops, DECORATOR_NS), name)
    return ops


def per_call_us(fn, calls):
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    args = ap.parse_args()

    print(f"CPU: {cpu_model()}")
    print(f"torch {torch.__version__}, layerzero {lz.version()}, torch threads {torch.get_num_threads()}")

    torch.manual_seed(0)
    x = torch.randn(1, 64)
    w = torch.randn(64)
    q, k, v = (torch.randn(1, 1, 2, 16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    eps = 1e-6
    lzt = torch.ops.layerzero
    deco = register_decorator_ops()

    # The kernel each call selects, called directly (no selection, dispatch or fallback) on
    # buffers allocated the same way: what lz.ops adds is the difference.
    from layerzero import _lz, ops as lz_ops

    lz.ops.rms_norm(x, w, eps=eps)
    lz.ops.attention(q, k, v, causal=True)
    norm_kernel = lz.which("rms_norm", x=x, weight=w, eps=eps)
    attn_kernel = lz.which("attention", q=q, k=k, v=v, causal=True)
    norm_call = lz_ops._calls[("rms_norm", eps)]
    attn_call = lz_ops._plain_attention[(True, "bottom_right", None, "BSHD")]
    print(f"selected: rms_norm -> {norm_kernel}, attention -> {attn_kernel}")

    def norm_direct():
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        return _lz.run_kernel(norm_kernel, norm_call, (x, w, None), (out,))[0]

    def attn_direct():
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        return _lz.run_kernel(attn_kernel, attn_call, (q, k, v, None, None, None), (out,))[0]

    variants = {
        "rms_norm": {
            "kernel directly": norm_direct,
            "lz.ops.rms_norm": lambda: lz.ops.rms_norm(x, w, eps=eps),
            "torch.ops.layerzero (Library)": lambda: lzt.rms_norm(x, w, eps),
            "custom_op decorator": lambda: deco["rms_norm"](x, w, eps),
            "F.rms_norm": lambda: F.rms_norm(x, (64,), w, eps=eps),
        },
        "attention": {
            "kernel directly": attn_direct,
            "lz.ops.attention": lambda: lz.ops.attention(q, k, v, causal=True),
            "torch.ops.layerzero (Library)": lambda: lzt.attention(q, k, v, causal=True),
            "custom_op decorator": lambda: deco["attention"](q, k, v, causal=True),
            "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True),
        },
    }

    # The same results from every path before timing anything.
    ref_n = F.rms_norm(x, (64,), w, eps=eps)
    ref_a = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(1, 2)
    for group, ref in (("rms_norm", ref_n), ("attention", ref_a)):
        for name, fn in variants[group].items():
            got = fn()
            if name.startswith("F."):
                got = got if group == "rms_norm" else got.transpose(1, 2)
            err = (got - ref).abs().max().item()
            if err > 1e-5:
                raise SystemExit(f"{group} / {name}: differs from PyTorch by {err}")

    if not args.no_compile:
        norm_c = torch.compile(lambda x, w: lzt.rms_norm(x, w, eps), fullgraph=True)
        attn_c = torch.compile(lambda q, k, v: lzt.attention(q, k, v, causal=True), fullgraph=True)
        fnorm_c = torch.compile(lambda x, w: F.rms_norm(x, (64,), w, eps=eps), fullgraph=True)
        t0 = time.perf_counter()
        for fn, a, ref in (
            (norm_c, (x, w), ref_n),
            (attn_c, (q, k, v), ref_a),
            (fnorm_c, (x, w), ref_n),
        ):
            err = (fn(*a) - ref).abs().max().item()
            if err > 1e-5:
                raise SystemExit(f"a compiled variant differs from PyTorch by {err}")
        print(f"torch.compile (inductor) of the three compiled variants: {time.perf_counter() - t0:.1f} s")
        variants["rms_norm"]["torch.compile(layerzero.rms_norm)"] = lambda: norm_c(x, w)
        variants["rms_norm"]["torch.compile(F.rms_norm)"] = lambda: fnorm_c(x, w)
        variants["attention"]["torch.compile(layerzero.attention)"] = lambda: attn_c(q, k, v)

    print(f"kernels: rms_norm -> {lz.which('rms_norm', x=x, weight=w, eps=eps)}, "
          f"attention -> {lz.which('attention', q=q, k=k, v=v, causal=True)}")
    before = lz.counters()
    times = {(g, n): [] for g, vs in variants.items() for n in vs}
    for group, vs in variants.items():  # warm-up
        for fn in vs.values():
            per_call_us(fn, 50)
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        for group, vs in variants.items():
            for name, fn in vs.items():
                times[(group, name)].append(per_call_us(fn, args.calls))
    elapsed = time.perf_counter() - t0
    after = lz.counters()

    print(f"{args.rounds} interleaved rounds of {args.calls} calls per variant ({elapsed:.1f} s)")
    print("rms_norm: x [1, 64] f32, weight [64]; attention: q, k, v [1, 1, 2, 16] f32 BSHD, causal")
    for group, vs in variants.items():
        print(f"\n{group}")
        base = statistics.median(times[(group, next(iter(vs)))])
        for name in vs:
            ts = times[(group, name)]
            med = statistics.median(ts)
            print(f"  {name:38s} {med:8.2f} us/call  (min {min(ts):7.2f})  x{med / base:5.2f} of lz.ops")
    hits = {key: after[key] - before[key] for key in ("cache_hits", "cache_misses", "live", "plan_hits")}
    print(f"\nlz.counters() during timing: {hits}")


if __name__ == "__main__":
    main()
