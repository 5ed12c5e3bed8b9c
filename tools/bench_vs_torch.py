#!/usr/bin/env python3
"""LayerZero's `cpu` attention kernels against PyTorch CPU SDPA, on the same machine in one run.

It runs `cargo bench -p layerzero --bench attention` (divan; shapes in
layerzero/benches/attention.rs), times torch.nn.functional.scaled_dot_product_attention on the
same shapes with the same thread count, measures memory-copy bandwidth with numpy, and prints:

  case | ours ms | torch ms | ours/torch | speedup      (medians; ratio < 1 means we are faster)
  decode: GB/s of K+V read and % of copy bandwidth (STREAM convention: copy = 2 x bytes / time)

Shapes: prefill B=1, Hq=32, Hkv=8, D=128, S in {512, 2048}, causal, f32 and bf16; decode one
query against a 4096-key f32 cache; paged decode the same cache in pages of 16 (torch has no
paged SDPA: it is compared with torch's dense decode on the same cache).

Usage: python3 tools/bench_vs_torch.py [--threads 2] [--divan-output FILE] [--reps 7] [--attention-only]
After attention it runs tools/bench_ops.py (norms, swiglu, embedding, linear) in the same run.
Requires: pip install torch numpy.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HQ, HKV, D, CACHE, PAGE = 32, 8, 128, 4096, 16
ROOT = Path(__file__).resolve().parent.parent

UNITS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_divan(text: str) -> dict[str, float]:
    """Median milliseconds per bench name ('group/arg' for benches with args)."""
    out: dict[str, float] = {}
    group = None
    for line in text.splitlines():
        m = re.match(r"^((?:│  |   )*)[├╰]─ (\S+)(.*)$", line)
        if not m:
            continue
        depth = len(m.group(1)) // 3
        name, cells = m.group(2), m.group(3).split("│")
        # Cells after the name: fastest | slowest | median | mean | samples | iters.
        if not cells[0].strip():  # a group header (a bench with args)
            group = name
            continue
        key = f"{group}/{name}" if depth >= 1 and group else name
        tm = re.match(r"\s*([\d.]+)\s*(\S+)", cells[2]) if len(cells) > 2 else None
        if tm and tm.group(2) in UNITS:
            out[key] = float(tm.group(1)) * UNITS[tm.group(2)]
    return out


def run_divan(threads: int) -> str:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    cmd = ["cargo", "bench", "-q", "-p", "layerzero", "--bench", "attention"]
    print("running:", " ".join(cmd), f"(RAYON_NUM_THREADS={threads})", file=sys.stderr)
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"cargo bench failed:\n{res.stderr[-4000:]}")
    return res.stdout


def median_ms(fn, reps: int) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


def torch_times(threads: int, reps: int) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    res = {}
    for dt, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        for s in (512, 2048):
            q = torch.randn(1, HQ, s, D, generator=g).to(dt)
            k = torch.randn(1, HKV, s, D, generator=g).to(dt)
            v = torch.randn(1, HKV, s, D, generator=g).to(dt)
            fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
            res[f"prefill_causal_{tag}/{s}"] = median_ms(fn, reps if s == 2048 else 3 * reps)
    q = torch.randn(1, HQ, 1, D, generator=g)
    k = torch.randn(1, HKV, CACHE, D, generator=g)
    v = torch.randn(1, HKV, CACHE, D, generator=g)
    dec = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), 50 * reps)
    res["decode_f32_cache4096"] = dec
    res["paged_decode_f32_cache4096_page16"] = dec
    return res


def copy_bandwidth(mbytes: int, reps: int) -> float:
    """STREAM-style copy bandwidth in GB/s (bytes read + bytes written) of an mbytes array."""
    import numpy as np

    n = mbytes * (1 << 20) // 4
    a = np.ones(n, dtype=np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = min(_timed(lambda: np.copyto(b, a)) for _ in range(reps))
    return 2 * a.nbytes / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--divan-output", help="parse this saved `cargo bench` output instead of running it")
    ap.add_argument("--attention-only", action="store_true", help="skip the row-wise and GEMM kernels (tools/bench_ops.py)")
    args = ap.parse_args()

    text = Path(args.divan_output).read_text() if args.divan_output else run_divan(args.threads)
    ours = parse_divan(text)
    if not ours:
        sys.exit("no divan results parsed:\n" + text)
    theirs = torch_times(args.threads, args.reps)
    bw_big = copy_bandwidth(256, 10)
    bw_small = copy_bandwidth(32, 20)

    print(f"\nthreads: {args.threads}  (torch {__import__('torch').__version__})")
    print(f"{'case':40} {'ours ms':>9} {'torch ms':>9} {'ours/torch':>10} {'speedup':>8}")
    for case in sorted(theirs):
        o, t = ours.get(case), theirs[case]
        if o is None:
            print(f"{case:40} {'-':>9} {t:9.2f}")
            continue
        print(f"{case:40} {o:9.2f} {t:9.2f} {o / t:10.2f} {t / o:7.2f}x")
    kv_bytes = 2 * CACHE * HKV * D * 4
    print(f"\ncopy bandwidth (numpy, read+write): {bw_big:.1f} GB/s at 256 MiB, {bw_small:.1f} GB/s at 32 MiB")
    for case in ("decode_f32_cache4096", "paged_decode_f32_cache4096_page16"):
        if case in ours:
            gbs = kv_bytes / (ours[case] * 1e-3) / 1e9
            print(
                f"{case:40} K+V {kv_bytes / 2**20:.0f} MiB read at {gbs:5.1f} GB/s = "
                f"{100 * gbs / bw_big:5.1f}% of 256 MiB copy, {100 * gbs / bw_small:5.1f}% of 32 MiB copy"
            )

    # The row-wise and GEMM kernels (norms, swiglu, embedding, linear) in the same run.
    if not args.attention_only:
        import bench_ops

        bench_ops.main(["--threads", str(args.threads), "--reps", str(args.reps)])


if __name__ == "__main__":
    main()
