#!/usr/bin/env python3
"""Every `cpu` kernel family against PyTorch CPU, at every ISA cap this machine supports, in one run.

The one benchmark entry point. For each cap (LAYERZERO_CPU_ISA) it starts a worker process with
the same cap imposed on PyTorch (ATEN_CPU_CAPABILITY for ATen's kernels, ONEDNN_MAX_CPU_ISA for
its oneDNN, MKL_ENABLE_INSTRUCTIONS for its MKL), and the worker, round after round, runs one
divan bench group of ours (the `cpu` kernel; then, when oneDNN is found, the `onednn` kernel of
the same op), times the same shapes through PyTorch with the same thread count, and measures a
numpy copy of as many bytes, so every ratio compares timings taken within seconds of each other.
It prints, per cap, the median over rounds of each figure, ours/torch, GB/s and % of copy
bandwidth (memory-bound cases; STREAM convention: bytes read + written), GFLOP/s (GEMMs and
attention prefill), and bf16-attention-over-f32; then one summary of ours/torch per case and cap.

Cases (the shapes of layerzero/benches/{attention,rows,linear}.rs):
  attention prefill B=1, Hq=32, Hkv=8, D=128, causal, S in {512, 2048}, f32 and bf16;
  decode one query against a 4096-key f32 cache, dense and in pages of 16 (torch: dense);
  rms_norm / layer_norm [4096, 4096] f32, bf16; swiglu split [4096, 2 x 5504] and separate
  [4096, 5504] x 2 f32; gelu [4096, 5504] f32, bf16; embedding 4096 ids of [32000, 4096] f32;
  linear 1 x 4096 x 4096 (decode) and 512 x 4096 x 4096 (prefill), f32 and bf16.

Caps: portable, avx2, avx512 (no bf16 instructions), avx512_bf16 (no AMX), amx, native. The
default is every cap above portable that this CPU has (--caps all adds portable).

Usage: tools/.venv/bin/python tools/bench.py [--caps avx2,avx512_bf16] [--threads 2]
       [--rounds 3] [--reps 7] [--only attention,linear] [--json FILE]
Requires: pip install torch numpy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HQ, HKV, D, CACHE = 32, 8, 128, 4096
ROWS, HIDDEN, INTER, VOCAB, N, K = 4096, 4096, 5504, 32000, 4096, 4096
UNITS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}
CAPS = ["portable", "avx2", "avx512", "avx512_bf16", "amx", "native"]

# What each cap leaves PyTorch: (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS).
TORCH_CAP = {
    "portable": ("default", "SSE41", "SSE4_2"),
    "avx2": ("avx2", "AVX2", "AVX2"),
    "avx512": ("avx512", "AVX512_CORE_VNNI", "AVX512"),
    "avx512_bf16": ("avx512", "AVX512_CORE_BF16", "AVX512"),
    "amx": (None, "AVX512_CORE_AMX", None),
    "native": (None, None, None),
}


def supported_caps() -> list[str]:
    """The caps this CPU can honour (its flags in /proc/cpuinfo)."""
    try:
        flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    except (OSError, AttributeError):
        return ["portable", "native"]
    caps = ["portable"]
    if {"avx2", "fma", "f16c"} <= flags:
        caps.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            caps.append("avx512")
            if "avx512_bf16" in flags:
                caps.append("avx512_bf16")
                if "amx_bf16" in flags:
                    caps.append("amx")
    return caps + ["native"]


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


def build_benches() -> dict[str, str]:
    """Paths of the `attention`, `rows` and `linear` bench executables (built once, release)."""
    names = ("attention", "rows", "linear")
    cmd = ["cargo", "bench", "-q", "-p", "layerzero", "--no-run", "--message-format=json"]
    for n in names:
        cmd += ["--bench", n]
    print("building:", " ".join(cmd), file=sys.stderr)
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"building the benches failed:\n{res.stderr[-4000:]}")
    exes = {}
    for line in res.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] in names:
            exes[msg["target"]["name"]] = msg["executable"]
    if missing := set(names) - exes.keys():
        sys.exit(f"bench executables not found: {sorted(missing)}")
    return exes


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def attention_flops(s: int) -> float:
    """Causal prefill: QK^T and PV over the lower triangle (2 GEMMs x 2 flops x S(S+1)/2 x D x Hq)."""
    return 2 * 2 * HQ * D * s * (s + 1) / 2


def cases(torch, F):
    """Bench groups: (executable, divan group, family, [(case, divan key, torch fn, bytes, flops)])."""
    g = torch.Generator().manual_seed(0)
    groups = []
    for dt, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        cs = []
        for s in (512, 2048):
            q = torch.randn(1, HQ, s, D, generator=g).to(dt)
            k = torch.randn(1, HKV, s, D, generator=g).to(dt)
            v = torch.randn(1, HKV, s, D, generator=g).to(dt)
            fn = lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
            cs.append((f"attention prefill S={s} {tag}", f"prefill_causal_{tag}/{s}", fn, None, attention_flops(s)))
        groups.append(("attention", f"prefill_causal_{tag}", "attention", cs))
    q = torch.randn(1, HQ, 1, D, generator=g)
    k = torch.randn(1, HKV, CACHE, D, generator=g)
    v = torch.randn(1, HKV, CACHE, D, generator=g)
    dec = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    kv = 2 * CACHE * HKV * D * 4
    groups.append(("attention", "decode_f32_cache4096", "attention", [
        ("attention decode f32 cache 4096", "decode_f32_cache4096", dec, kv, None)]))
    groups.append(("attention", "paged_decode_f32_cache4096_page16", "attention", [
        ("paged decode f32 cache 4096 (torch dense)", "paged_decode_f32_cache4096_page16", dec, kv, None)]))
    for kind, fn_of in [("rms_norm", lambda x, w, b: (lambda: F.rms_norm(x, (HIDDEN,), w, 1e-6))),
                        ("layer_norm", lambda x, w, b: (lambda: F.layer_norm(x, (HIDDEN,), w, b, 1e-5)))]:
        cs = []
        for dt, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
            x = torch.randn(ROWS, HIDDEN, generator=g).to(dt)
            w = torch.randn(HIDDEN, generator=g).to(dt)
            b = torch.randn(HIDDEN, generator=g).to(dt)
            cs.append((f"{kind} 4096x4096 {tag}", f"{kind}_4096x4096/{tag}", fn_of(x, w, b),
                       2 * ROWS * HIDDEN * x.element_size(), None))
        groups.append(("rows", f"{kind}_4096x4096", "norm", cs))
    xs = torch.randn(ROWS, 2 * INTER, generator=g)
    groups.append(("rows", "swiglu_split_4096x11008_f32", "activation", [
        ("swiglu split 4096x11008 f32", "swiglu_split_4096x11008_f32",
         lambda: F.silu(xs[:, :INTER]) * xs[:, INTER:], 3 * ROWS * INTER * 4, None)]))
    gate, up = torch.randn(ROWS, INTER, generator=g), torch.randn(ROWS, INTER, generator=g)
    groups.append(("rows", "swiglu_separate_4096x5504_f32", "activation", [
        ("swiglu separate 4096x5504 f32", "swiglu_separate_4096x5504_f32",
         lambda: F.silu(gate) * up, 3 * ROWS * INTER * 4, None)]))
    cs = []
    for dt, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        xg = torch.randn(ROWS, INTER, generator=g).to(dt)
        cs.append((f"gelu 4096x5504 {tag}", f"gelu_4096x5504/{tag}", (lambda xg=xg: F.gelu(xg)),
                   2 * ROWS * INTER * xg.element_size(), None))
    groups.append(("rows", "gelu_4096x5504", "activation", cs))
    table = torch.randn(VOCAB, HIDDEN, generator=g)
    ids = (torch.arange(ROWS, dtype=torch.int64) * 2654435761) % VOCAB
    groups.append(("rows", "embedding_4096_of_32000x4096_f32", "embedding", [
        ("embedding 4096 of 32000x4096 f32", "embedding_4096_of_32000x4096_f32",
         lambda: F.embedding(ids, table), 2 * ROWS * HIDDEN * 4, None)]))
    for dt, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
        wt = torch.randn(N, K, generator=g).to(dt)
        cs = []
        for m in (1, 512):
            xm = torch.randn(m, K, generator=g).to(dt)
            # Decode reads the weight once: its bytes are the memory-bound figure.
            cs.append((f"linear {m}x{K}x{N} {tag}", f"linear_{tag}/{m}", (lambda xm=xm, wt=wt: F.linear(xm, wt)),
                       N * K * wt.element_size() if m == 1 else None, 2 * m * N * K))
        groups.append(("linear", f"linear_{tag}", "linear", cs))
    return groups


def run_group(exe: str, group: str, threads: int, backend: str) -> dict[str, float]:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), MATMUL_NUM_THREADS=str(threads),
               OMP_NUM_THREADS=str(threads), LZ_BENCH_BACKEND=backend)
    # The group's full name (`bench::group`), whole word: `decode_x` must not match `paged_decode_x`.
    pattern = rf"{Path(exe).name.split('-')[0]}::{group}\b"
    res = subprocess.run([exe, "--bench", pattern], cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"{Path(exe).name} {group} ({backend}) failed; its cells stay empty:\n{res.stderr[-2000:]}", file=sys.stderr)
        return {}
    return parse_divan(res.stdout)


def worker(args) -> None:
    """Measures one cap (the environment already carries it) and prints JSON on stdout."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    exes = json.loads(args.exes)
    only = set(args.only.split(",")) if args.only else None
    groups = [gr for gr in cases(torch, F) if not only or gr[2] in only]
    onednn = bool(os.environ.get("LAYERZERO_ONEDNN_LIB"))

    def copy_gbps(nbytes: int, new_output: bool) -> float:
        # A kernel that returns a new tensor (a norm, an activation, an embedding, as
        # PyTorch's do) is compared with a copy into a new buffer, page faults and all; one
        # that reads far more than it writes (GEMV, decode attention) with a copy into a
        # buffer written before (STREAM's copy).
        src = np.ones(nbytes // 2, dtype=np.uint8)
        if new_output:
            return nbytes / (median_ms(lambda: src.copy(), args.reps) * 1e-3) / 1e9
        dst = np.zeros(nbytes // 2, dtype=np.uint8)
        return nbytes / (median_ms(lambda: np.copyto(dst, src), args.reps) * 1e-3) / 1e9

    series: dict[str, dict[str, list[float]]] = {}
    for r in range(args.rounds):
        print(f"  [{args.worker}] round {r + 1}/{args.rounds}", file=sys.stderr)
        for exe, group, family, cs in groups:
            got = {"cpu": run_group(exes[exe], group, args.threads, "cpu")}
            if onednn and exe != "attention":
                got["onednn"] = run_group(exes[exe], group, args.threads, "onednn")
            for case, key, fn, nbytes, flops in cs:
                s = series.setdefault(case, {})
                for backend, res in got.items():
                    if key in res:
                        s.setdefault(backend, []).append(res[key])
                s.setdefault("torch", []).append(median_ms(fn, args.reps))
                if nbytes:
                    # Cases with a FLOP count here (GEMV) and attention read; the rest write.
                    reads = family == "attention" or flops is not None
                    s.setdefault("copy_gbps", []).append(copy_gbps(nbytes, not reads))
    out = []
    for _, _, family, cs in groups:
        for case, _, _, nbytes, flops in cs:
            s = series.get(case, {})
            med = {k: statistics.median(v) for k, v in s.items()}
            out.append({"case": case, "family": family, "bytes": nbytes, "flops": flops, **med})
    print(json.dumps({"cap": args.worker, "torch": torch.__version__,
                      "torch_isa": torch.backends.cpu.get_cpu_capability(), "cases": out}))


def report(run: dict) -> None:
    cap = run["cap"]
    print(f"\n== cap {cap}: PyTorch {run['torch']} (ATen {run['torch_isa']}); medians of interleaved rounds")
    print(f"{'case':42} {'cpu ms':>9} {'onednn':>9} {'torch ms':>9} {'cpu/torch':>9} {'dnnl/torch':>10} "
          f"{'GB/s':>7} {'% copy':>7} {'GFLOP/s':>8}")
    by_case = {c["case"]: c for c in run["cases"]}
    for c in run["cases"]:
        t, o, d = c.get("torch"), c.get("cpu"), c.get("onednn")
        fmt = lambda v, w=9: f"{v:{w}.2f}" if v else f"{'-':>{w}}"  # noqa: E731
        ratio = lambda v: f"{v / t:9.2f}" if v and t else f"{'-':>9}"  # noqa: E731
        gbps = c["bytes"] / (o * 1e-3) / 1e9 if o and c["bytes"] else None
        pct = f"{100 * gbps / c['copy_gbps']:6.0f}%" if gbps and c.get("copy_gbps") else f"{'':>7}"
        gf = f"{c['flops'] / (o * 1e-3) / 1e9:8.1f}" if o and c["flops"] else f"{'':>8}"
        print(f"{c['case']:42} {fmt(o)} {fmt(d)} {fmt(t)} {ratio(o)} {ratio(d):>10} "
              f"{(f'{gbps:7.1f}' if gbps else ''):>7} {pct} {gf}")
    for s in (512, 2048):
        f32, bf = by_case.get(f"attention prefill S={s} f32", {}), by_case.get(f"attention prefill S={s} bf16", {})
        if f32.get("cpu") and bf.get("cpu"):
            print(f"attention prefill S={s}: bf16 is {f32['cpu'] / bf['cpu']:.2f}x as fast as our f32")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", help="comma-separated caps, or 'all' (default: every cap above portable this CPU has)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7, help="PyTorch calls per measurement (median)")
    ap.add_argument("--only", help="comma-separated families: attention,norm,activation,embedding,linear")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--exes", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    have = supported_caps()
    if args.caps == "all":
        caps = have
    elif args.caps:
        caps = [c.strip() for c in args.caps.split(",")]
        for c in caps:
            if c not in CAPS:
                sys.exit(f"--caps: unknown cap {c!r} (one of {', '.join(CAPS)})")
            if c not in have:
                sys.exit(f"--caps: this CPU cannot run cap {c!r} (it supports {', '.join(have)})")
    else:
        caps = [c for c in have if c not in ("portable", "native")] or ["native"]
    cpu = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    print(f"CPU: {cpu.group(1) if cpu else 'unknown'}; caps: {', '.join(caps)}; {args.threads} threads", file=sys.stderr)
    exes = build_benches()
    if not os.environ.get("LAYERZERO_ONEDNN_LIB"):
        print("oneDNN: LAYERZERO_ONEDNN_LIB is not set; the onednn column stays empty", file=sys.stderr)
    runs = []
    for cap in caps:
        aten, dnnl, mkl = TORCH_CAP[cap]
        env = dict(os.environ, LAYERZERO_CPU_ISA=cap)
        for var, val in (("ATEN_CPU_CAPABILITY", aten), ("ONEDNN_MAX_CPU_ISA", dnnl), ("MKL_ENABLE_INSTRUCTIONS", mkl)):
            if val:
                env[var] = val
            else:
                env.pop(var, None)
        print(f"cap {cap}: LAYERZERO_CPU_ISA={cap} ATEN_CPU_CAPABILITY={aten or '-'} "
              f"ONEDNN_MAX_CPU_ISA={dnnl or '-'} MKL_ENABLE_INSTRUCTIONS={mkl or '-'}", file=sys.stderr)
        cmd = [sys.executable, __file__, "--worker", cap, "--exes", json.dumps(exes), "--threads", str(args.threads),
               "--rounds", str(args.rounds), "--reps", str(args.reps)] + (["--only", args.only] if args.only else [])
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        sys.stderr.write(res.stderr)
        if res.returncode != 0:
            sys.exit(f"the worker for cap {cap} failed")
        run = json.loads(res.stdout.strip().splitlines()[-1])
        runs.append(run)
        report(run)
    if len(runs) > 1:
        print("\n== cpu/torch per cap (< 1: ours is faster)")
        print(f"{'case':42} " + " ".join(f"{r['cap']:>11}" for r in runs))
        for i, c in enumerate(runs[0]["cases"]):
            cells = []
            for r in runs:
                x = r["cases"][i]
                cells.append(f"{x['cpu'] / x['torch']:11.2f}" if x.get("cpu") and x.get("torch") else f"{'-':>11}")
            print(f"{c['case']:42} " + " ".join(cells))
    print("\nratios < 1: ours is faster; GB/s, % copy and GFLOP/s are the cpu kernel's; % copy compares bytes "
          "read + written with a numpy copy of as many bytes: into a new buffer for kernels that return one "
          "(norms, activations, embedding), into an existing one for those that mostly read (GEMV, decode attention).")
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
