#!/usr/bin/env python3
"""LayerZero's `cpu` row-wise and GEMM kernels against PyTorch CPU, in one run.

Runs `cargo bench -p layerzero --bench rows` and `--bench linear` (divan), times the same
shapes through PyTorch with the same thread count, measures copy bandwidth with numpy
(a copy into a new buffer, as the kernels write new outputs; STREAM convention: bytes read
plus written over time), and prints medians, our/torch ratios and % of copy bandwidth.

Shapes: rms_norm / layer_norm over [4096, 4096] (f32, bf16); swiglu split [4096, 2 x 5504]
f32 (as benches/rows.rs); embedding of 4096 ids from a [32000, 4096] f32 table; linear 1 x 4096 x 4096 (decode)
and 512 x 4096 x 4096 (prefill), f32 and bf16.

Usage: python3 tools/bench_ops.py [--threads 2] [--reps 7]   (called by bench_vs_torch.py)
Requires: pip install torch numpy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vs_torch import parse_divan  # noqa: E402

ROWS, HIDDEN, INTER, VOCAB, N, K = 4096, 4096, 5504, 32000, 4096, 4096


def run_divan(bench: str, threads: int) -> dict[str, float]:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), MATMUL_NUM_THREADS=str(threads))
    cmd = ["cargo", "bench", "-q", "-p", "layerzero", "--bench", bench]
    print("running:", " ".join(cmd), file=sys.stderr)
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"cargo bench --bench {bench} failed:\n{res.stderr[-4000:]}")
    return parse_divan(res.stdout)


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    ours = {**run_divan("rows", args.threads), **run_divan("linear", args.threads)}

    def copy_gbps(nbytes: int) -> float:
        src = np.ones(nbytes // 2, dtype=np.uint8)
        ms = median_ms(lambda: src.copy(), args.reps)
        return nbytes / (ms * 1e-3) / 1e9

    g = torch.Generator().manual_seed(0)
    rows = []  # (case, ours ms, torch ms, bytes moved or None, flops or None)
    for dt, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        x = torch.randn(ROWS, HIDDEN, generator=g).to(dt)
        w = torch.randn(HIDDEN, generator=g).to(dt)
        b = torch.randn(HIDDEN, generator=g).to(dt)
        nbytes = 2 * ROWS * HIDDEN * x.element_size()
        rows.append((f"rms_norm 4096x4096 {name}", ours.get(f"rms_norm_4096x4096/{name}"),
                     median_ms(lambda: F.rms_norm(x, (HIDDEN,), w, 1e-6), args.reps), nbytes, None))
        rows.append((f"layer_norm 4096x4096 {name}", ours.get(f"layer_norm_4096x4096/{name}"),
                     median_ms(lambda: F.layer_norm(x, (HIDDEN,), w, b, 1e-5), args.reps), nbytes, None))
    xs = torch.randn(ROWS, 2 * INTER, generator=g)
    rows.append(("swiglu split 4096x11008 f32", ours.get("swiglu_split_4096x11008_f32"),
                 median_ms(lambda: F.silu(xs[:, :INTER]) * xs[:, INTER:], args.reps), 3 * ROWS * INTER * 4, None))
    table = torch.randn(VOCAB, HIDDEN, generator=g)
    ids = (torch.arange(ROWS, dtype=torch.int64) * 2654435761) % VOCAB
    rows.append(("embedding 4096 of 32000x4096 f32", ours.get("embedding_4096_of_32000x4096_f32"),
                 median_ms(lambda: F.embedding(ids, table), args.reps), 2 * ROWS * HIDDEN * 4, None))
    for dt, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        wt = torch.randn(N, K, generator=g).to(dt)
        for m in (1, 512):
            xm = torch.randn(m, K, generator=g).to(dt)
            wbytes = N * K * wt.element_size()
            rows.append((f"linear {m}x{K}x{N} {name}", ours.get(f"linear_{name}/{m}"),
                         median_ms(lambda: F.linear(xm, wt), args.reps), wbytes if m == 1 else None, 2 * m * N * K))

    print(f"\nrow-wise and GEMM kernels vs PyTorch {torch.__version__} ({args.threads} threads; medians)")
    print(f"{'case':36} {'ours ms':>9} {'torch ms':>9} {'ours/torch':>10} {'GB/s':>7} {'% copy':>7} {'GFLOP/s':>8}")
    for case, o, t, nbytes, flops in rows:
        if o is None:
            print(f"{case:36} {'-':>9} {t:9.2f}  (no divan result)")
            continue
        gbps = f"{nbytes / (o * 1e-3) / 1e9:7.1f}" if nbytes else f"{'':>7}"
        pct = f"{100 * (nbytes / (o * 1e-3) / 1e9) / copy_gbps(nbytes):6.0f}%" if nbytes else f"{'':>7}"
        gf = f"{flops / (o * 1e-3) / 1e9:8.1f}" if flops else f"{'':>8}"
        print(f"{case:36} {o:9.2f} {t:9.2f} {o / t:10.2f} {gbps} {pct} {gf}")
    print("ours/torch < 1 means LayerZero is faster; % copy compares bytes read + written with a numpy copy of as many bytes.")


if __name__ == "__main__":
    main()
