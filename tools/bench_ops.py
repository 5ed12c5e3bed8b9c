#!/usr/bin/env python3
"""LayerZero's `cpu` and `onednn` row-wise and GEMM kernels against PyTorch CPU, in one run.

Builds the divan benches `rows` and `linear` of layerzero, then, round after round, runs one
bench group of ours (the `cpu` kernels, then, when oneDNN is found, the `onednn` kernels of the
same ops: `LZ_BENCH_BACKEND=onednn`, with LAYERZERO_ONEDNN_LIB or the active Python
environment's libdnnl.so.3), times the same shapes through PyTorch with the same thread count, and
measures copy bandwidth with numpy for those byte counts (a copy into a new buffer, as the
kernels write new outputs; STREAM convention: bytes read plus written over time), so that
every ratio compares timings taken within seconds of each other. It prints the median over
rounds of each figure, our/torch ratios and % of copy bandwidth.

Shapes: rms_norm / layer_norm over [4096, 4096] (f32, bf16); swiglu split [4096, 2 x 5504]
and separate [4096, 5504] x 2 f32; gelu [4096, 5504] (f32, bf16) (as benches/rows.rs);
embedding of 4096 ids from a [32000, 4096] f32 table; linear 1 x 4096 x 4096 (decode) and
512 x 4096 x 4096 (prefill), f32 and bf16. oneDNN has no rms_norm (v3.2), no split swiglu and
no embedding: those rows show `-` in its column.

Usage: python3 tools/bench_ops.py [--threads 2] [--reps 7] [--rounds 3]   (called by bench_vs_torch.py)
Requires: pip install torch numpy.
"""

from __future__ import annotations

import argparse
import json
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


def build_benches() -> dict[str, str]:
    """Paths of the `rows` and `linear` bench executables (built once, in release)."""
    cmd = ["cargo", "bench", "-q", "-p", "layerzero", "--bench", "rows", "--bench", "linear",
           "--no-run", "--message-format=json"]
    print("building:", " ".join(cmd), file=sys.stderr)
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"building the benches failed:\n{res.stderr[-4000:]}")
    exes = {}
    for line in res.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
            name = msg["target"]["name"]
            if name in ("rows", "linear"):
                exes[name] = msg["executable"]
    missing = {"rows", "linear"} - exes.keys()
    if missing:
        sys.exit(f"bench executables not found: {sorted(missing)}")
    return exes


