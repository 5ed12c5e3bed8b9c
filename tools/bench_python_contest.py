#!/usr/bin/env python3
"""The CPU contest from Python (attention and linear): torch SDPA's flash_cpu and math_cpu, ZenDNN
(zentorch), LayerZero's cpu.attention.flash (and oneDNN where it loads) measured by
``layerzero.tune`` into a fresh PerfDB with verification, then a dispatch table solved from
those measurements and served to the Python host.

Prints, per bucket, every kernel's median time, the fastest, and what model-only and
PerfDB-backed selection picked (regret = time(picked) / time(fastest) - 1), then the regret
summary and which backend won how often. The oracle is left out (LAYERZERO_DENY).

    python tools/bench_python_contest.py [--workload workloads/python-cpu-contest.json]
        [--budget SECONDS] [--out DIR]
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path


def main():
    root = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default=str(root / "workloads" / "python-cpu-contest.json"))
    ap.add_argument("--budget", type=float, default=600.0, help="seconds before no new measurement starts")
    ap.add_argument("--out", default=None, help="folder for the PerfDB and the table (default: a temporary one)")
    a = ap.parse_args()
    os.environ.setdefault("LAYERZERO_DENY", "cpu_reference.*")

    import torch

    import layerzero as lz

    out = Path(a.out or tempfile.mkdtemp(prefix="lz-contest-"))
    out.mkdir(parents=True, exist_ok=True)
    perfdb, table = out / "perfdb.sqlite", out / "table.json"
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"cpu: {cpu}; threads {torch.get_num_threads()}; torch {torch.__version__}; layerzero {lz.__version__}")
    backends = {k: v["version"] for k, v in lz.doctor()["python_backends"].items() if v["installed"]}
    print(f"python backends installed: {backends}")

    report = lz.tune(a.workload, perfdb=perfdb, budget=a.budget, verify=True)
    v = report["verify"]
    print(f"\nmeasured {len(report['results'])} (kernel, bucket) pairs in {report['elapsed_s']:.0f} s; "
          f"budget exhausted: {report['budget_exhausted']}")
    print(f"{'entry':<18} {'bucket':<36} {'fastest':<32} {'model pick (regret)':<44} perfdb pick (regret)")
    for b in v["buckets"]:
        times = ", ".join(f"{t['kernel'].split('.', 1)[0]}/{t['kernel'].rsplit('.', 1)[1]} {t['median_ns'] / 1e3:.0f}us"
                          for t in sorted(b["times"], key=lambda t: t["median_ns"] or 1e30) if t["median_ns"])
        m, p = b["model"], b["perfdb"]
        print(f"{b['entry']:<18} {b['bucket']:<36} {b['fastest']:<32} "
              f"{m['kernel'] + ' (' + format(m['regret'], '.1%') + ')':<44} {p['kernel']} ({p['regret']:.1%})")
        print(f"{'':<18} {times}")
    print(f"\nbuckets verified: {v['verified']} (contested by 2+ kernels: {v['contested']})")
    for name in ("model", "perfdb"):
        s = v[name]
        print(f"regret {name:>6}: mean {s['mean']:.1%}, worst {s['worst']:.1%}, misses {s['misses']}")
    print(f"wins by backend: {v['wins_by_backend']}")

    entries, unsolved = lz.solve(a.workload, table, perfdb=perfdb)
    print(f"\nsolved {table}: {entries} entries, {unsolved} unsolved")
    served = lz.LayerZero.host().with_plan(str(table), "strict")
    q = torch.randn(1, 256, 8, 64)
    kernel = served.which("attention", q=q, k=q, v=q, causal=True)
    lz.ops.attention(q, q, q, causal=True, handle=served)
    print(f"the plan serves prefill.mha.f32 at seq 256 with {kernel}; counters {served.counters()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