def run_group(exe: str, group: str, threads: int, backend: str = "cpu") -> dict[str, float]:
    """Median ms of each bench in one divan group (a name pattern, e.g. `rms_norm_4096x4096`),
    measuring `backend`'s kernel of each op (`cpu` or `onednn`)."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), MATMUL_NUM_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads), LZ_BENCH_BACKEND=backend)
    res = subprocess.run([exe, "--bench", group], cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{exe} {group} failed:\n{res.stderr[-4000:]}")
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
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (ours, torch, copy) per bench group")
    args = ap.parse_args(argv)
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    exes = build_benches()

    def copy_gbps(nbytes: int) -> float:
        src = np.ones(nbytes // 2, dtype=np.uint8)
        ms = median_ms(lambda: src.copy(), args.reps)
        return nbytes / (ms * 1e-3) / 1e9

    # Groups: (bench executable, divan group, [(case, divan key, torch fn, bytes or None, flops or None)]).
    g = torch.Generator().manual_seed(0)
    groups = []
    for kind, fn_of in [("rms_norm", lambda x, w, b: (lambda: F.rms_norm(x, (HIDDEN,), w, 1e-6))),
                        ("layer_norm", lambda x, w, b: (lambda: F.layer_norm(x, (HIDDEN,), w, b, 1e-5)))]:
        cases = []
        for dt, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
            x = torch.randn(ROWS, HIDDEN, generator=g).to(dt)
            w = torch.randn(HIDDEN, generator=g).to(dt)
            b = torch.randn(HIDDEN, generator=g).to(dt)
            nbytes = 2 * ROWS * HIDDEN * x.element_size()
            cases.append((f"{kind} 4096x4096 {name}", f"{kind}_4096x4096/{name}", fn_of(x, w, b), nbytes, None))
        groups.append(("rows", f"{kind}_4096x4096", cases))
    xs = torch.randn(ROWS, 2 * INTER, generator=g)
    groups.append(("rows", "swiglu_split_4096x11008_f32", [
        ("swiglu split 4096x11008 f32", "swiglu_split_4096x11008_f32",
         lambda: F.silu(xs[:, :INTER]) * xs[:, INTER:], 3 * ROWS * INTER * 4, None)]))
    gate, up = torch.randn(ROWS, INTER, generator=g), torch.randn(ROWS, INTER, generator=g)
    groups.append(("rows", "swiglu_separate_4096x5504_f32", [
        ("swiglu separate 4096x5504 f32", "swiglu_separate_4096x5504_f32",
         lambda: F.silu(gate) * up, 3 * ROWS * INTER * 4, None)]))
    cases = []
    for dt, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        xg = torch.randn(ROWS, INTER, generator=g).to(dt)
        cases.append((f"gelu 4096x5504 {name}", f"gelu_4096x5504/{name}", (lambda xg=xg: F.gelu(xg)),
                      2 * ROWS * INTER * xg.element_size(), None))
    groups.append(("rows", "gelu_4096x5504", cases))
    table = torch.randn(VOCAB, HIDDEN, generator=g)
    ids = (torch.arange(ROWS, dtype=torch.int64) * 2654435761) % VOCAB
    groups.append(("rows", "embedding_4096_of_32000x4096_f32", [
        ("embedding 4096 of 32000x4096 f32", "embedding_4096_of_32000x4096_f32",
         lambda: F.embedding(ids, table), 2 * ROWS * HIDDEN * 4, None)]))
    for dt, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        wt = torch.randn(N, K, generator=g).to(dt)
        cases = []
        for m in (1, 512):
            xm = torch.randn(m, K, generator=g).to(dt)
            wbytes = N * K * wt.element_size()
            cases.append((f"linear {m}x{K}x{N} {name}", f"linear_{name}/{m}", (lambda xm=xm, wt=wt: F.linear(xm, wt)),
                          wbytes if m == 1 else None, 2 * m * N * K))
        groups.append(("linear", f"linear_{name}", cases))

    ours: dict[str, list[float]] = {}
    dnnl: dict[str, list[float]] = {}
    theirs: dict[str, list[float]] = {}
    copies: dict[str, list[float]] = {}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
        for exe, group, cases in groups:
            got = run_group(exes[exe], group, args.threads)
            got_dnnl = run_group(exes[exe], group, args.threads, "onednn")
            for case, key, fn, nbytes, _ in cases:
                if key in got:
                    ours.setdefault(case, []).append(got[key])
                if key in got_dnnl:
                    dnnl.setdefault(case, []).append(got_dnnl[key])
                theirs.setdefault(case, []).append(median_ms(fn, args.reps))
                if nbytes:
                    copies.setdefault(case, []).append(copy_gbps(nbytes))

    print(f"\nrow-wise and GEMM kernels vs PyTorch {torch.__version__} ({args.threads} threads; "
          f"medians of {args.rounds} interleaved rounds)")
    print(f"{'case':36} {'cpu ms':>9} {'onednn ms':>10} {'torch ms':>9} {'cpu/torch':>10} {'dnnl/torch':>10} "
          f"{'GB/s':>7} {'% copy':>7} {'GFLOP/s':>8}")
    for _, _, cases in groups:
        for case, _, _, nbytes, flops in cases:
            t = statistics.median(theirs[case])
            d = statistics.median(dnnl[case]) if case in dnnl else None
            ds = f"{d:10.2f}" if d else f"{'-':>10}"
            dr = f"{d / t:10.2f}" if d else f"{'-':>10}"
            if case not in ours:
                print(f"{case:36} {'-':>9} {ds} {t:9.2f} {'-':>10} {dr}  (no divan result)")
                continue
            o = statistics.median(ours[case])
            gbps = nbytes / (o * 1e-3) / 1e9 if nbytes else None
            gb = f"{gbps:7.1f}" if gbps else f"{'':>7}"
            pct = f"{100 * gbps / statistics.median(copies[case]):6.0f}%" if gbps else f"{'':>7}"
            gf = f"{flops / (o * 1e-3) / 1e9:8.1f}" if flops else f"{'':>8}"
            print(f"{case:36} {o:9.2f} {ds} {t:9.2f} {o / t:10.2f} {dr} {gb} {pct} {gf}")
    print("x/torch < 1 means that kernel is faster than PyTorch; GB/s, % copy and GFLOP/s are the cpu kernel's; "
          "% copy compares bytes read + written with a numpy copy of as many bytes.")


if __name__ == "__main__":
    main()
